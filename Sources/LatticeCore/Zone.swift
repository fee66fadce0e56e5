/// A batch of record states for one zone: either the changes since a version, or a whole state.
///
/// Merging a delta is a join, so deltas may be applied in any order, more than once.
public struct ZoneDelta: Hashable, Sendable {
    public let zoneID: ZoneID
    /// The version the delta was computed against (empty for a whole state).
    public let since: VersionVector
    /// The sender's version after the changes in this delta.
    public let version: VersionVector
    /// Partial or whole record states, sorted by record name.
    public let records: [Record]

    public init(zoneID: ZoneID, since: VersionVector, version: VersionVector, records: [Record]) {
        self.zoneID = zoneID
        self.since = since
        self.version = version
        self.records = records
    }

    /// The newest clock value in the delta, to check against the receiving clock's drift bound.
    public var maximumHLC: HLC {
        records.reduce(version.maximumHLC) { max($0, $1.maximumHLC) }
    }
}

/// A zone as one replica holds it: its records (tombstones included) and the version it reflects.
///
/// ```swift
/// var clock = HybridLogicalClock(replica: ReplicaID(1), time: { 1_764_489_600_000 })
/// var zone = ZoneState(zoneID: zoneID)
/// try zone.create(recordName: "milk", recordType: "Item", clock: &clock)
/// try zone.update("milk", clock: &clock) { record, stamp in try record.set("text", to: .string("Milk"), at: stamp) }
/// let delta = zone.changes(since: otherVersion)   // nil when the other side is up to date
/// ```
public struct ZoneState: Hashable, Sendable {
    public let zoneID: ZoneID
    public private(set) var records: [String: Record]
    /// Every operation this state reflects.
    public private(set) var version: VersionVector

    public init(zoneID: ZoneID) {
        self.zoneID = zoneID
        self.records = [:]
        self.version = VersionVector()
    }

    public subscript(recordName: String) -> Record? { records[recordName] }

    /// Visible (not deleted) records, sorted by name.
    public var liveRecords: [Record] {
        records.values.filter { !$0.isDeleted }.sorted { compareBytes($0.id.recordName, $1.id.recordName) < 0 }
    }

    // MARK: Local edits

    /// Creates a record, or recreates it when it exists as a tombstone.
    /// - Throws: `ZoneError` if a live record with that name exists.
    @discardableResult
    public mutating func create(recordName: String, recordType: String, parent: Reference? = nil,
                                clock: inout HybridLogicalClock) throws -> Record {
        let id = try RecordID(recordName: recordName, zoneID: zoneID)
        let stamp = clock.now()
        var record: Record
        if var existing = records[recordName] {
            guard existing.isDeleted else { throw ZoneError.recordExists(recordName) }
            try existing.recreate(recordType: recordType, at: stamp)
            record = existing
        } else {
            record = try Record(id: id, recordType: recordType, createdAt: stamp)
        }
        version.record(stamp)
        if let parent {
            let parentStamp = clock.now()
            try record.setParent(parent, at: parentStamp)
            version.record(parentStamp)
        }
        records[recordName] = record
        return record
    }

    /// Applies a local edit with one fresh stamp; on error nothing changes.
    public mutating func update(_ recordName: String, clock: inout HybridLogicalClock,
                                _ edit: (inout Record, Stamp) throws -> Void) throws {
        guard var record = records[recordName], !record.isDeleted else { throw ZoneError.recordNotFound(recordName) }
        let stamp = clock.now()
        try edit(&record, stamp)
        records[recordName] = record
        version.record(stamp)
    }

    /// Deletes a live record, leaving a tombstone.
    public mutating func delete(_ recordName: String, clock: inout HybridLogicalClock) throws {
        guard var record = records[recordName], !record.isDeleted else { throw ZoneError.recordNotFound(recordName) }
        let stamp = clock.now()
        record.delete(at: stamp)
        records[recordName] = record
        version.record(stamp)
    }

    // MARK: Deltas and merge

    /// What this state holds that `since` does not reflect, or `nil` when there is nothing to send.
    public func changes(since: VersionVector) -> ZoneDelta? {
        guard version.exceeds(since) else { return nil }
        var changed: [Record] = []
        for record in records.values {
            if let part = record.changes(since: since) { changed.append(part) }
        }
        if changed.isEmpty { return nil }
        changed.sort { compareBytes($0.id.recordName, $1.id.recordName) < 0 }
        return ZoneDelta(zoneID: zoneID, since: since, version: version, records: changed)
    }

    /// The whole state as a delta since nothing.
    public func fullState() -> ZoneDelta {
        let all = records.values.sorted { compareBytes($0.id.recordName, $1.id.recordName) < 0 }
        return ZoneDelta(zoneID: zoneID, since: VersionVector(), version: version, records: all)
    }

    /// Joins a delta (or a whole state) into this state.
    ///
    /// The version advances to the sender's only when the delta was computed against a version this
    /// state already reflects; otherwise only the operations inside the delta are recorded.
    /// Check `delta.maximumHLC` with `HybridLogicalClock.observe(_:)` first to enforce the drift bound.
    public mutating func merge(_ delta: ZoneDelta) throws {
        guard delta.zoneID == zoneID else { throw ZoneError.wrongZone(expected: zoneID, got: delta.zoneID) }
        records.reserveCapacity(records.count + delta.records.count)
        let wholeVersion = version.dominates(delta.since)
        for incoming in delta.records {
            let name = incoming.id.recordName
            if let index = records.index(forKey: name) {
                records.values[index].merge(incoming)
            } else {
                records[name] = incoming
            }
            if !wholeVersion { incoming.recordOperations(into: &version) }
        }
        if wholeVersion { version.merge(delta.version) }
    }

    /// Removes tombstones whose delete is older than `horizon` (see the server's purge horizon).
    public mutating func purgeTombstones(deletedBefore horizon: HLC) {
        records = records.filter { _, record in
            guard let deletion = record.deletion else { return true }
            return deletion.hlc >= horizon
        }
    }
}

/// A zone-level operation was refused.
public enum ZoneError: Error, Hashable, Sendable, CustomStringConvertible {
    case recordExists(String)
    case recordNotFound(String)
    case wrongZone(expected: ZoneID, got: ZoneID)

    public var description: String {
        switch self {
        case .recordExists(let name): return "record \(name) already exists"
        case .recordNotFound(let name): return "record \(name) does not exist"
        case let .wrongZone(expected, got): return "delta for zone \(got) cannot merge into zone \(expected)"
        }
    }
}
