import Testing
@testable import LatticeCore

/// `Record.readState` (one pass over the text) against `Record(cloudKitJSON:)` (a tree, then the record):
/// what the reader takes it reads exactly as the tree read does, and what it does not take it leaves to the
/// tree read (nil), so a server that tries it first answers every request as before.
@Suite("Reading a record dictionary in one pass")
struct RecordStateReaderTests {
    static let caps = RecordStateCaps(maximumFields: 40, maximumListElements: 30)

    /// The one-pass read of `text`, or nil; it must never disagree with the tree read.
    static func read(_ text: [UInt8]) -> Record? {
        var reader = JSONReader(text)
        guard let read = try? Record.readState(&reader, caps: caps), (try? reader.end()) != nil else { return nil }
        return read.record
    }

    /// What the tree read (with the server's size caps) makes of `text`: nil where it refuses.
    static func treeRead(_ text: [UInt8]) -> Record? {
        guard let json = try? JSON.parse(text), let object = json.objectValue else { return nil }
        if let fields = object["fields"]?.objectValue, fields.count > caps.maximumFields { return nil }
        if json.largestArray > caps.maximumListElements { return nil }
        return try? Record(cloudKitJSON: json, zoneID: nil)
    }

    @Test("every random record's own dictionary is read, and equals the tree read")
    func recordsRoundTrip() throws {
        let seed: UInt64 = 0x0E5A_55ED
        print("[one-pass read] seed \(seed)")
        var rng = SplitMix64(seed: seed)
        for _ in 0 ..< 3_000 {
            let record = RandomRecord.make(&rng, jsonSafe: true)
            let text = record.cloudKitJSON.serializedBytes()
            let fast = Self.read(text)
            #expect(fast == record, "\(String(decoding: text, as: UTF8.self))")
            #expect(fast == Self.treeRead(text))
        }
    }

    @Test("mutated dictionaries: whatever the one-pass read takes, the tree read takes the same way")
    func mutationsNeverDisagree() throws {
        let seed: UInt64 = 0xD15A_6EE5
        print("[one-pass read] mutation seed \(seed)")
        var rng = SplitMix64(seed: seed)
        var taken = 0, left = 0
        for _ in 0 ..< 4_000 {
            let record = RandomRecord.make(&rng, jsonSafe: true)
            var json = record.cloudKitJSON
            for _ in 0 ..< rng.int(1 ... 3) { json = Self.mutate(json, &rng) }
            var text = json.serializedBytes()
            if rng.chance(10) { text = Self.duplicateAKey(text, &rng) }
            let fast = Self.read(text)
            if let fast {
                taken += 1
                #expect(fast == Self.treeRead(text), "\(String(decoding: text, as: UTF8.self))")
            } else {
                left += 1
            }
        }
        print("[one-pass read] mutated: \(taken) read in one pass, \(left) left to the tree read")
        #expect(taken > 100 && left > 100)
    }

    /// One random change somewhere in the tree: a member removed, retyped, added (unknown or an array
    /// over the cap), or a number turned into a double.
    static func mutate(_ json: JSON, _ rng: inout SplitMix64, depth: Int = 0) -> JSON {
        switch json {
        case .object(var members) where !members.isEmpty && (depth > 4 || rng.chance(35)):
            let key = rng.pick(members.keys.sorted())
            switch rng.int(0 ..< 7) {
            case 0: members[key] = nil
            case 1: members[key] = .string("x")
            case 2: members[key] = .int(7)
            case 3: members["unknown\(rng.int(0 ..< 3))"] = rng.bool() ? .array(Array(repeating: .int(1), count: 31)) : .null
            case 4: members[key] = .null
            case 5: members[key] = .array([])
            default: members[key] = .object([:])
            }
            return .object(members)
        case .object(var members) where !members.isEmpty:
            let key = rng.pick(members.keys.sorted())
            members[key] = mutate(members[key]!, &rng, depth: depth + 1)
            return .object(members)
        case .array(var elements) where !elements.isEmpty:
            let index = rng.int(0 ..< elements.count)
            if rng.chance(20) { elements.remove(at: index) } else { elements[index] = mutate(elements[index], &rng, depth: depth + 1) }
            return .array(elements)
        case .int(let value): return rng.bool() ? .double(Double(value)) : .int(value &+ 1)
        case .string(let text): return rng.bool() ? .string(text + "Z") : .string("")
        default: return json
        }
    }

    /// Repeats the first key of an object in the text (the tree read refuses duplicate keys).
    static func duplicateAKey(_ text: [UInt8], _ rng: inout SplitMix64) -> [UInt8] {
        let opens = text.indices.filter { text[$0] == UInt8(ascii: "{") && $0 + 1 < text.count && text[$0 + 1] == UInt8(ascii: "\"") }
        guard let open = opens.isEmpty ? nil : rng.pick(opens) else { return text }
        // `{"key":value,...` becomes `{"key":null,"key":value,...`.
        guard let quote = text[(open + 2)...].firstIndex(of: UInt8(ascii: "\"")) else { return text }
        let key = Array(text[(open + 1) ... quote])
        return Array(text[...open]) + key + Array(":null,".utf8) + Array(text[(open + 1)...])
    }

    @Test("the caps: more fields or a longer array than allowed is left to the tree read")
    func capsLeaveToTheTree() throws {
        let zone = try ZoneID(zoneName: "Z", ownerRecordName: "_owner")
        var record = try Record(id: RecordID(recordName: "r", zoneID: zone), recordType: "Item",
                                createdAt: Stamp(hlc: HLC(milliseconds: 5, counter: 0), replica: ReplicaID(1)))
        for index in 0 ..< 30 {
            try record.add(.int64(Int64(index)), to: "tags", at: Stamp(hlc: HLC(milliseconds: 10, counter: UInt16(index)), replica: ReplicaID(2)))
        }
        #expect(Self.read(record.cloudKitJSON.serializedBytes()) == record) // 30 entries: at the cap
        try record.add(.int64(99), to: "tags", at: Stamp(hlc: HLC(milliseconds: 11, counter: 0), replica: ReplicaID(2)))
        #expect(Self.read(record.cloudKitJSON.serializedBytes()) == nil) // 31: over it
        var wide = try Record(id: RecordID(recordName: "w", zoneID: zone), recordType: "Item",
                              createdAt: Stamp(hlc: HLC(milliseconds: 5, counter: 0), replica: ReplicaID(1)))
        for index in 0 ..< 41 {
            try wide.set("f\(index)", to: .int64(1), at: Stamp(hlc: HLC(milliseconds: 6, counter: UInt16(index)), replica: ReplicaID(1)))
        }
        #expect(Self.read(wide.cloudKitJSON.serializedBytes()) == nil)
        #expect(Self.treeRead(wide.cloudKitJSON.serializedBytes()) == nil)
    }
}
