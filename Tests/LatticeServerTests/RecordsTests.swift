import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// Zones and `records/*` operations, their limits and their atomicity, in-process.
@Suite(.tags(.postgres)) struct RecordsTests {
    private func setUp(_ configure: (inout ServiceConfiguration) -> Void = { _ in }) throws -> (ServiceHarness, String) {
        let h = try ServiceHarness(configure: configure)
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        return (h, token)
    }

    private func lookup(_ h: ServiceHarness, _ name: String, token: String, zone: String = "Lists") -> JSON {
        h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string(zone)]),
                                          "records": .array([.object(["recordName": .string(name)])])]),
               token: token).records.first ?? .null
    }

    @Test func zonesCreateListLookupDelete() throws {
        let (h, token) = try setUp()
        let names = h.call("zones/list", token: token).zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue }
        #expect(names == ["_defaultZone", "Lists"])
        // Creating an existing zone returns it.
        try h.createZone("Lists", token: token)
        let looked = h.call("zones/lookup", .object(["zones": .array([
            .object(["zoneName": .string("Lists")]), .object(["zoneName": .string("Nope")]),
        ])]), token: token)
        #expect(looked.zones[0]["zoneID"]?["zoneName"]?.stringValue == "Lists")
        #expect(looked.zones[1]["serverErrorCode"]?.stringValue == "ZONE_NOT_FOUND")

        #expect(h.modify("Lists", [operation("create", "milk")], token: token).records.count == 1)
        let deleted = h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("delete"), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])]),
        ])]), token: token)
        #expect(deleted.zones.first?["deleted"] == .bool(true))
        #expect(h.modify("Lists", [operation("create", "milk")], token: token).code == "ZONE_NOT_FOUND")
        try h.createZone("Lists", token: token)
        #expect(lookup(h, "milk", token: token)["serverErrorCode"]?.stringValue == "NOT_FOUND") // records went with the zone
        let defaultZone = h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("delete"), "zone": .object(["zoneID": .object(["zoneName": .string("_defaultZone")])])]),
        ])]), token: token)
        #expect(defaultZone.zones.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
    }

    @Test func illegalNamesAre400AndOddLegalNamesRoundTripByteForByte() throws {
        let (h, token) = try setUp()
        for bad in ["", "a/b", "..", "_private", "tab\there", String(repeating: "z", count: 256)] {
            let zone = h.call("zones/modify", .object(["operations": .array([
                .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string(bad)])])]),
            ])]), token: token)
            #expect(zone.zones.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST", "zone \(bad)")
            let record = h.modify("Lists", [operation("create", bad)], token: token)
            #expect(record.records.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST", "record \(bad)")
        }
        for odd in ["'; DROP TABLE x;--", "%", "100%25", "\"quoted\"", "it's", "a b", "Ω"] {
            let isASCII = odd.utf8.allSatisfy { $0 < 0x80 }
            try? h.createZone(odd, token: token)
            let zones = h.call("zones/list", token: token).zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue }
            #expect(zones.contains(odd) == isASCII, "zone \(odd)")
            guard isASCII else { continue }
            let created = h.modify(odd, [operation("create", odd, fields: ["text": value(.string(odd))])], token: token)
            #expect(created.records.first?["recordName"]?.stringValue == odd)
            let found = lookup(h, odd, token: token, zone: odd)
            #expect(Array(found["recordName"]?.stringValue?.utf8 ?? "".utf8) == Array(odd.utf8))
            #expect(found["fields"]?["text"]?["value"]?.stringValue == odd)
            #expect(found["zoneID"]?["zoneName"]?.stringValue == odd)
        }
    }

    @Test func everyOperationType() throws {
        let (h, token) = try setUp()
        // create
        let created = h.modify("Lists", [operation("create", "milk", fields: [
            "text": value(.string("Milk")), "done": value(.int(0)),
            "tags": .object(["value": .array([.string("dairy")]), "type": .string("STRING_LIST")]),
        ])], token: token).records[0]
        let tag1 = try #require(created["recordChangeTag"]?.stringValue)
        #expect(created["fields"]?["text"]?["value"]?.stringValue == "Milk")
        #expect(created["created"]?["userRecordName"] != nil && created["modified"]?["timestamp"] != nil)
        #expect(h.modify("Lists", [operation("create", "milk")], token: token).records[0]["serverErrorCode"]?.stringValue == "EXISTS")

        // update needs the current tag; a stale one is a CONFLICT carrying the server's record.
        let updated = h.modify("Lists", [operation("update", "milk", recordType: nil, fields: ["done": value(.int(1))],
                                                   tag: tag1)], token: token).records[0]
        let tag2 = try #require(updated["recordChangeTag"]?.stringValue)
        #expect(tag2 != tag1)
        #expect(updated["fields"]?["text"]?["value"]?.stringValue == "Milk") // untouched fields stay
        let stale = h.modify("Lists", [operation("update", "milk", recordType: nil, fields: ["done": value(.int(0))],
                                                 tag: tag1)], token: token).records[0]
        #expect(stale["serverErrorCode"]?.stringValue == "CONFLICT")
        #expect(stale["serverRecord"]?["recordChangeTag"]?.stringValue == tag2)
        #expect(stale["serverRecord"]?["fields"]?["done"]?["value"]?.intValue == 1)
        let untagged = h.modify("Lists", [operation("update", "milk", recordType: nil, fields: ["done": value(.int(0))])],
                                token: token).records[0]
        #expect(untagged["serverErrorCode"]?.stringValue == "BAD_REQUEST")

        // forceUpdate skips the check; list add and remove.
        let forced = h.modify("Lists", [operation("forceUpdate", "milk", recordType: nil, fields: [
            "tags": .object(["add": .array([.string("cold"), .string("fresh")]), "remove": .array([.string("dairy")]),
                             "type": .string("STRING_LIST")]),
        ])], token: token).records[0]
        #expect(forced["fields"]?["tags"]?["value"] == .array([.string("cold"), .string("fresh")]))
        let tag3 = try #require(forced["recordChangeTag"]?.stringValue)

        // replace clears what it does not name.
        let replaced = h.modify("Lists", [operation("replace", "milk", fields: ["text": value(.string("Oat milk"))], tag: tag3)],
                                token: token).records[0]
        #expect(replaced["fields"]?["text"]?["value"]?.stringValue == "Oat milk")
        #expect(replaced["fields"]?["done"]?["value"] == .null)
        #expect(replaced["fields"]?["tags"]?["value"] == .array([]))
        // forceReplace creates a missing record.
        let fresh = h.modify("Lists", [operation("forceReplace", "eggs", fields: ["text": value(.string("Eggs"))])],
                             token: token).records[0]
        #expect(fresh["fields"]?["text"]?["value"]?.stringValue == "Eggs")
        let tag4 = try #require(replaced["recordChangeTag"]?.stringValue)

        // delete with a stale tag conflicts; with the right one it deletes; forceDelete needs no tag.
        #expect(h.modify("Lists", [operation("delete", "milk", tag: tag1)], token: token).records[0]["serverErrorCode"]?
            .stringValue == "CONFLICT")
        let gone = h.modify("Lists", [operation("delete", "milk", tag: tag4)], token: token).records[0]
        #expect(gone["deleted"] == .bool(true))
        #expect(lookup(h, "milk", token: token)["serverErrorCode"]?.stringValue == "NOT_FOUND")
        #expect(h.modify("Lists", [operation("forceDelete", "eggs")], token: token).records[0]["deleted"] == .bool(true))
        #expect(h.modify("Lists", [operation("forceDelete", "eggs")], token: token).records[0]["serverErrorCode"]?
            .stringValue == "NOT_FOUND")
        // A deleted record can be created again.
        #expect(h.modify("Lists", [operation("create", "milk")], token: token).records[0]["deleted"] == .bool(false))
    }

    @Test func atomicBatchesAreAllOrNothing() throws {
        let (h, token) = try setUp()
        let reply = h.modify("Lists", [
            operation("create", "a"), operation("create", "b"), operation("update", "missing", tag: "x"),
        ], token: token)
        #expect(reply.records.map { $0["serverErrorCode"]?.stringValue } == ["ATOMIC_ERROR", "ATOMIC_ERROR", "NOT_FOUND"])
        #expect(reply.records.map { $0["recordName"]?.stringValue } == ["a", "b", "missing"])
        #expect(lookup(h, "a", token: token)["serverErrorCode"]?.stringValue == "NOT_FOUND")
        #expect(lookup(h, "b", token: token)["serverErrorCode"]?.stringValue == "NOT_FOUND")

        let partial = h.modify("Lists", [operation("create", "a"), operation("update", "missing", tag: "x")], token: token,
                               extra: ["atomic": .bool(false)])
        #expect(partial.records[0]["recordChangeTag"] != nil)
        #expect(partial.records[1]["serverErrorCode"]?.stringValue == "NOT_FOUND")
        #expect(lookup(h, "a", token: token)["recordName"]?.stringValue == "a")
    }

    @Test func limitsAreEnforcedAndNothingIsWritten() throws {
        let (h, token) = try setUp { $0.quotaBytesPerDatabase = 64 * 1024 }
        // 401 operations.
        let many = (0...400).map { operation("create", "r\($0)") }
        let tooMany = h.modify("Lists", many, token: token)
        #expect(tooMany.status == 413 && tooMany.code == "LIMIT_EXCEEDED")
        #expect(tooMany["reason"]?.stringValue?.contains("400") == true)
        #expect(lookup(h, "r0", token: token)["serverErrorCode"]?.stringValue == "NOT_FOUND")
        // 400 are fine.
        #expect(h.modify("Lists", Array(many.prefix(400)), token: token).records.allSatisfy { $0["serverErrorCode"] == nil })

        // A record over 1 MB (in a request under 2 MB).
        let (h2, token2) = try setUp()
        let big = String(repeating: "x", count: 1_100_000)
        let oversized = h2.modify("Lists", [operation("create", "big", fields: ["text": value(.string(big))]),
                                            operation("create", "small")], token: token2)
        #expect(oversized.records[0]["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED")
        #expect(oversized.records[1]["serverErrorCode"]?.stringValue == "ATOMIC_ERROR")
        #expect(lookup(h2, "small", token: token2)["serverErrorCode"]?.stringValue == "NOT_FOUND")

        // The body cap is the adapter's to enforce before buffering; the service names it and answers it.
        #expect(h.service.maximumBodySize == 2 * 1024 * 1024)
        let body = h.service.responseForOversizedBody()
        #expect(body.status == 413)
        #expect(try JSON.parse(body.body)["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED")

        // Quota: 64 KiB per database here.
        let chunk = String(repeating: "q", count: 20_000)
        let quota = h.modify("Lists", (0..<5).map { operation("create", "q\($0)", fields: ["text": value(.string(chunk))]) },
                             token: token)
        #expect(quota.records.contains { $0["serverErrorCode"]?.stringValue == "QUOTA_EXCEEDED" })
        #expect(lookup(h, "q0", token: token)["serverErrorCode"]?.stringValue == "NOT_FOUND")
    }

    @Test func clientOperationIDsMakeRetriesApplyOnce() throws {
        let (h, token) = try setUp()
        let ops = [operation("create", "a", fields: ["n": value(.int(1))])]
        let first = h.modify("Lists", ops, token: token, extra: ["clientOperationID": .string("op-1")])
        let retry = h.modify("Lists", ops, token: token, extra: ["clientOperationID": .string("op-1")])
        #expect(first.response.body == retry.response.body)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        // Without the id, the same create is a second attempt and fails.
        #expect(h.modify("Lists", ops, token: token).records[0]["serverErrorCode"]?.stringValue == "EXISTS")
        let misuse = h.modify("Lists", [operation("create", "b")], token: token, extra: ["clientOperationID": .string("op-1")])
        #expect(misuse.code == "BAD_REQUEST")
        // The feed holds the record once.
        let feed = h.call("changes/zone", .object(["zones": .array([.object(["zoneID": .object(["zoneName": .string("Lists")])])])]),
                          token: token)
        #expect(feed.zones[0]["records"]?.arrayValue?.count == 1)
        // A failed atomic batch is not remembered: the retry runs again.
        let failing = [operation("update", "zzz", tag: "t")]
        #expect(h.modify("Lists", failing, token: token, extra: ["clientOperationID": .string("op-2")]).response
            .header("Lattice-Replayed") == nil)
        #expect(h.modify("Lists", failing, token: token, extra: ["clientOperationID": .string("op-2")]).response
            .header("Lattice-Replayed") == nil)
    }

    @Test func crdtStatesMergeAndFutureStampsAreRefused() throws {
        let (h, token) = try setUp()
        let (_, owner) = (token, h.call("users/current", token: token)["userRecordName"]!.stringValue!)
        let zoneID = try ZoneID(zoneName: "Lists", ownerRecordName: owner)
        let now = UInt64(h.clock.now)
        var laptop = HybridLogicalClock(replica: ReplicaID(0xA), time: { now })
        var phone = HybridLogicalClock(replica: ReplicaID(0xB), time: { now + 5 })
        var a = try Record(id: RecordID(recordName: "milk", zoneID: zoneID), recordType: "Item", createdAt: laptop.now())
        var b = a
        try a.set("text", to: .string("Milk"), at: laptop.now())
        try b.set("done", to: .int64(1), at: phone.now())
        try b.add(.string("dairy"), to: "tags", at: phone.now())
        for state in [a, b, a] { // the repeat is idempotent
            let reply = h.modify("Lists", [.object(["operationType": .string("forceUpdate"), "record": state.cloudKitJSON])],
                                 token: token)
            #expect(reply.records[0]["serverErrorCode"] == nil, "\(reply.json.serialized())")
        }
        let merged = lookup(h, "milk", token: token)
        #expect(merged["fields"]?["text"]?["value"]?.stringValue == "Milk")
        #expect(merged["fields"]?["done"]?["value"]?.intValue == 1)
        #expect(merged["fields"]?["tags"]?["value"] == .array([.string("dairy")]))
        let parsed = try Record(cloudKitJSON: merged)
        #expect(parsed == a.merging(b))

        var future = HybridLogicalClock(replica: ReplicaID(0xC), time: { now + 3_600_000 })
        try b.set("text", to: .string("From the future"), at: future.now())
        let refused = h.modify("Lists", [.object(["operationType": .string("forceUpdate"), "record": b.cloudKitJSON])],
                               token: token)
        #expect(refused.records[0]["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        #expect(lookup(h, "milk", token: token)["fields"]?["text"]?["value"]?.stringValue == "Milk")
    }

    @Test func twoClientsRacingOnOneRecordLoseNothing() throws {
        let (h, token) = try setUp()
        #expect(h.modify("Lists", [operation("create", "shared")], token: token).records[0]["serverErrorCode"] == nil)
        let rounds = 50
        DispatchQueue.concurrentPerform(iterations: 2) { client in
            for round in 0..<rounds {
                let reply = h.modify("Lists", [operation("forceUpdate", "shared", recordType: nil, fields: [
                    "c\(client)_\(round)": value(.int(Int64(round))),
                    "tags": .object(["add": .array([.string("c\(client)-\(round)")])]),
                ])], token: token)
                precondition(reply.records.first?["serverErrorCode"] == nil, reply.json.serialized())
            }
        }
        let record = lookup(h, "shared", token: token)
        for client in 0..<2 {
            for round in 0..<rounds {
                #expect(record["fields"]?["c\(client)_\(round)"]?["value"]?.intValue == Int64(round))
            }
        }
        #expect(record["fields"]?["tags"]?["value"]?.arrayValue?.count == 2 * rounds)
    }

    @Test func queriesFilterSortAndPage() throws {
        let (h, token) = try setUp()
        var ops: [JSON] = []
        for i in 0..<25 {
            ops.append(operation("create", String(format: "item%02d", i), fields: [
                "position": value(.int(Int64((i * 7) % 25))),
                "text": value(.string(i % 2 == 0 ? "apple \(i)" : "banana \(i)")),
                "tags": .object(["value": .array([.string(i % 3 == 0 ? "fruit" : "other")]), "type": .string("STRING_LIST")]),
            ]))
        }
        ops.append(operation("create", "note", recordType: "Note", fields: ["position": value(.int(1))]))
        #expect(h.modify("Lists", ops, token: token).records.allSatisfy { $0["serverErrorCode"] == nil })

        func query(_ filters: [JSON], sort: [JSON] = [], limit: Int? = nil, marker: String? = nil) -> ServiceHarness.Reply {
            var body: [String: JSON] = [
                "zoneID": .object(["zoneName": .string("Lists")]),
                "query": .object(["recordType": .string("Item"), "filterBy": .array(filters), "sortBy": .array(sort)]),
            ]
            if let limit { body["resultsLimit"] = .int(Int64(limit)) }
            if let marker { body["continuationMarker"] = .string(marker) }
            return h.call("records/query", .object(body), token: token)
        }
        func filter(_ comparator: String, _ field: String, _ v: JSON, type: String? = nil) -> JSON {
            var fieldValue: [String: JSON] = ["value": v]
            if let type { fieldValue["type"] = .string(type) }
            return .object(["comparator": .string(comparator), "fieldName": .string(field), "fieldValue": .object(fieldValue)])
        }
        func count(_ filters: [JSON]) -> Int { query(filters).records.count }

        #expect(count([]) == 25)
        #expect(count([filter("EQUALS", "position", .int(3))]) == 1)
        #expect(count([filter("NOT_EQUALS", "position", .int(3))]) == 24)
        #expect(count([filter("LESS_THAN", "position", .int(10))]) == 10)
        #expect(count([filter("LESS_THAN_OR_EQUALS", "position", .int(10))]) == 11)
        #expect(count([filter("GREATER_THAN", "position", .int(10))]) == 14)
        #expect(count([filter("GREATER_THAN_OR_EQUALS", "position", .int(10))]) == 15)
        #expect(count([filter("BEGINS_WITH", "text", .string("apple"))]) == 13)
        #expect(count([filter("LIST_CONTAINS", "tags", .string("fruit"))]) == 9)
        #expect(count([filter("IN", "position", .array([.int(1), .int(2), .int(99)]), type: "INT64_LIST")]) == 2)
        #expect(count([filter("BEGINS_WITH", "text", .string("apple")), filter("LESS_THAN", "position", .int(10))]) > 0)
        #expect(count([filter("BEGINS_WITH", "text", .string("apple")), filter("LIST_CONTAINS", "tags", .string("fruit"))]) == 5)
        #expect(query([filter("WITHIN", "position", .int(1))]).code == "BAD_REQUEST")
        #expect(query([filter("IN", "position", .int(1))]).code == "BAD_REQUEST")

        // Sorted pages of 7 cover every record once, in order, across a concurrent insert.
        var seen: [Int64] = []
        var marker: String?
        var pages = 0
        repeat {
            let page = query([], sort: [.object(["fieldName": .string("position"), "ascending": .bool(false)])],
                             limit: 7, marker: marker)
            #expect(page.status == 200, "\(page.json.serialized())")
            seen += page.records.compactMap { $0["fields"]?["position"]?["value"]?.intValue }
            marker = page["continuationMarker"]?.stringValue
            pages += 1
        } while marker != nil && pages < 10
        #expect(seen == (0..<25).reversed().map(Int64.init))
        #expect(pages == 4)
        #expect(query([], marker: "bm90IGEgbWFya2Vy").code == "BAD_REQUEST")
    }
}
