import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

/// One HTTP exchange with the server, as the sync engine sees it.
public struct TransportRequest: Sendable {
    public var method: String
    public var path: String
    public var headers: [String: String]
    public var body: [UInt8]

    public init(method: String, path: String, headers: [String: String] = [:], body: [UInt8] = []) {
        self.method = method
        self.path = path
        self.headers = headers
        self.body = body
    }
}

public struct TransportResponse: Sendable {
    public var status: Int
    /// Header names lowercased.
    public var headers: [String: String]
    public var body: [UInt8]

    public init(status: Int, headers: [String: String], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }
}

/// The server could not be reached (or did not answer): the device is offline for now.
public struct TransportError: Error, CustomStringConvertible, Sendable {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// How the engine reaches a server: one exchange, async, bounded by `timeout` seconds. A cancelled task
/// ends the exchange at once with `CancellationError`. `HTTPTransport` is the real one; an app may pass its
/// own (its networking stack, a test double) in `LatticeSyncEngine.Configuration.transport`.
public protocol SyncTransport: Sendable {
    func send(_ request: TransportRequest, timeout: TimeInterval) async throws -> TransportResponse
}

/// A transport that can also answer on the caller's thread, for the blocking callers inside the package
/// (`ServerClient.Blocking`: the command line's account calls, the engine the benchmarks compare with).
/// Its async `send` by default runs the blocking one on a Dispatch thread (never one of Swift's shared
/// threads, which a parked `changes/wait` would hold for its whole timeout); a cancelled task still waits
/// for it (its timeout bounds it). `HTTPTransport` has a real async `send`.
package protocol BlockingSyncTransport: SyncTransport {
    func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse
}

extension BlockingSyncTransport {
    package func send(_ request: TransportRequest, timeout: TimeInterval) async throws -> TransportResponse {
        try await withCheckedThrowingContinuation { continuation in
            DispatchQueue.global().async {
                continuation.resume(with: Result { try self.sendBlocking(request, timeout: timeout) })
            }
        }
    }
}

/// HTTP to a server: `PlainHTTPClient` for `http://` URLs (unless the environment names a proxy),
/// URLSession (FoundationNetworking on Linux) for `https://` and behind proxies. The async `send` holds no
/// thread while it waits, and cancelling the task cancels the exchange.
public final class HTTPTransport: BlockingSyncTransport {
    public let baseURL: URL
    private let session: URLSession
    private let plain: PlainHTTPClient?

    /// - Throws: `TransportError` for a URL that is not `http(s)://host[:port]`.
    public init(serverURL: String) throws {
        guard let url = URL(string: serverURL), let scheme = url.scheme, scheme == "http" || scheme == "https", url.host != nil else {
            throw TransportError("\(serverURL) is not a server URL such as http://127.0.0.1:8080")
        }
        baseURL = url
        let configuration = URLSessionConfiguration.ephemeral
        configuration.httpMaximumConnectionsPerHost = 4
        configuration.requestCachePolicy = .reloadIgnoringLocalCacheData
        session = URLSession(configuration: configuration)
        plain = PlainHTTPClient.serves(url) ? try PlainHTTPClient(url: url) : nil
    }

    public func send(_ request: TransportRequest, timeout: TimeInterval) async throws -> TransportResponse {
        if let plain { return try await plain.send(request, timeout: timeout) }
        let urlRequest = try urlRequest(request, timeout: timeout)
        do {
            let (data, response) = try await session.data(for: urlRequest)
            return try answer(data, response)
        } catch let error as TransportError {
            throw error
        } catch {
            try Task.checkCancellation()
            throw TransportError("cannot reach \(base): \(error.localizedDescription)")
        }
    }

    package func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
        if let plain { return try plain.sendBlocking(request, timeout: timeout) }
        let urlRequest = try urlRequest(request, timeout: timeout)
        let box = ExchangeBox()
        let base = base
        let task = session.dataTask(with: urlRequest) { [self] data, response, error in
            if let error {
                box.finish(.failure(TransportError("cannot reach \(base): \(error.localizedDescription)")))
            } else {
                box.finish(Result { () throws(TransportError) in try answer(data ?? Data(), response) })
            }
        }
        task.resume()
        return try box.wait().get()
    }

    /// The server URL without its trailing slashes.
    private var base: String {
        var trimmed = baseURL.absoluteString
        while trimmed.hasSuffix("/") { trimmed.removeLast() }
        return trimmed
    }

    private func urlRequest(_ request: TransportRequest, timeout: TimeInterval) throws(TransportError) -> URLRequest {
        guard let url = URL(string: base + request.path) else { throw TransportError("bad path \(request.path)") }
        var urlRequest = URLRequest(url: url, timeoutInterval: timeout)
        urlRequest.httpMethod = request.method
        for (name, value) in request.headers { urlRequest.setValue(value, forHTTPHeaderField: name) }
        if !request.body.isEmpty {
            urlRequest.httpBody = Data(request.body)
            if request.headers.keys.contains(where: { $0.lowercased() == "content-type" }) == false {
                urlRequest.setValue("application/json", forHTTPHeaderField: "Content-Type")
            }
        }
        return urlRequest
    }

    private func answer(_ data: Data, _ response: URLResponse?) throws(TransportError) -> TransportResponse {
        guard let http = response as? HTTPURLResponse else { throw TransportError("no HTTP answer from \(base)") }
        var headers: [String: String] = [:]
        for (key, value) in http.allHeaderFields {
            if let key = key as? String, let value = value as? String { headers[key.lowercased()] = value }
        }
        return TransportResponse(status: http.statusCode, headers: headers, body: [UInt8](data))
    }
}

/// A one-shot slot for a URLSession completion, waited on by the caller's thread.
///
/// `@unchecked Sendable`: `condition` guards `result`, the only mutable member. (A condition, not a `Mutex`,
/// because the caller blocks until the completion fills the slot.)
private final class ExchangeBox: @unchecked Sendable {
    private let condition = NSCondition()
    private var result: Result<TransportResponse, TransportError>?

    func finish(_ value: Result<TransportResponse, TransportError>) {
        condition.lock()
        result = value
        condition.broadcast()
        condition.unlock()
    }

    func wait() -> Result<TransportResponse, TransportError> {
        condition.lock()
        defer { condition.unlock() }
        while result == nil { condition.wait() }
        return result!
    }
}
