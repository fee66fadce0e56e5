// Pieces of `lattice-bench sync`: a transport that counts the engine's HTTP requests, a crew of client
// threads that run one phase together, and the storage ceiling (frames written straight into SQLite).

import CSQLite
import LatticeCore
import Foundation
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// MARK: Counting transport

/// What one client's requests did since the last `take()`.
struct RequestTally: Sendable {
    var requests = 0
    /// Round-trip time of each request, in seconds.
    var latencies: [Double] = []
    /// Requests by the last two path components (`records/modify`, `changes/zone`, ...).
    var endpoints: [String: Int] = [:]
    /// Requests by their Content-Type header (what the engine put on the wire).
    var contentTypes: [String: Int] = [:]
    /// Answers with HTTP 429 (THROTTLED; the engine retries them after Retry-After).
    var throttled = 0
    /// Other answers outside 2xx.
    var otherErrors = 0
    var requestBytes = 0
    var responseBytes = 0

    mutating func add(_ other: RequestTally) {
        requests += other.requests
        latencies += other.latencies
        endpoints.merge(other.endpoints, uniquingKeysWith: +)
        contentTypes.merge(other.contentTypes, uniquingKeysWith: +)
        throttled += other.throttled
        otherErrors += other.otherErrors
        requestBytes += other.requestBytes
        responseBytes += other.responseBytes
    }
}

/// The engine's real `HTTPTransport` (one per client, so its keep-alive connections are reused), with
/// every exchange counted and timed, in both its forms (async for the app engine, blocking for the old
/// one). It changes nothing in the requests or the answers.
final class CountingTransport: BlockingSyncTransport {
    private let inner: HTTPTransport
    private let tally = Mutex(RequestTally())

    init(serverURL: String) throws {
        inner = try HTTPTransport(serverURL: serverURL)
    }

    func send(_ request: TransportRequest, timeout: TimeInterval) async throws -> TransportResponse {
        let began = monotonicNanoseconds()
        do {
            return counted(request, try await inner.send(request, timeout: timeout), began: began)
        } catch {
            tally.withLock { $0.otherErrors += 1 }
            throw error
        }
    }

    func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
        let began = monotonicNanoseconds()
        do {
            return counted(request, try inner.sendBlocking(request, timeout: timeout), began: began)
        } catch {
            tally.withLock { $0.otherErrors += 1 }
            throw error
        }
    }

    private func counted(_ request: TransportRequest, _ response: TransportResponse, began: UInt64) -> TransportResponse {
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        let endpoint = request.path.split(separator: "/").suffix(2).joined(separator: "/")
        let contentType = request.headers.first { $0.key.lowercased() == "content-type" }?.value
            ?? (request.body.isEmpty ? "none" : "application/json (set by HTTPTransport)")
        tally.withLock { tally in
            tally.requests += 1
            tally.latencies.append(seconds)
            tally.endpoints[endpoint, default: 0] += 1
            tally.contentTypes[contentType, default: 0] += 1
            if response.status == 429 { tally.throttled += 1 }
            else if !(200..<300).contains(response.status) { tally.otherErrors += 1 }
            tally.requestBytes += request.body.count
            tally.responseBytes += response.body.count
        }
        return response
    }

    /// The tally since the last call, and a fresh one.
    func take() -> RequestTally {
        tally.withLock { tally in
            let taken = tally
            tally = RequestTally()
            return taken
        }
    }
}

// MARK: Crew

/// N long-lived threads that run one phase together: `run` hands every thread the same job (called with
/// the thread's index) and returns when all have finished it.
final class Crew: Sendable {
    let count: Int
    private let starts: [DispatchSemaphore]
    private let finished = DispatchSemaphore(value: 0)
    private let job = Mutex<(@Sendable (Int) -> Void)?>(nil)
    private let stopping = Atomic<Bool>(false)

    init(count: Int) {
        self.count = count
        starts = (0..<count).map { _ in DispatchSemaphore(value: 0) }
        for index in 0..<count {
            let thread = Thread { [self] in
                while true {
                    starts[index].wait()
                    if stopping.load(ordering: .acquiring) { break }
                    let body = job.withLock { $0 }
                    body?(index)
                    finished.signal()
                }
                finished.signal()
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
    }

    /// Runs `body(index)` on every thread at once; returns the wall-clock seconds until the last one ended.
    @discardableResult
    func run(_ body: @escaping @Sendable (Int) -> Void) -> Double {
        job.withLock { $0 = body }
        let began = monotonicNanoseconds()
        for start in starts { start.signal() }
        for _ in 0..<count { finished.wait() }
        return Double(monotonicNanoseconds() - began) / 1e9
    }

    /// Ends the threads (after their current job).
    func stop() {
        stopping.store(true, ordering: .releasing)
        for start in starts { start.signal() }
        for _ in 0..<count { finished.wait() }
    }
}

/// The first error any crew thread hit (later ones are dropped).
final class FirstError: Sendable {
    private let slot = Mutex<String?>(nil)

    func record(_ error: any Error, _ context: String) {
        slot.withLock { if $0 == nil { $0 = "\(context): \(error)" } }
    }

    var message: String? { slot.withLock { $0 } }
}

// MARK: Storage ceiling

/// One row for the ceiling: a frame as a client engine produced it.
struct CeilingRow: Sendable {
    var zone: Int64
    var name: String
    var frame: [UInt8]
}

/// The storage ceiling: `rows` written straight into a fresh SQLite file with the server's durability
/// (WAL, `synchronous=FULL`) and `batch` rows per transaction, into a table shaped like the server's
/// `records` (primary key (zone_id, name), a second unique index on (zone_id, seq)), from one writer as
/// the server has. No service around it: no HTTP, no JSON, no validation, no merge.
enum StorageCeiling {
    struct Result {
        var rows: Int
        var transactions: Int
        var seconds: Double
        /// Commit times of the transactions, in seconds.
        var latencies: [Double]
    }

    /// Writes `target` rows (at least every row once), cycling through `rows` (each pass in zones of its own, so
    /// names stay unique), or fewer if `budgetSeconds` pass first (checked between transactions).
    static func measure(rows: [CeilingRow], target: Int, batch: Int, path: String, budgetSeconds: Double) throws
        -> Result {
        for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
        defer { for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) } }
        var handle: OpaquePointer?
        let opened = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        guard opened == SQLITE_OK, let db = handle else {
            sqlite3_close(handle)
            throw SystemError.message("ceiling: cannot open \(path) (SQLite code \(opened))")
        }
        defer { sqlite3_close_v2(db) }
        func check(_ code: Int32, _ what: String, _ expected: Int32 = SQLITE_OK) throws {
            guard code == expected else {
                throw SystemError.message("ceiling: \(what): \(String(cString: sqlite3_errmsg(db))) (code \(code))")
            }
        }
        func execute(_ sql: String) throws { try check(sqlite3_exec(db, sql, nil, nil, nil), sql) }
        try execute("PRAGMA journal_mode=WAL")
        try execute("PRAGMA synchronous=FULL")
        try execute("""
            CREATE TABLE records(
                zone_id INTEGER NOT NULL,
                name TEXT NOT NULL,
                record_type TEXT NOT NULL,
                frame BLOB NOT NULL,
                seq INTEGER NOT NULL,
                PRIMARY KEY(zone_id, name)) WITHOUT ROWID;
            CREATE UNIQUE INDEX records_log ON records(zone_id, seq);
            """)
        var prepared: OpaquePointer?
        try check(sqlite3_prepare_v2(db, "INSERT INTO records(zone_id, name, record_type, frame, seq) VALUES(?, ?, 'Item', ?, ?)",
                                     -1, &prepared, nil), "prepare")
        guard let insert = prepared else { throw SystemError.message("ceiling: prepare returned no statement") }
        defer { sqlite3_finalize(insert) }
        let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self) // SQLITE_TRANSIENT

        return try drive(rows: rows, target: target, batch: batch, budgetSeconds: budgetSeconds) { entries in
            try execute("BEGIN IMMEDIATE")
            for entry in entries {
                sqlite3_reset(insert)
                sqlite3_bind_int64(insert, 1, entry.zone)
                var name = entry.row.name
                try name.withUTF8 { utf8 in
                    try check(sqlite3_bind_text(insert, 2, UnsafeRawPointer(utf8.baseAddress!).assumingMemoryBound(to: CChar.self),
                                                Int32(utf8.count), transient), "bind name")
                }
                try entry.row.frame.withUnsafeBytes { raw in
                    try check(sqlite3_bind_blob(insert, 3, raw.baseAddress, Int32(raw.count), transient), "bind frame")
                }
                sqlite3_bind_int64(insert, 4, entry.seq)
                try check(sqlite3_step(insert), "insert", SQLITE_DONE)
            }
            try execute("COMMIT")
        }
    }

    /// One row of a ceiling's batch: the row, its zone for this pass and its next position there.
    struct Entry {
        let row: CeilingRow
        let zone: Int64
        let seq: Int64
    }

    /// Hands `commit` batches of `batch` entries until `target` rows (at least every row once) are written or
    /// `budgetSeconds` pass (checked between transactions), timing each call as one transaction. Each pass
    /// over `rows` writes into zones of its own, so names stay unique.
    static func drive(rows: [CeilingRow], target: Int, batch: Int, budgetSeconds: Double,
                      commit: ([Entry]) throws -> Void) throws -> Result {
        var sequence: [Int64: Int64] = [:]
        var written = 0
        var transactions = 0
        var latencies: [Double] = []
        let began = monotonicNanoseconds()
        let deadline = began &+ UInt64(budgetSeconds * 1e9)
        let total = rows.isEmpty ? 0 : max(target, rows.count)
        while written < total && monotonicNanoseconds() < deadline {
            let end = min(written + batch, total)
            let entries = (written..<end).map { position -> Entry in
                let row = rows[position % rows.count]
                let zone = row.zone + Int64(position / rows.count) * 1_000_000
                let seq = (sequence[zone] ?? 0) + 1
                sequence[zone] = seq
                return Entry(row: row, zone: zone, seq: seq)
            }
            let transactionBegan = monotonicNanoseconds()
            try commit(entries)
            latencies.append(Double(monotonicNanoseconds() - transactionBegan) / 1e9)
            written = end
            transactions += 1
        }
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        return Result(rows: written, transactions: transactions, seconds: seconds, latencies: latencies)
    }
}

// MARK: Statistics

/// The nearest-rank percentile `p` (0...1) of unsorted values; nil when there are none.
func percentile(_ values: [Double], _ p: Double) -> Double? {
    guard !values.isEmpty else { return nil }
    let sorted = values.sorted()
    let rank = Int((p * Double(sorted.count)).rounded(.up))
    return sorted[min(sorted.count, max(rank, 1)) - 1]
}

extension AccountClient {
    /// `signUp(name:)`, waited for on the benchmark's own threads (never one of Swift's shared threads).
    func signUpWaiting(name: String) throws -> Account { try waitForAsyncWork { try await signUp(name: name) } }

    /// `signIn(token:)`, waited for likewise.
    func signInWaiting(token: String) throws -> Account { try waitForAsyncWork { try await signIn(token: token) } }

    /// `call(_:_:_:as:)`, waited for likewise.
    func callWaiting(_ database: String, _ operation: String, _ body: JSON, as account: Account) throws -> JSON {
        try waitForAsyncWork { try await call(database, operation, body, as: account) }
    }
}
