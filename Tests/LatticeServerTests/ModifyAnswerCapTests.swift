import LatticeCore
import LatticeTestSupport
import Testing

/// `records/modify` answers are bounded too: past `maximumResponseBytes` of records a written record is
/// answered without its fields (`fieldsOmitted`), so small edits of large records cannot amplify.
@Suite struct ModifyAnswerCapTests {
    @Test func recordsPastTheByteCapAreAnsweredWithoutFields() throws {
        let h = try ServiceHarness { $0.maximumResponseBytes = 65_536 }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let text = String(repeating: "x", count: 30_000)
        let operations = (0..<4).map { operation("create", "r\($0)", fields: ["text": .object(["value": .string(text)])]) }
        for atomic in [true, false] {
            let name = atomic ? "a" : "n"
            let reply = h.modify("Lists", operations.enumerated().map { index, op in
                operation("create", "\(name)\(index)", fields: ["text": .object(["value": .string(text)])])
            }, token: token, extra: ["atomic": .bool(atomic)])
            #expect(reply.status == 200)
            let items = reply.records
            #expect(items.count == operations.count)
            // About 30 KB each: the first two fit in 64 KiB, the others are answered without fields.
            let full = items.filter { $0["fields"]?["text"]?["value"]?.stringValue == text }
            let omitted = items.filter { $0["fieldsOmitted"] == .bool(true) }
            #expect(full.count == 2 && omitted.count == 2, "\(items.map { $0["recordName"] ?? .null })")
            for item in omitted {
                #expect(item["fields"] == nil)
                #expect(item["recordChangeTag"]?.stringValue?.isEmpty == false)
                #expect(item["recordType"]?.stringValue == "Item")
            }
            // They were written whole: a lookup has their fields.
            let looked = h.call("records/lookup", .object([
                "zoneID": .object(["zoneName": .string("Lists")]),
                "records": .array(omitted.map { .object(["recordName": $0["recordName"] ?? .null]) }),
            ]), token: token)
            #expect(looked.records.count == 2)
            #expect(looked.records.allSatisfy { $0["fields"]?["text"]?["value"]?.stringValue == text })
        }
    }
}

/// `desiredKeys` on `records/modify` (as in CloudKit Web Services): the saved records come back with only
/// the fields named; `[]` answers none, which is what the sync engine's JSON path asks for.
@Suite struct ModifyDesiredKeysTests {
    private func item(_ name: String, text: String) -> JSON {
        operation("forceReplace", name, fields: ["text": value(.string(text)), "done": .object(["value": .int(0), "type": .string("INT64")])])
    }

    @Test func desiredKeysLimitTheFieldsOfTheSavedRecords() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let all = h.modify("Lists", [item("a", text: "Apples")], token: token)
        #expect(all.records.first?["fields"]?["text"]?["value"] == .string("Apples"))
        #expect(all.records.first?["fields"]?["done"] != nil)

        let one = h.modify("Lists", [item("b", text: "Bread")], token: token, extra: ["desiredKeys": .array([.string("text")])])
        #expect(one.records.first?["fields"]?.objectValue?.keys.sorted() == ["text"])

        let none = h.modify("Lists", [item("c", text: "Cheese"), item("d", text: "Dates")], token: token,
                            extra: ["desiredKeys": .array([])])
        #expect(none.status == 200)
        #expect(none.records.count == 2)
        for record in none.records {
            #expect(record["fields"] == .object([:]))
            #expect(record["recordChangeTag"]?.stringValue?.isEmpty == false)
            #expect(record["recordType"] == .string("Item"))
            #expect(record["created"]?["userRecordName"] != nil && record["modified"]?["timestamp"] != nil)
            #expect(record["crdt"]?["generation"] != nil)
            #expect(record["fieldsOmitted"] == nil)
        }
        // Written whole all the same.
        let looked = h.call("records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Lists")]),
            "records": .array([.object(["recordName": .string("c")]), .object(["recordName": .string("d")])]),
        ]), token: token)
        #expect(looked.records.map { $0["fields"]?["text"]?["value"] } == [.string("Cheese"), .string("Dates")])
        #expect(looked.records.first?["recordChangeTag"] == none.records.first?["recordChangeTag"])
    }

    @Test func illTypedDesiredKeysAreRefusedAndNothingIsWritten() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        for bad: JSON in [.string("text"), .array([.int(1)]), .object([:]), .bool(true)] {
            let reply = h.modify("Lists", [item("x", text: "X")], token: token, extra: ["desiredKeys": bad])
            #expect(reply.status == 400, "\(bad.serialized())")
            #expect(reply.code == "BAD_REQUEST")
            #expect(reply["reason"]?.stringValue?.contains("desiredKeys") == true)
        }
        let looked = h.call("records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Lists")]), "records": .array([.object(["recordName": .string("x")])]),
        ]), token: token)
        #expect(looked.records.first?["serverErrorCode"] == .string("NOT_FOUND"))
    }

    @Test func aReplayAnswersTheSameShapeAndAConflictStillCarriesTheWholeServerRecord() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        // Enough records that the replay cache keeps the compact form and renders the replay again.
        let operations = (0..<30).map { item("r\($0)", text: String(repeating: "t", count: 40)) }
        let extra: [String: JSON] = ["desiredKeys": .array([]), "clientOperationID": .string("op-1"), "atomic": .bool(false)]
        let first = h.modify("Lists", operations, token: token, extra: extra)
        let again = h.modify("Lists", operations, token: token, extra: extra)
        #expect(first.status == 200 && again.status == 200)
        #expect(again.response.headers.contains { $0.name == "Lattice-Replayed" && $0.value == "true" })
        #expect(again.records.count == 30)
        #expect(again.records.allSatisfy { $0["fields"] == .object([:]) })
        #expect(again.records.map { $0["recordChangeTag"] } == first.records.map { $0["recordChangeTag"] })

        let conflict = h.modify("Lists", [operation("update", "r0", fields: ["text": value(.string("new"))], tag: "0-0")],
                                token: token, extra: ["desiredKeys": .array([])])
        let failed = conflict.records.first
        #expect(failed?["serverErrorCode"] == .string("CONFLICT"))
        #expect(failed?["serverRecord"]?["fields"]?["text"]?["value"] == .string(String(repeating: "t", count: 40)))
    }
}
