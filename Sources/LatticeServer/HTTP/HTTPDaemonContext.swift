import CHTTPShims
import CMicroHTTPD
import Foundation
import Synchronization

/// What libmicrohttpd's callbacks reach through their context pointer: the handler and the requests in
/// flight (from request line to completion), which shutdown waits for.
final class HTTPDaemonContext: Sendable {
    let handler: any HTTPHandler
    let connections: HTTPConnectionGuard
    let workers: HTTPWorkerPool
    let resolver: ClientAddressResolver
    let accessLog: (@Sendable (String) -> Void)?
    private let bodyBudget: BodyBudget
    /// Requests in flight per forwarded client address, when the peer is a trusted proxy: each such
    /// client gets `perForwardedClient` of them, as a direct client gets that many connections.
    private let forwardedInFlight = Mutex<[String: Int]>([:])
    private let perForwardedClient: Int

    private struct Registry {
        var exchanges: [ObjectIdentifier: HTTPExchange] = [:]
        /// Shutdown started: answers carry `Connection: close`.
        var isDraining = false
        /// The grace period is over: every request, present or future, gets `refusal` instead of a handler.
        var refusal: HTTPResponse?
    }

    private let registry = Mutex(Registry())

    init(handler: any HTTPHandler, configuration: HTTPServerConfiguration) {
        self.handler = handler
        resolver = ClientAddressResolver(trustedProxies: configuration.trustedProxies)
        connections = HTTPConnectionGuard(
            limits: .init(perAddress: configuration.perIPConnectionLimit,
                          headerTimeout: .seconds(configuration.headerTimeoutSeconds),
                          bodyTimeout: .seconds(configuration.bodyTimeoutSeconds),
                          streamedBodyTimeout: .seconds(configuration.streamedBodyTimeoutSeconds),
                          minimumBodyBytesPerSecond: configuration.minimumBodyBytesPerSecond,
                          bodyRateGrace: .seconds(configuration.bodyRateGraceSeconds)),
            resolver: resolver)
        workers = HTTPWorkerPool(limits: .init(threads: configuration.workerThreads,
                                               perClientRunning: configuration.workersPerClient,
                                               perClientQueued: configuration.queuedRequestsPerClient,
                                               totalQueued: configuration.requestQueueLimit,
                                               maximumWait: .milliseconds(configuration.maximumQueueWaitMilliseconds)))
        accessLog = configuration.accessLog
        bodyBudget = BodyBudget(total: configuration.bodyBufferBudgetBytes, largestBody: handler.maximumBodySize)
        perForwardedClient = configuration.perIPConnectionLimit
    }

    // MARK: Body budget

    /// Reserves `bytes` of the body budget for `client`; false (and nothing reserved) if it would pass the
    /// server-wide budget or the client's share of it.
    func reserveBody(_ bytes: Int, client: String) -> Bool { bodyBudget.reserve(bytes, client: client) }

    func releaseBody(_ bytes: Int, client: String) { bodyBudget.release(bytes, client: client) }

    var bufferedBodyByteCount: Int { bodyBudget.reservedInAll }

    // MARK: Forwarded clients

    /// Counts a request from a client behind a trusted proxy; false if it has its share in flight.
    func admitForwarded(_ client: String) -> Bool {
        forwardedInFlight.withLock { counts in
            let count = counts[client, default: 0]
            guard count < perForwardedClient else { return false }
            counts[client] = count + 1
            return true
        }
    }

    func finishForwarded(_ client: String) {
        forwardedInFlight.withLock { counts in
            let count = counts[client, default: 1] - 1
            counts[client] = count > 0 ? count : nil
        }
    }

    var isDraining: Bool { registry.withLock { $0.isDraining } }

    var inFlightCount: Int { registry.withLock { $0.exchanges.count } }

    /// Starts tracking a new request.
    func open(connection: OpaquePointer, target: String) -> HTTPExchange {
        let exchange = HTTPExchange(connection: connection, target: target)
        let refusal = registry.withLock { registry in
            registry.exchanges[ObjectIdentifier(exchange)] = exchange
            return registry.refusal
        }
        if let refusal { exchange.deliver(refusal) }
        return exchange
    }

    /// Stops tracking a request: libmicrohttpd is done with it.
    func close(_ exchange: HTTPExchange) {
        _ = registry.withLock { $0.exchanges.removeValue(forKey: ObjectIdentifier(exchange)) }
    }

    func beginDraining() {
        registry.withLock { $0.isDraining = true }
    }

    /// Answers every request in flight with `response` (those already answered keep their answer) and every
    /// later one too, without calling the handler. Afterwards no connection can be left suspended.
    func refuseEverything(with response: HTTPResponse) {
        let pending = registry.withLock { registry in
            registry.isDraining = true
            registry.refusal = response
            return Array(registry.exchanges.values)
        }
        for exchange in pending { exchange.deliver(response) }
    }

    /// Waits until no request is in flight or `deadline` passes; returns whether it went quiet.
    func waitUntilQuiet(before deadline: ContinuousClock.Instant) -> Bool {
        while inFlightCount > 0 {
            if ContinuousClock.now >= deadline { return false }
            Thread.sleep(forTimeInterval: 0.005)
        }
        return true
    }
}

// MARK: - Callbacks
//
// Plain non-isolated functions with C calling convention; the context arrives as an unretained pointer to
// the `HTTPDaemonContext`, which the `HTTPServer` keeps alive until the daemon has stopped. Each request's
// `HTTPExchange` is retained into `*con_cls` and released in `requestCompleted`.

/// `MHD_OPTION_URI_LOG_CALLBACK`: the first thing the library reports about a request, with the target
/// exactly as sent. Its result becomes the request's `*con_cls`.
func requestStarted(_ context: UnsafeMutableRawPointer?, _ uri: UnsafePointer<CChar>?,
                    _ connection: OpaquePointer?) -> UnsafeMutableRawPointer? {
    guard let context, let connection else { return nil }
    let daemon = Unmanaged<HTTPDaemonContext>.fromOpaque(context).takeUnretainedValue()
    let target = uri.map { String(cString: $0) } ?? "/"
    return Unmanaged.passRetained(daemon.open(connection: connection, target: target)).toOpaque()
}

/// `MHD_AccessHandlerCallback`.
func accessRequest(
    _ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadSize: UnsafeMutablePointer<Int>?, _ requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    guard let context, let connection, let uploadSize, let requestContext else { return .NO }
    let daemon = Unmanaged<HTTPDaemonContext>.fromOpaque(context).takeUnretainedValue()
    let exchange: HTTPExchange
    if let existing = requestContext.pointee {
        exchange = Unmanaged<HTTPExchange>.fromOpaque(existing).takeUnretainedValue()
    } else {
        // Only if the request-line callback did not run; the library's decoded URL is the best left.
        exchange = daemon.open(connection: connection, target: url.map { String(cString: $0) } ?? "/")
        requestContext.pointee = Unmanaged.passRetained(exchange).toOpaque()
    }
    let healthy = exchange.advance(in: daemon, method: method, version: version, uploadData: uploadData,
                                   uploadSize: uploadSize)
    return healthy ? .YES : .NO
}

/// `MHD_RequestCompletedCallback`: the answer went out, or the connection failed, timed out or closed.
func requestCompleted(_ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                      _ requestContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                      _ reason: MHD_RequestTerminationCode) {
    guard let context else { return }
    let daemon = Unmanaged<HTTPDaemonContext>.fromOpaque(context).takeUnretainedValue()
    // The connection waits for its next request from now on.
    if let connection { daemon.connections.move(connection, to: .awaitingHeaders, resetClock: true) }
    guard let requestContext, let raw = requestContext.pointee else { return }
    requestContext.pointee = nil
    let exchange = Unmanaged<HTTPExchange>.fromOpaque(raw).takeRetainedValue()
    exchange.complete(in: daemon, completedNormally: reason == .REQUEST_TERMINATED_COMPLETED_OK)
    daemon.close(exchange)
}

/// `MHD_AcceptPolicyCallback`: while the server shuts down (draining), a new connection is closed as soon
/// as it is accepted; otherwise every one is taken.
func acceptConnection(_ context: UnsafeMutableRawPointer?, _ address: UnsafePointer<sockaddr>?,
                      _ length: socklen_t) -> MHD_Result {
    guard let context else { return .YES }
    return Unmanaged<HTTPDaemonContext>.fromOpaque(context).takeUnretainedValue().isDraining ? .NO : .YES
}

/// `MHD_NotifyConnectionCallback`: a connection was accepted, or is about to be closed (before its
/// socket is).
func connectionChanged(_ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?,
                       _ socketContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?,
                       _ change: MHD_ConnectionNotificationCode) {
    guard let context, let connection else { return }
    let daemon = Unmanaged<HTTPDaemonContext>.fromOpaque(context).takeUnretainedValue()
    switch change {
    case .CONNECTION_NOTIFY_STARTED:
        daemon.connections.opened(connection, fd: lattice_mhd_connection_fd(connection),
                                  peer: peerAddress(of: connection))
    case .CONNECTION_NOTIFY_CLOSED:
        daemon.connections.closed(connection)
    default:
        break
    }
}

/// The server-wide budget for buffered request bodies, shared fairly: one client (an account, or an
/// address before sign-in) may hold at most an eighth of it (and at least one largest body), so one
/// client holding bodies open cannot spend it for everyone; and small bodies (64 KiB or less, such as a
/// one-record write) may use an eighth more than the budget, so they still get in when large ones have
/// taken it all.
final class BodyBudget: Sendable {
    private struct State {
        var total = 0
        var perClient: [String: Int] = [:]
    }

    static let smallBody = 64 * 1024
    private let budget: Int
    private let perClientShare: Int
    private let state = Mutex(State())

    init(total: Int, largestBody: Int) {
        budget = total
        perClientShare = max(total / 8, min(total, largestBody))
    }

    func reserve(_ bytes: Int, client: String) -> Bool {
        guard bytes > 0 else { return true }
        let ceiling = bytes <= Self.smallBody ? budget + budget / 8 : budget
        return state.withLock { state in
            let held = state.perClient[client, default: 0]
            guard state.total + bytes <= ceiling, held + bytes <= perClientShare else { return false }
            state.total += bytes
            state.perClient[client] = held + bytes
            return true
        }
    }

    func release(_ bytes: Int, client: String) {
        guard bytes > 0 else { return }
        state.withLock { state in
            state.total -= bytes
            let left = state.perClient[client, default: 0] - bytes
            if left > 0 { state.perClient[client] = left } else { state.perClient[client] = nil }
        }
    }

    var reservedInAll: Int { state.withLock { $0.total } }
}
