// `lattice-bench sync`: the whole service end to end. A real `lattice serve` (the `lattice` binary next to
// this one) on 127.0.0.1, N real clients pushing batches of records over HTTP, each with the app engine
// (`LatticeSync.LatticeSyncEngine`, wire `engine`) and the engine the CLI ran on before (`SyncEngine`, wires
// `binary` and `json`) measured back to back in the same run, a fresh device pulling a large account, and in the same run the storage
// ceiling: the same frames written straight into SQLite with the same durability and batch size. With
// `--database URL --nodes N`: N `lattice serve` nodes on one PostgreSQL database (a scratch database made on
// URL's server for the run), clients spread over them, and the ceiling written straight through libpq.

import Foundation
import LatticeCore
import LatticeStore
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The client a push or pull measurement runs: the app engine, or the baseline engine on one of its wires.
enum BenchWire: String, CaseIterable, Sendable {
    /// `LatticeSyncEngine` (the public API): partial states in `deltas/push`, `deltas/pull`.
    case engine
    /// `SyncEngine` on its binary path (`deltas/push` of whole frames, `deltas/pull`).
    case binary
    /// `SyncEngine` on its JSON path (`records/modify`, `changes/zone`).
    case json
}

struct SyncBenchOptions: Sendable {
    var clients = 4
    var batches = [1, 2, 50, 200, 400]
    /// Records each client pushes per batch size (rounded up to whole batches).
    var records = 4000
    var pullRecords = 100_000
    /// Rows the ceiling writes per batch size, at least (cycling through the pushed frames).
    var ceilingRows = 20_000
    var wires: [BenchWire] = [.engine, .binary]
    var modes: [PushMode] = [.rounds, .backlog]
    /// Time budget of one push measurement and of one ceiling measurement (checked between rounds).
    var seconds = 30.0
    /// The whole run is stopped (server included) after this long.
    var timeout = 1800.0
    var jsonlPath: String?
    /// A PostgreSQL server (`postgres://...`): the nodes serve a scratch database made there for the run.
    var database: String?
    /// `lattice serve` processes on the one database (PostgreSQL only above 1).
    var nodes = 1
    /// Each node's --database-pool (nil: the server's default).
    var databasePool: Int?
    var help = false

    static let maximumBatch = 400

    /// How the clients' pushes are paced.
    enum PushMode: String, CaseIterable, Sendable {
        /// Every client makes B records, then all send at once; the next round starts when the last send
        /// returned (so the server waits for the slowest client at every round).
        case rounds
        /// Every client makes all its records first, then each engine sends its whole queue in B-record
        /// requests, the clients independently of each other (a device coming back online).
        case backlog
    }

    static let usage = """
        usage: lattice-bench sync [--clients N] [--batches 1,2,50,200,400] [--records N]
                                  [--pull-records N] [--ceiling-rows N] [--wire W[,W...]|all]
                                  [--push-mode rounds|backlog|both]
                                  [--seconds S] [--timeout S] [--jsonl FILE]
                                  [--database URL [--nodes N] [--database-pool N]]

        End-to-end sync benchmark. Starts `lattice serve` (the lattice executable next to lattice-bench)
        on 127.0.0.1 with a fresh data directory (SQLite, WAL, synchronous=FULL: the server's default)
        and measures, printing JSON lines:
          push     N clients (one account each, over HTTP) push records made locally (a string, an
                   integer, a two-element string list) in requests of B records, on each wire in
                   turn: engine (the app engine, LatticeSyncEngine: LatticeRecords queued with
                   state.add, a delegate giving batches of B) and binary or json (SyncEngine, the
                   engine the CLI ran on before, batchLimit B); only the send calls are timed.
                   Two pacings:
                   rounds   each client makes B records, then all call send at once (one request
                            each), until the last returns; then the next round
                   backlog  each client makes all its records, then all call send once: each engine
                            sends its queue in B-record requests without waiting for the others
          ceiling  the frames the clients pushed, written straight into SQLite (WAL, synchronous=FULL,
                   B rows per transaction, a primary key and a second unique index), no service;
                   the frames are written again (under other keys) until --ceiling-rows rows
          pull     a fresh device (signed in with the token of an account holding --pull-records
                   records) fetches all of it, on each wire: engine (fetchChanges, records handed
                   to the app in events) or SyncEngine's sync() into its replica; records/s
        and one summary line per wire, batch size and pacing with ratio_service_to_ceiling, and with
        the engine wire beside the binary one, ratio_engine_to_binary per batch size and pacing (and
        for the pull).

        With --database URL (a PostgreSQL server; its role needs CREATEDB): a scratch database
        lattice_bench_PID is created on that server for the run and dropped at the end; N nodes
        (lattice serve --database ... --node-name nodeK, each its own port, one --public-url) serve it,
        client i talks to node i mod N, and the ceiling commits the same frames straight through libpq
        (one multi-row INSERT per B-row transaction, the database's fsync and synchronous_commit, which
        the header reports).

        options:
          --clients N        concurrent client engines, 1 to 64 (default 4)
          --batches LIST     records per send, each 1 to 400 (default 1,2,50,200,400)
          --records N        records each client pushes per batch size, rounded up to whole
                             batches, 1 to 1000000 (default 4000)
          --pull-records N   records of the account a fresh device pulls, 0 (skip) to 10000000
                             (default 100000)
          --ceiling-rows N   rows the ceiling writes per batch size, at least every pushed frame once,
                             1 to 10000000 (default 20000)
          --wire W           engine, binary, json, a comma list, or all (default engine,binary)
          --push-mode M      rounds, backlog or both (default both): how the pushes are paced
          --seconds S        time budget per push and per ceiling measurement, checked between
                             rounds (default 30)
          --timeout S        the whole run is stopped, server included, after S seconds (default 1800)
          --jsonl FILE       also write every JSON line to FILE
          --database URL     PostgreSQL instead of SQLite (postgres:// or postgresql:// URL)
          --nodes N          lattice serve processes on the database, 1 to 8 (default 1; above 1
                             needs --database)
          --database-pool N  each node's --database-pool (default: the server's)
          -h, --help         show this help and exit

        Build both executables in release first:
          swift build -c release

        exit status: 0 when every measurement is ok, 1 when one failed, 2 for a bad command line.
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> SyncBenchOptions {
        var options = SyncBenchOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            let name = scanner.name, argument = scanner.argument
            func value() throws(UsageError) -> String { try scanner.value() }
            switch name {
            case "-h", "--help":
                try scanner.flag()
                options.help = true
            case "--clients": options.clients = try integer(name, try value(), in: 1...64)
            case "--batches": options.batches = try batchList(try value())
            case "--records": options.records = try integer(name, try value(), in: 1...1_000_000)
            case "--pull-records": options.pullRecords = try integer(name, try value(), in: 0...10_000_000)
            case "--ceiling-rows": options.ceilingRows = try integer(name, try value(), in: 1...10_000_000)
            case "--wire": options.wires = try wireList(try value())
            case "--push-mode": options.modes = try oneOrBoth(name, try value())
            case "--seconds": options.seconds = try seconds(name, try value(), maximum: 3600)
            case "--timeout": options.timeout = try seconds(name, try value(), maximum: 86_400)
            case "--database":
                let url = try value()
                guard PostgresStorage.isPostgresURL(url) else {
                    throw UsageError(message: "--database expects a postgres:// or postgresql:// URL")
                }
                options.database = url
            case "--nodes": options.nodes = try integer(name, try value(), in: 1...8)
            case "--database-pool": options.databasePool = try integer(name, try value(), in: 1...256)
            case "--jsonl":
                let path = try value()
                guard !path.isEmpty else { throw UsageError(message: "--jsonl expects a file name") }
                options.jsonlPath = path
            default:
                if argument.hasPrefix("-") { throw UsageError(message: "unrecognized option \(argument)") }
                throw UsageError(message: "unexpected argument \(argument)")
            }
        }
        if options.nodes > 1 && options.database == nil {
            throw UsageError(message: "--nodes above 1 needs --database (SQLite serves one process)")
        }
        return options
    }

    private static func integer(_ name: String, _ text: String, in range: ClosedRange<Int>) throws(UsageError) -> Int {
        guard let value = Int(text.filter { $0 != "_" }) else {
            throw UsageError(message: "\(name) expects an integer, got '\(text)'")
        }
        guard range.contains(value) else {
            throw UsageError(message: "\(name) must be \(range.lowerBound) to \(range.upperBound), got \(value)")
        }
        return value
    }

    private static func seconds(_ name: String, _ text: String, maximum: Double) throws(UsageError) -> Double {
        guard let value = Double(text), value.isFinite, value > 0, value <= maximum else {
            throw UsageError(message: "\(name) must be a number of seconds above 0 and at most \(Int(maximum)), got '\(text)'")
        }
        return value
    }

    /// One of `Choice`'s raw values, or "both" for all of them (`--wire`, `--push-mode`).
    private static func oneOrBoth<Choice: RawRepresentable & CaseIterable>(_ name: String, _ text: String)
        throws(UsageError) -> [Choice] where Choice.RawValue == String {
        if text == "both" { return Array(Choice.allCases) }
        guard let choice = Choice(rawValue: text) else {
            let names = Choice.allCases.map(\.rawValue)
            throw UsageError(message: "\(name) must be \(names.joined(separator: ", ")) or both, got '\(text)'")
        }
        return [choice]
    }

    private static func wireList(_ text: String) throws(UsageError) -> [BenchWire] {
        if text == "all" { return BenchWire.allCases }
        var wires: [BenchWire] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            guard let wire = BenchWire(rawValue: part.trimmingCharacters(in: .whitespaces)) else {
                throw UsageError(message: "--wire must be engine, binary, json, a comma list of them, or all, got '\(text)'")
            }
            if !wires.contains(wire) { wires.append(wire) }
        }
        return wires
    }

    private static func batchList(_ text: String) throws(UsageError) -> [Int] {
        var batches: [Int] = []
        for part in text.split(separator: ",", omittingEmptySubsequences: false) {
            let item = part.trimmingCharacters(in: .whitespaces)
            guard let batch = Int(item) else { throw UsageError(message: "--batches expects integers like 1,2,50, got '\(item)'") }
            guard (1...maximumBatch).contains(batch) else {
                throw UsageError(message: "--batches: each batch must be 1 to \(maximumBatch) records (one request), got \(batch)")
            }
            if !batches.contains(batch) { batches.append(batch) }
        }
        if batches.isEmpty { throw UsageError(message: "--batches needs at least one batch size") }
        return batches
    }

    var parametersJSON: JSONValue {
        .object([
            "clients": .integer(clients), "batches": .array(batches.map { .integer($0) }),
            "records_per_client_per_batch": .integer(records), "pull_records": .integer(pullRecords),
            "ceiling_rows": .integer(ceilingRows),
            "wires": .array(wires.map { .string($0.rawValue) }), "push_modes": .array(modes.map { .string($0.rawValue) }),
            "seconds_per_measurement": .double(seconds),
            "timeout_s": .double(timeout),
            "database": database.map { .string(PostgresStorage.redacted($0)) } ?? .null, "nodes": .integer(nodes),
            "database_pool": databasePool.map { .integer($0) } ?? .null,
        ])
    }
}

/// One client: an engine with its own home and account, and the transport that counts its requests.
struct BenchClient: Sendable {
    let engine: SyncEngine
    let transport: CountingTransport
    let zone: LocalZone
    /// The app engine of the same account (another device of it), and its app.
    let appEngine: LatticeSyncEngine
    let app: BenchApp
}

enum SyncBench {
    static let zoneName = "Bench"
    static let pullZoneName = "Pull"

    static func run(_ options: SyncBenchOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("sync", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        let root = NSTemporaryDirectory() + "lattice-bench-sync-\(getpid())"
        var servers: [BenchServer] = []
        var scratch: BenchScratchDatabase?
        do {
            let binary = try BenchServer.binaryNextToSelf()
            try? FileManager.default.removeItem(atPath: root)
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            if let database = options.database {
                let made = try BenchScratchDatabase(url: database)
                scratch = made
                // One public URL for every node (share links are checked against it): the first node's.
                let firstPort = try freeLoopbackPort()
                for node in 0..<options.nodes {
                    var storage = ["--database", made.url, "--node-name", "node\(node)",
                                   "--public-url", "http://127.0.0.1:\(firstPort)"]
                    if node == 0 { storage += ["--port", String(firstPort)] }
                    if let pool = options.databasePool { storage += ["--database-pool", String(pool)] }
                    servers.append(try BenchServer(binary: binary, storage: storage, logPath: root + "/node\(node).log",
                                                   scratchDirectory: root))
                }
            } else {
                servers.append(try BenchServer(binary: binary, data: root + "/server", logPath: root + "/server.log",
                                               scratchDirectory: root))
            }
        } catch {
            writeText(2, "lattice-bench sync: error: \(error)\n")
            for server in servers { server.stop() }
            scratch?.drop()
            try? FileManager.default.removeItem(atPath: root)
            return 1
        }
        let server = servers[0]
        let nodes = servers, scratchDatabase = scratch
        defer {
            for server in nodes { server.stop() }
            scratchDatabase?.drop()
            try? FileManager.default.removeItem(atPath: root)
        }
        // The watchdog: nothing runs longer than --timeout, and the servers go with it.
        DispatchQueue.global().asyncAfter(deadline: .now() + options.timeout) {
            writeText(2, "lattice-bench sync: error: the run exceeded --timeout \(options.timeout) s; stopping the server\n")
            for server in nodes { server.stop(graceSeconds: 2) }
            scratchDatabase?.drop()
            try? FileManager.default.removeItem(atPath: root)
            exit(1)
        }

        output.emit([
            "kind": .string("header"), "bench": .string("sync"), "started": .string(utcTimestamp()),
            "argv": .array(argv.map { .string($0) }), "machine": .object(MachineInfo.collect()),
            "build": .string(MachineInfo.buildConfiguration), "parameters": options.parametersJSON,
            "server": .object(["binary": .string(server.binary), "url": .string(server.url), "pid": .integer(server.pid),
                               "storage": .string(scratch.map {
                                   "PostgreSQL \($0.redactedURL), fsync=\($0.fsync), synchronous_commit=\($0.synchronousCommit)"
                               } ?? "SQLite, WAL, synchronous=FULL (lattice serve's default)"),
                               "nodes": .array(servers.map { .object(["url": .string($0.url), "pid": .integer($0.pid)]) })]),
            "record_shape": .string("Item: name STRING, n INT64, tags STRING_LIST of 2 (add-wins set)"),
        ])

        var lines: [[String: JSONValue]] = []
        func emit(_ line: [String: JSONValue]) {
            lines.append(line)
            output.emit(line)
        }
        var crew: Crew?
        do {
            let clients = try makeClients(options.clients, servers: servers, root: root)
            crew = Crew(count: clients.count)
            for batch in options.batches {
                var frames: [CeilingRow]?
                for mode in options.modes {
                    for wire in options.wires {
                        let (line, pushed) = try push(clients: clients, crew: crew!, batch: batch, wire: wire, mode: mode,
                                                      options: options, servers: servers, collectFrames: frames == nil)
                        emit(line)
                        if line["status"]?.stringValue != "ok" {
                            throw SystemError.message("the push measurement (wire \(wire.rawValue), batch \(batch), "
                                                      + "\(mode.rawValue)) failed: "
                                                      + (line["error"]?.stringValue ?? "unknown error"))
                        }
                        if frames == nil { frames = pushed }
                    }
                }
                emit(try ceiling(rows: frames ?? [], batch: batch, options: options, root: root, scratch: scratch))
            }
            if options.pullRecords > 0 {
                let (token, populateLine) = try populatePullAccount(options.pullRecords, server: server, root: root,
                                                                    budgetSeconds: options.timeout)
                emit(populateLine)
                for wire in options.wires {
                    emit(try pull(token: token, wire: wire, expected: options.pullRecords, server: server, root: root))
                }
            }
        } catch {
            crew?.stop()
            let message = "\(error)" + BenchServer.logTail(server.logPath)
            emit(["kind": .string("error"), "status": .string("error"), "error": .string(message)])
            writeText(2, "lattice-bench sync: error: \(message)\n")
            for summary in summaries(lines) { output.emit(summary) }
            return 1
        }
        crew?.stop()
        for summary in summaries(lines) { output.emit(summary) }
        return lines.allSatisfy { $0["status"]?.stringValue == "ok" } ? 0 : 1
    }

    // MARK: Clients

    /// One account and one home per client, each with its zone created on the server by a first (untimed)
    /// send of one record; client i talks to node i mod N.
    private static func makeClients(_ count: Int, servers: [BenchServer], root: String) throws -> [BenchClient] {
        try (0..<count).map { index in
            let server = servers[index % servers.count]
            let transport = try CountingTransport(serverURL: server.url)
            let engine = try SyncEngine(home: root + "/client-\(index)", transport: transport)
            let accounts = try AccountClient(serverURL: server.url, transport: transport)
            try engine.signIn(accounts.signUpWaiting(name: "bench-client-\(index)"))
            let zone = try engine.privateZone(zoneName)
            try makeItem(engine, "warm-up", in: zone, number: 0, tag: 0)
            let report = try engine.sync()
            guard report.online, report.sent == 1, report.queued == 0 else {
                throw SystemError.message("client \(index): the warm-up sync was not acknowledged (\(report))")
            }
            let app = BenchApp(batch: SyncBenchOptions.maximumBatch)
            let appEngine = app.makeEngine(account: engine.account, transport: transport)
            _ = transport.take()
            return BenchClient(engine: engine, transport: transport, zone: try engine.privateZone(zoneName),
                               appEngine: appEngine, app: app)
        }
    }

    /// A local edit through the engine: one `Item` with the benchmark's three fields.
    private static func makeItem(_ engine: SyncEngine, _ name: String, in zone: LocalZone, number: Int, tag: Int) throws {
        try engine.edit(name, in: zone, creating: "Item") { record, stamp in
            try record.set("name", to: .string("item \(name)"), at: stamp())
            try record.set("n", to: .int64(Int64(number)), at: stamp())
            try record.add([.string("alpha"), .string("tag\(tag)")], to: "tags", at: stamp())
        }
    }

    /// The same records through the app engine: `LatticeRecord`s the app keeps, queued once per call.
    private static func makeItems(_ client: BenchClient, prefix: String, rounds: Range<Int>, batch: Int) {
        let zone = LatticeRecordZone.ID(zoneName: zoneName)
        var ids: [LatticeRecord.ID] = []
        client.app.records.withLock { records in
            for round in rounds {
                for item in 0..<batch {
                    let name = "\(prefix)-r\(round)-\(item)"
                    let id = LatticeRecord.ID(recordName: name, zoneID: zone)
                    var record = LatticeRecord(recordType: "Item", recordID: id)
                    record["name"] = "item \(name)"
                    record["n"] = Int64(round * 1000 + item)
                    record.append(contentsOf: ["alpha", "tag\(item)"], toListForKey: "tags")
                    records[id] = record
                    ids.append(id)
                }
            }
        }
        client.appEngine.state.add(pendingRecordZoneChanges: ids.map { .saveRecord($0) })
    }

    // MARK: Push

    private struct ClientPush {
        var edited = 0
        var sent = 0
        var rejected = 0
        var sendLatencies: [Double] = []
    }

    /// `.rounds`: rounds of: every client makes `batch` records locally (untimed), then every client calls
    /// `send` at once (timed, until the last send returns); stops after `records` per client or the time
    /// budget. `.backlog`: every client makes all `records` (untimed, in the same names as the rounds would),
    /// then every client calls `send` once (timed); each engine sends its queue in `batch`-record requests.
    private static func push(clients: [BenchClient], crew: Crew, batch: Int, wire: BenchWire, mode: SyncBenchOptions.PushMode,
                             options: SyncBenchOptions, servers: [BenchServer],
                             collectFrames: Bool) throws -> ([String: JSONValue], [CeilingRow]) {
        let server = servers[0]
        let rounds = (options.records + batch - 1) / batch
        let prefix = "\(wire.rawValue)-b\(batch)" + (mode == .backlog ? "-backlog" : "")
        for client in clients {
            if wire != .engine { client.engine.wire = wire == .json ? .json : .binary }
            client.engine.batchLimit = batch
            client.app.batch.store(batch, ordering: .relaxed)
            _ = client.transport.take()
        }
        let peakScope = server.resetPeakRSS() ? "measurement" : "process"
        let results = Mutex([ClientPush](repeating: ClientPush(), count: clients.count))
        let failure = FirstError()
        var sendSeconds = 0.0, editSeconds = 0.0
        var roundsDone = 0
        let began = monotonicNanoseconds()
        let deadline = began &+ UInt64(options.seconds * 1e9)
        // CPU ticks used during the timed sends; nil once a reading failed.
        var serverCPU: Int? = 0, benchCPU: Int? = 0
        let serverPIDs = servers.map(\.pid)
        while roundsDone < rounds && monotonicNanoseconds() < deadline {
            let first = roundsDone, last = mode == .backlog ? rounds : roundsDone + 1
            editSeconds += crew.run { index in
                let client = clients[index]
                do {
                    if wire == .engine {
                        makeItems(client, prefix: prefix, rounds: first..<last, batch: batch)
                    } else {
                        for round in first..<last {
                            for item in 0..<batch {
                                try makeItem(client.engine, "\(prefix)-r\(round)-\(item)", in: client.zone,
                                             number: round * 1000 + item, tag: item)
                            }
                        }
                    }
                    results.withLock { $0[index].edited += batch * (last - first) }
                } catch {
                    failure.record(error, "client \(index) local edit")
                }
            }
            if failure.message != nil { break }
            let cpuBefore = (cpuTicks(serverPIDs), cpuTicks([getpid()]))
            sendSeconds += crew.run { index in
                var sent = 0, rejected = 0
                let sendBegan = monotonicNanoseconds()
                do {
                    if wire == .engine {
                        let app = clients[index].app, engine = clients[index].appEngine
                        let saved = app.saved.load(ordering: .relaxed), failed = app.failures.withLock { $0.count }
                        defer {
                            sent = app.saved.load(ordering: .relaxed) - saved
                            rejected = app.failures.withLock { $0.count } - failed
                        }
                        try waitForAsyncWork { try await engine.sendChanges() }
                    } else {
                        var report = SyncReport()
                        defer { (sent, rejected) = (report.sent, report.rejected.count) }
                        try clients[index].engine.send(&report)
                    }
                } catch {
                    failure.record(error, "client \(index) send")
                }
                let latency = Double(monotonicNanoseconds() - sendBegan) / 1e9
                results.withLock {
                    $0[index].sent += sent
                    $0[index].rejected += rejected
                    $0[index].sendLatencies.append(latency)
                }
            }
            let cpuAfter = (cpuTicks(serverPIDs), cpuTicks([getpid()]))
            if let total = serverCPU, let before = cpuBefore.0, let after = cpuAfter.0 { serverCPU = total + after - before }
            else { serverCPU = nil }
            if let total = benchCPU, let before = cpuBefore.1, let after = cpuAfter.1 { benchCPU = total + after - before }
            else { benchCPU = nil }
            roundsDone = last
            if failure.message != nil { break }
        }
        let wallSeconds = Double(monotonicNanoseconds() - began) / 1e9
        let serverPeak = server.statusKiB("VmHWM"), serverRSS = server.statusKiB("VmRSS")
        var tally = RequestTally()
        for client in clients { tally.add(client.transport.take()) }
        let perClient = results.withLock { $0 }
        var unacknowledged = 0
        for client in clients {
            unacknowledged += wire == .engine ? client.appEngine.state.pendingRecordZoneChanges.count
                : (try? client.engine.pendingCount()) ?? 0
        }

        let sent = perClient.reduce(0) { $0 + $1.sent }
        let edited = perClient.reduce(0) { $0 + $1.edited }
        let rejected = perClient.reduce(0) { $0 + $1.rejected }
        let sendLatencies = perClient.flatMap(\.sendLatencies)
        // A backlog's send call is the whole queue: its requests are the latencies worth a percentile.
        let latencies = mode == .backlog ? tally.latencies : sendLatencies
        var line = measurementLine(scenario: "push", wire: wire, batch: batch, clients: clients.count, records: sent,
                                   seconds: sendSeconds, requests: tally.requests, latencies: latencies)
        line["mode"] = .string(mode.rawValue)
        line["latency_of"] = .string(mode == .backlog ? "request" : "send call")
        // CPU during the timed sends (clock ticks from /proc): the server processes, and this process (the
        // client engines; its other threads are idle then).
        let tick = Double(sysconf(Int32(_SC_CLK_TCK)))
        line["server_cpu_s"] = serverCPU.map { rounded(Double($0) / tick, 3) } ?? .null
        line["clients_cpu_s"] = benchCPU.map { rounded(Double($0) / tick, 3) } ?? .null
        line["storage"] = .string(options.database == nil ? "sqlite" : "postgresql")
        line["nodes"] = .integer(options.nodes)
        line["rounds"] = .integer(roundsDone)
        line["records_edited"] = .integer(edited)
        line["records_rejected"] = .integer(rejected)
        line["records_unacknowledged"] = .integer(unacknowledged)
        line["send_calls"] = .integer(sendLatencies.count)
        line["stopped_by"] = .string(roundsDone == rounds ? "records" : (failure.message == nil ? "time" : "error"))
        line["wall_s"] = rounded(wallSeconds, 4)
        line["local_edit_s"] = rounded(editSeconds, 4)
        line["local_edit_records_per_s"] = rate(edited, editSeconds)
        line.merge(tallyFields(tally)) { _, new in new }
        line["server_peak_rss_mib"] = mib(serverPeak)
        line["server_rss_mib"] = mib(serverRSS)
        line["server_peak_rss_scope"] = .string(peakScope)
        if let message = failure.message {
            line["status"] = .string("error")
            line["error"] = .string(message)
        } else if rejected > 0 || unacknowledged > 0 || sent != edited {
            line["status"] = .string("error")
            line["error"] = .string("\(edited) records made, \(sent) acknowledged, \(rejected) rejected, "
                                    + "\(unacknowledged) still pending")
        }

        var frames: [CeilingRow] = []
        if collectFrames {
            // The frames the engines hold for the records they just pushed, in the order the server got them.
            var byClient: [[String: [UInt8]]] = []
            for client in clients {
                var frames: [String: [UInt8]] = [:]
                if wire == .engine {
                    // The saved records' states (the archive's frame: what the engine holds after the send).
                    for (id, record) in client.app.records.withLock({ $0 }) where id.recordName.hasPrefix(prefix + "-") {
                        let archive = try JSON.parse([UInt8](try record.encodeSystemFields()))
                        if let frame = archive["frame"]?.stringValue.flatMap({ Data(base64Encoded: $0) }) {
                            frames[id.recordName] = [UInt8](frame)
                        }
                    }
                } else {
                    for record in try client.engine.records(in: client.zone)
                        where record.id.recordName.hasPrefix(prefix + "-") {
                        frames[record.id.recordName] = try BinaryCodec.encode(record)
                    }
                }
                byClient.append(frames)
            }
            for round in 0..<roundsDone {
                for (index, clientFrames) in byClient.enumerated() {
                    for item in 0..<batch {
                        let name = "\(prefix)-r\(round)-\(item)"
                        if let frame = clientFrames[name] { frames.append(CeilingRow(zone: Int64(index + 1), name: name, frame: frame)) }
                    }
                }
            }
        }
        return (line, frames)
    }

    // MARK: Ceiling

    private static func ceiling(rows: [CeilingRow], batch: Int, options: SyncBenchOptions, root: String,
                                scratch: BenchScratchDatabase?) throws -> [String: JSONValue] {
        let target = max(options.ceilingRows, rows.count)
        let result = try scratch.map { scratch in
            try PostgresCeiling.measure(rows: rows, target: target, batch: batch, url: scratch.url,
                                        redacted: scratch.redactedURL, budgetSeconds: options.seconds)
        } ?? StorageCeiling.measure(rows: rows, target: target, batch: batch, path: root + "/ceiling.sqlite",
                                    budgetSeconds: options.seconds)
        var line = measurementLine(scenario: "ceiling", wire: nil, batch: batch, clients: 1, records: result.rows,
                                   seconds: result.seconds, requests: result.transactions, latencies: result.latencies)
        line["transactions"] = .integer(result.transactions)
        line["frames_available"] = .integer(rows.count)
        line["frame_bytes_mean"] = rows.isEmpty ? .null
            : rounded(Double(rows.reduce(0) { $0 + $1.frame.count }) / Double(rows.count), 1)
        line["rows_target"] = .integer(target)
        line["stopped_by"] = .string(result.rows == target ? "records" : "time")
        line["what"] = .string(scratch.map {
            "frames committed straight through libpq into PostgreSQL (fsync=\($0.fsync), synchronous_commit="
                + "\($0.synchronousCommit)), one writer, one multi-row INSERT of batch rows per transaction; "
                + "requests = transactions, latency = one transaction"
        } ?? "frames written straight into SQLite (WAL, synchronous=FULL), one writer, "
                               + "batch rows per transaction; requests = transactions, latency = one transaction")
        line["storage"] = .string(scratch == nil ? "sqlite" : "postgresql")
        if rows.isEmpty {
            line["status"] = .string("error")
            line["error"] = .string("no frames to write: the push measurement acknowledged nothing")
        }
        return line
    }

    // MARK: Pull

    /// Signs up the pull account and fills it with `count` records through plain `records/modify` requests of
    /// 400 creates each (setup, not the engine's path: the pull is what is measured). Returns the token and
    /// a `populate` line.
    static func populatePullAccount(_ count: Int, server: BenchServer, root: String, budgetSeconds: Double) throws
        -> (String, [String: JSONValue]) {
        let transport = try CountingTransport(serverURL: server.url)
        let owner = try SyncEngine(home: root + "/pull-owner", transport: transport)
        let accounts = try AccountClient(serverURL: server.url, transport: transport)
        let account = try accounts.signUpWaiting(name: "bench-pull")
        try owner.signIn(account)
        let zone: JSON = .object(["zoneName": .string(pullZoneName)])
        let created = try accounts.callWaiting("private", "zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": zone])]),
        ])]), as: account)
        if let code = created["zones"]?.arrayValue?.first?["serverErrorCode"]?.stringValue {
            throw SystemError.message("pull setup: zones/modify answered \(code)")
        }
        _ = transport.take()
        _ = server.resetPeakRSS()
        let began = monotonicNanoseconds()
        let deadline = began &+ UInt64(budgetSeconds * 1e9)
        var written = 0
        while written < count {
            guard monotonicNanoseconds() < deadline else {
                throw SystemError.message("pull setup: only \(written) of \(count) records written in \(Int(budgetSeconds)) s")
            }
            let end = min(written + SyncBenchOptions.maximumBatch, count)
            let operations: [JSON] = (written..<end).map { index in
                .object(["operationType": .string("create"), "record": .object([
                    "recordName": .string(String(format: "p%07d", index)), "recordType": .string("Item"),
                    "fields": .object([
                        "name": .object(["value": .string("item p\(index)")]),
                        "n": .object(["value": .int(Int64(index))]),
                        "tags": .object(["value": .array([.string("alpha"), .string("tag\(index % 400)")]),
                                         "type": .string("STRING_LIST")]),
                    ]),
                ])])
            }
            let reply = try accounts.callWaiting("private", "records/modify",
                                          .object(["zoneID": zone, "operations": .array(operations)]), as: account)
            let items = reply["records"]?.arrayValue ?? []
            guard items.count == operations.count, items.allSatisfy({ $0["serverErrorCode"] == nil }) else {
                let first = items.first { $0["serverErrorCode"] != nil }?.serialized() ?? "\(items.count) items"
                throw SystemError.message("pull setup: records/modify did not accept every record: \(first)")
            }
            written = end
        }
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        let tally = transport.take()
        var line = measurementLine(scenario: "populate", wire: nil, batch: SyncBenchOptions.maximumBatch, clients: 1,
                                   records: written, seconds: seconds, requests: tally.requests, latencies: tally.latencies)
        line["what"] = .string("setup of the pull account: plain-valued records/modify requests of 400 creates from one "
                               + "client (not the engine's send path; the server stamps the values)")
        line.merge(tallyFields(tally)) { _, new in new }
        line["server_peak_rss_mib"] = mib(server.statusKiB("VmHWM"))
        return (account.token, line)
    }

    /// A fresh device (new home) logs in with the pull account's token and runs one `sync()`, timed.
    private static func pull(token: String, wire: BenchWire, expected: Int, server: BenchServer, root: String) throws
        -> [String: JSONValue] {
        let transport = try CountingTransport(serverURL: server.url)
        let account = try AccountClient(serverURL: server.url, transport: transport).signInWaiting(token: token)
        var report = SyncReport()
        let peakScope: String
        let began: UInt64
        if wire == .engine {
            let app = BenchApp(batch: SyncBenchOptions.maximumBatch)
            let engine = app.makeEngine(account: account, transport: transport)
            _ = transport.take()
            peakScope = server.resetPeakRSS() ? "measurement" : "process"
            began = monotonicNanoseconds()
            do { try waitForAsyncWork { try await engine.fetchChanges() } } catch let error as LatticeSyncError
                where error.code == .networkUnavailable { report.online = false }
            report.fetched = app.fetched.load(ordering: .relaxed)
        } else {
            let device = try SyncEngine(home: root + "/pull-device-\(wire.rawValue)", transport: transport)
            device.wire = wire == .json ? .json : .binary
            try device.signIn(account)
            _ = transport.take()
            peakScope = server.resetPeakRSS() ? "measurement" : "process"
            began = monotonicNanoseconds()
            report = try device.sync()
        }
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        let tally = transport.take()
        var line = measurementLine(scenario: "pull", wire: wire, batch: nil, clients: 1, records: report.fetched,
                                   seconds: seconds, requests: tally.requests, latencies: tally.latencies)
        line["latency_of"] = .string("one HTTP request")
        line.merge(tallyFields(tally)) { _, new in new }
        line["server_peak_rss_mib"] = mib(server.statusKiB("VmHWM"))
        line["server_rss_mib"] = mib(server.statusKiB("VmRSS"))
        line["server_peak_rss_scope"] = .string(peakScope)
        line["records_expected"] = .integer(expected)
        line["client_peak_rss_mib"] = mib(ProcStatus.peakRSSKiB)
        if !report.online || report.fetched != expected {
            line["status"] = .string("error")
            line["error"] = .string(report.online ? "fetched \(report.fetched) of \(expected) records"
                                                  : "the server could not be reached during the sync")
        }
        return line
    }

    // MARK: Lines

    static func measurementLine(scenario: String, wire: BenchWire?, batch: Int?, clients: Int, records: Int,
                                        seconds: Double, requests: Int, latencies: [Double]) -> [String: JSONValue] {
        [
            "kind": .string("measurement"), "status": .string("ok"), "scenario": .string(scenario),
            "wire": wire.map { .string($0.rawValue) } ?? .null, "batch": batch.map { .integer($0) } ?? .null,
            "clients": .integer(clients), "records": .integer(records), "seconds": rounded(seconds, 4),
            "records_per_s": rate(records, seconds), "requests": .integer(requests),
            "requests_per_s": rate(requests, seconds),
            "p50_ms": percentile(latencies, 0.50).map { rounded($0 * 1000, 3) } ?? .null,
            "p99_ms": percentile(latencies, 0.99).map { rounded($0 * 1000, 3) } ?? .null,
        ]
    }

    static func tallyFields(_ tally: RequestTally) -> [String: JSONValue] {
        [
            "endpoints": .object(tally.endpoints.mapValues { .integer($0) }),
            "content_types": .object(tally.contentTypes.mapValues { .integer($0) }),
            "request_p50_ms": percentile(tally.latencies, 0.50).map { rounded($0 * 1000, 3) } ?? .null,
            "request_p99_ms": percentile(tally.latencies, 0.99).map { rounded($0 * 1000, 3) } ?? .null,
            "in_request_s": rounded(tally.latencies.reduce(0, +), 4),
            "throttled": .integer(tally.throttled), "http_errors": .integer(tally.otherErrors),
            "request_bytes": .integer(tally.requestBytes), "response_bytes": .integer(tally.responseBytes),
        ]
    }

    /// One summary per push line (wire, batch size, pacing) that has a ceiling line of its batch size.
    static func summaries(_ lines: [[String: JSONValue]]) -> [[String: JSONValue]] {
        let ceilings = lines.filter { $0["scenario"]?.stringValue == "ceiling" }
        var out: [[String: JSONValue]] = []
        for push in lines where push["scenario"]?.stringValue == "push" {
            guard let ceiling = ceilings.first(where: { $0["batch"] == push["batch"] }),
                  let service = push["records_per_s"]?.doubleValue,
                  let storage = ceiling["records_per_s"]?.doubleValue, storage > 0 else { continue }
            let ok = push["status"]?.stringValue == "ok" && ceiling["status"]?.stringValue == "ok"
            out.append([
                "kind": .string("summary"), "status": .string(ok ? "ok" : "error"), "wire": push["wire"] ?? .null,
                "mode": push["mode"] ?? .null,
                "storage": push["storage"] ?? .null, "nodes": push["nodes"] ?? .null,
                "batch": push["batch"] ?? .null, "clients": push["clients"] ?? .null,
                "push_records_per_s": push["records_per_s"] ?? .null, "ceiling_records_per_s": ceiling["records_per_s"] ?? .null,
                "ratio_service_to_ceiling": rounded(service / storage, 4),
                "push_p50_ms": push["p50_ms"] ?? .null, "push_p99_ms": push["p99_ms"] ?? .null,
            ])
        }
        // The app engine beside the baseline on its binary path, measured in the same run.
        for line in lines where line["wire"]?.stringValue == BenchWire.engine.rawValue {
            guard let scenario = line["scenario"]?.stringValue, scenario == "push" || scenario == "pull",
                  let baseline = lines.first(where: {
                      $0["scenario"] == line["scenario"] && $0["wire"]?.stringValue == BenchWire.binary.rawValue
                          && $0["batch"] == line["batch"] && $0["mode"] == line["mode"]
                  }),
                  let new = line["records_per_s"]?.doubleValue, let old = baseline["records_per_s"]?.doubleValue, old > 0
            else { continue }
            let ok = line["status"]?.stringValue == "ok" && baseline["status"]?.stringValue == "ok"
            out.append([
                "kind": .string("summary"), "status": .string(ok ? "ok" : "error"), "scenario": .string(scenario),
                "mode": line["mode"] ?? .null, "batch": line["batch"] ?? .null, "clients": line["clients"] ?? .null,
                "engine_records_per_s": line["records_per_s"] ?? .null, "binary_records_per_s": baseline["records_per_s"] ?? .null,
                "ratio_engine_to_binary": rounded(new / old, 4),
            ])
        }
        return out
    }

    static func rate(_ amount: Int, _ seconds: Double) -> JSONValue {
        seconds > 0 ? rounded(Double(amount) / seconds, 1) : .null
    }

    static func rounded(_ value: Double, _ digits: Int) -> JSONValue {
        let scale = pow(10, Double(digits))
        return .double((value * scale).rounded() / scale)
    }

    static func mib(_ kib: Int) -> JSONValue { kib < 0 ? .null : rounded(Double(kib) / 1024, 1) }
}

/// User plus system CPU of processes in clock ticks (/proc/PID/stat fields 14 and 15), nil if one is unreadable.
func cpuTicks(_ pids: [pid_t]) -> Int? {
    var total = 0
    for pid in pids {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
              let close = text.lastIndex(of: ")") else { return nil }
        // After the ")" closing the command name, field 3 (the state) is the first.
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let user = Int(fields[11]), let system = Int(fields[12]) else { return nil }
        total += user + system
    }
    return total
}
