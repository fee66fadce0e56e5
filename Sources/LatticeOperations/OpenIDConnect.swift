import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore
import Synchronization

/// An OpenID Connect provider this server accepts (`lattice serve --oidc-issuer URL --oidc-client-id ID`).
public struct OIDCProviderConfiguration: Sendable, Hashable {
    public var issuer: String
    public var clientID: String
    /// For a confidential client: sent to the token endpoint (`client_secret_post`); nil for a public one.
    public var clientSecret: String?

    public init(issuer: String, clientID: String, clientSecret: String? = nil) {
        self.issuer = issuer
        self.clientID = clientID
        self.clientSecret = clientSecret
    }

    /// A name to show: the issuer's host.
    public var name: String { URL(string: issuer)?.host ?? issuer }
}

/// What a provider's discovery document (`/.well-known/openid-configuration`) says, and its keys.
struct ProviderMetadata: Sendable {
    let authorizationEndpoint: String
    let tokenEndpoint: String
    let jwksURI: String
    var keys: ProviderKeySet
    /// When `keys` were fetched (successfully).
    var keysFetchedMs: Int64
    /// When a request last set out to fetch the keys again (an unknown `kid`, or keys older than
    /// `keyLifetimeMilliseconds`), whether or not that fetch succeeded; nil: never.
    var keysRefreshedMs: Int64?
}

/// Outbound requests to identity providers, bounded: 5 seconds to connect and answer, 10 in all, and at
/// most 256 KiB of answer received: the request is cancelled as soon as the answer passes that (a
/// Content-Length over it, or the bytes as they arrive), so an endless or huge answer costs neither the
/// memory nor the time.
enum ProviderHTTP {
    static let maximumBytes = 256 * 1024

    static func send(_ request: URLRequest, limit: Int = maximumBytes) throws -> (status: Int, body: [UInt8]) {
        let answer = OutboundHTTP.send(request, limit: limit, requestTimeout: 5, totalTimeout: 10, followsRedirects: true)
        switch answer {
        case .timedOut: throw ServiceError(.tryAgainLater, "the identity provider did not answer in time")
        case .failed(let error): throw ServiceError(.tryAgainLater, "the identity provider could not be reached: \(error)")
        case .answered(let status, let body, let tooLarge):
            if tooLarge { throw ServiceError(.tryAgainLater, "the identity provider's answer is too large") }
            return (status, body)
        }
    }

    static func getJSON(_ url: String) throws -> JSON {
        guard let target = URL(string: url), ["http", "https"].contains(target.scheme ?? "") else {
            throw ServiceError(.internalError, "the identity provider named an address that is not http(s): \(url.prefix(200))")
        }
        var request = URLRequest(url: target)
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        let (status, body) = try send(request)
        guard status == 200, let json = try? JSON.parse(body) else {
            throw ServiceError(.tryAgainLater, "the identity provider answered \(status) for \(url.prefix(200))")
        }
        return json
    }
}

/// Sign-in through OpenID Connect providers: the browser's authorization-code flow with PKCE, and the
/// exchange of an app's ID token for a device token. Each (issuer, subject) is one account: linked on
/// first sign-in (to the signed-in account when there is one, else to a new account).
///
/// A provider's discovery document and keys are cached per node (they are public, and the same on every
/// node); the keys are fetched again when a token names an unknown `kid`, at most once a minute. The
/// sign-ins under way are rows (any node finishes one), at most 10 live per client address and 10,000 in all.
public final class OpenIDConnect: Sendable {
    let core: OperationsCore
    public let providers: [OIDCProviderConfiguration]
    private let metadata: Mutex<[String: ProviderMetadata]>
    /// Held while a provider is discovered, so requests arriving together wait for one discovery (bounded
    /// by the fetch's 10 s) instead of each fetching.
    private let discovery = Mutex<Int>(0)

    public static let loginLifetimeMilliseconds: Int64 = 10 * 60 * 1000
    static let keyRefreshMilliseconds: Int64 = 60 * 1000
    /// How long a node trusts the keys it fetched: after that the next token makes it fetch them again, so
    /// a key the provider removed (rotated out, or compromised) stops verifying within this time.
    static let keyLifetimeMilliseconds: Int64 = 60 * 60 * 1000
    public static let loginsPerAddress = 10
    public static let loginsGlobal = 10_000

    public init(_ core: OperationsCore, providers: [OIDCProviderConfiguration]) {
        self.core = core
        self.providers = providers
        metadata = Mutex([:])
    }

    /// The callback every provider sends the browser back to.
    public var redirectURI: String {
        let base = core.publicURL.hasSuffix("/") ? String(core.publicURL.dropLast()) : core.publicURL
        return base + "/auth/oidc/callback"
    }

    func provider(issuer: String) throws -> OIDCProviderConfiguration {
        guard let found = providers.first(where: { $0.issuer == issuer }) else {
            throw ServiceError.badRequest("this server does not accept sign-ins from \(issuer.prefix(200))")
        }
        return found
    }

    /// The provider's metadata, discovered once per node (and again after a failure).
    func metadata(_ provider: OIDCProviderConfiguration) throws -> ProviderMetadata {
        if let known = metadata.withLock({ $0[provider.issuer] }) { return known }
        return try discovery.withLock { _ in try discover(provider) }
    }

    private func discover(_ provider: OIDCProviderConfiguration) throws -> ProviderMetadata {
        if let known = metadata.withLock({ $0[provider.issuer] }) { return known } // discovered while this one waited
        let base = provider.issuer.hasSuffix("/") ? String(provider.issuer.dropLast()) : provider.issuer
        let document = try ProviderHTTP.getJSON(base + "/.well-known/openid-configuration")
        guard document["issuer"]?.stringValue == provider.issuer,
              let authorization = document["authorization_endpoint"]?.stringValue,
              let token = document["token_endpoint"]?.stringValue, let jwks = document["jwks_uri"]?.stringValue else {
            throw ServiceError(.tryAgainLater, "the identity provider's discovery document is not for \(provider.issuer) or lacks its endpoints")
        }
        let keys = try keySet(jwks)
        let found = ProviderMetadata(authorizationEndpoint: authorization, tokenEndpoint: token, jwksURI: jwks, keys: keys,
                                     keysFetchedMs: core.configuration.now(), keysRefreshedMs: nil)
        metadata.withLock { $0[provider.issuer] = found }
        core.log("identity provider \(provider.issuer): discovered, \(keys.keys.count) signing keys")
        return found
    }

    private func keySet(_ url: String) throws -> ProviderKeySet {
        let json = try ProviderHTTP.getJSON(url)
        do throws(TokenError) { return try ProviderKeySet(json: json) } catch {
            throw ServiceError(.tryAgainLater, "the identity provider's keys: \(error.description)")
        }
    }

    /// Verifies an ID token from `provider`, fetching its keys again first when the token names a `kid`
    /// the cached set lacks, or when the cached set is older than `keyLifetimeMilliseconds`: at most once
    /// per `keyRefreshMilliseconds`, so a flood of made-up kids costs the provider one request a minute per
    /// node. The fetched set replaces the cached one (a key the provider dropped is no longer trusted); when
    /// a fetch for staleness alone fails, the cached keys still serve (and the next minute tries again).
    func verify(_ idToken: String, _ provider: OIDCProviderConfiguration, nonce: String?) throws -> IDTokenClaims {
        var known = try metadata(provider)
        let now = core.configuration.now()
        let kid = IDTokenVerifier.keyID(of: idToken)
        // Whether this request fetches the keys again, decided under the lock: of requests arriving together,
        // one fetches (the time is taken before the fetch, so a failing one counts too).
        let (refreshes, unknownKid) = metadata.withLock { cache -> (Bool, Bool) in
            guard let entry = cache[provider.issuer] else { return (false, false) }
            let unknown = kid.map { kid in !entry.keys.keys.contains(where: { $0.id == kid }) } ?? false
            let stale = now - entry.keysFetchedMs >= Self.keyLifetimeMilliseconds
            guard unknown || stale, entry.keysRefreshedMs.map({ now - $0 >= Self.keyRefreshMilliseconds }) ?? true else {
                return (false, unknown)
            }
            cache[provider.issuer]?.keysRefreshedMs = now
            return (true, unknown)
        }
        if refreshes {
            do {
                let keys = try keySet(known.jwksURI)
                known = metadata.withLock { cache in
                    var entry = cache[provider.issuer] ?? known
                    entry.keys = keys
                    entry.keysFetchedMs = now
                    cache[provider.issuer] = entry
                    return entry
                }
                core.log("identity provider \(provider.issuer): keys fetched again (\(unknownKid ? "an unknown kid" : "an hour old"))")
            } catch let error where !unknownKid {
                core.log("identity provider \(provider.issuer): the keys could not be fetched again, the cached ones serve: \(error)")
            }
        }
        do throws(TokenError) {
            return try IDTokenVerifier.verify(idToken, keys: known.keys, issuer: provider.issuer, audience: provider.clientID,
                                              nonce: nonce, nowSeconds: now / 1000)
        } catch {
            throw ServiceError(.authenticationFailed, "the identity provider's token was refused: \(error.description)")
        }
    }

    // MARK: The browser's authorization-code flow

    /// A random string of `bytes` random bytes, base64url.
    static func randomText(_ bytes: Int) throws -> String { Base64URL.encode(try Secrets.randomBytes(bytes)) }

    /// Starts a browser's sign-in with provider number `index`; returns the provider's authorization URL
    /// and the nonce (the caller binds the browser to it with a cookie). `next` must be a same-origin path.
    public func start(provider index: Int, next: String, linkUserID: Int64?, from origin: ClientOrigin) throws -> (url: String, nonce: String) {
        guard providers.indices.contains(index) else { throw ServiceError(.notFound, "no identity provider \(index) on this server") }
        let provider = providers[index]
        let known = try metadata(provider)
        let state = try Self.randomText(32), nonce = try Self.randomText(32), verifier = try Self.randomText(48)
        let now = core.configuration.now()
        let address = origin.limitKey
        try core.storage.write(deadline: core.freshDeadline()) { tx in
            try core.serialize("oidc-logins", tx)
            _ = try tx.forgetOIDCLogins(expiredAt: now)
            if try tx.liveOIDCLogins(address: address, nowMs: now) >= Self.loginsPerAddress {
                core.logRefusal("oidc start " + address, "OpenID Connect sign-in refused: \(address) has \(Self.loginsPerAddress) under way")
                throw ServiceError(.throttled, "this address has \(Self.loginsPerAddress) sign-ins under way already; finish one or "
                                   + "wait 10 minutes", retryAfter: 60)
            }
            if try tx.liveOIDCLogins(address: nil, nowMs: now) >= Self.loginsGlobal {
                throw ServiceError(.throttled, "too many sign-ins are under way on this server; retry later", retryAfter: 60)
            }
            try tx.insertOIDCLogin(OIDCLogin(stateHash: Secrets.sha256(Array(state.utf8)), issuer: provider.issuer, nonce: nonce,
                                             verifier: verifier, nextPath: next, linkUserID: linkUserID, address: address,
                                             createdMs: now, expiresMs: now + Self.loginLifetimeMilliseconds))
        }
        var components = URLComponents(string: known.authorizationEndpoint)
        let existing = components?.queryItems ?? []
        components?.queryItems = existing + [
            URLQueryItem(name: "response_type", value: "code"), URLQueryItem(name: "client_id", value: provider.clientID),
            URLQueryItem(name: "redirect_uri", value: redirectURI), URLQueryItem(name: "scope", value: "openid profile email"),
            URLQueryItem(name: "state", value: state), URLQueryItem(name: "nonce", value: nonce),
            URLQueryItem(name: "code_challenge", value: Base64URL.encode(Secrets.sha256(Array(verifier.utf8)))),
            URLQueryItem(name: "code_challenge_method", value: "S256"),
        ]
        guard let url = components?.url?.absoluteString else {
            throw ServiceError(.internalError, "the identity provider's authorization endpoint is not a URL")
        }
        return (url, nonce)
    }

    /// Finishes a browser's sign-in: the state's sign-in (taken once, and only from the browser holding
    /// its nonce), the code exchanged at the provider with the PKCE verifier, the ID token verified, and its
    /// (issuer, subject) mapped to an account. Returns the account and the path to go on to.
    public func finish(code: String, state: String, browserNonce: String?) throws -> (UserAccount, String) {
        let now = core.configuration.now()
        guard let login = try core.storage.write(deadline: core.freshDeadline(), {
            try $0.takeOIDCLogin(stateHash: Secrets.sha256(Array(state.utf8)), nowMs: now)
        }) else {
            throw ServiceError(.authenticationFailed, "this sign-in is unknown, used or expired; start again")
        }
        guard let browserNonce, Secrets.constantTimeEqual(Array(browserNonce.utf8), Array(login.nonce.utf8)) else {
            throw ServiceError(.authenticationFailed, "this sign-in was started in another browser; start again here")
        }
        let provider = try provider(issuer: login.issuer)
        let known = try metadata(provider)
        guard let endpoint = URL(string: known.tokenEndpoint) else {
            throw ServiceError(.internalError, "the identity provider's token endpoint is not a URL")
        }
        var fields = ["grant_type": "authorization_code", "code": code, "redirect_uri": redirectURI,
                      "client_id": provider.clientID, "code_verifier": login.verifier]
        if let secret = provider.clientSecret { fields["client_secret"] = secret }
        var request = URLRequest(url: endpoint)
        request.httpMethod = "POST"
        request.setValue("application/x-www-form-urlencoded", forHTTPHeaderField: "Content-Type")
        request.setValue("application/json", forHTTPHeaderField: "Accept")
        var form = URLComponents()
        form.queryItems = fields.sorted { $0.key < $1.key }.map { URLQueryItem(name: $0.key, value: $0.value) }
        request.httpBody = Data((form.percentEncodedQuery ?? "").replacingOccurrences(of: "+", with: "%2B").utf8)
        let (status, body) = try ProviderHTTP.send(request)
        guard status == 200, let idToken = (try? JSON.parse(body))?["id_token"]?.stringValue else {
            throw ServiceError(.authenticationFailed, "the identity provider refused the sign-in (\(status))")
        }
        let claims = try verify(idToken, provider, nonce: login.nonce)
        let user = try account(for: claims, linking: login.linkUserID)
        return (user, login.nextPath)
    }

    // MARK: An app's ID token

    /// `POST /auth/oidc/token {"issuer", "idToken", "deviceName"?}`: an app that signed its user in with a
    /// configured provider gets a device token of the user's account (made on first use).
    public func exchange(_ body: [String: JSON]) throws -> JSON {
        let reader = RequestReader(.object(body))
        guard let issuer = reader["issuer"]?.stringValue, let idToken = reader["idToken"]?.stringValue else {
            throw ServiceError.badRequest("expected {\"issuer\": \"...\", \"idToken\": \"...\"}")
        }
        let deviceName = try DeviceStartRequest(json: .object(body)).deviceName ?? "app"
        let provider = try provider(issuer: issuer)
        let claims = try verify(idToken, provider, nonce: nil)
        let user = try account(for: claims, linking: nil)
        let now = core.configuration.now()
        let (token, info) = try core.storage.write(deadline: core.freshDeadline()) { tx in
            try Devices(core).issueDeviceToken(userID: user.id, name: deviceName, nowMs: now, tx)
        }
        core.log("identity token exchanged: user \(user.name), device \(deviceName)")
        return DeviceTokenResponse(info: Accounts(core).tokenInfo(info), token: token.text, name: user.name,
                                   userRecordName: user.recordName, deviceName: deviceName).json
    }

    // MARK: Accounts

    /// The account of (issuer, subject): linked already; else linked now to `linkUserID`; else a new account
    /// named after the person's preferred user name, name or e-mail (made unique).
    func account(for claims: IDTokenClaims, linking linkUserID: Int64?) throws -> UserAccount {
        let now = core.configuration.now()
        if let found = try core.storage.write(deadline: core.freshDeadline(), { tx -> UserAccount? in
            if let userID = try tx.useIdentity(issuer: claims.issuer, subject: claims.subject, nowMs: now) { return try tx.user(id: userID) }
            guard let linkUserID, let user = try tx.user(id: linkUserID) else { return nil }
            try tx.linkIdentity(issuer: claims.issuer, subject: claims.subject, userID: user.id, nowMs: now)
            return user
        }) {
            return found
        }
        guard core.configuration.registrationOpen else {
            throw ServiceError(.accessDenied, "registration is closed on this server; the administrator adds users with lattice admin add-user")
        }
        let base = Self.userName(from: claims)
        for attempt in 0..<20 {
            let name = attempt == 0 ? base : String(base.prefix(58)) + "-" + String(attempt + 1)
            do {
                let account = try Accounts(core).createAccount(name: name, lifetimeSeconds: 60, kind: .signInLink) { user, tx in
                    try tx.linkIdentity(issuer: claims.issuer, subject: claims.subject, userID: user.id, nowMs: now)
                }
                // The account's first token is a one-minute sign-in link nobody holds: the caller makes the
                // session or device token it needs. It is deleted now.
                _ = try core.storage.write(deadline: core.freshDeadline()) { try $0.deleteToken(id: account.tokenInfo.id) }
                core.log("OpenID Connect sign-up: user \(name) from \(claims.issuer)")
                return account.user
            } catch let error as ServiceError where error.code == .exists {
                if try core.storage.write(deadline: core.freshDeadline(), {
                    try $0.useIdentity(issuer: claims.issuer, subject: claims.subject, nowMs: now)
                }) != nil {
                    // Linked meanwhile by another request of the same person: that account.
                    return try account(for: claims, linking: nil)
                }
                continue
            }
        }
        throw ServiceError(.exists, "no free user name near \(base); sign up by name, then link the provider from the account page")
    }

    /// A user name from the claims: the preferred user name, else the name, else the e-mail's local part,
    /// kept to letters, digits, '.', '_' and '-', starting with a letter or digit; "user" when nothing is left.
    static func userName(from claims: IDTokenClaims) -> String {
        let source = claims.preferredUserName ?? claims.name ?? claims.email.map { String($0.prefix { $0 != "@" }) } ?? ""
        var kept = String(source.unicodeScalars.filter { scalar in
            scalar.isASCII && (CharacterSet.alphanumerics.contains(scalar) || "._-".unicodeScalars.contains(scalar))
        }.map(Character.init).prefix(64))
        while let first = kept.first, !(first.isLetter || first.isNumber) { kept.removeFirst() }
        return kept.isEmpty ? "user" : kept
    }
}
