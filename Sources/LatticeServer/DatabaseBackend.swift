import LatticeStore

/// The PostgreSQL backend as the server opens it: one seam, so the rest of the server names no backend type.
enum DatabaseBackend {
    /// Opens (and migrates) the database named by a libpq connection string with a pool of `poolSize`.
    static func open(url: String, poolSize: Int) throws -> any Storage {
        try PostgresStorage(url: url, poolSize: poolSize)
    }

    /// `url` with any password replaced by `***`.
    static func redacted(_ url: String) -> String {
        PostgresStorage.redacted(url)
    }
}
