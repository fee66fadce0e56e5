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

    public init(maximumOperations: Int = 400, maximumResultsLimit: Int = 200) {
        self.maximumOperations = maximumOperations
        self.maximumResultsLimit = maximumResultsLimit
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
