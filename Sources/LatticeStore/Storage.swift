#if canImport(Glibc)
import Glibc
#endif
import LatticeCore
import LatticeSQLite

/// The storage seam: everything the service keeps, behind one protocol, so a PostgreSQL backend can
/// replace the embedded SQLite one without touching the HTTP layer. No SQL type or text crosses it, and
/// every operation reports failures as `StorageError`.
///
/// ## Where the rules live
///
/// A backend owns its SQL, connections and transactions, and stores what it is given. Decisions live
/// above it, once:
/// - `StorageRules` (StorageRules.swift), called by every backend when it writes: the change-tag format
///   (from the zone row and the log position), who created a record saved over its tombstone, the first
///   URL epoch of a new share, and which deleted zones `purge` may forget (never one a share was made in).
/// - LatticeSharing and the server's sharing endpoints: who may join, write or manage. The store keeps
///   roles, permissions and statuses as LatticeCore's `ShareRole`, `SharePermission` and `AcceptanceStatus`
///   (stored by raw value); a stored spelling no case knows is a damaged row (`StorageError.damagedRow`).
/// - The server's endpoints: what is merged into a record's frame, its parent, quotas and limits, which
///   records a hierarchy share holds, and when to purge (the horizons).
///
/// Bookkeeping is the backend's: log positions, `purgedSeq`, `bytesUsed`. `StorageContractTests`
/// (Tests/LatticeStoreTests) runs every operation below against each backend in `StorageBackends.all`;
/// a new backend adds itself there and must pass.
///
/// ## Change feeds and commit order
///
/// Each zone has a commit-ordered change log: every saved record gets the zone's next sequence number
/// (`StoredRecord.seq`), and a reader pages by `seq > cursor`. Each database has a log of changed zones
/// (`StoredZone.databaseSeq`). For paging by position to be correct, **positions must become visible in
/// the order they were allocated**. A backend guarantees that by allocating positions from a counter row
/// that stays locked until its transaction commits:
/// - SQLite has one writer at a time (`BEGIN IMMEDIATE`), so allocation order is commit order.
/// - A multi-writer database (PostgreSQL) must allocate with `UPDATE zones SET last_seq = last_seq + 1
///   ... RETURNING` inside the writing transaction, never from a free-running sequence: the row lock is
///   held to commit, so a later position cannot commit before an earlier one in the same log.
///
/// ## Tombstones
///
/// A deleted record stays as a tombstone (`deleted == true`, its frame holds the deletion stamp) until
/// `purge(before:operationsBeforeMs:limit:)` removes tombstones older than the horizon, a bounded batch at a
/// time, and raises the zone's `purgedSeq`; a cursor below `purgedSeq` has missed a deletion and must start
/// over (`CHANGE_TOKEN_EXPIRED`).
///
/// ## Deadlines and lanes
///
/// `read` and `write` take the request's `RequestDeadline` (nil: none). A backend stops its own work once
/// the deadline has passed and throws `StorageError.deadlineExceeded`: waiting for a connection, and the
/// statements it runs (SQLite: a progress handler; PostgreSQL: `statement_timeout` set from
/// `RequestDeadline.remainingMilliseconds`). A write that ran past its deadline is rolled back whole, so
/// nothing is half-written; a body that returned in time is committed even if the commit itself ends after
/// the deadline. Reads take a `ReadLane`: `.authentication` reads (one token lookup per request) must
/// never queue behind long reads or writes, so a backend keeps capacity apart for them.
public protocol Storage: Sendable {
    /// Runs `body` on a consistent snapshot of committed data, stopping at `deadline`.
    func read<T>(deadline: RequestDeadline?, lane: ReadLane, _ body: (any StorageTransaction) throws -> T) throws -> T
    /// Runs `body` in one write transaction: committed durably before this returns, or, if `body`
    /// throws or the work runs past `deadline`, rolled back so nothing is written.
    func write<T>(deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T
    /// Closes the backend; later calls fail with `StorageError.closed`.
    func close()
    /// Where the bytes of assets live (Assets.swift).
    var assetContents: any AssetContentStore { get }
    /// The bytes the backend occupies on disk now (SQLite: the database file plus its WAL), measured cheaply
    /// (no scan of records), for the server-wide disk budget.
    func sizeOnDisk() throws -> Int64
    /// `sizeOnDisk`, giving up with `StorageError.deadlineExceeded` at `deadline` (nil: none). Default: the
    /// plain `sizeOnDisk` (a backend whose measurement cannot stall, such as SQLite's `stat`).
    func sizeOnDisk(deadline: RequestDeadline?) throws -> Int64
    /// Delivers what other processes' commits changed (StorageNodes.swift) to `handler`, on a thread of the
    /// backend's, until `close`. A backend that serves one process never calls it (the default).
    func observeChanges(_ handler: @escaping @Sendable (StorageChange) -> Void) throws
    /// Claims the node name for this process until `close`, so that two live processes never run as one
    /// node (they would stamp with one replica id).
    /// - Throws: `StorageError.duplicate` if another live process holds it.
    func claimNode(_ name: String) throws
    /// Throws unless this process holds every node name it claimed (as last seen, no round trip), for the
    /// health probe: `.busy` while a claim is lost, `.failure` naming the node once another process took it.
    func checkNodeClaims() throws
}

extension Storage {
    /// Runs `body` on a consistent snapshot of committed data, with no deadline.
    public func read<T>(_ body: (any StorageTransaction) throws -> T) throws -> T {
        try read(deadline: nil, lane: .general, body)
    }

    /// A read of the general lane that stops at `deadline`.
    public func read<T>(deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try read(deadline: deadline, lane: .general, body)
    }

    /// One write transaction with no deadline.
    public func write<T>(_ body: (any StorageTransaction) throws -> T) throws -> T {
        try write(deadline: nil, body)
    }

    public func sizeOnDisk(deadline: RequestDeadline?) throws -> Int64 {
        try sizeOnDisk()
    }
}

/// Which capacity a read uses.
public enum ReadLane: Sendable, Hashable {
    /// Any read of a request (lookups, queries, feeds).
    case general
    /// A short point read on every request's path (the token lookup): kept apart from the general lane so
    /// that it never waits for a long read or a write.
    case authentication
}

/// The moment a request's work must stop, on the monotonic clock: storage-neutral, so every backend can
/// honour it (see `Storage`), and the server checks it between items of CPU work outside storage.
public struct RequestDeadline: Sendable, Hashable, Comparable {
    /// `CLOCK_MONOTONIC` nanoseconds.
    public let uptimeNanoseconds: UInt64

    public init(uptimeNanoseconds: UInt64) {
        self.uptimeNanoseconds = uptimeNanoseconds
    }

    /// `milliseconds` from now (0 or less: already passed).
    public static func after(milliseconds: Int64) -> RequestDeadline {
        let now = RequestDeadline.nowNanoseconds()
        let span = UInt64(max(0, milliseconds)).multipliedReportingOverflow(by: 1_000_000)
        let (sum, overflow) = now.addingReportingOverflow(span.partialValue)
        return RequestDeadline(uptimeNanoseconds: span.overflow || overflow ? .max : sum)
    }

    /// The monotonic clock now, in nanoseconds.
    public static func nowNanoseconds() -> UInt64 { monotonicNanoseconds() }

    public var hasPassed: Bool { RequestDeadline.nowNanoseconds() >= uptimeNanoseconds }

    /// Milliseconds left, at least 0 (for a backend's own timeout, e.g. PostgreSQL's `statement_timeout`).
    public var remainingMilliseconds: Int64 {
        let now = RequestDeadline.nowNanoseconds()
        return now >= uptimeNanoseconds ? 0 : Int64(min((uptimeNanoseconds - now) / 1_000_000, UInt64(Int64.max)))
    }

    /// - Throws: `StorageError.deadlineExceeded` once the deadline has passed.
    public func check() throws(StorageError) {
        if hasPassed { throw StorageError.deadlineExceeded }
    }

    public static func < (a: RequestDeadline, b: RequestDeadline) -> Bool { a.uptimeNanoseconds < b.uptimeNanoseconds }
}

extension Optional where Wrapped == RequestDeadline {
    /// Checks the deadline, if there is one.
    public func check() throws(StorageError) {
        if let self { try self.check() }
    }
}

/// The operations available inside a transaction. Writes fail in a read transaction (with a `StorageError`).
///
/// Composed of one protocol per area, so a caller that needs one area can take the narrow protocol
/// (`any RecordStorage`) instead of the whole transaction; every backend implements all of them, and
/// `StorageContractTests` checks each. Only `savepoint`, which spans every area, is declared here.
public protocol StorageTransaction: MetadataStorage, AccountStorage, DeviceStorage, PasskeyStorage, IdentityStorage, ShortLinkStorage, SubscriptionStorage, AssetStorage, ZoneStorage, RecordStorage,
                                    ShareStorage, ClientOperationStorage, NodeStorage, LockStorage, CopyStorage,
                                    MaintenanceStorage {
    /// Runs `body` so that, if it throws, only its own writes are undone (a savepoint), and rethrows.
    /// The transaction stays usable after that, even when a storage operation failed inside `body`
    /// (for example with `.duplicate`); outside a savepoint, let a failed operation end the transaction.
    func savepoint<T>(_ body: () throws -> T) throws -> T
}

/// Server-wide settings kept in the store (`metadata`): a key and a text value.
public protocol MetadataStorage {
    func metadata(_ key: String) throws -> String?
    func setMetadata(_ key: String, _ value: String) throws
}

/// Users, their bearer tokens (by hash) and the record of sign-ups for the sign-up limits.
public protocol AccountStorage {
    /// - Throws: `StorageError.duplicate` when the name or record name is taken.
    func insertUser(name: String, recordName: String, nowMs: Int64) throws -> UserAccount
    func user(named name: String) throws -> UserAccount?
    func user(recordName: String) throws -> UserAccount?
    func user(id: Int64) throws -> UserAccount?
    /// The owner of a token, expired or not (the caller decides about expiry).
    func user(tokenHash: [UInt8]) throws -> UserAccount?
    /// - Throws: `StorageError.duplicate` when the hash or the id is taken.
    func insertToken(_ token: NewToken) throws
    /// A token and its owner by the token's hash, expired or not; nil for an unknown (or revoked) token.
    func tokenOwner(hash: [UInt8]) throws -> (token: StoredToken, user: UserAccount)?
    /// A user's tokens, oldest first.
    func tokens(userID: Int64) throws -> [StoredToken]
    func token(id: String) throws -> StoredToken?
    /// Revokes (deletes) a token; returns whether it existed.
    func deleteToken(id: String) throws -> Bool
    /// Moves a token's expiry to `expiresMs` (a browser session renewed while used); returns whether it existed.
    func extendToken(id: String, expiresMs: Int64) throws -> Bool
    /// Revokes every token of a user; returns how many there were.
    func deleteTokens(userID: Int64) throws -> Int

    // MARK: Sign-ups
    /// Remembers one account made by `POST /auth/signup` from `address` (for the sign-up limits).
    func recordSignUp(address: String, nowMs: Int64) throws
    /// The sign-ups recorded at or after `sinceMs`, from `address` (from every address when nil).
    func signUps(address: String?, sinceMs: Int64) throws -> SignUpWindow
    /// Forgets sign-ups recorded before `beforeMs`.
    func forgetSignUps(before beforeMs: Int64) throws
}

/// Device sign-in (DeviceAuthorizations.swift): authorizations by code hash, their decisions and polls, and the
/// failed approvals kept for throttling.
public protocol DeviceStorage {
    /// - Throws: `StorageError.duplicate` when either code's hash is taken.
    func insertDeviceAuthorization(_ authorization: NewDeviceAuthorization) throws
    /// The authorization of a device code, expired or not. In a write transaction its row stays locked
    /// until the transaction ends (PostgreSQL: `FOR NO KEY UPDATE`; SQLite has one writer), as every
    /// single-row read of a write.
    func deviceAuthorization(deviceCodeHash: [UInt8]) throws -> StoredDeviceAuthorization?
    /// The authorization of a user code, expired or not; locked in a write transaction as above.
    func deviceAuthorization(userCodeHash: [UInt8]) throws -> StoredDeviceAuthorization?
    /// How many authorizations, in any state, are live at `nowMs` (`expiresMs > nowMs`), from `address`
    /// (from every address when nil).
    func liveDeviceAuthorizations(address: String?, nowMs: Int64) throws -> Int
    /// Moves a pending authorization that is live at `nowMs` to `approved` (by `userID`, renamed to
    /// `deviceName` when given) or `denied`, in one conditional update; false (nothing changed) when it is
    /// missing, expired or no longer pending, so of two racing decisions exactly one is kept.
    func decideDeviceAuthorization(userCodeHash: [UInt8], approve: Bool, userID: Int64, deviceName: String?,
                                   nowMs: Int64) throws -> Bool
    /// Remembers a poll: when it came, and the interval the device must keep from now on.
    func recordDevicePoll(deviceCodeHash: [UInt8], nowMs: Int64, intervalSeconds: Int64) throws
    /// Moves an approved authorization that is live at `nowMs` to `issued`, in one conditional update, and
    /// returns it (now `issued`, with the approving account and device name); nil when nothing changed, so
    /// exactly one poll ever gets it.
    func claimDeviceAuthorization(deviceCodeHash: [UInt8], nowMs: Int64) throws -> StoredDeviceAuthorization?
    /// Deletes the authorizations expired at `nowMs` (`expiresMs <= nowMs`); returns how many.
    func forgetDeviceAuthorizations(expiredAt nowMs: Int64) throws -> Int
    /// Remembers one failed approval (a wrong user code) under `key` (`user:ID` or `ip:ADDRESS`).
    func recordDeviceApprovalFailure(key: String, nowMs: Int64) throws
    /// The failed approvals recorded under `key` at or after `sinceMs` (the same window shape as sign-ups).
    func deviceApprovalFailures(key: String, sinceMs: Int64) throws -> SignUpWindow
    /// Forgets failed approvals recorded before `beforeMs`.
    func forgetDeviceApprovalFailures(before beforeMs: Int64) throws
}

/// Databases (per kind, environment and owner) and their zones, with the database log of changed zones.
public protocol ZoneStorage {
    /// The database for a kind, environment and owner (0 for the public database), created on first use.
    /// A read transaction does not create it: it sees an empty database with id 0.
    func database(_ key: DatabaseKey) throws -> StoredDatabase
    func database(id: Int64) throws -> StoredDatabase?
    /// The live zone with this name, if any.
    func zone(databaseID: Int64, name: String) throws -> StoredZone?
    /// A zone row by id, live or deleted.
    func zone(rowID: Int64) throws -> StoredZone?
    func liveZones(databaseID: Int64) throws -> [StoredZone]
    /// - Throws: `StorageError.duplicate` if a live zone has this name.
    func createZone(databaseID: Int64, name: String, ownerRecordName: String, nowMs: Int64) throws -> StoredZone
    /// Marks the zone deleted (a new position in the database log) and deletes its records. Does nothing
    /// to a zone that is missing or deleted already.
    func deleteZone(rowID: Int64, nowMs: Int64) throws
    /// Zones whose database position is after `cursor`, live or deleted, in log order.
    func zoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [StoredZone]
}

/// Records of a zone: reads, saves (positions in the zone log, change tags) and the change feed.
public protocol RecordStorage {
    func record(zoneRowID: Int64, name: String) throws -> StoredRecord?
    /// Records of a type (all types when nil), live only, in name order.
    func records(zoneRowID: Int64, recordType: String?) throws -> [StoredRecord]
    /// The same records as `records(zoneRowID:recordType:)`, in the same order, handed to `body` one at a
    /// time so that a caller keeps only what it needs; stops early when `body` returns false. A backend
    /// without a streaming read takes the default (`records`, then a loop).
    func forEachRecord(zoneRowID: Int64, recordType: String?, _ body: (StoredRecord) throws -> Bool) throws
    /// Saves a record's new state: the next position in the zone log, a new change tag
    /// (`StorageRules.changeTag`), and the zone's next position in its database's log. `created` follows
    /// `StorageRules.creation`: kept from the row it replaces, new over a tombstone.
    /// - Throws: `StorageError.failure` if the zone is missing or deleted.
    func saveRecord(zoneRowID: Int64, _ write: RecordWrite) throws -> StoredRecord
    /// Saves several records of one zone, exactly as `saveRecord` would one after another (consecutive zone
    /// positions in the order given, one new database position for the zone), but with the counters moved
    /// once. The names must be distinct. `previous[i]` is the row of `writes[i]` as this transaction read it
    /// (nil when it had none), so a backend need not read it again. A backend without a faster way takes the
    /// default (a loop of `saveRecord`).
    func saveRecords(zoneRowID: Int64, _ writes: [RecordWrite], previous: [StoredRecord?]) throws -> [StoredRecord]
    /// A hint that `record` is about to be called for each of `names` (a batch about to be planned), so a
    /// backend with a round trip per statement (PostgreSQL) can read them in one; the answers of `record` do
    /// not change. The default does nothing.
    func prefetchRecords(zoneRowID: Int64, names: [String]) throws
    /// Records whose zone position is after `cursor` (tombstones included), in log order.
    func recordChanges(zoneRowID: Int64, after cursor: Int64, limit: Int) throws -> [StoredRecord]
    /// The same records as `recordChanges(zoneRowID:after:limit:)`, in the same order, handed to `body` one
    /// at a time; stops early when `body` returns false, so a page cut at a byte budget never holds more
    /// than it sends. A backend without a streaming read takes the default (`recordChanges`, then a loop).
    func forEachRecordChange(zoneRowID: Int64, after cursor: Int64, limit: Int,
                             _ body: (StoredRecord) throws -> Bool) throws
    /// Names of the live records whose parent is `parentName`.
    func children(zoneRowID: Int64, parentName: String) throws -> [String]
    /// How many records `records(zoneRowID:recordType:)` would give (live only, tombstones left out), counted
    /// by the database without reading a record's data, so the cost does not grow with the records' size.
    func recordCount(zoneRowID: Int64, recordType: String?) throws -> Int
    /// How many names `children(zoneRowID:parentName:)` would give, counted by the database.
    func childCount(zoneRowID: Int64, parentName: String) throws -> Int
}

/// Shares, their participants (roles, permissions and statuses as LatticeCore's enums), link uses, a hierarchy
/// share's own log and the participants' shared-database logs.
public protocol ShareStorage {
    /// - Throws: `StorageError.duplicate` if the zone already has a live share record of that name, or
    ///   the public id is taken.
    func insertShare(_ share: NewShare) throws -> StoredShare
    /// A share by its public id, live or deleted.
    func share(publicID: String) throws -> StoredShare?
    func share(id: Int64) throws -> StoredShare?
    /// The live shares of a zone.
    func shares(zoneRowID: Int64) throws -> [StoredShare]
    /// Writes a share's title, public permission, URL epoch and deleted flag.
    func updateShare(_ share: StoredShare) throws
    func participants(shareID: Int64) throws -> [StoredParticipant]
    /// Inserts or replaces the participant row of (share, user).
    func saveParticipant(_ participant: StoredParticipant) throws
    /// The shares a user participates in with the given status, and the participant rows.
    func participations(userID: Int64, status: AcceptanceStatus) throws -> [(share: StoredShare, participant: StoredParticipant)]
    /// How often a share link (by its `jti`) has been used to join.
    func linkUses(tokenID: String) throws -> Int
    func recordLinkUse(tokenID: String, shareID: Int64) throws
    /// A hierarchy share's own log: whether a record is in the share, at the share's next position.
    func setShareMembership(shareID: Int64, recordName: String, member: Bool) throws
    func shareMembership(shareID: Int64, recordName: String) throws -> Bool?
    /// Entries of a share's log after `cursor`, in log order.
    func shareChanges(shareID: Int64, after cursor: Int64, limit: Int) throws -> [ShareLogEntry]
    /// Moves a shared zone in a participant's shared database log (next position), live or deleted.
    func markSharedZone(databaseID: Int64, shareID: Int64, deleted: Bool) throws
    /// A participant's shared database log after `cursor`.
    func sharedZoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [SharedZoneEntry]
}

/// Remembered answers to requests that carried a client operation id (idempotent retries), and their charge to
/// a database's quota.
public protocol ClientOperationStorage {
    func clientOperation(userID: Int64, operationID: String) throws -> ClientOperation?
    /// Remembers an answer, and charges `operation.storedBytes(operationID:)` to the `bytesUsed` of the
    /// database `chargedTo` (0: charge nothing) until the operation is forgotten (by `purge` or
    /// `forgetOldestClientOperations`), which gives the bytes back.
    /// - Throws: `StorageError.duplicate` if the user already has an operation with this id.
    func saveClientOperation(userID: Int64, operationID: String, _ operation: ClientOperation, chargedTo databaseID: Int64,
                             nowMs: Int64) throws
    /// How many operations the user has remembered.
    func clientOperationCount(userID: Int64) throws -> Int
    /// Forgets the user's `count` oldest remembered operations (by the time they were saved); returns how
    /// many went.
    func forgetOldestClientOperations(userID: Int64, count: Int) throws -> Int
}

/// Nodes (processes that share the store, StorageNodes.swift): names, replica ids, clock high-water marks, and
/// announcements of changed databases to the other processes.
public protocol NodeStorage {
    /// The node of this name, if it was ever registered.
    func node(named name: String) throws -> StoredNode?
    /// Registers a node.
    /// - Throws: `StorageError.duplicate` if the name or the replica id is taken.
    func insertNode(_ node: StoredNode) throws
    /// Raises the node's clock high-water mark to `latest`; a lower value leaves it as it is, so concurrent
    /// transactions of one node can never move it back.
    func raiseNodeClock(name: String, to latest: Int64) throws
    /// Tells the other processes on this storage that these databases' logs moved, delivered to their
    /// `observeChanges` handlers only if this transaction commits. Default: nothing (one process).
    func announceChanges(databaseIDs: [Int64]) throws
}

/// Named exclusive locks held until the transaction ends (one node runs a maintenance at a time).
public protocol LockStorage {
    /// Takes the exclusive lock `name` until this transaction ends if no other transaction holds it, without
    /// waiting; false if another holds it (another node runs that maintenance now).
    func tryExclusiveLock(_ name: String) throws -> Bool
}

/// Copying a deployment row for row (`lattice admin migrate`).
public protocol CopyStorage {
    /// Hands every row of `table` (one of `StorageTables.all`) to `body` in batches, each value in the
    /// table's column order there, in an order that keeps each table's own positions ascending.
    func exportRows(table: String, _ body: ([[StorageValue]]) throws -> Void) throws
    /// Inserts rows exactly as given (ids and positions included) into `table`, columns in
    /// `StorageTables.all` order.
    func insertRows(table: String, _ rows: [[StorageValue]]) throws
    /// After `insertRows`: moves the backend's id generators past the ids inserted, so new rows never
    /// take a copied id.
    func finishImport() throws
    /// How many rows `table` has.
    func rowCount(table: String) throws -> Int
}

/// Removing what expired: tombstones, deleted zones and remembered operations, in bounded batches.
public protocol MaintenanceStorage {
    /// One batch of the purge: removes at most `limit` rows in all (at least 1), first tombstones (oldest
    /// first), then deleted zones (by id), then remembered client operations: tombstones and deleted zones
    /// last changed before `horizonMs` (keeping the zones `StorageRules.purgesDeletedZone` keeps), and
    /// operations saved before `operationsBeforeMs`. Raises each zone's and database's `purgedSeq` to the
    /// newest position it removed and gives back what the removed rows were charged. The report's `complete`
    /// is false when the batch stopped at `limit`, or (a multi-writer backend) left rows it could not lock
    /// without waiting: the caller runs another batch, each in a write of its own, so no write transaction
    /// holds the writer for more than `limit` rows however large the backlog (`LatticeService`'s purge).
    /// - Throws: `StorageError.failure` for a `limit` below 1.
    func purge(before horizonMs: Int64, operationsBeforeMs: Int64, limit: Int) throws -> PurgeReport
}

/// Which database: kind, environment and owner (0 for the public database).
public struct DatabaseKey: Sendable, Hashable {
    public var kind: DatabaseKind
    public var environment: String
    public var ownerID: Int64

    public init(kind: DatabaseKind, environment: String, ownerID: Int64) {
        self.kind = kind
        self.environment = environment
        self.ownerID = ownerID
    }
}

public struct UserAccount: Sendable, Hashable {
    public let id: Int64
    /// CloudKit's user record name: `_` and 32 hex digits.
    public let recordName: String
    public let name: String
    public let createdMs: Int64

    public init(id: Int64, recordName: String, name: String, createdMs: Int64) {
        self.id = id
        self.recordName = recordName
        self.name = name
        self.createdMs = createdMs
    }
}

public struct StoredDatabase: Sendable, Hashable {
    public let id: Int64
    public let key: DatabaseKey
    /// The last position allocated in the database's log of changed zones.
    public let lastSeq: Int64
    /// Positions up to this one may have been purged; a cursor below it has expired.
    public let purgedSeq: Int64
    /// Bytes of record frames stored in the database's zones, for the quota.
    public let bytesUsed: Int64

    public init(id: Int64, key: DatabaseKey, lastSeq: Int64, purgedSeq: Int64, bytesUsed: Int64) {
        self.id = id
        self.key = key
        self.lastSeq = lastSeq
        self.purgedSeq = purgedSeq
        self.bytesUsed = bytesUsed
    }
}

public struct StoredZone: Sendable, Hashable {
    /// Never reused, so a token naming an older incarnation of a zone can be told apart.
    public let rowID: Int64
    public let databaseID: Int64
    public let name: String
    public let ownerRecordName: String
    public let deleted: Bool
    /// The last position allocated in the zone's record log.
    public let lastSeq: Int64
    /// Record positions up to this one may have been purged (tombstones); a cursor below it has expired.
    public let purgedSeq: Int64
    /// The zone's latest position in its database's log.
    public let databaseSeq: Int64
    public let createdMs: Int64
    public let modifiedMs: Int64

    public init(rowID: Int64, databaseID: Int64, name: String, ownerRecordName: String, deleted: Bool, lastSeq: Int64,
                purgedSeq: Int64, databaseSeq: Int64, createdMs: Int64, modifiedMs: Int64) {
        self.rowID = rowID
        self.databaseID = databaseID
        self.name = name
        self.ownerRecordName = ownerRecordName
        self.deleted = deleted
        self.lastSeq = lastSeq
        self.purgedSeq = purgedSeq
        self.databaseSeq = databaseSeq
        self.createdMs = createdMs
        self.modifiedMs = modifiedMs
    }
}

/// A record as stored: its CRDT state as one binary frame (LatticeCore's codec) plus server fields.
public struct StoredRecord: Sendable, Hashable {
    public let recordName: String
    public let recordType: String
    public let frame: [UInt8]
    public let deleted: Bool
    /// Position in the zone's log.
    public let seq: Int64
    /// CloudKit's `recordChangeTag`: new on every change.
    public let changeTag: String
    public let createdMs: Int64
    public let createdBy: String
    public let modifiedMs: Int64
    public let modifiedBy: String
    /// The name its `parent` reference points at, if any.
    public let parentName: String?

    public init(recordName: String, recordType: String, frame: [UInt8], deleted: Bool, seq: Int64, changeTag: String,
                createdMs: Int64, createdBy: String, modifiedMs: Int64, modifiedBy: String, parentName: String? = nil) {
        self.parentName = parentName
        self.recordName = recordName
        self.recordType = recordType
        self.frame = frame
        self.deleted = deleted
        self.seq = seq
        self.changeTag = changeTag
        self.createdMs = createdMs
        self.createdBy = createdBy
        self.modifiedMs = modifiedMs
        self.modifiedBy = modifiedBy
    }
}

/// A record's new state, to save.
public struct RecordWrite: Sendable {
    public var recordName: String
    public var recordType: String
    public var frame: [UInt8]
    public var deleted: Bool
    /// The record's parent (its `parent` reference's name), for hierarchy shares.
    public var parentName: String?
    public var userRecordName: String
    public var nowMs: Int64

    public init(recordName: String, recordType: String, frame: [UInt8], deleted: Bool, parentName: String? = nil,
                userRecordName: String, nowMs: Int64) {
        self.recordName = recordName
        self.recordType = recordType
        self.frame = frame
        self.deleted = deleted
        self.parentName = parentName
        self.userRecordName = userRecordName
        self.nowMs = nowMs
    }
}

/// A share to create.
public struct NewShare: Sendable {
    public var publicID: String
    public var zoneRowID: Int64
    public var recordName: String
    public var rootRecordName: String?
    public var ownerID: Int64
    public var title: String
    public var publicPermission: SharePermission
    /// The first epoch of the share's links.
    public var urlEpoch: Int64
    public var nowMs: Int64

    public init(publicID: String, zoneRowID: Int64, recordName: String, rootRecordName: String?, ownerID: Int64,
                title: String, publicPermission: SharePermission, urlEpoch: Int64 = StorageRules.firstURLEpoch, nowMs: Int64) {
        self.publicID = publicID
        self.zoneRowID = zoneRowID
        self.recordName = recordName
        self.rootRecordName = rootRecordName
        self.ownerID = ownerID
        self.title = title
        self.publicPermission = publicPermission
        self.urlEpoch = urlEpoch
        self.nowMs = nowMs
    }
}

/// A share as stored. Roles, permissions and rules are LatticeSharing's; these are the facts.
public struct StoredShare: Sendable, Hashable {
    public let id: Int64
    /// The id in share links (`sub`).
    public let publicID: String
    public let zoneRowID: Int64
    /// The name of the share's `cloudkit.share` record in the zone.
    public let recordName: String
    /// The root of a hierarchy share; nil for a zone-wide share.
    public let rootRecordName: String?
    public let ownerID: Int64
    public var title: String
    public var publicPermission: SharePermission
    public var urlEpoch: Int64
    public var deleted: Bool
    /// The last position of the share's own log (hierarchy shares).
    public let lastSeq: Int64

    public init(id: Int64, publicID: String, zoneRowID: Int64, recordName: String, rootRecordName: String?, ownerID: Int64,
                title: String, publicPermission: SharePermission, urlEpoch: Int64, deleted: Bool, lastSeq: Int64) {
        self.id = id
        self.publicID = publicID
        self.zoneRowID = zoneRowID
        self.recordName = recordName
        self.rootRecordName = rootRecordName
        self.ownerID = ownerID
        self.title = title
        self.publicPermission = publicPermission
        self.urlEpoch = urlEpoch
        self.deleted = deleted
        self.lastSeq = lastSeq
    }
}

/// A participant row of a share: who, in which role, with which permission, and where acceptance stands.
public struct StoredParticipant: Sendable, Hashable {
    public let shareID: Int64
    public let userID: Int64
    public var role: ShareRole
    public var permission: SharePermission
    public var status: AcceptanceStatus
    public var modifiedMs: Int64

    public init(shareID: Int64, userID: Int64, role: ShareRole, permission: SharePermission, status: AcceptanceStatus,
                modifiedMs: Int64) {
        self.shareID = shareID
        self.userID = userID
        self.role = role
        self.permission = permission
        self.status = status
        self.modifiedMs = modifiedMs
    }
}

public struct ShareLogEntry: Sendable, Hashable {
    public let recordName: String
    public let member: Bool
    public let seq: Int64

    public init(recordName: String, member: Bool, seq: Int64) {
        self.recordName = recordName
        self.member = member
        self.seq = seq
    }
}

public struct SharedZoneEntry: Sendable, Hashable {
    public let shareID: Int64
    public let deleted: Bool
    public let databaseSeq: Int64

    public init(shareID: Int64, deleted: Bool, databaseSeq: Int64) {
        self.shareID = shareID
        self.deleted = deleted
        self.databaseSeq = databaseSeq
    }
}

/// A remembered answer to a request that carried a client operation id.
public struct ClientOperation: Sendable, Hashable {
    /// SHA-256 of what was asked, so a reused id with a different request is refused.
    public let requestHash: [UInt8]
    public let status: Int
    /// What the server needs to answer a retry (its own encoding; opaque to the store).
    public let response: [UInt8]

    public init(requestHash: [UInt8], status: Int, response: [UInt8]) {
        self.requestHash = requestHash
        self.status = status
        self.response = response
    }

    /// The bytes a remembered operation is charged against a quota: its id, hash and answer, plus 32 for
    /// the rest of the row. Every backend charges this.
    public func storedBytes(operationID: String) -> Int64 {
        Int64(operationID.utf8.count + requestHash.count + response.count + 32)
    }
}

/// A bearer token to store: its hash (never the token), a public id and an optional expiry.
public struct NewToken: Sendable, Hashable {
    public var hash: [UInt8]
    /// The non-secret id that lists and revocation name it by.
    public var id: String
    public var userID: Int64
    public var createdMs: Int64
    /// When it stops working; nil: never.
    public var expiresMs: Int64?
    /// The device it was made for (a device signed in with a user code), shown in lists; nil: none.
    public var name: String?

    public init(hash: [UInt8], id: String, userID: Int64, createdMs: Int64, expiresMs: Int64? = nil, name: String? = nil) {
        self.hash = hash
        self.id = id
        self.userID = userID
        self.createdMs = createdMs
        self.expiresMs = expiresMs
        self.name = name
    }
}

/// A stored bearer token, without its hash.
public struct StoredToken: Sendable, Hashable {
    public let id: String
    public let userID: Int64
    public let createdMs: Int64
    public let expiresMs: Int64?
    /// The device it was made for, if it was named (`NewToken.name`).
    public let name: String?

    public init(id: String, userID: Int64, createdMs: Int64, expiresMs: Int64?, name: String? = nil) {
        self.id = id
        self.userID = userID
        self.createdMs = createdMs
        self.expiresMs = expiresMs
        self.name = name
    }
}

/// The sign-ups in a time window: how many, and when the oldest of them was.
public struct SignUpWindow: Sendable, Hashable {
    public let count: Int
    /// Nil when `count` is 0.
    public let oldestMs: Int64?

    public init(count: Int, oldestMs: Int64?) {
        self.count = count
        self.oldestMs = oldestMs
    }
}

/// What a purge removed: one batch (`StorageTransaction.purge`), or a whole run summed over its batches
/// (`Maintenance.purgeUnlessRunningElsewhere`).
public struct PurgeReport: Sendable, Hashable {
    public var tombstones: Int
    public var zones: Int
    public var clientOperations: Int
    /// Whether nothing expired was left: false when a batch stopped at its limit (or left rows it could not
    /// lock now), and, for a run, when it stopped before its last batch (its time budget, another node,
    /// a failed batch), so the rest waits for the next run.
    public var complete: Bool
    /// The write transactions of a run (one per batch); a backend's single batch leaves it 0.
    public var batches: Int

    public init(tombstones: Int = 0, zones: Int = 0, clientOperations: Int = 0, complete: Bool = true, batches: Int = 0) {
        self.tombstones = tombstones
        self.zones = zones
        self.clientOperations = clientOperations
        self.complete = complete
        self.batches = batches
    }

    /// Rows removed, of every kind.
    public var removed: Int { tombstones + zones + clientOperations }
}

/// A storage failure, in terms the service can map without knowing the backend.
public enum StorageError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The database stayed locked past the busy timeout: try again later.
    case busy
    /// A uniqueness rule was violated (a taken user name, a live zone name).
    case duplicate(String)
    /// The backend was closed.
    case closed
    /// The disk holding the data, or the server process's file-size limit, has no room for the write.
    /// The transaction wrote nothing; reads go on, and writes succeed again once space returns.
    case diskFull
    /// The request's `RequestDeadline` passed before the work finished; nothing of a write was kept.
    case deadlineExceeded
    /// Anything else. The text is for logs, never for clients (it may name tables).
    case failure(String)

    /// A stored value this build cannot read (say a participant role no `ShareRole` case spells): the row is
    /// damaged, or written by a newer build. A `.failure` naming the table, column and row, never a trap.
    public static func damagedRow(table: String, column: String, row: String, value: String?) -> StorageError {
        .failure("a damaged \(table) row (\(row)): \(column) \(value.map { "'\($0)'" } ?? "NULL") is not a known value")
    }

    public var description: String {
        switch self {
        case .busy: return "the database is busy"
        case .duplicate(let what): return "\(what) already exists"
        case .closed: return "the storage is closed"
        case .diskFull: return "the disk is full"
        case .deadlineExceeded: return "the request ran past its deadline"
        case .failure(let text): return text
        }
    }
}

extension RecordStorage {
    public func forEachRecord(zoneRowID: Int64, recordType: String?, _ body: (StoredRecord) throws -> Bool) throws {
        for record in try records(zoneRowID: zoneRowID, recordType: recordType) {
            guard try body(record) else { return }
        }
    }

    public func forEachRecordChange(zoneRowID: Int64, after cursor: Int64, limit: Int,
                                    _ body: (StoredRecord) throws -> Bool) throws {
        for record in try recordChanges(zoneRowID: zoneRowID, after: cursor, limit: limit) {
            guard try body(record) else { return }
        }
    }

    public func prefetchRecords(zoneRowID: Int64, names: [String]) throws {}

    public func saveRecords(zoneRowID: Int64, _ writes: [RecordWrite], previous: [StoredRecord?]) throws -> [StoredRecord] {
        try writes.map { try saveRecord(zoneRowID: zoneRowID, $0) }
    }
}

extension AccountStorage {
    /// A token that never expires, with a random id.
    public func insertToken(hash: [UInt8], userID: Int64, nowMs: Int64) throws {
        var random = SystemRandomNumberGenerator()
        let id = String(random.next() as UInt64, radix: 16)
        try insertToken(NewToken(hash: hash, id: String(repeating: "0", count: 16 - id.count) + id, userID: userID,
                                 createdMs: nowMs))
    }
}
