import CZlib
import Foundation
import LatticeCore
#if canImport(Glibc)
import Glibc
#endif

/// `lattice-bench text`: LatticeCore's text CRDT (`TextState`) on real editing traces, beside Loro and Yrs
/// (pycrdt) running the same traces in the same run through `Benchmarks/text_trace_peers.py`.
struct TextBenchOptions: Sendable {
    var traces: [String] = []
    var peers = ["loro", "pycrdt"]
    var peerPython = "/tmp/peers/bin/python"
    var peerScript = "Benchmarks/text_trace_peers.py"
    var repeats = 5
    var jsonlPath: String?
    /// The service scenario's batch (patches per request); nil skips the scenario.
    var serviceBatch: Int? = 1_000
    /// Internal: measure the one trace given and print its line (each trace runs in a process of its own,
    /// as each peer does, so one trace's memory does not hide the next one's).
    var worker = false
    var help = false

    static let usage = """
        usage: lattice-bench text [TRACE.json[.gz] ...] [--peers loro,pycrdt|none] [--peer-python PATH]
                                  [--peer-script PATH] [--repeat N] [--service-batch N | --no-service]
                                  [--jsonl FILE]

        Replays editing traces (the format of Benchmarks/traces/README.md; default: every trace in
        Benchmarks/traces) through LatticeCore's TextState:
          sequential traces  every patch applied as a local edit at its position (Unicode scalars), one
                             stamp per transaction; the final text must equal endContent
          concurrent traces  one replica per agent; before each transaction the writing replica joins
                             the state of every parent written by another agent (kept from right after
                             that parent's transaction); at the end all replicas join; every replica's text
                             must equal endContent
        Then the final state is encoded; "load" decodes it into a fresh replica and reads its text;
        "merge" decodes it and joins it into a replica holding the state halfway through the trace, then
        reads the text (both the best of --repeat runs). Memory: the growth of this process's resident
        set over the replay (after the trace is loaded), and its peak.
        Each peer runs the same trace in its own process (its own figures, same definitions), and a
        "ratio" line compares them: replay speed, load and merge time, encoded size.
        Service scenario (sequential traces): a real lattice serve (SQLite, next to lattice-bench) holds one
        record with a TEXT field; two clients take turns sending the trace's patches as splices, N per
        records/modify; the "text-service" line gives patches/s, request latency, the server's memory, and
        whether a records/lookup then reads endContent (build lattice too: swift build -c release).

        options:
          --peers LIST         loro, pycrdt, or none (default loro,pycrdt)
          --peer-python PATH   a Python with loro and pycrdt (default /tmp/peers/bin/python; create it with
                               python3 -m venv /tmp/peers && /tmp/peers/bin/pip install loro pycrdt)
          --peer-script PATH   default Benchmarks/text_trace_peers.py
          --repeat N           runs of load and merge, best counted (default 5)
          --service-batch N    patches per request in the service scenario (1...4096, default 1000)
          --no-service         skip the service scenario
          --jsonl FILE         also write every JSON line to FILE
          -h, --help           show this help and exit
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> TextBenchOptions {
        var options = TextBenchOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            switch scanner.name {
            case "--peers":
                let list = try scanner.value()
                options.peers = list == "none" ? [] : list.split(separator: ",").map(String.init)
                guard options.peers.allSatisfy({ ["loro", "pycrdt"].contains($0) }) else {
                    throw UsageError(message: "--peers takes loro, pycrdt (comma-separated) or none")
                }
            case "--peer-python": options.peerPython = try scanner.value()
            case "--peer-script": options.peerScript = try scanner.value()
            case "--repeat": options.repeats = try scanner.integer(in: 1...100)
            case "--jsonl": options.jsonlPath = try scanner.value()
            case "--service-batch": options.serviceBatch = try scanner.integer(in: 1...4_096)
            case "--no-service":
                try scanner.flag()
                options.serviceBatch = nil
            case "--worker":
                try scanner.flag()
                options.worker = true
            case "-h", "--help":
                try scanner.flag()
                options.help = true
            default:
                guard !scanner.argument.hasPrefix("-") else { throw scanner.unknown() }
                options.traces.append(scanner.argument)
            }
        }
        return options
    }
}

extension TextBenchOptions: BenchCommandOptions {}

/// One editing trace, its patches with their inserted text as Unicode scalars.
struct EditingTrace {
    struct Transaction {
        var patches: [(position: Int, deleted: Int, inserted: [Unicode.Scalar])]
        var agent: Int
        var parents: [Int]
    }

    var name: String
    var startContent: [Unicode.Scalar]
    var endContent: String
    var transactions: [Transaction]
    /// nil for a sequential trace.
    var agents: Int?

    var patchCount: Int { transactions.reduce(0) { $0 + $1.patches.count } }

    struct Failure: Error { var message: String }

    static func load(_ path: String) throws -> EditingTrace {
        guard let raw = FileManager.default.contents(atPath: path) else { throw Failure(message: "cannot read \(path)") }
        let bytes = path.hasSuffix(".gz") ? try gunzip([UInt8](raw)) : [UInt8](raw)
        let object = try JSON.parse(bytes)
        guard let end = object["endContent"]?.stringValue, let txns = object["txns"]?.arrayValue else {
            throw Failure(message: "\(path) is not an editing trace (endContent and txns)")
        }
        var transactions: [Transaction] = []
        transactions.reserveCapacity(txns.count)
        for txn in txns {
            guard let patches = txn["patches"]?.arrayValue else { throw Failure(message: "\(path): a transaction without patches") }
            var parsed: [(Int, Int, [Unicode.Scalar])] = []
            parsed.reserveCapacity(patches.count)
            for patch in patches {
                guard let parts = patch.arrayValue, parts.count == 3, let position = parts[0].intValue,
                      let deleted = parts[1].intValue, let inserted = parts[2].stringValue else {
                    throw Failure(message: "\(path): a malformed patch")
                }
                parsed.append((Int(position), Int(deleted), Array(inserted.unicodeScalars)))
            }
            transactions.append(Transaction(patches: parsed, agent: Int(txn["agent"]?.intValue ?? 0),
                                            parents: (txn["parents"]?.arrayValue ?? []).compactMap { $0.intValue.map(Int.init) }))
        }
        let name = URL(fileURLWithPath: path).lastPathComponent.components(separatedBy: ".").first ?? path
        return EditingTrace(name: name, startContent: Array((object["startContent"]?.stringValue ?? "").unicodeScalars),
                            endContent: end, transactions: transactions, agents: object["numAgents"]?.intValue.map(Int.init))
    }

    static func gunzip(_ input: [UInt8]) throws -> [UInt8] {
        var stream = z_stream()
        guard inflateInit2_(&stream, 15 + 32, zlibVersion(), Int32(MemoryLayout<z_stream>.size)) == Z_OK else {
            throw Failure(message: "zlib would not start")
        }
        defer { inflateEnd(&stream) }
        var output: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1 << 20)
        var input = input
        let status: Int32 = input.withUnsafeMutableBufferPointer { source in
            stream.next_in = source.baseAddress
            stream.avail_in = uInt(source.count)
            while true {
                let result = chunk.withUnsafeMutableBufferPointer { target -> Int32 in
                    stream.next_out = target.baseAddress
                    stream.avail_out = uInt(target.count)
                    return inflate(&stream, Z_NO_FLUSH)
                }
                output.append(contentsOf: chunk[0..<(chunk.count - Int(stream.avail_out))])
                if result != Z_OK { return result }
            }
        }
        guard status == Z_STREAM_END else { throw Failure(message: "not a gzip file (zlib status \(status))") }
        return output
    }
}

enum TextBench {
    static func run(_ options: TextBenchOptions, argv: [String]) -> Int32 {
        if options.worker {
            guard let path = options.traces.first, options.traces.count == 1 else {
                writeText(2, "lattice-bench text: error: --worker takes one trace\n")
                return 2
            }
            do {
                let line = measure(try EditingTrace.load(path), repeats: options.repeats)
                LineOutput().emit(line)
                return 0
            } catch {
                writeText(2, "lattice-bench text: error: \(error)\n")
                return 1
            }
        }
        guard var output = LineOutput.forCommand("text", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        var traces = options.traces
        if traces.isEmpty {
            let directory = "Benchmarks/traces"
            traces = ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? [])
                .filter { $0.hasSuffix(".json.gz") || $0.hasSuffix(".json") }.sorted().map { directory + "/" + $0 }
            guard !traces.isEmpty else {
                writeText(2, "lattice-bench text: error: no traces given and none in Benchmarks/traces (run from the project's root)\n")
                return 2
            }
        }
        output.emit([
            "kind": .string("header"), "bench": .string("text"), "started": .string(utcTimestamp()),
            "argv": .array(argv.map { .string($0) }), "machine": .object(MachineInfo.collect()),
            "build": .string(MachineInfo.buildConfiguration),
            "parameters": .object(["traces": .array(traces.map { .string($0) }), "peers": .array(options.peers.map { .string($0) }),
                                   "repeat": .integer(options.repeats),
                                   "service_batch": options.serviceBatch.map { .integer($0) } ?? .null]),
        ])
        var failed = false
        for path in traces {
            guard let line = runProcess("/proc/self/exe", ["text", "--worker", "--repeat", String(options.repeats), path]) else {
                output.emit(["kind": .string("error"), "trace": .string(path), "implementation": .string("lattice"),
                             "error": .string("the replay failed (see stderr)")])
                failed = true
                continue
            }
            output.emit(line)
            if line["final_ok"] != .bool(true) || line["load_ok"] != .bool(true) || line["merge_ok"] != .bool(true) { failed = true }
            if let batch = options.serviceBatch, line["concurrent"] == .bool(false) {
                do {
                    let service = TextServiceBench.run(try EditingTrace.load(path), batch: batch,
                                                       localPatchesPerSecond: line["patches_per_s"]?.doubleValue)
                    output.emit(service)
                    if service["final_ok"] != .bool(true) { failed = true }
                } catch {
                    output.emit(["kind": .string("error"), "trace": .string(path), "implementation": .string("lattice serve"),
                                 "error": .string("\(error)")])
                    failed = true
                }
            }
            for peer in options.peers {
                guard let theirs = runPeer(peer, trace: path, options: options) else {
                    output.emit(["kind": .string("error"), "trace": .string(path), "implementation": .string(peer),
                                 "error": .string("the peer script failed (see stderr)")])
                    continue
                }
                output.emit(theirs)
                output.emit(ratio(ours: line, theirs: theirs))
            }
        }
        return failed ? 1 : 0
    }

    /// Replays `trace` through TextState and measures it.
    static func measure(_ trace: EditingTrace, repeats: Int) -> [String: JSONValue] {
        let before = residentKiB()
        let (replay, (state, half)) = measureSeconds { trace.agents == nil ? replaySequential(trace) : replayConcurrent(trace) }
        let documentKiB = residentKiB() - before
        let final = state.text
        let encoded = state.encoded()
        let halfBytes = half.encoded()

        var loadBest = Double.infinity, mergeBest = Double.infinity
        var loaded = "", merged = ""
        for _ in 0..<repeats {
            let load = measureSeconds { (try? TextState(decoding: encoded))?.text ?? "" }
            loaded = load.result
            loadBest = min(loadBest, load.seconds)
            guard var target = try? TextState(decoding: halfBytes) else { break }
            let merge = measureSeconds { () -> String in
                if let incoming = try? TextState(decoding: encoded) { target.merge(incoming) }
                return target.text
            }
            merged = merge.result
            mergeBest = min(mergeBest, merge.seconds)
        }
        let patches = trace.patchCount
        return [
            "kind": .string("text-trace"), "implementation": .string("lattice"), "trace": .string(trace.name),
            "concurrent": .bool(trace.agents != nil), "transactions": .integer(trace.transactions.count),
            "patches": .integer(patches), "replay_s": SyncBench.rounded(replay, 6),
            "patches_per_s": .double((Double(patches) / replay).rounded()),
            "final_ok": .bool(final == trace.endContent), "load_s": SyncBench.rounded(loadBest, 6),
            "load_ok": .bool(loaded == trace.endContent), "merge_s": SyncBench.rounded(mergeBest, 6),
            "merge_ok": .bool(merged == trace.endContent), "encoded_bytes": .integer(encoded.count),
            "runs": .integer(state.runs.count), "document_rss_kib": .integer(documentKiB),
            "peak_rss_kib": .integer(peakResidentKiB()),
        ]
    }

    static func apply(_ transaction: EditingTrace.Transaction, to state: inout TextState, stamp: Stamp) {
        for patch in transaction.patches {
            do {
                if patch.deleted > 0 { try state.delete(from: patch.position, length: patch.deleted, stamp: stamp) }
                if !patch.inserted.isEmpty { try state.insert(patch.inserted, at: patch.position, stamp: stamp) }
            } catch {
                fatalError("trace patch \(patch.position),\(patch.deleted) does not fit the text: \(error)")
            }
        }
    }

    /// A stamp per transaction: the replay's own clock (one tick per transaction), never the wall clock.
    static func stamp(_ index: Int, agent: Int) -> Stamp {
        Stamp(hlc: HLC(rawValue: (1_764_489_600_000 << 16) + UInt64(index) + 1), replica: ReplicaID(UInt64(agent) + 1))
    }

    static func replaySequential(_ trace: EditingTrace) -> (TextState, TextState) {
        var state = TextState()
        if !trace.startContent.isEmpty { _ = try? state.insert(trace.startContent, at: 0, stamp: stamp(0, agent: 0)) }
        var half = TextState()
        let halfway = trace.transactions.count / 2
        for (index, transaction) in trace.transactions.enumerated() {
            apply(transaction, to: &state, stamp: stamp(index + 1, agent: 0))
            if index + 1 == halfway { half = state }
        }
        return (state, half)
    }

    static func replayConcurrent(_ trace: EditingTrace) -> (TextState, TextState) {
        let transactions = trace.transactions
        // Each kept snapshot is dropped after its last use.
        var uses: [Int: Int] = [:]
        for transaction in transactions {
            for parent in transaction.parents where transactions[parent].agent != transaction.agent { uses[parent, default: 0] += 1 }
        }
        var replicas = [TextState](repeating: TextState(), count: trace.agents ?? 1)
        var snapshots: [Int: TextState] = [:]
        var half = TextState()
        let halfway = transactions.count / 2
        for (index, transaction) in transactions.enumerated() {
            for parent in transaction.parents where transactions[parent].agent != transaction.agent {
                replicas[transaction.agent].merge(snapshots[parent]!)
                uses[parent]! -= 1
                if uses[parent] == 0 { snapshots[parent] = nil }
            }
            apply(transaction, to: &replicas[transaction.agent], stamp: stamp(index + 1, agent: transaction.agent))
            if uses[index] != nil { snapshots[index] = replicas[transaction.agent] }
            if index + 1 == halfway { half = replicas[transaction.agent] }
        }
        var final = replicas[0]
        for replica in replicas.dropFirst() { final.merge(replica) }
        return (final, half)
    }

    static func runPeer(_ peer: String, trace: String, options: TextBenchOptions) -> [String: JSONValue]? {
        runProcess(options.peerPython, [options.peerScript, "--peer", peer, trace])
    }

    /// Runs a program that prints JSON lines and returns its last line (nil when it fails).
    static func runProcess(_ executable: String, _ arguments: [String]) -> [String: JSONValue]? {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        do { try process.run() } catch {
            writeText(2, "lattice-bench text: cannot run \(executable): \(error)\n")
            return nil
        }
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0,
              let line = String(decoding: data, as: UTF8.self).split(separator: "\n").last,
              case .object(let object)? = try? JSONValue.parse(String(line)) else { return nil }
        return object
    }

    static func ratio(ours: [String: JSONValue], theirs: [String: JSONValue]) -> [String: JSONValue] {
        func number(_ line: [String: JSONValue], _ key: String) -> Double? {
            switch line[key] {
            case .double(let value)?: return value
            case .int(let value)?: return Double(value)
            case .uint(let value)?: return Double(value)
            default: return nil
            }
        }
        var line: [String: JSONValue] = ["kind": .string("ratio"), "trace": ours["trace"] ?? .null,
                                         "peer": theirs["implementation"] ?? .null]
        if let a = number(ours, "patches_per_s"), let b = number(theirs, "patches_per_s"), b > 0 {
            line["replay_speedup"] = SyncBench.rounded(a / b, 2)
        }
        for key in ["load_s", "merge_s"] {
            if let a = number(ours, key), let b = number(theirs, key), a > 0 {
                line[key.replacingOccurrences(of: "_s", with: "_speedup")] = SyncBench.rounded(b / a, 2)
            }
        }
        if let a = number(ours, "encoded_bytes"), let b = number(theirs, "encoded_bytes"), b > 0 {
            line["size_ratio"] = SyncBench.rounded(a / b, 3)
        }
        if let a = number(ours, "document_rss_kib"), let b = number(theirs, "document_rss_kib"), b > 0 {
            line["memory_ratio"] = SyncBench.rounded(a / b, 3)
        }
        return line
    }

    /// This process's resident set (VmRSS), in KiB.
    static func residentKiB() -> Int { FanoutBench.residentKiB(getpid()) ?? 0 }

    /// This process's peak resident set (VmHWM). Not getrusage's `ru_maxrss`: on Linux that keeps the peak of
    /// the process this worker was forked from (before its exec), the orchestrator's.
    static func peakResidentKiB() -> Int { ProcStatus.kib("VmHWM") }
}
