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
