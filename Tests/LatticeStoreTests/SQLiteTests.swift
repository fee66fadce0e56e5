import Foundation
import Synchronization
import Testing
import LatticeSQLite
@testable import LatticeStore

@Suite("SQLite layer")
struct SQLiteTests {
    private func temporaryPath() -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lattice-store-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory.appendingPathComponent("test.sqlite").path
    }

    /// The read-ahead of a batch tells names apart as SQLite does, byte by byte: "café" precomposed and
    /// decomposed are equal Swift strings but two records.
    @Test func aReadAheadKeepsApartNamesThatSwiftCallsEqual() throws {
        let storage = try SQLiteStorage(path: temporaryPath())
        defer { storage.close() }
        let composed = "caf\u{E9}", decomposed = "cafe\u{301}"
        #expect(composed == decomposed && Array(composed.utf8) != Array(decomposed.utf8))
        try storage.write { tx throws in
            let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: 1))
            let zone = try tx.createZone(databaseID: database.id, name: "Lists", ownerRecordName: "_a", nowMs: 1)
            _ = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(recordName: decomposed, recordType: "Item", frame: [1],
                                                                    deleted: false, parentName: nil, userRecordName: "_a",
                                                                    nowMs: 2))
            try tx.prefetchRecords(zoneRowID: zone.rowID, names: ["a", composed, decomposed, "d"])
            #expect(try tx.record(zoneRowID: zone.rowID, name: decomposed)?.frame == [1])
            #expect(try tx.record(zoneRowID: zone.rowID, name: composed) == nil)
            try tx.prefetchRecords(zoneRowID: zone.rowID, names: ["a", composed])
            #expect(try tx.record(zoneRowID: zone.rowID, name: composed) == nil)
            #expect(try tx.record(zoneRowID: zone.rowID, name: decomposed)?.frame == [1])
        }
    }

    /// Schema v8 keys the user names a database already holds (`StorageRules.userNameKeyMigration`): names
    /// that share a key since keys exist ("mom" and "Mom", taken before) keep their accounts, the first by
    /// its key, each later one by its key and id, and no new name can take either key.
    @Test func theMigrationKeysTheNamesADatabaseHoldsAndKeepsEarlierLookAlikes() throws {
        let path = temporaryPath()
        try SQLiteStorage(path: path).close()
        // The database as schema v7 had it: no key, and two names that differ only in case.
        try Connection(path: path).execute("""
            DROP TABLE passkeys;
            DROP TABLE passkey_ceremonies;
            DROP TABLE recovery_codes;
            DROP TABLE external_identities;
            DROP TABLE oidc_logins;
            DROP TABLE share_short_links;
            DROP TABLE subscriptions;
            DROP TABLE notification_counters;
            DROP TABLE notifications;
            DROP TABLE push_tokens;
            DROP TABLE webhook_deliveries;
            DROP TABLE asset_uploads;
            DROP TABLE asset_blobs;
            DROP TABLE asset_claims;
            DROP TABLE asset_references;
            DROP TABLE asset_chunks;
            DROP INDEX users_by_name_key;
            ALTER TABLE users DROP COLUMN name_key;
            INSERT INTO users(record_name, name, created_ms) VALUES ('_a', 'mom', 1), ('_b', 'Mom', 2), ('_c', 'ann', 3);
            PRAGMA user_version = 7;
            """) // the connection closes when it goes
        let storage = try SQLiteStorage(path: path)
        defer { storage.close() }
        let users = try storage.read { tx throws in
            try ["_a", "_b", "_c"].map { try #require(try tx.user(recordName: $0)) }
        }
        #expect(users.map(\.name) == ["mom", "Mom", "ann"])
        let keys = try storage.read { tx throws in
            var rows: [[StorageValue]] = []
            try tx.exportRows(table: "users") { rows += $0 }
            return rows.map { $0.last }
        }
        #expect(keys == [.text("mom"), .text("mom#\(users[1].id)"), .text("ann")])
        // Each finds its own account by its exact name; a new look-alike of either is refused.
        #expect(try storage.read { try $0.user(named: "Mom") }?.recordName == "_b")
        #expect(try storage.read { try $0.user(named: "mom") }?.recordName == "_a")
        for taken in ["MOM", "Ann"] {
            #expect(throws: StorageError.self) {
                try storage.write { _ = try $0.insertUser(name: taken, recordName: "_d", nowMs: 4) }
            }
        }
    }

    /// The counts of the share page are answered from a covering index alone (schema v7), never from the
    /// records' rows: reading `deleted` from a row walks a large record's overflow pages. The plan of each
    /// count statement, exactly as `SQLiteTransaction` runs it, must say COVERING INDEX.
    @Test func countsAreAnsweredFromACoveringIndex() throws {
        let path = temporaryPath()
        try SQLiteStorage(path: path).close()
        let connection = try Connection(path: path)
        let counts = [SQLiteTransaction.countOfType, SQLiteTransaction.countOfAllTypes, SQLiteTransaction.countOfChildren]
        for sql in counts {
            let arguments: [SQLiteValue] = sql.contains("record_type") || sql.contains("parent_name")
                ? [.integer(1), .text("Item")] : [.integer(1)]
            let plan = try connection.prepare("EXPLAIN QUERY PLAN " + sql).rows(arguments)
            let details = plan.compactMap { $0.last?.text }.joined(separator: "; ")
            #expect(details.contains("USING COVERING INDEX records_type") || details.contains("USING COVERING INDEX records_parent"),
                    "\(sql): \(details)")
        }
    }

    @Test func fileDatabasesUseWALWithFullSync() throws {
        let connection = try Connection(path: temporaryPath())
        #expect(try connection.journalMode == "wal")
        let sync = try connection.prepare("PRAGMA synchronous").rows()
        #expect(sync == [[.integer(2)]]) // FULL
    }

    @Test func valuesRoundTripByteForByte() throws {
        let connection = try Connection(path: ":memory:")
        try connection.execute("CREATE TABLE t (a, b, c, d, e)")
        let odd = "'; DROP TABLE t;-- % \" \u{0}x é"
        let row: [SQLiteValue] = [.integer(.min), .real(-0.5), .text(odd), .blob([0, 255, 1]), .null]
        try connection.prepare("INSERT INTO t VALUES (?, ?, ?, ?, ?)").run(row)
        try connection.prepare("INSERT INTO t VALUES (?, ?, ?, ?, ?)").run([.blob([]), .null, .null, .null, .null])
        let rows = try connection.prepare("SELECT * FROM t ORDER BY rowid").rows()
        #expect(rows[0] == row)
        #expect(rows[1][0] == .blob([]))
    }

    @Test func badSQLThrowsWithContextAndNoValues() throws {
        let connection = try Connection(path: ":memory:")
        let error = try #require(throws: SQLiteError.self) { try connection.prepare("SELEKT 1") }
        #expect(error.context == "prepare")
        #expect(error.description.contains("syntax error"))
    }

    @Test func aFailedTransactionWritesNothing() throws {
        let queue = try DatabaseQueue(path: temporaryPath())
        try queue.write { try $0.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)") }
        #expect(throws: SQLiteError.self) {
            try queue.write { db in
                try db.prepare("INSERT INTO t VALUES (1)").run()
                try db.prepare("INSERT INTO t VALUES (1)").run() // unique violation
            }
        }
        let count = try queue.read { try $0.prepare("SELECT count(*) FROM t").rows() }
        #expect(count == [[.integer(0)]])
    }

    /// Writes from many threads at once share commits; each caller gets its own result or error, a failing
    /// body undoes only its own rows, and a body whose interrupted write took the whole transaction with it
    /// (SQLite's rule) makes the others run again in a new one: every successful write is there exactly once.
    @Test func groupedWritesShareCommitsAndFailAlone() throws {
        let queue = try DatabaseQueue(path: temporaryPath())
        try queue.write { try $0.execute("CREATE TABLE t (x INTEGER PRIMARY KEY, v TEXT)") }
        let threads = 16, perThread = 40
        let outcomes = Mutex<[Int: Bool]>([:])
        let group = DispatchGroup()
        for thread in 0..<threads {
            group.enter()
            Thread {
                defer { group.leave() }
                for index in 0..<perThread {
                    let key = thread * 1_000 + index
                    let ok: Bool
                    do {
                        let written: Int = try queue.groupWrite { db in
                            try db.prepare("INSERT INTO t VALUES (\(key), 'a')").run()
                            // Every seventh write fails after writing: only its own row goes.
                            if key % 7 == 0 { try db.prepare("INSERT INTO t VALUES (\(key), 'again')").run() }
                            // Every 50th ends the whole transaction (as an interrupted write or a full disk does):
                            // it fails, and the writes before it in the group run again.
                            if key % 50 == 1 { try db.execute("ROLLBACK") }
                            return key
                        }
                        ok = written == key
                    } catch {
                        ok = false
                    }
                    outcomes.withLock { $0[key] = ok }
                }
            }.start()
        }
        #expect(group.wait(timeout: .now() + 60) == .success)
        // A write past its deadline (already passed) is refused before it runs.
        #expect(throws: SQLiteError.self) {
            try queue.groupWrite(deadline: 1) { db in try db.prepare("INSERT INTO t VALUES (-1, 'late')").run() }
        }
        let stored = Set(try queue.read { try $0.prepare("SELECT x FROM t").rows() }.map { $0[0].integer })
        let succeeded = Set(outcomes.withLock { $0 }.filter(\.value).keys.map(Int64.init))
        #expect(stored == succeeded)
        var expected = 0
        for thread in 0..<threads {
            for index in 0..<perThread where (thread * 1_000 + index) % 7 != 0 && (thread * 1_000 + index) % 50 != 1 {
                expected += 1
            }
        }
        #expect(succeeded.count == expected)
        let counts = queue.groupCommitCounts
        print("SQLiteTests: \(counts.writes) grouped writes in \(counts.groups) commits")
        let allWrites = threads * perThread + 1
        #expect(counts.writes == allWrites)
        #expect(counts.groups <= counts.writes)
    }

    /// `flushed: false` commits one transaction with synchronous=NORMAL (its writes are kept), also when it
    /// fails, and every other transaction stays at FULL.
    @Test func anUnflushedWriteCommitsAtNormalAndLeavesTheConnectionAtFull() throws {
        let path = temporaryPath()
        let queue = try DatabaseQueue(path: path)
        try queue.write { try $0.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)") }
        func synchronous(_ db: Connection) throws -> [[SQLiteValue]] { try db.prepare("PRAGMA synchronous").rows() }
        let during = try queue.write(flushed: false) { db in
            try db.prepare("INSERT INTO t VALUES (1)").run()
            return try synchronous(db)
        }
        #expect(during == [[.integer(1)]]) // NORMAL
        #expect(try queue.read { try synchronous($0) } == [[.integer(2)]]) // FULL again
        #expect(throws: SQLiteError.self) {
            try queue.write(flushed: false) { db in try db.prepare("INSERT INTO t VALUES (1)").run() }
        }
        #expect(try queue.read { try synchronous($0) } == [[.integer(2)]])
        #expect(try queue.write { try synchronous($0) } == [[.integer(2)]])
        queue.close()
        let reopened = try DatabaseQueue(path: path)
        #expect(try reopened.read { try $0.prepare("SELECT x FROM t").rows() } == [[.integer(1)]])
    }

    @Test func migrationsRunOnceInOrderAndRefuseNewerSchemas() throws {
        let path = temporaryPath()
        let migrator = Migrator([
            .init("create", sql: "CREATE TABLE zones (name TEXT PRIMARY KEY)"),
            .init("column", sql: "ALTER TABLE zones ADD COLUMN owner TEXT"),
        ])
        let connection = try Connection(path: path)
        #expect(try migrator.migrate(connection) == 2)
        #expect(try migrator.migrate(connection) == 0)
        #expect(try connection.userVersion == 2)
        try connection.prepare("INSERT INTO zones (name, owner) VALUES (?, ?)").run([.text("Lists"), .text("_a")])

        let older = Migrator([.init("create", sql: "CREATE TABLE zones (name TEXT PRIMARY KEY)")])
        #expect(throws: MigrationError.newerSchema(found: 2, known: 1)) { try older.migrate(connection) }
    }

    @Test func aBrokenMigrationLeavesTheSchemaAtAWholeVersion() throws {
        let connection = try Connection(path: temporaryPath())
        let migrator = Migrator([
            .init("create", sql: "CREATE TABLE a (x)"),
            .init("broken", sql: "CREATE TABLE b (x); CREATE TABLE a (x)"),
        ])
        #expect(throws: SQLiteError.self) { try migrator.migrate(connection) }
        #expect(try connection.userVersion == 1)
        let tables = try connection.prepare("SELECT name FROM sqlite_master WHERE name = 'b'").rows()
        #expect(tables.isEmpty)
    }
}
