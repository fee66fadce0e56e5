#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization

/// HTTP/1.1 over plain TCP, for `http://` servers: what `HTTPTransport` uses unless the URL is `https://`
/// or a proxy is configured in the environment (then URLSession does the work).
///
/// A sync client's exchanges are small POSTs, one after another, to one server; URLSession (libcurl and
/// Dispatch on Linux) spent about as much CPU per request as the server's whole HTTP layer. This client
/// keeps up to `maximumIdle` keep-alive connections on non-blocking sockets. `send` is async: while it
/// waits for the socket it holds no thread (a Dispatch source wakes it), and a cancelled task ends the
/// exchange at once (the connection is dropped). `sendBlocking` waits on the caller's thread instead
/// (`poll`), for the blocking callers (`ServerClient.Blocking`). Either way every wait is bounded by the
/// exchange's deadline, and the answer is bounded too: at most `maximumHeaderBytes` of status line and
/// headers, at most `maximumBodyBytes` of body; more is a `TransportError`, as is anything that is not
/// HTTP/1.x.
///
/// A kept connection the server has closed meanwhile is noticed before use (it polls readable) and
/// dropped; one that fails before any byte of the answer arrived is retried once on a new connection,
/// as a browser does. `ServerClient` then applies its own retry rules as for any `TransportError`.
final class PlainHTTPClient: Sendable {
    let host: String
    let port: UInt16
    /// `host[:port]` as the `Host` header carries it.
    let authority: String
    /// The path of the server URL without its trailing slashes: requests' paths are appended to it.
    let basePath: String
    /// Idle keep-alive connections, newest last.
    private let idle = Mutex<[PlainHTTPConnection]>([])

    static let maximumIdle = 4
    static let maximumHeaderBytes = 64 * 1024
    static let maximumBodyBytes = 256 * 1024 * 1024

    init(url: URL) throws(TransportError) {
        guard url.scheme == "http", let host = url.host, !host.isEmpty else {
            throw TransportError("\(url.absoluteString) is not an http:// URL")
        }
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        self.host = bare
        port = UInt16(url.port ?? 80)
        let shown = bare.contains(":") ? "[\(bare)]" : bare
        authority = url.port.map { "\(shown):\($0)" } ?? shown
        var path = url.path
        while path.hasSuffix("/") { path.removeLast() }
        basePath = path
    }

    /// Whether HTTP to `url` may skip URLSession: plain `http://` and no proxy named in the environment
    /// (URLSession honours `http_proxy` and `all_proxy`; this client connects directly).
    static func serves(_ url: URL, environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        guard url.scheme == "http" else { return false }
        let proxies = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        return !proxies.contains { !(environment[$0] ?? "").isEmpty }
    }

    /// One exchange, holding no thread while it waits; `CancellationError` when the task is cancelled.
    func send(_ request: TransportRequest, timeout: TimeInterval) async throws -> TransportResponse {
        let deadline = Deadline(seconds: timeout)
        let bytes = encode(request)
        do throws(PlainHTTPFailure) {
            while let kept = takeIdle() {
                do throws(PlainHTTPFailure) {
                    let answer = try await kept.exchange(bytes, method: request.method, deadline: deadline)
                    return keep(answer, kept)
                } catch {
                    guard case .beforeAnswer = error else { throw error }
                    break // let go meanwhile: try a new one
                }
            }
            let addresses = try await PlainHTTPConnection.resolve(host: host, port: port)
            let fresh = try await PlainHTTPConnection.connect(addresses, host: host, deadline: deadline)
            return keep(try await fresh.exchange(bytes, method: request.method, deadline: deadline), fresh)
        } catch {
            if case .cancelled = error { throw CancellationError() }
            throw transportError(error)
        }
    }

    /// One exchange, the caller's thread waiting (never one of Swift's shared threads).
    func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws(TransportError) -> TransportResponse {
        let deadline = Deadline(seconds: timeout)
        let bytes = encode(request)
        do throws(PlainHTTPFailure) {
            while let kept = takeIdle() {
                do throws(PlainHTTPFailure) {
                    return keep(try kept.exchangeBlocking(bytes, method: request.method, deadline: deadline), kept)
                } catch {
                    guard case .beforeAnswer = error else { throw error }
                    break
                }
            }
            let addresses = try PlainHTTPConnection.resolveBlocking(host: host, port: port)
            let fresh = try PlainHTTPConnection.connectBlocking(addresses, host: host, deadline: deadline)
            return keep(try fresh.exchangeBlocking(bytes, method: request.method, deadline: deadline), fresh)
        } catch {
            throw transportError(error)
        }
    }

    /// A kept connection fit to carry a request: quiet (not closed by the server, no stray bytes).
    private func takeIdle() -> PlainHTTPConnection? {
        while let kept = idle.withLock({ $0.popLast() }) {
            if kept.isQuiet { return kept }
        }
        return nil
    }

    /// The answer's response; its connection is kept for the next request when the answer allows it.
    private func keep(_ answer: ResponseParser.Answer, _ connection: PlainHTTPConnection) -> TransportResponse {
        if answer.keepAlive && answer.drained {
            idle.withLock { connections in
                if connections.count < Self.maximumIdle { connections.append(connection) }
            }
        }
        return answer.response
    }

    private func transportError(_ failure: PlainHTTPFailure) -> TransportError {
        switch failure {
        case .beforeAnswer(let reason), .failed(let reason): TransportError("cannot reach http://\(authority): \(reason)")
        case .cancelled: TransportError("cancelled")
        }
    }

    /// The request's bytes: request line, `Host`, the caller's headers, `Content-Length`, body.
    private func encode(_ request: TransportRequest) -> [UInt8] {
        var head = "\(request.method) \(basePath)\(request.path) HTTP/1.1\r\nHost: \(authority)\r\n"
        var hasType = false
        for (name, value) in request.headers.sorted(by: { $0.key < $1.key }) {
            let lowered = name.lowercased()
            guard lowered != "host", lowered != "content-length", lowered != "connection" else { continue }
            if lowered == "content-type" { hasType = true }
            head += "\(name): \(value)\r\n"
        }
        if !request.body.isEmpty && !hasType { head += "Content-Type: application/json\r\n" }
        if !request.body.isEmpty || request.method == "POST" || request.method == "PUT" {
            head += "Content-Length: \(request.body.count)\r\n"
        }
        head += "\r\n"
        var bytes = Array(head.utf8)
        bytes.append(contentsOf: request.body)
        return bytes
    }
}

/// Why an exchange failed: `beforeAnswer` when no byte of the answer had arrived (a kept connection the
/// server closed: worth one more try on a new one), `cancelled` when the awaiting task was cancelled,
/// otherwise `failed`.
enum PlainHTTPFailure: Error {
    case beforeAnswer(String)
    case failed(String)
    case cancelled
}

/// A point in time the exchange must finish by (the monotonic clock).
struct Deadline {
    let nanoseconds: UInt64

    init(seconds: TimeInterval) {
        let span = UInt64(max(0, min(seconds, 86_400)) * 1e9)
        nanoseconds = Deadline.now() &+ span
    }

    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// Nanoseconds left; nil when the deadline has passed.
    var remainingNanoseconds: UInt64? {
        let current = Deadline.now()
        return current < nanoseconds ? nanoseconds - current : nil
    }

    /// Milliseconds left for `poll`, at least 1 while any time is left; nil when it has passed.
    var remainingMilliseconds: Int32? {
        remainingNanoseconds.map { Int32(min(UInt64(Int32.max), max(1, $0 / 1_000_000))) }
    }
}

/// The socket calls whose spelling differs between Linux and Apple platforms.
enum SocketCalls {
    #if canImport(Darwin)
    static let stream = SOCK_STREAM

    /// A socket that never blocks, is closed on exec and raises no SIGPIPE (Darwin sets each apart).
    static func nonBlockingSocket(_ family: Int32, _ type: Int32, _ proto: Int32) -> Int32 {
        let fd = socket(family, type, proto)
        guard fd >= 0 else { return fd }
        var on: Int32 = 1
        guard fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0, fcntl(fd, F_SETFD, FD_CLOEXEC) == 0,
              setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<Int32>.size)) == 0 else {
            let code = errno
            close(fd)
            errno = code
            return -1
        }
        return fd
    }

    static func send(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
        Darwin.send(fd, bytes, count, 0) // SO_NOSIGPIPE is set on the socket
    }

    static func connect(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 {
        Darwin.connect(fd, address, length)
    }

    static func poll(_ entry: inout pollfd, _ milliseconds: Int32) -> Int32 { Darwin.poll(&entry, 1, milliseconds) }
    #else
    static let stream = Int32(SOCK_STREAM.rawValue)

    /// A socket that never blocks and is closed on exec, in one call.
    static func nonBlockingSocket(_ family: Int32, _ type: Int32, _ proto: Int32) -> Int32 {
        socket(family, type | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), proto)
    }

    /// `send` that raises no SIGPIPE when the peer has gone (MSG_NOSIGNAL).
    static func send(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
        Glibc.send(fd, bytes, count, Int32(MSG_NOSIGNAL))
    }

    static func connect(_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int32 {
        Glibc.connect(fd, address, length)
    }

    static func poll(_ entry: inout pollfd, _ milliseconds: Int32) -> Int32 { Glibc.poll(&entry, 1, milliseconds) }
    #endif
}

/// A resolved address of the server, ready for `connect`.
struct SocketAddress: Sendable {
    let family: Int32
    let type: Int32
    let proto: Int32
    let bytes: [UInt8]
}

/// What a socket is waited for.
enum SocketReadiness {
    case readable, writable

    var pollEvents: Int16 { self == .readable ? Int16(POLLIN) : Int16(POLLOUT) }
}

/// One TCP connection (non-blocking socket), closed when the last reference goes. Each step comes in two
/// forms: async (waits through `ReadinessWait`, holding no thread) and blocking (`poll` on the caller's
/// thread); both share the socket calls and the `ResponseParser`.
final class PlainHTTPConnection: Sendable {
    let descriptor: Int32

    private init(descriptor: Int32) { self.descriptor = descriptor }

    deinit { close(descriptor) }

    // MARK: Resolving and connecting

    /// The addresses of `host`; a name that is not a numeric address is looked up on a Dispatch thread.
    static func resolve(host: String, port: UInt16) async throws(PlainHTTPFailure) -> [SocketAddress] {
        if let numeric = try? lookUp(host: host, port: port, numericOnly: true) { return numeric }
        let result = await withCheckedContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(returning: Result { () throws(PlainHTTPFailure) in
                    try lookUp(host: host, port: port, numericOnly: false)
                })
            }
        }
        return try result.get()
    }

    static func resolveBlocking(host: String, port: UInt16) throws(PlainHTTPFailure) -> [SocketAddress] {
        try lookUp(host: host, port: port, numericOnly: false)
    }

    private static func lookUp(host: String, port: UInt16, numericOnly: Bool) throws(PlainHTTPFailure) -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = SocketCalls.stream
        hints.ai_flags = AI_NUMERICSERV | (numericOnly ? AI_NUMERICHOST : 0)
        var list: UnsafeMutablePointer<addrinfo>?
        let found = getaddrinfo(host, String(port), &hints, &list)
        guard found == 0, let first = list else {
            throw .beforeAnswer("cannot resolve \(host): \(String(cString: gai_strerror(found)))")
        }
        defer { freeaddrinfo(list) }
        var addresses: [SocketAddress] = []
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let address = entry {
            entry = address.pointee.ai_next
            let bytes = [UInt8](UnsafeRawBufferPointer(start: address.pointee.ai_addr, count: Int(address.pointee.ai_addrlen)))
            addresses.append(SocketAddress(family: address.pointee.ai_family, type: address.pointee.ai_socktype,
                                           proto: address.pointee.ai_protocol, bytes: bytes))
        }
        return addresses
    }

    /// A connection to the first of `addresses` that accepts within the deadline.
    static func connect(_ addresses: [SocketAddress], host: String, deadline: Deadline) async throws(PlainHTTPFailure)
        -> PlainHTTPConnection {
        var reason = "no address for \(host)"
        for address in addresses {
            let (connection, pending) = try start(address, reason: &reason)
            guard let connection else { continue }
            if pending {
                do throws(PlainHTTPFailure) {
                    try await connection.wait(.writable, deadline: deadline, timeout: "connect timed out")
                } catch {
                    if case .cancelled = error { throw error }
                    reason = "connect timed out"
                    continue
                }
                guard connection.connected(reason: &reason) else { continue }
            }
            return connection
        }
        throw .beforeAnswer(reason)
    }

    static func connectBlocking(_ addresses: [SocketAddress], host: String, deadline: Deadline) throws(PlainHTTPFailure)
        -> PlainHTTPConnection {
        var reason = "no address for \(host)"
        for address in addresses {
            let (connection, pending) = try start(address, reason: &reason)
            guard let connection else { continue }
            if pending {
                guard poll(connection.descriptor, .writable, deadline: deadline) else {
                    reason = "connect timed out"
                    continue
                }
                guard connection.connected(reason: &reason) else { continue }
            }
            return connection
        }
        throw .beforeAnswer(reason)
    }

    /// A socket connecting to `address`: nil (with the reason) when it failed at once; `pending` while the
    /// connection is under way.
    private static func start(_ address: SocketAddress, reason: inout String) throws(PlainHTTPFailure)
        -> (PlainHTTPConnection?, pending: Bool) {
        let fd = SocketCalls.nonBlockingSocket(address.family, address.type, address.proto)
        guard fd >= 0 else {
            reason = describe("socket")
            return (nil, false)
        }
        let connection = PlainHTTPConnection(descriptor: fd)
        let result = address.bytes.withUnsafeBytes { raw in
            SocketCalls.connect(fd, raw.baseAddress!.assumingMemoryBound(to: sockaddr.self), socklen_t(raw.count))
        }
        if result != 0 && errno != EINPROGRESS {
            reason = describe("connect")
            return (nil, false)
        }
        var on: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
        return (connection, result != 0)
    }

    /// Whether a connection under way succeeded (`SO_ERROR`).
    private func connected(reason: inout String) -> Bool {
        var failure: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(descriptor, SOL_SOCKET, SO_ERROR, &failure, &size) == 0, failure == 0 else {
            reason = "connect failed: \(String(cString: strerror(failure)))"
            return false
        }
        return true
    }

    static func describe(_ call: String, _ code: Int32 = errno) -> String {
        "\(call) failed: \(String(cString: strerror(code)))"
    }

    // MARK: Waiting

    /// Waits on the caller's thread until `fd` is ready (or in error); false when the deadline passes first.
    static func poll(_ fd: Int32, _ readiness: SocketReadiness, deadline: Deadline) -> Bool {
        while let milliseconds = deadline.remainingMilliseconds {
            var entry = pollfd(fd: fd, events: readiness.pollEvents, revents: 0)
            let ready = SocketCalls.poll(&entry, milliseconds)
            if ready > 0 { return true }
            if ready < 0 && errno != EINTR { return true } // the next call reports the error
        }
        return false
    }

    /// Waits, holding no thread, until the socket is ready; `failed(timeout)` past the deadline,
    /// `cancelled` when the task is cancelled.
    func wait(_ readiness: SocketReadiness, deadline: Deadline, timeout: String) async throws(PlainHTTPFailure) {
        let wait = ReadinessWait()
        let outcome = await withTaskCancellationHandler {
            await withCheckedContinuation { continuation in
                wait.start(continuation, connection: self, readiness: readiness, deadline: deadline)
            }
        } onCancel: {
            wait.finish(.cancelled)
        }
        switch outcome {
        case .ready: return
        case .timedOut: throw .failed(timeout)
        case .cancelled: throw .cancelled
        }
    }

    /// No bytes waiting and not closed by the peer: fit to carry the next request.
    var isQuiet: Bool {
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        return SocketCalls.poll(&entry, 0) == 0
    }

    // MARK: One exchange

    /// Sends `bytes` and reads the answer, holding no thread while it waits.
    func exchange(_ bytes: [UInt8], method: String, deadline: Deadline) async throws(PlainHTTPFailure) -> ResponseParser.Answer {
        var parser = ResponseParser(method: method)
        var offset = 0
        do throws(PlainHTTPFailure) {
            while offset < bytes.count {
                if try sendSome(bytes, from: &offset) { continue }
                try await wait(.writable, deadline: deadline, timeout: "sending the request timed out")
            }
        } catch {
            // The server may have answered early (a body it refuses) and closed: that answer counts.
            if case .cancelled = error { throw error }
            guard let early = try? await readAnswer(&parser, deadline: deadline) else { throw error }
            return early
        }
        return try await readAnswer(&parser, deadline: deadline)
    }

    func exchangeBlocking(_ bytes: [UInt8], method: String, deadline: Deadline) throws(PlainHTTPFailure) -> ResponseParser.Answer {
        var parser = ResponseParser(method: method)
        var offset = 0
        do throws(PlainHTTPFailure) {
            while offset < bytes.count {
                if try sendSome(bytes, from: &offset) { continue }
                guard Self.poll(descriptor, .writable, deadline: deadline) else { throw .failed("sending the request timed out") }
            }
        } catch {
            guard let early = try? readAnswerBlocking(&parser, deadline: deadline) else { throw error }
            return early
        }
        return try readAnswerBlocking(&parser, deadline: deadline)
    }

    private func readAnswer(_ parser: inout ResponseParser, deadline: Deadline) async throws(PlainHTTPFailure) -> ResponseParser.Answer {
        while true {
            if let answer = try parser.answer() { return answer }
            switch try receiveSome(into: &parser) {
            case .received: continue
            case .ended: return try parser.endOfStream()
            case .wouldBlock: try await wait(.readable, deadline: deadline, timeout: "the answer timed out")
            }
        }
    }

    private func readAnswerBlocking(_ parser: inout ResponseParser, deadline: Deadline) throws(PlainHTTPFailure)
        -> ResponseParser.Answer {
        while true {
            if let answer = try parser.answer() { return answer }
            switch try receiveSome(into: &parser) {
            case .received: continue
            case .ended: return try parser.endOfStream()
            case .wouldBlock:
                guard Self.poll(descriptor, .readable, deadline: deadline) else { throw .failed("the answer timed out") }
            }
        }
    }

    /// Sends what the socket takes now; false when it takes nothing (wait until writable). A failure is
    /// `beforeAnswer` (the server has answered nothing yet).
    private func sendSome(_ bytes: [UInt8], from offset: inout Int) throws(PlainHTTPFailure) -> Bool {
        let sent = bytes.withUnsafeBytes { raw in SocketCalls.send(descriptor, raw.baseAddress! + offset, raw.count - offset) }
        if sent >= 0 {
            offset += sent
            return true
        }
        if errno == EINTR { return true }
        if errno == EAGAIN || errno == EWOULDBLOCK { return false }
        throw .beforeAnswer(Self.describe("send"))
    }

    private enum Received { case received, ended, wouldBlock }

    /// Receives what has arrived (at most 64 KiB) into the parser.
    private func receiveSome(into parser: inout ResponseParser) throws(PlainHTTPFailure) -> Received {
        try withUnsafeTemporaryAllocation(byteCount: 64 * 1024, alignment: 1) { scratch throws(PlainHTTPFailure) -> Received in
            let got = recv(descriptor, scratch.baseAddress, scratch.count, 0)
            if got > 0 {
                parser.append(UnsafeRawBufferPointer(rebasing: scratch[..<got]))
                return .received
            }
            if got == 0 { return .ended }
            let code = errno
            if code == EINTR { return .received }
            if code == EAGAIN || code == EWOULDBLOCK { return .wouldBlock }
            throw .failed(Self.describe("recv", code))
        }
    }
}

/// One wait for a socket to become ready, without a thread: a Dispatch source on the socket and a timer
/// for the deadline, whichever fires first (or the task's cancellation) resumes the waiting task once.
final class ReadinessWait: Sendable {
    enum Outcome: Sendable { case ready, timedOut, cancelled }

    private struct Waiting {
        var continuation: CheckedContinuation<Outcome, Never>?
        var sources: [DispatchSourceHandle] = []
        /// Set when it ended before it started (cancelled first).
        var ended: Outcome?
    }

    private let waiting = Mutex(Waiting())
    /// The queue every socket source and timer of this client fires on (their handlers only resume a task).
    static let queue = DispatchQueue(label: "lattice.plain-http")

    func start(_ continuation: CheckedContinuation<Outcome, Never>, connection: PlainHTTPConnection,
               readiness: SocketReadiness, deadline: Deadline) {
        let descriptor = connection.descriptor
        let readable = readiness == .readable
        let left = min(deadline.remainingNanoseconds ?? 0, UInt64(Int.max))
        let ended = waiting.withLock { state -> Outcome? in
            if let ended = state.ended { return ended } // cancelled before it started
            let socket = DispatchSourceHandle(readable ? DispatchSource.makeReadSource(fileDescriptor: descriptor, queue: Self.queue)
                                                       : DispatchSource.makeWriteSource(fileDescriptor: descriptor, queue: Self.queue))
            socket.source.setEventHandler { [self] in finish(.ready) }
            // The connection (and so its descriptor) lives until the source is cancelled.
            socket.source.setCancelHandler { withExtendedLifetime(connection) {} }
            let timer = DispatchSource.makeTimerSource(queue: Self.queue)
            timer.schedule(deadline: .now() + .nanoseconds(Int(left)))
            timer.setEventHandler { [self] in finish(.timedOut) }
            state.continuation = continuation
            state.sources = [socket, DispatchSourceHandle(timer)]
            // Their handlers run on the queue and wait for this lock: none can end the wait before it is set.
            for handle in state.sources { handle.source.resume() }
            return nil
        }
        if let ended { continuation.resume(returning: ended) }
    }

    /// Ends the wait (the first call counts): the sources are cancelled and the task resumed.
    func finish(_ outcome: Outcome) {
        let (continuation, sources) = waiting.withLock { state in
            if state.continuation == nil && state.ended == nil { state.ended = outcome }
            defer { state.continuation = nil; state.sources = [] }
            return (state.continuation, state.sources)
        }
        for handle in sources { handle.source.cancel() }
        continuation?.resume(returning: outcome)
    }
}

/// A Dispatch source carried between threads. Dispatch sources are thread-safe (libdispatch lets any thread
/// set their handlers, resume and cancel them), but the Swift overlay does not mark them `Sendable`; the
/// handle says so for the one member, which is never reassigned.
final class DispatchSourceHandle: Sendable {
    nonisolated(unsafe) let source: any DispatchSourceProtocol

    init(_ source: any DispatchSourceProtocol) { self.source = source }
}

/// Reads one HTTP/1.x answer as its bytes arrive, within the client's bounds: the bytes are appended as
/// they come (`append`), and `answer()` gives the answer once it is whole (interim 1xx answers are read
/// past). `endOfStream()` is told when the connection ends.
struct ResponseParser {
    /// The final answer, whether the connection may carry another request, and whether nothing was
    /// received past the answer.
    struct Answer {
        var response: TransportResponse
        var keepAlive: Bool
        var drained: Bool
    }

    private struct Head {
        var status: Int
        var headers: [String: String]
        var keepAlive: Bool
    }

    private enum Phase {
        case head
        case length(Head, Int)
        case chunkSize(Head)
        case chunkData(Head, Int)
        case chunkEnd(Head)
        case trailers(Head)
        case toEnd(Head)
    }

    let method: String
    private var buffer: [UInt8] = []
    private var index = 0
    /// Bytes received so far, over all answers (interim ones included).
    private var received = 0
    /// Bytes past `index` known to hold no head end.
    private var searched = 0
    private var phase = Phase.head
    private var body: [UInt8] = []

    init(method: String) { self.method = method }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        if index > 0 && index == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            index = 0
        }
        buffer.append(contentsOf: bytes)
        received += bytes.count
    }

    /// The answer once the bytes so far hold all of it; nil while more are needed.
    mutating func answer() throws(PlainHTTPFailure) -> Answer? {
        while true {
            switch phase {
            case .head:
                guard let head = try takeHead() else { return nil }
                guard let next = try framing(of: head) else { continue } // an interim answer
                phase = next
            case .length(let head, let length):
                guard buffer.count - index >= length else { return nil }
                body = take(length)
                return finish(head)
            case .chunkSize(let head):
                guard let sizeLine = try takeLine() else { return nil }
                let digits = sizeLine.prefix { $0 != UInt8(ascii: ";") }
                guard let text = String(validating: digits, as: UTF8.self),
                      let size = Int(text.trimmingCharacters(in: .whitespaces), radix: 16), size >= 0 else {
                    throw .failed("a bad chunk size")
                }
                guard size <= PlainHTTPClient.maximumBodyBytes - body.count else {
                    throw .failed("an answer over \(PlainHTTPClient.maximumBodyBytes) bytes")
                }
                phase = size == 0 ? .trailers(head) : .chunkData(head, size)
            case .chunkData(let head, let size):
                guard buffer.count - index >= size else { return nil }
                body.append(contentsOf: buffer[index..<(index + size)])
                index += size
                phase = .chunkEnd(head)
            case .chunkEnd(let head):
                guard let end = try takeLine() else { return nil }
                guard end.isEmpty else { throw .failed("a chunk without its CRLF") }
                phase = .chunkSize(head)
            case .trailers(let head):
                guard let trailer = try takeLine() else { return nil } // trailers, ignored
                if trailer.isEmpty { return finish(head) }
            case .toEnd:
                guard buffer.count - index <= PlainHTTPClient.maximumBodyBytes else {
                    throw .failed("an answer over \(PlainHTTPClient.maximumBodyBytes) bytes")
                }
                return nil
            }
        }
    }

    /// The connection ended: the answer when its body runs to the end of the connection, else an error
    /// (`beforeAnswer` while nothing at all has arrived).
    mutating func endOfStream() throws(PlainHTTPFailure) -> Answer {
        if case .toEnd(var head) = phase {
            head.keepAlive = false
            body = take(buffer.count - index)
            return finish(head)
        }
        throw received == 0 ? .beforeAnswer("the connection closed before an answer")
                            : .failed("the connection closed in the middle of the answer")
    }

    private mutating func finish(_ head: Head) -> Answer {
        defer {
            body = []
            phase = .head
        }
        return Answer(response: TransportResponse(status: head.status, headers: head.headers, body: body),
                      keepAlive: head.keepAlive, drained: index == buffer.count)
    }

    /// Whether an answer with no length has a body (HEAD, 204 and 304 never do).
    private func needsBody(_ head: Head) -> Bool { !(method == "HEAD" || head.status == 204 || head.status == 304) }

    /// How the body after `head` is delimited; nil for an interim (1xx) answer.
    private func framing(of head: Head) throws(PlainHTTPFailure) -> Phase? {
        if (100..<200).contains(head.status) {
            guard head.status != 101 else { throw .failed("the server switched protocols") }
            return nil
        }
        if !needsBody(head) { return .length(head, 0) }
        if let coding = head.headers["transfer-encoding"] {
            guard coding.lowercased() == "chunked" else { throw .failed("transfer coding \(coding) is not supported") }
            return .chunkSize(head)
        }
        if let text = head.headers["content-length"] {
            guard let length = Int(text), length >= 0 else { throw .failed("a bad Content-Length \(text)") }
            guard length <= PlainHTTPClient.maximumBodyBytes else {
                throw .failed("an answer of \(length) bytes, over \(PlainHTTPClient.maximumBodyBytes)")
            }
            return .length(head, length)
        }
        var endless = head
        endless.keepAlive = false
        return .toEnd(endless)
    }

    /// The status line and headers up to the empty line, once they are all here.
    private mutating func takeHead() throws(PlainHTTPFailure) -> Head? {
        guard let end = headEnd(from: index + searched), end - index <= PlainHTTPClient.maximumHeaderBytes else {
            guard buffer.count - index <= PlainHTTPClient.maximumHeaderBytes else {
                throw .failed("an answer head over \(PlainHTTPClient.maximumHeaderBytes) bytes")
            }
            searched = max(0, buffer.count - index - 3)
            return nil
        }
        guard let text = String(validating: buffer[index..<end], as: UTF8.self) else {
            throw .failed("an answer head that is not UTF-8")
        }
        index = end + 4
        searched = 0
        let lines = text.split(separator: "\r\n", omittingEmptySubsequences: false)
        guard let statusLine = lines.first else { throw .failed("an empty answer") }
        let parts = statusLine.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, parts[0] == "HTTP/1.1" || parts[0] == "HTTP/1.0", parts[1].count == 3,
              let status = Int(parts[1]), (100...599).contains(status) else {
            throw .failed("not an HTTP/1.x answer: \(statusLine.prefix(80).debugDescription)")
        }
        var headers: [String: String] = [:]
        for line in lines.dropFirst() {
            guard let colon = line.firstIndex(of: ":") else { throw .failed("a header line without a colon") }
            let name = line[..<colon].lowercased()
            let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            headers[name] = headers[name].map { $0 + ", " + value } ?? value
        }
        let tokens = (headers["connection"] ?? "").lowercased().split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        let keepAlive = parts[0] == "HTTP/1.1" ? !tokens.contains("close") : tokens.contains("keep-alive")
        return Head(status: status, headers: headers, keepAlive: keepAlive)
    }

    /// Where `\r\n\r\n` starts, searching from `start`.
    private func headEnd(from start: Int) -> Int? {
        var position = start
        while position + 3 < buffer.count {
            if buffer[position] == 13 && buffer[position + 1] == 10 && buffer[position + 2] == 13 && buffer[position + 3] == 10 {
                return position
            }
            position += 1
        }
        return nil
    }

    /// The next `count` bytes (all here).
    private mutating func take(_ count: Int) -> [UInt8] {
        defer { index += count }
        return Array(buffer[index..<(index + count)])
    }

    /// One CRLF-terminated line (chunk sizes and trailers) once it is here, at most 4 KiB.
    private mutating func takeLine() throws(PlainHTTPFailure) -> [UInt8]? {
        if let end = buffer[index...].firstIndex(of: 10), end > index, buffer[end - 1] == 13 {
            defer { index = end + 1 }
            return Array(buffer[index..<(end - 1)])
        }
        guard buffer.count - index < 4096 else { throw .failed("a chunk line over 4096 bytes") }
        return nil
    }
}
