/// What a `PostgresTransaction` remembers between its statements so that it need not ask again, and the one
/// place that decides what a write makes stale.
///
/// Every statement of the transaction that writes one of the cached tables (`databases`, `zones`, `records`,
/// `shares`, `client_operations`) goes through `PostgresTransaction.write(_:_:changes:)`, naming the rows it
/// changes as `PostgresCacheScope`s; `drop(_:)` forgets every entry that depends on them before the statement
/// runs. A method may then put back what its statement returned (write-through: a saved record, a moved
/// counter), never anything older. In debug builds a statement that writes a cached table without naming
/// what it changes stops at an assertion (`PostgresTransactionCache.cachedTableWritten(by:)`), so a new write
/// method cannot forget. A savepoint rolled back or a bulk import drops everything (`.everything`).
///
/// Entries are valid only inside one transaction: a read sees one snapshot, and a write holds the rows it
/// cached locked (the zone row before its records and shares: Docs/Architecture.md, "Lock order"), so only
/// the transaction itself can change them.
struct PostgresTransactionCache {
    /// Zone rows this write transaction has locked, with their database and whether they are deleted. Lock
    /// state more than data: it survives every drop but `.everything` and `.zone` (a purge or a deletion of
    /// the zone), so a record read need not lock its zone again.
    var lockedZones: [Int64: (databaseID: Int64, deleted: Bool)] = [:]
    /// Record rows read or written, by zone and name (nil: known to be missing), so a batch read once
    /// (`prefetchRecords`) answers each later `record` without a round trip.
    var records: [Int64: [String: StoredRecord?]] = [:]
    /// Database rows this write transaction holds locked, as they are with its own changes.
    var lockedDatabases: [Int64: StoredDatabase] = [:]
    /// Zone rows this write transaction holds locked, as they are with its own changes.
    var zoneRows: [Int64: StoredZone] = [:]
    /// The live shares of a zone, read once.
    var shares: [Int64: [StoredShare]] = [:]
    /// Users' counts of remembered operations read by `clientOperation` in this write.
    var clientOperationCounts: [Int64: Int] = [:]

    /// Forgets every entry that depends on the rows `scopes` name.
    mutating func drop(_ scopes: [PostgresCacheScope]) {
        for scope in scopes {
            switch scope {
            case .database(let id):
                lockedDatabases[id] = nil
            case .allDatabases:
                lockedDatabases.removeAll()
            case .zone(let rowID):
                zoneRows[rowID] = nil
                lockedZones[rowID] = nil
            case .zoneCounters(let rowID):
                zoneRows[rowID] = nil
            case .records(let zoneRowID, let names):
                for name in names { records[zoneRowID]?[name] = nil }
            case .allRecords(let zoneRowID):
                records[zoneRowID] = nil
            case .shares(let zoneRowID):
                shares[zoneRowID] = nil
            case .share(let id):
                for (zoneRowID, live) in shares where live.contains(where: { $0.id == id }) { shares[zoneRowID] = nil }
            case .clientOperations(let userID):
                clientOperationCounts[userID] = nil
            case .allClientOperations:
                clientOperationCounts.removeAll()
            case .everything:
                self = PostgresTransactionCache()
            }
        }
    }

    /// Everything but the zone locks held: after a savepoint rolled back, whose writes are undone while the
    /// locks taken before it stay.
    mutating func dropAllButLocks() {
        let locks = lockedZones
        self = PostgresTransactionCache()
        lockedZones = locks
    }

    /// The cached table a statement writes, if any (a rough reading of the SQL: enough to catch a write
    /// method that forgot to name what it changes, in debug builds).
    static func cachedTableWritten(by sql: String) -> String? {
        let words = sql.split(whereSeparator: { $0 == " " || $0 == "\n" || $0 == "(" }).map { $0.lowercased() }
        for (index, word) in words.enumerated() where index + 1 < words.count {
            let target: String?
            switch word {
            case "update": target = words[index + 1]
            case "into" where index > 0 && words[index - 1] == "insert": target = words[index + 1]
            case "from" where index > 0 && words[index - 1] == "delete": target = words[index + 1]
            default: target = nil
            }
            if let target, cachedTables.contains(target) { return target }
        }
        return nil
    }

    static let cachedTables: Set<String> = ["databases", "zones", "records", "shares", "client_operations"]
}

/// Rows a write statement changes, as far as `PostgresTransactionCache` is concerned.
enum PostgresCacheScope: Hashable {
    /// One database row (its counters, bytes or purged position).
    case database(Int64)
    /// Database rows the statement picks itself (a refund to whichever databases charged).
    case allDatabases
    /// A zone row created, deleted or removed: its data and its lock state.
    case zone(Int64)
    /// A live zone's counters or positions (the row stays locked and live).
    case zoneCounters(Int64)
    /// These records of a zone.
    case records(zoneRowID: Int64, names: [String])
    /// Every record of a zone.
    case allRecords(zoneRowID: Int64)
    /// The shares of a zone (one inserted).
    case shares(zoneRowID: Int64)
    /// One share row, wherever it is cached.
    case share(Int64)
    /// A user's remembered operations (their count).
    case clientOperations(userID: Int64)
    /// Remembered operations of any user.
    case allClientOperations
    /// Everything.
    case everything
}
