import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeStore
import LatticeLists
@testable import LatticeSync
import Synchronization
import LatticeTestSupport
import Testing

/// A value shared between threads, under a lock.
final class Locked<Value: Sendable>: Sendable {
    private let mutex: Mutex<Value>
    init(_ value: Value) { mutex = Mutex(value) }
    func withLock<R>(_ body: (inout Value) -> R) -> R { mutex.withLock { body(&$0) } }
    var value: Value { mutex.withLock { $0 } }
}

/// The seed of a randomised test: `LATTICE_SEED` when set, else a fresh one (printed by the test).
func testSeed() -> UInt64 {
    if let text = ProcessInfo.processInfo.environment["LATTICE_SEED"], let seed = UInt64(text) { return seed }
    return UInt64.random(in: 1...UInt64.max)
}

/// A transport that records every exchange (and what each `deltas/pull` answer carried) around another one.
final class RecordingTransport: BlockingSyncTransport, Sendable {
    struct Exchange: Sendable {
        let operation: String
        let database: String
        let requestBody: [UInt8]
        let started: Date
        var finished: Date?
        var status: Int?
        /// For `deltas/pull`: the records delivered and those left out as already held.
        var pulled: [String] = []
        var skipped: [String] = []
        /// For `deltas/push`: the answer's items.
        var pushed: [JSON] = []
    }

    private struct State {
        var exchanges: [Exchange] = []
        var inFlight = 0
        var mostInFlight = 0
    }

    let inner: any BlockingSyncTransport
    /// Runs before a request is passed on (a concurrent edit made "while the request travels").
    private let beforeSend: @Sendable (TransportRequest) -> Void
    private let state = Mutex(State())

    init(_ inner: any BlockingSyncTransport, beforeSend: @escaping @Sendable (TransportRequest) -> Void = { _ in }) {
        self.inner = inner
        self.beforeSend = beforeSend
    }

    var exchanges: [Exchange] { state.withLock { $0.exchanges } }
    var mostInFlight: Int { state.withLock { $0.mostInFlight } }

    func reset() { state.withLock { $0 = State() } }

    func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
        // /database/1/{container}/{environment}/{database}/{operation}
        let parts = request.path.split(separator: "/").map(String.init)
        let operation = parts.count >= 6 ? parts[5...].joined(separator: "/") : request.path
        let index = state.withLock { state -> Int in
            state.exchanges.append(Exchange(operation: operation, database: parts.count > 4 ? parts[4] : "",
                                            requestBody: request.body, started: Date()))
            state.inFlight += 1
            state.mostInFlight = max(state.mostInFlight, state.inFlight)
            return state.exchanges.count - 1
        }
        defer { state.withLock { $0.inFlight -= 1 } }
        beforeSend(request)
        let response = try inner.sendBlocking(request, timeout: timeout)
        var pulled: [String] = [], skipped: [String] = [], pushed: [JSON] = []
        if operation == "deltas/pull", response.status == 200, let message = try? SyncMessage.Pull(decoding: response.body) {
            skipped = message.skipped
            pulled = (try? EncodedDelta(validating: message.delta))?.recordNames ?? []
        }
        if operation == "deltas/push" { pushed = (try? JSON.parse(response.body))?["records"]?.arrayValue ?? [] }
        state.withLock { state in
            state.exchanges[index].finished = Date()
            state.exchanges[index].status = response.status
            state.exchanges[index].pulled = pulled
            state.exchanges[index].skipped = skipped
            state.exchanges[index].pushed = pushed
        }
        return response
    }
}

extension SyncWorld {
    /// A device whose exchanges are recorded.
    func recordedDevice(_ name: String, beforeSend: @escaping @Sendable (TransportRequest) -> Void = { _ in }) throws
        -> (ListsReplica, Lists, RecordingTransport) {
        let transport = RecordingTransport(InProcessTransport(service: service, online: OnlineSwitch()), beforeSend: beforeSend)
        let replica = try ListsReplica(home: directory + "/home-\(name)-\(UUID().uuidString.prefix(6))", transport: transport)
        return (replica, Lists(replica: replica), transport)
    }

    /// A device on the engine the CLI used before, whose exchanges are recorded.
    func recordedLegacyDevice(_ name: String) throws -> (SyncEngine, RecordingTransport) {
        let transport = RecordingTransport(InProcessTransport(service: service, online: OnlineSwitch()))
        return (try SyncEngine(home: directory + "/home-\(name)-\(UUID().uuidString.prefix(6))", transport: transport), transport)
    }
}

/// Every record's state on a device (its system fields: the CRDT state the engine last gave), by zone and
/// name.
func frames(_ replica: ListsReplica) throws -> [String: [UInt8]] {
    var result: [String: [UInt8]] = [:]
    for zone in try replica.zones() {
        for record in try replica.records(in: zone) {
            // The archive's CRDT frame (its change tag and key order are not part of the state).
            let archive = try JSON.parse([UInt8](try record.encodeSystemFields()))
            let frame = try #require(archive["frame"]?.stringValue.flatMap { Data(base64Encoded: $0) })
            result["\(zone.zoneName)/\(zone.ownerRecordName)/\(record.recordID.recordName)"] = [UInt8](frame)
        }
    }
    return result
}

/// The client engine on the binary path: a device does not download its own writes, does download what the
/// server merged differently, and converges with a device on the JSON path.
@Suite(.tags(.postgres)) struct SyncEngineDeltaTests {
    /// `batchLimit` caps the records per push request (clamped to 1...400); every record is still sent.
    @Test func batchLimitSplitsTheQueueIntoRequestsOfThatSize() async throws {
        let world = try SyncWorld()
        let (laptop, net) = try world.recordedLegacyDevice("laptop")
        _ = try await laptop.signUpAndSignIn(name: "alice", serverURL: "http://x")
        #expect(laptop.batchLimit == 400)
        laptop.batchLimit = 0
        #expect(laptop.batchLimit == 1)
        laptop.batchLimit = 10_000
        #expect(laptop.batchLimit == 400)
        laptop.batchLimit = 7
        let zone = try laptop.privateZone("Batched")
        for index in 0..<20 {
            try laptop.edit("r\(index)", in: zone, creating: "Item") { record, stamp in
                try record.set("text", to: .string("item \(index)"), at: stamp())
            }
        }
        net.reset()
        let report = try laptop.sync()
        #expect(report.sent == 20 && report.queued == 0 && report.rejected.isEmpty, "\(report)")
        let sizes = net.exchanges.filter { $0.operation == "deltas/push" }.map(\.pushed.count)
        #expect(sizes == [7, 7, 6], "\(sizes)")
    }

    @Test func aDeviceDoesNotDownloadItsOwnWritesButAnotherDeviceGetsThemAll() async throws {
        let world = try SyncWorld()
        let (laptop, laptopLists, laptopNet) = try world.recordedDevice("laptop")
        let account = try await laptop.signUpAndSignIn(name: "alice", serverURL: "http://x")
        let list = try laptopLists.create(title: "Big")
        for index in 0..<300 { _ = try laptopLists.add("item \(index)", to: list) }
        let own = Set(try laptop.records(in: list.zone).map(\.recordID.recordName))
        #expect(own.count == 301)

        laptopNet.reset()
        let report = try await laptop.sync()
        #expect(report.sent == 301 && report.queued == 0 && report.rejected.isEmpty, "\(report)")
        let pushes = laptopNet.exchanges.filter { $0.operation == "deltas/push" }
        #expect(!pushes.isEmpty && laptopNet.exchanges.allSatisfy { $0.operation != "records/modify" })
        #expect(pushes.flatMap(\.pushed).filter { $0["upToDate"] == .bool(true) }.count == 301)
        let pulls = laptopNet.exchanges.filter { $0.operation == "deltas/pull" }
        let downloaded = pulls.flatMap(\.pulled)
        print("[own writes] sync 1: \(pulls.count) pulls, \(downloaded.count) frames, \(pulls.flatMap(\.skipped).count) skipped")
        let ownDownloaded = downloaded.filter(own.contains)
        #expect(ownDownloaded.isEmpty, "the laptop downloaded \(ownDownloaded.count) of its own writes")
        #expect(Set(pulls.flatMap(\.skipped)) == own) // the pull after the push named them as held

        laptopNet.reset()
        _ = try await laptop.sync()
        let again = laptopNet.exchanges.filter { $0.operation == "deltas/pull" }.flatMap(\.pulled)
        #expect(again.isEmpty, "the next sync downloaded \(again.count) frames")

        // A second device of the same account downloads all of them.
        let (phone, phoneLists, phoneNet) = try world.recordedDevice("phone")
        try await phone.signIn(serverURL: "http://x", token: account.token)
        let phoneReport = try await phone.sync()
        let phoneDownloads = phoneNet.exchanges.filter { $0.operation == "deltas/pull" }.flatMap(\.pulled)
        #expect(Set(phoneDownloads) == own && phoneDownloads.count == 301, "\(phoneDownloads.count) frames")
        #expect(phoneReport.fetched == 301)
        #expect(try phoneLists.items(of: try phoneLists.resolve("Big")).count == 300)
        #expect(try frames(phone) == frames(laptop))

        // And the laptop still downloads what others write: exactly the phone's one change.
        let item = try phoneLists.resolveItem("item 7", in: try phoneLists.resolve("Big"))
        try phoneLists.setDone(item, in: try phoneLists.resolve("Big"), true)
        _ = try await phone.sync()
        laptopNet.reset()
        _ = try await laptop.sync()
        #expect(laptopNet.exchanges.filter { $0.operation == "deltas/pull" }.flatMap(\.pulled) == [item.id])
        #expect(try laptopLists.items(of: list).first { $0.id == item.id }?.done == true)
    }

    @Test func whatTheServerMergedDifferentlyComesBack() async throws {
        let world = try SyncWorld()
        // The phone edits the same item while the laptop's push is on its way.
        let phoneSlot = Locked<(engine: ListsReplica, lists: Lists, armed: Bool)?>(nil)
        let (laptop, laptopLists, laptopNet) = try world.recordedDevice("laptop") { request in
            guard request.path.hasSuffix("deltas/push") else { return }
            phoneSlot.withLock { slot in
                guard let phone = slot, phone.armed, let list = try? phone.lists.resolve("Chores"),
                      let item = try? phone.lists.resolveItem("Dishes", in: list) else { return }
                slot = (phone.engine, phone.lists, false)
                try? phone.lists.setDone(item, in: list, true)
                let engine = phone.engine
                _ = try? waitForAsyncWork { try await engine.sync() } // on the transport's thread, not Swift's
            }
        }
        let account = try await laptop.signUpAndSignIn(name: "alice", serverURL: "http://x")
        let list = try laptopLists.create(title: "Chores")
        let dishes = try laptopLists.add("Dishes", to: list)
        _ = try laptopLists.add("Laundry", to: list)
        try await laptop.sync()
        let (phone, phoneLists, _) = try world.recordedDevice("phone")
        try await phone.signIn(serverURL: "http://x", token: account.token)
        try await phone.sync()
        phoneSlot.withLock { $0 = (phone, phoneLists, false) }

        try laptopLists.edit(dishes, in: list, text: "Wash the dishes", addTags: ["kitchen"], removeTags: [])
        laptopNet.reset()
        phoneSlot.withLock { $0?.armed = true }
        let report = try await laptop.sync()
        #expect(phoneSlot.value?.armed == false, "the concurrent edit did not run")
        #expect(report.queued == 0 && report.rejected.isEmpty)
        let answer = laptopNet.exchanges.flatMap(\.pushed).first { $0["recordName"]?.stringValue == dishes.id }
        #expect(answer?["upToDate"] == .bool(false), "\(String(describing: answer))")
        #expect(laptopNet.exchanges.filter { $0.operation == "deltas/pull" }.flatMap(\.pulled).contains(dishes.id))
        let merged = try #require(try laptopLists.items(of: list).first { $0.id == dishes.id })
        #expect(merged.text == "Wash the dishes" && merged.done && merged.tags == ["kitchen"], "\(merged)")
        try await phone.sync()
        #expect(try frames(phone) == frames(laptop))
    }

    @Test func threeDevicesEditingOfflineConvergeToTheSameBytes() async throws {
        let seed = testSeed()
        print("SyncEngineDeltaTests.threeDevicesEditingOfflineConvergeToTheSameBytes seed=\(seed)")
        var random = SplitMix64(seed: seed)
        let world = try SyncWorld()
        let (alice, aliceLists, aliceNet) = try world.recordedDevice("alice")
        let (phone, phoneLists, phoneNet) = try world.recordedDevice("alice-phone")
        let (bob, bobLists, bobNet) = try world.recordedDevice("bob")
        let account = try await alice.signUpAndSignIn(name: "alice", serverURL: "http://x")
        try await phone.signIn(serverURL: "http://x", token: account.token)
        try await bob.signUpAndSignIn(name: "bob", serverURL: "http://x")
        let list = try aliceLists.create(title: "Trip")
        for text in ["Tent", "Map", "Stove"] { _ = try aliceLists.add(text, tags: ["gear"], to: list) }
        try await alice.sync()
        _ = try await alice.callServer("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]), "rootRecordName": .string(list.id),
            "publicPermission": .string("readWrite"),
        ]))
        let url = try await #require(try alice.callServer("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]),
        ]))["url"]?.stringValue)
        _ = try await bob.callServer("shared", "records/accept",
            .object(["shortGUIDs": .array([.object(["value": .string(url)])])]))
        for device in [phone, bob] { try await device.sync() }

        // Offline edits on every device, then syncs in a random order until nothing moves.
        let devices: [(ListsReplica, Lists)] = [(alice, aliceLists), (phone, phoneLists), (bob, bobLists)]
        for round in 0..<4 {
            for (index, (_, lists)) in devices.enumerated() {
                let mine = try lists.resolve("Trip")
                for step in 0..<Int.random(in: 1...4, using: &random) {
                    let items = try lists.items(of: mine)
                    switch Int.random(in: 0..<4, using: &random) {
                    case 0: _ = try lists.add("r\(round) d\(index) s\(step)", tags: ["t\(index)"], to: mine)
                    case 1: if let item = items.randomElement(using: &random) { try lists.setDone(item, in: mine, !item.done) }
                    case 2: if let item = items.randomElement(using: &random) {
                        try lists.edit(item, in: mine, text: "\(item.text)+\(index)", addTags: ["e\(index)"],
                                       removeTags: ["gear"])
                    }
                    default:
                        if items.count > 3, let item = items.randomElement(using: &random) { try lists.remove(item, in: mine) }
                    }
                }
            }
            for index in [0, 1, 2].shuffled(using: &random) { _ = try await devices[index].0.sync() }
        }
        for _ in 0..<3 { for (engine, _) in devices { _ = try await engine.sync() } }
        let views = try devices.map { try $0.1.items(of: try $0.1.resolve("Trip")) }
        #expect(views[0] == views[1] && views[1] == views[2], "seed \(seed)")
        // The replicas hold the same bytes for every record of the list's zone. A participant has no tombstone
        // of a record deleted before it ever reached the share (the share's log never held it).
        let zoneFrames = { (engine: ListsReplica) throws -> [String: [UInt8]] in
            try frames(engine).filter { $0.key.hasPrefix("\(Lists.defaultZone)/\(account.userRecordName)/") }
        }
        let aliceFrames = try zoneFrames(alice), phoneFrames = try zoneFrames(phone), bobFrames = try zoneFrames(bob)
        #expect(aliceFrames == phoneFrames, "seed \(seed)")
        #expect(Set(bobFrames.keys).isSubset(of: aliceFrames.keys), "seed \(seed)")
        for (key, bytes) in aliceFrames {
            #expect(bobFrames[key] == nil || bobFrames[key] == bytes, "seed \(seed): \(key) differs on bob")
        }
        // Merged states travel on the binary path; a deletion is a records/modify.
        for net in [aliceNet, phoneNet, bobNet] {
            #expect(net.exchanges.contains { $0.operation == "deltas/push" })
            #expect(net.exchanges.contains { $0.operation == "deltas/pull" })
        }
    }
}

/// `ListsReplica.waitForChanges` (the engines' `waitForServerChanges(of:)`) over a real socket: one parked request for both databases while idle, and a
/// change made by another device seen well within two seconds.
@Suite(.serialized) struct SyncEngineWaitTests {
    final class LoopbackWorld {
        let world: SyncWorld
        let server: HTTPServer
        var url: String { "http://127.0.0.1:\(server.port)" }

        init() throws {
            world = try SyncWorld()
            server = try HTTPServer(handler: world.service, configuration: HTTPServerConfiguration(port: 0))
        }

        deinit { server.shutdown() }

        func device(_ name: String) throws -> (ListsReplica, Lists, RecordingTransport) {
            let transport = RecordingTransport(try HTTPTransport(serverURL: url))
            let replica = try ListsReplica(home: world.directory + "/home-\(name)", transport: transport)
            return (replica, Lists(replica: replica), transport)
        }
    }

    @Test func oneParkedRequestCoversBothDatabasesAndAChangeIsSeenQuickly() async throws {
        let loop = try LoopbackWorld()
        // bob watches: his own list (private database) and alice's list shared with him (shared database).
        let (alice, aliceLists, aliceNet) = try loop.device("alice")
        let (bob, bobLists, bobNet) = try loop.device("bob")
        let (bobPhone, bobPhoneLists, bobPhoneNet) = try loop.device("bob-phone")
        try await alice.signUpAndSignIn(name: "alice", serverURL: loop.url)
        let bobAccount = try await bob.signUpAndSignIn(name: "bob", serverURL: loop.url)
        try await bobPhone.signIn(serverURL: loop.url, token: bobAccount.token)
        let shared = try aliceLists.create(title: "Groceries")
        _ = try aliceLists.add("Milk", to: shared)
        try await alice.sync()
        _ = try await alice.callServer("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]), "rootRecordName": .string(shared.id),
            "publicPermission": .string("readOnly"),
        ]))
        let link = try await #require(try alice.callServer("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string(Lists.defaultZone)]),
        ]))["url"]?.stringValue)
        _ = try await bob.callServer("shared", "records/accept",
            .object(["shortGUIDs": .array([.object(["value": .string(link)])])]))
        _ = try bobLists.create(title: "Mine")
        try await bob.sync()
        try await bobPhone.sync()
        let mine = try bobPhoneLists.resolve("Mine")

        // Idle: what `lattice watch` does, waits of 2 s one after another, for about 5 s.
        bobNet.reset()
        let idleStart = Date()
        var waits = 0
        let samples = Locked<[Int]>([])
        let service = loop.world.service
        while Date().timeIntervalSince(idleStart) < 5 && waits < 10 {
            let sampler = DispatchSemaphore(value: 0)
            DispatchQueue.global().asyncAfter(deadline: .now() + 1) {
                let parked = service.notifier.waiterCount
                samples.withLock { $0.append(parked) }
                sampler.signal()
            }
            #expect(try await bob.waitForChanges(timeoutSeconds: 2) == false)
            _ = sampler.wait(timeout: .now() + 2)
            waits += 1
        }
        let idle = bobNet.exchanges
        let parkedSamples = samples.value
        let durations = idle.compactMap { exchange in exchange.finished.map { $0.timeIntervalSince(exchange.started) } }
        print("[watch idle] \(idle.count) requests in \(String(format: "%.1f", Date().timeIntervalSince(idleStart))) s: "
              + idle.map(\.operation).joined(separator: ", ") + "; durations "
              + durations.map { String(format: "%.2f", $0) }.joined(separator: ", ") + "; parked on the server: \(parkedSamples)")
        #expect(idle.allSatisfy { $0.operation == "changes/wait" && $0.database == "private" })
        #expect(idle.count == waits && idle.count <= 3)
        #expect(bobNet.mostInFlight == 1)
        #expect(durations.allSatisfy { $0 >= 1.9 }, "a wait returned before its timeout: \(durations)")
        #expect(parkedSamples.allSatisfy { $0 == 1 }, "\(parkedSamples)")
        for exchange in idle {
            let body = try JSON.parse(exchange.requestBody)
            let watched = body["databases"]?.arrayValue?.compactMap { $0["database"]?.stringValue }
            #expect(watched == ["private", "shared"], "\(body.serialized())")
        }

        // A change by another device: alice's to the shared list, then bob's phone's to his own list.
        var latencies: [String] = []
        let changes: [(label: String, writer: RecordingTransport, change: () async throws -> Void,
                       seen: @Sendable (Lists) throws -> Bool)] = [
            ("shared database (alice adds Eggs)", aliceNet, { _ = try aliceLists.add("Eggs", to: shared); try await alice.sync() },
             { lists in try lists.items(of: try lists.resolve("Groceries")).contains { $0.text == "Eggs" } }),
            ("private database (bob's phone adds Call mum)", bobPhoneNet,
             { _ = try bobPhoneLists.add("Call mum", to: mine); try await bobPhone.sync() },
             { lists in try lists.items(of: try lists.resolve("Mine")).contains { $0.text == "Call mum" } }),
        ]
        for (label, writer, change, seen) in changes {
            let done = DispatchSemaphore(value: 0)
            let outcome = Locked<(woken: Date?, seen: Date?, error: String?)>((nil, nil, nil))
            // The watcher: one wait, then a sync, as `lattice watch` does.
            Thread {
                defer { done.signal() }
                do {
                    guard try waitForAsyncWork({ try await bob.waitForChanges(timeoutSeconds: 10) }) else { return }
                    outcome.withLock { $0.woken = Date() }
                    _ = try waitForAsyncWork { try await bob.sync() }
                    if try seen(bobLists) { outcome.withLock { $0.seen = Date() } }
                } catch {
                    outcome.withLock { $0.error = "\(error)" }
                }
            }.start()
            try await Task.sleep(for: .milliseconds(300)) // parked by now
            writer.reset()
            let began = Date()
            try await change()
            var returned = false
            for _ in 0..<500 where !returned { // at most 10 s
                returned = done.wait(timeout: .now()) == .success
                if !returned { try await Task.sleep(for: .milliseconds(20)) }
            }
            #expect(returned, "\(label): the watcher never returned")
            let result = outcome.value
            #expect(result.error == nil, "\(label): \(result.error ?? "")")
            let woken = try #require(result.woken, "\(label): the wait was not woken")
            let visible = try #require(result.seen, "\(label): the change is not on bob's device after his sync")
            // The commit is inside the writer's deltas/push: it is done by the time that answer arrives.
            let committed = try #require(writer.exchanges.last { $0.operation == "deltas/push" }?.finished)
            let ms = { (interval: TimeInterval) in String(format: "%.0f ms", interval * 1000) }
            latencies.append("\(label): woken \(ms(woken.timeIntervalSince(committed))) and visible "
                             + "\(ms(visible.timeIntervalSince(committed))) after the commit (the writer's whole sync took "
                             + "\(ms(committed.timeIntervalSince(began))) up to it)")
            #expect(visible.timeIntervalSince(committed) < 2, "\(label): \(visible.timeIntervalSince(committed)) s")
            #expect(visible.timeIntervalSince(began) < 4, "\(label)")
        }
        print("[watch latency] " + latencies.joined(separator: "; "))
    }
}
