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

/// How the engine reaches a server. `HTTPTransport` is the real one; tests may pass one that calls the
/// service in-process.
public protocol SyncTransport: Sendable {
    func send(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse
}

/// HTTP to a server: `PlainHTTPClient` for `http://` URLs (unless the environment names a proxy),
/// URLSession (FoundationNetworking on Linux) for `https://` and behind proxies.
public final class HTTPTransport: SyncTransport {
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

    public func send(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
        if let plain { return try plain.send(request, timeout: timeout) }
        var trimmed = baseURL.absoluteString
        while trimmed.hasSuffix("/") { trimmed.removeLast() }
        let base = trimmed
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
        let box = ExchangeBox()
        let task = session.dataTask(with: urlRequest) { data, response, error in
            if let error {
                box.finish(.failure(TransportError("cannot reach \(base): \(error.localizedDescription)")))
            } else if let http = response as? HTTPURLResponse {
                var headers: [String: String] = [:]
                for (key, value) in http.allHeaderFields {
                    if let key = key as? String, let value = value as? String { headers[key.lowercased()] = value }
                }
                box.finish(.success(TransportResponse(status: http.statusCode, headers: headers, body: [UInt8](data ?? Data()))))
            } else {
                box.finish(.failure(TransportError("no HTTP answer from \(base)")))
            }
        }
        task.resume()
        return try box.wait().get()
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
