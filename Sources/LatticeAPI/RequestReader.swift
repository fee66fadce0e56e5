import LatticeCore

/// Reads the members of one request body (a JSON object) with types, throwing BAD_REQUEST or
/// LIMIT_EXCEEDED worded exactly as the server words them, so adopting it changes no answer.
public struct RequestReader: Sendable {
    public let object: [String: JSON]

    public init(_ object: [String: JSON]) { self.object = object }

    /// A body that must be an object; anything else is read as an empty object (the server's bodies are
    /// objects by the time an endpoint sees them).
    public init(_ json: JSON) { self.object = json.objectValue ?? [:] }

    public subscript(key: String) -> JSON? { object[key] }

    /// The array under `key`, each element an object (or a string with `allowStrings`), at most `limit`.
    /// - Throws: `expected "key": [...]` when missing or not an array, LIMIT_EXCEEDED over the limit,
    ///   `key[i] must be an object` for a wrongly typed element.
    public func items(_ key: String, limit: Int, optional: Bool = false, allowStrings: Bool = false) throws(ServiceError)
        -> [JSON] {
        if optional && object[key] == nil { return [] }
        guard let array = object[key]?.arrayValue else { throw ServiceError.badRequest("expected \"\(key)\": [...]") }
        guard array.count <= limit else {
            throw ServiceError(.limitExceeded, "\(array.count) items in \(key); the limit is \(limit) per request")
        }
        for (index, item) in array.enumerated() where item.objectValue == nil && !(allowStrings && item.stringValue != nil) {
            throw ServiceError.badRequest("\(key)[\(index)] must be an object")
        }
        return array
    }
}

/// Building request bodies for clients: members left nil are left out.
public struct RequestWriter: Sendable {
    public private(set) var object: [String: JSON] = [:]

    public init() {}

    public mutating func set(_ key: String, _ value: JSON?) { if let value { object[key] = value } }
    public mutating func set(_ key: String, _ value: String?) { if let value { object[key] = .string(value) } }
    public mutating func set(_ key: String, _ value: Bool?) { if let value { object[key] = .bool(value) } }
    public mutating func set(_ key: String, _ value: Int?) { if let value { object[key] = .int(Int64(value)) } }

    public var json: JSON { .object(object) }
}

/// The caps a request is checked against: server configuration, passed in by the decoder's caller.
public struct RequestLimits: Sendable, Hashable {
    /// Operations per modify request (`configuration.maximumOperations`).
    public var maximumOperations: Int
    /// Items per lookup or query answer (`configuration.maximumResultsLimit`).
    public var maximumResultsLimit: Int

    /// Fields per record of a modify operation (`configuration.maximumFieldsPerRecord`).
    public var maximumFieldsPerRecord: Int
    /// Elements per array anywhere in a modify operation's record (`configuration.maximumListElements`).
    public var maximumListElements: Int
    /// Filters, sort keys and values per filter of a query (`configuration.maximumQueryFilters`,
    /// `maximumQuerySortKeys`, `maximumFilterValues`).
    public var maximumQueryFilters: Int
    public var maximumQuerySortKeys: Int
    public var maximumFilterValues: Int

    public init(maximumOperations: Int = 400, maximumResultsLimit: Int = 200, maximumFieldsPerRecord: Int = 1_000,
                maximumListElements: Int = 50_000, maximumQueryFilters: Int = 64, maximumQuerySortKeys: Int = 8,
                maximumFilterValues: Int = 10_000) {
        self.maximumOperations = maximumOperations
        self.maximumResultsLimit = maximumResultsLimit
        self.maximumFieldsPerRecord = maximumFieldsPerRecord
        self.maximumListElements = maximumListElements
        self.maximumQueryFilters = maximumQueryFilters
        self.maximumQuerySortKeys = maximumQuerySortKeys
        self.maximumFilterValues = maximumFilterValues
    }
}

extension RequestReader {
    /// An optional string member. - Throws: `key must be a string` (the server's `syncToken` wording).
    public func optionalString(_ key: String) throws(ServiceError) -> String? {
        guard let value = object[key] else { return nil }
        guard let text = value.stringValue else { throw ServiceError.badRequest("\(key) must be a string") }
        return text
    }

    /// `resultsLimit` as given (nil when left out); the server clamps it to its maximum.
    /// - Throws: `resultsLimit must be a positive integer`.
    public func resultsLimit() throws(ServiceError) -> Int? {
        guard let json = object["resultsLimit"] else { return nil }
        guard let value = json.intValue, value >= 1 else { throw ServiceError.badRequest("resultsLimit must be a positive integer") }
        return Int(clamping: value)
    }
}

extension RequestReader {
    /// `clientOperationID`, the key of the replay cache (nil when left out).
    /// - Throws: `clientOperationID must be a string of 1 to 128 bytes`.
    public func clientOperationID() throws(ServiceError) -> String? {
        guard let json = object["clientOperationID"] else { return nil }
        guard let text = json.stringValue, (1...128).contains(text.utf8.count) else {
            throw ServiceError.badRequest("clientOperationID must be a string of 1 to 128 bytes")
        }
        return text
    }

    /// The zone id under `key` (`zoneID`), as the server's `parseZoneID` reads it.
    public func zoneID(_ key: String = "zoneID") throws(ServiceError) -> WireZoneID {
        try WireZoneID(json: object[key], path: key)
    }
}

extension RequestWriter {
    public mutating func set(_ key: String, _ value: [String]?) {
        if let value { object[key] = .array(value.map(JSON.string)) }
    }
}
