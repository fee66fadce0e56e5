// `lattice-bench sync --database URL`: a scratch database on the PostgreSQL server of URL for the nodes, and
// the PostgreSQL storage ceiling (the pushed frames committed straight through libpq, with the server's
// durability and the same batch size).

import CPostgres
import Foundation
import LatticeStore
#if canImport(Glibc)
import Glibc
#endif

/// One libpq connection for the benchmark's own statements (not the server's: that is LatticeStore's).
final class BenchPostgresConnection {
    private let handle: OpaquePointer

    /// Connects to `url` (a libpq connection string). The error never shows the URL's password.
    init(url: String, redacted: String) throws {
        guard let connection = PQconnectdb(url) else { throw SystemError.message("libpq: out of memory") }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = String(cString: PQerrorMessage(connection)).trimmingCharacters(in: .whitespacesAndNewlines)
            PQfinish(connection)
            throw SystemError.message("cannot connect to \(redacted): \(message)")
        }
        handle = connection
        try execute("SET client_min_messages TO warning") // no NOTICE lines on stderr ("... does not exist, skipping")
    }

    deinit { PQfinish(handle) }

    /// Runs SQL text (no parameters) and returns the first column of each row as text.
    @discardableResult
    func execute(_ sql: String) throws -> [String?] {
        guard let result = PQexec(handle, sql) else { throw SystemError.message("libpq: no result for \(sql)") }
        defer { PQclear(result) }
        try check(result, sql)
        return (0..<PQntuples(result)).map { row in
            PQgetisnull(result, row, 0) == 1 ? nil : String(cString: PQgetvalue(result, row, 0))
        }
    }

    /// Prepares `sql` under `name`.
    func prepare(_ name: String, _ sql: String) throws {
        guard let result = PQprepare(handle, name, sql, 0, nil) else { throw SystemError.message("libpq: prepare failed") }
        defer { PQclear(result) }
        try check(result, "prepare \(name)")
    }

    /// Runs the prepared statement `name` with `values`, each text (format 0) or binary (format 1).
    func runPrepared(_ name: String, _ values: [(bytes: [UInt8], binary: Bool)]) throws {
        var pointers: [UnsafePointer<CChar>?] = []
        var lengths: [Int32] = []
        var formats: [Int32] = []
        var buffers: [UnsafeMutablePointer<UInt8>] = []
        defer { for buffer in buffers { buffer.deallocate() } }
        for value in values {
            let buffer = UnsafeMutablePointer<UInt8>.allocate(capacity: value.bytes.count + 1)
            buffer.initialize(from: value.bytes, count: value.bytes.count)
            buffer[value.bytes.count] = 0
            buffers.append(buffer)
            pointers.append(UnsafeRawPointer(buffer).assumingMemoryBound(to: CChar.self))
            lengths.append(Int32(value.bytes.count))
            formats.append(value.binary ? 1 : 0)
        }
        guard let result = PQexecPrepared(handle, name, Int32(values.count), pointers, lengths, formats, 0) else {
            throw SystemError.message("libpq: no result for \(name)")
        }
        defer { PQclear(result) }
        try check(result, name)
    }

    private func check(_ result: OpaquePointer, _ what: String) throws {
        let status = PQresultStatus(result)
        guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
            let message = String(cString: PQresultErrorMessage(result)).trimmingCharacters(in: .whitespacesAndNewlines)
            throw SystemError.message("PostgreSQL: \(what): \(message)")
        }
    }
}

/// A database of its own on the server of `--database URL`, for one run: created at the start (the URL's
/// role needs CREATEDB), dropped at the end, so every run starts from an empty deployment.
final class BenchScratchDatabase: Sendable {
    let name: String
    /// The URL's connection string with the scratch database's name.
    let url: String
    let redactedURL: String
    private let adminURL: String
    private let adminRedacted: String
    /// `SHOW fsync`, `SHOW synchronous_commit` of the scratch database.
    let fsync: String
    let synchronousCommit: String

    init(url: String) throws {
        guard let replaced = BenchScratchDatabase.replacingDatabase(in: url, with: "lattice_bench_\(getpid())") else {
            throw SystemError.message("--database must be a postgres:// or postgresql:// URL")
        }
        name = "lattice_bench_\(getpid())"
        adminURL = url
        adminRedacted = PostgresStorage.redacted(url)
        self.url = replaced
        redactedURL = PostgresStorage.redacted(replaced)
        let admin = try BenchPostgresConnection(url: url, redacted: adminRedacted)
        try admin.execute("DROP DATABASE IF EXISTS \(name)")
        try admin.execute("CREATE DATABASE \(name)")
        let scratch = try BenchPostgresConnection(url: replaced, redacted: redactedURL)
        fsync = try scratch.execute("SHOW fsync").first.flatMap { $0 } ?? "?"
        synchronousCommit = try scratch.execute("SHOW synchronous_commit").first.flatMap { $0 } ?? "?"
    }

    /// Drops the database (after the nodes have stopped; `WITH (FORCE)` ends any session left).
    func drop() {
        guard let admin = try? BenchPostgresConnection(url: adminURL, redacted: adminRedacted) else { return }
        _ = try? admin.execute("DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
    }

    /// `url` (postgres:// or postgresql://) naming database `name` instead of its own.
    static func replacingDatabase(in url: String, with name: String) -> String? {
        let lower = url.lowercased()
        guard lower.hasPrefix("postgres://") || lower.hasPrefix("postgresql://"),
              let schemeEnd = url.range(of: "://") else { return nil }
        let rest = url[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let afterAuthority = rest[authorityEnd...]
        var tail = Substring("")
        if afterAuthority.hasPrefix("/") {
            let pathEnd = afterAuthority.firstIndex { $0 == "?" || $0 == "#" } ?? afterAuthority.endIndex
            tail = afterAuthority[pathEnd...]
        } else {
            tail = afterAuthority
        }
        return String(url[..<schemeEnd.upperBound]) + rest[..<authorityEnd] + "/" + name + tail
    }
}

/// The PostgreSQL storage ceiling: `rows` committed straight through libpq into a table shaped like the
/// server's `records` (primary key (zone_id, name), a unique index on (zone_id, seq), the frame as bytea),
/// `batch` rows per transaction, one writer, one multi-row INSERT per transaction (one round trip and one
/// commit flush per batch: the least a backend can do), with the database's own durability (the run's header
/// says fsync and synchronous_commit). No service around it: no HTTP, no JSON, no counters, no merge.
enum PostgresCeiling {
    static func measure(rows: [CeilingRow], target: Int, batch: Int, url: String, redacted: String,
                        budgetSeconds: Double) throws -> StorageCeiling.Result {
        let connection = try BenchPostgresConnection(url: url, redacted: redacted)
        try connection.execute("DROP TABLE IF EXISTS bench_ceiling_records")
        try connection.execute("""
            CREATE TABLE bench_ceiling_records(
                zone_id bigint NOT NULL,
                name text COLLATE "C" NOT NULL,
                record_type text NOT NULL,
                frame bytea NOT NULL,
                seq bigint NOT NULL,
                PRIMARY KEY(zone_id, name));
            CREATE UNIQUE INDEX bench_ceiling_records_log ON bench_ceiling_records(zone_id, seq);
            """)
        defer { _ = try? connection.execute("DROP TABLE IF EXISTS bench_ceiling_records") }
        var prepared: Set<Int> = []
        func statement(_ count: Int) throws -> String {
            let name = "ceiling_insert_\(count)"
            if !prepared.contains(count) {
                let values = (0..<count).map { row in
                    "($\(row * 4 + 1)::bigint, $\(row * 4 + 2), 'Item', $\(row * 4 + 3)::bytea, $\(row * 4 + 4)::bigint)"
                }
                try connection.prepare(name, "INSERT INTO bench_ceiling_records(zone_id, name, record_type, frame, seq) VALUES "
                                       + values.joined(separator: ", "))
                prepared.insert(count)
            }
            return name
        }

        // Prepared before the clock starts, as SQLite's statement is (a shorter last batch prepares its own).
        if !rows.isEmpty { _ = try statement(min(batch, max(target, rows.count))) }
        return try StorageCeiling.drive(rows: rows, target: target, batch: batch, budgetSeconds: budgetSeconds) { entries in
            var values: [(bytes: [UInt8], binary: Bool)] = []
            values.reserveCapacity(entries.count * 4)
            for entry in entries {
                values.append((Array(String(entry.zone).utf8), false))
                values.append((Array(entry.row.name.utf8), false))
                values.append((entry.row.frame, true))
                values.append((Array(String(entry.seq).utf8), false))
            }
            try connection.runPrepared(try statement(entries.count), values) // one statement: its own transaction, committed durably
        }
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on now (bound and released), for a node whose URL must be known
/// before it starts (the nodes' one --public-url).
func freeLoopbackPort() throws -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw SystemError.posix("socket", errno) }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) { pointer in
        pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw SystemError.posix("bind 127.0.0.1:0", errno) }
    return UInt16(bigEndian: address.sin_port)
}
