import CPostgres
import Foundation

/// A value PostgreSQL takes as a parameter or returns in a column, in the types Lattice uses.
///
/// Parameters go in libpq's binary format with their type named (`int8`, `text`, `bytea`, `bool` and
/// one-dimensional arrays of them), so no value is ever spliced into SQL text or escaped; results come back in
/// binary format too, so a `bytea` is its bytes exactly.
enum PostgresValue: Hashable, Sendable, StorageColumn {
    case null
    case integer(Int64)
    case text(String)
    case bytea([UInt8])
    case boolean(Bool)
    /// `int8[]` (for `unnest`).
    case integers([Int64])
    /// `text[]`; nil elements are NULL.
    case texts([String?])
    /// `bytea[]`.
    case byteas([[UInt8]])

    var integer: Int64 {
        switch self {
        case .integer(let value): return value
        case .boolean(let value): return value ? 1 : 0
        default: return 0
        }
    }

    var text: String? {
        if case .text(let value) = self { return value }
        return nil
    }

    var bytes: [UInt8] {
        if case .bytea(let value) = self { return value }
        return []
    }

    var isNull: Bool { self == .null }
}

/// Type OIDs from PostgreSQL's catalog (`pg_type`), stable across versions.
enum PostgresType {
    static let bool: Oid = 16
    static let bytea: Oid = 17
    static let name: Oid = 19
    static let int8: Oid = 20
    static let int2: Oid = 21
    static let int4: Oid = 23
    static let text: Oid = 25
    static let oid: Oid = 26
    static let bpchar: Oid = 1042
    static let varchar: Oid = 1043
    static let void: Oid = 2278
    static let byteaArray: Oid = 1001
    static let textArray: Oid = 1009
    static let int8Array: Oid = 1016
}

/// What a statement returned: its rows (binary results, decoded) and how many rows it changed.
struct PostgresResult {
    var rows: [[PostgresValue]]
    /// `PQcmdTuples`: rows inserted, updated, deleted or selected (0 for other commands).
    var affectedRows: Int
}

/// One libpq connection. Owns its `PGconn` and finishes it in `deinit`.
///
/// Not thread-safe: use it from one thread at a time (`PostgresPool` lends it to one transaction at a
/// time). Statements with parameters are prepared once per connection and run with `PQexecPrepared`;
/// statements without parameters (transaction control, schema changes) run with `PQexec`.
final class PostgresConnection {
    private let handle: OpaquePointer
    /// SQL text -> the name it was prepared under on this connection.
    private var prepared: [String: String] = [:]
    /// A command sent without waiting for its answer (`sendWithoutWaiting`), read before the next one.
    private var awaitingAnswer = false
    /// Transactions run on this connection (PostgresStorage: 0 means it was opened just now).
    var transactionsBegun = 0

    /// Connects with a libpq connection string (a `postgresql://` URL or `key=value` pairs; libpq reads a
    /// password from the string, `PGPASSWORD` or `~/.pgpass`). The client encoding is always UTF8.
    init(_ conninfo: String, connectTimeoutSeconds: Int = 10) throws(PostgresError) {
        // The connection string's own settings override the connect timeout, the application name and the
        // TCP settings (expand_dbname applies them after), but not the encoding, which comes last.
        // TCP keepalives (first probe after 30 s idle, every 10 s, 3 misses) and a 30 s TCP_USER_TIMEOUT: a
        // database host that vanished without closing the connection is noticed in about a minute, not
        // after the kernel's two hours, so a waiting transaction fails (.busy, then reconnect) instead of
        // holding its thread. (libpq ignores them on a Unix socket.)
        let keywords = ["connect_timeout", "fallback_application_name", "keepalives", "keepalives_idle",
                        "keepalives_interval", "keepalives_count", "tcp_user_timeout", "dbname", "client_encoding"]
        let values = [String(max(1, connectTimeoutSeconds)), "lattice", "1", "30", "10", "3", "30000", conninfo, "UTF8"]
        let connection = PostgresConnection.withCStrings(keywords) { keywordPointers in
            PostgresConnection.withCStrings(values) { valuePointers in
                PQconnectdbParams(keywordPointers, valuePointers, 1)
            }
        }
        guard let connection else {
            throw PostgresError(sqlState: "", message: "out of memory", context: "connect", connectionLost: true)
        }
        guard PQstatus(connection) == CONNECTION_OK else {
            let message = PQerrorMessage(connection).map { String(cString: $0) } ?? "cannot connect"
            PQfinish(connection)
            // libpq's message names host and port, never the password.
            throw PostgresError(sqlState: "", message: message.trimmingCharacters(in: .whitespacesAndNewlines),
                                context: "connect", connectionLost: true)
        }
        handle = connection
        // Server notices (e.g. "relation already exists, skipping") are not for our logs.
        PQsetNoticeProcessor(handle, { _, _ in }, nil)
    }

    deinit { PQfinish(handle) }

    /// Whether the connection is still good (not lost to a server shutdown or a network failure).
    /// Set when a failure left the connection in a state libpq has not judged yet (`pipeline`): it is then
    /// not used again, whatever `PQstatus` says.
    private var abandoned = false

    var isUsable: Bool { !abandoned && PQstatus(handle) == CONNECTION_OK }

    /// Whether a transaction is open on the connection (in progress or failed).
    var isInTransaction: Bool {
        let status = PQtransactionStatus(handle)
        return status == PQTRANS_INTRANS || status == PQTRANS_INERROR
    }

    /// The server's process id for this connection (for `pg_terminate_backend` in tests).
    var backendPID: Int32 { PQbackendPID(handle) }

    /// The libpq socket, for waiting on notifications.
    var socket: Int32 { PQsocket(handle) }

    /// Waits until the server has sent something (a notification, or the connection closing) or `milliseconds`
    /// pass; true when there is input to read. `EINTR` is waited out.
    func waitForInput(milliseconds: Int32) -> Bool {
        var descriptor = pollfd(fd: socket, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&descriptor, 1, milliseconds)
            if ready < 0 && errno == EINTR { continue }
            return ready > 0
        }
    }

    /// Reads what the server sent and returns the notifications received since the last call (channel and
    /// payload), in order.
    /// - Throws: a connection-loss `PostgresError` when the connection is gone.
    func notifications() throws(PostgresError) -> [(channel: String, payload: String)] {
        guard PQconsumeInput(handle) == 1, isUsable else {
            let message = PQerrorMessage(handle).map { String(cString: $0) } ?? "connection lost"
            throw PostgresError(sqlState: "", message: message.trimmingCharacters(in: .whitespacesAndNewlines),
                                context: "listen", connectionLost: true)
        }
        var received: [(channel: String, payload: String)] = []
        while let notification = PQnotifies(handle) {
            let channel = String(cString: notification.pointee.relname)
            let payload = notification.pointee.extra.map { String(cString: $0) } ?? ""
            PQfreemem(notification)
            received.append((channel, payload))
        }
        return received
    }

    /// Sends statements that take no parameters (a read-only transaction's `COMMIT`) without waiting for the
    /// answer, which the connection's next command reads first (and drops: a failure there shows again on
    /// that next command). Saves the caller a round trip when nothing depends on the answer.
    func sendWithoutWaiting(_ sql: String) {
        drainAnswer()
        if PQsendQuery(handle, sql) == 1 { awaitingAnswer = true }
    }

    /// Reads and drops the answer of a command sent without waiting.
    private func drainAnswer() {
        guard awaitingAnswer else { return }
        awaitingAnswer = false
        while let result = PQgetResult(handle) { PQclear(result) }
    }

    /// Whether a transaction is open on the connection, reading the answer of a command in flight first.
    var isInTransactionAfterDraining: Bool {
        drainAnswer()
        return isInTransaction
    }

    /// Runs statements that take no parameters (transaction control, `SET`, schema changes) with the simple
    /// query protocol. Several statements may be separated by semicolons.
    func execute(_ sql: String, context: String = "execute") throws(PostgresError) {
        drainAnswer()
        let result = PQexec(handle, sql)
        defer { PQclear(result) }
        try check(result, context: context)
    }

    /// Runs one statement with parameters bound in binary format; results are binary too.
    @discardableResult
    func query(_ sql: String, _ values: [PostgresValue] = [], context: String = "query") throws(PostgresError)
        -> PostgresResult {
        drainAnswer()
        let name = try preparedName(sql, values)
        let result = PostgresConnection.withParameters(values) { pointers, lengths, formats in
            PQexecPrepared(handle, name, Int32(values.count), pointers, lengths, formats, 1)
        }
        defer { PQclear(result) }
        try check(result, context: context)
        return try decode(result!)
    }

    /// Runs `preamble` (statements without parameters, such as `BEGIN`) and then one statement with
    /// parameters in a single round trip (libpq's pipeline mode). The first failure is thrown; a statement
    /// after a failed one does not run.
    func query(_ sql: String, _ values: [PostgresValue], after preamble: [String], context: String = "query")
        throws(PostgresError) -> PostgresResult {
        guard !preamble.isEmpty else { return try query(sql, values, context: context) }
        drainAnswer()
        let name = try preparedName(sql, values)
        guard PQenterPipelineMode(handle) == 1 else {
            throw PostgresError(result: nil, connection: handle, context: context)
        }
        var sent = 0
        var sending = true
        for statement in preamble where sending {
            sending = PQsendQueryParams(handle, statement, 0, nil, nil, nil, nil, 0) == 1
            if sending { sent += 1 }
        }
        if sending {
            sending = PostgresConnection.withParameters(values) { pointers, lengths, formats in
                PQsendQueryPrepared(handle, name, Int32(values.count), pointers, lengths, formats, 1)
            } == 1
            if sending { sent += 1 }
        }
        let synced = PQpipelineSync(handle) == 1
        var failure: PostgresError? = sending && synced ? nil
            : PostgresError(result: nil, connection: handle, context: context)
        var final: PostgresResult? = nil
        for index in 0..<sent {
            guard let result = PQgetResult(handle) else {
                if failure == nil { failure = PostgresError(result: nil, connection: handle, context: context) }
                break
            }
            let status = PQresultStatus(result)
            if status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK {
                if index == sent - 1 {
                    do { final = try decode(result) } catch { if failure == nil { failure = error } }
                }
            } else if status != PGRES_PIPELINE_ABORTED, failure == nil {
                failure = PostgresError(result: result, connection: handle, context: context)
            }
            PQclear(result)
            // Each command's results end with a NULL.
            while let extra = PQgetResult(handle) { PQclear(extra) }
        }
        if synced, let sync = PQgetResult(handle) { PQclear(sync) }
        if PQexitPipelineMode(handle) != 1, failure == nil {
            failure = PostgresError(result: nil, connection: handle, context: context)
        }
        if let failure { throw failure }
        guard let final else { throw PostgresError(result: nil, connection: handle, context: context) }
        return final
    }

    /// Runs `statements` in order in one round trip (libpq's pipeline mode): those with values prepared (once
    /// per connection) and bound in binary, those without sent as they are (one statement each, such as
    /// `COMMIT`). A statement after a failed one does not run.
    /// - Returns: nil when every statement succeeded; else the index of the first that failed, with its error
    ///   (a connection lost anywhere is reported as a loss, whatever ran before it).
    func pipeline(_ statements: [(sql: String, values: [PostgresValue])], context: String) -> (index: Int, error: PostgresError)? {
        drainAnswer()
        var names: [String?] = []
        for (index, statement) in statements.enumerated() {
            guard !statement.values.isEmpty else {
                names.append(nil)
                continue
            }
            do {
                names.append(try preparedName(statement.sql, statement.values))
            } catch {
                return (index, error)
            }
        }
        guard PQenterPipelineMode(handle) == 1 else {
            return (0, PostgresError(result: nil, connection: handle, context: context))
        }
        var sent = 0
        for (statement, name) in zip(statements, names) {
            let ok: Bool
            if let name {
                ok = PostgresConnection.withParameters(statement.values) { pointers, lengths, formats in
                    PQsendQueryPrepared(handle, name, Int32(statement.values.count), pointers, lengths, formats, 1)
                } == 1
            } else {
                ok = PQsendQueryParams(handle, statement.sql, 0, nil, nil, nil, nil, 1) == 1
            }
            guard ok else { break }
            sent += 1
        }
        let synced = PQpipelineSync(handle) == 1
        var failure: (index: Int, error: PostgresError)? = sent == statements.count && synced ? nil
            : (sent, PostgresError(result: nil, connection: handle, context: context))
        for index in 0..<sent {
            guard let result = PQgetResult(handle) else {
                if failure == nil || failure!.index > index {
                    failure = (index, PostgresError(result: nil, connection: handle, context: context))
                }
                break
            }
            let status = PQresultStatus(result)
            if status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK && status != PGRES_PIPELINE_ABORTED,
               failure == nil || failure!.index > index {
                failure = (index, PostgresError(result: result, connection: handle, context: context))
            }
            PQclear(result)
            // Each command's results end with a NULL.
            while let extra = PQgetResult(handle) { PQclear(extra) }
        }
        if synced, let sync = PQgetResult(handle) { PQclear(sync) }
        if PQexitPipelineMode(handle) != 1, failure == nil {
            failure = (statements.count - 1, PostgresError(result: nil, connection: handle, context: context))
        }
        // A failure without a SQLSTATE is libpq's own (no result to read, the pipeline not left: say, the
        // server's FATAL "terminating connection due to administrator command" arriving before libpq has
        // marked the connection bad): the connection's state is unknown, so it counts as lost, and a
        // COMMIT in it as one that may or may not have happened.
        if let found = failure, !found.error.isConnectionLoss, !isUsable || found.error.sqlState.isEmpty {
            abandoned = true
            return (found.index, PostgresError(sqlState: "", message: found.error.message, context: context,
                                               connectionLost: true))
        }
        return failure
    }

    /// Runs one statement with parameters without keeping it prepared (for statements made once, such as a
    /// multi-row INSERT of a copy); parameter types come from the values, NULLs from their context.
    @discardableResult
    func queryOnce(_ sql: String, _ values: [PostgresValue], context: String = "query") throws(PostgresError)
        -> PostgresResult {
        drainAnswer()
        let types = values.map(\.typeOID)
        let result = types.withUnsafeBufferPointer { typeBuffer in
            PostgresConnection.withParameters(values) { pointers, lengths, formats in
                PQexecParams(handle, sql, Int32(values.count), typeBuffer.baseAddress, pointers, lengths, formats, 1)
            }
        }
        defer { PQclear(result) }
        try check(result, context: context)
        return try decode(result!)
    }

    /// The rows of one statement.
    func rows(_ sql: String, _ values: [PostgresValue] = []) throws(PostgresError) -> [[PostgresValue]] {
        try query(sql, values).rows
    }

    private func preparedName(_ sql: String, _ values: [PostgresValue]) throws(PostgresError) -> String {
        if let name = prepared[sql] { return name }
        let name = "lattice_\(prepared.count + 1)"
        let types = values.map(\.typeOID)
        let result = types.withUnsafeBufferPointer { buffer in
            PQprepare(handle, name, sql, Int32(types.count), buffer.baseAddress)
        }
        defer { PQclear(result) }
        try check(result, context: "prepare")
        prepared[sql] = name
        return name
    }

    private func check(_ result: OpaquePointer?, context: String) throws(PostgresError) {
        if let result {
            let status = PQresultStatus(result)
            if status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK || status == PGRES_EMPTY_QUERY { return }
        }
        throw PostgresError(result: result, connection: handle, context: context)
    }

    private func decode(_ result: OpaquePointer) throws(PostgresError) -> PostgresResult {
        let rowCount = Int(PQntuples(result))
        let columnCount = Int(PQnfields(result))
        let types = (0..<columnCount).map { PQftype(result, Int32($0)) }
        var rows: [[PostgresValue]] = []
        rows.reserveCapacity(rowCount)
        for row in 0..<rowCount {
            var values: [PostgresValue] = []
            values.reserveCapacity(columnCount)
            for column in 0..<columnCount {
                if PQgetisnull(result, Int32(row), Int32(column)) != 0 {
                    values.append(.null)
                    continue
                }
                let length = Int(PQgetlength(result, Int32(row), Int32(column)))
                let raw = UnsafeRawBufferPointer(start: PQgetvalue(result, Int32(row), Int32(column)), count: length)
                values.append(try PostgresConnection.decodeBinary(raw, type: types[column]))
            }
            rows.append(values)
        }
        let affected = PQcmdTuples(result).map { Int(String(cString: $0)) ?? 0 } ?? 0
        return PostgresResult(rows: rows, affectedRows: affected)
    }

    /// One column value in binary format.
    private static func decodeBinary(_ raw: UnsafeRawBufferPointer, type: Oid) throws(PostgresError) -> PostgresValue {
        func bigEndian(_ size: Int) -> Int64 {
            var value: UInt64 = 0
            for byte in raw.prefix(size) { value = value << 8 | UInt64(byte) }
            // Sign-extend from `size` bytes.
            let shift = UInt64(64 - 8 * size)
            return Int64(bitPattern: value << shift) >> shift
        }
        switch type {
        case PostgresType.int8 where raw.count == 8: return .integer(bigEndian(8))
        case PostgresType.int4 where raw.count == 4, PostgresType.oid where raw.count == 4:
            return type == PostgresType.oid ? .integer(Int64(UInt32(truncatingIfNeeded: bigEndian(4)))) : .integer(bigEndian(4))
        case PostgresType.int2 where raw.count == 2: return .integer(bigEndian(2))
        case PostgresType.bool where raw.count == 1: return .boolean(raw[0] != 0)
        case PostgresType.bytea: return .bytea(Array(raw))
        case PostgresType.text, PostgresType.varchar, PostgresType.name, PostgresType.bpchar:
            return .text(String(decoding: raw, as: UTF8.self))
        case PostgresType.void: return .null
        default:
            throw PostgresError(sqlState: "", message: "a result column of type oid \(type) is not supported",
                                context: "decode")
        }
    }

    // MARK: Parameters

    /// Lays every parameter out in one buffer and calls `body` with libpq's three parallel arrays.
    private static func withParameters<R>(
        _ values: [PostgresValue],
        _ body: (UnsafePointer<UnsafePointer<CChar>?>?, UnsafePointer<Int32>?, UnsafePointer<Int32>?) -> R
    ) -> R {
        var buffer: [UInt8] = []
        var ranges: [Range<Int>?] = []
        ranges.reserveCapacity(values.count)
        for value in values {
            guard !value.isNull else {
                ranges.append(nil)
                continue
            }
            let start = buffer.count
            value.appendBinary(to: &buffer)
            ranges.append(start..<buffer.count)
        }
        buffer.append(0) // a base address even when every parameter is empty
        let lengths = ranges.map { Int32($0?.count ?? 0) }
        let formats = [Int32](repeating: 1, count: values.count)
        return buffer.withUnsafeBufferPointer { bytes in
            let base = UnsafeRawPointer(bytes.baseAddress!).assumingMemoryBound(to: CChar.self)
            let pointers: [UnsafePointer<CChar>?] = ranges.map { range in range.map { base + $0.lowerBound } }
            return pointers.withUnsafeBufferPointer { pointerBuffer in
                lengths.withUnsafeBufferPointer { lengthBuffer in
                    formats.withUnsafeBufferPointer { formatBuffer in
                        body(pointerBuffer.baseAddress, lengthBuffer.baseAddress, formatBuffer.baseAddress)
                    }
                }
            }
        }
    }

    /// Calls `body` with a NULL-terminated array of C strings.
    private static func withCStrings<R>(_ strings: [String], _ body: (UnsafePointer<UnsafePointer<CChar>?>) -> R) -> R {
        let copies = strings.map { strdup($0) }
        defer { copies.forEach { free($0) } }
        let pointers: [UnsafePointer<CChar>?] = copies.map { UnsafePointer($0) } + [nil]
        return pointers.withUnsafeBufferPointer { body($0.baseAddress!) }
    }
}

extension PostgresValue {
    /// The type a parameter is declared as when its statement is prepared (0: let the server infer it).
    var typeOID: Oid {
        switch self {
        case .null: return 0
        case .integer: return PostgresType.int8
        case .text: return PostgresType.text
        case .bytea: return PostgresType.bytea
        case .boolean: return PostgresType.bool
        case .integers: return PostgresType.int8Array
        case .texts: return PostgresType.textArray
        case .byteas: return PostgresType.byteaArray
        }
    }

    /// Appends the binary wire form (PostgreSQL's `*send` functions: big-endian integers, raw bytes,
    /// arrays as `array_send` writes them).
    func appendBinary(to buffer: inout [UInt8]) {
        switch self {
        case .null: return
        case .integer(let value): PostgresValue.append(UInt64(bitPattern: value), bytes: 8, to: &buffer)
        case .text(let value): buffer.append(contentsOf: value.utf8)
        case .bytea(let value): buffer.append(contentsOf: value)
        case .boolean(let value): buffer.append(value ? 1 : 0)
        case .integers(let values):
            PostgresValue.appendArrayHeader(count: values.count, hasNulls: false, element: PostgresType.int8, to: &buffer)
            for value in values {
                PostgresValue.append(8, bytes: 4, to: &buffer)
                PostgresValue.append(UInt64(bitPattern: value), bytes: 8, to: &buffer)
            }
        case .texts(let values):
            PostgresValue.appendArrayHeader(count: values.count, hasNulls: values.contains(nil), element: PostgresType.text,
                                            to: &buffer)
            for value in values {
                guard let value else {
                    PostgresValue.append(UInt64(UInt32.max), bytes: 4, to: &buffer) // -1: NULL
                    continue
                }
                PostgresValue.append(UInt64(value.utf8.count), bytes: 4, to: &buffer)
                buffer.append(contentsOf: value.utf8)
            }
        case .byteas(let values):
            PostgresValue.appendArrayHeader(count: values.count, hasNulls: false, element: PostgresType.bytea, to: &buffer)
            for value in values {
                PostgresValue.append(UInt64(value.count), bytes: 4, to: &buffer)
                buffer.append(contentsOf: value)
            }
        }
    }

    private static func appendArrayHeader(count: Int, hasNulls: Bool, element: Oid, to buffer: inout [UInt8]) {
        guard count > 0 else {
            // An empty array has no dimensions.
            append(0, bytes: 4, to: &buffer)
            append(0, bytes: 4, to: &buffer)
            append(UInt64(element), bytes: 4, to: &buffer)
            return
        }
        append(1, bytes: 4, to: &buffer) // dimensions
        append(hasNulls ? 1 : 0, bytes: 4, to: &buffer)
        append(UInt64(element), bytes: 4, to: &buffer)
        append(UInt64(count), bytes: 4, to: &buffer)
        append(1, bytes: 4, to: &buffer) // lower bound
    }

    private static func append(_ value: UInt64, bytes: Int, to buffer: inout [UInt8]) {
        for index in stride(from: bytes - 1, through: 0, by: -1) {
            buffer.append(UInt8(truncatingIfNeeded: value >> (8 * UInt64(index))))
        }
    }
}
