import LatticeCore
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
