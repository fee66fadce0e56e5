import LatticeCore
import Synchronization

/// What several server processes on one storage share, beyond the data itself: who each node is, how they
/// hear of each other's commits, which of them runs maintenance, and a neutral copy of every table for
/// moving a deployment from one backend to another (`lattice admin migrate`).
///
/// SQLite serves one process (its data directory is locked), so there these are simple: one node, no
/// announcements to deliver, every try-lock succeeds. PostgreSQL serves any number of nodes: each has its
/// own row in `nodes`, commits are announced with `NOTIFY` inside the writing transaction (delivered only
/// after the commit), and maintenance takes a transaction-scoped advisory lock.

/// One serving node (`lattice serve --node-name`): the replica id that stamps its plain writes, unique
/// among the nodes of a storage so that OR-set dots never collide, and its clock's high-water mark, which
/// only rises, so that its clock never goes back across restarts.
public struct StoredNode: Sendable, Hashable {
    public let name: String
    /// 16 hex digits (LatticeCore's `ReplicaID(hex:)`).
    public let replicaID: String
    /// A raw hybrid-logical-clock value at least as high as every stamp the node has committed: the
    /// reservation of its `NodeClockLease`, usually a little ahead of its clock.
    public let clockLatest: Int64
    public let createdMs: Int64

    public init(name: String, replicaID: String, clockLatest: Int64, createdMs: Int64) {
        self.name = name
        self.replicaID = replicaID
        self.clockLatest = clockLatest
        self.createdMs = createdMs
    }
}

/// A node's clock lease: the high-water mark kept in `nodes.clock_latest` is a reservation ahead of the
/// clock, not a copy of it, so that a write transaction need not update (and row-lock) the node's row
/// unless its clock has passed the reservation.
///
/// The rule (Docs/Architecture.md, "Several nodes"): every stamp a committed transaction carries is at
/// most the clock's `latest` read at the end of that transaction's body. If that value is at most the
/// reservation known to be committed (`persisted`), nothing is written; otherwise the transaction itself
/// raises the row to `markToPersist` (at least that value, and `lease` ahead of physical time) before it
/// commits, and only after the commit does the lease count the new mark as persisted. So the row always
/// holds at least every stamp of every committed transaction, whatever crashes when; a restarted node
/// starts its clock at the row's value and stamps above all of them. The cost is that a restarted node's
/// clock may start up to `lease` ahead of physical time (well inside the drift bound other replicas accept).
///
/// A transaction whose reservation did not commit leaves `persisted` as it was, so the next transaction
/// writes again: a mark is never trusted before it is durable.
public final class NodeClockLease: Sendable {
    /// How far ahead of physical time a reservation reaches: one row update per node at most every
    /// 10 seconds under steady writing.
    public static let defaultLeaseMilliseconds: Int64 = 10_000

    public let leaseMilliseconds: Int64
    private let persistedMark: Atomic<Int64>

    /// - Parameter persisted: the mark read from the node's row when the node started (its clock starts
    ///   there too).
    public init(persisted: Int64, leaseMilliseconds: Int64 = NodeClockLease.defaultLeaseMilliseconds) {
        precondition(leaseMilliseconds >= 0, "a lease cannot reach into the past")
        self.leaseMilliseconds = leaseMilliseconds
        persistedMark = Atomic(persisted)
    }

    /// The reservation known to be committed.
    public var persisted: Int64 { persistedMark.load(ordering: .acquiring) }

    /// The mark this transaction must raise the node's row to before it commits, or nil when `latest` (the
    /// clock's value at the end of the body, raw HLC) is covered by a committed reservation already.
    /// - Parameter nowMs: physical time in milliseconds (the clock's own source).
    public func markToPersist(latest: Int64, nowMs: Int64) -> Int64? {
        guard latest > persisted else { return nil }
        let ahead = UInt64(max(0, nowMs)).addingReportingOverflow(UInt64(leaseMilliseconds))
        let milliseconds = ahead.overflow ? HLC.maximumMilliseconds : min(ahead.partialValue, HLC.maximumMilliseconds)
        let reserved = Int64(clamping: HLC(milliseconds: milliseconds, counter: 0).rawValue)
        return max(latest, reserved)
    }

    /// Called after the transaction that raised the row to `mark` committed.
    public func committed(_ mark: Int64) {
        var current = persistedMark.load(ordering: .relaxed)
        while current < mark {
            let (exchanged, original) = persistedMark.compareExchange(expected: current, desired: mark,
                                                                      ordering: .acquiringAndReleasing)
            if exchanged { return }
            current = original
        }
    }
}

/// What another process's commits changed, as a backend delivers it to `Storage.observeChanges`.
public enum StorageChange: Sendable, Hashable {
    /// These databases' logs moved in a committed transaction.
    case databases([Int64])
    /// Announcements may have been missed (the listening connection was lost and is back): every waiter
    /// should look at its positions again.
    case resynchronize
}

/// One value of a row in the neutral form of `Storage.exportRows` and `importRows`.
public enum StorageValue: Sendable, Hashable {
    case null
    case integer(Int64)
    case text(String)
    case blob([UInt8])
}

/// The tables of a deployment, in an order in which each table's references point only at tables before
/// it, with the columns every backend has under the same names and the key rows are exported by (logs by
/// position, so a copy keeps positions ascending; text keys compare bytewise on every backend).
public enum StorageTables {
    public typealias Table = (name: String, columns: [String], order: String)

    public static let all: [Table] = [
        ("metadata", ["key", "value"], "key"),
        ("nodes", ["name", "replica_id", "clock_latest", "created_ms"], "name"),
        ("users", ["id", "record_name", "name", "created_ms", "name_key"], "id"),
        ("tokens", ["hash", "user_id", "created_ms", "id", "expires_ms", "name"], "hash"),
        ("signups", ["address", "created_ms"], "address, created_ms"),
        ("device_authorizations", ["device_code_hash", "user_code_hash", "address", "device_name", "status", "user_id",
                                   "interval_seconds", "last_poll_ms", "created_ms", "expires_ms"], "device_code_hash"),
        ("device_approval_failures", ["key", "created_ms"], "key, created_ms"),
        ("passkeys", ["credential_id", "user_id", "public_key", "algorithm", "sign_count", "name", "created_ms", "last_used_ms"],
         "credential_id"),
        ("passkey_ceremonies", ["challenge_hash", "purpose", "user_id", "address", "name", "created_ms", "expires_ms"],
         "challenge_hash"),
        ("recovery_codes", ["code_hash", "user_id", "created_ms", "used_ms"], "code_hash"),
        ("external_identities", ["issuer", "subject", "user_id", "created_ms", "last_used_ms"], "issuer, subject"),
        ("oidc_logins", ["state_hash", "issuer", "nonce", "verifier", "next_path", "link_user_id", "address", "created_ms",
                         "expires_ms"], "state_hash"),
        ("databases", ["id", "kind", "environment", "owner_id", "last_seq", "purged_seq", "bytes_used"], "id"),
        ("zones", ["id", "database_id", "name", "owner_record_name", "deleted", "last_seq", "purged_seq", "db_seq",
                   "created_ms", "modified_ms"], "id"),
        ("records", ["zone_id", "name", "record_type", "frame", "deleted", "seq", "created_ms", "created_by",
                     "modified_ms", "modified_by", "parent_name"], "zone_id, seq"),
        ("client_operations", ["user_id", "operation_id", "request_hash", "status", "response", "created_ms",
                               "database_id", "charged_bytes"], "user_id, operation_id"),
        ("shares", ["id", "public_id", "zone_id", "record_name", "root_record_name", "owner_id", "title",
                    "public_permission", "url_epoch", "deleted", "last_seq", "created_ms"], "id"),
        ("share_participants", ["share_id", "user_id", "role", "permission", "status", "modified_ms"],
         "share_id, user_id"),
        ("share_link_uses", ["token_id", "share_id", "uses"], "token_id"),
        ("share_short_links", ["code", "share_id", "token", "created_ms"], "code"),
        ("share_records", ["share_id", "record_name", "member", "seq"], "share_id, seq"),
        ("shared_zones", ["database_id", "share_id", "deleted", "db_seq"], "database_id, share_id"),
        ("subscriptions", ["id", "database_id", "user_id", "name", "kind", "zone_name", "zone_owner", "record_type", "fires_on",
                           "fires_once", "definition", "webhook_url", "webhook_secret", "created_ms", "modified_ms",
                           "webhook_seq"], "id"),
        ("notification_counters", ["user_id", "last_seq"], "user_id"),
        ("notifications", ["subscription_id", "zone_id", "user_id", "database_id", "subscription_name", "kind", "zone_name",
                           "zone_owner", "seq", "origin", "run_after"],
         "subscription_id, zone_id"),
        ("push_tokens", ["hash", "user_id", "device_token_id", "environment", "apns_environment", "registered",
                         "created_ms"], "hash"),
        ("webhook_deliveries", ["id", "subscription_id", "user_id", "seq", "url", "payload", "state", "attempts",
                                "next_attempt_ms", "claimed_by", "claimed_until_ms", "last_status", "last_error",
                                "created_ms", "finished_ms"], "id"),
    ] + AssetTables.all

    /// The table of this name; a name not in `all` (never spliced into SQL) is refused.
    public static func table(_ name: String) throws -> Table {
        guard let table = all.first(where: { $0.name == name }) else {
            throw StorageError.failure("no table \(name) to copy")
        }
        return table
    }
}

extension Storage {
    /// Nothing to observe: a single-process backend has no other process to hear from.
    public func observeChanges(_ handler: @escaping @Sendable (StorageChange) -> Void) throws {}

    /// Nothing to claim beyond what the backend's own lock (SQLite: the data directory's) already holds.
    public func claimNode(_ name: String) throws {}

    /// Held for as long as the backend is open.
    public func checkNodeClaims() throws {}
}

extension NodeStorage {
    /// Nothing to announce: in a single-process backend the process itself wakes its long polls.
    public func announceChanges(databaseIDs: [Int64]) throws {}
}
