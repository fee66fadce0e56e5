import LatticeCore

// Accounts and tokens: `POST /auth/signup`, `users/current`, `tokens/list`, `tokens/create`,
// `tokens/signinLink`, `tokens/revoke`, and `POST /auth/link` (a sign-in link exchanged for a session).

extension RequestReader {
    /// `lifetimeSeconds` as given (nil when left out): a whole number of seconds, 60 to ten years.
    /// - Throws: `lifetimeSeconds must be a whole number of seconds from 60 to 315360000 (ten years)`.
    public func lifetimeSeconds() throws(ServiceError) -> Int64? {
        guard let json = object["lifetimeSeconds"] else { return nil }
        guard let value = json.intValue, (60...315_360_000).contains(value) else {
            throw ServiceError.badRequest("lifetimeSeconds must be a whole number of seconds from 60 to 315360000 (ten years)")
        }
        return value
    }

    /// An optional `true` or `false`. - Throws: `key must be true or false`.
    public func optionalBool(_ key: String) throws(ServiceError) -> Bool? {
        guard let json = object[key] else { return nil }
        guard let value = json.boolValue else { throw ServiceError.badRequest("\(key) must be true or false") }
        return value
    }
}

/// `{"timestamp": ms}`, the API's form of a time.
private func timestamp(_ milliseconds: Int64) -> JSON { .object(["timestamp": .int(milliseconds)]) }

/// A token as the API shows it: its id, when it was made, when it expires, and a device's name for a
/// device's token. Never the secret or its hash.
public struct TokenInfo: Sendable, Hashable {
    public var tokenID: String
    public var createdMs: Int64
    /// Nil: the token never expires.
    public var expiresMs: Int64?
    public var deviceName: String?

    public init(tokenID: String, createdMs: Int64, expiresMs: Int64? = nil, deviceName: String? = nil) {
        self.tokenID = tokenID
        self.createdMs = createdMs
        self.expiresMs = expiresMs
        self.deviceName = deviceName
    }

    /// Reads the members of an answer that carries a token's description; nil without `tokenID`.
    public init?(json: JSON) {
        guard let id = json["tokenID"]?.stringValue else { return nil }
        self.init(tokenID: id, createdMs: json["created"]?["timestamp"]?.intValue ?? 0,
                  expiresMs: json["expires"]?["timestamp"]?.intValue, deviceName: json["deviceName"]?.stringValue)
    }

    /// `tokenID`, `created`, `expires`?, `deviceName`?: the members other answers add theirs to.
    public var members: [String: JSON] {
        var object: [String: JSON] = ["tokenID": .string(tokenID), "created": timestamp(createdMs)]
        if let expiresMs { object["expires"] = timestamp(expiresMs) }
        if let deviceName { object["deviceName"] = .string(deviceName) }
        return object
    }
}

// MARK: Sign-up and the current user

/// `POST /auth/signup {"name", "lifetimeSeconds"?, "session"?: true}`. With `session`, a page signs up and
/// gets a browser session instead of a bearer token (the server checks that request's origin first).
public struct SignUpRequest: Sendable, Hashable {
    public var name: String
    /// The first token's lifetime; nil means the server's maximum (or none).
    public var lifetimeSeconds: Int64?
    public var session: Bool

    public init(name: String, lifetimeSeconds: Int64? = nil, session: Bool = false) {
        self.name = name
        self.lifetimeSeconds = lifetimeSeconds
        self.session = session
    }

    /// Whether a body asks for a browser session (`"session": true`; anything else is a bearer sign-up).
    public static func asksForSession(_ json: JSON) -> Bool { json["session"] == .bool(true) }

    /// Reads `name`, then `lifetimeSeconds`, the server's order. The name's rules are the server's.
    public init(json: JSON) throws(ServiceError) {
        let reader = RequestReader(json)
        guard let name = reader["name"]?.stringValue else { throw ServiceError.badRequest("expected {\"name\": \"...\"}") }
        self.name = name
        lifetimeSeconds = try reader.lifetimeSeconds()
        session = Self.asksForSession(json)
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("name", name)
        writer.set("lifetimeSeconds", lifetimeSeconds.map { JSON.int($0) })
        if session { writer.set("session", true) }
        return writer.json
    }
}

/// The answer to a bearer sign-up: the account, and the one copy of its token's secret.
public struct SignUpResponse: Sendable, Hashable {
    public var userRecordName: String
    public var name: String
    public var token: String
    public var tokenInfo: TokenInfo

    public init(userRecordName: String, name: String, token: String, tokenInfo: TokenInfo) {
        self.userRecordName = userRecordName
        self.name = name
        self.token = token
        self.tokenInfo = tokenInfo
    }

    public init?(json: JSON) {
        guard let record = json["userRecordName"]?.stringValue, let token = json["token"]?.stringValue,
              let info = TokenInfo(json: json) else { return nil }
        self.init(userRecordName: record, name: json["name"]?.stringValue ?? "", token: token, tokenInfo: info)
    }

    public var json: JSON {
        var object = tokenInfo.members
        object["userRecordName"] = .string(userRecordName)
        object["name"] = .string(name)
        object["token"] = .string(token)
        return .object(object)
    }
}

/// `users/current`: no members.
public struct CurrentUserRequest: Sendable, Hashable {
    public init() {}
    public init(json: JSON) throws(ServiceError) {}
    public var json: JSON { .object([:]) }
}

/// The answer to `users/current`: who the token (or session) belongs to.
public struct CurrentUserResponse: Sendable, Hashable {
    public var userRecordName: String
    public var name: String

    public init(userRecordName: String, name: String) {
        self.userRecordName = userRecordName
        self.name = name
    }

    public init?(json: JSON) {
        guard let record = json["userRecordName"]?.stringValue else { return nil }
        self.init(userRecordName: record, name: json["name"]?.stringValue ?? "")
    }

    public var json: JSON { .object(["userRecordName": .string(userRecordName), "name": .string(name)]) }
}

// MARK: tokens/*

/// `tokens/list`: no members.
public struct TokensListRequest: Sendable, Hashable {
    public init() {}
    public init(json: JSON) throws(ServiceError) {}
    public var json: JSON { .object([:]) }
}

/// One token of `tokens/list`: its description, its kind (`bearer`, `device`, `session`, ...), whether
/// the request was made with it, and whether it has expired.
public struct TokenListing: Sendable, Hashable {
    public var info: TokenInfo
    public var kind: String
    public var current: Bool
    public var expired: Bool

    public init(info: TokenInfo, kind: String, current: Bool, expired: Bool) {
        self.info = info
        self.kind = kind
        self.current = current
        self.expired = expired
    }

    public init?(json: JSON) {
        guard let info = TokenInfo(json: json) else { return nil }
        self.init(info: info, kind: json["kind"]?.stringValue ?? "", current: json["current"]?.boolValue ?? false,
                  expired: json["expired"]?.boolValue ?? false)
    }

    public var json: JSON {
        var object = info.members
        object["kind"] = .string(kind)
        object["current"] = .bool(current)
        object["expired"] = .bool(expired)
        return .object(object)
    }
}

/// The answer to `tokens/list`: the caller's tokens, oldest first.
public struct TokensListResponse: Sendable, Hashable {
    public var tokens: [TokenListing]

    public init(tokens: [TokenListing]) { self.tokens = tokens }

    /// Nil without a `tokens` array; items that are not tokens are left out.
    public init?(json: JSON) {
        guard let items = json["tokens"]?.arrayValue else { return nil }
        tokens = items.compactMap(TokenListing.init(json:))
    }

    public var json: JSON { .object(["tokens": .array(tokens.map(\.json))]) }
}

/// `tokens/create {"lifetimeSeconds"?}`: another bearer token for the caller.
public struct TokenCreateRequest: Sendable, Hashable {
    public var lifetimeSeconds: Int64?

    public init(lifetimeSeconds: Int64? = nil) { self.lifetimeSeconds = lifetimeSeconds }

    public init(json: JSON) throws(ServiceError) {
        lifetimeSeconds = try RequestReader(json).lifetimeSeconds()
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("lifetimeSeconds", lifetimeSeconds.map { JSON.int($0) })
        return writer.json
    }
}

/// A new token and the one copy of its secret (`tokens/create`).
public struct IssuedTokenResponse: Sendable, Hashable {
    public var info: TokenInfo
    public var token: String

    public init(info: TokenInfo, token: String) {
        self.info = info
        self.token = token
    }

    public init?(json: JSON) {
        guard let info = TokenInfo(json: json), let token = json["token"]?.stringValue else { return nil }
        self.init(info: info, token: token)
    }

    public var json: JSON {
        var object = info.members
        object["token"] = .string(token)
        return .object(object)
    }
}

/// `tokens/signinLink`: no members.
public struct SignInLinkRequest: Sendable, Hashable {
    public init() {}
    public init(json: JSON) throws(ServiceError) {}
    public var json: JSON { .object([:]) }
}

/// A one-time sign-in link (`tokens/signinLink`): the secret is in the URL's fragment.
public struct SignInLinkResponse: Sendable, Hashable {
    public var info: TokenInfo
    public var url: String

    public init(info: TokenInfo, url: String) {
        self.info = info
        self.url = url
    }

    public init?(json: JSON) {
        guard let info = TokenInfo(json: json), let url = json["url"]?.stringValue else { return nil }
        self.init(info: info, url: url)
    }

    public var json: JSON {
        var object = info.members
        object["url"] = .string(url)
        return .object(object)
    }
}

/// `tokens/revoke {"tokens"?: [{"tokenID"}], "current"?: true, "all"?: true}`: named tokens, the one the
/// request is made with, or all of the caller's.
public struct TokensRevokeRequest: Sendable, Hashable {
    public var tokenIDs: [String]
    public var current: Bool
    public var all: Bool

    public init(tokenIDs: [String] = [], current: Bool = false, all: Bool = false) {
        self.tokenIDs = tokenIDs
        self.current = current
        self.all = all
    }

    /// The server's order: the list (objects, at most `maximumResultsLimit`), `current`, `all`, that
    /// something is named, then each `tokenID`, which only matters without `all` (that revokes every
    /// token whatever the list says).
    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        let reader = RequestReader(json)
        let named = try reader.items("tokens", limit: limits.maximumResultsLimit, optional: true)
        current = try reader.optionalBool("current") ?? false
        all = try reader.optionalBool("all") ?? false
        guard !named.isEmpty || current || all else {
            throw ServiceError.badRequest("name tokens to revoke: {\"tokens\": [{\"tokenID\": ...}]}, {\"current\": true} "
                                          + "or {\"all\": true}")
        }
        var ids: [String] = []
        for (index, item) in named.enumerated() {
            guard let id = item["tokenID"]?.stringValue else {
                if all { continue }
                throw ServiceError.badRequest("tokens[\(index)].tokenID is missing")
            }
            ids.append(id)
        }
        tokenIDs = ids
    }

    public var json: JSON {
        var writer = RequestWriter()
        if !tokenIDs.isEmpty { writer.set("tokens", JSON.array(tokenIDs.map { .object(["tokenID": .string($0)]) })) }
        if current { writer.set("current", true) }
        if all { writer.set("all", true) }
        return writer.json
    }
}

/// One token of a `tokens/revoke` answer: revoked, or the error (NOT_FOUND) that kept it.
public struct TokenRevocation: Sendable {
    public var tokenID: String
    /// Nil when the token was revoked.
    public var error: ServiceError?

    public init(tokenID: String, error: ServiceError? = nil) {
        self.tokenID = tokenID
        self.error = error
    }

    public var revoked: Bool { error == nil }

    public init?(json: JSON) {
        guard let id = json["tokenID"]?.stringValue else { return nil }
        tokenID = id
        error = json["revoked"] == .bool(true) ? nil : ServiceError(json: json) ?? ServiceError(.internalError, "")
    }

    public var json: JSON {
        if let error { return error.json(item: (key: "tokenID", value: tokenID)) }
        return .object(["tokenID": .string(tokenID), "revoked": .bool(true)])
    }
}

/// The answer to `tokens/revoke`: an item per token revoked or named.
public struct TokensRevokeResponse: Sendable {
    public var tokens: [TokenRevocation]

    public init(tokens: [TokenRevocation]) { self.tokens = tokens }

    public init?(json: JSON) {
        guard let items = json["tokens"]?.arrayValue else { return nil }
        tokens = items.compactMap(TokenRevocation.init(json:))
    }

    public var json: JSON { .object(["tokens": .array(tokens.map(\.json))]) }
}

// MARK: POST /auth/link

/// `POST /auth/link {"secret": "lt_...", "replaceSession"?: true}`: a page exchanges a one-time sign-in
/// link for a browser session.
public struct SignInLinkExchangeRequest: Sendable, Hashable {
    /// The answer to every link that does not work, a missing or wrongly typed `secret` included.
    public static let invalidLink = ServiceError(.authenticationFailed, "this sign-in link is invalid, expired or already "
                                                 + "used; run lattice login --web again for a new one")

    public var secret: String
    /// Switch a browser signed in to another account (else CONFLICT naming both).
    public var replaceSession: Bool

    public init(secret: String, replaceSession: Bool = false) {
        self.secret = secret
        self.replaceSession = replaceSession
    }

    /// The server's order: `secret` (its form is the server's to judge), then `replaceSession` (null is false).
    public init(json: JSON) throws(ServiceError) {
        guard let secret = json["secret"]?.stringValue else { throw Self.invalidLink }
        self.secret = secret
        switch json["replaceSession"] {
        case nil, .null?: replaceSession = false
        case .bool(let value)?: replaceSession = value
        default: throw ServiceError.badRequest("replaceSession must be true or false")
        }
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("secret", secret)
        if replaceSession { writer.set("replaceSession", true) }
        return writer.json
    }
}

/// A browser session as a page sees it (`GET /auth/session`, `POST /auth/link`, a session sign-up); the
/// session's secret is in the cookie only.
public struct SessionResponse: Sendable, Hashable {
    public var userRecordName: String
    public var name: String
    public var sessionID: String
    public var csrfToken: String
    public var container: String
    public var environment: String
    public var expiresMs: Int64?

    public init(userRecordName: String, name: String, sessionID: String, csrfToken: String, container: String,
                environment: String, expiresMs: Int64? = nil) {
        self.userRecordName = userRecordName
        self.name = name
        self.sessionID = sessionID
        self.csrfToken = csrfToken
        self.container = container
        self.environment = environment
        self.expiresMs = expiresMs
    }

    public init?(json: JSON) {
        guard let record = json["userRecordName"]?.stringValue, let sessionID = json["sessionID"]?.stringValue else {
            return nil
        }
        self.init(userRecordName: record, name: json["name"]?.stringValue ?? "", sessionID: sessionID,
                  csrfToken: json["csrfToken"]?.stringValue ?? "", container: json["container"]?.stringValue ?? "",
                  environment: json["environment"]?.stringValue ?? "", expiresMs: json["expires"]?["timestamp"]?.intValue)
    }

    public var json: JSON {
        var object: [String: JSON] = [
            "userRecordName": .string(userRecordName), "name": .string(name), "sessionID": .string(sessionID),
            "csrfToken": .string(csrfToken), "container": .string(container), "environment": .string(environment),
        ]
        if let expiresMs { object["expires"] = timestamp(expiresMs) }
        return .object(object)
    }
}
