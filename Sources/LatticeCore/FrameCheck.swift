// The quick check of one record frame: every import validates every frame it receives, so the common
// shapes are checked here in one tight pass over raw addresses, with no error values built.
//
// It answers only yes or no, and it is never more lenient than `BinaryReader.scanFrame`'s full check:
// it applies every rule of the format to what it accepts, and it declines (answers no) for anything it
// does not handle itself: references and locations, non-ASCII text, malformed input. The caller then
// runs the full check, which either accepts the frame after all or throws the precise error. So the
// quick check changes how fast a frame is accepted, never whether. A differential fuzz test holds it
// to that (`FuzzTests`).

/// Bit masks of the bytes names may hold, for `Names` rules checked a byte at a time: bit `b` of the
/// first mask is byte `b`, bit `b` of the second is byte `64 + b`.
enum NameBytes {
    /// Printable ASCII except `/` and `\` (record, zone and owner names).
    static let printable: (UInt64, UInt64) = (0xFFFF_7FFF_0000_0000, 0x7FFF_FFFF_EFFF_FFFF)
    /// Letters (the first byte of an identifier: field names and record types).
    static let letters: (UInt64, UInt64) = (0, 0x07FF_FFFE_07FF_FFFE)
    /// Letters, digits, `_` and `.` (the other bytes of an identifier).
    static let identifier: (UInt64, UInt64) = (0x03FF_4000_0000_0000, 0x07FF_FFFE_87FF_FFFE)

    @inline(__always) static func allows(_ mask: (UInt64, UInt64), _ byte: UInt8) -> Bool {
        let word = byte < 64 ? mask.0 : mask.1
        return byte < 128 && (word &>> UInt64(byte & 63)) & 1 != 0
    }

    /// True when `count` bytes at `base` form a legal record name (`Names.brokenRule(_, .recordName) == nil`).
    /// `loadable` says eight bytes may be read from `base`: names of up to eight bytes are then checked
    /// all at once.
    @inline(__always) static func isRecordName(_ base: UnsafeRawPointer, _ count: Int, loadable: Bool = false) -> Bool {
        guard count > 0, count <= Names.maximumLength else { return false }
        let first = base.load(as: UInt8.self)
        if first == UInt8(ascii: "_") { return false }
        if loadable && count <= 8 {
            guard isPrintable(base.loadUnaligned(as: UInt64.self), count) else { return false }
        } else {
            for index in 0..<count where !allows(printable, base.load(fromByteOffset: index, as: UInt8.self)) { return false }
        }
        // "." and ".." are refused.
        return !(first == UInt8(ascii: ".")
                 && (count == 1 || (count == 2 && base.load(fromByteOffset: 1, as: UInt8.self) == first)))
    }

    /// True when the first `count` bytes of `word` (little-endian) are all printable ASCII other than `/`
    /// and `\`, checked on all eight bytes at once (bytes past `count` are replaced by a legal one).
    @inline(__always) static func isPrintable(_ word: UInt64, _ count: Int) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101, high: UInt64 = 0x8080_8080_8080_8080
        let kept: UInt64 = count >= 8 ? .max : (1 &<< UInt64(count &* 8)) &- 1
        let x = (word & kept) | (0x6161_6161_6161_6161 & ~kept)
        @inline(__always) func hasZeroByte(_ y: UInt64) -> Bool { (y &- ones) & ~y & high != 0 }
        if x & high != 0 { return false }                           // not ASCII
        if (x &- 0x20 &* ones) & ~x & high != 0 { return false }     // a control character below 0x20
        return !hasZeroByte(x ^ (0x7F &* ones)) && !hasZeroByte(x ^ (0x2F &* ones)) && !hasZeroByte(x ^ (0x5C &* ones))
    }

    /// True when `count` bytes at `base` form a legal field name or record type.
    @inline(__always) static func isIdentifier(_ base: UnsafeRawPointer, _ count: Int) -> Bool {
        guard count > 0, count <= Names.maximumLength, allows(letters, base.load(as: UInt8.self)) else { return false }
        var index = 1
        while index < count {
            if !allows(identifier, base.load(fromByteOffset: index, as: UInt8.self)) { return false }
            index &+= 1
        }
        return true
    }
}

/// Identifiers (field names, record types) of up to seven bytes already found legal: the same few names
/// recur in every record of a delta. A direct-mapped table of sixteen names, each kept as one word
/// (its bytes and its length), so a hit costs one load and one compare.
struct NameCache {
    private var slots: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64,
                        UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) =
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    /// The key of a name of 1-7 bytes whose first eight bytes may be loaded, or 0 (never a key).
    @inline(__always) static func key(_ name: UnsafeRawPointer, _ count: Int, loadable: Bool) -> UInt64 {
        guard loadable, count > 0, count < 8 else { return 0 }
        let bytes = name.loadUnaligned(as: UInt64.self) & ((1 &<< UInt64(count &* 8)) &- 1)
        return bytes | UInt64(count) &<< 56
    }

    @inline(__always) private static func slot(_ key: UInt64) -> Int {
        Int(truncatingIfNeeded: (key &* 0x9E37_79B9_7F4A_7C15) &>> 60) &* 8
    }

    /// True when the cache at `cache` holds `key` (read in place: the table is not copied).
    @inline(__always) static func contains(_ key: UInt64, in cache: UnsafeMutablePointer<NameCache>) -> Bool {
        key != 0 && UnsafeRawPointer(cache).load(fromByteOffset: slot(key), as: UInt64.self) == key
    }

    @inline(__always) static func insert(_ key: UInt64, in cache: UnsafeMutablePointer<NameCache>) {
        guard key != 0 else { return }
        UnsafeMutableRawPointer(cache).storeBytes(of: key, toByteOffset: slot(key), as: UInt64.self)
    }
}

/// The quick check (see the top of this file). Reads never pass `end`.
struct FrameCheck {
    let p: UnsafeRawPointer
    var i: Int
    var end: Int
    /// The end of the whole buffer (reads past `end` are allowed up to here, for eight-byte compares).
    let bufferEnd: Int
    let names: UnsafeMutablePointer<NameCache>
    /// The greatest clock value in the frame.
    var maximumHLC: UInt64 = 0

    /// Checks the frame at `offset` in `buffer`, reading no further than `limit`. Returns the offset
    /// after the frame, the range of the record name's payload and the greatest clock value, or nil when
    /// the full check must decide.
    @inline(__always)
    static func check(_ buffer: UnsafeRawBufferPointer, at offset: Int, limit: Int, names: inout NameCache)
        -> (end: Int, name: Range<Int>, maximumHLC: UInt64)? {
        guard let base = buffer.baseAddress, limit &- offset >= 4 else { return nil }
        let length = Int(UInt32(littleEndian: base.loadUnaligned(fromByteOffset: offset, as: UInt32.self)))
        guard length <= Record.maximumMergedSize, length <= limit &- offset &- 4 else { return nil }
        return withUnsafeMutablePointer(to: &names) { names in
            var check = FrameCheck(p: base, i: offset &+ 4, end: offset &+ 4 &+ length, bufferEnd: buffer.count,
                                   names: names)
            guard let name = check.body() else { return nil }
            return (check.end, name, check.maximumHLC)
        }
    }

    @inline(__always) private func byte(_ at: Int) -> UInt8 { p.load(fromByteOffset: at, as: UInt8.self) }

    @inline(__always) private mutating func u8() -> UInt8? {
        guard i < end else { return nil }
        let value = byte(i)
        i &+= 1
        return value
    }

    @inline(__always) private mutating func u64() -> UInt64? {
        guard end &- i >= 8 else { return nil }
        let value = UInt64(littleEndian: p.loadUnaligned(fromByteOffset: i, as: UInt64.self))
        i &+= 8
        return value
    }

    /// A minimal LEB128 varint of at most 64 bits (the rules of `BinaryReader.varint`).
    @inline(__always) private mutating func varint() -> UInt64? {
        guard i < end else { return nil }
        let first = byte(i)
        if first < 0x80 {
            i &+= 1
            return UInt64(first)
        }
        return longVarint()
    }

    @inline(never) private mutating func longVarint() -> UInt64? {
        var result: UInt64 = 0, shift: UInt64 = 0
        while i < end {
            let value = byte(i)
            i &+= 1
            if shift == 63 && value > 1 { return nil }
            result |= UInt64(value & 0x7F) &<< shift
            if value & 0x80 == 0 { return value == 0 && shift > 0 ? nil : result }
            shift &+= 7
        }
        return nil
    }

    /// A count of elements of at least `size` bytes each that fit in what remains. (Checked as at most
    /// the bytes that remain: reading the elements then fails early if they do not fit, and the full
    /// check's stricter bound holds for everything the quick check accepts.)
    @inline(__always) private mutating func count(_ size: Int) -> Int? {
        guard let value = varint(), value <= UInt64(end &- i) else { return nil }
        return Int(truncatingIfNeeded: value)
    }

    @inline(__always) private mutating func stamp() -> Stamp? {
        guard let hlc = u64(), let replica = varint() else { return nil }
        if hlc > maximumHLC { maximumHLC = hlc }
        return Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(replica))
    }

    /// A length-prefixed name; returns its payload range.
    @inline(__always) private mutating func name(identifier: Bool) -> Range<Int>? {
        guard let length = count(1) else { return nil }
        let start = i
        let loadable = start &+ 8 <= bufferEnd
        if identifier {
            let key = NameCache.key(p + start, length, loadable: loadable)
            if !NameCache.contains(key, in: names) {
                guard NameBytes.isIdentifier(p + start, length) else { return nil }
                NameCache.insert(key, in: names)
            }
        } else {
            guard NameBytes.isRecordName(p + start, length, loadable: loadable) else { return nil }
        }
        i &+= length
        return Range(uncheckedBounds: (start, i))
    }

    /// A value of the common types (nil, string in ASCII, bytes, int64, double, timestamp); returns its
    /// type byte. References, locations and non-ASCII text are left to the full check.
    @inline(__always) private mutating func value() -> UInt8? {
        // The most common value, a short string, inline.
        if end &- i >= 2 && byte(i) == ValueType.string.rawValue {
            let length = Int(byte(i &+ 1))
            let start = i &+ 2
            if length < 0x80 && length <= end &- start && FrameCheck.isASCII(p, start, length, bufferEnd: bufferEnd) {
                i = start &+ length
                return ValueType.string.rawValue
            }
        }
        return otherValue()
    }

    @inline(never) private mutating func otherValue() -> UInt8? {
        guard let tag = u8() else { return nil }
        switch tag {
        case 0:
            return 0
        case ValueType.string.rawValue:
            guard let length = count(1), FrameCheck.isASCII(p, i, length, bufferEnd: bufferEnd) else { return nil }
            i &+= length
        case ValueType.bytes.rawValue:
            guard let length = count(1) else { return nil }
            i &+= length
        case ValueType.int64.rawValue, ValueType.double.rawValue, ValueType.timestamp.rawValue:
            guard end &- i >= 8 else { return nil }
            i &+= 8
        default:
            return nil
        }
        return tag
    }

    /// True when the `count` bytes at `start` are ASCII. Up to sixteen bytes take one or two eight-byte
    /// loads (masked, or overlapping) when the buffer has the bytes to load.
    @inline(__always)
    static func isASCII(_ p: UnsafeRawPointer, _ start: Int, _ count: Int, bufferEnd: Int) -> Bool {
        let high: UInt64 = 0x8080_8080_8080_8080
        if count <= 8 && start &+ 8 <= bufferEnd {
            let word = p.loadUnaligned(fromByteOffset: start, as: UInt64.self)
            let mask: UInt64 = count == 8 ? .max : (1 &<< UInt64(count &* 8)) &- 1 // the first `count` bytes
            return word & mask & high == 0
        }
        if count > 8 && count <= 16 {
            let head = p.loadUnaligned(fromByteOffset: start, as: UInt64.self)
            let tail = p.loadUnaligned(fromByteOffset: start &+ count &- 8, as: UInt64.self)
            return (head | tail) & high == 0
        }
        return isASCII(p + start, count)
    }

    @inline(__always) static func isASCII(_ base: UnsafeRawPointer, _ count: Int) -> Bool {
        var index = 0, high: UInt64 = 0
        while index &+ 8 <= count {
            high |= base.loadUnaligned(fromByteOffset: index, as: UInt64.self)
            index &+= 8
        }
        while index < count {
            high |= UInt64(base.load(fromByteOffset: index, as: UInt8.self))
            index &+= 1
        }
        return high & 0x8080_8080_8080_8080 == 0
    }

    /// A version vector: replicas strictly ascending, no zero clock.
    @inline(__always) private mutating func vector() -> Bool {
        guard let count = count(9) else { return false }
        var previous: UInt64 = 0
        for index in 0..<count {
            guard let replica = varint(), let hlc = u64(), hlc != 0, index == 0 || replica > previous else { return false }
            if hlc > maximumHLC { maximumHLC = hlc }
            previous = replica
        }
        return true
    }

    /// The record body (after the length); returns the name's payload range.
    @inline(__always) private mutating func body() -> Range<Int>? {
        guard let recordName = name(identifier: false), name(identifier: true) != nil,
              let generation = varint(), generation >= 1, generation <= UInt64(UInt32.max),
              stamp() != nil, let flags = u8(), flags & ~1 == 0 else { return nil } // a parent: the full check
        let deleted = flags == 1
        if deleted && stamp() == nil { return nil }
        guard let fieldCount = count(6), !deleted || fieldCount == 0 else { return nil }
        var previous = 0, previousLength = -1
        for _ in 0..<fieldCount {
            guard let field = name(identifier: true) else { return nil }
            if previousLength >= 0 && Raw.compare(p + previous, previousLength, p + field.lowerBound, field.count,
                                                   loadable: field.lowerBound &+ 8 <= bufferEnd) >= 0 { return nil }
            previous = field.lowerBound
            previousLength = field.count
            guard let kind = u8(), let length = count(1) else { return nil }
            let outer = end
            end = i &+ length
            switch kind {
            case 0:
                guard stamp() != nil, value() != nil else { return nil }
            case 1:
                guard set() else { return nil }
            case 2:
                guard sequence(of: ScalarValue.self) else { return nil }
            case 3:
                guard sequence(of: Unicode.Scalar.self) else { return nil }
            default:
                return nil
            }
            guard i == end else { return nil }
            end = outer
        }
        return i == end ? recordName : nil
    }

    /// A list or text payload: the whole sequence decoder's check (canonical runs in the tree's order,
    /// O(r log r) for r runs), over the payload's bytes.
    private mutating func sequence<Element: SequenceElement>(of: Element.Type) -> Bool {
        let bytes = UnsafeRawBufferPointer(start: p + i, count: end &- i)
        var reader = BinaryReader(bytes)
        guard let state = try? SequenceState<Element>(decoding: &reader), reader.offset == bytes.count else { return false }
        let hlc = state.context.maximumHLC.rawValue
        if hlc > maximumHLC { maximumHLC = hlc }
        i = end
        return true
    }

    /// An OR-set payload: its context, then entries strictly ordered, none nil, each dot inside the context.
    @inline(__always) private mutating func set() -> Bool {
        var contextAt = i
        guard vector() else { return false }
        let context = RawVector(p, &contextAt)
        guard let count = count(11) else { return false }
        var previous = 0, previousDot = Stamp(hlc: .zero, replica: ReplicaID(0))
        for index in 0..<count {
            let at = i
            guard let tag = value(), tag != 0, let dot = stamp() else { return false }
            if index > 0 {
                var order = Raw.compareValues(p, previous, p, at, inSet: true)
                if order == 0 { order = previousDot == dot ? 0 : (previousDot < dot ? -1 : 1) }
                if order >= 0 { return false }
            }
            guard context.covers(p, dot) else { return false }
            previous = at
            previousDot = dot
        }
        return true
    }
}
