import Dispatch
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LatticeAPI
import LatticeCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A device's push stream (`GET /push/{token}`, server-sent events) as the engine holds it: one per account
/// and server in a process (`PushListener.shared`), read on a thread of its own, reconnected with
/// `Last-Event-ID` when it drops (nothing is missed: the server keeps notifications), and woken waits
/// (`LatticeSyncEngine.waitForServerChanges`) when a notification comes. A server without push streams
/// (its `tokens/create` answers no push token) leaves the engine on `changes/wait`.
package final class PushListener: Sendable {
    private struct State {
        var lastEventID: String?
        /// A notification came that no wait has taken yet.
        var pending = false
        /// The stream answered `ready` since it last (re)connected.
        var connected = false
        var waiters: [Int: CheckedContinuation<Bool, Never>] = [:]
        var nextWaiter = 0
        var stopped = false
        /// The reader thread runs.
        var running = false
        var failures = 0
    }

    let url: URL
    private let state = Mutex(State())

    private init(url: URL) { self.url = url }

    // MARK: One listener per account and server

    private static let listeners = Mutex<[String: PushListener]>([:])
    /// Servers that answered no push token: their engines stay on `changes/wait`.
    private static let unsupported = Mutex<Set<String>>([])

    /// The listener of the account behind `client` and `token`, made (push token, registration, database
    /// subscriptions of both databases) on first use; nil when the server has no push streams or could not
    /// make one now (the caller falls back to `changes/wait`).
    package static func listener(serverURL: String, token: String, client: ServerClient, timeout: TimeInterval) async
        -> PushListener? {
        let key = serverURL + " " + token
        if let found = listeners.withLock({ $0[key] }) { return found }
        if unsupported.withLock({ $0.contains(serverURL) }) { return nil }
        do {
            let made = try await client.call("private", "tokens/create", PushTokenRequest(apnsEnvironment: "production").json,
                                             token: token, timeout: timeout)
            guard let push = made["apnsToken"]?.stringValue, let courier = made["webcourierURL"]?.stringValue,
                  let url = URL(string: courier) else {
                unsupported.withLock { _ = $0.insert(serverURL) }
                return nil
            }
            _ = try await client.call("private", "tokens/register",
                                      PushTokenRequest(apnsEnvironment: "production", apnsToken: push).json,
                                      token: token, timeout: timeout)
            for scope in ["private", "shared"] {
                let subscription = WireSubscription(subscriptionID: "lattice.sync." + scope, subscriptionType: .database)
                // A subscription of that id made by an earlier run answers EXISTS or itself: either is fine.
                _ = try await client.call(scope, "subscriptions/modify",
                                          SubscriptionsModifyRequest(operations: [.init(.create, subscription)]).json,
                                          token: token, timeout: timeout)
            }
            let listener = PushListener(url: url)
            let chosen = listeners.withLock { listeners -> PushListener in
                if let earlier = listeners[key] { return earlier }
                listeners[key] = listener
                return listener
            }
            chosen.startIfNeeded()
            // The first wait goes on the stream: give it up to 2 s to connect (else that wait parks changes/wait).
            for _ in 0..<100 where !chosen.state.withLock({ $0.connected }) {
                try? await Task.sleep(for: .milliseconds(20))
            }
            return chosen
        } catch {
            return nil
        }
    }

    /// A change this process sent for the account: its other engines' waits return (the server does not tell
    /// a device of its own changes, and to the server every engine of this token is one device).
    package static func noteLocalChange(serverURL: String, token: String) {
        listeners.withLock { $0[serverURL + " " + token] }?.notified()
    }

    // MARK: Waiting

    /// True as soon as a notification comes (or one came since the last wait), false after `seconds`, nil when
    /// the stream is not connected (the caller asks `changes/wait` instead).
    package func wait(seconds: Double) async -> Bool? {
        let (taken, connected) = state.withLock { state -> (Bool, Bool) in
            if state.pending {
                state.pending = false
                return (true, true)
            }
            return (false, state.connected)
        }
        if taken { return true }
        guard connected else { return nil }
        let id = state.withLock { state -> Int in
            state.nextWaiter += 1
            return state.nextWaiter
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let resumeNow = state.withLock { state -> Bool? in
                    if state.pending {
                        state.pending = false
                        return true
                    }
                    if state.stopped { return false }
                    state.waiters[id] = continuation
                    return nil
                }
                if let resumeNow { return continuation.resume(returning: resumeNow) }
                DispatchQueue.global().asyncAfter(deadline: .now() + seconds) { [self] in finish(id, false) }
            }
        } onCancel: {
            finish(id, false)
        }
    }

    private func finish(_ id: Int, _ value: Bool) {
        let waiter = state.withLock { $0.waiters.removeValue(forKey: id) }
        waiter?.resume(returning: value)
    }

    /// A notification came: every wait returns true, or the next one does.
    private func notified() {
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            let all = Array(state.waiters.values)
            state.waiters = [:]
            if all.isEmpty { state.pending = true }
            return all
        }
        for waiter in waiters { waiter.resume(returning: true) }
    }

    // MARK: Reading

    private func startIfNeeded() {
        let start = state.withLock { state -> Bool in
            guard !state.running, !state.stopped else { return false }
            state.running = true
            return true
        }
        guard start else { return }
        let thread = Thread { [self] in readLoop() }
        thread.name = "lattice-push"
        thread.start()
    }

    /// Connects, reads until the stream ends, and connects again after a pause (1 s, doubling to 60 s while
    /// it keeps failing); ends when the server revokes the token.
    private func readLoop() {
        while !state.withLock({ $0.stopped }) {
            let lastEventID = state.withLock { $0.lastEventID }
            let ended = PushStreamReader.read(url, lastEventID: lastEventID) { [self] event in
                switch event {
                case .ready(let id):
                    // Connected (again): a reconnect resumes after the last event read, so the server sends what
                    // came meanwhile.
                    state.withLock { state in
                        state.connected = true
                        state.failures = 0
                        if let id { state.lastEventID = id }
                    }
                case .notification(let id):
                    state.withLock { if let id { $0.lastEventID = id } }
                    notified()
                case .revoked:
                    state.withLock { $0.stopped = true }
                }
            }
            let pause = state.withLock { state -> Double in
                state.connected = false
                state.failures += 1
                return min(60, pow(2, Double(min(state.failures - 1, 6))))
            }
            if ended == .revoked || state.withLock({ $0.stopped }) { break }
            Thread.sleep(forTimeInterval: pause)
        }
        let waiters = state.withLock { state -> [CheckedContinuation<Bool, Never>] in
            state.running = false
            defer { state.waiters = [:] }
            return Array(state.waiters.values)
        }
        for waiter in waiters { waiter.resume(returning: false) }
    }
}

/// Reads one connection of a push stream: `http://` on a socket of its own (HTTP/1.0, so the body is the
/// events as they come, until the server closes), `https://` through URLSession.
enum PushStreamReader {
    enum Event {
        case ready(String?)
        case notification(String?)
        case revoked
    }

    enum End: Equatable {
        case closed
        case revoked
    }

    /// No byte for this long (the server's heartbeat is 30 s by default) means the stream is dead.
    static let idleSeconds = 75

    static func read(_ url: URL, lastEventID: String?, onEvent: (Event) -> Void) -> End {
        var parser = ServerSentEvents()
        var end = End.closed
        let handle: ([UInt8]) -> Bool = { bytes in
            for event in parser.feed(bytes) {
                switch event.type {
                case "ready": onEvent(.ready(event.id))
                case "notification": onEvent(.notification(event.id))
                case "revoked":
                    onEvent(.revoked)
                    end = .revoked
                    return false
                default: break
                }
            }
            return true
        }
        if url.scheme == "https" {
            readOverURLSession(url, lastEventID: lastEventID, handle)
        } else {
            readOverSocket(url, lastEventID: lastEventID, handle)
        }
        return end
    }

    private static func readOverSocket(_ url: URL, lastEventID: String?, _ handle: ([UInt8]) -> Bool) {
        guard let host = url.host else { return }
        let port = url.port ?? 80
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &found) == 0, let first = found else { return }
        defer { freeaddrinfo(first) }
        let fd = socket(first.pointee.ai_family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { return }
        defer { close(fd) }
        var timeout = timeval(tv_sec: idleSeconds, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var sendTimeout = timeval(tv_sec: 10, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &sendTimeout, socklen_t(MemoryLayout<timeval>.size))
        guard connect(fd, first.pointee.ai_addr, first.pointee.ai_addrlen) == 0 else { return }
        var head = "GET \(url.path) HTTP/1.0\r\nHost: \(host):\(port)\r\nAccept: text/event-stream\r\n"
        if let lastEventID { head += "Last-Event-ID: \(lastEventID)\r\n" }
        head += "\r\n"
        let request = Array(head.utf8)
        guard request.withUnsafeBytes({ send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }) == request.count else { return }
        var buffer = [UInt8](repeating: 0, count: 8_192)
        var header: [UInt8] = []
        var inBody = false
        while true {
            let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { return }
            var bytes = Array(buffer[0..<count])
            if !inBody {
                header += bytes
                guard let end = header.firstRange(of: [13, 10, 13, 10]) else {
                    if header.count > 16_384 { return }
                    continue
                }
                let status = String(decoding: header[..<end.lowerBound], as: UTF8.self).split(separator: " ").dropFirst().first
                guard status == "200" else { return }
                bytes = Array(header[end.upperBound...])
                header = []
                inBody = true
            }
            if !handle(bytes) { return }
        }
    }

    private static func readOverURLSession(_ url: URL, lastEventID: String?, _ handle: ([UInt8]) -> Bool) {
        let collector = StreamCollector()
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = Double(idleSeconds)
        configuration.timeoutIntervalForResource = 7 * 24 * 3600
        let session = URLSession(configuration: configuration, delegate: collector, delegateQueue: nil)
        defer { session.invalidateAndCancel() }
        var request = URLRequest(url: url)
        request.setValue("text/event-stream", forHTTPHeaderField: "Accept")
        if let lastEventID { request.setValue(lastEventID, forHTTPHeaderField: "Last-Event-ID") }
        let task = session.dataTask(with: request)
        task.resume()
        while let chunk = collector.next() {
            if !handle(chunk) {
                task.cancel()
                return
            }
        }
    }

    /// The bytes of one URLSession stream, handed to the reading thread in order. Every member is behind
    /// `state`'s lock; the semaphore counts the chunks (and the end) not yet taken.
    final class StreamCollector: NSObject, URLSessionDataDelegate, Sendable {
        private let state = Mutex<(chunks: [[UInt8]], ended: Bool)>(([], false))
        private let available = DispatchSemaphore(value: 0)

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
            completionHandler((response as? HTTPURLResponse)?.statusCode == 200 ? .allow : .cancel)
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
            state.withLock { $0.chunks.append([UInt8](data)) }
            available.signal()
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
            state.withLock { $0.ended = true }
            available.signal()
        }

        /// The next chunk, or nil once the stream ended.
        func next() -> [UInt8]? {
            available.wait()
            return state.withLock { state -> [UInt8]? in
                if !state.chunks.isEmpty { return state.chunks.removeFirst() }
                return nil
            }
        }
    }
}

/// A server-sent-event parser (the `text/event-stream` format): lines of `field: value`, an event per blank
/// line, comments (`:`) ignored. Bounded: a line over 64 KiB ends the stream's parse (the caller drops it).
struct ServerSentEvents {
    struct Event {
        var type = "message"
        var id: String?
        var data = ""
    }

    private var line: [UInt8] = []
    private var current = Event()
    private var hasField = false

    mutating func feed(_ bytes: [UInt8]) -> [Event] {
        var events: [Event] = []
        for byte in bytes {
            if byte == 10 {
                if line.last == 13 { line.removeLast() }
                if line.isEmpty {
                    if hasField { events.append(current) }
                    current = Event()
                    hasField = false
                } else if line.first != UInt8(ascii: ":") {
                    let text = String(decoding: line, as: UTF8.self)
                    let parts = text.split(separator: ":", maxSplits: 1, omittingEmptySubsequences: false)
                    let field = String(parts[0])
                    var value = parts.count > 1 ? String(parts[1]) : ""
                    if value.hasPrefix(" ") { value.removeFirst() }
                    hasField = true
                    switch field {
                    case "event": current.type = value
                    case "id": current.id = value
                    case "data": current.data += current.data.isEmpty ? value : "\n" + value
                    default: break
                    }
                }
                line.removeAll(keepingCapacity: true)
            } else if line.count < 65_536 {
                line.append(byte)
            }
        }
        return events
    }
}
