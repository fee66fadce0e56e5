import Testing
import LatticeCore

/// Decoder fuzzing: random and mutated inputs must never crash or hang the decoders; whatever they
/// accept must be canonical (re-encoding gives back the accepted bytes).
@Suite("Decoder fuzzing")
struct FuzzTests {
    static let inputsPerDecoder = 100_000

    /// A fixed corpus of valid encodings (independent of the run's seed, so a failing case seed replays
    /// alone), plus a zone that holds some of the same frames (for the known-frame validation path).
    struct Corpus: Sendable {
        var records: [[UInt8]] = []
        var deltas: [[UInt8]] = []
        var zone = ZoneState(zoneID: Fixtures.zone)
    }

    static let corpus: Corpus = {
        var rng = SplitMix64(seed: 0xC0FFEE)
        var corpus = Corpus()
        for _ in 0 ..< 150 { corpus.records.append(try! BinaryCodec.encode(RandomRecord.make(&rng))) }
        for _ in 0 ..< 60 { corpus.deltas.append(try! BinaryCodec.encode(RandomRecord.delta(&rng))) }
        for _ in 0 ..< 10 {
            var simulation = ZoneSimulation(replicaCount: 3)
            try! simulation.run(steps: 30, &rng)
            let zones = simulation.replicas.map(\.state)
            corpus.deltas.append(zones[0].encodedFullState())
            if let changes = zones[1].encodedChanges(since: zones[2].version) { corpus.deltas.append(changes) }
            corpus.zone = zones[0]
        }
        corpus.deltas.append(corpus.zone.encodedFullState())
        return corpus
    }()

    /// Big values for a count or length, as minimal varints, plus one that overflows 64 bits.
    static let hugeVarints: [[UInt8]] = [UInt64(1) << 32, 1 << 62, 1 << 63, .max, 1 << 24, 1 << 20 + 1].map { value in
        var builder = ByteBuilder()
        builder.varint(value)
        return builder.bytes
    } + [[UInt8](repeating: 0xFF, count: 10) + [0x01], [0x80, 0x00]]

    static func mutate(_ bytes: inout [UInt8], _ rng: inout SplitMix64, other: [UInt8]) {
        let position = bytes.isEmpty ? 0 : rng.int(0 ..< bytes.count)
        switch rng.int(0 ..< 9) {
        case 0: // bit flips
            for _ in 0 ..< rng.int(1 ... 3) where !bytes.isEmpty {
                bytes[rng.int(0 ..< bytes.count)] ^= 1 << UInt8(rng.int(0 ..< 8))
            }
        case 1: // an interesting byte
            if !bytes.isEmpty { bytes[position] = rng.pick([0, 1, 0x7F, 0x80, 0xFF, UInt8(truncatingIfNeeded: rng.next())]) }
        case 2: // insertion
            bytes.insert(contentsOf: rng.bytes(rng.int(1 ... 8)), at: position)
        case 3: // deletion
            if !bytes.isEmpty { bytes.removeSubrange(position ..< min(bytes.count, position + rng.int(1 ... 16))) }
        case 4: // splice with another input
            bytes = Array(bytes[..<position]) + Array(other[(other.isEmpty ? 0 : rng.int(0 ..< other.count))...])
        case 5: // a huge count or length over 1-3 bytes
            let end = min(bytes.count, position + rng.int(1 ... 3))
            bytes.replaceSubrange(position ..< end, with: rng.pick(hugeVarints))
        case 6: // duplicate a chunk
            if !bytes.isEmpty {
                let chunk = Array(bytes[position ..< min(bytes.count, position + rng.int(1 ... 32))])
                bytes.insert(contentsOf: chunk, at: rng.int(0 ... bytes.count))
            }
        case 7: // truncation
            bytes.removeSubrange(position...)
        default: // off by one, often a length
            if !bytes.isEmpty { bytes[position] = rng.bool() ? bytes[position] &+ 1 : bytes[position] &- 1 }
        }
    }

    /// A random input: pure noise (sometimes behind a valid header), or 1-3 mutations of corpus entries.
    static func input(_ rng: inout SplitMix64, from pool: [[UInt8]], kind: UInt8) -> [UInt8] {
        if rng.chance(8) {
            let noise = rng.bytes(rng.int(0 ... 64))
            return rng.bool() ? [0x4C, 0x54, 0x43, 1, kind] + noise : noise
        }
        var bytes = rng.pick(pool)
        for _ in 0 ..< rng.int(1 ... 3) { mutate(&bytes, &rng, other: rng.pick(pool)) }
        return bytes
    }

    @Test("decodeRecord: 100,000 random and mutated inputs, no crash, accepted inputs are canonical", .timeLimit(.minutes(2)))
    func fuzzRecords() {
        var accepted = 0
        let checks = runCases("fuzz decodeRecord", minimumChecks: Self.inputsPerDecoder, regressions: RegressionSeeds.fuzz) { rng in
            let bytes = Self.input(&rng, from: Self.corpus.records + Self.corpus.deltas.prefix(5), kind: 1)
            guard let record = try? BinaryCodec.decodeRecord(bytes) else { return 1 }
            accepted += 1
            let again = try BinaryCodec.encode(record)
            try require(again == bytes, "accepted input is not canonical:\n\(bytes.hex)\n\(again.hex)")
            try require(try BinaryCodec.decodeRecord(again) == record, "decode(encode(decoded)) differs")
            return 1
        }
        #expect(checks >= Self.inputsPerDecoder)
        #expect(accepted > 0, "no mutated input was accepted; the fuzzer is too coarse")
        print("fuzz decodeRecord: \(accepted) of \(checks) inputs accepted")
    }

    @Test("decodeDelta: 100,000 random and mutated inputs, no crash, accepted inputs are canonical", .timeLimit(.minutes(2)))
    func fuzzDeltas() {
        var accepted = 0
        var clock = HybridLogicalClock(replica: ReplicaID(77), time: { 1 << 50 }) // far future: no drift refusals
        let checks = runCases("fuzz decodeDelta", minimumChecks: Self.inputsPerDecoder, regressions: RegressionSeeds.fuzz) { rng in
            let bytes = Self.input(&rng, from: Self.corpus.deltas + Self.corpus.records.prefix(5), kind: 2)
            let known = try? EncodedDelta(validating: bytes, knownFrames: Self.corpus.zone)
            guard let delta = try? BinaryCodec.decodeDelta(bytes) else {
                try require(known == nil, "validation against known frames accepted what decodeDelta refuses:\n\(bytes.hex)")
                return 1
            }
            accepted += 1
            let again = try BinaryCodec.encode(delta)
            try require(again == bytes, "accepted input is not canonical:\n\(bytes.hex)\n\(again.hex)")
            try require(try BinaryCodec.decodeDelta(again) == delta, "decode(encode(decoded)) differs")
            // The known-frame fast path must agree with the full decoder.
            guard let known else { throw CaseFailure(description: "known-frame validation refused an input decodeDelta accepts:\n\(bytes.hex)") }
            // (Its `maximumHLC` leaves out frames identical to stored ones, which were accepted before.)
            let fast = try known.decoded()
            try require(fast.zoneID == delta.zoneID && fast.since == delta.since && fast.version == delta.version
                        && fast.records == delta.records, "known-frame validation decodes differently:\n\(bytes.hex)")
            try require(fast.maximumHLC <= delta.maximumHLC, "known-frame validation reports a newer clock value")
            // And merging the bytes must equal merging the values.
            if delta.zoneID == Self.corpus.zone.zoneID {
                var byBytes = Self.corpus.zone, byValue = Self.corpus.zone
                try byBytes.merge(known, clock: &clock)
                try byValue.merge(delta)
                try require(byBytes == byValue, "encoded merge differs from value merge for:\n\(bytes.hex)")
            }
            return 1
        }
        #expect(checks >= Self.inputsPerDecoder)
        #expect(accepted > 0, "no mutated input was accepted; the fuzzer is too coarse")
        print("fuzz decodeDelta: \(accepted) of \(checks) inputs accepted")
    }

    /// Regression (found by `fuzzDeltas`): a frame declaring length 0 made the known-frame fast path read
    /// one byte past the frame (`ZoneState.skipKnownFrame`), a crash in debug builds.
    @Test("a zero-length frame is refused, also when validating against known frames")
    func zeroLengthFrame() {
        var builder = ByteBuilder()
        builder.header(kind: 2)
        builder.zone()
        builder.varint(0) // since
        builder.varint(0) // version
        builder.varint(1) // one record
        builder.u32(0) // ...whose frame is empty
        builder.bytes += [UInt8](repeating: 0, count: 24)
        #expect(!Self.corpus.zone.records.isEmpty)
        #expect(throws: CodecError.self) { try EncodedDelta(validating: builder.bytes, knownFrames: Self.corpus.zone) }
        #expect(throws: CodecError.self) { try BinaryCodec.decodeDelta(builder.bytes) }
    }
}
