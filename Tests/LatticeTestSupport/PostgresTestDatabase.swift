import CPostgres
import Foundation
import LatticeStore
import Synchronization

/// A fresh, empty, migrated database per test, on the throwaway cluster whose URL is in
/// `LATTICE_TEST_POSTGRES_URL` (Scripts/test.sh starts one with Scripts/postgres-test-cluster.sh and exports it).
/// Test support: this target is in no product, so the shipped libraries and `lattice` do not contain it.
///
/// The first database of a process copies a template migrated once (`lattice_tpl_<fingerprint of the
/// migrations>`), so each later one is a `CREATE DATABASE ... TEMPLATE`. Database names are generated here
/// (hex), never taken from input, and are the only identifiers spliced into SQL.
///
/// ```swift
/// let database = try PostgresTestDatabase.create()
/// let storage = try database.openStorage() // closing it drops the database
/// ```
public final class PostgresTestDatabase: Sendable {
    /// The environment variable with the test cluster's URL.
    public static let environmentVariable = "LATTICE_TEST_POSTGRES_URL"

    /// The database's name.
    public let name: String
    /// A connection string for it.
    public let url: String
    private let adminURL: String
    private let dropped = Atomic<Bool>(false)

    private static let templateReady = Mutex<String?>(nil)

    private init(name: String, url: String, adminURL: String) {
        self.name = name
        self.url = url
        self.adminURL = adminURL
    }

    /// Why a test database could not be made.
    public struct SetupError: Error, CustomStringConvertible {
        public let description: String
    }

    /// The test cluster's URL.
    /// - Throws: `SetupError` saying how to get one when the variable is not set.
    public static func clusterURL() throws -> String {
        guard let url = ProcessInfo.processInfo.environment[environmentVariable], !url.isEmpty else {
            throw SetupError(description: "\(environmentVariable) is not set, so the PostgreSQL tests cannot run: run "
                             + "Scripts/test.sh (it starts a throwaway cluster), or start one with "
                             + "`Scripts/postgres-test-cluster.sh start DIR` and export the URL it prints as "
                             + environmentVariable)
        }
        return url
    }

    /// Creates a fresh database on the test cluster: migrated to the current schema, or with no tables at all.
    public static func create(migrated: Bool = true) throws -> PostgresTestDatabase {
        let adminURL = try clusterURL()
        let template = migrated ? try ensureTemplate(adminURL) : "template0"
        var random = SystemRandomNumberGenerator()
        let name = "lattice_test_" + String(random.next() as UInt64, radix: 16)
        try withAdmin(adminURL) { admin in
            try admin.execute("CREATE DATABASE \"\(name)\" TEMPLATE \"\(template)\"")
        }
        return PostgresTestDatabase(name: name, url: url(adminURL, database: name), adminURL: adminURL)
    }

    /// Opens the database as storage; closing the storage drops the database.
    public func openStorage(poolSize: Int = PostgresStorage.defaultPoolSize) throws -> PostgresStorage {
        try PostgresStorage(url: url, poolSize: poolSize, onClose: { [self] in drop() })
    }

    /// Drops the database (its connections are ended first); harmless twice.
    public func drop() {
        guard !dropped.exchange(true, ordering: .sequentiallyConsistent) else { return }
        try? PostgresTestDatabase.withAdmin(adminURL) { admin in
            try admin.execute("DROP DATABASE IF EXISTS \"\(name)\" WITH (FORCE)")
        }
    }

    /// Runs SQL without parameters on the cluster's maintenance connection (tests: `pg_terminate_backend`).
    public static func executeOnCluster(_ sql: String) throws {
        try withAdmin(try clusterURL()) { try $0.execute(sql) }
    }

    // MARK: Template

    /// The advisory lock that makes the template once per cluster: one above LatticeStore's migration lock
    /// ("LATTICE" and 1), so it never waits on a migration.
    private static let templateLockKey: Int64 = 0x4C41_5454_4943_4502

    /// The name of the migrated template, made once per cluster (under an advisory lock, so concurrent test
    /// processes make it once) and once per process checked.
    private static func ensureTemplate(_ adminURL: String) throws -> String {
        let template = "lattice_tpl_" + PostgresStorage.schemaFingerprint
        if templateReady.withLock({ $0 }) == template { return template }
        try withAdmin(adminURL) { admin in
            try admin.execute("SELECT pg_advisory_lock(\(templateLockKey))")
            defer { try? admin.execute("SELECT pg_advisory_unlock(\(templateLockKey))") }
            // The template's name is ours (hex), so it may be spliced into the query.
            guard try admin.rowCount("SELECT 1 FROM pg_database WHERE datname = '\(template)'") == 0 else { return }
            // Built under a temporary name and renamed when whole, so a crash leaves no half template.
            let building = template + "_building"
            try admin.execute("DROP DATABASE IF EXISTS \"\(building)\" WITH (FORCE)")
            try admin.execute("CREATE DATABASE \"\(building)\" TEMPLATE template0 ENCODING 'UTF8'")
            // Opening it as storage migrates it; closing it ends its connections.
            try PostgresStorage(url: url(adminURL, database: building), poolSize: 1).close()
            try admin.execute("ALTER DATABASE \"\(building)\" RENAME TO \"\(template)\"")
        }
        templateReady.withLock { $0 = template }
        return template
    }

    private static func withAdmin<T>(_ adminURL: String, _ body: (AdminConnection) throws -> T) throws -> T {
        try body(try AdminConnection(adminURL))
    }

    /// `base` with its database replaced by `database` (URL or key=value form).
    static func url(_ base: String, database: String) -> String {
        guard PostgresStorage.isPostgresURL(base), let schemeEnd = base.range(of: "://") else {
            // key=value: a later dbname overrides an earlier one.
            return base + " dbname='\(database)'"
        }
        let head = base[..<schemeEnd.upperBound]
        let rest = base[schemeEnd.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        var tail = rest[authorityEnd...]
        if tail.hasPrefix("/") {
            tail = tail[(tail.firstIndex(of: "?") ?? tail.endIndex)...]
        }
        return head + authority + "/" + database + tail
    }
}

/// The cluster's maintenance connection: SQL without parameters through libpq's `PQexec`, for creating and
/// dropping databases. LatticeStore's own connection type stays internal to it.
private final class AdminConnection {
    private let handle: OpaquePointer

    init(_ url: String) throws {
        guard let connection = PQconnectdb(url) else {
            throw PostgresTestDatabase.SetupError(description: "cannot connect to the test cluster: out of memory")
        }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = PQerrorMessage(connection).map { String(cString: $0) } ?? "cannot connect"
            PQfinish(connection)
            // libpq's message names host and port, never the password.
            throw PostgresTestDatabase.SetupError(
                description: "cannot connect to the test cluster \(PostgresStorage.redacted(url)) "
                    + "(\(PostgresTestDatabase.environmentVariable)): "
                    + message.trimmingCharacters(in: .whitespacesAndNewlines))
        }
        handle = connection
        // Server notices ("database ... does not exist, skipping") are not for the test output.
        PQsetNoticeProcessor(handle, { _, _ in }, nil)
    }

    deinit { PQfinish(handle) }

    /// Runs `sql`; throws with the server's message when it fails.
    func execute(_ sql: String) throws {
        _ = try run(sql)
    }

    /// The number of rows `sql` returns.
    func rowCount(_ sql: String) throws -> Int {
        try run(sql)
    }

    private func run(_ sql: String) throws -> Int {
        guard let result = PQexec(handle, sql) else {
            throw PostgresTestDatabase.SetupError(description: "\(sql.prefix(60)): no result (connection lost?)")
        }
        defer { PQclear(result) }
        switch PQresultStatus(result) {
        case PGRES_COMMAND_OK:
            return 0
        case PGRES_TUPLES_OK:
            return Int(PQntuples(result))
        default:
            let message = PQresultErrorMessage(result).map { String(cString: $0) } ?? "failed"
            throw PostgresTestDatabase.SetupError(
                description: "\(sql.prefix(60)): \(message.trimmingCharacters(in: .whitespacesAndNewlines))")
        }
    }
}
