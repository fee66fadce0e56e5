import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The binary path over a real socket (127.0.0.1): binary bodies both ways, the adapter's body cap, and
/// `lattice watch` costing one parked request while idle and showing another device's change quickly.
@Suite(.serialized) struct DeltaLoopbackTests {
    /// The service behind a handler that logs each request's operation, start and end.
    final class LoggingHandler: HTTPHandler {
        struct Entry: Sendable {
            let id: Int
            let path: String
            let body: [UInt8]
            let started: Date
            var finished: Date?
        }

        let service: LatticeService
        private let entries = Mutex<[Entry]>([])
        private let nextID = Atomic<Int>(0)

        init(_ service: LatticeService) { self.service = service }

        var maximumBodySize: Int { service.maximumBodySize }
        func responseForOversizedBody() -> HTTPResponse { service.responseForOversizedBody() }
        func beginShutdown() { service.beginShutdown() }

        func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
            let id = nextID.add(1, ordering: .relaxed).newValue
            entries.withLock { $0.append(Entry(id: id, path: request.path, body: request.body, started: Date())) }
            service.handle(request) { [self] response in
                // The entry is gone when the log was reset while the request was in flight.
                entries.withLock { entries in
                    if let index = entries.firstIndex(where: { $0.id == id }) { entries[index].finished = Date() }
                }
                respond(response)
            }
        }

        var log: [Entry] { entries.withLock { $0 } }
        func reset() { entries.withLock { $0 = [] } }
    }

    final class Loopback {
        let directory = temporaryDirectory("lattice-deltas")
        let storage: SQLiteStorage
        let service: LatticeService
        let handler: LoggingHandler
        let server: HTTPServer
        var url: String { "http://127.0.0.1:\(server.port)" }

        init() throws {
            storage = try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
            var configuration = ServiceConfiguration()
            configuration.rateLimit = nil
            let keyRing = try ShareKeyRing.open(directory: directory, nowMilliseconds: configuration.now())
            service = try LatticeService(storage: storage, configuration: configuration, keyRing: keyRing, log: { _ in })
            handler = LoggingHandler(service)
            server = try HTTPServer(handler: handler, configuration: HTTPServerConfiguration(port: 0))
            service.setPublicURL("http://127.0.0.1:\(server.port)")
        }

        deinit {
            server.shutdown()
            storage.close()
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    @Test func binaryBodiesBothWaysAndTheBodyCap() throws {
        let loop = try Loopback()
        let account = try loop.service.createAccount(name: "ann")
        let headers = ["Authorization": "Bearer " + account.token.text, "Content-Type": SyncMessage.contentType]
        let zoneID = try ZoneID(zoneName: Names.systemZoneName, ownerRecordName: account.user.recordName)
        var device = DeviceStates(zoneID: zoneID, replica: 0x51, clock: TestClock(Int64(Date().timeIntervalSince1970 * 1000)))
        let client = try RawHTTPClient(port: loop.server.port, timeoutSeconds: 30)

        // Three records of 800 KB: each under the per-record limit, together over the 2 MiB body cap.
        let big = try (0..<3).map { index -> Record in
            var record = try device.make("big\(index)")
            try record.set("text", to: .string(String(repeating: "b", count: 800_000)), at: device.stamp())
            return record
        }
        let oversized = try DeltaBytes.push(zoneID, big)
        #expect(oversized.count > loop.service.maximumBodySize)
        let refused = try client.send(method: "POST", path: ServiceHarness.databasePath("private", "deltas/push"),
                                      headers: headers, body: oversized)
        #expect(refused.status == 413)
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED")
        #expect(!loop.handler.log.contains { $0.path.hasSuffix("deltas/push") }, "the service saw the oversized body")

        // Under the cap: pushed in binary, answered in JSON; pulled in binary, the same frames.
        let records = [big[0], try device.make("small", fields: ["n": .int64(1)])]
        let client2 = try RawHTTPClient(port: loop.server.port, timeoutSeconds: 30)
        let pushed = try client2.send(method: "POST", path: ServiceHarness.databasePath("private", "deltas/push"),
                                      headers: headers, body: try DeltaBytes.push(zoneID, records))
        #expect(pushed.status == 200 && pushed.headers["content-type"]?.hasPrefix("application/json") == true)
        let items = try JSON.parse(pushed.body)["records"]?.arrayValue ?? []
        #expect(items.map(itemCode) == ["OK", "OK"] && items.allSatisfy { $0["upToDate"] == .bool(true) })
        let pullBody = JSON.object(["zoneID": .object(["zoneName": .string(Names.systemZoneName)])]).serializedBytes()
        let pulled = try client2.send(method: "POST", path: ServiceHarness.databasePath("private", "deltas/pull"),
                                      headers: ["Authorization": "Bearer " + account.token.text,
                                                "Content-Type": "application/json"], body: pullBody)
        #expect(pulled.status == 200 && pulled.headers["content-type"] == SyncMessage.contentType)
        let message = try SyncMessage.Pull(decoding: pulled.body)
        let frames = try EncodedDelta(validating: message.delta).recordFrames()
        #expect(frames.map(\.bytes) == (try records.map { try RecordFrame(encoding: $0).bytes }))
        #expect(!message.moreComing && message.skipped.isEmpty)
    }

    @Test func watchHoldsOnePushStreamWhileIdleAndShowsAChangeQuickly() throws {
        let loop = try Loopback()
        let alice = loop.directory + "/alice", bob = loop.directory + "/bob", bobPhone = loop.directory + "/bob-phone"
        try CLITests.ok("signup", "alice", "--server", loop.url, home: alice)
        let signedUp = try CLITests.ok("signup", "bob", "--server", loop.url, "--json", home: bob).json
        let bobToken = try #require(signedUp["token"]?.stringValue, "\(signedUp)")
        try CLITests.ok("login", "--server", loop.url, "--token", bobToken, home: bobPhone)
        try CLITests.ok("list", "create", "Groceries", home: alice)
        try CLITests.ok("list", "add", "Groceries", "Milk", home: alice)
        try CLITests.ok("share", "create", "Groceries", "--public-permission", "read-only", home: alice)
        let link = try #require(try CLITests.ok("share", "url", "Groceries", "--json", home: alice).json["url"]?.stringValue)
        try CLITests.ok("accept", link, "--yes", home: bob)
        try CLITests.ok("list", "create", "Mine", home: bob)
        try CLITests.ok("sync", home: bobPhone)

        let (watch, output, errors) = try CLITests.start(["watch"], home: bob)
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        let ready = Date().addingTimeInterval(20)
        while !errors.text.contains("watching") && Date() < ready && watch.isRunning { usleep(20_000) }
        #expect(errors.text.contains("watching all lists"), "\(errors.text)")
        Thread.sleep(forTimeInterval: 0.5) // past the start-up sync

        // Idle for about 5 s: the watch holds one push stream (no parked long poll, no thread on the server), and
        // sends at most the 0 s changes/wait check that starts each of its 25 s waits.
        loop.handler.reset()
        let idleStart = Date()
        var parked: [Int] = []
        var streams: [Int] = []
        for _ in 0..<5 {
            Thread.sleep(forTimeInterval: 1)
            parked.append(loop.service.notifier.waiterCount)
            streams.append(loop.service.pushStreams.streamCount)
        }
        let idle = loop.handler.log
        let idleEnd = Date()
        let operations = idle.map { String($0.path.split(separator: "/").dropFirst(5).joined(separator: "/")) }
        print("[lattice watch idle] \(idle.count) requests in \(String(format: "%.1f", idleEnd.timeIntervalSince(idleStart))) s: "
              + operations.joined(separator: ", ") + "; parked long polls each second: \(parked); push streams: \(streams)")
        #expect(operations.allSatisfy { $0 == "changes/wait" }, "\(operations)")
        #expect((0...1).contains(idle.count), "\(idle.count) requests while idle")
        #expect(parked.allSatisfy { $0 == 0 }, "\(parked)")
        #expect(streams.allSatisfy { $0 == 1 }, "\(streams)")
        for entry in idle {
            let body = try JSON.parse(entry.body)
            #expect(body["databases"]?.arrayValue?.compactMap { $0["database"]?.stringValue } == ["private", "shared"])
            #expect(body["timeout"] == .int(0), "only the 0 s check: \(body.serialized())")
        }

        // A change by another device, in each database: shown within 2 s of its commit.
        var latencies: [String] = []
        for (label, home, arguments, shown) in [
            ("shared database", alice, ["list", "add", "Groceries", "Eggs"], "+ Groceries: [ ] Eggs"),
            ("private database", bobPhone, ["list", "add", "Mine", "Call mum"], "+ Mine: [ ] Call mum"),
        ] {
            loop.handler.reset()
            let began = Date()
            let (writer, writerOutput, writerErrors) = try CLITests.start(arguments, home: home)
            while !output.text.contains(shown) && Date().timeIntervalSince(began) < 10 && watch.isRunning { usleep(5_000) }
            let seen = Date()
            writer.waitUntilExit()
            _ = (writerOutput.finish(), writerErrors.finish())
            #expect(output.text.contains(shown), "\(label): \(output.text)")
            let commit = try #require(loop.handler.log.first { $0.path.hasSuffix("deltas/push") }?.finished, "\(label): no push")
            let latency = seen.timeIntervalSince(commit)
            latencies.append("\(label): \(String(format: "%.0f", latency * 1000)) ms after the commit "
                             + "(\(String(format: "%.0f", seen.timeIntervalSince(began) * 1000)) ms after the writer started)")
            #expect(latency < 2, "\(label): \(latency) s")
        }
        print("[lattice watch latency] " + latencies.joined(separator: "; "))
        kill(watch.processIdentifier, SIGINT)
        watch.waitUntilExit()
        #expect(watch.terminationStatus == 0)
        _ = (output.finish(), errors.finish())
    }
}
