import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore


/// The signed-in browser of a request: its account, the session's id and secret.
struct BrowserSession: Sendable {
    let user: UserAccount
    let tokenID: String
    let token: BearerToken
    let expiresMs: Int64?

    /// The CSRF value of the session: derived from its secret, so the server keeps nothing more; the page
    /// reads it from `GET /auth/session` (same origin only: no CORS), a cross-site page cannot.
    var csrfValue: String { Self.csrfValue(token) }

    static func csrfValue(_ token: BearerToken) -> String {
        Secrets.hex(Secrets.sha256(Array(("lattice csrf v1 " + token.text).utf8)))
    }
}

extension LatticeService {
    static let sessionCookie = "lattice_session"
    static let csrfHeader = "x-lattice-csrf"
    /// How long a browser session lasts (capped by `--token-lifetime`).
    static let sessionLifetimeSeconds: Int64 = 30 * 86_400
    /// How long a one-time sign-in link works.
    static let signInLinkLifetimeSeconds: Int64 = 10 * 60

    // MARK: Reading the cookie

    /// The session secret in the request's `Cookie` header, if it has one shaped like a token.
    static func sessionToken(_ head: HTTPRequestHead) -> BearerToken? {
        guard let header = head.header("cookie") else { return nil }
        for part in header.split(separator: ";") {
            let pair = part.trimmingCharacters(in: .whitespaces)
            guard pair.hasPrefix(sessionCookie + "=") else { continue }
            return BearerToken(text: String(pair.dropFirst(sessionCookie.count + 1)))
        }
        return nil
    }

    /// The request's browser session, checked in the database; nil without a session cookie.
    /// - Throws: AUTHENTICATION_FAILED for an unknown, revoked or expired session.
    func browserSession(_ head: HTTPRequestHead, deadline: RequestDeadline? = nil) throws -> BrowserSession? {
        guard let token = Self.sessionToken(head) else {
            if head.header("cookie")?.contains(Self.sessionCookie + "=") == true {
                throw ServiceError(.authenticationFailed, "the session cookie is malformed; sign in again")
            }
            return nil
        }
        let hash = token.storedHash
        guard let found = try storage.read(deadline: deadline ?? freshDeadline(), lane: .authentication,
                                           { try $0.tokenOwner(hash: hash) }),
              TokenKind(id: found.token.id) == .session else {
            throw ServiceError(.authenticationFailed, "the session is unknown or was signed out; sign in again")
        }
        if let expires = found.token.expiresMs, expires <= configuration.now() {
            throw ServiceError(.authenticationFailed, "the session expired; sign in again")
        }
        return BrowserSession(user: found.user, tokenID: found.token.id, token: token, expiresMs: found.token.expiresMs)
    }

    /// A state-changing request made with a session cookie: it must carry the session's CSRF value and
    /// come from this server's own pages (`Origin` and `Sec-Fetch-Site`, when the browser sends them).
    func checkCSRF(_ head: HTTPRequestHead, session: BrowserSession) throws {
        try checkSameOrigin(head)
        guard let sent = head.header(Self.csrfHeader),
              Secrets.constantTimeEqual(Array(sent.utf8), Array(session.csrfValue.utf8)) else {
            throw ServiceError(.accessDenied, "a request made with a session cookie needs the session's X-Lattice-CSRF value "
                           + "(GET /auth/session gives it)")
        }
    }

    /// Refuses a request a browser says comes from another site: `Sec-Fetch-Site` other than
    /// `same-origin`, or an `Origin` that is neither the public URL's nor the `Host` the request was sent to.
    func checkSameOrigin(_ head: HTTPRequestHead) throws {
        if let site = head.header("sec-fetch-site"), site != "same-origin" {
            throw ServiceError(.accessDenied, "cross-site request refused (Sec-Fetch-Site: \(site.prefix(20)))")
        }
        guard let origin = head.header("origin") else { return }
        var allowed: [String] = []
        if let url = URL(string: publicURL), let scheme = url.scheme, let host = url.host {
            allowed.append("\(scheme)://\(host)" + (url.port.map { ":\($0)" } ?? ""))
        }
        if let host = head.header("host") { allowed += ["http://" + host, "https://" + host] }
        guard allowed.map({ $0.lowercased() }).contains(origin.lowercased()) else {
            throw ServiceError(.accessDenied, "cross-site request refused (Origin \(origin.prefix(100)) is not this server)")
        }
    }

    /// `Set-Cookie` for a new session, or (nil) one that clears the cookie.
    func sessionCookieHeader(_ token: BearerToken?, expiresMs: Int64?) -> (name: String, value: String) {
        let secure = publicURL.lowercased().hasPrefix("https:") ? "; Secure" : ""
        guard let token else {
            return (name: "Set-Cookie", value: "\(Self.sessionCookie)=; Path=/; Max-Age=0; HttpOnly; SameSite=Strict\(secure)")
        }
        let maxAge = expiresMs.map { max(1, ($0 - configuration.now()) / 1000) } ?? Self.sessionLifetimeSeconds
        return (name: "Set-Cookie",
                value: "\(Self.sessionCookie)=\(token.text); Path=/; Max-Age=\(maxAge); HttpOnly; SameSite=Strict\(secure)")
    }

    // MARK: Making sessions

    /// Inserts a session or sign-in link token for `userID` in `tx`. At the per-user token limit, the
    /// user's expired sessions and links are dropped first.
    func insertToken(_ kind: TokenKind, userID: Int64, lifetimeSeconds: Int64, _ tx: any StorageTransaction) throws
        -> (BearerToken, StoredToken) {
        let token = try BearerToken.generate()
        let id = try kind.newID()
        let now = configuration.now()
        let expires = Accounts(core).tokenExpiry(lifetimeSeconds, nowMs: now) ?? now + lifetimeSeconds * 1000
        var tokens = try tx.tokens(userID: userID)
        if tokens.count >= configuration.maximumTokensPerUser {
            for old in tokens where !TokenKind(id: old.id).isBearer && (old.expiresMs ?? .max) <= now {
                _ = try tx.deleteToken(id: old.id)
            }
            tokens = try tx.tokens(userID: userID)
        }
        guard tokens.count < configuration.maximumTokensPerUser else {
            throw ServiceError(.limitExceeded, "a user has at most \(configuration.maximumTokensPerUser) tokens and sessions; "
                           + "revoke some with tokens/revoke")
        }
        try tx.insertToken(NewToken(hash: token.storedHash, id: id, userID: userID, createdMs: now, expiresMs: expires))
        return (token, StoredToken(id: id, userID: userID, createdMs: now, expiresMs: expires))
    }

    /// The JSON a page gets about its session (and the cookie that holds it, when new).
    func sessionResponse(_ session: BrowserSession, setCookie: Bool, extra: [String: JSON] = [:]) -> HTTPResponse {
        var object = SessionResponse(
            userRecordName: session.user.recordName, name: session.user.name, sessionID: session.tokenID,
            csrfToken: session.csrfValue, container: configuration.container, environment: "production",
            expiresMs: session.expiresMs).json.objectValue ?? [:]
        object.merge(extra) { _, new in new }
        var response = HTTPResponse.json(.object(object))
        if setCookie { response.headers.append(sessionCookieHeader(session.token, expiresMs: session.expiresMs)) }
        return response
    }

    /// `POST /auth/signup {"name", "session": true}` from a page: the account's first token is a browser
    /// session, sent as the cookie only (the answer has no bearer token).
    func signUpWithSession(_ request: HTTPRequest, _ body: [String: JSON]) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        guard configuration.registrationOpen else {
            throw ServiceError(.accessDenied, "registration is closed on this server; the administrator adds users "
                           + "with lattice admin add-user")
        }
        let name = try SignUpRequest(json: .object(body)).name
        try checkDiskBudget("sign-up")
        var codes: [String] = []
        let account = try Accounts(core).createAccount(name: name, lifetimeSeconds: Self.sessionLifetimeSeconds,
                                                       signUpFrom: request.origin, kind: .session) { user, tx in
            codes = try Passkeys(core).replaceRecoveryCodes(userID: user.id, tx)
        }
        // The recovery codes are in this answer once: the page shows them to be saved.
        return sessionResponse(BrowserSession(user: account.user, tokenID: account.tokenInfo.id, token: account.token,
                                              expiresMs: account.tokenInfo.expiresMs), setCookie: true,
                               extra: ["recoveryCodes": .array(codes.map(JSON.string))])
    }

    /// Requests that make a session (sign-up, the link exchange) carry no cookie yet: they must come from
    /// this server's pages (so another site cannot sign a browser in to its own account) and carry the
    /// `X-Lattice-CSRF` header (any value), which a cross-site form cannot send.
    func checkPreSessionRequest(_ head: HTTPRequestHead) throws {
        try checkSameOrigin(head)
        guard let value = head.header(Self.csrfHeader), !value.isEmpty else {
            throw ServiceError(.accessDenied, "send X-Lattice-CSRF (any value) with a request that makes a browser session")
        }
    }

    // MARK: Routes

    /// `GET /auth/session`: the signed-in browser's account and CSRF value. A session used with less than
    /// half its lifetime left is renewed here: its expiry moves to a full lifetime from now (capped by
    /// `--token-lifetime`) and the cookie is sent again with the new `Max-Age`. The secret, and so the CSRF
    /// value other tabs hold, stay the same. The web client asks on every load and every few hours.
    func currentSession(_ request: HTTPRequest) throws -> HTTPResponse {
        guard var session = try browserSession(request.head) else {
            throw ServiceError(.authenticationRequired, "not signed in: no session cookie")
        }
        let now = configuration.now()
        guard let expires = session.expiresMs,
              let renewed = Accounts(core).tokenExpiry(Self.sessionLifetimeSeconds, nowMs: now),
              expires - now < (renewed - now) / 2, renewed > expires else {
            return sessionResponse(session, setCookie: false)
        }
        let tokenID = session.tokenID
        guard try write({ tx, _ in try tx.extendToken(id: tokenID, expiresMs: renewed) }) else {
            throw ServiceError(.authenticationFailed, "the session is unknown or was signed out; sign in again")
        }
        session = BrowserSession(user: session.user, tokenID: session.tokenID, token: session.token, expiresMs: renewed)
        return sessionResponse(session, setCookie: true)
    }

    /// `POST /auth/signout`: revokes the session on the server and clears the cookie.
    func signOut(_ request: HTTPRequest) throws -> HTTPResponse {
        guard let session = try browserSession(request.head) else {
            throw ServiceError(.authenticationRequired, "not signed in: no session cookie")
        }
        try checkCSRF(request.head, session: session)
        let revoked = try write { tx, _ in try tx.deleteToken(id: session.tokenID) }
        var response = HTTPResponse.json(.object(["sessionID": .string(session.tokenID), "revoked": .bool(revoked)]))
        response.headers.append(sessionCookieHeader(nil, expiresMs: nil))
        return response
    }

    /// `POST /auth/link {"secret": "lt_...", "replaceSession"?: true}`: exchanges a one-time sign-in link for
    /// a session. The link's row is deleted in the same transaction the session is made in; of two racing
    /// exchanges only the one whose delete found the row gets a session. Every failure is the same error.
    ///
    /// A browser already signed in to another account is not switched silently (login CSRF: a stranger's
    /// link would make the person's next lists land in the stranger's account): without `replaceSession:
    /// true`, which the page sends only after the person chose to switch, the answer is CONFLICT naming
    /// both accounts (`signedInAs`, `linkAccount`), and the link is not spent. A switch signs the old
    /// session out on the server.
    func exchangeSignInLink(_ request: HTTPRequest) throws -> HTTPResponse {
        try checkPreSessionRequest(request.head)
        let exchange = try SignInLinkExchangeRequest(json: .object(try parseBody(request)))
        let invalid = SignInLinkExchangeRequest.invalidLink
        guard let secret = BearerToken(text: exchange.secret) else { throw invalid }
        let replaceSession = exchange.replaceSession
        // An unknown, revoked or expired cookie is no session to keep: the exchange replaces it.
        let current = try? browserSession(request.head)
        let now = configuration.now()
        let outcome: Result<BrowserSession, ServiceError> = try write { tx, _ in
            guard let found = try tx.tokenOwner(hash: secret.storedHash),
                  TokenKind(id: found.token.id) == .signInLink else { return .failure(invalid) }
            if let expires = found.token.expiresMs, expires <= now {
                _ = try tx.deleteToken(id: found.token.id)
                return .failure(invalid)
            }
            if let current, current.user.id != found.user.id, !replaceSession {
                return .failure(Self.sessionSwitchRefused(signedInAs: current.user.name, linkAccount: found.user.name))
            }
            guard try tx.deleteToken(id: found.token.id) else { return .failure(invalid) }
            if let current { _ = try tx.deleteToken(id: current.tokenID) } // the replaced session is signed out
            let (token, info) = try insertToken(.session, userID: found.user.id, lifetimeSeconds: Self.sessionLifetimeSeconds, tx)
            return .success(BrowserSession(user: found.user, tokenID: info.id, token: token, expiresMs: info.expiresMs))
        }
        let session = try outcome.get()
        if let current, current.user.id != session.user.id {
            log("sign-in link used: browser switched from user \(current.user.name) to \(session.user.name)")
        } else {
            log("sign-in link used: user \(session.user.name)")
        }
        return sessionResponse(session, setCookie: true)
    }

    /// The answer to a sign-in link that would silently replace another account's session.
    static func sessionSwitchRefused(signedInAs: String, linkAccount: String) -> ServiceError {
        ServiceError(.conflict, "this browser is signed in as \(signedInAs) and the link signs in to \(linkAccount); "
                     + "ask the person, then send replaceSession: true to switch (the link is not spent)",
                     fields: ["signedInAs": .string(signedInAs), "linkAccount": .string(linkAccount)])
    }

    /// `tokens/signinLink` (private database, bearer token only): a one-time link that signs a browser in
    /// to the caller's account. It works once, for ten minutes; the secret is in the URL's fragment, so it
    /// is never sent to a server in a request line, a log or a Referer.
    func createSignInLink(_ context: RequestContext) throws -> JSON {
        guard context.kind == .private else { throw ServiceError.badRequest("tokens/signinLink is a private database operation") }
        try checkDiskBudget("tokens/signinLink")
        let (token, info) = try write { tx, _ in
            try insertToken(.signInLink, userID: context.user.id, lifetimeSeconds: Self.signInLinkLifetimeSeconds, tx)
        }
        let base = publicURL.hasSuffix("/") ? String(publicURL.dropLast()) : publicURL
        return SignInLinkResponse(info: Accounts(core).tokenInfo(info), url: base + "/#signin=" + token.text).json
    }
}
