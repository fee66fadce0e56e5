import LatticeAPI
import LatticeCore

/// Reading a request's JSON body with the API's path-precise messages.
package enum RequestBody {
    /// The array under `key` in a body, each element an object, at most `limit` of them.
    /// - Parameters:
    ///   - optional: a missing key means no items.
    ///   - allowStrings: items may be strings as well as objects.
    package static func items(_ body: [String: JSON], _ key: String, limit: Int, optional: Bool = false,
                              allowStrings: Bool = false) throws -> [JSON] {
        if optional && body[key] == nil { return [] }
        guard let array = body[key]?.arrayValue else { throw ServiceError.badRequest("expected \"\(key)\": [...]") }
        guard array.count <= limit else {
            throw ServiceError(.limitExceeded, "\(array.count) items in \(key); the limit is \(limit) per request")
        }
        for (index, item) in array.enumerated() where item.objectValue == nil && !(allowStrings && item.stringValue != nil) {
            throw ServiceError.badRequest("\(key)[\(index)] must be an object")
        }
        return array
    }
}
