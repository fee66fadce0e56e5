import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where an `HTTPServer` listens and the limits it enforces on connections.
///
/// ```swift
/// var configuration = HTTPServerConfiguration(port: 0)
/// configuration.connectionTimeoutSeconds = 10
/// let server = try HTTPServer(handler: service, configuration: configuration)
/// print("listening on \(server.port)")
/// ```
public struct HTTPServerConfiguration: Sendable {
    /// The IPv4 address to bind, as dotted text.
    public var host: String
    /// The TCP port; 0 picks a free one (read it back from `HTTPServer.port`).
    public var port: UInt16
    /// libmicrohttpd's threads, which accept, parse and write (handlers run on `workerThreads`). Requests
    /// waiting for a worker or a late answer do not hold one.
    public var threadPoolSize: Int
    /// Seconds a connection may sit idle before it is closed; 0 keeps idle connections forever. The clock
    /// stops while a request waits for a late answer and restarts once the answer is being sent.
    public var connectionTimeoutSeconds: Int
    /// Simultaneous connections accepted from one client address (a trusted proxy is exempt; through it,
    /// each forwarded client may have this many requests in flight instead).
    public var perIPConnectionLimit: Int
    /// Simultaneous connections in total. Each takes a file descriptor: keep it under RLIMIT_NOFILE.
    public var connectionLimit: Int
    /// Bytes one connection may use for its request line, headers and buffers (not the request body,
    /// which the handler's `maximumBodySize` caps).
    public var connectionMemoryLimit: Int
    /// Seconds `shutdown()` waits for in-flight requests after `HTTPHandler.beginShutdown()` before it
    /// answers the stragglers with 503 itself.
    public var shutdownGracePeriodSeconds: Int

    public init(
        host: String = "127.0.0.1",
        port: UInt16 = 8080,
        threadPoolSize: Int = ProcessInfo.processInfo.activeProcessorCount,
        connectionTimeoutSeconds: Int = 30,
        perIPConnectionLimit: Int = 64,
        connectionLimit: Int = 4096,
        connectionMemoryLimit: Int = 128 * 1024,
        shutdownGracePeriodSeconds: Int = 10
    ) {
        self.host = host
        self.port = port
        self.threadPoolSize = threadPoolSize
        self.connectionTimeoutSeconds = connectionTimeoutSeconds
        self.perIPConnectionLimit = perIPConnectionLimit
        self.connectionLimit = connectionLimit
        self.connectionMemoryLimit = connectionMemoryLimit
        self.shutdownGracePeriodSeconds = shutdownGracePeriodSeconds
    }

    // MARK: conn

    /// Seconds a connection has to deliver a request's complete headers, counted from its opening and,
    /// on a kept-alive connection, from the previous answer. Past it the connection is dropped (a slowloris
    /// client sending a byte every few seconds is not idle, so the idle timeout alone does not stop it);
    /// idle kept-alive connections therefore close after this long too.
    public var headerTimeoutSeconds = 10
    /// Seconds a request body may take, from the end of its headers, before the connection is dropped.
    public var bodyTimeoutSeconds = 60
    /// Seconds a streamed body (an asset upload) may take; the minimum rate below applies to it too. An
    /// upload cut by it resumes where it stopped.
    public var streamedBodyTimeoutSeconds = 1_800
    /// Once a body has been arriving for `bodyRateGraceSeconds`, it must have averaged at least this many
    /// bytes per second since its headers, or the connection is dropped.
    public var minimumBodyBytesPerSecond = 4096
    /// See `minimumBodyBytesPerSecond`.
    public var bodyRateGraceSeconds = 5
    /// Threads running handlers (the HTTP threads only accept, parse and write). Storage work happens here.
    public var workerThreads = max(4, 2 * ProcessInfo.processInfo.activeProcessorCount)
    /// Requests of one client (an account, or an address before sign-in) running at once; the rest wait
    /// in line, served round-robin across clients. Default: a quarter of the workers, at least 2, and
    /// always fewer than all of them (when there are two or more).
    public var workersPerClient = HTTPServerConfiguration.defaultWorkersPerClient(
        workerThreads: max(4, 2 * ProcessInfo.processInfo.activeProcessorCount))
    /// Requests of one client waiting in line; more get 429 THROTTLED with Retry-After.
    public var queuedRequestsPerClient = 32
    /// Requests waiting in line in total; more get 503 TRY_AGAIN_LATER with Retry-After.
    public var requestQueueLimit = 1024
    /// Milliseconds a request may wait in line for a worker; past it, it gets 503 TRY_AGAIN_LATER with
    /// Retry-After instead of waiting on (behind other clients' heaviest requests, say).
    public var maximumQueueWaitMilliseconds = 5_000
    /// Bytes of request bodies buffered at once, server-wide. A request whose declared (or, chunked,
    /// received) body would pass it gets 503 TRY_AGAIN_LATER with Retry-After before it is buffered.
    public var bodyBufferBudgetBytes = 64 * 1024 * 1024
    /// Proxies whose `X-Forwarded-For` is believed: IPv4 or IPv6 addresses or CIDR blocks (`10.0.0.0/8`,
    /// `2001:db8::/32`). From them, the right-most address of that header that is not itself a trusted
    /// proxy is the client's for limits, throttles and logs; from anyone else the header is ignored.
    /// Their own connections are exempt from `perIPConnectionLimit`.
    public var trustedProxies: [String] = []
    /// The default `workersPerClient` for a pool of `workerThreads`.
    public static func defaultWorkersPerClient(workerThreads: Int) -> Int {
        max(1, min(workerThreads - 1, max(2, workerThreads / 4)))
    }
    /// Receives one line per request (time, client, method, path without query, status, duration, bytes);
    /// nil logs nothing.
    public var accessLog: (@Sendable (String) -> Void)? = nil
}

/// Why an `HTTPServer` could not start.
public struct HTTPServerError: Error, CustomStringConvertible, Equatable {
    private enum Kind: Equatable {
        case hostIsNotIPv4(String)
        case invalidSetting(name: String, requirement: String)
        case cannotListen(host: String, port: UInt16)
    }

    private let kind: Kind

    /// `host` is not a dotted IPv4 address.
    public static func hostIsNotIPv4(_ host: String) -> HTTPServerError { HTTPServerError(kind: .hostIsNotIPv4(host)) }

    /// A configuration value is out of range.
    public static func invalidSetting(_ name: String, _ requirement: String) -> HTTPServerError {
        HTTPServerError(kind: .invalidSetting(name: name, requirement: requirement))
    }

    /// The daemon did not start: usually the port is taken.
    public static func cannotListen(host: String, port: UInt16) -> HTTPServerError {
        HTTPServerError(kind: .cannotListen(host: host, port: port))
    }

    public var description: String {
        switch kind {
        case .hostIsNotIPv4(let host):
            "cannot listen on \"\(host)\": the host must be an IPv4 address such as 127.0.0.1"
        case .invalidSetting(let name, let requirement):
            "invalid HTTP server configuration: \(name) \(requirement)"
        case .cannotListen(let host, let port):
            "cannot listen on \(host):\(port) (address in use?)"
        }
    }
}

extension HTTPServerConfiguration {
    /// The bind address in network byte order, after checking every setting.
    func validatedBindAddress() throws(HTTPServerError) -> UInt32 {
        func require(_ ok: Bool, _ name: String, _ requirement: String) throws(HTTPServerError) {
            if !ok { throw .invalidSetting(name, requirement) }
        }
        try require((1...1024).contains(threadPoolSize), "threadPoolSize", "must be between 1 and 1024")
        try require(connectionTimeoutSeconds >= 0 && connectionTimeoutSeconds <= Int(UInt32.max),
                    "connectionTimeoutSeconds", "must be 0 (no timeout) or more")
        try require(perIPConnectionLimit >= 1 && perIPConnectionLimit <= Int(UInt32.max),
                    "perIPConnectionLimit", "must be at least 1")
        try require(connectionLimit >= 1 && connectionLimit <= Int(UInt32.max), "connectionLimit",
                    "must be at least 1")
        try require(connectionMemoryLimit >= 4096, "connectionMemoryLimit", "must be at least 4096 bytes")
        try require(shutdownGracePeriodSeconds >= 0, "shutdownGracePeriodSeconds", "must be 0 or more")
        try require(headerTimeoutSeconds >= 1, "headerTimeoutSeconds", "must be at least 1")
        try require(bodyTimeoutSeconds >= 1, "bodyTimeoutSeconds", "must be at least 1")
        try require(minimumBodyBytesPerSecond >= 0, "minimumBodyBytesPerSecond", "must be 0 or more")
        try require(bodyRateGraceSeconds >= 0, "bodyRateGraceSeconds", "must be 0 or more")
        try require((1...4096).contains(workerThreads), "workerThreads", "must be between 1 and 4096")
        try require(workersPerClient >= 1, "workersPerClient", "must be at least 1")
        try require(queuedRequestsPerClient >= 0, "queuedRequestsPerClient", "must be 0 or more")
        try require(requestQueueLimit >= 0, "requestQueueLimit", "must be 0 or more")
        try require(maximumQueueWaitMilliseconds >= 1, "maximumQueueWaitMilliseconds", "must be at least 1")
        try require(bodyBufferBudgetBytes >= 0, "bodyBufferBudgetBytes", "must be 0 or more")
        for proxy in trustedProxies where AddressBlock(proxy) == nil {
            throw .invalidSetting("trustedProxies", "must be IPv4 or IPv6 addresses or CIDR blocks, not \(proxy)")
        }

        var address = in_addr()
        guard inet_pton(AF_INET, host, &address) == 1 else { throw .hostIsNotIPv4(host) }
        return address.s_addr
    }
}
