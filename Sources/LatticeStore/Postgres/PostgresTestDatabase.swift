import Foundation
import Synchronization

/// Test support (used by the test targets, not by the service): a fresh, empty, migrated database per test,
/// on the throwaway cluster whose URL is in `LATTICE_TEST_POSTGRES_URL` (Scripts/test.sh starts one with
/// Scripts/postgres-test-cluster.sh and exports it).
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
            try admin.execute("CREATE DATABASE \"\(name)\" TEMPLATE \"\(template)\"", context: "create test database")
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
            try admin.execute("DROP DATABASE IF EXISTS \"\(name)\" WITH (FORCE)", context: "drop test database")
        }
    }

    /// Runs SQL without parameters on the cluster's maintenance connection (tests: `pg_terminate_backend`).
    public static func executeOnCluster(_ sql: String) throws {
        try withAdmin(try clusterURL()) { try $0.execute(sql) }
    }

    // MARK: Template

    /// The name of the migrated template, made once per cluster (under an advisory lock, so concurrent test
    /// processes make it once) and once per process checked.
    private static func ensureTemplate(_ adminURL: String) throws -> String {
        let template = "lattice_tpl_" + PostgresStorage.migrator.fingerprint
        if templateReady.withLock({ $0 }) == template { return template }
        try withAdmin(adminURL) { admin in
            try admin.query("SELECT pg_advisory_lock($1)", [.integer(PostgresMigrator.lockKey + 1)])
            defer { _ = try? admin.query("SELECT pg_advisory_unlock($1)", [.integer(PostgresMigrator.lockKey + 1)]) }
            let exists = try admin.rows("SELECT 1 FROM pg_database WHERE datname = $1", [.text(template)])
            guard exists.isEmpty else { return }
            // Built under a temporary name and renamed when whole, so a crash leaves no half template.
            let building = template + "_building"
            try admin.execute("DROP DATABASE IF EXISTS \"\(building)\" WITH (FORCE)")
            try admin.execute("CREATE DATABASE \"\(building)\" TEMPLATE template0 ENCODING 'UTF8'")
            do {
                let connection = try PostgresConnection(url(adminURL, database: building))
                try PostgresStorage.migrator.migrate(connection)
            }
            try admin.execute("ALTER DATABASE \"\(building)\" RENAME TO \"\(template)\"")
        }
        templateReady.withLock { $0 = template }
        return template
    }

    private static func withAdmin<T>(_ adminURL: String, _ body: (PostgresConnection) throws -> T) throws -> T {
        let connection: PostgresConnection
        do {
            connection = try PostgresConnection(adminURL)
        } catch {
            throw SetupError(description: "cannot connect to the test cluster \(PostgresStorage.redacted(adminURL)) "
                             + "(\(environmentVariable)): \(error.description)")
        }
        return try body(connection)
    }

    /// `base` with its database replaced by `database` (URL or key=value form).
    static func url(_ base: String, database: String) -> String {
        guard PostgresConnectionString.isPostgres(base), let schemeEnd = base.range(of: "://") else {
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
