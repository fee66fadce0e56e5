import Foundation
import Testing
@testable import LatticeCore
@testable import LatticeServer
import LatticeStore

@Suite struct ZZPerfScratch {
    @Test func pushCost() throws {
        let dir = NSTemporaryDirectory() + "zzperf-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let storage = try SQLiteStorage(path: dir + "/s.sqlite")
        var config = ServiceConfiguration()
        config.rateLimit = nil
        let service = try LatticeService(storage: storage, configuration: config, log: { _ in })
        let signup = service.respond(to: HTTPRequest(method: "POST", path: "/auth/signup", body: Array(#"{"name":"perf"}"#.utf8)))
        let json = try JSON.parse(signup.body)
        let token = json["token"]!.stringValue!, owner = json["userRecordName"]!.stringValue!
        let base = "/database/1/lattice/production/private/"
        func call(_ op: String, _ body: [UInt8], type: String = "application/json") -> HTTPResponse {
            service.respond(to: HTTPRequest(method: "POST", path: base + op, headers: ["Authorization": "Bearer " + token, "Content-Type": type], body: body))
        }
        _ = call("zones/modify", Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Z"}}}]}"#.utf8))
        let zoneID = try ZoneID(zoneName: "Z", ownerRecordName: owner)
        var clock = HybridLogicalClock(replica: ReplicaID(7), time: { UInt64(Date().timeIntervalSince1970 * 1000) })
        var bodies: [[UInt8]] = []
        for round in 0..<150 {
            var frames: [RecordFrame] = []
            for i in 0..<200 {
                var edit = try RecordEdit(creating: RecordID(recordName: "r\(round)-\(i)", zoneID: zoneID), recordType: "Item", at: clock.now())
                try edit.set("name", to: .string("item \(i)"), at: clock.now())
                try edit.set("n", to: .int64(Int64(i)), at: clock.now())
                try edit.add([.string("alpha"), .string("tag\(i)")], to: "tags", at: clock.now())
                frames.append(try edit.applied()!)
            }
            bodies.append(SyncMessage.Push(clientOperationID: UUID().uuidString, atomic: false, delta: BinaryCodec.encodeDelta(zoneID: zoneID, frames: frames)).encoded())
        }
        let start = Date()
        for body in bodies {
            let r = call("deltas/push", body, type: SyncMessage.contentType)
            precondition(r.status == 200, String(decoding: r.body, as: UTF8.self))
        }
        let elapsed = Date().timeIntervalSince(start)
        print("PUSH in-process: \(elapsed / 150 * 1000) ms per 200-record push, \(30000 / elapsed) records/s")
    }
}
