import Foundation
import LatticeAPI
import LatticeCore

/// The signed-in account of a home. `Codable` for an app that keeps it (its token is a secret: keep it where
/// only the user can read it).
public struct Account: Sendable, Hashable, Codable {
    public var serverURL: String
    public var token: String
    public var userRecordName: String
    public var name: String

    var json: JSON {
        .object(["serverURL": .string(serverURL), "token": .string(token), "userRecordName": .string(userRecordName),
                 "name": .string(name)])
    }

    init?(json: JSON) {
        guard let server = json["serverURL"]?.stringValue, let token = json["token"]?.stringValue,
              let record = json["userRecordName"]?.stringValue, let name = json["name"]?.stringValue else { return nil }
        self.init(serverURL: server, token: token, userRecordName: record, name: name)
    }

    public init(serverURL: String, token: String, userRecordName: String, name: String) {
        self.serverURL = serverURL
        self.token = token
        self.userRecordName = userRecordName
        self.name = name
    }

    /// The same user on the same server (the token may differ).
    public func isSameAccount(as other: Account) -> Bool {
        userRecordName == other.userRecordName && serverURL == other.serverURL
    }
}

/// How the account of a home changed, as `SyncEvent.accountChange` tells it.
public enum AccountChange: Sendable, Hashable {
    /// An account was installed in a home that had none.
    case signIn(Account)
    /// Another account took the home over; the old account's data left the device.
    case switchAccounts(from: Account, to: Account)
    /// The account was forgotten, with its data.
    case signOut(Account)
    /// The server no longer accepts the token (signed out elsewhere, revoked, expired); the account stays
    /// installed until `signOut()`.
    case tokenRejected(reason: String)
}

/// What the engine tells its caller, one at a time (as CKSyncEngine's events).
public enum SyncEvent: Sendable {
    case willFetchChanges
    case didFetchChanges(zones: Int, records: Int)
    case willSendChanges(records: Int)
    case didSendChanges(sent: Int, failed: Int)
    /// The server accepted a record's changes.
    case sentRecord(zone: String, recordName: String)
    /// The server refused a record's changes; the local copy went back to the server's state.
    case failedRecord(zone: String, recordName: String, code: String, reason: String)
    /// The home's account changed, or the server stopped accepting its token (as CKSyncEngine's
    /// `accountChange`).
    case accountChange(AccountChange)
    /// A zone went away: deleted by its owner, or a share that was revoked, left or deleted.
    case zoneRemoved(database: String, zone: String, owner: String)
    /// Progress of a long fetch: records applied so far.
    case fetchProgress(records: Int)
    /// One share of a zone was lost (the zone's other shares stay); its records left the device.
    case shareLost(LostShare)
    /// An unsent edit was dropped: its record is out of reach (see SyncEngine+Revocation.swift).
    case editDropped(DroppedEdit)
    /// The server said "not now" (THROTTLED, TRY_AGAIN_LATER) for longer than the client waits quietly:
    /// the sync stopped, what was not sent stays queued; `retryAfter` is in seconds.
    case serverAskedToWait(reason: String, retryAfter: Double?)
}

/// The outcome of a sync.
public struct SyncReport: Sendable {
    public var sent = 0
    public var fetched = 0
    public var rejected: [(zone: String, recordName: String, code: String, reason: String)] = []
    public var removedZones: [(database: String, zone: String, owner: String)] = []
    /// Hierarchy shares lost while their zone stays; their records left the device.
    public var lostShares: [LostShare] = []
    /// Unsent edits dropped because their records went out of reach (never sent).
    public var droppedEdits: [DroppedEdit] = []
    /// False when the server could not be reached: local edits stay queued.
    public var online = true
    /// The server's "not now" (THROTTLED or TRY_AGAIN_LATER, with `retryAfter`) that stopped this sync:
    /// what was not sent stays queued; `retryAdvice` says when to try again. Nil when it was not stopped.
    public var notNow: ServerError?
    public var queued = 0

    /// An empty report, for callers of `fetch(_:)` and `send(_:)`.
    public init() {}
}

/// The client sync engine, modelled on CKSyncEngine: a local replica (SQLite in the home directory), a
/// persisted queue of pending record changes (dirty records), and the sync state (database and zone
/// change tokens), saved in the same transaction as each change it describes.
///
/// - Local edits always succeed offline: each is a `RecordEdit` joined into the stored frame (the one
///   join, `RecordFrame.merged(with:)`). `sync()` sends them and fetches: database changes first, then
///   each changed zone, looping while `moreComing`.
/// - The binary path (`wire == .binary`, the default) pushes dirty frames as a zone delta
///   (`deltas/push`) and pulls deltas (`deltas/pull`); the server's answer says which pushed states it
///   now holds exactly, and the next pull leaves those out, so a device does not download its own writes.
///   The JSON path (`records/modify`, `changes/zone`) is kept for comparison and for servers without it.
/// - Remote states are joined into local ones on bytes, so unsent edits survive a fetch.
/// - CHANGE_TOKEN_EXPIRED refetches the zone from scratch, keeping records with unsent edits.
/// - A record the server refuses (PERMISSION_FAILURE for a read-only participant, ...) returns to the
///   server's state and is reported.
///
/// `lock` (a recursive lock) guards every mutable member (`clock`, `handler`, `selectedWire`,
/// `selectedBatchLimit`) and serializes the public operations; `store` is itself Sendable and the other
/// members are constants.
package final class SyncEngine: @unchecked Sendable {
    public let home: String
    let store: LocalStore
    private let lock = NSRecursiveLock()
    private var clock: HybridLogicalClock
    /// The transport of every call (tests inject one); nil: HTTP to the account's server.
    package let transportOverride: (any SyncTransport)?
    private var handler: (SyncEvent) -> Void = { _ in }
    private var selectedWire: SyncWire = .binary
    private var selectedBatchLimit = SyncEngine.maximumBatchOperations
    /// Injected for tests; wall clock otherwise.
    let now: @Sendable () -> UInt64
    /// This device's replica id (stamps its edits).
    public let replicaID: ReplicaID

    /// Receives events; called on the thread that runs the engine.
    public var onEvent: (SyncEvent) -> Void {
        get { lock.withLock { handler } }
        set { lock.withLock { handler = newValue } }
    }

    /// The sync path: binary deltas by default.
    public var wire: SyncWire {
        get { lock.withLock { selectedWire } }
        set { lock.withLock { selectedWire = newValue } }
    }

    /// Records per push request, 1 to 400 (the server's limit, the default). A smaller limit means more,
    /// smaller requests: each answered sooner, more round trips in all.
    public var batchLimit: Int {
        get { lock.withLock { selectedBatchLimit } }
        set { lock.withLock { selectedBatchLimit = min(max(newValue, 1), Self.maximumBatchOperations) } }
    }

    static let maximumBatchOperations = 400
    static let maximumBatchBytes = 1_500_000
    /// Position ranges of own writes remembered per zone until the next complete pull (the server takes 1000).
    static let maximumKnownRanges = 1_000

    /// Opens (creating) the home directory and its replica.
    public init(home: String, transport: (any SyncTransport)? = nil,
                now: @escaping @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1000) }) throws {
        self.home = home
        self.now = now
        if !FileManager.default.fileExists(atPath: home) {
            try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        }
        store = try LocalStore(path: home + "/" + LocalStore.fileName)
        transportOverride = transport
        let (replica, latest) = try store.transaction { tx -> (ReplicaID, UInt64) in
            var replica = try tx.metadata("replica_id").flatMap(ReplicaID.init(hex:))
            if replica == nil {
                var random = SystemRandomNumberGenerator()
                replica = ReplicaID(random.next() | 1)
                try tx.setMetadata("replica_id", replica!.description)
            }
            return (replica!, try tx.metadata("clock_latest").flatMap(UInt64.init) ?? 0)
        }
        replicaID = replica
        clock = HybridLogicalClock(replica: replica, latest: HLC(rawValue: latest), time: now)
    }

    deinit { store.close() }

    private func emit(_ event: SyncEvent) { onEvent(event) }

    // MARK: Account

    /// The account installed in this home (`signIn(_:)`), nil when no one is signed in.
    public var account: Account? {
        (try? store.transaction { tx in try Self.storedAccount(tx) }).flatMap { $0 }
    }

    func client(for account: Account) throws -> ServerClient.Blocking {
        ServerClient(transport: try transportOverride ?? HTTPTransport(serverURL: account.serverURL)).blocking
    }

    private func requireAccount() throws -> Account {
        guard let account else { throw SyncError.notSignedIn }
        return account
    }

    /// Installs `account` in this home (one from `AccountClient.signUp(name:)` or `signIn(token:)`); no
    /// network. Another account (another user, or another server) takes the home over: the old account's
    /// synced data and unsent edits are dropped here first. The same account again keeps everything (a new
    /// token replaces the old one). Tells `onEvent` with `accountChange` when the account changed.
    public func signIn(_ account: Account) throws {
        let previous = try lock.withLock {
            try store.transaction { tx -> Account? in
                let previous = try Self.storedAccount(tx)
                if let previous, !previous.isSameAccount(as: account) {
                    try Self.forgetSyncedData(tx) // this home's data was the old account's
                }
                try tx.setMetadata("account", account.json.serialized())
                return previous
            }
        }
        switch previous {
        case nil: emit(.accountChange(.signIn(account)))
        case let previous? where !previous.isSameAccount(as: account):
            emit(.accountChange(.switchAccounts(from: previous, to: account)))
        default: break
        }
    }

    /// Forgets this home's account, its synced data and its unsent edits; no network. To sign out for
    /// good, revoke the token first (`AccountClient.revokeToken(of:)`) and call this only once that
    /// succeeded: a token that was not revoked stays valid on the server. Does nothing when no one is
    /// signed in; tells `onEvent` with `accountChange` otherwise.
    public func signOut() throws {
        let previous = try lock.withLock {
            try store.transaction { tx -> Account? in
                let previous = try Self.storedAccount(tx)
                try Self.forgetSyncedData(tx)
                try tx.setMetadata("account", nil)
                return previous
            }
        }
        if let previous { emit(.accountChange(.signOut(previous))) }
    }

    private static func storedAccount(_ tx: LocalTransaction) throws -> Account? {
        try tx.metadata("account").flatMap { try? JSON.parse($0) }.flatMap(Account.init(json:))
    }

    /// Every zone and record (unsent edits too) and the database change tokens.
    private static func forgetSyncedData(_ tx: LocalTransaction) throws {
        for zone in try tx.zones() { try tx.deleteZone(zone.id) }
        try tx.setMetadata("dbtoken.private", nil)
        try tx.setMetadata("dbtoken.shared", nil)
    }

    // MARK: Local state

    public func zones() throws -> [LocalZone] { try store.transaction { try $0.zones() } }

    /// A zone of the private database, created locally (and on the server at the next sync) if needed.
    public func privateZone(_ name: String) throws -> LocalZone {
        let account = try requireAccount()
        return try store.transaction { tx in
            try tx.ensureZone(database: "private", zoneName: name, owner: account.userRecordName, onServer: false)
        }
    }

    /// Every record of a zone, deleted ones included, decoded.
    public func records(in zone: LocalZone) throws -> [Record] {
        try store.transaction { tx in try tx.records(zoneID: zone.id) }.compactMap { try? RecordFrame(stored: $0.frame).decoded() }
    }

    public func record(_ name: String, in zone: LocalZone) throws -> Record? {
        try store.transaction { tx in try tx.record(zoneID: zone.id, name: name) }
            .flatMap { try? RecordFrame(stored: $0.frame).decoded() }
    }

    /// Number of records with edits the server has not acknowledged.
    public func pendingCount() throws -> Int { try store.transaction { try $0.dirtyRecords().count } }

    /// Applies a local edit to one record (creating it with `recordType` when missing or deleted) and queues
    /// it for the next sync. `edit` gets the record's edit and a function for fresh stamps; the edit is joined
    /// into the stored frame. Returns the record's state afterwards.
    @discardableResult
    public func edit(_ name: String, in zone: LocalZone, creating recordType: String? = nil,
                     _ edit: (inout RecordEdit, () -> Stamp) throws -> Void) throws -> RecordFrame {
        try lock.withLock {
            try store.transaction { tx in
                let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
                let stored = try tx.record(zoneID: zone.id, name: name).map { try RecordFrame(stored: $0.frame) }
                var change: RecordEdit
                if let stored, !stored.isDeleted {
                    change = try RecordEdit(editing: stored)
                } else {
                    guard let recordType else { throw SyncError.notFound(name) }
                    change = try RecordEdit(creating: RecordID(recordName: name, zoneID: zoneID), recordType: recordType,
                                            over: stored, at: clock.now())
                }
                var stamps = clock
                try edit(&change, { stamps.now() })
                clock = stamps
                try tx.setMetadata("clock_latest", String(clock.latest.rawValue))
                guard let result = try change.applied() else { return stored! } // nothing changed: nothing queued
                try tx.saveRecord(zoneID: zone.id, name: name, frame: result.bytes, dirty: true)
                return result
            }
        }
    }

    /// Deletes records locally (delete wins over concurrent edits) and queues the deletions.
    public func delete(_ names: [String], in zone: LocalZone) throws {
        try lock.withLock {
            try store.transaction { tx in
                for name in names {
                    guard let stored = try tx.record(zoneID: zone.id, name: name).map({ try RecordFrame(stored: $0.frame) }),
                          !stored.isDeleted else { continue }
                    var change = try RecordEdit(editing: stored)
                    change.delete(at: clock.now())
                    guard let result = try change.applied() else { continue }
                    try tx.saveRecord(zoneID: zone.id, name: name, frame: result.bytes, dirty: true)
                }
                try tx.setMetadata("clock_latest", String(clock.latest.rawValue))
            }
        }
    }

    // MARK: Sync

    /// Sends pending changes, then fetches. Offline, it reports `online == false` and keeps everything queued;
    /// told "not now" by the server (`notNow`), it stops there and keeps what was not sent queued.
    @discardableResult
    public func sync() throws -> SyncReport {
        try lock.withLock {
            var report = SyncReport()
            do {
                try fetch(&report) // first, so a zone that went away is known before sending into it
                try dropUnreachablePendingDeletions(&report)
                try send(&report)
                try fetch(&report)
            } catch is TransportError {
                report.online = false
            } catch let error as ServerError where error.isNotNow {
                report.notNow = error // busy or throttled: nothing more now; the rest stays queued
                emit(.serverAskedToWait(reason: error.reason, retryAfter: error.retryAfter))
            } catch let error as ServerError where error.serverErrorCode == .authenticationFailed {
                emit(.accountChange(.tokenRejected(reason: error.reason)))
                throw error
            }
            report.queued = try pendingCount()
            return report
        }
    }

    /// Fetches database changes (private, then shared), then each changed zone's records.
    public func fetch(_ report: inout SyncReport) throws {
        lock.lock()
        defer { lock.unlock() }
        let account = try requireAccount()
        let client = try client(for: account)
        emit(.willFetchChanges)
        var zonesFetched = 0
        let before = report.fetched
        for database in ["private", "shared"] {
            var changed: [(String, String)] = []
            var removed: [(String, String)] = []
            var token = try store.transaction { try $0.metadata("dbtoken.\(database)") }
            while true {
                let reply: JSON
                do {
                    reply = try client.call(database, "changes/database", DatabaseChangesRequest(syncToken: token).json,
                                            token: account.token)
                } catch let error as ServerError where error.serverErrorCode == .changeTokenExpired {
                    token = nil
                    try store.transaction { try $0.setMetadata("dbtoken.\(database)", nil) }
                    // Start over: every zone of the database is looked at again.
                    continue
                }
                for zone in reply["zones"]?.arrayValue ?? [] {
                    guard let name = zone["zoneID"]?["zoneName"]?.stringValue,
                          let owner = zone["zoneID"]?["ownerRecordName"]?.stringValue else { continue }
                    if zone["deleted"] == .bool(true) { removed.append((name, owner)) } else { changed.append((name, owner)) }
                }
                token = reply["syncToken"]?.stringValue
                if reply["moreComing"] != .bool(true) { break }
            }
            for (name, owner) in removed where !changed.contains(where: { $0 == (name, owner) }) {
                try removeZone(database: database, zoneName: name, owner: owner, &report)
                report.removedZones.append((database, name, owner))
                emit(.zoneRemoved(database: database, zone: name, owner: owner))
            }
            for (name, owner) in changed {
                let zone = try store.transaction { tx in
                    try tx.ensureZone(database: database, zoneName: name, owner: owner, onServer: true)
                }
                try fetchZone(zone, client: client, account: account, report: &report)
                zonesFetched += 1
            }
            // The database token moves only after its zones are in: a crash re-fetches, never skips.
            try store.transaction { try $0.setMetadata("dbtoken.\(database)", token) }
        }
        emit(.didFetchChanges(zones: zonesFetched, records: report.fetched - before))
    }

    /// One page of a zone's changes, whichever path brought it.
    struct ZonePage {
        var frames: [RecordFrame]
        /// Records that left what this device may see.
        var removed: [String]
        /// Records the page left out because this device holds them exactly (its own writes).
        var skipped: [String] = []
        /// Hierarchy shares this device lost since the token.
        var lostShares: [SyncMessage.LostShare] = []
        var maximumHLC: HLC
        var syncToken: String?
        var moreComing: Bool
    }

    private func fetchZone(_ zone: LocalZone, client: ServerClient.Blocking, account: Account, report: inout SyncReport) throws {
        var token = zone.syncToken
        var fromScratch = token == nil
        var seen: Set<String> = []
        let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
        let known = try knownRanges(zone)
        while true {
            let page: ZonePage
            do {
                page = wire == .binary
                    ? try pullPage(zone, zoneID: zoneID, token: token, known: known, client: client, account: account)
                    : try changesPage(zone, zoneID: zoneID, token: token, client: client, account: account)
            } catch let error as ServerError where error.serverErrorCode == .changeTokenExpired {
                token = nil
                fromScratch = true
                seen = []
                continue
            } catch let error as ServerError where error.serverErrorCode == .zoneNotFound {
                try removeZone(zone, &report)
                report.removedZones.append((zone.database, zone.zoneName, zone.ownerRecordName))
                emit(.zoneRemoved(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName))
                return
            }
            try? clock.observe(page.maximumHLC)
            var loss = AccessLoss()
            try store.transaction { tx in
                // What the page takes out of reach (a lost share, records that left one) goes first, and
                // unsent edits to it are dropped and reported.
                loss = try dropOutOfReach(page, zone: zone, tx)
                // Removals first: a record that left one share and entered another comes back below.
                for name in page.removed { try tx.deleteRecord(zoneID: zone.id, name: name) }
                for incoming in page.frames {
                    let name = incoming.recordName
                    seen.insert(name)
                    try applyRemote(incoming, name: name, zone: zone, tx)
                }
                seen.formUnion(page.removed)
                seen.formUnion(page.skipped)
                if fromScratch && !page.moreComing {
                    // A full refetch: what the server no longer has is gone, unless it holds unsent edits.
                    for local in try tx.records(zoneID: zone.id) where !seen.contains(local.name) && local.dirty == 0 {
                        try tx.deleteRecord(zoneID: zone.id, name: local.name)
                    }
                }
                try tx.setSyncToken(zone.id, page.syncToken)
                // Every own write remembered was committed before this pull began: the token is past them now.
                if !page.moreComing { try tx.setMetadata(Self.knownKey(zone), nil) }
                try tx.setMetadata("clock_latest", String(clock.latest.rawValue))
            }
            note(loss, in: &report)
            report.fetched += page.frames.count + page.removed.count
            emit(.fetchProgress(records: report.fetched))
            token = page.syncToken
            if !page.moreComing { break }
        }
    }

    /// `deltas/pull`: one binary page, leaving out the positions of this device's own acknowledged writes.
    private func pullPage(_ zone: LocalZone, zoneID: ZoneID, token: String?, known: [[Int64]], client: ServerClient.Blocking,
                          account: Account) throws -> ZonePage {
        let request = DeltaPullRequest(zoneID: WireZoneID(zoneName: zoneID.zoneName, ownerRecordName: zoneID.ownerRecordName),
                                       syncToken: token, known: known.compactMap { $0.count == 2 ? $0[0]...$0[1] : nil })
        let response = try client.callRaw(zone.database, "deltas/pull", request.json, token: account.token, timeout: 60)
        do {
            let pull = try SyncMessage.Pull(decoding: response.body)
            let delta = try EncodedDelta(validating: pull.delta)
            guard delta.zoneID == zoneID else { throw SyncError.unexpectedAnswer("deltas/pull (another zone)") }
            return ZonePage(frames: delta.recordFrames(), removed: pull.removed, skipped: pull.skipped,
                            lostShares: pull.lostShares, maximumHLC: delta.maximumHLC, syncToken: pull.syncToken,
                            moreComing: pull.moreComing)
        } catch let error as CodecError {
            throw SyncError.unexpectedAnswer("deltas/pull (\(error.description))")
        }
    }

    /// `changes/zone`: one JSON page; CRDT states are turned into frames for the same join.
    private func changesPage(_ zone: LocalZone, zoneID: ZoneID, token: String?, client: ServerClient.Blocking,
                             account: Account) throws -> ZonePage {
        let request = ZoneChangesRequest(zones: [ZoneChangesItem(
            zoneID: WireZoneID(zoneName: zoneID.zoneName, ownerRecordName: zoneID.ownerRecordName), syncToken: token)])
        let reply = try client.call(zone.database, "changes/zone", request.json, token: account.token)
        guard let result = reply["zones"]?.arrayValue?.first else { throw SyncError.unexpectedAnswer("changes/zone") }
        if let code = result["serverErrorCode"]?.stringValue {
            throw ServerError(code: code, reason: result["reason"]?.stringValue ?? "", status: 200, retryAfter: nil)
        }
        var page = ZonePage(frames: [], removed: [], maximumHLC: .zero, syncToken: result["syncToken"]?.stringValue,
                            moreComing: result["moreComing"] == .bool(true))
        page.lostShares = (result["lostShares"]?.arrayValue ?? []).compactMap { json in
            guard let root = json["rootRecordName"]?.stringValue, let share = json["shareRecordName"]?.stringValue else {
                return nil
            }
            return SyncMessage.LostShare(rootRecordName: root, shareRecordName: share)
        }
        for json in result["records"]?.arrayValue ?? [] {
            guard let name = json["recordName"]?.stringValue else { continue }
            guard json["crdt"] != nil else {
                // A deletion without CRDT metadata: the record left what this device may see (a share).
                if json["deleted"] == .bool(true) { page.removed.append(name) }
                continue
            }
            let record = try Record(cloudKitJSON: json, zoneID: zoneID)
            page.maximumHLC = max(page.maximumHLC, record.maximumHLC)
            page.frames.append(try RecordFrame(encoding: record))
        }
        return page
    }

    /// Joins a record state from the server into the local one (which may hold unsent edits).
    private func applyRemote(_ incoming: RecordFrame, name: String, zone: LocalZone, _ tx: LocalTransaction) throws {
        let local = try tx.record(zoneID: zone.id, name: name).map { try RecordFrame(stored: $0.frame) }
        guard let joined = RecordFrame.join(local, incoming) else { return }
        try tx.saveRecord(zoneID: zone.id, name: name, frame: joined.bytes, dirty: false)
    }

    // MARK: Own writes

    private static func knownKey(_ zone: LocalZone) -> String { "known.\(zone.id)" }

    /// The zone positions of this device's writes that the server holds exactly as sent, since the last
    /// complete pull: `[from, to]` ranges.
    private func knownRanges(_ zone: LocalZone) throws -> [[Int64]] {
        try store.transaction { tx in try knownRanges(zone, tx) }
    }

    private func knownRanges(_ zone: LocalZone, _ tx: LocalTransaction) throws -> [[Int64]] {
        guard let text = try tx.metadata(Self.knownKey(zone)), let ranges = (try? JSON.parse(text))?.arrayValue else {
            return []
        }
        return ranges.compactMap { range in
            guard let pair = range.arrayValue, pair.count == 2, let from = pair[0].intValue, let to = pair[1].intValue,
                  from <= to else { return nil }
            return [from, to]
        }
    }

    private func rememberKnown(_ positions: [Int64], zone: LocalZone, _ tx: LocalTransaction) throws {
        guard !positions.isEmpty else { return }
        let ranges = Self.addingKnown(positions, to: try knownRanges(zone, tx))
        try tx.setMetadata(Self.knownKey(zone), JSON.array(ranges.map { .array($0.map(JSON.int)) }).serialized())
    }

    /// `ranges` (`[from, to]` zone positions) with `positions` added, adjacent ones merged; the newest
    /// `maximumKnownRanges` kept (forgetting one only means downloading those records once more).
    static func addingKnown(_ positions: [Int64], to ranges: [[Int64]]) -> [[Int64]] {
        var ranges = ranges
        for position in positions.sorted() {
            if let last = ranges.last, last[1] + 1 == position { ranges[ranges.count - 1][1] = position }
            else { ranges.append([position, position]) }
        }
        if ranges.count > maximumKnownRanges { ranges.removeFirst(ranges.count - maximumKnownRanges) }
        return ranges
    }

    // MARK: Send

    /// Sends every record with unsent edits, zone by zone, in batches.
    public func send(_ report: inout SyncReport) throws {
        lock.lock()
        defer { lock.unlock() }
        let account = try requireAccount()
        let client = try client(for: account)
        // Zones made offline are created first.
        for zone in try zones() where !zone.onServer && zone.database == "private" {
            let request = ZonesModifyRequest(operations: [ZoneOperation(.create, WireZoneID(zoneName: zone.zoneName))])
            let reply = try client.call("private", "zones/modify", request.json, token: account.token)
            if reply["zones"]?.arrayValue?.first?["serverErrorCode"] == nil {
                try store.transaction { try $0.setOnServer(zone.id) }
            }
        }
        let pending = try store.transaction { try $0.dirtyRecords() }
        guard !pending.isEmpty else { return }
        emit(.willSendChanges(records: pending.count))
        var sent = 0
        var failed = 0
        let byZone = Dictionary(grouping: pending, by: \.zoneID)
        for zoneID in byZone.keys.sorted() {
            guard let zone = try store.transaction({ try $0.zone(id: zoneID) }), zone.onServer else { continue }
            var batch: [LocalRecord] = []
            var bytes = 0
            func flush() throws {
                guard !batch.isEmpty else { return }
                let (ok, bad) = try sendBatch(batch, zone: zone, client: client, account: account, report: &report)
                sent += ok
                failed += bad
                batch = []
                bytes = 0
            }
            for local in byZone[zoneID]! {
                // JSON states are a few times larger than frames: the byte budget counts what travels.
                let size = wire == .binary ? local.frame.count : local.frame.count * 4
                if batch.count == selectedBatchLimit || bytes + size > Self.maximumBatchBytes { try flush() }
                batch.append(local)
                bytes += size
            }
            try flush()
        }
        report.sent += sent
        emit(.didSendChanges(sent: sent, failed: failed))
    }

    /// One non-atomic batch (each record stands alone) with a client operation id. Split in half and sent
    /// again on LIMIT_EXCEEDED.
    private func sendBatch(_ batch: [LocalRecord], zone: LocalZone, client: ServerClient.Blocking, account: Account,
                           report: inout SyncReport) throws -> (Int, Int) {
        let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
        let frames = try batch.map { try RecordFrame(stored: $0.frame) }
        let items: [JSON]
        do {
            items = wire == .binary
                ? try pushFrames(frames, zoneID: zoneID, zone: zone, client: client, account: account)
                : try modifyFrames(frames, zoneID: zoneID, zone: zone, client: client, account: account)
        } catch let error as ServerError where error.serverErrorCode == .limitExceeded && batch.count > 1 {
            let half = batch.count / 2
            let first = try sendBatch(Array(batch[..<half]), zone: zone, client: client, account: account, report: &report)
            let second = try sendBatch(Array(batch[half...]), zone: zone, client: client, account: account, report: &report)
            return (first.0 + second.0, first.1 + second.1)
        } catch let error as ServerError where error.serverErrorCode == .zoneNotFound || error.serverErrorCode == .accessDenied {
            // The zone went away (a revoked share): drop it.
            try removeZone(zone, &report)
            report.removedZones.append((zone.database, zone.zoneName, zone.ownerRecordName))
            emit(.zoneRemoved(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName))
            return (0, batch.count)
        }
        // Answers come in the order sent; the binary path sends in name order, so match by name.
        var byName: [String: JSON] = [:]
        for item in items { if let name = item["recordName"]?.stringValue { byName[name] = item } }
        var sent = 0
        var failed = 0
        var upToDate: [Int64] = []
        var accepted: [LocalRecord] = []
        for local in batch {
            let item = byName[local.name] ?? .null
            if let code = item["serverErrorCode"]?.stringValue {
                failed += 1
                let reason = item["reason"]?.stringValue ?? code
                try revert(local, zone: zone, client: client, account: account)
                report.rejected.append((zone.zoneName, local.name, code, reason))
                emit(.failedRecord(zone: zone.zoneName, recordName: local.name, code: code, reason: reason))
            } else if item == .null {
                failed += 1 // no answer for it: it stays queued for the next sync
            } else {
                sent += 1
                accepted.append(local)
                if item["upToDate"] == .bool(true), let position = item["position"]?.intValue { upToDate.append(position) }
            }
        }
        // Safe to lose in a power failure (not in a crash of the process): a record still marked unsent
        // is sent again and the server's join answers it as up to date; a forgotten position means
        // downloading that record once more. So this commit does not wait for the disk.
        try store.transaction(flushed: false) { tx in
            for local in accepted { try tx.markSent(zoneID: zone.id, name: local.name, generation: local.dirty) }
            try rememberKnown(upToDate, zone: zone, tx)
        }
        for local in accepted { emit(.sentRecord(zone: zone.zoneName, recordName: local.name)) }
        return (sent, failed)
    }

    /// `deltas/push`: the frames as one zone delta; answers one item per record.
    private func pushFrames(_ frames: [RecordFrame], zoneID: ZoneID, zone: LocalZone, client: ServerClient.Blocking,
                            account: Account) throws -> [JSON] {
        let push = SyncMessage.Push(clientOperationID: UUID().uuidString, atomic: false,
                                    delta: BinaryCodec.encodeDelta(zoneID: zoneID, frames: frames))
        let response = try client.callBinary(zone.database, "deltas/push", body: push.encoded(),
                                             contentType: SyncMessage.contentType, token: account.token, timeout: 60)
        guard let items = BatchAnswerItems.read(response.body) else { throw SyncError.unexpectedAnswer("deltas/push") }
        return items
    }

    /// `records/modify` with each frame's CRDT state in JSON (`forceUpdate`: the server joins them), asking
    /// for no fields back (`desiredKeys: []`): as on the binary path, the device does not download its own
    /// writes in the answer; what the server joined in from others comes with the next fetch.
    private func modifyFrames(_ frames: [RecordFrame], zoneID: ZoneID, zone: LocalZone, client: ServerClient.Blocking,
                              account: Account) throws -> [JSON] {
        // Written straight from the records (LatticeAPI's `RecordStatesRequest.body`), no JSON tree made.
        let body = RecordStatesRequest.body(zoneID: zoneID, try frames.map { (type: .forceUpdate, record: try $0.decoded()) },
                                            atomic: false, desiredKeys: [], clientOperationID: UUID().uuidString)
        let response = try client.callBinary(zone.database, "records/modify", body: body, contentType: "application/json",
                                             token: account.token, timeout: 60)
        guard let items = BatchAnswerItems.read(response.body) else { throw SyncError.unexpectedAnswer("records/modify") }
        return items
    }

    /// A refused record goes back to the server's state (or away, if the server has none).
    private func revert(_ local: LocalRecord, zone: LocalZone, client: ServerClient.Blocking, account: Account) throws {
        let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
        let request = RecordsLookupRequest(zoneID: WireZoneID(zoneName: zoneID.zoneName, ownerRecordName: zoneID.ownerRecordName),
                                           recordNames: [local.name])
        let reply = try? client.call(zone.database, "records/lookup", request.json, token: account.token)
        let server = reply?["records"]?.arrayValue?.first
        try store.transaction { tx in
            if let server, server["crdt"] != nil {
                let frame = try RecordFrame(encoding: try Record(cloudKitJSON: server, zoneID: zoneID))
                try tx.saveRecord(zoneID: zone.id, name: local.name, frame: frame.bytes, dirty: false)
                try tx.clearDirty(zoneID: zone.id, name: local.name)
            } else {
                try tx.deleteRecord(zoneID: zone.id, name: local.name)
            }
        }
    }

    // MARK: Push

    /// Waits until a database the user reads changes, or the timeout: one parked `changes/wait` on both the
    /// private and the shared database. Returns whether something changed.
    public func waitForChanges(timeoutSeconds: Int) throws -> Bool {
        let account = try requireAccount()
        let client = try client(for: account)
        let databases = try [DatabaseKind.private, .shared].map { database in
            ChangesWaitRequest.Watched(database: database, syncToken: try store.transaction {
                try $0.metadata("dbtoken.\(database.rawValue)")
            })
        }
        let request = ChangesWaitRequest(databases: databases, timeoutSeconds: Int64(timeoutSeconds))
        let reply = try client.call("private", "changes/wait", request.json, token: account.token,
                                    timeout: TimeInterval(timeoutSeconds + 10))
        return reply["changed"] == .bool(true)
    }
}

public enum SyncError: Error, CustomStringConvertible, Sendable {
    case notSignedIn
    case notFound(String)
    case unexpectedAnswer(String)
    /// An account was given to a client of another server (its token is never sent elsewhere).
    case otherServer(String)

    public var description: String {
        switch self {
        case .notSignedIn: return "not signed in: run lattice signup NAME --server URL, or lattice login"
        case .notFound(let name): return "\(name) does not exist"
        case .unexpectedAnswer(let what): return "the server's answer to \(what) was not understood"
        case .otherServer(let url): return "the account is of another server (\(url))"
        }
    }
}

extension SyncEngine {
    /// Remembers a user's name (learned from share metadata) for display.
    public func rememberUserName(_ recordName: String, _ name: String) throws {
        try store.transaction { try $0.setMetadata("user.\(recordName)", name) }
    }

    public func userName(_ recordName: String) throws -> String? {
        try store.transaction { try $0.metadata("user.\(recordName)") }
    }
}
