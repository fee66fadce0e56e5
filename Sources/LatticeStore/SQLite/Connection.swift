import CSQLite
import Foundation

/// One SQLite connection. Owns its handle and closes it in `deinit`.
///
/// Opened in WAL mode with `synchronous=FULL`, so a committed transaction is durable before the commit
/// returns (a write is acknowledged only after that), with foreign keys on and a busy timeout so a
/// brief lock is waited out rather than reported. Use it from one executor at a time; `DatabaseQueue`
/// enforces that.
final class Connection {
    let handle: OpaquePointer
    private var statementCache: [String: Statement] = [:]

    /// Opens (creating if needed) the database at `path`; `":memory:"` opens a private in-memory one.
    /// A `readOnly` connection refuses every statement that would change the database (`query_only`).
    init(path: String, busyTimeoutMilliseconds: Int32 = 5_000, readOnly: Bool = false) throws(SQLiteError) {
        var db: OpaquePointer?
        let flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX
        let code = sqlite3_open_v2(path, &db, flags, nil)
        guard code == SQLITE_OK, let db else {
            let error = SQLiteError(code: code, connection: db, context: "open")
            sqlite3_close(db)
            throw error
        }
        handle = db
        sqlite3_extended_result_codes(db, 1)
        sqlite3_busy_timeout(db, busyTimeoutMilliseconds)
        if path != ":memory:" { try execute("PRAGMA journal_mode=WAL") }
        try execute("PRAGMA synchronous=FULL")
        try execute("PRAGMA foreign_keys=ON")
        if readOnly { try execute("PRAGMA query_only=ON") }
    }

    deinit {
        statementCache.removeAll()
        sqlite3_close_v2(handle)
    }

    /// Runs one or more statements that take no parameters (schema changes, pragmas).
    func execute(_ sql: String) throws(SQLiteError) {
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        guard code == SQLITE_OK else { throw SQLiteError(code: code, connection: handle, context: "execute") }
    }

    func prepare(_ sql: String) throws(SQLiteError) -> Statement {
        try Statement(self, sql: sql)
    }

    /// A prepared statement kept for reuse on this connection: for the hot, fixed SQL of a storage backend.
    func cached(_ sql: String) throws(SQLiteError) -> Statement {
        if let statement = statementCache[sql] { return statement }
        let statement = try Statement(self, sql: sql)
        statementCache[sql] = statement
        return statement
    }

    /// Runs `body` in an immediate transaction: committed if it returns, rolled back if it throws.
    func transaction<T>(_ body: (Connection) throws -> T) throws -> T {
        try execute("BEGIN IMMEDIATE")
        do {
            let result = try body(self)
            try execute("COMMIT")
            return result
        } catch {
            try? execute("ROLLBACK")
            throw error
        }
    }

    /// The rowid of the last insert on this connection.
    var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// The schema version kept in `PRAGMA user_version`.
    var userVersion: Int {
        get throws(SQLiteError) {
            let rows = try prepare("PRAGMA user_version").rows()
            if case .integer(let version)? = rows.first?.first { return Int(version) }
            return 0
        }
    }

    /// The journal mode in effect (`wal` for file databases).
    var journalMode: String {
        get throws(SQLiteError) {
            let rows = try prepare("PRAGMA journal_mode").rows()
            if case .text(let mode)? = rows.first?.first { return mode }
            return ""
        }
    }
}

/// A connection confined behind a lock: every use goes through `read` or `write`, one at a time.
///
/// `@unchecked Sendable` is sound because the connection is only reachable through `lock`. (A
/// `Mutex<Connection?>` cannot say this to the compiler: the caller's closure gets the connection, so
/// region checking treats it as escaping the lock.)
final class DatabaseQueue: @unchecked Sendable {
    private let lock = NSLock()
    private var connection: Connection?

    init(path: String, busyTimeoutMilliseconds: Int32 = 5_000, readOnly: Bool = false) throws(SQLiteError) {
        connection = try Connection(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds, readOnly: readOnly)
    }

    /// Runs `body` with the connection (no transaction).
    func read<T>(_ body: (Connection) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(try open())
    }

    /// Runs `body` in an immediate transaction; on error nothing is written.
    func write<T>(_ body: (Connection) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        return try open().transaction(body)
    }

    /// Closes the connection after any use in progress; later uses throw `SQLITE_MISUSE`.
    func close() {
        lock.lock()
        defer { lock.unlock() }
        connection = nil
    }

    private func open() throws(SQLiteError) -> Connection {
        guard let connection else { throw SQLiteError(code: SQLITE_MISUSE, connection: nil, context: "use after close") }
        return connection
    }
}
