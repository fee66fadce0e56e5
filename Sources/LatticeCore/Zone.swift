import Foundation
import CMemoryHints

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
    /// The newest clock value in the delta's header and in every frame it carries that is new to the zone
    /// it was validated against (frames byte-identical to held ones were observed when they arrived).
    public let maximumHLC: HLC
    /// Byte ranges of the record frames, in name order.
    let frames: [Range<Int>]
    /// Byte ranges of the record names' UTF-8 payloads.
    let names: [Range<Int>]

    public var recordCount: Int { frames.count }

    /// - Parameter known: a zone whose stored frames are already valid: in a whole state (a delta since
    ///   the empty version), an incoming frame byte-identical to one of them is accepted without
    ///   re-checking its contents (whole-state imports repeat most records). Pass `nil` to check everything.
    /// - Throws: `CodecError` for anything that is not a canonical version-1 zone delta.
    public init(validating bytes: [UInt8], knownFrames known: ZoneState? = nil) throws(CodecError) {
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
                var knownIndex = 0
                // Only whole states (computed against the empty version) repeat most records byte for byte;
                // a delta carries what changed, so its frames are not looked up among the known ones.
                let knownFrames = since.isEmpty ? known?.frames ?? [] : []
                for _ in 0..<count {
                    let start = reader.offset
                    if let skipped = try ZoneState.skipKnownFrame(&reader, raw, knownFrames, &knownIndex) {
                        if let last = names.last, EncodedOrder.compare(raw, last, raw, skipped.name) >= 0 {
                            throw CodecError(code: .malformed, context: "delta (records not in name order)", offset: start)
                        }
                        frames.append(skipped.frame)
                        names.append(skipped.name)
                        continue
                    }
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
    fileprivate var frames: ContiguousArray<[UInt8]>

    public init(zoneID: ZoneID) {
        self.zoneID = zoneID
        self.version = VersionVector()
        self.frames = []
    }

    /// Number of records, tombstones included.
    public var count: Int { frames.count }

    /// Bytes of encoded record frames held (tombstones included): the zone's storage size.
    public var encodedSize: Int { frames.reduce(0) { $0 + $1.count } }

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

    /// What this state holds that `since` does not reflect, encoded, or `nil` when there is nothing to send
    /// (no record to send and `since` already covers this state's version).
    ///
    /// A record travels with its header and only the fields (and parent) that hold an operation `since`
    /// does not cover; a record created, recreated or deleted after `since` travels whole.
    public func encodedChanges(since: VersionVector) -> [UInt8]? {
        var records = 0
        let covering = Covering(since)
        let bytes = encode(since: since) { writer in
            frames.withUnsafeBufferPointer { all in
                for index in all.indices {
                    if index &+ ZoneState.prefetchDistance < all.count {
                        ZoneState.prefetch(all[index &+ ZoneState.prefetchDistance])
                    }
                    all[index].withUnsafeBytes { p in
                        if ZoneState.appendChanges(of: p, since: covering, to: &writer) { records += 1 }
                    }
                }
            }
            return records
        }
        // Nothing to send only when the receiver also knows every operation we know of; otherwise an
        // empty delta still carries our version, so versions converge along with the records.
        return records == 0 && since.dominates(version) ? nil : bytes
    }

    /// The whole state, encoded as a delta since nothing.
    public func encodedFullState() -> [UInt8] {
        encode(since: VersionVector()) { writer in
            for frame in frames { writer.append(frame) }
            return frames.count
        }
    }

    /// Writes a delta into one allocation bounded by the stored frames (a delta never exceeds them);
    /// `body` appends frames and returns how many.
    private func encode(since: VersionVector, _ body: (inout BinaryWriter) -> Int) -> [UInt8] {
        var header = BinaryWriter(capacity: 256)
        header.header(kind: BinaryCodec.deltaKind)
        header.zoneID(zoneID)
        header.versionVector(since)
        header.versionVector(version)
        var total = 0
        for frame in frames { total += frame.count }
        let bound = header.count + 10 + total
        return header.withWrittenBytes { prefix in
            [UInt8](unsafeUninitializedCapacity: bound) { buffer, initialized in
                var writer = BinaryWriter(into: UnsafeMutableRawBufferPointer(buffer), populating: true)
                writer.append(prefix)
                let countAt = writer.countPlaceholder(upTo: frames.count)
                let count = body(&writer)
                writer.patchCount(count, at: countAt.offset, width: countAt.width)
                initialized = writer.count
            }
        }
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

    /// Validates received bytes (reusing this zone's frames, see `EncodedDelta(validating:knownFrames:)`)
    /// and joins them: the path a server or client takes for every delta it receives.
    /// - Throws: `CodecError`, `ClockError` or `ZoneError`; on any error nothing is merged.
    public mutating func merge(encoded bytes: [UInt8], clock: inout HybridLogicalClock) throws {
        try merge(EncodedDelta(validating: bytes, knownFrames: self), clock: &clock)
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
            var scratch = BinaryWriter(capacity: 4096)
            var index = 0
            frames.withUnsafeMutableBufferPointer { stored in
                for (frameRange, nameRange) in zip(delta.frames, delta.names) {
                    var order = 1
                    while index < stored.count {
                        if index &+ ZoneState.prefetchDistance < stored.count {
                            ZoneState.prefetch(stored[index &+ ZoneState.prefetchDistance])
                        }
                        order = stored[index].withUnsafeBytes { p in
                            EncodedOrder.compare(p, ZoneState.nameRange(p), q, nameRange)
                        }
                        if order >= 0 { break }
                        index += 1
                    }
                    let incoming = UnsafeRawBufferPointer(rebasing: q[frameRange])
                    if index < stored.count && order == 0 {
                        FrameMerge.merge(into: &stored[index], incoming, scratch: &scratch)
                        index += 1
                    } else {
                        inserts.append((index, FrameStorage.make(incoming)))
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

    /// How many frames ahead the frame walks (export, join) ask for the next frames' memory. Each frame
    /// is its own heap block, so the hardware cannot guess where the next one is; without the hint the
    /// walk waits for each frame in turn.
    static let prefetchDistance = 4

    /// Hints the CPU to load the first `prefetchLines` cache lines of `frame` (a typical frame; lines past
    /// its end are harmless, a prefetch never faults). Its length is not read: that read would itself
    /// wait for the memory the hint is for.
    @inline(__always)
    static func prefetch(_ frame: [UInt8]) {
        frame.withUnsafeBufferPointer { p in
            guard let base = p.baseAddress else { return }
            for line in 0..<prefetchLines { lattice_prefetch(UnsafeRawPointer(base) + (line &* 64 &- 32)) }
        }
    }

    static let prefetchLines = 6

    /// If the frame at the reader is byte-identical to a known (stored, hence valid) frame, moves past
    /// it and returns its ranges; otherwise leaves the reader where it was. `index` walks `known` in
    /// name order alongside the delta.
    fileprivate static func skipKnownFrame(_ reader: inout BinaryReader, _ raw: UnsafeRawBufferPointer,
                                           _ known: ContiguousArray<[UInt8]>, _ index: inout Int)
        throws(CodecError) -> (frame: Range<Int>, name: Range<Int>)? {
        guard !known.isEmpty, reader.remaining >= 5 else { return nil }
        let start = reader.offset
        let length = Int(raw.loadUnaligned(fromByteOffset: start, as: UInt32.self).littleEndian)
        guard length >= 1, length <= reader.remaining - 4 else { return nil } // `incoming[4]` below needs a body byte
        let frame = start..<(start + 4 + length)
        let incoming = UnsafeRawBufferPointer(rebasing: raw[frame])
        var cursor = ByteCursor(incoming, at: 4)
        let first = incoming[4]
        guard first < 0x80, 5 + Int(first) <= incoming.count else { return nil } // names are < 128 bytes
        let name = cursor.string()
        while index < known.count {
            let order = known[index].withUnsafeBytes { p in EncodedOrder.compare(p, nameRange(p), incoming, name) }
            if order > 0 { return nil }
            if order == 0 { break }
            index += 1
        }
        guard index < known.count else { return nil }
        let identical = known[index].withUnsafeBytes { p in
            p.count == incoming.count && memcmp(p.baseAddress!, incoming.baseAddress!, p.count) == 0
        }
        guard identical else { return nil }
        reader.offset = frame.upperBound
        return (frame, (name.lowerBound + start)..<(name.upperBound + start))
    }

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

    /// Re-encodes a locally edited record. The write limit is 1 MiB, or the current size of a record that
    /// merges made larger (so an edit may still shrink it).
    private mutating func store(_ record: Record, at position: Position) throws(RecordError) {
        var limit = Record.maximumEncodedSize
        if case .found(let index) = position { limit = max(limit, frames[index].count - 4) }
        var writer = BinaryWriter(capacity: 256)
        try writer.frame(record, limit: limit)
        let frame = writer.withWrittenBytes(FrameStorage.make)
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

    /// Appends the part of one frame that `since` does not reflect; returns false when there is none.
    ///
    /// Runs over every stored frame on each export, so it reads raw addresses (`Raw`) and writes
    /// nothing until it finds the first change: an unchanged frame costs one pass over its stamps.
    @inline(__always)
    static func appendChanges(of frame: UnsafeRawBufferPointer, since: Covering, to out: inout BinaryWriter) -> Bool {
        let p = frame.baseAddress!
        var i = 4
        i &+= Int(truncatingIfNeeded: Raw.varint(p, &i)) // name
        i &+= Int(truncatingIfNeeded: Raw.varint(p, &i)) // type
        _ = Raw.varint(p, &i)                            // generation
        let created = Raw.stamp(p, &i)
        let headerEnd = i
        let flags = Raw.u8(p, i)
        i &+= 1
        if flags & 1 != 0 { // a tombstone travels whole when its deletion is new
            let deletion = Raw.stamp(p, &i)
            guard !since.covers(created) || !since.covers(deletion) else { return false }
            out.append(frame)
            return true
        }
        if !since.covers(created) {
            out.append(frame)
            return true
        }
        var parentChanged = false
        let parentStart = i
        if flags & 2 != 0 {
            parentChanged = !since.covers(Raw.stamp(p, &i))
            i = Raw.valueEnd(p, i)
        }
        let parentEnd = i
        let fieldCount = Int(truncatingIfNeeded: Raw.varint(p, &i))
        var changed = 0
        var started = false
        var start = 0, countAt = 0
        out.writeDirect(reserving: frame.count) { w in
            start = w.count
            @inline(__always) func begin() {
                started = true
                w.u32(0)
                w.copy(p, 4, headerEnd)
                w.u8(parentChanged ? 2 : 0)
                if parentChanged { w.copy(p, parentStart, parentEnd) }
                countAt = w.placeholder()
            }
            if parentChanged { begin() }
            for _ in 0..<fieldCount {
                let field = RawField(p, at: i)
                i = field.end
                var isNew: Bool
                if field.kind != 0 { // a set, list or text: its payload starts with its context
                    var j = field.payload
                    let entries = Int(truncatingIfNeeded: Raw.varint(p, &j))
                    isNew = false
                    for _ in 0..<entries {
                        let replica = Raw.varint(p, &j)
                        let hlc = Raw.u64(p, j)
                        j &+= 8
                        if !since.covers(replica: replica, hlc: hlc) { isNew = true; break }
                    }
                } else {
                    var j = field.payload
                    isNew = !since.covers(Raw.stamp(p, &j))
                }
                guard isNew else { continue }
                if !started { begin() }
                changed &+= 1
                w.copy(p, field.start, field.end)
            }
        }
        guard started else { return false }
        if changed == fieldCount && (parentChanged || flags & 2 == 0) { // everything changed: the frame as it is
            out.truncate(to: start)
            out.append(frame)
            return true
        }
        out.patchCount(changed, at: countAt)
        out.patchU32(UInt32(out.count - start - 4), at: start)
        return true
    }
}

/// A version vector read once for many coverage checks (an export checks every stamp of every frame).
/// Vectors of up to two replicas, the common case, are kept inline.
struct Covering {
    private let entries: [VersionVector.Entry]
    private let count: Int
    private let r0: UInt64, h0: UInt64, r1: UInt64, h1: UInt64

    init(_ vector: VersionVector) {
        entries = vector.entries
        count = entries.count
        r0 = count > 0 ? entries[0].replica.rawValue : 0
        h0 = count > 0 ? entries[0].hlc.rawValue : 0
        r1 = count > 1 ? entries[1].replica.rawValue : 0
        h1 = count > 1 ? entries[1].hlc.rawValue : 0
    }

    @inline(__always) func covers(_ stamp: Stamp) -> Bool {
        covers(replica: stamp.replica.rawValue, hlc: stamp.hlc.rawValue)
    }

    /// True when the vector holds `replica` at `hlc` or later (entries are sorted by replica).
    @inline(__always) func covers(replica: UInt64, hlc: UInt64) -> Bool {
        if count <= 2 {
            if count > 0 && replica == r0 { return hlc <= h0 }
            return count > 1 && replica == r1 && hlc <= h1
        }
        return entries.withUnsafeBufferPointer { table in
            var low = 0, high = table.count // bisection: O(log n) for any size of vector
            while low < high {
                let middle = (low &+ high) >> 1
                let current = table[middle].replica.rawValue
                if current == replica { return hlc <= table[middle].hlc.rawValue }
                if current < replica { low = middle &+ 1 } else { high = middle }
            }
            return false
        }
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
