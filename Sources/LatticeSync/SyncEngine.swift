import Foundation
import LatticeCore
import LatticeStore

/// The signed-in account of a home.
public struct Account: Sendable, Hashable {
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
    /// The token stopped working (signed out elsewhere, or revoked).
    case accountChange(reason: String)
    /// A zone went away: deleted by its owner, or a share that was revoked, left or deleted.
    case zoneRemoved(database: String, zone: String, owner: String)
    /// Progress of a long fetch: records applied so far.
    case fetchProgress(records: Int)
}

/// The outcome of a sync.
public struct SyncReport: Sendable {
    public var sent = 0
    public var fetched = 0
    public var rejected: [(zone: String, recordName: String, code: String, reason: String)] = []
    public var removedZones: [(database: String, zone: String, owner: String)] = []
    /// False when the server could not be reached: local edits stay queued.
    public var online = true
    public var queued = 0
}

/// The client sync engine, modelled on CKSyncEngine: a local replica (SQLite in the home directory), a
/// persisted queue of pending record changes (dirty records), and the sync state (database and zone
/// change tokens), saved in the same transaction as each change it describes.
///
/// - Local edits always succeed offline; `sync()` sends them (batches of at most 400 operations and about
///   1.5 MB, split again on LIMIT_EXCEEDED, each with a client operation id) and fetches: database changes
///   first, then each changed zone, looping while `moreComing`.
/// - Remote states merge into local state with LatticeCore's join, so unsent edits survive a fetch.
/// - CHANGE_TOKEN_EXPIRED refetches the zone from scratch, keeping records with unsent edits.
/// - A record the server refuses (PERMISSION_FAILURE for a read-only participant, ...) returns to the
///   server's state and is reported.
public final class SyncEngine: @unchecked Sendable {
    public let home: String
    let store: LocalStore
    private let lock = NSRecursiveLock()
    private var clock: HybridLogicalClock
    private var transportOverride: (any SyncTransport)?
    /// Receives events; called on the thread that runs the engine.
    public var onEvent: (SyncEvent) -> Void = { _ in }
    public var wire: SyncWire = .json
    /// Injected for tests; wall clock otherwise.
    let now: @Sendable () -> UInt64

    static let maximumBatchOperations = 400
    static let maximumBatchBytes = 1_500_000

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
        clock = HybridLogicalClock(replica: replica, latest: HLC(rawValue: latest), time: now)
    }

    deinit { store.close() }

    public var replicaID: ReplicaID { clock.replica }

    // MARK: Account

    public var account: Account? {
        (try? store.transaction { tx in try tx.metadata("account") }).flatMap { $0 }
            .flatMap { try? JSON.parse($0) }.flatMap(Account.init(json:))
    }

    func client(for account: Account) throws -> ServerClient {
        ServerClient(transport: try transportOverride ?? HTTPTransport(serverURL: account.serverURL))
    }

    private func requireAccount() throws -> Account {
        guard let account else { throw SyncError.notSignedIn }
        return account
    }

    /// Creates an account on the server and keeps its token in this home.
    @discardableResult
    public func signUp(name: String, serverURL: String) throws -> Account {
        let client = ServerClient(transport: try transportOverride ?? HTTPTransport(serverURL: serverURL))
        let reply = try client.post("/auth/signup", .object(["name": .string(name)]), token: nil)
        guard let token = reply["token"]?.stringValue, let record = reply["userRecordName"]?.stringValue else {
            throw SyncError.unexpectedAnswer("signup")
        }
        let account = Account(serverURL: serverURL, token: token, userRecordName: record, name: name)
        try saveAccount(account)
        return account
    }

    /// Signs in with an existing token (checked with `users/current`).
    @discardableResult
    public func logIn(serverURL: String, token: String) throws -> Account {
        let client = ServerClient(transport: try transportOverride ?? HTTPTransport(serverURL: serverURL))
        let reply = try client.call("private", "users/current", .object([:]), token: token)
        guard let record = reply["userRecordName"]?.stringValue else { throw SyncError.unexpectedAnswer("users/current") }
        let account = Account(serverURL: serverURL, token: token, userRecordName: record,
                              name: reply["name"]?.stringValue ?? "")
        try saveAccount(account)
        return account
    }

    private func saveAccount(_ account: Account) throws {
        try store.transaction { tx in
            if let previous = try tx.metadata("account").flatMap({ try? JSON.parse($0) }).flatMap(Account.init(json:)),
               previous.userRecordName != account.userRecordName || previous.serverURL != account.serverURL {
                // Another account: this home's data was the old account's.
                for zone in try tx.zones() { try tx.deleteZone(zone.id) }
                try tx.setMetadata("dbtoken.private", nil)
                try tx.setMetadata("dbtoken.shared", nil)
            }
            try tx.setMetadata("account", account.json.serialized())
        }
    }

    /// A raw API call with this home's account, for operations that are online only (sharing).
    public func call(_ database: String, _ operation: String, _ body: JSON) throws -> JSON {
        let account = try requireAccount()
        return try client(for: account).call(database, operation, body, token: account.token)
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
        try store.transaction { tx in try tx.records(zoneID: zone.id) }.compactMap { try? BinaryCodec.decodeRecord($0.frame) }
    }

    public func record(_ name: String, in zone: LocalZone) throws -> Record? {
        try store.transaction { tx in try tx.record(zoneID: zone.id, name: name) }.flatMap { try? BinaryCodec.decodeRecord($0.frame) }
    }

    /// Number of records with edits the server has not acknowledged.
    public func pendingCount() throws -> Int { try store.transaction { try $0.dirtyRecords().count } }

    /// Applies a local edit to one record (creating it with `recordType` when missing or deleted) and queues
    /// it for the next sync. `edit` gets the record and a function for fresh stamps.
    @discardableResult
    public func edit(_ name: String, in zone: LocalZone, creating recordType: String? = nil,
                     _ edit: (inout Record, () -> Stamp) throws -> Void) throws -> Record {
        lock.lock()
        defer { lock.unlock() }
        return try store.transaction { tx in
            let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
            var record: Record
            if let stored = try tx.record(zoneID: zone.id, name: name), let decoded = try? BinaryCodec.decodeRecord(stored.frame) {
                record = decoded
                if record.isDeleted {
                    guard let recordType else { throw SyncError.notFound(name) }
                    try record.recreate(recordType: recordType, at: clock.now())
                }
            } else {
                guard let recordType else { throw SyncError.notFound(name) }
                record = try Record(id: RecordID(recordName: name, zoneID: zoneID), recordType: recordType, createdAt: clock.now())
            }
            var stamps = clock
            try edit(&record, { stamps.now() })
            clock = stamps
            try tx.saveRecord(zoneID: zone.id, name: name, frame: try BinaryCodec.encode(record), dirty: true)
            try tx.setMetadata("clock_latest", String(clock.latest.rawValue))
            return record
        }
    }

    /// Deletes records locally (delete wins over concurrent edits) and queues the deletions.
    public func delete(_ names: [String], in zone: LocalZone) throws {
        lock.lock()
        defer { lock.unlock() }
        try store.transaction { tx in
            for name in names {
                guard let stored = try tx.record(zoneID: zone.id, name: name),
                      var record = try? BinaryCodec.decodeRecord(stored.frame), !record.isDeleted else { continue }
                record.delete(at: clock.now())
                try tx.saveRecord(zoneID: zone.id, name: name, frame: try BinaryCodec.encode(record), dirty: true)
            }
            try tx.setMetadata("clock_latest", String(clock.latest.rawValue))
        }
    }

    // MARK: Sync

    /// Sends pending changes, then fetches. Offline, it reports `online == false` and keeps everything queued.
    @discardableResult
    public func sync() throws -> SyncReport {
        lock.lock()
        defer { lock.unlock() }
        var report = SyncReport()
        do {
            try fetch(&report) // first, so a zone that went away is known before sending into it
            try send(&report)
            try fetch(&report)
        } catch is TransportError {
            report.online = false
        } catch let error as ServerError where error.code == "AUTHENTICATION_FAILED" {
            onEvent(.accountChange(reason: error.reason))
            throw error
        }
        report.queued = try pendingCount()
        return report
    }

    /// Fetches database changes (private, then shared), then each changed zone's records.
    public func fetch(_ report: inout SyncReport) throws {
        let account = try requireAccount()
        let client = try client(for: account)
        onEvent(.willFetchChanges)
        var zonesFetched = 0
        let before = report.fetched
        for database in ["private", "shared"] {
            var changed: [(String, String)] = []
            var removed: [(String, String)] = []
            var token = try store.transaction { try $0.metadata("dbtoken.\(database)") }
            while true {
                var body: [String: JSON] = [:]
                if let token { body["syncToken"] = .string(token) }
                let reply: JSON
                do {
                    reply = try client.call(database, "changes/database", .object(body), token: account.token)
                } catch let error as ServerError where error.code == "CHANGE_TOKEN_EXPIRED" {
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
                try store.transaction { tx in
                    if let zone = try tx.zone(database: database, zoneName: name, owner: owner) { try tx.deleteZone(zone.id) }
                }
                report.removedZones.append((database, name, owner))
                onEvent(.zoneRemoved(database: database, zone: name, owner: owner))
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
        onEvent(.didFetchChanges(zones: zonesFetched, records: report.fetched - before))
    }

    private func fetchZone(_ zone: LocalZone, client: ServerClient, account: Account, report: inout SyncReport) throws {
        var token = zone.syncToken
        var fromScratch = token == nil
        var seen: Set<String> = []
        while true {
            var request: [String: JSON] = [
                "zoneID": .object(["zoneName": .string(zone.zoneName), "ownerRecordName": .string(zone.ownerRecordName)]),
            ]
            if let token { request["syncToken"] = .string(token) }
            let reply = try client.call(zone.database, "changes/zone", .object(["zones": .array([.object(request)])]),
                                        token: account.token)
            guard let result = reply["zones"]?.arrayValue?.first else { throw SyncError.unexpectedAnswer("changes/zone") }
            if let code = result["serverErrorCode"]?.stringValue {
                switch code {
                case "CHANGE_TOKEN_EXPIRED":
                    token = nil
                    fromScratch = true
                    seen = []
                    continue
                case "ZONE_NOT_FOUND":
                    try store.transaction { tx in try tx.deleteZone(zone.id) }
                    report.removedZones.append((zone.database, zone.zoneName, zone.ownerRecordName))
                    onEvent(.zoneRemoved(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName))
                    return
                default:
                    throw ServerError(code: code, reason: result["reason"]?.stringValue ?? "", status: 200, retryAfter: nil)
                }
            }
            let records = result["records"]?.arrayValue ?? []
            let nextToken = result["syncToken"]?.stringValue
            let more = result["moreComing"] == .bool(true)
            try store.transaction { tx in
                for json in records {
                    guard let name = json["recordName"]?.stringValue else { continue }
                    seen.insert(name)
                    try applyRemote(json, name: name, zone: zone, tx)
                }
                if fromScratch && !more {
                    // A full refetch: what the server no longer has is gone, unless it holds unsent edits.
                    for local in try tx.records(zoneID: zone.id) where !seen.contains(local.name) && local.dirty == 0 {
                        try tx.deleteRecord(zoneID: zone.id, name: local.name)
                    }
                }
                try tx.setSyncToken(zone.id, nextToken)
                try tx.setMetadata("clock_latest", String(clock.latest.rawValue))
            }
            report.fetched += records.count
            onEvent(.fetchProgress(records: report.fetched))
            token = nextToken
            if !more { break }
        }
    }

    /// Joins a record state from the server into the local one (which may hold unsent edits). A deletion
    /// without CRDT metadata means the record left what this device may see (a share): it is dropped.
    private func applyRemote(_ json: JSON, name: String, zone: LocalZone, _ tx: LocalTransaction) throws {
        guard json["crdt"] != nil else {
            if json["deleted"] == .bool(true) { try tx.deleteRecord(zoneID: zone.id, name: name) }
            return
        }
        let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
        var remote = try Record(cloudKitJSON: json, zoneID: zoneID)
        try? clock.observe(remote.maximumHLC)
        if let stored = try tx.record(zoneID: zone.id, name: name), let local = try? BinaryCodec.decodeRecord(stored.frame) {
            remote = local.merging(remote)
            guard remote != local else { return }
        }
        try tx.saveRecord(zoneID: zone.id, name: name, frame: try BinaryCodec.encode(remote), dirty: false)
    }

    /// Sends every record with unsent edits, zone by zone, in batches.
    public func send(_ report: inout SyncReport) throws {
        let account = try requireAccount()
        let client = try client(for: account)
        // Zones made offline are created first.
        for zone in try zones() where !zone.onServer && zone.database == "private" {
            let reply = try client.call("private", "zones/modify", .object(["operations": .array([
                .object(["operationType": .string("create"),
                         "zone": .object(["zoneID": .object(["zoneName": .string(zone.zoneName)])])]),
            ])]), token: account.token)
            if reply["zones"]?.arrayValue?.first?["serverErrorCode"] == nil {
                try store.transaction { try $0.setOnServer(zone.id) }
            }
        }
        let pending = try store.transaction { try $0.dirtyRecords() }
        guard !pending.isEmpty else { return }
        onEvent(.willSendChanges(records: pending.count))
        var sent = 0
        var failed = 0
        let byZone = Dictionary(grouping: pending, by: \.zoneID)
        for zoneID in byZone.keys.sorted() {
            guard let zone = try store.transaction({ try $0.zone(id: zoneID) }), zone.onServer else { continue }
            var batch: [(LocalRecord, JSON)] = []
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
                guard let record = try? BinaryCodec.decodeRecord(local.frame) else { continue }
                let operation = JSON.object(["operationType": .string("forceUpdate"), "record": record.cloudKitJSON])
                let size = operation.serializedBytes().count
                if batch.count == Self.maximumBatchOperations || bytes + size > Self.maximumBatchBytes { try flush() }
                batch.append((local, operation))
                bytes += size
            }
            try flush()
        }
        report.sent += sent
        onEvent(.didSendChanges(sent: sent, failed: failed))
    }

    /// One records/modify of CRDT states (not atomic: each record stands alone). Split in half and sent
    /// again on LIMIT_EXCEEDED.
    private func sendBatch(_ batch: [(LocalRecord, JSON)], zone: LocalZone, client: ServerClient, account: Account,
                           report: inout SyncReport) throws -> (Int, Int) {
        let body = JSON.object([
            "zoneID": .object(["zoneName": .string(zone.zoneName), "ownerRecordName": .string(zone.ownerRecordName)]),
            "atomic": .bool(false),
            "clientOperationID": .string(UUID().uuidString),
            "operations": .array(batch.map(\.1)),
        ])
        let reply: JSON
        do {
            reply = try client.call(zone.database, "records/modify", body, token: account.token)
        } catch let error as ServerError where error.code == "LIMIT_EXCEEDED" && batch.count > 1 {
            let half = batch.count / 2
            let first = try sendBatch(Array(batch[..<half]), zone: zone, client: client, account: account, report: &report)
            let second = try sendBatch(Array(batch[half...]), zone: zone, client: client, account: account, report: &report)
            return (first.0 + second.0, first.1 + second.1)
        } catch let error as ServerError where error.code == "ZONE_NOT_FOUND" || error.code == "ACCESS_DENIED" {
            // The zone went away (a revoked share): drop it.
            try store.transaction { try $0.deleteZone(zone.id) }
            report.removedZones.append((zone.database, zone.zoneName, zone.ownerRecordName))
            onEvent(.zoneRemoved(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName))
            return (0, batch.count)
        }
        let items = reply["records"]?.arrayValue ?? []
        var sent = 0
        var failed = 0
        for (index, (local, _)) in batch.enumerated() {
            let item = index < items.count ? items[index] : .null
            if let code = item["serverErrorCode"]?.stringValue {
                failed += 1
                let reason = item["reason"]?.stringValue ?? code
                try revert(local, zone: zone, client: client, account: account)
                report.rejected.append((zone.zoneName, local.name, code, reason))
                onEvent(.failedRecord(zone: zone.zoneName, recordName: local.name, code: code, reason: reason))
            } else {
                sent += 1
                try store.transaction { tx in
                    try applyRemote(item, name: local.name, zone: zone, tx)
                    try tx.markSent(zoneID: zone.id, name: local.name, generation: local.dirty)
                }
                onEvent(.sentRecord(zone: zone.zoneName, recordName: local.name))
            }
        }
        return (sent, failed)
    }

    /// A refused record goes back to the server's state (or away, if the server has none).
    private func revert(_ local: LocalRecord, zone: LocalZone, client: ServerClient, account: Account) throws {
        let reply = try? client.call(zone.database, "records/lookup", .object([
            "zoneID": .object(["zoneName": .string(zone.zoneName), "ownerRecordName": .string(zone.ownerRecordName)]),
            "records": .array([.object(["recordName": .string(local.name)])]),
        ]), token: account.token)
        let server = reply?["records"]?.arrayValue?.first
        try store.transaction { tx in
            if let server, server["crdt"] != nil {
                let zoneID = try ZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName)
                let record = try Record(cloudKitJSON: server, zoneID: zoneID)
                try tx.saveRecord(zoneID: zone.id, name: local.name, frame: try BinaryCodec.encode(record), dirty: false)
                try tx.clearDirty(zoneID: zone.id, name: local.name)
            } else {
                try tx.deleteRecord(zoneID: zone.id, name: local.name)
            }
        }
    }

    // MARK: Push

    /// Waits until a database the user reads changes (the server's `changes/wait` long poll), or the timeout.
    /// Returns whether something changed.
    public func waitForChanges(timeoutSeconds: Int) throws -> Bool {
        let account = try requireAccount()
        let client = try client(for: account)
        let half = max(1, timeoutSeconds / 2)
        for database in ["shared", "private"] {
            let token = try store.transaction { try $0.metadata("dbtoken.\(database)") }
            var body: [String: JSON] = ["timeout": .int(Int64(half))]
            if let token { body["syncToken"] = .string(token) }
            let reply = try client.call(database, "changes/wait", .object(body), token: account.token,
                                        timeout: TimeInterval(half + 10))
            if reply["changed"] == .bool(true) { return true }
        }
        return false
    }
}

public enum SyncError: Error, CustomStringConvertible, Sendable {
    case notSignedIn
    case notFound(String)
    case unexpectedAnswer(String)

    public var description: String {
        switch self {
        case .notSignedIn: return "not signed in: run lattice signup NAME --server URL, or lattice login"
        case .notFound(let name): return "\(name) does not exist"
        case .unexpectedAnswer(let what): return "the server's answer to \(what) was not understood"
        }
    }
}
