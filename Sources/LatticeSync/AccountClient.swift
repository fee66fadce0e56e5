import Foundation
import LatticeAPI
import LatticeCore

/// Talks to a Lattice server about an account, for what only works online: signing up, signing in with a
/// token or an OpenID Connect ID token, accepting a share, revoking the account's token, and raw calls such
/// as sharing, tokens and devices. Its calls are async (cancelling the task ends one). It keeps nothing: an
/// app gives the `Account` it returns to its engines (`LatticeSyncEngine.Configuration.account`).
///
/// Every call goes through `ServerClient`: "not now" answers (THROTTLED, TRY_AGAIN_LATER) are retried
/// quietly for a short while, longer waits are announced to `server.onWait`, and a `retryAfter` longer
/// than `server.longestQuietWait` is thrown at once (`ServerError.retryAdvice` says when to try again).
///
/// ```swift
/// let server = try AccountClient(serverURL: "http://127.0.0.1:8080")
/// let account = try await server.signUp(name: "alice")
/// let link = try await server.call("private", "shares/url", body, as: account)
/// ```
public struct AccountClient: Sendable {
    /// The server this client talks to; an account it is given must be of this server.
    public let serverURL: String
    /// The calls' retries and "not now" handling (`maximumAttempts`, `onWait`, `longestQuietWait`).
    public var server: ServerClient

    /// A client of the server at `serverURL`, over `transport` (tests inject an in-process one), else HTTP.
    public init(serverURL: String, transport: (any SyncTransport)? = nil) throws {
        self.serverURL = serverURL
        server = ServerClient(transport: try transport ?? HTTPTransport(serverURL: serverURL))
    }

    /// Creates an account named `name` on the server (`POST /auth/signup`).
    /// - Returns: the new account with its bearer token; nothing is kept here.
    public func signUp(name: String) async throws -> Account {
        let reply = try await server.post("/auth/signup", SignUpRequest(name: name).json, token: nil)
        guard let answer = SignUpResponse(json: reply) else { throw SyncError.unexpectedAnswer("signup") }
        return Account(serverURL: serverURL, token: answer.token, userRecordName: answer.userRecordName, name: name)
    }

    /// The account an existing token belongs to, checked with `users/current`.
    public func signIn(token: String) async throws -> Account {
        let reply = try await server.call("private", "users/current", CurrentUserRequest().json, token: token)
        guard let user = CurrentUserResponse(json: reply) else { throw SyncError.unexpectedAnswer("users/current") }
        return Account(serverURL: serverURL, token: token, userRecordName: user.userRecordName, name: user.name)
    }

    /// The account of a user the app signed in with an OpenID Connect provider the server accepts
    /// (`POST /auth/oidc/token`): the provider's ID token is exchanged for a device token of the account
    /// its `(iss, sub)` maps to (made on the first sign-in).
    /// - Throws: `ServerError` (`AUTHENTICATION_FAILED` for a token the server refuses, `BAD_REQUEST` for an
    ///   issuer it does not accept), `TransportError` offline.
    public func signIn(idToken: String, issuer: String, deviceName: String? = nil) async throws -> Account {
        var body: [String: JSON] = ["issuer": .string(issuer), "idToken": .string(idToken)]
        if let deviceName { body["deviceName"] = .string(deviceName) }
        let reply = try await server.post("/auth/oidc/token", .object(body), token: nil)
        guard let token = reply["token"]?.stringValue, let user = reply["userRecordName"]?.stringValue else {
            throw SyncError.unexpectedAnswer("auth/oidc/token")
        }
        return Account(serverURL: serverURL, token: token, userRecordName: user, name: reply["name"]?.stringValue ?? user)
    }

    /// What accepting a share gave, as `CKShare.Metadata` tells it.
    public struct AcceptedShare: Sendable, Hashable {
        /// The shared zone, as the shared database's engine reports it.
        public let zoneID: LatticeRecordZone.ID
        /// The shared root record, nil for a share of the whole zone.
        public let rootRecordName: String?
        public let title: String?
        public let ownerName: String?
        /// `readOnly` or `readWrite`.
        public let permission: String
    }

    /// Accepts a share link (a long or a short one) for `account` (`records/accept`), as CloudKit's
    /// `CKAcceptSharesOperation`: the zone then comes with the next fetch of a `.shared` engine.
    /// - Throws: `ServerError` when the link is invalid, expired or revoked, or the account may not join.
    public func acceptShare(_ link: String, as account: Account) async throws -> AcceptedShare {
        let reply = try await call("shared", "records/accept", .object(["shortGUIDs": .array([.object(["value": .string(link)])])]),
                             as: account)
        guard let result = reply["results"]?.arrayValue?.first else { throw SyncError.unexpectedAnswer("records/accept") }
        if let code = result["serverErrorCode"]?.stringValue {
            throw ServerError(code: code, reason: result["reason"]?.stringValue ?? code, status: 200, retryAfter: nil)
        }
        guard let zoneName = result["zoneID"]?["zoneName"]?.stringValue,
              let owner = result["zoneID"]?["ownerRecordName"]?.stringValue,
              let permission = result["participantPermission"]?.stringValue, permission != "none" else {
            throw ServerError(code: ServerErrorCode.permissionFailure.rawValue, reason: "the share cannot be joined with this link",
                              status: 200, retryAfter: nil)
        }
        return AcceptedShare(zoneID: LatticeRecordZone.ID(zoneName: zoneName, ownerName: owner),
                             rootRecordName: result["rootRecordName"]?.stringValue, title: result["title"]?.stringValue,
                             ownerName: result["ownerIdentity"]?["name"]?.stringValue, permission: permission)
    }

    /// Revokes the account's token on the server (`tokens/revoke` with `current`): its next use fails.
    /// - Returns: whether the server revoked it now; false when the server no longer accepted it (already
    ///   revoked or expired: nothing left to revoke).
    /// - Throws: `TransportError` when the server cannot be reached, or the server's refusal other than
    ///   AUTHENTICATION_FAILED.
    @discardableResult
    public func revokeToken(of account: Account) async throws -> Bool {
        try requireSameServer(account)
        do {
            try await server.revokeToken(account.token)
            return true
        } catch let error as ServerError where error.serverErrorCode == .authenticationFailed {
            return false
        }
    }

    /// A raw API call with the account's token (`POST /database/1/.../{database}/{operation}`), for
    /// operations that are online only: sharing, tokens, devices.
    public func call(_ database: String, _ operation: String, _ body: JSON, as account: Account) async throws -> JSON {
        try requireSameServer(account)
        return try await server.call(database, operation, body, token: account.token)
    }

    /// A token is only ever sent to the server that issued it.
    private func requireSameServer(_ account: Account) throws {
        guard account.serverURL == serverURL else { throw SyncError.otherServer(account.serverURL) }
    }
}
