import Foundation
import LatticeCore
import LatticeSharing
import LatticeStore

extension LatticeService {
    /// `records/lookup {"zoneID", "records": [{"recordName"}], "desiredKeys"?}`.
    func lookupRecords(_ context: RequestContext) throws -> JSON {
        let requested = try items(context.body, "records", limit: configuration.maximumResultsLimit)
        let desiredKeys = try parseDesiredKeys(context.body)
        return try storage.read { tx in
            let resolved = try resolveZone(context.body["zoneID"], context, tx, path: "zoneID")
            try requireZone(resolved)
            var results: [JSON] = []
            for (index, item) in requested.enumerated() {
                let name = item["recordName"]?.stringValue ?? ""
                do {
                    guard item["recordName"]?.stringValue != nil else {
                        throw APIError.badRequest("records[\(index)].recordName is missing")
                    }
                    guard let zone = resolved.zone, let stored = try tx.record(zoneRowID: zone.rowID, name: name),
                          !stored.deleted, try !resolved.isShared || grant(for: name, resolved, tx) != nil else {
                        throw APIError(.notFound, "record \(name) does not exist")
                    }
                    results.append(recordJSON(stored, try decode(stored), desiredKeys: desiredKeys))
                } catch let error as APIError {
                    results.append(error.json(item: (key: "recordName", value: name)))
                }
            }
            return .object(["records": .array(results)])
        }
    }

    private func parseDesiredKeys(_ body: [String: JSON]) throws -> Set<String>? {
        guard let json = body["desiredKeys"] else { return nil }
        guard let array = json.arrayValue, array.allSatisfy({ $0.stringValue != nil }) else {
            throw APIError.badRequest("desiredKeys must be an array of field names")
        }
        return Set(array.compactMap(\.stringValue))
    }

    /// `records/query`: filters (ANDed), sort, `resultsLimit` and a continuation marker.
    ///
    /// The marker records the sort position of the last record returned, so the next page continues
    /// after it even if records were added or removed in between.
    func queryRecords(_ context: RequestContext) throws -> JSON {
        guard let query = context.body["query"]?.objectValue else { throw APIError.badRequest("query is missing") }
        let recordType = query["recordType"]?.stringValue
        if query["recordType"] != nil && recordType == nil { throw APIError.badRequest("query.recordType must be a string") }
        let filters = try (query["filterBy"].map { try parseArray($0, "query.filterBy") } ?? [])
            .enumerated().map { try QueryFilter(json: $1, path: "query.filterBy[\($0)]") }
        let sorts = try (query["sortBy"].map { try parseArray($0, "query.sortBy") } ?? [])
            .enumerated().map { try QuerySort(json: $1, path: "query.sortBy[\($0)]") }
        let limit = try resultsLimit(context.body["resultsLimit"])
        let desiredKeys = try parseDesiredKeys(context.body)
        let fingerprint = Secrets.hex(Array(Secrets.sha256(
            Array((context.body["zoneID"] ?? .null).serializedBytes()) + [0] + Array(JSON.object(query).serializedBytes()))
            .prefix(8)))
        var after: QueryPosition?
        if let markerJSON = context.body["continuationMarker"] {
            guard let marker = markerJSON.stringValue else { throw APIError.badRequest("continuationMarker must be a string") }
            after = try QueryPosition(marker: marker, fingerprint: fingerprint)
            guard after?.keys.count == sorts.count else {
                throw APIError.badRequest("continuationMarker does not belong to this query")
            }
        }
        return try storage.read { tx in
            let resolved = try resolveZone(context.body["zoneID"], context, tx, path: "zoneID")
            try requireZone(resolved)
            guard let zone = resolved.zone else { return .object(["records": .array([])]) }
            var matches: [(StoredRecord, Record, QueryPosition)] = []
            for stored in try tx.records(zoneRowID: zone.rowID, recordType: recordType) {
                let record = try decode(stored)
                guard filters.allSatisfy({ $0.matches(record) }) else { continue }
                if resolved.isShared, try grant(for: stored.recordName, resolved, tx) == nil { continue }
                let position = QueryPosition(keys: sorts.map { record[$0.fieldName] }, recordName: stored.recordName)
                if let after, !(after.precedes(position, sorts)) { continue }
                matches.append((stored, record, position))
            }
            matches.sort { $0.2.precedes($1.2, sorts) }
            let page = matches.prefix(limit)
            var result: [String: JSON] = [
                "records": .array(page.map { recordJSON($0.0, $0.1, desiredKeys: desiredKeys) }),
            ]
            if matches.count > limit, let last = page.last {
                result["continuationMarker"] = .string(last.2.marker(fingerprint: fingerprint))
            }
            return .object(result)
        }
    }

    private func parseArray(_ json: JSON, _ path: String) throws -> [JSON] {
        guard let array = json.arrayValue else { throw APIError.badRequest("\(path) must be an array") }
        return array
    }

    /// `resultsLimit`: a positive integer; larger than the maximum means the maximum, as in CloudKit.
    /// `resultsLimit` as given, at most `maximum` (CloudKit's 200 unless a binary page allows more).
    func resultsLimit(_ json: JSON?, maximum: Int? = nil) throws -> Int {
        let maximum = maximum ?? configuration.maximumResultsLimit
        guard let json else { return maximum }
        guard let value = json.intValue, value >= 1 else { throw APIError.badRequest("resultsLimit must be a positive integer") }
        return Int(min(value, Int64(maximum)))
    }
}

/// One `filterBy` condition.
struct QueryFilter {
    enum Comparator: String, CaseIterable {
        case equals = "EQUALS", notEquals = "NOT_EQUALS"
        case lessThan = "LESS_THAN", lessThanOrEquals = "LESS_THAN_OR_EQUALS"
        case greaterThan = "GREATER_THAN", greaterThanOrEquals = "GREATER_THAN_OR_EQUALS"
        case beginsWith = "BEGINS_WITH", notBeginsWith = "NOT_BEGINS_WITH"
        case listContains = "LIST_CONTAINS", notListContains = "NOT_LIST_CONTAINS"
        case `in` = "IN", notIn = "NOT_IN"
    }

    let fieldName: String
    let comparator: Comparator
    let value: FieldValue

    init(json: JSON, path: String) throws {
        guard let fieldName = json["fieldName"]?.stringValue else { throw APIError.badRequest("\(path).fieldName is missing") }
        guard let name = json["comparator"]?.stringValue, let comparator = Comparator(rawValue: name) else {
            throw APIError.badRequest("\(path).comparator must be one of "
                                      + Comparator.allCases.map(\.rawValue).joined(separator: ", "))
        }
        guard let valueJSON = json["fieldValue"] else { throw APIError.badRequest("\(path).fieldValue is missing") }
        do {
            value = try FieldValue(cloudKitJSON: valueJSON, path: path + ".fieldValue")
        } catch {
            throw APIError.badRequest(error.description)
        }
        switch (comparator, value) {
        case (.in, .scalar), (.notIn, .scalar):
            throw APIError.badRequest("\(path): \(comparator.rawValue) takes a list value")
        case (.beginsWith, .scalar(let v)), (.notBeginsWith, .scalar(let v)):
            guard case .string = v else { throw APIError.badRequest("\(path): \(comparator.rawValue) takes a STRING") }
        case (.beginsWith, .list), (.notBeginsWith, .list), (.listContains, .list), (.notListContains, .list):
            throw APIError.badRequest("\(path): \(comparator.rawValue) takes a single value")
        default:
            break
        }
        self.fieldName = fieldName
        self.comparator = comparator
    }

    /// Whether a record matches. A record without the field matches no condition.
    func matches(_ record: Record) -> Bool {
        guard let field = record[fieldName] else { return false }
        switch comparator {
        case .equals: return field == value
        case .notEquals: return field != value
        case .lessThan, .lessThanOrEquals, .greaterThan, .greaterThanOrEquals:
            guard case .scalar(let a) = field, case .scalar(let b) = value, a.type == b.type else { return false }
            let order = ScalarValue.compare(a, b)
            switch comparator {
            case .lessThan: return order < 0
            case .lessThanOrEquals: return order <= 0
            case .greaterThan: return order > 0
            default: return order >= 0
            }
        case .beginsWith, .notBeginsWith:
            guard case .scalar(.string(let text)) = field, case .scalar(.string(let prefix)) = value else { return false }
            return text.utf8.starts(with: prefix.utf8) == (comparator == .beginsWith)
        case .listContains, .notListContains:
            guard case .list(_, let elements) = field, case .scalar(let element) = value else { return false }
            return elements.contains(element) == (comparator == .listContains)
        case .in, .notIn:
            guard case .scalar(let scalar) = field, case .list(_, let candidates) = value else { return false }
            return candidates.contains(scalar) == (comparator == .in)
        }
    }
}

/// One `sortBy` key.
struct QuerySort {
    let fieldName: String
    let ascending: Bool

    init(json: JSON, path: String) throws {
        guard let fieldName = json["fieldName"]?.stringValue else { throw APIError.badRequest("\(path).fieldName is missing") }
        if let ascending = json["ascending"], ascending.boolValue == nil {
            throw APIError.badRequest("\(path).ascending must be true or false")
        }
        self.fieldName = fieldName
        ascending = json["ascending"]?.boolValue ?? true
    }
}

/// A record's place in a query's order: its sort keys, then its name.
struct QueryPosition {
    let keys: [FieldValue?]
    let recordName: String

    init(keys: [FieldValue?], recordName: String) {
        self.keys = keys
        self.recordName = recordName
    }

    /// Strictly before `other` in the order given by `sorts`. Missing values sort last; lists sort by
    /// their elements in order.
    func precedes(_ other: QueryPosition, _ sorts: [QuerySort]) -> Bool {
        for (index, sort) in sorts.enumerated() {
            let order = Self.compare(keys[index], other.keys[index])
            if order != 0 { return sort.ascending ? order < 0 : order > 0 }
        }
        return recordName.utf8.lexicographicallyPrecedes(other.recordName.utf8)
    }

    private static func compare(_ a: FieldValue?, _ b: FieldValue?) -> Int {
        switch (a, b) {
        case (nil, nil): return 0
        case (nil, _): return 1
        case (_, nil): return -1
        case let (.scalar(x)?, .scalar(y)?): return ScalarValue.compare(x, y)
        case (.scalar?, .list?): return -1
        case (.list?, .scalar?): return 1
        case let (.list(_, x)?, .list(_, y)?):
            for (p, q) in zip(x, y) {
                let order = ScalarValue.compare(p, q)
                if order != 0 { return order }
            }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        }
    }

    func marker(fingerprint: String) -> String {
        let json = JSON.object([
            "q": .string(fingerprint),
            "n": .string(recordName),
            "k": .array(keys.map { $0?.cloudKitJSON ?? .null }),
        ])
        return Data(json.serializedBytes()).base64EncodedString()
    }

    init(marker: String, fingerprint: String) throws {
        let invalid = APIError.badRequest("continuationMarker does not belong to this query")
        guard marker.utf8.count <= 1 << 20, let data = Data(base64Encoded: marker),
              let json = try? JSON.parse([UInt8](data)), json["q"]?.stringValue == fingerprint,
              let name = json["n"]?.stringValue, let keys = json["k"]?.arrayValue else { throw invalid }
        recordName = name
        self.keys = try keys.map { key in
            if key == .null { return nil }
            guard let value = try? FieldValue(cloudKitJSON: key, path: "k") else { throw invalid }
            return value
        }
    }
}
