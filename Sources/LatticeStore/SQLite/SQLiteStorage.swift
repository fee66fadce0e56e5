import CSQLite
import LatticeCore
import LatticeSQLite
import Foundation
import Synchronization

/// The embedded backend: one SQLite file in WAL mode with `synchronous=FULL`.
///
/// One writer connection (SQLite allows one writer at a time, so the zone and database logs are
/// allocated in commit order) behind its lock; a pool of read-only reader connections (WAL lets each see
/// a committed snapshot while a write is in progress, and several read at once); and one more read-only
/// connection for the `.authentication` lane, so a token lookup never waits for a long read or a write.
/// Every use honours the request's `RequestDeadline`: waiting for a connection ends at it, and a progress
/// handler interrupts statements past it (a write is then rolled back). Decisions about records, shares
/// and purging come from `StorageRules`; this type owns the SQL, the connections and the transactions.
public final class SQLiteStorage: Storage, Sendable {
    private let writer: DatabaseQueue
    private let readers: ConnectionPool
    private let authenticationReader: DatabaseQueue
    private let isClosed = Atomic<Bool>(false)
    private let path: String
    /// Asset bytes: files in `assets/` beside the database file.
    public let assetContents: any AssetContentStore

    /// The file name inside a data directory.
    public static let fileName = "lattice.sqlite"
    /// The directory of asset files inside a data directory.
    public static let assetDirectoryName = "assets"
    /// Reader connections of the general lane unless told otherwise.
    public static let defaultReaderConnections = 4

    /// Opens (creating and migrating if needed) the database at `path`, with `readerConnections` (at least 1)
    /// reader connections for the general lane besides the authentication reader.
    public init(path: String, busyTimeoutMilliseconds: Int32 = 5_000,
                readerConnections: Int = SQLiteStorage.defaultReaderConnections) throws {
        self.path = path
        assetContents = try AssetFileStore(directory: (path as NSString).deletingLastPathComponent + "/"
                                           + SQLiteStorage.assetDirectoryName)
        do {
            writer = try DatabaseQueue(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds)
            _ = try writer.read { connection in try SQLiteStorage.migrator.migrate(connection) }
            readers = try ConnectionPool(path: path, count: max(1, readerConnections),
                                         busyTimeoutMilliseconds: busyTimeoutMilliseconds)
            authenticationReader = try DatabaseQueue(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds,
                                                     readOnly: true)
        } catch let error as SQLiteError {
            throw StorageError.failure("cannot open \(path): \(error.description)")
        } catch let error as MigrationError {
            throw StorageError.failure("cannot open \(path): \(error.description)")
        }
    }

    /// Reader connections of the general lane.
    public var readerConnections: Int { readers.count }

    public func read<T>(deadline: RequestDeadline?, lane: ReadLane, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try checkOpen()
        return try mapErrors {
            switch lane {
            case .general:
                return try readers.read(deadline: deadline?.uptimeNanoseconds) { connection in
                    try connection.readTransaction(deadline: deadline?.uptimeNanoseconds) {
                        try body(SQLiteTransaction($0, readOnly: true))
                    }
                }
            case .authentication:
                return try authenticationReader.readTransaction(deadline: deadline?.uptimeNanoseconds) {
                    try body(SQLiteTransaction($0, readOnly: true))
                }
            }
        }
    }

    public func write<T>(deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try checkOpen()
        return try mapErrors {
            // Writes that arrive together share one commit (`DatabaseQueue.groupWrite`): one sync of the log for
            // the group, each body in its own savepoint.
            try writer.groupWrite(deadline: deadline?.uptimeNanoseconds) { connection in
                try body(SQLiteTransaction(connection, readOnly: false))
            }
        }
    }

    public func close() {
        isClosed.store(true, ordering: .sequentiallyConsistent)
        // Wait for in-flight work, then checkpoint the WAL so the file is whole on its own.
        try? writer.read { connection in try connection.execute("PRAGMA wal_checkpoint(TRUNCATE)") }
        writer.close()
        readers.close()
        authenticationReader.close()
    }

    /// The database file plus its WAL, from `stat` (no SQL, no lock).
    public func sizeOnDisk() throws -> Int64 {
        try checkOpen()
        var total: Int64 = 0
        for suffix in ["", "-wal"] {
            var info = stat()
            if stat(path + suffix, &info) == 0 { total += Int64(info.st_size) }
        }
        return total
    }

    private func checkOpen() throws {
        if isClosed.load(ordering: .sequentiallyConsistent) { throw StorageError.closed }
    }

    /// Reports SQLite's errors (from `BEGIN`, `COMMIT` or a closed connection) as `StorageError`.
    private func mapErrors<T>(_ body: () throws -> T) throws -> T {
        do {
            return try body()
        } catch let error as SQLiteError {
            // A call that passed `checkOpen` just before `close` finds its connection gone.
            if isClosed.load(ordering: .sequentiallyConsistent) { throw StorageError.closed }
            throw StorageError(error)
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
        Migrator.Migration("v2: record parents, shares, participants, link uses, share and shared-database logs", sql: """
            ALTER TABLE records ADD COLUMN parent_name TEXT;
            CREATE INDEX records_parent ON records(zone_id, parent_name) WHERE parent_name IS NOT NULL;
            CREATE TABLE shares(
                id INTEGER PRIMARY KEY AUTOINCREMENT,
                public_id TEXT NOT NULL UNIQUE,
                zone_id INTEGER NOT NULL REFERENCES zones(id),
                record_name TEXT NOT NULL,
                root_record_name TEXT,
                owner_id INTEGER NOT NULL REFERENCES users(id),
                title TEXT NOT NULL,
                public_permission TEXT NOT NULL,
                url_epoch INTEGER NOT NULL DEFAULT 1,
                deleted INTEGER NOT NULL DEFAULT 0,
                last_seq INTEGER NOT NULL DEFAULT 0,
                created_ms INTEGER NOT NULL);
            CREATE UNIQUE INDEX shares_live_record ON shares(zone_id, record_name) WHERE deleted = 0;
            CREATE TABLE share_participants(
                share_id INTEGER NOT NULL REFERENCES shares(id),
                user_id INTEGER NOT NULL REFERENCES users(id),
                role TEXT NOT NULL,
                permission TEXT NOT NULL,
                status TEXT NOT NULL,
                modified_ms INTEGER NOT NULL,
                PRIMARY KEY(share_id, user_id)) WITHOUT ROWID;
            CREATE INDEX share_participants_user ON share_participants(user_id, status);
            CREATE TABLE share_link_uses(
                token_id TEXT PRIMARY KEY,
                share_id INTEGER NOT NULL,
                uses INTEGER NOT NULL) WITHOUT ROWID;
            CREATE TABLE share_records(
                share_id INTEGER NOT NULL REFERENCES shares(id),
                record_name TEXT NOT NULL,
                member INTEGER NOT NULL,
                seq INTEGER NOT NULL,
                PRIMARY KEY(share_id, record_name)) WITHOUT ROWID;
            CREATE UNIQUE INDEX share_records_log ON share_records(share_id, seq);
            CREATE TABLE shared_zones(
                database_id INTEGER NOT NULL REFERENCES databases(id),
                share_id INTEGER NOT NULL REFERENCES shares(id),
                deleted INTEGER NOT NULL,
                db_seq INTEGER NOT NULL,
                PRIMARY KEY(database_id, share_id)) WITHOUT ROWID;
            CREATE INDEX shared_zones_log ON shared_zones(database_id, db_seq);
            """),
        Migrator.Migration("v3: token ids and expiry, the sign-up log, replay-cache charges", sql: """
            ALTER TABLE tokens ADD COLUMN id TEXT;
            UPDATE tokens SET id = lower(hex(randomblob(8)));
            CREATE UNIQUE INDEX tokens_id ON tokens(id);
            ALTER TABLE tokens ADD COLUMN expires_ms INTEGER;
            CREATE INDEX tokens_user ON tokens(user_id);
            CREATE TABLE signups(
                address TEXT NOT NULL,
                created_ms INTEGER NOT NULL);
            CREATE INDEX signups_address ON signups(address, created_ms);
            CREATE INDEX signups_age ON signups(created_ms);
            ALTER TABLE client_operations ADD COLUMN database_id INTEGER NOT NULL DEFAULT 0;
            ALTER TABLE client_operations ADD COLUMN charged_bytes INTEGER NOT NULL DEFAULT 0;
            CREATE INDEX client_operations_user ON client_operations(user_id, created_ms);
            """),
        // The replica id and clock a server kept in `metadata` before nodes existed become node `main`'s.
        Migrator.Migration("v4: nodes", sql: """
            CREATE TABLE nodes(
                name TEXT PRIMARY KEY,
                replica_id TEXT NOT NULL UNIQUE,
                clock_latest INTEGER NOT NULL DEFAULT 0,
                created_ms INTEGER NOT NULL) WITHOUT ROWID;
            INSERT INTO nodes(name, replica_id, clock_latest, created_ms)
                SELECT '\(SQLiteStorage.defaultNodeName)', value,
                       COALESCE((SELECT CAST(value AS INTEGER) FROM metadata WHERE key = 'clock_latest'), 0), 0
                FROM metadata WHERE key = 'replica_id';
            DELETE FROM metadata WHERE key IN ('replica_id', 'clock_latest');
            """),
        Migrator.Migration("v5: device names on tokens, device authorizations, failed device approvals", sql: """
            ALTER TABLE tokens ADD COLUMN name TEXT;
            CREATE TABLE device_authorizations(
                device_code_hash BLOB PRIMARY KEY,
                user_code_hash BLOB NOT NULL UNIQUE,
                address TEXT NOT NULL,
                device_name TEXT NOT NULL,
                status TEXT NOT NULL,
                user_id INTEGER,
                interval_seconds INTEGER NOT NULL,
                last_poll_ms INTEGER NOT NULL,
                created_ms INTEGER NOT NULL,
                expires_ms INTEGER NOT NULL) WITHOUT ROWID;
            CREATE INDEX device_authorizations_address ON device_authorizations(address, expires_ms);
            CREATE INDEX device_authorizations_expiry ON device_authorizations(expires_ms);
            CREATE TABLE device_approval_failures(
                key TEXT NOT NULL,
                created_ms INTEGER NOT NULL);
            CREATE INDEX device_approval_failures_key ON device_approval_failures(key, created_ms);
            CREATE INDEX device_approval_failures_age ON device_approval_failures(created_ms);
            """),
        // The purge's batches (`purge(before:operationsBeforeMs:limit:)`) find their rows through these, so a
        // batch reads about as many rows as it removes instead of scanning every record or share.
        Migrator.Migration("v6: indexes of the purge: tombstones by age, deleted zones, shares by zone", sql: """
            CREATE INDEX records_tombstones ON records(modified_ms) WHERE deleted = 1;
            CREATE INDEX zones_deleted ON zones(id) WHERE deleted = 1;
            CREATE INDEX shares_zone ON shares(zone_id);
            """),
        // `recordCount` and `childCount` (the unauthenticated share page's item count) count live records from
        // an index alone. Reading a row's `deleted`, which sits after `frame`, walks a large record's overflow
        // chain, so a count from the rows cost as much I/O as reading the records (300 records of 1 MiB: about
        // 110 ms, against well under 1 ms from the index). The two record indexes by type and by parent are
        // replaced by partial indexes of live records with `deleted` as a column (so that they cover
        // `deleted = 0`): every query that uses them reads live records only, a write updates as many indexes
        // as before, and tombstones leave both.
        Migrator.Migration("v7: the record indexes by type and by parent hold live records only, covering counts", sql: """
            DROP INDEX records_type;
            DROP INDEX records_parent;
            CREATE INDEX records_type ON records(zone_id, record_type, deleted, name) WHERE deleted = 0;
            CREATE INDEX records_parent ON records(zone_id, parent_name, deleted) WHERE deleted = 0 AND parent_name IS NOT NULL;
            """),
        // User names are unique whatever their case and look-alikes (`StorageRules.userNameKey`).
        Migrator.Migration("v8: user name keys", sql: StorageRules.userNameKeyMigration),
        // Passkeys, their ceremonies and recovery codes (Passkeys.swift).
        Migrator.Migration("v9: passkeys, passkey ceremonies, recovery codes",
                           sql: PasskeyTables.migration(blob: "BLOB", integer: "INTEGER")),
        // Accounts of OpenID Connect providers and their sign-ins under way (ExternalIdentities.swift).
        Migrator.Migration("v10: external identities, OpenID Connect sign-ins",
                           sql: IdentityTables.migration(blob: "BLOB", integer: "INTEGER")),
        // Short share links (ShortLinks.swift).
        Migrator.Migration("v11: short share links", sql: ShortLinkTables.migration(integer: "INTEGER", text: "TEXT")),
        Migrator.Migration("v12: subscriptions, notifications, push tokens",
                           sql: SubscriptionTables.migration(integer: "INTEGER", text: "TEXT", blob: "BLOB",
                                                             key: "INTEGER PRIMARY KEY AUTOINCREMENT")),
        // Assets: uploads, blobs, claims, references (Assets.swift); their bytes are files under assets/.
        Migrator.Migration("v13: assets", sql: AssetTables.migration(integer: "INTEGER", text: "TEXT", blob: "BLOB",
                                                                     key: "INTEGER PRIMARY KEY AUTOINCREMENT")),
    ])

    /// The node a SQLite deployment runs as (one process), unless told otherwise.
    public static let defaultNodeName = "main"

    /// The schema version this build creates.
    public static var schemaVersion: Int { migrator.latestVersion }
}

/// `StorageTransaction` over one SQLite connection inside an open transaction.
struct SQLiteTransaction: StorageTransaction, StorageBookkeeping, StorageRowMapping, PortableAssetSQL {
    typealias Column = SQLiteValue

    let db: Connection
    let isReadOnly: Bool
    /// The rows `prefetchRecords` read ahead, for this transaction only.
    private let prefetched = PrefetchedRecords()

    init(_ connection: Connection, readOnly: Bool) {
        db = connection
        isReadOnly = readOnly
    }

    // Every operation throws `StorageError`, so a caller inside a transaction never sees SQLite's errors.

    private func rows(_ sql: String, _ values: [SQLiteValue] = []) throws -> [[SQLiteValue]] {
        do { return try db.cached(sql).rows(values) } catch { throw StorageError(error) }
    }

    @discardableResult
    private func run(_ sql: String, _ values: [SQLiteValue] = []) throws -> Int {
        do { return try db.cached(sql).run(values) } catch { throw StorageError(error) }
    }

    private func execute(_ sql: String) throws {
        do { try db.execute(sql) } catch { throw StorageError(error) }
    }

    // MARK: Assets (Assets.swift: the SQL is shared)

    func assetRows(_ sql: String, _ values: [StorageValue]) throws -> [[SQLiteValue]] {
        try rows(sql, values.map(SQLiteValue.init))
    }

    func assetRun(_ sql: String, _ values: [StorageValue]) throws -> Int {
        try run(sql, values.map(SQLiteValue.init))
    }

    var assetLock: String { "" }

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
            try run("INSERT INTO users(record_name, name, created_ms, name_key) VALUES (?, ?, ?, ?)",
                    [.text(recordName), .text(name), .integer(nowMs), .text(StorageRules.userNameKey(name))])
        } catch StorageError.duplicate {
            throw StorageError.duplicate("a user named \(name)")
        }
        return UserAccount(id: db.lastInsertRowID, recordName: recordName, name: name, createdMs: nowMs)
    }

    func user(named name: String) throws -> UserAccount? {
        // The name as taken, else the one its key names (a name matches whatever its case and look-alikes).
        try rows("SELECT \(Self.userColumns) FROM users WHERE name = ? OR name_key = ? ORDER BY name = ? DESC LIMIT 1",
                 [.text(name), .text(StorageRules.userNameKey(name)), .text(name)]).first.map(user)
    }

    func user(recordName: String) throws -> UserAccount? {
        try rows("SELECT \(Self.userColumns) FROM users WHERE record_name = ?", [.text(recordName)]).first.map(user)
    }

    func user(id: Int64) throws -> UserAccount? {
        try rows("SELECT \(Self.userColumns) FROM users WHERE id = ?", [.integer(id)]).first.map(user)
    }

    func user(tokenHash: [UInt8]) throws -> UserAccount? {
        try rows("SELECT u.id, u.record_name, u.name, u.created_ms FROM tokens t JOIN users u ON u.id = t.user_id "
                 + "WHERE t.hash = ?", [.blob(tokenHash)]).first.map(user)
    }

    func insertToken(_ token: NewToken) throws {
        try run("INSERT INTO tokens(hash, id, user_id, created_ms, expires_ms, name) VALUES (?, ?, ?, ?, ?, ?)",
                [.blob(token.hash), .text(token.id), .integer(token.userID), .integer(token.createdMs),
                 token.expiresMs.map { .integer($0) } ?? .null, token.name.map { .text($0) } ?? .null])
    }

    private static let tokenColumns = "t.id, t.user_id, t.created_ms, t.expires_ms, t.name"

    private func token(_ row: [SQLiteValue]) -> StoredToken {
        var expires: Int64? = nil
        if case .integer(let value) = row[3] { expires = value }
        return StoredToken(id: row[0].text ?? "", userID: row[1].integer, createdMs: row[2].integer, expiresMs: expires,
                           name: row[4].text)
    }

    func tokenOwner(hash: [UInt8]) throws -> (token: StoredToken, user: UserAccount)? {
        try rows("SELECT \(Self.tokenColumns), u.id, u.record_name, u.name, u.created_ms FROM tokens t "
                 + "JOIN users u ON u.id = t.user_id WHERE t.hash = ?", [.blob(hash)]).first.map {
            (token(Array($0[0..<5])), user(Array($0[5...])))
        }
    }

    func tokens(userID: Int64) throws -> [StoredToken] {
        try rows("SELECT \(Self.tokenColumns) FROM tokens t WHERE t.user_id = ? ORDER BY t.created_ms, t.id",
                 [.integer(userID)]).map(token)
    }

    func token(id: String) throws -> StoredToken? {
        try rows("SELECT \(Self.tokenColumns) FROM tokens t WHERE t.id = ?", [.text(id)]).first.map(token)
    }

    func deleteToken(id: String) throws -> Bool {
        try run("DELETE FROM tokens WHERE id = ?", [.text(id)]) > 0
    }

    func extendToken(id: String, expiresMs: Int64) throws -> Bool {
        try run("UPDATE tokens SET expires_ms = ? WHERE id = ?", [.integer(expiresMs), .text(id)]) > 0
    }

    func deleteTokens(userID: Int64) throws -> Int {
        try run("DELETE FROM tokens WHERE user_id = ?", [.integer(userID)])
    }

    // MARK: Sign-ups

    func recordSignUp(address: String, nowMs: Int64) throws {
        try run("INSERT INTO signups(address, created_ms) VALUES (?, ?)", [.text(address), .integer(nowMs)])
    }

    func signUps(address: String?, sinceMs: Int64) throws -> SignUpWindow {
        let row: [SQLiteValue]?
        if let address {
            row = try rows("SELECT COUNT(*), MIN(created_ms) FROM signups WHERE address = ? AND created_ms >= ?",
                           [.text(address), .integer(sinceMs)]).first
        } else {
            row = try rows("SELECT COUNT(*), MIN(created_ms) FROM signups WHERE created_ms >= ?", [.integer(sinceMs)]).first
        }
        guard let row, row[0].integer > 0 else { return SignUpWindow(count: 0, oldestMs: nil) }
        return SignUpWindow(count: Int(row[0].integer), oldestMs: row[1].integer)
    }

    func forgetSignUps(before beforeMs: Int64) throws {
        try run("DELETE FROM signups WHERE created_ms < ?", [.integer(beforeMs)])
    }

    // MARK: Device authorizations

    func insertDeviceAuthorization(_ authorization: NewDeviceAuthorization) throws {
        let inserted = try run("INSERT INTO device_authorizations(\(Self.deviceColumns)) "
                               + "VALUES (?, ?, ?, ?, ?, NULL, ?, 0, ?, ?) ON CONFLICT DO NOTHING",
                               [.blob(authorization.deviceCodeHash), .blob(authorization.userCodeHash),
                                .text(authorization.address), .text(authorization.deviceName),
                                .text(DeviceAuthorizationStatus.pending.rawValue), .integer(authorization.intervalSeconds),
                                .integer(authorization.createdMs), .integer(authorization.expiresMs)])
        if inserted == 0 { throw StorageError.duplicate("a device authorization with this device or user code") }
    }

    func deviceAuthorization(deviceCodeHash: [UInt8]) throws -> StoredDeviceAuthorization? {
        try rows("SELECT \(Self.deviceColumns) FROM device_authorizations WHERE device_code_hash = ?",
                 [.blob(deviceCodeHash)]).first.map { try deviceAuthorization($0) }
    }

    func deviceAuthorization(userCodeHash: [UInt8]) throws -> StoredDeviceAuthorization? {
        try rows("SELECT \(Self.deviceColumns) FROM device_authorizations WHERE user_code_hash = ?",
                 [.blob(userCodeHash)]).first.map { try deviceAuthorization($0) }
    }

    func liveDeviceAuthorizations(address: String?, nowMs: Int64) throws -> Int {
        if let address {
            return Int(try rows("SELECT COUNT(*) FROM device_authorizations WHERE address = ? AND expires_ms > ?",
                                [.text(address), .integer(nowMs)]).first?[0].integer ?? 0)
        }
        return Int(try rows("SELECT COUNT(*) FROM device_authorizations WHERE expires_ms > ?", [.integer(nowMs)])
            .first?[0].integer ?? 0)
    }

    func decideDeviceAuthorization(userCodeHash: [UInt8], approve: Bool, userID: Int64, deviceName: String?,
                                   nowMs: Int64) throws -> Bool {
        let status: DeviceAuthorizationStatus = approve ? .approved : .denied
        return try run("UPDATE device_authorizations SET status = ?, user_id = ?, device_name = COALESCE(?, device_name) "
                       + "WHERE user_code_hash = ? AND status = ? AND expires_ms > ?",
                       [.text(status.rawValue), .integer(userID), deviceName.map { .text($0) } ?? .null,
                        .blob(userCodeHash), .text(DeviceAuthorizationStatus.pending.rawValue), .integer(nowMs)]) > 0
    }

    func recordDevicePoll(deviceCodeHash: [UInt8], nowMs: Int64, intervalSeconds: Int64) throws {
        try run("UPDATE device_authorizations SET last_poll_ms = ?, interval_seconds = ? WHERE device_code_hash = ?",
                [.integer(nowMs), .integer(intervalSeconds), .blob(deviceCodeHash)])
    }

    func claimDeviceAuthorization(deviceCodeHash: [UInt8], nowMs: Int64) throws -> StoredDeviceAuthorization? {
        try rows("UPDATE device_authorizations SET status = ? WHERE device_code_hash = ? AND status = ? AND expires_ms > ? "
                 + "RETURNING \(Self.deviceColumns)",
                 [.text(DeviceAuthorizationStatus.issued.rawValue), .blob(deviceCodeHash),
                  .text(DeviceAuthorizationStatus.approved.rawValue), .integer(nowMs)]).first.map { try deviceAuthorization($0) }
    }

    func forgetDeviceAuthorizations(expiredAt nowMs: Int64) throws -> Int {
        try run("DELETE FROM device_authorizations WHERE expires_ms <= ?", [.integer(nowMs)])
    }

    // MARK: External identities (ExternalIdentities.swift)

    func linkIdentity(issuer: String, subject: String, userID: Int64, nowMs: Int64) throws {
        let inserted = try run("INSERT INTO external_identities(issuer, subject, user_id, created_ms, last_used_ms) "
                               + "VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                               [.text(issuer), .text(subject), .integer(userID), .integer(nowMs), .integer(nowMs)])
        if inserted == 0 { throw StorageError.duplicate("an external identity linked already") }
    }

    func useIdentity(issuer: String, subject: String, nowMs: Int64) throws -> Int64? {
        try rows("UPDATE external_identities SET last_used_ms = ? WHERE issuer = ? AND subject = ? RETURNING user_id",
                 [.integer(nowMs), .text(issuer), .text(subject)]).first?.first?.integer
    }

    func identities(userID: Int64) throws -> Int {
        Int(try rows("SELECT COUNT(*) FROM external_identities WHERE user_id = ?", [.integer(userID)]).first?.first?.integer ?? 0)
    }

    func insertOIDCLogin(_ login: OIDCLogin) throws {
        let inserted = try run("INSERT INTO oidc_logins(\(Self.oidcLoginColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                               + "ON CONFLICT DO NOTHING",
                               [.blob(login.stateHash), .text(login.issuer), .text(login.nonce), .text(login.verifier),
                                .text(login.nextPath), login.linkUserID.map { .integer($0) } ?? .null, .text(login.address),
                                .integer(login.createdMs), .integer(login.expiresMs)])
        if inserted == 0 { throw StorageError.duplicate("an OpenID Connect sign-in with this state") }
    }

    func takeOIDCLogin(stateHash: [UInt8], nowMs: Int64) throws -> OIDCLogin? {
        try rows("DELETE FROM oidc_logins WHERE state_hash = ? AND expires_ms > ? RETURNING \(Self.oidcLoginColumns)",
                 [.blob(stateHash), .integer(nowMs)]).first.map(oidcLogin)
    }

    func liveOIDCLogins(address: String?, nowMs: Int64) throws -> Int {
        let found = if let address {
            try rows("SELECT COUNT(*) FROM oidc_logins WHERE address = ? AND expires_ms > ?", [.text(address), .integer(nowMs)])
        } else {
            try rows("SELECT COUNT(*) FROM oidc_logins WHERE expires_ms > ?", [.integer(nowMs)])
        }
        return Int(found.first?.first?.integer ?? 0)
    }

    func forgetOIDCLogins(expiredAt nowMs: Int64) throws -> Int {
        try run("DELETE FROM oidc_logins WHERE expires_ms <= ?", [.integer(nowMs)])
    }

    // MARK: Passkeys (Passkeys.swift)

    func insertPasskey(_ passkey: NewPasskey) throws {
        let inserted = try run("INSERT INTO passkeys(\(Self.passkeyColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, NULL) "
                               + "ON CONFLICT DO NOTHING",
                               [.blob(passkey.credentialID), .integer(passkey.userID), .blob(passkey.publicKey),
                                .integer(passkey.algorithm), .integer(passkey.signCount), .text(passkey.name), .integer(passkey.createdMs)])
        if inserted == 0 { throw StorageError.duplicate("a passkey with this credential id") }
    }

    func passkey(credentialID: [UInt8]) throws -> StoredPasskey? {
        try rows("SELECT \(Self.passkeyColumns) FROM passkeys WHERE credential_id = ?", [.blob(credentialID)]).first.map(passkey)
    }

    func passkeys(userID: Int64) throws -> [StoredPasskey] {
        try rows("SELECT \(Self.passkeyColumns) FROM passkeys WHERE user_id = ? ORDER BY created_ms, credential_id",
                 [.integer(userID)]).map(passkey)
    }

    func recordPasskeySignIn(credentialID: [UInt8], signCount: Int64, nowMs: Int64) throws -> Bool {
        try run("UPDATE passkeys SET sign_count = ?, last_used_ms = ? WHERE credential_id = ? AND (? = 0 OR sign_count < ?)",
                [.integer(signCount), .integer(nowMs), .blob(credentialID), .integer(signCount), .integer(signCount)]) > 0
    }

    func renamePasskey(credentialID: [UInt8], userID: Int64, name: String) throws -> Bool {
        try run("UPDATE passkeys SET name = ? WHERE credential_id = ? AND user_id = ?",
                [.text(name), .blob(credentialID), .integer(userID)]) > 0
    }

    func deletePasskey(credentialID: [UInt8], userID: Int64) throws -> Bool {
        try run("DELETE FROM passkeys WHERE credential_id = ? AND user_id = ?", [.blob(credentialID), .integer(userID)]) > 0
    }

    func insertPasskeyCeremony(_ ceremony: PasskeyCeremony) throws {
        let inserted = try run("INSERT INTO passkey_ceremonies(\(Self.ceremonyColumns)) VALUES (?, ?, ?, ?, ?, ?, ?) "
                               + "ON CONFLICT DO NOTHING",
                               [.blob(ceremony.challengeHash), .text(ceremony.purpose.rawValue),
                                ceremony.userID.map { .integer($0) } ?? .null, .text(ceremony.address),
                                ceremony.name.map { .text($0) } ?? .null, .integer(ceremony.createdMs), .integer(ceremony.expiresMs)])
        if inserted == 0 { throw StorageError.duplicate("a passkey ceremony with this challenge") }
    }

    func takePasskeyCeremony(challengeHash: [UInt8], nowMs: Int64) throws -> PasskeyCeremony? {
        try rows("DELETE FROM passkey_ceremonies WHERE challenge_hash = ? AND expires_ms > ? RETURNING \(Self.ceremonyColumns)",
                 [.blob(challengeHash), .integer(nowMs)]).first.map { try ceremony($0) }
    }

    func livePasskeyCeremonies(address: String?, nowMs: Int64) throws -> Int {
        let found = if let address {
            try rows("SELECT COUNT(*) FROM passkey_ceremonies WHERE address = ? AND expires_ms > ?", [.text(address), .integer(nowMs)])
        } else {
            try rows("SELECT COUNT(*) FROM passkey_ceremonies WHERE expires_ms > ?", [.integer(nowMs)])
        }
        return Int(found.first?.first?.integer ?? 0)
    }

    func forgetPasskeyCeremonies(expiredAt nowMs: Int64) throws -> Int {
        try run("DELETE FROM passkey_ceremonies WHERE expires_ms <= ?", [.integer(nowMs)])
    }

    func replaceRecoveryCodes(userID: Int64, hashes: [[UInt8]], nowMs: Int64) throws {
        try run("DELETE FROM recovery_codes WHERE user_id = ?", [.integer(userID)])
        for hash in hashes {
            try run("INSERT INTO recovery_codes(code_hash, user_id, created_ms, used_ms) VALUES (?, ?, ?, NULL)",
                    [.blob(hash), .integer(userID), .integer(nowMs)])
        }
    }

    func useRecoveryCode(hash: [UInt8], nowMs: Int64) throws -> Int64? {
        try rows("UPDATE recovery_codes SET used_ms = ? WHERE code_hash = ? AND used_ms IS NULL RETURNING user_id",
                 [.integer(nowMs), .blob(hash)]).first?.first?.integer
    }

    func unusedRecoveryCodes(userID: Int64) throws -> Int {
        Int(try rows("SELECT COUNT(*) FROM recovery_codes WHERE user_id = ? AND used_ms IS NULL", [.integer(userID)]).first?.first?.integer ?? 0)
    }

    func recordDeviceApprovalFailure(key: String, nowMs: Int64) throws {
        try run("INSERT INTO device_approval_failures(key, created_ms) VALUES (?, ?)", [.text(key), .integer(nowMs)])
    }

    func deviceApprovalFailures(key: String, sinceMs: Int64) throws -> SignUpWindow {
        guard let row = try rows("SELECT COUNT(*), MIN(created_ms) FROM device_approval_failures "
                                 + "WHERE key = ? AND created_ms >= ?", [.text(key), .integer(sinceMs)]).first,
              row[0].integer > 0 else { return SignUpWindow(count: 0, oldestMs: nil) }
        return SignUpWindow(count: Int(row[0].integer), oldestMs: row[1].integer)
    }

    func forgetDeviceApprovalFailures(before beforeMs: Int64) throws {
        try run("DELETE FROM device_approval_failures WHERE created_ms < ?", [.integer(beforeMs)])
    }

    // MARK: Databases and zones

    func database(_ key: DatabaseKey) throws -> StoredDatabase {
        let select = "SELECT \(Self.databaseColumns) FROM databases WHERE kind = ? AND environment = ? AND owner_id = ?"
        let arguments: [SQLiteValue] = [.text(key.kind.rawValue), .text(key.environment), .integer(key.ownerID)]
        if let row = try rows(select, arguments).first { return try database(row) }
        // Only a write transaction can create it; a read sees an empty database that does not exist yet.
        if isReadOnly {
            return StoredDatabase(id: 0, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0)
        }
        try run("INSERT INTO databases(kind, environment, owner_id) VALUES (?, ?, ?)", arguments)
        return StoredDatabase(id: db.lastInsertRowID, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0)
    }

    func database(id: Int64) throws -> StoredDatabase? {
        try rows("SELECT \(Self.databaseColumns) FROM databases WHERE id = ?", [.integer(id)]).first.map { try database($0) }
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
    func nextDatabaseSeq(_ databaseID: Int64) throws -> Int64 {
        let rows = try rows("UPDATE databases SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq",
                            [.integer(databaseID)])
        guard let seq = rows.first?[0].integer else { throw StorageError.failure("database \(databaseID) is missing") }
        return seq
    }

    // createZone and deleteZone: StorageBookkeeping, over these.

    func insertZoneRow(databaseID: Int64, name: String, ownerRecordName: String, databaseSeq: Int64, nowMs: Int64)
        throws -> Int64? {
        do {
            try run("INSERT INTO zones(database_id, name, owner_record_name, db_seq, created_ms, modified_ms) "
                    + "VALUES (?, ?, ?, ?, ?, ?)",
                    [.integer(databaseID), .text(name), .text(ownerRecordName), .integer(databaseSeq), .integer(nowMs),
                     .integer(nowMs)])
        } catch StorageError.duplicate {
            return nil
        }
        return db.lastInsertRowID
    }

    func deleteRecordRows(zoneRowID: Int64) throws -> Int64 {
        let freed = try rows("SELECT COALESCE(SUM(LENGTH(frame)), 0) FROM records WHERE zone_id = ?",
                             [.integer(zoneRowID)]).first?[0].integer ?? 0
        try run("DELETE FROM records WHERE zone_id = ?", [.integer(zoneRowID)])
        return freed
    }

    func markZoneRowDeleted(_ zone: StoredZone, databaseSeq: Int64, nowMs: Int64) throws {
        try run("UPDATE zones SET deleted = 1, db_seq = ?, modified_ms = ? WHERE id = ?",
                [.integer(databaseSeq), .integer(nowMs), .integer(zone.rowID)])
    }

    func releaseBytes(_ bytes: Int64, databaseID: Int64) throws {
        try run("UPDATE databases SET bytes_used = bytes_used - ? WHERE id = ?", [.integer(bytes), .integer(databaseID)])
    }

    func zoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [StoredZone] {
        try rows("SELECT \(Self.zoneColumns) FROM zones WHERE database_id = ? AND db_seq > ? ORDER BY db_seq LIMIT ?",
                 [.integer(databaseID), .integer(cursor), .integer(Int64(limit))]).map(zone)
    }

    // MARK: Records

    private static let recordSQL = "SELECT \(recordColumns) FROM records WHERE zone_id = ? AND name = ?"

    /// One primary-key lookup per planned record of a batch, bound value by value, unless `prefetchRecords`
    /// read the row (or its absence) ahead and the connection has changed nothing since.
    func record(zoneRowID: Int64, name: String) throws -> StoredRecord? {
        if let answer = prefetched.answer(zoneRowID: zoneRowID, name: name, changes: db.totalChanges) { return answer }
        do {
            let select = try db.cached(Self.recordSQL)
            try select.reset()
            try select.bind(1, integer: zoneRowID)
            try select.bind(2, text: name)
            guard try select.step() else { return nil }
            let row = select.row()
            try select.runBound() // the key is unique: steps to the end and releases the statement
            return record(row, zoneRowID: zoneRowID)
        } catch {
            throw StorageError(error)
        }
    }

    private static let recordRangeSQL = "SELECT \(recordColumns) FROM records WHERE zone_id = ? AND name >= ? AND name <= ? "
        + "ORDER BY name LIMIT ?"

    /// Reads the rows of a batch's names in one range read of the primary key, from the smallest name to the
    /// largest, when that range holds at most twice as many rows as there are names (it stops reading
    /// there: a batch whose names are spread over a large zone keeps its lookups one by one). A batch of new
    /// names after the zone's last one (a device's backlog) costs one probe instead of one per name.
    func prefetchRecords(zoneRowID: Int64, names: [String]) throws {
        prefetched.clear()
        // Names compare as SQLite compares them, byte by byte (Swift's `<` on String follows canonical
        // equivalence, which can order and even equate names that SQLite keeps apart).
        let keys = names.map { Array($0.utf8) }
        guard keys.count > 1, let first = keys.min(by: { $0.lexicographicallyPrecedes($1) }),
              let last = keys.max(by: { $0.lexicographicallyPrecedes($1) }) else { return }
        let limit = 2 * names.count
        var rows: [[UInt8]: StoredRecord] = [:]
        do {
            let select = try db.cached(Self.recordRangeSQL)
            try select.reset()
            try select.bind(1, integer: zoneRowID)
            try select.bind(2, text: String(decoding: first, as: UTF8.self))
            try select.bind(3, text: String(decoding: last, as: UTF8.self))
            try select.bind(4, integer: Int64(limit + 1))
            var read = 0
            while try select.step() {
                read += 1
                guard read <= limit else {
                    try select.reset()
                    return
                }
                let row = record(select.row(), zoneRowID: zoneRowID)
                rows[Array(row.recordName.utf8)] = row
            }
        } catch {
            throw StorageError(error)
        }
        prefetched.fill(zoneRowID: zoneRowID, names: Set(keys), rows: rows, changes: db.totalChanges)
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

    func forEachRecord(zoneRowID: Int64, recordType: String?, _ body: (StoredRecord) throws -> Bool) throws {
        var sql = "SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND deleted = 0 "
        var values: [SQLiteValue] = [.integer(zoneRowID)]
        if let recordType {
            sql += "AND record_type = ? "
            values.append(.text(recordType))
        }
        try streamRecords(sql + "ORDER BY name", values, zoneRowID: zoneRowID, body)
    }

    func forEachRecordChange(zoneRowID: Int64, after cursor: Int64, limit: Int,
                             _ body: (StoredRecord) throws -> Bool) throws {
        try streamRecords("SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                          [.integer(zoneRowID), .integer(cursor), .integer(Int64(limit))], zoneRowID: zoneRowID, body)
    }

    /// Steps through the record rows of `sql` one at a time, until `body` returns false.
    private func streamRecords(_ sql: String, _ values: [SQLiteValue], zoneRowID: Int64,
                               _ body: (StoredRecord) throws -> Bool) throws {
        // A statement of its own (not the cached one): `body` may run other statements meanwhile.
        let statement: Statement
        do {
            statement = try db.prepare(sql)
            try statement.bind(values)
        } catch {
            throw StorageError(error)
        }
        while true {
            let hasRow: Bool
            do { hasRow = try statement.step() } catch { throw StorageError(error) }
            guard hasRow, try body(record(statement.row(), zoneRowID: zoneRowID)) else { return }
        }
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
        let saved = try insertRecord(zoneRowID: zoneRowID, write, previous: previous, seq: seq)
        let growth = Int64(write.frame.count) - Int64(previous?.frame.count ?? 0)
        try run("UPDATE databases SET bytes_used = bytes_used + ? WHERE id = ?", [.integer(growth), .integer(zone.databaseID)])
        return saved
    }

    func saveRecords(zoneRowID: Int64, _ writes: [RecordWrite], previous: [StoredRecord?]) throws -> [StoredRecord] {
        precondition(previous.count == writes.count, "one previous row (or nil) per write")
        guard writes.count > 1 else { return try writes.map { try saveRecord(zoneRowID: zoneRowID, $0) } }
        guard let zone = try zone(rowID: zoneRowID), !zone.deleted else {
            throw StorageError.failure("zone \(zoneRowID) is not live")
        }
        // The counters move once: n consecutive zone positions, one database position.
        let nowMs = writes.map(\.nowMs).max()!
        let seqRows = try rows("UPDATE zones SET last_seq = last_seq + ?, modified_ms = ? WHERE id = ? RETURNING last_seq",
                               [.integer(Int64(writes.count)), .integer(nowMs), .integer(zoneRowID)])
        guard let last = seqRows.first?[0].integer else { throw StorageError.failure("zone \(zoneRowID) is missing") }
        let databaseSeq = try nextDatabaseSeq(zone.databaseID)
        try run("UPDATE zones SET db_seq = ? WHERE id = ?", [.integer(databaseSeq), .integer(zoneRowID)])
        var saved: [StoredRecord] = []
        saved.reserveCapacity(writes.count)
        var growth: Int64 = 0
        let insert = try insertStatement()
        for (index, (write, previous)) in zip(writes, previous).enumerated() {
            let seq = last - Int64(writes.count - 1 - index)
            saved.append(try insertRecord(zoneRowID: zoneRowID, write, previous: previous, seq: seq, statement: insert))
            growth += Int64(write.frame.count) - Int64(previous?.frame.count ?? 0)
        }
        try run("UPDATE databases SET bytes_used = bytes_used + ? WHERE id = ?", [.integer(growth), .integer(zone.databaseID)])
        return saved
    }

    private static let insertRecordSQL = """
        INSERT INTO records(zone_id, name, record_type, frame, deleted, seq, created_ms, created_by, modified_ms,
                            modified_by, parent_name)
        VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
        ON CONFLICT(zone_id, name) DO UPDATE SET record_type = excluded.record_type, frame = excluded.frame,
            deleted = excluded.deleted, seq = excluded.seq, created_ms = excluded.created_ms,
            created_by = excluded.created_by, modified_ms = excluded.modified_ms,
            modified_by = excluded.modified_by, parent_name = excluded.parent_name
        """

    /// The prepared insert of `insertRecord`, looked up once per batch.
    private func insertStatement() throws -> Statement {
        do { return try db.cached(Self.insertRecordSQL) } catch { throw StorageError(error) }
    }

    /// Writes one record row at position `seq` (the counters are the caller's), bound value by value.
    private func insertRecord(zoneRowID: Int64, _ write: RecordWrite, previous: StoredRecord?, seq: Int64,
                              statement: Statement? = nil) throws -> StoredRecord {
        let (createdMs, createdBy) = StorageRules.creation(of: write, replacing: previous)
        let insert = try statement ?? insertStatement()
        do {
            try insert.reset()
            try insert.bind(1, integer: zoneRowID)
            try insert.bind(2, text: write.recordName)
            try insert.bind(3, text: write.recordType)
            try insert.bind(4, blob: write.frame)
            try insert.bind(5, integer: write.deleted ? 1 : 0)
            try insert.bind(6, integer: seq)
            try insert.bind(7, integer: createdMs)
            try insert.bind(8, text: createdBy)
            try insert.bind(9, integer: write.nowMs)
            try insert.bind(10, text: write.userRecordName)
            if let parent = write.parentName { try insert.bind(11, text: parent) } else { try insert.bindNull(11) }
            try insert.runBound()
        } catch {
            throw StorageError(error)
        }
        return StoredRecord(recordName: write.recordName, recordType: write.recordType, frame: write.frame,
                            deleted: write.deleted, seq: seq, changeTag: StorageRules.changeTag(zoneRowID: zoneRowID, seq: seq),
                            createdMs: createdMs, createdBy: createdBy, modifiedMs: write.nowMs,
                            modifiedBy: write.userRecordName, parentName: write.parentName)
    }

    func recordChanges(zoneRowID: Int64, after cursor: Int64, limit: Int) throws -> [StoredRecord] {
        try rows("SELECT \(Self.recordColumns) FROM records WHERE zone_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                 [.integer(zoneRowID), .integer(cursor), .integer(Int64(limit))]).map { record($0, zoneRowID: zoneRowID) }
    }

    func children(zoneRowID: Int64, parentName: String) throws -> [String] {
        try rows("SELECT name FROM records WHERE zone_id = ? AND parent_name = ? AND deleted = 0 ORDER BY name",
                 [.integer(zoneRowID), .text(parentName)]).compactMap { $0[0].text }
    }

    // `INDEXED BY` the covering partial indexes of schema v7: the planner's cost model does not see that reading
    // `deleted` from the table walks a large record's overflow pages, and would pick the primary key; with
    // INDEXED BY a count never touches a record's row (and fails loudly if the index could not serve it).
    static let countOfType = "SELECT COUNT(*) FROM records INDEXED BY records_type "
        + "WHERE zone_id = ? AND record_type = ? AND deleted = 0"
    static let countOfAllTypes = "SELECT COUNT(*) FROM records INDEXED BY records_type "
        + "WHERE zone_id = ? AND deleted = 0"
    static let countOfChildren = "SELECT COUNT(*) FROM records INDEXED BY records_parent "
        + "WHERE zone_id = ? AND parent_name = ? AND deleted = 0"

    func recordCount(zoneRowID: Int64, recordType: String?) throws -> Int {
        let found = if let recordType {
            try rows(Self.countOfType, [.integer(zoneRowID), .text(recordType)])
        } else {
            try rows(Self.countOfAllTypes, [.integer(zoneRowID)])
        }
        return Int(found.first?[0].integer ?? 0)
    }

    func childCount(zoneRowID: Int64, parentName: String) throws -> Int {
        Int(try rows(Self.countOfChildren, [.integer(zoneRowID), .text(parentName)]).first?[0].integer ?? 0)
    }

    // MARK: Shares

    func insertShare(_ new: NewShare) throws -> StoredShare {
        do {
            try run("INSERT INTO shares(public_id, zone_id, record_name, root_record_name, owner_id, title, public_permission, "
                    + "url_epoch, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [.text(new.publicID), .integer(new.zoneRowID), .text(new.recordName),
                     new.rootRecordName.map { .text($0) } ?? .null, .integer(new.ownerID), .text(new.title),
                     .text(new.publicPermission.rawValue), .integer(new.urlEpoch), .integer(new.nowMs)])
        } catch StorageError.duplicate {
            throw StorageError.duplicate("a share record named \(new.recordName)")
        }
        return StoredShare(id: db.lastInsertRowID, publicID: new.publicID, zoneRowID: new.zoneRowID,
                           recordName: new.recordName, rootRecordName: new.rootRecordName, ownerID: new.ownerID,
                           title: new.title, publicPermission: new.publicPermission, urlEpoch: new.urlEpoch, deleted: false,
                           lastSeq: 0)
    }

    func share(publicID: String) throws -> StoredShare? {
        try rows("SELECT \(Self.shareColumns) FROM shares WHERE public_id = ?", [.text(publicID)]).first.map(share)
    }

    func share(id: Int64) throws -> StoredShare? {
        try rows("SELECT \(Self.shareColumns) FROM shares WHERE id = ?", [.integer(id)]).first.map(share)
    }

    func shares(zoneRowID: Int64) throws -> [StoredShare] {
        try rows("SELECT \(Self.shareColumns) FROM shares WHERE zone_id = ? AND deleted = 0 ORDER BY id",
                 [.integer(zoneRowID)]).map(share)
    }

    func updateShare(_ share: StoredShare) throws {
        try run("UPDATE shares SET title = ?, public_permission = ?, url_epoch = ?, deleted = ? WHERE id = ?",
                [.text(share.title), .text(share.publicPermission.rawValue), .integer(share.urlEpoch),
                 .integer(share.deleted ? 1 : 0), .integer(share.id)])
    }

    func participants(shareID: Int64) throws -> [StoredParticipant] {
        try rows("SELECT share_id, user_id, role, permission, status, modified_ms FROM share_participants "
                 + "WHERE share_id = ? ORDER BY user_id", [.integer(shareID)]).map(participant)
    }

    func saveParticipant(_ p: StoredParticipant) throws {
        try run("""
            INSERT INTO share_participants(share_id, user_id, role, permission, status, modified_ms) VALUES (?, ?, ?, ?, ?, ?)
            ON CONFLICT(share_id, user_id) DO UPDATE SET role = excluded.role, permission = excluded.permission,
                status = excluded.status, modified_ms = excluded.modified_ms
            """, [.integer(p.shareID), .integer(p.userID), .text(p.role.rawValue), .text(p.permission.rawValue), .text(p.status.rawValue),
                  .integer(p.modifiedMs)])
    }

    func participations(userID: Int64, status: AcceptanceStatus) throws -> [(share: StoredShare, participant: StoredParticipant)] {
        let columns = Self.qualified(Self.shareColumns, by: "s")
        return try rows("SELECT \(columns), p.share_id, p.user_id, p.role, p.permission, p.status, p.modified_ms "
                        + "FROM share_participants p JOIN shares s ON s.id = p.share_id "
                        + "WHERE p.user_id = ? AND p.status = ? AND s.deleted = 0 ORDER BY s.id",
                        [.integer(userID), .text(status.rawValue)]).map { row in
            (try share(Array(row[0..<11])), try participant(Array(row[11...])))
        }
    }

    func linkUses(tokenID: String) throws -> Int {
        Int(try rows("SELECT uses FROM share_link_uses WHERE token_id = ?", [.text(tokenID)]).first?[0].integer ?? 0)
    }

    func recordLinkUse(tokenID: String, shareID: Int64) throws {
        try run("INSERT INTO share_link_uses(token_id, share_id, uses) VALUES (?, ?, 1) "
                + "ON CONFLICT(token_id) DO UPDATE SET uses = uses + 1", [.text(tokenID), .integer(shareID)])
    }

    func insertShortLink(code: String, shareID: Int64, token: String, nowMs: Int64) throws {
        let inserted = try run("INSERT INTO share_short_links(code, share_id, token, created_ms) VALUES (?, ?, ?, ?) "
                               + "ON CONFLICT DO NOTHING", [.text(code), .integer(shareID), .text(token), .integer(nowMs)])
        if inserted == 0 { throw StorageError.duplicate("a short link with this code") }
    }

    func shortLink(code: String) throws -> (shareID: Int64, token: String)? {
        try rows("SELECT share_id, token FROM share_short_links WHERE code = ?", [.text(code)]).first.map {
            (shareID: $0[0].integer, token: $0[1].text ?? "")
        }
    }

    func pruneShortLinks(shareID: Int64, keeping: Int) throws -> Int {
        try run("DELETE FROM share_short_links WHERE share_id = ? AND code NOT IN (SELECT code FROM share_short_links "
                + "WHERE share_id = ? ORDER BY created_ms DESC, code LIMIT ?)",
                [.integer(shareID), .integer(shareID), .integer(Int64(max(0, keeping)))])
    }

    // MARK: Subscriptions (Subscriptions.swift)

    func insertSubscription(_ subscription: StoredSubscription) throws -> StoredSubscription {
        let values = subscriptionValues(subscription, integer: SQLiteValue.integer, text: SQLiteValue.text,
                                        bytes: SQLiteValue.blob, null: .null)
        let inserted = try run("INSERT INTO subscriptions(\(Self.subscriptionColumns.dropFirst(4))) VALUES "
                               + "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", values)
        if inserted == 0 { throw StorageError.duplicate("a subscription named \(subscription.name)") }
        var stored = subscription
        stored.rowID = db.lastInsertRowID
        return stored
    }

    func updateSubscription(_ subscription: StoredSubscription) throws -> Bool {
        let values = subscriptionValues(subscription, integer: SQLiteValue.integer, text: SQLiteValue.text,
                                        bytes: SQLiteValue.blob, null: .null)
        return try run("UPDATE subscriptions SET kind = ?, zone_name = ?, zone_owner = ?, record_type = ?, fires_on = ?, "
                       + "fires_once = ?, definition = ?, webhook_url = ?, webhook_secret = ?, modified_ms = ? WHERE id = ?",
                       Array(values[3..<12]) + [values[13], .integer(subscription.rowID)]) > 0
    }

    func deleteSubscription(rowID: Int64, keepingNotifications: Bool) throws -> Bool {
        if !keepingNotifications { try run("DELETE FROM notifications WHERE subscription_id = ?", [.integer(rowID)]) }
        return try run("DELETE FROM subscriptions WHERE id = ?", [.integer(rowID)]) > 0
    }

    func subscription(databaseID: Int64, name: String) throws -> StoredSubscription? {
        try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE database_id = ? AND name = ?",
                 [.integer(databaseID), .text(name)]).first.map(subscription)
    }

    func subscription(rowID: Int64) throws -> StoredSubscription? {
        try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE id = ?", [.integer(rowID)]).first.map(subscription)
    }

    func subscriptions(databaseID: Int64, limit: Int) throws -> [StoredSubscription] {
        try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE database_id = ? ORDER BY name LIMIT ?",
                 [.integer(databaseID), .integer(Int64(max(0, limit)))]).map(subscription)
    }

    func subscriptionCount(databaseID: Int64) throws -> Int {
        Int(try rows("SELECT count(*) FROM subscriptions WHERE database_id = ?", [.integer(databaseID)]).first?[0].integer ?? 0)
    }

    func subscriptions(databaseIDs: [Int64]) throws -> [StoredSubscription] {
        guard !databaseIDs.isEmpty else { return [] }
        let marks = Array(repeating: "?", count: databaseIDs.count).joined(separator: ", ")
        return try rows("SELECT \(Self.subscriptionColumns) FROM subscriptions WHERE database_id IN (\(marks)) ORDER BY id",
                        databaseIDs.map(SQLiteValue.integer)).map(subscription)
    }

    func raiseNotifications(_ triggers: [NotificationTrigger], origin: String?) throws -> [Int64: Int64] {
        var counts: [Int64: Int64] = [:]
        var order: [Int64] = []
        for trigger in triggers {
            if counts[trigger.userID] == nil { order.append(trigger.userID) }
            counts[trigger.userID, default: 0] += 1
        }
        var next: [Int64: Int64] = [:]
        var last: [Int64: Int64] = [:]
        for user in order {
            let top = try rows("INSERT INTO notification_counters(user_id, last_seq) VALUES (?, ?) ON CONFLICT(user_id) "
                               + "DO UPDATE SET last_seq = last_seq + excluded.last_seq RETURNING last_seq",
                               [.integer(user), .integer(counts[user]!)]).first?[0].integer ?? 0
            next[user] = top - counts[user]! + 1
            last[user] = top
        }
        let originValue: SQLiteValue = origin.map(SQLiteValue.text) ?? .null
        for trigger in triggers {
            let seq = next[trigger.userID]!
            next[trigger.userID] = seq + 1
            try run("INSERT INTO notifications(\(Self.notificationColumns)) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 0) "
                    + "ON CONFLICT(subscription_id, zone_id) DO UPDATE SET "
                    + "run_after = CASE WHEN notifications.origin IS excluded.origin THEN notifications.run_after "
                    + "ELSE notifications.seq END, origin = excluded.origin, seq = excluded.seq, "
                    + "zone_name = excluded.zone_name, zone_owner = excluded.zone_owner",
                    triggerValues(trigger, integer: SQLiteValue.integer, text: SQLiteValue.text, null: .null)
                        + [.integer(seq), originValue])
        }
        return last
    }

    func notifications(userID: Int64, after cursor: Int64, limit: Int) throws -> [StoredNotification] {
        try rows("SELECT \(Self.notificationColumns) FROM notifications WHERE user_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                 [.integer(userID), .integer(cursor), .integer(Int64(max(0, limit)))]).map { try notification($0) }
    }

    func lastNotificationSeq(userID: Int64) throws -> Int64 {
        try rows("SELECT last_seq FROM notification_counters WHERE user_id = ?", [.integer(userID)]).first?[0].integer ?? 0
    }

    func insertPushToken(_ token: StoredPushToken) throws {
        let inserted = try run("INSERT INTO push_tokens(hash, user_id, device_token_id, environment, apns_environment, "
                               + "registered, created_ms) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                               [.blob(token.hash), .integer(token.userID), .text(token.deviceTokenID),
                                .text(token.environment), .text(token.apnsEnvironment),
                                .integer(token.registered ? 1 : 0), .integer(token.createdMs)])
        if inserted == 0 { throw StorageError.duplicate("a push token with this hash") }
    }

    func pushToken(hash: [UInt8], nowMs: Int64) throws -> StoredPushToken? {
        try rows("SELECT \(Self.pushTokenColumns) FROM push_tokens p JOIN tokens t ON t.id = p.device_token_id "
                 + "WHERE p.hash = ? AND (t.expires_ms IS NULL OR t.expires_ms > ?)",
                 [.blob(hash), .integer(nowMs)]).first.map(pushToken)
    }

    func registerPushToken(hash: [UInt8], userID: Int64) throws -> Bool {
        try run("UPDATE push_tokens SET registered = 1 WHERE hash = ? AND user_id = ?", [.blob(hash), .integer(userID)]) > 0
    }

    func prunePushTokens(deviceTokenID: String, keeping: Int) throws -> Int {
        try run("DELETE FROM push_tokens WHERE device_token_id = ? AND hash NOT IN (SELECT hash FROM push_tokens "
                + "WHERE device_token_id = ? ORDER BY created_ms DESC, hash LIMIT ?)",
                [.text(deviceTokenID), .text(deviceTokenID), .integer(Int64(max(0, keeping)))])
    }

    func forgetOrphanPushTokens(nowMs: Int64, limit: Int) throws -> Int {
        try run("DELETE FROM push_tokens WHERE hash IN (SELECT p.hash FROM push_tokens p LEFT JOIN tokens t "
                + "ON t.id = p.device_token_id WHERE t.id IS NULL OR (t.expires_ms IS NOT NULL AND t.expires_ms <= ?) "
                + "LIMIT ?)", [.integer(nowMs), .integer(Int64(max(0, limit)))])
    }

    func forgetOrphanNotifications(limit: Int) throws -> Int {
        try run("DELETE FROM notifications WHERE (subscription_id, zone_id) IN (SELECT n.subscription_id, n.zone_id "
                + "FROM notifications n LEFT JOIN subscriptions s ON s.id = n.subscription_id WHERE s.id IS NULL LIMIT ?)",
                [.integer(Int64(max(0, limit)))])
    }

    // MARK: Webhook deliveries (Subscriptions.swift)

    func enqueueDelivery(subscriptionRowID: Int64, userID: Int64, url: String, nowMs: Int64,
                         payload makePayload: (_ seq: Int64) throws -> [UInt8]) throws -> StoredDelivery {
        guard let seq = try rows("UPDATE subscriptions SET webhook_seq = webhook_seq + 1 WHERE id = ?1 RETURNING webhook_seq",
                                 [.integer(subscriptionRowID)]).first?[0].integer else {
            throw StorageError.failure("subscription \(subscriptionRowID) is missing")
        }
        let inserted = try rows("INSERT INTO webhook_deliveries(subscription_id, user_id, seq, url, payload, state, attempts, "
                                + "next_attempt_ms, claimed_until_ms, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, 'pending', 0, ?6, 0, ?6) "
                                + "RETURNING \(Self.deliveryColumns)",
                                [.integer(subscriptionRowID), .integer(userID), .integer(seq), .text(url), SQLiteValue.blob(try makePayload(seq)),
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
        try rows("UPDATE webhook_deliveries SET claimed_by = ?, claimed_until_ms = ?, attempts = attempts + 1 "
                 + "WHERE id IN (SELECT d.id FROM webhook_deliveries d WHERE d.state = 'pending' AND d.next_attempt_ms <= ?3 "
                 + "AND d.claimed_until_ms <= ?3 AND NOT EXISTS (SELECT 1 FROM webhook_deliveries e "
                 + "WHERE e.subscription_id = d.subscription_id AND e.state = 'pending' AND e.seq < d.seq) "
                 + "ORDER BY d.next_attempt_ms, d.id LIMIT ?4) RETURNING \(Self.deliveryColumns)",
                 [.text(node), .integer(nowMs + leaseMs), .integer(nowMs), .integer(Int64(max(0, limit)))]).map { try delivery($0) }
    }

    func finishDelivery(id: Int64, node: String, outcome: DeliveryOutcome, nowMs: Int64) throws -> Bool {
        let values = Self.outcomeValues(outcome, nowMs: nowMs)
        return try run("UPDATE webhook_deliveries SET state = ?1, last_status = ?2, last_error = ?3, "
                       + "next_attempt_ms = COALESCE(?4, next_attempt_ms), finished_ms = ?5, claimed_by = NULL, "
                       + "claimed_until_ms = 0 WHERE id = ?6 AND claimed_by = ?7",
                       [.text(values.state.rawValue), values.status.map(SQLiteValue.integer) ?? .null,
                        values.error.map(SQLiteValue.text) ?? .null, values.nextAttemptMs.map(SQLiteValue.integer) ?? .null,
                        values.finishedMs.map(SQLiteValue.integer) ?? .null, .integer(id), .text(node)]) > 0
    }

    func releaseDeliveryClaims(node: String) throws -> Int {
        try run("UPDATE webhook_deliveries SET claimed_by = NULL, claimed_until_ms = 0 WHERE claimed_by = ?1", [.text(node)])
    }

    func deliveries(subscriptionRowID: Int64, state: DeliveryState?, afterSeq: Int64, limit: Int) throws -> [StoredDelivery] {
        try rows("SELECT \(Self.deliveryColumns) FROM webhook_deliveries WHERE subscription_id = ?1 AND seq > ?2 "
                 + "AND (?3 IS NULL OR state = ?3) ORDER BY seq LIMIT ?4",
                 [.integer(subscriptionRowID), .integer(afterSeq), state.map { .text($0.rawValue) } ?? .null,
                  .integer(Int64(max(0, limit)))]).map { try delivery($0) }
    }

    func replayDeliveries(subscriptionRowID: Int64, seqs: [Int64]?, nowMs: Int64) throws -> Int {
        guard let seqs else {
            return try run("UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_ms = ?1, "
                           + "finished_ms = NULL WHERE subscription_id = ?2 AND state = 'failed'",
                           [.integer(nowMs), .integer(subscriptionRowID)])
        }
        var count = 0
        for seq in seqs {
            count += try run("UPDATE webhook_deliveries SET state = 'pending', attempts = 0, next_attempt_ms = ?1, "
                             + "finished_ms = NULL WHERE subscription_id = ?2 AND seq = ?3 AND state = 'failed'",
                             [.integer(nowMs), .integer(subscriptionRowID), .integer(seq)])
        }
        return count
    }

    func purgeDeliveries(finishedBefore beforeMs: Int64, limit: Int) throws -> Int {
        try run("DELETE FROM webhook_deliveries WHERE id IN (SELECT id FROM webhook_deliveries WHERE finished_ms IS NOT NULL "
                + "AND finished_ms < ?1 LIMIT ?2)", [.integer(beforeMs), .integer(Int64(max(0, limit)))])
    }

    func setShareMembership(shareID: Int64, recordName: String, member: Bool) throws {
        let seqRows = try rows("UPDATE shares SET last_seq = last_seq + 1 WHERE id = ? RETURNING last_seq", [.integer(shareID)])
        guard let seq = seqRows.first?[0].integer else { throw StorageError.failure("share \(shareID) is missing") }
        try run("INSERT INTO share_records(share_id, record_name, member, seq) VALUES (?, ?, ?, ?) "
                + "ON CONFLICT(share_id, record_name) DO UPDATE SET member = excluded.member, seq = excluded.seq",
                [.integer(shareID), .text(recordName), .integer(member ? 1 : 0), .integer(seq)])
    }

    func shareMembership(shareID: Int64, recordName: String) throws -> Bool? {
        try rows("SELECT member FROM share_records WHERE share_id = ? AND record_name = ?",
                 [.integer(shareID), .text(recordName)]).first.map { $0[0].integer != 0 }
    }

    func shareChanges(shareID: Int64, after cursor: Int64, limit: Int) throws -> [ShareLogEntry] {
        try rows("SELECT record_name, member, seq FROM share_records WHERE share_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                 [.integer(shareID), .integer(cursor), .integer(Int64(limit))]).map {
            ShareLogEntry(recordName: $0[0].text ?? "", member: $0[1].integer != 0, seq: $0[2].integer)
        }
    }

    func markSharedZone(databaseID: Int64, shareID: Int64, deleted: Bool) throws {
        let seq = try nextDatabaseSeq(databaseID)
        try run("INSERT INTO shared_zones(database_id, share_id, deleted, db_seq) VALUES (?, ?, ?, ?) "
                + "ON CONFLICT(database_id, share_id) DO UPDATE SET deleted = excluded.deleted, db_seq = excluded.db_seq",
                [.integer(databaseID), .integer(shareID), .integer(deleted ? 1 : 0), .integer(seq)])
    }

    func sharedZoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [SharedZoneEntry] {
        try rows("SELECT share_id, deleted, db_seq FROM shared_zones WHERE database_id = ? AND db_seq > ? "
                 + "ORDER BY db_seq LIMIT ?", [.integer(databaseID), .integer(cursor), .integer(Int64(limit))]).map {
            SharedZoneEntry(shareID: $0[0].integer, deleted: $0[1].integer != 0, databaseSeq: $0[2].integer)
        }
    }

    // MARK: Client operations

    func clientOperation(userID: Int64, operationID: String) throws -> ClientOperation? {
        try rows("SELECT request_hash, status, response FROM client_operations WHERE user_id = ? AND operation_id = ?",
                 [.integer(userID), .text(operationID)]).first.map {
            ClientOperation(requestHash: $0[0].blob, status: Int($0[1].integer), response: $0[2].blob)
        }
    }

    func saveClientOperation(userID: Int64, operationID: String, _ operation: ClientOperation, chargedTo databaseID: Int64,
                             nowMs: Int64) throws {
        let charged = databaseID == 0 ? 0 : operation.storedBytes(operationID: operationID)
        try run("INSERT INTO client_operations(user_id, operation_id, request_hash, status, response, created_ms, "
                + "database_id, charged_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [.integer(userID), .text(operationID), .blob(operation.requestHash), .integer(Int64(operation.status)),
                 .blob(operation.response), .integer(nowMs), .integer(databaseID), .integer(charged)])
        if charged != 0 {
            try run("UPDATE databases SET bytes_used = bytes_used + ? WHERE id = ?", [.integer(charged), .integer(databaseID)])
        }
    }

    func clientOperationCount(userID: Int64) throws -> Int {
        Int(try rows("SELECT COUNT(*) FROM client_operations WHERE user_id = ?", [.integer(userID)]).first?[0].integer ?? 0)
    }

    func forgetOldestClientOperations(userID: Int64, count: Int) throws -> Int {
        guard count > 0 else { return 0 }
        let oldest = try rows("SELECT operation_id, database_id, charged_bytes FROM client_operations WHERE user_id = ? "
                              + "ORDER BY created_ms, operation_id LIMIT ?", [.integer(userID), .integer(Int64(count))])
        for row in oldest {
            try run("DELETE FROM client_operations WHERE user_id = ? AND operation_id = ?", [.integer(userID), row[0]])
            if row[2].integer != 0 {
                try run("UPDATE databases SET bytes_used = bytes_used - ? WHERE id = ?", [row[2], row[1]])
            }
        }
        return oldest.count
    }

    // MARK: Nodes and copying

    func node(named name: String) throws -> StoredNode? {
        try rows("SELECT name, replica_id, clock_latest, created_ms FROM nodes WHERE name = ?", [.text(name)]).first.map {
            StoredNode(name: $0[0].text ?? "", replicaID: $0[1].text ?? "", clockLatest: $0[2].integer, createdMs: $0[3].integer)
        }
    }

    func insertNode(_ node: StoredNode) throws {
        try run("INSERT INTO nodes(name, replica_id, clock_latest, created_ms) VALUES (?, ?, ?, ?)",
                [.text(node.name), .text(node.replicaID), .integer(node.clockLatest), .integer(node.createdMs)])
    }

    func raiseNodeClock(name: String, to latest: Int64) throws {
        try run("UPDATE nodes SET clock_latest = MAX(clock_latest, ?) WHERE name = ?", [.integer(latest), .text(name)])
    }

    /// One writer at a time holds every lock there is.
    func tryExclusiveLock(_ name: String) throws -> Bool { true }

    func exportRows(table: String, _ body: ([[StorageValue]]) throws -> Void) throws {
        let (_, columns, order) = try StorageTables.table(table)
        let statement = try db.prepare("SELECT \(columns.joined(separator: ", ")) FROM \(table) ORDER BY \(order)")
        var batch: [[StorageValue]] = []
        while try statement.step() {
            batch.append(statement.row().map(\.neutral))
            if batch.count == 1_000 {
                try body(batch)
                batch.removeAll(keepingCapacity: true)
            }
        }
        if !batch.isEmpty { try body(batch) }
    }

    func insertRows(table: String, _ rows: [[StorageValue]]) throws {
        let columns = try StorageTables.table(table).columns
        let placeholders = Array(repeating: "?", count: columns.count).joined(separator: ", ")
        let statement = try db.cached("INSERT INTO \(table)(\(columns.joined(separator: ", "))) VALUES (\(placeholders))")
        for row in rows {
            guard row.count == columns.count else {
                throw StorageError.failure("a row of \(row.count) values for the \(columns.count) columns of \(table)")
            }
            _ = try statement.run(row.map(SQLiteValue.init))
        }
    }

    /// SQLite's AUTOINCREMENT counters follow the largest id inserted by themselves.
    func finishImport() throws {}

    func rowCount(table: String) throws -> Int {
        _ = try StorageTables.table(table)
        return Int(try rows("SELECT COUNT(*) FROM \(table)").first?[0].integer ?? 0)
    }

    // MARK: Savepoints and maintenance

    func savepoint<T>(_ body: () throws -> T) throws -> T {
        try execute("SAVEPOINT item")
        do {
            let result = try body()
            try execute("RELEASE item")
            return result
        } catch {
            try execute("ROLLBACK TO item")
            try execute("RELEASE item")
            throw error
        }
    }

    // The purge batch: StorageBookkeeping, over these. The one writer holds every lock, so nothing is skipped;
    // each kind is read through an index (tombstones by age, deleted zones by id, operations by age), so a
    // batch costs about `limit` rows however large the tables.

    func purgeTombstones(before horizonMs: Int64, limit: Int) throws -> (removed: Int, skipped: Bool) {
        // Oldest first: raise each zone's purged position to the newest one removed, give back their bytes.
        let tombstones = try rows("SELECT zone_id, name, seq, LENGTH(frame) FROM records "
                                  + "WHERE deleted = 1 AND modified_ms < ? ORDER BY modified_ms LIMIT ?",
                                  [.integer(horizonMs), .integer(Int64(limit))])
        var byZone: [Int64: (newest: Int64, bytes: Int64)] = [:]
        for row in tombstones {
            let zoneID = row[0].integer
            try run("DELETE FROM records WHERE zone_id = ? AND name = ?", [.integer(zoneID), row[1]])
            let held = byZone[zoneID] ?? (newest: 0, bytes: 0)
            byZone[zoneID] = (newest: max(held.newest, row[2].integer), bytes: held.bytes + row[3].integer)
        }
        for (zoneID, purged) in byZone.sorted(by: { $0.key < $1.key }) {
            try run("UPDATE zones SET purged_seq = MAX(purged_seq, ?) WHERE id = ?", [.integer(purged.newest), .integer(zoneID)])
            try run("UPDATE databases SET bytes_used = bytes_used - ? WHERE id = (SELECT database_id FROM zones WHERE id = ?)",
                    [.integer(purged.bytes), .integer(zoneID)])
        }
        return (tombstones.count, false)
    }

    func deletedZones(before horizonMs: Int64, after: Int64, limit: Int) throws -> [DeletedZone] {
        try rows("SELECT \(Self.zoneColumns), EXISTS(SELECT 1 FROM shares WHERE zone_id = zones.id) "
                 + "FROM zones WHERE deleted = 1 AND modified_ms < ? AND id > ? ORDER BY id LIMIT ?",
                 [.integer(horizonMs), .integer(after), .integer(Int64(limit))])
            .map { DeletedZone(zone: zone(Array($0[0..<10])), hasShares: $0[10].integer != 0) }
    }

    func deleteDeletedZoneRow(_ zone: StoredZone) throws -> Bool {
        try run("DELETE FROM zones WHERE id = ? AND deleted = 1", [.integer(zone.rowID)]) > 0
    }

    func raiseDatabasePurgedSeq(databaseID: Int64, to seq: Int64) throws {
        try run("UPDATE databases SET purged_seq = MAX(purged_seq, ?) WHERE id = ?", [.integer(seq), .integer(databaseID)])
    }

    func forgetClientOperations(before beforeMs: Int64, limit: Int) throws -> (examined: Int, removed: Int, skipped: Bool) {
        // Oldest first, giving back what they were charged.
        let operations = try rows("SELECT user_id, operation_id, database_id, charged_bytes FROM client_operations "
                                  + "WHERE created_ms < ? ORDER BY created_ms LIMIT ?",
                                  [.integer(beforeMs), .integer(Int64(limit))])
        var charges: [Int64: Int64] = [:]
        for row in operations {
            try run("DELETE FROM client_operations WHERE user_id = ? AND operation_id = ?", [row[0], row[1]])
            if row[2].integer != 0 { charges[row[2].integer, default: 0] += row[3].integer }
        }
        for (databaseID, bytes) in charges.sorted(by: { $0.key < $1.key }) {
            try releaseBytes(bytes, databaseID: databaseID)
        }
        return (operations.count, operations.count, false)
    }
}

extension StorageError {
    /// SQLite's error in the storage taxonomy: a taken unique key is `.duplicate`, a lock held past the
    /// busy timeout is `.busy`, a statement interrupted for the request deadline `.deadlineExceeded`, no
    /// room on the disk `.diskFull`, anything else a `.failure` for the logs.
    init(_ error: SQLiteError) {
        if error.isUniqueViolation {
            self = .duplicate(error.message)
        } else if error.isInterrupt {
            self = .deadlineExceeded
        } else if error.isBusy {
            self = .busy
        } else if error.isDiskFull {
            self = .diskFull
        } else {
            self = .failure(error.description)
        }
    }
}

extension SQLiteValue: StorageColumn {
    var bytes: [UInt8] { blob }
    var isNull: Bool { self == .null }
}

extension SQLiteValue {
    /// The neutral form of a value (a real never occurs in Lattice's tables; it is kept as text).
    var neutral: StorageValue {
        switch self {
        case .null: .null
        case .integer(let value): .integer(value)
        case .real(let value): .text(String(value))
        case .text(let value): .text(value)
        case .blob(let value): .blob(value)
        }
    }

    init(_ value: StorageValue) {
        switch value {
        case .null: self = .null
        case .integer(let value): self = .integer(value)
        case .text(let value): self = .text(value)
        case .blob(let value): self = .blob(value)
        }
    }
}

/// The rows of a batch read ahead by `SQLiteTransaction.prefetchRecords`: the answer of `record` for each
/// name asked for (a row, or none), valid while the connection's count of changed rows
/// (`sqlite3_total_changes64`) stays what it was when they were read, so any write in the transaction
/// drops them. Names are keyed by their UTF-8 bytes, as SQLite tells them apart. One per transaction, used
/// by its one thread.
final class PrefetchedRecords {
    private var zoneRowID: Int64 = -1
    private var changes: Int64 = -1
    private var names: Set<[UInt8]> = []
    private var rows: [[UInt8]: StoredRecord] = [:]

    func clear() {
        zoneRowID = -1
        names = []
        rows = [:]
    }

    func fill(zoneRowID: Int64, names: Set<[UInt8]>, rows: [[UInt8]: StoredRecord], changes: Int64) {
        self.zoneRowID = zoneRowID
        self.names = names
        self.rows = rows
        self.changes = changes
    }

    /// `.some(row or nil)` when the answer for `name` was read ahead and is still valid; nil otherwise.
    func answer(zoneRowID: Int64, name: String, changes: Int64) -> StoredRecord?? {
        guard zoneRowID == self.zoneRowID, changes == self.changes else { return nil }
        let key = Array(name.utf8)
        guard names.contains(key) else { return nil }
        return .some(rows[key])
    }
}
