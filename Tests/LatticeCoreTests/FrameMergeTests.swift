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
            }
        }
    }
}
