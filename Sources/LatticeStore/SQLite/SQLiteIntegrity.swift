import CSQLite
import LatticeSQLite

extension SQLiteStorage {
    /// SQLite's `PRAGMA integrity_check` on the database file at `path`, through a connection of its own
    /// that changes nothing: `["ok"]` when the file is sound, else SQLite's list of problems.
    ///
    /// Safe while a server has the file open (WAL readers do not block writers); used by the crash and
    /// disk-full tests after a `kill -9` or a write refused for lack of space.
    public static func integrityCheck(path: String) throws -> [String] {
        let result: Result<[String], SQLiteError> = checkIntegrity(path: path)
        switch result {
        case .success(let lines): return lines
        case .failure(let error): throw StorageError(error)
        }
    }

    private static func checkIntegrity(path: String) -> Result<[String], SQLiteError> {
        Result { () throws(SQLiteError) -> [String] in
            let connection = try Connection(path: path, readOnly: true)
            return try connection.prepare("PRAGMA integrity_check").rows().map { $0.first?.text ?? "" }
        }
    }
}
