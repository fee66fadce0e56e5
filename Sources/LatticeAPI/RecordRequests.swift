import LatticeCore

/// `records/lookup {"zoneID", "records": [{"recordName"}], "desiredKeys"?}`. A record item without a name
/// fails alone (an error item of the answer, found when the server reaches it), so the names are optional.
public struct RecordsLookupRequest: Sendable {
    public var zoneID: WireZoneID?
    /// Each item's `recordName` (nil when the item has none).
    public var recordNames: [String?]
    /// The fields each answered record carries (nil: all).
    public var desiredKeys: [String]?

    public init(zoneID: WireZoneID, recordNames: [String], desiredKeys: [String]? = nil) {
        self.zoneID = zoneID
        self.recordNames = recordNames
        self.desiredKeys = desiredKeys
    }

    /// The server's order: the list and its limit, a name given twice, `desiredKeys`; the zone id is judged
    /// with the zone (its error is the zone's).
    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let reader = RequestReader(json)
        let items = try reader.items("records", limit: limits.maximumResultsLimit)
        recordNames = items.map { $0["recordName"]?.stringValue }
        var seen: [String: Int] = [:]
        for (index, name) in recordNames.enumerated() {
            guard let name else { continue }
            if let first = seen[name] {
                throw ServiceError.badRequest("records[\(index)].recordName names record \(name.prefix(300)) again (as "
                                              + "records[\(first)].recordName does); name each record once")
            }
            seen[name] = index
        }
        desiredKeys = try reader.desiredKeys()
        zoneID = try? WireZoneID(json: json["zoneID"], path: "zoneID")
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("zoneID", zoneID?.json)
        writer.set("records", .array(recordNames.map { name in name.map { .object(["recordName": .string($0)]) } ?? .object([:]) }))
        writer.set("desiredKeys", desiredKeys.map { .array($0.map(JSON.string)) })
        return writer.json
    }
}

/// `deltas/pull {"zoneID", "syncToken"?, "resultsLimit"?, "known"?: [[from, to], ...]}`: a binary page of a
/// zone's changes, leaving out positions the device holds (`known`, at most 1,000 inclusive ranges).
public struct DeltaPullRequest: Sendable, Hashable {
    public static let maximumKnownRanges = 1_000

    public var zoneID: WireZoneID
    public var syncToken: String?
    public var resultsLimit: Int?
    public var known: [ClosedRange<Int64>]
    /// Ask for the share of each root record of a hierarchy share in the page (`Pull.sharedRoots`).
    public var shares: Bool

    public init(zoneID: WireZoneID, syncToken: String? = nil, resultsLimit: Int? = nil, known: [ClosedRange<Int64>] = [],
                shares: Bool = false) {
        self.zoneID = zoneID
        self.syncToken = syncToken
        self.resultsLimit = resultsLimit
        self.known = known
        self.shares = shares
    }

    /// The server's order: `known`, the zone id, `resultsLimit`, `syncToken`, `shares`.
    public init(json: JSON) throws(ServiceError) {
        known = try Self.known(json["known"])
        zoneID = try WireZoneID(json: json["zoneID"], path: "zoneID")
        let reader = RequestReader(json)
        resultsLimit = try reader.resultsLimit()
        syncToken = try reader.optionalString("syncToken")
        shares = try reader.optionalBool("shares") ?? false
    }

    /// `known` as the server reads it first (before the zone id; the token and limit are read with the
    /// page, `ZoneChangesItem`'s rules).
    /// - Throws: `known must be an array of at most 1000 [from, to] position ranges`, `known[i] must be
    ///   [from, to] with 0 <= from <= to`.
    public static func known(_ json: JSON?) throws(ServiceError) -> [ClosedRange<Int64>] {
        guard let json else { return [] }
        guard let array = json.arrayValue, array.count <= maximumKnownRanges else {
            throw ServiceError.badRequest("known must be an array of at most \(maximumKnownRanges) [from, to] position ranges")
        }
        var ranges: [ClosedRange<Int64>] = []
        for (index, item) in array.enumerated() {
            guard let pair = item.arrayValue, pair.count == 2, let from = pair[0].intValue, let to = pair[1].intValue,
                  from >= 0, from <= to else {
                throw ServiceError.badRequest("known[\(index)] must be [from, to] with 0 <= from <= to")
            }
            ranges.append(from...to)
        }
        return ranges
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("zoneID", zoneID.json)
        writer.set("syncToken", syncToken)
        writer.set("resultsLimit", resultsLimit)
        if !known.isEmpty {
            writer.set("known", .array(known.map { .array([.int($0.lowerBound), .int($0.upperBound)]) }))
        }
        if shares { writer.set("shares", .bool(true)) }
        return writer.json
    }
}

/// `changes/wait {"syncToken"?, "timeout"?}` or `{"databases": [{"database", "syncToken"?}], "timeout"?}`: a
/// long poll on one database (the request's) or on one or two of private and shared.
public struct ChangesWaitRequest: Sendable, Hashable {
    public struct Watched: Sendable, Hashable {
        public var database: DatabaseKind
        public var syncToken: String?

        public init(database: DatabaseKind, syncToken: String? = nil) {
            self.database = database
            self.syncToken = syncToken
        }
    }

    /// Nil: the request's own database, with `syncToken`.
    public var databases: [Watched]?
    public var syncToken: String?
    /// Seconds; nil means the server's default (it caps it at its maximum).
    public var timeoutSeconds: Int64?

    public init(databases: [Watched]? = nil, syncToken: String? = nil, timeoutSeconds: Int64? = nil) {
        self.databases = databases
        self.syncToken = syncToken
        self.timeoutSeconds = timeoutSeconds
    }

    /// The server's order: `timeout`, then `databases` (or `syncToken`).
    public init(json: JSON) throws(ServiceError) {
        if let value = json["timeout"] {
            guard let seconds = value.intValue, seconds >= 0 else {
                throw ServiceError.badRequest("timeout must be a non-negative number of seconds")
            }
            timeoutSeconds = seconds
        }
        if let list = json["databases"] {
            guard json["syncToken"] == nil else { throw ServiceError.badRequest("give syncToken or databases, not both") }
            guard let items = list.arrayValue, (1...2).contains(items.count) else {
                throw ServiceError.badRequest("databases must list one or two of private and shared")
            }
            var watched: [Watched] = []
            for (index, item) in items.enumerated() {
                guard let name = item["database"]?.stringValue, let kind = DatabaseKind(rawValue: name), kind != .public,
                      !watched.contains(where: { $0.database == kind }) else {
                    throw ServiceError.badRequest("databases[\(index)].database must be private or shared, each once")
                }
                var token: String?
                if let json = item["syncToken"] {
                    guard let text = json.stringValue else {
                        throw ServiceError.badRequest("databases[\(index)].syncToken must be a string")
                    }
                    token = text
                }
                watched.append(Watched(database: kind, syncToken: token))
            }
            databases = watched
        } else if let json = json["syncToken"] {
            guard let text = json.stringValue else { throw ServiceError.badRequest("syncToken must be a string") }
            syncToken = text
        }
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("databases", databases.map { list in
            .array(list.map { item in
                var member = RequestWriter()
                member.set("database", item.database.rawValue)
                member.set("syncToken", item.syncToken)
                return member.json
            })
        })
        writer.set("syncToken", syncToken)
        writer.set("timeout", timeoutSeconds.map { JSON.int($0) })
        return writer.json
    }
}

extension RequestReader {
    /// `desiredKeys`: the field names the answer's records carry (nil when absent: all of them).
    /// - Throws: `desiredKeys must be an array of field names`.
    public func desiredKeys() throws(ServiceError) -> [String]? {
        guard let json = object["desiredKeys"] else { return nil }
        guard let array = json.arrayValue, array.allSatisfy({ $0.stringValue != nil }) else {
            throw ServiceError.badRequest("desiredKeys must be an array of field names")
        }
        return array.compactMap(\.stringValue)
    }
}
