import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeStore

/// A zone named by a request, resolved against the caller's database.
struct ResolvedZone {
    let database: StoredDatabase
    /// Nil when the zone does not exist (yet).
    let zone: StoredZone?
    let zoneID: ZoneID
    /// In the shared database: the shares of this zone the caller has accepted. Empty for the caller's own
    /// zones and the public zone.
    var grants: [ShareGrant] = []

    var isShared: Bool { !grants.isEmpty }
}

extension LatticeService {
    /// The owner name of the public database's zone, as CloudKit spells it.
    static let publicOwner = "_defaultOwner"
    /// CloudKit's placeholder for "the current user" in a zone id.
    static let currentUserPlaceholder = "__defaultOwner__"

    /// Parses a zone id from a request and finds it in the caller's database.
    ///
    /// - Private database: the owner must be the caller (or left out); another user's private database
    ///   is ACCESS_DENIED. `_defaultZone` always exists (it is created on first write).
    /// - Public database: only `_defaultZone`, owned by `_defaultOwner`.
    /// - Shared database: zones of shares the caller accepted (none until the sharing service lands).
    func resolveZone(_ json: JSON?, _ context: RequestContext, _ tx: any StorageTransaction, path: String,
                     creatingDefault: Bool = false) throws -> ResolvedZone {
        try resolveZone(try parseZoneID(json, context, path: path), context, tx, creatingDefault: creatingDefault)
    }

    /// Parses a zone id from a request: `zoneName` a string, `ownerRecordName` a string; left out, or
    /// given as CloudKit's placeholder, the owner is the caller (`_defaultOwner` in the public database).
    /// - Throws: BAD_REQUEST naming the path for anything else, a wrongly typed member included.
    func parseZoneID(_ json: JSON?, _ context: RequestContext, path: String) throws -> ZoneID {
        guard let json else { throw ServiceError.badRequest("\(path) is missing") }
        guard var object = json.objectValue else { throw ServiceError.badRequest("\(path) must be {\"zoneName\": ...}") }
        let owner = context.kind == .public ? Self.publicOwner : context.user.recordName
        if object["ownerRecordName"]?.stringValue == Self.currentUserPlaceholder { object["ownerRecordName"] = nil }
        do {
            return try ZoneID(cloudKitJSON: .object(object), defaultOwner: owner, path: path)
        } catch {
            throw ServiceError.badRequest(error.description)
        }
    }

    /// ``resolveZone(_:_:_:path:creatingDefault:)`` for a zone id already parsed.
    func resolveZone(_ zoneID: ZoneID, _ context: RequestContext, _ tx: any StorageTransaction,
                     creatingDefault: Bool = false) throws -> ResolvedZone {
        let owner = context.kind == .public ? Self.publicOwner : context.user.recordName
        switch context.kind {
        case .private:
            guard zoneID.ownerRecordName == owner else {
                throw ServiceError(.accessDenied, "zone \(zoneID.zoneName) belongs to another user's private database")
            }
        case .public:
            guard zoneID.ownerRecordName == owner, zoneID.zoneName == Names.systemZoneName else {
                throw ServiceError(.zoneNotFound, "the public database has only \(Names.systemZoneName) (owner \(Self.publicOwner))")
            }
        case .shared:
            return try resolveSharedZone(zoneID, context, tx)
        }
        let database = try tx.database(context.databaseKey)
        var zone = try tx.zone(databaseID: database.id, name: zoneID.zoneName)
        if zone == nil, creatingDefault, zoneID.zoneName == Names.systemZoneName {
            zone = try tx.createZone(databaseID: database.id, name: zoneID.zoneName, ownerRecordName: owner,
                                     nowMs: configuration.now())
        }
        return ResolvedZone(database: database, zone: zone, zoneID: zoneID)
    }

    /// A zone that does not exist is ZONE_NOT_FOUND, except `_defaultZone`, which always exists.
    func requireZone(_ resolved: ResolvedZone) throws {
        if resolved.zone == nil && resolved.zoneID.zoneName != Names.systemZoneName {
            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
        }
    }

    func zoneJSON(_ zone: StoredZone, withToken: Bool = true) -> JSON {
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
    func listZones(_ context: RequestContext) throws -> JSON {
        if context.kind == .shared {
            return .object(["zones": .array(try storage.read(deadline: context.deadline) { tx in try sharedZones(context, tx) })])
        }
        let owner = context.kind == .public ? Self.publicOwner : context.user.recordName
        let zones = try storage.read(deadline: context.deadline) { tx in
            try tx.liveZones(databaseID: tx.database(context.databaseKey).id)
        }
        var list = zones.map { zoneJSON($0, withToken: context.kind != .public) }
        if !zones.contains(where: { $0.name == Names.systemZoneName }),
           let defaultZone = try? ZoneID(zoneName: Names.systemZoneName, ownerRecordName: owner) {
            list.insert(impliedZoneJSON(defaultZone), at: 0)
        }
        return .object(["zones": .array(list)])
    }

    /// `zones/lookup {"zones": [zoneID, ...]}`. A zone named twice is refused (BAD_REQUEST naming it).
    func lookupZones(_ context: RequestContext) throws -> JSON {
        let requested = try items(context.body, "zones", limit: configuration.maximumResultsLimit)
        try refuseDuplicateZones(requested.map { $0["zoneID"] ?? $0 }, context, path: { index in
            requested[index]["zoneID"] == nil ? "zones[\(index)]" : "zones[\(index)].zoneID"
        })
        return try storage.read(deadline: context.deadline) { tx in
            var results: [JSON] = []
            for (index, item) in requested.enumerated() {
                let path = "zones[\(index)]"
                do {
                    let resolved = try resolveZone(item["zoneID"] ?? item, context, tx,
                                                   path: item["zoneID"] == nil ? path : path + ".zoneID")
                    if let zone = resolved.zone {
                        results.append(zoneJSON(zone, withToken: context.kind == .private))
                    } else if resolved.zoneID.zoneName == Names.systemZoneName {
                        results.append(impliedZoneJSON(resolved.zoneID))
                    } else {
                        throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
                    }
                } catch let error as ServiceError {
                    results.append(error.json(item: (key: "zoneName", value: item["zoneID"]?["zoneName"]?.stringValue
                                                     ?? item["zoneName"]?.stringValue ?? "")))
                }
            }
            return .object(["zones": .array(results)])
        }
    }

    /// `zones/modify {"operations": [{"operationType": "create" | "delete", "zone": {"zoneID": ...}}]}`.
    ///
    /// Each operation stands alone. Creating a zone that exists returns it (as CloudKit's save does);
    /// deleting a zone deletes its records and moves it to the database log as deleted.
    func modifyZones(_ context: RequestContext, _ tx: any StorageTransaction, _ touched: inout Set<Int64>) throws
        -> HTTPResponse {
        guard context.kind == .private else {
            throw ServiceError.badRequest("zones can only be created and deleted in the private database")
        }
        let operations = try items(context.body, "operations", limit: configuration.maximumOperations)
        var results: [JSON] = []
        for (index, operation) in operations.enumerated() {
            let path = "operations[\(index)]"
            let zoneJSON = operation["zone"]?["zoneID"] ?? operation["zone"]
            do {
                let result = try tx.savepoint { () throws -> JSON in
                    let resolved = try resolveZone(zoneJSON, context, tx, path: path + ".zone.zoneID")
                    guard resolved.zoneID.zoneName != Names.systemZoneName else {
                        throw ServiceError.badRequest("\(Names.systemZoneName) always exists and cannot be created or deleted")
                    }
                    switch operation["operationType"]?.stringValue {
                    case "create":
                        if let zone = resolved.zone { return self.zoneJSON(zone) }
                        let zone = try tx.createZone(databaseID: resolved.database.id, name: resolved.zoneID.zoneName,
                                                     ownerRecordName: resolved.zoneID.ownerRecordName,
                                                     nowMs: configuration.now())
                        touched.insert(zone.databaseID)
                        return self.zoneJSON(zone)
                    case "delete":
                        guard let zone = resolved.zone else {
                            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
                        }
                        // Its shares go with it: participants lose access and see the zone deleted.
                        for share in try tx.shares(zoneRowID: zone.rowID) {
                            try removeShare(share, try roster(share, tx), zone: zone, context: context, tx, &touched)
                        }
                        try tx.deleteZone(rowID: zone.rowID, nowMs: configuration.now())
                        touched.insert(zone.databaseID)
                        return .object(["zoneID": resolved.zoneID.cloudKitJSON, "deleted": .bool(true)])
                    default:
                        throw ServiceError.badRequest("\(path).operationType must be create or delete")
                    }
                }
                results.append(result)
            } catch let error as ServiceError {
                results.append(error.json(item: (key: "zoneName", value: zoneJSON?["zoneName"]?.stringValue ?? "")))
            }
        }
        return .json(.object(["zones": .array(results)]))
    }

    /// Refuses a request naming one zone twice (BAD_REQUEST naming it). Ids that do not parse are left to
    /// the per-item errors of the request.
    func refuseDuplicateZones(_ zoneIDs: [JSON?], _ context: RequestContext, path: (Int) -> String) throws {
        try refuseDuplicates(zoneIDs.enumerated().compactMap { index, json in
            guard let zoneID = try? parseZoneID(json, context, path: "") else { return nil }
            return (key: zoneID.zoneName + "\u{0}" + zoneID.ownerRecordName,
                    label: "\(zoneID.zoneName) (owner \(zoneID.ownerRecordName))", path: path(index))
        }, what: "zone")
    }

    /// The array under `key` in a body (`RequestBody.items`).
    func items(_ body: [String: JSON], _ key: String, limit: Int, optional: Bool = false, allowStrings: Bool = false)
        throws -> [JSON] {
        try RequestBody.items(body, key, limit: limit, optional: optional, allowStrings: allowStrings)
    }
}
