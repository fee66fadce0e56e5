import Foundation
import LatticeSQLite

/// The client's local replica on disk: one SQLite file in a home directory (one home is one device).
///
/// It keeps the account, the sync state (change tokens), the zones the device knows and every record's
/// CRDT state as a binary frame, with a dirty mark on records that hold edits the server has not
/// acknowledged yet. It is written in transactions with `synchronous=FULL`, so a crash (of the process or
/// of the machine) never loses a local edit and never records a fetch that did not happen. The one
/// exception is asked for by name (`transaction(flushed: false)`): the engine's note that the server
/// acknowledged a send, which a power failure may undo (the record is then sent again and joined as
/// before) but a crash of the process does not.
public final class LocalStore: Sendable {
    private let queue: DatabaseQueue

    public static let fileName = "replica.sqlite"

    public init(path: String) throws {
        do {
            queue = try DatabaseQueue(path: path)
            _ = try queue.read { connection in try LocalStore.migrator.migrate(connection) }
        } catch let error as SQLiteError {
            throw LocalStoreError("cannot open the local replica \(path): \(error.description)")
        } catch let error as MigrationError {
            throw LocalStoreError("cannot open the local replica \(path): \(error.description)")
        }
    }

    public func close() { queue.close() }

    /// Runs `body` in one transaction: all of it is written, or none. `flushed: false` is for writes that are
    /// safe to lose in a power failure (they survive a crash of the process): the commit does not wait
    /// for the disk (`DatabaseQueue.write(flushed:)`).
    public func transaction<T>(flushed: Bool = true, _ body: (LocalTransaction) throws -> T) throws -> T {
        do {
            return try queue.write(flushed: flushed) { connection in try body(LocalTransaction(db: connection)) }
        } catch let error as SQLiteError {
            throw LocalStoreError(error.isBusy ? "the local replica is busy (another lattice process is using it)"
                                  : error.description, isBusy: error.isBusy)
        }
    }

    static let migrator = Migrator([
        Migrator.Migration("v1: metadata, zones, records with dirty marks", sql: """
            CREATE TABLE metadata(key TEXT PRIMARY KEY, value TEXT NOT NULL);
            CREATE TABLE zones(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                database TEXT NOT NULL,
                zone_name TEXT NOT NULL,
                owner TEXT NOT NULL,
                sync_token TEXT,
                on_server INTEGER NOT NULL DEFAULT 0,
                UNIQUE(database, zone_name, owner));
            CREATE TABLE records(
                zone_id INTEGER NOT NULL REFERENCES zones(id) ON DELETE CASCADE,
                name TEXT NOT NULL,
                frame BLOB NOT NULL,
                dirty INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY(zone_id, name)) WITHOUT ROWID;
            CREATE INDEX records_dirty ON records(dirty) WHERE dirty > 0;
            """),
    ])
}

/// A zone the device knows.
public struct LocalZone: Sendable, Hashable {
    public let id: Int64
    /// `private` or `shared`.
    public let database: String
    public let zoneName: String
    public let ownerRecordName: String
    public let syncToken: String?
    /// Whether the server has the zone (a zone made offline is created on the next sync).
    public let onServer: Bool
}

/// A record's local state.
public struct LocalRecord: Sendable, Hashable {
    public let zoneID: Int64
    public let name: String
    public let frame: [UInt8]
    /// 0 when the server has everything; otherwise the edit generation that is waiting to be sent.
    public let dirty: Int64
}

/// Operations inside a local transaction.
public struct LocalTransaction {
    let db: Connection

    private func rows(_ sql: String, _ values: [SQLiteValue] = []) throws -> [[SQLiteValue]] {
        try db.cached(sql).rows(values)
    }

    @discardableResult
    private func run(_ sql: String, _ values: [SQLiteValue] = []) throws -> Int {
        try db.cached(sql).run(values)
    }

    public func metadata(_ key: String) throws -> String? {
        try rows("SELECT value FROM metadata WHERE key = ?", [.text(key)]).first?[0].text
    }

    public func setMetadata(_ key: String, _ value: String?) throws {
        if let value {
            try run("INSERT INTO metadata(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    [.text(key), .text(value)])
        } else {
            try run("DELETE FROM metadata WHERE key = ?", [.text(key)])
        }
    }

    private static let zoneColumns = "id, database, zone_name, owner, sync_token, on_server"

    private func zone(_ row: [SQLiteValue]) -> LocalZone {
        LocalZone(id: row[0].integer, database: row[1].text ?? "", zoneName: row[2].text ?? "", ownerRecordName: row[3].text ?? "",
                  syncToken: row[4].text, onServer: row[5].integer != 0)
    }

    public func zones() throws -> [LocalZone] {
        try rows("SELECT \(Self.zoneColumns) FROM zones ORDER BY id").map(zone)
    }

    public func zone(id: Int64) throws -> LocalZone? {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE id = ?", [.integer(id)]).first.map(zone)
    }

    public func zone(database: String, zoneName: String, owner: String) throws -> LocalZone? {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database = ? AND zone_name = ? AND owner = ?",
                 [.text(database), .text(zoneName), .text(owner)]).first.map(zone)
    }

    /// The zone, created locally if the device does not know it yet.
    public func ensureZone(database: String, zoneName: String, owner: String, onServer: Bool) throws -> LocalZone {
        if let existing = try zone(database: database, zoneName: zoneName, owner: owner) {
            if onServer && !existing.onServer { try setOnServer(existing.id) }
            return try zone(id: existing.id)!
        }
        try run("INSERT INTO zones(database, zone_name, owner, on_server) VALUES (?, ?, ?, ?)",
                [.text(database), .text(zoneName), .text(owner), .integer(onServer ? 1 : 0)])
        return try zone(id: db.lastInsertRowID)!
    }

    public func setSyncToken(_ zoneID: Int64, _ token: String?) throws {
        try run("UPDATE zones SET sync_token = ? WHERE id = ?", [token.map { .text($0) } ?? .null, .integer(zoneID)])
    }

    public func setOnServer(_ zoneID: Int64) throws {
        try run("UPDATE zones SET on_server = 1 WHERE id = ?", [.integer(zoneID)])
    }

    /// Forgets a zone and its records.
    public func deleteZone(_ zoneID: Int64) throws {
        try run("DELETE FROM records WHERE zone_id = ?", [.integer(zoneID)])
        try run("DELETE FROM zones WHERE id = ?", [.integer(zoneID)])
    }

    private func record(_ row: [SQLiteValue]) -> LocalRecord {
        LocalRecord(zoneID: row[0].integer, name: row[1].text ?? "", frame: row[2].blob, dirty: row[3].integer)
    }

    public func records(zoneID: Int64) throws -> [LocalRecord] {
        try rows("SELECT zone_id, name, frame, dirty FROM records WHERE zone_id = ? ORDER BY name", [.integer(zoneID)]).map(record)
    }

    public func record(zoneID: Int64, name: String) throws -> LocalRecord? {
        try rows("SELECT zone_id, name, frame, dirty FROM records WHERE zone_id = ? AND name = ?",
                 [.integer(zoneID), .text(name)]).first.map(record)
    }

    /// Saves a record's state. A local edit (`dirty: true`) gets a new edit generation; a state from the
    /// server keeps the record's mark as it is (it may still hold unsent edits).
    public func saveRecord(zoneID: Int64, name: String, frame: [UInt8], dirty: Bool) throws {
        if dirty {
            let generation = Int64(try metadata("edit_generation").flatMap { Int64($0) } ?? 0) + 1
            try setMetadata("edit_generation", String(generation))
            try run("""
                INSERT INTO records(zone_id, name, frame, dirty) VALUES (?, ?, ?, ?)
                ON CONFLICT(zone_id, name) DO UPDATE SET frame = excluded.frame, dirty = excluded.dirty
                """, [.integer(zoneID), .text(name), .blob(frame), .integer(generation)])
        } else {
            try run("""
                INSERT INTO records(zone_id, name, frame, dirty) VALUES (?, ?, ?, 0)
                ON CONFLICT(zone_id, name) DO UPDATE SET frame = excluded.frame
                """, [.integer(zoneID), .text(name), .blob(frame)])
        }
    }

    /// Clears the dirty mark if no edit happened since `generation` was sent.
    private static let markSentSQL = "UPDATE records SET dirty = 0 WHERE zone_id = ? AND name = ? AND dirty = ?"

    /// Called once per acknowledged record of a send: bound value by value on the prepared statement.
    public func markSent(zoneID: Int64, name: String, generation: Int64) throws {
        let update = try db.cached(Self.markSentSQL)
        try update.reset()
        try update.bind(1, integer: zoneID)
        try update.bind(2, text: name)
        try update.bind(3, integer: generation)
        try update.runBound()
    }

    /// Drops the dirty mark whatever it is (the local state was replaced by the server's).
    public func clearDirty(zoneID: Int64, name: String) throws {
        try run("UPDATE records SET dirty = 0 WHERE zone_id = ? AND name = ?", [.integer(zoneID), .text(name)])
    }

    public func deleteRecord(zoneID: Int64, name: String) throws {
        try run("DELETE FROM records WHERE zone_id = ? AND name = ?", [.integer(zoneID), .text(name)])
    }

    /// Records with unsent edits, oldest edit first.
    public func dirtyRecords() throws -> [LocalRecord] {
        try rows("SELECT zone_id, name, frame, dirty FROM records WHERE dirty > 0 ORDER BY dirty").map(record)
    }
}

/// A failure of the local replica file: it could not be opened or migrated, or a transaction failed
/// (`isBusy`: another process held it past the busy timeout).
public struct LocalStoreError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public let isBusy: Bool

    init(_ description: String, isBusy: Bool = false) {
        self.description = description
        self.isBusy = isBusy
    }
}
