import Foundation
import LatticeCore
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The crash suite's machinery: concurrent atomic batches from several accounts against a real
/// `lattice serve`, a `kill -9` at a random (seeded) moment, a restart, and the checks.
///
/// Each run gives every account a new zone `Run<n>` holding a `tally` record; a batch `forceReplace`s
/// 2 to 10 records of its own and adds its id to the tally's `applied` list, atomically, under a
/// `clientOperationID`. After the restart:
/// - every acknowledged batch is present, and every present batch is whole (all its records and its
///   tally entry), so no batch is partial;
/// - the batches in flight at the kill, and a few acknowledged ones, are sent again with the same id and
///   body: each answers 200 (replayed if it had committed), and afterwards every attempted batch is present;
/// - the zone's change log shows one application per batch: its last position (the highest change tag)
///   is the tally's position after set-up plus, for each present batch, its records plus one. A batch
///   applied twice would re-add its tally entry (a real change: a new dot), so the count would be over;
/// - `PRAGMA integrity_check` answers ok.
///
/// The runs share one data directory, so later runs recover a database that crashed many times; a final
/// pass checks every acknowledged batch of every run once more.
struct CrashSuite {
    let data: String
    let runs: Int
    let seed: UInt64
    let accounts = 3
    let threadsPerAccount = 2

    /// The counts a run adds up to, printed as one JSON line at the end.
    struct Counts {
        var runs = 0
        var acknowledgedBatches = 0
        var acknowledgedRecords = 0
        var inFlightBatches = 0
        var inFlightCommitted = 0
        var partialBatches = 0
        var missingAcknowledged = 0
        var integrityOK = 0
        var integrityFailed = 0
        /// Runs on PostgreSQL: SQLite's `integrity_check` does not apply (PostgreSQL checks its own pages).
        var integrityNotChecked = 0
        var retriesUnanswered = 0
        var retriesAnswered = 0
        var retriesReplayed = 0
        var retriesAppliedNow = 0
        var retriesFailed = 0
        var doubleApplications = 0
        var writerAnomalies = 0

        var json: String {
            #"{"crash_test":"sigkill-concurrent","runs":\#(runs),"acknowledged_batches":\#(acknowledgedBatches),"#
                + #""acknowledged_records":\#(acknowledgedRecords),"in_flight_batches":\#(inFlightBatches),"#
                + #""in_flight_committed":\#(inFlightCommitted),"partial_batches":\#(partialBatches),"#
                + #""missing_acknowledged":\#(missingAcknowledged),"integrity_ok":\#(integrityOK),"#
                + #""integrity_failed":\#(integrityFailed),"#
                + #""integrity_not_checked":\#(integrityNotChecked),"retries_unanswered":\#(retriesUnanswered),"#
                + #""retries_answered":\#(retriesAnswered),"retries_replayed":\#(retriesReplayed),"#
                + #""retries_applied_now":\#(retriesAppliedNow),"retries_failed":\#(retriesFailed),"#
                + #""double_applications":\#(doubleApplications),"writer_anomalies":\#(writerAnomalies)}"#
        }
    }

    /// One batch as sent: its id (also its records' prefix and its tally entry), size and exact body.
    struct Batch: Sendable {
        let id: String
        let size: Int
        let body: [UInt8]
    }

    /// What one run's writers did, per account.
    struct RunLog {
        var zone: String
        var setupSeq: Int64 = 0
        var attempted: [String: Batch] = [:]
        var acknowledged: Set<String> = []
    }

    static let base = "/database/1/lattice/production/private/"

    // MARK: Running

    func run() throws -> Counts {
        var rng = SplitMix64(seed: seed)
        var counts = Counts()
        let tokens = try (0..<accounts).map { try Self.addUser("crash\($0)", data: data) }
        var history: [[RunLog]] = []
        var server = try ServerUnderTest(data: data)
        defer { server.kill(SIGTERM) } // the current one, also when a check throws
        let started = Date()
        for run in 0..<runs {
            // Set up this run's zones; then the writers, and a kill at a random moment.
            var logs: [RunLog] = []
            for token in tokens {
                var log = RunLog(zone: "Run\(run)")
                log.setupSeq = try Self.setUpZone(log.zone, port: server.port, token: token)
                logs.append(log)
            }
            let killAfterMs = Int.random(in: 0...1_000, using: &rng)
            let batchSeed = rng.next()
            let outcome = writeUntilKilled(server, tokens: tokens, zones: logs.map(\.zone), run: run,
                                           batchSeed: batchSeed, killAfterMs: killAfterMs)
            counts.writerAnomalies += outcome.anomalies.count
            for anomaly in outcome.anomalies.prefix(3) { Issue.record("run \(run): \(anomaly)") }
            for account in 0..<accounts {
                logs[account].attempted = outcome.attempted[account]
                logs[account].acknowledged = outcome.acknowledged[account]
            }

            // Restart on the same data directory and check what survived.
            server = try ServerUnderTest(data: data)
            for (account, token) in tokens.enumerated() {
                try check(logs[account], run: run, port: server.port, token: token, retry: true, rng: &rng,
                          counts: &counts)
            }
            // PRAGMA integrity_check on SQLite; on PostgreSQL not checked here, and counted as such.
            if TestBackend.current == .sqlite {
                let integrity = try SQLiteStorage.integrityCheck(path: data + "/" + SQLiteStorage.fileName)
                if integrity == ["ok"] { counts.integrityOK += 1 } else {
                    counts.integrityFailed += 1
                    Issue.record("run \(run): integrity_check: \(integrity.prefix(5))")
                }
            } else {
                counts.integrityNotChecked += 1
            }
            counts.runs += 1
            history.append(logs)
            if Date().timeIntervalSince(started) > Double(runs) * 20 {
                Issue.record("the crash suite ran over its time bound after \(run + 1) of \(runs) runs")
                break
            }
        }
        // Every acknowledged batch of every run, once more, on a server that has been killed `runs` times.
        for logs in history {
            for (account, token) in tokens.enumerated() {
                var sink = SplitMix64(seed: 0)
                var scratch = Counts()
                try check(logs[account], run: -1, port: server.port, token: token, retry: false, rng: &sink,
                          counts: &scratch)
                counts.missingAcknowledged += scratch.missingAcknowledged
                counts.partialBatches += scratch.partialBatches
            }
        }
        return counts
    }

    /// Creates an account with `lattice admin add-user` (no sign-up limit applies) and returns its token.
    static func addUser(_ name: String, data: String) throws -> String {
        let admin = Process()
        admin.executableURL = URL(fileURLWithPath: latticeBinary)
        admin.arguments = ["admin", "add-user", name, "--json"] + (try TestBackend.storageArguments(data: data))
        let output = Pipe()
        admin.standardOutput = output
        admin.standardError = Pipe()
        try admin.run()
        let bytes = [UInt8](output.fileHandleForReading.readDataToEndOfFile())
        admin.waitUntilExit()
        guard admin.terminationStatus == 0, let token = try JSON.parse(bytes)["token"]?.stringValue else {
            throw HarnessError("lattice admin add-user \(name) failed: \(String(decoding: bytes, as: UTF8.self))")
        }
        return token
    }

    /// Creates `zone` with its tally record; returns the tally's log position.
    static func setUpZone(_ zone: String, port: UInt16, token: String) throws -> Int64 {
        let client = try RawHTTPClient(port: port, timeoutSeconds: 10)
        let headers = ["Authorization": "Bearer " + token]
        let created = try client.send(method: "POST", path: base + "zones/modify", headers: headers, body: JSON.object([
            "operations": .array([.object(["operationType": .string("create"),
                                           "zone": .object(["zoneID": .object(["zoneName": .string(zone)])])])]),
        ]).serializedBytes())
        guard created.status == 200 else { throw HarnessError("zone \(zone): \(created.status)") }
        let tally = try client.send(method: "POST", path: base + "records/modify", headers: headers, body: JSON.object([
            "zoneID": .object(["zoneName": .string(zone)]),
            "operations": .array([operation("create", "tally", recordType: "Tally",
                                            fields: ["note": value(.string("one entry per applied batch"))])]),
        ]).serializedBytes())
        guard tally.status == 200, let tag = try JSON.parse(tally.body)["records"]?.arrayValue?.first?["recordChangeTag"]?.stringValue,
              let seq = Self.seq(ofTag: tag) else {
            throw HarnessError("tally in \(zone): \(tally.status) \(String(decoding: tally.body, as: UTF8.self))")
        }
        return seq
    }

    /// The log position in a change tag ("zone-seq", both base 36).
    static func seq(ofTag tag: String) -> Int64? {
        guard let last = tag.split(separator: "-").last else { return nil }
        return Int64(last, radix: 36)
    }

    static func batch(_ id: String, zone: String, size: Int) -> Batch {
        var operations: [JSON] = (0..<size).map { item in
            operation("forceReplace", "\(id)-\(item)", fields: [
                "batch": value(.string(id)), "item": value(.int(Int64(item))),
                "payload": value(.string(String(repeating: "p", count: 100))),
            ])
        }
        operations.append(.object(["operationType": .string("forceUpdate"), "record": .object([
            "recordName": .string("tally"),
            "fields": .object(["applied": .object(["add": .array([.string(id)]), "type": .string("STRING_LIST")])]),
        ])]))
        let body = JSON.object(["zoneID": .object(["zoneName": .string(zone)]), "atomic": .bool(true),
                                "clientOperationID": .string("op-" + id), "operations": .array(operations)])
        return Batch(id: id, size: size, body: body.serializedBytes())
    }

    // MARK: Writing and killing

    struct WriteOutcome {
        var attempted: [[String: Batch]]
        var acknowledged: [Set<String>]
        var anomalies: [String]
    }

    /// Runs the writers (`threadsPerAccount` per account, each on its own connection) until the server is
    /// killed, `killAfterMs` after the first acknowledgement.
    func writeUntilKilled(_ server: ServerUnderTest, tokens: [String], zones: [String], run: Int,
                          batchSeed: UInt64, killAfterMs: Int) -> WriteOutcome {
        let attempted = Mutex<[[String: Batch]]>(Array(repeating: [:], count: tokens.count))
        let acknowledged = Mutex<[Set<String>]>(Array(repeating: [], count: tokens.count))
        let anomalies = Mutex<[String]>([])
        let acknowledgedCount = Atomic<Int>(0)
        let killed = Atomic<Bool>(false)
        let group = DispatchGroup()
        let port = server.port
        for (account, token) in tokens.enumerated() {
            for thread in 0..<threadsPerAccount {
                group.enter()
                let zone = zones[account]
                Thread {
                    defer { group.leave() }
                    var rng = SplitMix64(seed: batchSeed &+ UInt64(account * 16 + thread))
                    guard let client = try? RawHTTPClient(port: port, timeoutSeconds: 5) else {
                        if !killed.load(ordering: .sequentiallyConsistent) {
                            anomalies.withLock { $0.append("account \(account) thread \(thread) could not connect") }
                        }
                        return
                    }
                    let headers = ["Authorization": "Bearer " + token]
                    let started = Date()
                    // Bounded: at most 2,000 batches or 30 s per writer; the kill normally ends it far sooner.
                    for index in 0..<2_000 where Date().timeIntervalSince(started) < 30 {
                        let batch = Self.batch("r\(run)a\(account)t\(thread)k\(index)", zone: zone,
                                               size: Int.random(in: 2...10, using: &rng))
                        attempted.withLock { _ = $0[account].updateValue(batch, forKey: batch.id) }
                        let reply: RawHTTPClient.Response
                        do {
                            reply = try client.send(method: "POST", path: Self.base + "records/modify", headers: headers,
                                                    body: batch.body)
                        } catch {
                            if !killed.load(ordering: .sequentiallyConsistent) {
                                anomalies.withLock { $0.append("\(batch.id): \(error) before the kill") }
                            }
                            return
                        }
                        let items = (try? JSON.parse(reply.body)["records"]?.arrayValue) ?? []
                        guard reply.status == 200, items.count == batch.size + 1,
                              items.allSatisfy({ $0["serverErrorCode"] == nil }) else {
                            anomalies.withLock {
                                $0.append("\(batch.id) answered \(reply.status): \(String(decoding: reply.body.prefix(300), as: UTF8.self))")
                            }
                            return
                        }
                        acknowledged.withLock { _ = $0[account].insert(batch.id) }
                        acknowledgedCount.add(1, ordering: .sequentiallyConsistent)
                    }
                }.start()
            }
        }
        // Kill without warning at a random moment after the first acknowledgement (bounded wait).
        let deadline = Date().addingTimeInterval(10)
        while acknowledgedCount.load(ordering: .sequentiallyConsistent) == 0 && Date() < deadline { usleep(1_000) }
        usleep(UInt32(killAfterMs) * 1_000)
        killed.store(true, ordering: .sequentiallyConsistent)
        server.kill(SIGKILL)
        group.wait()
        return WriteOutcome(attempted: attempted.withLock { $0 }, acknowledged: acknowledged.withLock { $0 },
                            anomalies: anomalies.withLock { $0 })
    }

    // MARK: Checking

    /// What a zone holds: each batch's record count, the tally's entries, the last log position.
    struct ZoneState {
        var recordsPerBatch: [String: Int] = [:]
        var tally: Set<String> = []
        var lastSeq: Int64 = 0
        var records = 0
    }

    static func readZone(_ zone: String, port: UInt16, token: String) throws -> ZoneState {
        let client = try RawHTTPClient(port: port, timeoutSeconds: 10)
        var state = ZoneState()
        var seen: Set<String> = []
        var syncToken: JSON = .null
        for _ in 0..<10_000 {
            var request: [String: JSON] = ["zoneID": .object(["zoneName": .string(zone)])]
            if syncToken != .null { request["syncToken"] = syncToken }
            let reply = try client.send(method: "POST", path: base + "changes/zone",
                                        headers: ["Authorization": "Bearer " + token],
                                        body: JSON.object(["zones": .array([.object(request)])]).serializedBytes())
            guard reply.status == 200, let answer = try JSON.parse(reply.body)["zones"]?.arrayValue?.first else {
                throw HarnessError("changes/zone \(zone): \(reply.status) \(String(decoding: reply.body.prefix(300), as: UTF8.self))")
            }
            for record in answer["records"]?.arrayValue ?? [] {
                guard let name = record["recordName"]?.stringValue else { continue }
                guard seen.insert(name).inserted else { throw HarnessError("the feed of \(zone) lists \(name) twice") }
                if let tag = record["recordChangeTag"]?.stringValue, let seq = seq(ofTag: tag) {
                    state.lastSeq = max(state.lastSeq, seq)
                }
                if name == "tally" {
                    state.tally = Set((record["fields"]?["applied"]?["value"]?.arrayValue ?? []).compactMap(\.stringValue))
                } else if let batch = record["fields"]?["batch"]?["value"]?.stringValue {
                    state.recordsPerBatch[batch, default: 0] += 1
                    state.records += 1
                }
            }
            syncToken = answer["syncToken"] ?? .null
            if answer["moreComing"] != .bool(true) { return state }
        }
        throw HarnessError("the feed of \(zone) did not end in 10,000 pages")
    }

    /// Checks one account's zone of one run; with `retry`, sends the in-flight batches and some acknowledged
    /// ones again and checks once more.
    func check(_ log: RunLog, run: Int, port: UInt16, token: String, retry: Bool, rng: inout SplitMix64,
               counts: inout Counts) throws {
        let state = try Self.readZone(log.zone, port: port, token: token)
        for id in log.acknowledged where state.recordsPerBatch[id] != log.attempted[id]?.size || !state.tally.contains(id) {
            counts.missingAcknowledged += 1
            let message = "run \(run) \(log.zone): acknowledged batch \(id) is missing or partial "
                + "(\(state.recordsPerBatch[id] ?? 0) records, tally \(state.tally.contains(id)))"
            Issue.record("\(message)")
        }
        counts.partialBatches += partialBatches(state, log, when: "after the restart (run \(run))")
        guard retry else { return }
        counts.acknowledgedBatches += log.acknowledged.count
        counts.acknowledgedRecords += log.acknowledged.reduce(0) { $0 + (log.attempted[$1]?.size ?? 0) }
        let inFlight = Set(log.attempted.keys).subtracting(log.acknowledged)
        counts.inFlightBatches += inFlight.count
        counts.inFlightCommitted += inFlight.filter { state.tally.contains($0) }.count

        // Retry what got no answer, and up to two that did, with the same operation id and body.
        let answered = log.acknowledged.sorted().shuffled(using: &rng).prefix(2)
        let client = try RawHTTPClient(port: port, timeoutSeconds: 10)
        for id in inFlight.sorted() + answered {
            let batch = log.attempted[id]!
            let wasAnswered = log.acknowledged.contains(id)
            if wasAnswered { counts.retriesAnswered += 1 } else { counts.retriesUnanswered += 1 }
            let reply = try client.send(method: "POST", path: Self.base + "records/modify",
                                        headers: ["Authorization": "Bearer " + token], body: batch.body)
            let replayed = reply.headers["lattice-replayed"] == "true"
            let items = (try? JSON.parse(reply.body)["records"]?.arrayValue) ?? []
            let fresh = items.count == batch.size + 1 && items.allSatisfy { $0["serverErrorCode"] == nil }
            guard reply.status == 200, replayed || fresh else {
                counts.retriesFailed += 1
                Issue.record("run \(run): retry of \(id) answered \(reply.status): \(String(decoding: reply.body.prefix(300), as: UTF8.self))")
                continue
            }
            if replayed { counts.retriesReplayed += 1 } else { counts.retriesAppliedNow += 1 }
            // A batch that had committed must be replayed, never applied again.
            if state.tally.contains(id) && !replayed {
                counts.doubleApplications += 1
                Issue.record("run \(run): retry of committed batch \(id) was applied again")
            }
        }

        // Now every attempted batch is present, whole, and applied once: the log grew by exactly its writes.
        let after = try Self.readZone(log.zone, port: port, token: token)
        for id in log.attempted.keys where after.recordsPerBatch[id] != log.attempted[id]!.size || !after.tally.contains(id) {
            Issue.record("run \(run) \(log.zone): batch \(id) is not whole after its retry")
        }
        counts.partialBatches += partialBatches(after, log, when: "after the retries (run \(run))")
        let expected = log.setupSeq + after.tally.reduce(Int64(0)) { $0 + Int64((log.attempted[$1]?.size ?? 0) + 1) }
        if after.lastSeq != expected {
            counts.doubleApplications += 1
            Issue.record("run \(run) \(log.zone): the log is at \(after.lastSeq), one application per batch makes \(expected)")
        }
    }

    /// Batches present only in part: some records missing, or records without their tally entry (or the reverse).
    func partialBatches(_ state: ZoneState, _ log: RunLog, when: String) -> Int {
        var partial = 0
        for id in Set(state.recordsPerBatch.keys).union(state.tally) {
            let size = log.attempted[id]?.size
            let whole = size != nil && state.recordsPerBatch[id] == size && state.tally.contains(id)
            if !whole {
                partial += 1
                let message = "\(log.zone) \(when): batch \(id) is partial (\(state.recordsPerBatch[id] ?? 0) of "
                    + "\(size.map(String.init) ?? "?") records, tally \(state.tally.contains(id)))"
                Issue.record("\(message)")
            }
        }
        return partial
    }
}
