import Foundation
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
    let notifier = ChangeNotifier()
    private let limiter: RateLimiter?
    /// Failed authentications per client address (in memory, per process).
    private let authenticationFailures: RateLimiter?
    /// Keeps refusals that an attacker can repeat from flooding the log: one line per kind a minute.
    private let refusalLog = RateLimiter(.init(requestsPerSecond: 1.0 / 60, burst: 1))
    private let shuttingDown = Atomic<Bool>(false)
    /// When the full disk was last logged (once a minute), for this service alone.
    private let diskFullLoggedMs = Atomic<Int64>(Int64.min / 2)
    private let currentPublicURL: Mutex<String>
    /// Set by `probeStorage`; true until a probe fails.
    private let storageHealthy = Atomic<Bool>(true)
    /// Where other nodes' announced commits are handled (`observedChange`), one at a time.
    let remoteChanges = DispatchQueue(label: "lattice-remote-changes")

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
        clock = Mutex(HybridLogicalClock(replica: replica, maximumDriftMilliseconds: configuration.maximumClockDriftMilliseconds,
                                         latest: HLC(rawValue: latest), time: { UInt64(max(0, now())) }))
        // Other nodes' commits wake this node's long polls (a single-process backend delivers nothing).
        let queue = remoteChanges
        try storage.observeChanges { [weak self] change in
            queue.async { [weak self] in self?.observedChange(change) }
        }
    }

    public var maximumBodySize: Int { configuration.maximumRequestBytes }

    public func responseForOversizedBody() -> HTTPResponse {
        APIError(.limitExceeded, "the request body is over the limit of \(configuration.maximumRequestBytes) bytes").response
    }

    public func beginShutdown() {
        shuttingDown.store(true, ordering: .sequentiallyConsistent)
        notifier.shutDown()
    }

    /// Removes tombstones, deleted zones and remembered operation ids past their horizons; an empty report
    /// when another node is purging now (`purgeUnlessRunningElsewhere`).
    @discardableResult
    public func purgeExpired() throws -> PurgeReport {
        try purgeUnlessRunningElsewhere() ?? PurgeReport()
    }

    /// The purge, in one write that first takes the exclusive lock "purge" without waiting: nil (nothing
    /// done) when another node holds it, so nodes on one database purge one at a time.
    public func purgeUnlessRunningElsewhere() throws -> PurgeReport? {
        let now = configuration.now()
        return try storage.write { tx in
            guard try tx.tryExclusiveLock("purge") else { return nil }
            return try tx.purge(before: now - configuration.tombstoneHorizonMilliseconds,
                                operationsBeforeMs: now - configuration.clientOperationHorizonMilliseconds)
        }
    }

    // MARK: Routing

    /// Every route the service answers, as `METHOD /path/{parameter}`; Docs/openapi.json must list each.
    public static let routes: [String] = ["GET /healthz", "POST /auth/signup", "GET /.well-known/jwks.json",
                                          "GET /share/{token}"]
        + DatabaseOperation.allCases.map { "POST /database/1/{container}/{environment}/{database}/\($0.rawValue)" }

    enum DatabaseOperation: String, CaseIterable {
        case usersCurrent = "users/current"
        case zonesList = "zones/list"
        case zonesLookup = "zones/lookup"
        case zonesModify = "zones/modify"
        case recordsModify = "records/modify"
        case recordsLookup = "records/lookup"
        case recordsQuery = "records/query"
        case changesDatabase = "changes/database"
        case changesZone = "changes/zone"
        case changesWait = "changes/wait"
        case sharesCreate = "shares/create"
        case sharesLookup = "shares/lookup"
        case sharesModify = "shares/modify"
        case sharesURL = "shares/url"
        case sharesLeave = "shares/leave"
        case sharesDelete = "shares/delete"
        case recordsResolve = "records/resolve"
        case recordsAccept = "records/accept"
        case deltasPush = "deltas/push"
        case deltasPull = "deltas/pull"
        case tokensList = "tokens/list"
        case tokensCreate = "tokens/create"
        case tokensRevoke = "tokens/revoke"
    }

    public func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        do {
            try route(request, respond: respond)
        } catch let error as APIError {
            respond(error.response)
        } catch let failure as AtomicBatchFailure {
            respond(failure.response)
        } catch {
            respond(internalError(error).response)
        }
    }

    private func route(_ request: HTTPRequest, respond: @escaping HTTPResponder) throws {
        if shuttingDown.load(ordering: .sequentiallyConsistent) {
            throw APIError(.tryAgainLater, "the server is shutting down")
        }
        let path = request.path
        if path == "/healthz" {
            guard request.method == "GET" || request.method == "HEAD" else { throw methodNotAllowed(request, "GET") }
            return respond(healthResponse())
        }
        if path == "/.well-known/jwks.json" {
            guard request.method == "GET" || request.method == "HEAD" else { throw methodNotAllowed(request, "GET") }
            guard let keyRing else { throw APIError(.notFound, "this server does not sign share links") }
            var response = HTTPResponse.json(keyRing.jwks())
            response.headers.removeAll { $0.name == "Cache-Control" }
            response.headers.append((name: "Cache-Control", value: "public, max-age=300"))
            return respond(response)
        }
        if path.hasPrefix("/share/") {
            guard request.method == "GET" || request.method == "HEAD" else { throw methodNotAllowed(request, "GET") }
            return respond(.json(.object([
                "message": .string("This is a Lattice share link. Open it with: lattice accept <this URL>"),
                "resolve": .string("POST /database/1/\(configuration.container)/{environment}/shared/records/resolve "
                                   + "with {\"shortGUIDs\": [{\"value\": \"<this URL>\"}]} and a bearer token"),
                "jwks": .string("/.well-known/jwks.json"),
            ])))
        }
        if path == "/auth/signup" {
            guard request.method == "POST" else { throw methodNotAllowed(request, "POST") }
            try throttle(key: "ip:" + request.remoteAddress)
            return respond(try signUp(parseBody(request), address: request.remoteAddress))
        }
        let (operation, kind, environment) = try databaseRoute(request.head)
        // The request's work ends at its deadline (storage is interrupted, CPU loops check it); a parked
        // long poll is not working, and its reads before and after parking take fresh ones.
        let deadline = RequestDeadline.after(milliseconds: configuration.requestDeadlineMilliseconds)
        // Admitted from the headers (`admit`): authenticated and throttled there already.
        let user: UserAccount, tokenID: String
        if let admitted = request.principal as? AuthenticatedCaller {
            (user, tokenID) = (admitted.user, admitted.tokenID)
        } else {
            (user, tokenID) = try authenticate(request.head, deadline: deadline)
            try throttle(key: "user:\(user.id)")
        }
        // deltas/push has a binary body: its envelope carries what a JSON body would (clientOperationID, atomic).
        var push: SyncMessage.Push? = nil
        var body: [String: JSON]
        if operation == .deltasPush {
            let envelope = try Self.pushEnvelope(request)
            body = ["atomic": .bool(envelope.atomic)]
            if let id = envelope.clientOperationID { body["clientOperationID"] = .string(id) }
            push = envelope
        } else {
            body = try parseBody(request)
        }
        let context = RequestContext(user: user, kind: kind, environment: environment, body: body,
                                     rawBody: request.body, path: path, push: push, deadline: deadline, tokenID: tokenID)
        if addsData(operation, body) { try checkDiskBudget(operation.rawValue) }
        switch operation {
        case .changesWait:
            try waitForChanges(context, abandonment: request.abandonment, respond: respond)
        default:
            respond(try perform(operation, context))
        }
    }

    /// A database route (`/database/1/{container}/{environment}/{database}/{operation}`) checked from the
    /// head alone.
    private func databaseRoute(_ head: HTTPRequestHead) throws -> (DatabaseOperation, DatabaseKind, String) {
        let path = head.path
        let parts = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard parts.count >= 7, parts[0].isEmpty, parts[1] == "database", parts[2] == "1" else {
            throw APIError(.notFound, "no such endpoint: \(head.method.prefix(20)) \(path.prefix(200))")
        }
        guard let operation = DatabaseOperation(rawValue: parts[6...].joined(separator: "/")) else {
            throw APIError(.notFound, "no such operation: \(parts[6...].joined(separator: "/").prefix(100))")
        }
        guard head.method == "POST" else {
            throw APIError(.notFound, "\(path.prefix(200)) answers POST, not \(head.method.prefix(20))")
        }
        guard parts[3] == configuration.container else {
            throw APIError(.notFound, "unknown container \(parts[3].prefix(100)); this server serves \(configuration.container)")
        }
        guard parts[4] == "development" || parts[4] == "production" else {
            throw APIError.badRequest("environment must be development or production")
        }
        guard let kind = DatabaseKind(rawValue: parts[5]) else {
            throw APIError.badRequest("database must be private, public or shared")
        }
        return (operation, kind, parts[4])
    }

    // MARK: Admission (before the body)

    /// From the headers alone: cheap routes run inline; a database request is routed and its token
    /// authenticated and throttled before its body is read (a bad or missing token gets its 401/421
    /// without the body being buffered), then runs on the worker pool in its account's share; sign-up in
    /// its address's share.
    public func admit(_ head: HTTPRequestHead) -> HTTPAdmission {
        let path = head.path
        if shuttingDown.load(ordering: .sequentiallyConsistent) || path == "/healthz"
            || path == "/.well-known/jwks.json" || path.hasPrefix("/share/") {
            return .inline
        }
        // Sign-up, and any other route outside /database/ (route() answers it, 404 included), in the
        // address's share.
        guard path.hasPrefix("/database/") else { return .pool(client: "ip:" + head.remoteAddress, principal: nil) }
        do {
            _ = try databaseRoute(head)
            let (user, tokenID) = try authenticate(head)
            try throttle(key: "user:\(user.id)")
            return .pool(client: "user:\(user.id)", principal: AuthenticatedCaller(user: user, tokenID: tokenID))
        } catch {
            return .answer(internalError(error).response)
        }
    }

    /// Share tokens in `/share/{token}` are secrets: the access log shows the route only.
    public func pathForLog(_ path: String) -> String {
        path.hasPrefix("/share/") ? "/share/{token}" : path
    }

    private func perform(_ operation: DatabaseOperation, _ context: RequestContext) throws -> HTTPResponse {
        switch operation {
        case .usersCurrent:
            return .json(.object(["userRecordName": .string(context.user.recordName), "name": .string(context.user.name)]))
        case .zonesList: return .json(try listZones(context))
        case .zonesLookup: return .json(try lookupZones(context))
        case .zonesModify: return try idempotent(context) { try modifyZones(context, $0, &$1) }
        case .recordsModify:
            let refused = try recordsModifyRefusals(context) // the size caps, before the write lock is taken
            return try idempotentModify(context) { try modifyRecordsOutcome(context, $0, &$1, refused: refused) }
        case .recordsLookup: return .json(try lookupRecords(context))
        case .recordsQuery: return .json(try queryRecords(context))
        case .changesDatabase: return .json(try databaseChanges(context))
        case .changesZone: return .json(try zoneChanges(context))
        case .changesWait: throw APIError(.internalError, "changes/wait is asynchronous")
        case .sharesCreate: return try idempotent(context) { try createShare(context, $0, &$1) }
        case .sharesLookup: return .json(try lookupShare(context))
        case .sharesModify: return try idempotent(context) { try modifyShare(context, $0, &$1) }
        case .sharesURL: return try write(deadline: context.deadline) { tx, touched in try shareURL(context, tx, &touched) }
        case .sharesLeave: return try idempotent(context) { try leaveShare(context, $0, &$1) }
        case .sharesDelete: return try idempotent(context) { try deleteShare(context, $0, &$1) }
        case .recordsResolve: return .json(try resolveShares(context))
        case .recordsAccept: return try write(deadline: context.deadline) { tx, touched in try acceptShares(context, tx, &touched) }
        case .deltasPush:
            guard let push = context.push else { throw APIError.badRequest("deltas/push takes a binary delta push") }
            let prepared = try preparePush(push)
            return try idempotent(context, replay: .push(prepared)) {
                try pushDelta(context, prepared, atomic: push.atomic, $0, &$1)
            }
        case .deltasPull: return try pullDelta(context)
        case .tokensList: return .json(try listTokens(context))
        case .tokensCreate: return .json(try createToken(context))
        case .tokensRevoke: return .json(try revokeTokens(context))
        }
    }

    private func methodNotAllowed(_ request: HTTPRequest, _ allowed: String) -> APIError {
        APIError(.notFound, "\(request.path.prefix(200)) answers \(allowed), not \(request.method.prefix(20))")
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
    private func authenticate(_ request: HTTPRequestHead, deadline: RequestDeadline? = nil) throws -> (user: UserAccount, tokenID: String) {
        guard let header = request.header("authorization") else {
            throw APIError(.authenticationRequired, "sign in: send Authorization: Bearer <token> (POST /auth/signup makes one)")
        }
        do {
            return try checkToken(header, deadline: deadline)
        } catch let error as APIError where error.code == .authenticationFailed {
            guard let authenticationFailures else { throw error }
            let address = "auth:" + request.remoteAddress
            let now = configuration.now()
            if let wait = authenticationFailures.take(address, nowMs: now) {
                logRefusal(address, "authentication: \(request.remoteAddress.isEmpty ? "-" : request.remoteAddress) is "
                           + "throttled after repeated failed tokens")
                throw APIError(.throttled, "too many failed sign-ins from this address; retry after \(wait) s", retryAfter: wait)
            }
            throw error
        }
    }

    /// Checks a bearer token against the database (no cache: revocation takes effect at once).
    private func checkToken(_ header: String, deadline: RequestDeadline?) throws -> (user: UserAccount, tokenID: String) {
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", let token = BearerToken(text: String(parts[1])) else {
            throw APIError(.authenticationFailed, "the Authorization header is not a Lattice bearer token")
        }
        // The authentication lane: never queued behind a long read or a write.
        guard let found = try storage.read(deadline: deadline, lane: .authentication, { try $0.tokenOwner(hash: token.storedHash) }) else {
            throw APIError(.authenticationFailed, "unknown or revoked token")
        }
        if let expires = found.token.expiresMs, expires <= configuration.now() {
            let date = Date(timeIntervalSince1970: Double(expires) / 1000)
            throw APIError(.authenticationFailed, "the token expired at \(ISO8601DateFormatter().string(from: date)); "
                           + "sign in again with a new token")
        }
        return (found.user, found.token.id)
    }

    private func throttle(key: String) throws {
        guard let limiter, let wait = limiter.take(key, nowMs: configuration.now()) else { return }
        throw APIError(.throttled, "too many requests; retry after \(wait) s", retryAfter: wait)
    }

    /// Logs a refusal of kind `key`, at most once a minute per kind.
    func logRefusal(_ key: String, _ message: @autoclosure () -> String) {
        if refusalLog.take(key, nowMs: configuration.now()) == nil { log(message()) }
    }

    // MARK: Bodies and errors

    private func parseBody(_ request: HTTPRequest) throws -> [String: JSON] {
        if request.body.isEmpty { return [:] }
        let json: JSON
        do {
            json = try JSON.parse(request.body)
        } catch {
            throw APIError.badRequest("the body is not valid JSON: \(error.description)")
        }
        guard let object = json.objectValue else { throw APIError.badRequest("the body must be a JSON object") }
        return object
    }

    /// When a full disk was last logged (milliseconds, the configuration's clock).

    /// Maps a non-API error: a busy database is TRY_AGAIN_LATER, and so is a full disk (logged once a
    /// minute: the operator must free space); anything else is logged and reported as INTERNAL_ERROR with
    /// no detail.
    func internalError(_ error: any Error) -> APIError {
        if let error = error as? APIError { return error }
        if case StorageError.busy = error {
            return APIError(.tryAgainLater, "the database is busy or cannot be reached; retry shortly")
        }
        if case StorageError.closed = error { return APIError(.tryAgainLater, "the server is shutting down") }
        if case StorageError.diskFull = error {
            // Logged at most once a minute: a full disk refuses every write, and the log may share the disk.
            let now = configuration.now(), last = diskFullLoggedMs.load(ordering: .relaxed)
            if now - last >= 60_000, diskFullLoggedMs.compareExchange(expected: last, desired: now, ordering: .relaxed).exchanged {
                log("writes refused: the disk holding the data directory is full (or the file-size limit is reached)")
            }
            return APIError(.tryAgainLater, "the server's disk is full; nothing was written; retry later", retryAfter: 30)
        }
        if case StorageError.deadlineExceeded = error {
            return APIError(.tryAgainLater, "the request ran past its deadline of \(configuration.requestDeadlineMilliseconds) ms "
                            + "and was stopped (nothing was written); retry, or ask for less at once")
        }
        let reference = UUID().uuidString.lowercased()
        log("internal error \(reference): \(error)")
        return APIError(.internalError, "internal error (reference \(reference))")
    }

    /// A write transaction. `touched` collects the databases whose logs it moved: their positions are read
    /// inside the transaction (the rows are locked by the writer already), the other nodes are told inside
    /// it (`announceChanges`: delivered only if it commits), and after the commit this node's long polls on
    /// them are woken with the committed positions. A backend may run `body` again (a retried conflict):
    /// each run starts with nothing touched.
    func write<T>(deadline: RequestDeadline? = nil, _ body: (any StorageTransaction, inout Set<Int64>) throws -> T) throws -> T {
        let (result, positions) = try storage.write(deadline: deadline) { tx -> (T, [(Int64, Int64)]) in
            var touched = Set<Int64>()
            let result = try body(tx, &touched)
            // Keep the clock's high-water mark with the writes it stamped: after a restart the clock never
            // goes back, even if the wall clock did.
            try tx.raiseNodeClock(name: configuration.nodeName, to: Int64(clamping: clock.withLock { $0.latest.rawValue }))
            guard !touched.isEmpty else { return (result, []) }
            let ids = touched.sorted()
            let positions = try ids.compactMap { id in try tx.database(id: id).map { (id, $0.lastSeq) } }
            try tx.announceChanges(databaseIDs: ids)
            return (result, positions)
        }
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
            remoteChanges.asyncAfter(deadline: .now() + 1) { [weak self] in self?.observedChange(.resynchronize) }
        }
    }

    // MARK: Health

    /// Whether the last probe of the storage (`probeStorage`) reached it; `/healthz` answers 503 while not.
    public var storageReachable: Bool { storageHealthy.load(ordering: .relaxed) }

    /// One cheap point read with a short deadline, for `/healthz` (`ServerProcess` runs it every second on a
    /// shared database): a node that cannot reach its database reports it, so a load balancer stops sending
    /// it requests until it can again.
    public func probeStorage(deadlineMilliseconds: Int64) {
        let reached: Bool
        do {
            _ = try storage.read(deadline: .after(milliseconds: deadlineMilliseconds), lane: .authentication) { tx in
                try tx.metadata(OpenedDeployment.publicURLKey)
            }
            reached = true
        } catch {
            reached = false
        }
        let was = storageHealthy.exchange(reached, ordering: .relaxed)
        if was != reached { log(reached ? "the database is reachable again" : "the database cannot be reached: /healthz answers 503") }
    }

    /// `GET /healthz`: `{"status": "ok"}`, or 503 `{"status": "unavailable", "reason": ...}` with Retry-After
    /// while the storage cannot be reached.
    func healthResponse() -> HTTPResponse {
        guard storageReachable else {
            var response = HTTPResponse.json(.object(["status": .string("unavailable"),
                                                      "reason": .string("the database cannot be reached")]), status: 503)
            response.headers.append((name: "Retry-After", value: "1"))
            return response
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
