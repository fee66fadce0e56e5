/// The type of a scalar value, with CloudKit Web Services' type names.
public enum ValueType: UInt8, Sendable, CaseIterable, CustomStringConvertible {
    case string = 1, int64, double, bytes, timestamp, reference, location, asset

    /// CloudKit's wire name, e.g. `STRING` or `INT64`; lists append `_LIST`.
    public var cloudKitName: String {
        switch self {
        case .string: return "STRING"
        case .int64: return "INT64"
        case .double: return "DOUBLE"
        case .bytes: return "BYTES"
        case .timestamp: return "TIMESTAMP"
        case .reference: return "REFERENCE"
        case .location: return "LOCATION"
        case .asset: return "ASSETID"
        }
    }

    public init?(cloudKitName: String) {
        guard let type = ValueType.allCases.first(where: { $0.cloudKitName == cloudKitName }) else { return nil }
        self = type
    }

    /// The element type a collection type names (`T_LIST`, or `T_SET` with `isSet`); nil for any other name.
    public static func collection(_ typeName: String) -> (element: ValueType, isSet: Bool)? {
        let isSet = typeName.hasSuffix("_SET")
        guard isSet || typeName.hasSuffix("_LIST"),
              let element = ValueType(cloudKitName: String(typeName.dropLast(isSet ? 4 : 5))) else { return nil }
        return (element, isSet)
    }

    public var description: String { cloudKitName }
}

/// A reference to another record, as in `CKRecord.Reference`. A `nil` zone means "the same zone".
public struct Reference: Hashable, Sendable, Comparable {
    public enum Action: UInt8, Sendable {
        case none = 0, deleteSelf = 1
        public var cloudKitName: String { self == .none ? "NONE" : "DELETE_SELF" }
    }

    public var recordName: String
    public var zoneID: ZoneID?
    public var action: Action

    public init(recordName: String, zoneID: ZoneID? = nil, action: Action = .none) throws(NameError) {
        try Names.validate(recordName, kind: .recordName)
        self.recordName = recordName
        self.zoneID = zoneID
        self.action = action
    }

    init(validatedRecordName recordName: String, zoneID: ZoneID?, action: Action) {
        self.recordName = recordName
        self.zoneID = zoneID
        self.action = action
    }

    public static func == (a: Reference, b: Reference) -> Bool {
        a.action == b.action && bytesEqual(a.recordName, b.recordName)
            && bytesEqual(a.zoneID?.zoneName, b.zoneID?.zoneName)
            && bytesEqual(a.zoneID?.ownerRecordName, b.zoneID?.ownerRecordName)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(action)
        hashBytes(recordName, into: &hasher)
        hashBytes(zoneID?.zoneName, into: &hasher)
        hashBytes(zoneID?.ownerRecordName, into: &hasher)
    }

    public static func < (a: Reference, b: Reference) -> Bool {
        var order = compareBytes(a.recordName, b.recordName)
        if order == 0 { order = compareBytes(a.zoneID?.zoneName, b.zoneID?.zoneName) }
        if order == 0 { order = compareBytes(a.zoneID?.ownerRecordName, b.zoneID?.ownerRecordName) }
        if order == 0 { order = a.action.rawValue == b.action.rawValue ? 0 : (a.action.rawValue < b.action.rawValue ? -1 : 1) }
        return order < 0
    }
}

/// A file attached to a record, as CloudKit's ASSETID value: the SHA-256 of its bytes and their count. The
/// bytes live beside the records (in the database's asset store, shared by every record of that database
/// that holds the same checksum); a record, its frames and the sync path carry only this reference.
public struct AssetValue: Hashable, Sendable, Comparable {
    /// The SHA-256 of the bytes: 32 bytes.
    public let checksum: [UInt8]
    public let size: Int64

    public static let checksumLength = 32

    /// Nil unless `checksum` has 32 bytes and `size` is not negative.
    public init?(checksum: [UInt8], size: Int64) {
        guard checksum.count == Self.checksumLength, size >= 0 else { return nil }
        self.checksum = checksum
        self.size = size
    }

    /// The checksum as lowercase hexadecimal (ETags, names of stored contents).
    public var checksumHex: String {
        let digits = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(checksum.count * 2)
        for byte in checksum {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 15)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    public static func < (a: AssetValue, b: AssetValue) -> Bool {
        if a.checksum != b.checksum { return a.checksum.lexicographicallyPrecedes(b.checksum) }
        return a.size < b.size
    }
}

/// A geographic location, as in CloudKit's LOCATION type. Optional parts are `nil` when unknown.
public struct Location: Hashable, Sendable, Comparable {
    public var latitude: Double
    public var longitude: Double
    public var altitude: Double?
    public var horizontalAccuracy: Double?
    public var verticalAccuracy: Double?
    public var course: Double?
    public var speed: Double?
    /// Milliseconds since the Unix epoch.
    public var timestamp: Int64?

    public init(latitude: Double, longitude: Double, altitude: Double? = nil, horizontalAccuracy: Double? = nil,
                verticalAccuracy: Double? = nil, course: Double? = nil, speed: Double? = nil, timestamp: Int64? = nil) {
        self.latitude = latitude
        self.longitude = longitude
        self.altitude = altitude
        self.horizontalAccuracy = horizontalAccuracy
        self.verticalAccuracy = verticalAccuracy
        self.course = course
        self.speed = speed
        self.timestamp = timestamp
    }

    var optionalDoubles: [Double?] { [altitude, horizontalAccuracy, verticalAccuracy, course, speed] }

    // Bit-pattern equality keeps NaN equal to itself and -0 apart from 0, so merges stay deterministic.
    public static func == (a: Location, b: Location) -> Bool { compare(a, b) == 0 }
    public static func < (a: Location, b: Location) -> Bool { compare(a, b) < 0 }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(latitude.bitPattern)
        hasher.combine(longitude.bitPattern)
        for value in optionalDoubles { hasher.combine(value?.bitPattern) }
        hasher.combine(timestamp)
    }

    static func compare(_ a: Location, _ b: Location) -> Int {
        var order = compareDoubles(a.latitude, b.latitude)
        if order == 0 { order = compareDoubles(a.longitude, b.longitude) }
        if order == 0 {
            for (x, y) in zip(a.optionalDoubles, b.optionalDoubles) where order == 0 {
                switch (x, y) {
                case (nil, nil): order = 0
                case (nil, _): order = -1
                case (_, nil): order = 1
                case let (x?, y?): order = compareDoubles(x, y)
                }
            }
        }
        if order == 0 {
            switch (a.timestamp, b.timestamp) {
            case (nil, nil): order = 0
            case (nil, _): order = -1
            case (_, nil): order = 1
            case let (x?, y?): order = x == y ? 0 : (x < y ? -1 : 1)
            }
        }
        return order
    }
}

/// One scalar value: what a last-writer-wins field holds, or one element of a list field.
///
/// Equality and order are by exact representation (strings by UTF-8 bytes, doubles by bit pattern),
/// never by Unicode equivalence or IEEE comparison, so every replica orders values the same way.
/// The total order, used for list output and for tie breaks, is by type (`ValueType` order), then value.
public enum ScalarValue: Hashable, Sendable, Comparable {
    case string(String)
    case int64(Int64)
    case double(Double)
    case bytes([UInt8])
    /// Milliseconds since the Unix epoch.
    case timestamp(Int64)
    indirect case reference(Reference)
    indirect case location(Location)
    /// A file kept beside the record (CloudKit's ASSETID): its SHA-256 and size, never its bytes.
    case asset(AssetValue)

    public var type: ValueType {
        switch self {
        case .string: return .string
        case .int64: return .int64
        case .double: return .double
        case .bytes: return .bytes
        case .timestamp: return .timestamp
        case .reference: return .reference
        case .location: return .location
        case .asset: return .asset
        }
    }

    public static func == (a: ScalarValue, b: ScalarValue) -> Bool { compare(a, b) == 0 }
    public static func < (a: ScalarValue, b: ScalarValue) -> Bool { compare(a, b) < 0 }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(type.rawValue)
        switch self {
        case .string(let s): hashBytes(s, into: &hasher)
        case .int64(let i), .timestamp(let i): hasher.combine(i)
        case .double(let d): hasher.combine(d.bitPattern)
        case .bytes(let b): hasher.combine(b)
        case .reference(let r): hasher.combine(r)
        case .location(let l): hasher.combine(l)
        case .asset(let a): hasher.combine(a)
        }
    }

    /// -1, 0 or 1: the total order described on the type.
    @inline(__always)
    public static func compare(_ a: ScalarValue, _ b: ScalarValue) -> Int {
        switch (a, b) {
        case let (.string(x), .string(y)): return compareBytes(x, y)
        case let (.int64(x), .int64(y)), let (.timestamp(x), .timestamp(y)): return x == y ? 0 : (x < y ? -1 : 1)
        case let (.double(x), .double(y)): return compareDoubles(x, y)
        case let (.bytes(x), .bytes(y)):
            return x == y ? 0 : (x.lexicographicallyPrecedes(y) ? -1 : 1)
        case let (.reference(x), .reference(y)): return x == y ? 0 : (x < y ? -1 : 1)
        case let (.location(x), .location(y)): return Location.compare(x, y)
        case let (.asset(x), .asset(y)): return x == y ? 0 : (x < y ? -1 : 1)
        default: return a.type.rawValue < b.type.rawValue ? -1 : 1
        }
    }
}

/// What a field holds as seen by an application: one scalar, or a list (the visible elements of an OR-set).
public enum FieldValue: Hashable, Sendable {
    case scalar(ScalarValue)
    /// A list field's elements in their order, duplicates kept (CloudKit's `*_LIST`), and the element
    /// type (needed to name an empty list's CloudKit type).
    case list(ValueType, [ScalarValue])
    /// An add-wins set's elements, each once, in ascending `ScalarValue` order (`*_SET`).
    case set(ValueType, [ScalarValue])
    /// A text merged character by character (`TEXT`).
    case text(String)

    public static func string(_ s: String) -> FieldValue { .scalar(.string(s)) }
    public static func int64(_ i: Int64) -> FieldValue { .scalar(.int64(i)) }
    public static func double(_ d: Double) -> FieldValue { .scalar(.double(d)) }

    /// CloudKit's type name, e.g. `STRING` or `STRING_LIST`.
    public var cloudKitType: String {
        switch self {
        case .scalar(let v): return v.type.cloudKitName
        case .list(let t, _): return t.cloudKitName + "_LIST"
        case .set(let t, _): return t.cloudKitName + "_SET"
        case .text: return "TEXT"
        }
    }
}

// MARK: - Exact comparisons

/// Byte-wise (UTF-8) comparison: -1, 0 or 1.
@inline(__always)
func compareBytes(_ a: String, _ b: String) -> Int {
    var a = a, b = b
    return a.withUTF8 { x in
        b.withUTF8 { y in
            let count = min(x.count, y.count)
            var index = 0
            while index < count {
                let p = x[index], q = y[index]
                if p != q { return p < q ? -1 : 1 }
                index += 1
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        }
    }
}

func compareBytes(_ a: String?, _ b: String?) -> Int {
    switch (a, b) {
    case (nil, nil): return 0
    case (nil, _): return -1
    case (_, nil): return 1
    case let (x?, y?): return compareBytes(x, y)
    }
}

func bytesEqual(_ a: String?, _ b: String?) -> Bool { compareBytes(a, b) == 0 }

func hashBytes(_ s: String?, into hasher: inout Hasher) {
    guard let s else { hasher.combine(0 as UInt8); return }
    hasher.combine(s.utf8.count)
    for byte in s.utf8 { hasher.combine(byte) }
}

/// Total order on doubles by their sign-adjusted bit pattern: -NaN < -inf < ... < -0 < 0 < ... < inf < NaN.
@inline(__always)
func compareDoubles(_ a: Double, _ b: Double) -> Int {
    func key(_ d: Double) -> UInt64 {
        let bits = d.bitPattern
        return bits & (1 << 63) != 0 ? ~bits : bits | (1 << 63)
    }
    let x = key(a), y = key(b)
    return x == y ? 0 : (x < y ? -1 : 1)
}
extension ScalarValue {
    /// The values in ascending order without repeats (O(n log n)).
    public static func sortedUnique(_ values: [ScalarValue]) -> [ScalarValue] {
        var sorted = values.sorted { ScalarValue.compare($0, $1) < 0 }
        var write = 0
        for value in sorted where write == 0 || ScalarValue.compare(sorted[write - 1], value) != 0 {
            sorted[write] = value
            write += 1
        }
        sorted.removeLast(sorted.count - write)
        return sorted
    }
}
