import CSQLite
import Foundation

/// One SQLite connection. Owns its handle and closes it in `deinit`.
///
/// Opened in WAL mode with `synchronous=FULL`, so a committed transaction is durable before the commit
/// returns (a write is acknowledged only after that), with foreign keys on and a busy timeout so a
/// brief lock is waited out rather than reported. Use it from one executor at a time; `DatabaseQueue`
/// enforces that.
public final class Connection {
    public let handle: OpaquePointer
    private var statementCache: [String: Statement] = [:]
    /// `CLOCK_MONOTONIC` nanoseconds after which this connection's statements are interrupted (`.max`:
    /// never). Set for one use (`withDeadline`, `transaction`) by the one thread using the connection, and
    /// read by the progress handler on that same thread.
    private var deadlineNanoseconds: UInt64 = .max
    /// Set once a statement was interrupted for the deadline: every later statement of the same use is
    /// refused, so a body that swallowed the error cannot go on writing outside the rolled-back transaction.
    public private(set) var interrupted = false

    /// Opens (creating if needed) the database at `path`; `":memory:"` opens a private in-memory one.
    /// A `readOnly` connection refuses every statement that would change the database (`query_only`).
    public init(path: String, busyTimeoutMilliseconds: Int32 = 5_000, readOnly: Bool = false) throws(SQLiteError) {
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
        // Every 1,000 virtual-machine steps SQLite asks whether to go on: not past the deadline of the
        // current use. The context is this connection, which outlives its handle's callbacks (deinit closes it).
        sqlite3_progress_handler(db, 1_000, { context in
            guard let context else { return 0 }
            return Unmanaged<Connection>.fromOpaque(context).takeUnretainedValue().progressShouldInterrupt() ? 1 : 0
        }, Unmanaged.passUnretained(self).toOpaque())
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

    /// Runs one or more statements that take no parameters (schema changes, pragmas, savepoints). Refused
    /// once the current use is past its deadline.
    public func execute(_ sql: String) throws(SQLiteError) {
        try checkDeadline()
        try executeUnchecked(sql)
    }

    /// `synchronous=FULL` (true) or `NORMAL` (false), whatever the deadline.
    public func setFullSync(_ full: Bool) throws(SQLiteError) {
        try executeUnchecked(full ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL")
    }

    /// `execute` without the deadline check: for BEGIN, COMMIT and ROLLBACK, which must run whatever the time.
    private func executeUnchecked(_ sql: String) throws(SQLiteError) {
        let code = sqlite3_exec(handle, sql, nil, nil, nil)
        if code == SQLITE_INTERRUPT { interrupted = true }
        guard code == SQLITE_OK else { throw SQLiteError(code: code, connection: handle, context: "execute") }
    }

    // MARK: Deadlines

    /// Runs `body` with statements interrupted past `deadline` (`CLOCK_MONOTONIC` nanoseconds; nil: none).
    public func withDeadline<T>(_ deadline: UInt64?, _ body: () throws -> T) rethrows -> T {
        deadlineNanoseconds = deadline ?? .max
        interrupted = false
        defer {
            deadlineNanoseconds = .max
            interrupted = false
        }
        return try body()
    }

    /// Throws SQLITE_INTERRUPT when the current use is past its deadline or was interrupted already.
    public func checkDeadline() throws(SQLiteError) {
        if interrupted || progressShouldInterrupt() {
            throw SQLiteError(code: SQLITE_INTERRUPT, connection: nil, context: "the request deadline")
        }
    }

    /// Notes when a step ended interrupted (the deadline, seen by the progress handler).
    public func noteResult(_ code: Int32) {
        if code & 0xFF == SQLITE_INTERRUPT { interrupted = true }
    }

    fileprivate func progressShouldInterrupt() -> Bool {
        guard deadlineNanoseconds != .max else { return false }
        if monotonicNanoseconds() >= deadlineNanoseconds { interrupted = true }
        return interrupted
    }

    public func prepare(_ sql: String) throws(SQLiteError) -> Statement {
        try Statement(self, sql: sql)
    }

    /// A prepared statement kept for reuse on this connection: for the hot, fixed SQL of a storage backend.
    public func cached(_ sql: String) throws(SQLiteError) -> Statement {
        if let statement = statementCache[sql] { return statement }
        let statement = try Statement(self, sql: sql)
        statementCache[sql] = statement
        return statement
    }

    /// Runs `body` in an immediate transaction: committed if it returns, rolled back if it throws or a
    /// statement ran into `deadline`. A body that returned is committed even if the deadline passes during
    /// the commit; one whose statement was interrupted is rolled back even if it caught the error.
    public func transaction<T>(deadline: UInt64? = nil, _ body: (Connection) throws -> T) throws -> T {
        try withDeadline(deadline) {
            try executeUnchecked("BEGIN IMMEDIATE")
            do {
                let result = try body(self)
                // Interrupted (SQLite may have rolled the transaction back on its own already): keep nothing.
                if interrupted || sqlite3_get_autocommit(handle) != 0 {
                    throw SQLiteError(code: SQLITE_INTERRUPT, connection: nil, context: "the request deadline")
                }
                deadlineNanoseconds = .max
                try executeUnchecked("COMMIT")
                return result
            } catch {
                if sqlite3_get_autocommit(handle) == 0 { try? executeUnchecked("ROLLBACK") }
                throw error
            }
        }
    }

    /// One group commit's transaction (`DatabaseQueue.groupWrite`): each job in a savepoint; the jobs that must
    /// run again in a new transaction are answered (none when the group committed or failed as a whole). A job
    /// that fails alone is completed with its error; when its failure took the transaction with it, the jobs
    /// before it run again.
    func runGroup(_ jobs: [any GroupedWrite]) -> [any GroupedWrite] {
        do {
            try executeUnchecked("BEGIN IMMEDIATE")
        } catch {
            for job in jobs { job.complete(error) }
            return []
        }
        var done: [any GroupedWrite] = []
        for (index, job) in jobs.enumerated() {
            if let deadline = job.deadline, monotonicNanoseconds() >= deadline {
                job.complete(SQLiteError(code: SQLITE_INTERRUPT, connection: nil, context: "the request deadline"))
                continue
            }
            var failure: (any Error)?
            withDeadline(job.deadline) {
                do {
                    try executeUnchecked("SAVEPOINT lattice_group")
                    try job.run(self)
                    if interrupted || sqlite3_get_autocommit(handle) != 0 {
                        throw SQLiteError(code: SQLITE_INTERRUPT, connection: nil, context: "the request deadline")
                    }
                    try executeUnchecked("RELEASE lattice_group")
                } catch {
                    failure = error
                }
            }
            guard let failure else {
                done.append(job)
                continue
            }
            if sqlite3_get_autocommit(handle) != 0 {
                // The whole transaction went (an interrupted write, a full disk): this job has its error, the
                // ones before it run again, and the rest wait for that round.
                job.complete(failure)
                return done + jobs[(index + 1)...]
            }
            try? executeUnchecked("ROLLBACK TO lattice_group")
            try? executeUnchecked("RELEASE lattice_group")
            job.complete(failure)
        }
        do {
            try executeUnchecked("COMMIT")
            for job in done { job.complete(nil) }
        } catch {
            if sqlite3_get_autocommit(handle) == 0 { try? executeUnchecked("ROLLBACK") }
            for job in done { job.complete(error) }
        }
        return []
    }

    /// Runs `body` in a read transaction (a snapshot) with statements interrupted past `deadline`.
    public func readTransaction<T>(deadline: UInt64?, _ body: (Connection) throws -> T) throws -> T {
        try withDeadline(deadline) {
            try executeUnchecked("BEGIN")
            defer { if sqlite3_get_autocommit(handle) == 0 { try? executeUnchecked("COMMIT") } }
            return try body(self)
        }
    }

    /// Rows changed by this connection's statements since it opened (`sqlite3_total_changes64`).
    public var totalChanges: Int64 { sqlite3_total_changes64(handle) }

    /// The rowid of the last insert on this connection.
    public var lastInsertRowID: Int64 { sqlite3_last_insert_rowid(handle) }

    /// The schema version kept in `PRAGMA user_version`.
    public var userVersion: Int {
        get throws(SQLiteError) {
            let rows = try prepare("PRAGMA user_version").rows()
            if case .integer(let version)? = rows.first?.first { return Int(version) }
            return 0
        }
    }

    /// The journal mode in effect (`wal` for file databases).
    public var journalMode: String {
        get throws(SQLiteError) {
            let rows = try prepare("PRAGMA journal_mode").rows()
            if case .text(let mode)? = rows.first?.first { return mode }
            return ""
        }
    }
}

/// A connection confined behind a lock: every use goes through `read` or `write`, one at a time.
///
/// `@unchecked Sendable` is sound because `lock` guards `connection`, its only member besides the lock. (A
/// `Mutex<Connection?>` cannot say this to the compiler: the caller's closure gets the connection, so
/// region checking treats it as escaping the lock.)
public final class DatabaseQueue: @unchecked Sendable {
    private let lock = NSLock()
    private var connection: Connection?
    /// Guards `waiting` and `leading`: the group commit's queue (`groupWrite`). Never held while a body runs.
    private let groupLock = NSLock()
    private var waiting: [any GroupedWrite] = []
    /// A caller is running a group now (it takes `lock` for it).
    private var leading = false
    /// The most writes one group commit joins.
    public static let maximumGroup = 64
    /// Group commits and the writes they carried, since the queue opened (`groupWrite`; for tests and
    /// benchmarks). Guarded by `groupLock`.
    private var groupCounts = (groups: 0, writes: 0)
    public var groupCommitCounts: (groups: Int, writes: Int) { groupLock.withLock { groupCounts } }

    public init(path: String, busyTimeoutMilliseconds: Int32 = 5_000, readOnly: Bool = false) throws(SQLiteError) {
        connection = try Connection(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds, readOnly: readOnly)
    }

    /// Runs `body` with the connection (no transaction).
    public func read<T>(_ body: (Connection) throws -> T) throws -> T {
        lock.lock()
        defer { lock.unlock() }
        return try body(try open())
    }

    /// Runs `body` in a read transaction, waiting for the connection no longer than `deadline`.
    public func readTransaction<T>(deadline: UInt64?, _ body: (Connection) throws -> T) throws -> T {
        try DatabaseQueue.lock(lock, before: deadline)
        defer { lock.unlock() }
        return try open().readTransaction(deadline: deadline, body)
    }

    /// Runs `body` in an immediate transaction; on error (or past `deadline`) nothing is written.
    ///
    /// `flushed: false` commits this one transaction with `synchronous=NORMAL`: in WAL mode it survives a
    /// crash of the process, and a power failure may undo it (and only it and later ones like it: the next
    /// `synchronous=FULL` commit syncs the log with everything before it). For writes that are safe to
    /// lose, such as a client's note that the server has acknowledged a record (lost, the record is sent
    /// again and joined as before). The connection is back to `synchronous=FULL` before the lock is let go.
    public func write<T>(deadline: UInt64? = nil, flushed: Bool = true,
                  _ body: (Connection) throws -> T) throws -> T {
        try DatabaseQueue.lock(lock, before: deadline)
        defer { lock.unlock() }
        let connection = try open()
        guard !flushed else { return try connection.transaction(deadline: deadline, body) }
        try connection.setFullSync(false)
        defer {
            // A connection that cannot go back to FULL is not used again (never silently less durable).
            if (try? connection.setFullSync(true)) == nil { self.connection = nil }
        }
        return try connection.transaction(deadline: deadline, body)
    }

    /// Runs `body` in a write transaction shared with other callers' writes that arrive meanwhile (a group
    /// commit): one `BEGIN IMMEDIATE`, each body in a savepoint of its own, one `COMMIT` and so one sync of
    /// the log for the whole group. Each caller gets its own body's result or error: a body that throws rolls
    /// back its savepoint only. Nothing of a body is acknowledged before the group's commit is durable, and a
    /// commit that fails fails every body of the group (nothing of theirs is written).
    ///
    /// The first caller to find no group running leads: it runs the group waiting at that moment (its own
    /// write among them), then hands the lead to the first caller that arrived meanwhile. The others wait on
    /// their own semaphore. A body may run more than once (when a later body's failure took the whole
    /// transaction with it, SQLite's rule for an interrupted write or a full disk, the bodies before it run
    /// again in a new transaction), so it must start from what it reads, as a body retried on a busy
    /// database does. A body whose `deadline` passes before it starts is refused with SQLITE_INTERRUPT.
    public func groupWrite<T>(deadline: UInt64? = nil, _ body: (Connection) throws -> T) throws -> T {
        try withoutActuallyEscaping(body) { body in
            let job = GroupedJob(deadline: deadline, body: body)
            let leads = groupLock.withLock { () -> Bool in
                waiting.append(job)
                guard !leading else { return false }
                leading = true
                return true
            }
            if leads || job.waitForTurn() { runGroups() }
            job.waitForCompletion()
            return try job.outcome()
        }
    }

    /// Runs the group waiting now, then hands the lead on (or gives it up when nobody waits).
    private func runGroups() {
        let batch = groupLock.withLock { () -> [any GroupedWrite] in
            let batch = Array(waiting.prefix(Self.maximumGroup))
            waiting.removeFirst(batch.count)
            groupCounts.groups += 1
            groupCounts.writes += batch.count
            return batch
        }
        runGroup(batch)
        let next = groupLock.withLock { () -> (any GroupedWrite)? in
            guard let next = waiting.first else {
                leading = false
                return nil
            }
            return next
        }
        next?.takeTurn()
    }

    /// One transaction for `batch`; every job of it completed when this returns.
    private func runGroup(_ batch: [any GroupedWrite]) {
        lock.lock()
        defer { lock.unlock() }
        guard let connection else {
            for job in batch { job.complete(SQLiteError(code: SQLITE_MISUSE, connection: nil, context: "use after close")) }
            return
        }
        var remaining = batch
        // At most as many rounds as jobs: each round completes at least one (the one that failed, or all).
        while !remaining.isEmpty {
            remaining = connection.runGroup(remaining)
        }
    }

    /// Takes `lock`, waiting at most until `deadline`; SQLITE_INTERRUPT (the deadline) when it passes first.
    public static func lock(_ lock: NSLock, before deadline: UInt64?) throws(SQLiteError) {
        guard let deadline else { return lock.lock() }
        let seconds = secondsUntil(deadline)
        guard lock.lock(before: Date(timeIntervalSinceNow: seconds)) else {
            throw SQLiteError(code: SQLITE_INTERRUPT, connection: nil, context: "waiting for the request deadline")
        }
    }

    /// Closes the connection after any use in progress; later uses throw `SQLITE_MISUSE`.
    public func close() {
        lock.lock()
        defer { lock.unlock() }
        connection = nil
    }

    private func open() throws(SQLiteError) -> Connection {
        guard let connection else { throw SQLiteError(code: SQLITE_MISUSE, connection: nil, context: "use after close") }
        return connection
    }
}

/// A fixed set of read-only connections to one database, lent one at a time: several readers run at once
/// (WAL gives each its own snapshot), and a reader waits only when all are lent, at most until its deadline.
///
/// `@unchecked Sendable` is sound because `condition` guards `idle`, `lent` and `closed` (`count` is an
/// immutable `let`), and a lent connection is reachable only by the one caller that holds it until it is given
/// back.
public final class ConnectionPool: @unchecked Sendable {
    private let condition = NSCondition()
    private var idle: [Connection]
    /// Connections lent and not given back yet.
    private var lent = 0
    private var closed = false
    public let count: Int

    public init(path: String, count: Int, busyTimeoutMilliseconds: Int32 = 5_000) throws(SQLiteError) {
        var connections: [Connection] = []
        for _ in 0..<count {
            connections.append(try Connection(path: path, busyTimeoutMilliseconds: busyTimeoutMilliseconds, readOnly: true))
        }
        idle = connections
        self.count = count
    }

    /// Runs `body` with a connection of the pool, waiting for a free one no longer than `deadline`.
    public func read<T>(deadline: UInt64?, _ body: (Connection) throws -> T) throws -> T {
        let connection = try take(deadline)
        defer { giveBack(connection) }
        return try body(connection)
    }

    private func take(_ deadline: UInt64?) throws(SQLiteError) -> Connection {
        condition.lock()
        defer { condition.unlock() }
        while true {
            if closed { throw SQLiteError(code: SQLITE_MISUSE, connection: nil, context: "use after close") }
            if let connection = idle.popLast() {
                lent += 1
                return connection
            }
            if let deadline {
                let seconds = secondsUntil(deadline)
                if seconds <= 0 || !condition.wait(until: Date(timeIntervalSinceNow: seconds)) {
                    if !closed, let connection = idle.popLast() {
                        lent += 1
                        return connection
                    }
                    throw SQLiteError(code: SQLITE_INTERRUPT, connection: nil, context: "waiting for the request deadline")
                }
            } else {
                condition.wait()
            }
        }
    }

    private func giveBack(_ connection: Connection) {
        condition.lock()
        lent -= 1
        if !closed { idle.append(connection) }
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until every connection is back, then closes them all; later uses throw `SQLITE_MISUSE`.
    public func close() {
        condition.lock()
        defer { condition.unlock() }
        closed = true
        idle = []
        while lent > 0 { condition.wait() }
    }
}

/// The monotonic clock (`CLOCK_MONOTONIC`) in nanoseconds: what deadlines here are measured on.
public func monotonicNanoseconds() -> UInt64 {
    var time = timespec()
    clock_gettime(CLOCK_MONOTONIC, &time)
    return UInt64(time.tv_sec) &* 1_000_000_000 &+ UInt64(time.tv_nsec)
}

/// Seconds from now until `deadline` (monotonic nanoseconds); 0 or less once it has passed.
func secondsUntil(_ deadline: UInt64) -> Double {
    let now = monotonicNanoseconds()
    return deadline > now ? Double(deadline - now) / 1e9 : 0
}

/// One caller's write in a group commit (`DatabaseQueue.groupWrite`).
protocol GroupedWrite: AnyObject {
    var deadline: UInt64? { get }
    /// Runs the body (again, if it ran before: the new result replaces the old).
    func run(_ connection: Connection) throws
    /// The write is over: committed (nil) or not (the error). Wakes its caller.
    func complete(_ error: (any Error)?)
    /// Wakes the caller to lead the next group.
    func takeTurn()
}

/// A `GroupedWrite` with its result.
///
/// `@unchecked Sendable`: `body`, `result`, `failure`, `completed` and `leads` are written by the thread that runs the group, or
/// the one that hands it the lead, before `signal` on `wakeUp`, and read by the caller only after its `wait`
/// on it returned (the semaphore orders the two); `body` and `deadline` never change.
final class GroupedJob<T>: GroupedWrite, @unchecked Sendable {
    let deadline: UInt64?
    /// Dropped when the write completes, before its caller wakes: the caller's closure must not outlive its
    /// `groupWrite` call (`withoutActuallyEscaping` checks), and other threads may still hold this job.
    private var body: ((Connection) throws -> T)?
    private var result: T?
    private var failure: (any Error)?
    private var completed = false
    private var leads = false
    private let wakeUp = DispatchSemaphore(value: 0)

    init(deadline: UInt64?, body: @escaping (Connection) throws -> T) {
        self.deadline = deadline
        self.body = body
    }

    func run(_ connection: Connection) throws {
        guard let body else { throw SQLiteError(code: SQLITE_MISUSE, connection: nil, context: "group commit") }
        result = try body(connection)
    }

    func complete(_ error: (any Error)?) {
        body = nil
        failure = error
        completed = true
        wakeUp.signal()
    }

    func takeTurn() {
        leads = true
        wakeUp.signal()
    }

    /// Waits until the write is done or the caller is handed the lead; true for the lead.
    func waitForTurn() -> Bool {
        wakeUp.wait()
        return leads && !completed
    }

    /// Waits until the write is done (at once when it is).
    func waitForCompletion() {
        while !completed { wakeUp.wait() }
    }

    func outcome() throws -> T {
        if let failure { throw failure }
        guard let result else { throw SQLiteError(code: SQLITE_MISUSE, connection: nil, context: "group commit") }
        return result
    }
}
