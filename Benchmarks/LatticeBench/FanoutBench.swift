import Dispatch
import Foundation
import LatticeCore
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `lattice-bench fanout`: one `lattice serve` holding many idle push streams, 2 per participant of one
/// share among them; a write to the share, repeated: how long until every participant's device has its
/// notification; the server's resident memory per idle stream and its CPU while idle.
struct FanoutBenchOptions: Sendable {
    var connections = 10_000
    var participants = 100
    var rounds = 20
    var idleSeconds = 35.0
    var timeout = 1_200.0
    var jsonlPath: String?
    var help = false

    static let devicesPerParticipant = 2
    /// Device tokens one idle account holds (the server allows 100 tokens an account, its first included).
    static let devicesPerIdleAccount = 99

    static let usage = """
        usage: lattice-bench fanout [--connections N] [--participants N] [--rounds N] [--idle-seconds S]
                                    [--timeout S] [--jsonl FILE]

        Starts `lattice serve` (SQLite) and opens --connections push streams (GET /push/{token}, server-sent
        events) from one epoll thread on 127.0.0.1: 2 devices for each of --participants participants of one
        zone-wide share, the owner included (each has a database subscription: the participants of their shared
        database, the owner of the private one; the owner writes from a third device), the rest
        devices of other accounts (99 each), idle. Then:
          memory   the server's resident memory before and after the streams opened, per stream
          idle     the server's CPU over --idle-seconds with every stream open and no traffic (one
                   heartbeat falls in the default 35 s)
          fanout   --rounds writes by the share's owner, one at a time: the time from the write's answer
                   until each participant device's stream has its notification (p50, p99, max per round
                   and over all rounds)

        options:
          --connections N   push streams, 2 x participants to 19000 (default 10000)
          --participants N  members of the share, the owner included, 2 to 100 (default 100: a share's
                            most); 2 devices each listen (the owner writes from a third)
          --rounds N        writes measured, 1 to 1000 (default 20)
          --idle-seconds S  the idle CPU window (default 35)
          --timeout S       the whole run is stopped, server included, after S seconds (default 1200)
          --jsonl FILE      also write every JSON line to FILE
          -h, --help        show this help and exit
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> FanoutBenchOptions {
        var options = FanoutBenchOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            switch scanner.name {
            case "--connections": options.connections = try scanner.integer(in: 2...19_000)
            case "--participants": options.participants = try scanner.integer(in: 2...100)
            case "--rounds": options.rounds = try scanner.integer(in: 1...1_000)
            case "--idle-seconds": options.idleSeconds = try scanner.seconds()
            case "--timeout": options.timeout = try scanner.seconds()
            case "--jsonl": options.jsonlPath = try scanner.value()
            case "-h", "--help":
                try scanner.flag()
                options.help = true
            default: throw scanner.unknown()
            }
        }
        guard options.connections >= options.participants * devicesPerParticipant else {
            throw UsageError(message: "--connections must be at least 2 x --participants")
        }
        return options
    }

    var parametersJSON: JSONValue {
        .object(["connections": .int(Int64(connections)), "participants": .int(Int64(participants)),
                 "rounds": .int(Int64(rounds)), "idle_seconds": .double(idleSeconds)])
    }
}

enum FanoutBench {
    /// A JSON POST through the client library's transport; the answer's JSON (non-200 throws).
    struct API: Sendable {
        let transport: HTTPTransport
        let base = "/database/1/lattice/production/"

        func post(_ path: String, _ body: JSON, token: String? = nil) throws -> JSON {
            var headers = ["Content-Type": "application/json"]
            if let token { headers["Authorization"] = "Bearer " + token }
            let response = try transport.sendBlocking(TransportRequest(method: "POST", path: path, headers: headers,
                                                                       body: body.serializedBytes()), timeout: 30)
            let json = (try? JSON.parse(response.body)) ?? .null
            guard response.status == 200 else {
                throw SystemError.message("\(path): \(response.status) \(String(decoding: response.body.prefix(300), as: UTF8.self))")
            }
            return json
        }

        func call(_ database: String, _ operation: String, _ body: JSON, token: String) throws -> JSON {
            try post(base + database + "/" + operation, body, token: token)
        }

        func signUp(_ name: String) throws -> String {
            guard let token = try post("/auth/signup", .object(["name": .string(name)]))["token"]?.stringValue else {
                throw SystemError.message("signup \(name): no token")
            }
            return token
        }

        /// A new device of the account (its own bearer token) and its registered push token.
        func device(of token: String) throws -> String {
            guard let device = try call("private", "tokens/issue", .object([:]), token: token)["token"]?.stringValue else {
                throw SystemError.message("tokens/issue: no token")
            }
            return try pushToken(device)
        }

        func pushToken(_ device: String) throws -> String {
            let made = try call("private", "tokens/create", .object(["apnsEnvironment": .string("production")]), token: device)
            guard let push = made["apnsToken"]?.stringValue else { throw SystemError.message("tokens/create: no token") }
            _ = try call("private", "tokens/register", .object(["apnsEnvironment": .string("production"),
                                                                "apnsToken": .string(push)]), token: device)
            return push
        }
    }

    static func run(_ options: FanoutBenchOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("fanout", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        raiseOpenFileLimitToHard()
        let root = NSTemporaryDirectory() + "lattice-bench-fanout-\(getpid())"
        let streams = String(options.connections + 100)
        guard let server = BenchServer.startScratch(
            command: "fanout", root: root,
            extra: ["--per-address-connections", streams, "--connections", streams, "--push-streams-per-address", streams,
                    "--push-streams-per-user", "200", "--requests-per-second-per-account", "0", "--connection-memory-kib", "16"],
            timeout: options.timeout) else { return 1 }
        defer {
            server.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
        output.emit(server.headerLine(bench: "fanout", argv: argv, parameters: options.parametersJSON))
        do {
            let port = UInt16(server.url.split(separator: ":").last.map(String.init) ?? "") ?? 0
            let api = API(transport: try HTTPTransport(serverURL: server.url))
            // The share: an owner's zone, shared zone-wide read-write; each participant accepts and subscribes.
            let owner = try api.signUp("owner")
            _ = try api.call("private", "zones/modify", .object(["operations": .array([.object([
                "operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Shared")])])])])]),
                             token: owner)
            _ = try api.call("private", "shares/create", .object(["zoneID": .object(["zoneName": .string("Shared")]),
                                                                   "publicPermission": .string("readWrite")]), token: owner)
            guard let url = try api.call("private", "shares/url", .object(["zoneID": .object(["zoneName": .string("Shared")])]),
                                         token: owner)["url"]?.stringValue else { throw SystemError.message("no share url") }
            let setupStarted = Date()
            // The owner is one of the share's members: two devices of theirs listen too (a database subscription of
            // their private database); the writes come from a third.
            _ = try api.call("private", "subscriptions/modify", .object(["operations": .array([.object([
                "operationType": .string("create"), "subscription": .object([
                    "subscriptionID": .string("mine"), "subscriptionType": .string("database")])])])]), token: owner)
            var watched: [String] = try (0..<FanoutBenchOptions.devicesPerParticipant).map { _ in try api.device(of: owner) }
            for index in 0..<(options.participants - 1) {
                let token = try api.signUp("participant-\(index)")
                _ = try api.call("shared", "records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                 token: token)
                _ = try api.call("shared", "subscriptions/modify", .object(["operations": .array([.object([
                    "operationType": .string("create"), "subscription": .object([
                        "subscriptionID": .string("shared"), "subscriptionType": .string("database")])])])]), token: token)
                for _ in 0..<FanoutBenchOptions.devicesPerParticipant { watched.append(try api.device(of: token)) }
            }
            // The idle devices, from several threads (setup, not measured).
            let idleCount = options.connections - watched.count
            let accounts = (idleCount + FanoutBenchOptions.devicesPerIdleAccount - 1) / FanoutBenchOptions.devicesPerIdleAccount
            let idle = Mutex<[String]>([])
            let failure = Mutex<String?>(nil)
            let group = DispatchGroup()
            for account in 0..<accounts {
                group.enter()
                DispatchQueue.global().async {
                    defer { group.leave() }
                    do {
                        let client = API(transport: try HTTPTransport(serverURL: server.url))
                        let token = try client.signUp("idle-\(account)")
                        let count = min(FanoutBenchOptions.devicesPerIdleAccount,
                                        idleCount - account * FanoutBenchOptions.devicesPerIdleAccount)
                        var mine: [String] = []
                        for _ in 0..<count { mine.append(try client.device(of: token)) }
                        idle.withLock { $0 += mine }
                    } catch {
                        failure.withLock { $0 = $0 ?? "\(error)" }
                    }
                }
            }
            group.wait()
            if let message = failure.withLock({ $0 }) { throw SystemError.message(message) }
            output.emit(["kind": .string("setup"), "devices": .int(Int64(watched.count + idleCount)),
                         "seconds": SyncBench.rounded(Date().timeIntervalSince(setupStarted), 1)])

            Thread.sleep(forTimeInterval: 1)
            let rssBefore = residentKiB(server.pid)
            // The idle streams on one thread (polling rarely), the timed ones on another.
            let openStarted = Date()
            let quiet = try StreamClient(port: port, tokens: idle.withLock { $0 }, watched: 0, pollTimeoutMilliseconds: 500)
            defer { quiet.stop() }
            guard quiet.waitUntilReady(seconds: 180) else {
                throw SystemError.message("only \(quiet.readyCount) of \(idleCount) idle streams opened: " + quiet.failureSummary)
            }
            let streams = try StreamClient(port: port, tokens: watched, watched: watched.count)
            defer { streams.stop() }
            guard streams.waitUntilReady(seconds: 60) else {
                throw SystemError.message("only \(streams.readyCount) of \(watched.count) streams opened: " + streams.failureSummary)
            }
            let openSeconds = Date().timeIntervalSince(openStarted)
            Thread.sleep(forTimeInterval: 2)
            let rssAfter = residentKiB(server.pid)
            var memory: [String: JSONValue] = ["kind": .string("measurement"), "scenario": .string("memory"),
                                               "streams": .int(Int64(options.connections)),
                                               "open_seconds": SyncBench.rounded(openSeconds, 2), "status": .string("ok")]
            if let before = rssBefore, let after = rssAfter {
                memory["server_rss_before_kib"] = .int(Int64(before))
                memory["server_rss_after_kib"] = .int(Int64(after))
                memory["server_rss_per_stream_bytes"] = SyncBench.rounded(Double(after - before) * 1024 / Double(options.connections), 0)
            }
            output.emit(memory)

            // Idle: every stream open, nothing written.
            let idleBefore = cpuTicks([server.pid])
            let idleStarted = Date()
            Thread.sleep(forTimeInterval: options.idleSeconds)
            let idleAfter = cpuTicks([server.pid])
            let idleElapsed = Date().timeIntervalSince(idleStarted)
            var idleLine: [String: JSONValue] = ["kind": .string("measurement"), "scenario": .string("idle"),
                                                 "streams": .int(Int64(options.connections)),
                                                 "seconds": SyncBench.rounded(idleElapsed, 1), "status": .string("ok")]
            if let before = idleBefore, let after = idleAfter {
                let cpu = Double(after - before) / Double(sysconf(Int32(_SC_CLK_TCK)))
                idleLine["server_cpu_s"] = SyncBench.rounded(cpu, 3)
                idleLine["server_cpu_percent_of_one_core"] = SyncBench.rounded(cpu / idleElapsed * 100, 2)
            }
            idleLine["streams_still_open"] = .int(Int64(streams.openCount + quiet.openCount))
            output.emit(idleLine)

            // Fanout rounds.
            var all: [Double] = []
            var missed = 0
            for round in 0..<options.rounds {
                streams.resetRound()
                let written = Date()
                _ = try api.call("private", "records/modify", .object([
                    "zoneID": .object(["zoneName": .string("Shared")]),
                    "operations": .array([.object(["operationType": .string("create"), "record": .object([
                        "recordName": .string("r\(round)"), "recordType": .string("Item"),
                        "fields": .object(["n": .object(["value": .int(Int64(round))])])])])]),
                ]), token: owner)
                let latencies = streams.waitForRound(since: written, seconds: 10)
                missed += watched.count - latencies.count
                all += latencies
                let sorted = latencies.sorted()
                output.emit(["kind": .string("measurement"), "scenario": .string("fanout"), "round": .int(Int64(round)),
                             "devices": .int(Int64(watched.count)), "notified": .int(Int64(latencies.count)),
                             "p50_ms": SyncBench.rounded(percentile(sorted, 0.5) * 1000, 2),
                             "p99_ms": SyncBench.rounded(percentile(sorted, 0.99) * 1000, 2),
                             "max_ms": SyncBench.rounded((sorted.last ?? 0) * 1000, 2),
                             "status": .string(latencies.count == watched.count ? "ok" : "missed")])
                Thread.sleep(forTimeInterval: 0.2)
            }
            let sorted = all.sorted()
            output.emit(["kind": .string("summary"), "scenario": .string("fanout"), "streams": .int(Int64(options.connections)),
                         "devices_per_write": .int(Int64(watched.count)), "rounds": .int(Int64(options.rounds)),
                         "missed": .int(Int64(missed)),
                         "p50_ms": SyncBench.rounded(percentile(sorted, 0.5) * 1000, 2),
                         "p99_ms": SyncBench.rounded(percentile(sorted, 0.99) * 1000, 2),
                         "max_ms": SyncBench.rounded((sorted.last ?? 0) * 1000, 2),
                         "server_rss_per_stream_bytes": memory["server_rss_per_stream_bytes"] ?? .null,
                         "idle_cpu_percent_of_one_core": idleLine["server_cpu_percent_of_one_core"] ?? .null,
                         "what": .string("a write to a zone shared with \(options.participants) participants (2 devices each) "
                                         + "while \(options.connections) push streams are open: time from the write's answer "
                                         + "to each device's `event: notification`")])
            return missed == 0 ? 0 : 1
        } catch {
            let message = "\(error)" + BenchServer.logTail(server.logPath)
            output.emit(["kind": .string("error"), "status": .string("error"), "error": .string(message)])
            writeText(2, "lattice-bench fanout: error: \(message)\n")
            return 1
        }
    }

    static func percentile(_ sorted: [Double], _ fraction: Double) -> Double {
        guard !sorted.isEmpty else { return 0 }
        return sorted[min(sorted.count - 1, Int((Double(sorted.count) * fraction).rounded(.down)))]
    }

    /// VmRSS of a process, in KiB.
    static func residentKiB(_ pid: pid_t) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return Int(line.split(separator: " ").dropFirst().first ?? "")
        }
        return nil
    }
}

/// Many push streams on one poll thread: connects in waves, sends each GET, and scans what arrives for
/// `event: ready` and `event: notification` (keeping only the last few bytes of each connection).
final class StreamClient: @unchecked Sendable {
    // @unchecked: `state` is guarded by `lock`; `connections` is touched only by the poll thread (`run`), which
    // owns it (the initializer fills it before the thread starts); `thread` only by the owner.
    private struct Connection {
        var fd: Int32 = -1
        var request: [UInt8] = []
        var sent = 0
        var tail: [UInt8] = []
        var ready = false
        var closed = false
    }

    private struct State {
        var ready = 0
        var open = 0
        var roundTimes: [Int: Double] = [:]
        var failures: [String: Int] = [:]
        var stopped = false
    }

    private let lock = NSLock()
    private var state = State()
    private var connections: [Connection]
    private let watched: Int
    private let port: UInt16
    private let pollTimeoutMilliseconds: Int32
    private var thread: Thread?

    /// `watched`: the first `watched` tokens' notifications are timed. `pollTimeoutMilliseconds`: how long one
    /// poll waits when nothing happens (the idle streams' client polls rarely).
    init(port: UInt16, tokens: [String], watched: Int, pollTimeoutMilliseconds: Int32 = 20) throws {
        self.port = port
        self.watched = watched
        self.pollTimeoutMilliseconds = pollTimeoutMilliseconds
        connections = tokens.map { token in
            Connection(request: Array("GET /push/\(token) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n".utf8))
        }
        let thread = Thread { [self] in run() }
        thread.name = "fanout-streams"
        self.thread = thread
        thread.start()
    }

    var readyCount: Int { lock.withLock { state.ready } }
    var openCount: Int { lock.withLock { state.open } }
    var failureSummary: String { lock.withLock { state.failures.map { "\($0.key): \($0.value)" }.joined(separator: ", ") } }

    func waitUntilReady(seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if readyCount == connections.count { return true }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return false
    }

    func resetRound() { lock.withLock { state.roundTimes = [:] } }

    /// The latencies (seconds from `since`) of the watched devices' notifications this round, once all came
    /// or `seconds` passed.
    func waitForRound(since: Date, seconds: Double) -> [Double] {
        let deadline = Date().addingTimeInterval(seconds)
        let start = since.timeIntervalSince1970
        while Date() < deadline {
            if lock.withLock({ state.roundTimes.count }) == watched { break }
            Thread.sleep(forTimeInterval: 0.001)
        }
        return lock.withLock { state.roundTimes.values.map { max(0, $0 - start) } }
    }

    func stop() {
        lock.withLock { state.stopped = true }
        thread = nil
    }

    private func note(_ failure: String) { lock.withLock { state.failures[failure, default: 0] += 1 } }

    private func connect(_ index: Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return note("socket: errno \(errno)") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let result = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 || errno == EINPROGRESS else {
            close(fd)
            return note("connect: errno \(errno)")
        }
        connections[index].fd = fd
    }

    private func run() {
        var next = 0
        var buffer = [UInt8](repeating: 0, count: 16 * 1024)
        let ready = Array("event: ready".utf8), notification = Array("event: notification".utf8)
        var entries: [pollfd] = []
        var indexes: [Int] = []
        while !lock.withLock({ state.stopped }) {
            // Connect in waves: at most 16 connections waiting for their ready event at once (the server serves one
            // address's requests a few at a time, and answers a flood from one address 429).
            let waiting = next - readyCount - lock.withLock { state.failures.values.reduce(0, +) }
            if next < connections.count && waiting < 16 {
                let wave = 16 - waiting
                for index in next..<min(connections.count, next + wave) { connect(index) }
                next = min(connections.count, next + wave)
            }
            entries.removeAll(keepingCapacity: true)
            indexes.removeAll(keepingCapacity: true)
            for index in 0..<next where connections[index].fd >= 0 && !connections[index].closed {
                let writing = connections[index].sent < connections[index].request.count
                entries.append(pollfd(fd: connections[index].fd, events: Int16(POLLIN) | (writing ? Int16(POLLOUT) : 0), revents: 0))
                indexes.append(index)
            }
            let connecting = next < connections.count || readyCount < next
            let count = poll(&entries, nfds_t(entries.count), connecting ? 20 : pollTimeoutMilliseconds)
            guard count > 0 else { continue }
            for (slot, entry) in entries.enumerated() where entry.revents != 0 {
                let index = indexes[slot]
                var connection = connections[index]
                if entry.revents & Int16(POLLOUT) != 0 && connection.sent < connection.request.count {
                    let written = connection.request[connection.sent...].withUnsafeBytes { write(connection.fd, $0.baseAddress, $0.count) }
                    if written > 0 { connection.sent += written }
                }
                if entry.revents & (Int16(POLLIN) | Int16(POLLHUP) | Int16(POLLERR)) != 0 {
                    while true {
                        let got = buffer.withUnsafeMutableBytes { read(connection.fd, $0.baseAddress, $0.count) }
                        if got > 0 {
                            let now = Date().timeIntervalSince1970
                            let scanned = connection.tail + buffer[0..<got]
                            if !connection.ready && Self.contains(scanned, ready) {
                                connection.ready = true
                                lock.withLock {
                                    state.ready += 1
                                    state.open += 1
                                }
                            }
                            if index < watched && Self.contains(scanned, notification) {
                                lock.withLock { if state.roundTimes[index] == nil { state.roundTimes[index] = now } }
                            }
                            connection.tail = Array(scanned.suffix(notification.count))
                            continue
                        }
                        if got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK) {
                            connection.closed = true
                            let wasReady = connection.ready
                            lock.withLock { if wasReady { state.open -= 1 } }
                            note(wasReady ? "closed after ready" : "closed before ready")
                        }
                        break
                    }
                }
                connections[index] = connection
            }
        }
        for connection in connections where connection.fd >= 0 { close(connection.fd) }
    }

    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard haystack.count >= needle.count else { return false }
        var start = 0
        while start + needle.count <= haystack.count {
            if haystack[start] == needle[0] && haystack[start..<(start + needle.count)].elementsEqual(needle) { return true }
            start += 1
        }
        return false
    }
}

/// Raises the soft open-file limit to the hard one.
func raiseOpenFileLimitToHard() {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
    var raised = limit
    raised.rlim_cur = limit.rlim_max
    _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised)
}
