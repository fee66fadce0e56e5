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
/// Calls are async; cancelling the task ends a call at once, its exchange or its pause included.
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
    /// Pauses between attempts; nil sleeps for real. Injected so tests need not wait.
    public var sleep: (@Sendable (Double) -> Void)?
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
    public func call(_ database: String, _ operation: String, _ body: JSON, token: String?, timeout: TimeInterval = 30)
        async throws -> JSON {
        try await post(databasePath(database, operation), body, token: token, timeout: timeout)
    }

    public func post(_ path: String, _ body: JSON, token: String?, timeout: TimeInterval = 30) async throws -> JSON {
        let request = Self.request(path, body: body.serializedBytes(), contentType: "application/json", token: token)
        return Self.json(try await exchange(request, timeout: timeout))
    }

    /// Revokes `token` itself on the server (`tokens/revoke {"current": true}`): its next use fails.
    public func revokeToken(_ token: String) async throws {
        try Self.checkRevoked(try await call("private", "tokens/revoke", TokensRevokeRequest(current: true).json, token: token))
    }

    /// A call whose body is binary (`deltas/push`), answered in JSON.
    public func callBinary(_ database: String, _ operation: String, body: [UInt8], contentType: String, token: String?,
                           timeout: TimeInterval = 30) async throws -> TransportResponse {
        try await exchange(Self.request(databasePath(database, operation), body: body, contentType: contentType, token: token),
                           timeout: timeout)
    }

    /// A call with a JSON body whose answer may be binary (`deltas/pull`): the raw response of a success.
    public func callRaw(_ database: String, _ operation: String, _ body: JSON, token: String?,
                        timeout: TimeInterval = 30) async throws -> TransportResponse {
        try await exchange(Self.request(databasePath(database, operation), body: body.serializedBytes(),
                                        contentType: "application/json", token: token), timeout: timeout)
    }

    /// The same calls, answered on the caller's thread: for the package's blocking callers (the command
    /// line's account commands, the engine the benchmarks compare with). Never from one of Swift's shared
    /// threads. The transport must have a blocking form (`HTTPTransport` has).
    package var blocking: Blocking { Blocking(client: self) }

    package struct Blocking: Sendable {
        let client: ServerClient

        package func call(_ database: String, _ operation: String, _ body: JSON, token: String?,
                          timeout: TimeInterval = 30) throws -> JSON {
            try post(client.databasePath(database, operation), body, token: token, timeout: timeout)
        }

        package func post(_ path: String, _ body: JSON, token: String?, timeout: TimeInterval = 30) throws -> JSON {
            ServerClient.json(try exchange(ServerClient.request(path, body: body.serializedBytes(),
                                                                 contentType: "application/json", token: token),
                                           timeout: timeout))
        }

        package func revokeToken(_ token: String) throws {
            try ServerClient.checkRevoked(try call("private", "tokens/revoke", TokensRevokeRequest(current: true).json,
                                                   token: token))
        }

        package func callBinary(_ database: String, _ operation: String, body: [UInt8], contentType: String,
                                token: String?, timeout: TimeInterval = 30) throws -> TransportResponse {
            try exchange(ServerClient.request(client.databasePath(database, operation), body: body, contentType: contentType,
                                              token: token), timeout: timeout)
        }

        package func callRaw(_ database: String, _ operation: String, _ body: JSON, token: String?,
                             timeout: TimeInterval = 30) throws -> TransportResponse {
            try exchange(ServerClient.request(client.databasePath(database, operation), body: body.serializedBytes(),
                                              contentType: "application/json", token: token), timeout: timeout)
        }

        private func exchange(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse {
            guard let transport = client.transport as? any BlockingSyncTransport else {
                throw TransportError("this transport answers only async calls")
            }
            var attempts = client.attempts(request.path)
            while true {
                let outcome: Result<TransportResponse, TransportError>
                do {
                    outcome = .success(try transport.sendBlocking(request, timeout: timeout))
                } catch let error as TransportError {
                    outcome = .failure(error)
                }
                switch try attempts.next(after: outcome) {
                case .answer(let response): return response
                case .pause(let seconds):
                    if let sleep = client.sleep { sleep(seconds) } else { Thread.sleep(forTimeInterval: seconds) }
                }
            }
        }
    }

    // MARK: The retry rules, shared by both forms

    /// One POST with the retries described above; a non-2xx answer becomes a `ServerError`.
    private func exchange(_ request: TransportRequest, timeout: TimeInterval) async throws -> TransportResponse {
        var attempts = attempts(request.path)
        while true {
            let outcome: Result<TransportResponse, TransportError>
            do {
                outcome = .success(try await transport.send(request, timeout: timeout))
            } catch let error as TransportError {
                outcome = .failure(error)
            }
            switch try attempts.next(after: outcome) {
            case .answer(let response): return response
            case .pause(let seconds):
                if let sleep { sleep(seconds) } else { try await Task.sleep(nanoseconds: UInt64(seconds * 1e9)) }
            }
        }
    }

    func attempts(_ path: String) -> Attempts {
        Attempts(path: path, maximumAttempts: maximumAttempts, longestQuietWait: longestQuietWait, onWait: onWait)
    }

    /// The attempts of one call: after each, the answer to return, the error to throw, or how long to pause
    /// before the next (announced to `onWait` once the call's pauses pass the quiet limit).
    struct Attempts {
        enum Next { case answer(TransportResponse), pause(Double) }

        let path: String
        let maximumAttempts: Int
        let longestQuietWait: Double
        let onWait: @Sendable (RetryWait) -> Void
        private(set) var attempt = 1
        private var waited = 0.0

        init(path: String, maximumAttempts: Int, longestQuietWait: Double, onWait: @escaping @Sendable (RetryWait) -> Void) {
            self.path = path
            self.maximumAttempts = maximumAttempts
            self.longestQuietWait = longestQuietWait
            self.onWait = onWait
        }

        mutating func next(after outcome: Result<TransportResponse, TransportError>) throws -> Next {
            let response: TransportResponse
            switch outcome {
            case .failure(let error):
                // Offline: one quick second try, then report it (edits stay queued).
                guard attempt < 2 else { throw error }
                return pause(backoff(attempt), "the server cannot be reached (\(error.description))")
            case .success(let answer):
                response = answer
            }
            if (200..<300).contains(response.status) { return .answer(response) }
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
            return pause(max(error.retryAfter ?? 0, backoff(attempt)), "the server answered \(error.code): \(error.reason)")
        }

        private mutating func pause(_ seconds: Double, _ cause: String) -> Next {
            if waited + seconds > longestQuietWait {
                onWait(RetryWait(path: path, seconds: seconds, attempt: attempt + 1, maximumAttempts: maximumAttempts,
                                 cause: cause))
            }
            waited += seconds
            attempt += 1
            return .pause(seconds)
        }
    }

    private func databasePath(_ database: String, _ operation: String) -> String {
        "/database/1/\(container)/\(environment)/\(database)/\(operation)"
    }

    private static func request(_ path: String, body: [UInt8], contentType: String, token: String?) -> TransportRequest {
        var headers: [String: String] = ["Content-Type": contentType]
        if let token { headers["Authorization"] = "Bearer " + token }
        return TransportRequest(method: "POST", path: path, headers: headers, body: body)
    }

    private static func json(_ response: TransportResponse) -> JSON { (try? JSON.parse(response.body)) ?? .null }

    private static func checkRevoked(_ answer: JSON) throws {
        let first = TokensRevokeResponse(json: answer)?.tokens.first
        guard let first, first.revoked else {
            throw ServerError(code: first?.error?.code.rawValue ?? "HTTP_200",
                              reason: "the server did not revoke the token", status: 200, retryAfter: nil)
        }
    }
}

/// 0.2 s, 0.4 s, 0.8 s ... capped at 10 s, each with up to 50% random jitter.
func backoff(_ attempt: Int) -> Double {
    let base = min(10, 0.2 * pow(2, Double(attempt - 1)))
    return base * (1 + Double.random(in: 0..<0.5))
}
