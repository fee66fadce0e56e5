import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore
import Synchronization

/// The Lattice service core: routes a request, authenticates it, runs the operation against storage and
/// renders the answer. It holds no socket; `HTTPServer` feeds it from libmicrohttpd, tests call it directly.
///
/// Merge rules come from LatticeCore and SQL stays in LatticeStore; this type maps requests to them.
public final class LatticeService: HTTPHandler, Sendable {
    public let configuration: ServiceConfiguration
    public let replicaID: ReplicaID
    let storage: any Storage
    /// Signs and verifies share URLs; nil on a server without share links (some tests).
    let keyRing: ShareKeyRing?
    let clock: Mutex<HybridLogicalClock>
    /// The reservation ahead of `clock` kept in the node's row (StorageNodes.swift).
    let clockLease: NodeClockLease
    let notifier = ChangeNotifier()
    private let limiter: RateLimiter?
    /// Failed authentications per client address (in memory, per process).
    private let authenticationFailures: RateLimiter?
    /// Keeps refusals that an attacker can repeat from flooding the log: one line per kind a minute.
    private let refusalLog = RateLimiter(.init(requestsPerSecond: 1.0 / 60, burst: 1))
    private let shuttingDown = Atomic<Bool>(false)
    /// When the full disk was last logged (once a minute), for this service alone.
    private let diskFullLoggedMs = Atomic<Int64>(Int64.min / 2)
    /// The database's size as last measured for the disk budget (`checkDiskBudget`).
    let diskUsage = DiskUsageReading()
    private let currentPublicURL: Mutex<String>
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
    public var publicURL: String { currentPublicURL.withLock { $0 } }

    /// Sets the public URL once the listening port is known (`lattice serve --port 0` without --public-url).
    public func setPublicURL(_ url: String) { currentPublicURL.withLock { $0 = url } }
    let log: @Sendable (String) -> Void

    /// - Parameter log: where internal errors are written (never to clients).
    public init(storage: any Storage, configuration: ServiceConfiguration = ServiceConfiguration(),
                keyRing: ShareKeyRing? = nil,
                log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(("lattice: " + $0 + "\n").utf8)) }) throws {
        self.storage = storage
        self.configuration = configuration
        self.keyRing = keyRing
        currentPublicURL = Mutex(configuration.publicURL)
        self.log = log
        limiter = configuration.rateLimit.map(RateLimiter.init)
        authenticationFailures = configuration.failedAuthenticationLimit.map(RateLimiter.init)
        // The node's replica id stamps plain writes; it is made once per node and kept in the database,
        // unique among the nodes (a taken one is drawn again).
        let nodeName = configuration.nodeName
        let now = configuration.now
        let (replica, latest): (ReplicaID, UInt64) = try storage.write { tx in
            if let node = try tx.node(named: nodeName) {
                guard let replica = ReplicaID(hex: node.replicaID) else {
                    throw StorageError.failure("node \(nodeName) has a malformed replica id \(node.replicaID)")
                }
                return (replica, UInt64(max(0, node.clockLatest)))
            }
            var random = SystemRandomNumberGenerator()
            for _ in 0..<8 {
                let replica = ReplicaID(random.next() | 1)
                do {
                    try tx.savepoint {
                        try tx.insertNode(StoredNode(name: nodeName, replicaID: replica.description, clockLatest: 0,
                                                     createdMs: now()))
                    }
                    return (replica, 0)
                } catch StorageError.duplicate {
                    continue
                }
            }
            throw StorageError.failure("cannot register node \(nodeName): no free replica id in 8 draws")
        }
        replicaID = replica
        clockLease = NodeClockLease(persisted: Int64(clamping: latest))
        clock = Mutex(HybridLogicalClock(replica: replica, maximumDriftMilliseconds: configuration.maximumClockDriftMilliseconds,
                                         latest: HLC(rawValue: latest), time: { UInt64(max(0, now())) }))
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
    /// device sign-ins and old failed approvals); an empty report when another node is purging now
    /// (`purgeUnlessRunningElsewhere`).
    @discardableResult
    public func purgeExpired() throws -> PurgeReport {
        try purgeUnlessRunningElsewhere() ?? PurgeReport()
    }

    /// Rows one batch of the purge removes at most: each batch is a write transaction of its own.
    public static let purgeBatchRows = 1_000
    /// The deadline of one batch's write transaction (its wait for the writer included).
    public static let purgeBatchDeadlineMilliseconds: Int64 = 2_000
    /// How long one purge run goes on starting batches; what is left then waits for the next run.
    public static let purgeRunBudgetMilliseconds: Int64 = 20_000
    /// The pause between two batches, so that requests waiting for the writer get it in between.
    static let purgePauseMilliseconds = 5
    /// Batches in a row that may remove nothing (all that is left is under rows requests held, on
    /// PostgreSQL) before the run stops; after such a batch the pause is `purgeIdlePauseMilliseconds`.
    static let purgeIdleBatches = 10
    static let purgeIdlePauseMilliseconds = 100

    /// The purge, in batches (`purgeBatchRows` rows each, `StorageTransaction.purge`), each one write with a
    /// deadline (`purgeBatchDeadlineMilliseconds`), so that a large backlog never holds SQLite's one writer
    /// for long: requests' writes get in between two batches. The run ends when a batch finds nothing more,
    /// or, with rows left (the report's `complete` is false, and the log says why), once it has run for
    /// `budgetMilliseconds`, a batch failed, or another node took the lock. The horizons are fixed when the
    /// run starts.
    ///
    /// One node at a time: every batch first takes the exclusive lock "purge" without waiting
    /// (`tryExclusiveLock`: SQLite's one writer; on PostgreSQL a transaction advisory lock, held until that
    /// batch commits). Nil (nothing done) when another node holds it at the first batch; a node that loses it
    /// at a later batch stops and leaves the rest to the node that holds it. So no two batches of the purge
    /// ever run at once, and two nodes' runs may at most take turns between batches (harmless: a batch
    /// removes only rows that are still expired).
    public func purgeUnlessRunningElsewhere(batchRows: Int = LatticeService.purgeBatchRows,
                                            budgetMilliseconds: Int64 = LatticeService.purgeRunBudgetMilliseconds)
        throws -> PurgeReport? {
        let now = configuration.now()
        let horizon = now - configuration.tombstoneHorizonMilliseconds
        let operationsBefore = now - configuration.clientOperationHorizonMilliseconds
        let approvalFailuresBefore = now - configuration.deviceApprovalFailureWindowMilliseconds + 1
        let limit = max(1, batchRows)
        let budget = RequestDeadline.after(milliseconds: budgetMilliseconds)
        var total = PurgeReport(complete: false)
        var idle = 0
        func stop(_ reason: String) -> PurgeReport {
            log("purge: \(reason) after \(total.batches) batches (\(total.tombstones) tombstones, \(total.zones) zones, "
                + "\(total.clientOperations) remembered operations removed); the rest waits for the next run")
            return total
        }
        while true {
            let first = total.batches == 0
            let batch: PurgeReport?
            do {
                batch = try storage.write(deadline: .after(milliseconds: Self.purgeBatchDeadlineMilliseconds)) { tx in
                    guard try tx.tryExclusiveLock("purge") else { return nil }
                    if first {
                        // Device sign-ins past their lifetime, and failed approvals past their window (Devices.swift):
                        // few (their creation is rate-limited), so they go with the first batch.
                        _ = try tx.forgetDeviceAuthorizations(expiredAt: now)
                        try tx.forgetDeviceApprovalFailures(before: approvalFailuresBefore)
                    }
                    return try tx.purge(before: horizon, operationsBeforeMs: operationsBefore, limit: limit)
                }
            } catch {
                if first { throw error }
                return stop("batch \(total.batches + 1) failed (\(error)), stopped")
            }
            guard let batch else {
                return first ? nil : stop("another node took the purge lock, stopped")
            }
            total.tombstones += batch.tombstones
            total.zones += batch.zones
            total.clientOperations += batch.clientOperations
            total.batches += 1
            if batch.complete {
                total.complete = true
                return total
            }
            idle = batch.removed == 0 ? idle + 1 : 0
            if idle >= Self.purgeIdleBatches {
                return stop("\(idle) batches in a row found only rows held by requests, stopped")
            }
            if budget.hasPassed { return stop("the run's budget of \(budgetMilliseconds) ms passed") }
            usleep(UInt32((idle > 0 ? Self.purgeIdlePauseMilliseconds : Self.purgePauseMilliseconds) * 1_000))
        }
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
    func logRefusal(_ key: String, _ message: @autoclosure () -> String) {
        if refusalLog.take(key, nowMs: configuration.now()) == nil { log(message()) }
    }

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

    /// When a full disk was last logged (milliseconds, the configuration's clock).

    /// Maps a non-API error: a busy database is TRY_AGAIN_LATER, and so is a full disk (logged once a
    /// minute: the operator must free space); anything else is logged and reported as INTERNAL_ERROR with
    /// no detail.
    func internalError(_ error: any Error) -> ServiceError {
        if let error = error as? ServiceError { return error }
        if case StorageError.busy = error {
            return ServiceError(.tryAgainLater, "the database is busy or cannot be reached; retry shortly")
        }
        if case StorageError.closed = error { return ServiceError(.tryAgainLater, "the server is shutting down") }
        if case StorageError.diskFull = error {
            // Logged at most once a minute: a full disk refuses every write, and the log may share the disk.
            let now = configuration.now(), last = diskFullLoggedMs.load(ordering: .relaxed)
            if now - last >= 60_000, diskFullLoggedMs.compareExchange(expected: last, desired: now, ordering: .relaxed).exchanged {
                log("writes refused: the disk holding the data directory is full (or the file-size limit is reached)")
            }
            return ServiceError(.tryAgainLater, "the server's disk is full; nothing was written; retry later", retryAfter: 30)
        }
        if case StorageError.deadlineExceeded = error {
            return ServiceError(.tryAgainLater, "the request ran past its deadline of \(configuration.requestDeadlineMilliseconds) ms "
                            + "and was stopped (nothing was written); retry, or ask for less at once")
        }
        let reference = UUID().uuidString.lowercased()
        log("internal error \(reference): \(error)")
        return ServiceError(.internalError, "internal error (reference \(reference))")
    }

    /// The configured request deadline from now: for the storage work of a request that has no
    /// `RequestContext` (sign-up, sessions, device sign-in, share pages, token checks before the body), so
    /// no request's storage work is unbounded.
    func freshDeadline() -> RequestDeadline {
        .after(milliseconds: configuration.requestDeadlineMilliseconds)
    }

    /// A write transaction. `touched` collects the databases whose logs it moved: their positions are read
    /// inside the transaction (the rows are locked by the writer already), the other nodes are told inside
    /// it (`announceChanges`: delivered only if it commits), and after the commit this node's long polls on
    /// them are woken with the committed positions. A backend may run `body` again (a retried conflict):
    /// each run starts with nothing touched.
    /// Without a `deadline` it gets one of the configured length from now (`freshDeadline`).
    func write<T>(deadline: RequestDeadline? = nil, _ body: (any StorageTransaction, inout Set<Int64>) throws -> T) throws -> T {
        let (result, positions, reserved) = try storage.write(deadline: deadline ?? freshDeadline()) { tx -> (T, [(Int64, Int64)], Int64?) in
            var touched = Set<Int64>()
            let result = try body(tx, &touched)
            // Keep the clock's high-water mark ahead of the writes it stamped (NodeClockLease): after a
            // restart the clock never goes back, even if the wall clock did. Most transactions are covered
            // by the committed reservation and leave the node's row alone.
            let latest = Int64(clamping: clock.withLock { $0.latest.rawValue })
            let reserved = clockLease.markToPersist(latest: latest, nowMs: configuration.now())
            if let reserved { try tx.raiseNodeClock(name: configuration.nodeName, to: reserved) }
            guard !touched.isEmpty else { return (result, [], reserved) }
            let ids = touched.sorted()
            let positions = try ids.compactMap { id in try tx.database(id: id).map { (id, $0.lastSeq) } }
            try tx.announceChanges(databaseIDs: ids)
            return (result, positions, reserved)
        }
        if let reserved { clockLease.committed(reserved) }
        for (id, position) in positions { notifier.notify(databaseID: id, position: position) }
        return result
    }

    /// Makes the rest of this write transaction wait for any other one that serialized on `name`, on every
    /// node: it writes the metadata row `lock:NAME`, whose row lock a multi-writer backend holds to commit
    /// (SQLite's one writer serializes anyway). For check-then-act rules that have no row of their own
    /// to lock (the sign-up limits, the tokens-per-user cap).
    func serialize(_ name: String, _ tx: any StorageTransaction) throws {
        try tx.setMetadata("lock:" + name, "")
    }

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
}
