/// A batch of record states for one zone, as values: either the changes since a version, or a whole state.
///
/// This is the readable form used by tests, tools and small clients; zones exchange the same content
/// as `EncodedDelta` bytes. Merging a delta is a join, so deltas may be applied in any order, more than once.
public struct ZoneDelta: Hashable, Sendable {
    public let zoneID: ZoneID
    /// The version the delta was computed against (empty for a whole state).
    public let since: VersionVector
    /// The sender's version after the changes in this delta.
    public let version: VersionVector
    /// Partial or whole record states, sorted by record name.
    public let records: [Record]
    /// The newest clock value in the delta, checked against the receiving clock's drift bound.
    public let maximumHLC: HLC

    public init(zoneID: ZoneID, since: VersionVector, version: VersionVector, records: [Record]) {
        let maximum = records.reduce(max(since.maximumHLC, version.maximumHLC)) { max($0, $1.maximumHLC) }
        self.init(zoneID: zoneID, since: since, version: version, records: records, maximumHLC: maximum)
    }

    init(zoneID: ZoneID, since: VersionVector, version: VersionVector, records: [Record], maximumHLC: HLC) {
        self.zoneID = zoneID
        self.since = since
        self.version = version
        self.records = records
        self.maximumHLC = maximumHLC
    }
}

/// A validated binary zone delta, ready to merge (see `BinaryCodec` for the format).
///
/// Validation reads every byte once and builds nothing: record frames stay where they are in `bytes`.
public struct EncodedDelta: Sendable {
    public let bytes: [UInt8]
    public let zoneID: ZoneID
    public let since: VersionVector
    public let version: VersionVector
    /// The newest clock value anywhere in the delta.
    public let maximumHLC: HLC
    /// Byte ranges of the record frames, in name order.
    let frames: [Range<Int>]
    /// Byte ranges of the record names' UTF-8 payloads.
    let names: [Range<Int>]

    public var recordCount: Int { frames.count }

    /// - Throws: `CodecError` for anything that is not a canonical version-1 zone delta.
    public init(validating bytes: [UInt8]) throws(CodecError) {
        var zoneID: ZoneID? = nil
        var since = VersionVector(), version = VersionVector()
        var frames: [Range<Int>] = [], names: [Range<Int>] = []
        var maximum = HLC.zero
        do {
            try bytes.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws in
                var reader = BinaryReader(raw)
                try reader.header(kind: BinaryCodec.deltaKind, name: "a zone delta")
                zoneID = try reader.zoneID()
                since = try reader.versionVector()
                version = try reader.versionVector()
                let count = try reader.count(minimumElementSize: 20, "record count")
                frames.reserveCapacity(count)
                names.reserveCapacity(count)
                for _ in 0..<count {
                    let start = reader.offset
                    let (frame, name) = try reader.scanFrame()
                    if let last = names.last, EncodedOrder.compare(raw, last, raw, name) >= 0 {
                        throw CodecError(code: .malformed, context: "delta (records not in name order)", offset: start)
                    }
                    frames.append(frame)
                    names.append(name)
                }
                try reader.end()
                maximum = reader.maximumHLC
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "input", offset: 0)
        }
        self.bytes = bytes
        self.zoneID = zoneID!
        self.since = since
        self.version = version
        self.maximumHLC = maximum
        self.frames = frames
        self.names = names
    }

    /// The records as values.
    public func decoded() throws(CodecError) -> ZoneDelta {
        var records: [Record] = []
        records.reserveCapacity(frames.count)
        for frame in frames { records.append(try ZoneState.decodeFrame(bytes, frame, zoneID: zoneID)) }
        return ZoneDelta(zoneID: zoneID, since: since, version: version, records: records, maximumHLC: maximumHLC)
    }
}

/// A zone as one replica holds it: its records (tombstones included) and the version it reflects.
///
/// Records are stored in their canonical binary frames, sorted by name; merging works on those bytes
/// (`FrameMerge`), and a whole-state export is a concatenation of stored frames.
///
/// ```swift
/// var clock = HybridLogicalClock(replica: ReplicaID(1), time: { 1_764_489_600_000 })
/// var zone = ZoneState(zoneID: zoneID)
/// try zone.create(recordName: "milk", recordType: "Item", clock: &clock)
/// try zone.update("milk", clock: &clock) { record, stamp in try record.set("text", to: .string("Milk"), at: stamp) }
/// let bytes = zone.encodedChanges(since: peerVersion)     // nil when the peer is up to date
/// try peer.merge(EncodedDelta(validating: bytes!), clock: &peerClock)
/// ```
public struct ZoneState: Hashable, Sendable {
    public let zoneID: ZoneID
    /// Every operation this state reflects: `version[r] = h` means every operation of replica `r` up to
    /// `h` is in this state (see Docs/Merge.md).
    public private(set) var version: VersionVector
    /// Encoded record frames, sorted by record name (UTF-8 bytes).
    private var frames: ContiguousArray<[UInt8]>

    public init(zoneID: ZoneID) {
        self.zoneID = zoneID
        self.version = VersionVector()
        self.frames = []
    }

    /// Number of records, tombstones included.
    public var count: Int { frames.count }

    public subscript(recordName: String) -> Record? {
        guard case .found(let index) = find(recordName) else { return nil }
        return record(at: index)
    }

    /// All records by name, tombstones included (decodes every record; for tools and tests).
    public var records: [String: Record] {
        var result: [String: Record] = [:]
        for index in frames.indices {
            let record = record(at: index)
            result[record.id.recordName] = record
        }
        return result
    }

    /// Visible (not deleted) records, sorted by name.
    public var liveRecords: [Record] {
        frames.indices.map(record(at:)).filter { !$0.isDeleted }
    }

    // MARK: Local edits

    /// Creates a record, or recreates it when it exists as a tombstone.
    /// - Throws: `ZoneError.recordExists` for a live record, `NameError`, `RecordError`.
    @discardableResult
    public mutating func create(recordName: String, recordType: String, parent: Reference? = nil,
                                clock: inout HybridLogicalClock) throws -> Record {
        let id = try RecordID(recordName: recordName, zoneID: zoneID)
        let position = find(recordName)
        var record: Record
        let stamp = clock.now()
        switch position {
        case .found(let index):
            record = self.record(at: index)
            guard record.isDeleted else { throw ZoneError.recordExists(recordName) }
            try record.recreate(recordType: recordType, at: stamp)
        case .insert:
            record = try Record(id: id, recordType: recordType, createdAt: stamp)
        }
        var stamps = [stamp]
        if let parent {
            let parentStamp = clock.now()
            try record.setParent(parent, at: parentStamp)
            stamps.append(parentStamp)
        }
        try store(record, at: position)
        for stamp in stamps { version.record(stamp) }
        return record
    }

    /// Applies a local edit with one fresh stamp. On error the zone is unchanged (the clock may have ticked).
    public mutating func update(_ recordName: String, clock: inout HybridLogicalClock,
                                _ edit: (inout Record, Stamp) throws -> Void) throws {
        let position = find(recordName)
        guard case .found(let index) = position else { throw ZoneError.recordNotFound(recordName) }
        var record = record(at: index)
        guard !record.isDeleted else { throw ZoneError.recordNotFound(recordName) }
        let stamp = clock.now()
        try edit(&record, stamp)
        try store(record, at: position)
        version.record(stamp)
    }

    /// Deletes a live record, leaving a tombstone.
    public mutating func delete(_ recordName: String, clock: inout HybridLogicalClock) throws {
        let position = find(recordName)
        guard case .found(let index) = position else { throw ZoneError.recordNotFound(recordName) }
        var record = record(at: index)
        guard !record.isDeleted else { throw ZoneError.recordNotFound(recordName) }
        let stamp = clock.now()
        record.delete(at: stamp)
        try store(record, at: position)
        version.record(stamp)
    }

    // MARK: Deltas

    /// What this state holds that `since` does not reflect, encoded, or `nil` when there is nothing to send.
    ///
    /// A record travels with its header and only the fields (and parent) that hold an operation `since`
    /// does not cover; a record created, recreated or deleted after `since` travels whole.
    public func encodedChanges(since: VersionVector) -> [UInt8]? {
        var body = BinaryWriter(capacity: 4096)
        var count = 0
        for frame in frames {
            frame.withUnsafeBytes { p in
                if ZoneState.appendChanges(of: p, since: since, to: &body) { count += 1 }
            }
        }
        if count == 0 { return nil }
        return body.withWrittenBytes { assemble(since: since, count: count, body: $0) }
    }

    /// The whole state, encoded as a delta since nothing.
    public func encodedFullState() -> [UInt8] {
        var total = 0
        for frame in frames { total += frame.count }
        var writer = BinaryWriter(capacity: total + 256)
        writeHeader(into: &writer, since: VersionVector(), count: frames.count)
        for frame in frames { writer.append(frame) }
        return writer.finish()
    }

    /// `encodedChanges(since:)` as values.
    public func changes(since: VersionVector) -> ZoneDelta? {
        guard let bytes = encodedChanges(since: since) else { return nil }
        return ZoneState.decodeOwn(bytes)
    }

    /// `encodedFullState()` as values.
    public func fullState() -> ZoneDelta {
        ZoneState.decodeOwn(encodedFullState())
    }

    // MARK: Merge

    /// Joins a received delta after checking it against the clock's drift bound (which it then observes).
    ///
    /// The version advances to the sender's only when the delta was computed against a version this
    /// state already reflects; otherwise the records are joined and the version stays as it was (the
    /// records may come again later; joining them twice changes nothing).
    /// - Throws: `ClockError` (nothing merged) or `ZoneError.wrongZone`.
    public mutating func merge(_ delta: EncodedDelta, clock: inout HybridLogicalClock) throws {
        guard delta.zoneID == zoneID else { throw ZoneError.wrongZone(expected: zoneID, got: delta.zoneID) }
        try clock.observe(delta.maximumHLC)
        join(delta)
    }

    /// Joins an in-process delta. Deltas built from values skip the drift check, which guards the wire.
    /// - Throws: `ZoneError.wrongZone`, `RecordError` if a record does not fit the binary format.
    public mutating func merge(_ delta: ZoneDelta) throws {
        guard delta.zoneID == zoneID else { throw ZoneError.wrongZone(expected: zoneID, got: delta.zoneID) }
        let encoded = try EncodedDelta(validating: BinaryCodec.encode(delta))
        join(encoded)
    }

    private mutating func join(_ delta: EncodedDelta) {
        delta.bytes.withUnsafeBytes { q in
            var inserts: [(index: Int, frame: [UInt8])] = []
            var index = 0
            frames.withUnsafeMutableBufferPointer { stored in
                for (frameRange, nameRange) in zip(delta.frames, delta.names) {
                    var order = 1
                    while index < stored.count {
                        order = stored[index].withUnsafeBytes { p in
                            EncodedOrder.compare(p, ZoneState.nameRange(p), q, nameRange)
                        }
                        if order >= 0 { break }
                        index += 1
                    }
                    let incoming = UnsafeRawBufferPointer(rebasing: q[frameRange])
                    if index < stored.count && order == 0 {
                        if let merged = FrameMerge.merge(stored[index], incoming) { stored[index] = merged }
                        index += 1
                    } else {
                        inserts.append((index, copyBytes(incoming)))
                    }
                }
            }
            if !inserts.isEmpty {
                var result = ContiguousArray<[UInt8]>()
                result.reserveCapacity(frames.count + inserts.count)
                var from = 0
                for insert in inserts {
                    result.append(contentsOf: frames[from..<insert.index])
                    result.append(insert.frame)
                    from = insert.index
                }
                result.append(contentsOf: frames[from...])
                frames = result
            }
        }
        if version.dominates(delta.since) { version.merge(delta.version) }
    }

    /// Removes tombstones whose delete is older than `horizon`.
    ///
    /// Only safe once every replica has seen those deletes: a replica that has not would keep its live
    /// copy, and could send it back. The server pairs its purge horizon with `CHANGE_TOKEN_EXPIRED`.
    public mutating func purgeTombstones(deletedBefore horizon: HLC) {
        frames = frames.filter { frame in
            frame.withUnsafeBytes { p in
                guard let deletion = FrameHeader(p).deletion else { return true }
                return deletion.hlc >= horizon
            }
        }
    }

    // MARK: Internals

    private enum Position { case found(Int), insert(Int) }

    private func find(_ recordName: String) -> Position {
        var name = recordName
        return name.withUTF8 { utf8 in
            let key = UnsafeRawBufferPointer(utf8)
            var low = 0, high = frames.count
            while low < high {
                let mid = (low + high) / 2
                let order = frames[mid].withUnsafeBytes { p in
                    EncodedOrder.compare(p, ZoneState.nameRange(p), key, 0..<key.count)
                }
                if order == 0 { return .found(mid) }
                if order < 0 { low = mid + 1 } else { high = mid }
            }
            return .insert(low)
        }
    }

    private func record(at index: Int) -> Record {
        // Stored frames were validated on the way in, so decoding cannot fail.
        guard let record = try? ZoneState.decodeFrame(frames[index], 0..<frames[index].count, zoneID: zoneID) else {
            preconditionFailure("stored frame does not decode")
        }
        return record
    }

    private mutating func store(_ record: Record, at position: Position) throws(RecordError) {
        var writer = BinaryWriter(capacity: 256)
        try writer.frame(record)
        let frame = writer.finish()
        switch position {
        case .found(let index): frames[index] = frame
        case .insert(let index): frames.insert(frame, at: index)
        }
    }

    @inline(__always)
    static func nameRange(_ frame: UnsafeRawBufferPointer) -> Range<Int> {
        var cursor = ByteCursor(frame, at: 4)
        return cursor.string()
    }

    static func decodeFrame(_ bytes: [UInt8], _ range: Range<Int>, zoneID: ZoneID) throws(CodecError) -> Record {
        do {
            return try bytes.withUnsafeBytes { raw throws in
                var reader = BinaryReader(raw)
                reader.offset = range.lowerBound
                return try reader.frame(zoneID: zoneID)
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "record", offset: range.lowerBound)
        }
    }

    private static func decodeOwn(_ bytes: [UInt8]) -> ZoneDelta {
        guard let delta = try? BinaryCodec.decodeDelta(bytes) else { preconditionFailure("own encoding does not decode") }
        return delta
    }

    private func assemble(since: VersionVector, count: Int, body: UnsafeRawBufferPointer) -> [UInt8] {
        var writer = BinaryWriter(capacity: body.count + 256)
        writeHeader(into: &writer, since: since, count: count)
        writer.append(body)
        return writer.finish()
    }

    private func writeHeader(into writer: inout BinaryWriter, since: VersionVector, count: Int) {
        writer.header(kind: BinaryCodec.deltaKind)
        writer.zoneID(zoneID)
        writer.versionVector(since)
        writer.versionVector(version)
        writer.varint(UInt64(count))
    }

    /// Appends the part of one frame that `since` does not reflect; returns false when there is none.
    @inline(__always)
    static func appendChanges(of p: UnsafeRawBufferPointer, since: VersionVector, to out: inout BinaryWriter) -> Bool {
        let header = FrameHeader(p)
        if !since.covers(header.created) || header.deletion.map({ !since.covers($0) }) == true {
            out.append(p)
            return true
        }
        if header.deletion != nil { return false }
        let parentChanged = header.parentWhole != nil && !since.covers(header.parentStamp)
        var changed = 0
        var cursor = ByteCursor(p, at: header.fieldsStart)
        for _ in 0..<header.fieldCount {
            let field = FieldView(&cursor)
            if field.isSet ? EncodedOrder.exceeds(p, field.context, since) : !since.covers(field.stamp) { changed += 1 }
        }
        if changed == 0 && !parentChanged { return false }
        if changed == header.fieldCount && (parentChanged || header.parentWhole == nil) {
            out.append(p)
            return true
        }
        let lengthAt = out.count
        out.u32(0)
        out.append(p, 4..<header.createdWhole.upperBound)
        out.u8(parentChanged ? 2 : 0)
        if parentChanged { out.append(p, header.parentWhole!) }
        out.varint(UInt64(changed))
        cursor = ByteCursor(p, at: header.fieldsStart)
        for _ in 0..<header.fieldCount {
            let field = FieldView(&cursor)
            if field.isSet ? EncodedOrder.exceeds(p, field.context, since) : !since.covers(field.stamp) {
                out.append(p, field.whole)
            }
        }
        out.patchU32(UInt32(out.count - lengthAt - 4), at: lengthAt)
        return true
    }
}

/// A zone-level operation was refused.
public enum ZoneError: Error, Hashable, Sendable, CustomStringConvertible {
    case recordExists(String)
    case recordNotFound(String)
    case wrongZone(expected: ZoneID, got: ZoneID)

    public var description: String {
        switch self {
        case .recordExists(let name): return "record \(name) already exists"
        case .recordNotFound(let name): return "record \(name) does not exist"
        case let .wrongZone(expected, got): return "delta for zone \(got) cannot merge into zone \(expected)"
        }
    }
}
