import Foundation
import LatticeCore

/// What a Lattice service enforces and how it tells time. Defaults follow CloudKit's limits.
public struct ServiceConfiguration: Sendable {
    /// The one container this server serves (`/database/1/{container}/...`).
    public var container: String = "lattice"
    /// The URL clients reach the server at; share URLs are built from it.
    public var publicURL: String = "http://127.0.0.1:8080"
    /// Whether `POST /auth/signup` creates accounts; when false, `lattice admin add-user` does.
    public var registrationOpen = true
    /// Operations per `records/modify` or `zones/modify` request.
    public var maximumOperations = 400
    /// Bytes per request body: 2 MB, checked before the body is buffered.
    public var maximumRequestBytes = 2 * 1024 * 1024
    /// Elements in one list field of a write (and in any one array of a record in a request), checked
    /// before any work is done: LIMIT_EXCEEDED above it.
    public var maximumListElements = 50_000
    /// Fields in one record of a write, checked before any work is done: LIMIT_EXCEEDED above it.
    public var maximumFieldsPerRecord = 1_000
    /// Bytes of stored record state per database (private database of a user, or the public one).
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
    /// Per-user (or, before sign-in, per-address) request rate; nil turns throttling off.
    public var rateLimit: RateLimit? = RateLimit(requestsPerSecond: 200, burst: 400)
    /// The wall clock in milliseconds since 1970. Injected so tests control time; merge code never reads it.
    public var now: @Sendable () -> Int64 = { Int64((Date().timeIntervalSince1970 * 1000).rounded(.down)) }
    /// How far ahead of this server's clock a client's CRDT stamp may be.
    public var maximumClockDriftMilliseconds: UInt64 = HybridLogicalClock.defaultMaximumDrift

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
}
