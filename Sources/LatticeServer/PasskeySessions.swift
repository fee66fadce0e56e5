import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeStore

/// The HTTP side of passkeys and recovery codes (LatticeOperations' `Passkeys` has the rules): which
/// requests may start a browser session, and the session cookie they get.
extension LatticeService {
    /// A session for `user` made by a sign-in the person just made on this origin (a passkey, a recovery
    /// code): it replaces the browser's current session, which is signed out on the server.
    func startSession(for user: UserAccount, replacing request: HTTPRequest, extra: [String: JSON] = [:]) throws -> HTTPResponse {
        let current = try? browserSession(request.head)
        let session: BrowserSession = try write { tx, _ in
            if let current { _ = try tx.deleteToken(id: current.tokenID) }
            let (token, info) = try insertToken(.session, userID: user.id, lifetimeSeconds: Self.sessionLifetimeSeconds, tx)
            return BrowserSession(user: user, tokenID: info.id, token: token, expiresMs: info.expiresMs)
        }
        return sessionResponse(session, setCookie: true, extra: extra)
    }

    /// `POST /auth/passkey/signup/options {"name"}` (no session yet; from this origin's pages only).
    func passkeySignUpOptions(_ request: HTTPRequest) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        return .json(try Passkeys(core).signUpOptions(try parseBody(request), from: request.origin))
    }

    /// `POST /auth/passkey/signup {"credential", "name"?}`: the account, its first passkey, a session and
    /// the recovery codes (in the answer, once).
    func passkeySignUp(_ request: HTTPRequest) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        try checkDiskBudget("sign-up")
        let (account, codes) = try Passkeys(core).finishSignUp(try parseBody(request), from: request.origin,
                                                               lifetimeSeconds: Self.sessionLifetimeSeconds)
        let session = BrowserSession(user: account.user, tokenID: account.tokenInfo.id, token: account.token,
                                     expiresMs: account.tokenInfo.expiresMs)
        return sessionResponse(session, setCookie: true, extra: ["recoveryCodes": .array(codes.map(JSON.string))])
    }

    /// `POST /auth/passkey/signin/options {}` (from this origin's pages only).
    func passkeySignInOptions(_ request: HTTPRequest) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        return .json(try Passkeys(core).signInOptions(from: request.origin))
    }

    /// `POST /auth/passkey/signin {"credential"}`: a session for the passkey's account.
    func passkeySignIn(_ request: HTTPRequest) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        let user = try Passkeys(core).finishSignIn(try parseBody(request))
        return try startSession(for: user, replacing: request)
    }

    /// `POST /auth/recovery {"code"}`: a session for the code's account; the code is used up.
    func recoverySignIn(_ request: HTTPRequest) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        let (user, left) = try Passkeys(core).signInWithRecoveryCode(try parseBody(request))
        return try startSession(for: user, replacing: request, extra: ["recoveryCodesLeft": .int(Int64(left))])
    }
}
