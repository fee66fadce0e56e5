import CSQLite
#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif

/// A failed SQLite call: the result code, SQLite's message and what Lattice was doing.
///
/// The description never includes bound values, so it is safe to log; SQL text stays out of HTTP
/// responses (the server maps this error to `INTERNAL_ERROR`, a full disk to `TRY_AGAIN_LATER`).
public struct SQLiteError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The primary result code (`SQLITE_BUSY`, `SQLITE_CONSTRAINT`, ...).
    public let code: Int32
    /// The extended result code (`SQLITE_CONSTRAINT_UNIQUE`, ...).
    public let extendedCode: Int32
    /// SQLite's own message.
    public let message: String
    /// What was being done, e.g. "prepare", "step", "open /data/lattice.sqlite".
    public let context: String
    /// The operating system's `errno` behind an I/O error (`sqlite3_system_errno`), 0 if none.
    public let systemErrno: Int32

    public var isBusy: Bool { code == SQLITE_BUSY || code == SQLITE_LOCKED }
    public var isConstraintViolation: Bool { code == SQLITE_CONSTRAINT }
    /// Interrupted: a statement ran into the request deadline (the progress handler), or a connection was
    /// not free before it.
    public var isInterrupt: Bool { code == SQLITE_INTERRUPT }
    /// A UNIQUE or PRIMARY KEY constraint failed: the row exists already.
    public var isUniqueViolation: Bool {
        // SQLITE_CONSTRAINT_UNIQUE and SQLITE_CONSTRAINT_PRIMARYKEY are macros Swift cannot import.
        extendedCode == SQLITE_CONSTRAINT | (8 << 8) || extendedCode == SQLITE_CONSTRAINT | (6 << 8)
    }

    /// The disk (or the process's file-size limit) has no room for the write: `SQLITE_FULL` (SQLite's
    /// answer to ENOSPC, and to a write cut short at `RLIMIT_FSIZE`), or an I/O error in growing a file
    /// whose cause is ENOSPC, EDQUOT or EFBIG. SQLite often loses that cause (its `errno` is read after
    /// other calls), so a failed write, truncate or shared-memory growth while this process runs under a
    /// file-size limit counts too: past the limit the kernel refuses with EFBIG (SIGXFSZ is ignored).
    /// Nothing of the failed transaction is kept, and writes succeed again once there is space.
    public var isDiskFull: Bool {
        if code == SQLITE_FULL { return true }
        guard code == SQLITE_IOERR else { return false }
        if [ENOSPC, EDQUOT, EFBIG].contains(systemErrno) { return true }
        // SQLITE_IOERR_WRITE, _TRUNCATE and _SHMSIZE: macros Swift cannot import.
        let growing = [SQLITE_IOERR | (3 << 8), SQLITE_IOERR | (6 << 8), SQLITE_IOERR | (19 << 8)]
        return growing.contains(extendedCode) && Self.processHasFileSizeLimit
    }

    /// Whether this process runs under a finite `RLIMIT_FSIZE` (as `prlimit --fsize` sets).
    public static var processHasFileSizeLimit: Bool {
        var limit = rlimit()
        #if canImport(Darwin)
        guard getrlimit(RLIMIT_FSIZE, &limit) == 0 else { return false }
        #else
        guard getrlimit(__rlimit_resource_t(RLIMIT_FSIZE.rawValue), &limit) == 0 else { return false }
        #endif
        return limit.rlim_cur != rlim_t.max // RLIM_INFINITY
    }

    public var description: String {
        let cause = systemErrno == 0 ? "" : " (errno \(systemErrno): \(String(cString: strerror(systemErrno))))"
        return "SQLite error \(code)/\(extendedCode) during \(context): \(message)\(cause)"
    }

    public init(code: Int32, connection: OpaquePointer?, context: String) {
        self.code = code & 0xFF
        if let connection {
            extendedCode = sqlite3_extended_errcode(connection)
            message = String(cString: sqlite3_errmsg(connection))
            systemErrno = sqlite3_system_errno(connection)
        } else {
            extendedCode = code
            message = String(cString: sqlite3_errstr(code))
            systemErrno = 0
        }
        self.context = context
    }
}
