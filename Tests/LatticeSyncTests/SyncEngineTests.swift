import Foundation
import LatticeCore
import LatticeOperations
import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeLists
@testable import LatticeSync
import LatticeTestSupport
import Synchronization
import Testing

/// Calls the service in-process: the engine's transport without sockets.
struct InProcessTransport: BlockingSyncTransport {
    let service: LatticeService
    /// While false, every call fails as if the network were down.
    let online: OnlineSwitch

    func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
        guard online.isOn else { throw TransportError("offline (test)") }
        guard online.allowCall() else { throw TransportError("connection dropped (test)") }
        // The HTTP adapter's body cap, which the in-process path would otherwise skip.
        if request.path.hasSuffix("records/modify"), let body = try? JSON.parse(request.body) {
            online.record(operations: body["operations"]?.arrayValue?.count ?? 0, bytes: request.body.count)
        }
        if request.path.hasSuffix("deltas/push"), let push = try? SyncMessage.Push(decoding: request.body),
           let delta = try? EncodedDelta(validating: push.delta) {
            online.record(operations: delta.recordCount, bytes: request.body.count)
        }
        if request.body.count > service.maximumBodySize {
            let refused = service.responseForOversizedBody()
            return TransportResponse(status: refused.status, headers: [:], body: refused.body)
        }
        let response = service.respond(to: HTTPRequest(method: request.method, path: request.path, headers: request.headers,
                                                       body: request.body, remoteAddress: "127.0.0.1"))
        var headers: [String: String] = [:]
        for header in response.headers { headers[header.name.lowercased()] = header.value }
        return TransportResponse(status: response.status, headers: headers, body: response.body)
    }
}

final class OnlineSwitch: Sendable {
    private struct State {
        var on = true
        var remainingCalls: Int?
        var modifies: [(operations: Int, bytes: Int)] = []
    }

    private let state = Mutex(State())
    func record(operations: Int, bytes: Int) { state.withLock { $0.modifies.append((operations, bytes)) } }
    var modifyRequests: [(operations: Int, bytes: Int)] { state.withLock { $0.modifies } }
    var isOn: Bool { state.withLock { $0.on } }
    func set(_ value: Bool) { state.withLock { $0.on = value } }
    /// After `count` more calls the connection drops (a crash in the middle of a sync); nil for never.
    func dropAfter(_ count: Int?) { state.withLock { $0.remainingCalls = count } }
    func allowCall() -> Bool {
        state.withLock { state in
            guard let remaining = state.remainingCalls else { return true }
            state.remainingCalls = remaining - 1
            return remaining > 0
        }
    }
}

/// A server and devices (homes) talking to it in-process.
final class SyncWorld: Sendable {
    let directory: String
    let storage: any Storage
    /// The PostgreSQL database under `LATTICE_TEST_BACKEND=postgres` (see TestBackend; closing the storage drops it).
    let databaseURL: String?
    let service: LatticeService

    let clock = ServerClock()

    init(configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
        directory = NSTemporaryDirectory() + "lattice-sync-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        (storage, databaseURL) = try TestBackend.makeStorage(directory: directory)
        var configuration = ServiceConfiguration()
        configuration.rateLimit = nil
        let clock = self.clock
        configuration.now = { clock.now }
        configure(&configuration)
        let keyRing = try ShareKeyRing.open(directory: directory, nowMilliseconds: 0)
        service = try LatticeService(storage: storage, configuration: configuration, keyRing: keyRing, log: { _ in })
    }

    deinit {
        storage.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A device with the CLI's lists (`ListsReplica`, on `LatticeSyncEngine`).
    func device(_ name: String, online: OnlineSwitch = OnlineSwitch()) throws -> (ListsReplica, Lists, OnlineSwitch) {
        let replica = try ListsReplica(home: directory + "/home-\(name)-\(UUID().uuidString.prefix(6))",
                                       transport: InProcessTransport(service: service, online: online))
        return (replica, Lists(replica: replica), online)
    }

    /// A device on the engine the CLI used before (`SyncEngine`), kept as the baseline of `lattice-bench sync`.
    func legacyDevice(_ name: String, online: OnlineSwitch = OnlineSwitch()) throws -> (SyncEngine, OnlineSwitch) {
        let engine = try SyncEngine(home: directory + "/home-\(name)-\(UUID().uuidString.prefix(6))",
                                    transport: InProcessTransport(service: service, online: online))
        return (engine, online)
    }
}

/// The server's wall clock, moved by hand (the devices keep the real one).
final class ServerClock: Sendable {
    private let offset = Mutex<Int64>(0)
    var now: Int64 { offset.withLock { Int64(Date().timeIntervalSince1970 * 1000) + $0 } }
    func advance(_ milliseconds: Int64) { offset.withLock { $0 += milliseconds } }
}

@Suite(.tags(.postgres)) struct SyncEngineTests {
    @Test func twoUsersShareAListEditOfflineAndConverge() async throws {
        let world = try SyncWorld()
        let (alice, aliceLists, aliceNet) = try world.device("alice")
        let (bob, bobLists, bobNet) = try world.device("bob")
        try await alice.signUpAndSignIn(name: "alice", serverURL: "http://127.0.0.1:8080")
        try await bob.signUpAndSignIn(name: "bob", serverURL: "http://127.0.0.1:8080")

        let groceries = try aliceLists.create(title: "Groceries")
        let milk = try aliceLists.add("Milk", tags: ["dairy"], to: groceries)
        _ = try aliceLists.add("Eggs", to: groceries)
        let first = try await alice.sync()
        #expect(first.online && first.queued == 0, "\(first)")

        let share = try await alice.callServer("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]), "rootRecordName": .string(groceries.id),
            "title": .string("Groceries"), "publicPermission": .string("readWrite"),
        ]))
        #expect(share["shareRecordName"] != nil, "\(share.serialized())")
        let url = try await #require(try alice.callServer("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]),
        ]))["url"]?.stringValue)
        let accepted = try await bob.callServer("shared", "records/accept",
            .object(["shortGUIDs": .array([.object(["value": .string(url)])])]))
        #expect(accepted["results"]?.arrayValue?.first?["participantStatus"]?.stringValue == "accepted")
        #expect(try await bob.sync().online)
        let bobsList = try bobLists.resolve("Groceries")
        #expect(bobsList.permission == "readWrite")
        #expect(try bobLists.items(of: bobsList).map(\.text) == ["Milk", "Eggs"])

        // Both offline: the same item's text on both sides; the tag removed on one side, added on the other.
        aliceNet.set(false)
        bobNet.set(false)
        try aliceLists.edit(milk, in: groceries, text: "Oat milk", addTags: [], removeTags: ["dairy"])
        let bobMilk = try bobLists.resolveItem("Milk", in: bobsList)
        try bobLists.edit(bobMilk, in: bobsList, text: "Whole milk", addTags: ["dairy", "cold"], removeTags: [])
        _ = try bobLists.add("Bread", to: bobsList)
        let offline = try await alice.sync()
        #expect(!offline.online && offline.queued > 0)

        aliceNet.set(true)
        bobNet.set(true)
        try await bob.sync()
        try await alice.sync()
        try await bob.sync()
        let aliceView = try aliceLists.items(of: try aliceLists.resolve("Groceries"))
        let bobView = try bobLists.items(of: try bobLists.resolve("Groceries"))
        #expect(aliceView == bobView)
        let merged = try #require(aliceView.first { $0.id == milk.id })
        #expect(merged.tags.sorted() == ["cold", "dairy"]) // add wins over the concurrent remove
        #expect(["Oat milk", "Whole milk"].contains(merged.text))
        #expect(aliceView.map(\.text).contains("Bread"))
    }

    @Test func aReadOnlyParticipantsEditIsRejectedAndRestored() async throws {
        let world = try SyncWorld()
        let (alice, aliceLists, _) = try world.device("alice")
        let (bob, bobLists, _) = try world.device("bob")
        try await alice.signUpAndSignIn(name: "alice", serverURL: "http://x")
        try await bob.signUpAndSignIn(name: "bob", serverURL: "http://x")
        let list = try aliceLists.create(title: "Chores")
        _ = try aliceLists.add("Dishes", to: list)
        try await alice.sync()
        _ = try await alice.callServer("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]), "rootRecordName": .string(list.id),
            "publicPermission": .string("readOnly"),
        ]))
        let url = try await #require(try alice.callServer("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]),
        ]))["url"]?.stringValue)
        _ = try await bob.callServer("shared", "records/accept",
            .object(["shortGUIDs": .array([.object(["value": .string(url)])])]))
        try await bob.sync()
        let bobsList = try bobLists.resolve("Chores")
        #expect(bobsList.permission == "readOnly")
        #expect(throws: ListsError.self) { try bobLists.add("Sneaky", to: bobsList) }
        // Bypass the CLI's check: the engine sends, the server refuses, the copy goes back.
        let item = try bobLists.resolveItem("Dishes", in: bobsList)
        var record = try #require(try bob.record(item.id, in: bobsList.zone))
        record["text"] = "Nope"
        try bob.save(record, in: bobsList.zone)
        let report = try await bob.sync()
        #expect(report.rejected.first?.code == "PERMISSION_FAILURE")
        #expect(try bobLists.items(of: bobsList).map(\.text) == ["Dishes"])
        #expect(try bob.pendingCount() == 0)
    }
}

@Suite struct SyncEngineRobustnessTests {
    /// A home the CLI's old engine made (`replica.sqlite`) with an unsent edit: opening it with the CLI's
    /// replica offline refuses and leaves it as it was; online, the edit is sent by the engine that made
    /// it, the account moves over, and the old file goes.
    @Test func aHomeTheOldEngineMadeIsBroughtOverWithWhatItHadNotSent() async throws {
        let world = try SyncWorld()
        let online = OnlineSwitch()
        let (old, _) = try world.legacyDevice("old", online: online)
        let account = try await old.signUpAndSignIn(name: "alice", serverURL: "http://x")
        let zone = try old.privateZone(Lists.defaultZone)
        try old.edit("l1", in: zone, creating: "List") { record, stamp in try record.set("title", to: .string("Kept"), at: stamp()) }
        #expect(try old.pendingCount() == 1)
        let transport = InProcessTransport(service: world.service, online: online)
        online.set(false)
        #expect(throws: ListsError.self) { _ = try ListsReplica(home: old.home, transport: transport) }
        #expect(FileManager.default.fileExists(atPath: old.home + "/" + LocalStore.fileName))
        #expect(!FileManager.default.fileExists(atPath: old.home + "/" + ListsReplica.fileName))
        #expect(try old.pendingCount() == 1)

        online.set(true)
        let replica = try ListsReplica(home: old.home, transport: transport)
        #expect(replica.account == account)
        #expect(!FileManager.default.fileExists(atPath: old.home + "/" + LocalStore.fileName))
        let report = try await replica.sync()
        #expect(report.online && report.queued == 0, "\(report)")
        #expect(try Lists(replica: replica).all().map(\.title) == ["Kept"])
    }

    @Test func anInterruptedSyncLosesNoEditAndSkipsNoChange() async throws {
        let world = try SyncWorld()
        let (alice, aliceLists, _) = try world.device("alice")
        let (phone, phoneLists, phoneNet) = try world.device("phone")
        let account = try await alice.signUpAndSignIn(name: "alice", serverURL: "http://x")
        try await phone.signIn(serverURL: "http://x", token: account.token)
        let list = try aliceLists.create(title: "Big")
        for index in 0..<120 { _ = try aliceLists.add("item \(index)", to: list) }
        try await alice.sync()
        let mine = try phoneLists.create(title: "Phone's")
        _ = try phoneLists.add("offline edit", to: mine)
        // The connection drops at every point of the phone's sync in turn; each time the next sync resumes.
        for cut in 0..<12 {
            phoneNet.dropAfter(cut)
            _ = try? await phone.sync()
            phoneNet.dropAfter(nil)
        }
        try await phone.sync()
        try await alice.sync()
        #expect(try phoneLists.items(of: try phoneLists.resolve("Big")).count == 120)
        #expect(try aliceLists.items(of: try aliceLists.resolve("Phone's")).map(\.text) == ["offline edit"])
        #expect(try phone.pendingCount() == 0)
    }

    @Test func batchesStayUnderTheLimitsAndSplitOnLimitExceeded() async throws {
        let world = try SyncWorld { $0.maximumRequestBytes = 64 * 1024 }
        let (alice, lists, net) = try world.device("alice")
        try await alice.signUpAndSignIn(name: "alice", serverURL: "http://x")
        let list = try lists.create(title: "Huge")
        for index in 0..<450 { _ = try lists.add("item \(index) " + String(repeating: "x", count: 100), to: list) }
        let report = try await alice.sync()
        #expect(report.queued == 0 && report.rejected.isEmpty && report.sent == 451, "\(report)")
        let requests = net.modifyRequests
        #expect(requests.allSatisfy { $0.operations <= 400 })
        #expect(requests.contains { $0.bytes > 64 * 1024 }) // refused with LIMIT_EXCEEDED, then split
        #expect(requests.filter { $0.bytes <= 64 * 1024 }.map(\.operations).reduce(0, +) == 451)
        let (other, otherLists, _) = try world.device("other")
        try await other.signIn(serverURL: "http://x", token: alice.account!.token)
        try await other.sync()
        #expect(try otherLists.items(of: try otherLists.resolve("Huge")).count == 450)
    }

    @Test func anExpiredTokenRefetchesTheZoneAndKeepsPendingEdits() async throws {
        let world = try SyncWorld { $0.tombstoneHorizonMilliseconds = 60_000 }
        let (alice, aliceLists, _) = try world.device("alice")
        let (phone, phoneLists, _) = try world.device("phone")
        let account = try await alice.signUpAndSignIn(name: "alice", serverURL: "http://x")
        try await phone.signIn(serverURL: "http://x", token: account.token)
        let list = try aliceLists.create(title: "Todo")
        let doomed = try aliceLists.add("doomed", to: list)
        _ = try aliceLists.add("kept", to: list)
        try await alice.sync()
        try await phone.sync()
        // Alice deletes an item; the tombstone is purged before the phone syncs again.
        try aliceLists.remove(doomed, in: list)
        try await alice.sync()
        world.clock.advance(120_000)
        #expect(try world.service.purgeExpired().tombstones >= 1)
        // The phone has an unsent edit meanwhile.
        let phoneList = try phoneLists.resolve("Todo")
        _ = try phoneLists.add("from the phone", to: phoneList)
        let report = try await phone.sync()
        #expect(report.online)
        let texts = try phoneLists.items(of: phoneList).map(\.text)
        #expect(texts == ["kept", "from the phone"]) // the purged record is gone, the pending edit survived
        try await alice.sync()
        #expect(try aliceLists.items(of: list).map(\.text) == ["kept", "from the phone"])
    }

    @Test func retriesHonourRetryAfterWithBackoff() async throws {
        final class Flaky: BlockingSyncTransport {
            private let count = Mutex(0)
            var calls: Int { count.withLock { $0 } }
            func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
                let calls = count.withLock { count in
                    count += 1
                    return count
                }
                if calls == 1 {
                    return TransportResponse(status: 503, headers: ["retry-after": "2"],
                                             body: Array(#"{"serverErrorCode":"TRY_AGAIN_LATER","reason":"busy","retryAfter":2}"#.utf8))
                }
                if calls == 2 {
                    return TransportResponse(status: 429, headers: [:],
                                             body: Array(#"{"serverErrorCode":"THROTTLED","reason":"slow down"}"#.utf8))
                }
                return TransportResponse(status: 200, headers: [:], body: Array(#"{"ok":true}"#.utf8))
            }
        }
        let flaky = Flaky()
        let sleeps = SleepLog()
        var client = ServerClient(transport: flaky)
        client.sleep = { sleeps.add($0) }
        let reply = try await client.call("private", "zones/list", .object([:]), token: "t")
        #expect(reply["ok"] == .bool(true))
        #expect(flaky.calls == 3)
        #expect(sleeps.values.count == 2)
        #expect(sleeps.values[0] >= 2) // Retry-After
        #expect(sleeps.values[1] >= 0.4 && sleeps.values[1] < 0.61) // backoff with jitter, attempt 2
    }
}

final class SleepLog: Sendable {
    private let items = Mutex<[Double]>([])
    func add(_ value: Double) { items.withLock { $0.append(value) } }
    var values: [Double] { items.withLock { $0 } }
}
