import LatticeCore

// The merge scenarios of workload lww-orset-v1 on LatticeCore's real code paths: zones hold
// encoded records, B exports with `encodedChanges(since:)` / `encodedFullState()`, and A imports
// with `ZoneState.merge(encoded:clock:)` (validate, check the clock bound, join). The join is `FrameMerge`, the one
// the server and the sync engine run too, per record through `RecordFrame.merged(with:)` between storage reads and
// writes (`lattice-bench sync` measures that path end to end). Clocks are deterministic: a fixed physical time, so
// only the HLC counter moves.

/// The `version` reported in run and summary lines.
let latticePeerVersion = "lattice 0.1.0 (binary format \(BinaryCodec.formatVersion))"

/// Fixed physical time for both replicas' clocks (2023-11-14T22:13:20Z); never the wall clock.
private let benchmarkMilliseconds: UInt64 = 1_700_000_000_000
private let recordType = "Item"
private let tagsField = "tags"

/// One benchmark replica: its clock and its copy of the zone.
private struct Replica {
    var clock: HybridLogicalClock
    var zone: ZoneState

    init(id: UInt64, zone: ZoneState, after latest: HLC = .zero) {
        clock = HybridLogicalClock(replica: ReplicaID(id), latest: latest, time: { benchmarkMilliseconds })
        self.zone = zone
    }

    /// Applies a plan with the public edit API: one stamp per edited record.
    mutating func apply(_ plan: EditPlan, workload: Workload) throws {
        for position in plan.indices {
            let edit = plan[position]
            try zone.update(edit.key, clock: &clock) { record, stamp in
                for (field, value) in edit.fields {
                    try record.set(workload.fieldNames[field], to: scalar(value), at: stamp)
                }
                try record.add(.string(workload.tagNames[edit.addTag]), to: tagsField, at: stamp)
                if let removed = edit.removeTag {
                    try record.remove(.string(workload.tagNames[removed]), from: tagsField, at: stamp)
                }
            }
        }
    }
}

private func scalar(_ value: WorkloadValue) -> ScalarValue {
    switch value {
    case .string(let text): return .string(text)
    case .int(let number): return .int64(number)
    }
}

/// Runs one scenario of the merge benchmark in this (fresh) process and reports its measurement.
func runScenario(_ scenario: Scenario, workload: Workload, verify: Bool) throws -> ScenarioMeasurement {
    let zoneID = try ZoneID(zoneName: "bench", ownerRecordName: "_bench")

    // 1. A builds the common base; B starts from a copy and has observed A's clock.
    var a = Replica(id: WorkloadReplica.a.id, zone: ZoneState(zoneID: zoneID))
    let rssBeforeBase = ProcStatus.rssKiB
    let buildBase = try measureSeconds { () throws -> Void in
        for index in workload.base.indices {
            let base = workload.base[index]
            try a.zone.create(recordName: base.key, recordType: recordType, clock: &a.clock)
            try a.zone.update(base.key, clock: &a.clock) { record, stamp in
                for (field, value) in base.values.enumerated() {
                    try record.set(workload.fieldNames[field], to: scalar(value), at: stamp)
                }
                for tag in base.tags { try record.add(.string(workload.tagNames[Int(tag)]), to: tagsField, at: stamp) }
            }
        }
    }
    let baseVersion = a.zone.version
    // Memory of one replica: the resident growth while A alone built the base, per record.
    let replicaBytesPerRecord = Double(max(0, ProcStatus.rssKiB - rssBeforeBase)) * 1024
        / Double(workload.parameters.records)
    var b = Replica(id: WorkloadReplica.b.id, zone: a.zone, after: a.clock.latest)

    // 2. Both edit independently.
    let applyEdits = try measureSeconds { () throws -> Void in
        try a.apply(workload.editsA, workload: workload)
        try b.apply(workload.editsB, workload: workload)
    }

    // 3. The timed step: B exports, A validates and merges.
    let timing = try measureMerge(
        export: { () -> [UInt8] in
            switch scenario {
            case .delta: return b.zone.encodedChanges(since: baseVersion) ?? []
            case .full: return b.zone.encodedFullState()
            }
        },
        importing: { bytes in
            guard !bytes.isEmpty else { return }
            try a.zone.merge(encoded: bytes, clock: &a.clock)
        })

    // 4. Checks after timing.
    var result: VerifyResult? = nil
    if verify {
        do {
            result = try check(a: &a, b: &b, baseVersion: baseVersion, workload: workload)
        } catch {
            result = .error("\(error)")
        }
    }
    return ScenarioMeasurement(buildBaseSeconds: buildBase.seconds, applyEditsSeconds: applyEdits.seconds, merge: timing,
                               verify: result, extra: [
                                   "replica_rss_bytes_per_record": .double(replicaBytesPerRecord.rounded()),
                                   "replica_encoded_bytes_per_record": .double(
                                       (Double(a.zone.encodedSize) / Double(workload.parameters.records)).rounded()),
                               ])
}

/// (a) every record only B edited equals B's values in A; (b) after B merges A's changes, A == B.
private func check(a: inout Replica, b: inout Replica, baseVersion: VersionVector,
                   workload: Workload) throws -> VerifyResult {
    guard a.zone.count == workload.parameters.records else {
        return .failed("A holds \(a.zone.count) records, expected \(workload.parameters.records)")
    }
    let tagIndex = Dictionary(uniqueKeysWithValues: workload.tagNames.enumerated().map { ($1, $0) })
    for edit in workload.bOnlyEdits() {
        let expected = workload.expectedRecord(after: edit)
        guard let record = a.zone[expected.key], !record.isDeleted else { return .failed("\(expected.key) missing in A") }
        for (field, value) in expected.values.enumerated() where record[workload.fieldNames[field]] != .scalar(scalar(value)) {
            return .failed("\(expected.key).\(workload.fieldNames[field]) differs in A")
        }
        var tags: [Int] = []
        if case .list(_, let elements)? = record[tagsField] {
            for case .string(let name) in elements { tags.append(tagIndex[name] ?? -1) }
        }
        if tags.sorted() != expected.tags { return .failed("\(expected.key).tags differ in A") }
    }
    if let fromA = a.zone.encodedChanges(since: baseVersion) {
        try b.zone.merge(EncodedDelta(validating: fromA), clock: &b.clock)
    }
    guard a.zone.encodedFullState() == b.zone.encodedFullState() else {
        return .failed("A and B differ after B merged A's changes")
    }
    return .ok
}
