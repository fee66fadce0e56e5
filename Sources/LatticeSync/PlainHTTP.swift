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
/// waits for the socket it holds no thread (`SocketPoller` runs the exchange's next step when the socket
/// is ready), and a cancelled task ends the exchange at once (the connection is dropped). `sendBlocking`
/// runs the same steps on the caller's thread between `poll`s, for the blocking callers
/// (`ServerClient.Blocking`). Either way every wait is bounded by the
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
            // A new connection: the connecting is the exchange's first wait, so the task is resumed once.
            var reason = "no address for \(host)"
            for address in try await PlainHTTPConnection.resolve(host: host, port: port) {
                let (fresh, pending) = try PlainHTTPConnection.start(address, reason: &reason)
                guard let fresh else { continue }
                do throws(PlainHTTPFailure) {
                    let answer = try await fresh.exchange(bytes, method: request.method, deadline: deadline, connecting: pending)
                    return keep(answer, fresh)
                } catch {
                    guard case .connectFailed(let why) = error else { throw error }
                    reason = why // the next address
                }
            }
            throw PlainHTTPFailure.beforeAnswer(reason)
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
            var reason = "no address for \(host)"
            for address in try PlainHTTPConnection.resolveBlocking(host: host, port: port) {
                let (fresh, pending) = try PlainHTTPConnection.start(address, reason: &reason)
                guard let fresh else { continue }
                do throws(PlainHTTPFailure) {
                    let answer = try fresh.exchangeBlocking(bytes, method: request.method, deadline: deadline, connecting: pending)
                    return keep(answer, fresh)
                } catch {
                    guard case .connectFailed(let why) = error else { throw error }
                    reason = why // the next address
                }
            }
            throw PlainHTTPFailure.beforeAnswer(reason)
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
        case .beforeAnswer(let reason), .failed(let reason), .connectFailed(let reason):
            TransportError("cannot reach http://\(authority): \(reason)")
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
    /// A new connection that did not connect (the next address may).
    case connectFailed(String)
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

    static func poll(_ entries: UnsafeMutablePointer<pollfd>, _ count: nfds_t, _ milliseconds: Int32) -> Int32 {
        Darwin.poll(entries, count, milliseconds)
    }
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

    static func poll(_ entries: UnsafeMutablePointer<pollfd>, _ count: nfds_t, _ milliseconds: Int32) -> Int32 {
        Glibc.poll(entries, count, milliseconds)
    }
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
/// forms: async (waits through `SocketPoller`, holding no thread) and blocking (`poll` on the caller's
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

    /// A socket connecting to `address`: nil (with the reason) when it failed at once; `pending` while the
    /// connection is under way.
    static func start(_ address: SocketAddress, reason: inout String) throws(PlainHTTPFailure)
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
    fileprivate func connected(reason: inout String) -> Bool {
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
            let ready = SocketCalls.poll(&entry, 1, milliseconds)
            if ready > 0 { return true }
            if ready < 0 && errno != EINTR { return true } // the next call reports the error
        }
        return false
    }

    /// No bytes waiting and not closed by the peer: fit to carry the next request.
    var isQuiet: Bool {
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        return SocketCalls.poll(&entry, 1, 0) == 0
    }

    // MARK: One exchange

    /// Sends `bytes` and reads the answer, holding no thread while it waits: what the socket takes or
    /// gives at once is done here, the rest on the poller's thread (`SocketPoller`), which resumes the task
    /// once, with the answer or the failure.
    func exchange(_ bytes: [UInt8], method: String, deadline: Deadline, connecting: Bool = false) async throws(PlainHTTPFailure)
        -> ResponseParser.Answer {
        let machine = ExchangeMachine(connection: self, bytes: bytes, method: method, connecting: connecting)
        switch machine.step(after: nil) {
        case .done(let result):
            return try result.get()
        case .wait(let readiness):
            let result = await SocketPoller.shared.drive(self, readiness, deadline: deadline) { machine.step(after: $0) }
            guard let result else { throw .cancelled }
            return try result.get()
        }
    }

    /// The same on the caller's thread, waiting with `poll` (the connecting too, for a new connection).
    func exchangeBlocking(_ bytes: [UInt8], method: String, deadline: Deadline, connecting: Bool = false)
        throws(PlainHTTPFailure) -> ResponseParser.Answer {
        let machine = ExchangeMachine(connection: self, bytes: bytes, method: method, connecting: connecting)
        var outcome: SocketPoller.Outcome?
        while true {
            switch machine.step(after: outcome) {
            case .done(let result): return try result.get()
            case .wait(let readiness): outcome = Self.poll(descriptor, readiness, deadline: deadline) ? .ready : .timedOut
            }
        }
    }

    /// Sends what the socket takes now; false when it takes nothing (wait until writable). A failure is
    /// `beforeAnswer` (the server has answered nothing yet).
    fileprivate func sendSome(_ bytes: [UInt8], from offset: inout Int) throws(PlainHTTPFailure) -> Bool {
        let sent = bytes.withUnsafeBytes { raw in SocketCalls.send(descriptor, raw.baseAddress! + offset, raw.count - offset) }
        if sent >= 0 {
            offset += sent
            return true
        }
        if errno == EINTR { return true }
        if errno == EAGAIN || errno == EWOULDBLOCK { return false }
        throw .beforeAnswer(Self.describe("send"))
    }

    fileprivate enum Received { case received, ended, wouldBlock }

    /// Receives what has arrived (at most 64 KiB) into the parser.
    fileprivate func receiveSome(into parser: inout ResponseParser) throws(PlainHTTPFailure) -> Received {
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

/// What a step of socket work gives: wait for the socket, or the result.
enum SocketStep<T: Sendable>: Sendable {
    case wait(SocketReadiness)
    case done(T)
}

/// One request and its answer on one connection, as steps that never block: write what the socket takes,
/// then read and parse what has come, each step saying what to wait for next. The async exchange runs its
/// steps on the poller's thread after the first; the blocking one on the caller's thread between `poll`s.
final class ExchangeMachine: Sendable {
    typealias Result = Swift.Result<ResponseParser.Answer, PlainHTTPFailure>

    private struct State {
        /// The connection is under way: wait until writable, then check it connected.
        var connecting: Bool
        var writing = true
        var offset = 0
        var parser: ResponseParser
        /// Why the request could not be sent in full: the server may still have answered (a body it refuses)
        /// before closing, and that answer counts; without one, this is the failure.
        var writeFailure: PlainHTTPFailure?
    }

    private let connection: PlainHTTPConnection
    private let bytes: [UInt8]
    /// Steps run one after another (the caller's, then the poller's); the lock makes the handover explicit.
    private let state: Mutex<State>

    init(connection: PlainHTTPConnection, bytes: [UInt8], method: String, connecting: Bool = false) {
        self.connection = connection
        self.bytes = bytes
        state = Mutex(State(connecting: connecting, parser: ResponseParser(method: method)))
    }

    /// Does what the socket allows now; `outcome` is how the last wait ended (nil before the first).
    func step(after outcome: SocketPoller.Outcome?) -> SocketStep<Result> {
        state.withLock { state in
            if state.connecting {
                switch outcome {
                case nil: return .wait(.writable)
                case .timedOut?: return .done(.failure(.connectFailed("connect timed out")))
                case .ready?:
                    var reason = ""
                    guard connection.connected(reason: &reason) else { return .done(.failure(.connectFailed(reason))) }
                    state.connecting = false
                }
            } else if outcome == .timedOut {
                return .done(.failure(state.writeFailure
                    ?? .failed(state.writing ? "sending the request timed out" : "the answer timed out")))
            }
            do throws(PlainHTTPFailure) {
                while state.writing && state.offset < bytes.count {
                    do throws(PlainHTTPFailure) {
                        if try !connection.sendSome(bytes, from: &state.offset) { return .wait(.writable) }
                    } catch {
                        state.writeFailure = error
                        break
                    }
                }
                state.writing = false
                while true {
                    if let answer = try state.parser.answer() { return .done(.success(answer)) }
                    switch try connection.receiveSome(into: &state.parser) {
                    case .received: continue
                    case .ended: return .done(.success(try state.parser.endOfStream()))
                    case .wouldBlock: return .wait(.readable)
                    }
                }
            } catch {
                return .done(.failure(state.writeFailure ?? error))
            }
        }
    }
}

/// The one thread that waits for the sockets of every async exchange of the process, and does their socket
/// work. A task registers a step function with its socket and suspends (holding no thread); this thread's
/// `poll` over all registered sockets, with the nearest deadline as its timeout, runs each step when its
/// socket is ready (or its deadline passed), and the step either asks to wait again or gives the result,
/// which resumes the task: once per exchange, however many waits it took. A cancelled task is resumed at
/// once (nil) and the poller woken through its pipe to drop the socket. The thread starts with the first
/// wait and then stays, parked in `poll` while nothing waits.
///
/// A registration holds its connection, and the poller holds the connections of the sockets it is polling
/// until that `poll` returns, so a descriptor is never closed (and its number reused) while it is polled.
/// Steps do only non-blocking socket calls and parsing.
final class SocketPoller: Sendable {
    enum Outcome: Sendable { case ready, timedOut }

    static let shared = SocketPoller()

    private struct Registration {
        let id: UInt64
        let connection: PlainHTTPConnection
        let events: Int16
        let deadline: Deadline
        /// Runs the step after a wait; the readiness to wait for next, or nil once the task is resumed.
        let advance: @Sendable (Outcome) -> SocketReadiness?
        /// Resumes the task as cancelled.
        let cancel: @Sendable () -> Void

        func waiting(for readiness: SocketReadiness) -> Registration {
            Registration(id: id, connection: connection, events: readiness.pollEvents, deadline: deadline, advance: advance,
                         cancel: cancel)
        }
    }

    private struct Registry {
        var waiting: [UInt64: Registration] = [:]
        /// Tasks cancelled while not registered (before their first wait, or while a step ran).
        var cancelled: Set<UInt64> = []
        var nextID: UInt64 = 1
        var threadStarted = false
    }

    private let registry = Mutex(Registry())
    /// A pipe whose read end is polled with the sockets: a byte written wakes the poller.
    private let wakeRead: Int32
    private let wakeWrite: Int32

    private init() {
        var ends: [Int32] = [-1, -1]
        if pipe(&ends) == 0 {
            for end in ends {
                _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
                _ = fcntl(end, F_SETFD, FD_CLOEXEC)
            }
        }
        (wakeRead, wakeWrite) = (ends[0], ends[1])
    }

    /// Waits for `connection` to be `readiness`, then runs `step` on the poller's thread (with `.timedOut`
    /// once the deadline has passed) until it gives a result. Nil when the task was cancelled.
    func drive<T: Sendable>(_ connection: PlainHTTPConnection, _ readiness: SocketReadiness, deadline: Deadline,
                            step: @escaping @Sendable (Outcome) -> SocketStep<T>) async -> T? {
        let id = registry.withLock { registry in
            defer { registry.nextID += 1 }
            return registry.nextID
        }
        let result = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<T?, Never>) in
                let registration = Registration(
                    id: id, connection: connection, events: readiness.pollEvents, deadline: deadline,
                    advance: { outcome in
                        switch step(outcome) {
                        case .wait(let next): return next
                        case .done(let value):
                            continuation.resume(returning: value)
                            return nil
                        }
                    },
                    cancel: { continuation.resume(returning: nil) })
                register(registration, wake: true)
            }
        } onCancel: {
            let taken = registry.withLock { registry -> Registration? in
                if let registration = registry.waiting.removeValue(forKey: id) { return registration }
                registry.cancelled.insert(id)
                return nil
            }
            taken?.cancel()
            wake()
        }
        // A cancellation that came after the task was resumed left its mark: not needed any more.
        registry.withLock { _ = $0.cancelled.remove(id) }
        return result
    }

    /// Adds a registration to the poll, unless its task was cancelled meanwhile (then resumes it so); the
    /// poller is woken to include it (not needed from the poller's own thread).
    private func register(_ registration: Registration, wake wakes: Bool) {
        let (cancelled, startThread) = registry.withLock { registry -> (Bool, Bool) in
            if registry.cancelled.remove(registration.id) != nil { return (true, false) }
            registry.waiting[registration.id] = registration
            defer { registry.threadStarted = true }
            return (false, !registry.threadStarted)
        }
        if cancelled { return registration.cancel() }
        if startThread {
            let thread = Thread { [self] in run() }
            thread.name = "lattice.socket-poller"
            thread.start()
        }
        if wakes { wake() }
    }

    private func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1) // a full pipe already wakes it
    }

    private func run() {
        var drain = [UInt8](repeating: 0, count: 256)
        while true {
            let polled = registry.withLock { Array($0.waiting.values) }
            var entries = [pollfd(fd: wakeRead, events: Int16(POLLIN), revents: 0)]
            entries += polled.map { pollfd(fd: $0.connection.descriptor, events: $0.events, revents: 0) }
            var timeout: Int32 = -1
            if let nearest = polled.map(\.deadline.nanoseconds).min() {
                let now = Deadline.now()
                timeout = nearest <= now ? 0 : Int32(min(UInt64(Int32.max), (nearest - now + 999_999) / 1_000_000))
            }
            let count = entries.withUnsafeMutableBufferPointer { SocketCalls.poll($0.baseAddress!, nfds_t($0.count), timeout) }
            if count < 0 && errno != EINTR { usleep(1000) } // not expected; never a busy loop
            if entries[0].revents != 0 { while read(wakeRead, &drain, drain.count) > 0 {} }
            let now = Deadline.now()
            // Taken off the registry first: a cancellation from now on finds none and marks the id instead.
            let due = registry.withLock { registry -> [(Registration, Outcome)] in
                var due: [(Registration, Outcome)] = []
                for (index, registration) in polled.enumerated() {
                    let outcome: Outcome? = entries[index + 1].revents != 0 ? .ready
                        : registration.deadline.nanoseconds <= now ? .timedOut : nil
                    if let outcome, registry.waiting.removeValue(forKey: registration.id) != nil {
                        due.append((registration, outcome))
                    }
                }
                return due
            }
            for (registration, outcome) in due {
                if let next = registration.advance(outcome) { register(registration.waiting(for: next), wake: false) }
            }
        }
    }
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
