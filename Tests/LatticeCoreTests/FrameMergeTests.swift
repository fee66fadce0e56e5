import Testing
@testable import LatticeCore

/// Zones join encoded frames byte-wise (`FrameMerge`); `Record.merge` is the readable reference of the
/// same join. These tests hold the two equal on reachable states from `RecordWorld`.
@Suite struct FrameMergeTests {
    private func frame(_ record: Record) -> [UInt8] {
        var writer = BinaryWriter(capacity: 256)
        try! writer.frame(record)
        return writer.finish()
    }

    @Test func byteJoinEqualsReferenceJoin() {
        var coverage = Coverage()
        let checks = runCases("frame join = Record.merge", minimumChecks: 10_000, regressions: RegressionSeeds.recordLaws) { rng in
            let snapshots = RecordWorld.run(&rng, coverage: &coverage)
            guard snapshots.count >= 2 else { return 0 }
            var made = 0
            for _ in 0 ..< 8 {
                let a = rng.pick(snapshots), b = rng.pick(snapshots)
                let expected = frame(a.merging(b))
                let joined = FrameMerge.merged(frame(a), frame(b))
                try require(joined == expected, "byte join differs from Record.merge for \(a) and \(b)")
                // The zone path rewrites the stored frame (in place when it fits, else in new storage);
                // "unchanged" must mean the join is the stored frame.
                var scratch = BinaryWriter(capacity: 64)
                for stored in [frame(a), frame(a).withUnsafeBytes(FrameStorage.make)] {
                    var mine = stored
                    let changed = frame(b).withUnsafeBytes { FrameMerge.merge(into: &mine, $0, scratch: &scratch) }
                    try require(mine == expected, "zone merge differs from Record.merge")
                    try require(changed == (stored != expected), "zone merge reports a change wrongly")
                }
                made += 1
            }
            return made
        }
        #expect(checks >= 10_000)
        print("frame join coverage: \(coverage)")
    }

    /// A record with one list field whose context names `replicas` (each at a random clock) and whose
    /// entries are dots the context covers. Contexts here reach past the inline (4) and in-place scan (16)
    /// sizes of the frame engine's `RawVector`, into its sorted table.
    private static func wideListRecord(_ rng: inout SplitMix64, replicas pool: [UInt64]) -> Record {
        let chosen = rng.shuffled(pool).prefix(rng.int(0 ... pool.count))
        let context = VersionVector(chosen.map {
            VersionVector.Entry(replica: ReplicaID($0), hlc: HLC(rawValue: (Fixtures.epoch << 16) + UInt64(rng.int(1 ... 40))))
        })
        var entries: [ORSet.Entry] = []
        for entry in context.entries where rng.chance(40) {
            let hlc = HLC(rawValue: (Fixtures.epoch << 16) + UInt64(rng.int(1 ... Int(entry.hlc.rawValue - (Fixtures.epoch << 16)))))
            entries.append(ORSet.Entry(element: .int64(Int64(rng.int(0 ... 6))), dot: Stamp(hlc: hlc, replica: entry.replica)))
        }
        let field = Field(name: "items", state: .set(ORSet(entries: entries, context: context)))
        return Record(id: Fixtures.recordID("wide"), recordType: "Item", generation: 1,
                      created: Fixtures.stamp(Fixtures.epoch, replica: 1), deletion: nil, parent: nil, fields: [field])
    }

    @Test func byteJoinEqualsReferenceJoinWithWideContexts() throws {
        var sizes: Set<String> = []
        let checks = runCases("frame join = Record.merge, wide contexts", minimumChecks: 2_000) { rng in
            // Replica ids from one pool, so the two contexts overlap in part; some need 9-10 byte varints.
            let pool = (0 ..< rng.int(1 ... 60)).map { _ in rng.chance(30) ? rng.next() : UInt64(rng.int(1 ... 200)) }
            let a = Self.wideListRecord(&rng, replicas: pool), b = Self.wideListRecord(&rng, replicas: pool)
            for record in [a, b] {
                guard case .set(let set)? = record.fields.first?.state else { continue }
                sizes.insert(set.context.entries.count <= 4 ? "inline" : set.context.entries.count <= 16 ? "scan" : "table")
                // Both checks accept the frame (every dot is covered, whatever the context's size).
                _ = try RecordFrame(validating: try RecordFrame(encoding: record).bytes)
            }
            let expected = frame(a.merging(b))
            try require(FrameMerge.merged(frame(a), frame(b)) == expected, "byte join differs from Record.merge for \(a) and \(b)")
            return 1
        }
        #expect(checks >= 2_000)
        #expect(sizes == ["inline", "scan", "table"], "context sizes reached: \(sizes)")
    }

    /// A dot just outside a wide context is refused by the quick check and the full check alike: the
    /// table's bisection answers "not covered" for a replica between two of its entries, past its last
    /// and before its first, and for a clock above the replica's entry.
    @Test func aDotOutsideAWideContextIsRefused() throws {
        let replicas = (1 ... 40).map { UInt64($0) * 10 }
        let context = VersionVector(replicas.map { VersionVector.Entry(replica: ReplicaID($0), hlc: HLC(rawValue: 100)) })
        for (replica, hlc) in [(15, 50), (5, 50), (999, 50), (200, 101)] as [(UInt64, UInt64)] {
            let outside = ORSet.Entry(element: .int64(1), dot: Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(replica)))
            let inside = ORSet.Entry(element: .int64(2), dot: Stamp(hlc: HLC(rawValue: 100), replica: ReplicaID(400)))
            let record = Record(id: Fixtures.recordID("wide"), recordType: "Item", generation: 1,
                                created: Fixtures.stamp(Fixtures.epoch, replica: 1), deletion: nil, parent: nil,
                                fields: [Field(name: "items", state: .set(ORSet(sortedEntries: [outside, inside], context: context)))])
            var writer = BinaryWriter(capacity: 1024)
            writer.header(kind: BinaryCodec.recordKind)
            writer.zoneID(Fixtures.zone)
            try writer.frame(record)
            let bytes = writer.finish()
            #expect(throws: CodecError.self, "dot \(replica)@\(hlc) outside the context was accepted") {
                _ = try RecordFrame(validating: bytes)
            }
        }
    }

    /// The zone cuts partial frames byte-wise; `Record.changes(since:)` states the same rule on values.
    @Test func byteChangesEqualReferenceChanges() {
        var coverage = Coverage()
        runCases("frame changes = Record.changes", minimumChecks: 5_000, regressions: RegressionSeeds.recordLaws) { rng in
            let snapshots = RecordWorld.run(&rng, coverage: &coverage)
            guard snapshots.count >= 2 else { return 0 }
            var made = 0
            for _ in 0 ..< 8 {
                let record = rng.pick(snapshots)
                var since = VersionVector()
                rng.pick(snapshots).recordStamps(into: &since)
                let expected = record.changes(since: since).map(frame)
                var writer = BinaryWriter(capacity: 256)
                let wrote = frame(record).withUnsafeBytes { ZoneState.appendChanges(of: $0, since: Covering(since), to: &writer) }
                let actual = wrote ? writer.finish() : nil
                try require(actual == expected, "byte changes differ from Record.changes for \(record) since \(since)")
                made += 1
            }
            return made
        }
    }

    @Test func zoneMergeOfEncodedBytesEqualsValueMerge() throws {
        var coverage = Coverage()
        runCases("zone encoded merge = value merge", minimumChecks: 300, regressions: RegressionSeeds.zoneLaws) { rng in
            let snapshots = RecordWorld.run(&rng, coverage: &coverage)
            guard let first = snapshots.first, let last = snapshots.last else { return 0 }
            var byValue = ZoneState(zoneID: Fixtures.zone)
            try byValue.merge(ZoneDelta(zoneID: Fixtures.zone, since: VersionVector(), version: VersionVector(),
                                        records: [first]))
            var byBytes = byValue
            let delta = ZoneDelta(zoneID: Fixtures.zone, since: VersionVector(), version: VersionVector(), records: [last])
            try byValue.merge(delta)
            var clock = HybridLogicalClock(replica: ReplicaID(99), time: { Fixtures.epoch + 1_000_000 })
            try byBytes.merge(encoded: BinaryCodec.encode(delta), clock: &clock)
            try require(byValue == byBytes, "encoded and value merges differ")
            try require(byValue[first.id.recordName] == first.merging(last), "zone merge differs from Record.merge")
            return 1
        }
    }
}

private extension Record {
    /// Every stamp the record holds, as a version (a plausible "what a peer has seen").
    func recordStamps(into version: inout VersionVector) {
        version.record(created)
        if let deletion { version.record(deletion) }
        if let parentRegister { version.record(parentRegister.stamp) }
        for field in fields {
            switch field.state {
            case .register(let register): version.record(register.stamp)
            case .set(let set): version.merge(set.context)
            case .list(let list): version.merge(list.context)
            case .text(let text): version.merge(text.context)
            }
        }
    }
}
