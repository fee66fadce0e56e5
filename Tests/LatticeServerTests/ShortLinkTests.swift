import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// Issue 30: short share links (`/s/{code}`) that survive trailing punctuation and never outlive the signed
/// link they point at; a pending invitee declines through `shares/leave` too; participants see the roster.
@Suite(.tags(.postgres)) struct ShortLinkTests {
    static let zone: JSON = .object(["zoneName": .string("Trips")])

    /// ann shares zone Trips (readOnly for anyone with a link); bob, carol and dave exist.
    static func world(publicPermission: String = "readOnly", configure: (inout ServiceConfiguration) -> Void = { _ in }) throws
        -> (h: ServiceHarness, ann: String, bob: String, carol: String, dave: String) {
        let h = try ServiceHarness(configure: configure)
        let ann = try h.signUp("ann").token, bob = try h.signUp("bob").token
        let carol = try h.signUp("carol").token, dave = try h.signUp("dave").token
        try h.createZone("Trips", token: ann)
        let made = h.call("shares/create", .object(["zoneID": zone, "title": .string("Lisbon"),
                                                    "publicPermission": .string(publicPermission)]), token: ann)
        try #require(made.status == 200, "\(made.json.serialized())")
        return (h, ann, bob, carol, dave)
    }

    static func link(_ h: ServiceHarness, _ token: String, rotate: Bool = false) throws -> ShareURLResponse {
        var body: [String: JSON] = ["zoneID": zone]
        if rotate { body["rotate"] = .bool(true) }
        let reply = h.call("shares/url", .object(body), token: token)
        return try #require(ShareURLResponse(json: reply.json), "\(reply.json.serialized())")
    }

    static func code(_ answer: ShareURLResponse) throws -> String {
        let short = try #require(answer.shortURL)
        return String(try #require(short.split(separator: "/").last))
    }

    static let page = ["Accept": "text/html,application/xhtml+xml"]

    @Test func aShortLinkAnswersTheSignedLinkToAppsAndTheSharePageToBrowsers() throws {
        let w = try Self.world()
        let answer = try Self.link(w.h, w.ann)
        let code = try Self.code(answer)
        #expect(answer.shortURL == "http://127.0.0.1:8080/s/" + code)
        #expect(code.count == 10 && code.allSatisfy { ShortLinkCode.alphabet.contains($0) }, "code \(code)")
        #expect(answer.shortURL!.count < 40 && answer.url.count > 200, "short: \(answer.shortURL!), long: \(answer.url.count)")

        let json = w.h.raw("GET", "/s/" + code)
        #expect(json.status == 200 && ShortLinkResolution(json: json.json)?.url == answer.url, "\(json.json.serialized())")
        #expect(json["shortURL"] == .string(answer.shortURL!))

        let browser = w.h.raw("GET", "/s/" + code, headers: Self.page)
        #expect(browser.status == 303, "\(browser.status)")
        #expect(browser.response.header("Location") == "/share/\(answer.token)?via=\(code)")
        #expect(browser.response.header("Cache-Control") == "no-store")

        // The share page reached through the short link shows the short link in its (folded) terminal block.
        let via = w.h.service.respond(to: HTTPRequest(method: "GET", path: "/share/" + answer.token, query: "via=" + code,
                                                      headers: ["accept": "text/html"], remoteAddress: "127.0.0.1"))
        let viaHTML = String(decoding: via.body, as: UTF8.self)
        #expect(via.status == 200 && viaHTML.contains("<details class=\"terminal\"><summary>Join from a terminal</summary>"))
        #expect(viaHTML.contains("lattice accept \(answer.shortURL!)</code>") && !viaHTML.contains(answer.url))
        // Straight to the long link, or with a code that names another link: the long link.
        let other = try Self.code(try Self.link(w.h, w.ann))
        for query in ["", "via=" + other, "via=notacode!"] {
            let plain = w.h.service.respond(to: HTTPRequest(method: "GET", path: "/share/" + answer.token, query: query,
                                                            headers: ["accept": "text/html"], remoteAddress: "127.0.0.1"))
            #expect(String(decoding: plain.body, as: UTF8.self).contains("lattice accept \(answer.url)</code>"), "query \(query)")
        }
    }

    @Test func trailingPunctuationAndCaseDoNotBreakAShortLink() throws {
        let w = try Self.world()
        let answer = try Self.link(w.h, w.ann)
        let code = try Self.code(answer)
        for suffix in [".", ",", ")", "]", ">", "!", "?", "'", "\"", ";", ":", ").", "\".", "/", "%22", "%29", "%3E"] {
            let json = w.h.raw("GET", "/s/" + code + suffix)
            #expect(json["url"] == .string(answer.url), "suffix \(suffix): \(json.json.serialized())")
            let browser = w.h.raw("GET", "/s/" + code + suffix, headers: Self.page)
            #expect(browser.response.header("Location") == "/share/\(answer.token)?via=\(code)", "suffix \(suffix)")
        }
        #expect(w.h.raw("GET", "/s/" + code.uppercased())["url"] == .string(answer.url), "typed in capitals")
        // records/resolve and records/accept take the short link (and a long one) with the punctuation too.
        let resolved = w.h.call("records/resolve", .object(["shortGUIDs": .array([.string(answer.shortURL! + ").")])]),
                                token: w.bob, database: "shared")
        #expect(resolved["results"]?.arrayValue?.first?["title"] == .string("Lisbon"), "\(resolved.json.serialized())")
        let accepted = w.h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(answer.shortURL! + ".")])])]),
                                token: w.bob, database: "shared")
        #expect(accepted["results"]?.arrayValue?.first?["participantStatus"] == .string("accepted"), "\(accepted.json.serialized())")
        let long = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(answer.url + "!")])]),
                            token: w.carol, database: "shared")
        #expect(long["results"]?.arrayValue?.first?["participantStatus"] == .string("accepted"), "\(long.json.serialized())")
    }

    @Test func revokedOrUnknownShortLinksAnswerAsAnInvalidLongLink() throws {
        let w = try Self.world()
        let old = try Self.link(w.h, w.ann)
        let oldCode = try Self.code(old)
        let fresh = try Self.link(w.h, w.ann, rotate: true)
        let freshCode = try Self.code(fresh)
        let invalidLong = w.h.raw("GET", "/share/" + old.token, headers: Self.page)
        #expect(invalidLong.status == 404)
        for path in ["/s/" + oldCode, "/s/" + oldCode + ".", "/s/zzzzzzzzzz", "/s/short", "/s/0o1li0o1li", "/s/"] {
            let browser = w.h.raw("GET", path, headers: Self.page)
            #expect(browser.status == 404 && browser.response.body == invalidLong.response.body, "\(path): the same page")
            let json = w.h.raw("GET", path)
            #expect(json.status == 403 && json.code == "ACCESS_DENIED", "\(path): \(json.json.serialized())")
            #expect(json["reason"] == .string(ShareTokenError.invalid.description))
        }
        let refused = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(old.shortURL!)])]), token: w.bob,
                               database: "shared")
        let refusedLong = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(old.url)])]), token: w.bob,
                                   database: "shared")
        #expect(refused["results"] == refusedLong["results"] && refused["results"]?.arrayValue?.first?["serverErrorCode"] == .string("ACCESS_DENIED"),
                "\(refused.json.serialized())")
        #expect(w.h.raw("GET", "/s/" + freshCode)["url"] == .string(fresh.url), "the new link's code works")

        // Stopping sharing: the new code goes dead too.
        #expect(w.h.call("shares/delete", .object(["zoneID": Self.zone]), token: w.ann).status == 200)
        #expect(w.h.raw("GET", "/s/" + freshCode, headers: Self.page).response.body == invalidLong.response.body)
        #expect(w.h.raw("GET", "/s/" + freshCode).code == "ACCESS_DENIED")
    }

    @Test func aShareKeepsItsNewestShortLinksOnly() throws {
        let w = try Self.world()
        let first = try Self.link(w.h, w.ann)
        var last = first
        for _ in 0..<50 {
            w.h.clock.advance(1)
            last = try Self.link(w.h, w.ann)
        }
        #expect(w.h.raw("GET", "/s/" + (try Self.code(first))).code == "ACCESS_DENIED", "the 51st link's code forgot the first's")
        #expect(w.h.raw("GET", "/s/" + (try Self.code(last)))["url"] == .string(last.url))
        let resolved = w.h.call("records/resolve", .object(["shortGUIDs": .array([.string(first.url)])]), token: w.bob,
                                database: "shared")
        #expect(resolved["results"]?.arrayValue?.first?["title"] == .string("Lisbon"), "its long link still works")
    }

    @Test func shortLinkLookupsAreThrottledPerAddress() throws {
        let h = try ServiceHarness { $0.rateLimit = .init(requestsPerSecond: 1, burst: 3) }
        func lookUp(from address: String) -> Int {
            h.service.respond(to: HTTPRequest(method: "GET", path: "/s/zzzzzzzzzz", remoteAddress: address)).status
        }
        let statuses = (0..<5).map { _ in lookUp(from: "192.0.2.7") }
        #expect(statuses.prefix(3).allSatisfy { $0 == 403 } && statuses.last == 429, "\(statuses)")
        #expect(lookUp(from: "192.0.2.8") == 403, "another address has its own budget")
    }

    // MARK: Invitations, leaving and the roster

    @Test func aPendingInviteeWhoLeavesDeclines() throws {
        let w = try Self.world(publicPermission: "none")
        let invited = w.h.call("shares/modify", .object(["zoneID": Self.zone, "participants": .array([
            .object(["operation": .string("invite"), "userName": .string("carol"), "permission": .string("readWrite")]),
        ])]), token: w.ann)
        #expect(invited.status == 200, "\(invited.json.serialized())")
        #expect(w.h.call("shares/invitations", .object([:]), token: w.carol, database: "shared")["invitations"]?.arrayValue?.count == 1)
        let left = w.h.call("shares/leave", .object(["zoneID": Self.zone]), token: w.carol, database: "shared")
        #expect(left.status == 200 && left["left"] == .bool(true), "\(left.json.serialized())")
        #expect(left["zoneID"]?["ownerRecordName"] != nil)
        #expect(w.h.call("shares/invitations", token: w.carol, database: "shared")["invitations"] == .array([]))
        let roster = w.h.call("shares/lookup", .object(["zoneID": Self.zone]), token: w.ann)["participants"]?.arrayValue ?? []
        #expect(roster.first { $0["name"] == .string("carol") }?["acceptanceStatus"] == .string("removed"))
        // Leaving again, or a share one was never invited to, is what it was before.
        let again = w.h.call("shares/leave", .object(["zoneID": Self.zone]), token: w.carol, database: "shared")
        let stranger = w.h.call("shares/leave", .object(["zoneID": Self.zone]), token: w.dave, database: "shared")
        #expect(again.status >= 400 && again.code == stranger.code, "\(again.json.serialized()) \(stranger.json.serialized())")
    }

    @Test func anInvitationsLinkAcceptsThroughItsShortFormToo() throws {
        let w = try Self.world(publicPermission: "none")
        _ = w.h.call("shares/modify", .object(["zoneID": Self.zone, "participants": .array([
            .object(["operation": .string("invite"), "userName": .string("bob"), "permission": .string("readWrite")]),
        ])]), token: w.ann)
        let listed = try #require(ShareInvitationsResponse(json: w.h.call("shares/invitations", token: w.bob, database: "shared").json))
        let invitation = try #require(listed.invitations.first)
        #expect(invitation.title == "Lisbon" && invitation.ownerName == "ann" && invitation.permission == .readWrite)
        // The owner's short link of an invitation-only share: it lets an invitee in, never a stranger.
        let short = try #require(try Self.link(w.h, w.ann).shortURL)
        let stranger = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(short)])]), token: w.dave, database: "shared")
        #expect(stranger["results"]?.arrayValue?.first?["serverErrorCode"] != nil, "\(stranger.json.serialized())")
        let accepted = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(short)])]), token: w.bob, database: "shared")
        #expect(accepted["results"]?.arrayValue?.first?["participantStatus"] == .string("accepted"), "\(accepted.json.serialized())")
        #expect(accepted["results"]?.arrayValue?.first?["participantPermission"] == .string("readWrite"), "the invitation's permission")
    }

    /// The members view: an accepted participant sees everyone on the share and their access; a pending
    /// invitee and a stranger see nothing.
    @Test func participantsSeeWhoElseIsOnTheShare() throws {
        let w = try Self.world(publicPermission: "none")
        let invited = w.h.call("shares/modify", .object(["zoneID": Self.zone, "participants": .array([
            .object(["operation": .string("invite"), "userName": .string("bob"), "permission": .string("readOnly")]),
            .object(["operation": .string("invite"), "userName": .string("carol"), "permission": .string("readWrite")]),
        ])]), token: w.ann)
        try #require(invited.status == 200, "\(invited.json.serialized())")
        let invitation = ShareInvitationsResponse(json: w.h.call("shares/invitations", token: w.bob, database: "shared").json)
        let url = try #require(invitation?.invitations.first?.url)
        _ = w.h.call("records/accept", .object(["shortGUIDs": .array([.string(url)])]), token: w.bob, database: "shared")
        // In the shared database a zone is named with its owner.
        let owner = try #require(w.h.call("users/current", token: w.ann)["userRecordName"])
        let zoneID: JSON = .object(["zoneName": .string("Trips"), "ownerRecordName": owner])
        let seen = w.h.call("shares/lookup", .object(["zoneID": zoneID]), token: w.bob, database: "shared")
        let described = try #require(ShareDescription(json: seen.json), "\(seen.json.serialized())")
        let byName = Dictionary(uniqueKeysWithValues: described.participants.map { ($0.name, $0) })
        #expect(byName["ann"]?.role == .owner && byName["ann"]?.permission == .readWrite)
        #expect(byName["bob"]?.permission == .readOnly && byName["bob"]?.acceptanceStatus == .accepted)
        #expect(byName["carol"]?.permission == .readWrite && byName["carol"]?.acceptanceStatus == .pending, "\(seen.json.serialized())")
        #expect(byName["dave"] == nil)
        let carol = w.h.call("shares/lookup", .object(["zoneID": zoneID]), token: w.carol, database: "shared")
        let dave = w.h.call("shares/lookup", .object(["zoneID": zoneID]), token: w.dave, database: "shared")
        #expect(carol.status >= 400 && carol["participants"] == nil, "\(carol.json.serialized())")
        #expect(dave.status >= 400 && dave["participants"] == nil && dave.code == carol.code)
    }
}
