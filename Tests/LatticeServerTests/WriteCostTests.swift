import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// The cost of a write is bounded by its size: list edits go in bulk (sort and merge, not one linear
/// insert per element), and the caps are checked before any work. These tests assert what is stored and
/// what is refused; the time of each large request is printed, not asserted (speed lives in benchmarks).
@Suite struct WriteCostTests {
    private func strings(_ range: Range<Int>, _ prefix: String) -> JSON {
        .array(range.map { .string("\(prefix)\($0)") })
    }

    private func listCount(_ h: ServiceHarness, _ name: String, token: String) -> Int? {
        let reply = h.call("records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Big")]), "records": .array([.object(["recordName": .string(name)])]),
        ]), token: token)
        return reply.records.first?["fields"]?["tags"]?["value"]?.arrayValue?.count
    }

    @Test func largeListsAreWrittenEditedAndTrimmedInBulk() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Big", token: token)
        var timings: [String] = []
        func timed(_ label: String, _ body: () -> ServiceHarness.Reply) -> ServiceHarness.Reply {
            let start = Date()
            let reply = body()
            timings.append("\(label) \(String(format: "%.2f", Date().timeIntervalSince(start))) s")
            return reply
        }
        // A record created with a 20,000-element list (the request the issue measured at 15 s).
        let created = timed("create 20000") {
            h.modify("Big", [operation("create", "big", fields: [
                "tags": .object(["value": strings(0..<20_000, "t"), "type": .string("STRING_LIST")]),
            ])], token: token)
        }
        #expect(created.status == 200 && created.records.first?["serverErrorCode"] == nil, "\(created.json.serialized().prefix(300))")
        #expect(listCount(h, "big", token: token) == 20_000)
        // 20,000 more added and 10,000 of the first removed, in one operation.
        let edited = timed("add 20000 remove 10000") {
            h.modify("Big", [operation("forceUpdate", "big", recordType: nil, fields: [
                "tags": .object(["add": strings(20_000..<40_000, "t"), "remove": strings(0..<10_000, "t"),
                                 "type": .string("STRING_LIST")]),
            ])], token: token)
        }
        #expect(edited.records.first?["serverErrorCode"] == nil, "\(edited.json.serialized().prefix(300))")
        #expect(listCount(h, "big", token: token) == 30_000)
        // Setting the list to exactly 5,000 of its elements: everything else removed.
        let trimmed = timed("set to 5000") {
            h.modify("Big", [operation("forceUpdate", "big", recordType: nil, fields: [
                "tags": .object(["value": strings(35_000..<40_000, "t"), "type": .string("STRING_LIST")]),
            ])], token: token)
        }
        #expect(trimmed.records.first?["serverErrorCode"] == nil)
        #expect(listCount(h, "big", token: token) == 5_000)
        // Giving it the elements it already holds writes nothing: the change tag stays.
        let tag = trimmed.records.first?["recordChangeTag"]?.stringValue
        let same = h.modify("Big", [operation("forceUpdate", "big", recordType: nil, fields: [
            "tags": .object(["value": strings(35_000..<40_000, "t"), "type": .string("STRING_LIST")]),
        ])], token: token)
        #expect(same.records.first?["recordChangeTag"]?.stringValue == tag)
        print("[write cost] " + timings.joined(separator: "; "))
    }

    @Test func overTheCapsIsRefusedBeforeAnyWork() throws {
        let h = try ServiceHarness { $0.maximumListElements = 1_000; $0.maximumFieldsPerRecord = 10 }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Big", token: token)
        let tooLong = h.modify("Big", [operation("create", "a", fields: [
            "tags": .object(["value": strings(0..<1_001, "t"), "type": .string("STRING_LIST")]),
        ])], token: token)
        #expect(tooLong.records.first?["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED", "\(tooLong.json.serialized().prefix(300))")
        let tooMany = h.modify("Big", [operation("create", "b", fields: Dictionary(uniqueKeysWithValues: (0..<11).map {
            ("f\($0)", value(.int(Int64($0))))
        }))], token: token)
        #expect(tooMany.records.first?["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED")
        // At the caps, accepted.
        let atCap = h.modify("Big", [operation("create", "c", fields: [
            "tags": .object(["value": strings(0..<1_000, "t"), "type": .string("STRING_LIST")]),
        ])], token: token)
        #expect(atCap.records.first?["serverErrorCode"] == nil)
        // Nothing of the refused operations was written.
        let lookup = h.call("records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Big")]),
            "records": .array(["a", "b"].map { .object(["recordName": .string($0)]) }),
        ]), token: token)
        #expect(lookup.records.allSatisfy { $0["serverErrorCode"]?.stringValue == "NOT_FOUND" })
    }
}
