/// Versioned schema migrations, tracked in `PRAGMA user_version`.
///
/// Migration `i` (0-based) moves the schema from version `i` to `i + 1`; each runs in its own
/// transaction together with the version bump, so a crash leaves the schema at a whole version.
public struct Migrator: Sendable {
    public struct Migration: Sendable {
        public let name: String
        public let sql: String
        public init(_ name: String, sql: String) {
            self.name = name
            self.sql = sql
        }
    }

    public let migrations: [Migration]

    public init(_ migrations: [Migration]) { self.migrations = migrations }

    /// The version a fully migrated database has.
    public var latestVersion: Int { migrations.count }

    /// Applies the migrations the database has not seen yet; returns how many ran.
    /// - Throws: `MigrationError.newerSchema` if the database is newer than this code knows.
    @discardableResult
    public func migrate(_ connection: Connection) throws -> Int {
        let current = try connection.userVersion
        guard current <= latestVersion else {
            throw MigrationError.newerSchema(found: current, known: latestVersion)
        }
        for index in current..<latestVersion {
            try connection.transaction { connection in
                try connection.execute(migrations[index].sql)
                try connection.execute("PRAGMA user_version = \(index + 1)")
            }
        }
        return latestVersion - current
    }
}

public enum MigrationError: Error, Hashable, Sendable, CustomStringConvertible {
    case newerSchema(found: Int, known: Int)

    public var description: String {
        switch self {
        case let .newerSchema(found, known):
            return "the database schema is version \(found), newer than this build knows (\(known)); upgrade Lattice"
        }
    }
}
