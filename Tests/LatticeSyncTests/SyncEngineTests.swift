import Foundation
import LatticeCore
import LatticeServer
import LatticeSharing
import LatticeStore
@testable import LatticeSync
import Testing

/// Calls the service in-process: the engine's transport without sockets.
struct InProcessTransport: SyncTransport {
    let service: LatticeService
    /// While false, every call fails as if the network were down.
    let online: OnlineSwitch

    func send(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
        guard online.isOn else { throw TransportError("offline (test)") }
        let response = service.respond(to: HTTPRequest(method: request.method, path: request.path, headers: request.headers,
                                                       body: request.body, remoteAddress: "127.0.0.1"))
        var headers: [String: String] = [:]
        for header in response.headers { headers[header.name.lowercased()] = header.value }
        return TransportResponse(status: response.status, headers: headers, body: response.body)
    }
}

final class OnlineSwitch: @unchecked Sendable {
    private let lock = NSLock()
    private var on = true
    var isOn: Bool { lock.lock(); defer { lock.unlock() }; return on }
    func set(_ value: Bool) { lock.lock(); on = value; lock.unlock() }
}

/// A server and devices (homes) talking to it in-process.
final class SyncWorld: @unchecked Sendable {
    let directory: String
    let storage: SQLiteStorage
    let service: LatticeService

    init() throws {
        directory = NSTemporaryDirectory() + "lattice-sync-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        storage = try SQLiteStorage(path: directory + "/server.sqlite")
        var configuration = ServiceConfiguration()
        configuration.rateLimit = nil
        let keyRing = try ShareKeyRing.open(directory: directory, nowMilliseconds: 0)
        service = try LatticeService(storage: storage, configuration: configuration, keyRing: keyRing, log: { _ in })
    }

    deinit {
        storage.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func device(_ name: String, online: OnlineSwitch = OnlineSwitch()) throws -> (SyncEngine, Lists, OnlineSwitch) {
        let engine = try SyncEngine(home: directory + "/home-\(name)-\(UUID().uuidString.prefix(6))",
                                    transport: InProcessTransport(service: service, online: online))
        return (engine, Lists(engine: engine), online)
    }
}

@Suite struct SyncEngineTests {
    @Test func twoUsersShareAListEditOfflineAndConverge() throws {
        let world = try SyncWorld()
        let (alice, aliceLists, aliceNet) = try world.device("alice")
        let (bob, bobLists, bobNet) = try world.device("bob")
        try alice.signUp(name: "alice", serverURL: "http://127.0.0.1:8080")
        try bob.signUp(name: "bob", serverURL: "http://127.0.0.1:8080")

        let groceries = try aliceLists.create(title: "Groceries")
        let milk = try aliceLists.add("Milk", tags: ["dairy"], to: groceries)
        _ = try aliceLists.add("Eggs", to: groceries)
        let first = try alice.sync()
        #expect(first.online && first.queued == 0, "\(first)")

        let share = try alice.call("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]), "rootRecordName": .string(groceries.id),
            "title": .string("Groceries"), "publicPermission": .string("readWrite"),
        ]))
        #expect(share["shareRecordName"] != nil, "\(share.serialized())")
        let url = try #require(try alice.call("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]),
        ]))["url"]?.stringValue)
        let accepted = try bob.call("shared", "records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]))
        #expect(accepted["results"]?.arrayValue?.first?["participantStatus"]?.stringValue == "accepted")
        #expect(try bob.sync().online)
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
        let offline = try alice.sync()
        #expect(!offline.online && offline.queued > 0)

        aliceNet.set(true)
        bobNet.set(true)
        try bob.sync()
        try alice.sync()
        try bob.sync()
        let aliceView = try aliceLists.items(of: try aliceLists.resolve("Groceries"))
        let bobView = try bobLists.items(of: try bobLists.resolve("Groceries"))
        #expect(aliceView == bobView)
        let merged = try #require(aliceView.first { $0.id == milk.id })
        #expect(merged.tags.sorted() == ["cold", "dairy"]) // add wins over the concurrent remove
        #expect(["Oat milk", "Whole milk"].contains(merged.text))
        #expect(aliceView.map(\.text).contains("Bread"))
    }

    @Test func aReadOnlyParticipantsEditIsRejectedAndRestored() throws {
        let world = try SyncWorld()
        let (alice, aliceLists, _) = try world.device("alice")
        let (bob, bobLists, _) = try world.device("bob")
        try alice.signUp(name: "alice", serverURL: "http://x")
        try bob.signUp(name: "bob", serverURL: "http://x")
        let list = try aliceLists.create(title: "Chores")
        _ = try aliceLists.add("Dishes", to: list)
        try alice.sync()
        _ = try alice.call("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]), "rootRecordName": .string(list.id),
            "publicPermission": .string("readOnly"),
        ]))
        let url = try #require(try alice.call("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]),
        ]))["url"]?.stringValue)
        _ = try bob.call("shared", "records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]))
        try bob.sync()
        let bobsList = try bobLists.resolve("Chores")
        #expect(bobsList.permission == "readOnly")
        #expect(throws: ListsError.self) { try bobLists.add("Sneaky", to: bobsList) }
        // Bypass the CLI's check: the engine sends, the server refuses, the copy goes back.
        let item = try bobLists.resolveItem("Dishes", in: bobsList)
        try bob.edit(item.id, in: bobsList.zone) { record, stamp in try record.set("text", to: .string("Nope"), at: stamp()) }
        let report = try bob.sync()
        #expect(report.rejected.first?.code == "PERMISSION_FAILURE")
        #expect(try bobLists.items(of: bobsList).map(\.text) == ["Dishes"])
        #expect(try bob.pendingCount() == 0)
    }
}
