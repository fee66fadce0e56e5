import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore
import Synchronization

/// The Lattice service core: routes a request, authenticates it, runs the operation against storage and
/// renders the answer. It holds no socket; `HTTPServer` feeds it from libmicrohttpd, tests call it directly.
///
/// Merge rules come from LatticeCore and SQL stays in LatticeStore; this type maps requests to them.
public final class LatticeService: HTTPHandler, Sendable {
    /// The operations' shared state: storage, configuration, the node's identity and clock, share keys, and
    /// the one write.
    package let core: OperationsCore
    public var configuration: ServiceConfiguration { core.configuration }
    public var replicaID: ReplicaID { core.replicaID }
    var storage: any Storage { core.storage }
    /// Signs and verifies share URLs; nil on a server without share links (some tests).
    var keyRing: ShareKeyRing? { core.keyRing }
    let notifier: ChangeNotifier
    private let limiter: RateLimiter?
    /// Failed authentications per client address (in memory, per process).
    private let authenticationFailures: RateLimiter?
    private let shuttingDown = Atomic<Bool>(false)
    /// Set by `probeStorage`: nil while healthy, else why `/healthz` answers 503 (the database cannot be
    /// reached, or another process took this node's name).
    private let storageProblem = Mutex<String?>(nil)
    /// Where other nodes' announced commits are handled (`observedChange`), one batch at a time.
    let remoteChanges = DispatchQueue(label: "lattice-remote-changes")
    /// Announcements not handled yet, merged into one batch (nil: none queued): under load a node reads
    /// the positions once per batch, not once per commit elsewhere.
    private let pendingChanges = Mutex<StorageChange?>(nil)

    /// The URL clients reach the server at (share URLs and their `iss`): the configured one, or the one
    /// the process learned after binding its port.
    public var publicURL: String { core.publicURL }

    /// Sets the public URL once the listening port is known (`lattice serve --port 0` without --public-url).
    public func setPublicURL(_ url: String) { core.setPublicURL(url) }
    var log: @Sendable (String) -> Void { core.log }

    /// - Parameter log: where internal errors are written (never to clients).
    public init(storage: any Storage, configuration: ServiceConfiguration = ServiceConfiguration(),
                keyRing: ShareKeyRing? = nil,
                log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(("lattice: " + $0 + "\n").utf8)) }) throws {
        let notifier = ChangeNotifier()
        self.notifier = notifier
        core = try OperationsCore(storage: storage, configuration: configuration, keyRing: keyRing, log: log) { positions in
            for (id, position) in positions { notifier.notify(databaseID: id, position: position) }
        }
        limiter = configuration.rateLimit.map(RateLimiter.init)
        authenticationFailures = configuration.failedAuthenticationLimit.map(RateLimiter.init)
        // Other nodes' commits wake this node's long polls (a single-process backend delivers nothing).
        try storage.observeChanges { [weak self] change in self?.enqueueObservedChange(change) }
    }

    public var maximumBodySize: Int { configuration.maximumRequestBytes }

    public func responseForOversizedBody() -> HTTPResponse {
        ServiceError(.limitExceeded, "the request body is over the limit of \(configuration.maximumRequestBytes) bytes").response
    }

    public func beginShutdown() {
        shuttingDown.store(true, ordering: .sequentiallyConsistent)
        notifier.shutDown()
    }

    /// Removes tombstones, deleted zones and remembered operation ids past their horizons (and expired
    /// device sign-ins and old failed approvals): `Maintenance.purgeExpired`.
    @discardableResult
    public func purgeExpired() throws -> PurgeReport { try Maintenance(core).purgeExpired() }

    /// One purge run unless another node is purging now: `Maintenance.purgeUnlessRunningElsewhere`.
    public func purgeUnlessRunningElsewhere(batchRows: Int = Maintenance.purgeBatchRows,
                                            budgetMilliseconds: Int64 = Maintenance.purgeRunBudgetMilliseconds)
        throws -> PurgeReport? {
        try Maintenance(core).purgeUnlessRunningElsewhere(batchRows: batchRows, budgetMilliseconds: budgetMilliseconds)
    }

    // MARK: Routing

    /// Dispatch from the route table (`apiRoutes`, Routes.swift): the table says which handler answers,
    /// whether it needs a token, where it runs and which limiter it takes from.
    public func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        do {
            try route(request, respond: respond)
        } catch let error as ServiceError {
            respond(error.response)
        } catch let error as MethodNotAllowed {
            respond(error.response)
        } catch let failure as AtomicBatchFailure {
            respond(failure.response)
        } catch {
            respond(internalError(error).response)
        }
    }

    /// The route of a request, or the NOT_FOUND or METHOD_NOT_ALLOWED error it gets.
    private func resolveRoute(method: String, path: String) throws -> (Route, RouteParameters) {
        switch Self.apiRoutes.resolve(method: method, path: path, configuration: configuration) {
        case .found(let route, let parameters):
            return (route, parameters)
        case .methodNotAllowed(let allowed, let route):
            let shown = route.hidesPath ? route.pattern.description : String(path.prefix(200))
            throw MethodNotAllowed(error: ServiceError(.methodNotAllowed, "\(shown) answers \(allowed.joined(separator: ", ")), "
                                                       + "not \(method.prefix(20))"), allowed: allowed)
        case .notFound:
            let parts = path.split(separator: "/", omittingEmptySubsequences: false)
            if parts.count >= 7, parts[0].isEmpty, parts[1] == "database", parts[2] == "1" {
                throw ServiceError(.notFound, "no such operation: \(parts[6...].joined(separator: "/").prefix(100))")
            }
            throw ServiceError(.notFound, "no such endpoint: \(method.prefix(20)) \(path.prefix(200))")
        }
    }

    private func route(_ request: HTTPRequest, respond: @escaping HTTPResponder) throws {
        if shuttingDown.load(ordering: .sequentiallyConsistent) {
            throw ServiceError(.tryAgainLater, "the server is shutting down")
        }
        let (route, parameters) = try resolveRoute(method: request.method, path: request.path)
        let perform: @Sendable (LatticeService, RequestContext, HTTPAbandonment, @escaping HTTPResponder) throws -> Void
        switch route.handler {
        case .plain(let answer):
            if route.throttle == .perAddress { try throttle(key: "ip:" + request.addressLimitKey) }
            return respond(try answer(self, request, parameters))
        case .account(let answer):
            let caller: AuthenticatedCaller
            if let admitted = request.principal as? AuthenticatedCaller {
                caller = admitted
            } else {
                let (user, tokenID) = try authenticate(request.head, allowSession: route.authentication == .bearerOrSession)
                if route.throttle == .perAccount { try throttle(key: "user:\(user.id)") }
                caller = AuthenticatedCaller(user: user, tokenID: tokenID)
            }
            return respond(try answer(self, request, caller))
        case .database(let answer):
            perform = { service, context, _, respond in respond(try answer(service, context)) }
        case .databaseLater(let answer):
            perform = answer
        }
        let (kind, environment) = try databaseTarget(parameters)
        // The request's work ends at its deadline (storage is interrupted, CPU loops check it); a parked
        // long poll is not working, and its reads before and after parking take fresh ones.
        let deadline = RequestDeadline.after(milliseconds: configuration.requestDeadlineMilliseconds)
        // Admitted from the headers (`admit`): authenticated and throttled there already.
        let user: UserAccount, tokenID: String
        if let admitted = request.principal as? AuthenticatedCaller {
            (user, tokenID) = (admitted.user, admitted.tokenID)
        } else {
            (user, tokenID) = try authenticate(request.head, deadline: deadline,
                                               allowSession: route.authentication == .bearerOrSession)
            if route.throttle == .perAccount { try throttle(key: "user:\(user.id)") }
        }
        // deltas/push has a binary body: its envelope carries what a JSON body would (clientOperationID, atomic).
        var push: SyncMessage.Push? = nil
        var body: [String: JSON]
        switch route.body {
        case .deltaPush:
            let envelope = try Self.pushEnvelope(request)
            body = ["atomic": .bool(envelope.atomic)]
            if let id = envelope.clientOperationID { body["clientOperationID"] = .string(id) }
            push = envelope
        case .json:
            body = try parseBody(request)
        }
        let context = RequestContext(user: user, kind: kind, environment: environment, body: body,
                                     rawBody: request.body, path: request.path, push: push, deadline: deadline,
                                     tokenID: tokenID)
        if route.growth.adds(body) { try checkDiskBudget(route.operationName) }
        try perform(self, context, request.abandonment, respond)
    }

    /// The database a `/database/1/{container}/{environment}/{database}/...` route names, checked in that
    /// order.
    private func databaseTarget(_ parameters: RouteParameters) throws -> (DatabaseKind, String) {
        let container = parameters["container"] ?? "", environment = parameters["environment"] ?? ""
        guard container == configuration.container else {
            throw ServiceError(.notFound, "unknown container \(container.prefix(100)); this server serves \(configuration.container)")
        }
        guard environment == "development" || environment == "production" else {
            throw ServiceError.badRequest("environment must be development or production")
        }
        guard let kind = DatabaseKind(rawValue: parameters["database"] ?? "") else {
            throw ServiceError.badRequest("database must be private, public or shared")
        }
        return (kind, environment)
    }

    // MARK: Admission (before the body)

    /// From the headers alone, as the route table says: an unknown `/database/` path or a wrong method is
    /// answered at once; inline routes run on the HTTP thread; a bearer route has its database checked and
    /// its token authenticated and throttled before its body is read (a bad or missing token gets its
    /// 401/421 without the body being buffered), then runs on the worker pool in its account's share; other
    /// pool routes (sign-up, and unknown paths outside /database/, which `route` answers 404) in their
    /// address's share.
    /// The deadline of the token lookup `admit` runs on the HTTP thread, in milliseconds.
    static let admissionDeadlineMilliseconds: Int64 = 2_000

    public func admit(_ head: HTTPRequestHead) -> HTTPAdmission {
        if shuttingDown.load(ordering: .sequentiallyConsistent) { return .inline }
        let addressShare = HTTPAdmission.pool(client: "ip:" + head.addressLimitKey, principal: nil)
        let route: Route, parameters: RouteParameters
        do {
            (route, parameters) = try resolveRoute(method: head.method, path: head.path)
        } catch let error as ServiceError where error.code == .notFound && !head.path.hasPrefix("/database/") {
            return addressShare
        } catch let error as MethodNotAllowed {
            return .answer(error.response)
        } catch {
            return .answer(internalError(error).response)
        }
        switch (route.lane, route.authentication) {
        case (.inline, _): return .inline
        case (.pool, .none): return addressShare
        case (.pool, .bearer), (.pool, .bearerOrSession):
            do {
                if case .account = route.handler {} else { _ = try databaseTarget(parameters) }
                // On the HTTP thread: the token lookup gets a short deadline of its own, so a database that
                // stalls (PostgreSQL unreachable) holds an HTTP thread for at most that long.
                let deadline = RequestDeadline.after(milliseconds: min(Self.admissionDeadlineMilliseconds,
                                                                       configuration.requestDeadlineMilliseconds))
                let (user, tokenID) = try authenticate(head, deadline: deadline,
                                                       allowSession: route.authentication == .bearerOrSession)
                if route.throttle == .perAccount { try throttle(key: "user:\(user.id)") }
                return .pool(client: "user:\(user.id)", principal: AuthenticatedCaller(user: user, tokenID: tokenID))
            } catch {
                return .answer(internalError(error).response)
            }
        }
    }

    /// Paths that hold a secret (a share token in `/share/{token}`): the access log shows the route's
    /// pattern only.
    public func pathForLog(_ path: String) -> String {
        guard let components = RoutePattern.components(of: path) else { return path }
        for route in Self.apiRoutes where route.hidesPath && route.pattern.match(components) != nil {
            return route.pattern.description
        }
        return path
    }

    // MARK: Authentication and throttling

    /// The caller and the id of the token they sent. A bad, unknown, revoked or expired token is
    /// AUTHENTICATION_FAILED and counts against the client address; once an address has used up its
    /// failure budget its bad tokens get THROTTLED (with Retry-After) instead, until the budget refills.
    /// Good tokens are always served, from any address (clients behind one NAT or proxy are not locked
    /// out by one bad client).
    private func authenticate(_ request: HTTPRequest, deadline: RequestDeadline?) throws -> (user: UserAccount, tokenID: String) {
        try authenticate(request.head, deadline: deadline)
    }

    /// Takes the head only, so `admit` can run it before the body is read.
    /// With `allowSession`, a request without `Authorization` may be made with a browser session cookie
    /// instead; it then needs the session's CSRF value (`checkCSRF`), else ACCESS_DENIED.
    private func authenticate(_ request: HTTPRequestHead, deadline: RequestDeadline? = nil, allowSession: Bool = false) throws
        -> (user: UserAccount, tokenID: String) {
        let header = request.header("authorization")
        let withSession = allowSession && header == nil && request.header("cookie")?.contains(Self.sessionCookie + "=") == true
        guard header != nil || withSession else {
            throw ServiceError(.authenticationRequired, "sign in: send Authorization: Bearer <token> (POST /auth/signup makes one)")
        }
        do {
            if let header { return try checkToken(header, deadline: deadline) }
            guard let session = try browserSession(request, deadline: deadline) else {
                throw ServiceError(.authenticationFailed, "the session cookie is malformed; sign in again")
            }
            try checkCSRF(request, session: session)
            return (session.user, session.tokenID)
        } catch let error as ServiceError where error.code == .authenticationFailed {
            throw failedSignIn(error, address: request.remoteAddress)
        }
    }

    /// A failed sign-in from `address` (a bad token, session, sign-in link or device code) taken from the
    /// address's failure budget: `error` itself while the budget lasts, THROTTLED (with Retry-After) once
    /// it is used up, until it refills.
    private func failedSignIn(_ error: ServiceError, address: String) -> ServiceError {
        guard let authenticationFailures else { return error }
        let key = "auth:" + ClientAddress.limitKey(address)
        guard let wait = authenticationFailures.take(key, nowMs: configuration.now()) else { return error }
        logRefusal(key, "authentication: \(address.isEmpty ? "-" : address) is throttled after repeated failed sign-ins")
        return ServiceError(.throttled, "too many failed sign-ins from this address; retry after \(wait) s", retryAfter: wait)
    }

    /// A sign-in exchange without a bearer token (`/auth/link`, `/auth/session`, `/auth/signout`,
    /// `/auth/device/token`) under the same per-address failure budget as bad tokens: an address that used
    /// it up is THROTTLED before any storage work, and each answer of a code in `failures` takes from it.
    /// Guessing links, sessions or device codes costs the guesser, not the database.
    func countingFailedSignIns(from address: String, _ failures: Set<ServerErrorCode> = [.authenticationFailed],
                               _ body: () throws -> HTTPResponse) throws -> HTTPResponse {
        if let authenticationFailures, let wait = authenticationFailures.wait("auth:" + ClientAddress.limitKey(address), nowMs: configuration.now()) {
            throw ServiceError(.throttled, "too many failed sign-ins from this address; retry after \(wait) s", retryAfter: wait)
        }
        do {
            return try body()
        } catch let error as ServiceError where failures.contains(error.code) {
            throw failedSignIn(error, address: address)
        }
    }

    /// Checks a bearer token against the database (no cache: revocation takes effect at once).
    private func checkToken(_ header: String, deadline: RequestDeadline?) throws -> (user: UserAccount, tokenID: String) {
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", let token = BearerToken(text: String(parts[1])) else {
            throw ServiceError(.authenticationFailed, "the Authorization header is not a Lattice bearer token")
        }
        // The authentication lane: never queued behind a long read or a write.
        guard let found = try storage.read(deadline: deadline ?? freshDeadline(), lane: .authentication,
                                           { try $0.tokenOwner(hash: token.storedHash) }) else {
            throw ServiceError(.authenticationFailed, "unknown or revoked token")
        }
        // Browser sessions and one-time sign-in links live in the same table but are not bearer tokens.
        guard TokenKind(id: found.token.id).isBearer else { throw ServiceError(.authenticationFailed, "unknown or revoked token") }
        if let expires = found.token.expiresMs, expires <= configuration.now() {
            let date = Date(timeIntervalSince1970: Double(expires) / 1000)
            throw ServiceError(.authenticationFailed, "the token expired at \(ISO8601DateFormatter().string(from: date)); "
                           + "sign in again with a new token")
        }
        return (found.user, found.token.id)
    }

    private func throttle(key: String) throws {
        guard let limiter, let wait = limiter.take(key, nowMs: configuration.now()) else { return }
        throw ServiceError(.throttled, "too many requests; retry after \(wait) s", retryAfter: wait)
    }

    /// Logs a refusal of kind `key`, at most once a minute per kind.
    func logRefusal(_ key: String, _ message: @autoclosure () -> String) { core.logRefusal(key, message()) }

    /// Refuses a write that adds data over the server-wide disk budget (`OperationsCore.checkDiskBudget`).
    func checkDiskBudget(_ what: String) throws { try core.checkDiskBudget(what) }

    // MARK: Accounts (`Accounts`, for `lattice admin` and tests)

    /// Creates a user with a fresh token (`Accounts.createAccount`).
    public func createAccount(name: String, lifetimeSeconds: Int64? = nil) throws -> NewAccount {
        try Accounts(core).createAccount(name: name, lifetimeSeconds: lifetimeSeconds)
    }

    /// Makes another token for an existing user (`Accounts.issueToken`).
    public func issueToken(userID: Int64, lifetimeSeconds: Int64? = nil) throws -> IssuedToken {
        try Accounts(core).issueToken(userID: userID, lifetimeSeconds: lifetimeSeconds)
    }

    /// Revokes one token by id, or every token of a user (`Accounts.revokeTokens(tokenID:userName:)`).
    public func revokeTokens(tokenID: String? = nil, userName: String? = nil) throws -> [String] {
        try Accounts(core).revokeTokens(tokenID: tokenID, userName: userName)
    }

    /// A user's tokens (`Accounts.tokens(userName:)`).
    public func tokens(userName: String) throws -> [StoredToken] { try Accounts(core).tokens(userName: userName) }

    // MARK: Bodies and errors

    func parseBody(_ request: HTTPRequest) throws -> [String: JSON] {
        if request.body.isEmpty { return [:] }
        let json: JSON
        do {
            json = try JSON.parse(request.body)
        } catch {
            throw ServiceError.badRequest("the body is not valid JSON: \(error.description)")
        }
        guard let object = json.objectValue else { throw ServiceError.badRequest("the body must be a JSON object") }
        return object
    }

    /// Maps a non-API error (`OperationsCore.serviceError(for:)`): busy, full disk and deadline are
    /// TRY_AGAIN_LATER; anything else is logged and reported as INTERNAL_ERROR with no detail.
    func internalError(_ error: any Error) -> ServiceError { core.serviceError(for: error) }

    /// The configured request deadline from now.
    func freshDeadline() -> RequestDeadline { core.freshDeadline() }

    /// The one write transaction of every change (`OperationsCore.write`).
    func write<T>(deadline: RequestDeadline? = nil, _ body: (any StorageTransaction, inout Set<Int64>) throws -> T) throws -> T {
        try core.write(deadline: deadline, body)
    }

    /// Serializes the rest of the write on `name` across nodes (`OperationsCore.serialize`).
    func serialize(_ name: String, _ tx: any StorageTransaction) throws { try core.serialize(name, tx) }

    // MARK: Other nodes' commits

    /// Merges `change` into the pending batch and, if none was queued, queues one on `remoteChanges`.
    func enqueueObservedChange(_ change: StorageChange) {
        let schedule: Bool = pendingChanges.withLock { pending in
            switch (pending, change) {
            case (nil, _):
                pending = change
                return true
            case (.resynchronize?, _), (_, .resynchronize):
                pending = .resynchronize
            case (.databases(let queued)?, .databases(let more)):
                pending = .databases(Array(Set(queued).union(more)))
            }
            return false
        }
        guard schedule else { return }
        remoteChanges.async { [weak self] in
            guard let self, let batch = self.pendingChanges.withLock({ pending -> StorageChange? in
                defer { pending = nil }
                return pending
            }) else { return }
            self.observedChange(batch)
        }
    }

    /// What another node's commit changed (`Storage.observeChanges`): wakes the parked long polls it
    /// concerns. Only databases with a parked waiter are read; after `.resynchronize` (announcements may
    /// have been lost) every parked waiter's databases are. Runs on `remoteChanges`, off the backend's thread.
    func observedChange(_ change: StorageChange) {
        let watched = notifier.watchedDatabaseIDs
        let wanted: [Int64]
        switch change {
        case .databases(let ids): wanted = ids.filter(watched.contains)
        case .resynchronize: wanted = watched.sorted()
        }
        guard !wanted.isEmpty else { return }
        do {
            let positions = try storage.read(deadline: .after(milliseconds: configuration.requestDeadlineMilliseconds)) { tx in
                try wanted.compactMap { id in try tx.database(id: id).map { (id, $0.lastSeq) } }
            }
            for (id, position) in positions { notifier.notify(databaseID: id, position: position) }
        } catch {
            // The database is away: look again shortly, and every waiter then, since more may be missed.
            log("could not read the positions other nodes announced (\(error)); retrying in 1 s")
            remoteChanges.asyncAfter(deadline: .now() + 1) { [weak self] in self?.enqueueObservedChange(.resynchronize) }
        }
    }

    // MARK: Health

    /// Whether the last probe of the storage (`probeStorage`) found it reachable and this node's claim
    /// held; `/healthz` answers 503 while not.
    public var storageReachable: Bool { storageProblem.withLock { $0 == nil } }

    /// One cheap point read with a short deadline, for `/healthz` (`ServerProcess` runs it every second on a
    /// shared database): a node that cannot reach its database reports it, so a load balancer stops sending
    /// it requests until it can again.
    public func probeStorage(deadlineMilliseconds: Int64) {
        let problem: String?
        do {
            _ = try storage.read(deadline: .after(milliseconds: deadlineMilliseconds), lane: .authentication) { tx in
                try tx.metadata(OpenedDeployment.publicURLKey)
            }
            try storage.checkNodeClaims()
            problem = nil
        } catch StorageError.failure(let message) {
            problem = message // a node name another process took: writes are refused until a restart
        } catch {
            problem = "the database cannot be reached"
        }
        let was = storageProblem.withLock { last in
            defer { last = problem }
            return last
        }
        if was != problem {
            log(problem.map { "\($0): /healthz answers 503" } ?? "the database is reachable again")
        }
    }

    /// `GET /healthz`: `{"status": "ok"}`, or, while the storage cannot be reached or this node's name was
    /// taken by another process, 503 TRY_AGAIN_LATER (with Retry-After) saying which, as while the server
    /// shuts down.
    func healthResponse() -> HTTPResponse {
        if let problem = storageProblem.withLock({ $0 }) {
            return ServiceError(.tryAgainLater, problem, retryAfter: 1).response
        }
        return .json(.object(["status": .string("ok")]))
    }
}

/// Who `admit` authenticated from the headers: the account and the id of the token it used.
struct AuthenticatedCaller: Sendable {
    let user: UserAccount
    let tokenID: String
}

/// What a request is about, once routed and authenticated.
struct RequestContext {
    let user: UserAccount
    let kind: DatabaseKind
    let environment: String
    let body: [String: JSON]
    let rawBody: [UInt8]
    let path: String
    /// The envelope of a `deltas/push` (its body is binary, not JSON).
    var push: SyncMessage.Push? = nil
    /// When the request's work must stop (`ServiceConfiguration.requestDeadlineMilliseconds`).
    var deadline: RequestDeadline? = nil
    /// The id of the bearer token the request was made with.
    var tokenID: String? = nil

    var databaseKey: DatabaseKey {
        DatabaseKey(kind: kind, environment: environment, ownerID: kind == .public ? 0 : user.id)
    }

    /// The caller, as operations see it.
    var caller: Caller { Caller(user: user, database: kind, environment: environment, tokenID: tokenID, deadline: deadline) }
}
