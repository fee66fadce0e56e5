import LatticeCore

// A tiny JSON value with output byte-identical in style to Python's
// `json.dumps(obj, sort_keys=True)`: keys sorted by code point, ", " and ": " separators,
// non-ASCII escaped as \uXXXX, floats as Python's repr. Worker lines are read back with
// LatticeCore's parser.

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

// MARK: Reading a worker's line back

extension JSONValue {
    /// Parses one JSON value with LatticeCore's parser. Integers beyond `Int64` come back as doubles;
    /// the only such key a worker writes is `seed`, which the orchestrator sets from its own options.
    static func parse(_ text: String) throws -> JSONValue {
        JSONValue(try JSON.parse(text))
    }

    init(_ json: JSON) {
        switch json {
        case .null: self = .null
        case .bool(let value): self = .bool(value)
        case .int(let value): self = .int(value)
        case .double(let value): self = .double(value)
        case .string(let value): self = .string(value)
        case .array(let values): self = .array(values.map(JSONValue.init))
        case .object(let values): self = .object(values.mapValues(JSONValue.init))
        }
    }
}
