import LatticeCore

/// A zone id as a request names it: the owner may be left out (or given as CloudKit's
/// `__defaultOwner__`), which means the caller; the server fills it in.
public struct WireZoneID: Sendable, Hashable {
    /// CloudKit's placeholder for "the current user" in a zone id.
    public static let currentUserPlaceholder = "__defaultOwner__"

    public var zoneName: String
    /// Nil: the caller (`_defaultOwner` in the public database).
    public var ownerRecordName: String?

    public init(zoneName: String, ownerRecordName: String? = nil) {
        self.zoneName = zoneName
        self.ownerRecordName = ownerRecordName
    }

    /// Decodes as the server's `parseZoneID` does, names checked.
    /// - Throws: BAD_REQUEST `path is missing`, `path must be {"zoneName": ...}`, or the name's error.
    public init(json: JSON?, path: String) throws(ServiceError) {
        guard let json else { throw ServiceError.badRequest("\(path) is missing") }
        guard var object = json.objectValue else { throw ServiceError.badRequest("\(path) must be {\"zoneName\": ...}") }
        if object["ownerRecordName"]?.stringValue == Self.currentUserPlaceholder { object["ownerRecordName"] = nil }
        let ownerGiven = object["ownerRecordName"] != nil
        do {
            // A stand-in owner that passes the name rules; it is dropped again when none was given.
            let zoneID = try ZoneID(cloudKitJSON: .object(object), defaultOwner: "_defaultOwner", path: path)
            self.init(zoneName: zoneID.zoneName, ownerRecordName: ownerGiven ? zoneID.ownerRecordName : nil)
        } catch {
            throw ServiceError.badRequest(error.description)
        }
    }

    /// The zone id with `owner` for a missing owner.
    public func resolved(defaultOwner owner: String) throws -> ZoneID {
        try ZoneID(zoneName: zoneName, ownerRecordName: ownerRecordName ?? owner)
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("zoneName", zoneName)
        writer.set("ownerRecordName", ownerRecordName)
        return writer.json
    }
}

/// `zones/list`: no members.
public struct ZonesListRequest: Sendable, Hashable {
    public init() {}
    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {}
    public var json: JSON { .object([:]) }
}

/// `zones/lookup {"zones": [zoneID or {"zoneID": ...}, ...]}`. A malformed item fails alone (an error
/// item of the answer), so each is a `Result`; only a missing or oversized list fails the request.
public struct ZonesLookupRequest: Sendable {
    public var zones: [Result<WireZoneID, ServiceError>]

    public init(zones: [WireZoneID]) { self.zones = zones.map { .success($0) } }

    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let items = try RequestReader(json).items("zones", limit: limits.maximumResultsLimit)
        zones = items.enumerated().map { index, item in
            let nested = item["zoneID"]
            let path = nested == nil ? "zones[\(index)]" : "zones[\(index)].zoneID"
            do throws(ServiceError) { return .success(try WireZoneID(json: nested ?? item, path: path)) }
            catch { return .failure(error) }
        }
    }

    /// The zone name an item's error answer carries (as the server reports it).
    public static func zoneName(of item: JSON) -> String {
        item["zoneID"]?["zoneName"]?.stringValue ?? item["zoneName"]?.stringValue ?? ""
    }

    /// Encodes the ids as `{"zoneID": ...}` items; items that failed to decode are left out.
    public var json: JSON {
        .object(["zones": .array(zones.compactMap { try? $0.get() }.map { .object(["zoneID": $0.json]) })])
    }
}

/// What a zones/modify operation does.
public enum ZoneOperationType: String, Sendable, Hashable, CaseIterable {
    case create
    case delete
}

/// One operation of `zones/modify`.
public struct ZoneOperation: Sendable, Hashable {
    public var operationType: ZoneOperationType
    public var zoneID: WireZoneID

    public init(_ operationType: ZoneOperationType, _ zoneID: WireZoneID) {
        self.operationType = operationType
        self.zoneID = zoneID
    }

    /// Checks the zone id first, then the operation type, the server's order.
    public init(json: JSON, path: String) throws(ServiceError) {
        zoneID = try WireZoneID(json: json["zone"]?["zoneID"] ?? json["zone"], path: path + ".zone.zoneID")
        guard let type = json["operationType"]?.stringValue.flatMap(ZoneOperationType.init(rawValue:)) else {
            throw ServiceError.badRequest("\(path).operationType must be create or delete")
        }
        operationType = type
    }

    public var json: JSON {
        .object(["operationType": .string(operationType.rawValue), "zone": .object(["zoneID": zoneID.json])])
    }
}

/// `zones/modify {"operations": [{"operationType": "create" | "delete", "zone": {"zoneID": ...}}]}`.
/// Each operation stands alone, so a malformed one is a `Result` failure, reported as its item.
public struct ZonesModifyRequest: Sendable {
    public var operations: [Result<ZoneOperation, ServiceError>]

    public init(operations: [ZoneOperation]) { self.operations = operations.map { .success($0) } }

    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let items = try RequestReader(json).items("operations", limit: limits.maximumOperations)
        operations = items.enumerated().map { index, item in
            do throws(ServiceError) { return .success(try ZoneOperation(json: item, path: "operations[\(index)]")) }
            catch { return .failure(error) }
        }
    }

    /// The zone name an operation's error answer carries.
    public static func zoneName(of item: JSON) -> String {
        (item["zone"]?["zoneID"] ?? item["zone"])?["zoneName"]?.stringValue ?? ""
    }

    public var json: JSON {
        .object(["operations": .array(operations.compactMap { try? $0.get() }.map(\.json))])
    }
}
