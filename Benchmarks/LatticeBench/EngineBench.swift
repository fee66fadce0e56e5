// `lattice-bench engine`: the app engine (`LatticeSyncEngine`, CKSyncEngine's shape) against the engine the
// CLI ran on before (`SyncEngine`), in pairs on one `lattice serve`: a push of records at one batch size, and a pull
// of a whole account by a fresh device. Each pair runs both engines back to back (the order alternating), so
// the ratio new ÷ old is taken from measurements seconds apart on this noisy machine.

import Foundation
import LatticeCore
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

struct EngineBenchOptions: Sendable {
    var pairs = 3
    var records = 2_000
    var batch = 200
    var pullRecords = 100_000
    var timeout = 1_800.0
    var jsonlPath: String?
    var help = false

    static let usage = """
        usage: lattice-bench engine [--pairs N] [--records N] [--batch B] [--pull-records N] [--timeout S] [--jsonl FILE]

        The app engine (LatticeSyncEngine) beside the engine the CLI ran on before (SyncEngine), in pairs against one
        lattice serve on SQLite, both over HTTP on 127.0.0.1, the order alternating pair by pair:
          push   one client makes --records records locally (untimed: a string, an integer and a list of
                 two), then sends them in requests of --batch records (timed, until acknowledged)
          pull   a fresh device of an account of --pull-records records fetches all of it (timed)
        Prints one JSON line per measurement, then one summary per scenario with each engine's median
        records/s and the ratio new / old of the medians.

          --pairs N          pairs per scenario, 1 to 20 (default 3)
          --records N        records per push, 1 to 1000000 (default 2000)
          --batch B          records per push request, 1 to 400 (default 200)
          --pull-records N   records of the pull account, 0 (skip) to 10000000 (default 100000)
          --timeout S        the whole run is stopped after S seconds (default 1800)
          --jsonl FILE       also write every JSON line to FILE
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> EngineBenchOptions {
        var options = EngineBenchOptions()
        var scanner = OptionScanner(arguments)
        func integer(_ text: String, in range: ClosedRange<Int>) throws(UsageError) -> Int {
            guard let value = Int(text), range.contains(value) else {
                throw UsageError(message: "\(scanner.name) expects an integer in \(range.lowerBound)...\(range.upperBound)")
            }
            return value
        }
        while scanner.next() {
            switch scanner.name {
            case "-h", "--help": options.help = true
            case "--pairs": options.pairs = try integer(try scanner.value(), in: 1...20)
            case "--records": options.records = try integer(try scanner.value(), in: 1...1_000_000)
            case "--batch": options.batch = try integer(try scanner.value(), in: 1...400)
            case "--pull-records": options.pullRecords = try integer(try scanner.value(), in: 0...10_000_000)
            case "--timeout":
                guard let seconds = Double(try scanner.value()), seconds > 0, seconds <= 86_400 else {
                    throw UsageError(message: "--timeout expects seconds in 0...86400")
                }
                options.timeout = seconds
            case "--jsonl":
                let path = try scanner.value()
                guard !path.isEmpty else { throw UsageError(message: "--jsonl expects a file name") }
                options.jsonlPath = path
            default: throw UsageError(message: "unknown option \(scanner.argument)")
            }
        }
        return options
    }
}

/// The app side of the new engine for the benchmark: records to send, and a count of what a fetch brings.
final class BenchApp: LatticeSyncEngineDelegate {
    let records = Mutex<[LatticeRecord.ID: LatticeRecord]>([:])
    let fetched = Atomic<Int>(0)
    let saved = Atomic<Int>(0)
    let failures = Mutex<[String]>([])
    /// Records per batch the app gives.
    let batch: Atomic<Int>

    init(batch: Int) { self.batch = Atomic(batch) }

    /// An engine of the private database for this app, syncing by hand, over `transport`.
    func makeEngine(account: Account?, transport: any SyncTransport) -> LatticeSyncEngine {
        var configuration = LatticeSyncEngine.Configuration(database: .private, account: account, stateSerialization: nil,
                                                            delegate: self)
        configuration.automaticallySync = false
        configuration.transport = transport
        configuration.requestTimeout = 60
        return LatticeSyncEngine(configuration)
    }

    func handleEvent(_ event: LatticeSyncEngine.Event, syncEngine: LatticeSyncEngine) async {
        switch event {
        case .fetchedRecordZoneChanges(let changes):
            fetched.add(changes.modifications.count, ordering: .relaxed)
        case .sentRecordZoneChanges(let sent):
            saved.add(sent.savedRecords.count, ordering: .relaxed)
            if !sent.savedRecords.isEmpty {
                records.withLock { records in for record in sent.savedRecords { records[record.recordID] = record } }
            }
            if !sent.failedRecordSaves.isEmpty {
                failures.withLock { $0 += sent.failedRecordSaves.map { "\($0.record.recordID.recordName): \($0.error)" } }
            }
        default: break
        }
    }

    func nextRecordZoneChangeBatch(_ context: LatticeSyncEngine.SendChangesContext,
                                   syncEngine: LatticeSyncEngine) async -> LatticeSyncEngine.RecordZoneChangeBatch? {
        let pending = syncEngine.state.pendingRecordZoneChanges(first: batch.load(ordering: .relaxed))
        return await LatticeSyncEngine.RecordZoneChangeBatch(pendingChanges: pending) { id in self.records.withLock { $0[id] } }
    }
}

enum EngineBench {
    static func run(_ options: EngineBenchOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("engine", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        let root = NSTemporaryDirectory() + "lattice-bench-engine-\(getpid())"
        let server: BenchServer
        do {
            try? FileManager.default.removeItem(atPath: root)
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            server = try BenchServer(binary: try BenchServer.binaryNextToSelf(), data: root + "/server",
                                     logPath: root + "/server.log", scratchDirectory: root)
        } catch {
            writeText(2, "lattice-bench engine: error: \(error)\n")
            try? FileManager.default.removeItem(atPath: root)
            return 1
        }
        defer {
            server.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + options.timeout) {
            writeText(2, "lattice-bench engine: error: the run exceeded --timeout \(options.timeout) s; stopping the server\n")
            server.stop(graceSeconds: 2)
            exit(1)
        }
        output.emit([
            "kind": .string("header"), "bench": .string("engine"), "started": .string(utcTimestamp()),
            "argv": .array(argv.map { .string($0) }), "machine": .object(MachineInfo.collect()),
            "build": .string(MachineInfo.buildConfiguration),
            "parameters": .object(["pairs": .integer(options.pairs), "records": .integer(options.records),
                                   "batch": .integer(options.batch), "pull_records": .integer(options.pullRecords)]),
            "server": .object(["binary": .string(server.binary), "url": .string(server.url),
                               "storage": .string("SQLite, WAL, synchronous=FULL (lattice serve's default)")]),
            "record_shape": .string("Item: name STRING, n INT64, tags STRING_LIST of 2 (add-wins set)"),
        ])
        var lines: [[String: JSONValue]] = []
        do {
            for pair in 0..<options.pairs {
                for engine in pair % 2 == 0 ? ["old", "new"] : ["new", "old"] {
                    let line = engine == "old" ? try pushOld(pair: pair, options, server: server, root: root)
                        : try pushNew(pair: pair, options, server: server, root: root)
                    lines.append(line)
                    output.emit(line)
                }
            }
            if options.pullRecords > 0 {
                let (token, populate) = try SyncBench.populatePullAccount(options.pullRecords, server: server, root: root,
                                                                          budgetSeconds: options.timeout)
                output.emit(populate)
                for pair in 0..<options.pairs {
                    for engine in pair % 2 == 0 ? ["old", "new"] : ["new", "old"] {
                        let line = engine == "old" ? try pullOld(pair: pair, token: token, options, server: server, root: root)
                            : try pullNew(pair: pair, token: token, options, server: server, root: root)
                        lines.append(line)
                        output.emit(line)
                    }
                }
            }
        } catch {
            let message = "\(error)" + BenchServer.logTail(server.logPath)
            output.emit(["kind": .string("error"), "status": .string("error"), "error": .string(message)])
            writeText(2, "lattice-bench engine: error: \(message)\n")
            return 1
        }
        for scenario in ["push", "pull"] {
            let old = lines.filter { $0["scenario"]?.stringValue == scenario && $0["engine"]?.stringValue == "old" }
            let new = lines.filter { $0["scenario"]?.stringValue == scenario && $0["engine"]?.stringValue == "new" }
            guard let oldMedian = median(old), let newMedian = median(new) else { continue }
            let both = { (lines: [[String: JSONValue]]) in median(lines, key: "edit_and_send_records_per_s") }
            var extra: [String: JSONValue] = [:]
            if scenario == "push", let oldBoth = both(old), let newBoth = both(new) {
                extra = ["old_edit_and_send_records_per_s_median": SyncBench.rounded(oldBoth, 1),
                         "new_edit_and_send_records_per_s_median": SyncBench.rounded(newBoth, 1),
                         "edit_and_send_ratio_new_to_old": SyncBench.rounded(newBoth / oldBoth, 3)]
            }
            output.emit(extra.merging(["kind": .string("summary"), "scenario": .string(scenario),
                         "old_records_per_s_median": SyncBench.rounded(oldMedian, 1),
                         "new_records_per_s_median": SyncBench.rounded(newMedian, 1),
                         "ratio_new_to_old": SyncBench.rounded(newMedian / oldMedian, 3),
                         "pairs": .integer(min(old.count, new.count))]) { $1 })
        }
        return lines.allSatisfy { $0["status"]?.stringValue == "ok" } ? 0 : 1
    }

    private static func median(_ lines: [[String: JSONValue]], key: String = "records_per_s") -> Double? {
        let values = lines.compactMap { line -> Double? in
            if case .double(let value)? = line[key] { return value }
            return nil
        }.sorted()
        return values.isEmpty ? nil : values[values.count / 2]
    }

    private static func line(_ scenario: String, engine: String, pair: Int, records: Int, seconds: Double,
                             transport: CountingTransport, batch: Int?, expected: Int) -> [String: JSONValue] {
        let tally = transport.take()
        var line = SyncBench.measurementLine(scenario: scenario, wire: .binary, batch: batch, clients: 1, records: records,
                                             seconds: seconds, requests: tally.requests, latencies: tally.latencies)
        line["engine"] = .string(engine)
        line["api"] = .string(engine == "old" ? "SyncEngine (the baseline the CLI ran on before)" : "LatticeSyncEngine (CKSyncEngine's shape)")
        line["pair"] = .integer(pair)
        line["records_expected"] = .integer(expected)
        line["latency_of"] = .string("one HTTP request")
        line.merge(SyncBench.tallyFields(tally)) { _, new in new }
        if records != expected {
            line["status"] = .string("error")
            line["error"] = .string("\(records) of \(expected) records")
        }
        return line
    }

    // MARK: Push

    /// The local edits' time beside the send's: the old engine writes each edit into its replica as it is
    /// made, the app engine makes an edit into a partial state when the batch is built.
    private static func withEdits(_ line: [String: JSONValue], editSeconds: Double, sendSeconds: Double) -> [String: JSONValue] {
        var line = line
        var records = 0
        if case .int(let count)? = line["records"] { records = Int(count) }
        line["local_edit_s"] = SyncBench.rounded(editSeconds, 4)
        line["edit_and_send_records_per_s"] = SyncBench.rate(records, editSeconds + sendSeconds)
        return line
    }

    private static func pushOld(pair: Int, _ options: EngineBenchOptions, server: BenchServer, root: String) throws
        -> [String: JSONValue] {
        let transport = try CountingTransport(serverURL: server.url)
        let engine = try SyncEngine(home: root + "/old-push-\(pair)", transport: transport)
        try engine.signIn(AccountClient(serverURL: server.url, transport: transport).signUpWaiting(name: "old-push-\(pair)"))
        engine.batchLimit = options.batch
        let zone = try engine.privateZone("Bench")
        // The zone is made on the server by the first send: one untimed record first.
        try engine.edit("warm-up", in: zone, creating: "Item") { record, stamp in try record.set("n", to: .int64(0), at: stamp()) }
        var warm = SyncReport()
        try engine.send(&warm)
        let editBegan = monotonicNanoseconds()
        for index in 0..<options.records {
            try engine.edit("item-\(index)", in: zone, creating: "Item") { record, stamp in
                try record.set("name", to: .string("item \(index)"), at: stamp())
                try record.set("n", to: .int64(Int64(index)), at: stamp())
                try record.add([.string("alpha"), .string("tag\(index % 400)")], to: "tags", at: stamp())
            }
        }
        let editSeconds = Double(monotonicNanoseconds() - editBegan) / 1e9
        _ = transport.take()
        let began = monotonicNanoseconds()
        var report = SyncReport()
        try engine.send(&report)
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        return withEdits(line("push", engine: "old", pair: pair, records: report.sent, seconds: seconds, transport: transport,
                              batch: options.batch, expected: options.records), editSeconds: editSeconds, sendSeconds: seconds)
    }

    private static func pushNew(pair: Int, _ options: EngineBenchOptions, server: BenchServer, root: String) throws
        -> [String: JSONValue] {
        let transport = try CountingTransport(serverURL: server.url)
        let account = try AccountClient(serverURL: server.url, transport: transport).signUpWaiting(name: "new-push-\(pair)")
        let app = BenchApp(batch: options.batch)
        let engine = app.makeEngine(account: account, transport: transport)
        let zone = LatticeRecordZone.ID(zoneName: "Bench")
        engine.state.add(pendingDatabaseChanges: [.saveZone(LatticeRecordZone(zoneID: zone))])
        try waitForAsyncWork { try await engine.sendChanges() }
        var ids: [LatticeRecord.ID] = []
        let editBegan = monotonicNanoseconds()
        app.records.withLock { records in
            for index in 0..<options.records {
                let id = LatticeRecord.ID(recordName: "item-\(index)", zoneID: zone)
                var record = LatticeRecord(recordType: "Item", recordID: id)
                record["name"] = "item \(index)"
                record["n"] = Int64(index)
                record.append(contentsOf: ["alpha", "tag\(index % 400)"], toListForKey: "tags")
                records[id] = record
                ids.append(id)
            }
        }
        engine.state.add(pendingRecordZoneChanges: ids.map { .saveRecord($0) })
        let editSeconds = Double(monotonicNanoseconds() - editBegan) / 1e9
        _ = transport.take()
        let began = monotonicNanoseconds()
        try waitForAsyncWork { try await engine.sendChanges() }
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        let failures = app.failures.withLock { $0 }
        if let first = failures.first { throw SystemError.message("new engine push: \(failures.count) failed saves, first \(first)") }
        let sent = options.records - engine.state.pendingRecordZoneChanges.count
        return withEdits(line("push", engine: "new", pair: pair, records: sent, seconds: seconds, transport: transport,
                              batch: options.batch, expected: options.records), editSeconds: editSeconds, sendSeconds: seconds)
    }

    // MARK: Pull

    private static func pullOld(pair: Int, token: String, _ options: EngineBenchOptions, server: BenchServer, root: String)
        throws -> [String: JSONValue] {
        let transport = try CountingTransport(serverURL: server.url)
        let device = try SyncEngine(home: root + "/old-pull-\(pair)", transport: transport)
        try device.signIn(AccountClient(serverURL: server.url, transport: transport).signInWaiting(token: token))
        _ = transport.take()
        let began = monotonicNanoseconds()
        let report = try device.sync()
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        var result = line("pull", engine: "old", pair: pair, records: report.fetched, seconds: seconds, transport: transport,
                          batch: nil, expected: options.pullRecords)
        result["what"] = .string("a fresh device's sync(): deltas/pull pages joined into its SQLite replica")
        return result
    }

    private static func pullNew(pair: Int, token: String, _ options: EngineBenchOptions, server: BenchServer, root: String)
        throws -> [String: JSONValue] {
        let transport = try CountingTransport(serverURL: server.url)
        let account = try AccountClient(serverURL: server.url, transport: transport).signInWaiting(token: token)
        let app = BenchApp(batch: options.batch)
        let engine = app.makeEngine(account: account, transport: transport)
        _ = transport.take()
        let began = monotonicNanoseconds()
        try waitForAsyncWork { try await engine.fetchChanges() }
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        var result = line("pull", engine: "new", pair: pair, records: app.fetched.load(ordering: .relaxed), seconds: seconds,
                          transport: transport, batch: nil, expected: options.pullRecords)
        result["what"] = .string("a fresh device's fetchChanges(): deltas/pull pages decoded into LatticeRecords and "
                                 + "handed to the app in fetchedRecordZoneChanges events (the app counts them)")
        return result
    }
}
