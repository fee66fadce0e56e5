import Foundation

// The byte-level join of two encoded frames of the same record: the twin of `Record.merge`, on the
// bytes zones store (see EncodedRecord.swift). It runs once per merged record on every import, so it
// is written against raw addresses: unchecked reads of validated bytes, wrapping offset arithmetic
// (offsets stay inside one frame, at most 1 MiB), and output written straight into memory reserved
// once per record. A differential property test keeps it equal to `Record.merge`.

/// Unchecked reads at byte offsets from a frame's start address. Only for validated frames.
enum Raw {
    @inline(__always) static func u8(_ p: UnsafeRawPointer, _ i: Int) -> UInt8 {
        p.load(fromByteOffset: i, as: UInt8.self)
    }

    @inline(__always) static func u64(_ p: UnsafeRawPointer, _ i: Int) -> UInt64 {
        UInt64(littleEndian: p.loadUnaligned(fromByteOffset: i, as: UInt64.self))
    }

    @inline(__always) static func varint(_ p: UnsafeRawPointer, _ i: inout Int) -> UInt64 {
        let first = u8(p, i)
        i &+= 1
        return first < 0x80 ? UInt64(first) : varintTail(p, &i, first)
    }

    @inline(never) static func varintTail(_ p: UnsafeRawPointer, _ i: inout Int, _ first: UInt8) -> UInt64 {
        var result = UInt64(first & 0x7F), shift: UInt64 = 7
        while true {
            let byte = u8(p, i)
            i &+= 1
            result |= UInt64(byte & 0x7F) &<< shift
            if byte < 0x80 { return result }
            shift &+= 7
        }
    }

    @inline(__always) static func stamp(_ p: UnsafeRawPointer, _ i: inout Int) -> Stamp {
        let hlc = u64(p, i)
        i &+= 8
        return Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(varint(p, &i)))
    }

    /// The offset just past the optional value whose type byte is at `i`.
    @inline(__always) static func valueEnd(_ p: UnsafeRawPointer, _ i: Int) -> Int {
        if u8(p, i) == ValueType.string.rawValue {
            let length = u8(p, i &+ 1)
            if length < 0x80 { return i &+ 2 &+ Int(length) }
        }
        return valueEndSlow(p, i)
    }

    @inline(never) static func valueEndSlow(_ p: UnsafeRawPointer, _ i: Int) -> Int {
        var j = i &+ 1
        switch u8(p, i) {
        case ValueType.string.rawValue, ValueType.bytes.rawValue:
            let length = Int(truncatingIfNeeded: varint(p, &j))
            return j &+ length
        case ValueType.int64.rawValue, ValueType.double.rawValue, ValueType.timestamp.rawValue:
            return j &+ 8
        case 0:
            return j
        default:
            var cursor = ByteCursor(UnsafeRawBufferPointer(start: p, count: Int.max / 2), at: i)
            cursor.skipValue()
            return cursor.offset
        }
    }

    /// Lexicographic order of two byte strings: -1, 0 or 1.
    @inline(__always)
    static func compare(_ x: UnsafeRawPointer, _ nx: Int, _ y: UnsafeRawPointer, _ ny: Int) -> Int {
        let n = nx < ny ? nx : ny
        var k = 0
        while k &+ 8 <= n {
            let u = x.loadUnaligned(fromByteOffset: k, as: UInt64.self).bigEndian
            let v = y.loadUnaligned(fromByteOffset: k, as: UInt64.self).bigEndian
            if u != v { return u < v ? -1 : 1 }
            k &+= 8
        }
        while k < n {
            let u = x.load(fromByteOffset: k, as: UInt8.self), v = y.load(fromByteOffset: k, as: UInt8.self)
            if u != v { return u < v ? -1 : 1 }
            k &+= 1
        }
        return nx == ny ? 0 : (nx < ny ? -1 : 1)
    }

    /// `compare` for strings that have eight readable bytes from their start (`loadable`), as names and
    /// values inside frames usually do: up to eight bytes are compared with one load each.
    @inline(__always)
    static func compare(_ x: UnsafeRawPointer, _ nx: Int, _ y: UnsafeRawPointer, _ ny: Int, loadable: Bool) -> Int {
        let n = nx < ny ? nx : ny
        guard loadable, n > 0, n <= 8 else { return compare(x, nx, y, ny) }
        let drop = UInt64(8 &- n) &* 8
        let u = x.loadUnaligned(as: UInt64.self).bigEndian &>> drop
        let v = y.loadUnaligned(as: UInt64.self).bigEndian &>> drop
        if u != v { return u < v ? -1 : 1 }
        return nx == ny ? 0 : (nx < ny ? -1 : 1)
    }

    @inline(__always)
    static func equal(_ x: UnsafeRawPointer, _ nx: Int, _ y: UnsafeRawPointer, _ ny: Int) -> Bool {
        nx == ny && memcmp(x, y, nx) == 0
    }

    /// Two encoded optional values in `ScalarValue` order (nil lowest); strings and integers inline.
    /// `inSet` says both are set entries, whose values are followed by a dot of at least nine bytes.
    @inline(__always)
    static func compareValues(_ p: UnsafeRawPointer, _ i: Int, _ q: UnsafeRawPointer, _ j: Int, inSet: Bool = false) -> Int {
        let ta = u8(p, i)
        if ta == u8(q, j) {
            if ta == ValueType.string.rawValue {
                let la = u8(p, i &+ 1), lb = u8(q, j &+ 1)
                if la < 0x80 && lb < 0x80 {
                    return compare(p + (i &+ 2), Int(la), q + (j &+ 2), Int(lb), loadable: inSet)
                }
            } else if ta == ValueType.int64.rawValue {
                let x = Int64(bitPattern: u64(p, i &+ 1)), y = Int64(bitPattern: u64(q, j &+ 1))
                return x == y ? 0 : (x < y ? -1 : 1)
            }
        }
        let whole = Int.max / 2
        return EncodedOrder.compareValues(UnsafeRawBufferPointer(start: p, count: whole), i,
                                          UnsafeRawBufferPointer(start: q, count: whole), j)
    }
}

/// Output into memory reserved up front: stores with no capacity checks.
struct RawOut {
    let base: UnsafeMutableRawPointer
    var count: Int

    @inline(__always) mutating func u8(_ value: UInt8) {
        base.storeBytes(of: value, toByteOffset: count, as: UInt8.self)
        count &+= 1
    }

    @inline(__always) mutating func u32(_ value: UInt32) {
        base.storeBytes(of: value.littleEndian, toByteOffset: count, as: UInt32.self)
        count &+= 4
    }

    @inline(__always) mutating func u64(_ value: UInt64) {
        base.storeBytes(of: value.littleEndian, toByteOffset: count, as: UInt64.self)
        count &+= 8
    }

    @inline(__always) mutating func varint(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            u8(UInt8(truncatingIfNeeded: value) | 0x80)
            value &>>= 7
        }
        u8(UInt8(truncatingIfNeeded: value))
    }

    @inline(__always) mutating func stamp(_ stamp: Stamp) {
        u64(stamp.hlc.rawValue)
        varint(stamp.replica.rawValue)
    }

    /// Copies `source[from..<to]`. Pieces up to 16 bytes (most fields and set entries) are copied with
    /// two overlapping loads and stores instead of a call to `memcpy`; reads stay inside the piece.
    @inline(__always) mutating func copy(_ source: UnsafeRawPointer, _ from: Int, _ to: Int) {
        let length = to &- from
        let s = source + from, d = base + count
        if length > 16 {
            d.copyMemory(from: s, byteCount: length)
        } else if length >= 8 {
            let head = s.loadUnaligned(as: UInt64.self), tail = s.loadUnaligned(fromByteOffset: length &- 8, as: UInt64.self)
            d.storeBytes(of: head, as: UInt64.self)
            d.storeBytes(of: tail, toByteOffset: length &- 8, as: UInt64.self)
        } else if length >= 4 {
            let head = s.loadUnaligned(as: UInt32.self), tail = s.loadUnaligned(fromByteOffset: length &- 4, as: UInt32.self)
            d.storeBytes(of: head, as: UInt32.self)
            d.storeBytes(of: tail, toByteOffset: length &- 4, as: UInt32.self)
        } else if length > 0 {
            for k in 0..<length { d.storeBytes(of: s.load(fromByteOffset: k, as: UInt8.self), toByteOffset: k, as: UInt8.self) }
        }
        count &+= length
    }

    /// One byte for a count written later by `patch(_:at:)`.
    @inline(__always) mutating func placeholder() -> Int {
        u8(0)
        return count &- 1
    }

    /// Writes `value` as a varint where `placeholder()` reserved one byte, moving what follows when it
    /// needs more. The caller's reservation covers the growth (see `FrameMerge.merge`).
    @inline(__always) mutating func patch(_ value: Int, at offset: Int) {
        if value < 0x80 {
            base.storeBytes(of: UInt8(truncatingIfNeeded: value), toByteOffset: offset, as: UInt8.self)
        } else {
            patchLong(value, at: offset)
        }
    }

    @inline(never) mutating func patchLong(_ value: Int, at offset: Int) {
        let length = BinaryWriter.varintWidth(UInt64(value))
        (base + offset + length).copyMemory(from: base + offset + 1, byteCount: count - offset - 1)
        BinaryWriter.storeVarint(UInt64(value), width: length, at: base + offset)
        count += length - 1
    }
}

/// One field of a validated frame: `string(name) kind:u8 length:varint payload`.
struct RawField {
    var start = 0, name = 0, nameLength = 0, payload = 0, end = 0
    /// 0 register, 1 set, 2 list, 3 text.
    var kind: UInt8 = 0

    @inline(__always) init() {}

    @inline(__always) init(_ p: UnsafeRawPointer, at offset: Int) {
        start = offset
        var i = offset
        nameLength = Int(truncatingIfNeeded: Raw.varint(p, &i))
        name = i
        i &+= nameLength
        kind = Raw.u8(p, i)
        i &+= 1
        let length = Int(truncatingIfNeeded: Raw.varint(p, &i))
        payload = i
        end = i &+ length
    }
}

/// Joins encoded frames of the same record (same name): the byte-level twin of `Record.merge`.
enum FrameMerge {
    /// What a join produced.
    enum Outcome {
        /// The first frame unchanged: it already reflects the second.
        case mine
        /// The second frame as it is (a later generation).
        case theirs
        /// The joined frame, written to the scratch writer.
        case written
    }

    /// Joins `theirs` into `frame`, rewriting it in place when its capacity allows (`FrameStorage`).
    /// Returns false when `frame` already reflected everything in `theirs`. `scratch` is working memory
    /// reused across calls.
    @discardableResult
    static func merge(into frame: inout [UInt8], _ theirs: UnsafeRawBufferPointer, scratch out: inout BinaryWriter) -> Bool {
        let outcome = frame.withUnsafeBytes { p -> Outcome in
            if p.count == theirs.count && memcmp(p.baseAddress!, theirs.baseAddress!, p.count) == 0 { return .mine }
            out.truncate(to: 0)
            return merge(p, theirs, mineIsResult: true, into: &out)
        }
        switch outcome {
        case .mine: return false
        case .theirs: FrameStorage.overwrite(&frame, with: theirs)
        case .written: out.withWrittenBytes { FrameStorage.overwrite(&frame, with: $0) }
        }
        return true
    }

    /// The join of two frames (used by tests on arbitrary pairs).
    static func merged(_ a: [UInt8], _ b: [UInt8]) -> [UInt8] {
        var out = BinaryWriter(capacity: a.count + b.count)
        let outcome = a.withUnsafeBytes { p in b.withUnsafeBytes { q in merge(p, q, mineIsResult: false, into: &out) } }
        switch outcome {
        case .mine: return a
        case .theirs: return b
        case .written: return out.copyBytes()
        }
    }

    static func merge(_ pb: UnsafeRawBufferPointer, _ qb: UnsafeRawBufferPointer, mineIsResult: Bool,
                              into out: inout BinaryWriter) -> Outcome {
        let a = FrameHeader(pb), b = FrameHeader(qb)
        if a.generation != b.generation { return a.generation > b.generation ? .mine : .theirs }
        let p = pb.baseAddress!, q = qb.baseAddress!
        // Outside list and text fields the join never exceeds the two inputs together: every byte written
        // comes from one side, and every count or length written is at most the sum of the two it replaces
        // (so its varint is at most as long as theirs together). A joined sequence has at most the runs of
        // both (each boundary is one side's), each at most 3 bytes longer than its source run of at least
        // 4 (a wider replica index or counter), and the values, replicas and context of both at most: under
        // twice its inputs. So twice the inputs bound the whole.
        out.writeDirect(reserving: 2 &* (pb.count &+ qb.count) &+ 64) { w in
            // Creation stamp and record type come from the later creation (ties: greater type bytes).
            let headerFromB = a.created < b.created
                || (a.created == b.created && EncodedOrder.compare(pb, a.type, qb, b.type) < 0)
            w.u32(0)
            w.copy(p, 4, a.name.upperBound) // the name with its length
            if headerFromB { w.copy(q, b.typeWhole.lowerBound, b.typeWhole.upperBound) }
            else { w.copy(p, a.typeWhole.lowerBound, a.typeWhole.upperBound) }
            w.varint(a.generation)
            w.stamp(headerFromB ? b.created : a.created)
            let deletion: Stamp? = switch (a.deletion, b.deletion) {
            case (nil, nil): nil
            case let (x?, nil): x
            case let (nil, y?): y
            case let (x?, y?): max(x, y)
            }
            if let deletion {
                w.u8(1)
                w.stamp(deletion)
                w.u8(0)
                return
            }
            // Parent register.
            switch (a.parentWhole, b.parentWhole) {
            case (nil, nil):
                w.u8(0)
            case (let x?, nil):
                w.u8(2)
                w.copy(p, x.lowerBound, x.upperBound)
            case (nil, let y?):
                w.u8(2)
                w.copy(q, y.lowerBound, y.upperBound)
            case (let x?, let y?):
                let theirs = a.parentStamp != b.parentStamp ? a.parentStamp < b.parentStamp
                    : Raw.compareValues(p, a.parentValue, q, b.parentValue) < 0
                w.u8(2)
                if theirs { w.copy(q, y.lowerBound, y.upperBound) } else { w.copy(p, x.lowerBound, x.upperBound) }
            }
            mergeFields(p, a, q, b, into: &w)
        }
        out.patchU32(UInt32(out.count - 4), at: 0)
        if mineIsResult, pb.count == out.count {
            let same = out.withWrittenBytes { memcmp($0.baseAddress!, pb.baseAddress!, pb.count) == 0 }
            if same { return .mine }
        }
        return .written
    }

    /// Walks both field lists in name order: fields only `mine` holds are copied as runs, fields only
    /// `theirs` holds are copied, fields both hold are joined.
    @inline(__always)
    private static func mergeFields(_ p: UnsafeRawPointer, _ a: FrameHeader, _ q: UnsafeRawPointer, _ b: FrameHeader,
                                    into w: inout RawOut) {
        let countAt = w.placeholder()
        var leftA = a.fieldCount, leftB = b.fieldCount
        var x = leftA > 0 ? RawField(p, at: a.fieldsStart) : RawField()
        var y = leftB > 0 ? RawField(q, at: b.fieldsStart) : RawField()
        var union = 0
        var pending = a.fieldsStart // `mine`'s fields from here up to `x` are not written yet
        while leftA > 0 && leftB > 0 {
            let order = Raw.compare(p + x.name, x.nameLength, q + y.name, y.nameLength,
                                    loadable: x.name &+ 8 <= a.end && y.name &+ 8 <= b.end)
            union &+= 1
            if order < 0 || (order == 0 && Raw.equal(p + x.start, x.end &- x.start, q + y.start, y.end &- y.start)) {
                // Only `mine` holds the field, or both hold the same bytes: it stays in the pending run.
                leftA &-= 1
                if leftA > 0 { x = RawField(p, at: x.end) }
                if order == 0 {
                    leftB &-= 1
                    if leftB > 0 { y = RawField(q, at: y.end) }
                }
                continue
            }
            w.copy(p, pending, x.start)
            if order > 0 {
                pending = x.start
                w.copy(q, y.start, y.end)
            } else {
                mergeField(p, x, q, y, into: &w)
                pending = x.end
                leftA &-= 1
                if leftA > 0 { x = RawField(p, at: x.end) }
            }
            leftB &-= 1
            if leftB > 0 { y = RawField(q, at: y.end) }
        }
        w.copy(p, pending, a.end)
        if leftB > 0 { w.copy(q, y.start, b.end) }
        w.patch(union &+ leftA &+ leftB, at: countAt)
    }

    @inline(__always)
    private static func mergeField(_ p: UnsafeRawPointer, _ x: RawField, _ q: UnsafeRawPointer, _ y: RawField,
                                   into w: inout RawOut) {
        if x.kind != y.kind {
            // Fields of two kinds under one name: the greater kind wins (as `FieldState.merge`).
            if y.kind > x.kind { w.copy(q, y.start, y.end) } else { w.copy(p, x.start, x.end) }
            return
        }
        switch x.kind {
        case 0:
            var i = x.payload, j = y.payload
            let sx = Raw.stamp(p, &i), sy = Raw.stamp(q, &j)
            let theirsWins = sx != sy ? sx < sy : Raw.compareValues(p, i, q, j) < 0
            if theirsWins { w.copy(q, y.start, y.end) } else { w.copy(p, x.start, x.end) }
        case 2:
            mergeSequences(ScalarValue.self, p, x, q, y, into: &w)
        case 3:
            mergeSequences(Unicode.Scalar.self, p, x, q, y, into: &w)
        default:
            w.copy(p, x.start, x.name &+ x.nameLength &+ 1) // the name and the kind byte
            let lengthAt = w.placeholder()
            var i = x.payload, j = y.payload
            let contextA = RawVector(p, &i), contextB = RawVector(q, &j)
            mergeContexts(p, contextA, q, contextB, into: &w)
            mergeEntries(p, i, contextA, q, j, contextB, into: &w)
            w.patch(w.count &- lengthAt &- 1, at: lengthAt)
        }
    }

    /// Writes the join of two list or text fields: both payloads decoded (they were validated with their
    /// frames), joined by `SequenceState.merge` and encoded again.
    @inline(never)
    private static func mergeSequences<Element: SequenceElement>(_: Element.Type, _ p: UnsafeRawPointer, _ x: RawField,
                                                                 _ q: UnsafeRawPointer, _ y: RawField,
                                                                 into w: inout RawOut) {
        func decode(_ base: UnsafeRawPointer, _ field: RawField) -> SequenceState<Element>? {
            var reader = BinaryReader(UnsafeRawBufferPointer(start: base + field.payload, count: field.end &- field.payload))
            return try? SequenceState<Element>(decoding: &reader)
        }
        guard var mine = decode(p, x), let theirs = decode(q, y) else {
            preconditionFailure("a validated frame holds a sequence its decoder refuses")
        }
        mine.merge(theirs)
        var encoded = BinaryWriter(capacity: (x.end &- x.payload) &+ (y.end &- y.payload) &+ 16)
        mine.encode(into: &encoded)
        w.copy(p, x.start, x.name &+ x.nameLength &+ 1) // the name and the kind byte
        encoded.withWrittenBytes { bytes in
            w.varint(UInt64(bytes.count))
            w.copy(bytes.baseAddress!, 0, bytes.count)
        }
    }

    /// Writes the pointwise maximum of two encoded version vectors.
    @inline(__always)
    private static func mergeContexts(_ p: UnsafeRawPointer, _ a: borrowing RawVector, _ q: UnsafeRawPointer,
                                      _ b: borrowing RawVector,
                                      into w: inout RawOut) {
        if Raw.equal(p + a.start, a.end &- a.start, q + b.start, b.end &- b.start) {
            w.copy(p, a.start, a.end)
            return
        }
        let countAt = w.placeholder()
        var i = a.first, j = b.first
        var na = a.count, nb = b.count
        var ra: UInt64 = 0, ha: UInt64 = 0, rb: UInt64 = 0, hb: UInt64 = 0
        if na > 0 { ra = Raw.varint(p, &i); ha = Raw.u64(p, i); i &+= 8 }
        if nb > 0 { rb = Raw.varint(q, &j); hb = Raw.u64(q, j); j &+= 8 }
        var count = 0
        while na > 0 || nb > 0 {
            let takeA = nb == 0 || (na > 0 && ra <= rb)
            let takeB = na == 0 || (nb > 0 && rb <= ra)
            count &+= 1
            w.varint(takeA ? ra : rb)
            w.u64(takeA && takeB ? max(ha, hb) : (takeA ? ha : hb))
            if takeA { na &-= 1; if na > 0 { ra = Raw.varint(p, &i); ha = Raw.u64(p, i); i &+= 8 } }
            if takeB { nb &-= 1; if nb > 0 { rb = Raw.varint(q, &j); hb = Raw.u64(q, j); j &+= 8 } }
        }
        w.patch(count, at: countAt)
    }

    /// Writes the surviving OR-set entries: in both, or in one whose dot the other side never saw.
    /// `i` and `j` are the offsets of the two entry counts.
    @inline(__always)
    private static func mergeEntries(_ p: UnsafeRawPointer, _ i: Int, _ contextA: borrowing RawVector,
                                     _ q: UnsafeRawPointer, _ j: Int, _ contextB: borrowing RawVector,
                                     into w: inout RawOut) {
        let countAt = w.placeholder()
        var i = i, j = j
        var leftA = Int(truncatingIfNeeded: Raw.varint(p, &i)), leftB = Int(truncatingIfNeeded: Raw.varint(q, &j))
        var ea = RawEntry(), eb = RawEntry()
        if leftA > 0 { ea = RawEntry(p, at: i) }
        if leftB > 0 { eb = RawEntry(q, at: j) }
        var kept = 0
        while leftA > 0 || leftB > 0 {
            var order: Int
            if leftA == 0 { order = 1 } else if leftB == 0 { order = -1 } else {
                order = Raw.compareValues(p, ea.start, q, eb.start, inSet: true)
                if order == 0 { order = ea.dot == eb.dot ? 0 : (ea.dot < eb.dot ? -1 : 1) }
            }
            if order <= 0 {
                if order == 0 || !contextB.covers(q, ea.dot) {
                    kept &+= 1
                    w.copy(p, ea.start, ea.end)
                }
                leftA &-= 1
                if leftA > 0 { ea = RawEntry(p, at: ea.end) }
            }
            if order >= 0 {
                if order > 0 && !contextA.covers(p, eb.dot) {
                    kept &+= 1
                    w.copy(q, eb.start, eb.end)
                }
                leftB &-= 1
                if leftB > 0 { eb = RawEntry(q, at: eb.end) }
            }
        }
        w.patch(kept, at: countAt)
    }
}

/// One OR-set entry of a validated frame: a value and its dot.
struct RawEntry {
    var start = 0, end = 0
    var dot = Stamp(hlc: .zero, replica: ReplicaID(0))

    @inline(__always) init() {}

    @inline(__always) init(_ p: UnsafeRawPointer, at offset: Int) {
        start = offset
        var i = Raw.valueEnd(p, offset)
        dot = Raw.stamp(p, &i)
        end = i
    }
}

/// An encoded version vector of a validated frame. Up to four entries are read once and kept inline;
/// up to `scanLimit` are consulted in place (a scan of at most that many entries); a larger vector is
/// decoded once into a sorted table on the heap and searched by bisection, so that `covers` costs
/// O(log n) whatever the vector's size (a set of E entries against a context of R replicas is joined or
/// validated in O((E + R) log R), never O(E * R)). Not copyable: the table is freed when the vector ends.
struct RawVector: ~Copyable {
    var start: Int, end: Int, first: Int, count: Int
    private var slots: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) = (0, 0, 0, 0, 0, 0, 0, 0)
    /// Replica then clock value for each entry, in the vector's order (ascending replica); only above
    /// `scanLimit` entries.
    private var table: UnsafeMutablePointer<UInt64>? = nil

    /// The largest vector consulted by a scan in place.
    static let scanLimit = 16

    /// Reads the vector at `i` and moves `i` past it.
    @inline(__always) init(_ p: UnsafeRawPointer, _ i: inout Int) {
        start = i
        end = i
        count = Int(truncatingIfNeeded: Raw.varint(p, &i))
        first = i
        if count <= 4 {
            withUnsafeMutableBytes(of: &slots) { raw in
                for index in 0..<count {
                    raw.storeBytes(of: Raw.varint(p, &i), toByteOffset: 16 &* index, as: UInt64.self)
                    raw.storeBytes(of: Raw.u64(p, i), toByteOffset: 16 &* index &+ 8, as: UInt64.self)
                    i &+= 8
                }
            }
        } else if count <= Self.scanLimit {
            for _ in 0..<count {
                _ = Raw.varint(p, &i)
                i &+= 8
            }
        } else {
            let table = UnsafeMutablePointer<UInt64>.allocate(capacity: 2 &* count)
            for index in 0..<count {
                table[2 &* index] = Raw.varint(p, &i)
                table[2 &* index &+ 1] = Raw.u64(p, i)
                i &+= 8
            }
            self.table = table
        }
        end = i
    }

    deinit { table?.deallocate() }

    /// True when the vector covers `stamp`. `p` is the frame the vector was read from.
    @inline(__always) func covers(_ p: UnsafeRawPointer, _ stamp: Stamp) -> Bool {
        let replica = stamp.replica.rawValue, hlc = stamp.hlc.rawValue
        if count <= 4 {
            return withUnsafeBytes(of: slots) { raw in
                for index in 0..<count where raw.load(fromByteOffset: 16 &* index, as: UInt64.self) == replica {
                    return hlc <= raw.load(fromByteOffset: 16 &* index &+ 8, as: UInt64.self)
                }
                return false
            }
        }
        if let table {
            var low = 0, high = count // the entry, if any, is in [low, high)
            while low < high {
                let middle = (low &+ high) >> 1
                let r = table[2 &* middle]
                if r == replica { return hlc <= table[2 &* middle &+ 1] }
                if r < replica { low = middle &+ 1 } else { high = middle }
            }
            return false
        }
        var i = first
        for _ in 0..<count {
            let r = Raw.varint(p, &i)
            let h = Raw.u64(p, i)
            i &+= 8
            if r == replica { return hlc <= h }
            if r > replica { return false }
        }
        return false
    }
}
