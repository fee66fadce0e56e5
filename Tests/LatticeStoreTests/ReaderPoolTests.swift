import Dispatch
import Foundation
import Synchronization
import Testing
@testable import LatticeStore

/// The SQLite backend's reader pool, its authentication lane and the request deadline. Overlap is shown by
/// ordering (a read finishes while another is still inside its transaction), never by timing; every wait is
/// bounded, so a regression fails instead of hanging.
@Suite("Reader pool and deadlines")
struct ReaderPoolTests {
    private func temporaryPath() -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("lattice-pool-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        return directory.appendingPathComponent("test.sqlite").path
    }

    /// A statement that runs until it is interrupted (a recursive count far past any test's patience).
    private static let endless = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 100000000000) "
        + "SELECT count(*) FROM n"

    private func runEndless(_ tx: any StorageTransaction) throws {
        let sqlite = try #require(tx as? SQLiteTransaction)
        do {
            _ = try sqlite.db.prepare(Self.endless).rows()
        } catch {
            throw StorageError(error)
        }
    }

    /// Holds a body inside its transaction until released; waits are bounded (10 s).
    final class Gate: Sendable {
        let entered = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        func hold() {
            entered.signal()
            _ = release.wait(timeout: .now() + 10)
        }
        func waitEntered() -> Bool { entered.wait(timeout: .now() + 10) == .success }
    }

    /// Shared state for the threads of a test (a class: its lock-guarded members can be captured).
    final class Shared: Sendable {
        let events = Mutex<[String]>([])
        let count = Atomic<Int>(0)
        let passed = Atomic<Int>(0)
        let flag = Atomic<Bool>(false)
        func log(_ event: String) { events.withLock { $0.append(event) } }
    }

    @Test func aLongReadOrWriteDoesNotBlockAuthenticationOrAShortRead() throws {
        let storage = try SQLiteStorage(path: temporaryPath(), readerConnections: 2)
        defer { storage.close() }
        try storage.write { tx in
            _ = try tx.insertUser(name: "ann", recordName: "_" + String(repeating: "a", count: 32), nowMs: 1)
            try tx.insertToken(hash: [1, 2, 3], userID: 1, nowMs: 1)
        }
        let shared = Shared()
        for holder in ["read", "write"] {
            let gate = Gate()
            let done = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                if holder == "read" {
                    _ = try? storage.read { _ in gate.hold() }
                } else {
                    try? storage.write { tx in
                        try tx.setMetadata("held", "yes")
                        gate.hold()
                    }
                }
                shared.log("\(holder) released")
                done.signal()
            }
            #expect(gate.waitEntered())
            // While the long one is inside its transaction: an authentication and a short read both finish.
            let user = try storage.read(deadline: .after(milliseconds: 10_000), lane: .authentication) {
                try $0.user(tokenHash: [1, 2, 3])
            }
            shared.log("authenticated during \(holder)")
            let name = try storage.read(deadline: .after(milliseconds: 10_000)) { try $0.user(id: 1)?.name }
            shared.log("short read during \(holder)")
            #expect(user?.name == "ann" && name == "ann")
            gate.release.signal()
            #expect(done.wait(timeout: .now() + 10) == .success)
        }
        #expect(shared.events.withLock { $0 } == ["authenticated during read", "short read during read", "read released",
                                           "authenticated during write", "short read during write", "write released"])
    }

    @Test func severalReadersAreInsideTheirTransactionsAtOnce() throws {
        let storage = try SQLiteStorage(path: temporaryPath(), readerConnections: 3)
        defer { storage.close() }
        #expect(storage.readerConnections == 3)
        let shared = Shared()
        let allInside = DispatchSemaphore(value: 0)
        let group = DispatchGroup()
        for _ in 0..<3 {
            group.enter()
            Thread.detachNewThread {
                _ = try? storage.read { tx in
                    _ = try tx.metadata("x")
                    if shared.count.add(1, ordering: .sequentiallyConsistent).newValue == 3 {
                        allInside.signal()
                        allInside.signal()
                        allInside.signal()
                    }
                    // Each stays inside until all three are: possible only if they read at once.
                    if allInside.wait(timeout: .now() + 10) == .success { shared.passed.add(1, ordering: .sequentiallyConsistent) }
                }
                group.leave()
            }
        }
        #expect(group.wait(timeout: .now() + 20) == .success)
        let passed = shared.passed.load(ordering: .sequentiallyConsistent)
        #expect(passed == 3)
    }

    @Test func aFullPoolMakesAGeneralReadWaitOnlyUntilItsDeadlineButNotAuthentication() throws {
        let storage = try SQLiteStorage(path: temporaryPath(), readerConnections: 1)
        defer { storage.close() }
        let gate = Gate()
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            _ = try? storage.read { _ in gate.hold() }
            done.signal()
        }
        #expect(gate.waitEntered())
        #expect(throws: StorageError.deadlineExceeded) {
            try storage.read(deadline: .after(milliseconds: 50)) { try $0.metadata("x") }
        }
        #expect(try storage.read(deadline: .after(milliseconds: 10_000), lane: .authentication) { try $0.metadata("x") } == nil)
        gate.release.signal()
        #expect(done.wait(timeout: .now() + 10) == .success)
        // The connection came back: the lane works again.
        #expect(try storage.read(deadline: .after(milliseconds: 10_000)) { try $0.metadata("x") } == nil)
    }

    @Test func aReadPastItsDeadlineIsInterrupted() throws {
        let storage = try SQLiteStorage(path: temporaryPath())
        defer { storage.close() }
        for lane in [ReadLane.general, .authentication] {
            #expect(throws: StorageError.deadlineExceeded) {
                try storage.read(deadline: .after(milliseconds: 200), lane: lane) { try runEndless($0) }
            }
            // The connection is whole again for the next use.
            #expect(try storage.read(deadline: .after(milliseconds: 10_000), lane: lane) { try $0.metadata("x") } == nil)
        }
    }

    @Test func aWritePastItsDeadlineLeavesNothing() throws {
        let storage = try SQLiteStorage(path: temporaryPath())
        defer { storage.close() }
        #expect(throws: StorageError.deadlineExceeded) {
            try storage.write(deadline: .after(milliseconds: 200)) { tx in
                try tx.setMetadata("before", "written")
                try runEndless(tx)
            }
        }
        // A body that swallows the interruption and goes on: its later statements are refused, and what it
        // returns is not committed.
        let shared = Shared()
        #expect(throws: StorageError.deadlineExceeded) {
            try storage.write(deadline: .after(milliseconds: 200)) { tx in
                try tx.setMetadata("swallowed", "written")
                try? runEndless(tx)
                do { try tx.setMetadata("after", "written") } catch { shared.flag.store(true, ordering: .sequentiallyConsistent) }
            }
        }
        let refusedLater = shared.flag.load(ordering: .sequentiallyConsistent)
        #expect(refusedLater)
        for key in ["before", "swallowed", "after"] {
            #expect(try storage.read { try $0.metadata(key) } == nil, "\(key)")
        }
        // A write that finishes inside its deadline commits.
        try storage.write(deadline: .after(milliseconds: 10_000)) { try $0.setMetadata("in time", "yes") }
        #expect(try storage.read { try $0.metadata("in time") } == "yes")
    }

    @Test func aWriteWaitingForTheWriterGivesUpAtItsDeadline() throws {
        let storage = try SQLiteStorage(path: temporaryPath())
        defer { storage.close() }
        let gate = Gate()
        let done = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            try? storage.write { tx in
                try tx.setMetadata("first", "yes")
                gate.hold()
            }
            done.signal()
        }
        #expect(gate.waitEntered())
        #expect(throws: StorageError.deadlineExceeded) {
            try storage.write(deadline: .after(milliseconds: 50)) { try $0.setMetadata("second", "yes") }
        }
        gate.release.signal()
        #expect(done.wait(timeout: .now() + 10) == .success)
        #expect(try storage.read { try $0.metadata("first") } == "yes")
        #expect(try storage.read { try $0.metadata("second") } == nil)
    }

    @Test func deadlinesCountDownOnTheMonotonicClock() {
        let soon = RequestDeadline.after(milliseconds: 60_000)
        #expect(!soon.hasPassed)
        #expect((59_000...60_000).contains(soon.remainingMilliseconds))
        let past = RequestDeadline.after(milliseconds: 0)
        #expect(past.hasPassed && past.remainingMilliseconds == 0)
        #expect(throws: StorageError.deadlineExceeded) { try past.check() }
        #expect(RequestDeadline.after(milliseconds: .max).uptimeNanoseconds == .max)
        let none: RequestDeadline? = nil
        #expect(throws: Never.self) { try none.check() }
    }
}
