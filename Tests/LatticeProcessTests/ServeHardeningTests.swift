import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice serve` hygiene: SIGTERM ends the process even when a handler is stuck, and the data directory
/// and its files are made owner-only (or the server refuses to start, saying why).
@Suite(.serialized) struct ServeHardeningTests {
    @Test func sigtermEndsTheProcessAfterTheGracePeriodEvenWithAStuckHandler() throws {
        let data = temporaryDirectory("lattice-stuck")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data, extra: ["--shutdown-grace", "1"])

        // Another connection holds SQLite's write lock, so the server's next write is stuck in SQLite's busy
        // wait; and closing the database, which checkpoints, is stuck behind the same lock.
        let blocker = try SQLiteStorage(path: data + "/" + SQLiteStorage.fileName)
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let done = DispatchSemaphore(value: 0)
        Thread {
            try? blocker.write { _ in
                holding.signal()
                _ = release.wait(timeout: .now() + 40)
            }
            done.signal()
        }.start()
        #expect(holding.wait(timeout: .now() + 10) == .success)

        let port = server.port
        Thread {
            _ = try? RawHTTPClient(port: port, timeoutSeconds: 30)
                .send(method: "POST", path: "/auth/signup", body: Array(#"{"name":"stuck"}"#.utf8))
        }.start()
        Thread.sleep(forTimeInterval: 1) // let the sign-up reach its write

        kill(server.process.processIdentifier, SIGTERM)
        var polls = 0
        while server.process.isRunning && polls < 400 {  // 40 s at most
            Thread.sleep(forTimeInterval: 0.1)
            polls += 1
        }
        let exited = !server.process.isRunning
        release.signal()
        _ = done.wait(timeout: .now() + 10)
        blocker.close()
        #expect(exited, "lattice serve did not exit after SIGTERM")
        guard exited else {
            server.kill(SIGKILL)
            return
        }
        #expect(server.process.terminationReason == .exit)
        #expect(server.process.terminationStatus == 1)
        let log = server.standardError
        #expect(log.contains("shutting down"))
        #expect(log.contains("still stopping 6 s after the signal"), "stderr: \(log)")
    }

    @Test func anOpenDataDirectoryIsMadePrivateAndItsFilesOwnerOnly() throws {
        let data = temporaryDirectory("lattice-mode")
        defer { try? FileManager.default.removeItem(atPath: data) }
        #expect(chmod(data, 0o755) == 0)
        let messages = Mutex<[String]>([])
        var options = ServerProcess.Options(dataDirectory: data)
        options.http.port = 0
        let server = try ServerProcess(options, log: { line in messages.withLock { $0.append(line) } })
        defer { server.stop() }

        #expect(mode(data) == 0o700)
        #expect(mode(data + "/lattice.lock") == 0o600)
        #expect(mode(data + "/" + SQLiteStorage.fileName) == 0o600)
        #expect(messages.withLock { $0 }.contains { $0.contains("had mode 755; changed it to 700") })
    }

    @Test func aDataDirectoryThatCannotBeMadePrivateIsRefused() throws {
        // /proc/self is a directory (mode 555) whose mode nobody may change, not even root.
        let options = ServerProcess.Options(dataDirectory: "/proc/self")
        do {
            _ = try ServerProcess(options, log: { _ in })
            Issue.record("the server started on /proc/self")
        } catch {
            let message = String(describing: error)
            #expect(message.contains("has mode 555, open to group or others, and it cannot be made 0700"), "\(message)")
            #expect(message.contains("chmod 700"))
        }
    }

    private func mode(_ path: String) -> mode_t {
        var status = stat()
        guard stat(path, &status) == 0 else { return 0 }
        return status.st_mode & 0o7777
    }
}
