import Foundation

// Byte-level access to records in the canonical binary form (see `BinaryCodec`).
//
// Zones store every record as its encoded frame and join incoming frames byte by byte: no strings,
// arrays or enum payloads are built on the hot path, and a whole-state export is a concatenation of
// stored frames. `Record.merge` is the readable reference of the same join; a differential property
// test keeps the two equal (`encode(a.merging(b)) == FrameMerge.merge(encode(a), encode(b))`).
//
// Everything here reads frames that `BinaryReader.scanFrame` has already validated, so reads are unchecked.

/// A fresh array holding a copy of raw bytes (one memcpy).
///
/// Built from a buffer pointer rather than with `init(unsafeUninitializedCapacity:)`: on this toolchain the
/// closure-based initializer costs about 700 more instructions per array (a generic metadata lookup and
/// the closure), measured with callgrind, and the zone join makes one array per merged record.
@inline(__always)
func copyBytes(_ raw: UnsafeRawBufferPointer) -> [UInt8] {
    guard raw.count > 0 else { return [] }
    return Array(UnsafeBufferPointer(start: raw.baseAddress!.assumingMemoryBound(to: UInt8.self), count: raw.count))
}

/// An unchecked cursor over validated bytes.
struct ByteCursor {
    let base: UnsafeRawBufferPointer
    var offset: Int

    @inline(__always) init(_ base: UnsafeRawBufferPointer, at offset: Int = 0) {
        self.base = base
        self.offset = offset
    }

    @inline(__always) mutating func u8() -> UInt8 {
        let value = base[offset]
        offset += 1
        return value
    }

    @inline(__always) mutating func u32() -> UInt32 {
        let value = base.loadUnaligned(fromByteOffset: offset, as: UInt32.self)
        offset += 4
        return UInt32(littleEndian: value)
    }

    @inline(__always) mutating func u64() -> UInt64 {
        let value = base.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
        offset += 8
        return UInt64(littleEndian: value)
    }

    @inline(__always) mutating func varint() -> UInt64 {
        var byte = base[offset]
        offset += 1
        if byte < 0x80 { return UInt64(byte) }
        var result = UInt64(byte & 0x7F)
        var shift: UInt64 = 7
        repeat {
            byte = base[offset]
            offset += 1
            result |= UInt64(byte & 0x7F) << shift
            shift += 7
        } while byte >= 0x80
        return result
    }

    /// Skips a length-prefixed string and returns the range of its UTF-8 payload.
    @inline(__always) mutating func string() -> Range<Int> {
        let length = Int(varint())
        let start = offset
        offset += length
        return start..<offset
    }

    @inline(__always) mutating func stamp() -> Stamp {
        let hlc = u64()
        return Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(varint()))
    }

    /// Skips an optional value (type 0 = nil).
    @inline(__always) mutating func skipValue() {
        let tag = u8()
        switch tag {
        case 0: break
        case ValueType.string.rawValue, ValueType.bytes.rawValue: _ = string()
        case ValueType.int64.rawValue, ValueType.double.rawValue, ValueType.timestamp.rawValue: offset += 8
        case ValueType.reference.rawValue:
            _ = string()
            if u8() & 1 != 0 {
                _ = string()
                _ = string()
            }
        default: // location
            offset += 16
            let mask = u8()
            offset += 8 * mask.nonzeroBitCount
        }
    }

    /// Skips a version vector and returns its whole byte range (count included).
    @inline(__always) mutating func skipVersionVector() -> Range<Int> {
        let start = offset
        let count = varint()
        for _ in 0..<count {
            _ = varint()
            offset += 8
        }
        return start..<offset
    }
}

/// The parsed header of one frame (`length:u32 recordBody`).
struct FrameHeader {
    var name: Range<Int>            // payload of the name string
    var typeWhole: Range<Int>       // the type string with its length prefix
    var type: Range<Int>            // payload of the type string
    var generation: UInt64
    var createdWhole: Range<Int>
    var created: Stamp
    var deletion: Stamp?
    var parentStamp: Stamp
    var parentWhole: Range<Int>?    // stamp and value
    var parentValue: Int            // offset of the parent value's type byte
    var fieldCount: Int
    var fieldsStart: Int
    var end: Int

    @inline(__always) init(_ p: UnsafeRawBufferPointer) {
        var c = ByteCursor(p)
        let length = Int(c.u32())
        end = 4 + length
        name = c.string()
        let typeStart = c.offset
        type = c.string()
        typeWhole = typeStart..<c.offset
        generation = c.varint()
        let createdStart = c.offset
        created = c.stamp()
        createdWhole = createdStart..<c.offset
        let flags = c.u8()
        deletion = flags & 1 != 0 ? c.stamp() : nil
        parentStamp = Stamp(hlc: .zero, replica: ReplicaID(0))
        parentValue = 0
        if flags & 2 != 0 {
            let start = c.offset
            parentStamp = c.stamp()
            parentValue = c.offset
            c.skipValue()
            parentWhole = start..<c.offset
        } else {
            parentWhole = nil
        }
        fieldCount = Int(c.varint())
        fieldsStart = c.offset
    }
}

/// One field inside a frame: `string(name) kind:u8 length:varint payload`.
struct FieldView {
    var whole: Range<Int>
    var name: Range<Int>
    var isSet: Bool
    /// Start of the payload (after the length).
    var payload: Int

    /// Reads the field header at `cursor` and moves past the whole field without parsing its payload.
    @inline(__always) init(_ c: inout ByteCursor) {
        let start = c.offset
        name = c.string()
        isSet = c.u8() == 1
        let length = Int(c.varint())
        payload = c.offset
        c.offset += length
        whole = start..<c.offset
    }

    /// A register's winning stamp.
    @inline(__always) func stamp(_ p: UnsafeRawBufferPointer) -> Stamp {
        var c = ByteCursor(p, at: payload)
        return c.stamp()
    }

    /// A register's value (offset of its type byte).
    @inline(__always) func valueOffset(_ p: UnsafeRawBufferPointer) -> Int {
        var c = ByteCursor(p, at: payload)
        _ = c.stamp()
        return c.offset
    }

    /// A set's causal context (count included), entry count and first entry.
    @inline(__always) func setLayout(_ p: UnsafeRawBufferPointer) -> (context: Range<Int>, entryCount: Int, entries: Int) {
        var c = ByteCursor(p, at: payload)
        let context = c.skipVersionVector()
        let count = Int(c.varint())
        return (context, count, c.offset)
    }
}

// MARK: - Comparisons on encoded bytes

enum EncodedOrder {
    /// Lexicographic comparison of two byte ranges: -1, 0 or 1 (eight bytes at a time).
    @inline(__always)
    static func compare(_ p: UnsafeRawBufferPointer, _ a: Range<Int>, _ q: UnsafeRawBufferPointer, _ b: Range<Int>) -> Int {
        let count = min(a.count, b.count)
        if count > 0 {
            let x = p.baseAddress! + a.lowerBound, y = q.baseAddress! + b.lowerBound
            var index = 0
            while index &+ 8 <= count {
                let u = x.loadUnaligned(fromByteOffset: index, as: UInt64.self).bigEndian
                let v = y.loadUnaligned(fromByteOffset: index, as: UInt64.self).bigEndian
                if u != v { return u < v ? -1 : 1 }
                index &+= 8
            }
            while index < count {
                let u = x.load(fromByteOffset: index, as: UInt8.self), v = y.load(fromByteOffset: index, as: UInt8.self)
                if u != v { return u < v ? -1 : 1 }
                index &+= 1
            }
        }
        return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
    }

    @inline(__always)
    static func equal(_ p: UnsafeRawBufferPointer, _ a: Range<Int>, _ q: UnsafeRawBufferPointer, _ b: Range<Int>) -> Bool {
        a.count == b.count && compare(p, a, q, b) == 0
    }

    /// `compareValues` with the common cases (two strings, two integers) inline.
    @inline(__always)
    static func compareValuesFast(_ p: UnsafeRawBufferPointer, _ i: Int, _ q: UnsafeRawBufferPointer, _ j: Int) -> Int {
        let ta = p[i]
        if ta == q[j] {
            if ta == ValueType.string.rawValue {
                let la = p[i + 1], lb = q[j + 1]
                if la < 0x80 && lb < 0x80 {
                    return compare(p, (i + 2)..<(i + 2 + Int(la)), q, (j + 2)..<(j + 2 + Int(lb)))
                }
            } else if ta == ValueType.int64.rawValue {
                let x = Int64(bitPattern: UInt64(littleEndian: p.loadUnaligned(fromByteOffset: i + 1, as: UInt64.self)))
                let y = Int64(bitPattern: UInt64(littleEndian: q.loadUnaligned(fromByteOffset: j + 1, as: UInt64.self)))
                return x == y ? 0 : (x < y ? -1 : 1)
            }
        }
        return compareValues(p, i, q, j)
    }

    /// Compares two encoded optional values in `ScalarValue` order (nil lowest), like `LWWRegister.valueOrder`.
    static func compareValues(_ p: UnsafeRawBufferPointer, _ i: Int, _ q: UnsafeRawBufferPointer, _ j: Int) -> Int {
        let ta = p[i], tb = q[j]
        if ta != tb { return ta < tb ? -1 : 1 }
        var a = ByteCursor(p, at: i + 1)
        var b = ByteCursor(q, at: j + 1)
        switch ta {
        case 0:
            return 0
        case ValueType.string.rawValue, ValueType.bytes.rawValue:
            return compare(p, a.string(), q, b.string())
        case ValueType.int64.rawValue, ValueType.timestamp.rawValue:
            let x = Int64(bitPattern: a.u64()), y = Int64(bitPattern: b.u64())
            return x == y ? 0 : (x < y ? -1 : 1)
        case ValueType.double.rawValue:
            return compareDoubles(Double(bitPattern: a.u64()), Double(bitPattern: b.u64()))
        default:
            return ScalarValue.compare(decodeValue(p, i), decodeValue(q, j))
        }
    }

    /// Materializes one validated value (used only for references and locations).
    static func decodeValue(_ p: UnsafeRawBufferPointer, _ i: Int) -> ScalarValue {
        var reader = BinaryReader(p)
        reader.offset = i
        // The bytes were validated when they entered the zone; a failure here is a bug.
        guard let value = try? reader.value() else { preconditionFailure("unvalidated value bytes") }
        return value
    }

    /// True when the encoded version vector at `vv` covers `stamp`.
    @inline(__always)
    static func covers(_ p: UnsafeRawBufferPointer, _ vv: Range<Int>, _ stamp: Stamp) -> Bool {
        var c = ByteCursor(p, at: vv.lowerBound)
        let count = c.varint()
        for _ in 0..<count {
            let replica = c.varint()
            let hlc = c.u64()
            if replica == stamp.replica.rawValue { return stamp.hlc.rawValue <= hlc }
            if replica > stamp.replica.rawValue { return false }
        }
        return false
    }

    /// True when the encoded vector at `vv` holds an entry above `version`.
    @inline(__always)
    static func exceeds(_ p: UnsafeRawBufferPointer, _ vv: Range<Int>, _ version: VersionVector) -> Bool {
        var c = ByteCursor(p, at: vv.lowerBound)
        let count = c.varint()
        for _ in 0..<count {
            let replica = c.varint()
            let hlc = c.u64()
            if !version.covers(Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(replica))) { return true }
        }
        return false
    }
}

// MARK: - The byte-level join

/// Joins encoded frames of the same record (same name): the byte-level twin of `Record.merge`.
enum FrameMerge {
    /// The join of `mine` and `theirs`, or `nil` when `mine` already reflects everything in `theirs`.
    /// `scratch` is working memory reused across calls.
    static func merge(_ mine: [UInt8], _ theirs: UnsafeRawBufferPointer, scratch out: inout BinaryWriter) -> [UInt8]? {
        mine.withUnsafeBytes { p in
            if p.count == theirs.count && memcmp(p.baseAddress!, theirs.baseAddress!, p.count) == 0 { return nil }
            out.truncate(to: 0)
            return merge(p, theirs, mineIsResult: true, into: &out)
        }
    }

    /// The join of two frames (used by tests on arbitrary pairs); always returns the joined frame.
    static func merged(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
        var out = BinaryWriter(capacity: a.count + b.count)
        return a.withUnsafeBytes { p in b.withUnsafeBytes { q in merge(p, q, mineIsResult: false, into: &out) ?? a } }
    }

    private static func merge(_ p: UnsafeRawBufferPointer, _ q: UnsafeRawBufferPointer, mineIsResult: Bool,
                              into out: inout BinaryWriter) -> [UInt8]? {
        let a = FrameHeader(p), b = FrameHeader(q)
        if a.generation != b.generation {
            return a.generation > b.generation ? (mineIsResult ? nil : copyBytes(p)) : copyBytes(q)
        }
        // Creation stamp and record type come from the later creation (ties: greater type bytes).
        let headerFromB = a.created < b.created
            || (a.created == b.created && EncodedOrder.compare(p, a.type, q, b.type) < 0)
        let deletion: Stamp? = switch (a.deletion, b.deletion) {
        case (nil, nil): nil
        case let (x?, nil): x
        case let (nil, y?): y
        case let (x?, y?): max(x, y)
        }
        out.reserve(p.count + q.count)
        out.u32(0)
        out.varint(UInt64(a.name.count))
        out.append(p, a.name)
        if headerFromB {
            out.append(q, b.typeWhole)
        } else {
            out.append(p, a.typeWhole)
        }
        out.varint(a.generation)
        out.stamp(headerFromB ? b.created : a.created)
        if let deletion {
            out.u8(1)
            out.stamp(deletion)
            out.varint(0)
            return finish(&out, comparedTo: mineIsResult ? p : nil)
        }
        // Parent register.
        var parentFrom: Int = 0 // 0 none, 1 mine, 2 theirs
        switch (a.parentWhole, b.parentWhole) {
        case (nil, nil): parentFrom = 0
        case (_?, nil): parentFrom = 1
        case (nil, _?): parentFrom = 2
        case (_?, _?):
            if a.parentStamp != b.parentStamp {
                parentFrom = a.parentStamp < b.parentStamp ? 2 : 1
            } else {
                parentFrom = EncodedOrder.compareValues(p, a.parentValue, q, b.parentValue) < 0 ? 2 : 1
            }
        }
        out.u8(parentFrom == 0 ? 0 : 2)
        if parentFrom == 1 { out.append(p, a.parentWhole!) }
        if parentFrom == 2 { out.append(q, b.parentWhole!) }
        mergeFields(p, a, q, b, into: &out)
        return finish(&out, comparedTo: mineIsResult ? p : nil)
    }

    /// Patches the frame length; returns nil when the result equals `original`.
    @inline(__always)
    private static func finish(_ out: inout BinaryWriter, comparedTo original: UnsafeRawBufferPointer?) -> [UInt8]? {
        out.patchU32(UInt32(out.count - 4), at: 0)
        if let original, original.count == out.count {
            let same = out.withWrittenBytes { memcmp($0.baseAddress!, original.baseAddress!, original.count) == 0 }
            if same { return nil }
        }
        return out.copyBytes()
    }

    @inline(__always)
    private static func mergeFields(_ p: UnsafeRawBufferPointer, _ a: FrameHeader, _ q: UnsafeRawBufferPointer,
                                    _ b: FrameHeader, into out: inout BinaryWriter) {
        let countAt = out.countPlaceholder()
        var ca = ByteCursor(p, at: a.fieldsStart), cb = ByteCursor(q, at: b.fieldsStart)
        var leftA = a.fieldCount, leftB = b.fieldCount
        var x = leftA > 0 ? FieldView(&ca) : nil
        var y = leftB > 0 ? FieldView(&cb) : nil
        var union = 0
        // Consecutive fields only `mine` holds are copied as one run.
        var run = a.fieldsStart..<a.fieldsStart
        while x != nil || y != nil {
            let order: Int
            if let x, let y { order = EncodedOrder.compare(p, x.name, q, y.name) } else { order = x == nil ? 1 : -1 }
            if order < 0 {
                let whole = x!.whole
                if run.upperBound != whole.lowerBound {
                    out.append(p, run)
                    run = whole.lowerBound..<whole.lowerBound
                }
                run = run.lowerBound..<whole.upperBound
            } else {
                out.append(p, run)
                run = 0..<0
                if order > 0 { out.append(q, y!.whole) } else { mergeField(p, x!, q, y!, into: &out) }
            }
            union += 1
            if order <= 0 { leftA -= 1; x = leftA > 0 ? FieldView(&ca) : nil }
            if order >= 0 { leftB -= 1; y = leftB > 0 ? FieldView(&cb) : nil }
        }
        out.append(p, run)
        out.patchCount(union, at: countAt)
    }

    @inline(__always)
    private static func mergeField(_ p: UnsafeRawBufferPointer, _ x: FieldView, _ q: UnsafeRawBufferPointer,
                                   _ y: FieldView, into out: inout BinaryWriter) {
        if EncodedOrder.equal(p, x.whole, q, y.whole) {
            out.append(p, x.whole)
            return
        }
        switch (x.isSet, y.isSet) {
        case (false, false):
            let sx = x.stamp(p), sy = y.stamp(q)
            let theirsWins = sx != sy ? sx < sy
                : EncodedOrder.compareValues(p, x.valueOffset(p), q, y.valueOffset(q)) < 0
            if theirsWins { out.append(q, y.whole) } else { out.append(p, x.whole) }
        case (true, false):
            out.append(p, x.whole)
        case (false, true):
            out.append(q, y.whole)
        case (true, true):
            out.append(p, x.whole.lowerBound..<(x.name.upperBound + 1)) // the name and the kind byte
            let lengthAt = out.countPlaceholder()
            let lx = x.setLayout(p), ly = y.setLayout(q)
            mergeContexts(p, lx.context, q, ly.context, into: &out)
            mergeEntries(p, lx, q, ly, into: &out)
            out.patchCount(out.count - lengthAt - 1, at: lengthAt)
        }
    }

    /// Writes the pointwise maximum of two encoded version vectors.
    private static func mergeContexts(_ p: UnsafeRawBufferPointer, _ a: Range<Int>, _ q: UnsafeRawBufferPointer,
                                      _ b: Range<Int>, into out: inout BinaryWriter) {
        if EncodedOrder.equal(p, a, q, b) {
            out.append(p, a)
            return
        }
        let countAt = out.countPlaceholder()
        var ca = ByteCursor(p, at: a.lowerBound), cb = ByteCursor(q, at: b.lowerBound)
        var na = Int(ca.varint()), nb = Int(cb.varint())
        var ra: UInt64 = 0, ha: UInt64 = 0, rb: UInt64 = 0, hb: UInt64 = 0
        if na > 0 { ra = ca.varint(); ha = ca.u64() }
        if nb > 0 { rb = cb.varint(); hb = cb.u64() }
        var count = 0
        while na > 0 || nb > 0 {
            let takeA = nb == 0 || (na > 0 && ra <= rb)
            let takeB = na == 0 || (nb > 0 && rb <= ra)
            count += 1
            out.varint(takeA ? ra : rb)
            out.u64(takeA && takeB ? max(ha, hb) : (takeA ? ha : hb))
            if takeA { na -= 1; if na > 0 { ra = ca.varint(); ha = ca.u64() } }
            if takeB { nb -= 1; if nb > 0 { rb = cb.varint(); hb = cb.u64() } }
        }
        out.patchCount(count, at: countAt)
    }

    /// Writes the surviving OR-set entries: in both, or in one whose dot the other side never saw.
    private static func mergeEntries(_ p: UnsafeRawBufferPointer, _ x: (context: Range<Int>, entryCount: Int, entries: Int),
                                     _ q: UnsafeRawBufferPointer, _ y: (context: Range<Int>, entryCount: Int, entries: Int),
                                     into out: inout BinaryWriter) {
        let contextA = DecodedVector(p, x.context), contextB = DecodedVector(q, y.context)
        let countAt = out.countPlaceholder()
        var ea = EntryCursor(p, at: x.entries, count: x.entryCount)
        var eb = EntryCursor(q, at: y.entries, count: y.entryCount)
        var kept = 0
        while !ea.done || !eb.done {
            var order: Int
            if ea.done { order = 1 } else if eb.done { order = -1 } else {
                order = EncodedOrder.compareValuesFast(p, ea.value, q, eb.value)
                if order == 0 { order = ea.dot == eb.dot ? 0 : (ea.dot < eb.dot ? -1 : 1) }
            }
            if order < 0 {
                if !contextB.covers(ea.dot) { kept += 1; out.append(p, ea.entry) }
                ea.advance()
            } else if order > 0 {
                if !contextA.covers(eb.dot) { kept += 1; out.append(q, eb.entry) }
                eb.advance()
            } else {
                kept += 1
                out.append(p, ea.entry)
                ea.advance()
                eb.advance()
            }
        }
        out.patchCount(kept, at: countAt)
    }
}

/// A version vector read once from its encoding; up to four entries are kept inline, larger vectors
/// are consulted in place.
struct DecodedVector {
    private var inline: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0, 0)
    private var count = 0
    private let bytes: UnsafeRawBufferPointer
    private let range: Range<Int>

    @inline(__always) init(_ p: UnsafeRawBufferPointer, _ range: Range<Int>) {
        bytes = p
        self.range = range
        var cursor = ByteCursor(p, at: range.lowerBound)
        let entries = Int(cursor.varint())
        guard entries <= 4 else { count = -1; return }
        count = entries
        withUnsafeMutableBytes(of: &inline) { raw in
            let slots = raw.bindMemory(to: UInt64.self)
            for index in 0..<entries {
                slots[2 * index] = cursor.varint()
                slots[2 * index + 1] = cursor.u64()
            }
        }
    }

    @inline(__always) func covers(_ stamp: Stamp) -> Bool {
        if count < 0 { return EncodedOrder.covers(bytes, range, stamp) }
        return withUnsafeBytes(of: inline) { raw in
            let slots = raw.bindMemory(to: UInt64.self)
            for index in 0..<count where slots[2 * index] == stamp.replica.rawValue {
                return stamp.hlc.rawValue <= slots[2 * index + 1]
            }
            return false
        }
    }
}

/// Walks the entries of an encoded OR-set: the current entry's bytes, value offset and dot.
struct EntryCursor {
    var cursor: ByteCursor
    var remaining: Int
    var entry: Range<Int> = 0..<0
    var value = 0
    var dot = Stamp(hlc: .zero, replica: ReplicaID(0))
    var done: Bool

    @inline(__always) init(_ p: UnsafeRawBufferPointer, at offset: Int, count: Int) {
        cursor = ByteCursor(p, at: offset)
        remaining = count
        done = false
        advance()
    }

    @inline(__always) mutating func advance() {
        guard remaining > 0 else { done = true; return }
        remaining -= 1
        value = cursor.offset
        cursor.skipValue()
        dot = cursor.stamp()
        entry = value..<cursor.offset
    }
}
