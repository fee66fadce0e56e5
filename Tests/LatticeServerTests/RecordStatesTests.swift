import Foundation
import LatticeAPI
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// `records/modify` bodies of CRDT states are read in one pass (`RecordStatesRequest`); every other body as a
/// JSON tree. Two services, one reading in one pass and one reading every body as a tree, get the same
/// requests (valid and not, in random order) and must give the same answers byte for byte: the one-pass
/// read changes the cost of a request, never its answer.
@Suite(.tags(.postgres)) struct RecordStatesTests {
    /// One service of each kind, with one account and zone each, on clocks that move together.
    struct Pair {
        let onePass: ServiceHarness, tree: ServiceHarness
        let tokens: (String, String)
        /// The account's record name on each service (random, and of the same length): the bodies name
        /// the one-pass service's, and the tree service's bodies and answers are translated.
        let owner: String, treeOwner: String

        init() throws {
            onePass = try ServiceHarness { $0.readsRecordStatesInOnePass = true }
            tree = try ServiceHarness { $0.readsRecordStatesInOnePass = false }
            let (a, ownerA) = try onePass.signUp("ann")
            let (b, ownerB) = try tree.signUp("ann")
            try #require(ownerA.utf8.count == ownerB.utf8.count)
            try onePass.createZone("Z", token: a)
            try tree.createZone("Z", token: b)
            tokens = (a, b)
            (owner, treeOwner) = (ownerA, ownerB)
        }

        /// Sends `body` to both; the answers must match (status, replay header, body without the error's
        /// fresh `uuid`).
        func send(_ body: [UInt8], _ label: String) -> ServiceHarness.Reply {
            let path = "/database/1/lattice/production/private/records/modify"
            let text = String(decoding: body, as: UTF8.self)
            let fast = onePass.raw("POST", path, body: body, token: tokens.0, headers: ["Content-Type": "application/json"])
            let slow = tree.raw("POST", path, body: Array(text.replacingOccurrences(of: owner, with: treeOwner).utf8),
                                token: tokens.1, headers: ["Content-Type": "application/json"])
            let slowJSON = (try? JSON.parse(String(decoding: slow.response.body, as: UTF8.self)
                .replacingOccurrences(of: treeOwner, with: owner))) ?? .null
            #expect(fast.status == slow.status, "\(label): \(fast.json.serialized()) vs \(slow.json.serialized())")
            #expect(Self.replayed(fast) == Self.replayed(slow), "\(label)")
            #expect(Self.withoutUUID(fast.json) == Self.withoutUUID(slowJSON),
                    "\(label):\n one pass: \(fast.json.serialized().prefix(600))\n tree:     \(slowJSON.serialized().prefix(600))")
            onePass.clock.advance(7)
            tree.clock.advance(7)
            return fast
        }

        static func replayed(_ reply: ServiceHarness.Reply) -> Bool {
            reply.response.headers.contains { $0.name == "Lattice-Replayed" }
        }

        static func withoutUUID(_ json: JSON) -> JSON {
            guard case .object(var object) = json else { return json }
            object["uuid"] = nil
            return .object(object)
        }
    }

    /// A record's state as a client sends it: made with `RecordEdit` on a replica of the client's.
    static func state(_ name: String, zone: ZoneID, at ms: UInt64, tags: [String], title: String?,
                      parent: String? = nil, counter: inout UInt16) throws -> JSON {
        func stamp() -> Stamp {
            counter &+= 1
            return Stamp(hlc: HLC(milliseconds: ms, counter: counter), replica: ReplicaID(0xC11E_17))
        }
        var edit = try RecordEdit(creating: RecordID(recordName: name, zoneID: zone), recordType: "Item", at: stamp())
        if let title { try edit.set("title", to: .string(title), at: stamp()) }
        try edit.add(tags.map { .string($0) }, to: "tags", at: stamp())
        if let parent { try edit.setParent(Reference(recordName: parent), at: stamp()) }
        guard let frame = try edit.applied() else { throw HarnessError("no frame") }
        return try frame.decoded().cloudKitJSON
    }

    @Test func randomBatchesOfStatesAnswerAsTheTreeReadDoes() throws {
        let seed = UInt64(Date().timeIntervalSince1970 * 1000)
        print("[record states] seed \(seed) (rerun with RECORD_STATES_SEED=\(seed))")
        var rng = SplitMix64(seed: ProcessInfo.processInfo.environment["RECORD_STATES_SEED"].flatMap(UInt64.init) ?? seed)
        let pair = try Pair()
        let zone = try ZoneID(zoneName: "Z", ownerRecordName: pair.owner)
        let otherZone = try ZoneID(zoneName: "Other", ownerRecordName: pair.owner)
        let now = UInt64(pair.onePass.clock.now)
        var counter: UInt16 = 0
        var usedIDs: [String] = []
        var lastBody: [UInt8] = []
        for round in 0 ..< 60 {
            var operations: [JSON] = []
            for _ in 0 ..< Int(rng.next() % 6) + 1 {
                let name = "r\(rng.next() % 12)"
                let roll = rng.next() % 100
                let type = roll < 50 ? "forceUpdate" : (roll < 75 ? "create" : "update")
                var record = try Self.state(name, zone: roll % 13 == 0 ? otherZone : zone,
                                            // Now and then a clock far ahead of the server's (refused).
                                            at: roll % 17 == 0 ? now + 86_400_000 : now - rng.next() % 5_000,
                                            tags: (0 ..< Int(rng.next() % 4)).map { "t\($0 + Int(rng.next() % 3))" },
                                            title: rng.next() % 3 == 0 ? nil : "title \(rng.next() % 5)",
                                            parent: roll % 11 == 0 ? "p\(rng.next() % 12)" : nil, counter: &counter)
                if type == "update", case .object(var object) = record {
                    // A right tag, a wrong one, or none.
                    switch rng.next() % 3 {
                    case 0: object["recordChangeTag"] = .string("nope")
                    case 1: break
                    default:
                        let looked = pair.onePass.call("records/lookup", .object([
                            "zoneID": .object(["zoneName": .string("Z")]),
                            "records": .array([.object(["recordName": .string(name)])]),
                        ]), token: pair.tokens.0)
                        if let tag = looked.records.first?["recordChangeTag"] { object["recordChangeTag"] = tag }
                    }
                    record = .object(object)
                }
                operations.append(.object(["operationType": .string(type), "record": record]))
            }
            var body: [String: JSON] = ["zoneID": .object(["zoneName": .string("Z")]), "operations": .array(operations)]
            switch rng.next() % 4 {
            case 0: body["atomic"] = .bool(false)
            case 1: body["atomic"] = .bool(true)
            default: break
            }
            switch rng.next() % 4 {
            case 0: body["desiredKeys"] = .array([])
            case 1: body["desiredKeys"] = .array([.string("title")])
            default: break
            }
            if rng.next() % 3 == 0 {
                let id = "op\(rng.next() % 6)"
                usedIDs.append(id)
                body["clientOperationID"] = .string(id)
            }
            let bytes = JSON.object(body).serializedBytes()
            // Every round's body is one the one-pass read takes (the comparison is of the two reads).
            let configuration = pair.onePass.service.configuration
            #expect(RecordStatesRequest.read(bytes, maximumOperations: configuration.maximumOperations,
                                             caps: RecordStateCaps(maximumFields: configuration.maximumFieldsPerRecord,
                                                                   maximumListElements: configuration.maximumListElements)) != nil)
            _ = pair.send(bytes, "round \(round)")
            // Now and then the same body again (a retry: replayed when it carried an id).
            if rng.next() % 5 == 0 { _ = pair.send(bytes, "round \(round), again") }
            lastBody = bytes
        }
        #expect(!usedIDs.isEmpty)
        // Bodies the one-pass read leaves to the tree: each is answered as before. (The plain value is one
        // that fails: a value the server stamps carries its own replica, which differs between the two.)
        let text = String(decoding: lastBody, as: UTF8.self)
        let zoneJSON = #"{"zoneName":"Z"}"#
        let item = try Self.state("x1", zone: zone, at: now, tags: ["a"], title: "t", counter: &counter).serialized()
        let cases: [(String, String)] = [
            ("a duplicate key", #"{"zoneID":\#(zoneJSON),"zoneID":\#(zoneJSON),"operations":[{"operationType":"forceUpdate","record":\#(item)}]}"#),
            ("a plain value beside a state", #"{"zoneID":\#(zoneJSON),"operations":[{"operationType":"forceUpdate","record":\#(item)},{"operationType":"forceUpdate","record":{"recordName":"missing","fields":{"n":{"value":1}}}}]}"#),
            ("atomic not a boolean", #"{"zoneID":\#(zoneJSON),"atomic":"yes","operations":[{"operationType":"forceUpdate","record":\#(item)}]}"#),
            ("no operations", #"{"zoneID":\#(zoneJSON),"operations":[]}"#),
            ("no zone", #"{"operations":[{"operationType":"forceUpdate","record":\#(item)}]}"#),
            ("a replace of a state", #"{"zoneID":\#(zoneJSON),"operations":[{"operationType":"forceReplace","record":\#(item)}]}"#),
            ("desiredKeys of numbers", #"{"zoneID":\#(zoneJSON),"desiredKeys":[1],"operations":[{"operationType":"forceUpdate","record":\#(item)}]}"#),
            ("truncated", String(text.prefix(text.count / 2))),
            ("trailing text", text + "x"),
            ("a bad clientOperationID", #"{"zoneID":\#(zoneJSON),"clientOperationID":"","operations":[{"operationType":"forceUpdate","record":\#(item)}]}"#),
        ]
        for (label, body) in cases { _ = pair.send(Array(body.utf8), label) }
    }

    @Test func statesOverTheCapsAnswerAsTheTreeReadDoes() throws {
        let pair = try Pair()
        let zone = try ZoneID(zoneName: "Z", ownerRecordName: pair.owner)
        var counter: UInt16 = 0
        let now = UInt64(pair.onePass.clock.now)
        // A list one element over the cap, and a record one field over it, beside a fine record.
        let configuration = pair.onePass.service.configuration
        let long = try Self.state("long", zone: zone, at: now, tags: (0 ... configuration.maximumListElements).map { "e\($0)" },
                                  title: nil, counter: &counter)
        var wide = RecordEdit?.none
        wide = try RecordEdit(creating: RecordID(recordName: "wide", zoneID: zone), recordType: "Item",
                              at: Stamp(hlc: HLC(milliseconds: now, counter: 1), replica: ReplicaID(3)))
        for index in 0 ... configuration.maximumFieldsPerRecord {
            try wide!.set("f\(index)", to: .int64(1), at: Stamp(hlc: HLC(milliseconds: now, counter: UInt16(index % 60_000)),
                                                                replica: ReplicaID(3)))
        }
        let wideJSON = try wide!.applied()!.decoded().cloudKitJSON
        let fine = try Self.state("fine", zone: zone, at: now, tags: ["a"], title: "t", counter: &counter)
        for atomic in [false, true] {
            let body = JSON.object([
                "zoneID": .object(["zoneName": .string("Z")]), "atomic": .bool(atomic),
                "operations": .array([long, wideJSON, fine].map { .object(["operationType": .string("forceUpdate"), "record": $0]) }),
            ])
            let reply = pair.send(body.serializedBytes(), "over the caps, atomic \(atomic)")
            #expect(reply.records.prefix(2).map { $0["serverErrorCode"]?.stringValue } == ["LIMIT_EXCEEDED", "LIMIT_EXCEEDED"])
        }
    }
}
