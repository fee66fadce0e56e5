import Dispatch
import Foundation
import LatticeCore
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `lattice-bench devices`: many devices, each sending small changes (1 or 2 records a request) through the
/// real client engine, to one `lattice serve` on SQLite; beside the storage ceilings at 1 and 50 rows per
/// commit measured in the same run.
struct DevicesBenchOptions: Sendable {
    var devices = 256
    /// Changes (requests) each device sends.
    var changes = 8
    /// Records per change: 1 or 2.
    var recordsPerChange = 1
    /// Threads that drive the devices (each picks the next device's next change): the requests in flight.
    var drivers = 64
    /// The server's --workers (nil: its default).
    var workers: Int?
    var ceilingRows = 5_000
    var seconds = 60.0
    var timeout = 900.0
    var jsonlPath: String?
    var help = false

    static let usage = """
        usage: lattice-bench devices [--devices N] [--changes N] [--records-per-change 1|2] [--drivers N]
                                     [--workers N] [--ceiling-rows N] [--seconds S] [--timeout S]
                                     [--jsonl FILE]

        Many devices, each with its own account, home (local replica) and client engine (SyncEngine, the
        engine `lattice` runs), send small changes to one `lattice serve` (the lattice executable next to
        lattice-bench; SQLite, WAL, synchronous=FULL). Each change is one local edit of 1 or 2 records
        and one send (the engine's push: one deltas/push request). --drivers threads run the devices at once, each taking the
        next change of the next device, so that many requests are in flight. Prints JSON lines:
          devices   acknowledged records/s, requests/s, the send latency (p50, p99, max), the server's
                    CPU per request (from /proc, during the timed part)
          ceiling   the same frames written straight into SQLite at 1 and at 50 rows per commit
        and a summary with the ratios of the service to both ceilings.

        options:
          --devices N            devices, 1 to 2000 (default 256)
          --changes N            changes each device sends, 1 to 1000 (default 8)
          --records-per-change N 1 or 2 (default 1)
          --drivers N            requests in flight, 1 to 512 (default 64)
          --workers N            the server's --workers (default: its own)
          --ceiling-rows N       rows each ceiling writes, 1 to 1000000 (default 5000)
          --seconds S            time budget of the timed part (default 60)
          --timeout S            the whole run is stopped, server included, after S seconds (default 900)
          --jsonl FILE           also write every JSON line to FILE
          -h, --help             show this help and exit
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> DevicesBenchOptions {
        var options = DevicesBenchOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            switch scanner.name {
            case "--devices": options.devices = try scanner.integer(in: 1...2_000)
            case "--changes": options.changes = try scanner.integer(in: 1...1_000)
            case "--records-per-change": options.recordsPerChange = try scanner.integer(in: 1...2)
            case "--drivers": options.drivers = try scanner.integer(in: 1...512)
            case "--workers": options.workers = try scanner.integer(in: 1...1_024)
            case "--ceiling-rows": options.ceilingRows = try scanner.integer(in: 1...1_000_000)
            case "--seconds": options.seconds = try scanner.seconds()
            case "--timeout": options.timeout = try scanner.seconds()
            case "--jsonl": options.jsonlPath = try scanner.value()
            case "-h", "--help":
                try scanner.flag()
                options.help = true
            default: throw scanner.unknown()
            }
        }
        return options
    }

    var parametersJSON: JSONValue {
        .object(["devices": .int(Int64(devices)), "changes": .int(Int64(changes)),
                 "records_per_change": .int(Int64(recordsPerChange)), "drivers": .int(Int64(drivers)),
                 "workers": workers.map { .int(Int64($0)) } ?? .null, "ceiling_rows": .int(Int64(ceilingRows)),
                 "seconds": .double(seconds)])
    }
}

enum DevicesBench {
    struct Device: Sendable {
        let engine: SyncEngine
        let zone: LocalZone
    }

    static func run(_ options: DevicesBenchOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("devices", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        raiseOpenFileLimitToHard()
        let root = NSTemporaryDirectory() + "lattice-bench-devices-\(getpid())"
        var extra = ["--per-address-connections", "4096", "--connections", "8192"]
        if let workers = options.workers { extra += ["--workers", String(workers)] }
        guard let server = BenchServer.startScratch(command: "devices", root: root, extra: extra, timeout: options.timeout)
        else { return 1 }
        defer {
            server.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
        var header = server.headerLine(bench: "devices", argv: argv, parameters: options.parametersJSON)
        header["record_shape"] = .string("Item: name STRING, n INT64, tags STRING_LIST of 2 (add-wins set)")
        output.emit(header)
        var lines: [[String: JSONValue]] = []
        func emit(_ line: [String: JSONValue]) {
            lines.append(line)
            output.emit(line)
        }
        do {
            let devices = try makeDevices(options.devices, server: server, root: root, drivers: options.drivers)
            let (line, frames) = try measure(devices, options: options, server: server)
            emit(line)
            for batch in [1, 50] {
                let target = max(options.ceilingRows, batch)
                let result = try StorageCeiling.measure(rows: frames, target: target, batch: batch,
                                                        path: root + "/ceiling.sqlite", budgetSeconds: options.seconds)
                var ceiling = SyncBench.measurementLine(scenario: "ceiling", wire: nil, batch: batch, clients: 1,
                                                        records: result.rows, seconds: result.seconds,
                                                        requests: result.transactions, latencies: result.latencies)
                ceiling["what"] = .string("the frames the devices pushed, written straight into SQLite (WAL, synchronous=FULL), "
                                          + "one writer, \(batch) rows per transaction")
                emit(ceiling)
            }
        } catch {
            let message = "\(error)" + BenchServer.logTail(server.logPath)
            emit(["kind": .string("error"), "status": .string("error"), "error": .string(message)])
            writeText(2, "lattice-bench devices: error: \(message)\n")
            return 1
        }
        let service = lines.first { $0["scenario"]?.stringValue == "devices" }
        let ceilings = lines.filter { $0["scenario"]?.stringValue == "ceiling" }
        func rate(_ line: [String: JSONValue]?) -> Double? { line?["records_per_s"]?.doubleValue }
        if let service = rate(service) {
            var summary: [String: JSONValue] = ["kind": .string("summary"), "scenario": .string("devices"),
                                                "records_per_s": .double(service)]
            for ceiling in ceilings {
                guard let batch = ceiling["batch"]?.doubleValue.map(Int.init), let value = rate(ceiling), value > 0 else { continue }
                summary["ceiling_\(batch)_records_per_s"] = .double(value)
                summary["ratio_to_ceiling_\(batch)"] = SyncBench.rounded(service / value, 3)
            }
            output.emit(summary)
        }
        return lines.allSatisfy { $0["status"]?.stringValue == "ok" } ? 0 : 1
    }

    /// One account, home and engine per device, each with its zone made by a first (untimed) sync.
    private static func makeDevices(_ count: Int, server: BenchServer, root: String, drivers: Int) throws -> [Device] {
        let made = Mutex<[Int: Device]>([:])
        let failure = Mutex<(any Error)?>(nil)
        let next = Atomic<Int>(0)
        let group = DispatchGroup()
        for _ in 0..<min(drivers, 16) {
            group.enter()
            Thread {
                defer { group.leave() }
                while failure.withLock({ $0 == nil }) {
                    let index = next.wrappingAdd(1, ordering: .relaxed).oldValue
                    guard index < count else { return }
                    do {
                        let transport = try HTTPTransport(serverURL: server.url)
                        let engine = try SyncEngine(home: root + "/device-\(index)", transport: transport)
                        let accounts = try AccountClient(serverURL: server.url, transport: transport)
                        try engine.signIn(accounts.signUpWaiting(name: "device-\(index)"))
                        let zone = try engine.privateZone("Bench")
                        try edit(engine, zone, "warm-up", count: 1, number: 0)
                        let report = try engine.sync()
                        guard report.online, report.queued == 0 else {
                            throw SystemError.message("device \(index): the warm-up sync was not acknowledged (\(report))")
                        }
                        made.withLock { $0[index] = Device(engine: engine, zone: zone) }
                    } catch {
                        failure.withLock { $0 = $0 ?? error }
                    }
                }
            }.start()
        }
        group.wait()
        if let error = failure.withLock({ $0 }) { throw error }
        return made.withLock { devices in (0..<count).map { devices[$0]! } }
    }

    private static func edit(_ engine: SyncEngine, _ zone: LocalZone, _ name: String, count: Int, number: Int) throws {
        for item in 0..<count {
            try engine.edit("\(name)-\(item)", in: zone, creating: "Item") { record, stamp in
                try record.set("name", to: .string("item \(name)-\(item)"), at: stamp())
                try record.set("n", to: .int64(Int64(number)), at: stamp())
                try record.add([.string("alpha"), .string("tag\(item)")], to: "tags", at: stamp())
            }
        }
    }

    /// The timed part: every device's changes, `drivers` at a time; and the frames they wrote (for the ceiling).
    private static func measure(_ devices: [Device], options: DevicesBenchOptions, server: BenchServer) throws
        -> ([String: JSONValue], [CeilingRow]) {
        let total = devices.count * options.changes
        let next = Atomic<Int>(0)
        let acknowledged = Atomic<Int>(0)
        let latencies = Mutex<[Double]>([])
        let failure = Mutex<String?>(nil)
        let deadline = Date().addingTimeInterval(options.seconds)
        let cpuBefore = cpuTicks([server.pid])
        let started = Date()
        let group = DispatchGroup()
        for _ in 0..<options.drivers {
            group.enter()
            Thread {
                defer { group.leave() }
                var mine: [Double] = []
                while failure.withLock({ $0 == nil }), Date() < deadline {
                    let job = next.wrappingAdd(1, ordering: .relaxed).oldValue
                    guard job < total else { break }
                    // Job j is change j / devices of device j % devices: every device's first change, then the
                    // seconds, so one device is never driven by two threads at once.
                    let device = devices[job % devices.count], change = job / devices.count
                    do {
                        try edit(device.engine, device.zone, "c\(change)", count: options.recordsPerChange, number: change)
                        let sent = Date()
                        var report = SyncReport()
                        try device.engine.send(&report)
                        mine.append(Date().timeIntervalSince(sent))
                        guard report.sent == options.recordsPerChange, report.rejected.isEmpty else {
                            failure.withLock { $0 = $0 ?? "a change was not acknowledged: \(report)" }
                            break
                        }
                        acknowledged.wrappingAdd(report.sent, ordering: .relaxed)
                    } catch {
                        failure.withLock { $0 = $0 ?? "\(error)" }
                    }
                }
                latencies.withLock { $0 += mine }
            }.start()
        }
        group.wait()
        let seconds = Date().timeIntervalSince(started)
        let cpuAfter = cpuTicks([server.pid])
        let requests = latencies.withLock { $0.count }
        var line = SyncBench.measurementLine(scenario: "devices", wire: .binary, batch: options.recordsPerChange,
                                             clients: options.drivers, records: acknowledged.load(ordering: .relaxed),
                                             seconds: seconds, requests: requests, latencies: latencies.withLock { $0 })
        line["devices"] = .int(Int64(devices.count))
        line["drivers"] = .int(Int64(options.drivers))
        if let before = cpuBefore, let after = cpuAfter, requests > 0 {
            let ticks = Double(sysconf(Int32(_SC_CLK_TCK)))
            let cpuSeconds = Double(after - before) / ticks
            line["server_cpu_s"] = SyncBench.rounded(cpuSeconds, 3)
            line["server_cpu_us_per_request"] = SyncBench.rounded(cpuSeconds / Double(requests) * 1e6, 1)
        }
        line["what"] = .string("\(devices.count) devices (SyncEngine, one account and replica each) each send "
                               + "\(options.changes) changes of \(options.recordsPerChange) record(s), one deltas/push request each, "
                               + "\(options.drivers) in flight; latency = one send (the engine's push, no fetch)")
        if let message = failure.withLock({ $0 }) {
            line["status"] = .string("error")
            line["error"] = .string(message)
        }
        // The frames for the ceiling: each device's records as its replica holds them.
        var frames: [CeilingRow] = []
        for (index, device) in devices.enumerated().prefix(64) {
            for record in try device.engine.records(in: device.zone) where record.id.recordName != "warm-up-0" {
                frames.append(CeilingRow(zone: Int64(index + 1), name: record.id.recordName, frame: try BinaryCodec.encode(record)))
            }
        }
        return (line, frames)
    }
}
