import Foundation
import LatticeCore
import Synchronization

/// How one run of a transaction ended, for `PostgresStorage`'s retry loop.
enum PostgresOutcome<T> {
    case success(T)
    /// Thrown to the caller as it is (a `StorageError` or the body's own error).
    case failure(any Error)
    /// A serialization failure or deadlock: nothing was kept; run the body again.
    case conflict
    /// Another transaction saved the same client operation id first: run the body again once, so it finds
    /// the stored answer.
    case clientOperationConflict
    /// The connection was lost before `COMMIT` was sent: nothing was committed; run again on a new connection.
    case connectionLost
}

/// `StorageTransaction` over one PostgreSQL connection inside an open transaction.
///
/// Every operation throws `StorageError`. A failure that ends the whole transaction (a conflict, a lost
/// connection, the deadline, or any failed statement outside a savepoint, which PostgreSQL aborts the
/// transaction for) is remembered: later statements are refused with the same error, and the transaction is
/// rolled back and retried or failed whatever the body did with the error.
final class PostgresTransaction: StorageTransaction, StorageBookkeeping, StorageRowMapping, PortableAssetSQL {
    typealias Column = PostgresValue

    let db: PostgresConnection
    let isReadOnly: Bool
    let deadline: RequestDeadline?
    /// Client-operation conflicts seen by earlier runs of this transaction (the second one is a duplicate).
    private let clientOperationConflictsSeen: Int

    private enum Fatal {
        case conflict
        case clientOperationConflict
        case connectionLost
        case deadline
        case failed(StorageError)
    }

    private var fatal: Fatal?
    /// `BEGIN` (and the statement timeout), not sent yet: it goes with the transaction's first statement.
    private var pendingBegin: [String]?
    private var savepointDepth = 0
    /// Rows read earlier in this transaction (zone locks, records, databases, zones, shares, operation counts),
    /// dropped by the one write entry point (`write(_:_:changes:)`) for whatever its statement changes.
    private var cache = PostgresTransactionCache()
    /// Statements whose answers nothing in the transaction needs (announcements), sent with `COMMIT` in one
    /// round trip; a failure among them fails the commit, so nothing is committed without them.
    private var deferred: [(sql: String, values: [PostgresValue])] = []
    /// Cursors opened by `exportRows` (each gets a name of its own).
    private var exportCursors = 0

    /// Tests only (`PostgresStorage.beforeCommitForTesting`): called with the backend's process id just
    /// before `COMMIT` is sent. Nil in the service.
    private let beforeCommit: (@Sendable (Int32) -> Void)?

    /// The storage's mark in its announcements.
    private let announcer: String

    init(_ connection: PostgresConnection, readOnly: Bool, deadline: RequestDeadline?, clientOperationConflictsSeen: Int,
         announcer: String, beforeCommit: (@Sendable (Int32) -> Void)? = nil) {
        self.announcer = announcer
        self.beforeCommit = beforeCommit
        db = connection
        isReadOnly = readOnly
        self.deadline = deadline
        self.clientOperationConflictsSeen = clientOperationConflictsSeen
    }

    // MARK: Running

    /// Begins, runs `body`, and commits (or rolls back), once.
    func perform<T>(_ body: (any StorageTransaction) throws -> T) -> PostgresOutcome<T> {
        var begin = [isReadOnly ? "BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY" : "BEGIN ISOLATION LEVEL READ COMMITTED"]
        if let deadline {
            let milliseconds = deadline.remainingMilliseconds
            guard milliseconds > 0 else { return .failure(StorageError.deadlineExceeded) }
            // Our own integer, not a value from a request.
            begin.append("SET LOCAL statement_timeout = \(milliseconds)")
        }
        // Sent with the first statement (one round trip for both); a body that runs none opens nothing.
        pendingBegin = begin
        let value: T
        do {
            value = try body(self)
        } catch {
            return finish(error)
        }
        if case .failed? = fatal, isReadOnly {
            // A read whose body caught a failed statement (say, a refused write) and returned: its answer
            // stands, as it would on SQLite; there is nothing to commit.
            if db.isUsable, db.isInTransaction { db.sendWithoutWaiting("ROLLBACK") }
            return .success(value)
        }
        if fatal != nil { return finish(nil) }
        if pendingBegin != nil && deferred.isEmpty {
            // No statement ran: no transaction was opened, nothing to commit.
            return .success(value)
        }
        if isReadOnly {
            // Nothing to make durable: the snapshot's answer stands whatever the COMMIT says, so the
            // connection reads that answer before its next use instead of the caller waiting for it now.
            db.sendWithoutWaiting("COMMIT")
            return .success(value)
        }
        // The body returned: commit, whatever the time (the deadline no longer applies), in one round trip
        // with the deferred statements before it.
        if pendingBegin != nil, !deferred.isEmpty {
            // Nothing was sent yet: the first deferred statement opens the transaction on its own, so that a
            // connection found lost there is known to have committed nothing (and the body runs again).
            let first = deferred.removeFirst()
            do {
                _ = try query(first.sql, first.values)
            } catch {
                return finish(error)
            }
        }
        if let hook = beforeCommit { hook(db.backendPID) }
        var statements = deferred
        deferred = []
        if deadline != nil { statements.append((sql: "SET LOCAL statement_timeout = 0", values: [])) }
        statements.append((sql: "COMMIT", values: []))
        if let (index, error) = db.pipeline(statements, context: "commit") {
            if error.isConnectionLoss {
                // It may or may not have committed: never report it as a success.
                return .failure(StorageError.busy)
            }
            if index < statements.count - 1 {
                // A statement before COMMIT failed, so COMMIT did not run: roll back as for any failure.
                _ = note(error)
                return finish(nil)
            }
            if error.isRetryableConflict { return .conflict }
            return .failure(Self.storageError(error))
        }
        return .success(value)
    }

    /// Rolls back and says why the run ended (`bodyError`: what the body threw, if it did).
    private func finish<T>(_ bodyError: (any Error)?) -> PostgresOutcome<T> {
        if db.isUsable, db.isInTransaction { try? db.execute("ROLLBACK", context: "rollback") }
        switch fatal {
        case .conflict?: return .conflict
        case .clientOperationConflict?: return .clientOperationConflict
        case .connectionLost?: return .connectionLost
        case .deadline?: return .failure(StorageError.deadlineExceeded)
        case .failed(let error)?: return .failure(bodyError ?? error)
        case nil: return .failure(bodyError ?? StorageError.failure("the transaction failed"))
        }
    }

    /// Records what a failed statement means for the transaction, and the error to throw to the body.
    private func note(_ error: PostgresError) -> StorageError {
        if error.isConnectionLoss {
            fatal = .connectionLost
            return .busy
        }
        if error.isRetryableConflict {
            fatal = .conflict
            return .busy
        }
        if error.isQueryCanceled {
            if deadline != nil {
                fatal = .deadline
                return .deadlineExceeded
            }
            // Cancelled by an administrator: transient.
            fatal = .failed(.busy)
            return .busy
        }
        let mapped = Self.storageError(error)
        // Outside a savepoint PostgreSQL has aborted the transaction: nothing more can run in it.
        if savepointDepth == 0 { fatal = .failed(mapped) }
        return mapped
    }

    /// PostgreSQL's error in the storage taxonomy (for errors that do not end the transaction by themselves).
    static func storageError(_ error: PostgresError) -> StorageError {
        if error.isUniqueViolation { return .duplicate(error.constraint ?? error.message) }
        if error.isDiskFull { return .diskFull }
        if error.isConnectionLoss || error.isRetryableConflict { return .busy }
        if error.sqlState == SQLState.readOnlyTransaction { return .failure("a read transaction cannot write") }
        return .failure(error.description)
    }

    private func throwIfEnded() throws(StorageError) {
        switch fatal {
        case nil: break
        case .conflict?, .clientOperationConflict?, .connectionLost?: throw .busy
        case .deadline?: throw .deadlineExceeded
        case .failed(let error)?: throw error
        }
        if let deadline, deadline.hasPassed {
            fatal = .deadline
            throw .deadlineExceeded
        }
    }

    private func query(_ sql: String, _ values: [PostgresValue] = []) throws(StorageError) -> PostgresResult {
        try throwIfEnded()
        do {
            if let begin = pendingBegin {
                pendingBegin = nil
                return try db.query(sql, values, after: begin)
            }
            return try db.query(sql, values)
        } catch {
            throw note(error)
        }
    }

    /// Opens the transaction now, for a command that cannot carry the `BEGIN` along.
    private func beginIfPending() throws(StorageError) {
        guard let begin = pendingBegin else { return }
        pendingBegin = nil
        do {
            try db.execute(begin.joined(separator: "; "), context: "begin")
        } catch {
            throw note(error)
        }
    }

    private func rows(_ sql: String, _ values: [PostgresValue] = []) throws(StorageError) -> [[PostgresValue]] {
        assert(PostgresTransactionCache.cachedTableWritten(by: sql) == nil,
               "a statement that writes a cached table goes through write(_:_:changes:)")
        return try query(sql, values).rows
    }

    /// The one way a statement writes a table this transaction caches rows of (`PostgresTransactionCache`):
    /// every entry that depends on the rows `changes` names is dropped before the statement runs, so no later
    /// read in the transaction can see them as they were.
    @discardableResult
    private func write(_ sql: String, _ values: [PostgresValue] = [], changes: [PostgresCacheScope])
        throws(StorageError) -> [[PostgresValue]] {
        cache.drop(changes)
        return try query(sql, values).rows
    }

    @discardableResult
    private func run(_ sql: String, _ values: [PostgresValue] = []) throws(StorageError) -> Int {
        assert(PostgresTransactionCache.cachedTableWritten(by: sql) == nil,
               "a statement that writes a cached table goes through write(_:_:changes:)")
        return try query(sql, values).affectedRows
    }

    /// `write(_:_:changes:)`, answering how many rows the statement changed.
    @discardableResult
    private func writeCounting(_ sql: String, _ values: [PostgresValue] = [], changes: [PostgresCacheScope])
        throws(StorageError) -> Int {
        cache.drop(changes)
        return try query(sql, values).affectedRows
    }

    private func execute(_ sql: String, checked: Bool = true) throws(StorageError) {
        if checked { try throwIfEnded() }
        try beginIfPending()
        do {
            try db.execute(sql)
        } catch {
            throw note(error)
        }
    }

    /// Row locks for single-row reads in a write transaction. `FOR NO KEY UPDATE` conflicts with itself and
    /// with every UPDATE or DELETE of the row, so read-check-write sequences on one row are serialized; it
    /// leaves foreign-key checks (`FOR KEY SHARE`) of other transactions unblocked.
    private var lock: String { isReadOnly ? "" : " FOR NO KEY UPDATE" }

    // MARK: Assets (Assets.swift: the SQL is shared, with `?` placeholders numbered here)

    /// `sql` with its `?` placeholders numbered `$1`, `$2`, ... (the shared asset SQL has no `?` elsewhere).
    private static func numbered(_ sql: String) -> String {
        var out = ""
        out.reserveCapacity(sql.utf8.count + 16)
        var index = 0
        for character in sql {
            if character == "?" {
                index += 1
                out += "$\(index)"
            } else {
                out.append(character)
            }
        }
        return out
    }

    func assetRows(_ sql: String, _ values: [StorageValue]) throws -> [[PostgresValue]] {
        try rows(Self.numbered(sql), values.map(PostgresValue.init))
    }

    func assetRun(_ sql: String, _ values: [StorageValue]) throws -> Int {
        try run(Self.numbered(sql), values.map(PostgresValue.init))
    }

    var assetLock: String { lock }

    /// Runs one statement of the caller's through the transaction's checks and error mapping (tests).
    func rowsForTesting(_ sql: String, _ values: [PostgresValue] = []) throws -> [[PostgresValue]] {
        try rows(sql, values)
    }

    func databaseSize() throws -> Int64 {
        try rows("SELECT pg_database_size(current_database())").first?[0].integer ?? 0
    }

    // MARK: Metadata

    func metadata(_ key: String) throws -> String? {
        try rows("SELECT value FROM metadata WHERE key = $1" + lock, [.text(key)]).first?[0].text
    }

    func setMetadata(_ key: String, _ value: String) throws {
        try run("INSERT INTO metadata(key, value) VALUES ($1, $2) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [.text(key), .text(value)])
    }

    // MARK: Users

    private static let userColumns = "id, record_name, name, created_ms"

    private func user(_ row: [PostgresValue]) -> UserAccount {
        UserAccount(id: row[0].integer, recordName: row[1].text ?? "", name: row[2].text ?? "", createdMs: row[3].integer)
    }

    func insertUser(name: String, recordName: String, nowMs: Int64) throws -> UserAccount {
        // ON CONFLICT DO NOTHING: a taken name is reported without aborting the transaction.
        let inserted = try rows("INSERT INTO users(record_name, name, created_ms, name_key) VALUES ($1, $2, $3, $4) "
                                + "ON CONFLICT DO NOTHING RETURNING id",
                                [.text(recordName), .text(name), .integer(nowMs), .text(StorageRules.userNameKey(name))])
        guard let id = inserted.first?[0].integer else { throw StorageError.duplicate("a user named \(name)") }
        return UserAccount(id: id, recordName: recordName, name: name, createdMs: nowMs)
    }

    func user(named name: String) throws -> UserAccount? {
        // The name as taken, else the one its key names (a name matches whatever its case and look-alikes).
        try rows("SELECT \(Self.userColumns) FROM users WHERE name = $1 OR name_key = $2 ORDER BY name = $1 DESC LIMIT 1",
                 [.text(name), .text(StorageRules.userNameKey(name))]).first.map(user)
    }

    func user(recordName: String) throws -> UserAccount? {
        try rows("SELECT \(Self.userColumns) FROM users WHERE record_name = $1", [.text(recordName)]).first.map(user)
    }

    func user(id: Int64) throws -> UserAccount? {
        try rows("SELECT \(Self.userColumns) FROM users WHERE id = $1", [.integer(id)]).first.map(user)
    }

    func user(tokenHash: [UInt8]) throws -> UserAccount? {
        try rows("SELECT u.id, u.record_name, u.name, u.created_ms FROM tokens t JOIN users u ON u.id = t.user_id "
                 + "WHERE t.hash = $1", [.bytea(tokenHash)]).first.map(user)
    }

    func insertToken(_ token: NewToken) throws {
        let inserted = try rows("INSERT INTO tokens(hash, id, user_id, created_ms, expires_ms, name) "
                                + "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING 1",
                                [.bytea(token.hash), .text(token.id), .integer(token.userID), .integer(token.createdMs),
                                 token.expiresMs.map { .integer($0) } ?? .null, token.name.map { .text($0) } ?? .null])
        if inserted.isEmpty { throw StorageError.duplicate("a token with this hash or id") }
    }

    private static let tokenColumns = "t.id, t.user_id, t.created_ms, t.expires_ms, t.name"

    private func token(_ row: [PostgresValue]) -> StoredToken {
        var expires: Int64? = nil
        if case .integer(let value) = row[3] { expires = value }
        return StoredToken(id: row[0].text ?? "", userID: row[1].integer, createdMs: row[2].integer, expiresMs: expires,
                           name: row[4].text)
    }

    func tokenOwner(hash: [UInt8]) throws -> (token: StoredToken, user: UserAccount)? {
        try rows("SELECT \(Self.tokenColumns), u.id, u.record_name, u.name, u.created_ms FROM tokens t "
                 + "JOIN users u ON u.id = t.user_id WHERE t.hash = $1", [.bytea(hash)]).first.map {
            (token(Array($0[0..<5])), user(Array($0[5...])))
        }
    }

    func tokens(userID: Int64) throws -> [StoredToken] {
        try rows("SELECT \(Self.tokenColumns) FROM tokens t WHERE t.user_id = $1 ORDER BY t.created_ms, t.id",
                 [.integer(userID)]).map(token)
    }

    func token(id: String) throws -> StoredToken? {
        try rows("SELECT \(Self.tokenColumns) FROM tokens t WHERE t.id = $1", [.text(id)]).first.map(token)
    }

    func deleteToken(id: String) throws -> Bool {
        try run("DELETE FROM tokens WHERE id = $1", [.text(id)]) > 0
    }

    func extendToken(id: String, expiresMs: Int64) throws -> Bool {
        try run("UPDATE tokens SET expires_ms = $1 WHERE id = $2", [.integer(expiresMs), .text(id)]) > 0
    }

    func deleteTokens(userID: Int64) throws -> Int {
        try run("DELETE FROM tokens WHERE user_id = $1", [.integer(userID)])
    }

    // MARK: Sign-ups

    func recordSignUp(address: String, nowMs: Int64) throws {
        try run("INSERT INTO signups(address, created_ms) VALUES ($1, $2)", [.text(address), .integer(nowMs)])
    }

    func signUps(address: String?, sinceMs: Int64) throws -> SignUpWindow {
        let row: [PostgresValue]?
        if let address {
            row = try rows("SELECT COUNT(*), MIN(created_ms) FROM signups WHERE address = $1 AND created_ms >= $2",
                           [.text(address), .integer(sinceMs)]).first
        } else {
            row = try rows("SELECT COUNT(*), MIN(created_ms) FROM signups WHERE created_ms >= $1", [.integer(sinceMs)]).first
        }
        guard let row, row[0].integer > 0 else { return SignUpWindow(count: 0, oldestMs: nil) }
        return SignUpWindow(count: Int(row[0].integer), oldestMs: row[1].integer)
    }

    func forgetSignUps(before beforeMs: Int64) throws {
        try run("DELETE FROM signups WHERE created_ms < $1", [.integer(beforeMs)])
    }

    // MARK: Databases and zones

    /// A database row read in a write transaction is locked: remember it.
    private func locked(_ database: StoredDatabase) -> StoredDatabase {
        if !isReadOnly { cache.lockedDatabases[database.id] = database }
        return database
    }

    func database(_ key: DatabaseKey) throws -> StoredDatabase {
        if !isReadOnly, let held = cache.lockedDatabases.values.first(where: { $0.key == key }) { return held }
        let select = "SELECT \(Self.databaseColumns) FROM databases WHERE kind = $1 AND environment = $2 AND owner_id = $3"
            + lock
        let arguments: [PostgresValue] = [.text(key.kind.rawValue), .text(key.environment), .integer(key.ownerID)]
        if let row = try rows(select, arguments).first { return locked(try database(row)) }
        // Only a write transaction can create it; a read sees an empty database that does not exist yet.
        if isReadOnly {
            return StoredDatabase(id: 0, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0)
        }
        // Another process may create it at the same moment: then its row is read (and locked) instead.
        let inserted = try write("INSERT INTO databases(kind, environment, owner_id) VALUES ($1, $2, $3) "
                                 + "ON CONFLICT DO NOTHING RETURNING \(Self.databaseColumns)", arguments, changes: [])
        if let row = inserted.first { return locked(try database(row)) }
        guard let row = try rows(select, arguments).first else {
            throw StorageError.failure("database \(key.kind.rawValue)/\(key.environment)/\(key.ownerID) vanished")
        }
        return locked(try database(row))
    }

    func database(id: Int64) throws -> StoredDatabase? {
        if !isReadOnly, let held = cache.lockedDatabases[id] { return held }
        return try rows("SELECT \(Self.databaseColumns) FROM databases WHERE id = $1" + lock, [.integer(id)]).first.map {
            locked(try database($0))
        }
    }

    /// A zone read in a write transaction is locked: remember it.
    private func locked(_ zone: StoredZone?) -> StoredZone? {
        if let zone, !isReadOnly {
            cache.lockedZones[zone.rowID] = (zone.databaseID, zone.deleted)
            cache.zoneRows[zone.rowID] = zone
        }
        return zone
    }

    func zone(databaseID: Int64, name: String) throws -> StoredZone? {
        if !isReadOnly,
           let held = cache.zoneRows.values.first(where: { $0.databaseID == databaseID && $0.name == name && !$0.deleted }) {
            return held
        }
        return locked(try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = $1 AND name = $2 AND deleted = 0" + lock,
                        [.integer(databaseID), .text(name)]).first.map(zone))
    }

    func zone(rowID: Int64) throws -> StoredZone? {
        if !isReadOnly, let held = cache.zoneRows[rowID] { return held }
        return locked(try rows("SELECT \(Self.zoneColumns) FROM zones WHERE id = $1" + lock, [.integer(rowID)]).first.map(zone))
    }

    func liveZones(databaseID: Int64) throws -> [StoredZone] {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = $1 AND deleted = 0 ORDER BY name",
                 [.integer(databaseID)]).map(zone)
    }

    /// Allocates the database's next log position; the row stays locked until commit.
    func nextDatabaseSeq(_ databaseID: Int64) throws -> Int64 {
        let rows = try write("UPDATE databases SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
                             [.integer(databaseID)], changes: [.database(databaseID)])
        guard let seq = rows.first?[0].integer else { throw StorageError.failure("database \(databaseID) is missing") }
        return seq
    }

    // createZone and deleteZone: StorageBookkeeping, over these.

    func insertZoneRow(databaseID: Int64, name: String, ownerRecordName: String, databaseSeq: Int64, nowMs: Int64)
        throws -> Int64? {
        try write("INSERT INTO zones(database_id, name, owner_record_name, db_seq, created_ms, modified_ms) "
                  + "VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING RETURNING id",
                  [.integer(databaseID), .text(name), .text(ownerRecordName), .integer(databaseSeq), .integer(nowMs),
                   .integer(nowMs)], changes: []).first?[0].integer
    }

    /// The new zone's row is locked (created by this transaction).
    func didCreateZone(_ zone: StoredZone) {
        cache.lockedZones[zone.rowID] = (zone.databaseID, false)
        cache.zoneRows[zone.rowID] = zone
    }

    func deleteRecordRows(zoneRowID: Int64) throws -> Int64 {
        try write("WITH gone AS (DELETE FROM records WHERE zone_id = $1 RETURNING octet_length(frame) AS bytes) "
                  + "SELECT COALESCE(SUM(bytes), 0)::bigint FROM gone", [.integer(zoneRowID)],
                  changes: [.allRecords(zoneRowID: zoneRowID)]).first?[0].integer ?? 0
    }

    func markZoneRowDeleted(_ zone: StoredZone, databaseSeq: Int64, nowMs: Int64) throws {
        // The zone's shares go with it (`shares(zoneRowID:)` gives the live zone's).
        try write("UPDATE zones SET deleted = 1, db_seq = $1, modified_ms = $2 WHERE id = $3",
                  [.integer(databaseSeq), .integer(nowMs), .integer(zone.rowID)],
                  changes: [.zone(zone.rowID), .shares(zoneRowID: zone.rowID)])
        cache.lockedZones[zone.rowID] = (zone.databaseID, true)
    }

    func releaseBytes(_ bytes: Int64, databaseID: Int64) throws {
        try write("UPDATE databases SET bytes_used = bytes_used - $1 WHERE id = $2", [.integer(bytes), .integer(databaseID)],
                  changes: [.database(databaseID)])
    }

    func zoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [StoredZone] {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = $1 AND db_seq > $2 ORDER BY db_seq LIMIT $3",
                 [.integer(databaseID), .integer(cursor), .integer(Int64(limit))]).map(zone)
    }

    // MARK: Records

    func record(zoneRowID: Int64, name: String) throws -> StoredRecord? {
        if let cached = cache.records[zoneRowID]?[name] { return cached }
        // The zone row first, then the record: every writer of a zone locks in that order, so a record that
        // does not exist yet cannot be created by another transaction between this read and this
        // transaction's save. Two statements: the record read must take its snapshot after the zone lock is
        // held (in READ COMMITTED a statement that waited for a lock still reads with its own snapshot).
        try lockZone(zoneRowID)
        let found = try rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = $1 AND name = $2" + lock,
                             [.integer(zoneRowID), .text(name)]).first.map { record($0, zoneRowID: zoneRowID) }
        cache.records[zoneRowID, default: [:]][name] = .some(found)
        return found
    }

    /// Reads (and in a write transaction locks) the rows of `names` in one statement, so that the `record`
    /// calls for them that follow need no round trip each.
    func prefetchRecords(zoneRowID: Int64, names: [String]) throws {
        var missing = Set(names)
        if let cached = cache.records[zoneRowID] { missing.subtract(cached.keys) }
        guard !missing.isEmpty else { return }
        try lockZone(zoneRowID)
        let wanted = Array(missing).sorted()
        // A join with the names (not `name = ANY(...)`): one primary-key probe per name whatever the planner
        // knows of the table's size.
        let found = try rows("SELECT \(Self.qualified(Self.recordColumns, by: "r")) "
                             + "FROM unnest($2::text[]) AS wanted(name) JOIN records r ON r.zone_id = $1 AND r.name = wanted.name "
                             + "ORDER BY r.name" + (isReadOnly ? "" : " FOR NO KEY UPDATE OF r"), [.integer(zoneRowID), .texts(wanted)])
            .map { record($0, zoneRowID: zoneRowID) }
        var entries = cache.records[zoneRowID] ?? [:]
        for name in wanted { entries[name] = .some(nil) }
        for row in found { entries[row.recordName] = .some(row) }
        cache.records[zoneRowID] = entries
    }

    /// Locks a zone row for this write transaction, once.
    private func lockZone(_ zoneRowID: Int64) throws {
        guard !isReadOnly, cache.lockedZones[zoneRowID] == nil else { return }
        let row = try rows("SELECT database_id, deleted FROM zones WHERE id = $1 FOR NO KEY UPDATE", [.integer(zoneRowID)])
        if let row = row.first { cache.lockedZones[zoneRowID] = (row[0].integer, row[1].integer != 0) }
    }

    func records(zoneRowID: Int64, recordType: String?) throws -> [StoredRecord] {
        let rows: [[PostgresValue]]
        if let recordType {
            rows = try self.rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = $1 AND record_type = $2 "
                                 + "AND deleted = 0 ORDER BY name", [.integer(zoneRowID), .text(recordType)])
        } else {
            rows = try self.rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = $1 AND deleted = 0 ORDER BY name",
                                 [.integer(zoneRowID)])
        }
        return rows.map { record($0, zoneRowID: zoneRowID) }
    }

    /// Streams the same records as `records(zoneRowID:recordType:)` in pages by name (16 rows first, then
    /// larger), so a caller that stops early never had more than a page in memory.
    func forEachRecord(zoneRowID: Int64, recordType: String?, _ body: (StoredRecord) throws -> Bool) throws {
        var after: String? = nil
        var pageSize = 16
        while true {
            var sql = "SELECT \(Self.recordColumns) FROM records WHERE zone_id = $1 AND deleted = 0"
            var values: [PostgresValue] = [.integer(zoneRowID)]
            if let recordType {
                values.append(.text(recordType))
                sql += " AND record_type = $\(values.count)"
            }
            if let after {
                values.append(.text(after))
                sql += " AND name > $\(values.count)"
            }
            values.append(.integer(Int64(pageSize)))
            sql += " ORDER BY name LIMIT $\(values.count)"
            let page = try rows(sql, values).map { record($0, zoneRowID: zoneRowID) }
            for stored in page {
                guard try body(stored) else { return }
            }
            guard page.count == pageSize, let last = page.last else { return }
            after = last.recordName
            pageSize = min(pageSize * 4, 1_024)
        }
    }

    /// Streams the same records as `recordChanges` in pages by position (16 rows first, then larger).
    func forEachRecordChange(zoneRowID: Int64, after cursor: Int64, limit: Int,
                             _ body: (StoredRecord) throws -> Bool) throws {
        var position = cursor
        var left = limit
        var pageSize = 16
        while left > 0 {
            let wanted = min(pageSize, left)
            let page = try recordChanges(zoneRowID: zoneRowID, after: position, limit: wanted)
            for stored in page {
                guard try body(stored) else { return }
            }
            guard page.count == wanted, let last = page.last else { return }
            position = last.seq
            left -= page.count
            pageSize = min(pageSize * 4, 1_024)
        }
    }

    /// The database of the live zone to write records into, whose row is locked (read once per transaction).
    private func databaseForWriting(zoneRowID: Int64) throws -> Int64 {
        if isReadOnly {
            // Nothing to lock; the write that follows is refused.
            guard let zone = try zone(rowID: zoneRowID), !zone.deleted else {
                throw StorageError.failure("zone \(zoneRowID) is not live")
            }
            return zone.databaseID
        }
        try lockZone(zoneRowID)
        guard let state = cache.lockedZones[zoneRowID], !state.deleted else {
            throw StorageError.failure("zone \(zoneRowID) is not live")
        }
        return state.databaseID
    }

    func saveRecord(zoneRowID: Int64, _ write: RecordWrite) throws -> StoredRecord {
        let databaseID = try databaseForWriting(zoneRowID: zoneRowID)
        let previous = try record(zoneRowID: zoneRowID, name: write.recordName)
        return try writeRecords(zoneRowID: zoneRowID, databaseID: databaseID, [write], previous: [previous])[0]
    }

    func saveRecords(zoneRowID: Int64, _ writes: [RecordWrite], previous: [StoredRecord?]) throws -> [StoredRecord] {
        precondition(previous.count == writes.count, "one previous row (or nil) per write")
        guard !writes.isEmpty else { return [] }
        let databaseID = try databaseForWriting(zoneRowID: zoneRowID)
        return try writeRecords(zoneRowID: zoneRowID, databaseID: databaseID, writes, previous: previous)
    }

    /// Saves the rows and moves the counters, in one statement: `count` consecutive zone positions, one
    /// database position for the zone, the database's bytes, then the rows (`unnest` of one array per column,
    /// each row's position from its ordinal). Both counter rows stay locked to commit.
    private func writeRecords(zoneRowID: Int64, databaseID: Int64, _ writes: [RecordWrite], previous: [StoredRecord?])
        throws -> [StoredRecord] {
        let count = Int64(writes.count)
        var growth: Int64 = 0
        var names: [String?] = [], types: [String?] = [], frames: [[UInt8]] = [], deleted: [Int64] = []
        var createdMs: [Int64] = [], createdBy: [String?] = [], modifiedMs: [Int64] = []
        var modifiedBy: [String?] = [], parents: [String?] = []
        var creations: [(createdMs: Int64, createdBy: String)] = []
        for (write, previous) in zip(writes, previous) {
            growth += Int64(write.frame.count) - Int64(previous?.frame.count ?? 0)
            let creation = StorageRules.creation(of: write, replacing: previous)
            creations.append(creation)
            names.append(write.recordName)
            types.append(write.recordType)
            frames.append(write.frame)
            deleted.append(write.deleted ? 1 : 0)
            createdMs.append(creation.createdMs)
            createdBy.append(creation.createdBy)
            modifiedMs.append(write.nowMs)
            modifiedBy.append(write.userRecordName)
            parents.append(write.parentName)
        }
        let nowMs = writes.map(\.nowMs).max()!
        // The database row as this transaction holds it, put back moved once the statement has moved it.
        let heldDatabase = cache.lockedDatabases[databaseID]
        let result = try write("""
            WITH d AS (
                UPDATE databases SET last_seq = last_seq + 1, bytes_used = bytes_used + $1 WHERE id = $2
                RETURNING last_seq, bytes_used),
            z AS (
                UPDATE zones SET last_seq = last_seq + $3, modified_ms = $4, db_seq = (SELECT last_seq FROM d)
                WHERE id = $5 AND deleted = 0
                RETURNING \(Self.zoneColumns)),
            w AS (
                INSERT INTO records(zone_id, name, record_type, frame, deleted, seq, created_ms, created_by, modified_ms,
                                    modified_by, parent_name)
                SELECT $5, u.name, u.record_type, u.frame, u.deleted, (SELECT last_seq FROM z) - $3 + u.ord, u.created_ms,
                       u.created_by, u.modified_ms, u.modified_by, u.parent_name
                FROM unnest($6::text[], $7::text[], $8::bytea[], $9::int8[], $10::int8[], $11::text[], $12::int8[],
                            $13::text[], $14::text[])
                     WITH ORDINALITY AS u(name, record_type, frame, deleted, created_ms, created_by, modified_ms,
                                          modified_by, parent_name, ord)
                ON CONFLICT(zone_id, name) DO UPDATE SET record_type = excluded.record_type, frame = excluded.frame,
                    deleted = excluded.deleted, seq = excluded.seq, created_ms = excluded.created_ms,
                    created_by = excluded.created_by, modified_ms = excluded.modified_ms,
                    modified_by = excluded.modified_by, parent_name = excluded.parent_name)
            SELECT d.last_seq AS database_seq, d.bytes_used, z.* FROM d LEFT JOIN z ON true
            """, [.integer(growth), .integer(databaseID), .integer(count), .integer(nowMs), .integer(zoneRowID),
                  .texts(names), .texts(types), .byteas(frames), .integers(deleted), .integers(createdMs), .texts(createdBy),
                  .integers(modifiedMs), .texts(modifiedBy), .texts(parents)],
            changes: [.database(databaseID), .zoneCounters(zoneRowID),
                      .records(zoneRowID: zoneRowID, names: writes.map(\.recordName))])
        guard let row = result.first, row.count == 12, !row[2].isNull else {
            throw StorageError.failure("zone \(zoneRowID) is not live")
        }
        let movedZone = zone(Array(row[2...]))
        cache.zoneRows[zoneRowID] = movedZone
        let lastSeq = movedZone.lastSeq
        if let held = heldDatabase, case .integer(let databaseSeq) = row[0], case .integer(let bytes) = row[1] {
            cache.lockedDatabases[databaseID] = StoredDatabase(id: held.id, key: held.key, lastSeq: databaseSeq,
                                                               purgedSeq: held.purgedSeq, bytesUsed: bytes)
        }
        var saved: [StoredRecord] = []
        saved.reserveCapacity(writes.count)
        var entries = cache.records[zoneRowID] ?? [:]
        for (index, (write, creation)) in zip(writes, creations).enumerated() {
            let seq = lastSeq - count + 1 + Int64(index)
            let row = StoredRecord(recordName: write.recordName, recordType: write.recordType, frame: write.frame,
                                   deleted: write.deleted, seq: seq,
                                   changeTag: StorageRules.changeTag(zoneRowID: zoneRowID, seq: seq),
                                   createdMs: creation.createdMs, createdBy: creation.createdBy, modifiedMs: write.nowMs,
                                   modifiedBy: write.userRecordName, parentName: write.parentName)
            saved.append(row)
            entries[write.recordName] = .some(row)
        }
        cache.records[zoneRowID] = entries
        return saved
    }

    func recordChanges(zoneRowID: Int64, after cursor: Int64, limit: Int) throws -> [StoredRecord] {
        try rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                 [.integer(zoneRowID), .integer(cursor), .integer(Int64(limit))]).map { record($0, zoneRowID: zoneRowID) }
    }

    func children(zoneRowID: Int64, parentName: String) throws -> [String] {
        try rows("SELECT name FROM records WHERE zone_id = $1 AND parent_name = $2 AND deleted = 0 ORDER BY name",
                 [.integer(zoneRowID), .text(parentName)]).compactMap { $0[0].text }
    }

    func recordCount(zoneRowID: Int64, recordType: String?) throws -> Int {
        if let recordType {
            return Int(try rows("SELECT COUNT(*) FROM records WHERE zone_id = $1 AND record_type = $2 AND deleted = 0",
                                [.integer(zoneRowID), .text(recordType)]).first?[0].integer ?? 0)
        }
        return Int(try rows("SELECT COUNT(*) FROM records WHERE zone_id = $1 AND deleted = 0", [.integer(zoneRowID)])
            .first?[0].integer ?? 0)
    }

    func childCount(zoneRowID: Int64, parentName: String) throws -> Int {
        Int(try rows("SELECT COUNT(*) FROM records WHERE zone_id = $1 AND parent_name = $2 AND deleted = 0",
                     [.integer(zoneRowID), .text(parentName)]).first?[0].integer ?? 0)
    }

    // MARK: Shares

    func insertShare(_ new: NewShare) throws -> StoredShare {
        let inserted = try write("INSERT INTO shares(public_id, zone_id, record_name, root_record_name, owner_id, title, "
                                 + "public_permission, url_epoch, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                                 + "ON CONFLICT DO NOTHING RETURNING id",
                                 [.text(new.publicID), .integer(new.zoneRowID), .text(new.recordName),
                                  new.rootRecordName.map { .text($0) } ?? .null, .integer(new.ownerID), .text(new.title),
                                  .text(new.publicPermission.rawValue), .integer(new.urlEpoch), .integer(new.nowMs)],
                                 changes: [.shares(zoneRowID: new.zoneRowID)])
        guard let id = inserted.first?[0].integer else {
            throw StorageError.duplicate("a share record named \(new.recordName)")
        }
        return StoredShare(id: id, publicID: new.publicID, zoneRowID: new.zoneRowID,
                           recordName: new.recordName, rootRecordName: new.rootRecordName, ownerID: new.ownerID,
                           title: new.title, publicPermission: new.publicPermission, urlEpoch: new.urlEpoch, deleted: false,
                           lastSeq: 0)
    }

    func share(publicID: String) throws -> StoredShare? {
        try rows("SELECT \(Self.shareColumns) FROM shares WHERE public_id = $1" + lock, [.text(publicID)]).first.map(share)
    }

    func share(id: Int64) throws -> StoredShare? {
        try rows("SELECT \(Self.shareColumns) FROM shares WHERE id = $1" + lock, [.integer(id)]).first.map(share)
    }

    func shares(zoneRowID: Int64) throws -> [StoredShare] {
        if let cached = cache.shares[zoneRowID] { return cached }
        let found = try rows("SELECT \(Self.shareColumns) FROM shares WHERE zone_id = $1 AND deleted = 0 ORDER BY id",
                             [.integer(zoneRowID)]).map(share)
        if isReadOnly || cache.lockedZones[zoneRowID] != nil { cache.shares[zoneRowID] = found }
        return found
    }

    func updateShare(_ share: StoredShare) throws {
        try write("UPDATE shares SET title = $1, public_permission = $2, url_epoch = $3, deleted = $4 WHERE id = $5",
                  [.text(share.title), .text(share.publicPermission.rawValue), .integer(share.urlEpoch),
                   .integer(share.deleted ? 1 : 0), .integer(share.id)],
                  changes: [.shares(zoneRowID: share.zoneRowID), .share(share.id)])
    }

    func participants(shareID: Int64) throws -> [StoredParticipant] {
        try rows("SELECT share_id, user_id, role, permission, status, modified_ms FROM share_participants "
                 + "WHERE share_id = $1 ORDER BY user_id", [.integer(shareID)]).map(participant)
    }

    func saveParticipant(_ p: StoredParticipant) throws {
        try run("""
            INSERT INTO share_participants(share_id, user_id, role, permission, status, modified_ms)
            VALUES ($1, $2, $3, $4, $5, $6)
            ON CONFLICT(share_id, user_id) DO UPDATE SET role = excluded.role, permission = excluded.permission,
                status = excluded.status, modified_ms = excluded.modified_ms
            """, [.integer(p.shareID), .integer(p.userID), .text(p.role.rawValue), .text(p.permission.rawValue), .text(p.status.rawValue),
                  .integer(p.modifiedMs)])
    }

    func participations(userID: Int64, status: AcceptanceStatus) throws -> [(share: StoredShare, participant: StoredParticipant)] {
        let columns = Self.qualified(Self.shareColumns, by: "s")
        return try rows("SELECT \(columns), p.share_id, p.user_id, p.role, p.permission, p.status, p.modified_ms "
                        + "FROM share_participants p JOIN shares s ON s.id = p.share_id "
                        + "WHERE p.user_id = $1 AND p.status = $2 AND s.deleted = 0 ORDER BY s.id",
                        [.integer(userID), .text(status.rawValue)]).map { row in
            (try share(Array(row[0..<11])), try participant(Array(row[11...])))
        }
    }

    func linkUses(tokenID: String) throws -> Int {
        Int(try rows("SELECT uses FROM share_link_uses WHERE token_id = $1" + lock, [.text(tokenID)]).first?[0].integer ?? 0)
    }

    func recordLinkUse(tokenID: String, shareID: Int64) throws {
        try run("INSERT INTO share_link_uses(token_id, share_id, uses) VALUES ($1, $2, 1) "
                + "ON CONFLICT(token_id) DO UPDATE SET uses = share_link_uses.uses + 1", [.text(tokenID), .integer(shareID)])
    }

    func insertShortLink(code: String, shareID: Int64, token: String, nowMs: Int64) throws {
        let inserted = try run("INSERT INTO share_short_links(code, share_id, token, created_ms) VALUES ($1, $2, $3, $4) "
                               + "ON CONFLICT DO NOTHING", [.text(code), .integer(shareID), .text(token), .integer(nowMs)])
        if inserted == 0 { throw StorageError.duplicate("a short link with this code") }
    }

    func shortLink(code: String) throws -> (shareID: Int64, token: String)? {
        try rows("SELECT share_id, token FROM share_short_links WHERE code = $1", [.text(code)]).first.map {
            (shareID: $0[0].integer, token: $0[1].text ?? "")
        }
    }

    func pruneShortLinks(shareID: Int64, keeping: Int) throws -> Int {
        try run("DELETE FROM share_short_links WHERE share_id = $1 AND code NOT IN (SELECT code FROM share_short_links "
                + "WHERE share_id = $1 ORDER BY created_ms DESC, code LIMIT $2)",
                [.integer(shareID), .integer(Int64(max(0, keeping)))])
    }

    // MARK: Subscriptions (Subscriptions.swift)

    func insertSubscription(_ subscription: StoredSubscription) throws -> StoredSubscription {
        let values = subscriptionValues(subscription, integer: PostgresValue.integer, text: PostgresValue.text,
                                        bytes: PostgresValue.bytea, null: .null)
        let inserted = try rows("INSERT INTO subscriptions(\(Self.subscriptionColumns.dropFirst(4))) VALUES "
                                + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) ON CONFLICT DO NOTHING RETURNING id",
                                values)
        guard let id = inserted.first?[0].integer else {
            throw StorageError.duplicate("a subscription named \(subscription.name)")
        }
        var stored = subscription
        stored.rowID = id
        return stored
    }

    func updateSubscription(_ subscription: StoredSubscription) throws -> Bool {
        let values = subscriptionValues(subscription, integer: PostgresValue.integer, text: PostgresValue.text,
                                        bytes: PostgresValue.bytea, null: .null)
        return try run("UPDATE subscriptions SET kind = $1, zone_name = $2, zone_owner = $3, record_type = $4, fires_on = $5, "
                       + "fires_once = $6, definition = $7, webhook_url = $8, webhook_secret = $9, modified_ms = $10 "
                       + "WHERE id = $11", Array(values[3..<12]) + [values[13], .integer(subscription.rowID)]) > 0
    }

    func deleteSubscription(rowID: Int64, keepingNotifications: Bool) throws -> Bool {
        if !keepingNotifications { try run("DELETE FROM notifications WHERE subscription_id = $1", [.integer(rowID)]) }
        return try run("DELETE FROM subscriptions WHERE id = $1", [.integer(rowID)]) > 0
    }

    func subscription(databaseID: Int64, name: String) throws -> StoredSubscription? {
        try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE database_id = $1 AND name = $2\(lock)",
                 [.integer(databaseID), .text(name)]).first.map(subscription)
    }

    func subscription(rowID: Int64) throws -> StoredSubscription? {
        try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE id = $1", [.integer(rowID)]).first.map(subscription)
    }

    func subscriptions(databaseID: Int64, limit: Int) throws -> [StoredSubscription] {
        try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE database_id = $1 ORDER BY name LIMIT $2",
                 [.integer(databaseID), .integer(Int64(max(0, limit)))]).map(subscription)
    }

    func subscriptionCount(databaseID: Int64) throws -> Int {
        Int(try rows("SELECT count(*) FROM subscriptions WHERE database_id = $1", [.integer(databaseID)]).first?[0].integer ?? 0)
    }

    func subscriptions(databaseIDs: [Int64]) throws -> [StoredSubscription] {
        guard !databaseIDs.isEmpty else { return [] }
        return try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE database_id = ANY($1) ORDER BY id",
                        [.integers(databaseIDs)]).map(subscription)
    }

    func raiseNotifications(_ triggers: [NotificationTrigger], origin: String?) throws -> [Int64: Int64] {
        var counts: [Int64: Int64] = [:]
        for trigger in triggers { counts[trigger.userID, default: 0] += 1 }
        var next: [Int64: Int64] = [:]
        var last: [Int64: Int64] = [:]
        // In user order, so two transactions raising for the same users lock their counters in one order.
        for user in counts.keys.sorted() {
            let top = try rows("INSERT INTO notification_counters(user_id, last_seq) VALUES ($1, $2) ON CONFLICT(user_id) "
                               + "DO UPDATE SET last_seq = notification_counters.last_seq + excluded.last_seq RETURNING last_seq",
                               [.integer(user), .integer(counts[user]!)]).first?[0].integer ?? 0
            next[user] = top - counts[user]! + 1
            last[user] = top
        }
        let originValue: PostgresValue = origin.map(PostgresValue.text) ?? .null
        for trigger in triggers {
            let seq = next[trigger.userID]!
            next[trigger.userID] = seq + 1
            try run("INSERT INTO notifications(\(Self.notificationColumns)) VALUES "
                    + "($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, 0) ON CONFLICT(subscription_id, zone_id) DO UPDATE SET "
                    + "run_after = CASE WHEN notifications.origin IS NOT DISTINCT FROM excluded.origin "
                    + "THEN notifications.run_after ELSE notifications.seq END, origin = excluded.origin, seq = excluded.seq, "
                    + "zone_name = excluded.zone_name, zone_owner = excluded.zone_owner",
                    triggerValues(trigger, integer: PostgresValue.integer, text: PostgresValue.text, null: .null)
                        + [.integer(seq), originValue])
        }
        return last
    }

    func notifications(userID: Int64, after cursor: Int64, limit: Int) throws -> [StoredNotification] {
        try rows("SELECT \(Self.notificationColumns) FROM notifications WHERE user_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                 [.integer(userID), .integer(cursor), .integer(Int64(max(0, limit)))]).map { try notification($0) }
    }

    func lastNotificationSeq(userID: Int64) throws -> Int64 {
        try rows("SELECT last_seq FROM notification_counters WHERE user_id = $1", [.integer(userID)]).first?[0].integer ?? 0
    }

    func insertPushToken(_ token: StoredPushToken) throws {
        let inserted = try run("INSERT INTO push_tokens(hash, user_id, device_token_id, environment, apns_environment, "
                               + "registered, created_ms) VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT DO NOTHING",
                               [.bytea(token.hash), .integer(token.userID), .text(token.deviceTokenID),
                                .text(token.environment), .text(token.apnsEnvironment),
                                .integer(token.registered ? 1 : 0), .integer(token.createdMs)])
        if inserted == 0 { throw StorageError.duplicate("a push token with this hash") }
    }

    func pushToken(hash: [UInt8], nowMs: Int64) throws -> StoredPushToken? {
        try rows("SELECT \(Self.pushTokenColumns) FROM push_tokens p JOIN tokens t ON t.id = p.device_token_id "
                 + "WHERE p.hash = $1 AND (t.expires_ms IS NULL OR t.expires_ms > $2)",
                 [.bytea(hash), .integer(nowMs)]).first.map(pushToken)
    }

    func registerPushToken(hash: [UInt8], userID: Int64) throws -> Bool {
        try run("UPDATE push_tokens SET registered = 1 WHERE hash = $1 AND user_id = $2", [.bytea(hash), .integer(userID)]) > 0
    }

    func prunePushTokens(deviceTokenID: String, keeping: Int) throws -> Int {
        try run("DELETE FROM push_tokens WHERE device_token_id = $1 AND hash NOT IN (SELECT hash FROM push_tokens "
                + "WHERE device_token_id = $1 ORDER BY created_ms DESC, hash LIMIT $2)",
                [.text(deviceTokenID), .integer(Int64(max(0, keeping)))])
    }

    func forgetOrphanPushTokens(nowMs: Int64, limit: Int) throws -> Int {
        try run("DELETE FROM push_tokens WHERE hash IN (SELECT p.hash FROM push_tokens p LEFT JOIN tokens t "
                + "ON t.id = p.device_token_id WHERE t.id IS NULL OR (t.expires_ms IS NOT NULL AND t.expires_ms <= $1) "
                + "LIMIT $2)", [.integer(nowMs), .integer(Int64(max(0, limit)))])
    }

    func forgetOrphanNotifications(limit: Int) throws -> Int {
        try run("DELETE FROM notifications WHERE (subscription_id, zone_id) IN (SELECT n.subscription_id, n.zone_id "
                + "FROM notifications n LEFT JOIN subscriptions s ON s.id = n.subscription_id WHERE s.id IS NULL LIMIT $1)",
                [.integer(Int64(max(0, limit)))])
    }

    // MARK: Webhook deliveries (Subscriptions.swift)

    func enqueueDelivery(subscriptionRowID: Int64, userID: Int64, url: String, nowMs: Int64,
                         payload makePayload: (_ seq: Int64) throws -> [UInt8]) throws -> StoredDelivery {
        guard let seq = try rows("UPDATE subscriptions SET webhook_seq = webhook_seq + 1 WHERE id = $1 RETURNING webhook_seq",
                                 [.integer(subscriptionRowID)]).first?[0].integer else {
            throw StorageError.failure("subscription \(subscriptionRowID) is missing")
        }
        let inserted = try rows("INSERT INTO webhook_deliveries(subscription_id, user_id, seq, url, payload, state, attempts, "
                                + "next_attempt_ms, claimed_until_ms, created_ms) VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, 0, $6) "
                                + "RETURNING \(Self.deliveryColumns)",
                                [.integer(subscriptionRowID), .integer(userID), .integer(seq), .text(url), PostgresValue.bytea(try makePayload(seq)),
                                 .integer(nowMs)])
        guard let row = inserted.first else { throw StorageError.failure("the delivery was not inserted") }
        return try delivery(row)
    }

    func nextDeliveryDueMs() throws -> Int64? {
        // The first pending delivery of each subscription only: a later one waits for it, not for its own time.
        let row = try rows("SELECT MIN(CASE WHEN d.claimed_until_ms > d.next_attempt_ms THEN d.claimed_until_ms "
                           + "ELSE d.next_attempt_ms END) FROM webhook_deliveries d WHERE d.state = 'pending' "
                           + "AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e WHERE e.subscription_id = d.subscription_id "
                           + "AND e.state = 'pending' AND e.seq < d.seq)").first
        return row.flatMap { $0[0].isNull ? nil : $0[0].integer }
    }

    func claimDeliveries(node: String, nowMs: Int64, leaseMs: Int64, limit: Int) throws -> [StoredDelivery] {
        try rows("WITH due AS (SELECT d.id FROM webhook_deliveries d WHERE d.state = 'pending' AND d.next_attempt_ms <= $3 "
                 + "AND d.claimed_until_ms <= $3 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e "
                 + "WHERE e.subscription_id = d.subscription_id AND e.state = 'pending' AND e.seq < d.seq) "
                 + "ORDER BY d.next_attempt_ms, d.id LIMIT $4 FOR UPDATE SKIP LOCKED) "
                 + "UPDATE webhook_deliveries w SET claimed_by = $1, claimed_until_ms = $2, attempts = w.attempts + 1 "
                 + "FROM due WHERE w.id = due.id RETURNING \(Self.qualified(Self.deliveryColumns, by: "w"))",
                 [.text(node), .integer(nowMs + leaseMs), .integer(nowMs), .integer(Int64(max(0, limit)))]).map { try delivery($0) }
    }

    func finishDelivery(id: Int64, node: String, outcome: DeliveryOutcome, nowMs: Int64) throws -> Bool {
        let values = Self.outcomeValues(outcome, nowMs: nowMs)
        return try run("UPDATE webhook_deliveries SET state = $1, last_status = $2, last_error = $3, "
                       + "next_attempt_ms = COALESCE($4, next_attempt_ms), finished_ms = $5, claimed_by = NULL, "
                       + "claimed_until_ms = 0 WHERE id = $6 AND claimed_by = $7",
                       [.text(values.state.rawValue), values.status.map(PostgresValue.integer) ?? .null,
                        values.error.map(PostgresValue.text) ?? .null, values.nextAttemptMs.map(PostgresValue.integer) ?? .null,
                        values.finishedMs.map(PostgresValue.integer) ?? .null, .integer(id), .text(node)]) > 0
    }

    func releaseDeliveryClaims(node: String) throws -> Int {
        try run("UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until_ms = 0 WHERE claimed_by = $1", [.text(node)])
    }

    func deliveries(subscriptionRowID: Int64, state: DeliveryState?, afterSeq: Int64, limit: Int) throws -> [StoredDelivery] {
        try rows("SELECT \(Self.deliveryColumns) FROM webhook_deliveries WHERE subscription_id = $1 AND seq > $2 "
                 + "AND ($3::text IS NULL OR state = $3::text) ORDER BY seq LIMIT $4",
                 [.integer(subscriptionRowID), .integer(afterSeq), state.map { .text($0.rawValue) } ?? .null,
                  .integer(Int64(max(0, limit)))]).map { try delivery($0) }
    }

    func replayDeliveries(subscriptionRowID: Int64, seqs: [Int64]?, nowMs: Int64) throws -> Int {
        guard let seqs else {
            return try run("UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_ms = $1, "
                           + "finished_ms = NULL WHERE subscription_id = $2 AND state = 'failed'",
                           [.integer(nowMs), .integer(subscriptionRowID)])
        }
        var count = 0
        for seq in seqs {
            count += try run("UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_ms = $1, "
                             + "finished_ms = NULL WHERE subscription_id = $2 AND seq = $3 AND state = 'failed'",
                             [.integer(nowMs), .integer(subscriptionRowID), .integer(seq)])
        }
        return count
    }

    func purgeDeliveries(finishedBefore beforeMs: Int64, limit: Int) throws -> Int {
        try run("DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries WHERE finished_ms IS NOT NULL "
                + "AND finished_ms < $1 LIMIT $2)", [.integer(beforeMs), .integer(Int64(max(0, limit)))])
    }

    func setShareMembership(shareID: Int64, recordName: String, member: Bool) throws {
        let seqRows = try write("UPDATE shares SET last_seq = last_seq + 1 WHERE id = $1 RETURNING last_seq",
                                [.integer(shareID)], changes: [.share(shareID)])
        guard let seq = seqRows.first?[0].integer else { throw StorageError.failure("share \(shareID) is missing") }
        try run("INSERT INTO share_records(share_id, record_name, member, seq) VALUES ($1, $2, $3, $4) "
                + "ON CONFLICT(share_id, record_name) DO UPDATE SET member = excluded.member, seq = excluded.seq",
                [.integer(shareID), .text(recordName), .integer(member ? 1 : 0), .integer(seq)])
    }

    func shareMembership(shareID: Int64, recordName: String) throws -> Bool? {
        try rows("SELECT member FROM share_records WHERE share_id = $1 AND record_name = $2",
                 [.integer(shareID), .text(recordName)]).first.map { $0[0].integer != 0 }
    }

    func shareChanges(shareID: Int64, after cursor: Int64, limit: Int) throws -> [ShareLogEntry] {
        try rows("SELECT record_name, member, seq FROM share_records WHERE share_id = $1 AND seq > $2 ORDER BY seq LIMIT $3",
                 [.integer(shareID), .integer(cursor), .integer(Int64(limit))]).map {
            ShareLogEntry(recordName: $0[0].text ?? "", member: $0[1].integer != 0, seq: $0[2].integer)
        }
    }

    func markSharedZone(databaseID: Int64, shareID: Int64, deleted: Bool) throws {
        let seq = try nextDatabaseSeq(databaseID)
        try run("INSERT INTO shared_zones(database_id, share_id, deleted, db_seq) VALUES ($1, $2, $3, $4) "
                + "ON CONFLICT(database_id, share_id) DO UPDATE SET deleted = excluded.deleted, db_seq = excluded.db_seq",
                [.integer(databaseID), .integer(shareID), .integer(deleted ? 1 : 0), .integer(seq)])
    }

    func sharedZoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [SharedZoneEntry] {
        try rows("SELECT share_id, deleted, db_seq FROM shared_zones WHERE database_id = $1 AND db_seq > $2 "
                 + "ORDER BY db_seq LIMIT $3", [.integer(databaseID), .integer(cursor), .integer(Int64(limit))]).map {
            SharedZoneEntry(shareID: $0[0].integer, deleted: $0[1].integer != 0, databaseSeq: $0[2].integer)
        }
    }

    // MARK: Client operations

    /// In a write it reads the user's count of remembered operations in the same statement: the write that
    /// looks an operation up next saves one under the cap (`clientOperationCount`), and this spares it a
    /// round trip. (Nothing locks the count, here or in a statement of its own: another node's save may
    /// land between the count and this one's save either way.)
    func clientOperation(userID: Int64, operationID: String) throws -> ClientOperation? {
        guard !isReadOnly else {
            return try rows("SELECT request_hash, status, response FROM client_operations WHERE user_id = $1 AND operation_id = $2",
                            [.integer(userID), .text(operationID)]).first.map {
                ClientOperation(requestHash: $0[0].bytes, status: Int($0[1].integer), response: $0[2].bytes)
            }
        }
        let row = try rows("""
            SELECT c.request_hash, c.status, c.response, n.count
            FROM (SELECT COUNT(*) AS count FROM client_operations WHERE user_id = $1) n
            LEFT JOIN client_operations c ON c.user_id = $1 AND c.operation_id = $2
            """, [.integer(userID), .text(operationID)]).first
        guard let row else { return nil }
        cache.clientOperationCounts[userID] = Int(row[3].integer)
        guard !row[0].isNull else { return nil }
        return ClientOperation(requestHash: row[0].bytes, status: Int(row[1].integer), response: row[2].bytes)
    }

    /// A conflict with a row that another transaction committed while this one ran (the same id retried on
    /// another process) runs this transaction again once, so the server finds the stored answer; a conflict
    /// on that second run (the row was there all along) is a duplicate.
    func saveClientOperation(userID: Int64, operationID: String, _ operation: ClientOperation, chargedTo databaseID: Int64,
                             nowMs: Int64) throws {
        let charged = databaseID == 0 ? 0 : operation.storedBytes(operationID: operationID)
        // The database row as this transaction holds it, put back charged once the statement has charged it.
        let heldDatabase = cache.lockedDatabases[databaseID]
        // The save and its charge in one statement: the charge only if the row was inserted.
        let result = try write("""
            WITH saved AS (
                INSERT INTO client_operations(user_id, operation_id, request_hash, status, response, created_ms,
                                              database_id, charged_bytes)
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING 1),
            charge AS (
                UPDATE databases SET bytes_used = bytes_used + $8
                WHERE id = $7 AND $8 <> 0 AND EXISTS (SELECT 1 FROM saved) RETURNING bytes_used)
            SELECT (SELECT COUNT(*) FROM saved), (SELECT bytes_used FROM charge)
            """, [.integer(userID), .text(operationID), .bytea(operation.requestHash), .integer(Int64(operation.status)),
                  .bytea(operation.response), .integer(nowMs), .integer(databaseID), .integer(charged)],
            changes: [.clientOperations(userID: userID), .database(databaseID)])
        if let held = heldDatabase {
            if charged == 0 {
                cache.lockedDatabases[databaseID] = held
            } else if case .integer(let bytes)? = result.first?[1] {
                cache.lockedDatabases[databaseID] = StoredDatabase(id: held.id, key: held.key, lastSeq: held.lastSeq,
                                                                   purgedSeq: held.purgedSeq, bytesUsed: bytes)
            }
        }
        if result.first?[0].integer ?? 0 == 0 {
            if clientOperationConflictsSeen == 0 && !isReadOnly {
                fatal = .clientOperationConflict
                throw StorageError.busy
            }
            throw StorageError.duplicate("client operation \(operationID)")
        }
    }

    func clientOperationCount(userID: Int64) throws -> Int {
        if let counted = cache.clientOperationCounts[userID] { return counted }
        return Int(try rows("SELECT COUNT(*) FROM client_operations WHERE user_id = $1", [.integer(userID)]).first?[0].integer ?? 0)
    }

    /// The end of a statement whose CTE `gone` deleted client operations (`RETURNING database_id,
    /// charged_bytes`): each database gets its operations' quota charges back, and the statement answers how
    /// many went. (Operations charged nowhere carry database id 0, which no database has.)
    private static let refundAndCountGoneOperations = """
        charges AS (
            UPDATE databases d SET bytes_used = d.bytes_used - g.total
            FROM (SELECT database_id, SUM(charged_bytes)::bigint AS total FROM gone WHERE database_id <> 0
                  AND charged_bytes <> 0 GROUP BY database_id) g
            WHERE d.id = g.database_id)
        SELECT COUNT(*) FROM gone
        """

    func forgetOldestClientOperations(userID: Int64, count: Int) throws -> Int {
        guard count > 0 else { return 0 }
        let rows = try write("""
            WITH gone AS (
                DELETE FROM client_operations WHERE user_id = $1 AND operation_id IN (
                    SELECT operation_id FROM client_operations WHERE user_id = $1
                    ORDER BY created_ms, operation_id LIMIT $2 FOR UPDATE)
                RETURNING database_id, charged_bytes),
            \(Self.refundAndCountGoneOperations)
            """, [.integer(userID), .integer(Int64(count))], changes: [.clientOperations(userID: userID), .allDatabases])
        return Int(rows.first?[0].integer ?? 0)
    }

    // MARK: Nodes and processes

    func node(named name: String) throws -> StoredNode? {
        try rows("SELECT name, replica_id, clock_latest, created_ms FROM nodes WHERE name = $1" + lock, [.text(name)]).first.map {
            StoredNode(name: $0[0].text ?? "", replicaID: $0[1].text ?? "", clockLatest: $0[2].integer, createdMs: $0[3].integer)
        }
    }

    func insertNode(_ node: StoredNode) throws {
        let inserted = try rows("INSERT INTO nodes(name, replica_id, clock_latest, created_ms) VALUES ($1, $2, $3, $4) "
                                + "ON CONFLICT DO NOTHING RETURNING 1",
                                [.text(node.name), .text(node.replicaID), .integer(node.clockLatest), .integer(node.createdMs)])
        if inserted.isEmpty { throw StorageError.duplicate("a node named \(node.name) or with replica id \(node.replicaID)") }
    }

    func raiseNodeClock(name: String, to latest: Int64) throws {
        // Only when it rises: a lower value neither writes nor locks the row.
        try run("UPDATE nodes SET clock_latest = $1 WHERE name = $2 AND clock_latest < $1", [.integer(latest), .text(name)])
    }

    /// `pg_notify` in this transaction: PostgreSQL delivers it to the listeners only when (and if) it commits.
    /// In a write it goes with `COMMIT` (one round trip for both).
    func announceChanges(databaseIDs: [Int64]) throws {
        try throwIfEnded()
        for payload in PostgresStorage.payloads(announcer: announcer, databaseIDs: databaseIDs) {
            let statement = (sql: "SELECT pg_notify($1, $2)", values: [PostgresValue.text(PostgresStorage.changeChannel), .text(payload)])
            if isReadOnly {
                try run(statement.sql, statement.values)
            } else {
                deferred.append(statement)
            }
        }
    }

    /// `pg_try_advisory_xact_lock`: released when the transaction ends.
    func tryExclusiveLock(_ name: String) throws -> Bool {
        try rows("SELECT pg_try_advisory_xact_lock($1)", [.integer(PostgresStorage.lockKey("lock:" + name))]).first?.first
            == .boolean(true)
    }

    // MARK: Copying a deployment

    /// Reads the table through a cursor of this transaction, 1,000 rows per batch (one pass, however large).
    func exportRows(table: String, _ body: ([[StorageValue]]) throws -> Void) throws {
        let (_, columns, order) = try StorageTables.table(table)
        exportCursors += 1
        let cursor = "lattice_export_\(exportCursors)"
        try execute("DECLARE \(cursor) NO SCROLL CURSOR FOR SELECT \(columns.joined(separator: ", ")) FROM \(table) "
                    + "ORDER BY \(order)")
        while true {
            // FETCH through the extended protocol: binary results, like every other statement.
            let batch = try rowsOnce("FETCH 1000 FROM \(cursor)")
            if batch.isEmpty { break }
            try body(batch.map { $0.map(\.neutral) })
        }
        try execute("CLOSE \(cursor)")
    }

    /// Multi-row INSERTs of up to 500 rows, every value bound (types from the table's columns).
    func insertRows(table: String, _ rows: [[StorageValue]]) throws {
        let columns = try StorageTables.table(table).columns
        for row in rows where row.count != columns.count {
            throw StorageError.failure("a row of \(row.count) values for the \(columns.count) columns of \(table)")
        }
        // Rows of any table, ids included: nothing read before can be trusted (the zone locks stay held).
        cache.dropAllButLocks()
        let chunkSize = 500
        for start in stride(from: 0, to: rows.count, by: chunkSize) {
            let chunk = rows[start..<min(start + chunkSize, rows.count)]
            var placeholders: [String] = []
            var values: [PostgresValue] = []
            values.reserveCapacity(chunk.count * columns.count)
            for row in chunk {
                let base = values.count
                placeholders.append("(" + (1...columns.count).map { "$\(base + $0)" }.joined(separator: ", ") + ")")
                values.append(contentsOf: row.map(PostgresValue.init))
            }
            // Not kept prepared (the text changes with the row count); a NULL takes its column's type.
            try runUnprepared("INSERT INTO \(table)(\(columns.joined(separator: ", "))) VALUES "
                              + placeholders.joined(separator: ", "), values)
        }
    }

    /// Moves the identity sequences past the largest id copied.
    func finishImport() throws {
        for table in ["users", "databases", "zones", "shares", "subscriptions", "webhook_deliveries", "asset_uploads"] {
            try run("SELECT setval(pg_get_serial_sequence($1, 'id'), COALESCE((SELECT MAX(id) FROM \(table)), 0) + 1, false)",
                    [.text(table)])
        }
    }

    func rowCount(table: String) throws -> Int {
        _ = try StorageTables.table(table)
        return Int(try rows("SELECT COUNT(*) FROM \(table)").first?[0].integer ?? 0)
    }

    private func runUnprepared(_ sql: String, _ values: [PostgresValue]) throws(StorageError) {
        _ = try rowsOnce(sql, values)
    }

    private func rowsOnce(_ sql: String, _ values: [PostgresValue] = []) throws(StorageError) -> [[PostgresValue]] {
        try throwIfEnded()
        try beginIfPending()
        do {
            return try db.queryOnce(sql, values).rows
        } catch {
            throw note(error)
        }
    }

    // MARK: Savepoints and maintenance

    func savepoint<T>(_ body: () throws -> T) throws -> T {
        savepointDepth += 1
        defer { savepointDepth -= 1 }
        let name = "lattice_\(savepointDepth)"
        let deferredBefore = deferred.count
        try execute("SAVEPOINT \(name)")
        do {
            let result = try body()
            try execute("RELEASE SAVEPOINT \(name)")
            return result
        } catch {
            // A conflict, lost connection or deadline ends the whole transaction: nothing to undo here.
            guard fatal == nil else { throw error }
            // Its writes are undone, the locks taken before it stay.
            cache.dropAllButLocks()
            deferred.removeSubrange(deferredBefore...)
            try execute("ROLLBACK TO SAVEPOINT \(name); RELEASE SAVEPOINT \(name)", checked: false)
            throw error
        }
    }

    /// One batch of at most `limit` rows that never waits for a row a request holds, so it can neither stall
    /// a request behind it nor deadlock with one: it locks the databases, then the zones, of its candidates
    /// (the lock order of every write, Docs/Architecture.md) with `SKIP LOCKED`, removes only the rows under
    /// rows it got, and reports `complete == false` for the ones it skipped (a later batch or run takes them).
    /// Tombstones of a busy zone are passed over for those of other zones in the same batch.
    /// Candidates are read through the purge's indexes (tombstones by age, deleted zones by id, operations by age).
    // The purge batch: StorageBookkeeping, over these. None of them waits for a row a request holds, so the
    // purge can neither stall a request behind it nor deadlock with one: they lock the databases, then the
    // zones, of their candidates (the lock order of every write, Docs/Architecture.md) with `SKIP LOCKED`,
    // remove only the rows under rows they got, and report the ones they skipped (a later batch or run takes
    // them). Candidates are read through the purge's indexes (tombstones by age, deleted zones by id,
    // operations by age).

    /// Tombstones, oldest first: deleted under the zones locked, then each zone's purged position rises to
    /// the newest one it lost and its database gets their bytes back. Zones whose database or zone row a
    /// request held are passed over by the next round of candidates, so a busy zone does not keep the rest
    /// waiting (at most `tombstoneRounds` rounds of candidates a batch).
    func purgeTombstones(before horizonMs: Int64, limit: Int) throws -> (removed: Int, skipped: Bool) {
        var remaining = limit
        var removed = 0
        var skipped = false
        var busyZones: Set<Int64> = []
        let tombstoneRounds = 4
        for _ in 0..<tombstoneRounds where remaining > 0 {
            let asked = remaining
            let tombstones = try rows("""
                SELECT r.zone_id, r.name, z.database_id FROM records r JOIN zones z ON z.id = r.zone_id
                WHERE r.deleted = 1 AND r.modified_ms < $1 AND r.zone_id <> ALL($3::int8[])
                ORDER BY r.modified_ms LIMIT $2
                """, [.integer(horizonMs), .integer(Int64(asked)), .integers(busyZones.sorted())])
            let databases = try lockWithoutWaiting("databases", Set(tombstones.map { $0[2].integer }))
            let zones = try lockWithoutWaiting("zones", Set(tombstones.filter { databases.contains($0[2].integer) }
                .map { $0[0].integer }))
            let chosen = tombstones.filter { zones.contains($0[0].integer) }
            let passedOver = tombstones.map { $0[0].integer }.filter { !zones.contains($0) }
            busyZones.formUnion(passedOver)
            if !passedOver.isEmpty { skipped = true }
            // One DELETE per zone, by its primary key and an array of names: a plan that never depends on
            // the table's statistics (a join with the candidates, planned from stale ones, scanned every record
            // once per candidate).
            var namesByZone: [Int64: (databaseID: Int64, names: [String?])] = [:]
            for row in chosen {
                namesByZone[row[0].integer, default: (databaseID: row[2].integer, names: [])].names.append(row[1].text)
            }
            for (zoneID, zone) in namesByZone.sorted(by: { $0.key < $1.key }) {
                guard let purged = try write("""
                    WITH gone AS (
                        DELETE FROM records WHERE zone_id = $1 AND name = ANY($2::text[]) AND deleted = 1
                        AND modified_ms < $3 RETURNING seq, octet_length(frame) AS bytes)
                    SELECT COUNT(*), COALESCE(MAX(seq), 0), COALESCE(SUM(bytes), 0)::bigint FROM gone
                    """, [.integer(zoneID), .texts(zone.names), .integer(horizonMs)],
                    changes: [.records(zoneRowID: zoneID, names: zone.names.compactMap { $0 })]).first,
                    purged[0].integer > 0 else {
                    continue
                }
                try write("UPDATE zones SET purged_seq = GREATEST(purged_seq, $1) WHERE id = $2",
                          [.integer(purged[1].integer), .integer(zoneID)], changes: [.zoneCounters(zoneID)])
                try write("UPDATE databases SET bytes_used = bytes_used - $1 WHERE id = $2",
                          [.integer(purged[2].integer), .integer(zone.databaseID)], changes: [.database(zone.databaseID)])
                removed += Int(purged[0].integer)
                remaining -= Int(purged[0].integer)
            }
            // Fewer candidates than asked for, none passed over: no expired tombstone is left.
            if passedOver.isEmpty && tombstones.count < asked { break }
        }
        if !busyZones.isEmpty { skipped = true }
        return (removed, skipped)
    }

    func deletedZones(before horizonMs: Int64, after: Int64, limit: Int) throws -> [DeletedZone] {
        try rows("SELECT \(Self.zoneColumns), EXISTS(SELECT 1 FROM shares WHERE zone_id = zones.id) "
                 + "FROM zones WHERE deleted = 1 AND modified_ms < $1 AND id > $2 ORDER BY id LIMIT $3",
                 [.integer(horizonMs), .integer(after), .integer(Int64(limit))])
            .map { DeletedZone(zone: zone(Array($0[0..<10])), hasShares: $0[10].integer != 0) }
    }

    func lockDeletedZonesForPurge(_ zones: [StoredZone]) throws -> Set<Int64> {
        let databases = try lockWithoutWaiting("databases", Set(zones.map(\.databaseID)))
        return try lockWithoutWaiting("zones", Set(zones.filter { databases.contains($0.databaseID) }.map(\.rowID)))
    }

    func deleteDeletedZoneRow(_ zone: StoredZone) throws -> Bool {
        try writeCounting("DELETE FROM zones WHERE id = $1 AND deleted = 1", [.integer(zone.rowID)],
                          changes: [.zone(zone.rowID), .allRecords(zoneRowID: zone.rowID)]) > 0
    }

    func raiseDatabasePurgedSeq(databaseID: Int64, to seq: Int64) throws {
        try write("UPDATE databases SET purged_seq = GREATEST(purged_seq, $1) WHERE id = $2",
                  [.integer(seq), .integer(databaseID)], changes: [.database(databaseID)])
    }

    /// Remembered operations, oldest first, give back what they were charged (those charged to a database
    /// only once its row is locked).
    func forgetClientOperations(before operationsBeforeMs: Int64, limit: Int)
        throws -> (examined: Int, removed: Int, skipped: Bool) {
        var skipped = false
        var count = 0
        let operations = try rows("SELECT user_id, operation_id, database_id FROM client_operations "
                                  + "WHERE created_ms < $1 ORDER BY created_ms LIMIT $2",
                                  [.integer(operationsBeforeMs), .integer(Int64(limit))])
        let databases = try lockWithoutWaiting("databases", Set(operations.map { $0[2].integer }.filter { $0 != 0 }))
        let chosen = operations.filter { $0[2].integer == 0 || databases.contains($0[2].integer) }
        if chosen.count < operations.count { skipped = true }
        if !chosen.isEmpty {
            let removed = try write("""
                WITH picked AS (
                    SELECT o.user_id, o.operation_id FROM client_operations o
                    JOIN unnest($1::int8[], $2::text[]) AS c(user_id, operation_id)
                      ON o.user_id = c.user_id AND o.operation_id = c.operation_id
                    WHERE o.created_ms < $3 FOR UPDATE OF o SKIP LOCKED),
                gone AS (
                    DELETE FROM client_operations o USING picked p
                    WHERE o.user_id = p.user_id AND o.operation_id = p.operation_id
                    RETURNING o.database_id, o.charged_bytes),
                \(Self.refundAndCountGoneOperations)
                """, [.integers(chosen.map { $0[0].integer }), .texts(chosen.map { $0[1].text }),
                      .integer(operationsBeforeMs)], changes: [.allClientOperations, .allDatabases])
            count = Int(removed.first?[0].integer ?? 0)
            if count < chosen.count { skipped = true }
        }
        return (operations.count, count, skipped)
    }

    /// Locks those of the rows of `table` (`databases` or `zones`) with the given ids that no other
    /// transaction holds now, in id order, without waiting; returns the ids it locked.
    private func lockWithoutWaiting(_ table: String, _ ids: Set<Int64>) throws -> Set<Int64> {
        guard !ids.isEmpty else { return [] }
        precondition(table == "databases" || table == "zones")
        return Set(try rows("SELECT id FROM \(table) WHERE id = ANY($1) ORDER BY id FOR NO KEY UPDATE SKIP LOCKED",
                            [.integers(ids.sorted())]).map { $0[0].integer })
    }

    // MARK: Device authorizations

    func insertDeviceAuthorization(_ authorization: NewDeviceAuthorization) throws {
        // ON CONFLICT DO NOTHING: a taken code is reported without aborting the transaction.
        let inserted = try rows("INSERT INTO device_authorizations(\(Self.deviceColumns)) "
                                + "VALUES ($1, $2, $3, $4, $5, NULL, $6, 0, $7, $8) ON CONFLICT DO NOTHING RETURNING 1",
                                [.bytea(authorization.deviceCodeHash), .bytea(authorization.userCodeHash),
                                 .text(authorization.address), .text(authorization.deviceName),
                                 .text(DeviceAuthorizationStatus.pending.rawValue), .integer(authorization.intervalSeconds),
                                 .integer(authorization.createdMs), .integer(authorization.expiresMs)])
        if inserted.isEmpty { throw StorageError.duplicate("a device authorization with this device or user code") }
    }

    func deviceAuthorization(deviceCodeHash: [UInt8]) throws -> StoredDeviceAuthorization? {
        try rows("SELECT \(Self.deviceColumns) FROM device_authorizations WHERE device_code_hash = $1" + lock,
                 [.bytea(deviceCodeHash)]).first.map { try deviceAuthorization($0) }
    }

    func deviceAuthorization(userCodeHash: [UInt8]) throws -> StoredDeviceAuthorization? {
        try rows("SELECT \(Self.deviceColumns) FROM device_authorizations WHERE user_code_hash = $1" + lock,
                 [.bytea(userCodeHash)]).first.map { try deviceAuthorization($0) }
    }

    func liveDeviceAuthorizations(address: String?, nowMs: Int64) throws -> Int {
        if let address {
            return Int(try rows("SELECT COUNT(*) FROM device_authorizations WHERE address = $1 AND expires_ms > $2",
                                [.text(address), .integer(nowMs)]).first?[0].integer ?? 0)
        }
        return Int(try rows("SELECT COUNT(*) FROM device_authorizations WHERE expires_ms > $1", [.integer(nowMs)])
            .first?[0].integer ?? 0)
    }

    /// A conditional UPDATE: of two transactions deciding one row at once, the second waits for the first's
    /// row lock, then finds the row no longer pending and changes nothing.
    func decideDeviceAuthorization(userCodeHash: [UInt8], approve: Bool, userID: Int64, deviceName: String?,
                                   nowMs: Int64) throws -> Bool {
        let status: DeviceAuthorizationStatus = approve ? .approved : .denied
        return try run("UPDATE device_authorizations SET status = $1, user_id = $2, device_name = COALESCE($3, device_name) "
                       + "WHERE user_code_hash = $4 AND status = $5 AND expires_ms > $6",
                       [.text(status.rawValue), .integer(userID), deviceName.map { .text($0) } ?? .null,
                        .bytea(userCodeHash), .text(DeviceAuthorizationStatus.pending.rawValue), .integer(nowMs)]) > 0
    }

    func recordDevicePoll(deviceCodeHash: [UInt8], nowMs: Int64, intervalSeconds: Int64) throws {
        try run("UPDATE device_authorizations SET last_poll_ms = $1, interval_seconds = $2 WHERE device_code_hash = $3",
                [.integer(nowMs), .integer(intervalSeconds), .bytea(deviceCodeHash)])
    }

    /// As `decideDeviceAuthorization`: the conditional UPDATE lets exactly one of racing polls have the row.
    func claimDeviceAuthorization(deviceCodeHash: [UInt8], nowMs: Int64) throws -> StoredDeviceAuthorization? {
        try rows("UPDATE device_authorizations SET status = $1 WHERE device_code_hash = $2 AND status = $3 "
                 + "AND expires_ms > $4 RETURNING \(Self.deviceColumns)",
                 [.text(DeviceAuthorizationStatus.issued.rawValue), .bytea(deviceCodeHash),
                  .text(DeviceAuthorizationStatus.approved.rawValue), .integer(nowMs)]).first.map { try deviceAuthorization($0) }
    }

    func forgetDeviceAuthorizations(expiredAt nowMs: Int64) throws -> Int {
        try run("DELETE FROM device_authorizations WHERE expires_ms <= $1", [.integer(nowMs)])
    }

    // MARK: External identities (ExternalIdentities.swift)

    func linkIdentity(issuer: String, subject: String, userID: Int64, nowMs: Int64) throws {
        let inserted = try run("INSERT INTO external_identities(issuer, subject, user_id, created_ms, last_used_ms) "
                               + "VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                               [.text(issuer), .text(subject), .integer(userID), .integer(nowMs), .integer(nowMs)])
        if inserted == 0 { throw StorageError.duplicate("an external identity linked already") }
    }

    func useIdentity(issuer: String, subject: String, nowMs: Int64) throws -> Int64? {
        try rows("UPDATE external_identities SET last_used_ms = $1 WHERE issuer = $2 AND subject = $3 RETURNING user_id",
                 [.integer(nowMs), .text(issuer), .text(subject)]).first?.first?.integer
    }

    func identities(userID: Int64) throws -> Int {
        Int(try rows("SELECT COUNT(*) FROM external_identities WHERE user_id = $1", [.integer(userID)]).first?.first?.integer ?? 0)
    }

    func insertOIDCLogin(_ login: OIDCLogin) throws {
        let inserted = try run("INSERT INTO oidc_logins(\(Self.oidcLoginColumns)) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) "
                               + "ON CONFLICT DO NOTHING",
                               [.bytea(login.stateHash), .text(login.issuer), .text(login.nonce), .text(login.verifier),
                                .text(login.nextPath), login.linkUserID.map { .integer($0) } ?? .null, .text(login.address),
                                .integer(login.createdMs), .integer(login.expiresMs)])
        if inserted == 0 { throw StorageError.duplicate("an OpenID Connect sign-in with this state") }
    }

    func takeOIDCLogin(stateHash: [UInt8], nowMs: Int64) throws -> OIDCLogin? {
        try rows("DELETE FROM oidc_logins WHERE state_hash = $1 AND expires_ms > $2 RETURNING \(Self.oidcLoginColumns)",
                 [.bytea(stateHash), .integer(nowMs)]).first.map(oidcLogin)
    }

    func liveOIDCLogins(address: String?, nowMs: Int64) throws -> Int {
        let found = if let address {
            try rows("SELECT COUNT(*) FROM oidc_logins WHERE address = $1 AND expires_ms > $2", [.text(address), .integer(nowMs)])
        } else {
            try rows("SELECT COUNT(*) FROM oidc_logins WHERE expires_ms > $1", [.integer(nowMs)])
        }
        return Int(found.first?.first?.integer ?? 0)
    }

    func forgetOIDCLogins(expiredAt nowMs: Int64) throws -> Int {
        try run("DELETE FROM oidc_logins WHERE expires_ms <= $1", [.integer(nowMs)])
    }

    // MARK: Passkeys (Passkeys.swift)

    func insertPasskey(_ passkey: NewPasskey) throws {
        let inserted = try run("INSERT INTO passkeys(\(Self.passkeyColumns)) VALUES ($1, $2, $3, $4, $5, $6, $7, NULL) "
                               + "ON CONFLICT DO NOTHING",
                               [.bytea(passkey.credentialID), .integer(passkey.userID), .bytea(passkey.publicKey),
                                .integer(passkey.algorithm), .integer(passkey.signCount), .text(passkey.name), .integer(passkey.createdMs)])
        if inserted == 0 { throw StorageError.duplicate("a passkey with this credential id") }
    }

    func passkey(credentialID: [UInt8]) throws -> StoredPasskey? {
        try rows("SELECT \(Self.passkeyColumns) FROM passkeys WHERE credential_id = $1", [.bytea(credentialID)]).first.map(passkey)
    }

    func passkeys(userID: Int64) throws -> [StoredPasskey] {
        try rows("SELECT \(Self.passkeyColumns) FROM passkeys WHERE user_id = $1 ORDER BY created_ms, credential_id",
                 [.integer(userID)]).map(passkey)
    }

    func recordPasskeySignIn(credentialID: [UInt8], signCount: Int64, nowMs: Int64) throws -> Bool {
        try run("UPDATE passkeys SET sign_count = $1, last_used_ms = $2 WHERE credential_id = $3 AND ($1 = 0 OR sign_count < $1)",
                [.integer(signCount), .integer(nowMs), .bytea(credentialID)]) > 0
    }

    func renamePasskey(credentialID: [UInt8], userID: Int64, name: String) throws -> Bool {
        try run("UPDATE passkeys SET name = $1 WHERE credential_id = $2 AND user_id = $3",
                [.text(name), .bytea(credentialID), .integer(userID)]) > 0
    }

    func deletePasskey(credentialID: [UInt8], userID: Int64) throws -> Bool {
        try run("DELETE FROM passkeys WHERE credential_id = $1 AND user_id = $2", [.bytea(credentialID), .integer(userID)]) > 0
    }

    func insertPasskeyCeremony(_ ceremony: PasskeyCeremony) throws {
        let inserted = try run("INSERT INTO passkey_ceremonies(\(Self.ceremonyColumns)) VALUES ($1, $2, $3, $4, $5, $6, $7) "
                               + "ON CONFLICT DO NOTHING",
                               [.bytea(ceremony.challengeHash), .text(ceremony.purpose.rawValue),
                                ceremony.userID.map { .integer($0) } ?? .null, .text(ceremony.address),
                                ceremony.name.map { .text($0) } ?? .null, .integer(ceremony.createdMs), .integer(ceremony.expiresMs)])
        if inserted == 0 { throw StorageError.duplicate("a passkey ceremony with this challenge") }
    }

    func takePasskeyCeremony(challengeHash: [UInt8], nowMs: Int64) throws -> PasskeyCeremony? {
        try rows("DELETE FROM passkey_ceremonies WHERE challenge_hash = $1 AND expires_ms > $2 RETURNING \(Self.ceremonyColumns)",
                 [.bytea(challengeHash), .integer(nowMs)]).first.map { try ceremony($0) }
    }

    func livePasskeyCeremonies(address: String?, nowMs: Int64) throws -> Int {
        let found = if let address {
            try rows("SELECT COUNT(*) FROM passkey_ceremonies WHERE address = $1 AND expires_ms > $2", [.text(address), .integer(nowMs)])
        } else {
            try rows("SELECT COUNT(*) FROM passkey_ceremonies WHERE expires_ms > $1", [.integer(nowMs)])
        }
        return Int(found.first?.first?.integer ?? 0)
    }

    func forgetPasskeyCeremonies(expiredAt nowMs: Int64) throws -> Int {
        try run("DELETE FROM passkey_ceremonies WHERE expires_ms <= $1", [.integer(nowMs)])
    }

    func replaceRecoveryCodes(userID: Int64, hashes: [[UInt8]], nowMs: Int64) throws {
        try run("DELETE FROM recovery_codes WHERE user_id = $1", [.integer(userID)])
        for hash in hashes {
            try run("INSERT INTO recovery_codes(code_hash, user_id, created_ms, used_ms) VALUES ($1, $2, $3, NULL)",
                    [.bytea(hash), .integer(userID), .integer(nowMs)])
        }
    }

    func useRecoveryCode(hash: [UInt8], nowMs: Int64) throws -> Int64? {
        try rows("UPDATE recovery_codes SET used_ms = $1 WHERE code_hash = $2 AND used_ms IS NULL RETURNING user_id",
                 [.integer(nowMs), .bytea(hash)]).first?.first?.integer
    }

    func unusedRecoveryCodes(userID: Int64) throws -> Int {
        Int(try rows("SELECT COUNT(*) FROM recovery_codes WHERE user_id = $1 AND used_ms IS NULL", [.integer(userID)]).first?.first?.integer ?? 0)
    }

    func recordDeviceApprovalFailure(key: String, nowMs: Int64) throws {
        try run("INSERT INTO device_approval_failures(key, created_ms) VALUES ($1, $2)", [.text(key), .integer(nowMs)])
    }

    func deviceApprovalFailures(key: String, sinceMs: Int64) throws -> SignUpWindow {
        guard let row = try rows("SELECT COUNT(*), MIN(created_ms) FROM device_approval_failures "
                                 + "WHERE key = $1 AND created_ms >= $2", [.text(key), .integer(sinceMs)]).first,
              row[0].integer > 0 else { return SignUpWindow(count: 0, oldestMs: nil) }
        return SignUpWindow(count: Int(row[0].integer), oldestMs: row[1].integer)
    }

    func forgetDeviceApprovalFailures(before beforeMs: Int64) throws {
        try run("DELETE FROM device_approval_failures WHERE created_ms < $1", [.integer(beforeMs)])
    }
}

extension PostgresValue {
    /// The neutral form of a value (arrays never occur in a table).
    var neutral: StorageValue {
        switch self {
        case .null: .null
        case .integer(let value): .integer(value)
        case .boolean(let value): .integer(value ? 1 : 0)
        case .text(let value): .text(value)
        case .bytea(let value): .blob(value)
        case .integers, .texts, .byteas: .null
        }
    }

    init(_ value: StorageValue) {
        switch value {
        case .null: self = .null
        case .integer(let value): self = .integer(value)
        case .text(let value): self = .text(value)
        case .blob(let value): self = .bytea(value)
        }
    }
}
