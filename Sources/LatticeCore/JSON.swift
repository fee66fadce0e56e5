/// A JSON value with exact 64-bit integers (Foundation's parser turns large integers into doubles).
///
/// Objects keep their keys in a dictionary; `serialized()` writes keys sorted, so output is deterministic.
public enum JSON: Hashable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSON])
    case object([String: JSON])

    public subscript(key: String) -> JSON? {
        if case .object(let object) = self { return object[key] }
        return nil
    }

    public var stringValue: String? { if case .string(let s) = self { return s }; return nil }
    public var intValue: Int64? {
        switch self {
        case .int(let i): return i
        case .double(let d) where d.rounded() == d && abs(d) < 9.007_199_254_740_992e15: return Int64(d)
        default: return nil
        }
    }
    public var doubleValue: Double? {
        switch self {
        case .int(let i): return Double(i)
        case .double(let d): return d
        default: return nil
        }
    }
    public var boolValue: Bool? { if case .bool(let b) = self { return b }; return nil }
    public var arrayValue: [JSON]? { if case .array(let a) = self { return a }; return nil }
    public var objectValue: [String: JSON]? { if case .object(let o) = self { return o }; return nil }

    // MARK: Serializing

    /// Compact JSON text with keys sorted.
    public func serialized() -> String {
        var out: [UInt8] = []
        write(into: &out)
        return String(decoding: out, as: UTF8.self)
    }

    public func serializedBytes() -> [UInt8] {
        var out: [UInt8] = []
        write(into: &out)
        return out
    }

    func write(into out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): JSON.writeInteger(i, into: &out)
        case .double(let d):
            if d.isFinite {
                if d == 0 && d.sign == .minus { out.append(contentsOf: "-0.0".utf8) }
                else if d.rounded() == d && abs(d) < 1e15 { out.append(contentsOf: String(Int64(d)).utf8) }
                else { out.append(contentsOf: "\(d)".utf8) }
            } else {
                out.append(contentsOf: "null".utf8) // JSON has no NaN or infinity
            }
        case .string(let s): JSON.writeString(s, into: &out)
        case .array(let array):
            out.append(UInt8(ascii: "["))
            for (index, element) in array.enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                element.write(into: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let object):
            out.append(UInt8(ascii: "{"))
            for (index, member) in object.sorted(by: { compareBytes($0.key, $1.key) < 0 }).enumerated() {
                if index > 0 { out.append(UInt8(ascii: ",")) }
                JSON.writeString(member.key, into: &out)
                out.append(UInt8(ascii: ":"))
                member.value.write(into: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    /// Decimal digits straight into `out` (no String made).
    static func writeInteger(_ value: Int64, into out: inout [UInt8]) {
        if value < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = value.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0) // room for 20 digits, most significant last
        var count = 0
        withUnsafeMutableBytes(of: &digits) { buffer in
            repeat {
                buffer[count] = UInt8(ascii: "0") + UInt8(magnitude % 10)
                magnitude /= 10
                count += 1
            } while magnitude > 0
            for index in stride(from: count - 1, through: 0, by: -1) { out.append(buffer[index]) }
        }
    }

    static func writeString(_ s: String, into out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        // Most strings need no escape: checked on their contiguous bytes and copied whole.
        let copied = s.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
            for byte in bytes where byte < 0x20 || byte == 0x7F || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") {
                return false
            }
            out.append(contentsOf: bytes)
            return true
        }
        if copied == true {
            out.append(UInt8(ascii: "\""))
            return
        }
        for byte in s.utf8 {
            switch byte {
            case UInt8(ascii: "\""): out.append(contentsOf: "\\\"".utf8)
            case UInt8(ascii: "\\"): out.append(contentsOf: "\\\\".utf8)
            case 0x0A: out.append(contentsOf: "\\n".utf8)
            case 0x0D: out.append(contentsOf: "\\r".utf8)
            case 0x09: out.append(contentsOf: "\\t".utf8)
            case 0..<0x20, 0x7F:
                let hex = Array("0123456789abcdef".utf8)
                out.append(contentsOf: "\\u00".utf8)
                out.append(hex[Int(byte >> 4)])
                out.append(hex[Int(byte & 0xF)])
            default: out.append(byte)
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    // MARK: Parsing

    /// Parses strict JSON (RFC 8259): no trailing commas, no comments, no duplicate keys, depth <= 64.
    public static func parse(_ text: String) throws(JSONError) -> JSON {
        try parse(Array(text.utf8))
    }

    public static func parse(_ bytes: [UInt8]) throws(JSONError) -> JSON {
        var parser = JSONParser(bytes: bytes)
        parser.skipWhitespace()
        let value = try parser.value(depth: 0)
        parser.skipWhitespace()
        guard parser.index == bytes.count else { throw parser.error("unexpected text after the JSON value") }
        return value
    }
}

/// Text that is not valid JSON, with the byte offset where parsing stopped.
public struct JSONError: Error, Hashable, Sendable, CustomStringConvertible {
    public let message: String
    public let offset: Int
    public var description: String { "invalid JSON at byte \(offset): \(message)" }
}

fileprivate struct JSONParser {
    let bytes: [UInt8]
    var index = 0
    static let maximumDepth = 64

    init(bytes: [UInt8]) { self.bytes = bytes }

    func error(_ message: String) -> JSONError { JSONError(message: message, offset: index) }

    mutating func skipWhitespace() {
        while index < bytes.count {
            switch bytes[index] {
            case 0x20, 0x09, 0x0A, 0x0D: index += 1
            default: return
            }
        }
    }

    mutating func literal(_ word: String, _ value: JSON) throws(JSONError) -> JSON {
        let utf8 = word.utf8
        guard index + utf8.count <= bytes.count, bytes[index..<index + utf8.count].elementsEqual(utf8) else {
            throw error("unexpected character")
        }
        index += utf8.count
        return value
    }

    mutating func value(depth: Int) throws(JSONError) -> JSON {
        guard depth < JSONParser.maximumDepth else { throw error("nested deeper than \(JSONParser.maximumDepth) levels") }
        guard index < bytes.count else { throw error("unexpected end of input") }
        switch bytes[index] {
        case UInt8(ascii: "{"): return try object(depth: depth)
        case UInt8(ascii: "["): return try array(depth: depth)
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): return try literal("true", .bool(true))
        case UInt8(ascii: "f"): return try literal("false", .bool(false))
        case UInt8(ascii: "n"): return try literal("null", .null)
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try number()
        default: throw error("unexpected character")
        }
    }

    mutating func object(depth: Int) throws(JSONError) -> JSON {
        index += 1
        // The members are collected first, so the dictionary is made once at its size (not grown and
        // rehashed member by member).
        var members: [(key: String, value: JSON, offset: Int)] = []
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "}") { index += 1; return .object([:]) }
        while true {
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: "\"") else { throw error("expected a string key") }
            let keyStart = index
            let key = try string()
            skipWhitespace()
            guard index < bytes.count, bytes[index] == UInt8(ascii: ":") else { throw error("expected ':'") }
            index += 1
            skipWhitespace()
            members.append((key, try value(depth: depth + 1), keyStart))
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in an object") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "}") { index += 1; break }
            throw error("expected ',' or '}'")
        }
        var object = [String: JSON](minimumCapacity: members.count)
        for member in members where object.updateValue(member.value, forKey: member.key) != nil {
            throw JSONError(message: "duplicate key \"\(member.key)\"", offset: member.offset)
        }
        return .object(object)
    }

    mutating func array(depth: Int) throws(JSONError) -> JSON {
        index += 1
        var array: [JSON] = []
        skipWhitespace()
        if index < bytes.count && bytes[index] == UInt8(ascii: "]") { index += 1; return .array(array) }
        while true {
            skipWhitespace()
            array.append(try value(depth: depth + 1))
            skipWhitespace()
            guard index < bytes.count else { throw error("unexpected end of input in an array") }
            if bytes[index] == UInt8(ascii: ",") { index += 1; continue }
            if bytes[index] == UInt8(ascii: "]") { index += 1; return .array(array) }
            throw error("expected ',' or ']'")
        }
    }

    mutating func hex4() throws(JSONError) -> UInt32 {
        guard index + 4 <= bytes.count else { throw error("truncated \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let c = bytes[index]
            let digit: UInt32
            switch c {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = UInt32(c - UInt8(ascii: "0"))
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = UInt32(c - UInt8(ascii: "a") + 10)
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = UInt32(c - UInt8(ascii: "A") + 10)
            default: throw error("bad hex digit in \\u escape")
            }
            value = value << 4 | digit
            index += 1
        }
        return value
    }

    mutating func string() throws(JSONError) -> String {
        index += 1
        // Most strings have no escape: validated straight from the input.
        let start = index
        var highBits: UInt8 = 0
        while index < bytes.count {
            let c = bytes[index]
            if c == UInt8(ascii: "\"") {
                let end = index
                index += 1
                let result = bytes.withUnsafeBufferPointer { buffer in
                    let utf8 = UnsafeBufferPointer(rebasing: buffer[start..<end])
                    // ASCII is valid UTF-8 as it stands; anything else is checked.
                    return highBits < 0x80 ? String(decoding: utf8, as: UTF8.self) : String(validating: utf8, as: UTF8.self)
                }
                guard let result else { throw error("invalid UTF-8 in a string") }
                return result
            }
            highBits |= c
            if c < 0x20 || c == UInt8(ascii: "\\") { break }
            index += 1
        }
        var out = Array(bytes[start..<index])
        while true {
            guard index < bytes.count else { throw error("unterminated string") }
            let c = bytes[index]
            if c == UInt8(ascii: "\"") { index += 1; break }
            if c < 0x20 { throw error("control character in a string") }
            if c != UInt8(ascii: "\\") { out.append(c); index += 1; continue }
            index += 1
            guard index < bytes.count else { throw error("unterminated escape") }
            let e = bytes[index]
            index += 1
            switch e {
            case UInt8(ascii: "\""): out.append(0x22)
            case UInt8(ascii: "\\"): out.append(0x5C)
            case UInt8(ascii: "/"): out.append(0x2F)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try hex4()
                if (0xD800..<0xDC00).contains(scalar) {
                    guard index + 2 <= bytes.count, bytes[index] == UInt8(ascii: "\\"), bytes[index + 1] == UInt8(ascii: "u")
                    else { throw error("unpaired surrogate") }
                    index += 2
                    let low = try hex4()
                    guard (0xDC00..<0xE000).contains(low) else { throw error("unpaired surrogate") }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                } else if (0xDC00..<0xE000).contains(scalar) {
                    throw error("unpaired surrogate")
                }
                out.append(contentsOf: String(Character(Unicode.Scalar(scalar)!)).utf8)
            default: throw error("unknown escape")
            }
        }
        guard let result = String(validating: out, as: UTF8.self) else { throw error("invalid UTF-8 in a string") }
        return result
    }

    mutating func number() throws(JSONError) -> JSON {
        let start = index
        var isInteger = true
        if bytes[index] == UInt8(ascii: "-") { index += 1 }
        guard index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) else {
            throw error("bad number")
        }
        if bytes[index] == UInt8(ascii: "0") {
            index += 1
        } else {
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: ".") {
            isInteger = false
            index += 1
            let digits = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            guard index > digits else { throw error("bad number") }
        }
        if index < bytes.count, bytes[index] == UInt8(ascii: "e") || bytes[index] == UInt8(ascii: "E") {
            isInteger = false
            index += 1
            if index < bytes.count, bytes[index] == UInt8(ascii: "+") || bytes[index] == UInt8(ascii: "-") { index += 1 }
            let digits = index
            while index < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[index]) { index += 1 }
            guard index > digits else { throw error("bad number") }
        }
        if isInteger && index - start <= 18 {
            // At most 18 digits always fit an Int64: read them without making a String.
            let negative = bytes[start] == UInt8(ascii: "-")
            var value: Int64 = 0
            for digit in bytes[(negative ? start + 1 : start)..<index] { value = value * 10 + Int64(digit - UInt8(ascii: "0")) }
            return .int(negative ? -value : value)
        }
        let text = String(decoding: bytes[start..<index], as: UTF8.self)
        if isInteger, let int = Int64(text) { return .int(int) }
        guard let double = Double(text), double.isFinite else {
            throw JSONError(message: "number out of range", offset: start)
        }
        return .double(double)
    }
}

/// A pull reader over JSON text, for decoders that read a document in one pass into their own values
/// instead of a `JSON` tree: the same grammar, strings and numbers as `JSON.parse` (it drives the same
/// parser), member by member. It does not check duplicate keys; a decoder that must refuse them (as
/// `JSON.parse` does) checks the keys it reads.
///
/// ```swift
/// var reader = JSONReader(bytes)
/// try reader.members { reader, key in
///     if key == "name" { name = try reader.string() } else { try reader.skip() }
/// }
/// try reader.end()
/// ```
public struct JSONReader {
    fileprivate var parser: JSONParser
    /// The depth of the value being read (objects and arrays entered), bounded as `JSON.parse` bounds it.
    private var depth = 0

    public init(_ bytes: [UInt8]) {
        parser = JSONParser(bytes: bytes)
        parser.skipWhitespace()
    }

    /// The first byte of the next value (whitespace skipped), nil at the end.
    public var next: UInt8? {
        mutating get {
            parser.skipWhitespace()
            return parser.index < parser.bytes.count ? parser.bytes[parser.index] : nil
        }
    }

    /// Reads an object, calling `body` with each key; `body` must read (or skip) the member's value.
    public mutating func members(_ body: (inout JSONReader, String) throws -> Void) throws {
        parser.skipWhitespace()
        guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "{") else {
            throw parser.error("expected an object")
        }
        guard depth + 1 < JSONParser.maximumDepth else { throw parser.error("nested too deep") }
        depth += 1
        defer { depth -= 1 }
        parser.index += 1
        parser.skipWhitespace()
        if parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "}") {
            parser.index += 1
            return
        }
        while true {
            parser.skipWhitespace()
            guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "\"") else {
                throw parser.error("expected a string key")
            }
            let key = try parser.string()
            parser.skipWhitespace()
            guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: ":") else {
                throw parser.error("expected ':'")
            }
            parser.index += 1
            try body(&self, key)
            parser.skipWhitespace()
            guard parser.index < parser.bytes.count else { throw parser.error("unexpected end of input in an object") }
            if parser.bytes[parser.index] == UInt8(ascii: ",") { parser.index += 1; continue }
            if parser.bytes[parser.index] == UInt8(ascii: "}") { parser.index += 1; return }
            throw parser.error("expected ',' or '}'")
        }
    }

    /// Reads an array, calling `body` for each element; `body` must read (or skip) it.
    public mutating func elements(_ body: (inout JSONReader) throws -> Void) throws {
        parser.skipWhitespace()
        guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "[") else {
            throw parser.error("expected an array")
        }
        guard depth + 1 < JSONParser.maximumDepth else { throw parser.error("nested too deep") }
        depth += 1
        defer { depth -= 1 }
        parser.index += 1
        parser.skipWhitespace()
        if parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "]") {
            parser.index += 1
            return
        }
        while true {
            try body(&self)
            parser.skipWhitespace()
            guard parser.index < parser.bytes.count else { throw parser.error("unexpected end of input in an array") }
            if parser.bytes[parser.index] == UInt8(ascii: ",") { parser.index += 1; continue }
            if parser.bytes[parser.index] == UInt8(ascii: "]") { parser.index += 1; return }
            throw parser.error("expected ',' or ']'")
        }
    }

    /// A string value.
    public mutating func string() throws -> String {
        parser.skipWhitespace()
        guard parser.index < parser.bytes.count, parser.bytes[parser.index] == UInt8(ascii: "\"") else {
            throw parser.error("expected a string")
        }
        return try parser.string()
    }

    /// Any value as a `JSON` tree (for small parts a decoder takes whole).
    public mutating func value() throws -> JSON {
        parser.skipWhitespace()
        return try parser.value(depth: depth)
    }

    /// Reads past a value.
    public mutating func skip() throws { _ = try value() }

    /// Checks that only whitespace is left.
    public mutating func end() throws {
        parser.skipWhitespace()
        guard parser.index == parser.bytes.count else { throw parser.error("unexpected text after the JSON value") }
    }
}
