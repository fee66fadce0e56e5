import LatticeAPI
import LatticeCore
import LatticeStore

/// A zone named by a request, resolved against the caller's database.
package struct ResolvedZone {
    package let database: StoredDatabase
    /// Nil when the zone does not exist (yet).
    package let zone: StoredZone?
    package let zoneID: ZoneID
    /// In the shared database: the shares of this zone the caller has accepted. Empty for the caller's own
    /// zones and the public zone.
    package var grants: [ShareGrant] = []

    package var isShared: Bool { !grants.isEmpty }

    package init(database: StoredDatabase, zone: StoredZone?, zoneID: ZoneID, grants: [ShareGrant] = []) {
        self.database = database
        self.zone = zone
        self.zoneID = zoneID
        self.grants = grants
    }

    /// The zone, which exists (the operation checked it, or it is a share's own zone).
    /// - Throws: ZONE_NOT_FOUND when it does not: never a trap.
    package func existingZone() throws -> StoredZone {
        guard let zone else { throw ServiceError(.zoneNotFound, "zone \(zoneID.zoneName) does not exist") }
        return zone
    }
}

/// Zones: resolving a zone a request names against the caller's database (the shared database's through
/// the caller's accepted shares), and `zones/list`, `zones/lookup`, `zones/modify`.
public struct Zones: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    var shares: Shares { Shares(core) }

    /// The owner name of the public database's zone, as CloudKit spells it.
    package static let publicOwner = "_defaultOwner"
    /// CloudKit's placeholder for "the current user" in a zone id.
    package static let currentUserPlaceholder = "__defaultOwner__"

    /// Parses a zone id from a request and finds it in the caller's database.
    ///
    /// - Private database: the owner must be the caller (or left out); another user's private database
    ///   is ACCESS_DENIED. `_defaultZone` always exists (it is created on first write).
    /// - Public database: only `_defaultZone`, owned by `_defaultOwner`.
    /// - Shared database: zones of shares the caller accepted (none until the sharing service lands).
    package func resolveZone(_ json: JSON?, _ caller: Caller, _ tx: any StorageTransaction, path: String,
                     creatingDefault: Bool = false) throws -> ResolvedZone {
        try resolveZone(try parseZoneID(json, caller, path: path), caller, tx, creatingDefault: creatingDefault)
    }

    /// Parses a zone id from a request: `zoneName` a string, `ownerRecordName` a string; left out, or
    /// given as CloudKit's placeholder, the owner is the caller (`_defaultOwner` in the public database).
    /// - Throws: BAD_REQUEST naming the path for anything else, a wrongly typed member included.
    package func parseZoneID(_ json: JSON?, _ caller: Caller, path: String) throws -> ZoneID {
        guard let json else { throw ServiceError.badRequest("\(path) is missing") }
        guard var object = json.objectValue else { throw ServiceError.badRequest("\(path) must be {\"zoneName\": ...}") }
        let owner = caller.database == .public ? Self.publicOwner : caller.user.recordName
        if object["ownerRecordName"]?.stringValue == Self.currentUserPlaceholder { object["ownerRecordName"] = nil }
        do {
            return try ZoneID(cloudKitJSON: .object(object), defaultOwner: owner, path: path)
        } catch {
            throw ServiceError.badRequest(error.description)
        }
    }

    /// ``resolveZone(_:_:_:path:creatingDefault:)`` for a zone id already parsed.
    package func resolveZone(_ zoneID: ZoneID, _ caller: Caller, _ tx: any StorageTransaction,
                     creatingDefault: Bool = false) throws -> ResolvedZone {
        let owner = caller.database == .public ? Self.publicOwner : caller.user.recordName
        switch caller.database {
        case .private:
            guard zoneID.ownerRecordName == owner else {
                throw ServiceError(.accessDenied, "zone \(zoneID.zoneName) belongs to another user's private database")
            }
        case .public:
            guard zoneID.ownerRecordName == owner, zoneID.zoneName == Names.systemZoneName else {
                throw ServiceError(.zoneNotFound, "the public database has only \(Names.systemZoneName) (owner \(Self.publicOwner))")
            }
        case .shared:
            return try shares.resolveSharedZone(zoneID, caller, tx)
        }
        let database = try tx.database(caller.databaseKey)
        var zone = try tx.zone(databaseID: database.id, name: zoneID.zoneName)
        if zone == nil, creatingDefault, zoneID.zoneName == Names.systemZoneName {
            zone = try tx.createZone(databaseID: database.id, name: zoneID.zoneName, ownerRecordName: owner,
                                     nowMs: core.configuration.now())
        }
        return ResolvedZone(database: database, zone: zone, zoneID: zoneID)
    }

    /// A zone that does not exist is ZONE_NOT_FOUND, except `_defaultZone`, which always exists.
    package func requireZone(_ resolved: ResolvedZone) throws {
        if resolved.zone == nil && resolved.zoneID.zoneName != Names.systemZoneName {
            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
        }
    }

    package func zoneJSON(_ zone: StoredZone, withToken: Bool = true) -> JSON {
        var object: [String: JSON] = [
            "zoneID": .object(["zoneName": .string(zone.name), "ownerRecordName": .string(zone.ownerRecordName)]),
            "atomic": .bool(true),
        ]
        if withToken { object["syncToken"] = .string(SyncToken(log: .zone, owner: zone.rowID, position: zone.lastSeq).text) }
        return .object(object)
    }

    /// A zone that is implied but not stored yet (`_defaultZone` before its first write).
    private func impliedZoneJSON(_ zoneID: ZoneID) -> JSON {
        .object(["zoneID": zoneID.cloudKitJSON, "atomic": .bool(true)])
    }

    /// `zones/list`: every zone of the database; `_defaultZone` is always listed for private and public.
    /// The shared database lists the zones of the shares the caller has accepted.
    public func listZones(_ caller: Caller) throws -> JSON {
        if caller.database == .shared {
            return .object(["zones": .array(try core.storage.read(deadline: caller.deadline) { tx in try shares.sharedZones(caller, tx) })])
        }
        let owner = caller.database == .public ? Self.publicOwner : caller.user.recordName
        let zones = try core.storage.read(deadline: caller.deadline) { tx in
            try tx.liveZones(databaseID: tx.database(caller.databaseKey).id)
        }
        var list = zones.map { zoneJSON($0, withToken: caller.database != .public) }
        if !zones.contains(where: { $0.name == Names.systemZoneName }),
           let defaultZone = try? ZoneID(zoneName: Names.systemZoneName, ownerRecordName: owner) {
            list.insert(impliedZoneJSON(defaultZone), at: 0)
        }
        return .object(["zones": .array(list)])
    }

    /// `zones/lookup {"zones": [zoneID, ...]}`. A zone named twice is refused (BAD_REQUEST naming it).
    public func lookupZones(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try ZonesLookupRequest(json: .object(body), limits: requestLimits)
        let items = body["zones"]?.arrayValue ?? []
        try refuseDuplicateZones(items.map { $0["zoneID"] ?? $0 }, caller, path: { index in
            items[index]["zoneID"] == nil ? "zones[\(index)]" : "zones[\(index)].zoneID"
        })
        return try core.storage.read(deadline: caller.deadline) { tx in
            var results: [JSON] = []
            for (item, decoded) in zip(items, request.zones) {
                do {
                    let resolved = try resolveZone(try zoneID(decoded.get(), caller), caller, tx)
                    if let zone = resolved.zone {
                        results.append(zoneJSON(zone, withToken: caller.database == .private))
                    } else if resolved.zoneID.zoneName == Names.systemZoneName {
                        results.append(impliedZoneJSON(resolved.zoneID))
                    } else {
                        throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
                    }
                } catch let error as ServiceError {
                    results.append(error.json(item: (key: "zoneName", value: ZonesLookupRequest.zoneName(of: item))))
                }
            }
            return .object(["zones": .array(results)])
        }
    }

    /// A zone id as a typed request gives it, with the caller (or the public database's owner) for a
    /// missing owner.
    package func zoneID(_ wire: WireZoneID, _ caller: Caller) throws -> ZoneID {
        do {
            return try wire.resolved(defaultOwner: caller.database == .public ? Self.publicOwner : caller.user.recordName)
        } catch {
            throw ServiceError.badRequest("zoneID: \(error)")
        }
    }

    /// `zones/modify {"operations": [{"operationType": "create" | "delete", "zone": {"zoneID": ...}}]}`.
    ///
    /// Each operation stands alone. Creating a zone that exists returns it (as CloudKit's save does);
    /// deleting a zone deletes its records and moves it to the database log as deleted.
    public func modifyZones(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction,
                            _ touched: inout CommitEffects) throws -> JSON {
        guard caller.database == .private else {
            throw ServiceError.badRequest("zones can only be created and deleted in the private database")
        }
        let request = try ZonesModifyRequest(json: .object(body), limits: requestLimits)
        let items = body["operations"]?.arrayValue ?? []
        var results: [JSON] = []
        for (item, decoded) in zip(items, request.operations) {
            do {
                let operation = try decoded.get()
                let result = try tx.savepoint { () throws -> JSON in
                    let resolved = try resolveZone(try zoneID(operation.zoneID, caller), caller, tx)
                    guard resolved.zoneID.zoneName != Names.systemZoneName else {
                        throw ServiceError.badRequest("\(Names.systemZoneName) always exists and cannot be created or deleted")
                    }
                    switch operation.operationType {
                    case .create:
                        if let zone = resolved.zone { return self.zoneJSON(zone) }
                        let zone = try tx.createZone(databaseID: resolved.database.id, name: resolved.zoneID.zoneName,
                                                     ownerRecordName: resolved.zoneID.ownerRecordName,
                                                     nowMs: core.configuration.now())
                        touched.zoneChanged(zone, caller: caller)
                        return self.zoneJSON(zone)
                    case .delete:
                        guard let zone = resolved.zone else {
                            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
                        }
                        // Its shares go with it: participants lose access and see the zone deleted.
                        for share in try tx.shares(zoneRowID: zone.rowID) {
                            try shares.removeShare(share, try shares.roster(share, tx), zone: zone, caller: caller, tx, &touched)
                        }
                        try tx.deleteZone(rowID: zone.rowID, nowMs: core.configuration.now())
                        // Its records' assets lose those references (the blobs' grace periods start).
                        try tx.removeAssetReferences(zoneRowID: zone.rowID, nowMs: core.configuration.now())
                        touched.zoneChanged(zone, caller: caller)
                        return .object(["zoneID": resolved.zoneID.cloudKitJSON, "deleted": .bool(true)])
                    }
                }
                results.append(result)
            } catch let error as ServiceError {
                results.append(error.json(item: (key: "zoneName", value: ZonesModifyRequest.zoneName(of: item))))
            }
        }
        return .object(["zones": .array(results)])
    }

    /// Refuses a request naming one zone twice (BAD_REQUEST naming it). Ids that do not parse are left to
    /// the per-item errors of the request.
    package func refuseDuplicateZones(_ zoneIDs: [JSON?], _ caller: Caller, path: (Int) -> String) throws {
        try refuseDuplicates(zoneIDs.enumerated().compactMap { index, json in
            guard let zoneID = try? parseZoneID(json, caller, path: "") else { return nil }
            return (key: zoneID.zoneName + "\u{0}" + zoneID.ownerRecordName,
                    label: "\(zoneID.zoneName) (owner \(zoneID.ownerRecordName))", path: path(index))
        }, what: "zone")
    }

    /// Refuses a request that names the same item twice: BAD_REQUEST naming the item and both places.
    /// `key` tells items apart, `label` names one in the reason.
    package func refuseDuplicates(_ items: [(key: String, label: String, path: String)], what: String) throws {
        var seen: [String: String] = [:]
        for item in items {
            if let first = seen[item.key] {
                throw ServiceError.badRequest("\(item.path) names \(what) \(item.label.prefix(300)) again (as \(first) "
                                          + "does); name each \(what) once")
            }
            seen[item.key] = item.path
        }
    }
}
