import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore
import Synchronization

/// Bearer tokens and browser sessions checked from the headers, failed sign-ins counted per address, and
/// per-account throttling.
extension LatticeService {
    // MARK: Authentication and throttling

    /// The caller and the id of the token they sent. A bad, unknown, revoked or expired token is
    /// AUTHENTICATION_FAILED and counts against the client address; once an address has used up its
    /// failure budget its bad tokens get THROTTLED (with Retry-After) instead, until the budget refills.
    /// Good tokens are always served, from any address (clients behind one NAT or proxy are not locked
    /// out by one bad client).
    func authenticate(_ request: HTTPRequest, deadline: RequestDeadline?) throws -> (user: UserAccount, tokenID: String) {
        try authenticate(request.head, deadline: deadline)
    }

    /// Takes the head only, so `admit` can run it before the body is read.
    /// With `allowSession`, a request without `Authorization` may be made with a browser session cookie
    /// instead; it then needs the session's CSRF value (`checkCSRF`), else ACCESS_DENIED.
    func authenticate(_ request: HTTPRequestHead, deadline: RequestDeadline? = nil, allowSession: Bool = false) throws
        -> (user: UserAccount, tokenID: String) {
        let header = request.header("authorization")
        let withSession = allowSession && header == nil && request.header("cookie")?.contains(Self.sessionCookie + "=") == true
        guard header != nil || withSession else {
            throw ServiceError(.authenticationRequired, "sign in: send Authorization: Bearer <token> (POST /auth/signup makes one)")
        }
        do {
            if let header { return try checkToken(header, deadline: deadline) }
            guard let session = try browserSession(request, deadline: deadline) else {
                throw ServiceError(.authenticationFailed, "the session cookie is malformed; sign in again")
            }
            try checkCSRF(request, session: session)
            return (session.user, session.tokenID)
        } catch let error as ServiceError where error.code == .authenticationFailed {
            throw failedSignIn(error, address: request.remoteAddress)
        }
    }

    /// A failed sign-in from `address` (a bad token, session, sign-in link or device code) taken from the
    /// address's failure budget: `error` itself while the budget lasts, THROTTLED (with Retry-After) once
    /// it is used up, until it refills.
    func failedSignIn(_ error: ServiceError, address: String) -> ServiceError {
        guard let authenticationFailures else { return error }
        let key = "auth:" + ClientAddress.limitKey(address)
        guard let wait = authenticationFailures.take(key, nowMs: configuration.now()) else { return error }
        logRefusal(key, "authentication: \(address.isEmpty ? "-" : address) is throttled after repeated failed sign-ins")
        return ServiceError(.throttled, "too many failed sign-ins from this address; retry after \(wait) s", retryAfter: wait)
    }

    /// A sign-in exchange without a bearer token (`/auth/link`, `/auth/session`, `/auth/signout`,
    /// `/auth/device/token`) under the same per-address failure budget as bad tokens: an address that used
    /// it up is THROTTLED before any storage work, and each answer of a code in `failures` takes from it.
    /// Guessing links, sessions or device codes costs the guesser, not the database.
    func countingFailedSignIns(from address: String, _ failures: Set<ServerErrorCode> = [.authenticationFailed],
                               _ body: () throws -> HTTPResponse) throws -> HTTPResponse {
        if let authenticationFailures, let wait = authenticationFailures.wait("auth:" + ClientAddress.limitKey(address), nowMs: configuration.now()) {
            throw ServiceError(.throttled, "too many failed sign-ins from this address; retry after \(wait) s", retryAfter: wait)
        }
        do {
            return try body()
        } catch let error as ServiceError where failures.contains(error.code) {
            throw failedSignIn(error, address: address)
        }
    }

    /// Checks a bearer token against the database (no cache: revocation takes effect at once).
    func checkToken(_ header: String, deadline: RequestDeadline?) throws -> (user: UserAccount, tokenID: String) {
        let parts = header.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer", let token = BearerToken(text: String(parts[1])) else {
            throw ServiceError(.authenticationFailed, "the Authorization header is not a Lattice bearer token")
        }
        // The authentication lane: never queued behind a long read or a write.
        guard let found = try storage.read(deadline: deadline ?? freshDeadline(), lane: .authentication,
                                           { try $0.tokenOwner(hash: token.storedHash) }) else {
            throw ServiceError(.authenticationFailed, "unknown or revoked token")
        }
        // Browser sessions and one-time sign-in links live in the same table but are not bearer tokens.
        guard TokenKind(id: found.token.id).isBearer else { throw ServiceError(.authenticationFailed, "unknown or revoked token") }
        if let expires = found.token.expiresMs, expires <= configuration.now() {
            let date = Date(timeIntervalSince1970: Double(expires) / 1000)
            throw ServiceError(.authenticationFailed, "the token expired at \(ISO8601DateFormatter().string(from: date)); "
                           + "sign in again with a new token")
        }
        return (found.user, found.token.id)
    }

    func throttle(key: String) throws {
        guard let limiter, let wait = limiter.take(key, nowMs: configuration.now()) else { return }
        throw ServiceError(.throttled, "too many requests; retry after \(wait) s", retryAfter: wait)
    }

    /// Logs a refusal of kind `key`, at most once a minute per kind.
}
