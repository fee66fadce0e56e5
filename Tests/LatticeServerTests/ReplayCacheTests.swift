import Foundation
import LatticeCore
@testable import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Testing

/// Issue 13 point 4: the replay cache keeps a short answer, counts against the quota and keeps at most
/// `maximumClientOperationsPerUser` operations per user; retries still apply once.
@Suite(.tags(.postgres)) struct ReplayCacheTests {
    static let zone: JSON = .object(["zoneName": .string("Lists")])

    /// `records/modify` creating `count` records of about `size` bytes each, under `id`.
    static func bigBatch(_ prefix: String, count: Int, size: Int, id: String?) -> JSON {
        var body: [String: JSON] = ["zoneID": zone, "operations": .array((0..<count).map { index in
            operation("create", "\(prefix)-\(index)", fields: ["blob": .object(["value": .string(String(repeating: "y", count: size))])])
        })]
        if let id { body["clientOperationID"] = .string(id) }
        return .object(body)
    }

    static func remembered(_ h: ServiceHarness, _ user: String, _ id: String) throws -> ClientOperation? {
        try h.storage.read { tx in
            guard let account = try tx.user(named: user) else { return nil }
            return try tx.clientOperation(userID: account.id, operationID: id)
        }
    }

    static func privateBytes(_ h: ServiceHarness, _ user: String) throws -> Int64 {
        try h.storage.read { tx in
            let account = try #require(try tx.user(named: user))
            return try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: account.id)).bytesUsed
        }
    }

    /// The last position of ann's zone Lists.
    static func listsSeq(_ h: ServiceHarness) throws -> Int64? {
        try h.storage.read { tx in
            let account = try #require(try tx.user(named: "ann"))
            let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: account.id))
            return try tx.zone(databaseID: database.id, name: "Lists")?.lastSeq
        }
    }

    @Test func aRetryAppliesOnceAndIsAnsweredFromAShortAnswer() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let body = Self.bigBatch("r", count: 20, size: 20_000, id: "op-big")
        let first = h.call("records/modify", body, token: token)
        #expect(first.status == 200)
        #expect(first.records.count == 20)
        #expect(first.response.body.count > 400_000)
        // What is remembered is short: no record state, only what rebuilds the answer.
        let kept = try #require(try Self.remembered(h, "ann", "op-big"))
        #expect(kept.response.count < 512, "remembered \(kept.response.count) bytes")
        let lastSeq = try Self.listsSeq(h)
        #expect(lastSeq == 20)

        let retry = h.call("records/modify", body, token: token)
        #expect(retry.status == 200)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        #expect(first.response.header("Lattice-Replayed") == nil)
        // Nothing changed in between, so the rebuilt answer is the first one, byte for byte.
        #expect(retry.json == first.json)
        // It did not apply again.
        #expect(try Self.listsSeq(h) == lastSeq)

        // A later write shows in a replay: the answer is the records' current state.
        let changed = h.modify("Lists", [operation("forceUpdate", "r-3", fields: ["note": .object(["value": .string("later")])])],
                               token: token)
        #expect(changed.status == 200)
        let after = h.call("records/modify", body, token: token)
        #expect(after.response.header("Lattice-Replayed") == "true")
        #expect(after.records[3]["fields"]?["note"]?["value"]?.stringValue == "later")
        #expect(after.records[3]["recordChangeTag"] != first.records[3]["recordChangeTag"])
        #expect(after.records[2] == first.records[2])

        // The same id with another body is still refused.
        let other = h.call("records/modify", Self.bigBatch("s", count: 1, size: 10, id: "op-big"), token: token)
        #expect(other.code == "BAD_REQUEST")
    }

    @Test func manyLargeRequestsWithNewIdsKeepTheReplayCacheSmall() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        var answered = 0
        for index in 0..<10 {
            let reply = h.call("records/modify", Self.bigBatch("b\(index)", count: 10, size: 30_000, id: "op-\(index)"),
                               token: token)
            #expect(reply.status == 200)
            answered += reply.response.body.count
        }
        var kept = 0
        for index in 0..<10 { kept += try #require(try Self.remembered(h, "ann", "op-\(index)")).response.count }
        print("[replay] 10 answers of \(answered / 10) bytes each; remembered \(kept) bytes in all")
        #expect(answered > 3_000_000)
        #expect(kept < 10 * 512)
    }

    @Test func aPartlyFailedBatchReplaysItsFailuresAndSuccesses() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        #expect(h.modify("Lists", [operation("create", "taken")], token: token).status == 200)
        var body = Self.bigBatch("p", count: 5, size: 5_000, id: "op-partial").objectValue!
        var operations = body["operations"]!.arrayValue!
        operations.insert(operation("create", "taken"), at: 2)
        body["operations"] = .array(operations)
        body["atomic"] = .bool(false)
        let first = h.call("records/modify", .object(body), token: token)
        #expect(first.records.count == 6)
        #expect(first.records[2]["serverErrorCode"]?.stringValue == "EXISTS")
        let retry = h.call("records/modify", .object(body), token: token)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        #expect(retry.json == first.json)
    }

    @Test func aConflictKeepsNoServerRecordAndAReplayShowsTheCurrentOne() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let big = String(repeating: "z", count: 50_000)
        let created = h.modify("Lists", [operation("create", "c", fields: ["blob": .object(["value": .string(big)])])], token: token)
        let tag = try #require(created.records.first?["recordChangeTag"]?.stringValue)
        #expect(h.modify("Lists", [operation("forceUpdate", "c", fields: ["n": .object(["value": .int(1)])])], token: token).status == 200)
        // A stale tag: CONFLICT with the server's record (50 KB) in the answer.
        let body: JSON = .object(["zoneID": Self.zone, "atomic": .bool(false), "clientOperationID": .string("op-conflict"),
                                  "operations": .array([operation("update", "c", fields: ["n": .object(["value": .int(2)])], tag: tag)])])
        let first = h.call("records/modify", body, token: token)
        #expect(first.records.first?["serverErrorCode"]?.stringValue == "CONFLICT")
        #expect(first.records.first?["serverRecord"]?["fields"]?["n"]?["value"]?.intValue == Int64(1))
        let kept = try #require(try Self.remembered(h, "ann", "op-conflict"))
        #expect(kept.response.count < 1_024, "remembered \(kept.response.count) bytes")
        let retry = h.call("records/modify", body, token: token)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        #expect(retry.json == first.json)
        #expect(h.modify("Lists", [operation("forceUpdate", "c", fields: ["n": .object(["value": .int(3)])])], token: token).status == 200)
        let later = h.call("records/modify", body, token: token)
        #expect(later.records.first?["serverErrorCode"]?.stringValue == "CONFLICT")
        #expect(later.records.first?["serverRecord"]?["fields"]?["n"]?["value"]?.intValue == Int64(3))
    }

    @Test func aReplayedPushRendersCurrentPositionsAndAppliesOnce() throws {
        let h = try ServiceHarness()
        let (token, owner) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        var device = DeviceStates(zoneID: try ZoneID(zoneName: "Lists", ownerRecordName: owner), replica: 0xD1, clock: h.clock)
        let records = try (0..<40).map { try device.make("item-\($0)", fields: ["title": .string(String(repeating: "t", count: 80))]) }
        let body = try DeltaBytes.push(device.zoneID, records, id: "push-1")
        let first = h.push(body, token: token)
        #expect(first.status == 200, "\(first.json.serialized())")
        #expect(first.response.body.count > ServiceHarness.wholeAnswerLimit)
        let kept = try #require(try Self.remembered(h, "ann", "push-1"))
        #expect(kept.response.count < 256)
        let retry = h.push(body, token: token)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        #expect(retry.json == first.json)
        #expect(try Self.listsSeq(h) == 40)
    }

    @Test func aLargePartlyFailedPushKeepsItsFailureAndReplaysTheFirstAnswer() throws {
        let h = try ServiceHarness()
        let (token, owner) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        var device = DeviceStates(zoneID: try ZoneID(zoneName: "Lists", ownerRecordName: owner), replica: 0xD2, clock: h.clock)
        #expect(h.push(try DeltaBytes.push(device.zoneID, [try device.make("clash")]), token: token).status == 200)
        // 30 new records and, in the middle (name order), "clash" again with another type: refused alone.
        var records = try (0..<30).map { try device.make("item-\($0)", fields: ["n": .int64(Int64($0))]) }
        records.append(try device.make("clash", type: "Note"))
        records.sort { $0.id.recordName < $1.id.recordName }
        let body = try DeltaBytes.push(device.zoneID, records, atomic: false, id: "push-partial")
        let first = h.push(body, token: token)
        #expect(first.status == 200 && first.response.body.count > ServiceHarness.wholeAnswerLimit, "\(first.json.serialized())")
        let failed = first.records.filter { $0["serverErrorCode"] != nil }
        #expect(failed.count == 1 && failed.first?["recordName"] == .string("clash"), "\(failed)")
        #expect(first.records.count == 31)
        // What is kept is the compact form (the zone row and the one failed item), not the answer.
        let kept = try #require(try Self.remembered(h, "ann", "push-partial"))
        #expect(kept.response.count < first.response.body.count / 4, "remembered \(kept.response.count) bytes")
        let retry = h.push(body, token: token)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        #expect(retry.json == first.json)
        #expect(try Self.listsSeq(h) == 31)
    }

    @Test func rememberedAnswersAreChargedToThePrivateQuota() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let before = try Self.privateBytes(h, "ann")
        let zoneBody: JSON = .object(["clientOperationID": .string("z-1"), "operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Other")])])])])])
        let reply = h.call("zones/modify", zoneBody, token: token)
        #expect(reply.status == 200)
        let kept = try #require(try Self.remembered(h, "ann", "z-1"))
        #expect(try Self.privateBytes(h, "ann") == before + kept.storedBytes(operationID: "z-1"))
        // Purged past the horizon, the charge is given back.
        h.clock.advance(h.service.configuration.clientOperationHorizonMilliseconds + 1)
        #expect(try h.service.purgeExpired().clientOperations == 1)
        #expect(try Self.privateBytes(h, "ann") == before)
    }

    @Test func anOperationThatWouldNotFitTheQuotaIsRefusedWhole() throws {
        // Room for the records but not for remembering the answer as well.
        let h = try ServiceHarness { $0.quotaBytesPerDatabase = 4_000 }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        var used: Int64 = 0
        var refused: ServiceHarness.Reply? = nil
        var refusedIndex = 0
        for index in 0..<200 {
            let reply = h.modify("Lists", [operation("create", "r\(index)", fields: ["v": .object(["value": .string("0123456789")])])],
                                 token: token, extra: ["clientOperationID": .string(String(repeating: "k", count: 120) + "\(index)")])
            if reply.status != 200 || reply.records.first?["serverErrorCode"] != nil { refused = reply; refusedIndex = index; break }
            used = try Self.privateBytes(h, "ann")
        }
        let failed = try #require(refused)
        print("[replay] refused at \(used) of 4000 bytes: \(failed.json.serialized())")
        #expect(failed.status == 413)
        #expect(failed.code == "QUOTA_EXCEEDED")
        #expect(failed["reason"]?.stringValue?.contains("remembering clientOperationID") == true)
        // Refused whole: the record the request carried was not written either.
        #expect(try Self.privateBytes(h, "ann") == used)
        let index = refusedIndex
        let lookup = h.call("records/lookup", .object(["zoneID": Self.zone,
                                                        "records": .array([.object(["recordName": .string("r\(index)")])])]),
                            token: token)
        #expect(lookup.records.first?["serverErrorCode"]?.stringValue == "NOT_FOUND")
    }

    @Test func eachUserKeepsAtMostTheCapAndTheOldestIsForgottenFirst() throws {
        let h = try ServiceHarness { $0.maximumClientOperationsPerUser = 3 }
        let (token, _) = try h.signUp("ann")
        let (bob, _) = try h.signUp("bob")
        try h.createZone("Lists", token: token)
        try h.createZone("Lists", token: bob)
        #expect(h.modify("Lists", [operation("create", "bob-1")], token: bob, extra: ["clientOperationID": .string("op-0")]).status == 200)
        for index in 1...5 {
            let reply = h.modify("Lists", [operation("create", "r\(index)")], token: token,
                                 extra: ["clientOperationID": .string("op-\(index)")])
            #expect(reply.status == 200)
            h.clock.advance(1_000)
        }
        let count = try h.storage.read { tx in try tx.clientOperationCount(userID: try #require(try tx.user(named: "ann")).id) }
        #expect(count == 3)
        #expect(try Self.remembered(h, "ann", "op-1") == nil)
        #expect(try Self.remembered(h, "ann", "op-2") == nil)
        #expect(try Self.remembered(h, "ann", "op-3") != nil)
        // A forgotten id runs again (a create of an existing record: EXISTS, not a replay)...
        let forgotten = h.modify("Lists", [operation("create", "r1")], token: token, extra: ["clientOperationID": .string("op-1")])
        #expect(forgotten.response.header("Lattice-Replayed") == nil)
        #expect(forgotten.records.first?["serverErrorCode"]?.stringValue == "EXISTS")
        // ...and a remembered one is replayed. Another user's operations are not theirs to lose.
        let kept = h.modify("Lists", [operation("create", "r5")], token: token, extra: ["clientOperationID": .string("op-5")])
        #expect(kept.response.header("Lattice-Replayed") == "true")
        #expect(kept.records.first?["serverErrorCode"] == nil)
        #expect(try Self.remembered(h, "bob", "op-0") != nil)
    }
}

extension ServiceHarness {
    static var wholeAnswerLimit: Int { Idempotency.wholeAnswerLimit }
}
