import Dispatch
import Foundation
import LatticeCore
import Synchronization
import Testing
@testable import LatticeStore
import LatticeTestSupport

/// The PostgreSQL backend's own behaviour, beyond the contract: binding, SQLSTATE mapping, retries, deadlines,
/// lost connections, several processes' worth of storages on one database, and commit order under concurrent
/// writers. Each test uses a fresh database on the cluster in `LATTICE_TEST_POSTGRES_URL` (without it every
/// test here fails, saying how to start one). Every wait and loop is bounded.
@Suite("PostgreSQL storage")
struct PostgresStorageTests {
    private static let ann = "_00000000000000000000000000000a11"

    /// State the test's threads share (noncopyable atomics and mutexes live in a class).
    final class Shared: Sendable {
        let count = Atomic<Int>(0)
        let flag = Atomic<Bool>(false)
        let failures = Mutex<[String]>([])
        let seen = Mutex<[ClientOperation?]>([])
        let answer = Mutex<String?>(nil)
        func fail(_ error: any Error) { failures.withLock { $0.append("\(error)") } }
        var failureList: [String] { failures.withLock { $0 } }
    }

    private func withDatabase<T>(_ body: (PostgresTestDatabase) throws -> T) throws -> T {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        return try body(database)
    }

    private func makeZone(_ tx: any StorageTransaction, _ name: String = "Lists") throws -> StoredZone {
        let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: 1))
        return try tx.createZone(databaseID: database.id, name: name, ownerRecordName: Self.ann, nowMs: 1_000)
    }

    private func write(_ name: String, frame: [UInt8] = [1, 2, 3]) -> RecordWrite {
        RecordWrite(recordName: name, recordType: "Item", frame: frame, deleted: false, userRecordName: Self.ann,
                    nowMs: 2_000)
    }

    /// Runs `body` on `count` threads at once and waits (bounded) for all of them.
    private func concurrently(_ count: Int, timeoutSeconds: Int = 60, _ body: @escaping @Sendable (Int) -> Void) -> Bool {
        let group = DispatchGroup()
        for index in 0..<count {
            group.enter()
            Thread.detachNewThread {
                body(index)
                group.leave()
            }
        }
        return group.wait(timeout: .now() + .seconds(timeoutSeconds)) == .success
    }

    // MARK: Binding

    @Test func parametersRoundTripByteForByteAndAreNeverSpliced() throws {
        try withDatabase { database in
            let connection = try PostgresConnection(database.url)
            try connection.execute("CREATE TABLE t(a bigint, b text, c bytea, d text, e bigint)")
            let odd = "'; DROP TABLE t;-- % \" $1 \\ é 漢字 🙂"
            let bytes: [UInt8] = Array(0...255) + [0, 0, 39, 92]
            let row: [PostgresValue] = [.integer(.min), .text(odd), .bytea(bytes), .null, .integer(.max)]
            try connection.query("INSERT INTO t VALUES ($1, $2, $3, $4, $5)", row)
            try connection.query("INSERT INTO t VALUES ($1, $2, $3, $4, $5)", [.integer(0), .text(""), .bytea([]), .null, .null])
            let rows = try connection.rows("SELECT a, b, c, d, e FROM t ORDER BY a")
            #expect(rows[0] == row)
            #expect(rows[1] == [.integer(0), .text(""), .bytea([]), .null, .null])
            #expect(try connection.rows("SELECT count(*) FROM t") == [[.integer(2)]])
            // Arrays too, NULL elements included.
            let unnested = try connection.rows("SELECT * FROM unnest($1::text[], $2::bytea[], $3::int8[])",
                                               [.texts([odd, nil]), .byteas([bytes, []]), .integers([-1, 1 << 40])])
            #expect(unnested == [[.text(odd), .bytea(bytes), .integer(-1)], [.null, .bytea([]), .integer(1 << 40)]])
            // PostgreSQL text cannot hold NUL: refused, never cut short.
            let error = try #require(throws: PostgresError.self) {
                try connection.query("INSERT INTO t(b) VALUES ($1)", [.text("a\u{0}b")])
            }
            #expect(error.sqlState.hasPrefix("22"), "\(error)")
        }
    }

    @Test func recordsWithOddNamesAndBinaryFramesRoundTripThroughTheStorage() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 2)
            defer { storage.close() }
            let name = "it's \"quoted\" -- é 漢字 🙂 $1"
            let frame: [UInt8] = [0, 0, 255, 0, 39, 92, 0]
            let (zone, saved) = try storage.write { tx throws in
                let zone = try makeZone(tx, "Zone 'with' quotes")
                let one = try tx.saveRecord(zoneRowID: zone.rowID, write(name, frame: frame))
                let batch = try tx.saveRecords(zoneRowID: zone.rowID, [write("b\u{1}", frame: []), write("c'", frame: frame)],
                                               previous: [nil, nil])
                return (zone, [one] + batch)
            }
            try storage.read { tx throws in
                #expect(try tx.zone(databaseID: zone.databaseID, name: "Zone 'with' quotes")?.rowID == zone.rowID)
                #expect(try tx.record(zoneRowID: zone.rowID, name: name) == saved[0])
                #expect(try tx.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 10) == saved)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "b\u{1}")?.frame == [])
            }
        }
    }

    // MARK: Errors

    @Test func sqlStatesMapToTheStorageTaxonomy() throws {
        try withDatabase { database in
            let connection = try PostgresConnection(database.url)
            try connection.execute("CREATE TABLE u(k text PRIMARY KEY)")
            try connection.query("INSERT INTO u VALUES ($1)", [.text("x")])
            let error = try #require(throws: PostgresError.self) { try connection.query("INSERT INTO u VALUES ($1)", [.text("x")]) }
            #expect(error.sqlState == "23505")
            #expect(error.constraint == "u_pkey")
            #expect(!error.description.contains("x'"), "no bound values in the description")
            #expect(PostgresTransaction.storageError(error) == .duplicate("u_pkey"))
            let states: [(String, StorageError)] = [("53100", .diskFull), ("40001", .busy), ("40P01", .busy), ("08006", .busy)]
            for (state, expected) in states {
                #expect(PostgresTransaction.storageError(PostgresError(sqlState: state, message: "m", context: "t")) == expected)
            }
            #expect(PostgresError(sqlState: "", message: "server closed the connection unexpectedly", context: "t")
                .isConnectionLoss)
            #expect(PostgresError(sqlState: "57P01", message: "terminating connection", context: "t").isConnectionLoss)
        }
    }

    @Test func aUniqueViolationInAWriteIsADuplicateAndTheSavepointKeepsTheTransaction() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 2)
            defer { storage.close() }
            try storage.write { tx in
                _ = try (tx as! PostgresTransaction).rowsForTesting("CREATE TABLE u(k text PRIMARY KEY)")
            }
            try storage.write { tx throws in
                let postgres = tx as! PostgresTransaction
                _ = try postgres.rowsForTesting("INSERT INTO u VALUES ($1)", [.text("a")])
                let error = #expect(throws: StorageError.self) {
                    try tx.savepoint { _ = try postgres.rowsForTesting("INSERT INTO u VALUES ($1)", [.text("a")]) }
                }
                #expect(error == .duplicate("u_pkey"))
                _ = try postgres.rowsForTesting("INSERT INTO u VALUES ($1)", [.text("b")])
            }
            let keys = try storage.read { tx in try (tx as! PostgresTransaction).rowsForTesting("SELECT k FROM u ORDER BY k") }
            #expect(keys == [[.text("a")], [.text("b")]])
            // Outside a savepoint the failure ends the transaction: nothing of it is kept.
            #expect(throws: StorageError.duplicate("u_pkey")) {
                try storage.write { tx throws in
                    let postgres = tx as! PostgresTransaction
                    _ = try postgres.rowsForTesting("INSERT INTO u VALUES ($1)", [.text("c")])
                    _ = try? postgres.rowsForTesting("INSERT INTO u VALUES ($1)", [.text("a")])
                }
            }
            #expect(try storage.read { tx in try (tx as! PostgresTransaction).rowsForTesting("SELECT count(*) FROM u") }
                    == [[.integer(2)]])
        }
    }

    // MARK: Deadlines and lanes

    @Test func aStatementPastTheDeadlineIsCancelledAndTheWriteRolledBack() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 2)
            defer { storage.close() }
            let started = RequestDeadline.nowNanoseconds()
            #expect(throws: StorageError.deadlineExceeded) {
                try storage.write(deadline: .after(milliseconds: 300)) { tx throws in
                    try tx.setMetadata("k", "v")
                    _ = try (tx as! PostgresTransaction).rowsForTesting("SELECT pg_sleep(20)")
                }
            }
            let elapsedMs = (RequestDeadline.nowNanoseconds() - started) / 1_000_000
            #expect(elapsedMs < 5_000, "cancelled near the deadline, not after the sleep (\(elapsedMs) ms)")
            #expect(try storage.read { try $0.metadata("k") } == nil)
            // A deadline already passed runs nothing.
            #expect(throws: StorageError.deadlineExceeded) {
                try storage.write(deadline: .after(milliseconds: 0)) { try $0.setMetadata("k", "v") }
            }
            // The connection is fine afterwards.
            try storage.write(deadline: .after(milliseconds: 5_000)) { try $0.setMetadata("k", "w") }
            #expect(try storage.read { try $0.metadata("k") } == "w")
        }
    }

    @Test func aPurgeBatchSkipsTheRowsOfADatabaseARequestHoldsInsteadOfWaiting() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 3)
            defer { storage.close() }
            // Ann's and Bob's private databases, each with a zone of 5 tombstones past the horizon (100).
            let databases: [Int64] = try storage.write { tx throws in
                try [(1, "ann"), (2, "bob")].map { owner, name in
                    _ = try tx.insertUser(name: name, recordName: "_" + String(repeating: "0", count: 31) + "\(owner)", nowMs: 1)
                    let db = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: Int64(owner)))
                    let zone = try tx.createZone(databaseID: db.id, name: "Lists", ownerRecordName: Self.ann, nowMs: 1)
                    for index in 0..<5 {
                        _ = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(recordName: "r\(index)", recordType: "Item",
                            frame: [1], deleted: true, userRecordName: Self.ann, nowMs: 10))
                    }
                    return db.id
                }
            }
            // A request's write holds Ann's database row.
            let entered = DispatchSemaphore(value: 0), release = DispatchSemaphore(value: 0), holder = DispatchGroup()
            holder.enter()
            Thread.detachNewThread {
                _ = try? storage.write { tx throws in
                    _ = try tx.database(id: databases[0])
                    entered.signal()
                    _ = release.wait(timeout: .now() + 20)
                }
                holder.leave()
            }
            #expect(entered.wait(timeout: .now() + 10) == .success)
            let started = RequestDeadline.nowNanoseconds()
            let batch = try storage.write(deadline: .after(milliseconds: 5_000)) {
                try $0.purge(before: 100, operationsBeforeMs: 100, limit: 100)
            }
            let elapsedMs = (RequestDeadline.nowNanoseconds() - started) / 1_000_000
            release.signal()
            #expect(holder.wait(timeout: .now() + 20) == .success)
            // Bob's tombstones went at once; Ann's were left, and the batch says it did not finish.
            #expect(batch == PurgeReport(tombstones: 5, complete: false))
            #expect(elapsedMs < 2_000, "the batch waited \(elapsedMs) ms for the held row")
            // Once the row is free the next batch takes the rest.
            let rest = try storage.write { try $0.purge(before: 100, operationsBeforeMs: 100, limit: 100) }
            #expect(rest == PurgeReport(tombstones: 5, complete: true))
            #expect(try storage.read { try $0.rowCount(table: "records") } == 0)
        }
    }

    @Test func waitingForAConnectionEndsAtTheDeadlineAndTheAuthenticationLaneDoesNotWait() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 1)
            defer { storage.close() }
            try storage.write { try $0.setMetadata("k", "v") }
            let entered = DispatchSemaphore(value: 0)
            let release = DispatchSemaphore(value: 0)
            let holder = DispatchGroup()
            holder.enter()
            Thread.detachNewThread {
                _ = try? storage.write { tx throws in
                    try tx.setMetadata("held", "1")
                    entered.signal()
                    _ = release.wait(timeout: .now() + 10)
                }
                holder.leave()
            }
            #expect(entered.wait(timeout: .now() + 10) == .success)
            // The only general connection is lent: a read waits no longer than its deadline.
            #expect(throws: StorageError.deadlineExceeded) {
                try storage.read(deadline: .after(milliseconds: 200)) { try $0.metadata("k") }
            }
            // The authentication lane has a connection of its own.
            #expect(try storage.read(deadline: .after(milliseconds: 5_000), lane: .authentication) { try $0.metadata("k") } == "v")
            release.signal()
            #expect(holder.wait(timeout: .now() + 10) == .success)
            #expect(try storage.read { try $0.metadata("held") } == "1")
            // While the lane's own connection is lent, a token lookup takes a general one that is free.
            let authEntered = DispatchSemaphore(value: 0)
            let authRelease = DispatchSemaphore(value: 0)
            let authHolder = DispatchGroup()
            authHolder.enter()
            Thread.detachNewThread {
                _ = try? storage.read(deadline: nil, lane: .authentication) { tx throws in
                    _ = try tx.metadata("k")
                    authEntered.signal()
                    _ = authRelease.wait(timeout: .now() + 10)
                }
                authHolder.leave()
            }
            #expect(authEntered.wait(timeout: .now() + 10) == .success)
            #expect(try storage.read(deadline: .after(milliseconds: 2_000), lane: .authentication) { try $0.metadata("k") } == "v")
            authRelease.signal()
            #expect(authHolder.wait(timeout: .now() + 10) == .success)
        }
    }

    // MARK: Conflicts

    @Test func aDeadlockIsRetriedTransparently() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 4)
            defer { storage.close() }
            try storage.write { tx in
                try tx.setMetadata("a", "0")
                try tx.setMetadata("b", "0")
            }
            // Two writers lock a then b, and b then a; on their first run each waits for the other in between,
            // so PostgreSQL must abort one (40P01). It runs again and both commit.
            let shared = Shared()
            let firstRunsLocked = DispatchGroup()
            firstRunsLocked.enter()
            firstRunsLocked.enter()
            let finished = concurrently(2) { index in
                let (first, second) = index == 0 ? ("a", "b") : ("b", "a")
                var myRuns = 0
                do {
                    try storage.write { tx throws in
                        shared.count.add(1, ordering: .relaxed)
                        myRuns += 1
                        _ = try tx.metadata(first)
                        if myRuns == 1 {
                            firstRunsLocked.leave()
                            _ = firstRunsLocked.wait(timeout: .now() + 10)
                        }
                        _ = try tx.metadata(second)
                        try tx.setMetadata(first, "\(index)")
                        try tx.setMetadata(second, "\(index)")
                    }
                } catch {
                    shared.fail(error)
                }
            }
            #expect(finished)
            #expect(shared.failureList == [])
            // At least one ran again (a retry may meet the other writer again and deadlock once more).
            let runs = shared.count.load(ordering: .relaxed)
            #expect(runs >= 3 && runs <= 2 + 2 * PostgresStorage.maximumConflictRetries, "\(runs) runs")
            let (a, b) = try storage.read { tx in (try tx.metadata("a"), try tx.metadata("b")) }
            #expect(a == b && (a == "0" || a == "1"), "the last commit wrote both: \(String(describing: a)), \(String(describing: b))")
        }
    }

    @Test func readCheckWriteSequencesOnOneRowAreSerializedAcrossStorages() throws {
        try withDatabase { database in
            // Two storages, as two processes would have.
            let nodes = [try PostgresStorage(url: database.url, poolSize: 3), try PostgresStorage(url: database.url, poolSize: 3)]
            defer { nodes.forEach { $0.close() } }
            let zone = try nodes[0].write { tx throws in
                try tx.setMetadata("counter", "0")
                return try makeZone(tx)
            }
            let shared = Shared()
            let perThread = 15
            let finished = concurrently(4) { index in
                let storage = nodes[index % 2]
                for step in 0..<perThread {
                    do {
                        try storage.write { tx throws in
                            // A counter read, checked and written back (lost updates without the row lock).
                            let value = Int(try tx.metadata("counter") ?? "") ?? -1000
                            try tx.setMetadata("counter", String(value + 1))
                            // A merge into one record: read it, then save what it held plus one byte.
                            let previous = try tx.record(zoneRowID: zone.rowID, name: "shared")
                            _ = try tx.saveRecord(zoneRowID: zone.rowID, write("shared", frame: (previous?.frame ?? []) + [UInt8(step)]))
                        }
                    } catch {
                        shared.fail(error)
                    }
                }
            }
            #expect(finished)
            #expect(shared.failureList == [])
            try nodes[1].read { tx throws in
                #expect(try tx.metadata("counter") == String(4 * perThread))
                #expect(try tx.record(zoneRowID: zone.rowID, name: "shared")?.frame.count == 4 * perThread)
                #expect(try tx.database(id: zone.databaseID)?.bytesUsed == Int64(4 * perThread))
            }
        }
    }

    @Test func aRecordCreatedByAnotherWriterIsSeenByAReadThatWaitedForIt() throws {
        try withDatabase { database in
            let nodes = [try PostgresStorage(url: database.url, poolSize: 2), try PostgresStorage(url: database.url, poolSize: 2)]
            defer { nodes.forEach { $0.close() } }
            let zone = try nodes[0].write { tx in try makeZone(tx) }
            let entered = DispatchSemaphore(value: 0)
            let firstDone = DispatchGroup()
            firstDone.enter()
            Thread.detachNewThread {
                _ = try? nodes[0].write { tx throws in
                    // Reads the record (none yet), then creates it, slowly.
                    _ = try tx.record(zoneRowID: zone.rowID, name: "new")
                    entered.signal()
                    usleep(300_000)
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("new", frame: [1]))
                }
                firstDone.leave()
            }
            #expect(entered.wait(timeout: .now() + 10) == .success)
            // The second writer's read waits for the first (the zone row is locked before the record is read),
            // then sees what it created: a merge into it, not an overwrite.
            let previous = try nodes[1].write { tx throws -> StoredRecord? in
                let previous = try tx.record(zoneRowID: zone.rowID, name: "new")
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("new", frame: (previous?.frame ?? []) + [2]))
                return previous
            }
            #expect(firstDone.wait(timeout: .now() + 10) == .success)
            #expect(previous?.frame == [1])
            #expect(try nodes[0].read { try $0.record(zoneRowID: zone.rowID, name: "new")?.frame } == [1, 2])
        }
    }

    @Test func aClientOperationSavedConcurrentlyIsAppliedOnceAndTheLoserSeesTheStoredAnswer() throws {
        try withDatabase { database in
            let nodes = [try PostgresStorage(url: database.url, poolSize: 2), try PostgresStorage(url: database.url, poolSize: 2)]
            defer { nodes.forEach { $0.close() } }
            let winner = ClientOperation(requestHash: [1], status: 200, response: Array("winner".utf8))
            let entered = DispatchSemaphore(value: 0)
            let release = DispatchSemaphore(value: 0)
            let winnerDone = DispatchGroup()
            winnerDone.enter()
            Thread.detachNewThread {
                _ = try? nodes[0].write { tx throws in
                    try tx.saveClientOperation(userID: 1, operationID: "op", winner, chargedTo: 0, nowMs: 1)
                    entered.signal()
                    _ = release.wait(timeout: .now() + 10)
                }
                winnerDone.leave()
            }
            #expect(entered.wait(timeout: .now() + 10) == .success)
            // The loser: what the server does (look the id up, else apply and remember).
            let shared = Shared()
            let loserDone = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                do {
                    let answer = try nodes[1].write { tx throws -> String in
                        let stored = try tx.clientOperation(userID: 1, operationID: "op")
                        shared.seen.withLock { $0.append(stored) }
                        if let stored { return String(decoding: stored.response, as: UTF8.self) }
                        try tx.saveClientOperation(userID: 1, operationID: "op",
                                                   ClientOperation(requestHash: [1], status: 200, response: Array("loser".utf8)),
                                                   chargedTo: 0, nowMs: 2)
                        return "applied"
                    }
                    shared.answer.withLock { $0 = answer }
                } catch {
                    shared.fail(error)
                }
                loserDone.signal()
            }
            usleep(300_000) // the loser is now waiting on the winner's uncommitted row
            release.signal()
            #expect(winnerDone.wait(timeout: .now() + 10) == .success)
            #expect(loserDone.wait(timeout: .now() + 10) == .success)
            #expect(shared.failureList == [])
            #expect(shared.answer.withLock { $0 } == "winner")
            let seen = shared.seen.withLock { $0 }
            #expect(seen.count == 2 && seen[0] == nil && seen[1] == winner)
            #expect(try nodes[0].read { try $0.clientOperation(userID: 1, operationID: "op") } == winner)
        }
    }

    // MARK: Commit order

    @Test func concurrentWritersNeverLetAReaderSkipAPosition() throws {
        try withDatabase { database in
            let nodes = [try PostgresStorage(url: database.url, poolSize: 3), try PostgresStorage(url: database.url, poolSize: 3)]
            defer { nodes.forEach { $0.close() } }
            let zone = try nodes[0].write { tx in try makeZone(tx) }
            let writers = 4
            let transactionsPerWriter = 30
            var seed = UInt64(RequestDeadline.nowNanoseconds())
            print("concurrentWritersNeverLetAReaderSkipAPosition seed \(seed)")
            let seeds = (0..<writers).map { _ -> UInt64 in
                seed = seed &* 6364136223846793005 &+ 1442695040888963407
                return seed
            }
            let shared = Shared()
            // Every write has a name of its own, so every position stays in the log: a reader paging by
            // position must see 1, 2, 3, ... with no gap, each once.
            let group = DispatchGroup()
            for writer in 0..<writers {
                group.enter()
                Thread.detachNewThread {
                    var random = SplitMix64(seed: seeds[writer])
                    for step in 0..<transactionsPerWriter {
                        let count = Int.random(in: 1...4, using: &random)
                        let writes = (0..<count).map { self.write("w\(writer)-\(step)-\($0)") }
                        do {
                            try nodes[writer % 2].write { tx throws in
                                if count == 1 {
                                    _ = try tx.saveRecord(zoneRowID: zone.rowID, writes[0])
                                } else {
                                    _ = try tx.saveRecords(zoneRowID: zone.rowID, writes, previous: writes.map { _ in nil })
                                }
                            }
                            shared.count.add(count, ordering: .sequentiallyConsistent)
                        } catch {
                            shared.fail(error)
                        }
                    }
                    group.leave()
                }
            }
            Thread.detachNewThread {
                _ = group.wait(timeout: .now() + 120)
                shared.flag.store(true, ordering: .sequentiallyConsistent)
            }
            var cursor: Int64 = 0
            var gaps: [String] = []
            let limit = RequestDeadline.after(milliseconds: 120_000)
            while !limit.hasPassed {
                let done = shared.flag.load(ordering: .sequentiallyConsistent)
                let page = try nodes[1].read { try $0.recordChanges(zoneRowID: zone.rowID, after: cursor, limit: 7) }
                for record in page {
                    if record.seq != cursor + 1 { gaps.append("after \(cursor) came \(record.seq)") }
                    cursor = record.seq
                }
                if done && page.isEmpty { break }
            }
            #expect(shared.failureList == [])
            #expect(gaps == [])
            #expect(cursor == Int64(shared.count.load(ordering: .sequentiallyConsistent)))
            #expect(try nodes[0].read { try $0.zone(rowID: zone.rowID)?.lastSeq } == cursor)
        }
    }

    // MARK: Lost connections

    @Test func terminatedConnectionsAreReplacedAndARefusingDatabaseGivesBusyUntilItReturns() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 2)
            defer { storage.close() }
            try storage.write { try $0.setMetadata("k", "1") }
            // Every connection of the pool ended by the server: the next use reconnects by itself.
            try PostgresTestDatabase.executeOnCluster("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                                      + "WHERE datname = '\(database.name)' AND pid <> pg_backend_pid()")
            try storage.write { try $0.setMetadata("k", "2") }
            #expect(try storage.read { try $0.metadata("k") } == "2")

            // A connection lost in the middle of a write: nothing was committed, so the body runs again.
            var runs = 0
            try storage.write { tx throws in
                runs += 1
                try tx.setMetadata("k", "3")
                if runs == 1 {
                    let pid = (tx as! PostgresTransaction).db.backendPID
                    try PostgresTestDatabase.executeOnCluster("SELECT pg_terminate_backend(\(pid))")
                }
                try tx.setMetadata("after", "yes")
            }
            #expect(runs == 2)
            #expect(try storage.read { tx in [try tx.metadata("k"), try tx.metadata("after")] } == ["3", "yes"])

            // The database refuses connections: writes and reads are busy, and nothing is acknowledged.
            try PostgresTestDatabase.executeOnCluster("ALTER DATABASE \"\(database.name)\" WITH ALLOW_CONNECTIONS false")
            try PostgresTestDatabase.executeOnCluster("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                                      + "WHERE datname = '\(database.name)' AND pid <> pg_backend_pid()")
            #expect(throws: StorageError.busy) { try storage.write { try $0.setMetadata("k", "lost") } }
            #expect(throws: StorageError.busy) { try storage.read { try $0.metadata("k") } }
            // It comes back: the same storage works again, without reopening.
            try PostgresTestDatabase.executeOnCluster("ALTER DATABASE \"\(database.name)\" WITH ALLOW_CONNECTIONS true")
            try storage.write { try $0.setMetadata("k", "4") }
            #expect(try storage.read { try $0.metadata("k") } == "4")
        }
    }

    @Test func aConnectionLostAtCommitIsBusyNeverASuccess() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 1)
            defer { storage.close() }
            var runs = 0
            storage.beforeCommitForTesting.withLock { hook in
                hook = { pid in _ = try? PostgresTestDatabase.executeOnCluster("SELECT pg_terminate_backend(\(pid))") }
            }
            let error = #expect(throws: StorageError.self) {
                try storage.write { tx throws in
                    runs += 1
                    try tx.setMetadata("k", "lost")
                }
            }
            storage.beforeCommitForTesting.withLock { $0 = nil }
            #expect(error == .busy)
            #expect(runs == 1, "a COMMIT whose outcome is unknown is not run again")
            // The storage goes on, and nothing of the lost transaction was kept.
            #expect(try storage.read { try $0.metadata("k") } == nil)
            try storage.write { try $0.setMetadata("k", "kept") }
            #expect(try storage.read { try $0.metadata("k") } == "kept")
        }
    }

    // MARK: Schema

    @Test func nodesStartingAtOnceMigrateOnceAndANewerSchemaIsRefused() throws {
        let database = try PostgresTestDatabase.create(migrated: false)
        defer { database.drop() }
        final class Opened: Sendable { let storages = Mutex<[PostgresStorage]>([]) }
        let shared = Shared()
        let opened = Opened()
        let finished = concurrently(4) { _ in
            do {
                let storage = try PostgresStorage(url: database.url, poolSize: 1)
                opened.storages.withLock { $0.append(storage) }
            } catch {
                shared.fail(error)
            }
        }
        #expect(finished)
        #expect(shared.failureList == [])
        let storages = opened.storages.withLock { $0 }
        #expect(storages.count == 4)
        let versions = try storages[0].read { tx in
            try (tx as! PostgresTransaction).rowsForTesting("SELECT version FROM lattice_schema_migrations ORDER BY version")
        }
        #expect(versions == (1...PostgresStorage.schemaVersion).map { [.integer(Int64($0))] })
        try storages[0].write { tx in
            _ = try (tx as! PostgresTransaction).rowsForTesting(
                "INSERT INTO lattice_schema_migrations(version, name) VALUES ($1, 'from the future')",
                [.integer(Int64(PostgresStorage.schemaVersion + 1))])
        }
        storages.forEach { $0.close() }
        let error = #expect(throws: StorageError.self) { try PostgresStorage(url: database.url, poolSize: 1) }
        #expect("\(String(describing: error))".contains("newer than this build"))
    }

    // MARK: Streaming

    @Test func streamingReadsPageThroughEverythingAndStopWhenTold() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 2)
            defer { storage.close() }
            let zone = try storage.write { tx throws in
                let zone = try makeZone(tx)
                var writes: [RecordWrite] = []
                for index in 0..<300 {
                    let type = index % 3 == 0 ? "A" : "B"
                    let frame: [UInt8] = [UInt8(index % 256)]
                    writes.append(RecordWrite(recordName: "r" + String(1_000 + index), recordType: type, frame: frame,
                                              deleted: index % 7 == 0, userRecordName: Self.ann, nowMs: 5))
                }
                _ = try tx.saveRecords(zoneRowID: zone.rowID, writes, previous: writes.map { _ in nil })
                return zone
            }
            try storage.read { tx throws in
                for type in [nil, "A", "B"] as [String?] {
                    var streamed: [StoredRecord] = []
                    try tx.forEachRecord(zoneRowID: zone.rowID, recordType: type) { streamed.append($0); return true }
                    #expect(streamed == (try tx.records(zoneRowID: zone.rowID, recordType: type)))
                }
                for (cursor, limit) in [(0, 300), (0, 1_000), (17, 100), (290, 50), (300, 10)] as [(Int64, Int)] {
                    var streamed: [StoredRecord] = []
                    try tx.forEachRecordChange(zoneRowID: zone.rowID, after: cursor, limit: limit) { streamed.append($0); return true }
                    #expect(streamed == (try tx.recordChanges(zoneRowID: zone.rowID, after: cursor, limit: limit)))
                }
                var seen = 0
                try tx.forEachRecordChange(zoneRowID: zone.rowID, after: 0, limit: 300) { _ in
                    seen += 1
                    return seen < 20
                }
                #expect(seen == 20)
            }
        }
    }

    // MARK: Copying

    @Test func aLargeTableIsExportedInBoundedBatchesInPositionOrderAndImportedWhole() throws {
        try withDatabase { database in
            let storage = try PostgresStorage(url: database.url, poolSize: 2)
            defer { storage.close() }
            let zone = try storage.write { tx throws in
                let zone = try makeZone(tx)
                for chunk in stride(from: 0, to: 2_345, by: 500) {
                    let writes = (chunk..<min(chunk + 500, 2_345)).map { write("r\($0)", frame: [UInt8($0 % 256), 0]) }
                    _ = try tx.saveRecords(zoneRowID: zone.rowID, writes, previous: writes.map { _ in nil })
                }
                return zone
            }
            var batches: [Int] = []
            var rows: [[StorageValue]] = []
            try storage.read { tx in
                try tx.exportRows(table: "records") { batch in
                    batches.append(batch.count)
                    rows += batch
                }
            }
            #expect(batches == [1_000, 1_000, 345])
            #expect(rows.map { $0[5] } == (1...2_345).map { .integer(Int64($0)) }, "ascending positions")
            #expect(rows.allSatisfy { $0[0] == .integer(zone.rowID) })
            let target = try PostgresTestDatabase.create()
            defer { target.drop() }
            let copy = try PostgresStorage(url: target.url, poolSize: 1)
            defer { copy.close() }
            try storage.read { source in
                try copy.write { tx in
                    for table in StorageTables.all {
                        try source.exportRows(table: table.name) { try tx.insertRows(table: table.name, $0) }
                    }
                    try tx.finishImport()
                }
            }
            #expect(try copy.read { try $0.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 3_000) }
                    == (try storage.read { try $0.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 3_000) }))
        }
    }

    // MARK: Connection strings

    @Test func passwordsAreRedactedFromConnectionStrings() {
        #expect(PostgresStorage.redacted("postgres://ann:s3cr%40t@db.internal:5432/lattice?sslmode=require")
                == "postgres://ann:***@db.internal:5432/lattice?sslmode=require")
        #expect(PostgresStorage.redacted("postgresql://ann@db/lattice?password=hunter2&application_name=x")
                == "postgresql://ann@db/lattice?password=***&application_name=x")
        #expect(PostgresStorage.redacted("postgresql:///lattice?host=/tmp/pg&port=5433")
                == "postgresql:///lattice?host=/tmp/pg&port=5433")
        #expect(PostgresStorage.redacted("host=/tmp dbname=lattice password='it\\'s a secret' user=ann")
                .range(of: "secret") == nil)
        #expect(PostgresStorage.redacted("host=db password = hunter2 user=ann") == "host=db password = *** user=ann")
        #expect(PostgresStorage.isPostgresURL("postgres://x") && PostgresStorage.isPostgresURL("POSTGRESQL://x"))
        #expect(!PostgresStorage.isPostgresURL("/var/lib/lattice"))
    }

    @Test func aBadURLFailsWithARedactedMessage() {
        let error = #expect(throws: StorageError.self) {
            try PostgresStorage(url: "postgresql://ann:topsecret@127.0.0.1:1/lattice?connect_timeout=2", poolSize: 1)
        }
        let text = "\(String(describing: error))"
        #expect(text.contains("cannot open postgresql://ann:***@127.0.0.1:1/lattice"), "\(text)")
        #expect(!text.contains("topsecret"))
    }
}

/// What several processes on one PostgreSQL database share beyond the data: announcements of commits
/// (LISTEN/NOTIFY), node claims and maintenance try-locks. Two storages on one database stand for two
/// processes.
@Suite("PostgreSQL storage: processes")
struct PostgresProcessTests {
    final class Inbox: Sendable {
        let changes = Mutex<[StorageChange]>([])
        let arrived = DispatchSemaphore(value: 0)
        func receive(_ change: StorageChange) {
            changes.withLock { $0.append(change) }
            arrived.signal()
        }
        /// The next change, waiting at most `seconds`.
        func next(within seconds: Double = 5) -> StorageChange? {
            guard arrived.wait(timeout: .now() + seconds) == .success else { return nil }
            return changes.withLock { $0.removeFirst() }
        }
    }

    @Test func commitsAreAnnouncedToOtherProcessesOnlyWhenTheyCommit() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let writer = try PostgresStorage(url: database.url, poolSize: 2)
        let watcher = try PostgresStorage(url: database.url, poolSize: 2)
        defer {
            writer.close()
            watcher.close()
        }
        let inbox = Inbox()
        let own = Inbox()
        try watcher.observeChanges { inbox.receive($0) }
        try writer.observeChanges { own.receive($0) }
        // Listening starts with a resynchronization.
        #expect(inbox.next() == .resynchronize)
        #expect(own.next() == .resynchronize)
        // A rolled-back transaction announces nothing; a committed one is heard by the other process only.
        struct Undo: Error {}
        #expect(throws: Undo.self) {
            try writer.write { tx throws in
                try tx.announceChanges(databaseIDs: [7])
                throw Undo()
            }
        }
        let started = RequestDeadline.nowNanoseconds()
        try writer.write { tx in try tx.announceChanges(databaseIDs: [3, 1, 3]) }
        #expect(inbox.next() == .databases([1, 3]))
        #expect((RequestDeadline.nowNanoseconds() - started) / 1_000_000 < 1_000, "heard within a second")
        #expect(inbox.next(within: 0.3) == nil, "the rolled-back announcement never arrives")
        #expect(own.next(within: 0.3) == nil, "a process does not hear itself")
        // Many ids are split across announcements, every id delivered.
        try writer.write { tx in try tx.announceChanges(databaseIDs: Array(1...1_000)) }
        var heard: Set<Int64> = []
        while heard.count < 1_000, case .databases(let ids)? = inbox.next() { heard.formUnion(ids) }
        #expect(heard == Set(1...1_000))
    }

    @Test func aLostListeningConnectionIsReestablishedAndTheHandlerToldToResynchronize() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let writer = try PostgresStorage(url: database.url, poolSize: 1)
        let watcher = try PostgresStorage(url: database.url, poolSize: 1)
        defer {
            writer.close()
            watcher.close()
        }
        let inbox = Inbox()
        try watcher.observeChanges { inbox.receive($0) }
        #expect(inbox.next() == .resynchronize)
        try PostgresTestDatabase.executeOnCluster("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                                  + "WHERE datname = '\(database.name)' AND pid <> pg_backend_pid()")
        #expect(inbox.next(within: 10) == .resynchronize)
        try writer.write { tx in try tx.announceChanges(databaseIDs: [5]) }
        #expect(inbox.next() == .databases([5]))
    }

    @Test func aNodeIsClaimedByOneLiveProcessAtATime() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let first = try PostgresStorage(url: database.url, poolSize: 1)
        let second = try PostgresStorage(url: database.url, poolSize: 1)
        defer { second.close() }
        try first.claimNode("a")
        #expect(throws: StorageError.self) { try second.claimNode("a") }
        try second.claimNode("b")
        first.close()
        // Closed: the claim is free again.
        try second.claimNode("a")
    }

    @Test func aTryLockIsHeldByOneTransactionAcrossProcesses() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let nodes = [try PostgresStorage(url: database.url, poolSize: 1), try PostgresStorage(url: database.url, poolSize: 1)]
        defer { nodes.forEach { $0.close() } }
        let (mine, theirs) = try nodes[0].write { tx throws -> (Bool, Bool) in
            let mine = try tx.tryExclusiveLock("purge")
            let theirs = try nodes[1].write { try $0.tryExclusiveLock("purge") }
            return (mine, theirs)
        }
        #expect(mine && !theirs)
        #expect(try nodes[1].write { try $0.tryExclusiveLock("purge") }, "released with the transaction")
        #expect(try nodes[1].write { try $0.tryExclusiveLock("other") })
    }
}
