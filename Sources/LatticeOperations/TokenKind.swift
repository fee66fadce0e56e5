import LatticeSharing

/// Browser sessions and one-time sign-in links, kept in the tokens table beside bearer tokens.
///
/// Every kind is a random `lt_` secret stored only as its SHA-256 (`BearerToken.storedHash`); the kind is
/// in the token's id:
/// - a bearer token's id is 16 hex digits (`newTokenID`);
/// - a browser session's id is `s-` + 16 hex digits: it is sent only in the `lattice_session` cookie, and
///   every state-changing request made with it needs the session's CSRF value in `X-Lattice-CSRF`;
/// - a one-time sign-in link's id is `l-` + 16 hex digits: `POST /auth/link` exchanges it, once, for a
///   session (the exchange deletes the row, and only the request whose delete found it gets the session).
/// - a device's token, made when a signed-in device approved its user code (Devices.swift), has the id
///   `d-` + 16 hex digits and the device's name; it is a bearer token like the first kind.
/// Neither a session nor a link works as `Authorization: Bearer` (`checkToken` refuses their ids).
public enum TokenKind: String, Sendable {
    case bearer
    case session
    case signInLink
    case device

    public static let sessionPrefix = "s-"
    public static let signInLinkPrefix = "l-"
    public static let devicePrefix = "d-"

    public init(id: String) {
        if id.hasPrefix(Self.sessionPrefix) { self = .session }
        else if id.hasPrefix(Self.signInLinkPrefix) { self = .signInLink }
        else if id.hasPrefix(Self.devicePrefix) { self = .device }
        else { self = .bearer }
    }

    /// Whether the kind works as `Authorization: Bearer`.
    public var isBearer: Bool { self == .bearer || self == .device }

    /// A new id of this kind: 16 random hex digits after the kind's prefix.
    public func newID() throws -> String {
        let hex = Secrets.hex(try Secrets.randomBytes(8))
        switch self {
        case .bearer: return hex
        case .session: return Self.sessionPrefix + hex
        case .signInLink: return Self.signInLinkPrefix + hex
        case .device: return Self.devicePrefix + hex
        }
    }
}
