import Foundation

// Byte-level access to records in the canonical binary form (see `BinaryCodec`).
//
// Zones store every record as its encoded frame and join incoming frames byte by byte: no strings,
// arrays or enum payloads are built on the hot path, and a whole-state export is a concatenation of
// stored frames. `Record.merge` is the readable reference of the same join (`FrameMerge`, in
// FrameMerge.swift); a differential property test keeps the two equal
// (`encode(a.merging(b)) == FrameMerge.merged(encode(a), encode(b))`).
//
// Everything here reads frames that `BinaryReader.scanFrame` has already validated, so reads are unchecked.

/// How stored frames are allocated.
///
/// Every merge or edit rewrites a whole frame, and a rewritten frame is usually a few bytes longer or
/// shorter than before (a changed text value, a set entry added and one removed, a new replica in a
/// set's context). Frames are therefore allocated with some room to grow and rewritten in place while
/// they fit, so merging a record costs no allocation, no free and no fresh memory.
enum FrameStorage {
    /// Spare capacity given to a frame when it is allocated.
    static let headroom = 32

    /// A new frame holding `bytes`, with room to grow.
    @inline(__always)
    static func make(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        var frame: [UInt8] = []
        frame.reserveCapacity(bytes.count + headroom)
        frame.append(contentsOf: bytes.assumingMemoryBound(to: UInt8.self))
        return frame
    }

    /// Replaces the contents of `frame` with `bytes`, in place when they fit its capacity.
    @inline(__always)
    static func overwrite(_ frame: inout [UInt8], with bytes: UnsafeRawBufferPointer) {
        if frame.capacity >= bytes.count {
            frame.removeAll(keepingCapacity: true)
            frame.append(contentsOf: bytes.assumingMemoryBound(to: UInt8.self))
        } else {
            frame = make(bytes)
        }
    }
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
        case ValueType.asset.rawValue:
            offset += AssetValue.checksumLength + 8
        default: // location
            offset += 16
            let mask = u8()
            offset += 8 * mask.nonzeroBitCount
        }
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

    /// Parses the header of a validated frame (raw reads, no checks: see `Raw`).
    @inline(__always) init(_ frame: UnsafeRawBufferPointer) {
        let p = frame.baseAddress!
        @inline(__always) func range(_ a: Int, _ b: Int) -> Range<Int> { Range(uncheckedBounds: (a, b)) }
        end = 4 &+ Int(UInt32(littleEndian: p.loadUnaligned(as: UInt32.self)))
        var i = 4
        let nameLength = Int(truncatingIfNeeded: Raw.varint(p, &i))
        name = range(i, i &+ nameLength)
        i &+= nameLength
        let typeStart = i
        let typeLength = Int(truncatingIfNeeded: Raw.varint(p, &i))
        type = range(i, i &+ typeLength)
        i &+= typeLength
        typeWhole = range(typeStart, i)
        generation = Raw.varint(p, &i)
        let createdStart = i
        created = Raw.stamp(p, &i)
        createdWhole = range(createdStart, i)
        let flags = Raw.u8(p, i)
        i &+= 1
        deletion = flags & 1 != 0 ? Raw.stamp(p, &i) : nil
        parentStamp = Stamp(hlc: .zero, replica: ReplicaID(0))
        parentValue = 0
        parentWhole = nil
        if flags & 2 != 0 {
            let start = i
            parentStamp = Raw.stamp(p, &i)
            parentValue = i
            i = Raw.valueEnd(p, i)
            parentWhole = range(start, i)
        }
        fieldCount = Int(truncatingIfNeeded: Raw.varint(p, &i))
        fieldsStart = i
    }
}

// MARK: - Comparisons on encoded bytes

enum EncodedOrder {
    /// Lexicographic comparison of two byte ranges: -1, 0 or 1 (eight bytes at a time).
    @inline(__always)
    static func compare(_ p: UnsafeRawBufferPointer, _ a: Range<Int>, _ q: UnsafeRawBufferPointer, _ b: Range<Int>) -> Int {
        guard let x = p.baseAddress, let y = q.baseAddress else { // an empty buffer: an empty range
            return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
        }
        return Raw.compare(x + a.lowerBound, a.count, y + b.lowerBound, b.count)
    }

    @inline(__always)
    static func equal(_ p: UnsafeRawBufferPointer, _ a: Range<Int>, _ q: UnsafeRawBufferPointer, _ b: Range<Int>) -> Bool {
        a.count == b.count && compare(p, a, q, b) == 0
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
}

