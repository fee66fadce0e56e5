import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Every open connection, with what it is doing and since when, so that:
/// - a connection slow to send its headers or its body is dropped (slowloris), not parked;
/// - one address holds at most `perAddressLimit` connections (a trusted proxy is exempt; an IPv6 /64
///   counts as one address, `ClientAddress.limitKey(_:)`);
/// - a parked request (long poll, or waiting for a worker) whose client closed its socket is noticed,
///   although libmicrohttpd does not poll suspended connections.
///
/// A sweeper thread checks every `sweepInterval`. Dropping means `shutdown(fd, SHUT_RDWR)`: libmicrohttpd
/// then sees the socket end and closes the connection itself. The descriptor cannot have been reused:
/// libmicrohttpd reports a connection closed (`closed(_:)`, which removes its record under the lock)
/// before it closes the socket, and every `shutdown` here runs under that same lock on a record present.
final class HTTPConnectionGuard: Sendable {
    struct Limits: Sendable {
        var perAddress: Int
        var headerTimeout: Duration
        var bodyTimeout: Duration
        /// The body timeout of a streamed body (an upload), which may be far larger than a buffered one.
        var streamedBodyTimeout: Duration
        var minimumBodyBytesPerSecond: Int
        var bodyRateGrace: Duration
    }

    enum Phase {
        /// Waiting for the complete headers of the next request, since `since`.
        case awaitingHeaders
        /// Headers in; body arriving since `since`.
        case receivingBody(bytes: Int)
        /// Being handled or answered: libmicrohttpd's own idle timeout covers a stalled answer.
        case busy
        /// Suspended (waiting for a worker, or a long poll): checked for a closed peer.
        case parked(HTTPExchange)
    }

    private struct Record {
        let fd: Int32
        /// The limit key (`ClientAddress.limitKey(_:)`) counted against `perAddress`; nil for a trusted proxy.
        let countedAddress: String?
        var phase: Phase = .awaitingHeaders
        var since: ContinuousClock.Instant
        var dropped = false
        /// The request's body is streamed: `streamedBodyTimeout` applies (until the next request).
        var streamed = false
    }

    private struct State {
        var records: [UInt: Record] = [:]
        var perAddress: [String: Int] = [:]
        var stopped = false
        var droppedSlow = 0
        var droppedOverLimit = 0
        var abandoned = 0
    }

    private let limits: Limits
    private let resolver: ClientAddressResolver
    private let state = Mutex(State())
    private let sweepInterval: Duration = .milliseconds(100)

    init(limits: Limits, resolver: ClientAddressResolver) {
        self.limits = limits
        self.resolver = resolver
    }

    /// Starts the sweeper; it stops after `stop()`.
    func start() {
        let thread = Thread { [self] in
            while !state.withLock({ $0.stopped }) {
                Thread.sleep(forTimeInterval: Double(sweepInterval.components.attoseconds) / 1e18)
                sweep(now: .now)
            }
        }
        thread.name = "lattice-http-sweeper"
        thread.start()
    }

    func stop() {
        state.withLock { $0.stopped = true }
    }

    private static func key(_ connection: OpaquePointer) -> UInt { UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection))) }

    /// A connection was accepted. Over the per-address limit it is dropped at once.
    func opened(_ connection: OpaquePointer, fd: Int32, peer: String) {
        let counted: String? = resolver.isTrustedProxy(peer) ? nil : ClientAddress.limitKey(peer)
        state.withLock { state in
            var record = Record(fd: fd, countedAddress: counted, since: .now)
            if let counted {
                let count = state.perAddress[counted, default: 0] + 1
                state.perAddress[counted] = count
                if count > limits.perAddress, fd >= 0 {
                    record.dropped = true
                    state.droppedOverLimit += 1
                    shutdown(fd, Int32(SHUT_RDWR))
                }
            }
            state.records[Self.key(connection)] = record
        }
    }

    /// libmicrohttpd is about to close the connection's socket.
    func closed(_ connection: OpaquePointer) {
        state.withLock { state in
            guard let record = state.records.removeValue(forKey: Self.key(connection)) else { return }
            if let counted = record.countedAddress {
                let count = state.perAddress[counted, default: 1] - 1
                state.perAddress[counted] = count > 0 ? count : nil
            }
        }
    }

    func move(_ connection: OpaquePointer, to phase: Phase, resetClock: Bool = false) {
        state.withLock { state in
            let key = Self.key(connection)
            guard state.records[key] != nil else { return }
            state.records[key]!.phase = phase
            if resetClock { state.records[key]!.since = .now }
            if case .awaitingHeaders = phase { state.records[key]!.streamed = false }
        }
    }

    /// The current request's body is streamed (`HTTPAdmission.stream`).
    func markStreamed(_ connection: OpaquePointer) {
        state.withLock { state in
            let key = Self.key(connection)
            guard state.records[key] != nil else { return }
            state.records[key]!.streamed = true
        }
    }

    func bodyReceived(_ connection: OpaquePointer, bytes: Int) {
        state.withLock { state in
            let key = Self.key(connection)
            guard let record = state.records[key], case .receivingBody(let earlier) = record.phase else { return }
            state.records[key]!.phase = .receivingBody(bytes: earlier + bytes)
        }
    }

    /// Drops connections past their deadlines; reports parked requests whose peer has gone, after
    /// shutting their sockets down.
    func sweep(now: ContinuousClock.Instant) {
        let gone: [HTTPExchange] = state.withLock { state in
            var gone: [HTTPExchange] = []
            for (key, record) in state.records where !record.dropped && record.fd >= 0 {
                let elapsed = now - record.since
                var drop = false
                switch record.phase {
                case .awaitingHeaders:
                    drop = elapsed > limits.headerTimeout
                case .receivingBody(let bytes):
                    // libmicrohttpd (0.9.75, epoll) can miss a peer that closed mid-body, with everything read:
                    // the request would stay open until the timeouts below. Dropping it ends the request (an
                    // upload then keeps what arrived).
                    if Self.senderHasGone(record.fd) {
                        drop = true
                    } else if elapsed > (record.streamed ? limits.streamedBodyTimeout : limits.bodyTimeout) {
                        drop = true
                    } else if elapsed > limits.bodyRateGrace, limits.minimumBodyBytesPerSecond > 0 {
                        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
                        drop = Double(bytes) < Double(limits.minimumBodyBytesPerSecond) * seconds
                    }
                case .busy:
                    break
                case .parked(let exchange):
                    if Self.peerHasGone(record.fd) {
                        drop = true
                        gone.append(exchange)
                        state.abandoned += 1
                    }
                }
                if drop {
                    if case .parked = record.phase {} else { state.droppedSlow += 1 }
                    state.records[key]!.dropped = true
                    shutdown(record.fd, Int32(SHUT_RDWR))
                }
            }
            return gone
        }
        for exchange in gone { exchange.abandon() }
    }

    /// Whether the peer closed (or reset) a socket nobody reads: readable with nothing to read, or hung up.
    private static func peerHasGone(_ fd: Int32) -> Bool {
        // POLLRDHUP (the peer shut down its side) needs _GNU_SOURCE in C, so Swift does not see it.
        let peerClosed: Int16 = 0x2000
        let hungUp: Int16 = Int16(POLLHUP) | Int16(POLLERR) | Int16(POLLNVAL) | peerClosed
        var descriptor = pollfd(fd: fd, events: Int16(POLLIN) | peerClosed, revents: 0)
        guard poll(&descriptor, 1, 0) > 0 else { return false }
        if descriptor.revents & hungUp != 0 { return true }
        var byte: UInt8 = 0
        let peeked = recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT))
        return peeked == 0 || (peeked < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
    }

    /// Whether the peer of a connection receiving a body closed it with nothing left unread: its end of
    /// file is all the socket holds (bytes still waiting mean the body may yet be complete).
    private static func senderHasGone(_ fd: Int32) -> Bool {
        let peerClosed: Int16 = 0x2000 // POLLRDHUP
        var descriptor = pollfd(fd: fd, events: peerClosed, revents: 0)
        guard poll(&descriptor, 1, 0) > 0 else { return false }
        if descriptor.revents & (Int16(POLLHUP) | Int16(POLLERR) | Int16(POLLNVAL)) != 0 { return true }
        guard descriptor.revents & peerClosed != 0 else { return false }
        var byte: UInt8 = 0
        return recv(fd, &byte, 1, Int32(MSG_PEEK | MSG_DONTWAIT)) == 0
    }

    /// Open connections counted against the per-address limit under `address`'s limit key.
    func openConnections(from address: String) -> Int {
        let key = ClientAddress.limitKey(address)
        return state.withLock { $0.perAddress[key, default: 0] }
    }

    struct Counters: Equatable {
        var open: Int
        var droppedSlow: Int
        var droppedOverLimit: Int
        var abandoned: Int
    }

    var counters: Counters {
        state.withLock { Counters(open: $0.records.count, droppedSlow: $0.droppedSlow,
                                  droppedOverLimit: $0.droppedOverLimit, abandoned: $0.abandoned) }
    }
}
