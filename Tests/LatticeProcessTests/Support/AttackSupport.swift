import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// The machinery of AttackSuiteTests: a real `lattice serve`, an HTTP client bound to any loopback address
// (127.0.0.0/8 is all loopback on Linux), the probe that measures another user's experience during an
// attack, floods of requests, and a poll loop that holds hundreds of slow connections.

/// Seconds on the monotonic clock.
func attackClock() -> Double {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return Double(now.tv_sec) + Double(now.tv_nsec) / 1e9
}

/// The nearest-rank percentile `p` (0...1) of unsorted values, in the values' unit; nil when there are none.
func attackPercentile(_ values: [Double], _ p: Double) -> Double? {
    guard !values.isEmpty else { return nil }
    let sorted = values.sorted()
    let rank = Int((p * Double(sorted.count)).rounded(.up))
    return sorted[min(sorted.count, max(rank, 1)) - 1]
}

/// Raises this process's soft open-files limit to `wanted` (at most the hard limit); returns the new soft limit.
@discardableResult
func raiseOpenFilesLimit(to wanted: UInt64) -> UInt64 {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 0 }
    if limit.rlim_cur < wanted {
        limit.rlim_cur = min(rlim_t(wanted), limit.rlim_max)
        _ = setrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
        _ = getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit)
    }
    return UInt64(limit.rlim_cur)
}

// MARK: The server

/// `lattice serve` as a real process on 127.0.0.1 (any port), its stderr in a file (a pipe nobody reads would
/// fill and stall the server). The `lattice` executable next to the test bundle (`swift build --build-tests`
/// builds it, debug), or `$LATTICE_BIN` (say, a release build).
final class AttackServer {
    let process = Process()
    let port: UInt16
    let logPath: String

    static var binary: String {
        if let path = ProcessInfo.processInfo.environment["LATTICE_BIN"] { return path }
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        var directory = executable.deletingLastPathComponent()
        if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
        return directory.appendingPathComponent("lattice").path
    }

    /// Whether the binary under test is a debug build: `$LATTICE_BIN` names its configuration by its path
    /// (`.build/release/...`), the default one sits beside this (debug or release) test bundle.
    static var isDebugBuild: Bool {
        if let declared = ProcessInfo.processInfo.environment["LATTICE_BIN_DEBUG"] { return declared != "0" }
        return !binary.contains("/release/")
    }

    init(data: String, extra: [String] = []) throws {
        logPath = data + ".log-\(UUID().uuidString.prefix(8))"
        _ = FileManager.default.createFile(atPath: logPath, contents: nil)
        process.executableURL = URL(fileURLWithPath: Self.binary)
        process.arguments = ["serve", "--data", data, "--host", "127.0.0.1", "--port", "0"] + extra
        let output = Pipe()
        process.standardOutput = output
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        process.standardInput = FileHandle.nullDevice
        try process.run()
        // The first line gives the port; later output is never read (there is none).
        let log = logPath
        port = try listeningPort(from: output.fileHandleForReading) { ": " + Self.tail(log) }
    }

    var pid: Int32 { process.processIdentifier }

    /// SIGTERM, and SIGKILL when the process has not ended after `graceSeconds` (a stuck server must not
    /// hold the suite).
    func stop(graceSeconds: Double = 3) {
        guard process.isRunning else { return }
        kill(pid, SIGTERM)
        let deadline = attackClock() + graceSeconds
        while process.isRunning && attackClock() < deadline { usleep(20_000) }
        if process.isRunning { kill(pid, SIGKILL) }
        process.waitUntilExit()
        try? FileManager.default.removeItem(atPath: logPath)
    }

    /// VmRSS of the server in MiB, or nil.
    var residentMiB: Double? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
              let kib = Double(line.split(separator: " ").dropFirst().first ?? "") else { return nil }
        return kib / 1024
    }

    /// Open descriptors of the server.
    var openFiles: Int { (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1 }

    static func tail(_ path: String) -> String {
        String(decoding: (FileManager.default.contents(atPath: path) ?? Data()).suffix(1500), as: UTF8.self)
    }
}

// MARK: A client bound to a chosen loopback address

/// One blocking HTTP/1.1 connection from `source` (a 127.x.y.z address) to 127.0.0.1:`port`, with a
/// timeout on every read and write. Keep-alive: requests one after another. Not thread-safe.
final class LoopbackClient {
    typealias Response = (status: Int, headers: [String: String], body: [UInt8])

    let port: UInt16
    let source: String
    private(set) var descriptor: Int32 = -1
    private var received: [UInt8] = []
    private var readIndex = 0

    init(port: UInt16, source: String = "127.0.0.1", timeoutSeconds: Double = 5) throws {
        self.port = port
        self.source = source
        descriptor = try openLoopbackSocket(source: source, port: port, timeoutSeconds: timeoutSeconds, blocking: true)
    }

    deinit { close() }

    func close() {
        if descriptor >= 0 { Glibc.close(descriptor); descriptor = -1 }
    }

    /// Sets the read and write timeout of the connection.
    func setTimeout(_ seconds: Double) {
        var timeout = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - seconds.rounded(.down)) * 1e6))
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    /// Sends a request (adding Host and Content-Length) and reads its answer. When the write fails because the
    /// server answered early and closed, that answer is read and returned.
    func send(method: String = "POST", path: String, headers: [String: String] = [:], body: [UInt8] = []) throws -> Response {
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
        let declares = headers.keys.contains { $0.lowercased() == "content-length" }
        if (method == "POST" || !body.isEmpty) && !declares { head += "Content-Length: \(body.count)\r\n" }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { head += "\(name): \(value)\r\n" }
        head += "\r\n"
        do {
            try write(Array(head.utf8) + body)
        } catch {
            if let response = try? readResponse() { return response }
            throw error
        }
        return try readResponse()
    }

    func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0 {
                if errno == EINTR { continue }
                throw LoopbackFailure(errno == EAGAIN || errno == EWOULDBLOCK ? .timedOut : .failed("send: \(errnoText())"))
            }
            offset += sent
        }
    }

    func readResponse() throws -> Response {
        while true {
            let statusLine = try readLine()
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
                throw LoopbackFailure(.failed("not an HTTP status line: \(statusLine.prefix(80).debugDescription)"))
            }
            var headers: [String: String] = [:]
            while true {
                let line = try readLine()
                if line.isEmpty { break }
                guard let colon = line.firstIndex(of: ":") else { throw LoopbackFailure(.failed("bad header line")) }
                let name = line[..<colon].lowercased()
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                headers[name] = headers[name].map { $0 + ", " + value } ?? value
            }
            if (100..<200).contains(status) { continue }
            if status == 204 || status == 304 { return (status, headers, []) }
            if headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
                var body: [UInt8] = []
                while true {
                    let sizeLine = try readLine()
                    guard let size = Int(sizeLine.split(separator: ";").first.map(String.init)?
                        .trimmingCharacters(in: .whitespaces) ?? "", radix: 16) else {
                        throw LoopbackFailure(.failed("bad chunk size"))
                    }
                    if size == 0 {
                        while try !readLine().isEmpty {}
                        return (status, headers, body)
                    }
                    body += try readExactly(size)
                    _ = try readLine()
                }
            }
            if let text = headers["content-length"], let length = Int(text) {
                return (status, headers, try readExactly(length))
            }
            while try fill() {}
            return (status, headers, Array(received[readIndex...]))
        }
    }

    /// One recv into the buffer: true on data, false when the server closed; throws on timeout.
    private func fill() throws -> Bool {
        if readIndex > 1 << 20 {
            received.removeFirst(readIndex)
            readIndex = 0
        }
        var chunk = [UInt8](repeating: 0, count: 256 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                received += chunk[..<count]
                return true
            }
            if count == 0 { return false }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: throw LoopbackFailure(.timedOut)
            case ECONNRESET: return false
            default: throw LoopbackFailure(.failed("recv: \(errnoText())"))
            }
        }
    }

    private func fillOrThrow() throws {
        guard try fill() else { throw LoopbackFailure(.closed) }
    }

    private func readLine() throws -> String {
        while true {
            if let end = received[readIndex...].firstIndex(of: 10) {
                var line = received[readIndex..<end]
                if line.last == 13 { line = line.dropLast() }
                readIndex = end + 1
                return String(decoding: line, as: UTF8.self)
            }
            guard received.count - readIndex < 64 * 1024 else { throw LoopbackFailure(.failed("an overlong line")) }
            try fillOrThrow()
        }
    }

    private func readExactly(_ count: Int) throws -> [UInt8] {
        while received.count - readIndex < count { try fillOrThrow() }
        defer { readIndex += count }
        return Array(received[readIndex..<readIndex + count])
    }
}

/// Why a loopback exchange failed: a timeout, the server closing without an answer, or anything else.
struct LoopbackFailure: Error, CustomStringConvertible {
    enum Kind: Equatable { case timedOut, closed, refused, failed(String) }
    let kind: Kind
    init(_ kind: Kind) { self.kind = kind }

    var description: String {
        switch kind {
        case .timedOut: "timed out"
        case .closed: "closed without an answer"
        case .refused: "connection refused"
        case .failed(let text): text
        }
    }
}

func errnoText(_ code: Int32 = errno) -> String { "\(String(cString: strerror(code))) (errno \(code))" }

/// A TCP socket bound to `source` and connected to 127.0.0.1:`port`. Blocking: the connect waits at most
/// `timeoutSeconds` (SO_SNDTIMEO bounds it). Non-blocking: the connect is started and may be in progress.
func openLoopbackSocket(source: String, port: UInt16, timeoutSeconds: Double, blocking: Bool) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    guard fd >= 0 else { throw LoopbackFailure(.failed("socket: \(errnoText())")) }
    var timeout = timeval(tv_sec: Int(timeoutSeconds), tv_usec: Int((timeoutSeconds - timeoutSeconds.rounded(.down)) * 1e6))
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    // Many short connections from one source address: let the kernel reuse ports in TIME_WAIT.
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
    var local = sockaddr_in()
    local.sin_family = sa_family_t(AF_INET)
    local.sin_port = 0
    guard inet_pton(AF_INET, source, &local.sin_addr) == 1 else {
        Glibc.close(fd)
        throw LoopbackFailure(.failed("bad source address \(source)"))
    }
    let bound = withUnsafePointer(to: &local) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    guard bound == 0 else {
        let text = errnoText()
        Glibc.close(fd)
        throw LoopbackFailure(.failed("bind \(source): \(text)"))
    }
    if !blocking { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
    var remote = sockaddr_in()
    remote.sin_family = sa_family_t(AF_INET)
    remote.sin_port = port.bigEndian
    remote.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
    let connected = withUnsafePointer(to: &remote) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
    }
    if connected != 0 && !(errno == EINPROGRESS && !blocking) {
        let code = errno
        Glibc.close(fd)
        switch code {
        case ECONNREFUSED, ECONNRESET: throw LoopbackFailure(.refused)
        case EAGAIN, EWOULDBLOCK, ETIMEDOUT, EINPROGRESS: throw LoopbackFailure(.timedOut)
        default: throw LoopbackFailure(.failed("connect from \(source): \(errnoText(code))"))
        }
    }
    return fd
}

// MARK: Answers

/// What an attacker got, counted by kind ("200", "413 LIMIT_EXCEEDED", "closed by server", ...), and whether
/// each kind is a clear answer.
final class AnswerTally: Sendable {
    private struct State {
        var counts: [String: Int] = [:]
        var unclear = 0
        var refusals = 0
        var total = 0
        var largestBody = 0
    }

    private let state = Mutex(State())

    /// A clear refusal: a 4xx with a JSON `serverErrorCode`, or a 503 with `Retry-After` and one.
    static func isClearRefusal(_ response: LoopbackClient.Response) -> Bool {
        let code = (try? JSON.parse(response.body))?["serverErrorCode"]?.stringValue
        if (400..<500).contains(response.status) { return code != nil }
        if response.status == 503 { return code != nil && response.headers["retry-after"] != nil }
        return false
    }

    /// Counts an HTTP answer. A 2xx is a success (a request within the caps may be served); refused per
    /// item inside a 2xx (records/modify answers per record) counts as a refusal of that kind.
    func add(_ response: LoopbackClient.Response) {
        let json = try? JSON.parse(response.body)
        var key = "\(response.status)"
        var refused = false
        var clear = true
        if (200..<300).contains(response.status) {
            let itemCodes = Set((json?["records"]?.arrayValue ?? []).compactMap { $0["serverErrorCode"]?.stringValue })
            if let code = itemCodes.sorted().first {
                key += " item:\(code)"
                refused = true
            }
        } else {
            if let code = json?["serverErrorCode"]?.stringValue { key += " \(code)" }
            clear = Self.isClearRefusal(response)
            refused = clear
            if !clear { key += " (unclear)" }
        }
        state.withLock {
            $0.counts[key, default: 0] += 1
            $0.total += 1
            if !clear { $0.unclear += 1 }
            if refused { $0.refusals += 1 }
            $0.largestBody = max($0.largestBody, response.body.count)
        }
    }

    /// Counts an outcome that is not an HTTP answer. `clear` says whether it counts as one (a slow client's
    /// connection closed by the server does; a request left unanswered does not).
    func add(event: String, clear: Bool, refusal: Bool = false) {
        state.withLock {
            $0.counts[event, default: 0] += 1
            $0.total += 1
            if !clear { $0.unclear += 1 }
            if refusal { $0.refusals += 1 }
        }
    }

    var counts: [String: Int] { state.withLock { $0.counts } }
    var total: Int { state.withLock { $0.total } }
    var unclear: Int { state.withLock { $0.unclear } }
    /// Clear refusals (4xx/429/503 answers, items refused, connections closed or refused by the server).
    var refusals: Int { state.withLock { $0.refusals } }
    var largestBody: Int { state.withLock { $0.largestBody } }

    var summary: String {
        counts.sorted { $0.value != $1.value ? $0.value > $1.value : $0.key < $1.key }
            .map { "\($0.key): \($0.value)" }.joined(separator: ", ")
    }
}

// MARK: The probe

/// Another user's experience during an attack: from 127.0.0.1, in a loop, `GET /healthz` on a fresh
/// connection (so the accept path is measured too), then a one-record `records/modify` and a small
/// `records/query` on a kept-alive connection. Each request has a timeout; a failure counts at its
/// elapsed time. Bounded by `maximumIterations` and by the stop flag / deadline.
final class Probe: Sendable {
    struct Result {
        var attempts = 0
        var successes = 0
        /// Seconds per request, failed ones included.
        var latencies: [Double] = []
        var failures: [String: Int] = [:]

        var successRate: Double { attempts == 0 ? 0 : Double(successes) / Double(attempts) }
        var p50: Double? { attackPercentile(latencies, 0.50) }
        var p99: Double? { attackPercentile(latencies, 0.99) }
    }

    let port: UInt16
    let token: String
    let zone: String
    let requestTimeout: Double
    let pauseSeconds: Double
    private let stopFlag = Atomic<Bool>(false)
    private let started = Atomic<Bool>(false)
    private let state = Mutex(Result())
    private let finished = DispatchSemaphore(value: 0)

    init(port: UInt16, token: String, zone: String, requestTimeout: Double = 2, pauseSeconds: Double = 0.02) {
        self.port = port
        self.token = token
        self.zone = zone
        self.requestTimeout = requestTimeout
        self.pauseSeconds = pauseSeconds
    }

    /// Starts the loop on its own thread (once; later calls do nothing); it ends at `stop()` or after
    /// `maximumSeconds`.
    func start(maximumSeconds: Double, maximumIterations: Int = 2_000) {
        guard !started.exchange(true, ordering: .acquiringAndReleasing) else { return }
        let thread = Thread { [self] in
            defer { finished.signal() }
            let deadline = attackClock() + maximumSeconds
            var kept: LoopbackClient?
            var iteration = 0
            while iteration < maximumIterations && attackClock() < deadline && !stopFlag.load(ordering: .acquiring) {
                iteration += 1
                measure("healthz") {
                    let client = try LoopbackClient(port: port, timeoutSeconds: requestTimeout)
                    let reply = try client.send(method: "GET", path: "/healthz")
                    return reply.status == 200
                }
                let write = Probe.body(["zoneID": .object(["zoneName": .string(zone)]), "operations": .array([
                    .object(["operationType": .string("forceReplace"), "record": .object([
                        "recordName": .string("probe"), "recordType": .string("Note"),
                        "fields": .object(["n": .object(["value": .int(Int64(iteration))])]),
                    ])]),
                ])])
                measure("write") {
                    if kept == nil { kept = try LoopbackClient(port: port, timeoutSeconds: requestTimeout) }
                    do {
                        let reply = try kept!.send(path: "/database/1/lattice/production/private/records/modify",
                                                   headers: ["Authorization": "Bearer " + token], body: write)
                        let items = (try? JSON.parse(reply.body))?["records"]?.arrayValue ?? []
                        return reply.status == 200 && items.count == 1 && items[0]["serverErrorCode"] == nil
                    } catch {
                        kept = nil
                        throw error
                    }
                }
                let query = Probe.body(["zoneID": .object(["zoneName": .string(zone)]), "resultsLimit": .int(5), "query": .object([
                    "recordType": .string("Note"),
                    "filterBy": .array([.object(["fieldName": .string("n"), "comparator": .string("GREATER_THAN_OR_EQUALS"),
                                                 "fieldValue": .object(["value": .int(0)])])]),
                ])])
                measure("query") {
                    if kept == nil { kept = try LoopbackClient(port: port, timeoutSeconds: requestTimeout) }
                    do {
                        let reply = try kept!.send(path: "/database/1/lattice/production/private/records/query",
                                                   headers: ["Authorization": "Bearer " + token], body: query)
                        return reply.status == 200 && (try? JSON.parse(reply.body))?["records"]?.arrayValue != nil
                    } catch {
                        kept = nil
                        throw error
                    }
                }
                usleep(UInt32(pauseSeconds * 1e6))
            }
        }
        thread.start()
    }

    /// Stops the loop and returns what it measured (waits for the request in flight, at most its timeout x 3).
    func stop() -> Result {
        stopFlag.store(true, ordering: .releasing)
        guard started.load(ordering: .acquiring) else { return state.withLock { $0 } }
        _ = finished.wait(timeout: .now() + requestTimeout * 3 + 1)
        return state.withLock { $0 }
    }

    private func measure(_ what: String, _ body: () throws -> Bool) {
        let began = attackClock()
        var failure: String?
        do {
            if try !body() { failure = "\(what): bad answer" }
        } catch {
            failure = "\(what): \(error)"
        }
        let elapsed = attackClock() - began
        state.withLock {
            $0.attempts += 1
            $0.latencies.append(elapsed)
            if let failure { $0.failures[failure, default: 0] += 1 } else { $0.successes += 1 }
        }
    }

    static func body(_ object: [String: JSON]) -> [UInt8] { JSON.object(object).serializedBytes() }
}

// MARK: Request floods

/// `threads` attackers, each with a kept-alive connection from its address, sending the request `make(thread,
/// index)` returns, one after another, until `seconds` pass or `maximumRequests` (each) are sent. Every answer
/// goes into `tally`; a request without an answer within `requestTimeout` is unclear (counted as such).
/// Returns when every attacker has its last answer (or its timeout).
func flood(port: UInt16, threads: Int, sources: [String], seconds: Double, maximumRequests: Int, requestTimeout: Double = 8,
           tally: AnswerTally,
           make: @escaping @Sendable (_ thread: Int, _ index: Int) -> (path: String, headers: [String: String], body: [UInt8])) {
    let group = DispatchGroup()
    let deadline = attackClock() + seconds
    for thread in 0..<threads {
        group.enter()
        let source = sources[thread % sources.count]
        Thread {
            defer { group.leave() }
            var client: LoopbackClient?
            var index = 0
            while index < maximumRequests && attackClock() < deadline {
                let request = make(thread, index)
                index += 1
                do {
                    if client == nil { client = try LoopbackClient(port: port, source: source, timeoutSeconds: requestTimeout) }
                    // A path written "GET /..." is sent as a GET; every other request is a POST.
                    let isGet = request.path.hasPrefix("GET ")
                    let reply = try client!.send(method: isGet ? "GET" : "POST", path: isGet ? String(request.path.dropFirst(4)) : request.path,
                                                 headers: request.headers, body: request.body)
                    tally.add(reply)
                    if reply.headers["connection"]?.lowercased() == "close" { client = nil }
                } catch let failure as LoopbackFailure {
                    client = nil
                    switch failure.kind {
                    case .timedOut: tally.add(event: "no answer in \(Int(requestTimeout)) s", clear: false)
                    case .closed: tally.add(event: "closed without an answer", clear: false)
                    case .refused: tally.add(event: "connection refused", clear: true, refusal: true)
                    case .failed(let text): tally.add(event: "error: \(text.prefix(60))", clear: false)
                    }
                } catch {
                    client = nil
                    tally.add(event: "error: \(error)", clear: false)
                }
            }
        }.start()
    }
    group.wait()
}

// MARK: Slow clients

/// Holds `connections` slow clients (spread over `sources`) in one poll loop: each first sends `prefix`,
/// then `trickle` `bytesPerTick` bytes at a time, one tick per `tickSeconds`, and is watched for the server
/// closing it (or answering, which is read and counted). Runs until every connection is closed or
/// `seconds` pass; then closes the rest, which count as "still open" (unclear: the server kept them, unless
/// `stillOpenIsClear`, for parked long polls, which may legitimately wait).
/// `onReady` runs once all connections are opened (the probe starts there).
func holdSlowClients(port: UInt16, connections count: Int, sources: [String], prefix: (Int) -> [UInt8],
                     trickle: (Int) -> [UInt8] = { _ in [] }, bytesPerTick: Int = 0, tickSeconds: Double = 1,
                     seconds: Double, stillOpenIsClear: Bool = false, tally: AnswerTally, onReady: () -> Void = {}) {
    struct Slow {
        var fd: Int32
        var pending: [UInt8]
        var trickle: [UInt8]
        var trickleIndex = 0
        var connected = false
        var nextTick: Double
        var answer: [UInt8] = []
        var done = false
    }
    let began = attackClock()
    let deadline = began + seconds
    var slows: [Slow] = []
    for index in 0..<count {
        do {
            let fd = try openLoopbackSocket(source: sources[index % sources.count], port: port, timeoutSeconds: 2, blocking: false)
            slows.append(Slow(fd: fd, pending: prefix(index), trickle: trickle(index),
                              nextTick: began + tickSeconds * Double(index % 10) / 10))
        } catch let failure as LoopbackFailure {
            tally.add(event: failure.kind == .refused ? "connection refused" : "cannot connect: \(failure)",
                      clear: failure.kind == .refused, refusal: failure.kind == .refused)
        } catch {
            tally.add(event: "cannot connect: \(error)", clear: false)
        }
    }
    onReady()
    var buffer = [UInt8](repeating: 0, count: 16 * 1024)
    func finish(_ slow: inout Slow, _ event: String, clear: Bool, refusal: Bool? = nil) {
        if !slow.answer.isEmpty {
            // The server answered (then perhaps closed): classify the answer by its status line and JSON.
            let text = String(decoding: slow.answer, as: UTF8.self)
            let statusLine = text.split(separator: "\r\n", maxSplits: 1).first.map(String.init) ?? ""
            let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") ?? 0
            let bodyText = text.components(separatedBy: "\r\n\r\n").dropFirst().joined(separator: "\r\n\r\n")
            var headers: [String: String] = [:]
            for line in text.components(separatedBy: "\r\n\r\n").first?.split(separator: "\r\n").dropFirst() ?? [] {
                if let colon = line.firstIndex(of: ":") {
                    headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                }
            }
            let response: LoopbackClient.Response = (status, headers, Array(bodyText.utf8))
            if event == "closed by server" && !AnswerTally.isClearRefusal(response) {
                // Answered (say, a bare 408) and closed: for a slow client the close is what counts.
                tally.add(event: "closed by server after a \(status)", clear: true, refusal: true)
            } else {
                tally.add(response)
            }
        } else {
            tally.add(event: event, clear: clear, refusal: refusal ?? clear)
        }
        Glibc.close(slow.fd)
        slow.done = true
    }
    while attackClock() < deadline && slows.contains(where: { !$0.done }) {
        var fds: [pollfd] = []
        var map: [Int] = []
        for (index, slow) in slows.enumerated() where !slow.done {
            var events = Int16(POLLIN) | Int16(0x2000) /* POLLRDHUP */
            if !slow.connected { events |= Int16(POLLOUT) }
            fds.append(pollfd(fd: slow.fd, events: events, revents: 0))
            map.append(index)
        }
        _ = poll(&fds, nfds_t(fds.count), 50)
        let now = attackClock()
        for (position, entry) in fds.enumerated() {
            var slow = slows[map[position]]
            defer { slows[map[position]] = slow }
            if !slow.connected && entry.revents & Int16(POLLOUT) != 0 {
                var error: Int32 = 0
                var length = socklen_t(MemoryLayout<Int32>.size)
                getsockopt(slow.fd, SOL_SOCKET, SO_ERROR, &error, &length)
                if error != 0 {
                    finish(&slow, error == ECONNREFUSED ? "connection refused" : "cannot connect: \(errnoText(error))",
                           clear: error == ECONNREFUSED || error == ECONNRESET)
                    continue
                }
                slow.connected = true
            }
            if entry.revents & (Int16(POLLIN) | Int16(0x2000) /* POLLRDHUP */ | Int16(POLLHUP) | Int16(POLLERR)) != 0 {
                let got = buffer.withUnsafeMutableBytes { recv(slow.fd, $0.baseAddress, $0.count, Int32(MSG_DONTWAIT)) }
                if got > 0 {
                    if slow.answer.count < 64 * 1024 { slow.answer += buffer[..<got] }
                } else if got == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    finish(&slow, "closed by server", clear: true)
                    continue
                }
            }
            guard slow.connected, now >= slow.nextTick else { continue }
            slow.nextTick = now + tickSeconds
            var bytes = slow.pending
            slow.pending = []
            if slow.trickleIndex < slow.trickle.count && bytesPerTick > 0 {
                let end = min(slow.trickle.count, slow.trickleIndex + bytesPerTick)
                bytes += slow.trickle[slow.trickleIndex..<end]
                slow.trickleIndex = end
            }
            if !bytes.isEmpty {
                let sent = bytes.withUnsafeBytes { Glibc.send(slow.fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL | MSG_DONTWAIT)) }
                if sent < 0 && (errno == EPIPE || errno == ECONNRESET) {
                    finish(&slow, "closed by server", clear: true)
                } else if sent >= 0 && sent < bytes.count {
                    slow.pending = Array(bytes[sent...]) // the socket buffer is full: the rest goes next tick
                }
            }
        }
    }
    for index in slows.indices where !slows[index].done {
        finish(&slows[index], "still open after \(Int(seconds.rounded())) s", clear: stillOpenIsClear, refusal: false)
    }
}
