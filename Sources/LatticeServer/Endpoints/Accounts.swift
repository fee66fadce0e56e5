import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore
import Synchronization

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

extension LatticeService {
    /// `POST /auth/signup {"name": ..., "lifetimeSeconds"?: n}` from `address` (the client's address,
    /// as the HTTP layer determined it). Sign-ups are limited per address and globally, in the database.
    func signUp(_ body: [String: JSON], address: String) throws -> HTTPResponse {
        guard configuration.registrationOpen else {
            throw ServiceError(.accessDenied, "registration is closed on this server; the administrator adds users "
                           + "with lattice admin add-user")
        }
        guard let name = body["name"]?.stringValue else { throw ServiceError.badRequest("expected {\"name\": \"...\"}") }
        let lifetime = try lifetimeSeconds(body["lifetimeSeconds"])
        try checkDiskBudget("sign-up")
        let account = try createAccount(name: name, lifetimeSeconds: lifetime, signUpAddress: address)
        var object: [String: JSON] = ["userRecordName": .string(account.user.recordName), "name": .string(account.user.name),
                                      "token": .string(account.token.text)]
        for (key, value) in tokenJSONFields(account.tokenInfo) { object[key] = value }
        return .json(.object(object))
    }

    /// Creates a user with a fresh token (for sign-up and `lattice admin add-user`).
    /// - Parameters:
    ///   - lifetimeSeconds: the token's requested lifetime (nil: the server's maximum, or none).
    ///   - signUpAddress: for `POST /auth/signup`, the client's address: the sign-up limits are checked and
    ///     the sign-up recorded in the same transaction. Nil for accounts the administrator makes.
    /// - Throws: `ServiceError` BAD_REQUEST for an illegal name, EXISTS for a taken one, THROTTLED over a
    ///   sign-up limit.
    ///   - kind: the first token's kind: a bearer token, or a browser session (`Sessions.swift`).
    public func createAccount(name: String, lifetimeSeconds: Int64? = nil, signUpAddress: String? = nil) throws
        -> NewAccount {
        try createAccount(name: name, lifetimeSeconds: lifetimeSeconds, signUpAddress: signUpAddress, kind: .bearer)
    }

    func createAccount(name: String, lifetimeSeconds: Int64?, signUpAddress: String?, kind: TokenKind) throws -> NewAccount {
        try Self.validateUserName(name)
        let token = try BearerToken.generate()
        let tokenID = try kind.newID()
        let recordName = "_" + Secrets.hex(try Secrets.randomBytes(16))
        let now = configuration.now()
        let expires = tokenExpiry(lifetimeSeconds, nowMs: now)
        do {
            let (user, info) = try storage.write(deadline: freshDeadline()) { tx in
                if let signUpAddress { try checkSignUpLimits(address: ClientAddress.limitKey(signUpAddress), nowMs: now, tx) }
                let user = try tx.insertUser(name: name, recordName: recordName, nowMs: now)
                let new = NewToken(hash: token.storedHash, id: tokenID, userID: user.id, createdMs: now, expiresMs: expires)
                try tx.insertToken(new)
                if let signUpAddress { try tx.recordSignUp(address: ClientAddress.limitKey(signUpAddress), nowMs: now) }
                return (user, StoredToken(id: tokenID, userID: user.id, createdMs: now, expiresMs: expires))
            }
            if let signUpAddress { log("sign-up: user \(name) from \(signUpAddress.isEmpty ? "-" : signUpAddress)") }
            return NewAccount(user: user, token: token, tokenInfo: info)
        } catch StorageError.duplicate {
            throw ServiceError(.exists, "the user name \(name) is taken")
        }
    }

    /// The sign-up limits: at most `signUpsPerAddress` from one address and `signUpsGlobal` from all in the
    /// sliding window, counted in the database (so every server process on it shares the count).
    private func checkSignUpLimits(address: String, nowMs: Int64, _ tx: any StorageTransaction) throws {
        let window = configuration.signUpWindowMilliseconds
        let since = nowMs - window + 1 // the window is the last `window` milliseconds, now included
        // Sign-ups on every node wait for each other here, so two cannot both pass a count of limit - 1.
        try serialize("signups", tx)
        try tx.forgetSignUps(before: since)
        func check(_ limit: Int?, _ address: String?, _ what: String) throws {
            guard let limit else { return }
            let counted = try tx.signUps(address: address, sinceMs: since)
            guard counted.count >= limit else { return }
            let freeAtMs = (counted.oldestMs ?? nowMs) + window
            let wait = max(1, Int((Double(freeAtMs - nowMs) / 1000).rounded(.up)))
            logRefusal("signup " + (address ?? "*"), "sign-up refused: the limit \(what) of \(limit) per "
                       + "\(window / 1000) s is reached (address \(address ?? "any"))")
            throw ServiceError(.throttled, "too many sign-ups \(what) (at most \(limit) per \(window / 1000) s); "
                           + "retry after \(wait) s", retryAfter: wait)
        }
        try check(configuration.signUpsPerAddress, address, "from this address")
        try check(configuration.signUpsGlobal, nil, "on this server")
    }

    /// Makes another token for an existing user (`tokens/create`, or `lattice admin` tooling).
    /// - Throws: LIMIT_EXCEEDED when the user already has `maximumTokensPerUser` tokens.
    public func issueToken(userID: Int64, lifetimeSeconds: Int64? = nil) throws -> IssuedToken {
        let token = try BearerToken.generate()
        let tokenID = try Self.newTokenID()
        let now = configuration.now()
        let expires = tokenExpiry(lifetimeSeconds, nowMs: now)
        let info = try storage.write(deadline: freshDeadline()) { tx in
            // Token issues wait for each other here, so two nodes cannot both pass a count of cap - 1.
            try serialize("tokens", tx)
            guard try tx.tokens(userID: userID).count < configuration.maximumTokensPerUser else {
                throw ServiceError(.limitExceeded, "a user has at most \(configuration.maximumTokensPerUser) tokens; "
                               + "revoke some with tokens/revoke")
            }
            try tx.insertToken(NewToken(hash: token.storedHash, id: tokenID, userID: userID, createdMs: now,
                                        expiresMs: expires))
            return StoredToken(id: tokenID, userID: userID, createdMs: now, expiresMs: expires)
        }
        return IssuedToken(token: token, info: info)
    }

    /// A token's non-secret id: 16 hex digits.
    static func newTokenID() throws -> String { Secrets.hex(try Secrets.randomBytes(8)) }

    /// When a token made now with the requested lifetime expires: the request capped by the server's
    /// maximum; with neither, never.
    func tokenExpiry(_ lifetimeSeconds: Int64?, nowMs: Int64) -> Int64? {
        var lifetime = lifetimeSeconds
        if let maximum = configuration.maximumTokenLifetimeSeconds { lifetime = min(lifetime ?? maximum, maximum) }
        return lifetime.map { nowMs + $0 * 1000 }
    }

    /// `lifetimeSeconds`: a whole number of seconds, 60 to ten years.
    func lifetimeSeconds(_ json: JSON?) throws -> Int64? {
        guard let json else { return nil }
        guard let value = json.intValue, (60...315_360_000).contains(value) else {
            throw ServiceError.badRequest("lifetimeSeconds must be a whole number of seconds from 60 to 315360000 (ten years)")
        }
        return value
    }

    /// A token as the API shows it: id, created, expiry, and the device's name for a device's token. Never
    /// the secret or its hash.
    func tokenJSONFields(_ token: StoredToken) -> [String: JSON] {
        var object: [String: JSON] = ["tokenID": .string(token.id), "created": .object(["timestamp": .int(token.createdMs)])]
        if let expires = token.expiresMs { object["expires"] = .object(["timestamp": .int(expires)]) }
        if let name = token.name { object["deviceName"] = .string(name) }
        return object
    }

    // MARK: Tokens

    /// `tokens/list` (private database): the caller's tokens, oldest first, each by id with its created
    /// and expiry times; `current` marks the one the request was made with.
    func listTokens(_ context: RequestContext) throws -> JSON {
        try requirePrivate(context, "tokens/list")
        let tokens = try storage.read(deadline: context.deadline) { tx in try tx.tokens(userID: context.user.id) }
        let now = configuration.now()
        return .object(["tokens": .array(tokens.map { token in
            var object = tokenJSONFields(token)
            object["kind"] = .string(TokenKind(id: token.id).rawValue)
            object["current"] = .bool(token.id == context.tokenID)
            object["expired"] = .bool(token.expiresMs.map { $0 <= now } ?? false)
            return .object(object)
        })])
    }

    /// `tokens/create {"lifetimeSeconds"?}` (private database): another token for the caller (a second
    /// device). The secret is in this answer only.
    func createToken(_ context: RequestContext) throws -> JSON {
        try requirePrivate(context, "tokens/create")
        let lifetime = try lifetimeSeconds(context.body["lifetimeSeconds"])
        try checkDiskBudget("tokens/create")
        let issued = try issueToken(userID: context.user.id, lifetimeSeconds: lifetime)
        var object = tokenJSONFields(issued.info)
        object["token"] = .string(issued.token.text)
        return .object(object)
    }

    /// `tokens/revoke {"tokens"?: [{"tokenID"}], "current"?: true, "all"?: true}` (private database):
    /// revokes the named tokens of the caller, the one the request was made with, or all of them. A
    /// revoked token fails on its next request (nothing is cached). Each named token gets an item: revoked,
    /// or NOT_FOUND (also for another user's token id).
    func revokeTokens(_ context: RequestContext) throws -> JSON {
        try requirePrivate(context, "tokens/revoke")
        let named = try items(context.body, "tokens", limit: configuration.maximumResultsLimit, optional: true)
        let current = try flag(context.body["current"], "current")
        let all = try flag(context.body["all"], "all")
        guard !named.isEmpty || current || all else {
            throw ServiceError.badRequest("name tokens to revoke: {\"tokens\": [{\"tokenID\": ...}]}, {\"current\": true} "
                                      + "or {\"all\": true}")
        }
        let user = context.user
        let results: [JSON] = try write(deadline: context.deadline) { tx, _ in
            var results: [JSON] = []
            if all {
                for token in try tx.tokens(userID: user.id) {
                    guard try tx.deleteToken(id: token.id) else { continue }
                    results.append(.object(["tokenID": .string(token.id), "revoked": .bool(true)]))
                }
                return results
            }
            var ids: [String] = []
            for (index, item) in named.enumerated() {
                guard let id = item["tokenID"]?.stringValue else { throw ServiceError.badRequest("tokens[\(index)].tokenID is missing") }
                ids.append(id)
            }
            if current, let id = context.tokenID, !ids.contains(id) { ids.append(id) }
            for id in ids {
                if let token = try tx.token(id: id), token.userID == user.id, try tx.deleteToken(id: id) {
                    results.append(.object(["tokenID": .string(id), "revoked": .bool(true)]))
                } else {
                    results.append(ServiceError(.notFound, "you have no token \(id.prefix(64))").json(item: (key: "tokenID", value: id)))
                }
            }
            return results
        }
        log("tokens revoked: user \(user.name), \(results.filter { $0["revoked"] == .bool(true) }.count)")
        return .object(["tokens": .array(results)])
    }

    private func requirePrivate(_ context: RequestContext, _ operation: String) throws {
        guard context.kind == .private else { throw ServiceError.badRequest("\(operation) is a private database operation") }
    }

    private func flag(_ json: JSON?, _ name: String) throws -> Bool {
        guard let json else { return false }
        guard let value = json.boolValue else { throw ServiceError.badRequest("\(name) must be true or false") }
        return value
    }

    /// Revokes tokens with the data directory's storage (`lattice admin revoke-token`): one token by id, or
    /// every token of a user. Returns the ids revoked.
    public func revokeTokens(tokenID: String? = nil, userName: String? = nil) throws -> [String] {
        try storage.write { tx in
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
        try storage.read { tx in
            guard let user = try tx.user(named: userName) else { throw ServiceError(.notFound, "no user named \(userName)") }
            return try tx.tokens(userID: user.id)
        }
    }

    // MARK: Disk budget

    /// How long a measured size stands for the disk budget (on the service's clock): re-measured at most this
    /// often, by one request at a time, so the budget costs no storage call on most writes.
    static let diskBudgetMeasurementIntervalMilliseconds: Int64 = 1_000
    /// The deadline of one measurement (on PostgreSQL a read of `pg_database_size`).
    static let diskBudgetMeasurementDeadlineMilliseconds: Int64 = 1_000

    /// Refuses a write that adds data when the database is over the server-wide disk budget, as measured
    /// within the last `diskBudgetMeasurementIntervalMilliseconds` (`DiskUsageReading`): a node may let through
    /// what it admits in that time past the budget. Each node keeps its own reading.
    func checkDiskBudget(_ what: String) throws {
        guard let budget = configuration.diskBudgetBytes else { return }
        let size: Int64
        do {
            size = try diskUsage.bytes(nowMs: configuration.now(),
                                       maximumAgeMilliseconds: Self.diskBudgetMeasurementIntervalMilliseconds) {
                try storage.sizeOnDisk(deadline: .after(milliseconds: Self.diskBudgetMeasurementDeadlineMilliseconds))
            }
        } catch {
            logRefusal("disk budget measurement", "disk budget: the database's size cannot be measured (\(error)); "
                       + "refusing writes that add data until it can (first refused: \(what)); at most one such line a minute")
            throw ServiceError(.tryAgainLater, "the server cannot measure its disk use now; nothing was written; retry later",
                           retryAfter: 1)
        }
        guard size >= budget else { return }
        logRefusal("disk budget", "disk budget: the database uses \(size) bytes of \(budget); refusing writes that add "
                   + "data (first refused: \(what)); at most one such line a minute")
        throw ServiceError(.quotaExceeded, "the server is full: its database uses \(size) bytes of its \(budget)-byte disk "
                       + "budget; reads and deletions still work")
    }

    // MARK: Names

    /// User names: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, starting with a letter or digit.
    static func validateUserName(_ name: String) throws(ServiceError) {
        let bytes = Array(name.utf8)
        func isAlphanumeric(_ c: UInt8) -> Bool { (c | 0x20) >= 97 && (c | 0x20) <= 122 || (c >= 48 && c <= 57) }
        guard (1...64).contains(bytes.count), isAlphanumeric(bytes[0]),
              bytes.allSatisfy({ isAlphanumeric($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") })
        else {
            throw ServiceError.badRequest("a user name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        }
    }
}

/// The storage's size on disk as last measured, for the disk budget (`LatticeService.checkDiskBudget`),
/// shared by every request thread of one service.
///
/// A reading younger than the maximum age is used as it is; an older one is replaced by the first caller
/// that finds it stale, while the others go on with the old reading meanwhile, so at most one measurement
/// runs at a time. A measurement that fails keeps the old reading (and counts as this round's measurement);
/// with no reading at all the failure is thrown.
final class DiskUsageReading: Sendable {
    private struct State {
        var bytes: Int64?
        /// When `bytes` was measured or last tried, on the service's clock.
        var measuredMs: Int64 = 0
        var measuring = false
    }

    private let state = Mutex(State())

    /// The size to check the budget against at `nowMs`; `measure` runs when the reading is older than
    /// `maximumAgeMilliseconds` (or from the future: a clock set back) and nobody else is measuring.
    func bytes(nowMs: Int64, maximumAgeMilliseconds: Int64, measure: () throws -> Int64) throws -> Int64 {
        let cached: Int64? = state.withLock { state in
            if let bytes = state.bytes, state.measuring || (0..<maximumAgeMilliseconds).contains(nowMs - state.measuredMs) {
                return bytes
            }
            state.measuring = true
            return nil
        }
        if let cached { return cached }
        do {
            let bytes = try measure()
            state.withLock { $0 = State(bytes: bytes, measuredMs: nowMs, measuring: false) }
            return bytes
        } catch {
            let previous: Int64? = state.withLock { state in
                state.measuring = false
                if state.bytes != nil { state.measuredMs = nowMs }
                return state.bytes
            }
            guard let previous else { throw error }
            return previous
        }
    }
}
