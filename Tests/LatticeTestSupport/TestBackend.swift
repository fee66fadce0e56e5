import Foundation
import LatticeStore
#if canImport(Glibc)
import Glibc
#endif

/// The storage backend the test harnesses run on: `LATTICE_TEST_BACKEND=postgres` puts every
/// `ServiceHarness`, every `lattice serve` a test starts (`ServerUnderTest`) and every
/// `lattice admin` it runs on a fresh database of the cluster `LATTICE_TEST_POSTGRES_URL` names; unset or
/// `sqlite`, they use SQLite files as before. Scripts/test.sh runs the correctness suites both ways.
public enum TestBackend: String, Sendable {
    case sqlite
    case postgres

    public static let current: TestBackend = {
        switch ProcessInfo.processInfo.environment["LATTICE_TEST_BACKEND"] ?? "sqlite" {
        case "postgres", "postgresql": .postgres
        default: .sqlite
        }
    }()

    /// A fresh storage for an in-process service: a SQLite file in `directory`, or a new, migrated
    /// PostgreSQL database (`PostgresTestDatabase`) that closing the storage drops; the second value is its URL.
    public static func makeStorage(directory: String) throws -> (any Storage, String?) {
        switch current {
        case .sqlite:
            return (try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName), nil)
        case .postgres:
            let database = try PostgresTestDatabase.create()
            do {
                return (try database.openStorage(poolSize: 2), database.url)
            } catch {
                database.drop()
                throw error
            }
        }
    }

    /// The public URL every `lattice serve` on PostgreSQL gets (`--public-url` is required there, and a
    /// database keeps the one it first served).
    public static let publicURL = "http://lattice.test"

    /// `lattice serve`'s storage options for `data`: `storageArguments`, and on PostgreSQL `--public-url`.
    public static func serveArguments(data: String) throws -> [String] {
        try storageArguments(data: data) + (current == .postgres ? ["--public-url", publicURL] : [])
    }

    /// The storage options for `lattice serve` and `lattice admin` on the data directory `data`: `--data`
    /// on SQLite; on PostgreSQL `--database` with a database made for `data` on first use, and the same
    /// one after (a restarted server finds what its predecessor wrote). The URL is kept in a file beside
    /// the data directory, which the test removes with it.
    public static func storageArguments(data: String) throws -> [String] {
        switch current {
        case .sqlite:
            return ["--data", data]
        case .postgres:
            return ["--database", try TestPostgres.databaseURL(forDataDirectory: data)]
        }
    }
}

/// A failed test set-up step (a database that could not be made, a script that failed).
public struct TestBackendError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// Fresh PostgreSQL databases for tests, on the throwaway cluster Scripts/test.sh starts
/// (Scripts/postgres-test-cluster.sh), reached through `psql`.
public enum TestPostgres {
    /// `LATTICE_TEST_POSTGRES_URL`, the cluster's `lattice` database (a role that may create databases).
    public static var clusterURL: String? {
        ProcessInfo.processInfo.environment["LATTICE_TEST_POSTGRES_URL"].flatMap { $0.isEmpty ? nil : $0 }
    }

    public static func requireClusterURL() throws -> String {
        guard let url = clusterURL else {
            throw TestBackendError("LATTICE_TEST_POSTGRES_URL is not set: run the tests with Scripts/test.sh, or start a "
                + "cluster with Scripts/postgres-test-cluster.sh start DIR and export the URL it prints")
        }
        return url
    }

    /// The PostgreSQL client and server programs: `$PG_BIN`, else Debian's postgresql-15.
    public static var binDirectory: String {
        ProcessInfo.processInfo.environment["PG_BIN"] ?? "/usr/lib/postgresql/15/bin"
    }

    /// `url` with its database name replaced (URL form `postgresql://.../NAME?...`, or keyword form).
    public static func url(_ url: String, database: String) -> String {
        if url.hasPrefix("postgres://") || url.hasPrefix("postgresql://"), var components = URLComponents(string: url) {
            components.percentEncodedPath = "/" + database
            if let rebuilt = components.string { return rebuilt }
        }
        return url + " dbname=" + database  // keyword form: the last dbname wins
    }

    /// Runs `sql` with psql against `url`; returns the unaligned, tuples-only output. Throws with psql's
    /// error text on failure.
    @discardableResult
    public static func psql(_ url: String, _ sql: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binDirectory + "/psql")
        process.arguments = ["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", url, "-c", sql]
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = FileHandle.nullDevice
        try process.run()
        let bytes = output.fileHandleForReading.readDataToEndOfFile()
        let errorBytes = errors.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0 else {
            throw TestBackendError("psql \(sql.prefix(80)): \(String(decoding: errorBytes, as: UTF8.self))")
        }
        return String(decoding: bytes, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// Creates an empty database on the cluster and returns its URL. `label` becomes part of its name.
    public static func createDatabase(_ label: String, cluster: String? = nil) throws -> String {
        let cluster = try cluster ?? requireClusterURL()
        let cleaned = label.lowercased().map { $0.isLetter || $0.isNumber ? $0 : "_" }.prefix(20)
        let name = "t_" + String(cleaned) + "_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(12)
        try psql(cluster, "CREATE DATABASE \(name)")
        return url(cluster, database: name)
    }

    /// Drops the database `url` names, closing its remaining sessions first.
    public static func dropDatabase(_ url: String, cluster: String? = nil) {
        guard let cluster = cluster ?? clusterURL, let name = databaseName(url), name.hasPrefix("t_") else { return }
        _ = try? psql(cluster, "DROP DATABASE IF EXISTS \(name) WITH (FORCE)")
    }

    public static func databaseName(_ url: String) -> String? {
        if let components = URLComponents(string: url), url.contains("://") {
            let path = components.path.drop { $0 == "/" }
            return path.isEmpty ? nil : String(path)
        }
        return url.split(separator: " ").last { $0.hasPrefix("dbname=") }.map { String($0.dropFirst(7)) }
    }

    /// The database a data directory stands for on PostgreSQL: made on first use, its URL kept in
    /// `DATA.postgres-url` (beside the directory: `lattice serve` wants the directory itself to be its own).
    public static func databaseURL(forDataDirectory data: String) throws -> String {
        let file = (data.hasSuffix("/") ? String(data.dropLast()) : data) + ".postgres-url"
        return try lock.withLock {
            if let existing = try? String(contentsOfFile: file, encoding: .utf8), !existing.isEmpty { return existing }
            let url = try PostgresTestDatabase.create().url
            try url.write(toFile: file, atomically: true, encoding: .utf8)
            return url
        }
    }

    private static let lock = NSLock()
}

/// A PostgreSQL cluster of a test's own (for stopping and starting it under load), made and removed with
/// Scripts/postgres-test-cluster.sh. `stop()` and `start()` run pg_ctl as the cluster's owner.
public final class OwnPostgresCluster {
    public let directory: String
    public let url: String

    /// Scripts/postgres-test-cluster.sh, found from this file (Tests/LatticeTestSupport/TestBackend.swift).
    private static let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().appendingPathComponent("Scripts/postgres-test-cluster.sh").path

    public init() throws {
        // Short: the unix socket's path must fit in 107 bytes.
        directory = "/tmp/lattice-pg-" + UUID().uuidString.prefix(8).lowercased()
        url = try Self.run(["start", directory])
    }

    deinit { _ = try? Self.run(["stop", directory]) }

    /// pg_ctl stop -m fast: sessions are cut, nothing committed is lost.
    public func stop() throws { try pgctl(["-m", "fast", "-w", "stop"]) }

    public func start() throws { try pgctl(["-w", "-t", "60", "-l", directory + "/server.log", "start"]) }

    private func pgctl(_ arguments: [String]) throws {
        let command = [TestPostgres.binDirectory + "/pg_ctl", "-D", directory + "/data"] + arguments
        _ = try Self.execute(geteuid() == 0 ? ["/usr/sbin/runuser", "-u", "postgres", "--"] + command : command)
    }

    @discardableResult
    private static func run(_ arguments: [String]) throws -> String {
        try execute(["/bin/bash", script] + arguments)
    }

    /// Runs `command` to its exit (bounded: 120 s) and returns its stdout. Started with posix_spawn and
    /// reaped with waitpid, its output in files: `pg_ctl start` leaves a daemon running with the descriptors
    /// it was given (a pipe would never end), and Foundation's `Process` did not notice such a child's exit.
    private static func execute(_ command: [String]) throws -> String {
        let base = NSTemporaryDirectory() + "lattice-pgctl-" + UUID().uuidString
        defer {
            try? FileManager.default.removeItem(atPath: base + ".out")
            try? FileManager.default.removeItem(atPath: base + ".err")
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, base + ".out", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        posix_spawn_file_actions_addopen(&actions, 2, base + ".err", O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        var arguments: [UnsafeMutablePointer<CChar>?] = command.map { strdup($0) } + [nil]
        defer { for argument in arguments { free(argument) } }
        var pid: pid_t = 0
        let spawned = posix_spawn(&pid, command[0], &actions, nil, &arguments, environ)
        guard spawned == 0 else { throw TestBackendError("\(command[0]): posix_spawn failed (\(spawned))") }
        var status: Int32 = 0
        let started = Date()
        while true {
            let reaped = waitpid(pid, &status, WNOHANG)
            if reaped == pid { break }
            if reaped < 0 && errno != EINTR { throw TestBackendError("\(command[0]): waitpid failed (errno \(errno))") }
            if Date().timeIntervalSince(started) > 120 {
                kill(pid, SIGKILL)
                _ = waitpid(pid, &status, 0)
                throw TestBackendError("\(command.joined(separator: " ")) ran over 120 s")
            }
            usleep(20_000)
        }
        let output = (try? String(contentsOfFile: base + ".out", encoding: .utf8)) ?? ""
        let exitCode = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        guard exitCode == 0 else {
            let errors = (try? String(contentsOfFile: base + ".err", encoding: .utf8)) ?? ""
            throw TestBackendError("\(command.joined(separator: " ")) exited \(exitCode): \(errors)")
        }
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }
}
