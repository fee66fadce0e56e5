/// A CBOR item (RFC 8949), as WebAuthn's attestation objects and COSE keys use them: definite lengths
/// only, no tags, no floats. Anything else is refused, so a decode is bounded by `CBOR.Limits`.
public indirect enum CBOR: Sendable, Hashable {
    case unsigned(UInt64)
    /// A negative integer: the value is `-1 - n`.
    case negative(UInt64)
    case bytes([UInt8])
    case text(String)
    case array([CBOR])
    /// Pairs in the order they were sent (a duplicate key is refused).
    case map([Pair])
    case bool(Bool)
    case null

    public struct Pair: Sendable, Hashable {
        public let key: CBOR
        public let value: CBOR

        public init(key: CBOR, value: CBOR) {
            self.key = key
            self.value = value
        }
    }

    /// The value under an integer key (COSE) or a text key (attestation objects), nil when absent.
    public subscript(key: Int) -> CBOR? {
        guard case .map(let pairs) = self else { return nil }
        return pairs.first { $0.key.intValue == key }?.value
    }

    public subscript(key: String) -> CBOR? {
        guard case .map(let pairs) = self else { return nil }
        return pairs.first { $0.key == .text(key) }?.value
    }

    /// An integer item as an `Int`, when it fits.
    public var intValue: Int? {
        switch self {
        case .unsigned(let n): n <= UInt64(Int.max) ? Int(n) : nil
        case .negative(let n): n < UInt64(Int.max) ? -1 - Int(n) : nil
        default: nil
        }
    }

    public var bytesValue: [UInt8]? { if case .bytes(let b) = self { b } else { nil } }
    public var textValue: String? { if case .text(let t) = self { t } else { nil } }

    /// How much a decode may take: nesting, items in all, and bytes of one string.
    public struct Limits: Sendable {
        public var depth = 8
        public var items = 512
        public var stringBytes = 16_384
        public init() {}
    }

    /// A CBOR input that breaks the format or the limits: where, and what.
    public struct DecodeError: Error, Hashable, Sendable, CustomStringConvertible {
        public let offset: Int
        public let reason: String
        public var description: String { "CBOR at byte \(offset): \(reason)" }
    }

    /// Decodes one item from the start of `bytes`; returns it and how many bytes it took (the rest, if
    /// any, is the caller's: authenticator data carries extensions after the key).
    public static func decodePrefix(_ bytes: [UInt8], limits: Limits = Limits()) throws(DecodeError) -> (CBOR, Int) {
        var reader = Reader(bytes: bytes, limits: limits)
        let item = try reader.item(depth: 0)
        return (item, reader.offset)
    }

    /// Decodes `bytes` as exactly one item.
    public static func decode(_ bytes: [UInt8], limits: Limits = Limits()) throws(DecodeError) -> CBOR {
        let (item, used) = try decodePrefix(bytes, limits: limits)
        guard used == bytes.count else { throw DecodeError(offset: used, reason: "\(bytes.count - used) bytes after the item") }
        return item
    }

    private struct Reader {
        let bytes: [UInt8]
        let limits: Limits
        var offset = 0
        var items = 0

        init(bytes: [UInt8], limits: Limits) {
            self.bytes = bytes
            self.limits = limits
        }

        func fail(_ reason: String) -> DecodeError { DecodeError(offset: offset, reason: reason) }

        mutating func byte() throws(DecodeError) -> UInt8 {
            guard offset < bytes.count else { throw fail("the input ends inside an item") }
            defer { offset += 1 }
            return bytes[offset]
        }

        mutating func argument(_ info: UInt8) throws(DecodeError) -> UInt64 {
            switch info {
            case 0..<24: return UInt64(info)
            case 24...27:
                let count = 1 << Int(info - 24)
                var value: UInt64 = 0
                for _ in 0..<count { value = value << 8 | UInt64(try byte()) }
                return value
            default: throw fail(info == 31 ? "indefinite lengths are not accepted" : "reserved additional information \(info)")
            }
        }

        mutating func take(_ count: UInt64) throws(DecodeError) -> [UInt8] {
            guard count <= UInt64(limits.stringBytes) else { throw fail("a string of \(count) bytes (at most \(limits.stringBytes))") }
            guard UInt64(bytes.count - offset) >= count else { throw fail("the input ends inside a string") }
            defer { offset += Int(count) }
            return Array(bytes[offset..<(offset + Int(count))])
        }

        mutating func item(depth: Int) throws(DecodeError) -> CBOR {
            items += 1
            guard items <= limits.items else { throw fail("more than \(limits.items) items") }
            guard depth <= limits.depth else { throw fail("nested deeper than \(limits.depth)") }
            let initial = try byte()
            let major = initial >> 5, info = initial & 0x1F
            switch major {
            case 0: return .unsigned(try argument(info))
            case 1: return .negative(try argument(info))
            case 2: return .bytes(try take(try argument(info)))
            case 3:
                let raw = try take(try argument(info))
                guard let text = String(validating: raw, as: UTF8.self) else { throw fail("a text string that is not UTF-8") }
                return .text(text)
            case 4:
                let count = try argument(info)
                guard count <= UInt64(limits.items) else { throw fail("an array of \(count) items") }
                var elements: [CBOR] = []
                for _ in 0..<count { elements.append(try item(depth: depth + 1)) }
                return .array(elements)
            case 5:
                let count = try argument(info)
                guard count <= UInt64(limits.items) else { throw fail("a map of \(count) pairs") }
                var pairs: [Pair] = []
                for _ in 0..<count {
                    let key = try item(depth: depth + 1)
                    guard !pairs.contains(where: { $0.key == key }) else { throw fail("a map key sent twice") }
                    pairs.append(Pair(key: key, value: try item(depth: depth + 1)))
                }
                return .map(pairs)
            case 6: throw fail("tags are not accepted")
            default:
                switch info {
                case 20: return .bool(false)
                case 21: return .bool(true)
                case 22: return .null
                default: throw fail("simple value or float \(info) is not accepted")
                }
            }
        }
    }
}

extension CBOR {
    /// The encoding of this item (canonical lengths), for tests and for building COSE keys.
    public var encoded: [UInt8] {
        var out: [UInt8] = []
        Self.encode(self, into: &out)
        return out
    }

    private static func head(_ major: UInt8, _ value: UInt64, into out: inout [UInt8]) {
        switch value {
        case 0..<24: out.append(major << 5 | UInt8(value))
        case 24...0xFF: out += [major << 5 | 24, UInt8(value)]
        case 0x100...0xFFFF: out += [major << 5 | 25, UInt8(value >> 8), UInt8(value & 0xFF)]
        case 0x10000...0xFFFF_FFFF: out.append(major << 5 | 26); for shift in stride(from: 24, through: 0, by: -8) { out.append(UInt8((value >> UInt64(shift)) & 0xFF)) }
        default: out.append(major << 5 | 27); for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((value >> UInt64(shift)) & 0xFF)) }
        }
    }

    private static func encode(_ item: CBOR, into out: inout [UInt8]) {
        switch item {
        case .unsigned(let n): head(0, n, into: &out)
        case .negative(let n): head(1, n, into: &out)
        case .bytes(let b): head(2, UInt64(b.count), into: &out); out += b
        case .text(let t): head(3, UInt64(t.utf8.count), into: &out); out += Array(t.utf8)
        case .array(let a): head(4, UInt64(a.count), into: &out); for element in a { encode(element, into: &out) }
        case .map(let pairs): head(5, UInt64(pairs.count), into: &out); for pair in pairs { encode(pair.key, into: &out); encode(pair.value, into: &out) }
        case .bool(let b): out.append(b ? 0xF5 : 0xF4)
        case .null: out.append(0xF6)
        }
    }

    /// An integer item.
    public static func int(_ value: Int) -> CBOR { value >= 0 ? .unsigned(UInt64(value)) : .negative(UInt64(-1 - value)) }
}
