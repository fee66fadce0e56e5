import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore

/// What the endpoints not yet moved into LatticeOperations call of the areas that have moved (`Zones`,
/// `Shares`): each forwards with the request's `Caller`. It goes when the last endpoint moves.
extension LatticeService {
    var zones: Zones { Zones(core) }
    var shares: Shares { Shares(core) }

    func resolveZone(_ json: JSON?, _ context: RequestContext, _ tx: any StorageTransaction, path: String,
                     creatingDefault: Bool = false) throws -> ResolvedZone {
        try zones.resolveZone(json, context.caller, tx, path: path, creatingDefault: creatingDefault)
    }

    func resolveZone(_ zoneID: ZoneID, _ context: RequestContext, _ tx: any StorageTransaction,
                     creatingDefault: Bool = false) throws -> ResolvedZone {
        try zones.resolveZone(zoneID, context.caller, tx, creatingDefault: creatingDefault)
    }

    func parseZoneID(_ json: JSON?, _ context: RequestContext, path: String) throws -> ZoneID {
        try zones.parseZoneID(json, context.caller, path: path)
    }

    func requireZone(_ resolved: ResolvedZone) throws { try zones.requireZone(resolved) }

    func zoneJSON(_ zone: StoredZone, withToken: Bool = true) -> JSON { zones.zoneJSON(zone, withToken: withToken) }

    func refuseDuplicateZones(_ zoneIDs: [JSON?], _ context: RequestContext, path: (Int) -> String) throws {
        try zones.refuseDuplicateZones(zoneIDs, context.caller, path: path)
    }

    func refuseDuplicates(_ items: [(key: String, label: String, path: String)], what: String) throws {
        try zones.refuseDuplicates(items, what: what)
    }

    func items(_ body: [String: JSON], _ key: String, limit: Int, optional: Bool = false, allowStrings: Bool = false)
        throws -> [JSON] {
        try RequestBody.items(body, key, limit: limit, optional: optional, allowStrings: allowStrings)
    }

    func roster(_ share: StoredShare, _ tx: any StorageTransaction) throws -> ShareRoster { try shares.roster(share, tx) }

    func grant(for recordName: String, _ resolved: ResolvedZone, _ tx: any StorageTransaction) throws -> ShareGrant? {
        try shares.grant(for: recordName, resolved, tx)
    }

    func checkParticipantWrite(_ recordName: String, isDelete: Bool, live: Bool, createsMissing: Bool,
                               requestedParent: String??, _ resolved: ResolvedZone, _ tx: any StorageTransaction) throws {
        try shares.checkParticipantWrite(recordName, isDelete: isDelete, live: live, createsMissing: createsMissing,
                                         requestedParent: requestedParent, resolved, tx)
    }

    func checkParticipantPlacement(_ record: RecordFrame, before: RecordFrame?, live: Bool, _ resolved: ResolvedZone,
                                   _ tx: any StorageTransaction) throws {
        try shares.checkParticipantPlacement(record, before: before, live: live, resolved, tx)
    }

    func recordsChanged(_ names: [String], in zone: StoredZone, context: RequestContext, _ tx: any StorageTransaction,
                        _ touched: inout Set<Int64>) throws {
        try shares.recordsChanged(names, in: zone, caller: context.caller, tx, &touched)
    }

    func checkSharesStayDisjoint(_ zone: StoredZone, _ tx: any StorageTransaction) throws {
        try shares.checkSharesStayDisjoint(zone, tx)
    }

    func removeShare(_ share: StoredShare, _ roster: ShareRoster, zone: StoredZone, context: RequestContext,
                     _ tx: any StorageTransaction, _ touched: inout Set<Int64>) throws {
        try shares.removeShare(share, roster, zone: zone, caller: context.caller, tx, &touched)
    }

    func verifiedLink(_ token: String, _ tx: any StorageTransaction) throws -> (ShareClaims, StoredShare) {
        try shares.verifiedLink(token, tx)
    }

    func lostShare(_ id: Int64, zone: StoredZone, context: RequestContext, _ tx: any StorageTransaction) throws -> StoredShare? {
        try shares.lostShare(id, zone: zone, caller: context.caller, tx)
    }

    func lostShareDrain(_ share: StoredShare, context: RequestContext, _ tx: any StorageTransaction) throws -> ShareLoss? {
        try shares.lostShareDrain(share, caller: context.caller, tx)
    }

    func hadRecord(_ recordName: String, _ lost: ShareLoss, _ tx: any StorageTransaction, known: inout [String: Bool]) throws
        -> Bool {
        try shares.hadRecord(recordName, lost, tx, known: &known)
    }

    static func shareURL(publicURL: String, token: String) -> String { Shares.shareURL(publicURL: publicURL, token: token) }
}
