import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// `changes/database`, `changes/zone`, the tombstone horizon and the `changes/wait` long poll.
@Suite(.tags(.postgres)) struct ChangeFeedTests {
    private func zoneFeed(_ h: ServiceHarness, _ token: String, zone: String = "Lists", syncToken: String? = nil,
                          limit: Int? = nil) -> JSON {
        var request: [String: JSON] = ["zoneID": .object(["zoneName": .string(zone)])]
        if let syncToken { request["syncToken"] = .string(syncToken) }
        if let limit { request["resultsLimit"] = .int(Int64(limit)) }
        return h.call("changes/zone", .object(["zones": .array([.object(request)])]), token: token).zones.first ?? .null
    }

    private func databaseFeed(_ h: ServiceHarness, _ token: String, syncToken: String? = nil, limit: Int? = nil)
        -> ServiceHarness.Reply {
        var body: [String: JSON] = [:]
        if let syncToken { body["syncToken"] = .string(syncToken) }
        if let limit { body["resultsLimit"] = .int(Int64(limit)) }
        return h.call("changes/database", .object(body), token: token)
    }

    @Test func zoneFeedPagesWithMoreComingAndListsEachRecordOnce() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        _ = h.modify("Lists", (0..<23).map { operation("create", "r\($0)") }, token: token)
        // Edit some again: each record still appears once, at its latest position.
        _ = h.modify("Lists", (0..<5).map { operation("forceUpdate", "r\($0)", fields: ["n": value(.int(1))]) }, token: token)
        _ = h.modify("Lists", [operation("forceDelete", "r7")], token: token)

        var names: [String] = []
        var syncToken: String?
        var pages = 0
        while true {
            let page = zoneFeed(h, token, syncToken: syncToken, limit: 5)
            names += (page["records"]?.arrayValue ?? []).compactMap { $0["recordName"]?.stringValue }
            syncToken = page["syncToken"]?.stringValue
            pages += 1
            if page["moreComing"] != .bool(true) { break }
        }
        #expect(pages == 5)
        #expect(names.count == 23 && Set(names).count == 23)
        #expect(names.suffix(6) == ["r0", "r1", "r2", "r3", "r4", "r7"]) // commit order
        let deleted = zoneFeed(h, token).objectValue?["records"]?.arrayValue?.first { $0["recordName"] == .string("r7") }
        #expect(deleted?["deleted"] == .bool(true))
        // Nothing new: an empty page and the same token.
        let quiet = zoneFeed(h, token, syncToken: syncToken)
        #expect(quiet["records"] == .array([]) && quiet["moreComing"] == .bool(false))
        #expect(quiet["syncToken"]?.stringValue == syncToken)
        // One more change shows up alone.
        _ = h.modify("Lists", [operation("forceUpdate", "r9", fields: ["n": value(.int(2))])], token: token)
        let next = zoneFeed(h, token, syncToken: syncToken)
        #expect(next["records"]?.arrayValue?.compactMap { $0["recordName"]?.stringValue } == ["r9"])
        // Garbage and foreign tokens.
        #expect(zoneFeed(h, token, syncToken: "garbage")["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        let databaseToken = try #require(databaseFeed(h, token)["syncToken"]?.stringValue)
        #expect(zoneFeed(h, token, syncToken: databaseToken)["serverErrorCode"]?.stringValue == "BAD_REQUEST")
    }

    @Test func databaseFeedReportsChangedAndDeletedZones() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        for name in ["A", "B", "C"] { try h.createZone(name, token: token) }
        let first = databaseFeed(h, token, limit: 2)
        #expect(first.zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue } == ["A", "B"])
        #expect(first["moreComing"] == .bool(true))
        let second = databaseFeed(h, token, syncToken: first["syncToken"]?.stringValue)
        #expect(second.zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue } == ["C"])
        let position = try #require(second["syncToken"]?.stringValue)

        _ = h.modify("B", [operation("create", "x")], token: token)
        _ = h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("delete"), "zone": .object(["zoneID": .object(["zoneName": .string("C")])])]),
        ])]), token: token)
        let changes = databaseFeed(h, token, syncToken: position)
        #expect(changes.zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue } == ["B", "C"])
        #expect(changes.zones[1]["deleted"] == .bool(true))
        #expect(changes.zones[0]["deleted"] == nil)
    }

    @Test func recreatedZonesAndPurgedTombstonesExpireTokens() throws {
        let h = try ServiceHarness { $0.tombstoneHorizonMilliseconds = 60_000 }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        _ = h.modify("Lists", [operation("create", "a"), operation("create", "b")], token: token)
        let before = try #require(zoneFeed(h, token)["syncToken"]?.stringValue)

        // A deletion within the horizon is delivered.
        _ = h.modify("Lists", [operation("forceDelete", "a")], token: token)
        #expect(zoneFeed(h, token, syncToken: before)["records"]?.arrayValue?.first?["deleted"] == .bool(true))
        // Past the horizon the tombstone is purged; a token from before it has expired, a later one has not.
        let after = try #require(zoneFeed(h, token)["syncToken"]?.stringValue)
        h.clock.advance(120_000)
        let report = try h.service.purgeExpired()
        #expect(report.tombstones == 1)
        let expired = zoneFeed(h, token, syncToken: before)
        #expect(expired["serverErrorCode"]?.stringValue == "CHANGE_TOKEN_EXPIRED")
        #expect(zoneFeed(h, token, syncToken: after)["serverErrorCode"] == nil)
        // Starting over works, and no longer lists the purged record.
        #expect(zoneFeed(h, token)["records"]?.arrayValue?.compactMap { $0["recordName"]?.stringValue } == ["b"])

        // Delete and recreate the zone: the old token names the old zone.
        for type in ["delete", "create"] {
            _ = h.call("zones/modify", .object(["operations": .array([
                .object(["operationType": .string(type), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])]),
            ])]), token: token)
        }
        #expect(zoneFeed(h, token, syncToken: after)["serverErrorCode"]?.stringValue == "CHANGE_TOKEN_EXPIRED")

        // The database log: a purged deleted zone expires older database tokens.
        let databaseBefore = try #require(databaseFeed(h, token)["syncToken"]?.stringValue)
        try h.createZone("Old", token: token)
        _ = h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("delete"), "zone": .object(["zoneID": .object(["zoneName": .string("Old")])])]),
        ])]), token: token)
        h.clock.advance(120_000)
        #expect(try h.service.purgeExpired().zones >= 1)
        #expect(databaseFeed(h, token, syncToken: databaseBefore).code == "CHANGE_TOKEN_EXPIRED")
    }

    @Test func waitReturnsOnAChangeOrATimeout() async throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let syncToken = try #require(h.call("changes/database", token: token)["syncToken"]?.stringValue)

        // Nothing changes: the timeout answers.
        let quiet = h.call("changes/wait", .object(["syncToken": .string(syncToken), "timeout": .int(0)]), token: token)
        #expect(quiet["changed"] == .bool(false))

        // A write from another client wakes the waiter.
        let box = ResponseBox()
        let body = JSON.object(["syncToken": .string(syncToken), "timeout": .int(30)]).serializedBytes()
        h.service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/changes/wait",
                                     headers: ["Authorization": "Bearer " + token], body: body)) { box.set($0) }
        #expect(h.service.notifier.waiterCount == 1)
        _ = h.modify("Lists", [operation("create", "x")], token: token)
        let woken = box.wait()
        #expect(try JSON.parse(woken.body)["changed"] == .bool(true))

        // A change that landed before the wait began answers at once.
        let early = h.call("changes/wait", .object(["syncToken": .string(syncToken), "timeout": .int(30)]), token: token)
        #expect(early["changed"] == .bool(true))

        // Shutdown answers open waits with TRY_AGAIN_LATER.
        let latest = try #require(h.call("changes/database", token: token)["syncToken"]?.stringValue)
        let pending = ResponseBox()
        h.service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/changes/wait",
                                     headers: ["Authorization": "Bearer " + token],
                                     body: JSON.object(["syncToken": .string(latest)]).serializedBytes())) { pending.set($0) }
        h.service.beginShutdown()
        let answer = pending.wait()
        #expect(answer.status == 503)
        #expect(try JSON.parse(answer.body)["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
    }

    @Test func publicDatabaseIsSharedReadableAndCreatorWritable() throws {
        let h = try ServiceHarness()
        let (ann, _) = try h.signUp("ann")
        let (bob, _) = try h.signUp("bob")
        func modify(_ ops: [JSON], _ token: String) -> ServiceHarness.Reply {
            h.call("records/modify", .object(["zoneID": .object(["zoneName": .string("_defaultZone")]),
                                              "operations": .array(ops)]), token: token, database: "public")
        }
        #expect(modify([operation("create", "notice", fields: ["text": value(.string("hi"))])], ann).records[0]["serverErrorCode"] == nil)
        let read = h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("_defaultZone")]),
                                                     "records": .array([.object(["recordName": .string("notice")])])]),
                          token: bob, database: "public")
        #expect(read.records[0]["fields"]?["text"]?["value"]?.stringValue == "hi")
        #expect(modify([operation("forceUpdate", "notice", fields: ["text": value(.string("mine"))])], bob)
            .records[0]["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
        #expect(modify([operation("create", "bobs")], bob).records[0]["serverErrorCode"] == nil)
        #expect(h.call("changes/database", token: ann, database: "public").code == "BAD_REQUEST")
        #expect(h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Other")]), "records": .array([])]),
                       token: ann, database: "public").code == "ZONE_NOT_FOUND")
        #expect(h.call("zones/list", token: ann, database: "shared").zones.isEmpty)
    }
}
