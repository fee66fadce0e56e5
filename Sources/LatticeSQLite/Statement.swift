import CSQLite

/// A value SQLite stores in a column or takes as a parameter.
public enum SQLiteValue: Hashable, Sendable {
    case null
    case integer(Int64)
    case real(Double)
    case text(String)
    case blob([UInt8])
}

extension SQLiteValue {
    /// The integer, or 0 for any other value.
    public var integer: Int64 {
        if case .integer(let value) = self { return value }
        return 0
    }

    /// The text, or nil for any other value.
    public var text: String? {
        if case .text(let value) = self { return value }
        return nil
    }

    /// The bytes, or none for any other value.
    public var blob: [UInt8] {
        if case .blob(let value) = self { return value }
        return []
    }
}

/// One prepared statement. Owns its `sqlite3_stmt` and finalizes it in `deinit`.
///
/// Not thread-safe: statements belong to their `Connection`, which one executor owns at a time.
public final class Statement {
    private let handle: OpaquePointer
    private unowned let connection: Connection

    public init(_ connection: Connection, sql: String) throws(SQLiteError) {
        var statement: OpaquePointer?
        let code = sqlite3_prepare_v2(connection.handle, sql, -1, &statement, nil)
        guard code == SQLITE_OK, let statement else {
            throw SQLiteError(code: code, connection: connection.handle, context: "prepare")
        }
        handle = statement
        self.connection = connection
    }

    deinit { sqlite3_finalize(handle) }

    /// Binds parameters by position (1-based in SQL, 0-based here) after clearing earlier bindings.
    @discardableResult
    public func bind(_ values: [SQLiteValue]) throws(SQLiteError) -> Statement {
        try connection.checkDeadline() // every run starts here: nothing runs past the deadline
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
        for (index, value) in values.enumerated() {
            let position = Int32(index + 1)
            let code: Int32
            switch value {
            case .null: code = sqlite3_bind_null(handle, position)
            case .integer(let v): code = sqlite3_bind_int64(handle, position, v)
            case .real(let v): code = sqlite3_bind_double(handle, position, v)
            case .text(let v):
                // Bind by byte length: text may contain NUL, and must round-trip byte for byte.
                let bytes = Array(v.utf8) + [0]
                code = bytes.withUnsafeBufferPointer { utf8 in
                    utf8.withMemoryRebound(to: CChar.self) { chars in
                        sqlite3_bind_text(handle, position, chars.baseAddress, Int32(chars.count - 1), sqliteTransient)
                    }
                }
            case .blob(let v):
                code = v.withUnsafeBytes { raw in
                    // A zero-length blob must still bind as a blob, not NULL.
                    sqlite3_bind_blob(handle, position, raw.baseAddress ?? UnsafeRawPointer(bitPattern: 1),
                                      Int32(raw.count), sqliteTransient)
                }
            }
            guard code == SQLITE_OK else { throw SQLiteError(code: code, connection: connection.handle, context: "bind") }
        }
        return self
    }

    /// Starts a run bound parameter by parameter (`bind(_:integer:)` and friends, no `SQLiteValue` array):
    /// for the hot statements of a batch. Checks the deadline as `bind(_:)` does.
    public func reset() throws(SQLiteError) {
        try connection.checkDeadline()
        sqlite3_reset(handle)
        sqlite3_clear_bindings(handle)
    }

    /// Binds an integer at `position` (1-based, as in SQL).
    public func bind(_ position: Int32, integer value: Int64) throws(SQLiteError) {
        try check(sqlite3_bind_int64(handle, position, value))
    }

    /// Binds text at `position` by byte length (it may contain NUL); SQLite copies the bytes.
    public func bind(_ position: Int32, text value: String) throws(SQLiteError) {
        var value = value
        let code = value.withUTF8 { utf8 in
            sqlite3_bind_text(handle, position, UnsafeRawPointer(utf8.baseAddress ?? UnsafePointer(bitPattern: 1)!)
                                  .assumingMemoryBound(to: CChar.self), Int32(utf8.count), sqliteTransient)
        }
        try check(code)
    }

    /// Binds a blob at `position` (a zero-length one still as a blob); SQLite copies the bytes.
    public func bind(_ position: Int32, blob value: [UInt8]) throws(SQLiteError) {
        let code = value.withUnsafeBytes { raw in
            sqlite3_bind_blob(handle, position, raw.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(raw.count),
                              sqliteTransient)
        }
        try check(code)
    }

    /// Binds NULL at `position`.
    public func bindNull(_ position: Int32) throws(SQLiteError) {
        try check(sqlite3_bind_null(handle, position))
    }

    /// Steps a statement bound after `reset()` to its end; returns the number of rows changed.
    @discardableResult
    public func runBound() throws(SQLiteError) -> Int {
        while try step() {}
        sqlite3_reset(handle)
        return Int(sqlite3_changes(connection.handle))
    }

    private func check(_ code: Int32) throws(SQLiteError) {
        guard code == SQLITE_OK else { throw SQLiteError(code: code, connection: connection.handle, context: "bind") }
    }

    /// Runs a statement that returns no rows; returns the number of rows changed.
    @discardableResult
    public func run(_ values: [SQLiteValue] = []) throws(SQLiteError) -> Int {
        try bind(values)
        while try step() {}
        sqlite3_reset(handle) // release the statement's hold on the database at once
        return Int(sqlite3_changes(connection.handle))
    }

    /// Every row, as arrays of values.
    public func rows(_ values: [SQLiteValue] = []) throws(SQLiteError) -> [[SQLiteValue]] {
        try bind(values)
        var rows: [[SQLiteValue]] = []
        while try step() { rows.append(row()) }
        sqlite3_reset(handle)
        return rows
    }

    /// Advances to the next row; false when done. `SQLITE_BUSY` is retried by the connection's busy timeout.
    public func step() throws(SQLiteError) -> Bool {
        let code = sqlite3_step(handle)
        switch code {
        case SQLITE_ROW: return true
        case SQLITE_DONE: return false
        default:
            sqlite3_reset(handle)
            connection.noteResult(code)
            throw SQLiteError(code: code, connection: connection.handle, context: "step")
        }
    }

    /// The current row's values.
    public func row() -> [SQLiteValue] {
        (0..<sqlite3_column_count(handle)).map(column)
    }

    public func column(_ index: Int32) -> SQLiteValue {
        switch sqlite3_column_type(handle, index) {
        case SQLITE_INTEGER: return .integer(sqlite3_column_int64(handle, index))
        case SQLITE_FLOAT: return .real(sqlite3_column_double(handle, index))
        case SQLITE_TEXT:
            guard let text = sqlite3_column_text(handle, index) else { return .text("") }
            let count = Int(sqlite3_column_bytes(handle, index))
            return .text(String(decoding: UnsafeBufferPointer(start: text, count: count), as: UTF8.self))
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(handle, index))
            guard count > 0, let bytes = sqlite3_column_blob(handle, index) else { return .blob([]) }
            return .blob([UInt8](UnsafeRawBufferPointer(start: bytes, count: count)))
        default: return .null
        }
    }
}

/// SQLite's SQLITE_TRANSIENT (a macro Swift cannot import): SQLite copies the bound bytes.
let sqliteTransient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
