import CMemoryHints

/// Input the binary decoder refused. The message says what and where; it never echoes the input.
public struct CodecError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case truncated, badMagic, unsupportedVersion, wrongKind, malformed, tooLarge, trailingBytes, invalidName
    }
    public let code: Code
    /// What was being read when it failed.
    public let context: String
    /// Byte offset in the input.
    public let offset: Int

    public var description: String {
        switch code {
        case .truncated: return "input ends early while reading \(context) at byte \(offset)"
        case .badMagic: return "not a Lattice binary encoding (bad magic)"
        case .unsupportedVersion: return "unsupported encoding version \(context)"
        case .wrongKind: return "expected \(context)"
        case .malformed: return "malformed \(context) at byte \(offset)"
        case .tooLarge: return "\(context) at byte \(offset) exceeds its size limit"
        case .trailingBytes: return "unexpected bytes after the end at byte \(offset)"
        case .invalidName: return "invalid \(context) at byte \(offset)"
        }
    }
}

/// Lattice's compact binary encoding of records and zone deltas (format version 1).
///
/// Layout (integers little-endian; `varint` is unsigned LEB128, at most 10 bytes):
/// ```
/// file    = "LTC" version:u8 kind:u8 body            kind 1 = record, 2 = zone delta
/// record  = zoneID frame
/// delta   = zoneID since:vv version:vv count:varint frame*
/// zoneID  = string(zoneName) string(ownerRecordName)
/// frame   = length:u32 (<= 1 MiB) recordBody
/// recordBody = string(name) string(type) generation:varint created:stamp flags:u8
///              [deletion:stamp] [parent:register] fieldCount:varint field*   (flags: 1 deleted, 2 parent)
/// field   = string(name) kind:u8 (0 register | 1 set | 2 list | 3 text) length:varint payload
///           (register | set | sequence, see SequenceCodec.swift)
/// register= stamp optionalValue
/// set     = context:vv count:varint (value stamp)*
/// vv      = count:varint (replica:varint hlc:u64)*    replicas strictly ascending, hlc > 0
/// stamp   = hlc:u64 replica:varint
/// value   = type:u8 payload    (optionalValue: type 0 = nil)
/// string  = length:varint utf8-bytes
/// ```
/// The encoding is canonical: fields, set entries, vector entries and delta records must be strictly
/// sorted, so `encode(decode(bytes)) == bytes` for every accepted input. Every count is checked against
/// the bytes that remain before anything is allocated for it.
public enum BinaryCodec {
    public static let formatVersion: UInt8 = 1
    static let magic: [UInt8] = [0x4C, 0x54, 0x43] // "LTC"
    static let recordKind: UInt8 = 1
    static let deltaKind: UInt8 = 2

    // MARK: Encoding

    /// Encodes one record. - Throws: `RecordError.tooLarge` above `Record.maximumEncodedSize`.
    public static func encode(_ record: Record) throws(RecordError) -> [UInt8] {
        var writer = BinaryWriter(capacity: 64 + record.fields.count * 32)
        writer.header(kind: recordKind)
        writer.zoneID(record.id.zoneID)
        try writer.frame(record)
        return writer.finish()
    }

    /// Encodes a zone delta or whole state. - Throws: `RecordError.tooLarge` if any record exceeds 1 MiB.
    public static func encode(_ delta: ZoneDelta) throws(RecordError) -> [UInt8] {
        var writer = BinaryWriter(capacity: 64 + delta.records.count * 160)
        writer.header(kind: deltaKind)
        writer.zoneID(delta.zoneID)
        writer.versionVector(delta.since)
        writer.versionVector(delta.version)
        writer.varint(UInt64(delta.records.count))
        for record in delta.records {
            guard record.id.zoneID == delta.zoneID else {
                throw RecordError(code: .wrongZone, message: "record \(record.id.recordName) belongs to zone "
                                  + "\(record.id.zoneID), not to the delta's zone \(delta.zoneID)")
            }
            try writer.frame(record, limit: Record.maximumMergedSize)
        }
        return writer.finish()
    }

    // MARK: Decoding

    public static func decodeRecord(_ bytes: [UInt8]) throws(CodecError) -> Record {
        try decode(bytes) { reader throws(CodecError) in
            try reader.header(kind: recordKind, name: "a record")
            let zoneID = try reader.zoneID()
            let start = reader.offset
            let (frame, _) = try reader.scanFrame()
            guard frame.count - 4 <= Record.maximumEncodedSize else {
                throw CodecError(code: .tooLarge, context: "record", offset: start)
            }
            try reader.end()
            reader.offset = start
            return try reader.frame(zoneID: zoneID)
        }
    }

    public static func decodeDelta(_ bytes: [UInt8]) throws(CodecError) -> ZoneDelta {
        try EncodedDelta(validating: bytes).decoded()
    }

    private static func decode<T>(_ bytes: [UInt8], _ body: (inout BinaryReader) throws(CodecError) -> T)
        throws(CodecError) -> T {
        do {
            return try bytes.withUnsafeBytes { raw in
                var reader = BinaryReader(raw)
                return try body(&reader)
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "input", offset: 0)
        }
    }
}

// MARK: - Writer

/// Page population for large fresh buffers.
enum Memory {
    /// How much of a fresh buffer is populated at a time.
    static let populateChunk = 256 << 10

    /// Populates the whole pages inside `count` bytes at `start` for writing, in one system call
    /// (`lattice_populate_for_writing` in CMemoryHints: Linux's `MADV_POPULATE_WRITE`, 5.14 and later,
    /// with the system's page size). A large buffer just allocated is otherwise faulted in a page at a
    /// time on first write: one trap into the kernel per page, which on this project's test machine
    /// costs about 2.7 µs each. Elsewhere, or if the kernel refuses, nothing happens and the pages fault
    /// in as usual.
    static func populate(_ start: UnsafeMutableRawPointer, _ count: Int) {
        guard count > 0 else { return }
        lattice_populate_for_writing(start, count)
    }
}

/// A growable byte buffer for encoders: raw stores, no per-byte bounds or uniqueness checks.
/// `finish()` hands the bytes over as an array of exactly the written size.
struct BinaryWriter: ~Copyable {
    private var base: UnsafeMutableRawPointer
    /// Bytes writable without calling `grow`: the allocation, or for borrowed memory that is being
    /// populated, the part populated so far.
    private var capacity: Int
    private(set) var count = 0
    /// False when writing into memory someone else owns (and sized): such a writer never grows.
    private let owned: Bool
    /// The size of borrowed memory.
    private let bound: Int

    init(capacity: Int) {
        self.capacity = max(capacity, 64)
        base = UnsafeMutableRawPointer.allocate(byteCount: self.capacity, alignment: 8)
        owned = true
        bound = 0
    }

    /// Writes into `memory`, whose size must bound everything written. With `populating`, the memory is
    /// fresh and large, and its pages are populated a chunk at a time just ahead of the writes
    /// (`Memory.populate`) rather than faulted in one by one.
    init(into memory: UnsafeMutableRawBufferPointer, populating: Bool = false) {
        base = memory.baseAddress!
        bound = memory.count
        capacity = populating ? 0 : memory.count
        owned = false
    }

    deinit { if owned { base.deallocate() } }

    /// The written bytes as an array (one copy of exactly `count` bytes).
    consuming func finish() -> [UInt8] {
        let base = self.base, count = self.count
        let result = [UInt8](unsafeUninitializedCapacity: count) { buffer, initialized in
            if count > 0 { buffer.baseAddress!.initialize(from: base.assumingMemoryBound(to: UInt8.self), count: count) }
            initialized = count
        }
        return result
    }

    /// A copy of the bytes written so far; the writer stays usable.
    func copyBytes() -> [UInt8] {
        [UInt8](UnsafeBufferPointer(start: base.assumingMemoryBound(to: UInt8.self), count: count))
    }

    /// The bytes written so far, for comparisons before `finish()`.
    func withWrittenBytes<R>(_ body: (UnsafeRawBufferPointer) -> R) -> R {
        body(UnsafeRawBufferPointer(start: base, count: count))
    }

    /// Reserves `capacity` bytes and lets `body` write up to that many straight into them.
    @inline(__always)
    mutating func writeDirect(reserving capacity: Int, _ body: (inout RawOut) -> Void) {
        reserve(capacity)
        var raw = RawOut(base: base, count: count)
        body(&raw)
        precondition(raw.count <= self.capacity, "direct write past its reservation")
        count = raw.count
    }

    @inline(__always)
    mutating func reserve(_ extra: Int) {
        if count &+ extra > capacity { grow(count + extra) }
    }

    @inline(never)
    private mutating func grow(_ needed: Int) {
        guard owned else {
            precondition(needed <= bound, "a writer over borrowed memory outgrew its bound")
            let next = min(bound, max(needed, capacity + Memory.populateChunk))
            Memory.populate(base + capacity, next - capacity)
            capacity = next
            return
        }
        var newCapacity = capacity * 2
        while newCapacity < needed { newCapacity *= 2 }
        let newBase = UnsafeMutableRawPointer.allocate(byteCount: newCapacity, alignment: 8)
        newBase.copyMemory(from: base, byteCount: count)
        base.deallocate()
        base = newBase
        capacity = newCapacity
    }

    /// Reserves room for a count of at most `maximum`, written later with `patchCount(_:at:width:)`.
    /// Unlike `countPlaceholder()`, nothing written after it moves unless the count needs fewer bytes
    /// than `maximum` does (a large delta's record count would otherwise shift the whole delta).
    mutating func countPlaceholder(upTo maximum: Int) -> (offset: Int, width: Int) {
        let width = BinaryWriter.varintWidth(UInt64(maximum))
        let offset = count
        for _ in 0..<width { u8(0) }
        return (offset, width)
    }

    /// Writes `value` (at most the `maximum` given to `countPlaceholder(upTo:)`) where that reserved room.
    mutating func patchCount(_ value: Int, at offset: Int, width: Int) {
        let needed = BinaryWriter.varintWidth(UInt64(value))
        precondition(needed <= width, "count above its reserved maximum")
        if needed < width {
            (base + offset + needed).copyMemory(from: base + offset + width, byteCount: count - offset - width)
            count -= width - needed
        }
        BinaryWriter.storeVarint(UInt64(value), width: needed, at: base + offset)
    }

    /// The bytes `value` takes as a varint.
    static func varintWidth(_ value: UInt64) -> Int {
        var width = 1, rest = value >> 7
        while rest > 0 { width += 1; rest >>= 7 }
        return width
    }

    /// Stores `value` as a varint of `width` bytes (its `varintWidth`) at `address`.
    static func storeVarint(_ value: UInt64, width: Int, at address: UnsafeMutableRawPointer) {
        var v = value
        for index in 0..<width {
            let more: UInt8 = index < width - 1 ? 0x80 : 0
            address.storeBytes(of: UInt8(truncatingIfNeeded: v & 0x7F) | more, toByteOffset: index, as: UInt8.self)
            v >>= 7
        }
    }

    /// Reserves one byte for a count that is written later with `patchCount(_:at:)`.
    @inline(__always)
    mutating func countPlaceholder() -> Int {
        u8(0)
        return count - 1
    }

    /// Writes `value` as a varint at `offset` (reserved by `countPlaceholder()`), moving what follows
    /// forward when the varint needs more than one byte.
    @inline(__always)
    mutating func patchCount(_ value: Int, at offset: Int) {
        if value < 0x80 {
            base.storeBytes(of: UInt8(value), toByteOffset: offset, as: UInt8.self)
            return
        }
        let length = BinaryWriter.varintWidth(UInt64(value))
        reserve(length - 1)
        let tail = count - offset - 1
        (base + offset + length).copyMemory(from: base + offset + 1, byteCount: tail)
        BinaryWriter.storeVarint(UInt64(value), width: length, at: base + offset)
        count += length - 1
    }

    /// Drops everything written after `count`.
    mutating func truncate(to count: Int) {
        precondition(count <= self.count)
        self.count = count
    }

    mutating func header(kind: UInt8) {
        append(BinaryCodec.magic)
        u8(BinaryCodec.formatVersion)
        u8(kind)
    }

    @inline(__always)
    mutating func u8(_ value: UInt8) {
        reserve(1)
        base.storeBytes(of: value, toByteOffset: count, as: UInt8.self)
        count &+= 1
    }

    @inline(__always)
    mutating func u32(_ value: UInt32) {
        reserve(4)
        base.storeBytes(of: value.littleEndian, toByteOffset: count, as: UInt32.self)
        count &+= 4
    }

    /// Overwrites four bytes written earlier (a length placeholder).
    @inline(__always)
    mutating func patchU32(_ value: UInt32, at offset: Int) {
        base.storeBytes(of: value.littleEndian, toByteOffset: offset, as: UInt32.self)
    }

    @inline(__always)
    mutating func u64(_ value: UInt64) {
        reserve(8)
        base.storeBytes(of: value.littleEndian, toByteOffset: count, as: UInt64.self)
        count &+= 8
    }

    @inline(__always)
    mutating func varint(_ value: UInt64) {
        reserve(10)
        var value = value
        while value >= 0x80 {
            base.storeBytes(of: UInt8(truncatingIfNeeded: value) | 0x80, toByteOffset: count, as: UInt8.self)
            count &+= 1
            value >>= 7
        }
        base.storeBytes(of: UInt8(value), toByteOffset: count, as: UInt8.self)
        count &+= 1
    }

    /// Appends `bytes[range]` with one memcpy.
    @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer, _ range: Range<Int>) {
        let length = range.count
        guard length > 0 else { return }
        reserve(length)
        (base + count).copyMemory(from: bytes.baseAddress! + range.lowerBound, byteCount: length)
        count &+= length
    }

    @inline(__always)
    mutating func append(_ bytes: UnsafeRawBufferPointer) { append(bytes, 0..<bytes.count) }

    @inline(__always)
    mutating func append(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { append($0) }
    }

    @inline(__always)
    mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { utf8 in
            varint(UInt64(utf8.count))
            append(UnsafeRawBufferPointer(utf8))
        }
    }

    mutating func zoneID(_ zoneID: ZoneID) {
        string(zoneID.zoneName)
        string(zoneID.ownerRecordName)
    }

    @inline(__always)
    mutating func stamp(_ stamp: Stamp) {
        u64(stamp.hlc.rawValue)
        varint(stamp.replica.rawValue)
    }

    mutating func versionVector(_ vector: VersionVector) {
        varint(UInt64(vector.entries.count))
        for entry in vector.entries {
            varint(entry.replica.rawValue)
            u64(entry.hlc.rawValue)
        }
    }

    mutating func value(_ value: ScalarValue?) {
        guard let value else { u8(0); return }
        u8(value.type.rawValue)
        switch value {
        case .string(let s): string(s)
        case .int64(let i), .timestamp(let i): u64(UInt64(bitPattern: i))
        case .double(let d): u64(d.bitPattern)
        case .bytes(let b):
            varint(UInt64(b.count))
            append(b)
        case .reference(let r):
            string(r.recordName)
            u8((r.zoneID == nil ? 0 : 1) | (r.action == .deleteSelf ? 2 : 0))
            if let zoneID = r.zoneID { self.zoneID(zoneID) }
        case .location(let l):
            u64(l.latitude.bitPattern)
            u64(l.longitude.bitPattern)
            let optionals = l.optionalDoubles
            var mask: UInt8 = 0
            for (bit, part) in optionals.enumerated() where part != nil { mask |= 1 << UInt8(bit) }
            if l.timestamp != nil { mask |= 1 << 5 }
            u8(mask)
            for part in optionals { if let part { u64(part.bitPattern) } }
            if let timestamp = l.timestamp { u64(UInt64(bitPattern: timestamp)) }
        case .asset(let a):
            append(a.checksum)
            u64(UInt64(bitPattern: a.size))
        }
    }

    /// Writes a record frame; rolls the buffer back and throws if the frame exceeds `limit` bytes.
    mutating func frame(_ record: Record, limit: Int = Record.maximumEncodedSize) throws(RecordError) {
        let lengthAt = count
        u32(0) // the frame length, patched below
        let start = count
        string(record.id.recordName)
        string(record.recordType)
        varint(UInt64(record.generation))
        stamp(record.created)
        u8((record.deletion == nil ? 0 : 1) | (record.parentRegister == nil ? 0 : 2))
        if let deletion = record.deletion { stamp(deletion) }
        if let parent = record.parentRegister {
            stamp(parent.stamp)
            value(parent.value)
        }
        varint(UInt64(record.fields.count))
        for field in record.fields {
            string(field.name)
            switch field.state {
            case .register(let register):
                u8(0)
                let lengthAt = countPlaceholder()
                stamp(register.stamp)
                value(register.value)
                patchCount(count - lengthAt - 1, at: lengthAt)
            case .set(let set):
                u8(1)
                let lengthAt = countPlaceholder()
                versionVector(set.context)
                varint(UInt64(set.entries.count))
                for entry in set.entries {
                    value(entry.element)
                    stamp(entry.dot)
                }
                patchCount(count - lengthAt - 1, at: lengthAt)
            case .list(let list):
                u8(2)
                let lengthAt = countPlaceholder()
                list.encode(into: &self)
                patchCount(count - lengthAt - 1, at: lengthAt)
            case .text(let text):
                u8(3)
                let lengthAt = countPlaceholder()
                text.encode(into: &self)
                patchCount(count - lengthAt - 1, at: lengthAt)
            }
        }
        let length = count - start
        if length > limit {
            truncate(to: lengthAt)
            throw RecordError(code: .tooLarge, message: "record \(record.id.recordName) encodes to \(length) bytes; "
                              + "the limit is \(limit) bytes")
        }
        patchU32(UInt32(length), at: lengthAt)
    }
}

// MARK: - Reader

struct BinaryReader {
    let buffer: UnsafeRawBufferPointer
    var offset: Int = 0
    /// Set while reading a frame: no read may pass it.
    var limit: Int
    /// The greatest clock value read so far (stamps and version vectors).
    var maximumHLC = HLC.zero
    /// Field names and record types the quick frame check has found legal in this buffer.
    var knownNames = NameCache()

    init(_ buffer: UnsafeRawBufferPointer) {
        self.buffer = buffer
        self.limit = buffer.count
    }

    var remaining: Int { limit - offset }

    func fail(_ code: CodecError.Code, _ context: String) -> CodecError {
        CodecError(code: code, context: context, offset: offset)
    }

    mutating func header(kind: UInt8, name: String) throws(CodecError) {
        guard remaining >= 5 else { throw fail(.truncated, "header") }
        for index in 0..<3 where buffer[index] != BinaryCodec.magic[index] { throw fail(.badMagic, "header") }
        guard buffer[3] == BinaryCodec.formatVersion else { throw fail(.unsupportedVersion, "\(buffer[3])") }
        guard buffer[4] == kind else { throw fail(.wrongKind, name) }
        offset = 5
    }

    func end() throws(CodecError) {
        if offset != buffer.count { throw fail(.trailingBytes, "end") }
    }

    @inline(__always)
    mutating func u8(_ context: @autoclosure () -> String) throws(CodecError) -> UInt8 {
        guard offset < limit else { throw fail(.truncated, context()) }
        let value = buffer[offset]
        offset += 1
        return value
    }

    @inline(__always)
    mutating func u64(_ context: @autoclosure () -> String) throws(CodecError) -> UInt64 {
        guard limit - offset >= 8 else { throw fail(.truncated, context()) }
        let value = buffer.loadUnaligned(fromByteOffset: offset, as: UInt64.self)
        offset += 8
        return UInt64(littleEndian: value)
    }

    @inline(__always)
    mutating func u32(_ context: @autoclosure () -> String) throws(CodecError) -> UInt32 {
        guard limit - offset >= 4 else { throw fail(.truncated, context()) }
        let value = buffer.loadUnaligned(fromByteOffset: offset, as: UInt32.self)
        offset += 4
        return UInt32(littleEndian: value)
    }

    @inline(__always)
    mutating func varint(_ context: @autoclosure () -> String) throws(CodecError) -> UInt64 {
        if offset < limit {
            let first = buffer[offset]
            if first < 0x80 {
                offset &+= 1
                return UInt64(first)
            }
        }
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            guard offset < limit else { throw fail(.truncated, context()) }
            let byte = buffer[offset]
            offset += 1
            if shift == 63 && byte > 1 { throw fail(.malformed, context() + " (varint overflows 64 bits)") }
            result |= UInt64(byte & 0x7F) << shift
            if byte & 0x80 == 0 {
                if byte == 0 && shift > 0 { throw fail(.malformed, context() + " (non-minimal varint)") }
                return result
            }
            shift += 7
        }
    }

    /// Reads a count and checks it against the bytes that remain before anyone allocates for it.
    @inline(__always)
    mutating func count(minimumElementSize: Int, _ context: @autoclosure () -> String) throws(CodecError) -> Int {
        let value = try varint(context())
        guard value <= UInt64(remaining / minimumElementSize) else {
            throw fail(.truncated, context() + " (\(value) elements cannot fit in \(remaining) bytes)")
        }
        return Int(value)
    }

    @inline(__always)
    mutating func string(_ context: @autoclosure () -> String) throws(CodecError) -> String {
        let length = try count(minimumElementSize: 1, context())
        let bytes = UnsafeRawBufferPointer(rebasing: buffer[offset..<(offset + length)])
        let result: String?
        if BinaryReader.isASCII(bytes) {
            result = String(decoding: bytes, as: UTF8.self)
        } else {
            result = String(validating: bytes, as: UTF8.self)
        }
        guard let result else { throw fail(.malformed, context() + " (invalid UTF-8)") }
        offset += length
        return result
    }

    mutating func name(_ kind: Names.Kind) throws(CodecError) -> String {
        let start = offset
        let value = try string(kind.rawValue)
        guard Names.isValid(value, kind: kind) else {
            throw CodecError(code: .invalidName, context: kind.rawValue, offset: start)
        }
        return value
    }

    mutating func zoneID() throws(CodecError) -> ZoneID {
        let zoneName = try name(.zoneName)
        let owner = try name(.ownerRecordName)
        return ZoneID(validatedZoneName: zoneName, ownerRecordName: owner)
    }

    @inline(__always)
    mutating func stamp(_ context: @autoclosure () -> String) throws(CodecError) -> Stamp {
        let hlc = try u64(context())
        let replica = try varint(context())
        if hlc > maximumHLC.rawValue { maximumHLC = HLC(rawValue: hlc) }
        return Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(replica))
    }

    mutating func versionVector() throws(CodecError) -> VersionVector {
        let count = try count(minimumElementSize: 9, "version vector")
        var entries: [VersionVector.Entry] = []
        entries.reserveCapacity(count)
        for _ in 0..<count {
            let replica = ReplicaID(try varint("version vector replica"))
            let hlc = HLC(rawValue: try u64("version vector clock"))
            if hlc == .zero { throw fail(.malformed, "version vector (zero clock)") }
            if hlc > maximumHLC { maximumHLC = hlc }
            if let last = entries.last, last.replica >= replica {
                throw fail(.malformed, "version vector (replicas not ascending)")
            }
            entries.append(VersionVector.Entry(replica: replica, hlc: hlc))
        }
        return VersionVector(sortedEntries: entries)
    }

    mutating func double(_ context: String) throws(CodecError) -> Double {
        Double(bitPattern: try u64(context))
    }

    mutating func value() throws(CodecError) -> ScalarValue? {
        let tag = try u8("value type")
        if tag == 0 { return nil }
        guard let type = ValueType(rawValue: tag) else { throw fail(.malformed, "value (unknown type \(tag))") }
        switch type {
        case .string: return .string(try string("string value"))
        case .int64: return .int64(Int64(bitPattern: try u64("int64 value")))
        case .double: return .double(try double("double value"))
        case .timestamp: return .timestamp(Int64(bitPattern: try u64("timestamp value")))
        case .bytes:
            let length = try count(minimumElementSize: 1, "bytes value")
            let bytes = [UInt8](UnsafeRawBufferPointer(rebasing: buffer[offset..<(offset + length)]))
            offset += length
            return .bytes(bytes)
        case .reference:
            let recordName = try name(.recordName)
            let flags = try u8("reference flags")
            guard flags & ~3 == 0 else { throw fail(.malformed, "reference flags") }
            let zoneID = flags & 1 != 0 ? try self.zoneID() : nil
            return .reference(Reference(validatedRecordName: recordName, zoneID: zoneID,
                                        action: flags & 2 != 0 ? .deleteSelf : .none))
        case .location:
            var location = Location(latitude: try double("latitude"), longitude: try double("longitude"))
            let mask = try u8("location mask")
            guard mask & ~0x3F == 0 else { throw fail(.malformed, "location mask") }
            if mask & 1 != 0 { location.altitude = try double("altitude") }
            if mask & 2 != 0 { location.horizontalAccuracy = try double("horizontal accuracy") }
            if mask & 4 != 0 { location.verticalAccuracy = try double("vertical accuracy") }
            if mask & 8 != 0 { location.course = try double("course") }
            if mask & 16 != 0 { location.speed = try double("speed") }
            if mask & 32 != 0 { location.timestamp = Int64(bitPattern: try u64("location timestamp")) }
            return .location(location)
        case .asset:
            guard limit - offset >= AssetValue.checksumLength else { throw fail(.truncated, "asset checksum") }
            let checksum = [UInt8](UnsafeRawBufferPointer(rebasing: buffer[offset..<(offset + AssetValue.checksumLength)]))
            offset += AssetValue.checksumLength
            guard let asset = AssetValue(checksum: checksum, size: Int64(bitPattern: try u64("asset size"))) else {
                throw fail(.malformed, "asset size (negative)")
            }
            return .asset(asset)
        }
    }

    /// Reads a field's payload length and confines reads to the payload; returns the limit to restore.
    @inline(__always)
    mutating func beginFieldPayload() throws(CodecError) -> Int {
        let length = try count(minimumElementSize: 1, "field length")
        let outer = limit
        limit = offset + length
        return outer
    }

    @inline(__always)
    mutating func endFieldPayload(restoring outer: Int) throws(CodecError) {
        guard offset == limit else { throw fail(.malformed, "field (length does not match contents)") }
        limit = outer
    }

    /// Reads one field (`string(name) kind length payload`) and checks that it is canonical.
    mutating func field() throws(CodecError) -> Field {
        let fieldName = try name(.fieldName)
        let kind = try u8("field kind")
        let outer = try beginFieldPayload()
        let state: FieldState
        switch kind {
        case 0:
            let stamp = try stamp("field stamp")
            state = .register(LWWRegister(value: try value(), stamp: stamp))
        case 1:
            let context = try versionVector()
            let entryCount = try count(minimumElementSize: 1 + 1 + 9, "set entry count")
            var entries: [ORSet.Entry] = []
            entries.reserveCapacity(entryCount)
            for _ in 0..<entryCount {
                guard let element = try value() else { throw fail(.malformed, "set entry (nil element)") }
                let dot = try stamp("set entry dot")
                let entry = ORSet.Entry(element: element, dot: dot)
                if let last = entries.last, !ORSet.entryPrecedes(last, entry) {
                    throw fail(.malformed, "set (entries not in order)")
                }
                if !context.covers(dot) { throw fail(.malformed, "set (dot outside its causal context)") }
                entries.append(entry)
            }
            state = .set(ORSet(sortedEntries: entries, context: context))
        case 2:
            let list = try ListState(decoding: &self)
            if list.context.maximumHLC > maximumHLC { maximumHLC = list.context.maximumHLC }
            state = .list(list)
        case 3:
            let text = try TextState(decoding: &self)
            if text.context.maximumHLC > maximumHLC { maximumHLC = text.context.maximumHLC }
            state = .text(text)
        default:
            throw fail(.malformed, "field kind \(kind)")
        }
        try endFieldPayload(restoring: outer)
        return Field(name: fieldName, state: state)
    }

    /// Reads one length-prefixed record frame and checks that it is canonical.
    mutating func frame(zoneID: ZoneID) throws(CodecError) -> Record {
        let length = Int(try u32("record frame length"))
        guard length <= Record.maximumMergedSize else { throw fail(.tooLarge, "record") }
        guard length <= remaining else { throw fail(.truncated, "record frame (\(length) bytes declared)") }
        let outerLimit = limit
        limit = offset + length
        let recordName = try name(.recordName)
        let recordType = try name(.recordType)
        let generation = try varint("generation")
        guard generation >= 1 && generation <= UInt64(UInt32.max) else { throw fail(.malformed, "generation") }
        let created = try stamp("creation stamp")
        let flags = try u8("record flags")
        guard flags & ~3 == 0 else { throw fail(.malformed, "record flags") }
        let deletion = flags & 1 != 0 ? try stamp("deletion stamp") : nil
        var parent: LWWRegister? = nil
        if flags & 2 != 0 {
            if deletion != nil { throw fail(.malformed, "record (a deleted record has no parent)") }
            let parentStamp = try stamp("parent stamp")
            let value = try value()
            if let value {
                guard case .reference(let reference) = value, reference.zoneID == nil, reference.action == .none,
                      compareBytes(reference.recordName, recordName) != 0 else {
                    throw fail(.malformed, "parent (must be a same-zone reference with action NONE to another record)")
                }
            }
            parent = LWWRegister(value: value, stamp: parentStamp)
        }
        let fieldCount = try count(minimumElementSize: 6, "field count")
        if deletion != nil && fieldCount != 0 { throw fail(.malformed, "record (a deleted record has no fields)") }
        var fields: [Field] = []
        fields.reserveCapacity(fieldCount)
        for _ in 0..<fieldCount {
            let start = offset
            let field = try field()
            if let last = fields.last, compareBytes(last.name, field.name) >= 0 {
                throw CodecError(code: .malformed, context: "record (fields not in name order)", offset: start)
            }
            fields.append(field)
        }
        guard offset == limit else { throw fail(.malformed, "record frame (length does not match contents)") }
        limit = outerLimit
        let id = RecordID(validatedRecordName: recordName, zoneID: zoneID)
        return Record(id: id, recordType: recordType, generation: UInt32(generation), created: created,
                      deletion: deletion, parent: parent, fields: fields)
    }
}

// MARK: - Validation without materializing

extension BinaryReader {
    /// Validates one record frame exactly as strictly as `frame(zoneID:)` and returns its byte range
    /// (length prefix included) and the range of its name's payload, without building any value.
    /// Common frames pass the quick check (`FrameCheck`); the rest take the full check, which explains
    /// what is wrong.
    @inline(__always)
    mutating func scanFrame() throws(CodecError) -> (frame: Range<Int>, name: Range<Int>) {
        if let quick = FrameCheck.check(buffer, at: offset, limit: limit, names: &knownNames) {
            let start = offset
            offset = quick.end
            if quick.maximumHLC > maximumHLC.rawValue { maximumHLC = HLC(rawValue: quick.maximumHLC) }
            return (start..<quick.end, quick.name)
        }
        return try scanFrameFully()
    }

    /// The full check behind `scanFrame()`: every rule, with a precise error for the first one broken.
    mutating func scanFrameFully() throws(CodecError) -> (frame: Range<Int>, name: Range<Int>) {
        let frameStart = offset
        let length = Int(try u32("record frame length"))
        guard length <= Record.maximumMergedSize else { throw fail(.tooLarge, "record") }
        guard length <= remaining else { throw fail(.truncated, "record frame (\(length) bytes declared)") }
        let outerLimit = limit
        limit = offset + length
        let name = try scanName(.recordName)
        _ = try scanName(.recordType)
        let generation = try varint("generation")
        guard generation >= 1 && generation <= UInt64(UInt32.max) else { throw fail(.malformed, "generation") }
        _ = try stamp("creation stamp")
        let flags = try u8("record flags")
        guard flags & ~3 == 0 else { throw fail(.malformed, "record flags") }
        let deleted = flags & 1 != 0
        if deleted { _ = try stamp("deletion stamp") }
        if flags & 2 != 0 {
            if deleted { throw fail(.malformed, "record (a deleted record has no parent)") }
            _ = try stamp("parent stamp")
            let valueAt = offset
            let tag = try scanValue()
            if tag != 0 {
                // Canonical parent: a reference with no zone (same zone) and action NONE, to another record.
                // The tag is checked first: only a validated reference may be read with the unchecked cursor.
                let invalid = fail(.malformed, "parent (must be a same-zone reference with action NONE to another record)")
                guard tag == ValueType.reference.rawValue else { throw invalid }
                var cursor = ByteCursor(buffer, at: valueAt + 1)
                let parentName = cursor.string()
                guard cursor.u8() == 0, EncodedOrder.compare(buffer, parentName, buffer, name) != 0 else { throw invalid }
            }
        }
        let fieldCount = try count(minimumElementSize: 6, "field count")
        if deleted && fieldCount != 0 { throw fail(.malformed, "record (a deleted record has no fields)") }
        var previousName: Range<Int>? = nil
        for _ in 0..<fieldCount {
            let start = offset
            let fieldName = try scanName(.fieldName)
            if let previousName, EncodedOrder.compare(buffer, previousName, buffer, fieldName) >= 0 {
                throw CodecError(code: .malformed, context: "record (fields not in name order)", offset: start)
            }
            previousName = fieldName
            let kind = try u8("field kind")
            let outer = try beginFieldPayload()
            switch kind {
            case 0:
                _ = try stamp("field stamp")
                _ = try scanValue()
            case 1:
                var contextAt = try scanVersionVector().lowerBound
                let context = RawVector(buffer.baseAddress!, &contextAt) // validated just now
                let entryCount = try count(minimumElementSize: 1 + 1 + 9, "set entry count")
                var previous: (value: Int, dot: Stamp)? = nil
                for _ in 0..<entryCount {
                    let valueAt = offset
                    guard try scanValue() != 0 else { throw fail(.malformed, "set entry (nil element)") }
                    let dot = try stamp("set entry dot")
                    if let previous {
                        var order = Raw.compareValues(buffer.baseAddress!, previous.value, buffer.baseAddress!, valueAt)
                        if order == 0 { order = previous.dot == dot ? 0 : (previous.dot < dot ? -1 : 1) }
                        if order >= 0 { throw fail(.malformed, "set (entries not in order)") }
                    }
                    if !context.covers(buffer.baseAddress!, dot) {
                        throw fail(.malformed, "set (dot outside its causal context)")
                    }
                    previous = (valueAt, dot)
                }
            case 2:
                let list = try ListState(decoding: &self)
                if list.context.maximumHLC > maximumHLC { maximumHLC = list.context.maximumHLC }
            case 3:
                let text = try TextState(decoding: &self)
                if text.context.maximumHLC > maximumHLC { maximumHLC = text.context.maximumHLC }
            default:
                throw fail(.malformed, "field kind \(kind)")
            }
            try endFieldPayload(restoring: outer)
        }
        guard offset == limit else { throw fail(.malformed, "record frame (length does not match contents)") }
        limit = outerLimit
        return (frameStart..<offset, name)
    }

    /// Validates a version vector in place and returns its byte range (count included).
    mutating func scanVersionVector() throws(CodecError) -> Range<Int> {
        let start = offset
        let count = try count(minimumElementSize: 9, "version vector")
        var previous: UInt64? = nil
        for _ in 0..<count {
            let replica = try varint("version vector replica")
            let hlc = HLC(rawValue: try u64("version vector clock"))
            if hlc == .zero { throw fail(.malformed, "version vector (zero clock)") }
            if hlc > maximumHLC { maximumHLC = hlc }
            if let previous, previous >= replica { throw fail(.malformed, "version vector (replicas not ascending)") }
            previous = replica
        }
        return start..<offset
    }

    /// Validates a length-prefixed name in place and returns its payload range.
    mutating func scanName(_ kind: Names.Kind) throws(CodecError) -> Range<Int> {
        let start = offset
        let length = try count(minimumElementSize: 1, kind.rawValue)
        let range = offset..<(offset + length)
        if Names.brokenRule(UnsafeRawBufferPointer(rebasing: buffer[range]), kind: kind) != nil {
            throw CodecError(code: .invalidName, context: kind.rawValue, offset: start)
        }
        offset += length
        return range
    }

    /// Validates a length-prefixed UTF-8 string in place.
    mutating func scanString(_ context: @autoclosure () -> String) throws(CodecError) {
        let length = try count(minimumElementSize: 1, context())
        let bytes = UnsafeRawBufferPointer(rebasing: buffer[offset..<(offset + length)])
        if !BinaryReader.isASCII(bytes) && String(validating: bytes, as: UTF8.self) == nil {
            throw fail(.malformed, context() + " (invalid UTF-8)")
        }
        offset += length
    }

    /// True when every byte is below 0x80 (checked eight bytes at a time).
    @inline(__always)
    static func isASCII(_ bytes: UnsafeRawBufferPointer) -> Bool {
        guard let base = bytes.baseAddress else { return true }
        return FrameCheck.isASCII(base, bytes.count)
    }

    /// Validates an optional value in place and returns its type byte (0 for nil).
    mutating func scanValue() throws(CodecError) -> UInt8 {
        let tag = try u8("value type")
        if tag == 0 { return 0 }
        guard let type = ValueType(rawValue: tag) else { throw fail(.malformed, "value (unknown type \(tag))") }
        switch type {
        case .string: try scanString("string value")
        case .int64, .double, .timestamp: _ = try u64("\(type) value")
        case .bytes:
            let length = try count(minimumElementSize: 1, "bytes value")
            offset += length
        case .reference:
            _ = try scanName(.recordName)
            let flags = try u8("reference flags")
            guard flags & ~3 == 0 else { throw fail(.malformed, "reference flags") }
            if flags & 1 != 0 {
                _ = try scanName(.zoneName)
                _ = try scanName(.ownerRecordName)
            }
        case .location:
            _ = try u64("latitude")
            _ = try u64("longitude")
            let mask = try u8("location mask")
            guard mask & ~0x3F == 0 else { throw fail(.malformed, "location mask") }
            for _ in 0..<mask.nonzeroBitCount { _ = try u64("location part") }
        case .asset:
            guard limit - offset >= AssetValue.checksumLength else { throw fail(.truncated, "asset checksum") }
            offset += AssetValue.checksumLength
            guard Int64(bitPattern: try u64("asset size")) >= 0 else { throw fail(.malformed, "asset size (negative)") }
        }
        return tag
    }
}
