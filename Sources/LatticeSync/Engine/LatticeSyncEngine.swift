import Foundation
import LatticeAPI
import LatticeCore
import Synchronization

/// A sync engine with `CKSyncEngine`'s shape on Lattice's merge: the app keeps its own data, queues what
/// changed (`state.add(pendingRecordZoneChanges:)`), gives records when asked
/// (`nextRecordZoneChangeBatch`), and hears of everything else as events (`handleEvent`). Code written
/// for CKSyncEngine ports by renaming its types (Docs/AppGuide.md).
///
/// What differs is the merge: a record sent carries only its edited keys as CRDT state stamped with the
/// moment the change was queued, and the server joins it with what other devices wrote, so two devices
/// editing one record never get `serverRecordChanged` (unless a batch asks for the strict policy).
///
/// The engine is an actor: its state lives in its own isolation domain, and operations run one at a time
/// in the order they were asked for. Every exchange with the server is bounded in time
/// (`Configuration.requestTimeout`) and honours cancellation (`cancelOperations()`, or the calling task's).
public actor LatticeSyncEngine {
    /// How an engine is made, as `CKSyncEngine.Configuration`.
    public struct Configuration: Sendable {
        /// The private or the shared database (one engine per database, as CKSyncEngine).
        public var database: LatticeDatabase
        /// The signed-in account (from `AccountClient`: sign-up, a token, an OpenID Connect ID token), or
        /// nil when no one is signed in. Its token is used for requests and never saved in the state.
        public var account: Account?
        /// The state saved from the last `stateUpdate` event; nil on first launch.
        public var stateSerialization: State.Serialization?
        /// The app's delegate, held weakly as CKSyncEngine holds it.
        public weak var delegate: (any LatticeSyncEngineDelegate)?
        /// Fetch at start and whenever the server says something changed, send soon after changes are
        /// queued (as CKSyncEngine). Off: the app calls `fetchChanges()` and `sendChanges()`.
        public var automaticallySync = true
        /// Events carry which device and time won each field (`Modification.provenance`).
        public var includesFieldProvenance = false
        /// Seconds an exchange with the server may take before it counts as unreachable.
        public var requestTimeout: Double = 30
        /// How requests reach the server; nil: HTTP to the account's server URL.
        public var transport: (any SyncTransport)?
        /// Told before each pause once a call's retries ("not now", a dropped connection) have waited more
        /// than 2 s in all, so a program can say why it is waiting; nil: the pauses are not told (the
        /// caller hears of a failure through the thrown error).
        public var onRetryWait: (@Sendable (ServerClient.RetryWait) -> Void)?
        /// Physical time in milliseconds since 1970 for the device's clock (injected in tests).
        public var now: @Sendable () -> UInt64 = { UInt64(Date().timeIntervalSince1970 * 1000) }
        /// Where the device keeps asset files (`AssetStore`): assets imported there are uploaded before the
        /// records that name them are sent, and `assetFile` downloads into it. Nil: no assets.
        public var assets: AssetStore?

        public init(database: LatticeDatabase, account: Account?, stateSerialization: State.Serialization?,
                    delegate: any LatticeSyncEngineDelegate) {
            self.database = database
            self.account = account
            self.stateSerialization = stateSerialization
            self.delegate = delegate
        }
    }

    /// The database this engine syncs.
    public nonisolated let database: LatticeDatabase
    /// The pending changes and sync state, as `CKSyncEngine.state`.
    public nonisolated let state: State

    private let configuration: Configuration
    private var account: Account?
    /// The comparison of the configured account with the saved state's, which comes before every other event.
    private var start: Task<Void, Never>?
    private var operationTail: Task<Void, Never>?
    private var operations: [Int: Task<Void, any Error>] = [:]
    private var nextOperation = 0
    private var automatic: Task<Void, Never>?
    private var wake: AsyncStream<Void>.Continuation?
    /// The client of the account's server, kept so its keep-alive connections serve every exchange.
    private var server: (url: String, client: ServerClient)?

    public init(_ configuration: Configuration) {
        database = configuration.database
        state = State(configuration.stateSerialization, now: configuration.now)
        self.configuration = configuration
        account = configuration.account
        // A queued change wakes automatic sync; the app's delegate hears of the new state.
        state.setOnChange { [weak self] in Task { await self?.localChange() } }
        Task { [weak self] in await self?.begin() }
    }

    deinit {
        automatic?.cancel()
        state.setOnChange(nil)
    }

    private func begin() {
        guard configuration.automaticallySync, automatic == nil else { return }
        automatic = Task { [weak self] in
            var failures = 0
            while !Task.isCancelled {
                guard let engine = self else { return }
                failures = await engine.automaticRound(after: failures)
            }
        }
    }

    // MARK: Public operations

    /// Fetches what changed on the server since the saved state: the database's zones, then each changed
    /// zone's records, delivered as events. Throws `LatticeSyncError` (offline: `.networkUnavailable`).
    public func fetchChanges(_ options: FetchChangesOptions = .init()) async throws {
        try await enqueue { engine in try await engine.performFetch(options, reason: .manual) }
    }

    /// Sends the queued changes: zones first, then the batches `nextRecordZoneChangeBatch` gives, until it
    /// gives nil. Throws `LatticeSyncError`; what was not sent stays queued.
    public func sendChanges(_ options: SendChangesOptions = .init()) async throws {
        try await enqueue { engine in try await engine.performSend(options, reason: .manual) }
    }

    /// Cancels the fetches and sends under way or waiting; each throws `.operationCancelled`. What they
    /// did not finish stays queued.
    public func cancelOperations() async {
        let running = Array(operations.values)
        for task in running { task.cancel() }
        for task in running { _ = try? await task.value }
    }

    /// Changes the account (sign-in, sign-out with nil, or another account): as on start, an
    /// `accountChange` event, and the state's tokens and pending changes are dropped when the account is
    /// not the one the state belongs to. A new token of the same account changes nothing else.
    public func setAccount(_ newAccount: Account?) async throws {
        try await enqueue { engine in await engine.installAccount(newAccount) }
    }

    /// Parks until the server says this database changed since the state's token, or `timeoutSeconds`
    /// (1 to 50) pass: what automatic sync does between its rounds, for a program that syncs by hand
    /// (CKSyncEngine has no such call). It does not wait for, or hold up, fetches and sends. Returns
    /// whether something changed; throws `LatticeSyncError` (offline: `.networkUnavailable`).
    public func waitForServerChanges(timeoutSeconds: Int) async throws -> Bool {
        try await Self.waitForServerChanges(of: [self], timeoutSeconds: timeoutSeconds)
    }

    /// The same for several engines of one account (the private and the shared database): one parked
    /// request, sent by the first, that the server answers as soon as any of their databases changes.
    ///
    /// With a server that has push streams (and the engine's own `HTTPTransport`), the wait is on the
    /// account's push stream (`PushListener`: a push token and a database subscription of each database, made
    /// once a process): after one `changes/wait` of 0 s (a change already past the tokens answers at once),
    /// it returns on the first notification. Elsewhere, or while the stream is down, it parks `changes/wait`.
    public static func waitForServerChanges(of engines: [LatticeSyncEngine], timeoutSeconds: Int) async throws -> Bool {
        guard let first = engines.first else { return false }
        let watched = engines.map { engine in
            ChangesWaitRequest.Watched(database: engine.database.scope == .private ? .private : .shared,
                                       syncToken: engine.state.read { $0.databaseToken })
        }
        let seconds = Int64(min(max(timeoutSeconds, 1), 50))
        if let listener = await first.pushListener() {
            if try await first.parkedWait(watched, seconds: 0) { return true }
            if let changed = await listener.wait(seconds: Double(seconds)) { return changed }
        }
        return try await first.parkedWait(watched, seconds: seconds)
    }

    /// The account's push listener, when the engine talks to the server itself (no transport of the app's)
    /// and the server has push streams.
    private func pushListener() async -> PushListener? {
        guard configuration.transport == nil, let account else { return nil }
        guard let client = try? client(account) else { return nil }
        return await PushListener.listener(serverURL: account.serverURL, token: account.token, client: client,
                                           timeout: configuration.requestTimeout)
    }

    private func parkedWait(_ watched: [ChangesWaitRequest.Watched], seconds: Int64) async throws -> Bool {
        await startIfNeeded()
        let request = ChangesWaitRequest(databases: watched, timeoutSeconds: seconds).json
        let scope = scope
        do {
            let reply = try await exchange { client, bearer in
                try await client.call(scope, "changes/wait", request, token: bearer, timeout: TimeInterval(seconds + 10))
            }
            return reply["changed"] == .bool(true)
        } catch {
            throw LatticeSyncError(error)
        }
    }

    // MARK: Operations, one at a time

    private func enqueue(_ body: @escaping @Sendable (LatticeSyncEngine) async throws -> Void) async throws {
        let previous = operationTail
        let id = nextOperation
        nextOperation += 1
        let task = Task<Void, any Error> { [self] in
            await previous?.value
            try Task.checkCancellation()
            await self.startIfNeeded()
            try await body(self)
        }
        operations[id] = task
        operationTail = Task { _ = try? await task.value }
        do {
            try await withTaskCancellationHandler { try await task.value } onCancel: { task.cancel() }
            operations[id] = nil
        } catch {
            operations[id] = nil
            throw LatticeSyncError(error)
        }
    }

    /// The first operation compares the configured account with the saved state's.
    private func startIfNeeded() async {
        if start == nil {
            let account = account
            start = Task { await self.installAccount(account) }
        }
        await start?.value
    }

    private func installAccount(_ newAccount: Account?) async {
        let previous = state.read { ($0.accountServerURL, $0.accountUserRecordName) }
        account = newAccount
        let now = (newAccount?.serverURL, newAccount?.userRecordName)
        guard previous != now else { return }
        let dropped = state.update { stored -> [PendingRecordZoneChange] in
            let hadAccount = stored.accountUserRecordName != nil
            let dropped = hadAccount ? stored.pendingRecords.map(\.change) : []
            if hadAccount { stored.forgetAccountData() }
            stored.accountServerURL = newAccount?.serverURL
            stored.accountUserRecordName = newAccount?.userRecordName
            return dropped
        }
        let change: Event.AccountChange.ChangeType
        switch (previous.1, newAccount?.userRecordName) {
        case (nil, let current?): change = .signIn(currentUser: current)
        case (let old?, nil): change = .signOut(previousUser: old)
        case (let old?, let current?): change = .switchAccounts(previousUser: old, currentUser: current)
        case (nil, nil): return
        }
        await emit(.accountChange(.init(changeType: change, droppedPendingChanges: dropped)))
        await emitStateUpdate()
    }

    // MARK: Events

    private func emit(_ event: Event) async {
        guard let delegate = configuration.delegate else { return }
        await delegate.handleEvent(event, syncEngine: self)
    }

    private func emitStateUpdate() async {
        await emit(.stateUpdate(.init(stateSerialization: state.serialization)))
    }

    private func localChange() async {
        await startIfNeeded()
        await emitStateUpdate()
        wake?.yield()
    }

    // MARK: The server

    private func requireAccount() throws -> Account {
        guard let account else { throw LatticeSyncError(.notAuthenticated, "no account is configured") }
        return account
    }

    private func client(_ account: Account) throws -> ServerClient {
        if let server, server.url == account.serverURL { return server.client }
        let transport = try configuration.transport ?? HTTPTransport(serverURL: account.serverURL)
        var client = ServerClient(transport: transport, container: database.container, environment: database.environment)
        client.onWait = configuration.onRetryWait ?? { _ in }
        server = (account.serverURL, client)
        return client
    }

    private var scope: String { database.scope.rawValue }

    // MARK: Assets

    /// Uploads the assets `record`'s edits set or add that wait for upload in the asset store.
    private func uploadAssets(of record: LatticeRecord, wire: ZoneID) async throws {
        guard let store = configuration.assets else { return }
        var wanted: [(field: String, asset: AssetValue)] = []
        for (edit, _) in record.edits {
            switch edit {
            case let .set(key, .scalar(.asset(asset))?): wanted.append((key, asset))
            case let .set(key, .list(_, elements)?), let .set(key, .set(_, elements)?), let .add(key, elements, _):
                for case .asset(let asset) in elements { wanted.append((key, asset)) }
            default: continue
            }
        }
        for (field, asset) in wanted where store.isPendingUpload(asset) {
            guard let file = store.file(for: asset) else { continue }
            let scope = scope
            _ = try await exchange { client, bearer in
                try await AssetTransfer(client: client).upload(file, asset: asset, database: scope, zone: wire,
                                                               recordName: record.recordID.recordName,
                                                               recordType: record.recordType, fieldName: field, token: bearer)
            }
            store.markUploaded(asset)
        }
    }

    /// The local file of an asset a record holds in `fieldName`: from the asset store when this device has it,
    /// else downloaded now (through a fresh download URL), checked against its SHA-256 and kept in the store,
    /// whose least recently used files go past its size bound.
    public func assetFile(_ asset: AssetValue, recordID: LatticeRecord.ID, fieldName: String) async throws -> URL {
        guard let store = configuration.assets else {
            throw LatticeSyncError(.invalidArguments, "this engine has no asset store (Configuration.assets)")
        }
        if let file = store.file(for: asset) { return file }
        let wire = try wireZone(recordID.zoneID)
        let scope = scope
        let downloaded = try await exchange { client, bearer -> URL in
            let transfer = AssetTransfer(client: client)
            let url = try await transfer.downloadURL(database: scope, zone: wire, recordName: recordID.recordName,
                                                     fieldName: fieldName, asset: asset, token: bearer)
            return try await transfer.download(url)
        }
        return try store.store(downloaded, as: asset)
    }

    /// One call to the server with the account's token, bounded by its timeout (the actor is free while it
    /// waits; operations run one at a time through `enqueue`). Cancelling the task ends it at once: the
    /// transport drops the exchange, and a send not acknowledged stays queued (sending it again is harmless:
    /// the server's join is idempotent and the request carries a client operation id).
    private func exchange<T: Sendable>(_ body: (ServerClient, String) async throws -> T) async throws -> T {
        let account = try requireAccount()
        return try await body(try client(account), account.token)
    }

    private func wireZone(_ zoneID: LatticeRecordZone.ID) throws -> ZoneID {
        let owner = zoneID.ownerName == LatticeRecordZone.ID.currentUserOwnerName
            ? try requireAccount().userRecordName : zoneID.ownerName
        do { return try ZoneID(zoneName: zoneID.zoneName, ownerRecordName: owner) } catch {
            throw LatticeSyncError(.invalidArguments, "zone \(zoneID): \(error)")
        }
    }

    private func appZone(name: String, owner: String) -> LatticeRecordZone.ID {
        LatticeRecordZone.ID(zoneName: name,
                             ownerName: owner == account?.userRecordName ? LatticeRecordZone.ID.currentUserOwnerName : owner)
    }

    // MARK: Fetch

    private func performFetch(_ options: FetchChangesOptions, reason: SyncReason) async throws {
        _ = try requireAccount()
        let context = FetchChangesContext(reason: reason, options: options)
        try await bracketed(.willFetchChanges(.init(context: context)), .didFetchChanges(.init(context: context))) {
            try await fetchDatabase(options)
        }
    }

    /// `will`, the work, then `did`, also when the work fails.
    private func bracketed(_ will: Event, _ did: Event, _ work: () async throws -> Void) async throws {
        await emit(will)
        do { try await work() } catch {
            await emit(did)
            throw error
        }
        await emit(did)
    }

    private func fetchDatabase(_ options: FetchChangesOptions) async throws {
        var token = state.read { $0.databaseToken }
        var changed: [LatticeRecordZone.ID] = []
        var deleted: [LatticeRecordZone.ID] = []
        let scope = scope
        for _ in 0..<10_000 { // pages of zones; bounded
            let request = DatabaseChangesRequest(syncToken: token).json
            let reply: JSON
            do {
                reply = try await exchange { client, bearer in try await client.call(scope, "changes/database", request, token: bearer) }
            } catch let error as ServerError where error.serverErrorCode == .changeTokenExpired {
                token = nil // every zone is looked at again
                changed = []
                deleted = []
                continue
            }
            for zone in reply["zones"]?.arrayValue ?? [] {
                guard let name = zone["zoneID"]?["zoneName"]?.stringValue,
                      let owner = zone["zoneID"]?["ownerRecordName"]?.stringValue else { continue }
                let id = appZone(name: name, owner: owner)
                changed.removeAll { $0 == id }
                deleted.removeAll { $0 == id }
                if zone["deleted"] == .bool(true) { deleted.append(id) } else { changed.append(id) }
            }
            token = reply["syncToken"]?.stringValue
            if reply["moreComing"] != .bool(true) { break }
        }
        if !changed.isEmpty || !deleted.isEmpty {
            state.update { stored in stored.zones.removeAll { deleted.contains($0.zoneID) } }
            await emit(.fetchedDatabaseChanges(.init(
                modifications: changed.map { .init(zoneID: $0) },
                deletions: deleted.map { .init(zoneID: $0, reason: .deleted) })))
            await emitStateUpdate()
        }
        // Zones the state knows but the server's token skipped are not refetched; a zone asked for by name is.
        var zones = changed
        if let wanted = options.zoneIDs {
            zones = zones.filter(wanted.contains)
            for id in wanted where !zones.contains(id) && state.read({ $0.zone(id) }) == nil { zones.append(id) }
        }
        for zone in zones { try await fetchZone(zone) }
        // The database's token moves only after its zones are in, and only for a fetch of every zone.
        if options.zoneIDs == nil {
            state.update { $0.databaseToken = token }
            await emitStateUpdate()
        }
    }

    private func fetchZone(_ zoneID: LatticeRecordZone.ID) async throws {
        await emit(.willFetchRecordZoneChanges(.init(zoneID: zoneID)))
        let whole: Bool
        do {
            whole = try await fetchZonePages(zoneID)
        } catch let error as ServerError where error.serverErrorCode == .zoneNotFound {
            state.update { stored in stored.zones.removeAll { $0.zoneID == zoneID } }
            await emit(.didFetchRecordZoneChanges(.init(zoneID: zoneID, error: LatticeSyncError(error))))
            return
        } catch {
            await emit(.didFetchRecordZoneChanges(.init(zoneID: zoneID, error: LatticeSyncError(error))))
            throw error
        }
        await emit(.didFetchRecordZoneChanges(.init(zoneID: zoneID, error: nil, deliveredWholeZone: whole)))
    }

    /// Returns whether the pages held every record of the zone (they started from no token).
    private func fetchZonePages(_ zoneID: LatticeRecordZone.ID) async throws -> Bool {
        let wire = try wireZone(zoneID)
        var entry = state.read { $0.zone(zoneID) } ?? ZoneEntry(zoneID: zoneID)
        var whole = entry.token == nil && entry.known.isEmpty // own writes it was told of are left out
        let scope = scope
        for _ in 0..<1_000_000 { // pages; bounded
            let request = DeltaPullRequest(zoneID: WireZoneID(zoneName: wire.zoneName, ownerRecordName: wire.ownerRecordName),
                                           syncToken: entry.token,
                                           known: entry.known.compactMap { $0.count == 2 ? $0[0]...$0[1] : nil },
                                           shares: true).json
            let timeout = configuration.requestTimeout
            let pull: SyncMessage.Pull
            let frames: [RecordFrame]
            let maximumHLC: HLC
            do {
                let response = try await exchange { client, bearer in
                    try await client.callRaw(scope, "deltas/pull", request, token: bearer, timeout: timeout)
                }
                pull = try SyncMessage.Pull(decoding: response.body)
                let delta = try EncodedDelta(validating: pull.delta)
                guard delta.zoneID == wire else { throw LatticeSyncError(.serverRejectedRequest, "deltas/pull answered another zone") }
                frames = delta.recordFrames()
                maximumHLC = delta.maximumHLC
            } catch let error as ServerError where error.serverErrorCode == .changeTokenExpired {
                entry.token = nil
                entry.known = []
                whole = true
                continue
            } catch let error as CodecError {
                throw LatticeSyncError(.serverRejectedRequest, "deltas/pull: \(error.description)")
            }
            state.update { stored in
                var clock = stored.clock(configuration.now)
                try? clock.observe(maximumHLC)
                stored.clockLatest = clock.latest.rawValue
            }
            var modifications: [Event.FetchedRecordZoneChanges.Modification] = []
            var deletions: [Event.FetchedRecordZoneChanges.Deletion] = []
            var shares: [String: String] = [:]
            for root in pull.sharedRoots { shares[root.rootRecordName] = root.shareRecordName }
            for frame in frames {
                let id = LatticeRecord.ID(recordName: frame.recordName, zoneID: zoneID)
                if frame.isDeleted {
                    deletions.append(.init(recordID: id, recordType: frame.recordType, reason: .deleted))
                    continue
                }
                // Validated with the delta; decoded when the app first reads it.
                var record = LatticeRecord(frame: frame, recordID: id)
                record.share = shares[frame.recordName].map { .init(recordID: .init(recordName: $0, zoneID: zoneID)) }
                var provenance: [String: FieldProvenance] = [:]
                if configuration.includesFieldProvenance, let decoded = record.base {
                    for field in decoded.fields { provenance[field.name] = decoded.provenance(of: field.name) }
                }
                modifications.append(.init(record: record, provenance: provenance))
            }
            for name in pull.removed {
                deletions.append(.init(recordID: .init(recordName: name, zoneID: zoneID), recordType: nil, reason: .leftShare))
            }
            let lost = pull.lostShares.map {
                Event.FetchedRecordZoneChanges.LostShare(rootRecordID: .init(recordName: $0.rootRecordName, zoneID: zoneID),
                                                         shareRecordID: .init(recordName: $0.shareRecordName, zoneID: zoneID))
            }
            if !modifications.isEmpty || !deletions.isEmpty || !lost.isEmpty {
                await emit(.fetchedRecordZoneChanges(.init(zoneID: zoneID, modifications: modifications, deletions: deletions,
                                                           lostShares: lost)))
            }
            entry.token = pull.syncToken
            if !pull.moreComing { entry.known = [] }
            let saved = entry
            state.update { $0.setZone(saved) }
            await emitStateUpdate()
            if !pull.moreComing { return whole }
        }
        return false
    }

    // MARK: Send

    private func performSend(_ options: SendChangesOptions, reason: SyncReason) async throws {
        _ = try requireAccount()
        let context = SendChangesContext(reason: reason, options: options)
        try await bracketed(.willSendChanges(.init(context: context)), .didSendChanges(.init(context: context))) {
            try await sendZones(options)
            try await sendBatches(context)
        }
        // The server tells no device of its own changes: other engines of this account in this process (the
        // same device to the server) hear of it here.
        if let account { PushListener.noteLocalChange(serverURL: account.serverURL, token: account.token) }
    }

    private func sendZones(_ options: SendChangesOptions) async throws {
        let pending = state.pendingDatabaseChanges.filter { options.zoneIDs?.contains($0.zoneID) ?? true }
        guard !pending.isEmpty else { return }
        let operations = try pending.map { change -> ZoneOperation in
            let wire = try wireZone(change.zoneID)
            let zone = WireZoneID(zoneName: wire.zoneName, ownerRecordName: database.scope == .shared ? wire.ownerRecordName : nil)
            switch change {
            case .saveZone: return ZoneOperation(.create, zone)
            case .deleteZone: return ZoneOperation(.delete, zone)
            }
        }
        let request = ZonesModifyRequest(operations: operations).json
        let scope = scope
        let reply = try await exchange { client, bearer in try await client.call(scope, "zones/modify", request, token: bearer) }
        let items = reply["zones"]?.arrayValue ?? []
        var saved: [LatticeRecordZone] = []
        var failedSaves: [Event.SentDatabaseChanges.FailedZoneSave] = []
        var deleted: [LatticeRecordZone.ID] = []
        var failedDeletes: [LatticeRecordZone.ID: LatticeSyncError] = [:]
        for (index, change) in pending.enumerated() {
            let item = index < items.count ? items[index] : .null
            let code = item["serverErrorCode"]?.stringValue
            // A zone that exists already is saved; one that is gone already is deleted.
            let error = code.flatMap { code -> LatticeSyncError? in
                if case .saveZone = change, code == ServerErrorCode.exists.rawValue { return nil }
                if case .deleteZone = change, code == ServerErrorCode.zoneNotFound.rawValue { return nil }
                return LatticeSyncError(server: code, reason: item["reason"]?.stringValue ?? code)
            } ?? (item == .null ? LatticeSyncError(.serverRejectedRequest, "no answer for this zone") : nil)
            switch (change, error) {
            case (.saveZone(let zone), nil): saved.append(zone)
            case (.saveZone(let zone), let error?): failedSaves.append(.init(zone: zone, error: error))
            case (.deleteZone(let id), nil): deleted.append(id)
            case (.deleteZone(let id), let error?): failedDeletes[id] = error
            }
        }
        state.update { stored in
            stored.pendingZones.removeAll(where: pending.contains)
            stored.zones.removeAll { deleted.contains($0.zoneID) }
            stored.pendingRecords.removeAll { deleted.contains($0.change.recordID.zoneID) }
        }
        await emit(.sentDatabaseChanges(.init(savedZones: saved, failedZoneSaves: failedSaves, deletedZoneIDs: deleted,
                                              failedZoneDeletes: failedDeletes)))
        await emitStateUpdate()
    }

    private func sendBatches(_ context: SendChangesContext) async throws {
        // Bounded: a delegate that keeps giving batches stops after as many as there were changes, plus one.
        let limit = state.read { $0.pendingRecords.count } + 1
        for _ in 0..<limit {
            try Task.checkCancellation()
            // The edits queued before the batch is asked for are the ones it can cover.
            let covering = state.read { $0.nextEdit }
            guard let delegate = configuration.delegate,
                  let batch = await delegate.nextRecordZoneChangeBatch(context, syncEngine: self) else { return }
            if batch.recordsToSave.isEmpty && batch.recordIDsToDelete.isEmpty && batch.withoutRecord.isEmpty { return }
            let inBatch = Set(batch.recordsToSave.map(\.recordID)).union(batch.recordIDsToDelete).union(batch.withoutRecord)
            let entries = state.read { $0.pendingEntries(inBatch) }
            let sent = try await send(batch, entries: entries, covering: covering)
            state.update { stored in
                var settled = Set(sent.savedRecords.map(\.recordID)).union(sent.deletedRecordIDs)
                settled.formUnion(sent.failedRecordSaves.map(\.record.recordID))
                settled.formUnion(sent.failedRecordDeletes.keys)
                settled.formUnion(batch.withoutRecord)
                // A change queued again after the batch was asked for stays: the batch did not cover that edit.
                stored.removePending(settled, editsUpTo: covering)
            }
            await emit(.sentRecordZoneChanges(sent))
            await emitStateUpdate()
        }
    }

    /// One batch: per zone, the saves (one push), then the deletions (one `records/modify`).
    private func send(_ batch: RecordZoneChangeBatch, entries: [LatticeRecord.ID: PendingEntry], covering: UInt64) async throws
        -> Event.SentRecordZoneChanges {
        var saved: [LatticeRecord] = []
        var failedSaves: [Event.SentRecordZoneChanges.FailedRecordSave] = []
        var deleted: [LatticeRecord.ID] = []
        var failedDeletes: [LatticeRecord.ID: LatticeSyncError] = [:]
        var covered: [LatticeRecord.ID: UInt64] = [:]
        // The last record given for a name counts.
        var saves: [LatticeRecord.ID: LatticeRecord] = [:]
        var order: [LatticeRecord.ID] = []
        for record in batch.recordsToSave {
            if saves.updateValue(record, forKey: record.recordID) == nil { order.append(record.recordID) }
        }
        let zones = Set(order.map(\.zoneID)).union(batch.recordIDsToDelete.map(\.zoneID))
        for zone in zones.sorted(by: { ($0.ownerName, $0.zoneName) < ($1.ownerName, $1.zoneName) }) {
            let records = order.filter { $0.zoneID == zone }.compactMap { saves[$0] }
            if !records.isEmpty {
                let outcome = try await save(records, in: zone, batch: batch, entries: entries)
                saved += outcome.saved
                failedSaves += outcome.failed
            }
            let deletions = batch.recordIDsToDelete.filter { $0.zoneID == zone }
            if !deletions.isEmpty {
                let outcome = try await delete(deletions, in: zone, atomic: batch.atomicByZone)
                deleted += outcome.deleted
                failedDeletes.merge(outcome.failed) { $1 }
            }
        }
        // Every edit of these records numbered up to `covering` went with the batch.
        for id in saved.map(\.recordID) + deleted { if let entry = entries[id] { covered[id] = min(entry.edit, covering) } }
        return .init(batchID: batch.batchID, savedRecords: saved, failedRecordSaves: failedSaves, deletedRecordIDs: deleted,
                     failedRecordDeletes: failedDeletes, coveredEdits: covered)
    }

    /// An edit made into its stamped partial state (`RecordEdit`), and the record it makes.
    private struct PreparedSave {
        var record: LatticeRecord
        var partial: RecordFrame?
        var result: RecordFrame
    }

    private func prepare(_ record: LatticeRecord, wire: ZoneID, entries: [LatticeRecord.ID: PendingEntry]) throws
        -> PreparedSave {
        // Each edit counts from the first time the change was queued after it was made (from the last time,
        // for edits made in another run or after the change was last queued); each operation gets its own
        // stamp, increasing.
        let replica = state.replicaID
        let marks = entries[record.recordID]?.marks ?? []
        let fresh: UInt64? = marks.isEmpty ? state.update { stored in
            var clock = stored.clock(configuration.now)
            let stamp = clock.now()
            stored.clockLatest = clock.latest.rawValue
            return stamp.hlc.rawValue
        } : nil
        var previous: UInt64 = 0
        func stamp(_ moment: EditMoment?) -> Stamp {
            let queued = moment.flatMap { moment in
                marks.first { $0.moment.process == moment.process && $0.moment.sequence > moment.sequence }?.stamp
            }
            let chosen = max(queued ?? marks.last?.stamp ?? fresh ?? 0, previous &+ 1)
            previous = chosen
            return Stamp(hlc: HLC(rawValue: chosen), replica: replica)
        }
        do {
            let id = try RecordID(recordName: record.recordID.recordName, zoneID: wire)
            // The edits are made into the state they were made over (for a record rebased on a fetch since,
            // an older one), then joined with the newest.
            let baseFrame = record.baseFrame
            let editFrame = record.editBaseFrame
            var edit = try editFrame.flatMap { $0.isDeleted ? nil : try RecordEdit(editing: $0) }
                ?? RecordEdit(creating: id, recordType: record.recordType, over: editFrame, at: stamp(record.edits.first?.moment))
            for (change, moment) in record.edits {
                switch change {
                case let .set(key, nil): try edit.clear(key, at: stamp(moment))
                case let .set(key, .scalar(value)?): try edit.set(key, to: value, at: stamp(moment))
                case let .set(key, .list(_, elements)?): try edit.setList(key, to: elements, at: stamp(moment))
                case let .set(key, .set(_, elements)?): try edit.setSet(key, to: elements, at: stamp(moment))
                case let .set(key, .text(text)?): try edit.setText(key, to: text, at: stamp(moment))
                case let .add(key, elements, asSet):
                    try edit.addElements(elements, to: key, creatingSet: asSet, at: stamp(moment))
                case let .remove(key, elements): try edit.removeElements(elements, from: key, at: stamp(moment))
                case let .splice(key, position, deleted, .text(inserted)):
                    try edit.spliceText(key, at: position, deleting: deleted, inserting: inserted, at: stamp(moment))
                case let .splice(key, position, deleted, inserted):
                    let elements: [ScalarValue]
                    if case .list(_, let list) = inserted { elements = list } else { elements = [] }
                    try edit.splice(key, at: position, deleting: deleted, inserting: elements, at: stamp(moment))
                case let .parent(reference):
                    let parent = try reference.map {
                        try Reference(recordName: $0.recordID.recordName, action: $0.action == .deleteSelf ? .deleteSelf : .none)
                    }
                    try edit.setParent(parent, at: stamp(moment))
                }
            }
            // Later stamps of this device come after these.
            state.update { stored in
                var clock = stored.clock(configuration.now)
                try? clock.observe(HLC(rawValue: previous))
                stored.clockLatest = clock.latest.rawValue
            }
            // The partial state is encoded once and joined with the state it was made over (`applied()`
            // would encode it again).
            let partial = try edit.frame()
            var joined = partial.map { RecordFrame.join(editFrame, $0) ?? editFrame ?? $0 } ?? editFrame
            if let joined, joined.exceedsWriteLimit {
                throw LatticeSyncError(.limitExceeded, "record \(record.recordID) would encode to \(joined.encodedSize) bytes; "
                                       + "the limit is \(Record.maximumEncodedSize) bytes")
            }
            if record.editBase != nil, let baseFrame {
                joined = joined.map { RecordFrame.join(baseFrame, $0) ?? baseFrame } ?? baseFrame
            }
            guard let joined else { throw LatticeSyncError(.invalidArguments, "record \(record.recordID) has nothing to save") }
            return PreparedSave(record: record, partial: partial, result: joined)
        } catch let error as LatticeSyncError {
            throw error
        } catch {
            throw LatticeSyncError(.invalidArguments, "record \(record.recordID): \(error)")
        }
    }

    private func save(_ records: [LatticeRecord], in zone: LatticeRecordZone.ID, batch: RecordZoneChangeBatch,
                      entries: [LatticeRecord.ID: PendingEntry]) async throws
        -> (saved: [LatticeRecord], failed: [Event.SentRecordZoneChanges.FailedRecordSave]) {
        let wire = try wireZone(zone)
        var failed: [Event.SentRecordZoneChanges.FailedRecordSave] = []
        var prepared: [PreparedSave] = []
        for record in records {
            do { prepared.append(try prepare(record, wire: wire, entries: entries)) } catch {
                failed.append(.init(record: record, error: LatticeSyncError(error)))
            }
        }
        // Assets first: each asset a record's edits name that this device imported and has not uploaded goes up
        // before the record (the server takes an asset in a record only from whoever uploaded it).
        var uploadFailures: Set<LatticeRecord.ID> = []
        for item in prepared where item.partial != nil {
            do {
                try await uploadAssets(of: item.record, wire: wire)
            } catch {
                failed.append(.init(record: item.record, error: LatticeSyncError(error)))
                uploadFailures.insert(item.record.recordID)
            }
        }
        prepared.removeAll { uploadFailures.contains($0.record.recordID) }
        let sending = prepared.filter { $0.partial != nil }
        var items: [String: JSON] = [:]
        if !sending.isEmpty {
            do {
                items = try await push(sending, wire: wire, batch: batch)
            } catch let error as ServerError where error.refusesTheWholeRequest {
                // The whole request was refused (the zone is gone, no permission): every record fails with it.
                let refusal = LatticeSyncError(error)
                return ([], failed + prepared.map { .init(record: $0.record, error: refusal) })
            }
        }
        // Records the server now holds exactly as sent (new ones, mostly) need not come back in a pull.
        let upToDate = sending.compactMap { save -> Int64? in
            let answer = items[save.record.recordID.recordName]
            return answer?["upToDate"] == .bool(true) ? answer?["position"]?.intValue : nil
        }
        if !upToDate.isEmpty {
            state.update { stored in
                var entry = stored.zone(zone) ?? ZoneEntry(zoneID: zone)
                entry.known = SyncEngine.addingKnown(upToDate, to: entry.known)
                stored.setZone(entry)
            }
        }
        var saved: [LatticeRecord] = []
        for item in prepared {
            let name = item.record.recordID.recordName
            let answer = items[name]
            if item.partial != nil, let code = answer?["serverErrorCode"]?.stringValue {
                var error = LatticeSyncError(server: code, reason: answer?["reason"]?.stringValue ?? code)
                if batch.savePolicy == .ifServerRecordUnchanged && code == ServerErrorCode.exists.rawValue {
                    error = LatticeSyncError(.serverRecordChanged, error.reason, serverErrorCode: code)
                }
                failed.append(.init(record: item.record, error: error))
            } else if item.partial != nil && answer == nil {
                failed.append(.init(record: item.record, error: LatticeSyncError(.serverRejectedRequest, "no answer for \(name)")))
            } else {
                var record = LatticeRecord(frame: item.result, recordID: item.record.recordID,
                                           changeTag: answer?["recordChangeTag"]?.stringValue ?? item.record.recordChangeTag)
                record.share = item.record.share // saving a record does not change its share
                saved.append(record)
            }
        }
        return (saved, failed)
    }

    /// Sends partial states: `deltas/push` for the merge policy, `records/modify` (`update` with the change
    /// tag, `create` for a new record) for the strict one. Answers by record name. A batch the server finds
    /// too large is split in two.
    private func push(_ saves: [PreparedSave], wire: ZoneID, batch: RecordZoneChangeBatch) async throws -> [String: JSON] {
        let scope = scope
        let timeout = configuration.requestTimeout
        let items: [JSON]
        do {
            if batch.savePolicy == .changedKeys {
                let message = SyncMessage.Push(clientOperationID: UUID().uuidString, atomic: batch.atomicByZone,
                                               delta: BinaryCodec.encodeDelta(zoneID: wire, frames: saves.compactMap(\.partial)))
                let body = message.encoded()
                let response = try await exchange { client, bearer in
                    try await client.callBinary(scope, "deltas/push", body: body, contentType: SyncMessage.contentType, token: bearer,
                                          timeout: timeout)
                }
                guard let read = BatchAnswerItems.read(response.body) else {
                    throw LatticeSyncError(.serverRejectedRequest, "the answer to deltas/push was not understood")
                }
                items = read
            } else {
                let operations: [JSON] = try saves.map { save in
                    guard case .object(var record) = try save.partial!.decoded().cloudKitJSON else { return .null }
                    let strictUpdate = save.record.baseFrame != nil
                    if strictUpdate { record["recordChangeTag"] = save.record.recordChangeTag.map(JSON.string) ?? .string("") }
                    return .object(["operationType": .string(strictUpdate ? "update" : "create"), "record": .object(record)])
                }
                let request: JSON = .object(["operations": .array(operations), "zoneID": wire.cloudKitJSON,
                                             "atomic": .bool(batch.atomicByZone), "desiredKeys": .array([]),
                                             "clientOperationID": .string(UUID().uuidString)])
                let reply = try await exchange { client, bearer in
                    try await client.call(scope, "records/modify", request, token: bearer, timeout: timeout)
                }
                items = reply["records"]?.arrayValue ?? []
            }
        } catch let error as ServerError where error.serverErrorCode == .limitExceeded && saves.count > 1 {
            let half = saves.count / 2
            let first = try await push(Array(saves[..<half]), wire: wire, batch: batch)
            let second = try await push(Array(saves[half...]), wire: wire, batch: batch)
            return first.merging(second) { $1 }
        }
        var byName: [String: JSON] = [:]
        for item in items { if let name = item["recordName"]?.stringValue { byName[name] = item } }
        return byName
    }

    private func delete(_ ids: [LatticeRecord.ID], in zone: LatticeRecordZone.ID, atomic: Bool) async throws
        -> (deleted: [LatticeRecord.ID], failed: [LatticeRecord.ID: LatticeSyncError]) {
        let wire = try wireZone(zone)
        let operations: [JSON] = ids.map {
            .object(["operationType": .string("forceDelete"), "record": .object(["recordName": .string($0.recordName)])])
        }
        let request: JSON = .object(["operations": .array(operations), "zoneID": wire.cloudKitJSON, "atomic": .bool(atomic),
                                     "clientOperationID": .string(UUID().uuidString)])
        let scope = scope
        let reply: JSON
        do {
            reply = try await exchange { client, bearer in try await client.call(scope, "records/modify", request, token: bearer) }
        } catch let error as ServerError where error.refusesTheWholeRequest {
            let refusal = LatticeSyncError(error)
            return ([], Dictionary(ids.map { ($0, refusal) }, uniquingKeysWith: { $1 }))
        }
        let items = reply["records"]?.arrayValue ?? []
        var deleted: [LatticeRecord.ID] = []
        var failed: [LatticeRecord.ID: LatticeSyncError] = [:]
        for (index, id) in ids.enumerated() {
            let item = index < items.count ? items[index] : .null
            // A record that is not there is deleted as far as this device is concerned.
            if let code = item["serverErrorCode"]?.stringValue, code != ServerErrorCode.notFound.rawValue {
                failed[id] = LatticeSyncError(server: code, reason: item["reason"]?.stringValue ?? code)
            } else if item == .null {
                failed[id] = LatticeSyncError(.serverRejectedRequest, "no answer for \(id.recordName)")
            } else {
                deleted.append(id)
            }
        }
        return (deleted, failed)
    }

    // MARK: Automatic sync

    /// One round: fetch, send what waits, then wait for the server to say something changed (the account's
    /// push stream, else a parked `changes/wait`, at most 50 s), for a change queued here, or, after failures,
    /// for a backoff.
    private func automaticRound(after failures: Int) async -> Int {
        var failures = failures
        do {
            try await enqueue { engine in try await engine.performFetch(.init(), reason: .scheduled) }
            if !state.read({ $0.pendingRecords.isEmpty && $0.pendingZones.isEmpty }) {
                try await enqueue { engine in try await engine.performSend(.init(), reason: .scheduled) }
            }
            failures = 0
        } catch {
            failures += 1
            if Task.isCancelled { return failures }
        }
        let (stream, continuation) = AsyncStream<Void>.makeStream(bufferingPolicy: .bufferingNewest(1))
        wake = continuation
        let pendingNow = !state.read { $0.pendingRecords.isEmpty && $0.pendingZones.isEmpty }
        if pendingNow && failures == 0 { return failures } // queued while this round ran
        let backoff = failures == 0 ? nil : min(60.0, pow(2.0, Double(failures)))
        let poll: (@Sendable () async throws -> Void)? = account == nil ? nil : { @Sendable [weak self] in
            _ = try await self?.waitForServerChanges(timeoutSeconds: 50)
        }
        await withTaskGroup(of: Void.self) { group in
            group.addTask { for await _ in stream { return } }
            group.addTask {
                if let backoff { try? await Task.sleep(for: .seconds(backoff)) } else if let poll {
                    do { try await poll() } catch { try? await Task.sleep(for: .seconds(5)) }
                } else {
                    try? await Task.sleep(for: .seconds(50))
                }
            }
            await group.next()
            group.cancelAll()
        }
        wake = nil
        return failures
    }
}

extension ServerError {
    /// A refusal of a whole batch request that every record of it shares (the zone is gone, no permission),
    /// as opposed to "not now", a lost token or an answer in no known code, which end the send.
    var refusesTheWholeRequest: Bool {
        !isNotNow && serverErrorCode != nil && serverErrorCode != .authenticationFailed
    }
}

/// Runs async work (an engine's `fetchChanges()`, `sendChanges()`, ...) to its end from a program that
/// blocks: a command-line tool's main thread, a thread of its own. The caller's thread waits while the work
/// runs on Swift's shared threads, so it must never be one of those (from async code, `await` instead):
/// on a two-core machine two such waits would leave the work no thread to run on.
public func waitForAsyncWork<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) throws -> T {
    let result = Mutex<Result<T, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    Task {
        do {
            let value = try await body()
            result.withLock { $0 = .success(value) }
        } catch {
            result.withLock { $0 = .failure(error) }
        }
        done.signal()
    }
    done.wait()
    return try result.withLock { $0! }.get()
}
