import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// Ordered lists (`T_LIST`), sets (`T_SET`) and texts (`TEXT`) through the JSON API: CloudKit's list meaning,
/// the `splices` form and its refusals, two clients that edit one text offline in the CRDT form, and queries.
@Suite struct SequenceFieldTests {
    static func field(_ value: JSON, _ type: String) -> JSON { .object(["value": value, "type": .string(type)]) }

    static func operation(_ type: String, _ name: String, _ fields: [String: JSON], recordType: String? = nil) -> JSON {
        var record: [String: JSON] = ["recordName": .string(name), "fields": .object(fields)]
        if let recordType { record["recordType"] = .string(recordType) }
        return .object(["operationType": .string(type), "record": .object(record)])
    }

    static func plain(_ field: JSON?) -> JSON {
        .object(["value": field?["value"] ?? .null, "type": field?["type"] ?? .null])
    }

    @Test func aListKeepsOrderAndRepeatsAndSplicesEditListsAndTexts() throws {
        let harness = try ServiceHarness()
        let (token, _) = try harness.signUp("ann")
        try harness.createZone("Z", token: token)
        let numbers = Self.field(.array([.int(3), .int(1), .int(3), .int(2)]), "INT64_LIST")
        let created = harness.modify("Z", [Self.operation("create", "r", [
            "numbers": numbers, "body": Self.field(.string("Line one.\nLine two."), "TEXT"),
            "tags": Self.field(.array([.string("b"), .string("a"), .string("b")]), "STRING_SET"),
        ], recordType: "Note")], token: token)
        #expect(created.status == 200 && created.records.first?["serverErrorCode"] == nil, "\(created.json.serialized())")
        let fields = created.records.first?["fields"]
        #expect(Self.plain(fields?["numbers"]) == numbers)
        #expect(Self.plain(fields?["tags"]) == Self.field(.array([.string("a"), .string("b")]), "STRING_SET"))
        #expect(Self.plain(fields?["body"]) == Self.field(.string("Line one.\nLine two."), "TEXT"))

        let spliced = harness.modify("Z", [Self.operation("forceUpdate", "r", [
            "body": .object(["splices": .array([.array([.int(0), .int(4), .string("First")]),
                                                 .array([.int(11), .int(4), .string("Second")])]), "type": .string("TEXT")]),
            "numbers": .object(["splices": .array([.array([.int(1), .int(1), .array([.int(7), .int(7)])])]),
                                "type": .string("INT64_LIST")]),
        ])], token: token)
        let after = spliced.records.first?["fields"]
        #expect(after?["body"]?["value"] == .string("First one.\nSecond two."), "\(spliced.json.serialized())")
        #expect(after?["numbers"]?["value"] == .array([.int(3), .int(7), .int(7), .int(3), .int(2)]))

        // A whole new value becomes the fewest splices: the list reads exactly what was sent.
        let whole = harness.modify("Z", [Self.operation("forceUpdate", "r", [
            "numbers": Self.field(.array([.int(2), .int(3), .int(1), .int(3)]), "INT64_LIST")])], token: token)
        #expect(whole.records.first?["fields"]?["numbers"]?["value"] == .array([.int(2), .int(3), .int(1), .int(3)]))
    }

    @Test func badSplicesAreRefusedAndChangeNothing() throws {
        let harness = try ServiceHarness()
        let (token, _) = try harness.signUp("ann")
        try harness.createZone("Z", token: token)
        _ = harness.modify("Z", [Self.operation("create", "r", [
            "numbers": Self.field(.array([.int(1)]), "INT64_LIST"), "body": Self.field(.string("abc"), "TEXT"),
        ], recordType: "Note")], token: token)
        func refusal(_ field: String, _ edit: JSON) -> String? {
            let reply = harness.modify("Z", [Self.operation("forceUpdate", "r", [field: edit])], token: token)
            return reply.records.first?["serverErrorCode"]?.stringValue ?? reply.code
        }
        let huge = JSON.int(Int64.max)
        #expect(refusal("body", .object(["splices": .array([.array([huge, .int(1), .string("")])]), "type": .string("TEXT")])) == "BAD_REQUEST")
        #expect(refusal("body", .object(["splices": .array([.array([.int(1), huge, .string("")])]), "type": .string("TEXT")])) == "BAD_REQUEST")
        #expect(refusal("numbers", .object(["splices": .array([.array([huge, huge, .array([])])]), "type": .string("INT64_LIST")])) == "BAD_REQUEST")
        #expect(refusal("body", .object(["splices": .array([.array([.int(4), .int(0), .string("x")])]), "type": .string("TEXT")])) == "BAD_REQUEST")
        #expect(refusal("body", .object(["splices": .array([.array([.int(-1), .int(0), .string("x")])]), "type": .string("TEXT")])) == "BAD_REQUEST")
        #expect(refusal("body", .object(["splices": .array([.array([.int(0), .int(0), .string("x")])])])) == "BAD_REQUEST") // no type
        #expect(refusal("body", .object(["splices": .array([]), "value": .string("x"), "type": .string("TEXT")])) == "BAD_REQUEST")
        #expect(refusal("numbers", .object(["splices": .array([.array([.int(0), .int(0), .string("x")])]), "type": .string("TEXT")])) == "BAD_REQUEST")
        #expect(refusal("body", .object(["splices": .array([.array([.int(0), .int(0), .array([.int(1)])])]), "type": .string("INT64_LIST")])) == "BAD_REQUEST")
        let many = JSON.array((0 ..< 4_097).map { _ in .array([.int(0), .int(0), .string("x")]) })
        #expect(refusal("body", .object(["splices": many, "type": .string("TEXT")])) == "LIMIT_EXCEEDED")
        // A refused batch changes nothing: the first splice of a failing request is not kept either.
        #expect(refusal("body", .object(["splices": .array([.array([.int(0), .int(0), .string("kept?")]), .array([.int(99), .int(0), .string("")])]),
                                         "type": .string("TEXT")])) == "BAD_REQUEST")
        let looked = harness.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Z")]),
                                                              "records": .array([.object(["recordName": .string("r")])])]), token: token)
        #expect(looked.records.first?["fields"]?["body"]?["value"] == .string("abc"))
        #expect(looked.records.first?["fields"]?["numbers"]?["value"] == .array([.int(1)]))
    }

    /// Two clients of the JSON API hold the record's CRDT state, edit different paragraphs of its text
    /// offline (each on its own replica), and send their states: both edits are kept.
    @Test func twoClientsEditDifferentParagraphsOfflineInTheCRDTFormAndBothKeepTheirEdits() throws {
        let harness = try ServiceHarness()
        let (token, _) = try harness.signUp("ann")
        try harness.createZone("Z", token: token)
        _ = harness.modify("Z", [Self.operation("create", "note", [
            "body": Self.field(.string("Milk, 1 litre.\nEggs, a dozen.\nBread."), "TEXT")], recordType: "Note")], token: token)
        let looked = harness.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Z")]),
                                                              "records": .array([.object(["recordName": .string("note")])])]), token: token)
        let stateJSON = try #require(looked.records.first)
        let base = try RecordFrame(encoding: try Record(cloudKitJSON: stateJSON))
        let ms = UInt64(harness.clock.now)
        func edited(_ replica: UInt64, _ change: (inout RecordEdit, Stamp) throws -> Void) throws -> JSON {
            var edit = try RecordEdit(editing: base)
            try change(&edit, Stamp(hlc: HLC(milliseconds: ms + 1, counter: 0), replica: ReplicaID(replica)))
            return try #require(try edit.applied()).decoded().cloudKitJSON
        }
        let first = try edited(0xA11CE) { edit, stamp in try edit.spliceText("body", at: 0, deleting: 4, inserting: "Oat milk", at: stamp) }
        let second = try edited(0xB0B) { edit, stamp in
            try edit.setText("body", to: "Milk, 1 litre.\nEggs, a dozen.\nRye bread, sliced.", at: stamp)
        }
        for state in [second, first] {
            let sent = harness.modify("Z", [.object(["operationType": .string("forceUpdate"), "record": state])], token: token)
            #expect(sent.records.first?["serverErrorCode"] == nil, "\(sent.json.serialized())")
        }
        let final = harness.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Z")]),
                                                             "records": .array([.object(["recordName": .string("note")])])]), token: token)
        #expect(final.records.first?["fields"]?["body"]?["value"] == .string("Oat milk, 1 litre.\nEggs, a dozen.\nRye bread, sliced."),
                "\(final.json.serialized())")
    }

    @Test func queriesMatchTextsAsStringsListsInOrderAndSetsAsSets() throws {
        let harness = try ServiceHarness()
        let (token, _) = try harness.signUp("ann")
        try harness.createZone("Z", token: token)
        _ = harness.modify("Z", [
            Self.operation("create", "a", ["body": Self.field(.string("Shopping list"), "TEXT"),
                                           "order": Self.field(.array([.int(2), .int(1)]), "INT64_LIST"),
                                           "tags": Self.field(.array([.string("x"), .string("y")]), "STRING_SET")], recordType: "Note"),
            Self.operation("create", "b", ["body": Self.field(.string("Chores"), "TEXT"),
                                           "order": Self.field(.array([.int(1), .int(2)]), "INT64_LIST")], recordType: "Note"),
        ], token: token)
        func names(_ filter: JSON) -> [String] {
            let reply = harness.call("records/query", .object([
                "zoneID": .object(["zoneName": .string("Z")]),
                "query": .object(["recordType": .string("Note"), "filterBy": .array([filter])])]), token: token)
            return reply.records.compactMap { $0["recordName"]?.stringValue }.sorted()
        }
        func filter(_ name: String, _ comparator: String, _ value: JSON, _ type: String) -> JSON {
            .object(["fieldName": .string(name), "comparator": .string(comparator), "fieldValue": Self.field(value, type)])
        }
        #expect(names(filter("body", "BEGINS_WITH", .string("Shop"), "STRING")) == ["a"])
        #expect(names(filter("body", "EQUALS", .string("Chores"), "STRING")) == ["b"])
        #expect(names(filter("order", "EQUALS", .array([.int(1), .int(2)]), "INT64_LIST")) == ["b"])
        #expect(names(filter("tags", "EQUALS", .array([.string("y"), .string("x")]), "STRING_LIST")) == ["a"])
        #expect(names(filter("order", "LIST_CONTAINS", .int(2), "INT64")) == ["a", "b"])
        let refused = harness.call("records/query", .object([
            "zoneID": .object(["zoneName": .string("Z")]),
            "query": .object(["recordType": .string("Note"), "filterBy": .array([
                filter("tags", "LIST_CONTAINS", .array([.string("x")]), "STRING_SET")])])]), token: token)
        #expect(refused.code == "BAD_REQUEST", "\(refused.json.serialized())")
    }
}
