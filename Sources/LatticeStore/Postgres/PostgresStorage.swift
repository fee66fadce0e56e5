import Foundation
import LatticeSQLite
import Synchronization

/// The shared backend: one PostgreSQL database that any number of `lattice serve` processes use at once.
///
/// A pool of connections (`poolSize`, default 2 × cores) serves reads and writes, each transaction on a
/// connection of its own; one more connection is kept for the `.authentication` lane, so a token lookup
/// never queues behind long work.
///
/// - Reads run in `REPEATABLE READ, READ ONLY` transactions: one consistent snapshot.
/// - Writes run in `READ COMMITTED` and take row locks (`FOR NO KEY UPDATE`) on every single-row read of a
///   database, zone, share, record or metadata key, so the server's read-check-write sequences (quotas,
///   participant caps, link-use limits, merges into a record) are serialized per row across processes, as
///   SQLite's single writer serializes them. A zone row is locked before its records.
/// - Log positions (zone, database, share and shared-database logs) are allocated with
///   `UPDATE ... SET last_seq = last_seq + n ... RETURNING` in the writing transaction: the counter row stays
///   locked to commit, so positions become visible in allocation order.
/// - A serialization failure (40001) or deadlock (40P01) runs the whole transaction body again, up to
///   `maximumConflictRetries` times with jittered backoff, then fails with `StorageError.busy`. A lost
///   connection is dropped (with every idle one) and the transaction runs once more on a new connection if
///   nothing could have been committed; a connection lost during `COMMIT` fails with `.busy` (it may or may
///   not have committed, so it is never reported as a success). A database that stays unreachable gives
///   `.busy`.
/// - The request deadline bounds the wait for a connection and, through `SET LOCAL statement_timeout`, every
///   statement; a statement cancelled for it (57014) rolls the write back and throws `.deadlineExceeded`.
/// - A concurrent save of the same client operation id on another process makes the loser's transaction run
///   again once, so the server finds the stored answer and replays it (applied once).
public final class PostgresStorage: Storage, Sendable {
    /// Asset bytes: chunk rows in the database itself, so every node serves every asset.
    public var assetContents: any AssetContentStore { AssetChunkStore(storage: self) }

    private let pool: PostgresPool
    private let authenticationPool: PostgresPool
    private let isClosed = Atomic<Bool>(false)
    private let conninfo: String
    private let onClose: (@Sendable () -> Void)?
    /// This storage's mark in its announcements, so that it does not hear its own commits.
    let announcer: String
    private let listeners = Mutex<[PostgresListener]>([])
    private let claims: PostgresClaims
    /// Tests only: called with the backend's process id just before each `COMMIT` of this storage.
    let beforeCommitForTesting = Mutex<(@Sendable (Int32) -> Void)?>(nil)

    /// Times a transaction body runs again after a serialization failure or deadlock before `.busy`.
    public static let maximumConflictRetries = 8

    /// Connections of the general lane unless told otherwise: twice the processor count.
    public static var defaultPoolSize: Int { 2 * max(1, ProcessInfo.processInfo.activeProcessorCount) }

    /// Opens the database named by `url` (a libpq connection string: `postgresql://user@host:port/db?...` or
    /// `host=... dbname=...`; a `host` may be a unix-socket directory; a password comes from the string,
    /// `PGPASSWORD` or `~/.pgpass`) and migrates it, under an advisory lock so that several processes
    /// starting at once migrate it once.
    ///
    /// - Parameters:
    ///   - poolSize: connections for reads and writes (at least 1), besides the authentication connection.
    ///   - connectTimeoutSeconds: libpq's `connect_timeout` unless the URL sets one.
    ///   - claimCheckIntervalMilliseconds: how often the node claims (`claimNode`) are checked and, if lost,
    ///     retaken.
    ///   - onClose: runs once after `close()` has closed every connection (tests drop a throwaway database).
    /// - Throws: `StorageError.failure` naming the (redacted) URL when the database cannot be reached or
    ///   migrated, or its schema is newer than this build.
    public init(url: String, poolSize: Int = PostgresStorage.defaultPoolSize, connectTimeoutSeconds: Int = 5,
                claimCheckIntervalMilliseconds: Int = 1_000, onClose: (@Sendable () -> Void)? = nil) throws {
        conninfo = url
        claims = PostgresClaims(conninfo: url, checkIntervalMilliseconds: claimCheckIntervalMilliseconds)
        self.onClose = onClose
        var random = SystemRandomNumberGenerator()
        announcer = String(random.next() as UInt64, radix: 36)
        pool = PostgresPool(conninfo: url, capacity: max(1, poolSize), connectTimeoutSeconds: connectTimeoutSeconds)
        authenticationPool = PostgresPool(conninfo: url, capacity: 1, connectTimeoutSeconds: connectTimeoutSeconds)
        do {
            let connection: PostgresConnection
            do {
                connection = try pool.take(before: nil)
            } catch .connect(let error) {
                throw error
            } catch {
                throw PostgresError(sqlState: "", message: "no connection", context: "connect", connectionLost: true)
            }
            defer { pool.giveBack(connection) }
            try PostgresStorage.migrator.migrate(connection)
        } catch let error as PostgresError {
            throw StorageError.failure("cannot open \(PostgresStorage.redacted(url)): \(error.description)")
        } catch let error as MigrationError {
            throw StorageError.failure("cannot open \(PostgresStorage.redacted(url)): \(error.description)")
        }
    }

    /// `url` with any password replaced by `***`, for messages and logs (URL or key=value form).
    public static func redacted(_ url: String) -> String { PostgresConnectionString.redacted(url) }

    /// Whether `text` names a PostgreSQL database (`postgres://` or `postgresql://`) rather than a path.
    public static func isPostgresURL(_ text: String) -> Bool { PostgresConnectionString.isPostgres(text) }

    /// Connections of the general lane.
    public var poolSize: Int { pool.capacity }

    // MARK: Storage

    /// An `.authentication` read runs on the lane's own connection, or, while that one is lent, on a general
    /// connection that is free right now: it never waits behind general work, and token lookups of many
    /// requests at once are not all queued on one connection.
    public func read<T>(deadline: RequestDeadline?, lane: ReadLane, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try run(lane == .authentication ? authenticationPool : pool, borrowing: lane == .authentication ? pool : nil,
                readOnly: true, deadline: deadline, body)
    }

    public func write<T>(deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try run(pool, readOnly: false, deadline: deadline, body)
    }

    public func close() {
        guard !isClosed.exchange(true, ordering: .sequentiallyConsistent) else { return }
        listeners.withLock { listeners in
            listeners.forEach { $0.stop() }
            listeners.removeAll()
        }
        claims.releaseAll()
        pool.close()
        authenticationPool.close()
        onClose?()
    }

    /// `pg_database_size(current_database())`: every file of the database, from the catalog (no scan).
    /// It excludes the WAL (`pg_wal` is the cluster's) and the cluster's other databases.
    public func sizeOnDisk() throws -> Int64 {
        try sizeOnDisk(deadline: nil)
    }

    /// `sizeOnDisk` as a read whose `statement_timeout` (and wait for a connection) ends at `deadline`.
    public func sizeOnDisk(deadline: RequestDeadline?) throws -> Int64 {
        try read(deadline: deadline) { tx in try (tx as! PostgresTransaction).databaseSize() }
    }

    // MARK: Nodes and processes

    /// Listens for other processes' announcements (`LISTEN` on a connection of its own) and hands them to
    /// `handler` on the listener's thread, until `close`. After the listening connection is (re)established,
    /// first and after every loss, the handler gets `.resynchronize`: announcements sent meanwhile are lost.
    public func observeChanges(_ handler: @escaping @Sendable (StorageChange) -> Void) throws {
        try checkOpen()
        let own = announcer
        let listener = PostgresListener(conninfo: conninfo, channel: Self.changeChannel, notify: { payload in
            guard let change = PostgresStorage.change(payload, ignoring: own) else { return }
            handler(change)
        }, resynchronize: { handler(.resynchronize) })
        listeners.withLock { $0.append(listener) }
        listener.start()
    }

    /// Holds a session advisory lock named after the node on a connection of its own until `close`.
    /// - Throws: `StorageError.duplicate` when another live process holds it; `.busy` when the database
    ///   cannot be reached.
    ///
    /// The claim is kept while the storage is open: lost with its connection (a PostgreSQL restart), it is
    /// retaken on reconnection, and writes are refused with `.busy` until then; taken by another process
    /// meanwhile, this storage refuses writes from then on (`PostgresClaims`).
    public func claimNode(_ name: String) throws {
        try checkOpen()
        try claims.claim(name)
    }

    /// Whether every claim is held, as the watcher last saw it (`PostgresClaims.describeClaims`).
    public func checkNodeClaims() throws {
        try checkOpen()
        try claims.describeClaims()
    }

    /// An advisory lock key for a name of ours (FNV-1a, 64 bits).
    static func lockKey(_ name: String) -> Int64 {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in name.utf8 { hash = (hash ^ UInt64(byte)) &* 0x0100_0000_01B3 }
        return Int64(bitPattern: hash)
    }

    /// An announcement's payload: the announcer's mark, a colon, database ids separated by commas.
    static func payloads(announcer: String, databaseIDs: [Int64]) -> [String] {
        // NOTIFY payloads stay under 8000 bytes: at most 400 ids (20 bytes each at most) per announcement.
        let unique = Array(Set(databaseIDs)).sorted()
        return stride(from: 0, to: unique.count, by: 400).map { start in
            announcer + ":" + unique[start..<min(start + 400, unique.count)].map(String.init).joined(separator: ",")
        }
    }

    static func change(_ payload: String, ignoring own: String) -> StorageChange? {
        guard let colon = payload.firstIndex(of: ":") else { return .resynchronize }
        guard payload[..<colon] != own else { return nil }
        let ids = payload[payload.index(after: colon)...].split(separator: ",").compactMap { Int64($0) }
        return ids.isEmpty ? nil : .databases(ids)
    }

    private func checkOpen() throws(StorageError) {
        if isClosed.load(ordering: .sequentiallyConsistent) { throw StorageError.closed }
    }

    // MARK: Transactions

    /// Runs `body` in one transaction on a connection of `lanePool`, again after a conflict or a connection
    /// lost before anything could have been committed.
    private func run<T>(_ lanePool: PostgresPool, borrowing spare: PostgresPool? = nil, readOnly: Bool,
                        deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try checkOpen()
        if !readOnly { try claims.checkWritable() }
        var conflicts = 0
        var losses = 0
        var clientOperationConflicts = 0
        var random = SystemRandomNumberGenerator()
        while true {
            try deadline.check()
            let connection: PostgresConnection
            var owner = lanePool
            do {
                if let spare, let idle = lanePool.takeIdle() ?? spare.takeIdle().map({ borrowed in
                    owner = spare
                    return borrowed
                }) {
                    connection = idle
                } else {
                    connection = try lanePool.take(before: deadline)
                }
            } catch .closed {
                throw StorageError.closed
            } catch .deadline {
                throw StorageError.deadlineExceeded
            } catch .connect {
                // The database is unreachable (down, restarting, or refusing connections).
                if isClosed.load(ordering: .sequentiallyConsistent) { throw StorageError.closed }
                throw StorageError.busy
            }
            if !readOnly, connection.transactionsBegun == 0 {
                // A connection opened just now, maybe to a database that restarted: the claims' sessions may
                // be gone with the old ones, so they are checked (and retaken) before anything is written.
                do {
                    try claims.verify()
                } catch {
                    owner.giveBack(connection)
                    throw error
                }
            }
            connection.transactionsBegun += 1
            let transaction = PostgresTransaction(connection, readOnly: readOnly, deadline: deadline,
                                                  clientOperationConflictsSeen: clientOperationConflicts,
                                                  announcer: announcer,
                                                  beforeCommit: beforeCommitForTesting.withLock { $0 })
            let outcome = transaction.perform(body)
            owner.giveBack(connection)
            switch outcome {
            case .success(let value):
                return value
            case .failure(let error):
                throw error
            case .conflict:
                conflicts += 1
                guard conflicts <= Self.maximumConflictRetries else { throw StorageError.busy }
                try backOff(attempt: conflicts, deadline: deadline, &random)
            case .clientOperationConflict:
                clientOperationConflicts += 1
            case .connectionLost:
                owner.dropIdle()
                if isClosed.load(ordering: .sequentiallyConsistent) { throw StorageError.closed }
                losses += 1
                guard losses <= 1 else { throw StorageError.busy }
            }
        }
    }

    /// Sleeps a random 1 ms up to 2^attempt ms (at most 100 ms), never past the deadline.
    private func backOff(attempt: Int, deadline: RequestDeadline?, _ random: inout SystemRandomNumberGenerator) throws {
        let ceiling = min(100, 1 << min(attempt, 7))
        var milliseconds = Int64.random(in: 1...Int64(ceiling), using: &random)
        if let deadline { milliseconds = min(milliseconds, deadline.remainingMilliseconds) }
        if milliseconds > 0 { usleep(useconds_t(milliseconds * 1_000)) }
        try deadline.check()
    }

    // MARK: Schema

    /// The schema version this build creates (the same numbering as SQLite's).
    public static var schemaVersion: Int { migrator.latestVersion }

    /// A stable fingerprint of the migrations' SQL, for the test support's pre-migrated template databases.
    /// `package`: for this package's targets, not part of the public API.
    package static var schemaFingerprint: String { migrator.fingerprint }

    static let migrator = PostgresMigrator([
        PostgresMigrator.Migration("v1: users, tokens, databases, zones, records, client operations", sql: """
            CREATE TABLE metadata(key text COLLATE "C" PRIMARY KEY, value text COLLATE "C" NOT NULL);
            CREATE TABLE users(
                id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                record_name text COLLATE "C" NOT NULL UNIQUE,
                name text COLLATE "C" NOT NULL UNIQUE,
                created_ms bigint NOT NULL);
            CREATE TABLE tokens(
                hash bytea PRIMARY KEY,
                user_id bigint NOT NULL REFERENCES users(id),
                created_ms bigint NOT NULL);
            CREATE TABLE databases(
                id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                kind text COLLATE "C" NOT NULL,
                environment text COLLATE "C" NOT NULL,
                owner_id bigint NOT NULL,
                last_seq bigint NOT NULL DEFAULT 0,
                purged_seq bigint NOT NULL DEFAULT 0,
                bytes_used bigint NOT NULL DEFAULT 0,
                UNIQUE(kind, environment, owner_id));
            CREATE TABLE zones(
                id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                database_id bigint NOT NULL REFERENCES databases(id),
                name text COLLATE "C" NOT NULL,
                owner_record_name text COLLATE "C" NOT NULL,
                deleted bigint NOT NULL DEFAULT 0,
                last_seq bigint NOT NULL DEFAULT 0,
                purged_seq bigint NOT NULL DEFAULT 0,
                db_seq bigint NOT NULL,
                created_ms bigint NOT NULL,
                modified_ms bigint NOT NULL);
            CREATE UNIQUE INDEX zones_live_name ON zones(database_id, name) WHERE deleted = 0;
            CREATE INDEX zones_log ON zones(database_id, db_seq);
            CREATE TABLE records(
                zone_id bigint NOT NULL REFERENCES zones(id),
                name text COLLATE "C" NOT NULL,
                record_type text COLLATE "C" NOT NULL,
                frame bytea NOT NULL,
                deleted bigint NOT NULL,
                seq bigint NOT NULL,
                created_ms bigint NOT NULL,
                created_by text COLLATE "C" NOT NULL,
                modified_ms bigint NOT NULL,
                modified_by text COLLATE "C" NOT NULL,
                PRIMARY KEY(zone_id, name));
            -- Frames are compact binary already: stored as they are (no compression on the write path), so
            -- the disk budget counts their bytes.
            ALTER TABLE records ALTER COLUMN frame SET STORAGE EXTERNAL;
            CREATE UNIQUE INDEX records_log ON records(zone_id, seq);
            CREATE INDEX records_type ON records(zone_id, record_type, name);
            CREATE TABLE client_operations(
                user_id bigint NOT NULL,
                operation_id text COLLATE "C" NOT NULL,
                request_hash bytea NOT NULL,
                status bigint NOT NULL,
                response bytea NOT NULL,
                created_ms bigint NOT NULL,
                PRIMARY KEY(user_id, operation_id));
            CREATE INDEX client_operations_age ON client_operations(created_ms);
            """),
        PostgresMigrator.Migration("v2: record parents, shares, participants, link uses, share and shared-database logs",
                                   sql: """
            ALTER TABLE records ADD COLUMN parent_name text COLLATE "C";
            CREATE INDEX records_parent ON records(zone_id, parent_name) WHERE parent_name IS NOT NULL;
            CREATE TABLE shares(
                id bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,
                public_id text COLLATE "C" NOT NULL UNIQUE,
                zone_id bigint NOT NULL REFERENCES zones(id),
                record_name text COLLATE "C" NOT NULL,
                root_record_name text COLLATE "C",
                owner_id bigint NOT NULL REFERENCES users(id),
                title text COLLATE "C" NOT NULL,
                public_permission text COLLATE "C" NOT NULL,
                url_epoch bigint NOT NULL DEFAULT 1,
                deleted bigint NOT NULL DEFAULT 0,
                last_seq bigint NOT NULL DEFAULT 0,
                created_ms bigint NOT NULL);
            CREATE UNIQUE INDEX shares_live_record ON shares(zone_id, record_name) WHERE deleted = 0;
            CREATE TABLE share_participants(
                share_id bigint NOT NULL REFERENCES shares(id),
                user_id bigint NOT NULL REFERENCES users(id),
                role text COLLATE "C" NOT NULL,
                permission text COLLATE "C" NOT NULL,
                status text COLLATE "C" NOT NULL,
                modified_ms bigint NOT NULL,
                PRIMARY KEY(share_id, user_id));
            CREATE INDEX share_participants_user ON share_participants(user_id, status);
            CREATE TABLE share_link_uses(
                token_id text COLLATE "C" PRIMARY KEY,
                share_id bigint NOT NULL,
                uses bigint NOT NULL);
            CREATE TABLE share_records(
                share_id bigint NOT NULL REFERENCES shares(id),
                record_name text COLLATE "C" NOT NULL,
                member bigint NOT NULL,
                seq bigint NOT NULL,
                PRIMARY KEY(share_id, record_name));
            CREATE UNIQUE INDEX share_records_log ON share_records(share_id, seq);
            CREATE TABLE shared_zones(
                database_id bigint NOT NULL REFERENCES databases(id),
                share_id bigint NOT NULL REFERENCES shares(id),
                deleted bigint NOT NULL,
                db_seq bigint NOT NULL,
                PRIMARY KEY(database_id, share_id));
            CREATE INDEX shared_zones_log ON shared_zones(database_id, db_seq);
            """),
        PostgresMigrator.Migration("v3: token ids and expiry, the sign-up log, replay-cache charges", sql: """
            ALTER TABLE tokens ADD COLUMN id text COLLATE "C";
            UPDATE tokens SET id = substr(md5(random()::text || encode(hash, 'hex')), 1, 16);
            CREATE UNIQUE INDEX tokens_id ON tokens(id);
            ALTER TABLE tokens ADD COLUMN expires_ms bigint;
            CREATE INDEX tokens_user ON tokens(user_id);
            CREATE TABLE signups(
                address text COLLATE "C" NOT NULL,
                created_ms bigint NOT NULL);
            CREATE INDEX signups_address ON signups(address, created_ms);
            CREATE INDEX signups_age ON signups(created_ms);
            ALTER TABLE client_operations ADD COLUMN database_id bigint NOT NULL DEFAULT 0;
            ALTER TABLE client_operations ADD COLUMN charged_bytes bigint NOT NULL DEFAULT 0;
            CREATE INDEX client_operations_user ON client_operations(user_id, created_ms);
            """),
        // As on SQLite: a replica id and clock kept in `metadata` become node `main`'s.
        PostgresMigrator.Migration("v4: nodes", sql: """
            CREATE TABLE nodes(
                name text COLLATE "C" PRIMARY KEY,
                replica_id text COLLATE "C" NOT NULL UNIQUE,
                clock_latest bigint NOT NULL DEFAULT 0,
                created_ms bigint NOT NULL);
            INSERT INTO nodes(name, replica_id, clock_latest, created_ms)
                SELECT '\(SQLiteStorage.defaultNodeName)', value,
                       COALESCE((SELECT value::bigint FROM metadata WHERE key = 'clock_latest'), 0), 0
                FROM metadata WHERE key = 'replica_id';
            DELETE FROM metadata WHERE key IN ('replica_id', 'clock_latest');
            """),
        PostgresMigrator.Migration("v5: device names on tokens, device authorizations, failed device approvals", sql: """
            ALTER TABLE tokens ADD COLUMN name text COLLATE "C";
            CREATE TABLE device_authorizations(
                device_code_hash bytea PRIMARY KEY,
                user_code_hash bytea NOT NULL UNIQUE,
                address text COLLATE "C" NOT NULL,
                device_name text COLLATE "C" NOT NULL,
                status text COLLATE "C" NOT NULL,
                user_id bigint,
                interval_seconds bigint NOT NULL,
                last_poll_ms bigint NOT NULL,
                created_ms bigint NOT NULL,
                expires_ms bigint NOT NULL);
            CREATE INDEX device_authorizations_address ON device_authorizations(address, expires_ms);
            CREATE INDEX device_authorizations_expiry ON device_authorizations(expires_ms);
            CREATE TABLE device_approval_failures(
                key text COLLATE "C" NOT NULL,
                created_ms bigint NOT NULL);
            CREATE INDEX device_approval_failures_key ON device_approval_failures(key, created_ms);
            CREATE INDEX device_approval_failures_age ON device_approval_failures(created_ms);
            """),
        // The purge's batches (`purge(before:operationsBeforeMs:limit:)`) find their rows through these, so a
        // batch reads about as many rows as it removes instead of scanning every record or share (the shares
        // index also serves the foreign-key check of a zone's deletion).
        PostgresMigrator.Migration("v6: indexes of the purge: tombstones by age, deleted zones, shares by zone", sql: """
            CREATE INDEX records_tombstones ON records(modified_ms) WHERE deleted = 1;
            CREATE INDEX zones_deleted ON zones(id) WHERE deleted = 1;
            CREATE INDEX shares_zone ON shares(zone_id);
            """),
        // User names are unique whatever their case and look-alikes (`StorageRules.userNameKey`).
        PostgresMigrator.Migration("v7: user name keys", sql: StorageRules.userNameKeyMigration),
        PostgresMigrator.Migration("v8: passkeys, passkey ceremonies, recovery codes",
                                   sql: PasskeyTables.migration(blob: "BYTEA", integer: "BIGINT")),
        PostgresMigrator.Migration("v9: external identities, OpenID Connect sign-ins",
                                   sql: IdentityTables.migration(blob: "BYTEA", integer: "BIGINT")),
        PostgresMigrator.Migration("v10: short share links",
                                   sql: ShortLinkTables.migration(integer: "BIGINT", text: "text COLLATE \"C\"")),
        PostgresMigrator.Migration("v11: subscriptions, notifications, push tokens",
                                   sql: SubscriptionTables.migration(integer: "BIGINT", text: "text COLLATE \"C\"",
                                                                     blob: "BYTEA",
                                                                     key: "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")),
        // Assets: uploads, blobs, claims, references, and the bytes themselves as chunk rows (Assets.swift).
        PostgresMigrator.Migration("v12: assets", sql: AssetTables.migration(integer: "BIGINT", text: "text COLLATE \"C\"",
                                                                             blob: "BYTEA",
                                                                             key: "bigint GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY")),
    ])

    /// The channel commits are announced on (`NOTIFY`).
    static let changeChannel = "lattice_changes"
}

/// Versioned schema migrations for PostgreSQL, tracked in the table `lattice_schema_migrations`.
///
/// Every pending migration runs in one transaction that first takes a transaction-level advisory lock, so
/// processes starting at once wait for each other and the first one migrates; the others then find the
/// schema current.
struct PostgresMigrator: Sendable {
    struct Migration: Sendable {
        let name: String
        let sql: String
        init(_ name: String, sql: String) {
            self.name = name
            self.sql = sql
        }
    }

    let migrations: [Migration]

    init(_ migrations: [Migration]) { self.migrations = migrations }

    var latestVersion: Int { migrations.count }

    /// The advisory lock key of migrations ("LATTICE" and 1).
    static let lockKey: Int64 = 0x4C41_5454_4943_4501

    /// A stable fingerprint of the migrations' SQL (FNV-1a), for naming pre-migrated template databases.
    var fingerprint: String {
        var hash: UInt64 = 0xCBF2_9CE4_8422_2325
        for byte in migrations.map(\.sql).joined(separator: "\u{1}").utf8 {
            hash = (hash ^ UInt64(byte)) &* 0x0100_0000_01B3
        }
        return String(hash, radix: 16)
    }

    /// Applies the migrations the database has not seen yet; returns how many ran.
    /// - Throws: `MigrationError.newerSchema` if the database is newer than this code knows.
    @discardableResult
    func migrate(_ connection: PostgresConnection) throws -> Int {
        try connection.execute("BEGIN ISOLATION LEVEL READ COMMITTED", context: "migrate")
        do {
            try connection.query("SELECT pg_advisory_xact_lock($1)", [.integer(Self.lockKey)], context: "migrate")
            try connection.execute("""
                CREATE TABLE IF NOT EXISTS lattice_schema_migrations(
                    version bigint PRIMARY KEY,
                    name text NOT NULL,
                    applied_at timestamptz NOT NULL DEFAULT now())
                """, context: "migrate")
            let current = Int(try connection.rows("SELECT COALESCE(MAX(version), 0) FROM lattice_schema_migrations")
                .first?.first?.integer ?? 0)
            guard current <= latestVersion else {
                throw MigrationError.newerSchema(found: current, known: latestVersion)
            }
            for index in current..<latestVersion {
                try connection.execute(migrations[index].sql, context: "migrate to version \(index + 1)")
                try connection.query("INSERT INTO lattice_schema_migrations(version, name) VALUES ($1, $2)",
                                     [.integer(Int64(index + 1)), .text(migrations[index].name)], context: "migrate")
            }
            try connection.execute("COMMIT", context: "migrate")
            return latestVersion - current
        } catch {
            if connection.isInTransaction { try? connection.execute("ROLLBACK") }
            throw error
        }
    }

    /// The schema version of the database on `connection` (0: none yet).
    func version(_ connection: PostgresConnection) throws -> Int {
        let exists = try connection.rows("SELECT to_regclass('lattice_schema_migrations') IS NOT NULL").first?.first
        guard exists == .boolean(true) else { return 0 }
        return Int(try connection.rows("SELECT COALESCE(MAX(version), 0) FROM lattice_schema_migrations")
            .first?.first?.integer ?? 0)
    }
}

/// The node claims of one storage (session advisory locks, each on a connection of its own) and a watcher
/// that keeps them: a claim's connection lost (PostgreSQL restarted, the network failed, the session was
/// terminated) loses its lock, so the watcher pings each claim every `checkIntervalMilliseconds` and, once
/// one is lost, connects again and retakes the lock.
///
/// - While a claim is lost and not retaken (the database is away), writes are refused with `.busy`
///   (TRY_AGAIN_LATER); reads go on.
/// - If another process took the node name meanwhile, the claim is **taken**: that process now stamps with
///   this node's replica id, so this storage refuses every write from then on (`.busy`: TRY_AGAIN_LATER,
///   so a client retries, on another node behind a load balancer) until it is restarted; it never takes the
///   name back. `describeClaims` names the cause, and the server's `/healthz` answers 503 with it, so a
///   load balancer stops sending this node requests.
/// - A write on a connection the pool has just opened (after a loss, e.g. a PostgreSQL restart, every
///   connection is new) first checks the claims on the spot (`verify`), so no write can commit on a
///   restarted database before the claim is held again. A claim's session cut alone while the database and
///   the pool stay up is noticed by the watcher within its interval.
///
/// `@unchecked Sendable` is sound because `lock` guards `claims` (and the connections in it, which are used
/// only under the lock), `stopped` and `watching` are atomic, and the other members are immutable `let`s.
final class PostgresClaims: @unchecked Sendable {
    enum State {
        case held(PostgresConnection)
        case lost
        case taken
    }

    private let lock = NSLock()
    private var claims: [(name: String, state: State)] = []
    private let conninfo: String
    private let checkIntervalMilliseconds: Int
    private let stopped = Atomic<Bool>(false)
    private let watching = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    init(conninfo: String, checkIntervalMilliseconds: Int) {
        self.conninfo = conninfo
        self.checkIntervalMilliseconds = max(10, checkIntervalMilliseconds)
    }

    /// Takes the claim (a session advisory lock on a new connection) and starts the watcher if needed.
    /// - Throws: `.duplicate` when another live process holds it; `.busy` when the database cannot be reached.
    func claim(_ name: String) throws(StorageError) {
        let connection: PostgresConnection
        do {
            connection = try PostgresConnection(conninfo)
        } catch {
            throw StorageError.busy
        }
        let taken: Bool
        do {
            taken = try Self.tryLock(name, on: connection)
        } catch {
            throw PostgresTransaction.storageError(error)
        }
        guard taken else { throw StorageError.duplicate("node \(name) (another running process is that node)") }
        lock.lock()
        claims.append((name, .held(connection)))
        lock.unlock()
        if !watching.exchange(true, ordering: .sequentiallyConsistent) {
            Thread.detachNewThread { [self] in
                watch()
                finished.signal()
            }
        }
    }

    private static func tryLock(_ name: String, on connection: PostgresConnection) throws(PostgresError) -> Bool {
        try connection.rows("SELECT pg_try_advisory_lock($1)", [.integer(PostgresStorage.lockKey("node:" + name))])
            .first?.first == .boolean(true)
    }

    /// Refuses a write unless every claim is held (as last seen: no round trip).
    func checkWritable() throws(StorageError) {
        lock.lock()
        defer { lock.unlock() }
        try Self.check(claims)
    }

    private static func check(_ claims: [(name: String, state: State)]) throws(StorageError) {
        for claim in claims {
            if case .held = claim.state { continue }
            throw StorageError.busy
        }
    }

    /// As `checkWritable`, but a taken claim throws `.failure` naming the node and saying what to do.
    func describeClaims() throws(StorageError) {
        lock.lock()
        defer { lock.unlock() }
        for claim in claims {
            switch claim.state {
            case .held: continue
            case .lost: throw StorageError.busy
            case .taken:
                throw StorageError.failure("node \(claim.name) was claimed by another process while this one had lost "
                                           + "the database; this process refuses writes until it is restarted")
            }
        }
    }

    /// Pings every held claim, retakes every lost one (one attempt each), then refuses as `checkWritable`.
    func verify() throws(StorageError) {
        lock.lock()
        defer { lock.unlock() }
        for index in claims.indices {
            let name = claims[index].name
            switch claims[index].state {
            case .taken:
                continue
            case .held(let connection):
                if (try? connection.execute("SELECT 1", context: "claim")) != nil { continue }
                claims[index].state = .lost
            case .lost:
                break
            }
            // Lost: connect again and retake the lock, unless another process has it now.
            guard let connection = try? PostgresConnection(conninfo, connectTimeoutSeconds: 2) else { continue }
            guard let mine = try? Self.tryLock(name, on: connection) else { continue }
            claims[index].state = mine ? .held(connection) : .taken
        }
        try Self.check(claims)
    }

    private func watch() {
        while !stopped.load(ordering: .sequentiallyConsistent) {
            var left = checkIntervalMilliseconds
            while left > 0, !stopped.load(ordering: .sequentiallyConsistent) {
                let step = min(left, 50)
                usleep(useconds_t(step * 1_000))
                left -= step
            }
            if stopped.load(ordering: .sequentiallyConsistent) { break }
            try? verify()
        }
    }

    /// Stops the watcher and closes the connections, which releases their locks.
    func releaseAll() {
        if !stopped.exchange(true, ordering: .sequentiallyConsistent), watching.load(ordering: .sequentiallyConsistent) {
            _ = finished.wait(timeout: .now() + 5)
        }
        lock.lock()
        defer { lock.unlock() }
        claims.removeAll()
    }
}
