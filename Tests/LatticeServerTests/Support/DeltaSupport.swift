import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import Testing

// Support for the binary sync path tests (`deltas/push`, `deltas/pull`): CRDT states made as a device
// makes them, delta and envelope bytes (well formed and deliberately broken), and calls to the service.

/// Makes CRDT states as a device does: its own replica, and a clock that follows the server's (so stamps
/// pass the drift check). `observe` a state before editing it so the edit is newer than what it saw.
struct DeviceStates {
    let zoneID: ZoneID
    var clock: HybridLogicalClock

    init(zoneID: ZoneID, replica: UInt64, clock serverClock: TestClock) {
        self.zoneID = zoneID
        clock = HybridLogicalClock(replica: ReplicaID(replica), time: { UInt64(serverClock.now) })
    }

    mutating func stamp() -> Stamp { clock.now() }

    mutating func observe(_ record: Record) { try? clock.observe(record.maximumHLC) }

    /// A new record with scalar fields, a `tags` list and a parent.
    mutating func make(_ name: String, type: String = "Item", fields: [String: ScalarValue] = [:], tags: [String] = [],
                       parent: String? = nil) throws -> Record {
        var record = try Record(id: RecordID(recordName: name, zoneID: zoneID), recordType: type, createdAt: stamp())
        for key in fields.keys.sorted() { try record.set(key, to: fields[key]!, at: stamp()) }
        for tag in tags { try record.add(.string(tag), to: "tags", at: stamp()) }
        if let parent { try record.setParent(try Reference(recordName: parent), at: stamp()) }
        return record
    }

    /// `record` after this device saw it and set one field.
    mutating func setting(_ record: Record, _ field: String, to value: ScalarValue?) throws -> Record {
        observe(record)
        var copy = record
        try copy.set(field, to: value, at: stamp())
        return copy
    }
}

/// Delta files and push envelopes, and surgery on them.
enum DeltaBytes {
    static func delta(_ zoneID: ZoneID, _ records: [Record]) throws -> [UInt8] {
        BinaryCodec.encodeDelta(zoneID: zoneID, frames: try records.map { try RecordFrame(encoding: $0) })
    }

    static func push(_ delta: [UInt8], atomic: Bool = true, id: String? = nil) -> [UInt8] {
        SyncMessage.Push(clientOperationID: id, atomic: atomic, delta: delta).encoded()
    }

    static func push(_ zoneID: ZoneID, _ records: [Record], atomic: Bool = true, id: String? = nil) throws -> [UInt8] {
        push(try delta(zoneID, records), atomic: atomic, id: id)
    }

    private static func varint(_ bytes: [UInt8], _ at: inout Int) -> Int {
        var value = 0, shift = 0
        while true {
            let byte = Int(bytes[at])
            at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80 { return value }
            shift += 7
        }
    }

    private static func skipString(_ bytes: [UInt8], _ at: inout Int) {
        let length = varint(bytes, &at)
        at += length
    }

    /// A well-formed delta's layout: where its frames begin, and each frame's bytes (length prefix included).
    static func layout(_ delta: [UInt8]) -> (head: Int, frames: [Range<Int>]) {
        var at = 5
        skipString(delta, &at)
        skipString(delta, &at)
        for _ in 0..<2 { // since, version
            let count = varint(delta, &at)
            for _ in 0..<count {
                _ = varint(delta, &at)
                at += 8
            }
        }
        let count = varint(delta, &at)
        let head = at
        var frames: [Range<Int>] = []
        for _ in 0..<count {
            let length = Int(delta[at]) | Int(delta[at + 1]) << 8 | Int(delta[at + 2]) << 16 | Int(delta[at + 3]) << 24
            frames.append(at..<(at + 4 + length))
            at += 4 + length
        }
        precondition(at == delta.count, "not a well-formed delta")
        return (head, frames)
    }

    /// The delta with its frames in `order` (indexes of the name-ordered frames).
    static func reordered(_ delta: [UInt8], _ order: [Int]) -> [UInt8] {
        let (head, frames) = layout(delta)
        var bytes = Array(delta[..<head])
        for index in order { bytes += delta[frames[index]] }
        return bytes
    }

    /// Offset, in the delta, of frame `index`'s record flags byte (after its name, type, generation and
    /// creation stamp). Only bits 1 and 2 may be set there.
    static func flagsOffset(_ delta: [UInt8], frame index: Int) -> Int {
        var at = layout(delta).frames[index].lowerBound + 4
        skipString(delta, &at) // name
        skipString(delta, &at) // type
        _ = varint(delta, &at) // generation
        at += 8                // creation hlc
        _ = varint(delta, &at) // creation replica
        return at
    }

    /// Frame `index` rewritten so that its parent reference (to `parent`) names another zone, which a
    /// canonical frame never does. The frame's length prefix is fixed up; everything else is as it was.
    static func withForeignParent(_ delta: [UInt8], frame index: Int, parent: String, zone: ZoneID) -> [UInt8] {
        let (head, frames) = layout(delta)
        var frame = Array(delta[frames[index]])
        let name = Array(parent.utf8)
        let needle = [ValueType.reference.rawValue, UInt8(name.count)] + name + [0]
        guard let start = (0...(frame.count - needle.count)).first(where: { Array(frame[$0..<($0 + needle.count)]) == needle })
        else { preconditionFailure("no parent reference to \(parent) in frame \(index)") }
        let flags = start + needle.count - 1
        frame[flags] = 1
        var zoneBytes: [UInt8] = []
        for text in [zone.zoneName, zone.ownerRecordName] { zoneBytes += [UInt8(text.utf8.count)] + Array(text.utf8) }
        frame.insert(contentsOf: zoneBytes, at: flags + 1)
        let length = UInt32(frame.count - 4)
        for byte in 0..<4 { frame[byte] = UInt8(truncatingIfNeeded: length >> (8 * UInt32(byte))) }
        var bytes = Array(delta[..<head])
        for (position, range) in frames.enumerated() { bytes += position == index ? frame : Array(delta[range]) }
        return bytes
    }
}

/// One answer of `deltas/pull`: the decoded page on success, the JSON error otherwise.
struct PulledPage {
    let status: Int
    let contentType: String?
    let error: JSON
    let message: SyncMessage.Pull?
    let frames: [RecordFrame]

    var code: String? { error["serverErrorCode"]?.stringValue }
    var names: [String] { frames.map(\.recordName) }
    var syncToken: String? { message?.syncToken }
    var moreComing: Bool { message?.moreComing ?? false }
    var skipped: [String] { message?.skipped ?? [] }
}

extension ServiceHarness {
    static func databasePath(_ database: String, _ operation: String) -> String {
        "/database/1/lattice/production/\(database)/\(operation)"
    }

    /// `deltas/push` with a binary body.
    func push(_ body: [UInt8], token: String?, database: String = "private",
              contentType: String? = SyncMessage.contentType) -> Reply {
        var headers: [String: String] = [:]
        if let contentType { headers["Content-Type"] = contentType }
        return raw("POST", Self.databasePath(database, "deltas/push"), body: body, token: token, headers: headers)
    }

    /// `deltas/pull` with a JSON body.
    func pull(_ body: [String: JSON], token: String?, database: String = "private",
              sourceLocation: SourceLocation = #_sourceLocation) -> PulledPage {
        let reply = raw("POST", Self.databasePath(database, "deltas/pull"), body: JSON.object(body).serializedBytes(),
                        token: token, headers: ["Content-Type": "application/json"])
        let type = reply.response.header("Content-Type")
        guard reply.status == 200 else {
            return PulledPage(status: reply.status, contentType: type, error: reply.json, message: nil, frames: [])
        }
        do {
            let message = try SyncMessage.Pull(decoding: reply.response.body)
            let delta = try EncodedDelta(validating: message.delta)
            return PulledPage(status: 200, contentType: type, error: .null, message: message, frames: delta.recordFrames())
        } catch {
            Issue.record("deltas/pull answered bytes that do not decode: \(error)", sourceLocation: sourceLocation)
            return PulledPage(status: 200, contentType: type, error: .null, message: nil, frames: [])
        }
    }

    /// `changes/zone` for one zone: the zone's item.
    func zonePage(_ zoneID: JSON, syncToken: String? = nil, limit: Int? = nil, token: String,
                  database: String = "private") -> JSON {
        var request: [String: JSON] = ["zoneID": zoneID]
        if let syncToken { request["syncToken"] = .string(syncToken) }
        if let limit { request["resultsLimit"] = .int(Int64(limit)) }
        return call("changes/zone", .object(["zones": .array([.object(request)])]), token: token, database: database)
            .zones.first ?? .null
    }

    func lookup(_ zoneID: JSON, _ names: [String], token: String, database: String = "private") -> [JSON] {
        call("records/lookup", .object(["zoneID": zoneID, "records": .array(names.map { .object(["recordName": .string($0)]) })]),
             token: token, database: database).records
    }

    /// What a zone holds and where its logs stand, as its owner sees them: the whole change feed of the zone
    /// with its token, the lookup of each named record, and the database log's token. Equal snapshots mean
    /// nothing was written.
    func snapshot(_ zone: String, names: [String], token: String) -> JSON {
        let zoneID: JSON = .object(["zoneName": .string(zone)])
        var records: [JSON] = []
        var syncToken: String?
        for _ in 0..<100 {
            let page = zonePage(zoneID, syncToken: syncToken, limit: 200, token: token)
            records += page["records"]?.arrayValue ?? []
            syncToken = page["syncToken"]?.stringValue
            if page["moreComing"] != .bool(true) { break }
        }
        return .object([
            "feed": .array(records), "zoneToken": syncToken.map(JSON.string) ?? .null,
            "lookups": .array(lookup(zoneID, names, token: token)),
            "databaseToken": call("changes/database", token: token)["syncToken"] ?? .null,
        ])
    }

    /// The position in a zone's log that a zone token names.
    func position(_ syncToken: String?) throws -> Int64 {
        try SyncToken(text: try #require(syncToken), expected: .zone).position
    }
}

/// A lookup or feed item without what the server stamps on a write (change tag, created, modified).
func withoutServerStamps(_ item: JSON) -> JSON {
    guard case .object(var object) = item else { return item }
    for key in ["recordChangeTag", "created", "modified"] { object[key] = nil }
    return .object(object)
}
