import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// A participant's `deltas/push` may touch only records inside their shares, with write access, and never a
/// share's root placement or deletion nor a share record: every cell answers as the same CRDT state sent as
/// JSON `forceUpdate` through `records/modify`, and a refused cell changes nothing the owner sees.
@Suite struct DeltaSharingTests {
    enum Target: String, CaseIterable {
        case editInShare, editRoot, editOutside, newChild, newOrphan, moveOut, deleteChild, deleteRoot, shareRecord

        /// What the cell must answer (for rows that reach the zone at all).
        func expected(_ row: MatrixRow) -> String {
            if row.isOwner { return self == .shareRecord ? "BAD_REQUEST" : "OK" }
            if !row.isActive { return "ZONE_NOT_FOUND" }
            switch self {
            // Outside the share: judged as a missing name, so a state with no parent inside the share (a new
            // orphan's answer, not NOT_FOUND: a pushed state makes a missing record).
            case .editOutside, .newOrphan, .moveOut, .deleteRoot, .shareRecord: return "PERMISSION_FAILURE"
            case .editInShare, .editRoot, .newChild, .deleteChild: return row.readWrite ? "OK" : "PERMISSION_FAILURE"
            }
        }
    }

    /// Two identical worlds: one takes each cell's state as JSON, the other in binary.
    struct Worlds {
        let json: MatrixWorld
        let binary: MatrixWorld
        var devices: [String: DeviceStates] = [:]

        init() throws {
            json = try MatrixWorld()
            binary = try MatrixWorld()
        }
    }

    private static func prefix(_ zone: String) -> String { zone == MatrixWorld.pub ? "P" : "L" }

    private func zoneID(_ w: MatrixWorld, _ zone: String) throws -> ZoneID {
        try ZoneID(zoneName: zone, ownerRecordName: w.ann.recordName)
    }

    /// The owner's current state of a record, as a device that fetched it holds it.
    private func ownerState(_ w: MatrixWorld, _ zone: String, _ name: String) throws -> Record {
        let view = w.ownerView(zone, name)
        guard view["serverErrorCode"] == nil else { throw HarnessError("no \(name) in \(zone): \(view.serialized())") }
        return try Record(cloudKitJSON: view, zoneID: try zoneID(w, zone))
    }

    /// The record a cell is about, prepared by the owner (fresh records keep the cells independent).
    private func prepare(_ w: MatrixWorld, _ target: Target, zone: String, k: Int) throws -> String {
        let p = Self.prefix(zone)
        switch target {
        case .editInShare, .moveOut, .deleteChild:
            let name = "F\(k)"
            let made = w.owner("records/modify", zone, ["operations": .array([
                operation("create", name, fields: ["title": value(.string("fresh"))], extra: parentRef("\(p)-child")),
            ])])
            guard matrixCode(made) == "OK" else { throw HarnessError("prepare \(name): \(made.json.serialized())") }
            return name
        case .editRoot, .deleteRoot: return "\(p)-root"
        case .editOutside: return "\(p)-outside"
        case .newChild, .newOrphan: return "N\(k)"
        case .shareRecord:
            return try #require(w.shareView(zone)["shareRecordName"]?.stringValue, "\(w.shareView(zone).serialized())")
        }
    }

    /// The state the caller's device sends for a cell.
    private func state(_ w: MatrixWorld, _ target: Target, zone: String, name: String, k: Int,
                       device: inout DeviceStates) throws -> Record {
        let p = Self.prefix(zone)
        switch target {
        case .editInShare, .editRoot, .editOutside:
            return try device.setting(try ownerState(w, zone, name), "n", to: .int64(Int64(k)))
        case .moveOut:
            var record = try ownerState(w, zone, name)
            device.observe(record)
            try record.setParent(try Reference(recordName: "\(p)-outside"), at: device.stamp())
            return record
        case .deleteChild, .deleteRoot:
            var record = try ownerState(w, zone, name)
            device.observe(record)
            record.delete(at: device.stamp())
            return record
        case .newChild: return try device.make(name, fields: ["n": .int64(Int64(k))], parent: "\(p)-child")
        case .newOrphan: return try device.make(name, fields: ["n": .int64(Int64(k))])
        case .shareRecord: return try device.make(name, type: "Share", fields: ["n": .int64(Int64(k))])
        }
    }

    private func sendJSON(_ w: MatrixWorld, _ row: MatrixRow, zone: String, _ records: [Record],
                          atomic: Bool = true) -> ServiceHarness.Reply {
        let body: [String: JSON] = [
            "atomic": .bool(atomic),
            "operations": .array(records.map { .object(["operationType": .string("forceUpdate"), "record": $0.cloudKitJSON]) }),
        ]
        return row.isOwner ? w.owner("records/modify", zone, body) : w.shared("records/modify", zone, body, as: row.account)
    }

    private func sendBinary(_ w: MatrixWorld, _ row: MatrixRow, zone: String, _ records: [Record],
                            atomic: Bool = true) throws -> ServiceHarness.Reply {
        w.h.push(try DeltaBytes.push(try zoneID(w, zone), records, atomic: atomic), token: w.token(row.account),
                 database: row.database)
    }

    @Test func everyCellAnswersAsRecordsModifyDoesAndRefusalsChangeNothing() throws {
        var worlds = try Worlds()
        let rows = MatrixRow.all.filter { $0.caller != .removed || $0.permission == .readWrite }
        var k = 0
        var table: [String] = []
        for row in rows {
            var line: [String] = []
            for target in Target.allCases {
                if row.isOwner && target == .deleteRoot { continue } // deletes the share: ownerDeletesARootByPush
                k += 1
                let zone = row.home
                var answers: [String] = []
                for (label, w) in [("JSON", worlds.json), ("binary", worlds.binary)] {
                    let name = try prepare(w, target, zone: zone, k: k)
                    let key = "\(label)|\(row.account)"
                    var device = try worlds.devices[key]
                        ?? DeviceStates(zoneID: zoneID(w, zone), replica: UInt64(0x100 + worlds.devices.count), clock: w.h.clock)
                    let record = try state(w, target, zone: zone, name: name, k: k, device: &device)
                    worlds.devices[key] = device
                    let before = w.ownerView(zone, name)
                    let reply = try label == "JSON" ? sendJSON(w, row, zone: zone, [record])
                                                    : sendBinary(w, row, zone: zone, [record])
                    let code = matrixCode(reply)
                    answers.append(code)
                    let after = w.ownerView(zone, name)
                    if code == "OK" {
                        #expect(after != before, "\(label) \(row.label) \(target): accepted but nothing changed")
                        if target == .deleteChild { #expect(itemCode(after) == "NOT_FOUND") }
                        if target == .editInShare || target == .newChild {
                            #expect(after["fields"]?["n"]?["value"]?.intValue == Int64(k), "\(label) \(row.label) \(target)")
                        }
                    } else {
                        #expect(after == before, "\(label) \(row.label) \(target) refused but changed: \(after.serialized())")
                    }
                }
                let expected = target.expected(row)
                #expect(answers[0] == answers[1], "\(row.label) \(target): JSON \(answers[0]) but binary \(answers[1])")
                #expect(answers[1] == expected, "\(row.label) \(target): binary \(answers[1]), expected \(expected)")
                line.append("\(target.rawValue)=\(shortCode(answers[1]))")
            }
            table.append("\(row.label): " + line.joined(separator: " "))
        }
        print("[deltas/push sharing]\n" + table.joined(separator: "\n"))
        // The root is still where it was and still shared.
        for w in [worlds.json, worlds.binary] {
            #expect(itemCode(w.ownerView(MatrixWorld.lists, "L-root")) == "OK")
            #expect(w.shareView(MatrixWorld.lists)["serverErrorCode"] == nil)
        }
    }

    @Test func aParticipantsAtomicPushWithOneRecordOutsideTheShareWritesNothing() throws {
        let w = try MatrixWorld()
        let row = MatrixRow(caller: .privateUser, permission: .readWrite)
        let zone = MatrixWorld.lists
        var device = DeviceStates(zoneID: try zoneID(w, zone), replica: 0x77, clock: w.h.clock)
        let inside = try device.setting(try ownerState(w, zone, "L-child"), "n", to: .int64(1))
        let outside = try device.setting(try ownerState(w, zone, "L-outside"), "n", to: .int64(1))
        let child = try device.make("N-new", parent: "L-grand")
        let names = ["L-child", "L-outside", "N-new"]
        let before = names.map { w.ownerView(zone, $0) }
        let atomic = try sendBinary(w, row, zone: zone, [inside, outside, child], atomic: true)
        #expect(atomic.records.map(itemCode) == ["ATOMIC_ERROR", "PERMISSION_FAILURE", "ATOMIC_ERROR"], "\(atomic.json.serialized())")
        #expect(names.map { w.ownerView(zone, $0) } == before)
        // Not atomic: the records inside are written, the one outside is not.
        let partial = try sendBinary(w, row, zone: zone, [inside, outside, child], atomic: false)
        #expect(partial.records.map(itemCode) == ["OK", "PERMISSION_FAILURE", "OK"], "\(partial.json.serialized())")
        #expect(w.ownerView(zone, "L-child")["fields"]?["n"]?["value"]?.intValue == 1)
        #expect(w.ownerView(zone, "L-outside") == before[1])
        #expect(w.ownerView(zone, "N-new")["parent"]?["recordName"]?.stringValue == "L-grand")
        // Read-only, the same batch is refused per record.
        let readOnlyRow = MatrixRow(caller: .privateUser, permission: .readOnly)
        let readOnly = try sendBinary(w, readOnlyRow, zone: zone, [inside], atomic: false)
        #expect(readOnly.records.map(itemCode) == ["PERMISSION_FAILURE"])
        // Another owner's zone that is not shared with the caller, and the caller's own zone named in the
        // shared database: ZONE_NOT_FOUND, nothing written.
        var other = DeviceStates(zoneID: try zoneID(w, MatrixWorld.other), replica: 0x78, clock: w.h.clock)
        let unshared = w.h.push(try DeltaBytes.push(other.zoneID, [try other.make("O-new")]), token: w.token("priv-rw"),
                                database: "shared")
        #expect(unshared.status == 404 && unshared.code == "ZONE_NOT_FOUND", "\(unshared.json.serialized())")
        #expect(itemCode(w.ownerView(MatrixWorld.other, "O-new")) == "NOT_FOUND")
        let mine = try ZoneID(zoneName: Names.systemZoneName, ownerRecordName: w.account("priv-rw").recordName)
        var own = DeviceStates(zoneID: mine, replica: 0x79, clock: w.h.clock)
        let ownInShared = w.h.push(try DeltaBytes.push(mine, [try own.make("x")]), token: w.token("priv-rw"), database: "shared")
        #expect(ownInShared.code == "ZONE_NOT_FOUND", "\(ownInShared.json.serialized())")
    }

    @Test func ownerDeletesARootByPushAndTheShareGoesWithIt() throws {
        let w = try MatrixWorld()
        var device = DeviceStates(zoneID: try zoneID(w, MatrixWorld.pub), replica: 0x80, clock: w.h.clock)
        var root = try ownerState(w, MatrixWorld.pub, "P-root")
        device.observe(root)
        root.delete(at: device.stamp())
        let reply = try sendBinary(w, MatrixRow(caller: .owner, permission: nil), zone: MatrixWorld.pub, [root])
        #expect(matrixCode(reply) == "OK", "\(reply.json.serialized())")
        #expect(w.shareView(MatrixWorld.pub)["serverErrorCode"]?.stringValue == "NOT_FOUND")
        #expect(w.shared("records/lookup", MatrixWorld.pub, ["records": .array([])], as: "pub-rw").code == "ZONE_NOT_FOUND")
        let pulled = w.h.pull(["zoneID": w.zoneID(MatrixWorld.pub, shared: true)], token: w.token("pub-rw"), database: "shared")
        #expect(pulled.code == "ZONE_NOT_FOUND", "\(pulled.error)")
    }

    /// A participant's `deltas/pull` is their `changes/zone`: the share's own log, records that left it as
    /// removals, the same tokens; and nothing outside the share.
    @Test func aParticipantsPullIsTheirChangesZone() throws {
        let w = try MatrixWorld()
        let zone = MatrixWorld.lists
        let who = "priv-ro"
        func compare(_ syncToken: String?, limit: Int? = nil, _ label: String) throws
            -> (token: String?, names: [String], removed: [String]) {
            var request: [String: JSON] = ["zoneID": w.zoneID(zone, shared: true)]
            if let syncToken { request["syncToken"] = .string(syncToken) }
            if let limit { request["resultsLimit"] = .int(Int64(limit)) }
            let json = try #require(w.h.call("changes/zone", .object(["zones": .array([.object(request)])]), token: w.token(who),
                                             database: "shared").zones.first)
            let binary = w.h.pull(request, token: w.token(who), database: "shared")
            #expect(binary.status == 200, "\(label): \(binary.error)")
            let items = json["records"]?.arrayValue ?? []
            let removed = items.filter { $0["crdt"] == nil }.compactMap { $0["recordName"]?.stringValue }
            let present = items.filter { $0["crdt"] != nil }.compactMap { $0["recordName"]?.stringValue }
            #expect(binary.names == present.sorted(), "\(label)")
            #expect(binary.message?.removed == removed, "\(label)")
            #expect(binary.syncToken == json["syncToken"]?.stringValue, "\(label)")
            #expect(binary.moreComing == (json["moreComing"] == .bool(true)), "\(label)")
            for frame in binary.frames {
                let item = try #require(items.first { $0["recordName"]?.stringValue == frame.recordName })
                let zoneID = try ZoneID(zoneName: zone, ownerRecordName: w.ann.recordName)
                let encoded = try RecordFrame(encoding: try Record(cloudKitJSON: item, zoneID: zoneID))
                #expect(encoded.bytes == frame.bytes, "\(label)")
            }
            return (binary.syncToken, binary.names, binary.message?.removed ?? [])
        }
        let first = try compare(nil, "from nothing")
        let shareRecord = try #require(w.shareView(zone)["shareRecordName"]?.stringValue)
        #expect(Set(first.names) == ["L-root", "L-child", "L-grand", shareRecord], "\(first.names)")
        // The owner moves L-grand out and edits L-outside: one removal, nothing else.
        let moved = w.owner("records/modify", zone, ["operations": .array([
            operation("forceUpdate", "L-grand", recordType: nil, extra: parentRef("L-outside")),
            operation("forceUpdate", "L-outside", recordType: nil, fields: ["n": value(.int(1))]),
        ])])
        #expect(matrixCode(moved) == "OK")
        let second = try compare(first.token, "after a move out")
        #expect(second.names.isEmpty && second.removed == ["L-grand"], "\(second)")
        // Paged with known positions: own writes are skipped, the token still ends where changes/zone's does.
        _ = w.owner("records/modify", zone, ["operations": .array((0..<5).map {
            operation("create", "K\($0)", extra: parentRef("L-child"))
        })])
        var token = second.token
        var seen: [String] = []
        for page in 0..<10 {
            let result = try compare(token, limit: 2, "page \(page)")
            seen += result.names
            token = result.token
            if result.names.isEmpty && result.removed.isEmpty { break }
        }
        #expect(Set(seen) == Set((0..<5).map { "K\($0)" }), "\(seen)")
        // What is outside the share never comes, whatever known or limit says.
        let outside = w.h.pull(["zoneID": w.zoneID(zone, shared: true), "known": .array([.array([.int(0), .int(1_000_000)])])],
                               token: w.token(who), database: "shared")
        #expect(!outside.names.contains("L-outside") && !outside.skipped.contains("L-outside"),
                "\(outside.names) \(outside.skipped)")
    }
}
