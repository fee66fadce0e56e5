// A tiny JSON value with output byte-identical in style to Python's
// `json.dumps(obj, sort_keys=True)`: keys sorted by code point, ", " and ": " separators,
// non-ASCII escaped as \uXXXX, floats as Python's repr. Also a small parser, for reading the
// worker's line back.

/// A JSON value.
enum JSONValue: Equatable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case uint(UInt64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    /// `.int` from any integer (clamped into `UInt64`'s range when too large for `Int64`).
    static func integer<T: BinaryInteger>(_ value: T) -> JSONValue {
        if let small = Int64(exactly: value) { return .int(small) }
        return .uint(UInt64(clamping: value))
    }

    /// `.double`, or `.null` for nil.
    static func number(_ value: Double?) -> JSONValue { value.map { .double($0) } ?? .null }

    /// The numeric value, if any.
    var doubleValue: Double? {
        switch self {
        case .int(let value): return Double(value)
        case .uint(let value): return Double(value)
        case .double(let value): return value
        default: return nil
        }
    }

    var stringValue: String? {
        if case .string(let text) = self { return text }
        return nil
    }

    var objectValue: [String: JSONValue]? {
        if case .object(let members) = self { return members }
        return nil
    }

    /// One line of JSON as Python's `json.dumps(value, sort_keys=True)` writes it (no newline).
    /// Non-finite doubles become `null` (Python would write the invalid `NaN`/`Infinity`).
    var serialized: String {
        var out = [UInt8]()
        write(to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    func write(to out: inout [UInt8]) {
        switch self {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let flag): out.append(contentsOf: (flag ? "true" : "false").utf8)
        case .int(let value): out.append(contentsOf: String(value).utf8)
        case .uint(let value): out.append(contentsOf: String(value).utf8)
        case .double(let value): out.append(contentsOf: JSONValue.pythonRepr(value).utf8)
        case .string(let text): JSONValue.writeString(text, to: &out)
        case .array(let elements):
            out.append(UInt8(ascii: "["))
            for (position, element) in elements.enumerated() {
                if position > 0 { out.append(contentsOf: ", ".utf8) }
                element.write(to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let members):
            out.append(UInt8(ascii: "{"))
            let keys = members.keys.sorted { $0.unicodeScalars.lexicographicallyPrecedes($1.unicodeScalars) }
            for (position, key) in keys.enumerated() {
                if position > 0 { out.append(contentsOf: ", ".utf8) }
                JSONValue.writeString(key, to: &out)
                out.append(contentsOf: ": ".utf8)
                members[key]!.write(to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    private static func writeString(_ text: String, to out: inout [UInt8]) {
        let hex = Array("0123456789abcdef".utf8)
        func escape(_ unit: UInt16) {
            out.append(contentsOf: "\\u".utf8)
            for shift in stride(from: 12, through: 0, by: -4) { out.append(hex[Int((unit >> UInt16(shift)) & 0xF)]) }
        }
        out.append(UInt8(ascii: "\""))
        for scalar in text.unicodeScalars {
            switch scalar.value {
            case 0x22: out.append(contentsOf: "\\\"".utf8)
            case 0x5C: out.append(contentsOf: "\\\\".utf8)
            case 0x0A: out.append(contentsOf: "\\n".utf8)
            case 0x0D: out.append(contentsOf: "\\r".utf8)
            case 0x09: out.append(contentsOf: "\\t".utf8)
            case 0x08: out.append(contentsOf: "\\b".utf8)
            case 0x0C: out.append(contentsOf: "\\f".utf8)
            case 0x20...0x7E: out.append(UInt8(truncatingIfNeeded: scalar.value))
            default:
                for unit in String(scalar).utf16 { escape(unit) }
            }
        }
        out.append(UInt8(ascii: "\""))
    }

    /// Python's `repr(float)`: shortest round-trip digits, positional when the decimal exponent
    /// is in -4..<16 (with ".0" for integral values), otherwise `d.ddde+XX`.
    static func pythonRepr(_ value: Double) -> String {
        guard value.isFinite else { return "null" }
        if value == 0 { return value.sign == .minus ? "-0.0" : "0.0" }
        // Swift's description also prints the shortest round-trip digits; re-layout them.
        var text = Substring(value.magnitude.description)
        var exponent = 0
        if let e = text.firstIndex(where: { $0 == "e" || $0 == "E" }) {
            exponent = Int(text[text.index(after: e)...]) ?? 0
            text = text[..<e]
        }
        var digits = "", pointPosition = 0, seenPoint = false
        for character in text {
            if character == "." { seenPoint = true; continue }
            digits.append(character)
            if !seenPoint { pointPosition += 1 }
        }
        // Value = 0.<digits> x 10^(pointPosition + exponent); strip leading and trailing zeros.
        var decimalPoint = pointPosition + exponent
        while digits.hasPrefix("0") { digits.removeFirst(); decimalPoint -= 1 }
        while digits.hasSuffix("0") { digits.removeLast() }
        let sign = value.sign == .minus ? "-" : ""
        if decimalPoint > -4 && decimalPoint <= 16 {
            if decimalPoint <= 0 {
                return sign + "0." + String(repeating: "0", count: -decimalPoint) + digits
            }
            if digits.count <= decimalPoint {
                return sign + digits + String(repeating: "0", count: decimalPoint - digits.count) + ".0"
            }
            let split = digits.index(digits.startIndex, offsetBy: decimalPoint)
            return sign + digits[..<split] + "." + digits[split...]
        }
        let shown = decimalPoint - 1
        var mantissa = String(digits.prefix(1))
        if digits.count > 1 { mantissa += "." + digits.dropFirst() }
        let exponentDigits = String(abs(shown))
        return sign + mantissa + "e" + (shown < 0 ? "-" : "+")
            + (exponentDigits.count < 2 ? "0" : "") + exponentDigits
    }
}

// MARK: Parsing

/// Malformed JSON text.
struct JSONParseError: Error, CustomStringConvertible {
    let message: String
    let offset: Int
    var description: String { "invalid JSON at byte \(offset): \(message)" }
}

extension JSONValue {
    /// Parses one JSON value (surrounding whitespace allowed).
    static func parse(_ text: String) throws -> JSONValue {
        var parser = JSONParser(bytes: Array(text.utf8))
        let value = try parser.value()
        parser.skipWhitespace()
        guard parser.position == parser.bytes.count else { throw parser.error("trailing characters") }
        return value
    }
}

private struct JSONParser {
    let bytes: [UInt8]
    var position = 0

    init(bytes: [UInt8]) { self.bytes = bytes }

    func error(_ message: String) -> JSONParseError { JSONParseError(message: message, offset: position) }

    mutating func skipWhitespace() {
        while position < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[position]) { position += 1 }
    }

    mutating func expect(_ literal: String, _ value: JSONValue) throws -> JSONValue {
        let expected = Array(literal.utf8)
        guard bytes.count - position >= expected.count,
              Array(bytes[position ..< position + expected.count]) == expected else { throw error("expected \(literal)") }
        position += expected.count
        return value
    }

    mutating func value() throws -> JSONValue {
        skipWhitespace()
        guard position < bytes.count else { throw error("unexpected end") }
        switch bytes[position] {
        case UInt8(ascii: "n"): return try expect("null", .null)
        case UInt8(ascii: "t"): return try expect("true", .bool(true))
        case UInt8(ascii: "f"): return try expect("false", .bool(false))
        case UInt8(ascii: "N"): return try expect("NaN", .double(.nan))
        case UInt8(ascii: "I"): return try expect("Infinity", .double(.infinity))
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "["):
            position += 1
            var elements: [JSONValue] = []
            skipWhitespace()
            if position < bytes.count && bytes[position] == UInt8(ascii: "]") { position += 1; return .array(elements) }
            while true {
                elements.append(try value())
                skipWhitespace()
                guard position < bytes.count else { throw error("unterminated array") }
                if bytes[position] == UInt8(ascii: ",") { position += 1; continue }
                if bytes[position] == UInt8(ascii: "]") { position += 1; return .array(elements) }
                throw error("expected , or ]")
            }
        case UInt8(ascii: "{"):
            position += 1
            var members: [String: JSONValue] = [:]
            skipWhitespace()
            if position < bytes.count && bytes[position] == UInt8(ascii: "}") { position += 1; return .object(members) }
            while true {
                skipWhitespace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else { throw error("expected a key") }
                let key = try string()
                skipWhitespace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else { throw error("expected :") }
                position += 1
                members[key] = try value()
                skipWhitespace()
                guard position < bytes.count else { throw error("unterminated object") }
                if bytes[position] == UInt8(ascii: ",") { position += 1; continue }
                if bytes[position] == UInt8(ascii: "}") { position += 1; return .object(members) }
                throw error("expected , or }")
            }
        default:
            return try number()
        }
    }

    mutating func number() throws -> JSONValue {
        let start = position
        var isInteger = true
        if position < bytes.count && bytes[position] == UInt8(ascii: "-") {
            position += 1
            if position < bytes.count && bytes[position] == UInt8(ascii: "I") {
                _ = try expect("Infinity", .null)
                return .double(-.infinity)
            }
        }
        while position < bytes.count {
            let byte = bytes[position]
            if byte >= 0x30 && byte <= 0x39 { position += 1; continue }
            if byte == UInt8(ascii: ".") || byte == UInt8(ascii: "e") || byte == UInt8(ascii: "E")
                || byte == UInt8(ascii: "+") || byte == UInt8(ascii: "-") {
                isInteger = false
                position += 1
                continue
            }
            break
        }
        let text = String(decoding: bytes[start..<position], as: UTF8.self)
        guard !text.isEmpty else { throw error("unexpected character") }
        if isInteger {
            if let value = Int64(text) { return .int(value) }
            if let value = UInt64(text) { return .uint(value) }
        }
        guard let value = Double(text) else { position = start; throw error("bad number \(text)") }
        return .double(value)
    }

    mutating func string() throws -> String {
        position += 1   // opening quote
        var scalars = String.UnicodeScalarView()
        var raw: [UInt8] = []
        func flushRaw() {
            if !raw.isEmpty { scalars.append(contentsOf: String(decoding: raw, as: UTF8.self).unicodeScalars); raw.removeAll() }
        }
        while true {
            guard position < bytes.count else { throw error("unterminated string") }
            let byte = bytes[position]
            position += 1
            if byte == UInt8(ascii: "\"") { break }
            if byte != UInt8(ascii: "\\") { raw.append(byte); continue }
            guard position < bytes.count else { throw error("unterminated escape") }
            let escaped = bytes[position]
            position += 1
            switch escaped {
            case UInt8(ascii: "\""): raw.append(0x22)
            case UInt8(ascii: "\\"): raw.append(0x5C)
            case UInt8(ascii: "/"): raw.append(0x2F)
            case UInt8(ascii: "b"): raw.append(0x08)
            case UInt8(ascii: "f"): raw.append(0x0C)
            case UInt8(ascii: "n"): raw.append(0x0A)
            case UInt8(ascii: "r"): raw.append(0x0D)
            case UInt8(ascii: "t"): raw.append(0x09)
            case UInt8(ascii: "u"):
                flushRaw()
                var unit = try hex4()
                if (0xD800..<0xDC00).contains(unit), position + 1 < bytes.count,
                   bytes[position] == UInt8(ascii: "\\"), bytes[position + 1] == UInt8(ascii: "u") {
                    position += 2
                    let low = try hex4()
                    if (0xDC00..<0xE000).contains(low) {
                        unit = 0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)
                    } else {
                        scalars.append(Unicode.Scalar(0xFFFD)!)
                        unit = low
                    }
                }
                scalars.append(Unicode.Scalar(unit) ?? Unicode.Scalar(0xFFFD)!)
            default:
                throw error("bad escape")
            }
        }
        flushRaw()
        return String(scalars)
    }

    mutating func hex4() throws -> UInt32 {
        guard bytes.count - position >= 4 else { throw error("short \\u escape") }
        var value: UInt32 = 0
        for _ in 0..<4 {
            let byte = bytes[position]
            position += 1
            let digit: UInt8
            switch byte {
            case 0x30...0x39: digit = byte - 0x30
            case 0x61...0x66: digit = byte - 0x61 + 10
            case 0x41...0x46: digit = byte - 0x41 + 10
            default: throw error("bad \\u escape")
            }
            value = value << 4 | UInt32(digit)
        }
        return value
    }
}
