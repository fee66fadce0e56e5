import LatticeAPI
import LatticeCore
import Testing

/// `RecordStatesRequest.body` (what a client sends) and `read` (what the server reads in one pass).
@Suite struct RecordStatesRequestTests {
    static let caps = RecordStateCaps(maximumFields: 1_000, maximumListElements: 50_000)

    static func records(_ count: Int, zone: ZoneID, seed: UInt64) throws -> [Record] {
        var rng = SplitMix64(seed: seed)
        return try (0 ..< count).map { index in
            var counter: UInt16 = 0
            func stamp() -> Stamp {
                counter += 1
                return Stamp(hlc: HLC(milliseconds: 1_000 + rng.next() % 1_000, counter: counter), replica: ReplicaID(rng.next() | 1))
            }
            var edit = try RecordEdit(creating: RecordID(recordName: "r\(index)", zoneID: zone), recordType: "Item", at: stamp())
            try edit.set("name", to: .string("item \"\(index)\" é"), at: stamp())
            try edit.set("n", to: .int64(Int64(rng.next() % 1_000)), at: stamp())
            if rng.next() % 2 == 0 { try edit.set("price", to: .double(Double(rng.next() % 100) / 4), at: stamp()) }
            try edit.add((0 ..< Int(rng.next() % 4)).map { .string("tag\($0)") }, to: "tags", at: stamp())
            if rng.next() % 3 == 0 { try edit.setParent(Reference(recordName: "list"), at: stamp()) }
            return try #require(try edit.applied()).decoded()
        }
    }

    @Test func theBodyIsTheTreeSerializedAndReadsBackAsItsRecords() throws {
        let seed: UInt64 = 0xB0D1_E5
        print("[record states body] seed \(seed)")
        let zone = try ZoneID(zoneName: "Lists", ownerRecordName: "_owner")
        let records = try Self.records(50, zone: zone, seed: seed)
        let types: [RecordOperationKind] = records.indices.map { [.forceUpdate, .create, .update][$0 % 3] }
        for (atomic, keys, id) in [(false, [String]?.some([]), String?.some("op-1")), (true, nil, nil), (false, ["name"], nil)] {
            let body = RecordStatesRequest.body(zoneID: zone, Array(zip(types, records)).map { (type: $0, record: $1) },
                                                atomic: atomic, desiredKeys: keys, clientOperationID: id)
            var tree: [String: JSON] = [
                "atomic": .bool(atomic), "zoneID": zone.cloudKitJSON,
                "operations": .array(zip(types, records).map {
                    .object(["operationType": .string($0.rawValue), "record": $1.cloudKitJSON])
                }),
            ]
            if let keys { tree["desiredKeys"] = .array(keys.map(JSON.string)) }
            if let id { tree["clientOperationID"] = .string(id) }
            #expect(body == JSON.object(tree).serializedBytes())
            let read = try #require(RecordStatesRequest.read(body, maximumOperations: 400, caps: Self.caps))
            #expect(read.operations.map(\.state.record) == records)
            #expect(read.operations.map(\.type) == types)
            #expect(read.atomic == atomic && read.desiredKeys == keys.map(Set.init) && read.clientOperationID == id.map(JSON.string))
            #expect(read.zoneID == zone.cloudKitJSON)
        }
    }

    @Test func whatItDoesNotTakeIsLeftToTheTreeRead() throws {
        let zone = try ZoneID(zoneName: "Lists", ownerRecordName: "_owner")
        let record = try Self.records(1, zone: zone, seed: 7)[0]
        func body(_ type: String = "forceUpdate", extra: String = "") -> [UInt8] {
            var text = String(decoding: RecordStatesRequest.body(zoneID: zone, [(.forceUpdate, record)], atomic: false), as: UTF8.self)
            text = text.replacingOccurrences(of: #""operationType":"forceUpdate""#, with: #""operationType":"\#(type)""#)
            return Array((String(text.dropLast()) + extra + "}").utf8)
        }
        #expect(RecordStatesRequest.read(body(), maximumOperations: 400, caps: Self.caps) != nil)
        // Unknown members are skipped, as the tree read ignores them.
        #expect(RecordStatesRequest.read(body(extra: #","note":[1,2]"#), maximumOperations: 400, caps: Self.caps) != nil)
        for type in ["replace", "forceReplace", "delete", "forceDelete", "upsert"] {
            #expect(RecordStatesRequest.read(body(type), maximumOperations: 400, caps: Self.caps) == nil, "\(type)")
        }
        #expect(RecordStatesRequest.read(body(extra: #","atomic":true"#), maximumOperations: 400, caps: Self.caps) == nil)
        #expect(RecordStatesRequest.read(body(), maximumOperations: 0, caps: Self.caps) == nil)
        #expect(RecordStatesRequest.read(Array(#"{"operations":[]}"#.utf8), maximumOperations: 400, caps: Self.caps) == nil)
        #expect(RecordStatesRequest.read(Array("[]".utf8), maximumOperations: 400, caps: Self.caps) == nil)
    }
}

extension RecordStatesRequestTests {
    @Test func batchAnswerItemsKeepWhatAClientActsOn() throws {
        let answer = JSON.object(["records": .array([
            .object(["recordName": .string("a"), "recordChangeTag": .string("1-2"), "deleted": .bool(false),
                     "crdt": .object(["created": .object(["ms": .int(1)])]), "fields": .object([:]), "position": .int(4),
                     "upToDate": .bool(true)]),
            .object(["recordName": .string("b"), "serverErrorCode": .string("CONFLICT"), "reason": .string("changed"),
                     "serverRecord": .object(["recordName": .string("b")])]),
        ]), "zoneID": .object(["zoneName": .string("Z")])])
        let items = try #require(BatchAnswerItems.read(answer.serializedBytes()))
        #expect(items == [
            .object(["recordName": .string("a"), "recordChangeTag": .string("1-2"), "position": .int(4), "upToDate": .bool(true)]),
            .object(["recordName": .string("b"), "serverErrorCode": .string("CONFLICT"), "reason": .string("changed")]),
        ])
        #expect(BatchAnswerItems.read(Array(#"{"zones":[]}"#.utf8)) == nil)
        #expect(BatchAnswerItems.read(Array(#"{"records":[{"recordName":"a"}]"#.utf8)) == nil) // cut short
    }
}
