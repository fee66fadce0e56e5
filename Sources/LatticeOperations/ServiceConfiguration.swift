import Foundation
import LatticeCore

/// What a Lattice service enforces and how it tells time. Defaults follow CloudKit's limits.
public struct ServiceConfiguration: Sendable {
    /// The one container this server serves (`/database/1/{container}/...`).
    public var container: String = "lattice"
    /// The URL clients reach the server at; share URLs are built from it.
    public var publicURL: String = "http://127.0.0.1:8080"
    /// Which node of the storage this service runs as (`lattice serve --node-name`): each node has its own
    /// replica id and clock high-water mark in the database, so several nodes on one PostgreSQL never
    /// stamp with the same replica id.
    public var nodeName: String = "main"
    /// Whether `POST /auth/signup` creates accounts; when false, `lattice admin add-user` does.
    public var registrationOpen = true
    /// The OpenID Connect providers people may sign in with (`--oidc-issuer URL --oidc-client-id ID`).
    public var oidcProviders: [OIDCProviderConfiguration] = []
    /// Operations per `records/modify` or `zones/modify` request.
    public var maximumOperations = 400
    /// Bytes per request body: 2 MB, checked before the body is buffered.
    public var maximumRequestBytes = 2 * 1024 * 1024
    /// Elements in one list field of a write (and in any one array of a record in a request), checked
    /// before any work is done: LIMIT_EXCEEDED above it.
    public var maximumListElements = 50_000
    /// `records/modify` bodies of CRDT states are read in one pass (`RecordStatesRequest`), any other as a
    /// JSON tree. Off, every body is read as a tree: the answers are the same (RecordStatesTests compares
    /// them), only slower.
    public var readsRecordStatesInOnePass = true
    /// Fields in one record of a write, checked before any work is done: LIMIT_EXCEEDED above it.
    public var maximumFieldsPerRecord = 1_000
    /// Bytes of stored record state per database (private database of a user, or the public one);
    /// `lattice serve --quota-per-database`.
    public var quotaBytesPerDatabase: Int64 = 1 << 30
    /// Items per response for lookups, queries and change feeds, and tokens per `changes/zone` request.
    public var maximumResultsLimit = 200
    /// Records per `deltas/pull` page (the default and the most): binary pages are small, so a fresh
    /// device needs fewer round trips than with `changes/zone`'s 200.
    public var maximumPullRecords = 2_000
    /// Tombstones (deleted records and zones) are purged this long after the deletion; older sync tokens
    /// then get CHANGE_TOKEN_EXPIRED.
    public var tombstoneHorizonMilliseconds: Int64 = 30 * 24 * 3_600_000
    /// How long a client operation id is remembered for idempotent retries.
    public var clientOperationHorizonMilliseconds: Int64 = 7 * 24 * 3_600_000
    /// Default and largest `timeout` (seconds) of `changes/wait`.
    public var defaultWaitSeconds = 30
    public var maximumWaitSeconds = 60
    /// Per-user (or, before sign-in, per-address) request rate; nil turns throttling off. `lattice serve
    /// --requests-per-second-per-account N` sets N per second in bursts of 2N.
    public var rateLimit: RateLimit? = RateLimit(requestsPerSecond: 200, burst: 400)
    /// The wall clock in milliseconds since 1970. Injected so tests control time; merge code never reads it.
    public var now: @Sendable () -> Int64 = { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }
    /// How far ahead of this server's clock a client's CRDT stamp may be.
    public var maximumClockDriftMilliseconds: UInt64 = HybridLogicalClock.defaultMaximumDrift

    // MARK: accounts

    /// Accounts `POST /auth/signup` makes per client address per `signUpWindowMilliseconds`; nil: no limit.
    /// Counted in the database, so the limit survives restarts and holds across server processes.
    public var signUpsPerAddress: Int? = 5
    /// Accounts `POST /auth/signup` makes per `signUpWindowMilliseconds` from all addresses together; nil: no limit.
    public var signUpsGlobal: Int? = 100
    /// The sliding window of the sign-up limits.
    public var signUpWindowMilliseconds: Int64 = 3_600_000
    /// Failed authentications (bad, unknown, revoked or expired tokens) allowed per client address: a
    /// token bucket of `burst`, refilled at `requestsPerSecond`. An address with an empty bucket gets
    /// THROTTLED instead of AUTHENTICATION_FAILED for its bad tokens until it refills (good tokens are
    /// always served). In memory, per process. Nil: off.
    public var failedAuthenticationLimit: RateLimit? = RateLimit(requestsPerSecond: 20.0 / 60, burst: 20)
    /// The longest lifetime of a bearer token, in seconds: tokens asking for more (or for none) get this
    /// one. Nil: tokens live until revoked unless they ask for a lifetime.
    public var maximumTokenLifetimeSeconds: Int64? = nil
    /// Bearer tokens per user (sign-up, `tokens/create`); creating one more answers LIMIT_EXCEEDED.
    public var maximumTokensPerUser = 100
    /// The server-wide disk budget in bytes (database file plus WAL). Over it, writes that add data
    /// answer QUOTA_EXCEEDED ("the server is full"); reads and deletions keep working. Nil: no budget.
    public var diskBudgetBytes: Int64? = nil
    /// Client operation ids remembered per user for idempotent retries; saving one more forgets the
    /// user's oldest. Each remembered answer is charged to the user's private database quota.
    public var maximumClientOperationsPerUser = 1_000

    // MARK: device sign-in (Devices.swift)

    /// How long a device authorization (`POST /auth/device/start`) and its user code work, in seconds.
    public var deviceCodeLifetimeSeconds: Int64 = 600
    /// The seconds a device waits between polls of `POST /auth/device/token` at first; each SLOW_DOWN adds 5.
    public var devicePollIntervalSeconds: Int64 = 5
    /// Device authorizations one client address may have live (not expired) at once; nil: no limit.
    public var deviceAuthorizationsPerAddress: Int? = 10
    /// Device authorizations live at once on the whole server, every node together (so the table stays
    /// bounded whoever asks); nil: no limit.
    public var deviceAuthorizationsGlobal: Int? = 1_000
    /// Passkey ceremonies (sign-up, registration, sign-in challenges) one client address may have live at once.
    public var passkeyCeremoniesPerAddress = 20
    /// Passkey ceremonies live at once on the whole server, every node together (the table stays bounded).
    public var passkeyCeremoniesGlobal = 10_000
    /// Failed approvals (a wrong or stale user code) one account may make per `deviceApprovalFailureWindowMilliseconds`.
    public var deviceApprovalFailuresPerAccount = 10
    /// Failed approvals from one client address per `deviceApprovalFailureWindowMilliseconds`, whatever the account.
    public var deviceApprovalFailuresPerAddress = 20
    /// The sliding window of the failed-approval limits, counted in the database.
    public var deviceApprovalFailureWindowMilliseconds: Int64 = 3_600_000

    public struct RateLimit: Sendable {
        public var requestsPerSecond: Double
        public var burst: Double
        public init(requestsPerSecond: Double, burst: Double) {
            self.requestsPerSecond = requestsPerSecond
            self.burst = burst
        }
    }

    // MARK: bounds

    /// Filters (`query.filterBy`) per `records/query`: LIMIT_EXCEEDED above it, before any work.
    public var maximumQueryFilters = 64
    /// Sort keys (`query.sortBy`) per `records/query`: LIMIT_EXCEEDED above it, before any work.
    public var maximumQuerySortKeys = 8
    /// Values in one `IN` or `NOT_IN` filter (and in the list value of any filter): LIMIT_EXCEEDED above it.
    /// Matching looks each field up in a set of them, so the cost does not grow with the count.
    public var maximumFilterValues = 10_000
    /// Bytes of records in one answer of `records/query`, `records/lookup`, `changes/zone` and `deltas/pull`
    /// (JSON as sent; binary frames for `deltas/pull`). A feed or query stops before the record that would
    /// pass it and says `moreComing` (a continuation resumes exactly there); a lookup answers the records
    /// past it with a per-item LIMIT_EXCEEDED. One record is always answered, so a page always moves on.
    public var maximumResponseBytes = 8 * 1024 * 1024
    /// How long a request may work, in milliseconds: storage work past it is interrupted and rolled back,
    /// CPU work checks it between items, and the client gets TRY_AGAIN_LATER. A parked `changes/wait` is
    /// not working and is not subject to it.
    public var requestDeadlineMilliseconds: Int64 = 10_000
    /// Reader connections of the storage's general lane (SQLite: a pool of WAL readers, besides one kept for
    /// authentication). Read by `ServerProcess` when it opens the storage.
    public var storageReaderConnections = 4

    public init() {}

    // MARK: conn

    /// `changes/wait` requests one account may have parked at once; more get THROTTLED (429).
    public var maximumParkedWaitsPerUser = 8

    // MARK: subscriptions and push

    /// Subscriptions one database may hold (`subscriptions/modify` answers QUOTA_EXCEEDED past it).
    public var maximumSubscriptionsPerDatabase = 200
    /// Push tokens (`tokens/create`) one device token or browser session keeps: a new one past it replaces its
    /// oldest.
    public var maximumPushTokensPerDevice = 8
    /// Push streams (`GET /push/{token}`) one account may hold open on one node (one per device; a device's
    /// new stream replaces its old one).
    public var maximumPushStreamsPerUser = 32
    /// Push streams one client address (an IPv6 /64 counts as one) may hold open on one node.
    public var maximumPushStreamsPerAddress = 256
    /// Seconds between the comment lines every push stream gets (proxies keep it open; a dead peer is found
    /// by the write) and the checks of its push token.
    public var pushHeartbeatSeconds = 30
    /// Webhook sending: concurrency, time-out, attempts, backoff, and whether receivers on private addresses
    /// are allowed (`WebhookDispatcher.Settings`).
    public var webhooks = WebhookDispatcher.Settings()
    /// Assets' limits and times (`lattice serve --asset-*`).
    public var assets = AssetSettings()
    /// Bytes a push stream may have waiting for a slow reader before it is cut off (it reconnects with
    /// `Last-Event-ID` and loses nothing: notifications are kept in the storage).
    public var pushBacklogBytes = 64 * 1024

    // MARK: web files

    /// The directory whose files `GET /web/{path}` and `GET /` serve (`StaticFiles`, Docs/Web.md); nil
    /// turns those routes off. `StaticFiles.webRoot(executablePath:)` finds the one shipped with the
    /// `lattice` binary. Until `lattice serve` sets it, the default is the environment's
    /// `LATTICE_WEB_ROOT` (the browser tests use it), else nil.
    public var webRoot: String? = ServiceConfiguration.webRootFromEnvironment

    static var webRootFromEnvironment: String? {
        guard let path = ProcessInfo.processInfo.environment["LATTICE_WEB_ROOT"], !path.isEmpty else { return nil }
        return path
    }
}
