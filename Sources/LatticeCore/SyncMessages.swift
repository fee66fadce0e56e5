/// The bodies of the binary sync path (`deltas/push`, `deltas/pull`; Docs/API.md), in the binary format
/// of Merge.md §7: the file header with its own kinds, a few fields, then an embedded zone delta whose
/// record frames are the stored frames themselves.
///
/// ```
/// push  = "LTC" 1 kind=3 string(clientOperationID, "" for none) flags:u8 (1 = atomic) delta-file
/// pull  = "LTC" 1 kind=4 string(syncToken) flags:u8 (1 = moreComing)
///         count:varint string(recordName)*        records that left what the caller may see
///         count:varint (string(rootRecordName) string(shareRecordName))*   hierarchy shares the caller lost
///         count:varint string(recordName)*        records left out as already held (`known` positions)
///         delta-file
/// delta-file = "LTC" 1 kind=2 delta               (Merge.md §7)
/// ```
public enum SyncMessage {
    /// The media type of both bodies; the version is the format version.
    public static let contentType = "application/vnd.lattice.delta; version=1"
    static let pushKind: UInt8 = 3
    static let pullKind: UInt8 = 4
    /// Bounds on the small fields, checked before anything is allocated for them.
    public static let maximumStringBytes = 4096

    /// A device's changes to one zone: CRDT states joined by the server, as `records/modify` joins them.
    public struct Push: Sendable, Equatable {
        public var clientOperationID: String?
        public var atomic: Bool
        /// A zone delta file (`BinaryCodec.encodeDelta`).
        public var delta: [UInt8]

        public init(clientOperationID: String?, atomic: Bool, delta: [UInt8]) {
            self.clientOperationID = clientOperationID
            self.atomic = atomic
            self.delta = delta
        }

        public func encoded() -> [UInt8] {
            var writer = BinaryWriter(capacity: 32 + delta.count)
            writer.header(kind: pushKind)
            writer.string(clientOperationID ?? "")
            writer.u8(atomic ? 1 : 0)
            writer.append(delta)
            return writer.finish()
        }

        /// Reads the envelope; the delta is validated separately (`EncodedDelta(validating:)`).
        public init(decoding bytes: [UInt8]) throws(CodecError) {
            var id = "", flags: UInt8 = 0, start = 0
            try SyncMessage.read(bytes, kind: pushKind, name: "a delta push") { (reader: inout BinaryReader) throws(CodecError) in
                id = try reader.boundedString("clientOperationID")
                flags = try reader.u8("push flags")
                guard flags & ~1 == 0 else { throw reader.fail(.malformed, "push flags") }
                start = reader.offset
            }
            clientOperationID = id.isEmpty ? nil : id
            atomic = flags & 1 != 0
            delta = Array(bytes[start...])
        }
    }

    /// A hierarchy share the caller lost: its root and its `cloudkit.share` record.
    public struct LostShare: Sendable, Hashable {
        public var rootRecordName: String
        public var shareRecordName: String

        public init(rootRecordName: String, shareRecordName: String) {
            self.rootRecordName = rootRecordName
            self.shareRecordName = shareRecordName
        }
    }

    /// A record of the page that is the root of a hierarchy share, and its share's record (CloudKit's `share`
    /// reference), in pages pulled with `shares` asked for.
    public struct SharedRoot: Sendable, Hashable {
        public var rootRecordName: String
        public var shareRecordName: String

        public init(rootRecordName: String, shareRecordName: String) {
            self.rootRecordName = rootRecordName
            self.shareRecordName = shareRecordName
        }
    }

    /// One page of a zone's changes for a device.
    public struct Pull: Sendable, Equatable {
        public var syncToken: String
        public var moreComing: Bool
        public var removed: [String]
        public var lostShares: [LostShare]
        /// Records changed in this page that the device already holds exactly (its own writes).
        public var skipped: [String]
        /// The page's records that are roots of hierarchy shares, with their share (only when the request
        /// asked for `shares`; a page without any is encoded as before).
        public var sharedRoots: [SharedRoot]
        public var delta: [UInt8]

        public init(syncToken: String, moreComing: Bool, removed: [String], lostShares: [LostShare], skipped: [String] = [],
                    sharedRoots: [SharedRoot] = [], delta: [UInt8]) {
            self.syncToken = syncToken
            self.moreComing = moreComing
            self.removed = removed
            self.lostShares = lostShares
            self.skipped = skipped
            self.sharedRoots = sharedRoots
            self.delta = delta
        }

        public func encoded() -> [UInt8] {
            var writer = BinaryWriter(capacity: 64 + delta.count + removed.count * 16)
            writer.header(kind: pullKind)
            writer.string(syncToken)
            // Flag 1: more pages come. Flag 2: the shared roots' list follows `skipped`.
            writer.u8((moreComing ? 1 : 0) | (sharedRoots.isEmpty ? 0 : 2))
            writer.varint(UInt64(removed.count))
            for name in removed { writer.string(name) }
            writer.varint(UInt64(lostShares.count))
            for share in lostShares {
                writer.string(share.rootRecordName)
                writer.string(share.shareRecordName)
            }
            writer.varint(UInt64(skipped.count))
            for name in skipped { writer.string(name) }
            if !sharedRoots.isEmpty {
                writer.varint(UInt64(sharedRoots.count))
                for root in sharedRoots {
                    writer.string(root.rootRecordName)
                    writer.string(root.shareRecordName)
                }
            }
            writer.append(delta)
            return writer.finish()
        }

        public init(decoding bytes: [UInt8]) throws(CodecError) {
            var token = "", flags: UInt8 = 0, lists: [[String]] = [], start = 0
            try SyncMessage.read(bytes, kind: pullKind, name: "a delta pull") { (reader: inout BinaryReader) throws(CodecError) in
                token = try reader.boundedString("syncToken")
                flags = try reader.u8("pull flags")
                guard flags & ~3 == 0 else { throw reader.fail(.malformed, "pull flags") }
                // removed, then lostShares (two names each), then skipped, then (flag 2) the shared roots (two each).
                for (list, namesPerItem) in [(0, 1), (1, 2), (2, 1), (3, 2)] where list < 3 || flags & 2 != 0 {
                    let count = try reader.count(minimumElementSize: 2 * namesPerItem,
                                                 list == 1 ? "lost share count" : list == 3 ? "shared root count" : "record name count")
                    // Flag 2 with no shared root would not encode back to the same bytes.
                    if list == 3 && count == 0 { throw reader.fail(.malformed, "an empty shared roots list") }
                    var names: [String] = []
                    names.reserveCapacity(count * namesPerItem)
                    for _ in 0..<(count * namesPerItem) { names.append(try reader.name(.recordName)) }
                    lists.append(names)
                }
                start = reader.offset
            }
            syncToken = token
            moreComing = flags & 1 != 0
            removed = lists[0]
            lostShares = stride(from: 0, to: lists[1].count, by: 2).map {
                LostShare(rootRecordName: lists[1][$0], shareRecordName: lists[1][$0 + 1])
            }
            skipped = lists[2]
            let roots = lists.count > 3 ? lists[3] : []
            sharedRoots = stride(from: 0, to: roots.count, by: 2).map {
                SharedRoot(rootRecordName: roots[$0], shareRecordName: roots[$0 + 1])
            }
            delta = Array(bytes[start...])
        }
    }

    private static func read(_ bytes: [UInt8], kind: UInt8, name: String,
                             _ body: (inout BinaryReader) throws(CodecError) -> Void) throws(CodecError) {
        do {
            try bytes.withUnsafeBytes { (raw: UnsafeRawBufferPointer) throws in
                var reader = BinaryReader(raw)
                try reader.header(kind: kind, name: name)
                try body(&reader)
            }
        } catch let error as CodecError {
            throw error
        } catch {
            throw CodecError(code: .malformed, context: "input", offset: 0)
        }
    }
}

extension SyncMessage {
    // The delta's own layout (Merge.md §7), walked leniently to point at the broken record.
    /// A validation error, with the record it is in when that can be told: "record 3 (milk): ...".
    public static func describe(_ error: CodecError, in delta: [UInt8]) -> String {
        // The record count is checked against the bytes left before any frame is read: it is in no record.
        guard !error.context.hasPrefix("record count"), let located = locate(error.offset, in: delta) else {
            return error.description
        }
        let name = located.name.map { " (\($0))" } ?? ""
        return "record \(located.index)\(name): \(error.description)"
    }

    /// Walks a delta's frames by their length prefixes only, to find the one holding `offset`.
    private static func locate(_ offset: Int, in delta: [UInt8]) -> (index: Int, name: String?)? {
        func varint(_ at: inout Int) -> Int? {
            var value = 0, shift = 0
            while at < delta.count, shift < 63 {
                let byte = Int(delta[at])
                at += 1
                value |= (byte & 0x7F) << shift
                if byte < 0x80 { return value }
                shift += 7
            }
            return nil
        }
        func skipString(_ at: inout Int) -> Bool {
            guard let length = varint(&at), length <= delta.count - at else { return false }
            at += length
            return true
        }
        var at = 5
        guard skipString(&at), skipString(&at) else { return nil }
        for _ in 0..<2 { // since and version
            guard let count = varint(&at), count <= delta.count else { return nil }
            for _ in 0..<count {
                guard varint(&at) != nil, at + 8 <= delta.count else { return nil }
                at += 8
            }
        }
        guard let count = varint(&at) else { return nil }
        for index in 0..<min(count, delta.count / 4) {
            // An error before the first frame (the header, the record count) is in no record.
            guard offset >= at, at + 4 <= delta.count else { return nil }
            let length = Int(delta[at]) | Int(delta[at + 1]) << 8 | Int(delta[at + 2]) << 16 | Int(delta[at + 3]) << 24
            let end = at + 4 + length
            if offset < end || end > delta.count {
                var nameAt = at + 4
                guard let nameLength = varint(&nameAt), nameLength <= 255, nameAt + nameLength <= delta.count,
                      let name = String(validating: delta[nameAt..<(nameAt + nameLength)], as: UTF8.self),
                      (try? Names.validate(name, kind: .recordName)) != nil else { return (index, nil) }
                return (index, name)
            }
            at = end
        }
        return nil
    }
}

extension BinaryReader {
    /// A string of at most `SyncMessage.maximumStringBytes`, refused on its declared length before its
    /// bytes are read.
    mutating func boundedString(_ context: String) throws(CodecError) -> String {
        let start = offset
        guard try varint(context) <= UInt64(SyncMessage.maximumStringBytes) else {
            throw CodecError(code: .tooLarge, context: context, offset: start)
        }
        offset = start
        return try string(context)
    }
}
