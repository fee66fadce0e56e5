import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice serve` as a real process: killed with SIGKILL during a stream of atomic batches, restarted, and
/// checked. Also its graceful stop on SIGTERM.
@Suite(.serialized, .tags(.postgres)) struct CrashRecoveryTests {
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

    /// `kill -9` at random moments during concurrent atomic batches from several accounts: 20 runs, or
    /// `LATTICE_CRASH_RUNS`; `LATTICE_CRASH_SEED` replays a printed seed's choices (kill moments, batch
    /// sizes, which answered batches are retried). See `CrashSuite` for what each restart checks.
    @Test func sigkillAtRandomPointsDuringConcurrentAtomicBatches() throws {
        let environment = ProcessInfo.processInfo.environment
        let runs = environment["LATTICE_CRASH_RUNS"].flatMap { Int($0) }.map { min(max($0, 1), 10_000) } ?? 20
        let seed = environment["LATTICE_CRASH_SEED"].flatMap { UInt64($0) } ?? UInt64.random(in: 1...UInt64(UInt32.max))
        print(#"{"crash_test":"seed","seed":\#(seed),"runs":\#(runs)}"#)
        let data = temporaryDirectory("lattice-crash")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let started = Date()
        let counts = try CrashSuite(data: data, runs: runs, seed: seed).run()
        print(counts.json.dropLast() + #","seed":\#(seed),"seconds":\#(Int(Date().timeIntervalSince(started)))}"#)
        #expect(counts.runs == runs)
        #expect(counts.acknowledgedBatches >= runs, "too few writes got through before the kills to test anything")
        #expect(counts.partialBatches == 0)
        #expect(counts.missingAcknowledged == 0)
        #expect(counts.integrityOK + counts.integrityNotChecked == runs && counts.integrityFailed == 0)
        #expect(TestBackend.current != .sqlite || counts.integrityOK == runs)
        #expect(counts.retriesFailed == 0 && counts.doubleApplications == 0)
        #expect(counts.writerAnomalies == 0)
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
        // Closed cleanly: the WAL was checkpointed away (SQLite), and the data opens again with everything in it.
        #expect(TestBackend.current != .sqlite || !FileManager.default.fileExists(atPath: data + "/lattice.sqlite-wal")
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
        admin.executableURL = URL(fileURLWithPath: latticeBinary)
        admin.arguments = ["admin", "add-user", "ann", "--json"] + (try TestBackend.storageArguments(data: data))
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
        let storage = try TestBackend.storageArguments(data: data)
        for (arguments, status) in [(["admin", "add-user", "ann"] + storage, Int32(1)),
                                    (["admin", "add-user"] + storage, Int32(2)),
                                    (["serve", "--port", "99999", "--data", data], Int32(2))] {
            let process = Process()
            process.executableURL = URL(fileURLWithPath: latticeBinary)
            process.arguments = arguments
            process.standardOutput = Pipe()
            process.standardError = Pipe()
            try process.run()
            process.waitUntilExit()
            #expect(process.terminationStatus == status, "\(arguments)")
        }
    }

    /// SQLite only: on PostgreSQL several servers share one database by design (MultiNodeTests).
    @Test(.enabled(if: TestBackend.current == .sqlite))
    func aSecondServerOnTheSameDataDirectoryIsRefused() throws {
        let data = temporaryDirectory("lattice-lock")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data)
        defer { server.kill(SIGTERM) }
        #expect(throws: (any Error).self) { _ = try ServerUnderTest(data: data) }
    }
}
