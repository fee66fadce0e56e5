import CPostgres

/// A failed libpq call: PostgreSQL's SQLSTATE, its primary message, the constraint it names (if any) and
/// what Lattice was doing.
///
/// The description never includes bound values or the connection string's password, so it is safe to log;
/// the server never shows it to a client (the storage maps it to a `StorageError` first).
struct PostgresError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The five-character SQLSTATE (`23505`, `40001`, ...); empty when the failure was the client's own
    /// (no connection, a lost connection, a result libpq could not read).
    let sqlState: String
    /// PostgreSQL's (or libpq's) primary message.
    let message: String
    /// The constraint or index a violation names (`PG_DIAG_CONSTRAINT_NAME`), if any.
    let constraint: String?
    /// What was being done: "connect", "execute", "prepare", "commit", ...
    let context: String
    /// Whether the connection was found unusable afterwards (`PQstatus` is bad).
    let connectionLost: Bool

    init(sqlState: String, message: String, constraint: String? = nil, context: String, connectionLost: Bool = false) {
        self.sqlState = sqlState
        self.message = message
        self.constraint = constraint
        self.context = context
        self.connectionLost = connectionLost
    }

    /// The error a failed result carries (nil result: libpq ran out of memory or lost the connection).
    init(result: OpaquePointer?, connection: OpaquePointer?, context: String) {
        let lost = connection.map { PQstatus($0) != CONNECTION_OK } ?? true
        guard let result else {
            let text = connection.flatMap { PQerrorMessage($0) }.map { String(cString: $0) } ?? "no result"
            self.init(sqlState: "", message: PostgresError.trimmed(text), context: context, connectionLost: lost)
            return
        }
        func field(_ code: UInt8) -> String? {
            PQresultErrorField(result, Int32(code)).map { String(cString: $0) }
        }
        let primary = field(Field.messagePrimary) ?? PQresultErrorMessage(result).map { String(cString: $0) } ?? ""
        self.init(sqlState: field(Field.sqlState) ?? "", message: PostgresError.trimmed(primary),
                  constraint: field(Field.constraintName), context: context, connectionLost: lost)
    }

    /// Result fields (`PG_DIAG_*`, character macros Swift does not import).
    private enum Field {
        static let sqlState = UInt8(ascii: "C")
        static let messagePrimary = UInt8(ascii: "M")
        static let constraintName = UInt8(ascii: "n")
    }

    // MARK: Classes of failure

    /// `unique_violation`: the row exists already.
    var isUniqueViolation: Bool { sqlState == SQLState.uniqueViolation }
    /// `serialization_failure` or `deadlock_detected`: the transaction lost a race and may be run again.
    var isRetryableConflict: Bool { sqlState == SQLState.serializationFailure || sqlState == SQLState.deadlockDetected }
    /// `query_canceled`: a statement ran past `statement_timeout` (the request deadline).
    var isQueryCanceled: Bool { sqlState == SQLState.queryCanceled }
    /// `disk_full`.
    var isDiskFull: Bool { sqlState == SQLState.diskFull }
    /// The connection is gone or the server is going away: class 08 (connection exception), an
    /// administrator's shutdown or termination (57P01-57P03), or a failure libpq reports with the
    /// connection found bad (for example "server closed the connection unexpectedly").
    var isConnectionLoss: Bool {
        connectionLost || sqlState.hasPrefix("08") || SQLState.shutdowns.contains(sqlState)
            || message.contains("server closed the connection") || message.contains("no connection to the server")
    }

    var description: String {
        let state = sqlState.isEmpty ? "" : " \(sqlState)"
        let named = constraint.map { " (constraint \($0))" } ?? ""
        return "PostgreSQL error\(state) during \(context): \(message)\(named)"
    }

    private static func trimmed(_ text: String) -> String {
        var text = text
        while let last = text.last, last.isWhitespace { text.removeLast() }
        return text
    }
}

/// The SQLSTATE codes Lattice acts on (PostgreSQL's Appendix A).
enum SQLState {
    static let uniqueViolation = "23505"
    static let serializationFailure = "40001"
    static let deadlockDetected = "40P01"
    static let queryCanceled = "57014"
    static let diskFull = "53100"
    static let readOnlyTransaction = "25006"
    static let inFailedTransaction = "25P02"
    /// admin_shutdown, crash_shutdown, cannot_connect_now.
    static let shutdowns: Set<String> = ["57P01", "57P02", "57P03"]
}
