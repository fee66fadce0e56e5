import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Testing

/// Subscriptions (CloudKit's shapes), the notifications they raise (coalesced, not to the device that made
/// the change, participants cut off with their access), push tokens and the push stream on a real socket.
@Suite(.tags(.postgres)) struct SubscriptionTests {
    static let zoneSub: JSON = .object(["subscriptionID": .string("lists"), "subscriptionType": .string("zone"),
                                        "zoneID": .object(["zoneName": .string("Lists")])])
    static let databaseSub: JSON = .object(["subscriptionID": .string("everything"), "subscriptionType": .string("database")])

    static func subscribe(_ type: String, _ subscription: JSON) -> JSON {
        .object(["operationType": .string(type), "subscription": subscription])
    }

    static func item(_ name: String, done: Int64) -> JSON {
        operation("create", name, recordType: "Item", fields: ["done": value(.int(done))])
    }

    /// A push token of the device `token` is, registered; and its session.
    static func pushSession(_ h: ServiceHarness, token: String) throws -> (text: String, session: PushSession) {
        let made = h.call("tokens/create", .object(["apnsEnvironment": .string("production")]), token: token)
        let text = try #require(made["apnsToken"]?.stringValue, "\(made.json.serialized())")
        #expect(made["webcourierURL"]?.stringValue?.hasSuffix("/push/" + text) == true)
        #expect(h.call("tokens/register", .object(["apnsEnvironment": .string("production"), "apnsToken": .string(text)]),
                       token: token).status == 200)
        let session = try #require(try Subscriptions(h.service.core).openSession(pushToken: text, deadline: nil))
        return (text, session)
    }

    static func pending(_ h: ServiceHarness, _ session: PushSession, after cursor: Int64) throws -> [JSON] {
        try Subscriptions(h.service.core).notifications(session, after: cursor, limit: 100, deadline: nil).events.map(\.1)
    }

    @Test func subscriptionsAreCreatedListedLookedUpUpdatedAndDeletedAsInCloudKit() throws {
        let h = try ServiceHarness()
        let ann = try h.signUp("ann").token
        try h.createZone("Lists", token: ann)
        let query: JSON = .object([
            "subscriptionID": .string("done-items"), "subscriptionType": .string("query"),
            "zoneID": .object(["zoneName": .string("Lists")]), "firesOn": .array([.string("create"), .string("delete")]),
            "query": .object(["recordType": .string("Item"), "filterBy": .array([.object([
                "fieldName": .string("done"), "comparator": .string("EQUALS"),
                "fieldValue": .object(["value": .int(1)])])])]),
        ])
        let created = h.call("subscriptions/modify", .object(["operations": .array([
            Self.subscribe("create", Self.zoneSub), Self.subscribe("create", Self.databaseSub), Self.subscribe("create", query),
            Self.subscribe("create", .object(["subscriptionID": .string("nowhere"), "subscriptionType": .string("zone"),
                                              "zoneID": .object(["zoneName": .string("Missing")])])),
        ])]), token: ann)
        #expect(created.status == 200)
        let items = created["subscriptions"]?.arrayValue ?? []
        #expect(items.count == 4)
        #expect(items[0]["subscriptionType"]?.stringValue == "zone")
        #expect(items[2]["firesOn"] == .array([.string("create"), .string("delete")]))
        #expect(items[3]["serverErrorCode"]?.stringValue == "ZONE_NOT_FOUND")
        #expect(items[3]["subscriptionID"]?.stringValue == "nowhere")

        // A retried create answers the same; a different definition under the name is EXISTS.
        let again = h.call("subscriptions/modify", .object(["operations": .array([
            Self.subscribe("create", Self.zoneSub),
            Self.subscribe("create", .object(["subscriptionID": .string("lists"), "subscriptionType": .string("database")])),
        ])]), token: ann)["subscriptions"]?.arrayValue ?? []
        #expect(again.first?["subscriptionID"]?.stringValue == "lists" && again.first?["serverErrorCode"] == nil)
        #expect(again.last?["serverErrorCode"]?.stringValue == "EXISTS")

        let listed = h.call("subscriptions/list", token: ann)["subscriptions"]?.arrayValue ?? []
        #expect(listed.compactMap { $0["subscriptionID"]?.stringValue } == ["done-items", "everything", "lists"])
        let lookedUp = h.call("subscriptions/lookup", .object(["subscriptions": .array([
            .object(["subscriptionID": .string("lists")]), .object(["subscriptionID": .string("ghost")]),
        ])]), token: ann)["subscriptions"]?.arrayValue ?? []
        #expect(lookedUp.first?["zoneID"]?["zoneName"]?.stringValue == "Lists")
        #expect(lookedUp.last?["serverErrorCode"]?.stringValue == "NOT_FOUND")

        let updated = h.call("subscriptions/modify", .object(["operations": .array([
            Self.subscribe("update", .object(["subscriptionID": .string("lists"), "subscriptionType": .string("database")])),
            Self.subscribe("delete", .object(["subscriptionID": .string("everything")])),
            Self.subscribe("delete", .object(["subscriptionID": .string("everything")])),
        ])]), token: ann)["subscriptions"]?.arrayValue ?? []
        #expect(updated.first?["subscriptionType"]?.stringValue == "database")
        #expect(updated[1]["deleted"] == .bool(true))
        #expect(updated[2]["serverErrorCode"]?.stringValue == "NOT_FOUND")

        // Where they may not be, and malformed ones.
        #expect(h.call("subscriptions/list", token: ann, database: "public").code == "BAD_REQUEST")
        let inShared = h.call("subscriptions/modify", .object(["operations": .array([Self.subscribe("create", query)])]),
                              token: ann, database: "shared")["subscriptions"]?.arrayValue?.first
        #expect(inShared?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        for bad: JSON in [
            .object(["subscriptionID": .string("x"), "subscriptionType": .string("zone")]),
            .object(["subscriptionID": .string("x"), "subscriptionType": .string("hourly")]),
            .object(["subscriptionID": .string(""), "subscriptionType": .string("database")]),
            .object(["subscriptionID": .string("x"), "subscriptionType": .string("query"), "zoneWide": .bool(true)]),
            .object(["subscriptionID": .string("x"), "subscriptionType": .string("database"), "firesOn": .array([.string("create")])]),
        ] {
            let reply = h.call("subscriptions/modify", .object(["operations": .array([Self.subscribe("create", bad)])]), token: ann)
            #expect(reply.code == "BAD_REQUEST", "\(bad.serialized()) -> \(reply.json.serialized())")
        }
    }

    @Test func notificationsAreCoalescedAndSkipTheDeviceThatMadeTheChange() throws {
        let h = try ServiceHarness()
        let (ann, annName) = try h.signUp("ann")
        let phone = try #require(h.call("tokens/issue", token: ann)["token"]?.stringValue)
        try h.createZone("Lists", token: ann)
        let query: JSON = .object([
            "subscriptionID": .string("done"), "subscriptionType": .string("query"), "zoneID": .object(["zoneName": .string("Lists")]),
            "firesOn": .array([.string("create")]), "firesOnce": .bool(true),
            "query": .object(["recordType": .string("Item"), "filterBy": .array([.object([
                "fieldName": .string("done"), "comparator": .string("EQUALS"), "fieldValue": .object(["value": .int(1)])])])]),
        ])
        #expect(h.call("subscriptions/modify", .object(["operations": .array([
            Self.subscribe("create", Self.zoneSub), Self.subscribe("create", query),
        ])]), token: ann).status == 200)
        let laptop = try Self.pushSession(h, token: ann)
        let phoneStream = try Self.pushSession(h, token: phone)
        let start = try Subscriptions(h.service.core).latestPosition(laptop.session, deadline: nil)

        // Three writes from the phone: one notification per subscription and zone for the laptop, none for
        // the phone. The query subscription fires on its first match only, then is gone.
        #expect(h.modify("Lists", [Self.item("a", done: 0)], token: phone).status == 200)
        #expect(h.modify("Lists", [Self.item("b", done: 1)], token: phone).status == 200)
        #expect(h.modify("Lists", [Self.item("c", done: 1)], token: phone).status == 200)
        let forLaptop = try Self.pending(h, laptop.session, after: start)
        #expect(forLaptop.compactMap { $0["subscriptionID"]?.stringValue }.sorted() == ["done", "lists"])
        #expect(forLaptop.first { $0["subscriptionID"] == .string("lists") }?["zoneID"]
                    == .object(["zoneName": .string("Lists"), "ownerRecordName": .string(annName)]))
        #expect(forLaptop.allSatisfy { $0["databaseScope"] == .string("private") && $0["recordName"] == nil })
        #expect(try Self.pending(h, phoneStream.session, after: start).isEmpty)
        #expect(h.call("subscriptions/lookup", .object(["subscriptions": .array([.object(["subscriptionID": .string("done")])])]),
                       token: ann)["subscriptions"]?.arrayValue?.first?["serverErrorCode"]?.stringValue == "NOT_FOUND")

        // The laptop writes next: the phone hears of it; the laptop, having seen the phone's changes, does not
        // hear of its own; but a laptop still behind the phone's change is told.
        let seen = try Subscriptions(h.service.core).latestPosition(laptop.session, deadline: nil)
        #expect(h.modify("Lists", [Self.item("d", done: 0)], token: ann).status == 200)
        #expect(try Self.pending(h, phoneStream.session, after: seen).map { $0["subscriptionID"]?.stringValue } == ["lists"])
        #expect(try Self.pending(h, laptop.session, after: seen).isEmpty)
        #expect(try Self.pending(h, laptop.session, after: start).count == 2)
    }

    @Test func sharedDatabaseSubscriptionsFollowTheShareAndStopWithIt() throws {
        let h = try ServiceHarness()
        let (ann, annName) = try h.signUp("ann")
        let bob = try h.signUp("bob").token
        try h.createZone("Lists", token: ann)
        #expect(h.modify("Lists", [Self.item("a", done: 0)], token: ann).status == 200)
        let zoneID: JSON = .object(["zoneName": .string("Lists"), "ownerRecordName": .string(annName)])
        #expect(h.call("shares/create", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                 "publicPermission": .string("readWrite")]), token: ann).status == 200)
        let url = try #require(h.call("shares/url", .object(["zoneID": .object(["zoneName": .string("Lists")])]),
                                      token: ann)["url"]?.stringValue)
        #expect(h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]), token: bob,
                       database: "shared").status == 200)
        let subscribed = h.call("subscriptions/modify", .object(["operations": .array([
            Self.subscribe("create", .object(["subscriptionID": .string("shared-lists"), "subscriptionType": .string("zone"),
                                              "zoneID": zoneID])),
            Self.subscribe("create", .object(["subscriptionID": .string("shared-all"), "subscriptionType": .string("database")])),
        ])]), token: bob, database: "shared")
        #expect(subscribed["subscriptions"]?.arrayValue?.allSatisfy { $0["serverErrorCode"] == nil } == true,
                "\(subscribed.json.serialized())")
        let bobStream = try Self.pushSession(h, token: bob)
        let start = try Subscriptions(h.service.core).latestPosition(bobStream.session, deadline: nil)

        #expect(h.modify("Lists", [Self.item("b", done: 0)], token: ann).status == 200)
        let heard = try Self.pending(h, bobStream.session, after: start)
        #expect(heard.compactMap { $0["subscriptionID"]?.stringValue }.sorted() == ["shared-all", "shared-lists"])
        #expect(heard.allSatisfy { $0["databaseScope"] == .string("shared") })

        // Ann stops sharing: Bob hears that once (his shared database changed), then nothing of her writes.
        #expect(h.call("shares/modify", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                 "publicPermission": .string("none")]), token: ann).status == 200)
        let cut = try Subscriptions(h.service.core).latestPosition(bobStream.session, deadline: nil)
        #expect(cut > start)
        #expect(h.modify("Lists", [Self.item("c", done: 0)], token: ann).status == 200)
        #expect(try Self.pending(h, bobStream.session, after: cut).isEmpty)
        #expect(try Subscriptions(h.service.core).latestPosition(bobStream.session, deadline: nil) == cut)
    }

    @Test func pushTokensAreRefusedUntilRegisteredAndTheOldTokenRequestStillMakesABearerToken() throws {
        let h = try ServiceHarness()
        let ann = try h.signUp("ann").token
        let bob = try h.signUp("bob").token
        let made = h.call("tokens/create", .object(["apnsEnvironment": .string("development")]), token: ann)
        let text = try #require(made["apnsToken"]?.stringValue)
        #expect(throws: ServiceError.self) { try Subscriptions(h.service.core).openSession(pushToken: text, deadline: nil) }
        #expect(h.call("tokens/register", .object(["apnsEnvironment": .string("development"), "apnsToken": .string(text)]),
                       token: bob).code == "NOT_FOUND")
        #expect(h.call("tokens/create", .object(["apnsEnvironment": .string("sandbox")]), token: ann).code == "BAD_REQUEST")
        #expect(h.raw("GET", "/push/lp_" + String(repeating: "0", count: 64)).code == "AUTHENTICATION_FAILED")
        #expect(h.raw("GET", "/push/nonsense").code == "AUTHENTICATION_FAILED")

        // A device keeps its 8 newest push tokens: a ninth replaces the oldest, which then opens nothing.
        let first = try Self.pushSession(h, token: bob)
        h.clock.advance(1)
        for _ in 0..<8 {
            #expect(h.call("tokens/create", .object(["apnsEnvironment": .string("production")]), token: bob).status == 200)
            h.clock.advance(1)
        }
        #expect(try Subscriptions(h.service.core).openSession(pushToken: first.text, deadline: nil) == nil)

        // The bearer-token request under its old name: answered, marked deprecated; tokens/issue is its name.
        let old = h.call("tokens/create", .object(["lifetimeSeconds": .int(3600)]), token: ann)
        #expect(old.status == 200 && old["token"]?.stringValue?.hasPrefix("lt_") == true)
        #expect(old.response.header("Deprecation") == "true")
        let issued = h.call("tokens/issue", token: ann)
        #expect(issued["token"]?.stringValue?.hasPrefix("lt_") == true && issued.response.header("Deprecation") == nil)
    }

    /// A streamed body keeps at most its limit for a reader that does not take it: past it the reader is cut off
    /// (the content reader ends the answer with an error) and nothing more is queued.
    @Test func aStreamBodyCutsOffAReaderThatFallsBehind() throws {
        let body = HTTPStreamBody(limit: 100)
        #expect(body.send([UInt8](repeating: 1, count: 60)))
        #expect(body.backlog == 60)
        #expect(!body.send([UInt8](repeating: 2, count: 60)), "past the limit")
        #expect(!body.send([3]), "cut off: nothing more is queued")
        var buffer = [CChar](repeating: 0, count: 16)
        #expect(buffer.withUnsafeMutableBufferPointer { body.read(into: $0.baseAddress!, capacity: 16) } == -2)
        let open = HTTPStreamBody(limit: 100)
        #expect(open.send(Array("abc".utf8)))
        #expect(buffer.withUnsafeMutableBufferPointer { open.read(into: $0.baseAddress!, capacity: 16) } == 3)
        open.finish()
        #expect(buffer.withUnsafeMutableBufferPointer { open.read(into: $0.baseAddress!, capacity: 16) } == -1, "the end")
    }

    /// The stream on a real socket: `ready`, a change from another device, nothing of its own, a reconnect
    /// with `Last-Event-ID`, a second stream of the same device replacing the first, and the end of the
    /// stream once its device token is revoked (checked at each heartbeat).
    @Test func thePushStreamDeliversResumesAndEnds() throws {
        let h = try ServiceHarness { $0.pushHeartbeatSeconds = 1 }
        let server = try HTTPServer(handler: h.service, configuration: HTTPServerConfiguration(port: 0))
        defer { server.shutdown() }
        let ann = try h.signUp("ann").token
        let phone = try #require(h.call("tokens/issue", token: ann)["token"]?.stringValue)
        let phoneID = try #require(h.call("tokens/list", token: phone)["tokens"]?.arrayValue?
            .first { $0["current"] == .bool(true) }?["tokenID"]?.stringValue)
        try h.createZone("Lists", token: ann)
        #expect(h.call("subscriptions/modify", .object(["operations": .array([Self.subscribe("create", Self.zoneSub)])]),
                       token: ann).status == 200)
        let push = try Self.pushSession(h, token: phone)

        func open(lastEventID: String? = nil) throws -> RawHTTPClient {
            let client = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
            var head = "GET /push/\(push.text) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n"
            if let lastEventID { head += "Last-Event-ID: \(lastEventID)\r\n" }
            try client.write(Array((head + "\r\n").utf8))
            return client
        }
        let stream = try open()
        let ready = try stream.readUntil("event: ready")
        #expect(ready.found && ready.text.contains("200") && ready.text.lowercased().contains("text/event-stream"))
        #expect(try stream.readUntil("\n\n").found)

        #expect(h.modify("Lists", [Self.item("a", done: 0)], token: ann).status == 200)
        let first = try stream.readUntil("event: notification")
        #expect(first.found, "\(first.text)")
        let data = try stream.readUntil("\n\n").text
        #expect(data.contains("\"subscriptionID\":\"lists\""))
        let id = try #require(first.text.components(separatedBy: "id: ").last?.split(separator: "\n").first.map(String.init))

        // The phone's own write is not announced to it (only keep-alive comments come within a heartbeat).
        #expect(h.modify("Lists", [Self.item("b", done: 0)], token: phone).status == 200)
        #expect(h.modify("Lists", [Self.item("c", done: 0)], token: ann).status == 200)
        let second = try stream.readUntil("event: notification")
        #expect(second.found)
        _ = try stream.readUntil("\n\n")

        // A reconnect from the first notification's id gets the later change again (coalesced, once); the old
        // stream is told it was replaced and ends.
        let resumed = try open(lastEventID: id)
        let replay = try resumed.readUntil("event: notification")
        #expect(replay.found, "\(replay.text)")
        let replaced = try stream.readUntil("event: replaced")
        #expect(replaced.found)
        #expect(try stream.readUntil("\r\n0\r\n\r\n").found) // the last chunk: the old stream is over

        // Revoking the phone's token ends its stream at the next heartbeat.
        #expect(h.call("tokens/revoke", .object(["tokens": .array([.object(["tokenID": .string(phoneID)])])]),
                       token: ann).status == 200)
        let revoked = try resumed.readUntil("event: revoked")
        #expect(revoked.found, "\(revoked.text)")
    }
}
