import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The attack suite of issue 13: a real `lattice serve`, a probe client (its own account, from 127.0.0.1)
/// measuring `/healthz`, a one-record write and a small query while an attacker (its own account and/or
/// other loopback addresses, 127.0.k.x) runs one attack for a few seconds.
///
/// Pass, per attack: probe success >= 99 % and probe p99 under 250 ms times `p99Factor` (1 for a release
/// build; `debugFactor` for a debug build, see below), and the attacker gets clear answers: a 4xx, or a 503
/// with Retry-After, each with a JSON `serverErrorCode` (a 2xx where the request is within the caps), or
/// for slow clients its connection closed by the server. Some attacks expect refusals too (over-cap
/// requests, floods, long polls past a per-user cap).
///
/// Each attack gets a fresh server process on the same data directory (made once: accounts, a zone of
/// 20,000 records, records near the 1 MiB cap), so one attack's leftovers (a query still running, parked
/// connections) never count against the next. Attacks use their own loopback /24 (127.0.k.0), so per-address
/// throttles of one never reach another, nor the probe's 127.0.0.1.
///
/// The table (attack, probe success, p50/p99, attacker's answers) is printed after each attack and whole
/// at the end of the process (lines starting with `| `).
///
/// Knobs: `LATTICE_BIN` (the binary; say `.build/release/lattice`), `LATTICE_ATTACK_P99_FACTOR` (overrides
/// the factor), `LATTICE_ATTACK_SLOW_SECONDS` (how long slow clients may stay open, default 15), and
/// `LATTICE_ATTACK_SUITE=skip`, which skips the suite so a script can run everything else in parallel and
/// then this suite alone (its probe measures latency; suites running beside it on a small machine add
/// noise, and its floods slow them down).
@Suite(.serialized, .enabled(if: ProcessInfo.processInfo.environment["LATTICE_ATTACK_SUITE"] != "skip",
                             "LATTICE_ATTACK_SUITE=skip"))
struct AttackSuiteTests {
    /// A debug build's probe p99 budget is 250 ms times this. Measured with no attack (the `idle` row, debug
    /// test process both times) on the 2-core build machine, 2026-12-01: a release server's probe p99 was
    /// 14-22 ms, a debug server's 28-34 ms (about 2x), and 196 ms while a release build shared the cores.
    /// 4x (1 s) leaves room for such neighbours; a stall caused by an attack costs the probe seconds (its
    /// requests time out at 2 s), so it still fails.
    static let debugFactor = 4.0

    static var p99Factor: Double {
        if let text = ProcessInfo.processInfo.environment["LATTICE_ATTACK_P99_FACTOR"], let factor = Double(text) { return factor }
        return AttackServer.isDebugBuild ? debugFactor : 1
    }

    static var p99Budget: Double { 0.250 * p99Factor }

    static var slowSeconds: Double {
        ProcessInfo.processInfo.environment["LATTICE_ATTACK_SLOW_SECONDS"].flatMap(Double.init) ?? 15
    }

    /// Seconds each request attack lasts (the slow-client ones last until their connections are closed, at
    /// most `slowSeconds`).
    static let floodSeconds = 3.0

    // MARK: Fixture

    /// The data directory every attack's server opens, and the accounts and data in it.
    final class Fixture: Sendable {
        let data: String
        let probeToken: String
        let attackerToken: String
        /// Two more attacking accounts, each with a zone `Heavy` like the attacker's (the attack from several
        /// accounts at once).
        let accompliceTokens: [String]
        /// Records in the attacker's zone `Heavy`.
        let heavyRecords = 20_000
        /// Names of the attacker's records near the 1 MiB record cap (zone `Big`), and their list size.
        let bigRecords: [String]
        let bigElements: Int

        init() throws {
            let data = temporaryDirectory("lattice-attack")
            chmod(data, 0o700) // owner-only, as the server wants its data directory
            _ = raiseOpenFilesLimit(to: 16_384)
            // Accounts through `lattice admin add-user`, not sign-up (its limits are under test).
            func addUser(_ name: String) throws -> String {
                let process = Process()
                process.executableURL = URL(fileURLWithPath: AttackServer.binary)
                process.arguments = ["admin", "add-user", name, "--data", data, "--json"]
                let output = Pipe()
                process.standardOutput = output
                process.standardError = FileHandle.nullDevice
                try process.run()
                let bytes = output.fileHandleForReading.readDataToEndOfFile()
                process.waitUntilExit()
                guard process.terminationStatus == 0, let token = try JSON.parse([UInt8](bytes))["token"]?.stringValue else {
                    throw HarnessError("lattice admin add-user \(name) failed")
                }
                return token
            }
            let probeToken = try addUser("probe")
            let attackerToken = try addUser("attacker")
            let accompliceTokens = try ["accomplice-1", "accomplice-2"].map(addUser)

            let server = try AttackServer(data: data)
            defer { server.stop(graceSeconds: 10) }
            let client = try LoopbackClient(port: server.port, source: "127.0.0.1", timeoutSeconds: 60)
            func call(_ token: String, _ operation: String, _ body: [String: JSON]) throws -> JSON {
                let reply = try client.send(path: "/database/1/lattice/production/private/" + operation,
                                            headers: ["Authorization": "Bearer " + token], body: JSON.object(body).serializedBytes())
                guard reply.status == 200 else {
                    throw HarnessError("setup \(operation): \(reply.status) \(String(decoding: reply.body.prefix(300), as: UTF8.self))")
                }
                return try JSON.parse(reply.body)
            }
            for (token, zone) in [(probeToken, "Probe"), (attackerToken, "Heavy"), (attackerToken, "Big"), (attackerToken, "Lists")]
                + accompliceTokens.map({ ($0, "Heavy") }) {
                _ = try call(token, "zones/modify", ["operations": .array([.object(["operationType": .string("create"),
                                                                                   "zone": .object(["zoneID": .object(["zoneName": .string(zone)])])])])])
            }
            // The probe's query finds a few records.
            _ = try call(probeToken, "records/modify", ["zoneID": .object(["zoneName": .string("Probe")]), "operations": .array((0..<10).map {
                AttackSuiteTests.create("note-\($0)", type: "Note", fields: ["n": .object(["value": .int(Int64($0))])])
            })])
            // The heavy zones: 20,000 small records each, 400 per request.
            for token in [attackerToken] + accompliceTokens {
                for start in stride(from: 0, to: 20_000, by: 400) {
                    let reply = try call(token, "records/modify", ["zoneID": .object(["zoneName": .string("Heavy")]),
                        "operations": .array((start..<min(start + 400, 20_000)).map {
                            AttackSuiteTests.create(String(format: "h%05d", $0), type: "Item", fields: [
                                "n": .object(["value": .int(Int64($0))]), "s": .object(["value": .string("item-\($0)")]),
                            ])
                        })])
                    guard (reply["records"]?.arrayValue ?? []).allSatisfy({ $0["serverErrorCode"] == nil }) else {
                        throw HarnessError("setup: the heavy zone refused a record: \(reply.serialized().prefix(300))")
                    }
                }
            }
            // Records as close to the record cap as a list of 18-byte elements gets: the largest accepted size.
            var elements = 50_000
            var accepted: Int?
            while accepted == nil && elements >= 1_000 {
                let reply = try call(attackerToken, "records/modify", ["zoneID": .object(["zoneName": .string("Big")]),
                                                                       "operations": .array([AttackSuiteTests.bigListRecord("big-0", elements: elements)])])
                if reply["records"]?.arrayValue?.first?["serverErrorCode"] == nil { accepted = elements } else { elements = elements * 4 / 5 }
            }
            guard let accepted else { throw HarnessError("setup: no list record of 1,000 18-byte elements was accepted") }
            let bigRecords = (0..<4).map { "big-\($0)" }
            for name in bigRecords.dropFirst() {
                _ = try call(attackerToken, "records/modify", ["zoneID": .object(["zoneName": .string("Big")]),
                                                               "operations": .array([AttackSuiteTests.bigListRecord(name, elements: accepted)])])
            }
            self.data = data
            self.probeToken = probeToken
            self.attackerToken = attackerToken
            self.accompliceTokens = accompliceTokens
            self.bigRecords = bigRecords
            bigElements = accepted
            atexit {
                AttackSuiteTests.printTable()
                if let data = try? AttackSuiteTests.fixture.get().data { try? FileManager.default.removeItem(atPath: data) }
            }
        }
    }

    static let fixture = Result { try Fixture() }

    static func create(_ name: String, type: String, fields: [String: JSON]) -> JSON {
        .object(["operationType": .string("create"), "record": .object([
            "recordName": .string(name), "recordType": .string(type), "fields": .object(fields),
        ])])
    }

    /// A record with one STRING_LIST of `elements` distinct elements of `length` bytes each.
    static func bigListRecord(_ name: String, elements: Int, length: Int = 18) -> JSON {
        let values: [JSON] = (0..<elements).map { index in
            let digits = String(index)
            return .string(String(repeating: "x", count: max(0, length - digits.count)) + digits)
        }
        return create(name, type: "Blob", fields: ["list": .object(["value": .array(values), "type": .string("STRING_LIST")])])
    }

    // MARK: Table

    struct Row: Sendable {
        var attack: String
        var probe: String
        var p50: String
        var p99: String
        var answers: String
        var verdict: String
    }

    static let rows = Mutex<[Row]>([])

    static func tableLines(_ rows: [Row]) -> [String] {
        ["| attack | probe success | probe p50 / p99 (ms) | attacker's answers | result |",
         "|---|---|---|---|---|"] + rows.map { "| \($0.attack) | \($0.probe) | \($0.p50) / \($0.p99) | \($0.answers) | \($0.verdict) |" }
    }

    static func printTable() {
        let all = rows.withLock { $0 }
        guard !all.isEmpty else { return }
        let build = AttackServer.isDebugBuild ? "debug" : "release"
        print("\nAttack suite (\(build) build, probe p99 budget \(Int(p99Budget * 1000)) ms = 250 ms x \(p99Factor)):")
        for line in tableLines(all) { print(line) }
        fflush(nil)
    }

    // MARK: Running one attack

    /// What an attack gets: its server, its addresses, the attacker's token, the fixture, and the probe's
    /// start (call it once the attack is in place; it is started anyway before the attack body if not).
    struct Context {
        let server: AttackServer
        let fixture: Fixture
        let subnet: Int
        let tally: AnswerTally
        let startProbe: () -> Void

        var port: UInt16 { server.port }
        var token: String { fixture.attackerToken }
        /// `count` attacker addresses in this attack's /24: 127.0.subnet.2 ...
        func sources(_ count: Int) -> [String] { (0..<count).map { "127.0.\(subnet).\($0 + 2)" } }
        func path(_ operation: String) -> String { "/database/1/lattice/production/private/" + operation }
        var auth: [String: String] { ["Authorization": "Bearer " + token] }
    }

    /// Runs `attack` against a fresh server with the probe running, records and prints the row, and checks
    /// the pass criteria plus the attack's own `expectations` (each a failure message, or nil when met).
    func run(_ name: String, subnet: Int, probeDuringSetup: Bool = false, serverArguments: [String] = [],
             expectations: (AnswerTally) -> [String?] = { _ in [] },
             attack: (Context) throws -> Void) throws {
        let fixture = try Self.fixture.get()
        let server = try AttackServer(data: fixture.data, extra: serverArguments)
        defer { server.stop() }
        let ready = try LoopbackClient(port: server.port).send(method: "GET", path: "/healthz")
        #expect(ready.status == 200)
        let rssBefore = server.residentMiB
        let probe = Probe(port: server.port, token: fixture.probeToken, zone: "Probe")
        let tally = AnswerTally()
        let context = Context(server: server, fixture: fixture, subnet: subnet, tally: tally, startProbe: {
            probe.start(maximumSeconds: Self.slowSeconds + 10)
        })
        if probeDuringSetup { context.startProbe() }
        let began = attackClock()
        try attack(context)
        context.startProbe() // an attack that never called it still gets a (short) measurement
        if attackClock() - began < 0.5 { usleep(500_000) }
        let result = probe.stop()
        let rssAfter = server.residentMiB
        let alive = server.process.isRunning

        let p50 = result.p50.map { String(format: "%.1f", $0 * 1000) } ?? "-"
        let p99 = result.p99.map { String(format: "%.1f", $0 * 1000) } ?? "-"
        var failures: [String] = []
        if result.attempts < 10 { failures.append("the probe made only \(result.attempts) requests") }
        if result.successRate < 0.99 {
            failures.append("probe success \(result.successes)/\(result.attempts) is under 99 %: \(result.failures)")
        }
        if let worst = result.p99, worst > Self.p99Budget {
            failures.append(String(format: "probe p99 %.1f ms is over the budget of %.0f ms", worst * 1000, Self.p99Budget * 1000))
        }
        let unclearAllowed = tally.total / 100
        if tally.unclear > unclearAllowed {
            failures.append("the attacker got \(tally.unclear) unclear outcomes of \(tally.total): \(tally.summary)")
        }
        if !alive { failures.append("the server died: \(AttackServer.tail(server.logPath))") }
        failures += expectations(tally).compactMap { $0 }

        var answers = tally.total == 0 ? "-" : tally.summary
        if let rssBefore, let rssAfter, rssAfter - rssBefore > 50 {
            answers += String(format: "; server RSS %.0f -> %.0f MiB", rssBefore, rssAfter)
        }
        let row = Row(attack: name, probe: String(format: "%.1f %% of %d", result.successRate * 100, result.attempts),
                      p50: p50, p99: p99, answers: answers, verdict: failures.isEmpty ? "pass" : "FAIL")
        Self.rows.withLock { $0.append(row) }
        print(Self.tableLines([row]).last!)
        for failure in failures { print("  \(name): \(failure.prefix(600))") }
        fflush(nil)
        #expect(failures.isEmpty, "\(name): \(failures.joined(separator: "; "))")
    }

    /// The largest n in `range` whose request the server serves (2xx without item errors), by bisection
    /// to within 5 % (at most 11 requests). A request refused with a 4xx means "over the cap"; one not answered within
    /// `timeout` counts as served (the server took it on: that is what an attacker would use).
    static func largestServed(_ range: ClosedRange<Int>, port: UInt16, source: String, timeout: Double = 4,
                              request: (Int) -> (path: String, headers: [String: String], body: [UInt8])) -> Int {
        func served(_ n: Int) -> Bool {
            let made = request(n)
            guard let client = try? LoopbackClient(port: port, source: source, timeoutSeconds: timeout) else { return false }
            do {
                let reply = try client.send(path: made.path, headers: made.headers, body: made.body)
                if (400..<500).contains(reply.status) { return false }
                let items = (try? JSON.parse(reply.body))?["records"]?.arrayValue ?? []
                return (200..<300).contains(reply.status)
                    && !items.contains { $0["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED" }
            } catch {
                return true
            }
        }
        if served(range.upperBound) { return range.upperBound }
        var low = range.lowerBound, high = range.upperBound // served(low) assumed, !served(high)
        var steps = 0
        while high - low > max(1, low / 20) && steps < 10 {
            steps += 1
            let middle = (low + high) / 2
            if served(middle) { low = middle } else { high = middle }
        }
        return low
    }

    // MARK: The attacks

    @Test func idleBaseline() throws {
        try run("idle (no attack)", subnet: 1) { context in
            context.startProbe()
            usleep(UInt32(Self.floodSeconds * 1e6))
        }
    }

    @Test func largestListTheCapsAllow() throws {
        try run("largest list the caps allow (records/modify, 6-byte elements)", subnet: 2) { context in
            let zone: JSON = .object(["zoneName": .string("Lists")])
            // The element cap (50,000 by default) or the record cap, whichever comes first: found by bisection
            // from the 18-byte list the fixture found accepted (shorter elements fit at least as many).
            let cap = Self.largestServed(context.fixture.bigElements...50_000, port: context.port, source: context.sources(1)[0]) { n in
                (context.path("records/modify"), context.auth, JSON.object(["zoneID": zone, "operations": .array([
                    Self.bigListRecord("cap-\(n)-\(UUID().uuidString.prefix(6))", elements: n, length: 6)])]).serializedBytes())
            }
            print("  largest list the caps allow: \(cap) elements of 6 bytes")
            context.startProbe()
            let path = context.path("records/modify"), auth = context.auth
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 200,
                  tally: context.tally) { thread, index in
                (path, auth, JSON.object(["zoneID": zone, "operations": .array([
                    Self.bigListRecord("list-\(thread)-\(index)", elements: cap, length: 6)])]).serializedBytes())
            }
        }
    }

    @Test func listNearTheRecordCap() throws {
        try run("list near the 1 MiB record cap (records/modify)", subnet: 3) { context in
            let zone: JSON = .object(["zoneName": .string("Lists")])
            let elements = context.fixture.bigElements
            context.startProbe()
            let path = context.path("records/modify"), auth = context.auth
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 200,
                  tally: context.tally) { thread, index in
                (path, auth, JSON.object(["zoneID": zone, "operations": .array([
                    Self.bigListRecord("near-\(thread)-\(index)", elements: elements)])]).serializedBytes())
            }
        }
    }

    @Test func requestsOverTheCapsAreRefused() throws {
        try run("over the caps (list of 50,001; 60,000 fields; 2.5 MiB body)", subnet: 4, expectations: { tally in
            [tally.refusals == tally.total && tally.total > 0 ? nil : "an over-cap request was not refused: \(tally.summary)"]
        }) { context in
            let zone: JSON = .object(["zoneName": .string("Lists")])
            let overList = JSON.object(["zoneID": zone, "operations": .array([Self.bigListRecord("over-list", elements: 50_001, length: 4)])])
                .serializedBytes()
            var fields: [String: JSON] = [:]
            for index in 0..<60_000 { fields["f\(index)"] = .object(["value": .int(1)]) }
            let overFields = JSON.object(["zoneID": zone, "operations": .array([Self.create("over-fields", type: "Blob", fields: fields)])])
                .serializedBytes()
            let overBody = JSON.object(["zoneID": zone, "operations": .array([Self.create("over-body", type: "Blob", fields: [
                "s": .object(["value": .string(String(repeating: "b", count: 2_600_000))])])])]).serializedBytes()
            let bodies = [overList, overFields, overBody]
            context.startProbe()
            let path = context.path("records/modify"), auth = context.auth
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 300,
                  tally: context.tally) { thread, index in (path, auth, bodies[(thread + index) % bodies.count]) }
        }
    }

    /// `n` filters on a field every record has, each matching every record: every filter runs on every record.
    static func heavyQuery(filters n: Int) -> [UInt8] {
        let filter: JSON = .object(["fieldName": .string("n"), "comparator": .string("GREATER_THAN_OR_EQUALS"),
                                    "fieldValue": .object(["value": .int(0)])])
        return JSON.object(["zoneID": .object(["zoneName": .string("Heavy")]), "query": .object([
            "recordType": .string("Item"), "filterBy": .array(Array(repeating: filter, count: n)),
            "sortBy": .array([.object(["fieldName": .string("s"), "ascending": .bool(false)])]),
        ])]).serializedBytes()
    }

    /// The body of the heaviest query the caps allow on a `Heavy` zone (the most filters served), found
    /// against this attack's server, and the seconds one such query takes alone.
    static func heaviestQuery(_ context: Context, _ label: String) -> (body: [UInt8], seconds: Double) {
        let filters = largestServed(1...20_000, port: context.port, source: context.sources(1)[0]) { n in
            (context.path("records/query"), context.auth, heavyQuery(filters: n))
        }
        let body = heavyQuery(filters: filters)
        let started = ContinuousClock.now
        _ = try? LoopbackClient(port: context.port, source: context.sources(1)[0], timeoutSeconds: 30)
            .send(path: context.path("records/query"), headers: context.auth, body: body)
        let elapsed = ContinuousClock.now - started
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
        print("  \(label): \(filters) filters, \(String(format: "%.2f", seconds)) s alone")
        return (body, seconds)
    }

    /// The server's bound on waiting in line for a worker (`maximumQueueWaitMilliseconds`' default).
    static let queueWaitSeconds = 5.0

    @Test func heaviestQueryWithTheMostFilters() throws {
        try run("heaviest query: 20,000 records, most filters allowed", subnet: 5) { context in
            let body = Self.heaviestQuery(context, "heaviest query").body
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 100,
                  tally: context.tally) { [path = context.path("records/query"), auth = context.auth] _, _ in (path, auth, body) }
        }
    }

    @Test func heaviestQueriesFromThreeAccountsAtOnce() throws {
        try run("heaviest queries from 3 accounts at once (2 each)", subnet: 18) { context in
            let (body, alone) = Self.heaviestQuery(context, "heaviest query from 3 accounts")
            let auths = ([context.token] + context.fixture.accompliceTokens).map { ["Authorization": "Bearer " + $0] }
            context.startProbe()
            // Threads 0-5: two per account, each from its own address. Three of the six run at once (the last
            // free worker is kept for the probe); the others wait in line, at most the server's bound, then
            // run. An answer is due within that bound plus three times a query's time alone (three share
            // two cores); the debug build in CI takes seconds per query, so 8 s alone would be too short.
            flood(port: context.port, threads: 6, sources: context.sources(6), seconds: Self.floodSeconds, maximumRequests: 100,
                  requestTimeout: max(8, Self.queueWaitSeconds + 3 * alone),
                  tally: context.tally) { [path = context.path("records/query")] thread, _ in (path, auths[thread % 3], body) }
        }
    }

    @Test func queryWithAHugeInList() throws {
        try run("query with the largest IN list allowed (20,000 records)", subnet: 6) { context in
            func body(_ n: Int) -> [UInt8] {
                JSON.object(["zoneID": .object(["zoneName": .string("Heavy")]), "query": .object([
                    "recordType": .string("Item"),
                    "filterBy": .array([.object(["fieldName": .string("n"), "comparator": .string("IN"), "fieldValue": .object([
                        "value": .array((0..<n).map { .int(Int64($0 * 7 + 1_000_000)) }), "type": .string("INT64_LIST")])])]),
                ])]).serializedBytes()
            }
            let values = Self.largestServed(1...30_000, port: context.port, source: context.sources(1)[0]) { n in
                (context.path("records/query"), context.auth, body(n))
            }
            print("  huge IN list: \(values) values")
            let request = body(values)
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 100,
                  tally: context.tally) { [path = context.path("records/query"), auth = context.auth] _, _ in (path, auth, request) }
        }
    }

    /// Bounded answers: 32 MiB is far above any sane response cap and far below the 180 MB the duplicates
    /// made before the caps.
    static let answerBytesBound = 32 << 20

    @Test func lookupNamingOneBigRecord200Times() throws {
        try run("records/lookup naming one big record 200 times", subnet: 7, expectations: { tally in
            [tally.largestBody <= Self.answerBytesBound ? nil : "an answer of \(tally.largestBody) bytes (over 32 MiB)"]
        }) { context in
            let name = context.fixture.bigRecords[0]
            let body = JSON.object(["zoneID": .object(["zoneName": .string("Big")]),
                                    "records": .array(Array(repeating: .object(["recordName": .string(name)]), count: 200))])
                .serializedBytes()
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 50,
                  tally: context.tally) { [path = context.path("records/lookup"), auth = context.auth] _, _ in (path, auth, body) }
        }
    }

    @Test func changesZoneNamingOneZoneManyTimes() throws {
        try run("changes/zone naming one zone of big records 50 times", subnet: 8, expectations: { tally in
            [tally.largestBody <= Self.answerBytesBound ? nil : "an answer of \(tally.largestBody) bytes (over 32 MiB)"]
        }) { context in
            let body = JSON.object(["zones": .array(Array(repeating: .object(["zoneID": .object(["zoneName": .string("Big")])]),
                                                          count: 50))]).serializedBytes()
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 50,
                  tally: context.tally) { [path = context.path("changes/zone"), auth = context.auth] _, _ in (path, auth, body) }
        }
    }

    /// A request head that never ends, one byte per second: a slowloris client.
    static func slowHead(_ index: Int) -> [UInt8] {
        Array("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow-\(index): \(String(repeating: "s", count: 200))\r\n".utf8)
    }

    static func allClosed(_ tally: AnswerTally) -> String? {
        tally.refusals == tally.total && tally.total > 0 ? nil : "not every slow connection was closed or refused: \(tally.summary)"
    }

    @Test func slowlorisFromOneAddress() throws {
        try run("slowloris: 300 connections from one address", subnet: 9, expectations: { [Self.allClosed($0)] }) { context in
            holdSlowClients(port: context.port, connections: 300, sources: context.sources(1), prefix: { _ in [] },
                            trickle: Self.slowHead, bytesPerTick: 1, tickSeconds: 1, seconds: Self.slowSeconds,
                            tally: context.tally, onReady: context.startProbe)
        }
    }

    @Test func slowlorisFromManyAddresses() throws {
        try run("slowloris: 1,100 connections from 20 addresses", subnet: 10, expectations: { [Self.allClosed($0)] }) { context in
            holdSlowClients(port: context.port, connections: 1_100, sources: context.sources(20), prefix: { _ in [] },
                            trickle: Self.slowHead, bytesPerTick: 1, tickSeconds: 1, seconds: Self.slowSeconds,
                            tally: context.tally, onReady: context.startProbe)
        }
    }

    static func waitRequest(port: UInt16, token: String, timeout: Int) -> [UInt8] {
        let body = #"{"timeout":\#(timeout)}"#
        return Array(("POST /database/1/lattice/production/private/changes/wait HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
                      + "Authorization: Bearer \(token)\r\nContent-Length: \(body.utf8.count)\r\n\r\n" + body).utf8)
    }

    @Test func parkedLongPollsFromOneUser() throws {
        try run("parked long polls: 160 changes/wait by one user (4 addresses)", subnet: 11, expectations: { tally in
            [tally.refusals > 0 ? nil : "no long poll past a per-user cap was refused: \(tally.summary)"]
        }) { context in
            let request = Self.waitRequest(port: context.port, token: context.token, timeout: 30)
            holdSlowClients(port: context.port, connections: 160, sources: context.sources(4), prefix: { _ in request },
                            seconds: Self.floodSeconds + 1, stillOpenIsClear: true, tally: context.tally, onReady: context.startProbe)
        }
    }

    @Test func longPollsWhoseClientsWentAwayAreFreed() throws {
        try run("long polls: 64 parked by one user and address, then gone", subnet: 12, expectations: { tally in
            [tally.counts.keys.contains { $0.hasPrefix("new wait after the others left: 200") } ? nil
                : "a new changes/wait from the same user and address was not served after the others left: \(tally.summary)"]
        }) { context in
            let source = context.sources(1)[0]
            let request = Self.waitRequest(port: context.port, token: context.token, timeout: 60)
            context.startProbe()
            // Park 64 (the old per-address connection limit), then go away all at once.
            holdSlowClients(port: context.port, connections: 64, sources: [source], prefix: { _ in request },
                            seconds: 1.5, stillOpenIsClear: true, tally: context.tally)
            // Within 5 s, one more wait (timeout 1 s) by the same user from the same address gets its answer.
            let deadline = attackClock() + 5
            var outcome = "refused or unanswered for 5 s"
            while attackClock() < deadline {
                if let client = try? LoopbackClient(port: context.port, source: source, timeoutSeconds: 4),
                   let reply = try? client.send(path: context.path("changes/wait"), headers: context.auth,
                                                body: Array(#"{"timeout":1}"#.utf8)), reply.status == 200 {
                    outcome = "200"
                    break
                }
                usleep(250_000)
            }
            context.tally.add(event: "new wait after the others left: \(outcome)", clear: outcome == "200")
        }
    }

    // MARK: Push streams

    /// `count` new devices of the attacker's account (tokens/issue), each with a registered push token; the
    /// push tokens. With `subscriptions`, that many database subscriptions of the attacker's private database
    /// too (each of the attacker's writes then raises that many notifications for every device).
    static func pushDevices(_ context: Context, count: Int, subscriptions: Int = 1) throws -> [String] {
        let client = try LoopbackClient(port: context.port, source: context.sources(1)[0], timeoutSeconds: 30)
        func call(_ token: String, _ operation: String, _ body: JSON) throws -> JSON {
            let reply = try client.send(path: context.path(operation), headers: ["Authorization": "Bearer " + token],
                                        body: body.serializedBytes())
            guard reply.status == 200 else {
                throw HarnessError("\(operation): \(reply.status) \(String(decoding: reply.body.prefix(200), as: UTF8.self))")
            }
            return try JSON.parse(reply.body)
        }
        let operations: [JSON] = (0..<subscriptions).map { index in
            .object(["operationType": .string("create"), "subscription": .object([
                "subscriptionID": .string("attack-\(index)"), "subscriptionType": .string("database")])])
        }
        _ = try call(context.token, "subscriptions/modify", .object(["operations": .array(operations)]))
        return try (0..<count).map { _ in
            guard let device = try call(context.token, "tokens/issue", .object([:]))["token"]?.stringValue,
                  let push = try call(device, "tokens/create", .object(["apnsEnvironment": .string("production")]))["apnsToken"]?
                      .stringValue else { throw HarnessError("no device or push token") }
            _ = try call(device, "tokens/register", .object(["apnsEnvironment": .string("production"), "apnsToken": .string(push)]))
            return push
        }
    }

    static func streamRequest(port: UInt16, push: String) -> [UInt8] {
        Array("GET /push/\(push) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nAccept: text/event-stream\r\n\r\n".utf8)
    }

    @Test func idlePushStreamsFromOneAccount() throws {
        try run("push streams: 40 devices of one account, 4 streams each, held from 4 addresses", subnet: 31, expectations: { tally in
            [tally.refusals > 0 ? nil : "no stream past the per-account cap was refused or replaced: \(tally.summary)"]
        }) { context in
            let devices = try Self.pushDevices(context, count: 40)
            holdSlowClients(port: context.port, connections: 160, sources: context.sources(4),
                            prefix: { Self.streamRequest(port: context.port, push: devices[$0 % devices.count]) },
                            seconds: Self.floodSeconds + 1, stillOpenIsClear: true, tally: context.tally, onReady: context.startProbe)
        }
    }

    @Test func idlePushStreamsFromOneAddress() throws {
        try run("push streams: 150 held from one address", subnet: 32, expectations: { tally in
            [tally.refusals > 0 ? nil : "no stream past the per-address limits was refused: \(tally.summary)"]
        }) { context in
            let devices = try Self.pushDevices(context, count: 30)
            holdSlowClients(port: context.port, connections: 150, sources: context.sources(1),
                            prefix: { Self.streamRequest(port: context.port, push: devices[$0 % devices.count]) },
                            seconds: Self.floodSeconds + 1, stillOpenIsClear: true, tally: context.tally, onReady: context.startProbe)
        }
    }

    /// Streams whose readers never read, while the attacker's own writes raise 150 notifications a write for
    /// each: what waits for a reader is bounded (64 KiB a stream in the server, past what the kernel's socket
    /// buffers hold; a stream past it is cut off), so the server's memory stays bounded.
    @Test func pushStreamsThatNeverRead() throws {
        try run("push streams: 8 readers that never read, 150 notifications a write for 3 s", subnet: 33, expectations: { tally in
            [tally.counts.keys.contains { $0.hasSuffix("(bounded)") } ? nil : "the server's memory grew without bound: \(tally.summary)"]
        }) { context in
            let rssBefore = context.server.residentMiB
            let devices = try Self.pushDevices(context, count: 8, subscriptions: 150)
            let source = context.sources(1)[0]
            var sockets: [Int32] = []
            for device in devices {
                let fd = try openLoopbackSocket(source: source, port: context.port, timeoutSeconds: 2, blocking: true)
                var small: Int32 = 4_096 // the smallest receive buffer: the kernel holds little for the reader
                setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
                _ = Self.streamRequest(port: context.port, push: device).withUnsafeBytes {
                    Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
                }
                sockets.append(fd)
            }
            context.startProbe()
            let path = context.path("records/modify"), auth = context.auth
            flood(port: context.port, threads: 2, sources: [source], seconds: Self.floodSeconds, maximumRequests: 300,
                  tally: context.tally) { thread, index in
                (path, auth, JSON.object([
                    "zoneID": .object(["zoneName": .string("Lists")]),
                    "operations": .array([AttackSuiteTests.create("n-\(thread)-\(index)-\(Int(attackClock() * 1000))",
                                                                  type: "Note", fields: [:])]),
                ]).serializedBytes())
            }
            if let before = rssBefore, let after = context.server.residentMiB {
                let grown = after - before
                context.tally.add(event: String(format: "server memory grew %.0f MiB", grown) + (grown < 64 ? " (bounded)" : " (unbounded)"),
                                  clear: grown < 64)
            }
            // Each reader now drains what reached it: a stream cut off ends (the connection closes).
            for fd in sockets {
                var timeout = timeval(tv_sec: 1, tv_usec: 0)
                setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
                var buffer = [UInt8](repeating: 0, count: 64 * 1024)
                var closed = false
                let deadline = attackClock() + 3
                while attackClock() < deadline {
                    let got = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                    if got == 0 || (got < 0 && errno != EINTR && errno != EAGAIN) { closed = true; break }
                    if got < 0 { break } // nothing more for 1 s: the stream is still open
                }
                context.tally.add(event: closed ? "cut off (closed by the server)" : "still open after the flood", clear: true,
                                  refusal: closed)
                Glibc.close(fd)
            }
        }
    }

    /// One device's stream opened and dropped as fast as 4 addresses can: each open is answered (its ready
    /// event, or 429), and the probe is not slowed.
    @Test func pushStreamReconnectStorm() throws {
        try run("push streams: a reconnect storm of one device from 4 addresses for 3 s", subnet: 34) { context in
            let device = try Self.pushDevices(context, count: 1)[0]
            context.startProbe()
            let group = DispatchGroup()
            let deadline = attackClock() + Self.floodSeconds
            let port = context.port, tally = context.tally
            for source in context.sources(4) {
                group.enter()
                Thread {
                    defer { group.leave() }
                    var opened = 0
                    while attackClock() < deadline && opened < 2_000 {
                        opened += 1
                        guard let client = try? LoopbackClient(port: port, source: source, timeoutSeconds: 4) else {
                            tally.add(event: "connection refused", clear: true, refusal: true)
                            continue
                        }
                        do {
                            try client.write(Self.streamRequest(port: port, push: device))
                            let response = try client.readResponse()
                            if response.status == 200 {
                                tally.add(event: "stream opened", clear: true)
                            } else {
                                tally.add(response)
                            }
                        } catch {
                            tally.add(event: "no answer: \(error)".prefix(80).description, clear: false)
                        }
                        client.close()
                    }
                }.start()
            }
            group.wait()
        }
    }

    static func heldBodyHead(port: UInt16, token: String?) -> [UInt8] {
        var head = "POST /database/1/lattice/production/private/records/modify HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(2 * 1024 * 1024)\r\n"
        if let token { head += "Authorization: Bearer \(token)\r\n" }
        return Array((head + "\r\n").utf8)
    }

    @Test func bodiesNeverSentWithoutAToken() throws {
        try run("held bodies: 200 x Content-Length 2 MiB, no token, body never sent", subnet: 13,
                expectations: { [Self.allClosed($0)] }) { context in
            let head = Self.heldBodyHead(port: context.port, token: nil)
            holdSlowClients(port: context.port, connections: 200, sources: context.sources(4), prefix: { _ in head },
                            seconds: Self.slowSeconds, tally: context.tally, onReady: context.startProbe)
        }
    }

    @Test func bodiesSentSlowlyWithAToken() throws {
        try run("held bodies: 160 x Content-Length 2 MiB with a token, body at 1 KiB/s", subnet: 14,
                expectations: { [Self.allClosed($0)] }) { context in
            let head = Self.heldBodyHead(port: context.port, token: context.token)
            let body = Array(#"{"operations":[],"zoneID":{"zoneName":"Lists"},"pad":""#.utf8) + [UInt8](repeating: 0x61, count: 2 * 1024 * 1024)
            holdSlowClients(port: context.port, connections: 160, sources: context.sources(4), prefix: { _ in head },
                            trickle: { _ in body }, bytesPerTick: 1024, tickSeconds: 1, seconds: Self.slowSeconds,
                            tally: context.tally, onReady: context.startProbe)
        }
    }

    // MARK: Assets

    /// `count` upload URLs' paths of `token`'s account (the attacker's, zone Lists, by default; an account
    /// holds at most 200 open uploads, so each row takes its own), made through `assets/upload` in batches.
    static func uploadPaths(_ context: Context, count: Int, token: String? = nil, zone: String = "Lists") throws -> [String] {
        let client = try LoopbackClient(port: context.port, source: context.sources(1)[0], timeoutSeconds: 30)
        var paths: [String] = []
        while paths.count < count {
            let batch = min(100, count - paths.count)
            let body = JSON.object(["zoneID": .object(["zoneName": .string(zone)]), "tokens": .array((0..<batch).map {
                .object(["recordType": .string("Item"), "recordName": .string("item-\(paths.count + $0)"), "fieldName": .string("photo")])
            })])
            let reply = try client.send(path: context.path("assets/upload"),
                                        headers: ["Authorization": "Bearer " + (token ?? context.token)], body: body.serializedBytes())
            guard reply.status == 200 else { throw HarnessError("assets/upload: \(reply.status) \(String(decoding: reply.body, as: UTF8.self))") }
            paths += try (JSON.parse(reply.body)["tokens"]?.arrayValue ?? []).compactMap { $0["url"]?.stringValue }.map { url in
                String(url[url.range(of: "/assets/upload/")!.lowerBound...])
            }
        }
        return paths
    }

    static func uploadHead(_ path: String, port: UInt16, length: Int) -> [UInt8] {
        Array("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Type: image/jpeg\r\nContent-Length: \(length)\r\n\r\n".utf8)
    }

    @Test func uploadsSentSlowly() throws {
        try run("slow uploads: 150 x 50 MiB declared, bytes at 1 KiB/s", subnet: 35,
                expectations: { [Self.allClosed($0)] }) { context in
            let paths = try Self.uploadPaths(context, count: 150)
            let body = [UInt8](repeating: 0x61, count: 64 * 1024)
            holdSlowClients(port: context.port, connections: paths.count, sources: context.sources(4),
                            prefix: { Self.uploadHead(paths[$0], port: context.port, length: 50 * 1024 * 1024) },
                            trickle: { _ in body }, bytesPerTick: 1024, tickSeconds: 1, seconds: Self.slowSeconds,
                            tally: context.tally, onReady: context.startProbe)
        }
    }

    @Test func manyUploadsAtOnce() throws {
        try run("parallel uploads: 16 clients sending 1 MiB assets for 3 s", subnet: 36, expectations: { tally in
            [tally.total > 0 ? nil : "no upload was answered"]
        }) { context in
            let paths = try Self.uploadPaths(context, count: 190, token: context.fixture.accompliceTokens[0], zone: "Heavy")
            let body = [UInt8](repeating: 0x62, count: 1024 * 1024)
            context.startProbe()
            flood(port: context.port, threads: 16, sources: context.sources(4), seconds: Self.floodSeconds, maximumRequests: 11,
                  requestTimeout: 10, tally: context.tally) { thread, index in
                (paths[(thread * 11 + index) % paths.count], ["Content-Type": "image/jpeg"], body)
            }
        }
    }

    @Test func uploadsDeclaringHugeLengths() throws {
        try run("huge declared uploads: 10 GB Content-Length and Upload-Length, body never sent", subnet: 37, expectations: { tally in
            [tally.refusals == tally.total && tally.total > 0 ? nil : "not every huge upload was refused: \(tally.summary)"]
        }) { context in
            let paths = try Self.uploadPaths(context, count: 100, token: context.fixture.accompliceTokens[1], zone: "Heavy")
            context.startProbe()
            flood(port: context.port, threads: 8, sources: context.sources(4), seconds: Self.floodSeconds, maximumRequests: 50,
                  tally: context.tally) { thread, index in
                let path = paths[(thread * 50 + index) % paths.count]
                return index % 2 == 0
                    ? (path, ["Content-Length": "10000000000"], [])
                    : (path, ["Upload-Length": "10000000000"], [1, 2, 3])
            }
        }
    }

    static func signUpBody(_ name: String) -> [UInt8] { JSON.object(["name": .string(name)]).serializedBytes() }

    static func someRefused(_ tally: AnswerTally) -> String? {
        tally.refusals > 0 ? nil : "no request of the flood was refused: \(tally.summary)"
    }

    @Test func signUpFloodFromOneAddress() throws {
        try run("sign-up flood: 300 POST /auth/signup from one address", subnet: 15, expectations: { [Self.someRefused($0)] }) { context in
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(1), seconds: Self.floodSeconds, maximumRequests: 150,
                  tally: context.tally) { thread, index in ("/auth/signup", [:], Self.signUpBody("flood-\(thread)-\(index)")) }
        }
    }

    @Test func signUpFloodFromSeveralAddresses() throws {
        try run("sign-up flood: 10 addresses x 30 POST /auth/signup", subnet: 16, expectations: { [Self.someRefused($0)] }) { context in
            context.startProbe()
            flood(port: context.port, threads: 10, sources: context.sources(10), seconds: Self.floodSeconds, maximumRequests: 30,
                  tally: context.tally) { thread, index in ("/auth/signup", [:], Self.signUpBody("many-\(thread)-\(index)")) }
        }
    }

    @Test func signInGuessFlood() throws {
        try run("sign-in guesses: 1,000 wrong sign-in links and device codes from one address", subnet: 19, expectations: { tally in
            [tally.counts.keys.contains { $0.hasPrefix("429") } ? nil : "sign-in guesses were never throttled (429): \(tally.summary)"]
        }) { context in
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(1), seconds: Self.floodSeconds, maximumRequests: 500,
                  tally: context.tally) { [port = context.port] thread, index in
                let hex = String(thread * 1_000_000 + index + 1, radix: 16)
                let guess = String(repeating: "0", count: 64 - hex.count) + hex
                if thread == 0 {
                    return ("/auth/link", ["Origin": "http://127.0.0.1:\(port)", "X-Lattice-CSRF": "guess"],
                            JSON.object(["secret": .string("lt_" + guess)]).serializedBytes())
                }
                return ("/auth/device/token", [:], JSON.object(["deviceCode": .string("ld_" + guess)]).serializedBytes())
            }
        }
    }

    @Test func badTokenFlood() throws {
        try run("bad-token flood: 2,000 unknown tokens from one address", subnet: 17, expectations: { tally in
            [tally.counts.keys.contains { $0.hasPrefix("429") } ? nil : "bad tokens were never throttled (429): \(tally.summary)"]
        }) { context in
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(1), seconds: Self.floodSeconds, maximumRequests: 1_000,
                  tally: context.tally) { [path = context.path("users/current")] thread, index in
                let hex = String(thread * 1_000_000 + index + 1, radix: 16)
                let token = "lt_" + String(repeating: "0", count: 64 - hex.count) + hex
                return (path, ["Authorization": "Bearer " + token], [])
            }
        }
    }

    // MARK: Passkey and recovery-code sign-in flooding (issue 30)

    /// The headers of a page of this server asking for a session (pre-session routes).
    static func pageHeaders(_ port: UInt16) -> [String: String] {
        ["Origin": "http://127.0.0.1:\(port)", "X-Lattice-CSRF": "flood"]
    }

    /// How many answers of the tally were a 2xx.
    static func served(_ tally: AnswerTally) -> Int {
        tally.counts.filter { $0.key.hasPrefix("2") }.values.reduce(0, +)
    }

    @Test func passkeyCeremonyFloodFromOneAddress() throws {
        try run("passkey challenge flood: 600 POST /auth/passkey/signin/options from one address", subnet: 30, expectations: { tally in
            [tally.counts.keys.contains { $0.hasPrefix("429") } ? nil : "challenges were never throttled (429): \(tally.summary)",
             Self.served(tally) <= 20 ? nil : "\(Self.served(tally)) challenges issued to one address (at most 20 live)"]
        }) { context in
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(1), seconds: Self.floodSeconds, maximumRequests: 300,
                  tally: context.tally) { [port = context.port] _, _ in
                ("/auth/passkey/signin/options", Self.pageHeaders(port), Array("{}".utf8))
            }
        }
    }

    @Test func passkeyCeremonyFloodFromManyAddresses() throws {
        try run("passkey challenge flood: 20 addresses x 40 POST /auth/passkey/signup/options", subnet: 31, expectations: { tally in
            [Self.served(tally) <= 20 * 20 ? nil : "\(Self.served(tally)) challenges issued to 20 addresses (at most 20 live each)"]
        }) { context in
            context.startProbe()
            flood(port: context.port, threads: 20, sources: context.sources(20), seconds: Self.floodSeconds, maximumRequests: 40,
                  tally: context.tally) { [port = context.port] thread, index in
                ("/auth/passkey/signup/options", Self.pageHeaders(port),
                 JSON.object(["name": .string("pk-\(thread)-\(index)")]).serializedBytes())
            }
        }
    }

    @Test func forgedPasskeyAndRecoveryCodeFlood() throws {
        try run("sign-in forgeries: 1,000 forged passkey assertions and recovery-code guesses from one address", subnet: 32,
                expectations: { tally in
            [tally.counts.keys.contains { $0.hasPrefix("429") } ? nil : "forgeries were never throttled (429): \(tally.summary)",
             Self.served(tally) == 0 ? nil : "\(Self.served(tally)) forgeries signed in"]
        }) { context in
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(1), seconds: Self.floodSeconds, maximumRequests: 500,
                  tally: context.tally) { [port = context.port] thread, index in
                if thread == 0 {
                    // A well-formed assertion of a challenge the server never issued, signed by nobody.
                    let client = JSON.object(["type": .string("webauthn.get"), "origin": .string("http://127.0.0.1:\(port)"),
                                              "challenge": .string(Base64URL.encode(Array(repeating: UInt8(index % 256), count: 32)))])
                    let credential = JSON.object([
                        "type": .string("public-key"), "rawId": .string(Base64URL.encode([UInt8(index % 256), 1, 2, 3])),
                        "response": .object([
                            "clientDataJSON": .string(Base64URL.encode(client.serializedBytes())),
                            "authenticatorData": .string(Base64URL.encode([UInt8](repeating: 0, count: 37))),
                            "signature": .string(Base64URL.encode([UInt8](repeating: 1, count: 70))),
                        ]),
                    ])
                    return ("/auth/passkey/signin", Self.pageHeaders(port), JSON.object(["credential": credential]).serializedBytes())
                }
                let alphabet = Array("23456789ABCDEFGHJKMNPQRSTVWXYZ")
                let code = String((0..<12).map { alphabet[(index / (1 << ($0 % 8)) + $0) % alphabet.count] })
                return ("/auth/recovery", Self.pageHeaders(port), JSON.object(["code": .string(code)]).serializedBytes())
            }
        }
    }

    @Test func openIDConnectSignInFlood() throws {
        let provider = try OIDCProviderProcess(clientIDs: ["lattice-app"])
        defer { provider.stop() }
        let tokens = try (0..<8).map { _ in try provider.mint("unknown-kid", audience: "lattice-app") }
        try run("OpenID Connect flood: 1,000 sign-in starts and forged ID tokens (unknown kids) from one address", subnet: 33,
                serverArguments: ["--oidc-issuer", provider.issuer, "--oidc-client-id", "lattice-app"], expectations: { tally in
            let counts = (try? provider.counts()) ?? [:]
            return [tally.counts.keys.contains { $0.hasPrefix("429") } ? nil : "the flood was never throttled (429): \(tally.summary)",
                    Self.served(tally) <= 10 ? nil : "\(Self.served(tally)) sign-ins started by one address (at most 10 under way)",
                    (counts["/jwks"] ?? 0) <= 2 && (counts["/.well-known/openid-configuration"] ?? 0) <= 1 ? nil
                        : "the provider was hammered: \(counts)"]
        }) { context in
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(1), seconds: Self.floodSeconds, maximumRequests: 500,
                  tally: context.tally) { [issuer = provider.issuer] thread, index in
                if thread == 0 { return ("GET /auth/oidc/start?provider=0", [:], []) }
                return ("/auth/oidc/token", [:], JSON.object(["issuer": .string(issuer),
                                                              "idToken": .string(tokens[index % tokens.count])]).serializedBytes())
            }
            print("  provider requests: \((try? provider.counts()) ?? [:])")
        }
    }

    // MARK: The costliest joins (issue 29, first hole)

    /// The attacker's zone `Contexts` with record `ctx` stored as the widest causal context the caps allow
    /// (no entries, sent on the binary path), and the body that joins the most entries the caps allow into
    /// it on the path asked for. Such a join once scanned the stored context per entry: 12-21 s of the
    /// writer per request. The joined state is over the write limit, so each request is refused after its
    /// join and the next one joins the same stored state again.
    static func costliestJoin(_ context: Context, binary: Bool) throws -> (path: String, headers: [String: String], body: [UInt8]) {
        // A connection per call: sizing the body below takes seconds in a debug build, past the server's header
        // timeout (10 s), which closes a kept-alive connection idle that long.
        func call(_ path: String, _ body: [UInt8], contentType: String = "application/json") throws -> LoopbackClient.Response {
            var headers = context.auth
            headers["Content-Type"] = contentType
            let client = try LoopbackClient(port: context.port, source: context.sources(1)[0], timeoutSeconds: 60)
            return try client.send(path: path, headers: headers, body: body)
        }
        let current = try call(context.path("users/current"), [])
        guard let owner = try JSON.parse(current.body)["userRecordName"]?.stringValue else { throw HarnessError("users/current") }
        let zoneName = binary ? "ContextsBinary" : "ContextsJSON"
        _ = try call(context.path("zones/modify"), JSON.object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string(zoneName)])])])])]).serializedBytes())
        let zoneID = try ZoneID(zoneName: zoneName, ownerRecordName: owner)
        let ms = UInt64(Date().timeIntervalSince1970 * 1000)
        let replicas = CostliestRecords.largest(upTo: 50_000, zoneID: zoneID) { CostliestRecords.wideContext("ctx", replicas: $0, ms: ms) }
        let stored = try RecordFrame(encoding: CostliestRecords.record(CostliestRecords.wideContext("ctx", replicas: replicas, ms: ms), zoneID: zoneID))
        let push = SyncMessage.Push(clientOperationID: nil, atomic: true,
                                    delta: BinaryCodec.encodeDelta(zoneID: zoneID, frames: [stored])).encoded()
        let saved = try call(context.path("deltas/push"), push, contentType: SyncMessage.contentType)
        guard saved.status == 200 else {
            throw HarnessError("storing the wide context: \(saved.status) \(String(decoding: saved.body.prefix(300), as: UTF8.self))")
        }
        let entries: Int
        let body: [UInt8]
        if binary {
            entries = CostliestRecords.largest(upTo: 50_000, zoneID: zoneID) { CostliestRecords.manyEntries("ctx", count: $0, ms: ms) }
            let incoming = try RecordFrame(encoding: CostliestRecords.record(CostliestRecords.manyEntries("ctx", count: entries, ms: ms),
                                                                             zoneID: zoneID))
            body = SyncMessage.Push(clientOperationID: nil, atomic: true,
                                    delta: BinaryCodec.encodeDelta(zoneID: zoneID, frames: [incoming])).encoded()
        } else {
            // The request body's cap (2 MiB) bounds a JSON state before the record cap does.
            entries = CostliestRecords.largest(upTo: 50_000, jsonBytes: 2 * 1024 * 1024 - 512, zoneID: zoneID) {
                CostliestRecords.manyEntries("ctx", count: $0, ms: ms)
            }
            body = JSON.object(["zoneID": .object(["zoneName": .string(zoneName)]), "operations": .array([.object([
                "operationType": .string("forceUpdate"), "record": CostliestRecords.manyEntries("ctx", count: entries, ms: ms)])])])
                .serializedBytes()
        }
        print("  costliest join (\(binary ? "binary" : "JSON")): stored context of \(replicas) replicas, \(entries) entries per request")
        // One request timed alone: the server's time for the whole join (loopback adds well under a millisecond).
        let began = attackClock()
        let one = binary ? try call(context.path("deltas/push"), body, contentType: SyncMessage.contentType)
            : try call(context.path("records/modify"), body)
        print(String(format: "  costliest join (%@): one request answered %d in %.1f ms: %@", binary ? "binary" : "JSON", one.status,
                     (attackClock() - began) * 1000, String(decoding: one.body.prefix(200), as: UTF8.self)))
        var headers = context.auth
        if binary { headers["Content-Type"] = SyncMessage.contentType }
        return (context.path(binary ? "deltas/push" : "records/modify"), headers, body)
    }

    @Test func costliestJoinOnTheBinaryPath() throws {
        try run("costliest join: widest context x most entries (deltas/push)", subnet: 20) { context in
            let request = try Self.costliestJoin(context, binary: true)
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 200,
                  tally: context.tally) { _, _ in request }
        }
    }

    @Test func costliestJoinOnTheJSONPath() throws {
        try run("costliest join: widest context x most entries (records/modify)", subnet: 21) { context in
            let request = try Self.costliestJoin(context, binary: false)
            context.startProbe()
            flood(port: context.port, threads: 2, sources: context.sources(2), seconds: Self.floodSeconds, maximumRequests: 200,
                  tally: context.tally) { _, _ in request }
        }
    }

}
