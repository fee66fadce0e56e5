import CHTTPShims
import CMicroHTTPD
import Foundation
import Synchronization

/// Serves an `HTTPHandler` over HTTP/1.1 with libmicrohttpd: a pool of HTTP threads polling the
/// connections (accept, parse, write), handlers on a worker pool of their own shared fairly between
/// clients, request bodies capped and budgeted before they are buffered, the token checked from the
/// headers (`HTTPHandler.admit`), header and body deadlines, per-address limits that see through trusted
/// proxies, and late answers (long polls) that park their connection instead of a thread.
///
/// ```swift
/// let server = try HTTPServer(handler: service, configuration: HTTPServerConfiguration(port: 0))
/// print("listening on 127.0.0.1:\(server.port)")
/// // ...
/// server.shutdown()
/// ```
///
/// The server listens from `init` until `shutdown()`, which also runs when the last reference goes away.
public final class HTTPServer: Sendable {
    /// The port the server listens on: the configured one, or the one picked for port 0.
    public let port: UInt16

    private let context: HTTPDaemonContext
    private let gracePeriod: Duration
    /// The running daemon, `nil` once shut down. Held for the whole of `shutdown()`.
    private let daemon: Mutex<DaemonHandle?>

    /// Starts listening. Throws `HTTPServerError` when the configuration is invalid or the address cannot
    /// be bound.
    public init(handler: any HTTPHandler, configuration: HTTPServerConfiguration) throws {
        let bindAddress = try configuration.validatedBindAddress()
        let context = HTTPDaemonContext(handler: handler, configuration: configuration)
        var settings = lattice_mhd_config(
            bind_address_be: bindAddress,
            port: configuration.port,
            thread_pool_size: UInt32(configuration.threadPoolSize),
            connection_timeout_s: UInt32(configuration.connectionTimeoutSeconds),
            // The per-address limit is ours (HTTPConnectionGuard), so a trusted proxy can be exempt.
            per_ip_connection_limit: 0,
            connection_limit: UInt32(configuration.connectionLimit),
            connection_memory_limit: configuration.connectionMemoryLimit)
        // Unretained: `self.context` outlives the daemon, which `shutdown()` stops before `self` goes away.
        let pointer = Unmanaged.passUnretained(context).toOpaque()
        guard let started = lattice_mhd_start_tracked(&settings, accessRequest, pointer, requestCompleted, pointer,
                                                      requestStarted, pointer, connectionChanged, pointer,
                                                      acceptConnection, pointer)
        else {
            context.workers.stop()
            throw HTTPServerError.cannotListen(host: configuration.host, port: configuration.port)
        }
        context.connections.start()
        self.port = lattice_mhd_bound_port(started)
        self.context = context
        self.gracePeriod = .seconds(configuration.shutdownGracePeriodSeconds)
        self.daemon = Mutex(DaemonHandle(started))
    }

    deinit {
        shutdown()
    }

    /// Stops gracefully, then returns; later calls do nothing.
    ///
    /// In order: stop taking connections (each new one is closed at once); call `HTTPHandler.beginShutdown()` once so the handler answers
    /// whatever waits (long polls); let requests in flight finish and their answers go out, each closing its
    /// connection; after the grace period answer the stragglers with 503; stop the daemon.
    /// Call it from outside the handler: it blocks until requests in flight are done.
    public func shutdown() {
        daemon.withLock { handle in
            guard let running = handle else { return }
            handle = nil
            // From here new connections are closed as they are accepted (`acceptConnection`).
            context.beginDraining()
            context.handler.beginShutdown()
            if !context.waitUntilQuiet(before: .now + gracePeriod) {
                context.refuseEverything(with: Self.shuttingDownResponse)
                _ = context.waitUntilQuiet(before: .now + .seconds(2))
            }
            context.workers.stop()
            context.connections.stop()
            MHD_stop_daemon(running.pointer)
        }
    }

    /// Requests between their request line and their completion (tests watch this go back to zero).
    var inFlightRequestCount: Int { context.inFlightCount }

    /// Open connections, and how many were dropped as too slow, over the per-address limit, or
    /// abandoned by their client while parked.
    var connectionCounters: HTTPConnectionGuard.Counters { context.connections.counters }

    /// Connections open now from `address`, as the per-address limit counts them.
    func openConnections(from address: String) -> Int { context.connections.openConnections(from: address) }

    /// Requests waiting in line for a worker now.
    var queuedRequestCount: Int { context.workers.queuedCount }

    /// Bytes of request bodies held against the server-wide budget now.
    var bufferedBodyBytes: Int { context.bufferedBodyByteCount }

    /// The adapter's own answer to stragglers at shutdown: JSON like every answer of the API.
    static let shuttingDownResponse = HTTPResponse(
        status: 503,
        headers: [("Content-Type", "application/json; charset=utf-8"), ("Connection", "close"), ("Retry-After", "1")],
        body: Array(#"{"reason":"the server is shutting down","retryAfter":1,"serverErrorCode":"TRY_AGAIN_LATER"}"#.utf8))
}

/// The daemon pointer, so it can sit in a `Mutex`.
private struct DaemonHandle {
    let pointer: OpaquePointer

    init(_ pointer: OpaquePointer) {
        self.pointer = pointer
    }
}
