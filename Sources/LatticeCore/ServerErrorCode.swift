/// The error taxonomy of the HTTP API, mirroring CloudKit Web Services' `serverErrorCode` strings.
///
/// The one list of codes: the server answers with them (LatticeAPI's `ServiceError`; LatticeServer maps each
/// to its HTTP status) and the client engine and the CLI match on them, so neither side spells a code as
/// a string literal. Docs/API.md explains when each is returned.
public enum ServerErrorCode: String, Sendable, CaseIterable {
    case accessDenied = "ACCESS_DENIED"
    case atomicError = "ATOMIC_ERROR"
    case authenticationFailed = "AUTHENTICATION_FAILED"
    case authenticationRequired = "AUTHENTICATION_REQUIRED"
    case badRequest = "BAD_REQUEST"
    case conflict = "CONFLICT"
    case exists = "EXISTS"
    case internalError = "INTERNAL_ERROR"
    case limitExceeded = "LIMIT_EXCEEDED"
    case notFound = "NOT_FOUND"
    case quotaExceeded = "QUOTA_EXCEEDED"
    case throttled = "THROTTLED"
    case tryAgainLater = "TRY_AGAIN_LATER"
    case zoneNotFound = "ZONE_NOT_FOUND"
    case changeTokenExpired = "CHANGE_TOKEN_EXPIRED"
    /// A share participant lacks the permission for the operation (CloudKit's permissionFailure).
    case permissionFailure = "PERMISSION_FAILURE"
    /// The record (or zone) already belongs to a share (CloudKit's alreadyShared).
    case alreadyShared = "ALREADY_SHARED"
    /// A share would have more than 100 participants (CloudKit's tooManyParticipants).
    case tooManyParticipants = "TOO_MANY_PARTICIPANTS"
    /// The path is a route's but the method is not (HTTP 405, with `Allow`); no CloudKit counterpart.
    case methodNotAllowed = "METHOD_NOT_ALLOWED"
    /// A device sign-in (`POST /auth/device/token`) is not approved yet: poll again after the interval
    /// (RFC 8628's authorization_pending).
    case authorizationPending = "AUTHORIZATION_PENDING"
    /// A device sign-in was polled faster than its interval, which grew: wait `retryAfter` seconds between
    /// polls from now on (RFC 8628's slow_down).
    case slowDown = "SLOW_DOWN"
    /// A device code that expired, is unknown, or was already exchanged for a token: start again
    /// (RFC 8628's expired_token).
    case expiredToken = "EXPIRED_TOKEN"
    /// A request framed with a transfer coding the server does not implement (anything but chunked), HTTP
    /// 501; no CloudKit counterpart.
    case notImplemented = "NOT_IMPLEMENTED"
}
