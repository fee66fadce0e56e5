import Testing
@testable import LatticeCore

/// The quick frame check (`FrameCheck`) may decline anything, but it must never accept a frame the full
/// check (`BinaryReader.scanFrameFully`) refuses, and what it accepts it must read the same way.
@Suite("Quick frame check")
struct FrameCheckTests {
    /// Valid frames: random records (every value type, names of every legal shape) and zone-made records.
    static let pool: [[UInt8]] = {
        var rng = SplitMix64(seed: 0xF4A3E)
        var frames: [[UInt8]] = []
        func encode(_ record: Record) -> [UInt8] {
            var writer = BinaryWriter(capacity: 64)
            try! writer.frame(record)
            return writer.finish()
        }
        for _ in 0 ..< 300 { frames.append(encode(RandomRecord.make(&rng))) }
        for _ in 0 ..< 10 {
            var simulation = ZoneSimulation(replicaCount: 3)
            try! simulation.run(steps: 30, &rng)
            for zone in simulation.replicas.map(\.state) { frames += zone.records.values.map(encode) }
        }
        return frames
    }()

    @Test("the quick check never accepts what the full check refuses (200,000 random and mutated frames)",
          .timeLimit(.minutes(2)))
    func quickNeverMoreLenient() {
        var quickAccepted = 0, fullAccepted = 0, validDeclined = 0
        // One cache across cases, as across the frames of a delta: a name found legal once stays legal.
        var names = NameCache()
        let checks = runCases("quick frame check", minimumChecks: 200_000) { rng in
            var bytes = rng.pick(Self.pool)
            let mutations = rng.int(0 ... 3)
            for _ in 0 ..< mutations { FuzzTests.mutate(&bytes, &rng, other: rng.pick(Self.pool)) }
            // Sometimes bytes follow the frame (as in a delta): the eight-byte loads may read them, the
            // verdict must not depend on them.
            let limit = bytes.count
            if rng.bool() { bytes += rng.bytes(rng.int(1 ... 16)) }
            try bytes.withUnsafeBytes { raw in
                let quick = FrameCheck.check(raw, at: 0, limit: limit, names: &names)
                var reader = BinaryReader(raw)
                reader.limit = limit
                let full = try? reader.scanFrameFully()
                if full != nil { fullAccepted += 1 }
                if full != nil && quick == nil && mutations == 0 { validDeclined += 1 }
                guard let quick else { return }
                quickAccepted += 1
                guard let full else {
                    throw CaseFailure(description: "quick check accepted a frame the full check refuses:\n\(bytes.hex)")
                }
                try require(full.frame == 0 ..< quick.end && full.name == quick.name
                            && reader.maximumHLC.rawValue == quick.maximumHLC,
                            "quick check reads the frame differently:\n\(bytes.hex)")
            }
            return 1
        }
        #expect(checks >= 200_000)
        #expect(quickAccepted > 0 && quickAccepted <= fullAccepted)
        print("quick frame check: \(quickAccepted) accepted by the quick check, \(fullAccepted) by the full check, "
              + "\(validDeclined) unmutated frames left to the full check, of \(checks)")
    }

    @Test("legal names: the byte masks agree with the name rules on every short name")
    func nameMasks() throws {
        // Every name of one or two bytes over all byte values, plus eight-byte words with each byte varied.
        var names: [[UInt8]] = (0 ... 255).map { [UInt8($0)] }
        for first in [UInt8(ascii: "a"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "Z")] {
            names += (0 ... 255).map { [first, UInt8($0)] }
        }
        for position in 0 ..< 8 {
            names += (0 ... 255).map { value in
                var name = Array("r000012x".utf8)
                name[position] = UInt8(value)
                return name
            }
        }
        for name in names {
            let padded = name + [UInt8](repeating: 0xFF, count: 8) // bytes past the name must not matter
            padded.withUnsafeBytes { raw in
                let bytes = UnsafeRawBufferPointer(rebasing: raw[0 ..< name.count])
                let recordOK = Names.brokenRule(bytes, kind: .recordName) == nil
                #expect(NameBytes.isRecordName(raw.baseAddress!, name.count) == recordOK, "\(name)")
                #expect(NameBytes.isRecordName(raw.baseAddress!, name.count, loadable: true) == recordOK, "\(name)")
                #expect(NameBytes.isIdentifier(raw.baseAddress!, name.count)
                        == (Names.brokenRule(bytes, kind: .fieldName) == nil), "\(name)")
            }
        }
    }
}
