import Foundation
import LatticeAPI
import Synchronization

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
    /// The client's address as text, or empty when unknown (in-process tests): the TCP peer's, or, when
    /// the peer is a trusted proxy, the last address of its `X-Forwarded-For`.
    public var remoteAddress: String
    /// What `HTTPHandler.admit(_:)` returned with `.pool(client:principal:)` for this request (say, the
    /// account its token authenticated), or nil.
    public var principal: (any Sendable)?
    /// Fires if the client goes away before the request is answered (see `HTTPAbandonment`).
    public var abandonment: HTTPAbandonment

    public init(method: String, path: String, query: String = "", headers: [String: String] = [:],
                body: [UInt8] = [], remoteAddress: String = "", principal: (any Sendable)? = nil,
                abandonment: HTTPAbandonment = HTTPAbandonment()) {
        self.method = method
        self.path = path
        self.query = query
        self.headers = Dictionary(headers.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: { _, last in last })
        self.body = body
        self.remoteAddress = remoteAddress
        self.principal = principal
        self.abandonment = abandonment
    }

    public func header(_ name: String) -> String? { headers[name.lowercased()] }

    /// The request without its body.
    public var head: HTTPRequestHead {
        HTTPRequestHead(method: method, path: path, query: query, headers: headers, remoteAddress: remoteAddress)
    }
}

/// What is known of a request once its headers are in, before any byte of its body has been read.
public struct HTTPRequestHead: Sendable {
    public var method: String
    /// The path without the query string, exactly as sent.
    public var path: String
    /// The raw query string after `?`, or empty.
    public var query: String
    /// Header names are lowercased.
    public var headers: [String: String]
    /// The client's address, as in `HTTPRequest.remoteAddress`.
    public var remoteAddress: String

    public init(method: String, path: String, query: String = "", headers: [String: String] = [:],
                remoteAddress: String = "") {
        self.method = method
        self.path = path
        self.query = query
        self.headers = Dictionary(headers.map { ($0.key.lowercased(), $0.value) }, uniquingKeysWith: { _, last in last })
        self.remoteAddress = remoteAddress
    }

    public func header(_ name: String) -> String? { headers[name.lowercased()] }
}

/// How the adapter runs a request, decided from its head (`HTTPHandler.admit(_:)`).
public enum HTTPAdmission: Sendable {
    /// Answer with this right away; the body is not read (nor buffered).
    case answer(HTTPResponse)
    /// Cheap (no storage work): `handle` runs on the HTTP thread as soon as the body is in.
    case inline
    /// `handle` runs on the worker pool, counted against `client`'s share of it (an account, or an
    /// address before sign-in); `principal` reaches `HTTPRequest.principal`.
    case pool(client: String, principal: (any Sendable)?)
    /// The body is not buffered: each piece goes to `sink` as it arrives (on the HTTP thread), up to
    /// `maximumBytes` (a declared Content-Length over it is answered 413 before any byte is read); then
    /// `handle` runs on the worker pool like `.pool`, with the sink as `HTTPRequest.principal` and an empty body.
    case stream(client: String, sink: any HTTPBodySink, maximumBytes: Int)
}

/// Where a streamed request body goes (`HTTPAdmission.stream`): an asset upload written as it arrives.
public protocol HTTPBodySink: Sendable {
    /// One piece of the body, in order, on the HTTP thread. An answer refuses the request: the rest of the
    /// body is not kept, and that answer is sent.
    func receive(_ bytes: UnsafeRawBufferPointer) -> HTTPResponse?
    /// The request ended without `handle` (the connection broke or timed out mid-body, or the body was
    /// refused); called once, off the HTTP thread.
    func interrupted()
}

/// The adapter's own refusals; the handler renders them (`HTTPHandler.response(for:)`).
public enum HTTPRefusal: Sendable, Equatable {
    /// HTTP/1.1 without `Host`: 400.
    case missingHost
    /// A body framing two parsers could read two ways (RFC 9112 §6.1, §6.3): `Content-Length` with
    /// `Transfer-Encoding`, `Content-Length` values that differ or are not decimal numbers, or chunked that is
    /// not the final coding or is applied twice: 400, and the connection is closed after the answer. The
    /// reason says which.
    case ambiguousFraming(String)
    /// A `Transfer-Encoding` naming a coding other than chunked (the coding given): 501, and the connection
    /// is closed after the answer.
    case unsupportedTransferCoding(String)
    /// The server-wide budget for buffered request bodies is spent: 503, retry after the seconds given.
    case bodyBudgetExhausted(retryAfter: Int)
    /// The worker pool's queue is full: 503.
    case queueFull(retryAfter: Int)
    /// This client already has its share of the worker pool queued, or its share of in-flight requests
    /// through a trusted proxy: 429.
    case clientBusy(retryAfter: Int)
}

/// Tells a handler that the client of a request went away before its answer (a long poll whose peer
/// closed its connection), so it can release what it holds for it. Runs its callbacks once, or never
/// when the request is answered first.
public final class HTTPAbandonment: Sendable {
    private struct State {
        var callbacks: [@Sendable () -> Void] = []
        /// nil while open; true once abandoned, false once answered.
        var outcome: Bool?
    }

    private let state = Mutex(State())

    public init() {}

    /// Runs `callback` when the client goes away (right away if it already has); never if the request is
    /// answered first.
    public func onAbandon(_ callback: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            switch state.outcome {
            case nil:
                state.callbacks.append(callback)
                return false
            case true?: return true
            case false?: return false
            }
        }
        if runNow { callback() }
    }

    /// The client went away: runs the callbacks (once).
    func abandon() {
        let callbacks = state.withLock { state -> [@Sendable () -> Void] in
            guard state.outcome == nil else { return [] }
            state.outcome = true
            defer { state.callbacks = [] }
            return state.callbacks
        }
        for callback in callbacks { callback() }
    }

    /// The request was answered: the callbacks are dropped without running.
    func settle() {
        state.withLock { state in
            guard state.outcome == nil else { return }
            state.outcome = false
            state.callbacks = []
        }
    }

    var isAbandoned: Bool { state.withLock { $0.outcome == true } }
}

/// One HTTP response.
public struct HTTPResponse: Sendable, Equatable {
    public var status: Int
    /// Header names as they are sent.
    public var headers: [(name: String, value: String)]
    public var body: [UInt8]
    /// A body sent while it is made (server-sent events), instead of `body`: the answer has no length and
    /// lasts until the stream finishes or the connection ends.
    public var stream: HTTPStreamBody?
    /// A body of known length read from storage while it is sent (an asset), instead of `body`.
    public var file: HTTPFileBody?

    public init(status: Int, headers: [(name: String, value: String)] = [], body: [UInt8] = [],
                stream: HTTPStreamBody? = nil, file: HTTPFileBody? = nil) {
        self.status = status
        self.headers = headers
        self.body = body
        self.stream = stream
        self.file = file
    }

    public func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    /// This response with each of `extra` that it has no header of the same name for (case-insensitively)
    /// added at the end; a header it has already stays as it is.
    func adding(missing extra: [(name: String, value: String)]) -> HTTPResponse {
        guard !extra.isEmpty else { return self }
        var response = self
        let present = Set(headers.map { $0.name.lowercased() })
        response.headers += extra.filter { !present.contains($0.name.lowercased()) }
        return response
    }

    public static func == (a: HTTPResponse, b: HTTPResponse) -> Bool {
        a.status == b.status && a.body == b.body && a.stream === b.stream && a.file === b.file && a.headers.map(\.name) == b.headers.map(\.name)
            && a.headers.map(\.value) == b.headers.map(\.value)
    }
}

/// Answers a request exactly once. It may be called on any thread, later than `handle` returns
/// (a long poll does that), but never twice.
public typealias HTTPResponder = @Sendable (HTTPResponse) -> Void

/// The service core: `Request -> Response`, with no sockets. The HTTP adapter calls `admit` on its HTTP
/// threads once a request's headers are in, then `handle` (on its worker pool, or inline for cheap
/// requests); tests call `handle` in-process.
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

    /// Decides from the head alone, before the body is read, whether to refuse the request (a bad token),
    /// run it inline (cheap) or on the worker pool, and whose share of the pool it uses. Runs on an HTTP
    /// thread: keep it cheap. Default: the pool, one share per client address.
    func admit(_ head: HTTPRequestHead) -> HTTPAdmission

    /// The answer for one of the adapter's own refusals. Default: an API error in JSON.
    func response(for refusal: HTTPRefusal) -> HTTPResponse

    /// The path as the access log shows it: without secrets (say, a share token in the path). Default: as is.
    func pathForLog(_ path: String) -> String

    /// Headers every answer carries, whatever made it (`handle`, `admit`, a refusal, the server's shutdown
    /// answer): the adapter adds each one an answer lacks, by name, to every answer it sends, and so does
    /// `respond(to:)`. Default: none.
    var headersOnEveryAnswer: [(name: String, value: String)] { get }
}

extension HTTPHandler {
    public func admit(_ head: HTTPRequestHead) -> HTTPAdmission { .pool(client: head.remoteAddress, principal: nil) }

    public func response(for refusal: HTTPRefusal) -> HTTPResponse {
        switch refusal {
        case .missingHost:
            ServiceError(.badRequest, "an HTTP/1.1 request must have a Host header").response
        case .ambiguousFraming(let reason):
            ServiceError(.badRequest, reason).response
        case .unsupportedTransferCoding(let coding):
            ServiceError(.notImplemented, "the transfer coding \(coding.prefix(40)) is not supported; "
                     + "send the body with Content-Length or Transfer-Encoding: chunked").response
        case .bodyBudgetExhausted(let seconds):
            ServiceError(.tryAgainLater, "the server is receiving too many request bodies; retry shortly",
                     retryAfter: seconds).response
        case .queueFull(let seconds):
            ServiceError(.tryAgainLater, "the server is busy; retry shortly", retryAfter: seconds).response
        case .clientBusy(let seconds):
            ServiceError(.throttled, "too many requests in flight from this client; retry after \(seconds) s",
                     retryAfter: seconds).response
        }
    }

    public func pathForLog(_ path: String) -> String { path }

    public var headersOnEveryAnswer: [(name: String, value: String)] { [] }

    /// Handles a request and waits for its answer. For tests and for callers that are already off the
    /// adapter's threads.
    public func respond(to request: HTTPRequest) -> HTTPResponse {
        let box = ResponseBox()
        handle(request) { box.set($0) }
        return box.wait().adding(missing: headersOnEveryAnswer)
    }
}

/// A one-shot slot a responder fills and a caller waits on.
///
/// `@unchecked Sendable`: `condition` guards `response`, the only mutable member (every read and write of it,
/// `isSet` included, holds the condition's lock). A condition, not a `Mutex`, because callers block until the
/// slot is filled.
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

extension HTTPBodySink {
    /// `interrupted()` on a global queue: it may wait for storage, which the HTTP thread must not.
    func interruptedOffThread() {
        DispatchQueue.global(qos: .utility).async { self.interrupted() }
    }
}
