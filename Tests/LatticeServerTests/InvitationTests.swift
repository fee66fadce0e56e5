import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// Issue 30: an invited person is told. `shares/invitations` lists the caller's pending invitations with a
/// link that accepts; `shares/decline` turns one down.
@Suite(.tags(.postgres)) struct InvitationTests {
    static let zone: JSON = .object(["zoneName": .string("Trips")])

    static func world() throws -> (h: ServiceHarness, ann: String, bob: String, carol: String, dave: String) {
        let h = try ServiceHarness()
        let ann = try h.signUp("ann").token, bob = try h.signUp("bob").token
        let carol = try h.signUp("carol").token, dave = try h.signUp("dave").token
        try h.createZone("Trips", token: ann)
        let made = h.call("shares/create", .object(["zoneID": zone, "title": .string("Lisbon")]), token: ann)
        try #require(made.status == 200, "\(made.json.serialized())")
        let invited = h.call("shares/modify", .object(["zoneID": zone, "participants": .array([
            .object(["operation": .string("invite"), "userName": .string("bob"), "permission": .string("readWrite")]),
            .object(["operation": .string("invite"), "userName": .string("carol"), "permission": .string("readOnly")]),
        ])]), token: ann)
        try #require(invited.status == 200, "\(invited.json.serialized())")
        return (h, ann, bob, carol, dave)
    }

    @Test func anInvitedPersonSeesTheInvitationAndAcceptsItThroughItsLink() throws {
        let w = try Self.world()
        let listed = w.h.call("shares/invitations", token: w.bob, database: "shared")
        let invitations = try #require(listed["invitations"]?.arrayValue, "\(listed.json.serialized())")
        #expect(invitations.count == 1)
        let invitation = try #require(invitations.first)
        #expect(invitation["title"] == .string("Lisbon") && invitation["ownerName"] == .string("ann"))
        #expect(invitation["permission"] == .string("readWrite") && invitation["zoneID"]?["zoneName"] == .string("Trips"))
        let url = try #require(invitation["url"]?.stringValue)
        let accepted = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(url)])]), token: w.bob, database: "shared")
        #expect(accepted["results"]?.arrayValue?.first?["participantStatus"] == .string("accepted"), "\(accepted.json.serialized())")
        #expect(w.h.call("shares/invitations", token: w.bob, database: "shared")["invitations"] == .array([]), "answered: gone")
        // The link is no use to someone not invited (the share is invitation-only).
        let stranger = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(url)])]), token: w.dave, database: "shared")
        #expect(stranger["results"]?.arrayValue?.first?["serverErrorCode"] != nil, "\(stranger.json.serialized())")
    }

    @Test func aDeclinedInvitationGoesAndTheOwnerSeesItRemoved() throws {
        let w = try Self.world()
        let declined = w.h.call("shares/decline", .object(["zoneID": .object(["zoneName": .string("Trips")])]), token: w.carol,
                                database: "shared")
        #expect(declined.status == 200 && declined["declined"] == .bool(true), "\(declined.json.serialized())")
        #expect(w.h.call("shares/invitations", token: w.carol, database: "shared")["invitations"] == .array([]))
        let lookup = w.h.call("shares/lookup", .object(["zoneID": Self.zone]), token: w.ann)
        let carol = lookup["participants"]?.arrayValue?.first { $0["userIdentity"]?["name"] == .string("carol") || $0["name"] == .string("carol") }
        #expect(carol?["acceptanceStatus"] == .string("removed"), "\(lookup.json.serialized())")
        // Declining again, or with no invitation, is NOT_FOUND; so is a stranger's.
        #expect(w.h.call("shares/decline", .object(["zoneID": .object(["zoneName": .string("Trips")])]), token: w.carol,
                         database: "shared").code == "NOT_FOUND")
        #expect(w.h.call("shares/decline", .object(["zoneID": .object(["zoneName": .string("Trips")])]), token: w.dave,
                         database: "shared").code == "NOT_FOUND")
        // Bob's invitation is untouched.
        #expect(w.h.call("shares/invitations", token: w.bob, database: "shared")["invitations"]?.arrayValue?.count == 1)
    }

    @Test func onlyTheSharedDatabaseListsInvitationsAndStrangersHaveNone() throws {
        let w = try Self.world()
        #expect(w.h.call("shares/invitations", token: w.dave, database: "shared")["invitations"] == .array([]))
        #expect(w.h.call("shares/invitations", token: w.bob, database: "private").code == "BAD_REQUEST")
        #expect(w.h.call("shares/decline", .object(["zoneID": Self.zone]), token: w.bob, database: "private").code == "BAD_REQUEST")
        #expect(w.h.call("shares/decline", .object([:]), token: w.bob, database: "shared").code == "BAD_REQUEST")
    }
}
