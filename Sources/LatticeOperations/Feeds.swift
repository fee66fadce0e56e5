import Foundation
import LatticeAPI
import LatticeCore

import LatticeSharing
import LatticeStore

/// Feeds: `changes/database` and `changes/zone` (a zone's log, or for a participant of hierarchy shares
/// the shares' own logs), the page `deltas/pull` answers in binary, and what `changes/wait` watches (the
/// server parks the request; the operation says which positions to wait past).
public struct Feeds: Sendable, OperationArea {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// `changes/database {"syncToken"?, "resultsLimit"?}`: the zones changed (or deleted) since the token.
    public func databaseChanges(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        guard caller.database != .public else {
            throw ServiceError.badRequest("the public database has no change feed (as in CloudKit)")
        }
        let request = try DatabaseChangesRequest(json: .object(body), limits: requestLimits)
        let limit = request.effectiveLimit(requestLimits)
        let token = try request.syncToken.map { try SyncToken(text: $0, expected: .database) }
        if caller.database == .shared { return try sharedDatabaseChanges(caller, token: token, limit: limit) }
        return try storage.read(deadline: caller.deadline) { tx in
            let database = try tx.database(caller.databaseKey)
            let cursor = try databaseCursor(token, database)
            let changes = try tx.zoneChanges(databaseID: database.id, after: cursor, limit: limit)
            let moreComing = changes.count == limit && changes.last.map { $0.databaseSeq < database.lastSeq } == true
            let position = moreComing ? changes.last!.databaseSeq : database.lastSeq
            // A zone deleted and recreated inside one page is reported once, as it is now.
            var latest: [String: StoredZone] = [:]
            for zone in changes where latest[zone.name].map({ $0.deleted || !zone.deleted }) ?? true {
                latest[zone.name] = zone
            }
            let zones: [JSON] = latest.values.sorted { $0.databaseSeq < $1.databaseSeq }.map { zone in
                var object: [String: JSON] = [
                    "zoneID": .object(["zoneName": .string(zone.name), "ownerRecordName": .string(zone.ownerRecordName)]),
                ]
                if zone.deleted { object["deleted"] = .bool(true) }
                return .object(object)
            }
            return .object([
                "zones": .array(zones),
                "syncToken": .string(SyncToken(log: .database, owner: database.id, position: position).text),
                "moreComing": .bool(moreComing),
            ])
        }
    }

    /// Checks a database token against the database; returns the position to read after.
    private func databaseCursor(_ token: SyncToken?, _ database: StoredDatabase) throws -> Int64 {
        guard let token else { return 0 }
        if token.owner == 0 && token.position == 0 { return 0 } // issued before the database existed
        guard token.owner == database.id else {
            throw ServiceError(.changeTokenExpired, "the sync token belongs to another database; fetch again without one")
        }
        guard token.position <= database.lastSeq else { throw ServiceError.badRequest("the sync token is from the future") }
        guard token.position >= database.purgedSeq else {
            throw ServiceError(.changeTokenExpired, "the sync token is older than the tombstone horizon; fetch again without one")
        }
        return token.position
    }

    /// `changes/zone {"zones": [{"zoneID", "syncToken"?, "resultsLimit"?}]}`: each zone's records changed
    /// since its token, in commit order, deletions included, with `moreComing` while more are left.
    ///
    /// A zone named twice is refused (BAD_REQUEST naming it). The records of all zones together stop at
    /// `maximumResponseBytes`: a zone cut there, and every zone after it, says `moreComing` with a token that
    /// resumes exactly after its last record answered.
    public func zoneChanges(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        guard caller.database != .public else {
            throw ServiceError.badRequest("the public database has no change feed (as in CloudKit)")
        }
        let request = try ZoneChangesRequest(json: .object(body), limits: requestLimits)
        let items = body["zones"]?.arrayValue ?? []
        try zones.refuseDuplicateZones(items.map { $0["zoneID"] }, caller, path: { "zones[\($0)].zoneID" })
        return try storage.read(deadline: caller.deadline) { tx in
            var results: [JSON] = []
            var budget = ResponseBudget(limit: configuration.maximumResponseBytes)
            for (index, (item, decoded)) in zip(items, request.zones).enumerated() {
                let zoneName = item["zoneID"]?["zoneName"]?.stringValue ?? ""
                // The zone id as the server read it, echoed in an error item; nil when it is ill-formed.
                let zoneID = try? zones.parseZoneID(item["zoneID"], caller, path: "zones[\(index)].zoneID")
                do {
                    let page = try decoded.get()
                    var rendered: [JSON] = []
                    let pageZone = try zones.zoneID(page.zoneID, caller)
                    var shareNames: [String: String]? // read with the first record
                    var zoneRow: Int64? // read with the first record that holds an asset
                    let links = AssetLinks(reader: caller.user) {
                        if let zoneRow { return zoneRow }
                        let row = try zones.resolveZone(pageZone, caller, tx).existingZone().rowID
                        zoneRow = row
                        return row
                    }
                    let feed = try zoneFeedPage(syncToken: page.syncToken, resultsLimit: page.resultsLimit,
                                                zoneID: pageZone, caller, tx) { stored in
                        try caller.deadline.check()
                        if shareNames == nil { shareNames = try shares.shareRecordNamesByRoot(in: pageZone, caller, tx) }
                        let json = try recordJSON(stored, try decode(stored), desiredKeys: nil,
                                                  share: shareNames?[stored.recordName], links: links)
                        guard budget.admit(json) else { return false }
                        rendered.append(json)
                        return true
                    }
                    results.append(pageJSON(feed, rendered: rendered))
                } catch let error as ServiceError {
                    var answer = error.json(item: (key: "zoneName", value: zoneName))
                    if case .object(var object) = answer, let zoneID {
                        object["zoneID"] = zoneID.cloudKitJSON
                        answer = .object(object)
                    }
                    results.append(answer)
                }
            }
            return .object(["zones": .array(results)])
        }
    }

    func zoneCursor(_ token: SyncToken?, _ zone: StoredZone) throws -> Int64 {
        guard let token else { return 0 }
        if token.owner == 0 && token.position == 0 { return 0 } // issued before the zone was first written
        guard token.owner == zone.rowID else {
            throw ServiceError(.changeTokenExpired, "the zone was deleted and recreated since this sync token; fetch it "
                           + "again without a token")
        }
        guard token.position <= zone.lastSeq else { throw ServiceError.badRequest("the sync token is from the future") }
        guard token.position >= zone.purgedSeq else {
            throw ServiceError(.changeTokenExpired, "the sync token is older than the tombstone horizon; fetch the zone "
                           + "again without a token")
        }
        return token.position
    }

    /// `changes/wait {"syncToken"?, "timeout"?}` or `{"databases": [{"database", "syncToken"?}], "timeout"?}`:
    /// what a long poll watches. Each database's position to wait past (its `changes/database` token's, or
    /// without one its position now; the databases are created if missing, so their ids can be watched), and
    /// the timeout, at most `maximumWaitSeconds`. The server parks the request (`LatticeService.waitForChanges`).
    public func planWait(_ caller: Caller, _ body: [String: JSON]) throws -> WaitPlan {
        guard caller.database != .public else {
            throw ServiceError.badRequest("changes/wait watches the private or the shared database; the public one has no feed")
        }
        let request = try ChangesWaitRequest(json: .object(body))
        let timeout = request.timeoutSeconds.map { Int(min($0, Int64(configuration.maximumWaitSeconds))) }
            ?? configuration.defaultWaitSeconds
        // The databases to watch: the request's own with `syncToken`, or several with `databases`, so a device
        // waits on all of them with one parked request.
        let watched: [(kind: DatabaseKind, token: SyncToken?)] = try (request.databases.map { list in
            list.map { ($0.database, $0.syncToken) }
        } ?? [(caller.database, request.syncToken)]).map { kind, text in
            (kind, try text.map { try SyncToken(text: $0, expected: .database) })
        }
        // The databases must exist so their ids can be watched; reading them inside a write creates them.
        // The request's deadline covers this work, not the parking (the waiter's own timeout bounds that).
        let databases = try core.write(deadline: caller.deadline) { tx, _ in
            try watched.map { try tx.database(DatabaseKey(kind: $0.kind, environment: caller.environment,
                                                          ownerID: caller.user.id)) }
        }
        var cursors: [Int64: Int64] = [:]
        for (database, item) in zip(databases, watched) {
            cursors[database.id] = try item.token.map { try databaseCursor($0, database) } ?? database.lastSeq
        }
        return WaitPlan(timeoutSeconds: timeout, cursors: cursors,
                        behind: databases.contains { $0.lastSeq > cursors[$0.id]! })
    }

    /// Whether any watched database's log moved past its cursor (read again after the waiter is registered,
    /// so a commit that landed before the registration is seen).
    public func moved(_ plan: WaitPlan, deadline: RequestDeadline?) throws -> Bool {
        let now = try storage.read(deadline: deadline) { tx in try plan.cursors.keys.compactMap { try tx.database(id: $0) } }
        return now.contains { $0.lastSeq > plan.cursors[$0.id]! }
    }

    /// `changes/database` in the shared database: the caller's log of shared zones. A zone whose every
    /// share the caller lost (removed, left, share deleted) is reported deleted.
    private func sharedDatabaseChanges(_ caller: Caller, token: SyncToken?, limit: Int) throws -> JSON {
        try storage.read(deadline: caller.deadline) { tx in
            let database = try tx.database(caller.databaseKey)
            let cursor = try databaseCursor(token, database)
            let entries = try tx.sharedZoneChanges(databaseID: database.id, after: cursor, limit: limit)
            let moreComing = entries.count == limit && entries.last.map { $0.databaseSeq < database.lastSeq } == true
            let position = moreComing ? entries.last!.databaseSeq : database.lastSeq
            let accepted = Set(try tx.participations(userID: caller.user.id, status: .accepted)
                .map(\.share.zoneRowID))
            var reported: [Int64: JSON] = [:]
            var order: [Int64] = []
            for entry in entries {
                guard let share = try tx.share(id: entry.shareID), let zone = try tx.zone(rowID: share.zoneRowID) else { continue }
                var object: [String: JSON] = [
                    "zoneID": .object(["zoneName": .string(zone.name), "ownerRecordName": .string(zone.ownerRecordName)]),
                ]
                if !accepted.contains(zone.rowID) || zone.deleted { object["deleted"] = .bool(true) }
                if reported[zone.rowID] == nil { order.append(zone.rowID) }
                reported[zone.rowID] = .object(object)
            }
            return .object([
                "zones": .array(order.compactMap { reported[$0] }),
                "syncToken": .string(SyncToken(log: .database, owner: database.id, position: position).text),
                "moreComing": .bool(moreComing),
            ])
        }
    }

    /// A feed page as `changes/zone` answers it: records that left what the caller may see come first, as
    /// deletions without CRDT state, then the changed records with their state (`rendered`: the page's
    /// records as JSON, in order, rendered while the page was cut to the response budget).
    func pageJSON(_ page: ZoneFeedPage, rendered: [JSON]) -> JSON {
        var records: [JSON] = page.removed.map { .object(["recordName": .string($0), "deleted": .bool(true)]) }
        records.append(contentsOf: rendered)
        var object: [String: JSON] = [
            "zoneID": page.zoneID.cloudKitJSON,
            "records": .array(records),
            "syncToken": .string(page.syncToken),
            "moreComing": .bool(page.moreComing),
        ]
        if !page.lostShares.isEmpty {
            object["lostShares"] = .array(page.lostShares.map { share in
                var named: [String: JSON] = ["shareRecordName": .string(share.shareRecordName)]
                if !share.rootRecordName.isEmpty { named["rootRecordName"] = .string(share.rootRecordName) }
                return .object(named)
            })
        }
        return .object(object)
    }

    /// The feed of a participant of hierarchy shares: the shares' own logs, where a record that left the
    /// share (its parent moved it out) comes as a removal and one that entered comes whole. The token keeps
    /// one position per share.
    ///
    /// A share the token holds a position for but the caller no longer has (removed, left, share deleted,
    /// `publicPermission` none, root deleted) is named once in `lostShares` and then drained: a removal for
    /// each record the caller had from it, paged like the rest. See `hadRecord` for what counts as "had".
    ///
    /// `admit` is asked for each record before it joins the page (the response budget); the first it refuses
    /// ends the page there, the share's position staying before it, and `moreComing` is set.
    func shareFeedPage(syncToken: String?, _ resolved: ResolvedZone, zone: StoredZone, limit: Int,
                       caller: Caller, _ tx: any StorageTransaction,
                       admit: (StoredRecord) throws -> Bool) throws -> ZoneFeedPage {
        var token = ShareFeedToken.State()
        if let syncToken { token = try ShareFeedToken.parse(syncToken) }
        var records: [StoredRecord] = []
        var removed: [String] = []
        var moreComing = false
        var full = false // the response budget refused a record: no more records on this page
        let granted = Set(resolved.grants.map(\.share.id))
        for grant in resolved.grants.sorted(by: { $0.share.id < $1.share.id }) {
            let share = try tx.share(id: grant.share.id) ?? grant.share
            token.drains[share.id] = nil // regained: the share's feed starts over below
            let cursor = token.positions[share.id] ?? 0
            guard cursor <= share.lastSeq else { throw ServiceError.badRequest("the sync token is from the future") }
            let room = limit - records.count - removed.count
            guard room > 0, !full else {
                moreComing = moreComing || cursor < share.lastSeq
                continue
            }
            let entries = try tx.shareChanges(shareID: share.id, after: cursor, limit: room)
            var taken = cursor
            for entry in entries {
                if entry.member, let stored = try tx.record(zoneRowID: zone.rowID, name: entry.recordName) {
                    guard try admit(stored) else {
                        full = true
                        break
                    }
                    records.append(stored)
                } else {
                    removed.append(entry.recordName)
                }
                taken = entry.seq
            }
            if full {
                token.positions[share.id] = taken
                moreComing = true
                continue
            }
            let last = entries.last?.seq ?? share.lastSeq
            let done = entries.count < room || last >= share.lastSeq
            token.positions[share.id] = done ? share.lastSeq : last
            moreComing = moreComing || !done
        }
        // Shares the caller had a position in and lost since: named once, then drained.
        var lostShares: [SyncMessage.LostShare] = []
        for (shareID, cursor) in token.positions.sorted(by: { $0.key < $1.key }) where !granted.contains(shareID) {
            token.positions[shareID] = nil
            guard let share = try shares.lostShare(shareID, zone: zone, caller: caller, tx) else { continue }
            if let root = share.rootRecordName {
                lostShares.append(SyncMessage.LostShare(rootRecordName: root, shareRecordName: share.recordName))
            }
            token.drains[shareID] = ShareFeedToken.Drain(bound: min(cursor, share.lastSeq), after: 0)
        }
        for (shareID, drain) in token.drains.sorted(by: { $0.key < $1.key }) where !granted.contains(shareID) {
            let room = limit - records.count - removed.count
            guard room > 0 else {
                moreComing = true
                continue
            }
            guard let share = try shares.lostShare(shareID, zone: zone, caller: caller, tx),
                  let loss = try shares.lostShareDrain(share, caller: caller, tx) else {
                token.drains[shareID] = nil
                continue
            }
            let entries = try tx.shareChanges(shareID: shareID, after: drain.after, limit: room)
            var after = drain.after
            var had: [String: Bool] = [:]
            for entry in entries where entry.seq <= drain.bound {
                after = entry.seq
                if entry.member, try shares.hadRecord(entry.recordName, loss, tx, known: &had) {
                    removed.append(entry.recordName)
                }
            }
            let done = entries.count < room || after >= drain.bound || entries.contains { $0.seq > drain.bound }
            token.drains[shareID] = done ? nil : ShareFeedToken.Drain(bound: drain.bound, after: after)
            moreComing = moreComing || !done
        }
        return ZoneFeedPage(zoneID: resolved.zoneID, records: records, removed: removed, lostShares: lostShares,
                            syncToken: ShareFeedToken.text(token), moreComing: moreComing)
    }
}

/// The sync token of a hierarchy-share feed, base64url of `s1.<id>:<pos>,...`: one position per share the
/// caller has, and `<id>:<bound>:<after>` for a lost share still being drained (deletions for its log's
/// entries after `after`, up to `bound`).
enum ShareFeedToken {
    struct Drain: Hashable {
        /// The caller's position in the share's log when the loss was seen: nothing after it is named.
        var bound: Int64
        /// The last log position drained so far.
        var after: Int64
    }

    struct State: Hashable {
        var positions: [Int64: Int64] = [:]
        var drains: [Int64: Drain] = [:]
    }

    static func text(_ state: State) -> String {
        let live = state.positions.keys.sorted().map { "\($0):\(state.positions[$0]!)" }
        let draining = state.drains.keys.sorted().map { "\($0):\(state.drains[$0]!.bound):\(state.drains[$0]!.after)" }
        let body = "s1." + (live + draining).joined(separator: ",")
        return Base64URL.encode(Array(body.utf8))
    }

    static func parse(_ text: String) throws -> State {
        let invalid = ServiceError.badRequest("syncToken is not a token this server issued for this feed")
        guard text.utf8.count <= 4096 else { throw invalid }
        guard let data = Base64URL.decode(text) else { throw invalid }
        let body = String(decoding: data, as: UTF8.self)
        guard body.hasPrefix("s1.") else { throw invalid }
        var state = State()
        for entry in body.dropFirst(3).split(separator: ",") {
            let parts = entry.split(separator: ":", omittingEmptySubsequences: false).map { Int64($0) }
            guard parts.count == 2 || parts.count == 3, let id = parts[0], state.positions[id] == nil,
                  state.drains[id] == nil, parts.dropFirst().allSatisfy({ ($0 ?? -1) >= 0 }) else { throw invalid }
            if parts.count == 2 {
                state.positions[id] = parts[1]!
            } else {
                guard parts[2]! <= parts[1]! else { throw invalid }
                state.drains[id] = Drain(bound: parts[1]!, after: parts[2]!)
            }
        }
        return state
    }
}

/// One page of one zone's feed, as `changes/zone` and `deltas/pull` answer it.
struct ZoneFeedPage {
    let zoneID: ZoneID
    /// Records changed since the token (tombstones included), in log order.
    var records: [StoredRecord]
    /// Records that left what the caller may see (moved out of a share, or of a share the caller lost).
    var removed: [String]
    /// Hierarchy shares the caller lost since the token.
    var lostShares: [SyncMessage.LostShare]
    let syncToken: String
    let moreComing: Bool
}

extension Feeds {
    /// One zone's page of changes since the request's token: the zone's log, or for a participant of
    /// hierarchy shares the shares' own logs. The token and limit are one item of `changes/zone`'s `zones`,
    /// or `deltas/pull`'s (decoded with their request); the limit is at most `maximumLimit`.
    ///
    /// `admit` is asked for each record, in order, before it joins the page (the caller renders it and counts
    /// it against the response budget); the first one it refuses ends the page before it, with `moreComing`
    /// and a token whose position is the last record answered, so the next page starts at the refused one.
    func zoneFeedPage(syncToken: String?, resultsLimit: Int?, zoneID: ZoneID, _ caller: Caller, _ tx: any StorageTransaction,
                      maximumLimit: Int? = nil, admit: (StoredRecord) throws -> Bool = { _ in true }) throws -> ZoneFeedPage {
        let resolved = try zones.resolveZone(zoneID, caller, tx)
        let cap = maximumLimit ?? configuration.maximumResultsLimit
        let limit = min(resultsLimit ?? cap, cap)
        let hierarchy = resolved.grants.contains { $0.share.rootRecordName != nil }
        let token = hierarchy ? nil : try syncToken.map { try SyncToken(text: $0, expected: .zone) }
        guard let zone = resolved.zone else {
            if resolved.zoneID.zoneName == Names.systemZoneName, token == nil || token?.owner == 0 {
                return ZoneFeedPage(zoneID: resolved.zoneID, records: [], removed: [], lostShares: [],
                                    syncToken: SyncToken(log: .zone, owner: 0, position: 0).text, moreComing: false)
            }
            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
        }
        if resolved.isShared, hierarchy {
            return try shareFeedPage(syncToken: syncToken, resolved, zone: zone, limit: limit, caller: caller, tx, admit: admit)
        }
        let cursor = try zoneCursor(token, zone)
        // Streamed: the rows past the one `admit` refuses are never read.
        var records: [StoredRecord] = []
        var cut = false
        try tx.forEachRecordChange(zoneRowID: zone.rowID, after: cursor, limit: limit) { stored in
            guard try admit(stored) else {
                cut = true
                return false
            }
            records.append(stored)
            return true
        }
        let moreComing = cut || (records.count == limit && records.last.map { $0.seq < zone.lastSeq } == true)
        let syncToken: SyncToken
        if moreComing, let last = records.last {
            syncToken = SyncToken(log: .zone, owner: zone.rowID, position: last.seq)
        } else if moreComing {
            // Nothing fitted (the budget was spent on earlier zones): the same place again; "from the start"
            // stays the token that means it, which no purge expires.
            syncToken = cursor == 0 ? SyncToken(log: .zone, owner: 0, position: 0)
                                    : SyncToken(log: .zone, owner: zone.rowID, position: cursor)
        } else {
            syncToken = SyncToken(log: .zone, owner: zone.rowID, position: zone.lastSeq)
        }
        return ZoneFeedPage(zoneID: resolved.zoneID, records: records, removed: [], lostShares: [],
                            syncToken: syncToken.text, moreComing: moreComing)
    }
}

/// What a `changes/wait` watches: per database id the position to wait past, the timeout, and whether a
/// database is already past its position (answered at once, whatever the timeout).
public struct WaitPlan: Sendable {
    public let timeoutSeconds: Int
    public let cursors: [Int64: Int64]
    public let behind: Bool
}
