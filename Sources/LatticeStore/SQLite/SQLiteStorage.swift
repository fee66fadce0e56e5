import CSQLite
import Foundation

/// The embedded backend: one SQLite file in WAL mode with `synchronous=FULL`.
///
/// One writer connection (SQLite allows one writer at a time, so the zone and database logs are
/// allocated in commit order) and one reader connection, each behind its own lock; WAL lets the reader
/// see committed snapshots while a write is in progress.
public final class SQLiteStorage: Storage, @unchecked Sendable {
    private let writer: DatabaseQueue
    private let reader: DatabaseQueue
    private let state = NSLock()
    private var isClosed = false

    /// The file name inside a data directory.
    public static let fileName = "lattice.sqlite"

    /// Opens (creating and migrating if needed) the database at `path`.
    public init(path: String, busyTimeoutMilliseconds: Int32 = 5_000) throws {
        do {
            writer = try DatabaseQueue(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds)
            _ = try writer.read { connection in try SQLiteStorage.migrator.migrate(connection) }
            reader = try DatabaseQueue(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds)
        } catch let error as SQLiteError {
            throw StorageError.failure("cannot open \(path): \(error.description)")
        }
    }

    public func read<T>(_ body: (any StorageTransaction) throws -> T) throws -> T {
        try checkOpen()
        return try mapErrors {
            try reader.read { connection in
                try connection.execute("BEGIN")
                defer { try? connection.execute("COMMIT") }
                return try body(SQLiteTransaction(connection, readOnly: true))
            }
        }
    }

    public func write<T>(_ body: (any StorageTransaction) throws -> T) throws -> T {
        try checkOpen()
        return try mapErrors { try writer.write { connection in try body(SQLiteTransaction(connection, readOnly: false)) } }
    }

    public func close() {
        state.lock()
        isClosed = true
        state.unlock()
        // Wait for in-flight work, then checkpoint the WAL so the file is whole on its own.
        try? writer.read { connection in try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
        writer.close()
        reader.close()
    }

    private func checkOpen() throws {
        state.lock()
        defer { state.unlock() }
        if isClosed { throw StorageError.closed }
    }

    private func mapErrors<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as SQLiteError {
            if error.isBusy { throw StorageError.busy }
            throw StorageError.failure(error.description)
        }
    }

    // MARK: Schema

    static let migrator = Migrator([
        Migrator.Migration("v1: users, tokens, databases, zones, records, client operations", sql: """
            CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE users(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                record_name TEXT NOT NULL UNIQUE,
                name TEXT NOT NULL UNIQUE,
                created_ms INTEGER NOT NULL);
            CREATE TABLE tokens(
                hash BLOB PRIMARY KEY,
                user_id INTEGER NOT NULL REFERENCES users(id),
                created_ms INTEGER NOT NULL) WITHOUT ROWID;
            CREATE TABLE databases(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                kind TEXT NOT NULL,
                environment TEXT NOT NULL,
                owner_id INTEGER NOT NULL,
                last_seq INTEGER NOT NULL DEFAULT 0,
                purged_seq INTEGER NOT NULL DEFAULT 0,
                bytes_used INTEGER NOT NULL DEFAULT 0,
                UNIQUE(kind, environment, owner_id));
            CREATE TABLE zones(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                database_id INTEGER NOT NULL REFERENCES databases(id),
                name TEXT NOT NULL,
                owner_record_name TEXT NOT NULL,
                deleted INTEGER NOT NULL DEFAULT 0,
                last_seq INTEGER NOT NULL DEFAULT 0,
                purged_seq INTEGER NOT NULL DEFAULT 0,
                db_seq INTEGER NOT NULL,
                created_ms INTEGER NOT NULL,
                modified_ms INTEGER NOT NULL);
            CREATE UNIQUE INDEX zones_live_name ON zones(database_id, name) WHERE deleted = 0;
            CREATE INDEX zones_log ON zones(database_id, db_seq);
            CREATE TABLE records(
                zone_id INTEGER NOT NULL REFERENCES zones(id),
                name TEXT NOT NULL,
                record_type TEXT NOT NULL,
                frame BLOB NOT NULL,
                deleted INTEGER NOT NULL,
                seq INTEGER NOT NULL,
                created_ms INTEGER NOT NULL,
                created_by TEXT NOT NULL,
                modified_ms INTEGER NOT NULL,
                modified_by TEXT NOT NULL,
                PRIMARY KEY(zone_id, name)) WITHOUT ROWID;
            CREATE UNIQUE INDEX records_log ON records(zone_id, seq);
            CREATE INDEX records_type ON records(zone_id, record_type, name);
            CREATE TABLE client_operations(
                user_id INTEGER NOT NULL,
                operation_id TEXT NOT NULL,
                request_hash BLOB NOT NULL,
                status INTEGER NOT NULL,
                response BLOB NOT NULL,
                created_ms INTEGER NOT NULL,
                PRIMARY KEY(user_id, operation_id)) WITHOUT ROWID;
            CREATE INDEX client_operations_age ON client_operations(created_ms);
            """),
    ])

    /// The schema version this build creates.
    public static var schemaVersion: Int { migrator.latestVersion }
}

/// `StorageTransaction` over one SQLite connection inside an open transaction.
struct SQLiteTransaction: StorageTransaction {
    let db: Connection
    let isReadOnly: Bool

    init(_ connection: Connection, readOnly: Bool) {
        db = connection
        isReadOnly = readOnly
    }

    private func rows(_ sql: String, _ values: [SQLiteValue] = []) throws -> [[SQLiteValue]] {
        try db.cached(sql).rows(values)
    }

    @discardableResult
    private func run(_ sql: String, _ values: [SQLiteValue] = []) throws -> Int {
        do {
            return try db.cached(sql).run(values)
        } catch where error.isUniqueViolation {
            throw StorageError.duplicate(error.message)
        }
    }

    // MARK: Metadata

    func metadata(_ key: String) throws -> String? {
        try rows("SELECT value FROM metadata WHERE key = ?", [.text(key)]).first?[0].text
    }

    func setMetadata(_ key: String, _ value: String) throws {
        try run("INSERT INTO metadata(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                [.text(key), .text(value)])
    }

    // MARK: Users

    private static let userColumns = "id, record_name, name, created_ms"

    private func user(_ row: [SQLiteValue]) -> UserAccount {
        UserAccount(id: row[0].integer, recordName: row[1].text ?? "", name: row[2].text ?? "", createdMs: row[3].integer)
    }

    func insertUser(name: String, recordName: String, nowMs: Int64) throws -> UserAccount {
        do {
            try run("INSERT INTO users(record_name, name, created_ms) VALUES (?, ?, ?)",
                    [.text(recordName), .text(name), .integer(nowMs)])
        } catch StorageError.duplicate {
            throw StorageError.duplicate("a user named \(name)")
        }
        return UserAccount(id: db.lastInsertRowID, recordName: recordName, name: name, createdMs: nowMs)
    }

    func user(named name: String) throws -> UserAccount? {
        try rows("SELECT \(Self.userColumns) FROM users WHERE name = ?", [.text(name)]).first.map(user)
    }

    func user(recordName: String) throws -> UserAccount? {
        try rows("SELECT \(Self.userColumns) FROM users WHERE record_name = ?", [.text(recordName)]).first.map(user)
    }

    func user(tokenHash: [UInt8]) throws -> UserAccount? {
        try rows("SELECT u.id, u.record_name, u.name, u.created_ms FROM tokens t JOIN users u ON u.id = t.user_id "
                 + "WHERE t.hash = ?", [.blob(tokenHash)]).first.map(user)
    }

    func insertToken(hash: [UInt8], userID: Int64, nowMs: Int64) throws {
        try run("INSERT INTO tokens(hash, user_id, created_ms) VALUES (?, ?, ?)",
                [.blob(hash), .integer(userID), .integer(nowMs)])
    }

    // MARK: Databases and zones

    private static let databaseColumns = "id, kind, environment, owner_id, last_seq, purged_seq, bytes_used"

    private func database(_ row: [SQLiteValue]) -> StoredDatabase {
        StoredDatabase(
            id: row[0].integer,
            key: DatabaseKey(kind: DatabaseKind(rawValue: row[1].text ?? "") ?? .private, environment: row[2].text ?? "",
                             ownerID: row[3].integer),
            lastSeq: row[4].integer, purgedSeq: row[5].integer, bytesUsed: row[6].integer)
    }

    func database(_ key: DatabaseKey) throws -> StoredDatabase {
        let select = "SELECT \(Self.databaseColumns) FROM databases WHERE kind = ? AND environment = ? AND owner_id = ?"
        let arguments: [SQLiteValue] = [.text(key.kind.rawValue), .text(key.environment), .integer(key.ownerID)]
        if let row = try rows(select, arguments).first { return database(row) }
        // Only a write transaction can create it; a read sees an empty database that does not exist yet.
        if isReadOnly {
            return StoredDatabase(id: 0, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0)
        }
        try run("INSERT INTO databases(kind, environment, owner_id) VALUES (?, ?, ?)", arguments)
        return StoredDatabase(id: db.lastInsertRowID, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0)
    }

    func database(id: Int64) throws -> StoredDatabase? {
        try rows("SELECT \(Self.databaseColumns) FROM databases WHERE id = ?", [.integer(id)]).first.map(database)
    }

    private static let zoneColumns =
        "id, database_id, name, owner_record_name, deleted, last_seq, purged_seq, db_seq, created_ms, modified_ms"

    private func zone(_ row: [SQLiteValue]) -> StoredZone {
        StoredZone(rowID: row[0].integer, databaseID: row[1].integer, name: row[2].text ?? "",
                   ownerRecordName: row[3].text ?? "", deleted: row[4].integer != 0, lastSeq: row[5].integer,
                   purgedSeq: row[6].integer, databaseSeq: row[7].integer, createdMs: row[8].integer,
                   modifiedMs: row[9].integer)
    }

    func zone(databaseID: Int64, name: String) throws -> StoredZone? {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = ? AND name = ? AND deleted = 0",
                 [.integer(databaseID), .text(name)]).first.map(zone)
    }

    func zone(rowID: Int64) throws -> StoredZone? {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE id = ?", [.integer(rowID)]).first.map(zone)
    }

    func liveZones(databaseID: Int64) throws -> [StoredZone] {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = ? AND deleted = 0 ORDER BY name",
                 [.integer(databaseID)]).map(zone)
    }

    /// Allocates the database's next log position. The UPDATE takes the write lock (held to commit).
    private func nextDatabaseSeq(_ databaseID: Int64) throws -> Int64 {
        let rows = try rows("UPDATE databases SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq",
                            [.integer(databaseID)])
        guard let seq = rows.first?[0].integer else { throw StorageError.failure("database \(databaseID) is missing") }
        return seq
    }

    func createZone(databaseID: Int64, name: String, ownerRecordName: String, nowMs: Int64) throws -> StoredZone {
        let seq = try nextDatabaseSeq(databaseID)
        do {
            try run("INSERT INTO zones(database_id, name, owner_record_name, db_seq, created_ms, modified_ms) "
                    + "VALUES (?, ?, ?, ?, ?, ?)",
                    [.integer(databaseID), .text(name), .text(ownerRecordName), .integer(seq), .integer(nowMs),
                     .integer(nowMs)])
        } catch StorageError.duplicate {
            throw StorageError.duplicate("a zone named \(name)")
        }
        return StoredZone(rowID: db.lastInsertRowID, databaseID: databaseID, name: name, ownerRecordName: ownerRecordName,
                          deleted: false, lastSeq: 0, purgedSeq: 0, databaseSeq: seq, createdMs: nowMs, modifiedMs: nowMs)
    }

    func deleteZone(rowID: Int64, nowMs: Int64) throws {
        guard let zone = try zone(rowID: rowID), !zone.deleted else { return }
        let seq = try nextDatabaseSeq(zone.databaseID)
        let freed = try rows("SELECT COALESCE(SUM(LENGTH(frame)), 0) FROM records WHERE zone_id = ?",
                             [.integer(rowID)]).first?[0].integer ?? 0
        try run("DELETE FROM records WHERE zone_id = ?", [.integer(rowID)])
        try run("UPDATE zones SET deleted = 1, db_seq = ?, modified_ms = ? WHERE id = ?",
                [.integer(seq), .integer(nowMs), .integer(rowID)])
        try run("UPDATE databases SET bytes_used = bytes_used - ? WHERE id = ?", [.integer(freed), .integer(zone.databaseID)])
    }

    func zoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [StoredZone] {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = ? AND db_seq > ? ORDER BY db_seq LIMIT ?",
                 [.integer(databaseID), .integer(cursor), .integer(Int64(limit))]).map(zone)
    }

    // MARK: Records

    private static let recordColumns =
        "name, record_type, frame, deleted, seq, created_ms, created_by, modified_ms, modified_by"

    private func record(_ row: [SQLiteValue], zoneRowID: Int64) -> StoredRecord {
        let seq = row[4].integer
        return StoredRecord(recordName: row[0].text ?? "", recordType: row[1].text ?? "", frame: row[2].blob,
                            deleted: row[3].integer != 0, seq: seq, changeTag: Self.changeTag(zoneRowID, seq),
                            createdMs: row[5].integer, createdBy: row[6].text ?? "", modifiedMs: row[7].integer,
                            modifiedBy: row[8].text ?? "")
    }

    /// A change tag names the zone incarnation and the log position, so it is new on every change.
    static func changeTag(_ zoneRowID: Int64, _ seq: Int64) -> String {
        String(zoneRowID, radix: 36) + "-" + String(seq, radix: 36)
    }

    func record(zoneRowID: Int64, name: String) throws -> StoredRecord? {
        try rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND name = ?",
                 [.integer(zoneRowID), .text(name)]).first.map { record($0, zoneRowID: zoneRowID) }
    }

    func records(zoneRowID: Int64, recordType: String?) throws -> [StoredRecord] {
        let rows: [[SQLiteValue]]
        if let recordType {
            rows = try self.rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND record_type = ? "
                                 + "AND deleted = 0 ORDER BY name", [.integer(zoneRowID), .text(recordType)])
        } else {
            rows = try self.rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND deleted = 0 ORDER BY name",
                                 [.integer(zoneRowID)])
        }
        return rows.map { record($0, zoneRowID: zoneRowID) }
    }

    func saveRecord(zoneRowID: Int64, _ write: RecordWrite) throws -> StoredRecord {
        guard let zone = try zone(rowID: zoneRowID), !zone.deleted else {
            throw StorageError.failure("zone \(zoneRowID) is not live")
        }
        let previous = try record(zoneRowID: zoneRowID, name: write.recordName)
        let seqRows = try rows("UPDATE zones SET last_seq = last_seq + 1, modified_ms = ? WHERE id = ? RETURNING last_seq",
                               [.integer(write.nowMs), .integer(zoneRowID)])
        guard let seq = seqRows.first?[0].integer else { throw StorageError.failure("zone \(zoneRowID) is missing") }
        let databaseSeq = try nextDatabaseSeq(zone.databaseID)
        try run("UPDATE zones SET db_seq = ? WHERE id = ?", [.integer(databaseSeq), .integer(zoneRowID)])
        let createdMs = previous?.createdMs ?? write.nowMs
        let createdBy = previous?.createdBy ?? write.userRecordName
        try run("""
            INSERT INTO records(zone_id, name, record_type, frame, deleted, seq, created_ms, created_by, modified_ms,
                                modified_by)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT(zone_id, name) DO UPDATE SET record_type = excluded.record_type, frame = excluded.frame,
                deleted = excluded.deleted, seq = excluded.seq, modified_ms = excluded.modified_ms,
                modified_by = excluded.modified_by
            """, [.integer(zoneRowID), .text(write.recordName), .text(write.recordType), .blob(write.frame),
                  .integer(write.deleted ? 1 : 0), .integer(seq), .integer(createdMs), .text(createdBy),
                  .integer(write.nowMs), .text(write.userRecordName)])
        let growth = Int64(write.frame.count) - Int64(previous?.frame.count ?? 0)
        try run("UPDATE databases SET bytes_used = bytes_used + ? WHERE id = ?", [.integer(growth), .integer(zone.databaseID)])
        return StoredRecord(recordName: write.recordName, recordType: write.recordType, frame: write.frame,
                            deleted: write.deleted, seq: seq, changeTag: Self.changeTag(zoneRowID, seq),
                            createdMs: createdMs, createdBy: createdBy, modifiedMs: write.nowMs,
                            modifiedBy: write.userRecordName)
    }

    func recordChanges(zoneRowID: Int64, after cursor: Int64, limit: Int) throws -> [StoredRecord] {
        try rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                 [.integer(zoneRowID), .integer(cursor), .integer(Int64(limit))]).map { record($0, zoneRowID: zoneRowID) }
    }

    // MARK: Client operations

    func clientOperation(userID: Int64, operationID: String) throws -> ClientOperation? {
        try rows("SELECT request_hash, status, response FROM client_operations WHERE user_id = ? AND operation_id = ?",
                 [.integer(userID), .text(operationID)]).first.map {
            ClientOperation(requestHash: $0[0].blob, status: Int($0[1].integer), response: $0[2].blob)
        }
    }

    func saveClientOperation(userID: Int64, operationID: String, _ operation: ClientOperation, nowMs: Int64) throws {
        try run("INSERT INTO client_operations(user_id, operation_id, request_hash, status, response, created_ms) "
                + "VALUES (?, ?, ?, ?, ?, ?)",
                [.integer(userID), .text(operationID), .blob(operation.requestHash), .integer(Int64(operation.status)),
                 .blob(operation.response), .integer(nowMs)])
    }

    // MARK: Savepoints and maintenance

    func savepoint<T>(_ body: () throws -> T) throws -> T {
        try db.execute("SAVEPOINT item")
        do {
            let result = try body()
            try db.execute("RELEASE item")
            return result
        } catch {
            try db.execute("ROLLBACK TO item")
            try db.execute("RELEASE item")
            throw error
        }
    }

    func purge(before horizonMs: Int64, operationsBeforeMs: Int64) throws -> PurgeReport {
        var report = PurgeReport()
        // Tombstones: raise each zone's purged position to the newest purged tombstone, then delete them.
        let purgedByZone = try rows("SELECT zone_id, MAX(seq), COUNT(*), SUM(LENGTH(frame)) FROM records "
                                    + "WHERE deleted = 1 AND modified_ms < ? GROUP BY zone_id", [.integer(horizonMs)])
        for row in purgedByZone {
            let zoneID = row[0].integer
            try run("UPDATE zones SET purged_seq = MAX(purged_seq, ?) WHERE id = ?", [.integer(row[1].integer), .integer(zoneID)])
            try run("UPDATE databases SET bytes_used = bytes_used - ? WHERE id = (SELECT database_id FROM zones WHERE id = ?)",
                    [.integer(row[3].integer), .integer(zoneID)])
            report.tombstones += Int(row[2].integer)
        }
        try run("DELETE FROM records WHERE deleted = 1 AND modified_ms < ?", [.integer(horizonMs)])
        // Deleted zones: the same for each database's log.
        let purgedByDatabase = try rows("SELECT database_id, MAX(db_seq), COUNT(*) FROM zones WHERE deleted = 1 "
                                        + "AND modified_ms < ? GROUP BY database_id", [.integer(horizonMs)])
        for row in purgedByDatabase {
            try run("UPDATE databases SET purged_seq = MAX(purged_seq, ?) WHERE id = ?",
                    [.integer(row[1].integer), .integer(row[0].integer)])
            report.zones += Int(row[2].integer)
        }
        try run("DELETE FROM zones WHERE deleted = 1 AND modified_ms < ?", [.integer(horizonMs)])
        report.clientOperations = try run("DELETE FROM client_operations WHERE created_ms < ?",
                                          [.integer(operationsBeforeMs)])
        return report
    }
}

extension SQLiteValue {
    var integer: Int64 {
        if case .integer(let value) = self { return value }
        return 0
    }

    var text: String? {
        if case .text(let value) = self { return value }
        return nil
    }

    var blob: [UInt8] {
        if case .blob(let value) = self { return value }
        return []
    }
}
