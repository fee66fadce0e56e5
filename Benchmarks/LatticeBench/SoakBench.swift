// `lattice-bench soak`: a real `lattice serve` (the `lattice` binary next to this one) under mixed traffic
// from N clients for M minutes; one JSON line per interval with p50/p99 per operation kind, requests,
// errors, and the server's memory, open files, connections and database size. Flat figures mean no leak.

import Foundation
import LatticeCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

struct SoakOptions: Sendable {
    var minutes = 10.0
    var clients = 32
    /// Seconds between two report lines.
    var interval = 60.0
    var seed: UInt64 = 42
    var jsonlPath: String?
    var help = false

    static let usage = """
        usage: lattice-bench soak [--minutes M] [--clients N] [--interval S] [--seed S] [--jsonl FILE]

        Soak benchmark. Starts `lattice serve` (the lattice executable next to lattice-bench) on 127.0.0.1
        with a fresh data directory and runs N clients (one account, one zone and one keep-alive connection
        each) for M minutes, each looping over a seeded mix of:
          write    records/modify of 1 to 200 records (forceReplace over a pool of 2,000 names per client,
                   so the data set stops growing once the pool is written)
          query    records/query on the client's zone, one filter, resultsLimit 50
          lookup   records/lookup of 10 records
          feed     changes/zone from the client's last sync token
          wait     changes/wait with a 1 s timeout (a long poll; its latency is mostly the wait)
        Prints JSON lines: a header; one `interval` line every S seconds with, per operation kind, the
        requests, errors, p50 and p99 in ms, and the server's RSS (VmRSS), open files (/proc/PID/fd),
        sockets among them, established connections to its port, and the data directory's bytes; then a
        summary comparing the first and the last full interval, and the server's counters once every client
        has gone. Flat memory, files and connections mean no leak. The clients' requests still running at the
        end make a short last line marked "partial": true.

        options:
          --minutes M     how long the traffic runs, fractions allowed (default 10; 0.5 for a quick check)
          --clients N     concurrent clients, 1 to 256 (default 32)
          --interval S    seconds between report lines, 1 to 3600 (default 60)
          --seed S        seed of the traffic mix (default 42)
          --jsonl FILE    also write every JSON line to FILE
          -h, --help      show this help and exit

        Build both executables in release first:
          swift build -c release

        exit status: 0 when the run completed with under 1 % errors, 1 otherwise, 2 for a bad command line.
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> SoakOptions {
        var options = SoakOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            let name = scanner.name, argument = scanner.argument
            func value() throws(UsageError) -> String { try scanner.value() }
            func number(_ range: ClosedRange<Double>) throws(UsageError) -> Double {
                let text = try value()
                guard let number = Double(text), number.isFinite, range.contains(number), number > 0 else {
                    throw UsageError(message: "\(name) must be a number above 0 and at most \(Int(range.upperBound)), got '\(text)'")
                }
                return number
            }
            switch name {
            case "-h", "--help":
                try scanner.flag()
                options.help = true
            case "--minutes": options.minutes = try number(0...1440)
            case "--interval": options.interval = try number(1...3600)
            case "--clients":
                let text = try value()
                guard let count = Int(text), (1...256).contains(count) else {
                    throw UsageError(message: "--clients must be 1 to 256, got '\(text)'")
                }
                options.clients = count
            case "--seed":
                let text = try value()
                guard let seed = UInt64(text) else { throw UsageError(message: "--seed expects a non-negative integer, got '\(text)'") }
                options.seed = seed
            case "--jsonl":
                let path = try value()
                guard !path.isEmpty else { throw UsageError(message: "--jsonl expects a file name") }
                options.jsonlPath = path
            default:
                if argument.hasPrefix("-") { throw UsageError(message: "unrecognized option \(argument)") }
                throw UsageError(message: "unexpected argument \(argument)")
            }
        }
        return options
    }

    var parametersJSON: JSONValue {
        .object(["minutes": .double(minutes), "clients": .integer(clients), "interval_s": .double(interval),
                 "seed": .uint(seed)])
    }
}

enum SoakBench {
    static let kinds = ["write", "query", "lookup", "feed", "wait"]
    static let namePool = 2_000
    static let zoneName = "Soak"

    static func run(_ options: SoakOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("soak", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        let root = NSTemporaryDirectory() + "lattice-bench-soak-\(getpid())"
        let data = root + "/server"
        let server: BenchServer
        var tokens: [String] = []
        do {
            let binary = try BenchServer.binaryNextToSelf()
            try? FileManager.default.removeItem(atPath: root)
            for directory in [root, data] {
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            }
            // Accounts through `lattice admin add-user` (sign-up has its own limits, not measured here).
            for index in 0..<options.clients { tokens.append(try addUser(binary: binary, name: "soak-\(index)", data: data)) }
            server = try BenchServer(binary: binary, data: data, logPath: root + "/server.log", scratchDirectory: root)
        } catch {
            writeText(2, "lattice-bench soak: error: \(error)\n")
            try? FileManager.default.removeItem(atPath: root)
            return 1
        }
        defer {
            server.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
        let budget = options.minutes * 60
        DispatchQueue.global().asyncAfter(deadline: .now() + budget + 300) {
            writeText(2, "lattice-bench soak: error: the run overran its \(Int(budget)) s by 300 s; stopping the server\n")
            server.stop(graceSeconds: 2)
            try? FileManager.default.removeItem(atPath: root)
            exit(1)
        }
        output.emit([
            "kind": .string("header"), "bench": .string("soak"), "started": .string(utcTimestamp()),
            "argv": .array(argv.map { .string($0) }), "machine": .object(MachineInfo.collect()),
            "build": .string(MachineInfo.buildConfiguration), "parameters": options.parametersJSON,
            "server": .object(["binary": .string(server.binary), "url": .string(server.url), "pid": .integer(server.pid)]),
            "operations": .array(kinds.map { .string($0) }),
            "mix": .string("per iteration, by seeded draw: write 35 % (1-200 records: 1 at 50 %, 2-20 at 35 %, 21-200 at 15 %), "
                           + "query 20 %, lookup 15 %, feed 20 %, wait 10 %"),
        ])

        let stats = SoakStats()
        let group = DispatchGroup()
        let began = monotonicNanoseconds()
        let end = began &+ UInt64(budget * 1e9)
        for index in 0..<options.clients {
            group.enter()
            let token = tokens[index]
            let seed = options.seed &* 1_000 &+ UInt64(index)
            let port = server.port
            let thread = Thread {
                defer { group.leave() }
                runClient(port: port, token: token, seed: seed, end: end, stats: stats)
            }
            thread.stackSize = 1 << 20
            thread.start()
        }

        // Report every interval until the clients are done.
        var lines: [[String: JSONValue]] = []
        var serverDied = false
        var intervalIndex = 0
        var lastReport = began
        while true {
            let next = lastReport &+ UInt64(options.interval * 1e9)
            let before = monotonicNanoseconds()
            let finished = group.wait(timeout: .now() + .nanoseconds(Int(next > before ? next - before : 0))) == .success
            let now = monotonicNanoseconds()
            intervalIndex += 1
            var line = intervalLine(index: intervalIndex, seconds: Double(now - lastReport) / 1e9, elapsed: Double(now - began) / 1e9,
                                    stats: stats, server: server, data: data)
            lastReport = now
            if line["server_rss_mib"] == .null { serverDied = true }
            // The clients' last requests after the end: a short tail, kept apart from the full intervals.
            line["partial"] = .bool(finished && Double(now - began) / 1e9 > budget)
            lines.append(line)
            output.emit(line)
            if finished || serverDied { break }
            // A client still in a request a minute after the end: stop them all (their requests time out at 30 s).
            if now > end &+ 60_000_000_000 { stats.stopping.store(true, ordering: .releasing) }
        }
        stats.stopping.store(true, ordering: .releasing)
        group.wait()

        let totals = stats.total
        let errorRate = totals.requests == 0 ? 1 : Double(totals.errors) / Double(totals.requests)
        var summary: [String: JSONValue] = [
            "kind": .string("summary"), "bench": .string("soak"), "intervals": .integer(lines.count),
            "requests": .integer(totals.requests), "errors": .integer(totals.errors),
            "error_rate": .double((errorRate * 1e6).rounded() / 1e6),
            "seconds": .double((Double(monotonicNanoseconds() - began) / 1e9 * 1000).rounded() / 1000),
            "status": .string(!serverDied && errorRate < 0.01 ? "ok" : "error"),
        ]
        // First and last full interval side by side (flat means no leak), and the server once every client
        // has gone (its descriptors and sockets should be back to the listening socket and the database).
        let full = lines.filter { $0["partial"] != .bool(true) }
        if let first = full.first ?? lines.first, let last = full.last ?? lines.last {
            for key in ["server_rss_mib", "server_open_files", "server_sockets", "server_connections", "data_bytes"] {
                summary["first_" + key] = first[key] ?? .null
                summary["last_" + key] = last[key] ?? .null
            }
        }
        let after = ServerCounters.descriptors(pid: server.pid)
        summary["end_server_open_files"] = after.open < 0 ? .null : .integer(after.open)
        summary["end_server_sockets"] = after.sockets < 0 ? .null : .integer(after.sockets)
        summary["end_server_connections"] = .integer(ServerCounters.establishedConnections(port: server.port))
        summary["end_server_rss_mib"] = server.statusKiB("VmRSS") < 0 ? .null : .double((Double(server.statusKiB("VmRSS")) / 1024 * 10).rounded() / 10)
        if serverDied { summary["error"] = .string("the server process ended during the run" + BenchServer.logTail(server.logPath)) }
        output.emit(summary)
        return summary["status"]?.stringValue == "ok" ? 0 : 1
    }

    /// `lattice admin add-user NAME --data DATA --json`: the new account's token.
    private static func addUser(binary: String, name: String, data: String) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["admin", "add-user", name, "--data", data, "--json"]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = FileHandle.nullDevice
        try process.run()
        let bytes = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        guard process.terminationStatus == 0, let token = try? JSON.parse([UInt8](bytes))["token"]?.stringValue else {
            throw SystemError.message("lattice admin add-user \(name) failed (status \(process.terminationStatus))")
        }
        return token
    }

    private static func intervalLine(index: Int, seconds: Double, elapsed: Double, stats: SoakStats, server: BenchServer,
                                     data: String) -> [String: JSONValue] {
        let (interval, totalRequests, totalErrors) = stats.take()
        var operations: [String: JSONValue] = [:]
        var requests = 0, errors = 0
        for kind in kinds {
            let latencies = interval.latencies[kind] ?? []
            let failed = interval.errors[kind] ?? 0
            requests += latencies.count
            errors += failed
            operations[kind] = .object([
                "requests": .integer(latencies.count), "errors": .integer(failed),
                "p50_ms": percentile(latencies, 0.50).map { .double(($0 * 1e6).rounded() / 1000) } ?? .null,
                "p99_ms": percentile(latencies, 0.99).map { .double(($0 * 1e6).rounded() / 1000) } ?? .null,
            ])
        }
        let rss = server.statusKiB("VmRSS")
        let descriptors = ServerCounters.descriptors(pid: server.pid)
        var line: [String: JSONValue] = [
            "kind": .string("interval"), "bench": .string("soak"), "interval": .integer(index),
            "seconds": .double((seconds * 1000).rounded() / 1000), "elapsed_s": .double((elapsed * 1000).rounded() / 1000),
            "requests": .integer(requests), "errors": .integer(errors),
            "requests_per_s": seconds > 0 ? .double((Double(requests) / seconds * 10).rounded() / 10) : .null,
            "total_requests": .integer(totalRequests), "total_errors": .integer(totalErrors),
            "operations": .object(operations),
            "server_rss_mib": rss < 0 ? .null : .double((Double(rss) / 1024 * 10).rounded() / 10),
            "server_open_files": descriptors.open < 0 ? .null : .integer(descriptors.open),
            "server_sockets": descriptors.sockets < 0 ? .null : .integer(descriptors.sockets),
            "server_connections": .integer(ServerCounters.establishedConnections(port: server.port)),
            "data_bytes": .integer(ServerCounters.directoryBytes(data)),
        ]
        if !interval.errorKinds.isEmpty { line["error_kinds"] = .object(interval.errorKinds.mapValues { .integer($0) }) }
        return line
    }

    // MARK: One client

    private static func runClient(port: UInt16, token: String, seed: UInt64, end: UInt64, stats: SoakStats) {
        var random = SplitMix64(seed: seed)
        let connection = SoakConnection(port: port, timeoutSeconds: 30)
        let base = "/database/1/lattice/production/private/"
        let zone: JSON = .object(["zoneName": .string(zoneName)])
        var syncToken: JSON = .null

        /// One timed request; an answer outside 2xx, or a per-record error, is an error of its kind.
        func call(_ kind: String, _ operation: String, _ body: JSON) -> JSON? {
            let began = monotonicNanoseconds()
            var failure: String?
            var parsed: JSON?
            do {
                let answer = try connection.post(base + operation, token: token, body: body.serializedBytes())
                parsed = try? JSON.parse(answer.body)
                if !(200..<300).contains(answer.status) {
                    failure = "\(operation) \(answer.status) \(parsed?["serverErrorCode"]?.stringValue ?? "")"
                } else if let code = (parsed?["records"]?.arrayValue ?? []).lazy.compactMap({ $0["serverErrorCode"]?.stringValue })
                    .first(where: { $0 != "NOT_FOUND" }) {
                    failure = "\(operation) item \(code)"
                }
            } catch {
                failure = "\(operation) transport: \(error)".prefix(120).description
            }
            stats.record(kind, seconds: Double(monotonicNanoseconds() - began) / 1e9, error: failure)
            return failure == nil ? parsed : nil
        }

        // The client's zone (untimed setup).
        _ = try? connection.post(base + "zones/modify", token: token, body: JSON.object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": zone])]),
        ])]).serializedBytes())
        var iteration = 0
        while monotonicNanoseconds() < end && !stats.stopping.load(ordering: .acquiring) {
            iteration += 1
            let draw = random.below(100)
            switch draw {
            case 0..<35:
                let sizeDraw = random.below(100)
                let count = sizeDraw < 50 ? 1 : (sizeDraw < 85 ? 2 + random.below(19) : 21 + random.below(180))
                let first = random.below(namePool)
                let operations: [JSON] = (0..<count).map { offset in
                    let number = (first + offset) % namePool
                    return .object(["operationType": .string("forceReplace"), "record": .object([
                        "recordName": .string("r\(number)"), "recordType": .string("Item"),
                        "fields": .object([
                            "n": .object(["value": .int(Int64(number))]),
                            "title": .object(["value": .string("item \(number) v\(iteration)")]),
                            "tags": .object(["value": .array([.string("t\(number % 16)"), .string("v\(iteration % 8)")]),
                                             "type": .string("STRING_LIST")]),
                        ]),
                    ])])
                }
                _ = call("write", "records/modify", .object(["zoneID": zone, "operations": .array(operations)]))
            case 35..<55:
                let low = random.below(namePool)
                _ = call("query", "records/query", .object(["zoneID": zone, "resultsLimit": .int(50), "query": .object([
                    "recordType": .string("Item"),
                    "filterBy": .array([.object(["fieldName": .string("n"), "comparator": .string("GREATER_THAN_OR_EQUALS"),
                                                 "fieldValue": .object(["value": .int(Int64(low))])])]),
                ])]))
            case 55..<70:
                // Ten distinct names: the server refuses a lookup that names a record twice.
                var picked: [Int] = []
                while picked.count < 10 {
                    let index = random.below(namePool)
                    if !picked.contains(index) { picked.append(index) }
                }
                let names: [JSON] = picked.map { .object(["recordName": .string("r\($0)")]) }
                _ = call("lookup", "records/lookup", .object(["zoneID": zone, "records": .array(names)]))
            case 70..<90:
                var request: [String: JSON] = ["zoneID": zone, "resultsLimit": .int(200)]
                if syncToken != .null { request["syncToken"] = syncToken }
                if let reply = call("feed", "changes/zone", .object(["zones": .array([.object(request)])])),
                   let first = reply["zones"]?.arrayValue?.first, let next = first["syncToken"] {
                    syncToken = next
                }
            default:
                _ = call("wait", "changes/wait", .object(["timeout": .int(1)]))
            }
        }
    }
}
