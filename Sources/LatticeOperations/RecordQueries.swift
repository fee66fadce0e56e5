import Foundation
import LatticeAPI
import LatticeCore

import LatticeSharing
import LatticeStore

extension Records {
    /// `records/lookup {"zoneID", "records": [{"recordName"}], "desiredKeys"?}`.
    ///
    /// A record named twice is refused (BAD_REQUEST naming it). Records past `maximumResponseBytes` of
    /// answer get a per-item LIMIT_EXCEEDED: look them up again in another request.
    public func lookup(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try RecordsLookupRequest(json: .object(body), limits: requestLimits)
        let desiredKeys = request.desiredKeys.map(Set.init)
        return try storage.read(deadline: caller.deadline) { tx in
            let resolved = try zones.resolveZone(body["zoneID"], caller, tx, path: "zoneID")
            try zones.requireZone(resolved)
            var results: [JSON] = []
            var budget = ResponseBudget(limit: configuration.maximumResponseBytes)
            let shareNames = try resolved.zone.map { try shares.shareRecordNamesByRoot(zoneRowID: $0.rowID, tx) } ?? [:]
            for (index, requestedName) in request.recordNames.enumerated() {
                let name = requestedName ?? ""
                do {
                    try caller.deadline.check()
                    guard requestedName != nil else {
                        throw ServiceError.badRequest("records[\(index)].recordName is missing")
                    }
                    guard let zone = resolved.zone, let stored = try tx.record(zoneRowID: zone.rowID, name: name),
                          !stored.deleted, try !resolved.isShared || shares.grant(for: name, resolved, tx) != nil else {
                        throw ServiceError(.notFound, "record \(name) does not exist")
                    }
                    guard !budget.isFull else { throw budget.lookupRefusal(name) }
                    let json = try recordJSON(stored, try decode(stored), desiredKeys: desiredKeys, share: shareNames[stored.recordName],
                                              links: AssetLinks(reader: caller.user, zoneRowID: zone.rowID))
                    guard budget.admit(json) else { throw budget.lookupRefusal(name) }
                    results.append(json)
                } catch let error as ServiceError {
                    results.append(error.json(item: (key: "recordName", value: name)))
                }
            }
            return .object(["records": .array(results)])
        }
    }

    /// `records/query`: filters (ANDed), sort, `resultsLimit` and a continuation marker.
    ///
    /// The marker records the sort position of the last record returned, so the next page continues
    /// after it even if records were added or removed in between.
    public func query(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        // Bounded before any work (the request's decode): filters, sort keys and the values of each filter.
        let request = try RecordsQueryRequest(json: .object(body), limits: requestLimits)
        let query = body["query"]?.objectValue ?? [:]
        let recordType = request.recordType
        let filters = request.filters.map(QueryFilter.init)
        let sorts = request.sorts.map { QuerySort(fieldName: $0.fieldName, ascending: $0.ascending) }
        let limit = request.effectiveLimit(requestLimits)
        let desiredKeys = request.desiredKeys.map(Set.init)
        let fingerprint = Secrets.hex(Array(Secrets.sha256(
            Array((body["zoneID"] ?? .null).serializedBytes()) + [0] + Array(JSON.object(query).serializedBytes()))
            .prefix(8)))
        var after: QueryPosition?
        if let marker = request.continuationMarker {
            after = try QueryPosition(marker: marker, fingerprint: fingerprint)
            guard after?.keys.count == sorts.count else {
                throw ServiceError.badRequest("continuationMarker does not belong to this query")
            }
        }
        return try storage.read(deadline: caller.deadline) { tx in
            let resolved = try zones.resolveZone(body["zoneID"], caller, tx, path: "zoneID")
            try zones.requireZone(resolved)
            guard let zone = resolved.zone else { return .object(["records": .array([])]) }
            // Records stream in name order; only the positions of the best `keep` matches are kept (O(n log
            // keep) time, no record held), and without sort keys name order is the query's order, so the read
            // stops once the page (and one more, to know there are more) is found.
            var matches: [QueryPosition] = []
            let keep = limit + 1
            try tx.forEachRecord(zoneRowID: zone.rowID, recordType: recordType) { stored in
                try caller.deadline.check()
                let record = try decode(stored)
                // Each field is read once per record, however many filters name it.
                var fields: [String: FieldValue?] = [:]
                func field(_ name: String) -> FieldValue? {
                    if let known = fields[name] { return known }
                    let value = record[name]
                    fields[name] = .some(value)
                    return value
                }
                guard filters.allSatisfy({ $0.matches(field($0.fieldName)) }) else { return true }
                if resolved.isShared, try shares.grant(for: stored.recordName, resolved, tx) == nil { return true }
                let position = QueryPosition(keys: sorts.map { field($0.fieldName) }, recordName: stored.recordName)
                if let after, !(after.precedes(position, sorts)) { return true }
                matches.append(position)
                if sorts.isEmpty { return matches.count < keep }
                if matches.count >= 2 * keep + 64 {
                    matches.sort { $0.precedes($1, sorts) }
                    matches.removeSubrange(keep...)
                }
                return true
            }
            try caller.deadline.check()
            matches.sort { $0.precedes($1, sorts) }
            // The page: at most `limit` records and `maximumResponseBytes` of them, read again by name in the
            // same snapshot; the marker resumes after the last one answered.
            var budget = ResponseBudget(limit: configuration.maximumResponseBytes)
            var records: [JSON] = []
            var last: QueryPosition?
            let shareNames = try shares.shareRecordNamesByRoot(zoneRowID: zone.rowID, tx)
            for match in matches.prefix(limit) {
                try caller.deadline.check()
                guard let stored = try tx.record(zoneRowID: zone.rowID, name: match.recordName), !stored.deleted else {
                    continue
                }
                let json = try recordJSON(stored, try decode(stored), desiredKeys: desiredKeys, share: shareNames[stored.recordName],
                                          links: AssetLinks(reader: caller.user, zoneRowID: zone.rowID))
                guard budget.admit(json) else { break }
                records.append(json)
                last = match
            }
            var result: [String: JSON] = ["records": .array(records)]
            if matches.count > records.count, let last {
                result["continuationMarker"] = .string(last.marker(fingerprint: fingerprint))
            }
            return .object(result)
        }
    }
}

/// One `filterBy` condition.
struct QueryFilter {
    typealias Comparator = QueryComparator

    let fieldName: String
    let comparator: Comparator
    let value: FieldValue
    /// The candidates of IN and NOT_IN, looked up by hash (`ScalarValue`'s hash agrees with its equality).
    let candidates: Set<ScalarValue>
    /// A list or set value's elements in ascending order without repeats, for comparing it with sets.
    let distinctElements: [ScalarValue]

    /// A filter as the request decoded it (`RecordQueryFilter`: its value checked against its comparator).
    init(_ filter: RecordQueryFilter) {
        let fieldName = filter.fieldName, value = filter.value, comparator = filter.comparator
        self.value = Self.comparable(value)
        switch value {
        case .list(_, let elements), .set(_, let elements): distinctElements = ScalarValue.sortedUnique(elements)
        default: distinctElements = []
        }
        self.fieldName = fieldName
        self.comparator = comparator
        switch value {
        case .list(_, let elements) where comparator == .in || comparator == .notIn,
             .set(_, let elements) where comparator == .in || comparator == .notIn:
            candidates = Set(elements)
        default:
            candidates = []
        }
    }

    /// A value as filters compare it: a text as the string it reads.
    static func comparable(_ value: FieldValue) -> FieldValue {
        if case .text(let text) = value { return .scalar(.string(text)) }
        return value
    }

    /// Equality of a field and the filter's value. A set (written as `*_SET`, or as `*_LIST` by a release
    /// before lists kept their order) equals a list or set value holding the same distinct elements; two
    /// lists are equal element by element, in order.
    func equal(_ field: FieldValue) -> Bool {
        switch (field, value) {
        case (.set(_, let elements), .list), (.set(_, let elements), .set):
            return elements == distinctElements // a set's elements are already ascending and distinct
        case (.list(_, let elements), .set):
            return ScalarValue.sortedUnique(elements) == distinctElements
        default:
            return field == value
        }
    }

    /// Whether a record matches. A record without the field matches no condition.
    func matches(_ record: Record) -> Bool { matches(record[fieldName]) }

    /// Whether a record whose `fieldName` holds `field` matches (nil: the record lacks it).
    func matches(_ field: FieldValue?) -> Bool {
        guard let field = field.map(Self.comparable) else { return false }
        switch comparator {
        case .equals: return equal(field)
        case .notEquals: return !equal(field)
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
            guard case .scalar(let element) = value else { return false }
            switch field {
            case .list(_, let elements), .set(_, let elements): return elements.contains(element) == (comparator == .listContains)
            default: return false
            }
        case .in, .notIn:
            guard case .scalar(let scalar) = field else { return false }
            switch value {
            case .list, .set: return candidates.contains(scalar) == (comparator == .in)
            default: return false
            }
        }
    }
}

/// One `sortBy` key.
struct QuerySort {
    let fieldName: String
    let ascending: Bool
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
        case let (a?, b?):
            // Scalars, then texts (as strings), then lists and sets (element by element).
            func rank(_ value: FieldValue) -> Int {
                switch value {
                case .scalar: return 0
                case .text: return 1
                case .list, .set: return 2
                }
            }
            if rank(a) != rank(b) { return rank(a) < rank(b) ? -1 : 1 }
            switch (a, b) {
            case let (.text(x), .text(y)): return ScalarValue.compare(.string(x), .string(y))
            case let (.list(_, x), .list(_, y)), let (.list(_, x), .set(_, y)), let (.set(_, x), .list(_, y)),
                 let (.set(_, x), .set(_, y)):
                for (p, q) in zip(x, y) {
                    let order = ScalarValue.compare(p, q)
                    if order != 0 { return order }
                }
                return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
            default: return 0
            }
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
        let invalid = ServiceError.badRequest("continuationMarker does not belong to this query")
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

/// The bytes of records one answer may still carry (`ServiceConfiguration.maximumResponseBytes`), counted
/// as each record is rendered. The answer's first record is always admitted, so a page always moves on;
/// once one is refused, every later one is too, so a feed or query stops at one place and resumes there.
struct ResponseBudget {
    let limit: Int
    private(set) var used = 0
    private(set) var admitted = 0
    private(set) var isFull = false

    init(limit: Int) {
        self.limit = limit
    }

    /// Takes `bytes` for one more record; false (taking nothing, and full from now on) when it would pass
    /// the limit.
    mutating func admit(bytes: Int) -> Bool {
        guard !isFull else { return false }
        if admitted > 0 && used + bytes > limit {
            isFull = true
            return false
        }
        used += bytes
        admitted += 1
        return true
    }

    /// ``admit(bytes:)`` for a record's JSON, as it will be serialized.
    mutating func admit(_ json: JSON) -> Bool {
        guard !isFull else { return false }
        return admit(bytes: json.serializedBytes().count)
    }

    /// The per-item error of a lookup whose answer is full.
    func lookupRefusal(_ name: String) -> ServiceError {
        ServiceError(.limitExceeded, "not answered: the answer reached its limit of \(limit) bytes before record "
                 + "\(name.prefix(300)); look it up in another request")
    }
}

