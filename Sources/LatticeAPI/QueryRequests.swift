import LatticeCore

/// How a `records/query` filter compares a record's field with its value.
public enum QueryComparator: String, Sendable, Hashable, CaseIterable {
    case equals = "EQUALS", notEquals = "NOT_EQUALS"
    case lessThan = "LESS_THAN", lessThanOrEquals = "LESS_THAN_OR_EQUALS"
    case greaterThan = "GREATER_THAN", greaterThanOrEquals = "GREATER_THAN_OR_EQUALS"
    case beginsWith = "BEGINS_WITH", notBeginsWith = "NOT_BEGINS_WITH"
    case listContains = "LIST_CONTAINS", notListContains = "NOT_LIST_CONTAINS"
    case `in` = "IN", notIn = "NOT_IN"
}

/// One `filterBy` condition: `{"fieldName", "comparator", "fieldValue": {"value", "type"?}}`.
public struct RecordQueryFilter: Sendable, Hashable {
    public var fieldName: String
    public var comparator: QueryComparator
    public var value: FieldValue

    public init(_ fieldName: String, _ comparator: QueryComparator, _ value: FieldValue) {
        self.fieldName = fieldName
        self.comparator = comparator
        self.value = value
    }

    /// Decodes as the server's `QueryFilter` does: the name, the comparator, the value (LIMIT_EXCEEDED over
    /// `maximumValues` list elements, before they are parsed), then whether the comparator takes that value.
    public init(json: JSON, path: String, maximumValues: Int = .max) throws(ServiceError) {
        guard let fieldName = json["fieldName"]?.stringValue else { throw ServiceError.badRequest("\(path).fieldName is missing") }
        guard let name = json["comparator"]?.stringValue, let comparator = QueryComparator(rawValue: name) else {
            throw ServiceError.badRequest("\(path).comparator must be one of "
                                          + QueryComparator.allCases.map(\.rawValue).joined(separator: ", "))
        }
        guard let valueJSON = json["fieldValue"] else { throw ServiceError.badRequest("\(path).fieldValue is missing") }
        if let count = valueJSON["value"]?.arrayValue?.count, count > maximumValues {
            throw ServiceError(.limitExceeded, "\(path).fieldValue holds \(count) values; the limit is \(maximumValues) per filter")
        }
        let value: FieldValue
        do {
            value = try FieldValue(cloudKitJSON: valueJSON, path: path + ".fieldValue")
        } catch {
            throw ServiceError.badRequest(error.description)
        }
        switch (comparator, value) {
        case (.in, .scalar), (.notIn, .scalar), (.in, .text), (.notIn, .text):
            throw ServiceError.badRequest("\(path): \(comparator.rawValue) takes a list value")
        case (.beginsWith, .scalar(let scalar)), (.notBeginsWith, .scalar(let scalar)):
            guard case .string = scalar else { throw ServiceError.badRequest("\(path): \(comparator.rawValue) takes a STRING") }
        case (.beginsWith, .list), (.notBeginsWith, .list), (.listContains, .list), (.notListContains, .list),
             (.beginsWith, .set), (.notBeginsWith, .set), (.listContains, .set), (.notListContains, .set),
             (.listContains, .text), (.notListContains, .text):
            throw ServiceError.badRequest("\(path): \(comparator.rawValue) takes a single value")
        default:
            break
        }
        self.init(fieldName, comparator, value)
    }

    public var json: JSON {
        .object(["fieldName": .string(fieldName), "comparator": .string(comparator.rawValue), "fieldValue": value.cloudKitJSON])
    }
}

/// One `sortBy` key: `{"fieldName", "ascending"?}` (ascending unless false).
public struct RecordQuerySort: Sendable, Hashable {
    public var fieldName: String
    public var ascending: Bool

    public init(_ fieldName: String, ascending: Bool = true) {
        self.fieldName = fieldName
        self.ascending = ascending
    }

    /// - Throws: `path.fieldName is missing`, `path.ascending must be true or false`.
    public init(json: JSON, path: String) throws(ServiceError) {
        guard let fieldName = json["fieldName"]?.stringValue else { throw ServiceError.badRequest("\(path).fieldName is missing") }
        if let ascending = json["ascending"], ascending.boolValue == nil {
            throw ServiceError.badRequest("\(path).ascending must be true or false")
        }
        self.init(fieldName, ascending: json["ascending"]?.boolValue ?? true)
    }

    public var json: JSON { .object(["fieldName": .string(fieldName), "ascending": .bool(ascending)]) }
}

/// `records/query {"zoneID", "query": {"recordType"?, "filterBy"?, "sortBy"?}, "resultsLimit"?,
/// "desiredKeys"?, "continuationMarker"?}`: the records of one zone matching every filter, in the sort
/// keys' order then by name. The marker stays opaque text; the server checks it belongs to the query.
public struct RecordsQueryRequest: Sendable, Hashable {
    public var zoneID: WireZoneID
    /// Nil: records of every type.
    public var recordType: String?
    public var filters: [RecordQueryFilter]
    public var sorts: [RecordQuerySort]
    /// As asked; nil means the server's maximum.
    public var resultsLimit: Int?
    public var desiredKeys: [String]?
    public var continuationMarker: String?

    public init(zoneID: WireZoneID, recordType: String? = nil, filters: [RecordQueryFilter] = [],
                sorts: [RecordQuerySort] = [], resultsLimit: Int? = nil, desiredKeys: [String]? = nil,
                continuationMarker: String? = nil) {
        self.zoneID = zoneID
        self.recordType = recordType
        self.filters = filters
        self.sorts = sorts
        self.resultsLimit = resultsLimit
        self.desiredKeys = desiredKeys
        self.continuationMarker = continuationMarker
    }

    /// The server's order: the query object, its record type, the filter and sort-key counts (each list's
    /// type then its cap), each filter, each sort key, `resultsLimit`, `desiredKeys`, the marker's type, and
    /// last the zone id (read when the zone is resolved).
    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let reader = RequestReader(json)
        guard let query = reader["query"]?.objectValue else { throw ServiceError.badRequest("query is missing") }
        recordType = query["recordType"]?.stringValue
        if query["recordType"] != nil && recordType == nil { throw ServiceError.badRequest("query.recordType must be a string") }
        func array(_ key: String) throws(ServiceError) -> [JSON] {
            guard let json = query[key] else { return [] }
            guard let array = json.arrayValue else { throw ServiceError.badRequest("query.\(key) must be an array") }
            return array
        }
        let filterJSON = try array("filterBy")
        guard filterJSON.count <= limits.maximumQueryFilters else {
            throw ServiceError(.limitExceeded, "query.filterBy has \(filterJSON.count) filters; the limit is "
                               + "\(limits.maximumQueryFilters) per query")
        }
        let sortJSON = try array("sortBy")
        guard sortJSON.count <= limits.maximumQuerySortKeys else {
            throw ServiceError(.limitExceeded, "query.sortBy has \(sortJSON.count) sort keys; the limit is "
                               + "\(limits.maximumQuerySortKeys) per query")
        }
        var filters: [RecordQueryFilter] = []
        for (index, json) in filterJSON.enumerated() {
            filters.append(try RecordQueryFilter(json: json, path: "query.filterBy[\(index)]",
                                                 maximumValues: limits.maximumFilterValues))
        }
        self.filters = filters
        var sorts: [RecordQuerySort] = []
        for (index, json) in sortJSON.enumerated() { sorts.append(try RecordQuerySort(json: json, path: "query.sortBy[\(index)]")) }
        self.sorts = sorts
        resultsLimit = try reader.resultsLimit()
        desiredKeys = try reader.desiredKeys()
        if let marker = reader["continuationMarker"] {
            guard let text = marker.stringValue else { throw ServiceError.badRequest("continuationMarker must be a string") }
            continuationMarker = text
        }
        zoneID = try reader.zoneID()
    }

    /// The limit the server applies: the asked one, at most `limits.maximumResultsLimit`.
    public func effectiveLimit(_ limits: RequestLimits) -> Int {
        min(resultsLimit ?? limits.maximumResultsLimit, limits.maximumResultsLimit)
    }

    public var json: JSON {
        var query = RequestWriter()
        query.set("recordType", recordType)
        if !filters.isEmpty { query.set("filterBy", JSON.array(filters.map(\.json))) }
        if !sorts.isEmpty { query.set("sortBy", JSON.array(sorts.map(\.json))) }
        var writer = RequestWriter()
        writer.set("zoneID", zoneID.json)
        writer.set("query", query.json)
        writer.set("resultsLimit", resultsLimit)
        writer.set("desiredKeys", desiredKeys)
        writer.set("continuationMarker", continuationMarker)
        return writer.json
    }
}
