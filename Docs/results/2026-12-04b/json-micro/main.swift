import Foundation
// A records/modify-like answer: 200 records with three fields, rendered the way the server does.
var records: [JSON] = []
for i in 0..<200 {
    let stamp = JSON.object(["counter": .int(Int64(i)), "ms": .int(1796035556315), "replica": .string("b81e1205b7cea0e1")])
    records.append(.object([
        "recordName": .string("record-\(i)-abcdefghijkl"), "recordType": .string("Item"),
        "zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .string("_f369e70b252768709dfaf832caaba53a")]),
        "deleted": .bool(false), "recordChangeTag": .string("1-\(i)"),
        "created": .object(["timestamp": .int(1796035556315), "userRecordName": .string("_f369e70b252768709dfaf832caaba53a")]),
        "modified": .object(["timestamp": .int(1796035556315), "userRecordName": .string("_f369e70b252768709dfaf832caaba53a")]),
        "crdt": .object(["generation": .int(1), "created": stamp]),
        "fields": .object([
            "name": .object(["value": .string("Milk \(i)"), "type": .string("STRING"), "crdt": .object(["stamp": stamp])]),
            "n": .object(["value": .int(Int64(i)), "type": .string("INT64"), "crdt": .object(["stamp": stamp])]),
            "tags": .object(["value": .array([.string("a"), .string("b")]), "type": .string("STRING_LIST"),
                             "crdt": .object(["entries": .array([.object(["value": .string("a"), "stamp": stamp]), .object(["value": .string("b"), "stamp": stamp])]), "context": .array([stamp])])]),
        ]),
    ]))
}
let answer = JSON.object(["records": .array(records)])
var bytes = 0
let reps = Int(CommandLine.arguments.dropFirst().first ?? "300")!
let t0 = DispatchTime.now().uptimeNanoseconds
for _ in 0..<reps { bytes &+= answer.serializedBytes().count }
let t1 = DispatchTime.now().uptimeNanoseconds
let text = answer.serializedBytes()
for _ in 0..<reps { bytes &+= (try! JSON.parse(text)).objectValue!.count }
let t2 = DispatchTime.now().uptimeNanoseconds
print("answer \(text.count) bytes; serialize \(Double(t1 - t0) / Double(reps) / 1000) us, parse \(Double(t2 - t1) / Double(reps) / 1000) us per 200 records (\(bytes))")
