import LatticeCore

/// The answer of `changes/database`: the zones changed (or deleted) since the token, the token to resume
/// from, and whether more changes are left.
public struct DatabaseChangesResponse: Sendable, Hashable {
    /// A zone that changed; `deleted` when it went away (or, in the shared database, the caller lost it).
    public struct Zone: Sendable, Hashable {
        public var zoneID: WireZoneID
        public var deleted: Bool

        public init(zoneID: WireZoneID, deleted: Bool = false) {
            self.zoneID = zoneID
            self.deleted = deleted
        }
    }

    public var zones: [Zone]
    public var syncToken: String
    public var moreComing: Bool

    public init(zones: [Zone], syncToken: String, moreComing: Bool) {
        self.zones = zones
        self.syncToken = syncToken
        self.moreComing = moreComing
    }

    /// Zone ids carry their owner; `deleted` and `moreComing` are false unless true.
    public init(json: JSON) throws(AnswerError) {
        let reader = AnswerReader(operation: "changes/database")
        let object = try reader.object(json, "answer")
        var zones: [Zone] = []
        for (index, item) in try reader.array(object["zones"], "zones").enumerated() {
            zones.append(Zone(zoneID: try reader.zoneID(item["zoneID"], "zones[\(index)].zoneID"),
                              deleted: item["deleted"] == .bool(true)))
        }
        self.zones = zones
        syncToken = try reader.string(object["syncToken"], "syncToken")
        moreComing = object["moreComing"] == .bool(true)
    }

    public var json: JSON {
        .object([
            "zones": .array(zones.map { zone in
                var object: [String: JSON] = ["zoneID": zone.zoneID.json]
                if zone.deleted { object["deleted"] = .bool(true) }
                return .object(object)
            }),
            "syncToken": .string(syncToken),
            "moreComing": .bool(moreComing),
        ])
    }
}

/// One zone's page of `changes/zone`: its records changed since the token, in commit order (a record that
/// left what the caller may see comes first as `{"recordName", "deleted": true}` without CRDT state), the
/// hierarchy shares the caller lost, the token to resume from, and whether more are left.
public struct ZoneChangesPage: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var records: [[String: JSON]]
    public var lostShares: [SyncMessage.LostShare]
    public var syncToken: String
    public var moreComing: Bool

    public init(zoneID: WireZoneID, records: [[String: JSON]], lostShares: [SyncMessage.LostShare] = [], syncToken: String,
                moreComing: Bool) {
        self.zoneID = zoneID
        self.records = records
        self.lostShares = lostShares
        self.syncToken = syncToken
        self.moreComing = moreComing
    }

    /// A lost share without `rootRecordName` reads as one with an empty root (and is written so).
    init(json: [String: JSON], path: String, reader: AnswerReader) throws(AnswerError) {
        zoneID = try reader.zoneID(json["zoneID"], path + ".zoneID")
        var records: [[String: JSON]] = []
        for (index, item) in try reader.array(json["records"], path + ".records").enumerated() {
            records.append(try reader.object(item, "\(path).records[\(index)]"))
        }
        self.records = records
        var lost: [SyncMessage.LostShare] = []
        for (index, item) in (json["lostShares"]?.arrayValue ?? []).enumerated() {
            lost.append(SyncMessage.LostShare(
                rootRecordName: item["rootRecordName"]?.stringValue ?? "",
                shareRecordName: try reader.string(item["shareRecordName"], "\(path).lostShares[\(index)].shareRecordName")))
        }
        lostShares = lost
        syncToken = try reader.string(json["syncToken"], path + ".syncToken")
        moreComing = json["moreComing"] == .bool(true)
    }

    public var json: JSON {
        var object: [String: JSON] = [
            "zoneID": zoneID.json,
            "records": .array(records.map(JSON.object)),
            "syncToken": .string(syncToken),
            "moreComing": .bool(moreComing),
        ]
        if !lostShares.isEmpty {
            object["lostShares"] = .array(lostShares.map { share in
                var named: [String: JSON] = ["shareRecordName": .string(share.shareRecordName)]
                if !share.rootRecordName.isEmpty { named["rootRecordName"] = .string(share.rootRecordName) }
                return .object(named)
            })
        }
        return .object(object)
    }
}

/// One item of `changes/zone`'s answer: the zone's page, or its error (naming the zone by `zoneName`, and by
/// `zoneID` when the server could read the id).
public struct ZoneChangesAnswer: Sendable {
    public var result: Result<ZoneChangesPage, ServiceError>
    /// For an error item: the zone as the request named it.
    public var zoneName: String
    public var zoneID: WireZoneID?

    public init(page: ZoneChangesPage) {
        result = .success(page)
        zoneName = page.zoneID.zoneName
        zoneID = page.zoneID
    }

    public init(zoneName: String, zoneID: WireZoneID? = nil, error: ServiceError) {
        result = .failure(error)
        self.zoneName = zoneName
        self.zoneID = zoneID
    }

    public var page: ZoneChangesPage? { try? result.get() }

    public var json: JSON {
        switch result {
        case .success(let page): return page.json
        case .failure(let error):
            var item = error.json(item: (key: "zoneName", value: zoneName))
            if case .object(var object) = item, let zoneID {
                object["zoneID"] = zoneID.json
                item = .object(object)
            }
            return item
        }
    }
}

/// The answer of `changes/zone`: an item per zone asked, in order.
public struct ZoneChangesResponse: Sendable {
    public var zones: [ZoneChangesAnswer]

    public init(zones: [ZoneChangesAnswer]) { self.zones = zones }

    public init(json: JSON) throws(AnswerError) {
        let reader = AnswerReader(operation: "changes/zone")
        var zones: [ZoneChangesAnswer] = []
        for (index, item) in try reader.array(try reader.object(json, "answer")["zones"], "zones").enumerated() {
            let path = "zones[\(index)]"
            let object = try reader.object(item, path)
            var withoutID = object
            withoutID["zoneID"] = nil
            if let error = ServiceError(json: .object(withoutID), itemKey: "zoneName") {
                let zoneID = object["zoneID"] == nil ? nil : try reader.zoneID(object["zoneID"], path + ".zoneID")
                zones.append(ZoneChangesAnswer(zoneName: object["zoneName"]?.stringValue ?? "", zoneID: zoneID, error: error))
            } else {
                zones.append(ZoneChangesAnswer(page: try ZoneChangesPage(json: object, path: path, reader: reader)))
            }
        }
        self.zones = zones
    }

    public var json: JSON { .object(["zones": .array(zones.map(\.json))]) }
}

/// The answer of `changes/wait`: whether a watched database changed (false: the wait timed out).
public struct ChangesWaitResponse: Sendable, Hashable {
    public var changed: Bool

    public init(changed: Bool) { self.changed = changed }

    /// Anything but `"changed": true` reads as unchanged.
    public init(json: JSON) throws(AnswerError) {
        _ = try AnswerReader(operation: "changes/wait").object(json, "answer")
        changed = json["changed"] == .bool(true)
    }

    public var json: JSON { .object(["changed": .bool(changed)]) }
}

/// A zone as the zone operations answer it: its id, its `changes/zone` token where given, `deleted` after a
/// delete, and any other members as they came (`atomic`).
public struct ZoneState: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var syncToken: String?
    public var deleted: Bool
    public var otherMembers: [String: JSON]

    public init(zoneID: WireZoneID, syncToken: String? = nil, deleted: Bool = false, otherMembers: [String: JSON] = [:]) {
        self.zoneID = zoneID
        self.syncToken = syncToken
        self.deleted = deleted
        self.otherMembers = otherMembers
    }

    init(json: [String: JSON], path: String, reader: AnswerReader) throws(AnswerError) {
        zoneID = try reader.zoneID(json["zoneID"], path + ".zoneID")
        syncToken = try json["syncToken"].map { token throws(AnswerError) in try reader.string(token, path + ".syncToken") }
        deleted = json["deleted"] == .bool(true)
        var others = json
        for key in ["zoneID", "syncToken", "deleted"] { others[key] = nil }
        otherMembers = others
    }

    public var json: JSON {
        var object = otherMembers
        object["zoneID"] = zoneID.json
        if let syncToken { object["syncToken"] = .string(syncToken) }
        if deleted { object["deleted"] = .bool(true) }
        return .object(object)
    }
}

/// One item of `zones/lookup` and `zones/modify`: the zone, or its error naming it by `zoneName`.
public struct ZoneAnswer: Sendable {
    public var zoneName: String
    public var result: Result<ZoneState, ServiceError>

    public init(zone: ZoneState) {
        zoneName = zone.zoneID.zoneName
        result = .success(zone)
    }

    public init(zoneName: String, error: ServiceError) {
        self.zoneName = zoneName
        result = .failure(error)
    }

    public var zone: ZoneState? { try? result.get() }

    public var error: ServiceError? {
        if case .failure(let error) = result { return error }
        return nil
    }

    public var json: JSON {
        switch result {
        case .success(let zone): return zone.json
        case .failure(let error): return error.json(item: (key: "zoneName", value: zoneName))
        }
    }
}

func decodeZoneAnswers(_ json: JSON, operation: String) throws(AnswerError) -> [ZoneAnswer] {
    let reader = AnswerReader(operation: operation)
    var zones: [ZoneAnswer] = []
    for (index, item) in try reader.array(try reader.object(json, "answer")["zones"], "zones").enumerated() {
        let object = try reader.object(item, "zones[\(index)]")
        if let error = ServiceError(json: item, itemKey: "zoneName") {
            zones.append(ZoneAnswer(zoneName: object["zoneName"]?.stringValue ?? "", error: error))
        } else {
            zones.append(ZoneAnswer(zone: try ZoneState(json: object, path: "zones[\(index)]", reader: reader)))
        }
    }
    return zones
}

/// The answer of `zones/list`: every zone of the database.
public struct ZonesListResponse: Sendable, Hashable {
    public var zones: [ZoneState]

    public init(zones: [ZoneState]) { self.zones = zones }

    public init(json: JSON) throws(AnswerError) {
        let reader = AnswerReader(operation: "zones/list")
        var zones: [ZoneState] = []
        for (index, item) in try reader.array(try reader.object(json, "answer")["zones"], "zones").enumerated() {
            zones.append(try ZoneState(json: try reader.object(item, "zones[\(index)]"), path: "zones[\(index)]", reader: reader))
        }
        self.zones = zones
    }

    public var json: JSON { .object(["zones": .array(zones.map(\.json))]) }
}

/// The answer of `zones/lookup`: an item per zone asked, in order.
public struct ZonesLookupResponse: Sendable {
    public var zones: [ZoneAnswer]

    public init(zones: [ZoneAnswer]) { self.zones = zones }
    public init(json: JSON) throws(AnswerError) { zones = try decodeZoneAnswers(json, operation: "zones/lookup") }
    public var json: JSON { .object(["zones": .array(zones.map(\.json))]) }
}

/// The answer of `zones/modify`: an item per operation, in order.
public struct ZonesModifyResponse: Sendable {
    public var zones: [ZoneAnswer]

    public init(zones: [ZoneAnswer]) { self.zones = zones }
    public init(json: JSON) throws(AnswerError) { zones = try decodeZoneAnswers(json, operation: "zones/modify") }
    public var json: JSON { .object(["zones": .array(zones.map(\.json))]) }
}
