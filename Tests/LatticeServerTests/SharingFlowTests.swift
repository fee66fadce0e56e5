import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Synchronization
import Testing

/// Sharing end to end in-process: create, invite, URL, resolve, accept, access, moves, revocation, limits.
@Suite(.tags(.postgres)) struct SharingFlowTests {
    struct World {
        let h: ServiceHarness
        let ann: String, annName: String
        let bob: String, carol: String, dave: String

        init() throws {
            h = try ServiceHarness()
            (ann, annName) = try h.signUp("ann")
            bob = try h.signUp("bob").token
            carol = try h.signUp("carol").token
            dave = try h.signUp("dave").token
            try h.createZone("Lists", token: ann)
            let created = h.modify("Lists", [
                operation("create", "groceries", recordType: "List", fields: ["title": value(.string("Groceries"))]),
                operation("create", "milk", fields: ["text": value(.string("Milk"))],
                          extra: ["parent": .object(["recordName": .string("groceries")])]),
                operation("create", "secret", recordType: "List", fields: ["title": value(.string("Secret"))]),
            ], token: ann)
            precondition(created.records.allSatisfy { $0["serverErrorCode"] == nil }, created.json.serialized())
        }

        var sharedZone: JSON { .object(["zoneName": .string("Lists"), "ownerRecordName": .string(annName)]) }

        func share(_ operation: String, _ body: [String: JSON], token: String, database: String = "private") -> ServiceHarness.Reply {
            var body = body
            if body["zoneID"] == nil {
                body["zoneID"] = database == "shared" ? sharedZone : .object(["zoneName": .string("Lists")])
            }
            return h.call(operation, .object(body), token: token, database: database)
        }

        func shared(_ operation: String, _ body: [String: JSON], token: String) -> ServiceHarness.Reply {
            var body = body
            body["zoneID"] = sharedZone
            return h.call(operation, .object(body), token: token, database: "shared")
        }

        func url(_ body: [String: JSON] = [:], token: String? = nil) throws -> String {
            let reply = share("shares/url", body, token: token ?? ann)
            return try #require(reply["url"]?.stringValue, "\(reply.json.serialized())")
        }

        func accept(_ url: String, token: String) -> JSON {
            h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]), token: token,
                   database: "shared")["results"]?.arrayValue?.first ?? .null
        }

        func feedNames(_ token: String) -> [String: Bool] {
            var names: [String: Bool] = [:]
            let zone = shared("changes/zone", ["zones": .array([.object(["zoneID": sharedZone])])], token: token).zones.first
            for record in zone?["records"]?.arrayValue ?? [] {
                names[record["recordName"]?.stringValue ?? ""] = record["deleted"] == .bool(true)
            }
            return names
        }
    }

    @Test func hierarchyShareFromInviteToRevocation() throws {
        let w = try World()
        let created = w.share("shares/create", ["rootRecordName": .string("groceries"), "title": .string("Groceries")], token: w.ann)
        #expect(created.status == 200, "\(created.json.serialized())")
        #expect(created["participants"]?.arrayValue?.count == 1)
        let invited = w.share("shares/modify", ["participants": .array([
            .object(["operation": .string("invite"), "userName": .string("bob"), "permission": .string("readWrite")]),
            .object(["operation": .string("invite"), "userName": .string("carol"), "permission": .string("readOnly")]),
        ])], token: w.ann)
        #expect(invited.status == 200, "\(invited.json.serialized())")
        let url = try w.url()
        #expect(url.hasPrefix("http://127.0.0.1:8080/share/"))

        // Resolve grants nothing; accept makes bob a participant.
        let resolved = w.h.call("records/resolve", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                token: w.bob, database: "shared")["results"]?.arrayValue?.first
        #expect(resolved?["currentStatus"]?.stringValue == "pending")
        #expect(resolved?["participantStatus"]?.stringValue == "accepted") // what accepting would make him
        #expect(resolved?["participantRole"]?.stringValue == "privateUser")
        #expect(resolved?["participantPermission"]?.stringValue == "readWrite")
        #expect(resolved?["title"]?.stringValue == "Groceries")
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("milk")])])], token: w.bob)
            .code == "ZONE_NOT_FOUND")
        let accepted = w.accept(url, token: w.bob)
        #expect(accepted["participantStatus"]?.stringValue == "accepted", "\(accepted.serialized())")
        #expect(w.accept(url, token: w.bob)["participantStatus"]?.stringValue == "accepted") // idempotent

        // Bob's shared database shows the zone; the feed holds the hierarchy and the share, not the rest.
        #expect(w.h.call("zones/list", token: w.bob, database: "shared").zones.first?["zoneID"]?["zoneName"]?.stringValue == "Lists")
        let databaseFeed = w.h.call("changes/database", token: w.bob, database: "shared")
        #expect(databaseFeed.zones.count == 1)
        let feed = w.feedNames(w.bob)
        #expect(feed["groceries"] == false && feed["milk"] == false && feed["secret"] == nil)
        #expect(feed.keys.contains { $0.hasPrefix("Share-") })
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("secret")])])], token: w.bob)
            .records.first?["serverErrorCode"]?.stringValue == "NOT_FOUND")
        let query = w.shared("records/query", ["query": .object([:])], token: w.bob)
        let queried = Set(query.records.compactMap { $0["recordName"]?.stringValue })
        #expect(queried.isSuperset(of: ["groceries", "milk"]))
        #expect(!query.records.contains { $0["recordName"]?.stringValue == "secret" })

        // Bob writes inside; not outside; not the root's deletion.
        func bobModify(_ ops: [JSON], _ token: String) -> JSON {
            w.shared("records/modify", ["operations": .array(ops)], token: token).records.first ?? .null
        }
        #expect(bobModify([operation("forceUpdate", "milk", recordType: nil, fields: ["done": value(.int(1))])], w.bob)["serverErrorCode"] == nil)
        #expect(bobModify([operation("create", "eggs", extra: ["parent": .object(["recordName": .string("groceries")])])], w.bob)["serverErrorCode"] == nil)
        #expect(bobModify([operation("create", "loose")], w.bob)["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
        #expect(bobModify([operation("forceUpdate", "secret", recordType: nil, fields: ["x": value(.int(1))])], w.bob)["serverErrorCode"]?.stringValue == "NOT_FOUND")
        #expect(bobModify([operation("forceDelete", "groceries")], w.bob)["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
        #expect(bobModify([operation("forceDelete", "eggs")], w.bob)["deleted"] == .bool(true))

        // Carol is read-only.
        #expect(w.accept(url, token: w.carol)["participantPermission"]?.stringValue == "readOnly")
        #expect(bobModify([operation("forceUpdate", "milk", recordType: nil, fields: ["done": value(.int(0))])], w.carol)["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("milk")])])], token: w.carol)
            .records.first?["fields"]?["done"]?["value"]?.intValue == 1)

        // Dave was not invited and the share is not public.
        #expect(w.accept(url, token: w.dave)["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")

        // The owner moves milk out of the hierarchy: it leaves bob's feed as a deletion; moving it back returns it.
        let zoneToken = try #require(w.shared("changes/zone", ["zones": .array([.object(["zoneID": w.sharedZone])])], token: w.bob)
            .zones.first?["syncToken"]?.stringValue)
        #expect(w.h.modify("Lists", [operation("forceUpdate", "milk", recordType: nil,
                                               extra: ["parent": .object(["recordName": .string("secret")])])], token: w.ann)
            .records.first?["serverErrorCode"] == nil)
        let moved = w.shared("changes/zone", ["zones": .array([.object(["zoneID": w.sharedZone, "syncToken": .string(zoneToken)])])],
                             token: w.bob).zones.first
        #expect(moved?["records"]?.arrayValue?.first { $0["recordName"]?.stringValue == "milk" }?["deleted"] == .bool(true))
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("milk")])])], token: w.bob)
            .records.first?["serverErrorCode"]?.stringValue == "NOT_FOUND")
        _ = w.h.modify("Lists", [operation("forceUpdate", "milk", recordType: nil,
                                           extra: ["parent": .object(["recordName": .string("groceries")])])], token: w.ann)
        #expect(w.feedNames(w.bob)["milk"] == false)

        // Removing bob revokes at once, and his shared database reports the zone deleted.
        let databaseToken = try #require(databaseFeed["syncToken"]?.stringValue)
        #expect(w.share("shares/modify", ["participants": .array([
            .object(["operation": .string("remove"), "userName": .string("bob")]),
        ])], token: w.ann).status == 200)
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("milk")])])], token: w.bob)
            .code == "ZONE_NOT_FOUND")
        let after = w.h.call("changes/database", .object(["syncToken": .string(databaseToken)]), token: w.bob, database: "shared")
        #expect(after.zones.first?["deleted"] == .bool(true))
        // His old URL does not let him back in.
        #expect(w.accept(url, token: w.bob)["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
    }

    @Test func publicSharesLinksRotationAndUses() throws {
        let w = try World()
        #expect(w.share("shares/create", ["title": .string("Everything"), "publicPermission": .string("readWrite")],
                        token: w.ann).status == 200)
        // Zone-wide: no hierarchy shares besides.
        #expect(w.share("shares/create", ["rootRecordName": .string("groceries")], token: w.ann).code == "ALREADY_SHARED")
        let readOnlyLink = try w.url(["permission": .string("readOnly")])
        let joined = w.accept(readOnlyLink, token: w.bob)
        #expect(joined["participantRole"]?.stringValue == "publicUser")
        #expect(joined["participantPermission"]?.stringValue == "readOnly") // the lesser of public and link
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("secret")])])], token: w.bob)
            .records.first?["fields"] != nil) // zone-wide: everything

        // A single-use link works once.
        let once = try w.url(["maxUses": .int(1)])
        #expect(w.accept(once, token: w.carol)["participantStatus"]?.stringValue == "accepted")
        #expect(w.accept(once, token: w.dave)["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
        // Rotation invalidates older links.
        _ = try w.url(["rotate": .bool(true)])
        #expect(w.accept(readOnlyLink, token: w.dave)["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
        // Back to none: public participants are removed.
        #expect(w.share("shares/modify", ["publicPermission": .string("none")], token: w.ann).status == 200)
        #expect(w.shared("records/lookup", ["records": .array([])], token: w.bob).code == "ZONE_NOT_FOUND")
        // Tampered links get the same error.
        let fresh = try w.url()
        var bytes = Array(fresh.utf8)
        bytes[bytes.count - 5] = bytes[bytes.count - 5] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let tampered = w.accept(String(decoding: bytes, as: UTF8.self), token: w.dave)
        #expect(tampered["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
        #expect(tampered["reason"]?.stringValue == "the share link is invalid, expired or revoked")
        // Deleting the share: the link dies too.
        #expect(w.share("shares/delete", [:], token: w.ann)["deleted"] == .bool(true))
        #expect(w.accept(fresh, token: w.dave)["reason"]?.stringValue == "the share link is invalid, expired or revoked")
    }

    @Test func atMostOneHundredParticipantsEvenConcurrently() throws {
        let w = try World()
        #expect(w.share("shares/create", ["rootRecordName": .string("groceries")], token: w.ann).status == 200)
        let users = (0..<101).map { "u\($0)" }
        for name in users { _ = try w.h.signUp(name) }
        // The owner plus 98 sequential invitations: 99.
        for name in users.prefix(98) {
            let reply = w.share("shares/modify", ["participants": .array([
                .object(["operation": .string("invite"), "userName": .string(name), "permission": .string("readOnly")]),
            ])], token: w.ann)
            #expect(reply.status == 200)
        }
        // Three concurrent invitations for the last place: exactly one wins.
        let codes = OutcomeLog()
        DispatchQueue.concurrentPerform(iterations: 3) { index in
            let reply = w.share("shares/modify", ["participants": .array([
                .object(["operation": .string("invite"), "userName": .string(users[98 + index]), "permission": .string("readOnly")]),
            ])], token: w.ann)
            codes.append(reply.code ?? "OK")
        }
        #expect(codes.values.sorted() == ["OK", "TOO_MANY_PARTICIPANTS", "TOO_MANY_PARTICIPANTS"])
        let share = w.share("shares/lookup", [:], token: w.ann)
        #expect(share["participants"]?.arrayValue?.count == 100)
    }

    @Test func revocationWakesAParticipantParkedInWait() throws {
        let w = try World()
        _ = w.share("shares/create", ["publicPermission": .string("readWrite")], token: w.ann)
        #expect(w.accept(try w.url(), token: w.bob)["participantStatus"]?.stringValue == "accepted")
        let token = try #require(w.h.call("changes/database", token: w.bob, database: "shared")["syncToken"]?.stringValue)
        let box = ResponseBox()
        w.h.service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/shared/changes/wait",
                                       headers: ["Authorization": "Bearer " + w.bob],
                                       body: JSON.object(["syncToken": .string(token), "timeout": .int(30)]).serializedBytes())) {
            box.set($0)
        }
        #expect(w.h.service.notifier.waiterCount == 1)
        #expect(w.share("shares/delete", [:], token: w.ann).status == 200)
        #expect(try JSON.parse(box.wait().body)["changed"] == .bool(true))
        #expect(w.shared("records/lookup", ["records": .array([])], token: w.bob).code == "ZONE_NOT_FOUND")
    }
}

/// A tiny thread-safe list for concurrent test outcomes.
final class OutcomeLog: Sendable {
    private let items = Mutex<[String]>([])
    func append(_ item: String) { items.withLock { $0.append(item) } }
    var values: [String] { items.withLock { $0 } }
}
