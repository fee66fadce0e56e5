import Testing
@testable import LatticeCore

/// The binary push and pull envelopes (`SyncMessage`): exact round trips, and a clear refusal of every
/// kind of bad input before anything is built from it.
@Suite("Sync messages")
struct SyncMessageTests {
    static let maximum = SyncMessage.maximumStringBytes

    /// A string of 1-4096 UTF-8 bytes (exactly the bound now and then).
    static func boundedString(_ rng: inout SplitMix64) -> String {
        switch rng.int(0 ..< 10) {
        case 0: return String(repeating: "a", count: maximum)
        case 1: return String(repeating: "é", count: maximum / 2)
        case 2 ..< 5: return "op-\(rng.next())"
        default:
            let text = rng.string()
            return text.isEmpty ? "x" : text
        }
    }

    static func names(_ rng: inout SplitMix64) -> [String] {
        (0 ..< rng.int(0 ... 6)).map { _ in rng.pick(SplitMix64.recordNames) }
    }

    /// A real zone delta, or bytes the envelope carries without looking at them.
    static func delta(_ rng: inout SplitMix64) -> [UInt8] {
        rng.chance(60) ? encoded(RandomRecord.delta(&rng)) : rng.bytes(rng.int(0 ... 40))
    }

    static func push(_ rng: inout SplitMix64) -> SyncMessage.Push {
        SyncMessage.Push(clientOperationID: rng.chance(30) ? nil : boundedString(&rng), atomic: rng.bool(),
                         delta: delta(&rng))
    }

    static func pull(_ rng: inout SplitMix64) -> SyncMessage.Pull {
        SyncMessage.Pull(syncToken: rng.chance(10) ? "" : boundedString(&rng), moreComing: rng.bool(),
                         removed: names(&rng),
                         lostShares: names(&rng).map { SyncMessage.LostShare(rootRecordName: $0, shareRecordName: "s" + $0) }
                            .filter { Names.isValid($0.shareRecordName, kind: .recordName) },
                         skipped: names(&rng),
                         sharedRoots: names(&rng).map { SyncMessage.SharedRoot(rootRecordName: $0, shareRecordName: "s" + $0) }
                            .filter { Names.isValid($0.shareRecordName, kind: .recordName) },
                         delta: delta(&rng))
    }

    private static func codecError(_ body: () throws(CodecError) -> Void) -> CodecError? {
        do throws(CodecError) { try body(); return nil } catch { return error }
    }

    static func pushError(_ bytes: [UInt8]) -> CodecError? {
        codecError { () throws(CodecError) in _ = try SyncMessage.Push(decoding: bytes) }
    }
    static func pullError(_ bytes: [UInt8]) -> CodecError? {
        codecError { () throws(CodecError) in _ = try SyncMessage.Pull(decoding: bytes) }
    }

    @Test("pushes round-trip exactly; a cut in the envelope is truncated, a cut in the delta is the delta's business")
    func pushRoundTrip() throws {
        runCases("push round trip", minimumChecks: 3_000, regressions: RegressionSeeds.codec) { rng in
            let push = Self.push(&rng)
            let bytes = push.encoded()
            let decoded = try SyncMessage.Push(decoding: bytes)
            try require(decoded == push, "decode(encode(push)) differs: \(decoded)")
            try require(decoded.encoded() == bytes, "re-encoding differs")
            if let delta = try? EncodedDelta(validating: push.delta) {
                let names = try EncodedDelta(validating: decoded.delta).recordNames
                try require(names == delta.recordNames, "delta differs")
            }
            let envelope = bytes.count - push.delta.count
            let cut = rng.int(0 ..< bytes.count)
            let prefix = Array(bytes[..<cut])
            if cut < envelope {
                try require(Self.pushError(prefix)?.code == .truncated, "cut at \(cut) of \(envelope): not truncated")
            } else {
                let delta = try SyncMessage.Push(decoding: prefix).delta
                try require(delta == Array(push.delta.prefix(cut - envelope)), "cut delta")
            }
            return 1
        }
        // An empty operation id is no operation id.
        let anonymous = SyncMessage.Push(clientOperationID: "", atomic: false, delta: [])
        #expect(try SyncMessage.Push(decoding: anonymous.encoded()).clientOperationID == nil)
    }

    @Test("pulls round-trip exactly, name lists in order; a cut inside the envelope is truncated")
    func pullRoundTrip() {
        runCases("pull round trip", minimumChecks: 3_000, regressions: RegressionSeeds.codec) { rng in
            let pull = Self.pull(&rng)
            let bytes = pull.encoded()
            let decoded = try SyncMessage.Pull(decoding: bytes)
            try require(decoded == pull, "decode(encode(pull)) differs: \(decoded)")
            try require(decoded.encoded() == bytes, "re-encoding differs")
            let envelope = bytes.count - pull.delta.count
            let cut = rng.int(0 ..< bytes.count)
            let prefix = Array(bytes[..<cut])
            if cut < envelope {
                try require(Self.pullError(prefix)?.code == .truncated, "cut at \(cut) of \(envelope): not truncated")
            } else {
                let delta = try SyncMessage.Pull(decoding: prefix).delta
                try require(delta == Array(pull.delta.prefix(cut - envelope)), "cut delta")
            }
            return 1
        }
    }

    @Test("a bad header is refused: magic, version, kind")
    func badHeaders() {
        let emptyDelta = encoded(ZoneDelta(zoneID: Fixtures.zone, since: VersionVector(), version: VersionVector(),
                                           records: []))
        let push = SyncMessage.Push(clientOperationID: "op", atomic: true, delta: emptyDelta).encoded()
        let pull = SyncMessage.Pull(syncToken: "t", moreComing: false, removed: ["milk"], lostShares: [],
                                    delta: []).encoded()
        for (bytes, decode) in [(push, Self.pushError), (pull, Self.pullError)] {
            #expect(decode([])?.code == .truncated)
            #expect(decode(Array(bytes.prefix(4)))?.code == .truncated)
            for index in 0 ..< 3 {
                var bad = bytes
                bad[index] ^= 0x20
                #expect(decode(bad)?.code == .badMagic)
            }
            for version: UInt8 in [0, 2, 0xFF] {
                var bad = bytes
                bad[3] = version
                #expect(decode(bad)?.code == .unsupportedVersion)
            }
            for kind: UInt8 in [0, 1, 2, 5, 0xFF] {
                var bad = bytes
                bad[4] = kind
                #expect(decode(bad)?.code == .wrongKind)
            }
        }
        // Each envelope is the other's wrong kind, and so are record and delta files.
        #expect(Self.pullError(push)?.code == .wrongKind)
        #expect(Self.pushError(pull)?.code == .wrongKind)
        let record = encoded(genesisRecord), delta = Array(push.suffix(from: 5 + 3 + 1))
        for file in [record, delta] {
            #expect(Self.pushError(file)?.code == .wrongKind)
            #expect(Self.pullError(file)?.code == .wrongKind)
        }
    }

    @Test("unknown flag bits are refused")
    func unknownFlags() {
        for bit in 1 ..< 8 {
            var push = ByteBuilder()
            push.header(kind: 3)
            push.string("op")
            push.bytes.append(UInt8(1 << bit) | 1)
            #expect(Self.pushError(push.bytes) == CodecError(code: .malformed, context: "push flags", offset: 9))

            guard bit > 1 else { continue } // pull flag 2: the shared roots follow
            var pull = ByteBuilder()
            pull.header(kind: 4)
            pull.string("token")
            pull.bytes.append(UInt8(1 << bit))
            pull.varint(0)
            pull.varint(0)
            #expect(Self.pullError(pull.bytes) == CodecError(code: .malformed, context: "pull flags", offset: 12))
        }
    }

    @Test("strings over maximumStringBytes are refused on their declared length")
    func oversizedStrings() throws {
        let atLimit = String(repeating: "a", count: Self.maximum)
        let push = SyncMessage.Push(clientOperationID: atLimit, atomic: false, delta: [])
        #expect(try SyncMessage.Push(decoding: push.encoded()).clientOperationID == atLimit)
        let pull = SyncMessage.Pull(syncToken: atLimit, moreComing: false, removed: [], lostShares: [], delta: [])
        #expect(try SyncMessage.Pull(decoding: pull.encoded()).syncToken == atLimit)
        for over in [atLimit + "b", String(repeating: "é", count: Self.maximum / 2 + 1)] {
            let push = SyncMessage.Push(clientOperationID: over, atomic: false, delta: []).encoded()
            #expect(Self.pushError(push) == CodecError(code: .tooLarge, context: "clientOperationID", offset: 5))
            let pull = SyncMessage.Pull(syncToken: over, moreComing: false, removed: [], lostShares: [],
                                        delta: []).encoded()
            #expect(Self.pullError(pull) == CodecError(code: .tooLarge, context: "syncToken", offset: 5))
        }
        // A gigabyte declared in a few bytes: too large, before the bytes are looked for (or decoded).
        for kind: UInt8 in [3, 4] {
            var builder = ByteBuilder()
            builder.header(kind: kind)
            builder.varint(1 << 30)
            builder.bytes += [0xFF, 0xFE, 0x00]
            let error = kind == 3 ? Self.pushError(builder.bytes) : Self.pullError(builder.bytes)
            #expect(error?.code == .tooLarge)
        }
        // Invalid UTF-8 within the bound is malformed.
        var builder = ByteBuilder()
        builder.header(kind: 3)
        builder.varint(2)
        builder.bytes += [0xC3, 0x28, 0]
        #expect(Self.pushError(builder.bytes)?.code == .malformed)
    }

    /// A pull envelope with `removed` written as given (count, then raw name bytes), no lost shares and no
    /// skipped records.
    private static func pull(count: UInt64, names: [[UInt8]], lostSharesCount: UInt64 = 0) -> [UInt8] {
        var builder = ByteBuilder()
        builder.header(kind: 4)
        builder.string("token")
        builder.bytes.append(0)
        builder.varint(count)
        for name in names { builder.varint(UInt64(name.count)); builder.bytes += name }
        builder.varint(lostSharesCount)
        builder.varint(0)
        return builder.bytes
    }

    @Test("a name count larger than the bytes that remain is refused before anything is allocated")
    func countsBeyondTheInput() throws {
        let milk = Array("milk".utf8)
        #expect(try SyncMessage.Pull(decoding: Self.pull(count: 2, names: [milk, milk])).removed == ["milk", "milk"])
        for count: UInt64 in [12, 100, 1 << 31, 1 << 62, .max] {
            #expect(Self.pullError(Self.pull(count: count, names: [milk, milk]))?.code == .truncated, "count \(count)")
        }
        // The second list too.
        #expect(Self.pullError(Self.pull(count: 0, names: [], lostSharesCount: 1 << 40))?.code == .truncated)
        // A count is a minimal varint.
        var builder = ByteBuilder()
        builder.header(kind: 4)
        builder.string("")
        builder.bytes += [0, 0x80, 0x00, 0, 0]
        #expect(Self.pullError(builder.bytes)?.code == .malformed)
    }

    @Test("invalid record names in the name lists are refused", arguments: [
        "", "_reserved", "a/b", "back\\slash", "héllo", "tab\tname", "del\u{7F}", String(repeating: "n", count: 256),
    ])
    func invalidNames(name: String) {
        #expect(!Names.isValid(name, kind: .recordName))
        let inRemoved = Self.pull(count: 2, names: [Array("milk".utf8), Array(name.utf8)])
        #expect(Self.pullError(inRemoved)?.code == .invalidName)
        // (Delta bytes follow, so that even the 1-byte empty name passes the count check and is read.)
        let message = SyncMessage.Pull(syncToken: "t", moreComing: true, removed: ["milk"],
                                       lostShares: [SyncMessage.LostShare(rootRecordName: name, shareRecordName: "share")],
                                       delta: [0, 0])
        #expect(Self.pullError(message.encoded())?.code == .invalidName)
    }

    @Test("random mutations of envelopes: no crash, and what is accepted is canonical", .timeLimit(.minutes(2)))
    func fuzzEnvelopes() {
        var accepted = 0
        var corpusRNG = SplitMix64(seed: 0x5EED)
        let pushes = (0 ..< 40).map { _ in Self.push(&corpusRNG).encoded() }
        let pulls = (0 ..< 40).map { _ in Self.pull(&corpusRNG).encoded() }
        let checks = runCases("fuzz sync messages", minimumChecks: 20_000, regressions: RegressionSeeds.fuzz) { rng in
            let isPush = rng.bool()
            let pool = isPush ? pushes : pulls
            var bytes = rng.pick(pool)
            for _ in 0 ..< rng.int(1 ... 3) { FuzzTests.mutate(&bytes, &rng, other: rng.pick(pool)) }
            if isPush {
                guard let push = try? SyncMessage.Push(decoding: bytes) else { return 1 }
                try require(push.encoded() == bytes, "accepted push is not canonical:\n\(bytes.hex)")
            } else {
                guard let pull = try? SyncMessage.Pull(decoding: bytes) else { return 1 }
                try require(pull.encoded() == bytes, "accepted pull is not canonical:\n\(bytes.hex)")
                let valid = (pull.removed + pull.skipped + pull.lostShares.flatMap { [$0.rootRecordName, $0.shareRecordName] })
                    .allSatisfy { Names.isValid($0, kind: .recordName) }
                try require(valid, "an invalid name was accepted")
            }
            accepted += 1
            return 1
        }
        #expect(checks >= 20_000)
        #expect(accepted > 0)
        print("fuzz sync messages: \(accepted) of \(checks) accepted")
    }
}
