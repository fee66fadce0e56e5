import Foundation
import Testing
import LatticeCore

/// Hand-assembled binary input, for inputs the encoder would never produce.
struct ByteBuilder {
    var bytes: [UInt8] = []

    mutating func header(kind: UInt8) { bytes += [0x4C, 0x54, 0x43, 1, kind] }
    mutating func varint(_ value: UInt64) {
        var value = value
        while value >= 0x80 { bytes.append(UInt8(truncatingIfNeeded: value) | 0x80); value >>= 7 }
        bytes.append(UInt8(value))
    }
    mutating func string(_ s: String) { varint(UInt64(s.utf8.count)); bytes += Array(s.utf8) }
    mutating func u32(_ value: UInt32) { withUnsafeBytes(of: value.littleEndian) { bytes += $0 } }
    mutating func u64(_ value: UInt64) { withUnsafeBytes(of: value.littleEndian) { bytes += $0 } }
    mutating func zone() { string("Groceries"); string("_owner1") }
    /// A frame: length, then `body`.
    mutating func frame(_ body: [UInt8]) { u32(UInt32(body.count)); bytes += body }
}

@Suite("Binary codec")
struct CodecTests {
    @Test("random records round-trip exactly, and re-encode to the same bytes")
    func recordRoundTrip() {
        var deleted = 0, withParent = 0, generations = 0
        let checks = runCases("record round trip", minimumChecks: 3_000, regressions: RegressionSeeds.codec) { rng in
            let record = RandomRecord.make(&rng)
            let bytes = try BinaryCodec.encode(record)
            let decoded = try BinaryCodec.decodeRecord(bytes)
            try require(decoded == record, "decode(encode(x)) != x\n\(decoded)\n\(record)")
            try require(try BinaryCodec.encode(decoded) == bytes, "re-encoding differs")
            try require(decoded.maximumHLC == record.maximumHLC && decoded.values.count == record.values.count, "views differ")
            deleted += record.isDeleted ? 1 : 0
            withParent += record.parentRegister != nil ? 1 : 0
            generations += record.generation > 1 ? 1 : 0
            return 1
        }
        #expect(checks >= 3_000)
        #expect(deleted > 0 && withParent > 0 && generations > 0)
    }

    @Test("random deltas and zone exports round-trip exactly")
    func deltaRoundTrip() {
        let checks = runCases("delta round trip", minimumChecks: 1_000, regressions: RegressionSeeds.codec) { rng in
            var deltas = [RandomRecord.delta(&rng)]
            var simulation = ZoneSimulation(replicaCount: 3)
            try simulation.run(steps: 20, &rng)
            let zones = simulation.replicas.map(\.state)
            deltas.append(zones[0].fullState())
            if let changes = zones[1].changes(since: zones[2].version) { deltas.append(changes) }
            for delta in deltas {
                let bytes = try BinaryCodec.encode(delta)
                let decoded = try BinaryCodec.decodeDelta(bytes)
                try require(decoded == delta, "decode(encode(delta)) != delta\n\(decoded)\n\(delta)")
                try require(try BinaryCodec.encode(decoded) == bytes, "re-encoding differs")
                try require(decoded.maximumHLC == delta.maximumHLC, "maximumHLC differs")
            }
            // The zone's own encoder and the value encoder agree byte for byte.
            try require(zones[0].encodedFullState() == BinaryCodec.encode(zones[0].fullState()), "zone export differs")
            return deltas.count
        }
        #expect(checks >= 1_000)
    }

    @Test("every value type survives exactly: NaN payloads, -0, infinities, bytes, references, locations")
    func everyValueType() throws {
        let nans: [Double] = [.nan, -.nan, .signalingNaN, Double(bitPattern: 0x7FF8_0000_0000_BEEF), Double(bitPattern: 0xFFF0_0000_0000_0001)]
        var values: [ScalarValue] = nans.map { .double($0) } + [
            .double(-0.0), .double(0.0), .double(.infinity), .double(-.infinity), .double(.leastNonzeroMagnitude),
            .string(""), .string("e\u{301}"), .string("\u{E9}"), .string("a\u{0}b"), .string("😀"),
            .int64(.min), .int64(.max), .timestamp(.min), .timestamp(0), .bytes([]), .bytes(Array(0 ... 255)),
            .reference(Fixtures.reference("milk")),
            .reference(Fixtures.reference("milk", zone: Fixtures.otherZone, action: .deleteSelf)),
            .location(Location(latitude: 1, longitude: 2)),
            .location(Location(latitude: .nan, longitude: -0.0, altitude: nil, horizontalAccuracy: 5, verticalAccuracy: nil,
                               course: .infinity, speed: nil, timestamp: .min)),
            .location(Location(latitude: 0, longitude: 0, altitude: 1, horizontalAccuracy: 2, verticalAccuracy: 3,
                               course: 4, speed: 5, timestamp: 6)),
        ]
        values.append(.location(Location(latitude: 0, longitude: 0, timestamp: nil)))
        var record = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(1, replica: 1))
        for (index, value) in values.enumerated() {
            try record.set("f\(index)", to: value, at: Fixtures.stamp(2, UInt16(index), replica: 1))
            try record.add(value, to: "set", at: Fixtures.stamp(3, UInt16(index), replica: 2))
        }
        // An ordered list keeps every value in the order written, repeats included.
        try record.splice("list", at: 0, deleting: 0, inserting: values + values.reversed(), stamp: Fixtures.stamp(5, replica: 2))
        try record.set("cleared", to: nil, at: Fixtures.stamp(4, replica: 1))
        let decoded = try BinaryCodec.decodeRecord(BinaryCodec.encode(record))
        #expect(decoded == record)
        for (index, value) in values.enumerated() {
            if case .double(let original) = value, case .scalar(.double(let back))? = decoded["f\(index)"] {
                #expect(back.bitPattern == original.bitPattern, "double \(index)")
            }
        }
        #expect(decoded["cleared"] == nil && decoded.provenance(of: "cleared") == .register(Fixtures.stamp(4, replica: 1)))
        guard case .set(_, let elements)? = decoded["set"] else { Issue.record("set missing"); return }
        #expect(elements.count == values.count)
        #expect(elements == elements.sorted(), "set elements come out in ascending order")
        guard case .list(_, let ordered)? = decoded["list"] else { Issue.record("list missing"); return }
        let written = values + values.reversed()
        #expect(ordered.count == written.count && zip(ordered, written).allSatisfy { ScalarValue.compare($0, $1) == 0 },
                "list elements come out as written, bit for bit")
    }

    @Test("JSON round trip: cloudKitJSON -> serialized -> parse -> Record(cloudKitJSON:)")
    func jsonRoundTrip() {
        let checks = runCases("JSON round trip", minimumChecks: 2_000, regressions: RegressionSeeds.codec) { rng in
            let record = RandomRecord.make(&rng, jsonSafe: true)
            let text = record.cloudKitJSON.serialized()
            let parsed = try JSON.parse(text)
            try require(parsed.serialized() == text, "JSON text is not stable")
            let back = try Record(cloudKitJSON: parsed)
            try require(back == record, "JSON round trip differs\n\(text)\n\(back)\n\(record)")
            try require(try BinaryCodec.encode(back) == BinaryCodec.encode(record), "binary forms differ after JSON")
            return 1
        }
        #expect(checks >= 2_000)
    }

    @Test("JSON carries NaN and infinities as strings, but not NaN payloads (documented)")
    func jsonNonFinite() throws {
        var record = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(1, replica: 1))
        try record.set("nan", to: .double(.nan), at: Fixtures.stamp(2, replica: 1))
        try record.set("inf", to: .double(-.infinity), at: Fixtures.stamp(3, replica: 1))
        try record.set("payload", to: .double(Double(bitPattern: 0xFFF8_0000_0000_BEEF)), at: Fixtures.stamp(4, replica: 1))
        let back = try Record(cloudKitJSON: JSON.parse(record.cloudKitJSON.serialized()))
        #expect(back["nan"] == .double(.nan))
        #expect(back["inf"] == .double(-.infinity))
        #expect(back["payload"] == .double(.nan), "a NaN's payload and sign are not kept in JSON")
        #expect(back["nan"] != nil, "NaN must not turn into a cleared field")
    }

    @Test("a record larger than Record.maximumEncodedSize throws RecordError.tooLarge")
    func sizeLimit() throws {
        func record(bytes count: Int) throws -> Record {
            var record = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(1, replica: 1))
            try record.set("data", to: .bytes([UInt8](repeating: 7, count: count)), at: Fixtures.stamp(2, replica: 1))
            return record
        }
        // The frame length is the u32 after the 5-byte header and the zone id.
        let zoneBytes = 2 + "Groceries".utf8.count + "_owner1".utf8.count
        func frameLength(_ bytes: [UInt8]) -> Int {
            Int(bytes[5 + zoneBytes]) | Int(bytes[6 + zoneBytes]) << 8 | Int(bytes[7 + zoneBytes]) << 16 | Int(bytes[8 + zoneBytes]) << 24
        }
        let small = try BinaryCodec.encode(record(bytes: 20_000)) // a 3-byte length varint, as near 1 MiB
        let overhead = frameLength(small) - 20_000
        let largest = Record.maximumEncodedSize - overhead

        let atLimit = try BinaryCodec.encode(record(bytes: largest))
        #expect(frameLength(atLimit) == Record.maximumEncodedSize)
        #expect(try BinaryCodec.decodeRecord(atLimit) == record(bytes: largest))

        let error = #expect(throws: RecordError.self) { try BinaryCodec.encode(record(bytes: largest + 1)) }
        #expect(error?.code == .tooLarge)
        #expect(error?.description.contains("1048577 bytes") == true, "\(error?.description ?? "")")
        #expect(throws: RecordError.self) { try BinaryCodec.encode(record(bytes: 2 << 20)) }

        // A zone refuses a local write that would make a record too large, and stays unchanged.
        var zone = ZoneState(zoneID: Fixtures.zone)
        var clock = Fixtures.clock(1, time: ManualTime())
        try zone.create(recordName: "milk", recordType: "Item", clock: &clock)
        let before = zone
        #expect(throws: RecordError.self) {
            try zone.update("milk", clock: &clock) { try $0.set("data", to: .bytes([UInt8](repeating: 1, count: 1 << 20)), at: $1) }
        }
        #expect(zone == before)
    }

    @Test("decoders refuse frames above the merged-size bound before reading them")
    func oversizedFrame() {
        var input = ByteBuilder()
        input.header(kind: 1)
        input.zone()
        input.u32(UInt32(Record.maximumMergedSize + 1))
        input.bytes += [UInt8](repeating: 0, count: 64)
        let error = #expect(throws: CodecError.self) { try BinaryCodec.decodeRecord(input.bytes) }
        #expect(error?.code == .tooLarge)
    }

    @Test("every prefix of a valid encoding is rejected with CodecError")
    func truncatedInputs() {
        let checks = runCases("truncated prefixes", minimumChecks: 20_000, regressions: RegressionSeeds.codec) { rng in
            let bytes = rng.chance(60) ? try BinaryCodec.encode(RandomRecord.make(&rng)) : try BinaryCodec.encode(RandomRecord.delta(&rng))
            let isRecord = bytes[4] == 1
            for length in 0 ..< bytes.count {
                let prefix = Array(bytes[..<length])
                do {
                    if isRecord { _ = try BinaryCodec.decodeRecord(prefix) } else { _ = try BinaryCodec.decodeDelta(prefix) }
                    try require(false, "a \(length)-byte prefix of \(bytes.count) bytes decoded")
                } catch let error as CodecError {
                    try require(error.code == .truncated, "prefix \(length): \(error.code) (\(error)) instead of truncated")
                    try require(error.offset <= length, "offset \(error.offset) beyond the input")
                }
            }
            return bytes.count
        }
        #expect(checks >= 20_000)
    }

    @Test("malformed headers and trailing bytes are named")
    func headerErrors() throws {
        var rng = SplitMix64(seed: 7)
        let record = try BinaryCodec.encode(RandomRecord.make(&rng))
        func code(_ bytes: [UInt8], delta: Bool = false) -> CodecError.Code? {
            do {
                if delta { _ = try BinaryCodec.decodeDelta(bytes) } else { _ = try BinaryCodec.decodeRecord(bytes) }
                return nil
            } catch { return error.code }
        }
        #expect(code(record) == nil)
        #expect(code(record + [0]) == .trailingBytes)
        #expect(code([0x4C, 0x54, 0x44, 1, 1] + record.dropFirst(5)) == .badMagic)
        #expect(code([0x4C, 0x54, 0x43, 2, 1] + record.dropFirst(5)) == .unsupportedVersion)
        #expect(code(record, delta: true) == .wrongKind)
        #expect(code(try BinaryCodec.encode(RandomRecord.delta(&rng))) == .wrongKind)
        let error = #expect(throws: CodecError.self) { try BinaryCodec.decodeRecord([0x4C, 0x54, 0x43, 9, 1, 0, 0]) }
        #expect(error?.description == "unsupported encoding version 9")
        // A name that breaks the rules is refused on decode, too.
        var builder = ByteBuilder()
        builder.header(kind: 2)
        builder.string("../etc")
        builder.string("_o")
        builder.bytes += [0, 0, 0]
        #expect(code(builder.bytes, delta: true) == .invalidName)
    }

    @Test("a delta whose record belongs to another zone cannot be encoded")
    func wrongZoneRecord() throws {
        let record = try Record(id: Fixtures.recordID("milk", zone: Fixtures.otherZone), recordType: "Item",
                                createdAt: Fixtures.stamp(1, replica: 1))
        let delta = ZoneDelta(zoneID: Fixtures.zone, since: VersionVector(), version: VersionVector(), records: [record])
        #expect(throws: RecordError.self) { try BinaryCodec.encode(delta) }
    }

    /// Counts far beyond the input must fail fast, before anything is allocated for them.
    @Test("huge counts are checked against the remaining bytes", arguments: [UInt64(1) << 32, 1 << 62, .max, 1_000_000])
    func hugeCounts(count: UInt64) {
        var inputs: [(String, [UInt8], Bool)] = []
        func delta(_ body: (inout ByteBuilder) -> Void) -> [UInt8] {
            var b = ByteBuilder(); b.header(kind: 2); b.zone(); body(&b); return b.bytes
        }
        inputs.append(("zone name length", { var b = ByteBuilder(); b.header(kind: 2); b.varint(count); return b.bytes }(), true))
        inputs.append(("since count", delta { $0.varint(count) }, true))
        inputs.append(("record count", delta { $0.varint(0); $0.varint(0); $0.varint(count) }, true))
        var body = ByteBuilder()
        body.string("milk"); body.string("Item"); body.varint(1); body.u64(1); body.varint(1); body.bytes.append(0)
        body.varint(count)
        inputs.append(("field count", { var b = ByteBuilder(); b.header(kind: 1); b.zone(); b.frame(body.bytes); return b.bytes }(), false))
        for (what, bytes, isDelta) in inputs {
            let start = ContinuousClock.now
            let error = #expect(throws: CodecError.self, "\(what)") {
                if isDelta { _ = try BinaryCodec.decodeDelta(bytes) } else { _ = try BinaryCodec.decodeRecord(bytes) }
            }
            #expect(error?.code == .truncated || error?.code == .malformed, "\(what): \(String(describing: error))")
            #expect(ContinuousClock.now - start < .milliseconds(200), "\(what) took too long")
        }
    }
}
