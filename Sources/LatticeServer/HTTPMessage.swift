import Foundation

/// One HTTP request as the service core sees it: already parsed, body fully received and within the cap.
///
/// The libmicrohttpd adapter builds these; tests build them directly (see `HTTPHandler`).
public struct HTTPRequest: Sendable {
    public var method: String
    /// The path without the query string, percent-decoded by nothing: exactly as sent.
    public var path: String
    /// The raw query string after `?`, or empty.
    public var query: String
    /// Header names are lowercased.
    public var headers: [String: String]
    public var body: [UInt8]
    /// The client's IPv4 address as dotted text, or empty when unknown (in-process tests).
    public var remoteAddress: String

    public init(method: String, path: String, query: String = "", headers: [String: String] = [:],
                body: [UInt8] = [], remoteAddress: String = "") {
        self.method = method
        self.path = path
        self.query = query
        self.headers = Dictionary(headers.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: { _, last in last })
        self.body = body
        self.remoteAddress = remoteAddress
    }

    public func header(_ name: String) -> String? { headers[name.lowercased()] }
}

/// One HTTP response.
public struct HTTPResponse: Sendable, Equatable {
    public var status: Int
    /// Header names as they are sent.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = []) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    public func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    public static func == (a: HTTPResponse, b: HTTPResponse) -> Bool {
        a.status == b.status && a.body == b.body && a.headers.map(\.name) == b.headers.map(\.name)
            && a.headers.map(\.value) == b.headers.map(\.value)
    }
}

/// Answers a request exactly once. It may be called on any thread, later than `handle` returns
/// (a long poll does that), but never twice.
public typealias HTTPResponder = @Sendable (HTTPResponse) -> Void

/// The service core: `Request -> Response`, with no sockets. The HTTP adapter calls it from its worker
/// threads; tests call it in-process.
public protocol HTTPHandler: Sendable {
    /// The body-size cap. The adapter rejects longer bodies before buffering them, answering with
    /// `responseForOversizedBody()`, and never calls `handle` for them.
    var maximumBodySize: Int { get }

    /// Handles one request. Call `respond` once, now or later.
    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder)

    /// The answer for a body over `maximumBodySize`.
    func responseForOversizedBody() -> HTTPResponse

    /// Called once when the server starts shutting down, after it stops accepting connections: answer
    /// anything that is waiting (long polls) now, so in-flight requests can finish.
    func beginShutdown()
}

extension HTTPHandler {
    /// Handles a request and waits for its answer. For tests and for callers that are already off the
    /// adapter's threads.
    public func respond(to request: HTTPRequest) -> HTTPResponse {
        let box = ResponseBox()
        handle(request) { box.set($0) }
        return box.wait()
    }
}

/// A one-shot slot a responder fills and a caller waits on.
final class ResponseBox: @unchecked Sendable {
    private let condition = NSCondition()
    private var response: HTTPResponse?

    func set(_ value: HTTPResponse) {
        condition.lock()
        if response == nil { response = value }
        condition.broadcast()
        condition.unlock()
    }

    func wait() -> HTTPResponse {
        condition.lock()
        defer { condition.unlock() }
        while response == nil { condition.wait() }
        return response!
    }

    /// The response, or nil if none came within `seconds`.
    func wait(seconds: Double) -> HTTPResponse? {
        let deadline = Date().addingTimeInterval(seconds)
        condition.lock()
        defer { condition.unlock() }
        while response == nil {
            if !condition.wait(until: deadline) { break }
        }
        return response
    }

    var isSet: Bool {
        condition.lock()
        defer { condition.unlock() }
        return response != nil
    }
}
