import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing

/// Issue 13 point 4: sign-up limits (per address and global, in the database), failed-token throttling per
/// address, the server-wide disk budget (measured at most once a second), and a purge that never holds the
/// writer for a whole backlog. Every test runs on either backend (`LATTICE_TEST_BACKEND`).
@Suite(.tags(.postgres)) struct AbuseLimitTests {
    /// A request to `service` as if from `address`.
    static func send(_ service: LatticeService, _ path: String, _ body: JSON = .object([:]), token: String? = nil,
                     from address: String) -> ServiceHarness.Reply {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer " + token }
        let response = service.respond(to: HTTPRequest(method: "POST", path: path, headers: headers,
                                                       body: body.serializedBytes(), remoteAddress: address))
        return ServiceHarness.Reply(status: response.status, json: (try? JSON.parse(response.body)) ?? .null,
                                    response: response)
    }

    static func signUp(_ service: LatticeService, _ name: String, from address: String) -> ServiceHarness.Reply {
        send(service, "/auth/signup", .object(["name": .string(name)]), from: address)
    }

    static let currentUser = "/database/1/lattice/production/private/users/current"

    // MARK: Sign-up

    @Test func signUpsAreLimitedPerAddressAndGloballyAcrossRestartsAndProcesses() throws {
        let h = try ServiceHarness { configuration in
            configuration.signUpsPerAddress = 3
            configuration.signUpsGlobal = 5
            configuration.signUpWindowMilliseconds = 3_600_000
        }
        let service = h.service
        for index in 0..<3 {
            let reply = Self.signUp(service, "a\(index)", from: "10.0.0.1")
            #expect(reply.status == 200, "\(reply.json.serialized())")
            h.clock.advance(1_000)
        }
        // The fourth from the same address: THROTTLED until the oldest of the three leaves the window.
        let refused = Self.signUp(service, "a3", from: "10.0.0.1")
        #expect(refused.status == 429)
        #expect(refused.code == "THROTTLED")
        #expect(refused.response.header("Retry-After") == String(3_600 - 3))
        #expect(refused["retryAfter"]?.intValue == Int64(3_597))
        #expect(refused["reason"]?.stringValue?.contains("from this address") == true)
        // Another address is not limited by the first one's count, but by the global one.
        #expect(Self.signUp(service, "b0", from: "10.0.0.2").status == 200)
        #expect(Self.signUp(service, "b1", from: "10.0.0.2").status == 200)
        let global = Self.signUp(service, "c0", from: "10.0.0.3")
        #expect(global.code == "THROTTLED")
        #expect(global["reason"]?.stringValue?.contains("on this server") == true)
        #expect(global.response.header("Retry-After") != nil)
        // Nothing of a refused sign-up is written.
        #expect(try h.storage.read { try $0.user(named: "a3") } == nil)
        #expect(try h.storage.read { try $0.user(named: "c0") } == nil)
        // The administrator's accounts are not sign-ups: not limited, not counted.
        _ = try service.createAccount(name: "admin-made")
        #expect(try h.storage.read { try $0.signUps(address: nil, sinceMs: 0).count } == 5)

        // A restarted service, and a second process on the same database, see the same counts.
        let second: any Storage = try h.databaseURL.map { try PostgresStorage(url: $0, poolSize: 2) }
            ?? SQLiteStorage(path: h.directory + "/" + SQLiteStorage.fileName)
        defer { second.close() }
        let other = try LatticeService(storage: second, configuration: service.configuration, log: { _ in })
        #expect(Self.signUp(other, "a3", from: "10.0.0.1").code == "THROTTLED")
        #expect(Self.signUp(other, "c0", from: "10.0.0.3").code == "THROTTLED")

        // The window slides: an hour after the first sign-up, one place is free again (globally too).
        h.clock.advance(3_600_000 - 3_000)
        let again = Self.signUp(other, "a3", from: "10.0.0.1")
        #expect(again.status == 200, "\(again.json.serialized())")
        #expect(Self.signUp(service, "a4", from: "10.0.0.1").code == "THROTTLED")
    }

    @Test func closedRegistrationStaysClosedWhateverTheLimits() throws {
        let h = try ServiceHarness { configuration in
            configuration.registrationOpen = false
            configuration.signUpsPerAddress = 100
        }
        let reply = Self.signUp(h.service, "eve", from: "10.0.0.1")
        #expect(reply.status == 403)
        #expect(reply.code == "ACCESS_DENIED")
        #expect(try h.storage.read { try $0.signUps(address: nil, sinceMs: 0).count } == 0)
    }

    // MARK: Failed authentications

    @Test func badTokensFromOneAddressAreThrottledAndOthersAreNot() throws {
        let h = try ServiceHarness { configuration in
            configuration.failedAuthenticationLimit = .init(requestsPerSecond: 1.0 / 60, burst: 5)
        }
        let (good, _) = try h.signUp("ann")
        let bad = "lt_" + String(repeating: "0", count: 64)
        for attempt in 0..<5 {
            let reply = Self.send(h.service, Self.currentUser, token: attempt % 2 == 0 ? bad : "nonsense", from: "10.0.0.9")
            #expect(reply.status == 401, "attempt \(attempt): \(reply.json.serialized())")
        }
        let throttled = Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.9")
        #expect(throttled.status == 429)
        #expect(throttled.code == "THROTTLED")
        #expect(Int(throttled.response.header("Retry-After") ?? "") ?? 0 >= 1)
        #expect(Self.send(h.service, Self.currentUser, token: "nonsense", from: "10.0.0.9").code == "THROTTLED")
        // A good token is still served from the throttled address (one bad client behind a NAT or proxy
        // does not lock the others out), and does not count.
        #expect(Self.send(h.service, Self.currentUser, token: good, from: "10.0.0.9").status == 200)
        // Other addresses are unaffected: good tokens work, bad ones get 401.
        #expect(Self.send(h.service, Self.currentUser, token: good, from: "10.0.0.8").status == 200)
        #expect(Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.8").status == 401)
        // A request without a token is no guess: 421 as ever, even from the throttled address.
        #expect(Self.send(h.service, Self.currentUser, from: "10.0.0.9").status == 421)
        // A minute later one failure is allowed again.
        h.clock.advance(60_000)
        #expect(Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.9").status == 401)
        #expect(Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.9").status == 429)
    }

    // MARK: Disk budget

    /// The size of a fresh storage of the backend under test (a PostgreSQL database starts with its catalog,
    /// several megabytes).
    static func emptyStorageSize() throws -> Int64 {
        let directory = temporaryDirectory("lattice-empty")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let (storage, _) = try TestBackend.makeStorage(directory: directory)
        defer { storage.close() }
        return try storage.sizeOnDisk()
    }

    static let measurementInterval = OperationsCore.diskBudgetMeasurementIntervalMilliseconds

    @Test func overTheDiskBudgetWritesThatAddDataAreRefusedWhileReadsAndDeletionsWork() throws {
        let budget: Int64 = try Self.emptyStorageSize() + 2 * 1024 * 1024
        let h = try ServiceHarness { configuration in configuration.diskBudgetBytes = budget }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        #expect(h.modify("Lists", [operation("create", "keep", fields: ["title": .object(["value": .string("kept")])])],
                         token: token).status == 200)
        let payload = String(repeating: "x", count: 200_000)
        var refused: ServiceHarness.Reply? = nil
        for index in 0..<40 { // 40 × 200 KB is 8 MB, well past the 2 MiB budget
            h.clock.advance(Self.measurementInterval) // each write finds the reading stale and measures again
            let reply = h.modify("Lists", [operation("create", "big\(index)", fields: ["blob": .object(["value": .string(payload)])])],
                                 token: token)
            if reply.status != 200 { refused = reply; break }
        }
        let full = try #require(refused, "no write was refused over a \(budget)-byte budget")
        #expect(full.status == 413)
        #expect(full.code == "QUOTA_EXCEEDED")
        #expect(full["reason"]?.stringValue?.contains("the server is full") == true, "\(full.json.serialized())")
        #expect(try h.storage.sizeOnDisk() >= budget)
        // Other writes that add data are refused too, sign-up included.
        #expect(h.call("zones/modify", .object(["operations": .array([.object(["operationType": .string("create"),
            "zone": .object(["zoneID": .object(["zoneName": .string("More")])])])])]), token: token).code == "QUOTA_EXCEEDED")
        #expect(h.post("/auth/signup", .object(["name": .string("bob")]), token: nil).code == "QUOTA_EXCEEDED")
        #expect(h.call("shares/create", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                  "rootRecordName": .string("keep")]), token: token).code == "QUOTA_EXCEEDED")
        // Reads keep working.
        let read = h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                      "records": .array([.object(["recordName": .string("keep")])])]), token: token)
        #expect(read.status == 200)
        #expect(read.records.first?["fields"]?["title"]?["value"]?.stringValue == "kept")
        #expect(h.call("zones/list", token: token).status == 200)
        #expect(h.call("users/current", token: token).status == 200)
        // Deletions keep working, and so do token revocations.
        let deleted = h.modify("Lists", [operation("forceDelete", "big0", recordType: nil)], token: token)
        #expect(deleted.status == 200, "\(deleted.json.serialized())")
        #expect(deleted.records.first?["serverErrorCode"] == nil)
        #expect(h.call("zones/modify", .object(["operations": .array([.object(["operationType": .string("delete"),
            "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])])])]), token: token).status == 200)
        #expect(h.call("tokens/list", token: token).status == 200)
    }

    @Test func aMeasuredSizeStandsForItsIntervalThenIsMeasuredAgain() throws {
        let budget: Int64 = try Self.emptyStorageSize() + 1024 * 1024
        let h = try ServiceHarness { configuration in configuration.diskBudgetBytes = budget }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        // Within one interval of the service's clock the first reading stands: 8 × 200 KB go past the 1 MiB
        // budget (the overshoot the documentation allows, what one node admits in one interval).
        let payload = String(repeating: "y", count: 200_000)
        for index in 0..<8 {
            let reply = h.modify("Lists", [operation("create", "big\(index)", fields: ["blob": .object(["value": .string(payload)])])],
                                 token: token)
            #expect(reply.status == 200, "write \(index) within the interval: \(reply.json.serialized())")
        }
        #expect(try h.storage.sizeOnDisk() >= budget)
        // Once the interval has passed, the next write measures again and is refused.
        h.clock.advance(Self.measurementInterval)
        let refused = h.modify("Lists", [operation("create", "more", fields: ["title": .object(["value": .string("x")])])],
                               token: token)
        #expect(refused.code == "QUOTA_EXCEEDED", "\(refused.json.serialized())")
    }

    @Test func oneReadingIsSharedByEveryThreadAndAFailedMeasurementKeepsTheOldOne() throws {
        let reading = DiskUsageReading()
        let measurements = Atomic<Int>(0)
        // No reading yet and the measurement fails: the failure is thrown (every caller without a reading
        // measures; from the first reading on, one at a time).
        #expect(throws: StorageError.deadlineExceeded) {
            _ = try reading.bytes(nowMs: 1_000, maximumAgeMilliseconds: 1_000) { throw StorageError.deadlineExceeded }
        }
        #expect(try reading.bytes(nowMs: 1_000, maximumAgeMilliseconds: 1_000) { 41 } == 41)
        // Past the interval, eight threads at once, 200 calls each: one measurement, while the others go on
        // with the old reading.
        let done = DispatchSemaphore(value: 0)
        let failures = Atomic<Int>(0)
        for _ in 0..<8 {
            Thread {
                for _ in 0..<200 {
                    let bytes = try? reading.bytes(nowMs: 2_000, maximumAgeMilliseconds: 1_000) {
                        measurements.add(1, ordering: .relaxed)
                        usleep(2_000)
                        return 42
                    }
                    if bytes != 41 && bytes != 42 { failures.add(1, ordering: .relaxed) }
                }
                done.signal()
            }.start()
        }
        for _ in 0..<8 { #expect(done.wait(timeout: .now() + 30) == .success) }
        #expect(failures.load(ordering: .relaxed) == 0)
        #expect(measurements.load(ordering: .relaxed) == 1)
        // Past the interval a failed measurement keeps the old reading, and counts as that round's.
        #expect(try reading.bytes(nowMs: 3_100, maximumAgeMilliseconds: 1_000) { throw StorageError.busy } == 42)
        #expect(try reading.bytes(nowMs: 3_200, maximumAgeMilliseconds: 1_000) { Issue.record("measured again"); return 0 } == 42)
        // The next interval measures again; so does a clock set back.
        #expect(try reading.bytes(nowMs: 4_100, maximumAgeMilliseconds: 1_000) { 43 } == 43)
        #expect(try reading.bytes(nowMs: 4_000, maximumAgeMilliseconds: 1_000) { 44 } == 44)
    }

    // MARK: Purge

    @Test func aPurgeOverALargeBacklogLetsAWriteInBetweenItsBatches() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        // 4,000 tombstones past the horizon, written straight into the zone; the purge takes them 50 at a time.
        let backlog = 4_000, batchRows = 50
        let expiredAt = h.clock.now - h.service.configuration.tombstoneHorizonMilliseconds - 60_000
        try h.storage.write { tx in
            let user = try #require(try tx.user(named: "ann"))
            let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: user.id))
            let zone = try #require(try tx.zone(databaseID: database.id, name: "Lists"))
            let writes = (0..<backlog).map { index in
                RecordWrite(recordName: "gone\(index)", recordType: "Item", frame: [0], deleted: true,
                            userRecordName: user.recordName, nowMs: expiredAt + Int64(index))
            }
            _ = try tx.saveRecords(zoneRowID: zone.rowID, writes, previous: Array(repeating: nil, count: backlog))
        }
        func recordsLeft() throws -> Int { try h.storage.read { try $0.rowCount(table: "records") } }
        #expect(try recordsLeft() == backlog)

        let outcome = Mutex<Result<PurgeReport?, any Error>?>(nil)
        let finished = DispatchSemaphore(value: 0)
        Thread {
            let result = Result { try h.service.purgeUnlessRunningElsewhere(batchRows: batchRows) }
            outcome.withLock { $0 = result }
            finished.signal()
        }.start()
        // Once the first batch has committed (bounded wait), a one-record write goes in while the purge
        // still has batches to go: one unbounded transaction would have kept it out until the end.
        let waitStarted = Date()
        while try recordsLeft() == backlog, Date().timeIntervalSince(waitStarted) < 20 { usleep(1_000) }
        #expect(try recordsLeft() < backlog, "no purge batch committed within 20 s")
        let writeStarted = Date()
        let written = h.modify("Lists", [operation("create", "fresh", fields: ["title": .object(["value": .string("new")])])],
                               token: token)
        let writeSeconds = Date().timeIntervalSince(writeStarted)
        let tombstonesLeft = try recordsLeft() - 1
        #expect(written.status == 200, "\(written.json.serialized())")
        #expect(tombstonesLeft > 0, "the write finished only after the whole backlog was purged")
        #expect(writeSeconds < 2, "the write took \(writeSeconds) s while the purge ran")
        print("AbuseLimitTests: a write during the purge took \(String(format: "%.1f", writeSeconds * 1_000)) ms, "
              + "\(tombstonesLeft) of \(backlog) tombstones still to purge")

        #expect(finished.wait(timeout: .now() + 120) == .success)
        let report = try #require(try outcome.withLock { $0 }?.get())
        #expect(report.tombstones == backlog)
        #expect(report.complete)
        #expect(report.batches >= backlog / batchRows)
        #expect(try recordsLeft() == 1)
    }

    @Test func aPurgeRunStopsAtItsBudgetAndTheNextRunGoesOn() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        let expiredAt = h.clock.now - h.service.configuration.tombstoneHorizonMilliseconds - 60_000
        try h.storage.write { tx in
            let user = try #require(try tx.user(named: "ann"))
            let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: user.id))
            let zone = try #require(try tx.zone(databaseID: database.id, name: "Lists"))
            let writes = (0..<30).map { index in
                RecordWrite(recordName: "gone\(index)", recordType: "Item", frame: [0], deleted: true,
                            userRecordName: user.recordName, nowMs: expiredAt)
            }
            _ = try tx.saveRecords(zoneRowID: zone.rowID, writes, previous: Array(repeating: nil, count: 30))
        }
        // A budget of 0 ms: one batch, then the run stops and says the rest waits.
        let partial = try #require(try h.service.purgeUnlessRunningElsewhere(batchRows: 10, budgetMilliseconds: 0))
        #expect(partial == PurgeReport(tombstones: 10, complete: false, batches: 1))
        let rest = try #require(try h.service.purgeUnlessRunningElsewhere(batchRows: 10))
        #expect(rest.tombstones == 20 && rest.complete && rest.batches >= 2)
        #expect(try h.storage.read { try $0.rowCount(table: "records") } == 0)
    }
}
