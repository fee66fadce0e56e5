import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// The costliest records the caps allow, on both write paths (issue 29, first hole): a stored list whose
/// causal context names as many replicas as the caps allow, joined with a state holding as many entries
/// as the caps allow from a replica that context does not name. The answers are checked (what is
/// refused, and why; what is stored when it fits); the server time of each request is printed, and the
/// attack suite measures another user's requests beside a flood of them (`AttackSuiteTests.costliestJoin*`).
@Suite struct CostliestRecordTests {
    /// A zone `Lists` of ann's, and her stamps' clock value (the harness's clock, within the drift bound).
    struct World {
        let h: ServiceHarness
        let token: String
        let zoneID: ZoneID
        let ms: UInt64

        init() throws {
            h = try ServiceHarness()
            let owner: String
            (token, owner) = try h.signUp("ann")
            try h.createZone("Lists", token: token)
            zoneID = try ZoneID(zoneName: "Lists", ownerRecordName: owner)
            ms = UInt64(h.clock.now)
        }

        func frame(_ json: JSON) throws -> RecordFrame {
            try RecordFrame(encoding: CostliestRecords.record(json, zoneID: zoneID))
        }

        /// One binary push of `records`; the answer and the milliseconds it took.
        func push(_ records: [JSON]) throws -> (reply: ServiceHarness.Reply, ms: Double) {
            let body = SyncMessage.Push(clientOperationID: nil, atomic: false,
                                        delta: BinaryCodec.encodeDelta(zoneID: zoneID, frames: try records.map(frame))).encoded()
            return timed { h.push(body, token: token) }
        }

        /// One `records/modify` forceUpdate of CRDT states.
        func modify(_ records: [JSON]) -> (reply: ServiceHarness.Reply, ms: Double) {
            timed { h.modify("Lists", records.map { .object(["operationType": .string("forceUpdate"), "record": $0]) }, token: token) }
        }

        func timed(_ body: () -> ServiceHarness.Reply) -> (reply: ServiceHarness.Reply, ms: Double) {
            let began = DispatchTime.now().uptimeNanoseconds
            let reply = body()
            return (reply, Double(DispatchTime.now().uptimeNanoseconds - began) / 1e6)
        }

        /// The stored list of `name`: entries and context sizes.
        func stored(_ name: String) throws -> (entries: Int, context: Int) {
            let item = try #require(h.lookup(.object(["zoneName": .string("Lists")]), [name], token: token).first)
            let record = try Record(cloudKitJSON: item, zoneID: zoneID)
            guard case .set(let set)? = record.fields.first(where: { $0.name == CostliestRecords.field })?.state else {
                throw HarnessError("\(name) has no list: \(item.serialized().prefix(300))")
            }
            return (set.entries.count, set.context.entries.count)
        }
    }

    private func itemCode(_ reply: ServiceHarness.Reply) -> String? {
        reply.records.first?["serverErrorCode"]?.stringValue ?? reply.code
    }

    @Test func theBinaryPathBoundsContextsAndJoinsTheCostliestStatesQuickly() throws {
        let w = try World()
        // The widest context the caps allow: the per-list limit (50,000), which fits the 1 MiB record cap.
        let replicas = CostliestRecords.largest(upTo: 50_000, zoneID: w.zoneID) {
            CostliestRecords.wideContext("ctx", replicas: $0, ms: w.ms)
        }
        #expect(replicas == 50_000)
        let wide = try w.push([CostliestRecords.wideContext("ctx", replicas: replicas, ms: w.ms)])
        #expect(wide.reply.status == 200 && itemCode(wide.reply) == nil, "\(wide.reply.json.serialized().prefix(300))")
        print("[costliest] binary: a context of \(replicas) replicas stored in \(String(format: "%.1f", wide.ms)) ms")

        // One replica more is refused before any work, naming the context.
        let over = try w.push([CostliestRecords.wideContext("over", replicas: 50_001, ms: w.ms)])
        #expect(itemCode(over.reply) == "LIMIT_EXCEEDED", "\(over.reply.json.serialized().prefix(300))")
        #expect(over.reply.records.first?["reason"]?.stringValue?.contains("causal context") == true)

        // The most entries the caps allow, joined into that context: the joined state is over the write
        // limit, so it is refused after the join and the stored record is unchanged.
        let entries = CostliestRecords.largest(upTo: 50_000, zoneID: w.zoneID) {
            CostliestRecords.manyEntries("ctx", count: $0, ms: w.ms)
        }
        let join = try w.push([CostliestRecords.manyEntries("ctx", count: entries, ms: w.ms)])
        print("[costliest] binary: \(entries) entries joined into it in \(String(format: "%.1f", join.ms)) ms: "
              + "\(join.reply.status) \(itemCode(join.reply) ?? "saved")")
        #expect(join.reply.status == 200 && itemCode(join.reply) == "LIMIT_EXCEEDED", "\(join.reply.json.serialized().prefix(300))")
        #expect(try w.stored("ctx") == (0, replicas))

        // Where the join fits, it is what the merge says: every entry kept, the contexts' union.
        let small = try w.push([CostliestRecords.wideContext("fits", replicas: 20_000, ms: w.ms)])
        #expect(itemCode(small.reply) == nil)
        let fits = try w.push([CostliestRecords.manyEntries("fits", count: 20_000, ms: w.ms)])
        #expect(itemCode(fits.reply) == nil, "\(fits.reply.json.serialized().prefix(300))")
        print("[costliest] binary: 20,000 entries joined into a context of 20,000 replicas in \(String(format: "%.1f", fits.ms)) ms")
        #expect(try w.stored("fits") == (20_000, 20_001))
    }

    @Test func theJSONPathJoinsTheCostliestStatesQuickly() throws {
        let w = try World()
        // The stored context as wide as the binary path allows (a JSON body of 2 MiB holds fewer replicas).
        #expect(itemCode(try w.push([CostliestRecords.wideContext("ctx", replicas: 50_000, ms: w.ms)]).reply) == nil)
        // A context over the per-list limit is refused on JSON too (an array of 50,001 elements).
        let over = w.modify([CostliestRecords.wideContext("over", replicas: 50_001, ms: w.ms)])
        #expect(itemCode(over.reply) == "LIMIT_EXCEEDED", "\(over.reply.json.serialized().prefix(300))")

        // As many entries as a request body holds.
        let entries = CostliestRecords.largest(upTo: 50_000, jsonBytes: 2 * 1024 * 1024 - 512, zoneID: w.zoneID) {
            CostliestRecords.manyEntries("ctx", count: $0, ms: w.ms)
        }
        let join = w.modify([CostliestRecords.manyEntries("ctx", count: entries, ms: w.ms)])
        print("[costliest] JSON: \(entries) entries joined into a context of 50,000 replicas in "
              + "\(String(format: "%.1f", join.ms)) ms: \(join.reply.status) \(itemCode(join.reply) ?? "saved")")
        #expect(join.reply.status == 200, "\(join.reply.json.serialized().prefix(300))")
        if itemCode(join.reply) == nil {
            #expect(try w.stored("ctx") == (entries, 50_001))
        } else {
            #expect(itemCode(join.reply) == "LIMIT_EXCEEDED")
            #expect(try w.stored("ctx") == (0, 50_000))
        }

        // The widest context a JSON body holds, sent as JSON (building it was quadratic in its size).
        let replicas = CostliestRecords.largest(upTo: 50_000, jsonBytes: 2 * 1024 * 1024 - 512, zoneID: w.zoneID) {
            CostliestRecords.wideContext("wide", replicas: $0, ms: w.ms)
        }
        let wide = w.modify([CostliestRecords.wideContext("wide", replicas: replicas, ms: w.ms)])
        print("[costliest] JSON: a context of \(replicas) replicas stored in \(String(format: "%.1f", wide.ms)) ms")
        #expect(wide.reply.status == 200 && itemCode(wide.reply) == nil, "\(wide.reply.json.serialized().prefix(300))")
        #expect(try w.stored("wide") == (0, replicas))
    }
}
