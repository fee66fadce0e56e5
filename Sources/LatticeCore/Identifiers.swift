/// The identity of one replica (a device, a server, a benchmark peer).
///
/// Replica ids break ties between equal hybrid-logical-clock values, so two replicas must never share one.
public struct ReplicaID: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public var rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }
    public init(_ rawValue: UInt64) { self.rawValue = rawValue }

    /// Parses the 16-hex-digit form printed by `description`.
    public init?(hex: String) {
        guard (1...16).contains(hex.utf8.count), let value = UInt64(hex, radix: 16) else { return nil }
        self.rawValue = value
    }

    public static func < (lhs: ReplicaID, rhs: ReplicaID) -> Bool { lhs.rawValue < rhs.rawValue }

    /// Sixteen lower-case hex digits, e.g. `000000000000002a`.
    public var description: String {
        let digits = String(rawValue, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }
}

/// A zone: a named container of records in one owner's database (CloudKit's `CKRecordZone.ID`).
public struct ZoneID: Hashable, Sendable, CustomStringConvertible {
    public let zoneName: String
    public let ownerRecordName: String

    /// Creates a zone id after checking both names with CloudKit's naming rules.
    /// - Throws: `NameError` for an empty, over-long, non-ASCII or otherwise illegal name.
    public init(zoneName: String, ownerRecordName: String) throws(NameError) {
        try Names.validate(zoneName, kind: .zoneName)
        try Names.validate(ownerRecordName, kind: .ownerRecordName)
        self.zoneName = zoneName
        self.ownerRecordName = ownerRecordName
    }

    /// For names that were validated before (decoders re-validate; this skips nothing silently).
    init(validatedZoneName zoneName: String, ownerRecordName: String) {
        self.zoneName = zoneName
        self.ownerRecordName = ownerRecordName
    }

    public var description: String { "\(zoneName):\(ownerRecordName)" }
}

/// A record's identity: its name inside a zone (CloudKit's `CKRecord.ID`).
public struct RecordID: Hashable, Sendable, CustomStringConvertible {
    public let recordName: String
    public let zoneID: ZoneID

    /// - Throws: `NameError` when `recordName` breaks CloudKit's rules (see `Names`).
    public init(recordName: String, zoneID: ZoneID) throws(NameError) {
        try Names.validate(recordName, kind: .recordName)
        self.recordName = recordName
        self.zoneID = zoneID
    }

    init(validatedRecordName recordName: String, zoneID: ZoneID) {
        self.recordName = recordName
        self.zoneID = zoneID
    }

    public var description: String { "\(recordName)@\(zoneID)" }
}

/// A name that breaks the naming rules, with the rule it broke.
public struct NameError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Rule: String, Sendable {
        case empty, tooLong, notASCII, controlCharacter, reservedPrefix, pathSeparator, dotSegment, notIdentifier
    }
    public let kind: Names.Kind
    public let rule: Rule

    public var description: String {
        switch rule {
        case .empty: return "\(kind.rawValue) must not be empty"
        case .tooLong: return "\(kind.rawValue) is longer than \(Names.maximumLength) characters"
        case .notASCII: return "\(kind.rawValue) must be ASCII"
        case .controlCharacter: return "\(kind.rawValue) must not contain control characters such as NUL"
        case .reservedPrefix: return "\(kind.rawValue) must not start with '_' (reserved)"
        case .pathSeparator: return "\(kind.rawValue) must not contain '/' or '\\'"
        case .dotSegment: return "\(kind.rawValue) must not be '.' or '..'"
        case .notIdentifier:
            return "\(kind.rawValue) must start with a letter and hold only letters, digits, '_' and '.'"
        }
    }
}

/// CloudKit's naming rules for record names and zone names.
///
/// A name is 1...255 printable ASCII characters, does not start with `_` (reserved for the system),
/// contains no `/` or `\` and is not a dot segment (`.`, `..`). Owner record names are the one place
/// a leading `_` is required by CloudKit's own format (`_9a1c...`), so they skip the prefix rule.
public enum Names {
    public enum Kind: String, Sendable {
        case recordName = "record name"
        case zoneName = "zone name"
        case ownerRecordName = "owner record name"
        case fieldName = "field name"
        case recordType = "record type"
    }

    public static let maximumLength = 255

    /// Names the system itself may use although they start with `_` or contain dots.
    public static let systemZoneName = "_defaultZone"

    public static func validate(_ name: String, kind: Kind) throws(NameError) {
        var name = name
        let rule = name.withUTF8 { utf8 in brokenRule(UnsafeRawBufferPointer(utf8), kind: kind) }
        if let rule { throw NameError(kind: kind, rule: rule) }
    }

    /// The first rule the UTF-8 bytes of a name break, or `nil` for a legal name.
    @inline(__always)
    static func brokenRule(_ bytes: UnsafeRawBufferPointer, kind: Kind) -> NameError.Rule? {
        let count = bytes.count
        if count == 0 { return .empty }
        if count > maximumLength { return .tooLong }
        let identifier = kind == .fieldName || kind == .recordType
        let base = bytes.baseAddress!
        for index in 0..<count {
            let byte = base.load(fromByteOffset: index, as: UInt8.self)
            if byte >= 0x80 { return .notASCII }
            if byte < 0x20 || byte == 0x7F { return .controlCharacter }
            if byte == UInt8(ascii: "/") || byte == UInt8(ascii: "\\") { return .pathSeparator }
            if identifier {
                let lower = byte | 0x20
                let letter = lower >= UInt8(ascii: "a") && lower <= UInt8(ascii: "z")
                let legal = letter || (index > 0 && ((byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9"))
                    || byte == UInt8(ascii: "_") || byte == UInt8(ascii: ".")))
                if !legal { return index == 0 && byte == UInt8(ascii: "_") ? .reservedPrefix : .notIdentifier }
            }
        }
        let first = base.load(as: UInt8.self)
        if first == UInt8(ascii: "."), count <= 2, count == 1 || base.load(fromByteOffset: 1, as: UInt8.self) == first {
            return .dotSegment
        }
        switch kind {
        case .ownerRecordName:
            return nil
        case .zoneName where bytes.elementsEqual(systemZoneName.utf8):
            return nil
        case .recordName, .zoneName, .fieldName, .recordType:
            return first == UInt8(ascii: "_") ? .reservedPrefix : nil
        }
    }

    /// True when `name` passes `validate(_:kind:)`.
    public static func isValid(_ name: String, kind: Kind) -> Bool {
        (try? validate(name, kind: kind)) != nil
    }

}
