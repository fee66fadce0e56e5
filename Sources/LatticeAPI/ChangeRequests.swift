import LatticeCore

/// `changes/database {"syncToken"?, "resultsLimit"?}`: the zones changed since the token. The token stays
/// opaque text here; the server checks it is one it issued for this feed.
public struct DatabaseChangesRequest: Sendable, Hashable {
    public var syncToken: String?
    /// As asked; nil means the server's maximum.
    public var resultsLimit: Int?

    public init(syncToken: String? = nil, resultsLimit: Int? = nil) {
        self.syncToken = syncToken
        self.resultsLimit = resultsLimit
    }

    /// Reads `resultsLimit` before `syncToken`, the server's order.
    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let reader = RequestReader(json)
        resultsLimit = try reader.resultsLimit()
        syncToken = try reader.optionalString("syncToken")
    }

    /// The limit the server applies: the asked one, at most `limits.maximumResultsLimit`.
    public func effectiveLimit(_ limits: RequestLimits) -> Int {
        min(resultsLimit ?? limits.maximumResultsLimit, limits.maximumResultsLimit)
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("syncToken", syncToken)
        writer.set("resultsLimit", resultsLimit)
        return writer.json
    }
}

/// One zone of `changes/zone`: its id, the token it resumes from, its own `resultsLimit`.
public struct ZoneChangesItem: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var syncToken: String?
    /// The item's limit, or the body's when the item gives none; nil means the server's maximum.
    public var resultsLimit: Int?

    public init(zoneID: WireZoneID, syncToken: String? = nil, resultsLimit: Int? = nil) {
        self.zoneID = zoneID
        self.syncToken = syncToken
        self.resultsLimit = resultsLimit
    }

    /// The server's order: zone id, then limit (its message names no path), then token.
    public init(json: JSON, bodyLimit: JSON?, path: String) throws(ServiceError) {
        zoneID = try WireZoneID(json: json["zoneID"], path: path + ".zoneID")
        var limitMembers: [String: JSON] = [:]
        limitMembers["resultsLimit"] = json["resultsLimit"] ?? bodyLimit
        resultsLimit = try RequestReader(limitMembers).resultsLimit()
        if let token = json["syncToken"] {
            guard let text = token.stringValue else { throw ServiceError.badRequest("\(path).syncToken must be a string") }
            syncToken = text
        }
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("zoneID", zoneID.json)
        writer.set("syncToken", syncToken)
        writer.set("resultsLimit", resultsLimit)
        return writer.json
    }
}

/// `changes/zone {"zones": [{"zoneID", "syncToken"?, "resultsLimit"?}], "resultsLimit"?}`. Each zone
/// fails alone (an error item), so each is a `Result`; a missing or oversized list fails the request.
public struct ZoneChangesRequest: Sendable {
    public var zones: [Result<ZoneChangesItem, ServiceError>]

    public init(zones: [ZoneChangesItem]) { self.zones = zones.map { .success($0) } }

    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let reader = RequestReader(json)
        let items = try reader.items("zones", limit: limits.maximumResultsLimit)
        zones = items.enumerated().map { index, item in
            do throws(ServiceError) {
                return .success(try ZoneChangesItem(json: item, bodyLimit: reader["resultsLimit"], path: "zones[\(index)]"))
            } catch { return .failure(error) }
        }
    }

    /// Each zone carries its own limit (the body-wide one is folded into the items when decoding).
    public var json: JSON {
        .object(["zones": .array(zones.compactMap { try? $0.get() }.map(\.json))])
    }
}
