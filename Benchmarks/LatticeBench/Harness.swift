// The benchmark driver: the orchestrator (header, one fresh worker process per repetition,
// summaries) and the worker (one scenario, one repetition, one JSON line), mirroring the
// reference peer_merge_bench.py.

#if canImport(Glibc)
import Glibc
#endif

enum Harness {
    /// The `peer` of every run and summary line.
    static let peerName = "lattice"

    /// Summary statistics (median/min/max) are computed over these run keys, as in the reference.
    static let summaryKeys = ["export_s", "import_s", "merge_s", "records_per_s", "field_merges_per_s",
                              "import_field_merges_per_s", "ops_per_s", "update_bytes", "peak_rss_mib",
                              "rss_before_merge_mib", "rss_after_merge_mib", "build_base_s", "apply_edits_s"]

    /// Run keys copied into the summary from the first successful run.
    static let summaryCopiedKeys = ["records", "fields", "records_merged", "field_merges", "ops_merged",
                                    "edited_by_B", "edited_by_both", "field_conflicts"]

    /// Entry point: `arguments` excludes the program name. Returns the exit status.
    static func main(arguments: [String]) -> Int32 {
        guard let command = arguments.first else {
            writeText(2, "lattice-bench: error: missing command\n" + topUsage)
            return 2
        }
        switch command {
        case "merge":
            let options: MergeOptions
            do {
                options = try MergeOptions.parse(Array(arguments.dropFirst()))
            } catch {
                writeText(2, "lattice-bench merge: error: \(error.message)\n(run 'lattice-bench merge --help' for the options)\n")
                return 2
            }
            if options.help {
                writeText(1, MergeOptions.usage + "\n")
                return 0
            }
            if options.worker { return runWorker(options) }
            if let path = options.dumpWorkloadPath { return dumpWorkload(options, to: path) }
            return runOrchestrator(options, argv: arguments)
        case "serve":
            return runCommand("serve", arguments, ServeLoadOptions.self, helpHint: false) { options, _ in ServeLoad.run(options) }
        case "sync":
            return runCommand("sync", arguments, SyncBenchOptions.self) { SyncBench.run($0, argv: $1) }
        case "devices":
            return runCommand("devices", arguments, DevicesBenchOptions.self) { DevicesBench.run($0, argv: $1) }
        case "fanout":
            return runCommand("fanout", arguments, FanoutBenchOptions.self) { FanoutBench.run($0, argv: $1) }
        case "assets":
            return runCommand("assets", arguments, AssetsBenchOptions.self) { AssetsBench.run($0, argv: $1) }
        case "text":
            return runCommand("text", arguments, TextBenchOptions.self) { TextBench.run($0, argv: $1) }
        case "engine":
            return runCommand("engine", arguments, EngineBenchOptions.self) { EngineBench.run($0, argv: $1) }
        case "push":
            return runCommand("push", arguments, PushProfileOptions.self, helpHint: false) { options, _ in PushProfile.run(options) }
        case "soak":
            return runCommand("soak", arguments, SoakOptions.self) { SoakBench.run($0, argv: $1) }
        case BenchServer.guardCommand: // internal: the process between `lattice-bench sync` and its server
            return BenchServer.runGuard(Array(arguments.dropFirst()))
        case "-h", "--help", "help":
            writeText(1, topUsage)
            return 0
        default:
            writeText(2, "lattice-bench: error: unknown command '\(command)'\n" + topUsage)
            return 2
        }
    }

    /// A command with options of its own: `--help` prints its usage; a bad command line exits 2 naming it.
    private static func runCommand<Options: BenchCommandOptions>(
        _ name: String, _ arguments: [String], _ type: Options.Type, helpHint: Bool = true,
        run: (Options, [String]) -> Int32
    ) -> Int32 {
        do {
            let options = try Options.parse(Array(arguments.dropFirst()))
            if options.help {
                writeText(1, Options.usage + "\n")
                return 0
            }
            return run(options, arguments)
        } catch {
            let hint = helpHint ? "(run 'lattice-bench \(name) --help' for the options)\n" : ""
            writeText(2, "lattice-bench \(name): error: \(error.message)\n" + hint)
            return 2
        }
    }

    static let topUsage = """
        usage: lattice-bench merge [options]     merge throughput (lattice-bench merge --help)
               lattice-bench serve [options]     server request rate and latency (lattice-bench serve --help)
               lattice-bench sync [options]      end-to-end sync: push, pull, storage ceiling (lattice-bench sync --help)
               lattice-bench devices [options]   many devices sending small changes, beside the storage ceilings
               lattice-bench fanout [options]    many idle push streams; a write to a share reaching its devices
               lattice-bench assets [options]    asset uploads and downloads (MB/s) beside the disk's fsync ceiling
               lattice-bench text [traces] [options]  text CRDT on real editing traces beside Loro and Yrs
               lattice-bench engine [options]    the app engine beside the CLI's, push and pull (lattice-bench engine --help)
               lattice-bench push [options]      one binary push in-process, for profiling (lattice-bench push --help)
               lattice-bench soak [options]      mixed traffic for minutes: latency, memory, files (lattice-bench soak --help)

        """

    // MARK: Workload dump

    /// Writes the digest lines to `path` and prints the reference's `{"kind": "workload", ...}` line.
    static func dumpWorkload(_ options: MergeOptions, to path: String) -> Int32 {
        do {
            let workload = try Workload(options.parameters)
            try workload.writeLines(toFile: path)
            var line = statsJSON(workload.stats)
            line["kind"] = .string("workload")
            line["workload_spec"] = .string(Workload.spec)
            line["workload_digest"] = .string(workload.digest())
            writeText(1, JSONValue.object(line).serialized + "\n")
            return 0
        } catch let error as WorkloadError {
            writeText(2, "lattice-bench merge: error: \(error.message)\n")
            return 2
        } catch {
            writeText(2, "lattice-bench merge: error: \(error)\n")
            return 2
        }
    }

    static func statsJSON(_ stats: WorkloadStats) -> [String: JSONValue] {
        ["edited_by_A": .integer(stats.editedByA), "edited_by_B": .integer(stats.editedByB),
         "edited_by_both": .integer(stats.editedByBoth), "field_conflicts": .integer(stats.fieldConflicts)]
    }

    // MARK: Orchestrator

    /// Prints the header, runs every repetition of every scenario in a fresh worker process,
    /// prints each run line and then one summary line per scenario.
    static func runOrchestrator(_ options: MergeOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("merge", jsonl: options.jsonlPath) else { return 2 }
        let header: [String: JSONValue]
        do {
            header = try makeHeader(options, argv: argv)   // the workload is freed on return
        } catch {
            writeText(2, "lattice-bench merge: error: \(error)\n")
            return 2
        }
        output.emit(header)

        let argv0 = CommandLine.arguments.first ?? "lattice-bench"
        var runs: [[String: JSONValue]] = []
        for rep in 0..<options.reps {
            for scenario in options.scenarios {
                let record = runOneWorker(options, scenario: scenario, rep: rep, argv0: argv0)
                runs.append(record)
                output.emit(record)
            }
        }
        for summary in summarize(runs) { output.emit(summary) }
        output.close()
        let allOK = runs.allSatisfy { ["ok", "skipped"].contains($0["status"]?.stringValue ?? "") }
        return allOK ? 0 : 1
    }

    private static func makeHeader(_ options: MergeOptions, argv: [String]) throws -> [String: JSONValue] {
        let started = utcTimestamp()
        let machine = MachineInfo.collect()
        let workload = try Workload(options.parameters)
        var header = statsJSON(workload.stats)
        header["kind"] = .string("header")
        header["started"] = .string(started)
        header["argv"] = .array(argv.map { .string($0) })
        header["machine"] = .object(machine)
        header["workload_spec"] = .string(Workload.spec)
        header["workload_digest"] = .string(workload.digest())
        return header
    }

    /// Runs one worker and returns its run line, or an error run line if it produced none.
    private static func runOneWorker(_ options: MergeOptions, scenario: Scenario, rep: Int,
                                     argv0: String) -> [String: JSONValue] {
        var failure: [String: JSONValue] = ["kind": .string("run"), "peer": .string(peerName),
                                            "scenario": .string(scenario.rawValue), "rep": .integer(rep),
                                            "version": .string(latticePeerVersion), "status": .string("error")]
        let child: ChildResult
        do {
            child = try runSelfAsChild(arguments: options.workerArguments(scenario: scenario, rep: rep),
                                       argv0: argv0, timeoutSeconds: options.workerTimeoutSeconds)
        } catch {
            failure["error"] = .string("\(error)")
            return failure
        }
        if !child.stderr.isEmpty {
            child.stderr.withUnsafeBytes { try? writeAll(2, $0, what: "stderr") }
        }
        let stdoutText = String(decoding: child.stdout, as: UTF8.self)
        for line in stdoutText.split(separator: "\n").reversed() where line.hasPrefix("{") {
            if case .object(var record)? = try? JSONValue.parse(String(line)) {
                record["seed"] = .integer(options.parameters.seed) // exact, even above Int64.max
                return record
            }
            break
        }
        var reason: String
        if child.timedOut {
            reason = "worker timed out after \(JSONValue.pythonRepr(options.workerTimeoutSeconds)) s and was killed"
        } else {
            switch child.termination {
            case .exited(let code): reason = "worker exited with status \(code) without a run line"
            case .signaled(let signal): reason = "worker was killed by signal \(signal)"
            }
        }
        // A Swift runtime failure prints its message first, then a long backtrace: keep the head.
        let output = String(decoding: child.stderr.isEmpty ? child.stdout : child.stderr, as: UTF8.self)
        if !output.isEmpty { reason += "\n" + String(output.prefix(2000)) }
        failure["error"] = .string(reason)
        return failure
    }

    /// One summary line per (peer, scenario), in first-run order, exactly like the reference's
    /// `summarize`: medians, minima and maxima over the successful runs.
    static func summarize(_ runs: [[String: JSONValue]]) -> [[String: JSONValue]] {
        var order: [String] = []
        var groups: [String: [[String: JSONValue]]] = [:]
        for run in runs {
            let key = (run["peer"]?.stringValue ?? "") + "\u{0}" + (run["scenario"]?.stringValue ?? "")
            if groups[key] == nil { order.append(key) }
            groups[key, default: []].append(run)
        }
        var summaries: [[String: JSONValue]] = []
        for key in order {
            let group = groups[key]!
            let ok = group.filter { $0["status"]?.stringValue == "ok" }
            var summary: [String: JSONValue] = [
                "kind": .string("summary"), "peer": group[0]["peer"] ?? .null,
                "scenario": group[0]["scenario"] ?? .null, "version": group[0]["version"] ?? .null,
                "reps": .integer(ok.count),
            ]
            guard let first = ok.first else {
                summary["status"] = group[0]["status"] ?? .string("error")
                let reason = group[0]["reason"] ?? .null
                summary["reason"] = (reason == .null || reason == .string("")) ? (group[0]["error"] ?? .null) : reason
                summaries.append(summary)
                continue
            }
            summary["status"] = .string("ok")
            for name in summaryCopiedKeys { summary[name] = first[name] ?? .null }
            for name in summaryKeys {
                let values = ok.compactMap { run -> JSONValue? in
                    guard let value = run[name], value.doubleValue != nil else { return nil }
                    return value
                }
                guard !values.isEmpty else { continue }
                let sorted = values.sorted { $0.doubleValue! < $1.doubleValue! }
                summary["median_" + name] = median(sorted)
                summary["min_" + name] = sorted.first!
                summary["max_" + name] = sorted.last!
            }
            let verifies = Set(ok.map { $0["verify"]?.stringValue ?? "not run" })
            summary["verify"] = .array(verifies.sorted { $0.unicodeScalars.lexicographicallyPrecedes($1.unicodeScalars) }
                .map { .string($0) })
            summaries.append(summary)
        }
        return summaries
    }

    /// Python's `statistics.median` of sorted numbers: the middle element, or the mean of the two
    /// middle ones (always a float).
    static func median(_ sorted: [JSONValue]) -> JSONValue {
        let count = sorted.count
        if count % 2 == 1 { return sorted[count / 2] }
        let low = sorted[count / 2 - 1], high = sorted[count / 2]
        if case .int(let a) = low, case .int(let b) = high {
            let (sum, overflow) = a.addingReportingOverflow(b)
            if !overflow { return .double(Double(sum) / 2) }
        }
        return .double((low.doubleValue! + high.doubleValue!) / 2)
    }

    // MARK: Worker

    /// Runs one repetition of one scenario in this process and prints its run line.
    static func runWorker(_ options: MergeOptions) -> Int32 {
        let rssStart = ProcStatus.rssKiB
        let scenario = options.workerScenario
        var record: [String: JSONValue] = ["kind": .string("run"), "peer": .string(peerName),
                                           "scenario": .string(scenario.rawValue), "rep": .integer(options.workerRep),
                                           "version": .string(latticePeerVersion)]
        do {
            let workload = try Workload(options.parameters)
            let measurement = try runScenario(scenario, workload: workload, verify: options.verify)
            record.merge(runFields(workload: workload, scenario: scenario, measurement: measurement,
                                   rssStartKiB: rssStart, verify: options.verify)) { _, new in new }
            for (key, value) in measurement.extra where record[key] == nil { record[key] = value }
        } catch let error as WorkloadError {
            record["status"] = .string("error")
            record["error"] = .string(error.message)
        } catch {
            record["status"] = .string("error")
            record["error"] = .string(String(describing: error))
        }
        writeText(1, JSONValue.object(record).serialized + "\n")
        return 0
    }

    /// The measured part of a successful run line, with counts and rates per the README.
    static func runFields(workload: Workload, scenario: Scenario, measurement m: ScenarioMeasurement,
                          rssStartKiB: Int, verify: Bool) -> [String: JSONValue] {
        let p = workload.parameters
        let counts = workload.mergeCounts(for: scenario)
        let exportSeconds = m.merge.exportSeconds, importSeconds = m.merge.importSeconds
        let mergeSeconds = exportSeconds + importSeconds
        func rate(_ amount: Int, _ seconds: Double) -> JSONValue {
            seconds > 0 ? .double(Double(amount) / seconds) : .null
        }
        func mib(_ kib: Int) -> JSONValue { .double(Double(kib) / 1024) }
        func rounded6(_ seconds: Double?) -> JSONValue {
            seconds.map { .double(($0 * 1e6).rounded() / 1e6) } ?? .null
        }
        var fields: [String: JSONValue] = [
            "status": .string("ok"),
            "records": .integer(p.records), "fields": .integer(p.fields), "tags": .integer(p.tags),
            "tag_vocab": .integer(p.tagVocab), "edit_frac": .double(p.editFraction),
            "fields_per_edit": .integer(p.effectiveFieldsPerEdit), "seed": .integer(p.seed),
            "workload_spec": .string(Workload.spec),
            "records_merged": .integer(counts.recordsMerged), "field_merges": .integer(counts.fieldMerges),
            "ops_merged": .integer(counts.opsMerged), "update_bytes": .integer(m.merge.updateBytes),
            "build_base_s": rounded6(m.buildBaseSeconds), "apply_edits_s": rounded6(m.applyEditsSeconds),
            "export_s": .double(exportSeconds), "import_s": .double(importSeconds), "merge_s": .double(mergeSeconds),
            "records_per_s": rate(counts.recordsMerged, mergeSeconds),
            "field_merges_per_s": rate(counts.fieldMerges, mergeSeconds),
            "import_field_merges_per_s": rate(counts.fieldMerges, importSeconds),
            "ops_per_s": rate(counts.opsMerged, mergeSeconds),
            "rss_start_mib": mib(rssStartKiB), "rss_before_merge_mib": mib(m.merge.rssBeforeMergeKiB),
            "rss_after_merge_mib": mib(m.merge.rssAfterMergeKiB), "peak_rss_mib": mib(m.merge.peakRSSKiB),
        ]
        fields.merge(statsJSON(workload.stats)) { _, new in new }
        if verify { fields["verify"] = .string(m.verify?.text ?? "not run") }
        return fields
    }
}

/// Emits JSON lines on stdout (flushed per line) and optionally to a file.
struct LineOutput {
    private var fileDescriptor: Int32 = -1

    /// The output of a measuring command (`merge`, `sync`): stdout, and `--jsonl FILE` when given. Warns
    /// on a debug build; nil (after saying why) when the file cannot be opened.
    static func forCommand(_ command: String, jsonl path: String?) -> LineOutput? {
        #if DEBUG
        writeText(2, "lattice-bench: warning: this is a debug build; measure with -c release\n")
        #endif
        var output = LineOutput()
        if let path {
            do { try output.openFile(path) } catch {
                writeText(2, "lattice-bench \(command): error: \(error)\n")
                return nil
            }
        }
        return output
    }

    mutating func openFile(_ path: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SystemError.posix("cannot open \(path) for writing", errno) }
        fileDescriptor = fd
    }

    func emit(_ object: [String: JSONValue]) {
        let line = JSONValue.object(object).serialized + "\n"
        writeText(1, line)
        if fileDescriptor >= 0 { writeText(fileDescriptor, line) }
    }

    mutating func close() {
        if fileDescriptor >= 0 { _ = Glibc.close(fileDescriptor); fileDescriptor = -1 }
    }
}

/// The options of a `lattice-bench` command: parsed from its arguments, with a usage text and `--help`.
protocol BenchCommandOptions {
    static var usage: String { get }
    var help: Bool { get }
    static func parse(_ arguments: [String]) throws(UsageError) -> Self
}

extension ServeLoadOptions: BenchCommandOptions {}
extension SyncBenchOptions: BenchCommandOptions {}
extension DevicesBenchOptions: BenchCommandOptions {}
extension AssetsBenchOptions: BenchCommandOptions {}
extension FanoutBenchOptions: BenchCommandOptions {}
extension EngineBenchOptions: BenchCommandOptions {}
extension PushProfileOptions: BenchCommandOptions {}
extension SoakOptions: BenchCommandOptions {}
