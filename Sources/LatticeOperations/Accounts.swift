import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore

/// A new account and the one copy of its bearer token.
public struct NewAccount: Sendable {
    public let user: UserAccount
    public let token: BearerToken
    /// The token's non-secret id and expiry.
    public let tokenInfo: StoredToken
}

/// A new bearer token for an existing user, and the one copy of its secret.
public struct IssuedToken: Sendable {
    public let token: BearerToken
    public let info: StoredToken
}

/// Where a request came from, as the HTTP layer determined it: the address (for the log) and the key
/// per-address limits count it under (an IPv4 address, or an IPv6 /64).
public struct ClientOrigin: Sendable {
    public let address: String
    public let limitKey: String

    public init(address: String, limitKey: String) {
        self.address = address
        self.limitKey = limitKey
    }
}

/// Accounts and their bearer tokens: sign-up (limited per address and globally, in the database), the
/// administrator's accounts, and the caller's tokens (`tokens/list`, `tokens/create`, `tokens/revoke`).
public struct Accounts: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// `POST /auth/signup {"name": ..., "lifetimeSeconds"?: n}` from `address` (the client's address,
    /// as the HTTP layer determined it). Sign-ups are limited per address and globally, in the database.
    public func signUp(_ body: [String: JSON], from origin: ClientOrigin) throws -> JSON {
        guard core.configuration.registrationOpen else {
            throw ServiceError(.accessDenied, "registration is closed on this server; the administrator adds users "
                           + "with lattice admin add-user")
        }
        let request = try SignUpRequest(json: .object(body))
        try core.checkDiskBudget("sign-up")
        let account = try createAccount(name: request.name, lifetimeSeconds: request.lifetimeSeconds, signUpFrom: origin)
        return SignUpResponse(userRecordName: account.user.recordName, name: account.user.name, token: account.token.text,
                              tokenInfo: tokenInfo(account.tokenInfo)).json
    }

    /// Creates a user with a fresh token (for sign-up and `lattice admin add-user`).
    /// - Parameters:
    ///   - lifetimeSeconds: the token's requested lifetime (nil: the server's maximum, or none).
    ///   - signUpFrom: for `POST /auth/signup`, where the client is: the sign-up limits are checked and
    ///     the sign-up recorded in the same transaction. Nil for accounts the administrator makes.
    /// - Throws: `ServiceError` BAD_REQUEST for an illegal name, EXISTS for a taken one, THROTTLED over a
    ///   sign-up limit.
    ///   - kind: the first token's kind: a bearer token, or a browser session (`Sessions.swift`).
    /// `also` runs in the same transaction once the user exists (a passkey and recovery codes made with
    /// the account): if it throws, no account is made.
    public func createAccount(name: String, lifetimeSeconds: Int64? = nil, signUpFrom origin: ClientOrigin? = nil,
                              kind: TokenKind = .bearer,
                              also: (UserAccount, any StorageTransaction) throws -> Void = { _, _ in }) throws -> NewAccount {
        try Self.validateUserName(name)
        let token = try BearerToken.generate()
        let tokenID = try kind.newID()
        let recordName = "_" + Secrets.hex(try Secrets.randomBytes(16))
        let now = core.configuration.now()
        let expires = tokenExpiry(lifetimeSeconds, nowMs: now)
        do {
            let (user, info) = try core.storage.write(deadline: core.freshDeadline()) { tx in
                if let origin { try checkSignUpLimits(address: origin.limitKey, nowMs: now, tx) }
                let user = try tx.insertUser(name: name, recordName: recordName, nowMs: now)
                let new = NewToken(hash: token.storedHash, id: tokenID, userID: user.id, createdMs: now, expiresMs: expires)
                try tx.insertToken(new)
                if let origin { try tx.recordSignUp(address: origin.limitKey, nowMs: now) }
                try also(user, tx)
                return (user, StoredToken(id: tokenID, userID: user.id, createdMs: now, expiresMs: expires))
            }
            if let origin { core.log("sign-up: user \(name) from \(origin.address.isEmpty ? "-" : origin.address)") }
            return NewAccount(user: user, token: token, tokenInfo: info)
        } catch StorageError.duplicate {
            throw ServiceError(.exists, "the user name \(name) is taken")
        }
    }

    /// The sign-up limits: at most `signUpsPerAddress` from one address and `signUpsGlobal` from all in the
    /// sliding window, counted in the database (so every server process on it shares the count).
    private func checkSignUpLimits(address: String, nowMs: Int64, _ tx: any StorageTransaction) throws {
        let window = core.configuration.signUpWindowMilliseconds
        let since = nowMs - window + 1 // the window is the last `window` milliseconds, now included
        // Sign-ups on every node wait for each other here, so two cannot both pass a count of limit - 1.
        try core.serialize("signups", tx)
        try tx.forgetSignUps(before: since)
        func check(_ limit: Int?, _ address: String?, _ what: String) throws {
            guard let limit else { return }
            let counted = try tx.signUps(address: address, sinceMs: since)
            guard counted.count >= limit else { return }
            let freeAtMs = (counted.oldestMs ?? nowMs) + window
            let wait = max(1, Int((Double(freeAtMs - nowMs) / 1000).rounded(.up)))
            core.logRefusal("signup " + (address ?? "*"), "sign-up refused: the limit \(what) of \(limit) per "
                       + "\(window / 1000) s is reached (address \(address ?? "any"))")
            throw ServiceError(.throttled, "too many sign-ups \(what) (at most \(limit) per \(window / 1000) s); "
                           + "retry after \(wait) s", retryAfter: wait)
        }
        try check(core.configuration.signUpsPerAddress, address, "from this address")
        try check(core.configuration.signUpsGlobal, nil, "on this server")
    }

    /// Makes another token for an existing user (`tokens/create`, or `lattice admin` tooling).
    /// - Throws: LIMIT_EXCEEDED when the user already has `maximumTokensPerUser` tokens.
    public func issueToken(userID: Int64, lifetimeSeconds: Int64? = nil) throws -> IssuedToken {
        let token = try BearerToken.generate()
        let tokenID = try TokenKind.bearer.newID()
        let now = core.configuration.now()
        let expires = tokenExpiry(lifetimeSeconds, nowMs: now)
        let info = try core.storage.write(deadline: core.freshDeadline()) { tx in
            // Token issues wait for each other here, so two nodes cannot both pass a count of cap - 1.
            try core.serialize("tokens", tx)
            guard try tx.tokens(userID: userID).count < core.configuration.maximumTokensPerUser else {
                throw ServiceError(.limitExceeded, "a user has at most \(core.configuration.maximumTokensPerUser) tokens; "
                               + "revoke some with tokens/revoke")
            }
            try tx.insertToken(NewToken(hash: token.storedHash, id: tokenID, userID: userID, createdMs: now,
                                        expiresMs: expires))
            return StoredToken(id: tokenID, userID: userID, createdMs: now, expiresMs: expires)
        }
        return IssuedToken(token: token, info: info)
    }

    /// When a token made now with the requested lifetime expires: the request capped by the server's
    /// maximum; with neither, never.
    package func tokenExpiry(_ lifetimeSeconds: Int64?, nowMs: Int64) -> Int64? {
        var lifetime = lifetimeSeconds
        if let maximum = core.configuration.maximumTokenLifetimeSeconds { lifetime = min(lifetime ?? maximum, maximum) }
        return lifetime.map { nowMs + $0 * 1000 }
    }

    /// A token as the API shows it: id, created, expiry, and the device's name for a device's token. Never
    /// the secret or its hash.
    package func tokenInfo(_ token: StoredToken) -> TokenInfo {
        TokenInfo(tokenID: token.id, createdMs: token.createdMs, expiresMs: token.expiresMs, deviceName: token.name)
    }

    // MARK: Tokens

    /// `tokens/list` (private database): the caller's tokens, oldest first, each by id with its created
    /// and expiry times; `current` marks the one the request was made with.
    public func listTokens(_ caller: Caller) throws -> JSON {
        try requirePrivate(caller, "tokens/list")
        let tokens = try core.storage.read(deadline: caller.deadline) { tx in try tx.tokens(userID: caller.user.id) }
        let now = core.configuration.now()
        return TokensListResponse(tokens: tokens.map { token in
            TokenListing(info: tokenInfo(token), kind: TokenKind(id: token.id).rawValue, current: token.id == caller.tokenID,
                         expired: token.expiresMs.map { $0 <= now } ?? false)
        }).json
    }

    /// `tokens/create {"lifetimeSeconds"?}` (private database): another token for the caller (a second
    /// device). The secret is in this answer only.
    public func createToken(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        try requirePrivate(caller, "tokens/create")
        let request = try TokenCreateRequest(json: .object(body))
        try core.checkDiskBudget("tokens/create")
        let issued = try issueToken(userID: caller.user.id, lifetimeSeconds: request.lifetimeSeconds)
        return IssuedTokenResponse(info: tokenInfo(issued.info), token: issued.token.text).json
    }

    /// `tokens/revoke {"tokens"?: [{"tokenID"}], "current"?: true, "all"?: true}` (private database):
    /// revokes the named tokens of the caller, the one the request was made with, or all of them. A
    /// revoked token fails on its next request (nothing is cached). Each named token gets an item: revoked,
    /// or NOT_FOUND (also for another user's token id).
    public func revokeTokens(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        try requirePrivate(caller, "tokens/revoke")
        let request = try TokensRevokeRequest(json: .object(body), limits: RequestLimits(
            maximumOperations: core.configuration.maximumOperations, maximumResultsLimit: core.configuration.maximumResultsLimit))
        let user = caller.user
        let results: [TokenRevocation] = try core.write(deadline: caller.deadline) { tx, _ in
            var results: [TokenRevocation] = []
            if request.all {
                for token in try tx.tokens(userID: user.id) {
                    guard try tx.deleteToken(id: token.id) else { continue }
                    results.append(TokenRevocation(tokenID: token.id))
                }
                return results
            }
            var ids = request.tokenIDs
            if request.current, let id = caller.tokenID, !ids.contains(id) { ids.append(id) }
            for id in ids {
                if let token = try tx.token(id: id), token.userID == user.id, try tx.deleteToken(id: id) {
                    results.append(TokenRevocation(tokenID: id))
                } else {
                    results.append(TokenRevocation(tokenID: id, error: ServiceError(.notFound, "you have no token \(id.prefix(64))")))
                }
            }
            return results
        }
        core.log("tokens revoked: user \(user.name), \(results.filter(\.revoked).count)")
        return TokensRevokeResponse(tokens: results).json
    }

    private func requirePrivate(_ caller: Caller, _ operation: String) throws {
        guard caller.database == .private else { throw ServiceError.badRequest("\(operation) is a private database operation") }
    }

    /// Revokes tokens with the data directory's storage (`lattice admin revoke-token`): one token by id, or
    /// every token of a user. Returns the ids revoked.
    public func revokeTokens(tokenID: String? = nil, userName: String? = nil) throws -> [String] {
        try core.storage.write { tx in
            if let tokenID {
                guard try tx.token(id: tokenID) != nil, try tx.deleteToken(id: tokenID) else {
                    throw ServiceError(.notFound, "no token with id \(tokenID)")
                }
                return [tokenID]
            }
            guard let userName, let user = try tx.user(named: userName) else {
                throw ServiceError(.notFound, "no user named \(userName ?? "")")
            }
            let ids = try tx.tokens(userID: user.id).map(\.id)
            _ = try tx.deleteTokens(userID: user.id)
            return ids
        }
    }

    /// A user's tokens, for `lattice admin tokens`.
    public func tokens(userName: String) throws -> [StoredToken] {
        try core.storage.read { tx in
            guard let user = try tx.user(named: userName) else { throw ServiceError(.notFound, "no user named \(userName)") }
            return try tx.tokens(userID: user.id)
        }
    }

    // MARK: Names

    /// User names: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, starting with a letter or digit.
    package static func validateUserName(_ name: String) throws(ServiceError) {
        let bytes = Array(name.utf8)
        func isAlphanumeric(_ c: UInt8) -> Bool { (c | 0x20) >= 97 && (c | 0x20) <= 122 || (c >= 48 && c <= 57) }
        guard (1...64).contains(bytes.count), isAlphanumeric(bytes[0]),
              bytes.allSatisfy({ isAlphanumeric($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") })
        else {
            throw ServiceError.badRequest("a user name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        }
    }
}

