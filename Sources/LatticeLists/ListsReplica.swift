import Foundation
import LatticeCore
import LatticeSync
import Synchronization

/// One device's shared lists: the CLI's app on LatticeSync's public engine, as an app developer would
/// write it (Docs/AppGuide.md).
///
/// The app keeps its own data in its home directory (`lists.sqlite`, a `LocalStore`): the account, the
/// zones it knows, and each record as a `LatticeRecord` archive with its unsent edits
/// (`encodeWithEdits()`), marked while a change waits. Two `LatticeSyncEngine`s, one for the private and
/// one for the shared database, with `automaticallySync` off, send and fetch; their states
/// (`State.Serialization`) are saved in the same file on every `stateUpdate` and before a command ends.
/// This type is their delegate's owner: fetched records are joined with the device's unsent edits
/// (`replaying(editsOf:)`), zones and shares that went away take their records and unsent edits with them
/// (reported), and a save or deletion the server refuses goes back to the state last fetched (reported).
///
/// Calls that reach the server are async (the CLI, a blocking program, waits for them on its main thread).
public final class ListsReplica: Sendable {
    public let home: String
    package let store: LocalStore
    /// The engines of the account in the home, remade when it changes. Guards nothing else.
    private let engines: Mutex<Engines>
    private let delegate: ListsSyncDelegate
    /// The transport of every call (tests inject one); nil: HTTP to the account's server.
    package let transportOverride: (any SyncTransport)?
    private let now: @Sendable () -> UInt64
    private let onRetryWait: @Sendable (ServerClient.RetryWait) -> Void

    struct Engines: Sendable {
        var `private`: LatticeSyncEngine
        var shared: LatticeSyncEngine
        var all: [LatticeSyncEngine] { [self.private, shared] }
    }

    public static let fileName = "lists.sqlite"

    /// Opens (creating) the home directory and its lists. A home an earlier `lattice` made (its
    /// `replica.sqlite`) is brought over: its account is kept, and what it had not sent is sent first.
    /// `onRetryWait` hears of each pause once a call's retries have waited 2 s in all (by default a line on
    /// stderr: a person at a terminal never waits in silence).
    public init(home: String, transport: (any SyncTransport)? = nil,
                now: @escaping @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1000) },
                onRetryWait: @escaping @Sendable (ServerClient.RetryWait) -> Void = { wait in
                    FileHandle.standardError.write(Data("lattice: \(wait)\n".utf8))
                }) throws {
        self.home = home
        transportOverride = transport
        self.now = now
        self.onRetryWait = onRetryWait
        if !FileManager.default.fileExists(atPath: home) {
            try FileManager.default.createDirectory(atPath: home, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        }
        let path = home + "/" + Self.fileName
        let fresh = !FileManager.default.fileExists(atPath: path)
        let legacy = home + "/" + LocalStore.fileName
        var carried: Account?
        if fresh && FileManager.default.fileExists(atPath: legacy) { carried = try Self.bringOver(home, transport: transport) }
        store = try LocalStore(path: path)
        if let carried { try store.transaction { tx in try tx.setMetadata("account", Self.encode(carried)) } }
        if carried != nil { try? FileManager.default.removeItem(atPath: legacy) }
        delegate = ListsSyncDelegate(store: store)
        let account = try store.transaction { tx in try Self.storedAccount(tx) }
        engines = Mutex(try Self.makeEngines(home: home, account: account, store: store, delegate: delegate, transport: transport, now: now,
                                             onRetryWait: onRetryWait))
    }

    /// The account of a home an earlier `lattice` made, once the changes it had not sent are sent (with
    /// the engine that made them: their edits are in its frames, not in `LatticeRecord` edits).
    private static func bringOver(_ home: String, transport: (any SyncTransport)?) throws -> Account? {
        let old = try SyncEngine(home: home, transport: transport)
        guard let account = old.account else { return nil }
        let pending = try old.pendingCount()
        if pending > 0 {
            var report = SyncReport()
            try? old.send(&report)
            let left = try old.pendingCount()
            if left > 0 {
                throw ListsError.invalid("this home was made by an earlier lattice and holds \(left) unsent "
                                         + plural(left, "change") + "; they could not be sent to \(account.serverURL) "
                                         + "now. Run the command again when the server can be reached.")
            }
        }
        return account
    }

    private static func makeEngines(home: String, account: Account?, store: LocalStore, delegate: ListsSyncDelegate,
                                    transport: (any SyncTransport)?, now: @escaping @Sendable () -> UInt64,
                                    onRetryWait: @escaping @Sendable (ServerClient.RetryWait) -> Void) throws -> Engines {
        // Attachments: imported files wait here for upload; downloads are cached here, 256 MiB at most.
        let assets = try AssetStore(directory: URL(fileURLWithPath: home + "/" + assetDirectoryName))
        func engine(_ database: LatticeDatabase) throws -> LatticeSyncEngine {
            let saved = try store.transaction { tx in try tx.metadata(stateKey(database.scope)) }
            var serialization: LatticeSyncEngine.State.Serialization?
            if let saved {
                do {
                    serialization = try JSONDecoder().decode(LatticeSyncEngine.State.Serialization.self, from: Data(saved.utf8))
                } catch {
                    throw ListsError.invalid("the sync state in \(fileName) cannot be read (\(error)); "
                                             + "sign in again with lattice login to start over")
                }
            }
            var configuration = LatticeSyncEngine.Configuration(database: database, account: account,
                                                                stateSerialization: serialization, delegate: delegate)
            configuration.automaticallySync = false
            configuration.transport = transport
            configuration.now = now
            configuration.requestTimeout = 60
            configuration.onRetryWait = onRetryWait
            configuration.assets = assets
            return LatticeSyncEngine(configuration)
        }
        return Engines(private: try engine(.private), shared: try engine(.shared))
    }

    static func stateKey(_ scope: LatticeDatabase.Scope) -> String { "engine.\(scope.rawValue)" }

    /// The directory of attachment files in a home.
    public static let assetDirectoryName = "assets"

    /// The asset store of this home (`AssetStore`).
    public var assets: AssetStore? { try? AssetStore(directory: URL(fileURLWithPath: home + "/" + Self.assetDirectoryName)) }

    /// The local file of an attachment a record of `zone` holds in `fieldName`, downloaded if need be.
    public func assetFile(_ asset: AssetValue, record name: String, fieldName: String, in zone: LocalZone) async throws -> URL {
        let id = LatticeRecord.ID(recordName: name, zoneID: zoneID(zone))
        return try await engine(zone.database == "shared" ? .shared : .private).assetFile(asset, recordID: id, fieldName: fieldName)
    }

    deinit { store.close() }

    private var current: Engines { engines.withLock { $0 } }

    func engine(_ scope: LatticeDatabase.Scope) -> LatticeSyncEngine {
        scope == .private ? current.private : current.shared
    }

    /// Saves both engines' states as they are now (the `stateUpdate` of a change queued just now may not
    /// have come yet when a command ends).
    func saveStates() throws {
        let engines = current
        try store.transaction { tx in
            for engine in engines.all {
                try tx.setMetadata(Self.stateKey(engine.database.scope), try Self.encode(engine.state.currentSerialization))
            }
        }
    }

    static func encode<T: Encodable>(_ value: T) throws -> String {
        String(decoding: try JSONEncoder().encode(value), as: UTF8.self)
    }

    // MARK: Account

    /// The account signed in on this device, nil when no one is.
    public var account: Account? { (try? store.transaction { tx in try Self.storedAccount(tx) }) ?? nil }

    /// The account as the file keeps it (the home is the owner's only: the token is in it).
    static func storedAccount(_ tx: LocalTransaction) throws -> Account? {
        guard let text = try tx.metadata("account") else { return nil }
        return try? JSONDecoder().decode(Account.self, from: Data(text.utf8))
    }

    /// Installs `account` (from `AccountClient`); no network. Another account takes the home over: the old
    /// one's lists and unsent changes leave the device first. The same account again keeps everything (a
    /// new token replaces the old one).
    public func signIn(_ account: Account) async throws {
        try await install(account)
    }

    /// Forgets the account, its lists and its unsent changes; no network. Revoke the token first
    /// (`AccountClient.revokeToken(of:)`): one that was not revoked stays valid on the server.
    public func signOut() async throws {
        try await install(nil)
    }

    private func install(_ account: Account?) async throws {
        try store.transaction { tx in
            let sameAccount = try Self.storedAccount(tx).flatMap { previous in account.map(previous.isSameAccount) } ?? false
            if !sameAccount {
                for zone in try tx.zones() { try tx.deleteZone(zone.id) }
            }
            try tx.setMetadata("account", try account.map(Self.encode))
        }
        // The engines compare the account with their states' and drop tokens and pending changes of another.
        let engines = try Self.makeEngines(home: home, account: account, store: store, delegate: delegate, transport: transportOverride,
                                           now: now, onRetryWait: onRetryWait)
        self.engines.withLock { $0 = engines }
        for engine in engines.all { try await engine.setAccount(account) }
        try saveStates()
    }

    // MARK: Local state

    /// The zones this device knows.
    public func zones() throws -> [LocalZone] { try store.transaction { try $0.zones() } }

    /// A zone of the private database, made here (and on the server at the next sync) when new.
    public func privateZone(_ name: String) throws -> LocalZone {
        guard let account else { throw SyncError.notSignedIn }
        let zone = try store.transaction { tx in
            try tx.ensureZone(database: "private", zoneName: name, owner: account.userRecordName, onServer: false)
        }
        if !zone.onServer {
            current.private.state.add(pendingDatabaseChanges: [.saveZone(LatticeRecordZone(zoneName: name))])
            try saveStates()
        }
        return zone
    }

    /// The zone's ID as its engine names it.
    func zoneID(_ zone: LocalZone) -> LatticeRecordZone.ID {
        zone.database == "private" ? LatticeRecordZone.ID(zoneName: zone.zoneName)
            : LatticeRecordZone.ID(zoneName: zone.zoneName, ownerName: zone.ownerRecordName)
    }

    func scope(_ zone: LocalZone) -> LatticeDatabase.Scope { zone.database == "private" ? .private : .shared }

    /// The other way: the app's zone (its database, name and owner) for an engine's zone ID.
    static func zoneKey(_ id: LatticeRecordZone.ID, scope: LatticeDatabase.Scope, account: Account)
        -> (database: String, zoneName: String, owner: String) {
        (scope == .private ? "private" : "shared", id.zoneName,
         id.ownerName == LatticeRecordZone.ID.currentUserOwnerName ? account.userRecordName : id.ownerName)
    }

    /// The app's zone for an engine's zone ID (made when `creating`), nil when this device does not know it.
    static func zone(_ id: LatticeRecordZone.ID, scope: LatticeDatabase.Scope, account: Account, _ tx: LocalTransaction,
                     creating: Bool = false) throws -> LocalZone? {
        let key = zoneKey(id, scope: scope, account: account)
        return creating ? try tx.ensureZone(database: key.database, zoneName: key.zoneName, owner: key.owner, onServer: true)
            : try tx.zone(database: key.database, zoneName: key.zoneName, owner: key.owner)
    }

    /// The zone's records as this device shows them (unsent edits included, records it deleted left out).
    public func records(in zone: LocalZone) throws -> [LatticeRecord] {
        let deleting = pendingDeletions(zone)
        return try store.transaction { tx in try tx.records(zoneID: zone.id) }
            .filter { !deleting.contains($0.name) }
            .compactMap { try? LatticeRecord(archive: Data($0.frame)) }
    }

    public func record(_ name: String, in zone: LocalZone) throws -> LatticeRecord? {
        guard !pendingDeletions(zone).contains(name) else { return nil }
        return try store.transaction { tx in try tx.record(zoneID: zone.id, name: name) }
            .flatMap { try? LatticeRecord(archive: Data($0.frame)) }
    }

    private func pendingDeletions(_ zone: LocalZone) -> Set<String> {
        let id = zoneID(zone)
        var names = Set<String>()
        for case .deleteRecord(let record) in engine(scope(zone)).state.pendingRecordZoneChanges where record.zoneID == id {
            names.insert(record.recordName)
        }
        return names
    }

    /// Record changes that wait for the server (a zone made here goes with its records).
    public func pendingCount() throws -> Int {
        current.all.reduce(0) { $0 + $1.state.pendingRecordZoneChanges.count }
    }

    /// Keeps `record` (with its edits) and queues it. A record without edits is kept and not queued.
    public func save(_ record: LatticeRecord, in zone: LocalZone) throws {
        let archive = try record.encodeWithEdits()
        try store.transaction { tx in
            try tx.saveRecord(zoneID: zone.id, name: record.recordID.recordName, frame: [UInt8](archive), dirty: record.hasChanges)
        }
        if record.hasChanges {
            engine(scope(zone)).state.add(pendingRecordZoneChanges: [.saveRecord(record.recordID)])
            try saveStates()
        }
    }

    /// Deletes records here and queues their deletions (a deletion wins over edits made elsewhere). They
    /// stay in the file, hidden, until the server has them: a refused deletion brings them back.
    public func delete(_ names: [String], in zone: LocalZone) throws {
        let id = zoneID(zone)
        engine(scope(zone)).state.add(pendingRecordZoneChanges: names.map { .deleteRecord(LatticeRecord.ID(recordName: $0, zoneID: id)) })
        try saveStates()
    }

    /// The replica ids this device's edits are stamped with (one per database's engine).
    public var replicaIDs: Set<ReplicaID> { Set(current.all.map(\.state.replicaID)) }

    /// Remembers a user's name (learned from share metadata) for display.
    public func rememberUserName(_ recordName: String, _ name: String) throws {
        try store.transaction { try $0.setMetadata("user.\(recordName)", name) }
    }

    public func userName(_ recordName: String) throws -> String? {
        try store.transaction { try $0.metadata("user.\(recordName)") }
    }

    // MARK: Sync

    /// Told while a sync fetches: records fetched so far, then `nil` when the fetch ends.
    public var onFetchProgress: (@Sendable (Int?) -> Void)? {
        get { delegate.progress.withLock { $0 } }
        set { delegate.progress.withLock { $0 = newValue } }
    }

    /// Fetches (so a zone or share that went away is known before anything is sent into it), sends, and
    /// fetches again, on both databases. Offline, it reports `online == false` and keeps everything
    /// queued; told "not now" by the server, it stops there (`notNow`) and keeps what was not sent.
    /// Throws `LatticeSyncError` otherwise (`.notAuthenticated`: the server no longer accepts the token).
    @discardableResult
    public func sync() async throws -> ListsSyncReport {
        guard account != nil else { throw SyncError.notSignedIn }
        let engines = current
        delegate.begin()
        var report: ListsSyncReport
        do {
            for engine in engines.all { try await engine.fetchChanges() }
            for engine in engines.all { try await engine.sendChanges() }
            for engine in engines.all { try await engine.fetchChanges() }
            report = delegate.end()
        } catch let error as LatticeSyncError {
            report = delegate.end()
            switch error.code {
            case .networkUnavailable: report.online = false
            case .requestRateLimited, .serviceUnavailable:
                report.notNow = error
            default:
                try saveStates()
                throw error
            }
        } catch {
            _ = delegate.end()
            try saveStates()
            throw error
        }
        try saveStates()
        report.queued = try pendingCount()
        return report
    }

    /// Waits until a database the user reads changes on the server, or the timeout (at most 50 s): one
    /// parked request for both databases (`LatticeSyncEngine.waitForServerChanges(of:)`). Returns whether
    /// something changed.
    public func waitForChanges(timeoutSeconds: Int) async throws -> Bool {
        try await LatticeSyncEngine.waitForServerChanges(of: current.all, timeoutSeconds: timeoutSeconds)
    }
}

/// What a sync did, for the CLI to tell.
public struct ListsSyncReport: Sendable {
    public struct Rejection: Sendable, Hashable {
        public let zone: String
        public let recordName: String
        public let code: String
        public let reason: String
    }

    public struct RemovedZone: Sendable, Hashable {
        public let database: String
        public let zone: String
        public let owner: String
    }

    /// A share of part of a zone that this device lost (its records left the device).
    public typealias LostShare = LatticeSync.LostShare
    /// An unsent change that will never be sent: its record went out of reach.
    public typealias DroppedEdit = LatticeSync.DroppedEdit

    public var sent = 0
    public var fetched = 0
    public var rejected: [Rejection] = []
    public var removedZones: [RemovedZone] = []
    public var lostShares: [LostShare] = []
    public var droppedEdits: [DroppedEdit] = []
    /// False when the server could not be reached: local changes stay queued.
    public var online = true
    /// The server's "not now" (`isNotNow`) that stopped this sync; what was not sent stays queued.
    public var notNow: LatticeSyncError?
    /// Changes still waiting for the server.
    public var queued = 0

    public init() {}
}

/// The engines' delegate: keeps what they fetch and send in the app's file, and notes what a sync did.
final class ListsSyncDelegate: LatticeSyncEngineDelegate {
    let store: LocalStore
    /// The sync's report while it runs. Guards nothing else.
    private let report = Mutex(ListsSyncReport())
    /// Told of fetch progress. Guards nothing else.
    let progress = Mutex<(@Sendable (Int?) -> Void)?>(nil)
    private let fetchedSoFar = Mutex(0)
    /// The records each zone's fetch under way delivered, by scope and zone. Guards nothing else.
    private let delivered = Mutex<[String: Set<String>]>([:])

    init(store: LocalStore) { self.store = store }

    /// The account in the app's file (the engines have it too, but not for the app to read).
    private var account: Account? { (try? store.transaction { tx in try ListsReplica.storedAccount(tx) }) ?? nil }

    private func zone(_ id: LatticeRecordZone.ID, scope: LatticeDatabase.Scope, account: Account,
                      creating: Bool = false) throws -> LocalZone? {
        try store.transaction { tx in try ListsReplica.zone(id, scope: scope, account: account, tx, creating: creating) }
    }

    func begin() { report.withLock { $0 = ListsSyncReport() } }
    func end() -> ListsSyncReport { report.withLock { $0 } }

    // MARK: Batches

    func nextRecordZoneChangeBatch(_ context: LatticeSyncEngine.SendChangesContext,
                                   syncEngine: LatticeSyncEngine) async -> LatticeSyncEngine.RecordZoneChangeBatch? {
        let pending = context.options.zoneIDs.map { zones in
            syncEngine.state.pendingRecordZoneChanges.filter { zones.contains($0.recordID.zoneID) }
        } ?? syncEngine.state.pendingRecordZoneChanges(first: LatticeSyncEngine.RecordZoneChangeBatch.maximumRecords)
        // The batch's records, read in one transaction (a record the file no longer has is left out, and its
        // change dropped). When the file cannot be read, nothing is sent and every change stays queued.
        let scope = syncEngine.database.scope
        guard let records = try? store.transaction({ tx -> [LatticeRecord.ID: LatticeRecord] in
            guard let account = try ListsReplica.storedAccount(tx) else { return [:] }
            var records: [LatticeRecord.ID: LatticeRecord] = [:]
            var zones: [LatticeRecordZone.ID: LocalZone?] = [:]
            for case .saveRecord(let id) in pending.prefix(LatticeSyncEngine.RecordZoneChangeBatch.maximumRecords) {
                if zones[id.zoneID] == nil { zones[id.zoneID] = try ListsReplica.zone(id.zoneID, scope: scope, account: account, tx) }
                guard let zone = zones[id.zoneID] ?? nil, let row = try tx.record(zoneID: zone.id, name: id.recordName) else { continue }
                records[id] = try? LatticeRecord(archive: Data(row.frame))
            }
            return records
        }) else { return nil }
        return await LatticeSyncEngine.RecordZoneChangeBatch(pendingChanges: pending) { id in records[id] }
    }

    // MARK: Events

    func handleEvent(_ event: LatticeSyncEngine.Event, syncEngine: LatticeSyncEngine) async {
        let scope = syncEngine.database.scope
        do {
            if case .stateUpdate(let update) = event {
                let text = try ListsReplica.encode(update.stateSerialization)
                return try store.transaction { tx in try tx.setMetadata(ListsReplica.stateKey(scope), text) }
            }
            guard let account else { return }
            switch event {
            case .fetchedDatabaseChanges(let changes):
                for modification in changes.modifications {
                    _ = try zone(modification.zoneID, scope: scope, account: account, creating: true)
                }
                for deletion in changes.deletions {
                    try removeZone(deletion.zoneID, scope: scope, account: account, engine: syncEngine)
                }
            case .fetchedRecordZoneChanges(let changes):
                try applyFetched(changes, scope: scope, account: account, engine: syncEngine)
            case .willFetchRecordZoneChanges(let zone):
                delivered.withLock { $0["\(scope)/\(zone.zoneID)"] = [] }
            case .didFetchRecordZoneChanges(let done):
                let names = delivered.withLock { $0.removeValue(forKey: "\(scope)/\(done.zoneID)") } ?? []
                if done.deliveredWholeZone {
                    try pruneUndelivered(done.zoneID, keeping: names, scope: scope, account: account, engine: syncEngine)
                }
            case .sentDatabaseChanges(let sent):
                for saved in sent.savedZones {
                    _ = try zone(saved.zoneID, scope: scope, account: account, creating: true)
                }
            case .sentRecordZoneChanges(let sent):
                try applySent(sent, scope: scope, account: account, engine: syncEngine)
            case .didFetchChanges:
                if fetchedSoFar.withLock({ $0 }) > 0 { progress.withLock { $0 }?(nil) }
                fetchedSoFar.withLock { $0 = 0 }
            default:
                break
            }
        } catch {
            // The file could not be written: the engine's state was saved before (or is saved by the caller),
            // so what this event brought is fetched again at the next sync.
            FileHandle.standardError.write(Data("lattice: cannot keep what the sync brought: \(error)\n".utf8))
        }
    }

    private func applyFetched(_ changes: LatticeSyncEngine.Event.FetchedRecordZoneChanges, scope: LatticeDatabase.Scope,
                              account: Account, engine: LatticeSyncEngine) throws {
        guard let zone = try self.zone(changes.zoneID, scope: scope, account: account, creating: true) else { return }
        // The zone's waiting changes by record name.
        var pending: [String: [LatticeSyncEngine.PendingRecordZoneChange]] = [:]
        for change in engine.state.pendingRecordZoneChanges where change.recordID.zoneID == changes.zoneID {
            pending[change.recordID.recordName, default: []].append(change)
        }
        let lost = Dictionary(changes.lostShares.map { ($0.rootRecordID.recordName, $0) }, uniquingKeysWith: { first, _ in first })
        var dropped: [LatticeSyncEngine.PendingRecordZoneChange] = []
        var droppedEdits: [ListsSyncReport.DroppedEdit] = []
        try store.transaction { tx in
            for modification in changes.modifications {
                let name = modification.record.recordID.recordName
                var record = modification.record
                var dirty = false
                if let row = try tx.record(zoneID: zone.id, name: name), row.dirty > 0,
                   let local = try? LatticeRecord(archive: Data(row.frame)), local.hasChanges {
                    record = record.replaying(editsOf: local)
                    dirty = true
                }
                try tx.saveRecord(zoneID: zone.id, name: name, frame: [UInt8](try record.encodeWithEdits()), dirty: false)
                if !dirty { try tx.clearDirty(zoneID: zone.id, name: name) }
            }
            // What leaves the device: the deletions, and for each lost share the records under its root here
            // (one made here and never sent has no deletion from the server) and its share record.
            var leaving: [(name: String, root: String?, leftShare: Bool)] = changes.deletions.map {
                ($0.recordID.recordName, nil, $0.reason == .leftShare)
            }
            if !lost.isEmpty {
                var parents: [String: String] = [:]
                for row in try tx.records(zoneID: zone.id) {
                    if let parent = (try? LatticeRecord(archive: Data(row.frame)))?.parent?.recordID.recordName {
                        parents[row.name] = parent
                    }
                }
                func root(of name: String) -> String? {
                    var current: String? = name
                    for _ in 0..<64 { // parent chains are short; a cycle ends here
                        guard let name = current else { return nil }
                        if lost[name] != nil { return name }
                        current = parents[name]
                    }
                    return nil
                }
                leaving = leaving.map { ($0.name, root(of: $0.name) ?? (lost.count == 1 ? lost.keys.first : nil), $0.leftShare) }
                let named = Set(leaving.map(\.name))
                for name in parents.keys where !named.contains(name) {
                    if let found = root(of: name) { leaving.append((name, found, true)) }
                }
                for share in changes.lostShares where !named.contains(share.shareRecordID.recordName) {
                    leaving.append((share.shareRecordID.recordName, share.rootRecordID.recordName, true))
                }
            }
            for (name, root, leftShare) in leaving {
                try tx.deleteRecord(zoneID: zone.id, name: name)
                for change in pending[name] ?? [] {
                    dropped.append(change)
                    guard leftShare else { continue } // deleted elsewhere: the deletion wins
                    var deleting = false
                    if case .deleteRecord = change { deleting = true }
                    droppedEdits.append(.init(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName,
                                              recordName: name, rootRecordName: root, deletion: deleting))
                }
            }
        }
        if !dropped.isEmpty { engine.state.remove(pendingRecordZoneChanges: dropped) }
        let count = changes.modifications.count
        delivered.withLock { delivered in
            delivered["\(scope)/\(changes.zoneID)"]?.formUnion(changes.modifications.map(\.record.recordID.recordName))
        }
        report.withLock { report in
            report.fetched += count
            report.droppedEdits += droppedEdits
            report.lostShares += changes.lostShares.map {
                .init(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName,
                      rootRecordName: $0.rootRecordID.recordName, shareRecordName: $0.shareRecordID.recordName)
            }
        }
        let total = fetchedSoFar.withLock { total in
            total += count
            return total
        }
        if count > 0 { progress.withLock { $0 }?(total) }
    }

    private func applySent(_ sent: LatticeSyncEngine.Event.SentRecordZoneChanges, scope: LatticeDatabase.Scope,
                           account: Account, engine: LatticeSyncEngine) throws {
        var rejected: [ListsSyncReport.Rejection] = []
        var goneZones: [LatticeRecordZone.ID] = []
        // Records queued again after the batch was asked for keep their edits (their change still waits).
        let waiting = Set(engine.state.pendingRecordZoneChanges.map(\.recordID))
        try store.transaction { tx in
            for record in sent.savedRecords where !waiting.contains(record.recordID) {
                guard let zone = try ListsReplica.zone(record.recordID.zoneID, scope: scope, account: account, tx) else { continue }
                try tx.saveRecord(zoneID: zone.id, name: record.recordID.recordName, frame: [UInt8](try record.encodeWithEdits()),
                                  dirty: false)
                try tx.clearDirty(zoneID: zone.id, name: record.recordID.recordName)
            }
            for id in sent.deletedRecordIDs {
                guard let zone = try ListsReplica.zone(id.zoneID, scope: scope, account: account, tx) else { continue }
                try tx.deleteRecord(zoneID: zone.id, name: id.recordName)
            }
            var failures = sent.failedRecordSaves.map { ($0.record.recordID, $0.error, Optional($0.record)) }
            failures += sent.failedRecordDeletes.map { ($0.key, $0.value, nil) }
            for (id, error, record) in failures {
                guard let zone = try ListsReplica.zone(id.zoneID, scope: scope, account: account, tx) else { continue }
                if error.code == .zoneNotFound || error.serverErrorCode == "ACCESS_DENIED" {
                    if !goneZones.contains(id.zoneID) { goneZones.append(id.zoneID) }
                    continue
                }
                // The device's copy goes back to the state last fetched (a refused deletion: it stays).
                if record != nil, let row = try tx.record(zoneID: zone.id, name: id.recordName),
                   let local = try? LatticeRecord(archive: Data(row.frame)) {
                    if let base = try? LatticeRecord(systemFields: local.encodeSystemFields()) {
                        try tx.saveRecord(zoneID: zone.id, name: id.recordName, frame: [UInt8](try base.encodeWithEdits()), dirty: false)
                        try tx.clearDirty(zoneID: zone.id, name: id.recordName)
                    } else {
                        try tx.deleteRecord(zoneID: zone.id, name: id.recordName) // made here: the server has none
                    }
                }
                rejected.append(.init(zone: id.zoneID.zoneName, recordName: id.recordName,
                                      code: error.serverErrorCode ?? error.code.rawValue, reason: error.reason))
            }
        }
        let saved = sent.savedRecords.count + sent.deletedRecordIDs.count
        report.withLock { report in
            report.sent += saved
            report.rejected += rejected
        }
        for zoneID in goneZones { try removeZone(zoneID, scope: scope, account: account, engine: engine) }
    }

    /// After a fetch that delivered every record of the zone: the records it did not deliver were deleted
    /// on the server while the device could not be told; they go, unless a change of them waits.
    private func pruneUndelivered(_ zoneID: LatticeRecordZone.ID, keeping names: Set<String>, scope: LatticeDatabase.Scope,
                                  account: Account, engine: LatticeSyncEngine) throws {
        let waiting = Set(engine.state.pendingRecordZoneChanges.filter { $0.recordID.zoneID == zoneID }.map(\.recordID.recordName))
        try store.transaction { tx in
            guard let zone = try ListsReplica.zone(zoneID, scope: scope, account: account, tx) else { return }
            for row in try tx.records(zoneID: zone.id) where !names.contains(row.name) && !waiting.contains(row.name) {
                try tx.deleteRecord(zoneID: zone.id, name: row.name)
            }
        }
    }

    /// A zone that went away (deleted by its owner, a zone share that ended): its records and unsent
    /// changes leave the device, reported.
    private func removeZone(_ zoneID: LatticeRecordZone.ID, scope: LatticeDatabase.Scope, account: Account,
                            engine: LatticeSyncEngine) throws {
        let (database, _, owner) = ListsReplica.zoneKey(zoneID, scope: scope, account: account)
        let pending = engine.state.pendingRecordZoneChanges.filter { $0.recordID.zoneID == zoneID }
        let known = try store.transaction { tx -> Bool in
            guard let zone = try ListsReplica.zone(zoneID, scope: scope, account: account, tx) else { return false }
            try tx.deleteZone(zone.id)
            return true
        }
        if !pending.isEmpty { engine.state.remove(pendingRecordZoneChanges: pending) }
        let zoneChanges = engine.state.pendingDatabaseChanges.filter { $0.zoneID == zoneID }
        if !zoneChanges.isEmpty { engine.state.remove(pendingDatabaseChanges: zoneChanges) }
        guard known || !pending.isEmpty else { return }
        report.withLock { report in
            report.removedZones.append(.init(database: database, zone: zoneID.zoneName, owner: owner))
            report.droppedEdits += pending.map { change in
                var deleting = false
                if case .deleteRecord = change { deleting = true }
                return .init(database: database, zone: zoneID.zoneName, owner: owner, recordName: change.recordID.recordName,
                             rootRecordName: nil, deletion: deleting)
            }
        }
    }
}

func plural(_ count: Int, _ word: String) -> String { count == 1 ? word : word + "s" }
