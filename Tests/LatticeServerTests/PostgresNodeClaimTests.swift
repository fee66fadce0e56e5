import Foundation
@testable import LatticeServer
@testable import LatticeStore
import LatticeTestSupport
import Testing

/// A node's claim (PostgresClaims) when its session is lost: with a PostgreSQL restart, and with the claim's
/// session alone cut; retaken when the name is still free, and every write refused for good when another
/// process took the name meanwhile. And the clock lease on PostgreSQL.
extension PostgresNodesTests {
    static func sql(_ storage: PostgresStorage, _ text: String, _ values: [PostgresValue] = []) throws -> [[PostgresValue]] {
        try storage.write { tx in try (tx as! PostgresTransaction).rowsForTesting(text, values) }
    }

    /// Process ids holding a session advisory lock in the storage's database.
    static func advisoryHolders(_ storage: PostgresStorage) throws -> [Int64] {
        try sql(storage, "SELECT pid::bigint FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid() "
                + "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) ORDER BY pid")
            .map { $0[0].integer }
    }

    /// A write that stands for any: a metadata row.
    static func touch(_ storage: PostgresStorage, _ value: String) throws {
        try storage.write { tx in try tx.setMetadata("claim-test", value) }
    }

    /// A storage on a cluster of the test's own that claimed node a and wrote, then PostgreSQL restarted.
    /// Its watcher stays out of the way: what is tested is the check of a connection opened just now.
    static func claimedThenRestarted() throws -> (OwnPostgresCluster, PostgresStorage) {
        let postgres = try OwnPostgresCluster()
        let first = try PostgresStorage(url: postgres.url, poolSize: 2, claimCheckIntervalMilliseconds: 600_000)
        do {
            try first.claimNode("a")
            try touch(first, "before")
            try postgres.stop()
            try postgres.start()
        } catch {
            first.close()
            throw error
        }
        return (postgres, first)
    }

    @Test func aClaimLostWithAPostgreSQLRestartIsRetakenBeforeTheNextWrite() throws {
        let (postgres, first) = try Self.claimedThenRestarted()
        defer { first.close() }
        // The first write after the restart finds its connection lost, opens a new one, retakes the claim
        // on it before anything is written, and commits.
        try Self.touch(first, "after")
        #expect(try first.read { try $0.metadata("claim-test") } == "after")
        // The claim is held again: a second process cannot be node a.
        let second = try PostgresStorage(url: postgres.url, poolSize: 1)
        defer { second.close() }
        #expect(throws: StorageError.self) { try second.claimNode("a") }
        #expect(try Self.advisoryHolders(second).count == 1)
    }

    @Test func aNodeWhoseNameWasTakenWhilePostgreSQLWasAwayRefusesEveryWrite() throws {
        let (postgres, first) = try Self.claimedThenRestarted()
        defer { first.close() }
        // Another process starts as node a before the first one writes again.
        let second = try PostgresStorage(url: postgres.url, poolSize: 1)
        defer { second.close() }
        try second.claimNode("a")
        for attempt in 0..<3 {
            do {
                try Self.touch(first, "after \(attempt)")
                Issue.record("write \(attempt) of a node whose name another process holds committed")
            } catch StorageError.busy {
                // TRY_AGAIN_LATER: the client retries, on another node behind a load balancer.
            }
        }
        // The health probe names the cause (so /healthz answers 503 and a load balancer drops the node).
        do {
            try first.checkNodeClaims()
            Issue.record("the claims of a node whose name another process holds were reported held")
        } catch StorageError.failure(let message) {
            #expect(message.contains("node a") && message.contains("another process"), "\(message)")
        }
        // Nothing of it committed; reads still work; the other process writes.
        #expect(try first.read { try $0.metadata("claim-test") } == "before")
        try Self.touch(second, "second")
        #expect(try first.read { try $0.metadata("claim-test") } == "second")
    }

    @Test func aClaimWhoseSessionAloneWasCutIsRetakenByTheWatcher() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let node = try PostgresStorage(url: database.url, poolSize: 1, claimCheckIntervalMilliseconds: 100)
        defer { node.close() }
        let observer = try PostgresStorage(url: database.url, poolSize: 1)
        defer { observer.close() }
        try node.claimNode("a")
        let holders = try Self.advisoryHolders(observer)
        try #require(holders.count == 1, "\(holders)")
        _ = try Self.sql(observer, "SELECT pg_terminate_backend($1::int)", [.integer(holders[0])])
        // Within a few check intervals the watcher has connected again and holds the lock in a new session.
        var retaken: [Int64] = []
        let started = Date()
        while Date().timeIntervalSince(started) < 10 {
            retaken = try Self.advisoryHolders(observer)
            if retaken.count == 1, retaken != holders { break }
            usleep(50_000)
        }
        #expect(retaken.count == 1 && retaken != holders, "not retaken: \(holders) then \(retaken)")
        print("PostgresNodesTests: claim retaken \(Int(Date().timeIntervalSince(started) * 1000)) ms after its session was cut")
        try Self.touch(node, "after")
        #expect(throws: StorageError.self) { try observer.claimNode("a") }
    }

    @Test func theClockLeaseOnPostgreSQL() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let storage = try database.openStorage(poolSize: 2)
        defer { storage.close() }
        try ClockLeaseCheck.run(storage, label: "postgres")
    }
}
