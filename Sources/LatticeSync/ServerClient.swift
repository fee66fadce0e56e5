import Foundation
import LatticeAPI
import LatticeCore

/// An error the server answered with, in its taxonomy (`serverErrorCode`, `reason`).
public struct ServerError: Error, CustomStringConvertible, Sendable {
    /// The code as the server sent it, or `HTTP_<status>` when the answer carried none. Match on
    /// ``serverErrorCode``, not on this text.
    public let code: String
    public let reason: String
    public let status: Int
    public let retryAfter: Double?

    /// The code in the taxonomy the server uses; nil for `HTTP_<status>` or a code this client does not know.
    public var serverErrorCode: ServerErrorCode? { ServerErrorCode(rawValue: code) }

    public var description: String { "\(code): \(reason)" + (retryAdvice.map { "; " + $0 } ?? "") }

    /// Whether the server said "not now" (THROTTLED or TRY_AGAIN_LATER): the request may succeed later.
    public var isNotNow: Bool { serverErrorCode == .throttled || serverErrorCode == .tryAgainLater }

    /// When to try again, for people ("try again in 14 minutes"), from `retryAfter`; nil without one.
    public var retryAdvice: String? {
        guard let retryAfter, retryAfter > 0 else { return nil }
        return "try again in " + Self.duration(retryAfter)
    }

    /// Seconds in words, rounded up: "1 second", "40 seconds", "14 minutes", "3 hours".
    static func duration(_ seconds: Double) -> String {
        func count(_ value: Double, _ unit: String) -> String {
            let whole = Int(value.rounded(.up))
            return "\(whole) \(unit)\(whole == 1 ? "" : "s")"
        }
        if seconds < 90 { return count(seconds, "second") }
        if seconds < 90 * 60 { return count(seconds / 60, "minute") }
        return count(seconds / 3600, "hour")
    }
}

/// Calls the Lattice HTTP API with retries: THROTTLED and TRY_AGAIN_LATER (and a dropped connection) are
/// retried with exponential backoff and jitter, honouring `Retry-After`; anything else is returned at once.
///
/// It never waits long in silence: an answer whose `retryAfter` is over `longestQuietWait` seconds is
/// thrown at once (the caller tells the person when to try again: `ServerError.retryAdvice`), and once
/// a call's pauses add up to more than `longestQuietWait`, each further pause is announced to `onWait`
/// first (by default on stderr).
public struct ServerClient: Sendable {
    public let transport: any SyncTransport
    public let container: String
    public let environment: String
    /// Attempts per call for retryable failures.
    public var maximumAttempts = 5
    /// Pauses between attempts; injected so tests need not wait.
    public var sleep: @Sendable (Double) -> Void = { Thread.sleep(forTimeInterval: $0) }
    /// The longest a call waits without saying so: a longer `retryAfter` is not waited for, and pauses past
    /// this much in total are announced to `onWait`.
    public var longestQuietWait: Double = 2
    /// Told what a call is about to wait for, when its pauses go past `longestQuietWait` in total.
    public var onWait: @Sendable (RetryWait) -> Void = { wait in
        FileHandle.standardError.write(Data("lattice: \(wait)\n".utf8))
    }

    /// A pause before another attempt of a call, as `onWait` hears of it.
    public struct RetryWait: Sendable, CustomStringConvertible {
        /// The path of the call (`/database/1/.../records/modify`, `/auth/signup`).
        public let path: String
        /// Seconds about to be waited.
        public let seconds: Double
        /// The attempt that comes after the pause, and how many there are at most.
        public let attempt: Int
        public let maximumAttempts: Int
        /// What the last attempt got: the server's error, or why the server could not be reached.
        public let cause: String

        public var description: String {
            // `/database/1/{container}/{environment}/{database}/zones/list` is named `zones/list`.
            let parts = path.split(separator: "/")
            let operation = parts.count > 5 && parts[0] == "database" ? parts[5...].joined(separator: "/") : path
            return "waiting \(String(format: "%.1f", seconds)) s before attempt \(attempt) of \(maximumAttempts) of "
                + "\(operation): \(cause)"
        }
    }

    public init(transport: any SyncTransport, container: String = "lattice", environment: String = "production") {
        self.transport = transport
        self.container = container
        self.environment = environment
    }

    /// `POST /database/1/{container}/{environment}/{database}/{operation}`.
    public func call(_ database: String, _ operation: String, _ body: JSON, token: String?, timeout: TimeInterval = 30) throws
        -> JSON {
        try post("/database/1/\(container)/\(environment)/\(database)/\(operation)", body, token: token, timeout: timeout)
    }

    public func post(_ path: String, _ body: JSON, token: String?, timeout: TimeInterval = 30) throws -> JSON {
        let response = try exchange(path, body: body.serializedBytes(), contentType: "application/json", token: token,
                                    timeout: timeout)
        return (try? JSON.parse(response.body)) ?? .null
    }

    /// Revokes `token` itself on the server (`tokens/revoke {"current": true}`): its next use fails.
    public func revokeToken(_ token: String) throws {
        let answer = try call("private", "tokens/revoke", TokensRevokeRequest(current: true).json, token: token)
        let first = TokensRevokeResponse(json: answer)?.tokens.first
        guard let first, first.revoked else {
            throw ServerError(code: first?.error?.code.rawValue ?? "HTTP_200",
                              reason: "the server did not revoke the token", status: 200, retryAfter: nil)
        }
    }

    /// A call whose body is binary (`deltas/push`), answered in JSON.
    public func callBinary(_ database: String, _ operation: String, body: [UInt8], contentType: String, token: String?,
                           timeout: TimeInterval = 30) throws -> TransportResponse {
        try exchange("/database/1/\(container)/\(environment)/\(database)/\(operation)", body: body,
                     contentType: contentType, token: token, timeout: timeout)
    }

    /// A call with a JSON body whose answer may be binary (`deltas/pull`): the raw response of a success.
    public func callRaw(_ database: String, _ operation: String, _ body: JSON, token: String?,
                        timeout: TimeInterval = 30) throws -> TransportResponse {
        try exchange("/database/1/\(container)/\(environment)/\(database)/\(operation)", body: body.serializedBytes(),
                     contentType: "application/json", token: token, timeout: timeout)
    }

    /// One POST with the retries described above; a non-2xx answer becomes a `ServerError`.
    private func exchange(_ path: String, body: [UInt8], contentType: String, token: String?, timeout: TimeInterval)
        throws -> TransportResponse {
        var headers: [String: String] = ["Content-Type": contentType]
        if let token { headers["Authorization"] = "Bearer " + token }
        let request = TransportRequest(method: "POST", path: path, headers: headers, body: body)
        var attempt = 0
        var waited = 0.0
        /// Waits before the next attempt, announcing the pause when the call's waiting goes past the quiet limit.
        func pause(_ seconds: Double, _ cause: String) {
            if waited + seconds > longestQuietWait {
                onWait(RetryWait(path: path, seconds: seconds, attempt: attempt + 1, maximumAttempts: maximumAttempts,
                                 cause: cause))
            }
            waited += seconds
            sleep(seconds)
        }
        while true {
            attempt += 1
            let response: TransportResponse
            do {
                response = try transport.send(request, timeout: timeout)
            } catch let error as TransportError {
                // Offline: one quick second try, then report it (edits stay queued).
                if attempt < 2 {
                    pause(backoff(attempt), "the server cannot be reached (\(error.description))")
                    continue
                }
                throw error
            }
            if (200..<300).contains(response.status) { return response }
            let json = (try? JSON.parse(response.body)) ?? .null
            let error = ServerError(code: json["serverErrorCode"]?.stringValue ?? "HTTP_\(response.status)",
                                    reason: json["reason"]?.stringValue ?? "HTTP \(response.status)",
                                    status: response.status,
                                    retryAfter: json["retryAfter"]?.doubleValue
                                        ?? response.headers["retry-after"].flatMap(Double.init))
            // "Not now" for longer than the quiet limit: said at once, with when to try again, not waited for.
            guard error.isNotNow, attempt < maximumAttempts, (error.retryAfter ?? 0) <= longestQuietWait else {
                throw error
            }
            pause(max(error.retryAfter ?? 0, backoff(attempt)), "the server answered \(error.code): \(error.reason)")
        }
    }

    /// 0.2 s, 0.4 s, 0.8 s ... capped at 10 s, each with up to 50% random jitter.
    func backoff(_ attempt: Int) -> Double {
        let base = min(10, 0.2 * pow(2, Double(attempt - 1)))
        return base * (1 + Double.random(in: 0..<0.5))
    }
}
