import Foundation
import LatticeCore
import LatticeStore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice-bench sync` run as people run it (the built binary, which starts the `lattice` binary next to
/// it), on a tiny configuration: its JSON lines parse, and the counts add up. No timing is asserted.
@Suite(.serialized) struct SyncBenchCommandTests {
    /// The `lattice-bench` executable next to the `lattice` one the other process tests use.
    static var benchBinary: String {
        if let path = ProcessInfo.processInfo.environment["LATTICE_BENCH_BIN"] { return path }
        return URL(fileURLWithPath: latticeBinary).deletingLastPathComponent()
            .appendingPathComponent("lattice-bench").path
    }

    /// Runs `lattice-bench` with stdout and stderr in files; killed (by pid) after `timeoutSeconds`.
    static func bench(_ arguments: [String], timeoutSeconds: Double = 600) throws -> CLITests.Outcome {
        let directory = temporaryDirectory("lattice-bench-test")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let outPath = directory + "/stdout", errPath = directory + "/stderr"
        _ = FileManager.default.createFile(atPath: outPath, contents: nil)
        _ = FileManager.default.createFile(atPath: errPath, contents: nil)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: benchBinary)
        process.arguments = arguments
        process.standardInput = FileHandle.nullDevice
        process.standardOutput = try FileHandle(forWritingTo: URL(fileURLWithPath: outPath))
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: errPath))
        try process.run()
        let deadline = Date().addingTimeInterval(timeoutSeconds)
        while process.isRunning && Date() < deadline { usleep(50_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw HarnessError("lattice-bench \(arguments.joined(separator: " ")) ran over \(Int(timeoutSeconds)) s")
        }
        process.waitUntilExit()
        let stdout = String(decoding: FileManager.default.contents(atPath: outPath) ?? Data(), as: UTF8.self)
        let stderr = String(decoding: FileManager.default.contents(atPath: errPath) ?? Data(), as: UTF8.self)
        return CLITests.Outcome(status: process.terminationStatus, stdout: stdout, stderr: stderr)
    }

    @Test func tinyRunPrintsParseableLinesWhoseCountsAddUp() throws {
        let directory = temporaryDirectory("lattice-bench-sync")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let clients = 2, recordsPerClient = 60, pullRecords = 200, ceilingRows = 300
        let batches = [1, 50]
        let jsonl = directory + "/lines.jsonl"
        let outcome = try Self.bench(["sync", "--clients", String(clients), "--batches", "1,50",
                                      "--records", String(recordsPerClient), "--pull-records", String(pullRecords),
                                      "--ceiling-rows", String(ceilingRows), "--seconds", "300", "--jsonl", jsonl])
        #expect(outcome.status == 0, "\(outcome)")
        let lines = try outcome.stdout.split(separator: "\n").map { try JSON.parse(String($0)) }
        // --jsonl gets the same lines.
        let copy = String(decoding: FileManager.default.contents(atPath: jsonl) ?? Data(), as: UTF8.self)
        #expect(copy == outcome.stdout)

        let header = try #require(lines.first)
        #expect(header["kind"]?.stringValue == "header")
        #expect(header["bench"]?.stringValue == "sync")
        #expect(header["parameters"]?["clients"] == .int(Int64(clients)))
        #expect(header["parameters"]?["pull_records"] == .int(Int64(pullRecords)))
        #expect(header["server"]?["url"]?.stringValue?.hasPrefix("http://127.0.0.1:") == true)
        #expect(header["machine"]?["nproc"]?.intValue != nil)
        let wires = try #require(header["parameters"]?["wires"]?.arrayValue).compactMap(\.stringValue)
        #expect(wires == ["engine", "binary"]) // the default: the app engine beside the baseline's binary path
        let modes = try #require(header["parameters"]?["push_modes"]?.arrayValue).compactMap(\.stringValue)
        #expect(modes == ["rounds", "backlog"]) // --push-mode both is the default

        func measurements(_ scenario: String) -> [JSON] {
            lines.filter { $0["kind"]?.stringValue == "measurement" && $0["scenario"]?.stringValue == scenario }
        }
        func int(_ line: JSON, _ key: String) -> Int { Int(line[key]?.intValue ?? -1) }
        for line in lines.dropFirst() {
            #expect(line["status"]?.stringValue == "ok", "\(line.serialized())")
        }

        // Push: every pacing, wire and batch. Rounds: `batch` records per client, each send one request;
        // backlog: one send per client, its queue in requests of `batch` records.
        let pushes = measurements("push")
        #expect(pushes.count == modes.count * wires.count * batches.count)
        for (mode, wire, batch) in modes.flatMap({ mode in wires.flatMap { wire in batches.map { (mode, wire, $0) } } }) {
            do {
                let push = try #require(pushes.first {
                    $0["mode"]?.stringValue == mode && $0["wire"]?.stringValue == wire && $0["batch"] == .int(Int64(batch))
                })
                let rounds = (recordsPerClient + batch - 1) / batch
                #expect(int(push, "clients") == clients)
                #expect(int(push, "rounds") == rounds)
                #expect(int(push, "records") == clients * rounds * batch)
                #expect(int(push, "records_edited") == int(push, "records"))
                #expect(int(push, "records_rejected") == 0)
                #expect(int(push, "records_unacknowledged") == 0)
                #expect(int(push, "send_calls") == (mode == "rounds" ? clients * rounds : clients))
                #expect(int(push, "requests") == clients * rounds + int(push, "throttled"))
                #expect(push["latency_of"]?.stringValue == (mode == "rounds" ? "send call" : "request"))
                #expect((push["server_cpu_s"]?.doubleValue ?? -1) >= 0 && (push["clients_cpu_s"]?.doubleValue ?? -1) >= 0)
                let endpoints = push["endpoints"]?.objectValue ?? [:]
                #expect(endpoints.values.reduce(0) { $0 + Int($1.intValue ?? 0) } == int(push, "requests"))
                // The wire asked for is the wire used: deltas/push (the app engine's partial states, the baseline's
                // whole frames), or records/modify.
                #expect(Array(endpoints.keys) == [wire == "json" ? "records/modify" : "deltas/push"], "\(endpoints)")
                #expect(push["stopped_by"]?.stringValue == "records")
                let seconds = try #require(push["seconds"]?.doubleValue)
                let rate = try #require(push["records_per_s"]?.doubleValue)
                #expect(abs(rate * seconds - Double(int(push, "records"))) <= 0.01 * Double(int(push, "records")) + 1)
                #expect(push["p50_ms"]?.doubleValue != nil && push["p99_ms"]?.doubleValue != nil)
                #expect((push["p50_ms"]?.doubleValue ?? 1) <= (push["p99_ms"]?.doubleValue ?? 0))
                #expect((push["server_peak_rss_mib"]?.doubleValue ?? 0) > 0)
            }
        }

        // Ceiling: the frames of the first wire's push (120 and 200 of them), written again under other keys up to
        // --ceiling-rows, `batch` rows per transaction.
        let ceilings = measurements("ceiling")
        #expect(ceilings.count == batches.count)
        for batch in batches {
            let ceiling = try #require(ceilings.first { $0["batch"] == .int(Int64(batch)) })
            let push = try #require(pushes.first {
                $0["mode"]?.stringValue == modes[0] && $0["wire"]?.stringValue == wires[0] && $0["batch"] == .int(Int64(batch))
            })
            #expect(int(ceiling, "rows_target") == max(ceilingRows, int(push, "records")))
            #expect(int(ceiling, "records") == int(ceiling, "rows_target"))
            #expect(int(ceiling, "frames_available") == int(push, "records"))
            #expect(int(ceiling, "transactions") == (int(ceiling, "records") + batch - 1) / batch)
            #expect((ceiling["frame_bytes_mean"]?.doubleValue ?? 0) > 0)
        }

        // Pull: the account was filled with exactly --pull-records records, and each fresh device got them all.
        let populate = try #require(measurements("populate").first)
        #expect(int(populate, "records") == pullRecords)
        let pulls = measurements("pull")
        #expect(pulls.compactMap { $0["wire"]?.stringValue } == wires)
        for pull in pulls {
            #expect(int(pull, "records") == pullRecords)
            #expect(int(pull, "records_expected") == pullRecords)
            #expect(int(pull, "requests") >= 1)
            let pages = pull["wire"]?.stringValue == "json" ? "changes/zone" : "deltas/pull"
            #expect(pull["endpoints"]?[pages]?.intValue ?? 0 >= 1, "\(pull.serialized())")
        }

        // Summaries: one per pacing, wire and batch, the ratio of the two rates printed beside it.
        let summaries = lines.filter { $0["kind"]?.stringValue == "summary" && $0["ratio_service_to_ceiling"] != nil }
        #expect(summaries.count == modes.count * wires.count * batches.count)
        #expect(Set(summaries.compactMap { $0["mode"]?.stringValue }) == Set(modes))
        for summary in summaries {
            let push = try #require(summary["push_records_per_s"]?.doubleValue)
            let storage = try #require(summary["ceiling_records_per_s"]?.doubleValue)
            let ratio = try #require(summary["ratio_service_to_ceiling"]?.doubleValue)
            #expect(abs(ratio - push / storage) <= 0.001 * max(1, ratio), "\(summary.serialized())")
        }

        // And the app engine beside the baseline: one per pacing and batch, and one for the pull.
        let pairs = lines.filter { $0["kind"]?.stringValue == "summary" && $0["ratio_engine_to_binary"] != nil }
        #expect(pairs.count == modes.count * batches.count + 1)
        for pair in pairs {
            let new = try #require(pair["engine_records_per_s"]?.doubleValue)
            let old = try #require(pair["binary_records_per_s"]?.doubleValue)
            let ratio = try #require(pair["ratio_engine_to_binary"]?.doubleValue)
            #expect(abs(ratio - new / old) <= 0.001 * max(1, ratio), "\(pair.serialized())")
        }

        // The server is gone: the bench stopped and reaped it.
        let pid = try #require(header["server"]?["pid"]?.intValue)
        #expect(kill(pid_t(pid), 0) == -1 && errno == ESRCH)
    }

    /// `--database URL --nodes 2` on the test cluster: both nodes take clients, every pushed record is
    /// acknowledged, the ceiling runs through libpq, and the nodes are gone afterwards.
    @Test func tinyRunOnTwoPostgreSQLNodes() throws {
        let url = try PostgresTestDatabase.clusterURL()
        let clients = 3, recordsPerClient = 10
        let outcome = try Self.bench(["sync", "--clients", String(clients), "--batches", "2", "--records",
                                      String(recordsPerClient), "--pull-records", "0", "--ceiling-rows", "40",
                                      "--wire", "binary", "--seconds", "120", "--database", url, "--nodes", "2"])
        #expect(outcome.status == 0, "\(outcome)")
        let lines = try outcome.stdout.split(separator: "\n").map { try JSON.parse(String($0)) }
        let header = try #require(lines.first)
        let nodes = try #require(header["server"]?["nodes"]?.arrayValue)
        #expect(nodes.count == 2)
        #expect(header["server"]?["storage"]?.stringValue?.hasPrefix("PostgreSQL") == true, "\(header.serialized())")
        let push = try #require(lines.first { $0["scenario"]?.stringValue == "push" })
        #expect(push["storage"]?.stringValue == "postgresql" && push["nodes"] == .int(2))
        #expect(push["records"] == .int(Int64(clients * recordsPerClient)) && push["status"]?.stringValue == "ok",
                "\(push.serialized())")
        let ceiling = try #require(lines.first { $0["scenario"]?.stringValue == "ceiling" })
        #expect(ceiling["storage"]?.stringValue == "postgresql" && ceiling["records"] == .int(40), "\(ceiling.serialized())")
        #expect(lines.contains { $0["kind"]?.stringValue == "summary" })
        for node in nodes {
            let pid = try #require(node["pid"]?.intValue)
            #expect(kill(pid_t(pid), 0) == -1 && errno == ESRCH)
        }
    }

    @Test(arguments: [
        (["sync", "--clients", "0"], "--clients"),
        (["sync", "--batches", "1,401"], "--batches"),
        (["sync", "--batches", "1,x"], "--batches"),
        (["sync", "--wire", "xml"], "--wire"),
        (["sync", "--push-mode", "lockstep"], "--push-mode"),
        (["sync", "--records", "0"], "--records"),
        (["sync", "--ceiling-rows", "0"], "--ceiling-rows"),
        (["sync", "--pull-records", "-5"], "--pull-records"),
        (["sync", "--seconds", "-1"], "--seconds"),
        (["sync", "--frobnicate"], "--frobnicate"),
        (["sync", "--nodes", "2"], "--nodes"),
        (["sync", "--nodes", "9", "--database", "postgresql:///lattice"], "--nodes"),
        (["sync", "--database", "/tmp/not-a-url"], "--database"),
    ])
    func badParametersExitTwoWithAClearError(arguments: [String], named option: String) throws {
        let outcome = try Self.bench(arguments, timeoutSeconds: 60)
        #expect(outcome.status == 2, "\(outcome)")
        #expect(outcome.stdout.isEmpty)
        #expect(outcome.stderr.contains("lattice-bench sync: error:") && outcome.stderr.contains(option), "\(outcome)")
    }
}
