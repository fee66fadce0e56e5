import Foundation
import LatticeCore
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice serve` as a real process: killed with SIGKILL during a stream of atomic batches, restarted, and
/// checked. Also its graceful stop on SIGTERM.
@Suite(.serialized) struct CrashRecoveryTests {
    /// The `lattice` executable next to the test bundle (`swift build --build-tests` builds both), or
    /// `$LATTICE_BIN`.
    static var latticeBinary: String {
        if let path = ProcessInfo.processInfo.environment["LATTICE_BIN"] { return path }
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var directory = executable.deletingLastPathComponent()
        // The test binary sits inside LatticePackageTests.xctest on some layouts.
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        return directory.appendingPathComponent("lattice").path
    }

    /// What a process wrote to a pipe, collected by a reader thread.
    final class CollectedOutput: Sendable {
        let state = Mutex<(bytes: Data, ended: Bool)>((Data(), false))
    }

    /// A running `lattice serve` process.
    final class ServerUnderTest {
        let process = Process()
        let port: UInt16
        private let errors = Pipe()
        private let collected = CollectedOutput()

        init(data: String, extra: [String] = []) throws {
            process.executableURL = URL(fileURLWithPath: CrashRecoveryTests.latticeBinary)
            process.arguments = ["serve", "--data", data, "--port", "0"] + extra
            let output = Pipe()
            process.standardOutput = output
            process.standardError = errors
            try process.run()
            // Drain stderr all along (the access log writes a line per request there): a full pipe would
            // block the server.
            let errorHandle = errors.fileHandleForReading
            let collected = self.collected
            Thread {
                while true {
                    let data = errorHandle.availableData
                    if data.isEmpty { break }
                    collected.state.withLock { $0.bytes += data }
                }
                collected.state.withLock { $0.ended = true }
            }.start()
            // The first line is "listening on http://127.0.0.1:PORT".
            var line = [UInt8]()
            let handle = output.fileHandleForReading
            while true {
                let byte = handle.readData(ofLength: 1)
                guard let first = byte.first else { throw HarnessError("lattice serve exited before listening") }
                if first == UInt8(ascii: "\n") { break }
                line.append(first)
            }
            let text = String(decoding: line, as: UTF8.self)
            guard text.hasPrefix("listening on http://127.0.0.1:"), let port = UInt16(text.split(separator: ":").last ?? "") else {
                throw HarnessError("unexpected first line: \(text)")
            }
            self.port = port
        }

        func kill(_ signal: Int32) {
            Glibc.kill(process.processIdentifier, signal)
            process.waitUntilExit()
        }

        /// Everything the server wrote to stderr so far (all of it, once the process has exited).
        var standardError: String {
            if !process.isRunning {
                for _ in 0..<200 where !collected.state.withLock({ $0.ended }) { Thread.sleep(forTimeInterval: 0.01) }
            }
            return String(decoding: collected.state.withLock { $0.bytes }, as: UTF8.self)
        }
    }

    private static func signUp(_ port: UInt16) throws -> String {
        let client = try RawHTTPClient(port: port)
        let reply = try client.send(method: "POST", path: "/auth/signup", body: Array(#"{"name":"crash"}"#.utf8))
        guard let token = try JSON.parse(reply.body)["token"]?.stringValue else { throw HarnessError("signup failed") }
        let zone = try client.send(method: "POST", path: "/database/1/lattice/production/private/zones/modify",
                                   headers: ["Authorization": "Bearer " + token],
                                   body: Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Batches"}}}]}"#.utf8))
        guard zone.status == 200 else { throw HarnessError("zone create failed") }
        return token
    }

    private static func batchBody(_ batch: Int, size: Int) -> [UInt8] {
        let operations: [JSON] = (0..<size).map { item in
            .object(["operationType": .string("create"), "record": .object([
                "recordName": .string("b\(batch)-\(item)"), "recordType": .string("Item"),
                "fields": .object(["batch": .object(["value": .int(Int64(batch))]),
                                   "payload": .object(["value": .string(String(repeating: "p", count: 200))])]),
            ])])
        }
        return JSON.object(["zoneID": .object(["zoneName": .string("Batches")]), "atomic": .bool(true),
                            "clientOperationID": .string("batch-\(batch)"), "operations": .array(operations)])
            .serializedBytes()
    }

    @Test func sigkillDuringAtomicBatchesLosesNothingAcknowledgedAndHalfAppliesNothing() throws {
        let data = temporaryDirectory("lattice-crash")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let batchSize = 20
        let first = try ServerUnderTest(data: data)
        let token = try Self.signUp(first.port)
        let headers = ["Authorization": "Bearer " + token]

        // Four writers stream batches; the server is killed while they are mid-request.
        let acknowledged = Mutex<Set<Int>>([])
        let attempted = Mutex<Set<Int>>([])
        let writers = 4
        let group = DispatchGroup()
        let port = first.port
        for writer in 0..<writers {
            group.enter()
            Thread {
                defer { group.leave() }
                guard let client = try? RawHTTPClient(port: port, timeoutSeconds: 5) else { return }
                var batch = writer
                while true {
                    attempted.withLock { _ = $0.insert(batch) }
                    guard let reply = try? client.send(method: "POST", path: "/database/1/lattice/production/private/records/modify",
                                                       headers: headers, body: Self.batchBody(batch, size: batchSize)),
                          reply.status == 200,
                          let items = try? JSON.parse(reply.body)["records"]?.arrayValue,
                          items.count == batchSize, items.allSatisfy({ $0["serverErrorCode"] == nil })
                    else { return } // the server is gone
                    acknowledged.withLock { _ = $0.insert(batch) }
                    batch += writers
                }
            }.start()
        }
        // Let a good number of batches through, then kill without warning.
        let deadline = Date().addingTimeInterval(20)
        while acknowledged.withLock({ $0.count }) < 40 && Date() < deadline { usleep(10_000) }
        first.kill(SIGKILL)
        group.wait()
        let acked = acknowledged.withLock { $0 }
        let tried = attempted.withLock { $0 }
        #expect(acked.count >= 40)
        print(#"{"crash_test":"sigkill","acknowledged_batches":\#(acked.count),"attempted_batches":\#(tried.count)}"#)

        // Restart on the same data directory.
        let second = try ServerUnderTest(data: data)
        defer { second.kill(SIGTERM) }
        let client = try RawHTTPClient(port: second.port, timeoutSeconds: 10)
        var present: [String: Int] = [:]
        var feedCount = 0
        var syncToken: JSON = .null
        repeat {
            var request: [String: JSON] = ["zoneID": .object(["zoneName": .string("Batches")])]
            if syncToken != .null { request["syncToken"] = syncToken }
            let reply = try client.send(method: "POST", path: "/database/1/lattice/production/private/changes/zone",
                                        headers: headers, body: JSON.object(["zones": .array([.object(request)])]).serializedBytes())
            let zone = try #require(try JSON.parse(reply.body)["zones"]?.arrayValue?.first)
            for record in zone["records"]?.arrayValue ?? [] {
                feedCount += 1
                if let batch = record["fields"]?["batch"]?["value"]?.intValue { present[record["recordName"]!.stringValue!] = Int(batch) }
            }
            syncToken = zone["syncToken"] ?? .null
            if zone["moreComing"] != .bool(true) { break }
        } while true
        #expect(feedCount == present.count, "the feed lists a record twice")
        var perBatch: [Int: Int] = [:]
        for batch in present.values { perBatch[batch, default: 0] += 1 }
        for (batch, count) in perBatch { #expect(count == batchSize, "batch \(batch) is half applied: \(count) records") }
        for batch in acked { #expect(perBatch[batch] == batchSize, "acknowledged batch \(batch) is missing") }
        #expect(Set(perBatch.keys).isSubset(of: tried))

        // A batch in flight at the kill can be retried with its operation id: it applies exactly once.
        for batch in tried.subtracting(acked) {
            let reply = try client.send(method: "POST", path: "/database/1/lattice/production/private/records/modify",
                                        headers: headers, body: Self.batchBody(batch, size: batchSize))
            let items = try JSON.parse(reply.body)["records"]?.arrayValue ?? []
            let created = items.filter { $0["serverErrorCode"] == nil }.count
            let exists = items.filter { $0["serverErrorCode"]?.stringValue == "EXISTS" }.count
            // Either it had committed (replayed or EXISTS) or it applies now, whole.
            #expect(created == batchSize || exists == batchSize || reply.headers["lattice-replayed"] == "true")
        }
    }

    @Test func sigtermStopsGracefullyAndClosesTheDatabase() throws {
        let data = temporaryDirectory("lattice-term")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data)
        let token = try Self.signUp(server.port)
        // A long poll is open when the signal arrives: it is answered, not cut off.
        let port = server.port
        let answer = Mutex<RawHTTPClient.Response?>(nil)
        let waiter = Thread {
            let reply = try? RawHTTPClient(port: port, timeoutSeconds: 20).send(method: "POST", path: "/database/1/lattice/production/private/changes/wait",
                                         headers: ["Authorization": "Bearer " + token], body: Array(#"{"timeout":30}"#.utf8))
            answer.withLock { $0 = reply }
        }
        waiter.start()
        usleep(500_000)
        server.kill(SIGTERM)
        #expect(server.process.terminationStatus == 0)
        usleep(200_000)
        let reply = try #require(answer.withLock { $0 })
        #expect(reply.status == 503)
        // Closed cleanly: the WAL was checkpointed away, and the data opens again with everything in it.
        #expect(!FileManager.default.fileExists(atPath: data + "/lattice.sqlite-wal")
            || ((try? FileManager.default.attributesOfItem(atPath: data + "/lattice.sqlite-wal")[.size] as? Int) ?? 0) == 0)
        let again = try ServerUnderTest(data: data)
        defer { again.kill(SIGTERM) }
        let check = try RawHTTPClient(port: again.port)
        let current = try check.send(method: "POST", path: "/database/1/lattice/production/private/users/current",
                                     headers: ["Authorization": "Bearer " + token])
        #expect(current.status == 200)
    }

    @Test func closedRegistrationAndAdminAddUserOnARunningServer() throws {
        let data = temporaryDirectory("lattice-admin")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data, extra: ["--registration", "closed"])
        defer { server.kill(SIGTERM) }
        let client = try RawHTTPClient(port: server.port)
        let refused = try client.send(method: "POST", path: "/auth/signup", body: Array(#"{"name":"ann"}"#.utf8))
        #expect(refused.status == 403)
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "ACCESS_DENIED")

        let admin = Process()
        admin.executableURL = URL(fileURLWithPath: Self.latticeBinary)
        admin.arguments = ["admin", "add-user", "ann", "--data", data, "--json"]
        let output = Pipe()
        admin.standardOutput = output
        try admin.run()
        admin.waitUntilExit()
        #expect(admin.terminationStatus == 0)
        let created = try JSON.parse([UInt8](output.fileHandleForReading.readDataToEndOfFile()))
        let token = try #require(created["token"]?.stringValue)
        let current = try client.send(method: "POST", path: "/database/1/lattice/production/private/users/current",
                                      headers: ["Authorization": "Bearer " + token])
        #expect(current.status == 200)
        #expect(try JSON.parse(current.body)["userRecordName"] == created["userRecordName"])

        // The same name again is an error (exit 1), and a usage mistake is exit 2.
        for (arguments, status) in [(["admin", "add-user", "ann", "--data", data], Int32(1)),
                                    (["admin", "add-user", "--data", data], Int32(2)),
                                    (["serve", "--port", "99999", "--data", data], Int32(2))] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: Self.latticeBinary)
            process.arguments = arguments
            process.standardOutput = Pipe()
            process.standardError = Pipe()
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == status, "\(arguments)")
        }
    }

    @Test func aSecondServerOnTheSameDataDirectoryIsRefused() throws {
        let data = temporaryDirectory("lattice-lock")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data)
        defer { server.kill(SIGTERM) }
        #expect(throws: (any Error).self) { _ = try ServerUnderTest(data: data) }
    }
}
