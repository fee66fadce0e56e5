/// The bookkeeping every backend does the same way, written once over small primitives that each backend
/// implements in its own SQL: creating and deleting a zone (positions in the database log, the records and
/// their bytes), and the order, budget and report of a purge batch. A backend conforms to
/// `StorageBookkeeping` and gets `createZone`, `deleteZone` and `purge` from the extension below; its
/// primitives say nothing about when or why they run.

/// A backend's primitives for the shared bookkeeping (internal: callers see `StorageTransaction` only).
protocol StorageBookkeeping: StorageTransaction {
    var isReadOnly: Bool { get }

    // MARK: Zones

    /// Allocates the database's next log position; the counter row stays locked until commit.
    func nextDatabaseSeq(_ databaseID: Int64) throws -> Int64
    /// Inserts a live zone row at database position `databaseSeq`; nil when a live zone already has the name.
    func insertZoneRow(databaseID: Int64, name: String, ownerRecordName: String, databaseSeq: Int64, nowMs: Int64)
        throws -> Int64?
    /// Called with the zone `createZone` made (a backend that remembers rows it holds keeps it). Default: nothing.
    func didCreateZone(_ zone: StoredZone)
    /// Deletes every record row of a zone; returns the bytes of their frames.
    func deleteRecordRows(zoneRowID: Int64) throws -> Int64
    /// Marks a zone row deleted at database position `databaseSeq`.
    func markZoneRowDeleted(_ zone: StoredZone, databaseSeq: Int64, nowMs: Int64) throws
    /// Takes `bytes` off the database's `bytesUsed`.
    func releaseBytes(_ bytes: Int64, databaseID: Int64) throws

    // MARK: Purge

    /// Removes at most `limit` tombstones last changed before `horizonMs`, oldest first, raising each zone's
    /// `purgedSeq` and giving back their bytes; `skipped` when it left some it could not lock without waiting.
    func purgeTombstones(before horizonMs: Int64, limit: Int) throws -> (removed: Int, skipped: Bool)
    /// Deleted zones last changed before `horizonMs` with an id after `after`, in id order, at most `limit`.
    func deletedZones(before horizonMs: Int64, after: Int64, limit: Int) throws -> [DeletedZone]
    /// The zones of `zones` the purge may remove now (a multi-writer backend: those whose database and zone
    /// rows it could lock without waiting). Default: all of them (one writer holds every lock).
    func lockDeletedZonesForPurge(_ zones: [StoredZone]) throws -> Set<Int64>
    /// Removes a deleted zone's row; false if it was not there (or not deleted).
    func deleteDeletedZoneRow(_ zone: StoredZone) throws -> Bool
    /// Raises the database's `purgedSeq` to `seq` (never lowers it).
    func raiseDatabasePurgedSeq(databaseID: Int64, to seq: Int64) throws
    /// Forgets at most `limit` remembered operations saved before `beforeMs`, oldest first, giving back their
    /// charges: how many it looked at, how many went, and whether it left some it could not lock.
    func forgetClientOperations(before beforeMs: Int64, limit: Int) throws
        -> (examined: Int, removed: Int, skipped: Bool)
}

extension StorageBookkeeping {
    func didCreateZone(_ zone: StoredZone) {}

    func lockDeletedZonesForPurge(_ zones: [StoredZone]) throws -> Set<Int64> { Set(zones.map(\.rowID)) }

    public func createZone(databaseID: Int64, name: String, ownerRecordName: String, nowMs: Int64) throws -> StoredZone {
        let seq = try nextDatabaseSeq(databaseID)
        guard let rowID = try insertZoneRow(databaseID: databaseID, name: name, ownerRecordName: ownerRecordName,
                                            databaseSeq: seq, nowMs: nowMs) else {
            throw StorageError.duplicate("a zone named \(name)")
        }
        let zone = StoredZone(rowID: rowID, databaseID: databaseID, name: name, ownerRecordName: ownerRecordName,
                              deleted: false, lastSeq: 0, purgedSeq: 0, databaseSeq: seq, createdMs: nowMs, modifiedMs: nowMs)
        didCreateZone(zone)
        return zone
    }

    public func deleteZone(rowID: Int64, nowMs: Int64) throws {
        guard let zone = try zone(rowID: rowID), !zone.deleted else { return }
        let seq = try nextDatabaseSeq(zone.databaseID)
        let freed = try deleteRecordRows(zoneRowID: rowID)
        try markZoneRowDeleted(zone, databaseSeq: seq, nowMs: nowMs)
        try releaseBytes(freed, databaseID: zone.databaseID)
    }

    /// The batch's order and budget: tombstones, then deleted zones (`StorageRules.purgesDeletedZone` decides
    /// which; pages of `limit` candidates past the kept ones), then remembered operations, at most `limit`
    /// rows looked at in all; `complete` unless the budget ran out or a backend skipped rows it could not lock.
    public func purge(before horizonMs: Int64, operationsBeforeMs: Int64, limit: Int) throws -> PurgeReport {
        guard limit > 0 else { throw StorageError.failure("a purge batch limit of \(limit): at least 1") }
        // Refused even when there is nothing to remove (and so no statement would be).
        guard !isReadOnly else { throw StorageError.failure("a purge in a read transaction") }
        var report = PurgeReport()
        var remaining = limit
        let tombstones = try purgeTombstones(before: horizonMs, limit: remaining)
        report.tombstones = tombstones.removed
        remaining -= tombstones.removed
        var skipped = tombstones.skipped
        // Each database's purged position rises to the newest position of a zone it forgot.
        var after: Int64 = 0
        while remaining > 0 {
            let page = try deletedZones(before: horizonMs, after: after, limit: limit)
            let candidates = page.filter(StorageRules.purgesDeletedZone).prefix(remaining).map(\.zone)
            let locked = try lockDeletedZonesForPurge(Array(candidates))
            for zone in candidates {
                remaining -= 1
                guard locked.contains(zone.rowID), try deleteDeletedZoneRow(zone) else {
                    skipped = true
                    continue
                }
                try raiseDatabasePurgedSeq(databaseID: zone.databaseID, to: zone.databaseSeq)
                report.zones += 1
            }
            guard page.count == limit, let last = page.last else { break }
            after = last.zone.rowID
        }
        if remaining > 0 {
            let operations = try forgetClientOperations(before: operationsBeforeMs, limit: remaining)
            report.clientOperations = operations.removed
            remaining -= operations.examined
            skipped = skipped || operations.skipped
        }
        // Stopped at the limit: there may be more (the next batch finds out).
        report.complete = remaining > 0 && !skipped
        return report
    }
}
