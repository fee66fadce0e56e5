import Testing
import LatticeCore

/// The three join-semilattice laws every merge must obey.
enum Law: String, CaseIterable, Sendable, CustomTestStringConvertible {
    case commutative, associative, idempotent
    var testDescription: String { rawValue }
}

/// Checks `law` on operands drawn from one world's snapshots, comparing states with `==` and their
/// canonical binary encodings byte for byte. Returns the number of cases checked.
private func check<S: Equatable>(_ law: Law, snapshots: [S], cases: Int, _ rng: inout SplitMix64,
                                 merge: (S, S) throws -> S, bytes: (S) -> [UInt8]) throws -> Int {
    guard !snapshots.isEmpty else { return 0 }
    func same(_ x: S, _ y: S, _ what: String) throws {
        try require(x == y, "\(law) (\(what)): states differ\n\(x)\n\(y)")
        try require(bytes(x) == bytes(y), "\(law) (\(what)): encodings differ\n\(bytes(x).hex)\n\(bytes(y).hex)")
    }
    for _ in 0 ..< cases {
        let a = rng.pick(snapshots), b = rng.pick(snapshots), c = rng.pick(snapshots)
        switch law {
        case .commutative:
            try same(try merge(a, b), try merge(b, a), "a ⊔ b = b ⊔ a")
        case .associative:
            try same(try merge(try merge(a, b), c), try merge(a, try merge(b, c)), "(a ⊔ b) ⊔ c = a ⊔ (b ⊔ c)")
        case .idempotent:
            try same(try merge(a, a), a, "a ⊔ a = a")
            let ab = try merge(a, b)
            try same(try merge(ab, b), ab, "(a ⊔ b) ⊔ b = a ⊔ b")
        }
    }
    return cases
}

private let casesPerLaw = 10_000
/// Operand triples drawn from each generated world.
private let casesPerWorld = 8

@Suite("Merge laws (property tests)")
struct MergeLawTests {
    @Test("LWWRegister", arguments: Law.allCases)
    func lwwRegister(law: Law) {
        var coverage = Coverage()
        var ties = 0
        let checked = runCases("LWWRegister \(law)", minimumChecks: casesPerLaw, regressions: RegressionSeeds.lwwLaws) { rng in
            let snapshots = RegisterWorld.run(&rng, coverage: &coverage)
            return try check(law, snapshots: snapshots, cases: casesPerWorld, &rng, merge: { a, b in
                if a.stamp.hlc == b.stamp.hlc && a.stamp.replica != b.stamp.replica { ties += 1 }
                return a.merging(b)
            }, bytes: { encoded(wrapped($0)) })
        }
        #expect(checked >= casesPerLaw)
        #expect(coverage["equal HLC on two replicas"] > 0, "\(coverage)")
        #expect(law == .idempotent || ties > 0, "no merge compared equal clock values from different replicas")
    }

    @Test("LWWRegister: equal clock values are won by the greater replica id, in either order")
    func lwwTieBreak() {
        let a = LWWRegister(value: .string("from 1"), stamp: Fixtures.stamp(Fixtures.epoch, 3, replica: 1))
        let b = LWWRegister(value: .string("from 2"), stamp: Fixtures.stamp(Fixtures.epoch, 3, replica: 2))
        #expect(a.merging(b) == b)
        #expect(b.merging(a) == b)
        // A reused stamp (a forged or buggy input) still merges commutatively: the greater value wins.
        let forged = LWWRegister(value: .string("zzz"), stamp: a.stamp)
        #expect(a.merging(forged) == forged.merging(a))
        #expect(a.merging(forged).value == .string("zzz"))
        let cleared = LWWRegister(value: nil, stamp: a.stamp)
        #expect(cleared.merging(a) == a && a.merging(cleared) == a)
    }

    @Test("ORSet", arguments: Law.allCases)
    func orSet(law: Law) {
        var coverage = Coverage()
        let checked = runCases("ORSet \(law)", minimumChecks: casesPerLaw, regressions: RegressionSeeds.orSetLaws) { rng in
            let records = ORSetWorld.run(&rng, coverage: &coverage)
            // Each operand is a record whose only field is the set, so the canonical encodings are compared
            // too; the merged record's set must be exactly the ORSet join, which carries the laws over to it.
            return try check(law, snapshots: records, cases: casesPerWorld, &rng, merge: { a, b in
                let record = a.merging(b)
                try require(tags(record) == tags(a).merging(tags(b)), "record join and ORSet join differ")
                return record
            }, bytes: encoded)
        }
        #expect(checked >= casesPerLaw)
        for situation in ["remove concurrent with an add", "re-add after remove", "remove of a never-seen element",
                          "equal HLC on two replicas"] {
            #expect(coverage[situation] > 0, "generator never produced: \(situation) (\(coverage))")
        }
    }

    @Test("Record", arguments: Law.allCases)
    func record(law: Law) {
        var coverage = Coverage()
        let checked = runCases("Record \(law)", minimumChecks: casesPerLaw, regressions: RegressionSeeds.recordLaws) { rng in
            let snapshots = RecordWorld.run(&rng, coverage: &coverage)
            return try check(law, snapshots: snapshots, cases: casesPerWorld, &rng, merge: { $0.merging($1) }, bytes: encoded)
        }
        #expect(checked >= casesPerLaw)
        for situation in ["concurrent create", "recreate", "delete meets a later concurrent edit", "generations meet",
                          "register meets set", "register tie on equal HLC", "equal HLC on two replicas"] {
            #expect(coverage[situation] > 0, "generator never produced: \(situation) (\(coverage))")
        }
    }

    /// Zone states join by merging a whole state; `changes(since:)` must be an exact substitute.
    @Test("ZoneState (full states and deltas)", arguments: Law.allCases)
    func zoneState(law: Law) {
        func join(_ a: ZoneState, _ b: ZoneState) -> ZoneState {
            var result = a
            try! result.merge(b.fullState())
            return result
        }
        let checked = runCases("ZoneState \(law)", minimumChecks: casesPerLaw, regressions: RegressionSeeds.zoneLaws) { rng in
            var simulation = ZoneSimulation(replicaCount: rng.int(2 ... 4))
            simulation.misaddressedDeltas = false
            try simulation.run(steps: rng.int(10 ... 30), &rng)
            let snapshots = simulation.snapshots
            var checks = try check(law, snapshots: snapshots, cases: casesPerWorld, &rng, merge: join, bytes: encoded)
            // Delta law: merging b's changes since a's version (or since any older version of a, as when a
            // delta arrives late) gives exactly a ⊔ b.
            for _ in 0 ..< casesPerWorld / 2 where !snapshots.isEmpty {
                let a = rng.pick(snapshots), b = rng.pick(snapshots)
                let olderA = snapshots.filter { a.version.dominates($0.version) }
                let since = rng.chance(50) ? a.version : rng.pick(olderA).version
                var viaDelta = a
                if let delta = b.changes(since: since) { try viaDelta.merge(delta) }
                if viaDelta != join(a, b) {
                    let j = join(a, b)
                    for (id, r) in j.records where viaDelta.records[id] != r { print("DEBUG join \(r)\nDEBUG viaDelta \(String(describing: viaDelta.records[id]))\nDEBUG a \(String(describing: a.records[id]))\nDEBUG b \(String(describing: b.records[id]))\nDEBUG since \(since)\nDEBUG bdelta \(String(describing: b.changes(since: since)))") }
                }
                try require(viaDelta == join(a, b), "a.merge(b.changes(since:)) differs from a ⊔ b")
                try require(encoded(viaDelta) == encoded(join(a, b)), "delta merge encodes differently")
                checks += 1
            }
            return checks
        }
        #expect(checked >= casesPerLaw)
    }
}
