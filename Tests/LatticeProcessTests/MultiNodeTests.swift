import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Issue 14: three real `lattice serve` processes on one PostgreSQL database (a fresh one per test on the
/// cluster `LATTICE_TEST_POSTGRES_URL` names; the restart test brings a cluster of its own), each with its
/// own `--node-name` and port and one `--public-url`. Clients talk to 127.0.0.1 only; every loop is bounded
/// in count and time; the load's seed is printed (`LATTICE_SEED` replays it).
@Suite(.serialized) struct MultiNodeTests {
    // MARK: The load

    /// The accounts and records the load writes: an owner's zone `Load` with `records` records, shared
    /// zone-wide (read-write) with three participants who accepted it, each on a different node.
    final class LoadWorld {
        let cluster: NodeCluster
        let owner: (token: String, recordName: String)
        let participants: [(token: String, recordName: String)]
        let records: [String]

        init(_ cluster: NodeCluster, records: Int = 16) throws {
            self.cluster = cluster
            let first = NodeClient(port: cluster.port(0))
            owner = try first.signUp("owner")
            try first.ok("zones/modify", .object(["operations": .array([.object([
                "operationType": .string("create"), "zone": .object(["zoneID": zoneID("Load")]),
            ])])]), token: owner.token)
            self.records = (0..<records).map { "r\($0)" }
            let created = try first.ok("records/modify", .object([
                "zoneID": zoneID("Load"),
                "operations": .array(self.records.map { operation("create", $0, fields: ["note": value(.string("load"))]) }),
            ]), token: owner.token)
            guard created.json["records"]?.arrayValue?.allSatisfy({ $0["serverErrorCode"] == nil }) == true else {
                throw HarnessError("load records: \(created.text)")
            }
            try first.ok("shares/create", .object(["zoneID": zoneID("Load"), "publicPermission": .string("readWrite")]),
                         token: owner.token)
            guard let url = try first.ok("shares/url", .object(["zoneID": zoneID("Load")]), token: owner.token)["url"]?
                .stringValue else { throw HarnessError("no share url") }
            var participants: [(token: String, recordName: String)] = []
            for index in 1...3 {
                let client = NodeClient(port: cluster.port(index % cluster.count))
                let user = try client.signUp("participant\(index)")
                let accepted = try client.ok("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                             token: user.token, database: "shared")
                guard accepted["results"]?.arrayValue?.first?["participantStatus"]?.stringValue == "accepted" else {
                    throw HarnessError("accept on node \(index % cluster.count): \(accepted.text)")
                }
                participants.append(user)
            }
            self.participants = participants
        }

        /// Account 0 is the owner (private database), 1 to 3 the participants (shared database).
        func token(_ account: Int) -> String { account == 0 ? owner.token : participants[account - 1].token }
        func database(_ account: Int) -> String { account == 0 ? "private" : "shared" }
        func zone(_ account: Int) -> JSON { account == 0 ? zoneID("Load") : zoneID("Load", owner: owner.recordName) }
    }

    /// One acknowledged write: its record, the log position of its change, when it was first sent and when
    /// its answer came (monotonic nanoseconds).
    struct Acknowledged: Sendable {
        let id: String
        let writer: Int
        let record: String
        let position: Int64
        let firstSent: UInt64
        let answered: UInt64
    }

    /// What a change-feed reader saw: every (record, position) in the order received.
    struct ReaderLog: Sendable {
        let node: Int
        let account: Int
        var seen: [(record: String, position: Int64)] = []
        var violations: [String] = []
        var lastSeen: [String: Int64] = [:]
        var polls = 0
        var endedEarly: String?
    }

    struct LoadOutcome {
        var acknowledged: [Acknowledged] = []
        var attempted: Set<String> = []
        var statuses: [Int: Int] = [:]
        var anomalies: [String] = []
        var connectionErrors = 0
        var readers: [ReaderLog] = []
        /// Acknowledgements per node (by the node that answered), and after the disruption.
        var acknowledgedByNode: [Int: Int] = [:]
        var acknowledgedAfterRecovery: [Int: Int] = [:]
    }

    static func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

    /// 32 writers (each its own connection, spread over the nodes and the four accounts) add their write's id
    /// to a random record's `applied` list for `seconds`, each write under its own `clientOperationID`;
    /// two readers per node (the owner's zone feed, a participant's shared feed) poll `changes/zone`
    /// all along. `disrupt` runs on its own thread `disruptAfter` seconds in; writes acknowledged after
    /// `recoveredAfter` seconds are counted per node in `acknowledgedAfterRecovery`.
    static func runLoad(_ world: LoadWorld, seed: UInt64, seconds: Double = 10, writers: Int = 32,
                        disruptAfter: Double? = nil, recoveredAfter: Double? = nil,
                        disrupt: (() -> Void)? = nil) -> LoadOutcome {
        let cluster = world.cluster
        let ports = cluster.ports
        let nodeCount = ports.count
        let stop = Atomic<Bool>(false)
        // Set once every writer has finished its last write: only then do the readers make their final pass.
        let writersDone = Atomic<Bool>(false)
        let outcome = Mutex(LoadOutcome())
        let started = now()
        let recoveredAt = recoveredAfter.map { started + UInt64($0 * 1e9) }
        let group = DispatchGroup()
        let readerGroup = DispatchGroup()
        let tokens = (0..<4).map { world.token($0) }
        let databases = (0..<4).map { world.database($0) }
        let zones = (0..<4).map { world.zone($0) }
        let records = world.records

        for writer in 0..<writers {
            group.enter()
            Thread {
                defer { group.leave() }
                var rng = SplitMix64(seed: seed &+ UInt64(writer) &* 0x9E37_79B9)
                let account = writer % 4
                var node = writer % nodeCount
                let client = NodeClient(port: ports[node], timeoutSeconds: 15)
                var lastPosition: Int64 = 0
                // Bounded: 5,000 writes or the load's time.
                for index in 0..<5_000 where !stop.load(ordering: .sequentiallyConsistent) {
                    let id = "w\(writer)k\(index)"
                    let record = records[Int.random(in: 0..<records.count, using: &rng)]
                    let body = JSON.object([
                        "zoneID": zones[account], "atomic": .bool(true), "clientOperationID": .string("op-" + id),
                        "operations": .array([.object(["operationType": .string("forceUpdate"), "record": .object([
                            "recordName": .string(record),
                            "fields": .object(["applied": .object(["add": .array([.string(id)]), "type": .string("STRING_LIST")])]),
                        ])])]),
                    ])
                    outcome.withLock { _ = $0.attempted.insert(id) }
                    let firstSent = now()
                    // The same write again (same id and body) until it is answered: on another node after a
                    // connection failure, after a pause on 503 or 429. Bounded: 200 tries or 30 s.
                    var done = false
                    for _ in 0..<200 where !done && now() - firstSent < 30_000_000_000 {
                        let reply: NodeReply
                        do {
                            reply = try client.post("records/modify", body, token: tokens[account], database: databases[account])
                        } catch {
                            outcome.withLock { $0.connectionErrors += 1 }
                            node = (node + 1) % nodeCount
                            client.port = ports[node]
                            Thread.sleep(forTimeInterval: 0.05)
                            continue
                        }
                        outcome.withLock { $0.statuses[reply.status, default: 0] += 1 }
                        let item = reply["records"]?.arrayValue?.first
                        if reply.status == 200, let item, item["serverErrorCode"] == nil,
                           let position = changeTagPosition(item["recordChangeTag"]?.stringValue) {
                            let answered = now()
                            let acknowledged = Acknowledged(id: id, writer: writer, record: record, position: position,
                                                            firstSent: firstSent, answered: answered)
                            outcome.withLock {
                                $0.acknowledged.append(acknowledged)
                                $0.acknowledgedByNode[node, default: 0] += 1
                                if let recoveredAt, answered > recoveredAt { $0.acknowledgedAfterRecovery[node, default: 0] += 1 }
                                if position <= lastPosition {
                                    $0.anomalies.append("writer \(writer): \(id) at position \(position) after its previous write at \(lastPosition)")
                                }
                            }
                            lastPosition = position
                            done = true
                        } else if reply.status == 503 || reply.status == 429 || item?["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER" {
                            let pause = min(Double(reply.headers["retry-after"] ?? "") ?? 0.1, 0.5)
                            Thread.sleep(forTimeInterval: max(pause, 0.02))
                        } else {
                            outcome.withLock { $0.anomalies.append("\(id) on node \(node): \(reply.status) \(reply.text.prefix(300))") }
                            done = true
                        }
                    }
                }
            }.start()
        }

        for node in 0..<nodeCount {
            for account in [0, 1 + node % 3] {
                readerGroup.enter()
                Thread {
                    defer { readerGroup.leave() }
                    let log = readFeed(port: ports[node], node: node, account: account, token: tokens[account],
                                       database: databases[account], zone: zones[account], stop: writersDone)
                    outcome.withLock { $0.readers.append(log) }
                }.start()
            }
        }

        if let disrupt, let disruptAfter {
            Thread.sleep(forTimeInterval: disruptAfter)
            disrupt()
            Thread.sleep(forTimeInterval: max(0, seconds - disruptAfter))
        } else {
            Thread.sleep(forTimeInterval: seconds)
        }
        stop.store(true, ordering: .sequentiallyConsistent)
        group.wait()
        writersDone.store(true, ordering: .sequentiallyConsistent)
        readerGroup.wait()
        return outcome.withLock { $0 }
    }

    /// A reader polling `changes/zone` until `stop` (set when the writers are done), then to the end of the feed. Every position it gets
    /// must be above every position it got before (the feed is in commit order and never goes back).
    static func readFeed(port: UInt16, node: Int, account: Int, token: String, database: String, zone: JSON,
                         stop: borrowing Atomic<Bool>) -> ReaderLog {
        var log = ReaderLog(node: node, account: account)
        let client = NodeClient(port: port, timeoutSeconds: 15)
        var syncToken: JSON = .null
        var highest: Int64 = 0
        var finalPass = false
        let started = now()
        var failuresInARow = 0
        // Bounded: 100,000 polls or 90 s.
        for _ in 0..<100_000 where now() - started < 90_000_000_000 {
            if !finalPass && stop.load(ordering: .sequentiallyConsistent) { finalPass = true }
            var request: [String: JSON] = ["zoneID": zone, "resultsLimit": .int(100)]
            if syncToken != .null { request["syncToken"] = syncToken }
            let reply: NodeReply
            do {
                reply = try client.post("changes/zone", .object(["zones": .array([.object(request)])]), token: token,
                                        database: database)
            } catch {
                failuresInARow += 1
                if failuresInARow > 100 { log.endedEarly = "node \(node) unreachable: \(error)"; return log }
                Thread.sleep(forTimeInterval: 0.05)
                continue
            }
            log.polls += 1
            guard reply.status == 200, let answer = reply["zones"]?.arrayValue?.first, answer["serverErrorCode"] == nil else {
                if reply.status == 503 || reply.status == 429 {
                    failuresInARow = 0
                    Thread.sleep(forTimeInterval: 0.05)
                    continue
                }
                log.violations.append("changes/zone answered \(reply.status): \(reply.text.prefix(300))")
                return log
            }
            failuresInARow = 0
            for item in answer["records"]?.arrayValue ?? [] {
                guard let name = item["recordName"]?.stringValue,
                      let position = changeTagPosition(item["recordChangeTag"]?.stringValue) else { continue }
                if position <= highest {
                    log.violations.append("\(name) at position \(position) after position \(highest) (poll \(log.polls))")
                }
                highest = max(highest, position)
                log.seen.append((name, position))
                log.lastSeen[name] = position
            }
            syncToken = answer["syncToken"] ?? syncToken
            if answer["moreComing"] == .bool(true) { continue }
            if finalPass { return log }
        }
        log.endedEarly = "reader on node \(node) ran out of its bounds"
        return log
    }

    /// The records' `applied` lists and change tags as node `node` answers them (the owner's lookup).
    static func appliedOnNode(_ world: LoadWorld, port: UInt16) throws -> [String: (applied: Set<String>, position: Int64)] {
        let reply = try NodeClient(port: port, timeoutSeconds: 30).ok("records/lookup", .object([
            "zoneID": zoneID("Load"), "records": .array(world.records.map { .object(["recordName": .string($0)]) }),
        ]), token: world.owner.token)
        var state: [String: (Set<String>, Int64)] = [:]
        for record in reply["records"]?.arrayValue ?? [] {
            guard let name = record["recordName"]?.stringValue else { continue }
            let applied = Set((record["fields"]?["applied"]?["value"]?.arrayValue ?? []).compactMap(\.stringValue))
            state[name] = (applied, changeTagPosition(record["recordChangeTag"]?.stringValue) ?? -1)
        }
        return state
    }

    /// The checks after a load: every acknowledged write present on every live node, nothing present that
    /// was never sent, the nodes agreeing, the readers' feeds increasing and complete, and commit order:
    /// a write acknowledged before another was first sent has the lower position.
    static func checkLoad(_ world: LoadWorld, _ outcome: LoadOutcome, liveNodes: [Int], label: String) throws {
        let summary = #"{"multinode":"\#(label)","acknowledged":\#(outcome.acknowledged.count),"#
            + #""attempted":\#(outcome.attempted.count),"statuses":\#(outcome.statuses.sorted { $0.key < $1.key }.map { "\"\($0.key)\":\($0.value)" }.joined(separator: ",").braced),"#
            + #""connection_errors":\#(outcome.connectionErrors),"anomalies":\#(outcome.anomalies.count),"#
            + #""reader_changes":[\#(outcome.readers.map { String($0.seen.count) }.joined(separator: ","))],"#
            + #""by_node":\#(outcome.acknowledgedByNode.sorted { $0.key < $1.key }.map { "\"n\($0.key)\":\($0.value)" }.joined(separator: ",").braced)}"#
        print(summary)
        #expect(outcome.acknowledged.count >= 100, "too few writes got through to test anything: \(summary)")
        #expect(outcome.statuses[500] == nil, "a request answered 500: \(summary)\n\(world.cluster.logs())")
        for anomaly in outcome.anomalies.prefix(5) { Issue.record("\(label): \(anomaly)") }
        #expect(outcome.anomalies.isEmpty)

        var agreed: [String: Int64]?
        for node in liveNodes {
            let state = try appliedOnNode(world, port: world.cluster.port(node))
            let missing = outcome.acknowledged.filter { !(state[$0.record]?.applied.contains($0.id) ?? false) }
            #expect(missing.isEmpty, "\(label): node \(node) lacks \(missing.count) acknowledged writes, e.g. \(missing.prefix(3).map(\.id))")
            let present = state.values.reduce(into: Set<String>()) { $0.formUnion($1.applied) }
            let phantoms = present.subtracting(outcome.attempted)
            #expect(phantoms.isEmpty, "\(label): node \(node) holds writes nobody sent: \(phantoms.prefix(3))")
            let positions = state.mapValues(\.position)
            if let agreed { #expect(positions == agreed, "\(label): node \(node) answers other change tags") }
            agreed = positions
        }

        // Commit order across writers: sweep the writes by first send, holding the highest position among
        // the writes answered before it.
        let byAnswer = outcome.acknowledged.sorted { $0.answered < $1.answered }
        var answeredIndex = 0
        var highestAnswered: (position: Int64, id: String) = (0, "")
        var orderViolations: [String] = []
        for write in outcome.acknowledged.sorted(by: { $0.firstSent < $1.firstSent }) {
            while answeredIndex < byAnswer.count && byAnswer[answeredIndex].answered < write.firstSent {
                if byAnswer[answeredIndex].position > highestAnswered.position {
                    highestAnswered = (byAnswer[answeredIndex].position, byAnswer[answeredIndex].id)
                }
                answeredIndex += 1
            }
            if write.position <= highestAnswered.position {
                orderViolations.append("\(write.id) at \(write.position), sent after \(highestAnswered.id) at \(highestAnswered.position) was acknowledged")
            }
        }
        #expect(orderViolations.isEmpty, "\(label): \(orderViolations.count) writes out of commit order: \(orderViolations.prefix(3))")

        // The readers: increasing positions (so each change at most once, never one from before the cursor),
        // and at the end each record at its final position (so nothing was skipped).
        let final = agreed ?? [:]
        for reader in outcome.readers where liveNodes.contains(reader.node) {
            let name = "reader node \(reader.node) account \(reader.account)"
            #expect(reader.endedEarly == nil, "\(label): \(name): \(reader.endedEarly ?? "")")
            #expect(reader.violations.isEmpty, "\(label): \(name): \(reader.violations.prefix(3))")
            #expect(reader.polls > 10, "\(label): \(name) polled only \(reader.polls) times")
            let behind = world.records.filter { reader.lastSeen[$0] != final[$0] }
            let examples = behind.prefix(3).map { "\($0) \(reader.lastSeen[$0] ?? -1) vs \(final[$0] ?? -1)" }
            #expect(behind.isEmpty, "\(label): \(name) ended with \(behind.count) records not at their final position: \(examples)")
            let acknowledgedMissed = outcome.acknowledged.filter { (reader.lastSeen[$0.record] ?? -1) < $0.position }
            #expect(acknowledgedMissed.isEmpty, "\(label): \(name) never saw \(acknowledgedMissed.count) acknowledged changes")
        }
    }

    // MARK: Tests

    @Test func thirtyTwoClientsOnThreeNodesLoseNothingAndEveryFeedIsInCommitOrder() throws {
        let seed = RandomSeed.current
        print(#"{"multinode":"seed","test":"load","seed":\#(seed)}"#)
        let cluster = try NodeCluster()
        let world = try LoadWorld(cluster)
        let outcome = Self.runLoad(world, seed: seed)
        try Self.checkLoad(world, outcome, liveNodes: [0, 1, 2], label: "load")
        #expect(outcome.connectionErrors == 0)
        for node in 0..<3 { #expect((outcome.acknowledgedByNode[node] ?? 0) > 0, "node \(node) acknowledged nothing") }
    }

    @Test func sigkillOfOneNodeDuringTheLoadLosesNoAcknowledgedWrite() throws {
        let seed = RandomSeed.current
        print(#"{"multinode":"seed","test":"kill","seed":\#(seed)}"#)
        let cluster = try NodeCluster()
        let world = try LoadWorld(cluster)
        let outcome = Self.runLoad(world, seed: seed, seconds: 10, disruptAfter: 4, recoveredAfter: 5) {
            cluster.killNode(2)
        }
        try Self.checkLoad(world, outcome, liveNodes: [0, 1], label: "kill -9 of n2")
        // The others kept serving: writes acknowledged by both after the kill.
        for node in 0..<2 {
            #expect((outcome.acknowledgedAfterRecovery[node] ?? 0) > 10, "node \(node) served too little after the kill: \(outcome.acknowledgedAfterRecovery)")
        }
        let afterKill = try NodeClient(port: cluster.port(0)).ok("users/current", token: world.owner.token)
        #expect(afterKill.status == 200)
    }

    @Test func postgresStoppedAndStartedDuringTheLoadAnswersTryAgainLaterAndRecovers() throws {
        let seed = RandomSeed.current
        print(#"{"multinode":"seed","test":"postgres-restart","seed":\#(seed)}"#)
        let postgres = try OwnPostgresCluster()
        let cluster = try NodeCluster(clusterURL: postgres.url)
        let world = try LoadWorld(cluster)
        let restartFailure = Mutex<String?>(nil)
        let outcome = Self.runLoad(world, seed: seed, seconds: 14, disruptAfter: 3, recoveredAfter: 9) {
            do {
                try postgres.stop()
                Thread.sleep(forTimeInterval: 2)
                try postgres.start()
            } catch {
                restartFailure.withLock { $0 = "\(error)" }
            }
        }
        #expect(restartFailure.withLock { $0 } == nil, "\(restartFailure.withLock { $0 } ?? "")")
        // Requests during the outage were refused with 503 TRY_AGAIN_LATER (never 500, checked below), and
        // every acknowledged write is there afterwards: no false acknowledgement.
        #expect((outcome.statuses[503] ?? 0) > 0, "nothing answered 503 while PostgreSQL was down: \(outcome.statuses)")
        try Self.checkLoad(world, outcome, liveNodes: [0, 1, 2], label: "postgres restart")
        // The nodes recovered by themselves: each acknowledged writes after the restart.
        for node in 0..<3 {
            #expect((outcome.acknowledgedAfterRecovery[node] ?? 0) > 0, "node \(node) did not recover: \(outcome.acknowledgedAfterRecovery)\n\(cluster.logs())")
        }
    }

    /// Webhook deliveries from two nodes that share one outbox: writes alternate between the nodes, both
    /// dispatchers claim (`FOR UPDATE SKIP LOCKED`), and the receiver gets every change once, in order.
    @Test func twoNodesDeliverEachWebhookOnceInOrder() throws {
        let receiver = try WebhookReceiverProcess()
        let cluster = try NodeCluster(nodes: 2, extra: ["--access-log", "off", "--webhook-private-addresses", "allow",
                                                        "--webhook-retry-ms", "100"])
        let first = NodeClient(port: cluster.port(0)), second = NodeClient(port: cluster.port(1))
        let owner = try first.signUp("owner")
        try first.ok("zones/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": zoneID("Hooks")]),
        ])])]), token: owner.token)
        let made = try second.ok("subscriptions/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "subscription": .object([
                "subscriptionID": .string("hooks"), "subscriptionType": .string("database"),
                "webhook": .object(["url": .string(receiver.url)])]),
        ])])]), token: owner.token)
        let secret = try #require(made["subscriptions"]?.arrayValue?.first?["webhook"]?["secret"]?.stringValue, "\(made.text)")
        try receiver.control(mode: "ok", secret: secret)
        let writes = 20
        for index in 0..<writes {
            let client = index % 2 == 0 ? first : second
            try client.ok("records/modify", .object([
                "zoneID": zoneID("Hooks"), "operations": .array([operation("create", "r\(index)")]),
            ]), token: owner.token)
        }
        let delivered = try receiver.wait(seconds: 30) { $0.count >= writes }
        #expect(delivered.count == writes, "\(delivered.count) of \(writes) came: \(cluster.logs())")
        #expect(delivered.map(\.sequence) == (1...Int64(writes)).map { $0 }, "in sequence order, each once")
        #expect(Set(delivered.map(\.id)).count == delivered.count)
        #expect(delivered.allSatisfy { $0.verified })
        // Nothing more comes (no node sends one twice).
        Thread.sleep(forTimeInterval: 1)
        #expect(try receiver.deliveries().count == writes)
    }

    @Test func aLongPollOnOneNodeWakesWithinASecondOfAWriteOnAnother() throws {
        let cluster = try NodeCluster()
        let a = NodeClient(port: cluster.port(0))
        let user = try a.signUp("waiter")
        try a.ok("zones/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": zoneID("Inbox")]),
        ])])]), token: user.token)
        var delays: [Double] = []
        for round in 0..<5 {
            let token = try #require(try a.ok("changes/database", token: user.token)["syncToken"])
            // Park a wait on node 0, seen unanswered for 0.5 s.
            let poll = try RawHTTPClient(port: cluster.port(0), timeoutSeconds: 20)
            let body = JSON.object(["syncToken": token, "timeout": .int(30)]).serializedBytes()
            try poll.write(Array("POST \(NodeClient.base)private/changes/wait HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(user.token)\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
            try #require(poll.staysQuiet(for: 0.5), "round \(round): the wait did not park")
            // Write on node 1 (round 0, 2, 4) or node 2.
            let writer = NodeClient(port: cluster.port(1 + round % 2))
            // Timed from before the write is sent (its own answer may come after the wake-up).
            let written = Self.now()
            try writer.ok("records/modify", .object(["zoneID": zoneID("Inbox"),
                                                     "operations": .array([operation("forceReplace", "m\(round)")])]),
                          token: user.token)
            let answer = try poll.readResponse(method: "POST")
            let delay = Double(Self.now() - written) / 1e9
            delays.append(delay)
            #expect(answer.status == 200 && (try? JSON.parse(answer.body)["changed"]) == .bool(true),
                    "round \(round): \(answer.status) \(String(decoding: answer.body, as: UTF8.self))")
            poll.close()
        }
        print(#"{"multinode":"long-poll-wake","seconds":[\#(delays.map { String(format: "%.3f", $0) }.joined(separator: ","))]}"#)
        #expect(delays.allSatisfy { $0 < 1 }, "wake-ups: \(delays)")
    }

    /// `shares/modify` of zone Team inviting `names` (read-only).
    static func invite(_ names: [String]) -> JSON {
        .object(["zoneID": zoneID("Team"), "participants": .array(names.map {
            .object(["operation": .string("invite"), "userName": .string($0), "permission": .string("readOnly")])
        })])
    }

    @Test func tenConcurrentInvitationsFromNinetyFiveThroughThreeNodesLeaveExactlyAHundred() throws {
        let cluster = try NodeCluster()
        let first = NodeClient(port: cluster.port(0))
        let owner = try first.signUp("host")
        try first.ok("zones/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": zoneID("Team")]),
        ])])]), token: owner.token)
        try first.ok("shares/create", .object(["zoneID": zoneID("Team")]), token: owner.token)
        for index in 0..<104 { _ = try NodeClient(port: cluster.port(index % 3)).signUp("guest\(index)") }
        // The owner and 94 guests: 95.
        try first.ok("shares/modify", Self.invite((0..<94).map { "guest\($0)" }), token: owner.token)
        let active = { (reply: NodeReply) in
            (reply["participants"]?.arrayValue ?? []).filter { $0["acceptanceStatus"]?.stringValue != "removed" }.count
        }
        #expect(active(try first.ok("shares/lookup", .object(["zoneID": zoneID("Team")]), token: owner.token)) == 95)

        // Ten invitations at once, each its own request, through the three nodes in turn.
        let codes = Mutex<[Int: String]>([:])
        let gate = DispatchSemaphore(value: 0)
        let group = DispatchGroup()
        let ports = cluster.ports
        for index in 0..<10 {
            group.enter()
            Thread {
                defer { group.leave() }
                let client = NodeClient(port: ports[index % 3])
                gate.wait()
                var code = "no answer"
                for _ in 0..<50 {  // retried while TRY_AGAIN_LATER, as a client would
                    guard let reply = try? client.post("shares/modify", Self.invite(["guest\(94 + index)"]), token: owner.token,
                                                       database: "private") else { break }
                    code = reply.status == 200 ? "OK" : (reply.code ?? "\(reply.status)")
                    if code != "TRY_AGAIN_LATER" { break }
                    Thread.sleep(forTimeInterval: 0.02)
                }
                codes.withLock { $0[index] = code }
            }.start()
        }
        for _ in 0..<10 { gate.signal() }
        group.wait()
        let outcome = codes.withLock { $0 }
        print(#"{"multinode":"invitations","outcomes":"\#(outcome.sorted { $0.key < $1.key }.map { "\($0.key):\($0.value)" }.joined(separator: " "))"}"#)
        #expect(outcome.values.filter { $0 == "OK" }.count == 5, "\(outcome)")
        #expect(outcome.values.filter { $0 == "TOO_MANY_PARTICIPANTS" }.count == 5, "\(outcome)")
        for node in 0..<3 {
            let view = try NodeClient(port: cluster.port(node)).ok("shares/lookup", .object(["zoneID": zoneID("Team")]),
                                                                   token: owner.token)
            #expect(active(view) == 100, "node \(node) sees \(active(view)) participants")
        }
    }

    @Test func aSingleUseLinkAcceptedOnThreeNodesAtOnceJoinsExactlyOnce() throws {
        let cluster = try NodeCluster()
        let first = NodeClient(port: cluster.port(0))
        let owner = try first.signUp("linker")
        try first.ok("zones/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": zoneID("Once")]),
        ])])]), token: owner.token)
        try first.ok("shares/create", .object(["zoneID": zoneID("Once"), "publicPermission": .string("readOnly")]),
                     token: owner.token)
        let rounds = 5
        let guests = try (0..<(rounds * 3)).map { try NodeClient(port: cluster.port($0 % 3)).signUp("joiner\($0)") }
        let ports = cluster.ports
        for round in 0..<rounds {
            let url = try #require(try first.ok("shares/url", .object(["zoneID": zoneID("Once"), "maxUses": .int(1)]),
                                                token: owner.token)["url"]?.stringValue)
            let statuses = Mutex<[Int: String]>([:])
            let gate = DispatchSemaphore(value: 0)
            let group = DispatchGroup()
            for node in 0..<3 {
                group.enter()
                let guest = guests[round * 3 + node]
                Thread {
                    defer { group.leave() }
                    let client = NodeClient(port: ports[node])
                    gate.wait()
                    var status = "no answer"
                    for _ in 0..<50 {
                        guard let reply = try? client.post("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                                           token: guest.token, database: "shared") else { break }
                        let result = reply["results"]?.arrayValue?.first
                        status = result?["participantStatus"]?.stringValue ?? result?["serverErrorCode"]?.stringValue
                            ?? reply.code ?? "\(reply.status)"
                        if status != "TRY_AGAIN_LATER" { break }
                        Thread.sleep(forTimeInterval: 0.02)
                    }
                    statuses.withLock { $0[node] = status }
                }.start()
            }
            for _ in 0..<3 { gate.signal() }
            group.wait()
            let outcome = statuses.withLock { $0 }
            print(#"{"multinode":"single-use","round":\#(round),"outcomes":"\#(outcome.sorted { $0.key < $1.key }.map { "n\($0.key):\($0.value)" }.joined(separator: " "))"}"#)
            #expect(outcome.values.filter { $0 == "accepted" }.count == 1, "round \(round): \(outcome)")
            #expect(outcome.values.filter { $0 == "ACCESS_DENIED" }.count == 2, "round \(round): \(outcome)")
        }
        // One joiner per link: the owner and `rounds` participants, on every node.
        for node in 0..<3 {
            let view = try NodeClient(port: cluster.port(node)).ok("shares/lookup", .object(["zoneID": zoneID("Once")]),
                                                                   token: owner.token)
            let joined = (view["participants"]?.arrayValue ?? []).filter { $0["acceptanceStatus"]?.stringValue == "accepted" }
            #expect(joined.count == 1 + rounds, "node \(node): \(view.text)")
        }
    }

    @Test func aKeyRotatedAndRetiredThroughOneNodeInvalidatesItsLinksOnEveryNode() throws {
        let cluster = try NodeCluster()
        let first = NodeClient(port: cluster.port(0))
        let owner = try first.signUp("keyholder")
        let reader = try NodeClient(port: cluster.port(1)).signUp("keyreader")
        try first.ok("zones/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": zoneID("Keys")]),
        ])])]), token: owner.token)
        try first.ok("shares/create", .object(["zoneID": zoneID("Keys"), "publicPermission": .string("readOnly")]),
                     token: owner.token)
        let resolve = { (node: Int, url: String) throws -> String in
            let reply = try NodeClient(port: cluster.port(node)).ok(
                "records/resolve", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                token: reader.token, database: "shared")
            let result = reply["results"]?.arrayValue?.first
            return result?["serverErrorCode"]?.stringValue ?? "OK"
        }
        let makeLink = { (node: Int, extra: [String: JSON]) throws -> String in
            var body: [String: JSON] = ["zoneID": zoneID("Keys")]
            for (key, value) in extra { body[key] = value }
            guard let url = try NodeClient(port: cluster.port(node)).ok("shares/url", .object(body), token: owner.token)["url"]?
                .stringValue else { throw HarnessError("no url") }
            return url
        }
        let oldKeyLink = try makeLink(0, [:])
        #expect(oldKeyLink.hasPrefix(NodeCluster.publicURL + "/share/"), "\(oldKeyLink)")
        for node in 0..<3 { #expect(try resolve(node, oldKeyLink) == "OK", "node \(node) refuses a fresh link") }

        // The URL epoch, rotated through node 1: the old link fails on every node, a new one works on all.
        _ = try makeLink(1, ["rotate": .bool(true)])
        for node in 0..<3 { #expect(try resolve(node, oldKeyLink) == "ACCESS_DENIED", "node \(node) accepts an old-epoch link") }
        let newEpochLink = try makeLink(2, [:])
        for node in 0..<3 { #expect(try resolve(node, newEpochLink) == "OK") }

        // The signing key, rotated with `lattice admin` on the database: links of the old key keep working
        // on every node until it is retired, then fail on every node; links of the new key work everywhere.
        let keys = try cluster.admin(["share-keys", "--json"])
        try #require(keys.status == 0, "\(keys)")
        let oldKid = try #require(try keys.json.arrayValue?.first { $0["state"]?.stringValue == "active" }?["kid"]?.stringValue)
        let rotated = try cluster.admin(["rotate-share-key"])
        try #require(rotated.status == 0, "\(rotated)")
        for node in 0..<3 { #expect(try resolve(node, newEpochLink) == "OK", "node \(node): the old key stopped verifying before it was retired") }
        let newKeyLink = try makeLink(1, [:])
        // A key id is base64url and may begin with "--": it goes after "--".
        let retired = try cluster.admin(["retire-share-key", "--", oldKid])
        try #require(retired.status == 0, "\(retired)")
        for node in 0..<3 {
            #expect(try resolve(node, newEpochLink) == "ACCESS_DENIED", "node \(node) accepts a link of the retired key")
            #expect(try resolve(node, newKeyLink) == "OK", "node \(node) refuses a link of the new key")
        }
        // The JWKS of every node lists the new key only.
        for node in 0..<3 {
            let jwks = try RawHTTPClient(port: cluster.port(node)).send(method: "GET", path: "/.well-known/jwks.json")
            let kids = (try JSON.parse(jwks.body)["keys"]?.arrayValue ?? []).compactMap { $0["kid"]?.stringValue }
            #expect(!kids.contains(oldKid) && kids.count == 1, "node \(node): \(kids)")
        }
    }

    @Test func theCLIDemoWithTheTwoUsersOnDifferentNodes() throws {
        let cluster = try NodeCluster(nodes: 2)
        let home = cluster.directory
        let alice = home + "/alice", bob = home + "/bob"
        try CLITests.ok("signup", "alice", "--server", cluster.url(0), home: alice)
        try CLITests.ok("signup", "bob", "--server", cluster.url(1), home: bob)
        try CLITests.ok("list", "create", "Groceries", home: alice)
        try CLITests.ok("list", "add", "Groceries", "Milk", "--tag", "dairy", home: alice)
        try CLITests.ok("list", "add", "Groceries", "Eggs", home: alice)
        try CLITests.ok("share", "create", "Groceries", "--public-permission", "read-write", home: alice)
        let link = try #require(try CLITests.ok("share", "url", "Groceries", "--json", home: alice).json["url"]?.stringValue)
        try CLITests.ok("accept", link, "--yes", home: bob)

        // Offline edits on both sides: the same item's text, a tag removed by one and added by the other.
        try CLITests.ok("list", "edit", "Groceries", "Milk", "--text", "Oat milk", "--remove-tag", "dairy", "--no-sync", home: alice)
        try CLITests.ok("list", "add", "Groceries", "Coffee", "--no-sync", home: alice)
        try CLITests.ok("list", "edit", "Groceries", "Milk", "--text", "Whole milk", "--add-tag", "dairy", "--add-tag", "cold",
                        "--no-sync", home: bob)
        try CLITests.ok("list", "check", "Groceries", "Eggs", "--no-sync", home: bob)
        try CLITests.ok("sync", home: alice)
        try CLITests.ok("sync", home: bob)
        try CLITests.ok("sync", home: alice)

        let aliceItems = try CLITests.ok("list", "show", "Groceries", "--json", home: alice).json["items"]
        let bobItems = try CLITests.ok("list", "show", "Groceries", "--json", home: bob).json["items"]
        #expect(aliceItems == bobItems, "alice: \(aliceItems?.serialized() ?? "-")\nbob: \(bobItems?.serialized() ?? "-")")
        // Converged as on one node: one milk item (either text: the later write wins), the tag added on one
        // side kept over its concurrent removal, Eggs checked, Coffee added.
        let items = aliceItems?.arrayValue ?? []
        #expect(items.count == 3, "\(items)")
        let milk = items.filter { $0["text"]?.stringValue?.hasSuffix("milk") == true }
        #expect(milk.count == 1 && ["Oat milk", "Whole milk"].contains(milk.first?["text"]?.stringValue ?? ""), "\(items)")
        #expect(milk.first?["tags"] == .array([.string("cold"), .string("dairy")]), "\(items)")
        #expect(items.contains { $0["text"] == .string("Eggs") && $0["done"] == .bool(true) })
        #expect(items.contains { $0["text"] == .string("Coffee") })
    }
}

private extension String {
    var braced: String { "{" + self + "}" }
}
