import Dispatch
import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import Synchronization

/// The push streams this node holds: one server-sent-event stream per device (`GET /push/{token}`), woken
/// when a database it watches moves (a commit here, or one another node announced) and fed the device's
/// notifications from the storage (`Subscriptions.notifications`), so nothing a stream carries lives only
/// in this process: a device that reconnects anywhere resumes from its `Last-Event-ID`.
///
/// An idle stream costs no thread (its connection is suspended, `HTTPStreamBody`) and a bounded amount of
/// memory; every `heartbeatSeconds` each stream gets a comment line (so proxies keep it open and a dead peer
/// is found by the failed write) and its push token is checked again (a revoked device token ends it).
/// One device holds one stream: a new stream of a device ends its older one.
final class PushStreams: Sendable {
    /// One open stream.
    final class Stream: Sendable {
        let id: Int
        let body: HTTPStreamBody
        let addressKey: String
        let session: PushSession
        /// The last notification position sent (or skipped).
        let cursor: Mutex<Int64>

        init(id: Int, body: HTTPStreamBody, addressKey: String, session: PushSession, cursor: Int64) {
            self.id = id
            self.body = body
            self.addressKey = addressKey
            self.session = session
            self.cursor = Mutex(cursor)
        }
    }

    struct Limits: Sendable {
        var perUser: Int
        var perAddress: Int
        var heartbeatSeconds: Int
        /// Bytes a stream may have queued before its reader is cut off.
        var backlogBytes: Int
    }

    enum Registration {
        case opened(Stream)
        case overUserLimit
        case overAddressLimit
        case shuttingDown
    }

    private struct State {
        var nextID = 0
        var streams: [Int: Stream] = [:]
        var byDatabase: [Int64: Set<Int>] = [:]
        var byDevice: [String: Int] = [:]
        var perUser: [Int64: Int] = [:]
        var perAddress: [String: Int] = [:]
        /// Streams to read, and whether a drain is queued.
        var dirty: Set<Int> = []
        var draining = false
        /// A read failed (the storage was away): every stream reads again at the next heartbeat.
        var retryAll = false
        var shuttingDown = false
    }

    let limits: Limits
    private let state = Mutex(State())
    private let queue = DispatchQueue(label: "lattice-push")
    private let subscriptions: Mutex<Subscriptions?> = Mutex(nil)
    private let deadlineMilliseconds: Int64
    private let log: @Sendable (String) -> Void

    init(limits: Limits, deadlineMilliseconds: Int64, log: @escaping @Sendable (String) -> Void) {
        self.limits = limits
        self.deadlineMilliseconds = deadlineMilliseconds
        self.log = log
    }

    /// Where notifications are read from; set once the service's core exists.
    func attach(_ subscriptions: Subscriptions) {
        self.subscriptions.withLock { $0 = subscriptions }
        scheduleBeat()
    }

    /// The next heartbeat, on the streams' queue, until shutdown.
    private func scheduleBeat() {
        queue.asyncAfter(deadline: .now() + .seconds(max(1, limits.heartbeatSeconds))) { [weak self] in
            guard let self, !self.state.withLock({ $0.shuttingDown }) else { return }
            self.beat()
            self.scheduleBeat()
        }
    }

    /// Registers a stream for `session` whose client has seen everything up to `cursor`; the backlog after it
    /// is read at once. An older stream of the same device is ended.
    func open(session: PushSession, cursor: Int64, body: HTTPStreamBody, addressKey: String) -> Registration {
        let (registration, replaced): (Registration, Stream?) = state.withLock { state in
            guard !state.shuttingDown else { return (.shuttingDown, nil) }
            let older = state.byDevice[session.deviceTokenID].flatMap { state.streams[$0] }
            let userCount = state.perUser[session.userID, default: 0] - (older == nil ? 0 : 1)
            guard userCount < limits.perUser else { return (.overUserLimit, nil) }
            let sameAddress = older?.addressKey == addressKey ? 1 : 0
            guard state.perAddress[addressKey, default: 0] - sameAddress < limits.perAddress else {
                return (.overAddressLimit, nil)
            }
            if let older { Self.remove(older, &state) }
            state.nextID += 1
            let stream = Stream(id: state.nextID, body: body, addressKey: addressKey, session: session, cursor: cursor)
            state.streams[stream.id] = stream
            state.byDevice[session.deviceTokenID] = stream.id
            state.perUser[session.userID, default: 0] += 1
            state.perAddress[addressKey, default: 0] += 1
            for id in session.databases.keys { state.byDatabase[id, default: []].insert(stream.id) }
            state.dirty.insert(stream.id)
            return (.opened(stream), older)
        }
        if let replaced {
            replaced.body.send(Array("event: replaced\ndata: {}\n\n".utf8))
            replaced.body.finish()
        }
        if case .opened(let stream) = registration {
            body.onClose { [weak self] in self?.closed(stream) }
            scheduleDrain()
        }
        return registration
    }

    /// The databases some stream watches now (other nodes' announcements about the rest are not read).
    var watchedDatabaseIDs: Set<Int64> { state.withLock { Set($0.byDatabase.keys) } }

    var streamCount: Int { state.withLock { $0.streams.count } }

    /// These databases moved: their streams read what is new.
    func wake(databaseIDs: [Int64]) {
        let any = state.withLock { state -> Bool in
            var any = false
            for id in databaseIDs {
                guard let streams = state.byDatabase[id] else { continue }
                state.dirty.formUnion(streams)
                any = true
            }
            return any
        }
        if any { scheduleDrain() }
    }

    /// Ends every stream and refuses new ones.
    func shutDown() {
        let all: [Stream] = state.withLock { state in
            state.shuttingDown = true
            return Array(state.streams.values)
        }
        for stream in all { stream.body.finish() }
    }

    private func closed(_ stream: Stream) {
        state.withLock { Self.remove(stream, &$0) }
    }

    private static func remove(_ stream: Stream, _ state: inout State) {
        guard state.streams.removeValue(forKey: stream.id) != nil else { return }
        let session = stream.session
        if state.byDevice[session.deviceTokenID] == stream.id { state.byDevice[session.deviceTokenID] = nil }
        let users = state.perUser[session.userID, default: 1] - 1
        state.perUser[session.userID] = users > 0 ? users : nil
        let addresses = state.perAddress[stream.addressKey, default: 1] - 1
        state.perAddress[stream.addressKey] = addresses > 0 ? addresses : nil
        for id in session.databases.keys {
            state.byDatabase[id]?.remove(stream.id)
            if state.byDatabase[id]?.isEmpty == true { state.byDatabase[id] = nil }
        }
        state.dirty.remove(stream.id)
    }

    private func scheduleDrain() {
        let start = state.withLock { state -> Bool in
            guard !state.draining, !state.dirty.isEmpty else { return false }
            state.draining = true
            return true
        }
        if start { queue.async { [weak self] in self?.drain() } }
    }

    /// Reads and sends the new notifications of every dirty stream, until none is dirty.
    private func drain() {
        while true {
            let batch: [Stream] = state.withLock { state in
                let streams = state.dirty.compactMap { state.streams[$0] }
                state.dirty = []
                if streams.isEmpty { state.draining = false }
                return streams
            }
            if batch.isEmpty { return }
            for stream in batch { deliver(stream) }
        }
    }

    /// Sends a stream what is new for it: pages of at most 100 notifications, at most 10 pages a wake (a
    /// stream further behind is marked dirty again, so one stream cannot hold the queue).
    private func deliver(_ stream: Stream) {
        guard let subscriptions = subscriptions.withLock({ $0 }), !stream.body.isClosed else { return }
        let session = stream.session
        for _ in 0..<10 {
            let cursor = stream.cursor.withLock { $0 }
            let page: (events: [(Int64, JSON)], cursor: Int64)
            do {
                page = try subscriptions.notifications(session, after: cursor, limit: 100,
                                                       deadline: .after(milliseconds: deadlineMilliseconds))
            } catch {
                // The storage is away: look again at the next heartbeat (or the next change).
                log("push: could not read notifications (\(error)); the streams read again at the next heartbeat")
                state.withLock { $0.retryAll = true }
                return
            }
            var bytes: [UInt8] = []
            for (position, json) in page.events {
                bytes += Array("id: \(position)\nevent: notification\ndata: ".utf8)
                bytes += json.serializedBytes()
                bytes += Array("\n\n".utf8)
            }
            if !bytes.isEmpty && !stream.body.send(bytes) { return } // cut off, or gone
            stream.cursor.withLock { $0 = page.cursor }
            if page.cursor == cursor { return }
        }
        state.withLock { state in
            if state.streams[stream.id] != nil { state.dirty.insert(stream.id) }
        }
        scheduleDrain()
    }

    /// Every stream gets a comment line, and its push token is checked again.
    private func beat() {
        guard let subscriptions = subscriptions.withLock({ $0 }) else { return }
        let all: [Stream] = state.withLock { Array($0.streams.values) }
        for stream in all {
            let session = stream.session
            do {
                guard try subscriptions.isLive(session, deadline: .after(milliseconds: deadlineMilliseconds)) else {
                    stream.body.send(Array("event: revoked\ndata: {}\n\n".utf8))
                    stream.body.finish()
                    continue
                }
            } catch {
                // Checked again at the next beat.
            }
            stream.body.send(Array(": keep-alive\n\n".utf8))
        }
        // A change missed while the storage was away is read now.
        let retry = state.withLock { state -> Bool in
            guard state.retryAll else { return false }
            state.retryAll = false
            state.dirty.formUnion(state.streams.keys)
            return true
        }
        if retry { scheduleDrain() }
    }
}

extension LatticeService {
    /// `GET /push/{token}`: the push stream of the device whose push token (`tokens/create`, registered with
    /// `tokens/register`) is in the path, as `text/event-stream`. It opens with `event: ready` (its `id` is
    /// where the stream starts: the request's `Last-Event-ID`, else the newest position), then one
    /// `event: notification` per coalesced notification (`id` its position), and `: keep-alive` comments.
    /// A reconnect with `Last-Event-ID` misses nothing.
    func openPushStream(_ request: HTTPRequest, token: String) throws -> HTTPResponse {
        let subscriptions = Subscriptions(core)
        let deadline = freshDeadline()
        guard let session = try subscriptions.openSession(pushToken: token, deadline: deadline) else {
            throw failedSignIn(ServiceError(.authenticationFailed, "unknown or revoked push token; make one with tokens/create"),
                               address: request.remoteAddress)
        }
        let latest = try subscriptions.latestPosition(session, deadline: deadline)
        var cursor = latest
        if let header = request.header("last-event-id"), !header.isEmpty {
            guard let position = Int64(header), position >= 0 else {
                throw ServiceError.badRequest("Last-Event-ID must be a position this stream sent (a non-negative integer)")
            }
            cursor = min(position, latest)
        }
        let body = HTTPStreamBody(limit: pushStreams.limits.backlogBytes)
        body.send(Array("retry: 2000\nid: \(cursor)\nevent: ready\ndata: {\"lastEventID\":\"\(cursor)\"}\n\n".utf8))
        switch pushStreams.open(session: session, cursor: cursor, body: body, addressKey: request.addressLimitKey) {
        case .opened: break
        case .overUserLimit:
            throw ServiceError(.throttled, "this account holds \(configuration.maximumPushStreamsPerUser) push streams on "
                               + "this server; one stream per device serves every database", retryAfter: 5)
        case .overAddressLimit:
            throw ServiceError(.throttled, "this address holds \(configuration.maximumPushStreamsPerAddress) push streams "
                               + "on this server", retryAfter: 5)
        case .shuttingDown:
            throw ServiceError(.tryAgainLater, "the server is shutting down")
        }
        return HTTPResponse(status: 200, headers: [
            (name: "Content-Type", value: "text/event-stream; charset=utf-8"),
            (name: "Cache-Control", value: "no-store"),
            (name: "X-Accel-Buffering", value: "no"),
        ], stream: body)
    }
}
