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
    /// The push streams this node holds (`GET /push/{token}`, PushStreams.swift).
    let pushStreams: PushStreams
    /// This node's webhook sender; `lattice serve` starts it (`ServerProcess`), in-process tests may.
    public let webhooks: WebhookDispatcher
    let limiter: RateLimiter?
    /// Failed authentications per client address (in memory, per process).
    let authenticationFailures: RateLimiter?
    let shuttingDown = Atomic<Bool>(false)
    /// Set by `probeStorage`: nil while healthy, else why `/healthz` answers 503 (the database cannot be
    /// reached, or another process took this node's name).
    let storageProblem = Mutex<String?>(nil)
    /// Where other nodes' announced commits are handled (`observedChange`), one batch at a time.
    let remoteChanges = DispatchQueue(label: "lattice-remote-changes")
    /// Announcements not handled yet, merged into one batch (nil: none queued): under load a node reads
    /// the positions once per batch, not once per commit elsewhere.
    let pendingChanges = Mutex<StorageChange?>(nil)

    /// The URL clients reach the server at (share URLs and their `iss`): the configured one, or the one
    /// the process learned after binding its port.
    public var publicURL: String { core.publicURL }

    /// Sets the public URL once the listening port is known (`lattice serve --port 0` without --public-url).
    public func setPublicURL(_ url: String) { core.setPublicURL(url) }
    var log: @Sendable (String) -> Void { core.log }

    // The areas of operations the routes call (`Records`, `Feeds`, `Deltas` and the others are made per call
    // the same way: each is a value over `core`).
    var zones: Zones { Zones(core) }
    var shares: Shares { Shares(core) }
    /// Sign-in through OpenID Connect providers: one per service, for its per-node cache of their keys.
    let openIDConnect: OpenIDConnect

    /// - Parameter log: where internal errors are written (never to clients).
    public init(storage: any Storage, configuration: ServiceConfiguration = ServiceConfiguration(),
                keyRing: ShareKeyRing? = nil,
                log: @escaping @Sendable (String) -> Void = { FileHandle.standardError.write(Data(("lattice: " + $0 + "\n").utf8)) }) throws {
        let notifier = ChangeNotifier()
        self.notifier = notifier
        let pushStreams = PushStreams(limits: .init(perUser: configuration.maximumPushStreamsPerUser,
                                                    perAddress: configuration.maximumPushStreamsPerAddress,
                                                    heartbeatSeconds: configuration.pushHeartbeatSeconds,
                                                    backlogBytes: configuration.pushBacklogBytes),
                                      deadlineMilliseconds: configuration.requestDeadlineMilliseconds, log: log)
        self.pushStreams = pushStreams
        core = try OperationsCore(storage: storage, configuration: configuration, keyRing: keyRing, log: log) { positions in
            for (id, position) in positions { notifier.notify(databaseID: id, position: position) }
            pushStreams.wake(databaseIDs: positions.map(\.databaseID))
        }
        pushStreams.attach(Subscriptions(core))
        webhooks = WebhookDispatcher(core: core, settings: configuration.webhooks)
        core.deliveriesQueued.withLock { [webhooks] in $0 = { webhooks.nudge() } }
        openIDConnect = OpenIDConnect(core, providers: configuration.oidcProviders)
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
        pushStreams.shutDown()
    }

    /// Removes tombstones, deleted zones and remembered operation ids past their horizons (and expired
    /// device sign-ins and old failed approvals): `Maintenance.purgeExpired`.
    @discardableResult
    public func purgeExpired() throws -> PurgeReport { try Maintenance(core).purgeExpired() }

    /// The collection of assets alone (`Assets.collect`).
    @discardableResult
    public func collectAssets() throws -> AssetCollection { try Assets(core).collect() }

    /// One purge run unless another node is purging now: `Maintenance.purgeUnlessRunningElsewhere`.
    public func purgeUnlessRunningElsewhere(batchRows: Int = Maintenance.purgeBatchRows,
                                            budgetMilliseconds: Int64 = Maintenance.purgeRunBudgetMilliseconds)
        throws -> PurgeReport? {
        try Maintenance(core).purgeUnlessRunningElsewhere(batchRows: batchRows, budgetMilliseconds: budgetMilliseconds)
    }

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
    func write<T>(deadline: RequestDeadline? = nil, _ body: (any StorageTransaction, inout CommitEffects) throws -> T) throws -> T {
        try core.write(deadline: deadline, body)
    }

    /// Serializes the rest of the write on `name` across nodes (`OperationsCore.serialize`).
    func serialize(_ name: String, _ tx: any StorageTransaction) throws { try core.serialize(name, tx) }

    /// The replay key of a request whose body has a `clientOperationID` (its path and bytes identify it).
    func replayKey(_ context: RequestContext) throws -> ReplayKey? {
        try ReplayKey.of(context.body, operation: context.path, bytes: context.rawBody)
    }

    /// A write under the body's `clientOperationID`, if any (`Idempotency.run`).
    func idempotent(_ context: RequestContext,
                    _ body: (any StorageTransaction, inout CommitEffects) throws -> JSON) throws -> HTTPResponse {
        .answer(try Idempotency(core).run(context.caller, replay: try replayKey(context), body))
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
    /// A `records/modify` body of CRDT states, read in one pass (`body` is then empty).
    var states: RecordStatesRequest? = nil
    /// When the request's work must stop (`ServiceConfiguration.requestDeadlineMilliseconds`).
    var deadline: RequestDeadline? = nil
    /// The id of the bearer token the request was made with.
    var tokenID: String? = nil
    /// Made with `Authorization: Bearer` (not a browser session).
    var viaBearer = true

    var databaseKey: DatabaseKey {
        DatabaseKey(kind: kind, environment: environment, ownerID: kind == .public ? 0 : user.id)
    }

    /// The caller, as operations see it.
    var caller: Caller { Caller(user: user, database: kind, environment: environment, tokenID: tokenID, deadline: deadline) }
}
