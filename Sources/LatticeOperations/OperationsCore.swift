import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore
import Synchronization

/// What the operations of every area share: the storage, the configuration, this node's identity and
/// hybrid logical clock, the share-signing keys, and the one write every change goes through. It knows
/// nothing of HTTP: the server holds one, runs operations on it and renders what they return.
///
/// ```swift
/// let core = try OperationsCore(storage: storage, configuration: configuration, keyRing: keys,
///                               log: { print($0) }, committed: { positions in wakeLongPolls(positions) })
/// let stamp = core.tick()
/// ```
public final class OperationsCore: Sendable {
    public let storage: any Storage
    public let configuration: ServiceConfiguration
    /// Signs and verifies share URLs; nil on a server without share links (some tests).
    public let keyRing: ShareKeyRing?
    /// This node's replica id: it stamps plain writes. Made once per node and kept in the database.
    public let replicaID: ReplicaID
    /// The node's clock (injected time: `configuration.now`).
    package let clock: Mutex<HybridLogicalClock>
    /// The reservation ahead of `clock` kept in the node's row (StorageNodes.swift).
    package let clockLease: NodeClockLease
    /// Where internal errors are written (never to clients).
    package let log: @Sendable (String) -> Void
    /// Told, after a write commits, each database it changed with that database's last position.
    private let committed: @Sendable ([(databaseID: Int64, position: Int64)]) -> Void
    /// Told after a commit that queued webhook deliveries (the node's dispatcher, once started).
    package let deliveriesQueued = Mutex<(@Sendable () -> Void)?>(nil)
    /// When a full disk was last logged (milliseconds, the configuration's clock): once a minute.
    private let diskFullLoggedMs = Atomic<Int64>(Int64.min / 2)
    private let currentPublicURL: Mutex<String>
    /// Keeps refusals that an attacker can repeat from flooding the log: one line per kind a minute.
    private let refusalLog = RateLimiter(.init(requestsPerSecond: 1.0 / 60, burst: 1))
    /// The database's size as last measured for the disk budget (`checkDiskBudget`).
    private let diskUsage = DiskUsageReading()
    /// The key download URLs are signed with (`assetURLKey`), read or made when the core starts.
    private let assetKey: Mutex<[UInt8]>
    /// Who holds an upload this process receives bytes for: the node and a random id of this process, so a
    /// restarted node takes over its own earlier leases at once (`Assets.beginUpload`).
    package let assetLeaseHolder: String

    /// Registers this node (`configuration.nodeName`) in the storage, or finds it, and starts its clock
    /// past the last value it persisted.
    public init(storage: any Storage, configuration: ServiceConfiguration, keyRing: ShareKeyRing?,
                log: @escaping @Sendable (String) -> Void,
                committed: @escaping @Sendable ([(databaseID: Int64, position: Int64)]) -> Void) throws {
        self.storage = storage
        self.configuration = configuration
        self.keyRing = keyRing
        self.log = log
        self.committed = committed
        currentPublicURL = Mutex(configuration.publicURL)
        assetLeaseHolder = configuration.nodeName + ":" + Secrets.hex(try Secrets.randomBytes(8))
        // The node's replica id is unique among the nodes (a taken one is drawn again).
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
        // The download-URL key is read (or made) now, in a transaction of its own: later it is needed while
        // answers are rendered, some inside a write, where making it would wait for that very write.
        assetKey = Mutex(try Self.loadAssetURLKey(storage))
        clock = Mutex(HybridLogicalClock(replica: replica, maximumDriftMilliseconds: configuration.maximumClockDriftMilliseconds,
                                         latest: HLC(rawValue: latest), time: { UInt64(max(0, now())) }))
    }

    /// The URL clients reach the server at (share URLs and their `iss`): the configured one, or the one
    /// the process learned after binding its port.
    public var publicURL: String { currentPublicURL.withLock { $0 } }

    /// Sets the public URL once the listening port is known (`lattice serve --port 0` without --public-url).
    public func setPublicURL(_ url: String) { currentPublicURL.withLock { $0 = url } }

    // MARK: Asset URLs

    /// The service's key for download URLs: 256 random bits in the metadata row `asset-url-key`, made by the
    /// first node that started without one (`loadAssetURLKey`), so any node verifies a URL another signed.
    package func assetURLKey() throws -> [UInt8] { assetKey.withLock { $0 } }

    private static let assetKeyName = "asset-url-key"

    /// Reads the asset URL key, or makes it (serialized, so two nodes starting at once make one).
    private static func loadAssetURLKey(_ storage: any Storage) throws -> [UInt8] {
        if let key = try storage.read({ tx in try tx.metadata(assetKeyName) }).flatMap(hexBytes), key.count == 32 { return key }
        let fresh = Secrets.hex(try Secrets.randomBytes(32))
        let key = try storage.write { tx -> [UInt8]? in
            try tx.setMetadata("lock:" + assetKeyName, "")
            if let existing = try tx.metadata(assetKeyName) { return hexBytes(existing) }
            try tx.setMetadata(assetKeyName, fresh)
            return hexBytes(fresh)
        }
        guard let key, key.count == 32 else { throw StorageError.failure("the asset URL key (metadata \(assetKeyName)) is malformed") }
        return key
    }

    private static func hexBytes(_ text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 2 == 0 else { return nil }
        var bytes: [UInt8] = []
        for index in stride(from: 0, to: digits.count, by: 2) {
            guard let byte = UInt8(String(decoding: digits[index..<(index + 2)], as: UTF8.self), radix: 16) else { return nil }
            bytes.append(byte)
        }
        return bytes
    }

    // MARK: The clock

    /// A fresh stamp from the node's clock.
    package func tick() -> Stamp {
        clock.withLock { $0.now() }
    }

    /// Checks a remote clock value against the drift bound (and moves the node's clock past it).
    /// - Throws: BAD_REQUEST naming `path` when the value is too far ahead.
    package func observe(_ hlc: HLC, path: String) throws {
        let refused = clock.withLock { clock -> ClockError? in
            do throws(ClockError) {
                try clock.observe(hlc)
                return nil
            } catch {
                return error
            }
        }
        if let refused { throw ServiceError.badRequest("\(path): \(refused.description)") }
    }

    // MARK: Stored records

    /// A stored row's frame, checked (a damaged row is an internal error, never an unchecked read).
    package func frame(_ stored: StoredRecord) throws -> RecordFrame {
        do {
            return try RecordFrame(stored: stored.frame)
        } catch {
            throw StorageError.failure("stored record \(stored.recordName) does not decode: \(error)")
        }
    }

    // MARK: Writing

    /// The configured request deadline from now: for the storage work of a request that has no
    /// deadline of its own.
    package func freshDeadline() -> RequestDeadline {
        .after(milliseconds: configuration.requestDeadlineMilliseconds)
    }

    /// The one write transaction of every change: `body` gets the transaction and the set of databases it
    /// touched (every write of a record, zone or share inserts its database's id); after the commit the
    /// databases touched are announced to other nodes and this node's long polls on them are woken with
    /// the committed positions (`committed`). A backend may run `body` again (a retried conflict): each run
    /// starts with nothing touched. Without a `deadline` it gets one of the configured length from now.
    package func write<T>(deadline: RequestDeadline? = nil,
                          _ body: (any StorageTransaction, inout CommitEffects) throws -> T) throws -> T {
        var queuedDeliveries = false
        let (result, positions, reserved) = try storage.write(deadline: deadline ?? freshDeadline()) { tx
            -> (T, [(databaseID: Int64, position: Int64)], Int64?) in
            var touched = CommitEffects()
            let result = try body(tx, &touched)
            // The notifications (and webhook deliveries) the change raises commit with it (Subscriptions.swift).
            queuedDeliveries = try Subscriptions(self).fire(touched, tx)
            // Keep the clock's high-water mark ahead of the writes it stamped (NodeClockLease): after a
            // restart the clock never goes back, even if the wall clock did. Most transactions are covered
            // by the committed reservation and leave the node's row alone.
            let latest = Int64(clamping: clock.withLock { $0.latest.rawValue })
            let reserved = clockLease.markToPersist(latest: latest, nowMs: configuration.now())
            if let reserved { try tx.raiseNodeClock(name: configuration.nodeName, to: reserved) }
            guard !touched.isEmpty else { return (result, [], reserved) }
            let ids = touched.sorted()
            let positions = try ids.compactMap { id in try tx.database(id: id).map { (databaseID: id, position: $0.lastSeq) } }
            try tx.announceChanges(databaseIDs: ids)
            return (result, positions, reserved)
        }
        if let reserved { clockLease.committed(reserved) }
        if !positions.isEmpty { committed(positions) }
        if queuedDeliveries { deliveriesQueued.withLock { $0 }?() }
        return result
    }

    /// Makes the rest of this write transaction wait for any other one that serialized on `name`, on every
    /// node: it writes the metadata row `lock:NAME`, whose row lock a multi-writer backend holds to commit
    /// (SQLite's one writer serializes anyway). For check-then-act rules that have no row of their own
    /// to lock (the sign-up limits, the tokens-per-user cap).
    package func serialize(_ name: String, _ tx: any StorageTransaction) throws {
        try tx.setMetadata("lock:" + name, "")
    }

    // MARK: Errors

    /// Maps an error that is not a `ServiceError`: a busy database is TRY_AGAIN_LATER, and so is a full
    /// disk (logged once a minute: the operator must free space) and a request past its deadline; anything
    /// else is logged with a reference and reported as INTERNAL_ERROR with no detail.
    package func serviceError(for error: any Error) -> ServiceError {
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

    /// Logs a refusal an attacker can repeat at most once a minute per `key`.
    package func logRefusal(_ key: String, _ message: @autoclosure () -> String) {
        if refusalLog.take(key, nowMs: configuration.now()) == nil { log(message()) }
    }

    // MARK: Disk budget

    /// How long a measured size stands for the disk budget (on the service's clock): re-measured at most this
    /// often, by one request at a time, so the budget costs no storage call on most writes.
    package static let diskBudgetMeasurementIntervalMilliseconds: Int64 = 1_000
    /// The deadline of one measurement (on PostgreSQL a read of `pg_database_size`).
    package static let diskBudgetMeasurementDeadlineMilliseconds: Int64 = 1_000

    /// Refuses a write that adds data when the database is over the server-wide disk budget, as measured
    /// within the last `diskBudgetMeasurementIntervalMilliseconds` (`DiskUsageReading`): a node may let through
    /// what it admits in that time past the budget. Each node keeps its own reading.
    package func checkDiskBudget(_ what: String) throws {
        guard let budget = configuration.diskBudgetBytes else { return }
        let size: Int64
        do {
            size = try diskUsage.bytes(nowMs: configuration.now(),
                                       maximumAgeMilliseconds: Self.diskBudgetMeasurementIntervalMilliseconds) {
                try storage.sizeOnDisk(deadline: .after(milliseconds: Self.diskBudgetMeasurementDeadlineMilliseconds))
            }
        } catch {
            logRefusal("disk budget measurement", "disk budget: the database's size cannot be measured (\(error)); "
                       + "refusing writes that add data until it can (first refused: \(what)); at most one such line a minute")
            throw ServiceError(.tryAgainLater, "the server cannot measure its disk use now; nothing was written; retry later",
                           retryAfter: 1)
        }
        guard size >= budget else { return }
        logRefusal("disk budget", "disk budget: the database uses \(size) bytes of \(budget); refusing writes that add "
                   + "data (first refused: \(what)); at most one such line a minute")
        throw ServiceError(.quotaExceeded, "the server is full: its database uses \(size) bytes of its \(budget)-byte disk "
                       + "budget; reads and deletions still work")
    }
}

/// The storage's size on disk as last measured, for the disk budget (`OperationsCore.checkDiskBudget`),
/// shared by every request thread of one service.
///
/// A reading younger than the maximum age is used as it is; an older one is replaced by the first caller
/// that finds it stale, while the others go on with the old reading meanwhile, so at most one measurement
/// runs at a time. A measurement that fails keeps the old reading (and counts as this round's measurement);
/// with no reading at all the failure is thrown.
package final class DiskUsageReading: Sendable {
    private struct State {
        var bytes: Int64?
        /// When `bytes` was measured or last tried, on the service's clock.
        var measuredMs: Int64 = 0
        var measuring = false
    }

    private let state = Mutex(State())

    package init() {}

    /// The size to check the budget against at `nowMs`; `measure` runs when the reading is older than
    /// `maximumAgeMilliseconds` (or from the future: a clock set back) and nobody else is measuring.
    package func bytes(nowMs: Int64, maximumAgeMilliseconds: Int64, measure: () throws -> Int64) throws -> Int64 {
        let cached: Int64? = state.withLock { state in
            if let bytes = state.bytes, state.measuring || (0..<maximumAgeMilliseconds).contains(nowMs - state.measuredMs) {
                return bytes
            }
            state.measuring = true
            return nil
        }
        if let cached { return cached }
        do {
            let bytes = try measure()
            state.withLock { $0 = State(bytes: bytes, measuredMs: nowMs, measuring: false) }
            return bytes
        } catch {
            let previous: Int64? = state.withLock { state in
                state.measuring = false
                if state.bytes != nil { state.measuredMs = nowMs }
                return state.bytes
            }
            guard let previous else { throw error }
            return previous
        }
    }
}
