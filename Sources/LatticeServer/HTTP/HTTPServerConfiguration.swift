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
    /// Worker threads serving connections. Requests waiting for a late answer do not hold a thread.
    public var threadPoolSize: Int
    /// Seconds a connection may sit idle before it is closed; 0 keeps idle connections forever. The clock
    /// stops while a request waits for a late answer and restarts once the answer is being sent.
    public var connectionTimeoutSeconds: Int
    /// Simultaneous connections accepted from one client address.
    public var perIPConnectionLimit: Int
    /// Simultaneous connections in total.
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
        connectionLimit: Int = 1024,
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

        var address = in_addr()
        guard inet_pton(AF_INET, host, &address) == 1 else { throw .hostIsNotIPv4(host) }
        return address.s_addr
    }
}
