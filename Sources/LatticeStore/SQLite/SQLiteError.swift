import CSQLite

/// A failed SQLite call: the result code, SQLite's message and what Lattice was doing.
///
/// The description never includes bound values, so it is safe to log; SQL text stays out of HTTP
/// responses (the server maps this error to `INTERNAL_ERROR`).
struct SQLiteError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The primary result code (`SQLITE_BUSY`, `SQLITE_CONSTRAINT`, ...).
    let code: Int32
    /// The extended result code (`SQLITE_CONSTRAINT_UNIQUE`, ...).
    let extendedCode: Int32
    /// SQLite's own message.
    let message: String
    /// What was being done, e.g. "prepare", "step", "open /data/lattice.sqlite".
    let context: String

    var isBusy: Bool { code == SQLITE_BUSY || code == SQLITE_LOCKED }
    var isConstraintViolation: Bool { code == SQLITE_CONSTRAINT }
    /// Interrupted: a statement ran into the request deadline (the progress handler), or a connection was
    /// not free before it.
    var isInterrupt: Bool { code == SQLITE_INTERRUPT }
    /// A UNIQUE or PRIMARY KEY constraint failed: the row exists already.
    var isUniqueViolation: Bool {
        // SQLITE_CONSTRAINT_UNIQUE and SQLITE_CONSTRAINT_PRIMARYKEY are macros Swift cannot import.
        extendedCode == SQLITE_CONSTRAINT | (8 << 8) || extendedCode == SQLITE_CONSTRAINT | (6 << 8)
    }

    var description: String { "SQLite error \(code)/\(extendedCode) during \(context): \(message)" }

    init(code: Int32, connection: OpaquePointer?, context: String) {
        self.code = code & 0xFF
        if let connection {
            extendedCode = sqlite3_extended_errcode(connection)
            message = String(cString: sqlite3_errmsg(connection))
        } else {
            extendedCode = code
            message = String(cString: sqlite3_errstr(code))
        }
        self.context = context
    }
}
