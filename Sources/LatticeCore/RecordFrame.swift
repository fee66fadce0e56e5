import Foundation

/// One record in its canonical binary form, as the server and a device's replica store it: a record file
/// (`"LTC" version kind=1 zoneID frame`, Merge.md §7).
///
/// This is the unit of the merge engine outside a `ZoneState`: incoming states are validated once
/// (`init(validating:)`) and joined on bytes (`merged(with:)`, `FrameMerge`), and local edits become a
/// stamped frame (`RecordEdit`) joined the same way. A `Record` value is built only to look at a record
/// (`decoded()`): JSON answers, the CLI, tests.
///
/// ```swift
/// let incoming = try RecordFrame(validating: bytes)
/// if let joined = stored.merged(with: incoming) { save(joined) }   // nil: nothing new
/// ```
public struct RecordFrame: Hashable, Sendable {
    /// The record file.
    public let bytes: [UInt8]
    /// Offset of the frame (its length prefix) in `bytes`; before it: the file header and the zone id.
    let frameStart: Int

    /// Checks a record file fully (canonical form, names, order, `Record.maximumMergedSize`).
    /// - Throws: `CodecError` naming what is wrong and where.
    public init(validating bytes: [UInt8]) throws(CodecError) {
        let start: Int
        do {
            start = try bytes.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws -> Int in
                var reader = BinaryReader(raw)
                try reader.header(kind: BinaryCodec.recordKind, name: "a record")
                _ = try reader.zoneID()
                let start = reader.offset
                _ = try reader.scanFrame()
                try reader.end()
                return start
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "input", offset: 0)
        }
        self.bytes = bytes
        self.frameStart = start
    }

    /// Bytes this process wrote or validated before (a stored frame): only the file header is located.
    init(trusted bytes: [UInt8]) {
        self.bytes = bytes
        self.frameStart = bytes.withUnsafeBytes { raw in
            var cursor = ByteCursor(raw, at: 5)
            _ = cursor.string()
            _ = cursor.string()
            return cursor.offset
        }
    }

    /// A stored frame read back from storage. It is checked in full, so a damaged row is an error and never
    /// an unchecked read by the join.
    public init(stored bytes: [UInt8]) throws(CodecError) {
        try self.init(validating: bytes)
    }

    /// Encodes a record. - Throws: `RecordError.tooLarge` above `Record.maximumEncodedSize`.
    public init(encoding record: Record) throws(RecordError) {
        self.init(trusted: try BinaryCodec.encode(record))
    }

    /// A frame of a validated delta, with the delta's zone (`prefix` is that zone's record-file header).
    init(prefix: [UInt8], frame: UnsafeRawBufferPointer) {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(prefix.count + frame.count)
        bytes.append(contentsOf: prefix)
        bytes.append(contentsOf: frame.assumingMemoryBound(to: UInt8.self))
        self.bytes = bytes
        self.frameStart = prefix.count
    }

    /// The record-file header for records of `zoneID`: what precedes every frame.
    static func prefix(for zoneID: ZoneID) -> [UInt8] {
        var writer = BinaryWriter(capacity: 64)
        writer.header(kind: BinaryCodec.recordKind)
        writer.zoneID(zoneID)
        return writer.finish()
    }

    @inline(__always)
    func withFrame<R>(_ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try bytes.withUnsafeBytes { raw in try body(UnsafeRawBufferPointer(rebasing: raw[frameStart...])) }
    }

    private func string(_ range: KeyPath<FrameHeader, Range<Int>>) -> String {
        withFrame { frame in
            let header = FrameHeader(frame)
            return String(decoding: UnsafeRawBufferPointer(rebasing: frame[header[keyPath: range]]), as: UTF8.self)
        }
    }

    // MARK: Header

    public var recordName: String { string(\.name) }
    public var recordType: String { string(\.type) }
    public var isDeleted: Bool { withFrame { FrameHeader($0).deletion != nil } }
    public var generation: UInt32 { withFrame { UInt32(truncatingIfNeeded: FrameHeader($0).generation) } }
    var created: Stamp { withFrame { FrameHeader($0).created } }

    /// The zone the record belongs to.
    public var zoneID: ZoneID {
        bytes.withUnsafeBytes { raw in
            var cursor = ByteCursor(raw, at: 5)
            let zone = cursor.string(), owner = cursor.string()
            return ZoneID(validatedZoneName: String(decoding: UnsafeRawBufferPointer(rebasing: raw[zone]), as: UTF8.self),
                          ownerRecordName: String(decoding: UnsafeRawBufferPointer(rebasing: raw[owner]), as: UTF8.self))
        }
    }

    /// The parent's record name (sharing hierarchies follow it); nil when there is none.
    public var parentName: String? {
        withFrame { frame in
            let header = FrameHeader(frame)
            guard header.parentWhole != nil, frame[header.parentValue] == ValueType.reference.rawValue else { return nil }
            var cursor = ByteCursor(frame, at: header.parentValue + 1)
            let name = cursor.string()
            return String(decoding: UnsafeRawBufferPointer(rebasing: frame[name]), as: UTF8.self)
        }
    }

    /// The size the 1 MiB write limit applies to: the record body, without the frame's length prefix.
    public var encodedSize: Int { bytes.count - frameStart - 4 }

    /// True when a write of this state must be refused (`Record.maximumEncodedSize`); merged states may be
    /// larger (up to `Record.maximumMergedSize`) when they only travel, never when they are written.
    public var exceedsWriteLimit: Bool { encodedSize > Record.maximumEncodedSize }

    // MARK: Reading

    /// The record as a value (for JSON answers, the CLI and tests).
    public func decoded() throws(CodecError) -> Record {
        do {
            return try bytes.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws -> Record in
                var reader = BinaryReader(raw)
                try reader.header(kind: BinaryCodec.recordKind, name: "a record")
                let zoneID = try reader.zoneID()
                let record = try reader.frame(zoneID: zoneID)
                try reader.end()
                return record
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "input", offset: 0)
        }
    }

    /// The state of one field, decoded on its own (nil when the record has no such field).
    func fieldState(_ name: String) -> FieldState? {
        let wanted = Array(name.utf8)
        return withFrame { frame -> FieldState? in
            guard let start = fieldOffsets(frame).first(where: { offset in
                var cursor = ByteCursor(frame, at: offset)
                let range = cursor.string()
                return range.count == wanted.count && wanted.withUnsafeBytes {
                    memcmp(frame.baseAddress! + range.lowerBound, $0.baseAddress!, wanted.count) == 0
                }
            }) else { return nil }
            var reader = BinaryReader(frame)
            reader.offset = start
            return try? reader.field().state
        }
    }

    /// Every field's name and kind (0 register, 1 set, 2 list, 3 text), in name order.
    func fieldKinds() -> [(name: String, kind: UInt8)] {
        withFrame { frame in
            fieldOffsets(frame).map { offset in
                var cursor = ByteCursor(frame, at: offset)
                let range = cursor.string()
                let kind = cursor.u8()
                return (String(decoding: UnsafeRawBufferPointer(rebasing: frame[range]), as: UTF8.self), kind)
            }
        }
    }

    private func fieldOffsets(_ frame: UnsafeRawBufferPointer) -> [Int] {
        let header = FrameHeader(frame)
        var cursor = ByteCursor(frame, at: header.fieldsStart)
        var offsets: [Int] = []
        offsets.reserveCapacity(header.fieldCount)
        for _ in 0..<header.fieldCount {
            offsets.append(cursor.offset)
            _ = cursor.string()
            _ = cursor.u8()
            let length = Int(cursor.varint())
            cursor.offset += length
        }
        return offsets
    }

    // MARK: The join

    /// The join of two states of the same record, on bytes (`FrameMerge`); nil when `self` already
    /// reflects everything in `other`, so nothing needs writing.
    public func merged(with other: RecordFrame) -> RecordFrame? {
        withFrame { p -> RecordFrame? in
            other.withFrame { q -> RecordFrame? in
                precondition(EncodedOrder.equal(p, FrameHeader(p).name, q, FrameHeader(q).name), "joining different records")
                if p.count == q.count && memcmp(p.baseAddress!, q.baseAddress!, p.count) == 0 { return nil }
                var out = BinaryWriter(capacity: p.count + q.count + 16)
                switch FrameMerge.merge(p, q, mineIsResult: true, into: &out) {
                case .mine: return nil
                case .theirs: return RecordFrame(prefix: Array(bytes[..<frameStart]), frame: q)
                case .written: return out.withWrittenBytes { RecordFrame(prefix: Array(bytes[..<frameStart]), frame: $0) }
                }
            }
        }
    }

    /// `stored` joined with `incoming`; `incoming` itself when nothing is stored; nil when nothing changes.
    public static func join(_ stored: RecordFrame?, _ incoming: RecordFrame) -> RecordFrame? {
        guard let stored else { return incoming }
        return stored.merged(with: incoming)
    }
}

extension EncodedDelta {
    /// Each record of the delta as its own record file, in name order (the frames are copied, not
    /// re-encoded or re-validated).
    public func recordFrames() -> [RecordFrame] {
        let prefix = RecordFrame.prefix(for: zoneID)
        return bytes.withUnsafeBytes { raw in
            frames.map { RecordFrame(prefix: prefix, frame: UnsafeRawBufferPointer(rebasing: raw[$0])) }
        }
    }

    /// The record names, in the delta's order.
    public var recordNames: [String] {
        bytes.withUnsafeBytes { raw in
            names.map { String(decoding: UnsafeRawBufferPointer(rebasing: raw[$0]), as: UTF8.self) }
        }
    }
}

extension BinaryCodec {
    /// A zone delta made of stored frames, copied as they are (no decode, no re-encode). Frames are put in
    /// name order; each record must appear once and belong to `zoneID`.
    public static func encodeDelta(zoneID: ZoneID, since: VersionVector = VersionVector(),
                                   version: VersionVector = VersionVector(), frames: [RecordFrame]) -> [UInt8] {
        // Each frame's name is located once; the zone is checked on the record-file header's bytes.
        let prefix = RecordFrame.prefix(for: zoneID)
        let named = frames.map { frame -> (frame: RecordFrame, name: ArraySlice<UInt8>) in
            precondition(frame.bytes[..<frame.frameStart].elementsEqual(prefix), "a frame of another zone in a delta")
            let name = frame.withFrame { FrameHeader($0).name }
            return (frame, frame.bytes[(frame.frameStart + name.lowerBound)..<(frame.frameStart + name.upperBound)])
        }
        let sorted = named.sorted { $0.name.lexicographicallyPrecedes($1.name) }
        var writer = BinaryWriter(capacity: 64 + frames.reduce(0) { $0 + $1.bytes.count })
        writer.header(kind: deltaKind)
        writer.zoneID(zoneID)
        writer.versionVector(since)
        writer.versionVector(version)
        writer.varint(UInt64(sorted.count))
        for item in sorted { item.frame.withFrame { writer.append($0) } }
        return writer.finish()
    }
}
