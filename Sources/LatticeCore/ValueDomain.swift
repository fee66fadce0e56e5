/// The value domain: what a well-formed value may hold. A LOCATION's latitude lies in [-90, 90] and its
/// longitude in [-180, 180], and all its numbers are finite; a TIMESTAMP (and a LOCATION's timestamp) lies
/// in the years 1 to 9999.
///
/// Checked on input, where a value enters the service (a write in JSON or a pushed frame), not when a
/// frame is decoded: a value stored before these rules stays readable and mergeable.
public enum ValueDomain {
    /// 0001-01-01T00:00:00.000Z, in milliseconds since 1970.
    public static let earliestTimestamp: Int64 = -62_135_596_800_000
    /// 9999-12-31T23:59:59.999Z, in milliseconds since 1970.
    public static let latestTimestamp: Int64 = 253_402_300_799_999
    public static let latitudes: ClosedRange<Double> = -90...90
    public static let longitudes: ClosedRange<Double> = -180...180

    /// Why `milliseconds` is not a date of the years 1 to 9999, naming it as `what`; nil when it is.
    public static func timestampViolation(_ milliseconds: Int64, _ what: String) -> String? {
        guard milliseconds < earliestTimestamp || milliseconds > latestTimestamp else { return nil }
        return "\(what) \(milliseconds) is outside the years 1 to 9999 (\(earliestTimestamp) to \(latestTimestamp) "
            + "milliseconds since 1970)"
    }
}

extension ScalarValue {
    /// Why the value lies outside its type's domain (`ValueDomain`), or nil.
    public var domainViolation: String? {
        switch self {
        case .timestamp(let milliseconds): return ValueDomain.timestampViolation(milliseconds, "TIMESTAMP")
        case .location(let location): return location.domainViolation
        default: return nil
        }
    }
}

extension Location {
    /// Why the location lies outside the LOCATION domain (`ValueDomain`), or nil.
    public var domainViolation: String? {
        guard latitude.isFinite, ValueDomain.latitudes.contains(latitude) else {
            return "LOCATION latitude \(latitude) is outside [-90, 90]"
        }
        guard longitude.isFinite, ValueDomain.longitudes.contains(longitude) else {
            return "LOCATION longitude \(longitude) is outside [-180, 180]"
        }
        let parts: [(String, Double?)] = [("altitude", altitude), ("horizontalAccuracy", horizontalAccuracy),
                                          ("verticalAccuracy", verticalAccuracy), ("course", course), ("speed", speed)]
        for (name, value) in parts {
            if let value, !value.isFinite { return "LOCATION \(name) must be a finite number, not \(value)" }
        }
        if let timestamp { return ValueDomain.timestampViolation(timestamp, "LOCATION timestamp") }
        return nil
    }
}

extension FieldValue {
    /// The first scalar of the value (or of its elements) outside its domain, or nil.
    public var domainViolation: String? {
        switch self {
        case .scalar(let value): return value.domainViolation
        case .list(let type, let elements), .set(let type, let elements):
            guard type == .timestamp || type == .location else { return nil }
            for element in elements { if let violation = element.domainViolation { return violation } }
            return nil
        case .text:
            return nil
        }
    }
}

extension RecordFrame {
    /// The first field holding a value outside its domain (`ValueDomain`), with the reason; nil when every
    /// value is inside. Walks the validated frame once, building no values but the ones it checks.
    public var domainViolation: (field: String, reason: String)? {
        withFrame { frame in
            var found: (field: String, reason: String)?
            RecordFrame.walkValues(frame) { name, cursor in
                guard let reason = RecordFrame.domainViolation(of: &cursor) else { return true }
                found = (String(decoding: UnsafeRawBufferPointer(rebasing: frame[name]), as: UTF8.self), reason)
                return false
            }
            return found
        }
    }

    /// The assets (ASSETID values) the record holds: each register's value and each list's live elements,
    /// each checksum once. Walks the validated frame once, building only the assets.
    public var assetValues: [AssetValue] {
        withFrame { frame in
            var assets: [AssetValue] = []
            RecordFrame.walkValues(frame) { _, cursor in
                let start = cursor.offset
                if cursor.u8() == ValueType.asset.rawValue {
                    let checksum = [UInt8](UnsafeRawBufferPointer(rebasing: frame[cursor.offset..<(cursor.offset + AssetValue.checksumLength)]))
                    cursor.offset += AssetValue.checksumLength
                    let size = Int64(bitPattern: cursor.u64())
                    if let asset = AssetValue(checksum: checksum, size: size),
                       !assets.contains(where: { $0.checksum == checksum }) {
                        assets.append(asset)
                    }
                } else {
                    cursor.offset = start
                    cursor.skipValue()
                }
                return true
            }
            return assets
        }
    }

    /// Calls `visit` with each field's name (the payload range of its string) and a cursor at each value it
    /// holds (a register's value; each entry of a set; each visible element of a list), which `visit` must
    /// read past; stops when it answers false.
    static func walkValues(_ frame: UnsafeRawBufferPointer, _ visit: (Range<Int>, inout ByteCursor) -> Bool) {
        let header = FrameHeader(frame)
        var cursor = ByteCursor(frame, at: header.fieldsStart)
        for _ in 0..<header.fieldCount {
            let name = cursor.string()
            let kind = cursor.u8()
            let length = Int(cursor.varint())
            let payload = cursor.offset
            var inner = ByteCursor(frame, at: payload)
            if kind == 0 { // a register: its stamp, then its value
                _ = inner.stamp()
                guard visit(name, &inner) else { return }
            } else if kind == 1 { // a set: its context, then entries of a value and a dot
                let replicas = inner.varint()
                for _ in 0..<replicas {
                    _ = inner.varint()
                    inner.offset += 8
                }
                let entries = inner.varint()
                for _ in 0..<entries {
                    guard visit(name, &inner) else { return }
                    _ = inner.stamp()
                }
            } else if kind == 2 { // a list: its context, replicas and runs, then its visible values in order
                let visible = SequenceCodecLayout.skipToValues(&inner)
                for _ in 0..<visible {
                    guard visit(name, &inner) else { return }
                }
            }
            // A text (kind 3) holds characters, not values: nothing to visit.
            cursor.offset = payload + length
        }
    }

    /// Reads one encoded optional value (the layout of `BinaryWriter.value`) and says why it is outside its
    /// domain, or nil.
    private static func domainViolation(of cursor: inout ByteCursor) -> String? {
        let start = cursor.offset
        let tag = cursor.u8()
        switch tag {
        case ValueType.timestamp.rawValue:
            return ValueDomain.timestampViolation(Int64(bitPattern: cursor.u64()), "TIMESTAMP")
        case ValueType.location.rawValue:
            var location = Location(latitude: Double(bitPattern: cursor.u64()), longitude: Double(bitPattern: cursor.u64()))
            let mask = cursor.u8()
            if mask & 1 != 0 { location.altitude = Double(bitPattern: cursor.u64()) }
            if mask & 2 != 0 { location.horizontalAccuracy = Double(bitPattern: cursor.u64()) }
            if mask & 4 != 0 { location.verticalAccuracy = Double(bitPattern: cursor.u64()) }
            if mask & 8 != 0 { location.course = Double(bitPattern: cursor.u64()) }
            if mask & 16 != 0 { location.speed = Double(bitPattern: cursor.u64()) }
            if mask & 32 != 0 { location.timestamp = Int64(bitPattern: cursor.u64()) }
            return location.domainViolation
        default:
            cursor.offset = start
            cursor.skipValue()
            return nil
        }
    }
}
