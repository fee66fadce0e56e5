import LatticeCore

/// The claims of a share link.
///
/// Signed as a JWT payload (RFC 7519) with the claim names in parentheses below. The server checks what
/// only it knows (the share exists, `epoch` is current, uses remain);
/// ``ShareKeyRing/verify(_:nowSeconds:leewaySeconds:)`` checks the signature, the structure and the times.
public struct ShareClaims: Sendable, Equatable {
    /// The permissions a link may grant (`perm`).
    public static let permissions: Set<String> = ["readOnly", "readWrite"]

    /// The server's public URL (`iss`).
    public var issuer: String
    /// The share's identifier (`sub`).
    public var shareID: String
    /// The shared zone (`zone`).
    public var zoneName: String
    /// The zone owner's user record name (`owner`).
    public var ownerRecordName: String
    /// When the link was made, seconds since 1970 (`iat`).
    public var issuedAt: Int64
    /// When the link stops working, seconds since 1970 (`exp`); nil for never.
    public var expiresAt: Int64?
    /// How many times the link may be accepted (`max_uses`, at least 1); nil for no limit.
    public var maximumUses: Int?
    /// A random identifier for this link (`jti`); see ``newTokenID()``.
    public var tokenID: String
    /// The most the link grants (`perm`): "readOnly" or "readWrite".
    public var permission: String
    /// The share's URL epoch (`epoch`); rotating it invalidates every older URL.
    public var epoch: Int64

    public init(
        issuer: String, shareID: String, zoneName: String, ownerRecordName: String, issuedAt: Int64,
        expiresAt: Int64? = nil, maximumUses: Int? = nil, tokenID: String, permission: String, epoch: Int64
    ) {
        self.issuer = issuer
        self.shareID = shareID
        self.zoneName = zoneName
        self.ownerRecordName = ownerRecordName
        self.issuedAt = issuedAt
        self.expiresAt = expiresAt
        self.maximumUses = maximumUses
        self.tokenID = tokenID
        self.permission = permission
        self.epoch = epoch
    }

    /// 16 random bytes in base64url (22 characters), for ``tokenID``.
    public static func newTokenID() throws -> String {
        Base64URL.encode(try Secrets.randomBytes(16))
    }

    /// Why a set of claims cannot be signed or accepted; nil when it is well formed.
    var problem: String? {
        for (name, value) in [("iss", issuer), ("sub", shareID), ("zone", zoneName), ("owner", ownerRecordName),
                              ("jti", tokenID)] where value.isEmpty {
            return "\(name) is empty"
        }
        if !Self.permissions.contains(permission) { return "perm is neither readOnly nor readWrite" }
        if let maximumUses, maximumUses < 1 { return "max_uses is less than 1" }
        if issuedAt < 0 { return "iat is negative" }
        if epoch < 0 { return "epoch is negative" }
        return nil
    }

    /// The JWT payload. Optional claims are left out, not written as null.
    var json: JSON {
        var object: [String: JSON] = [
            "iss": .string(issuer), "sub": .string(shareID), "zone": .string(zoneName),
            "owner": .string(ownerRecordName), "iat": .int(issuedAt), "jti": .string(tokenID),
            "perm": .string(permission), "epoch": .int(epoch),
        ]
        if let expiresAt { object["exp"] = .int(expiresAt) }
        if let maximumUses { object["max_uses"] = .int(Int64(maximumUses)) }
        return .object(object)
    }

    static let requiredNames: Set<String> = ["iss", "sub", "zone", "owner", "iat", "jti", "perm", "epoch"]
    static let optionalNames: Set<String> = ["exp", "max_uses"]

    /// Reads a JWT payload strictly: every required claim present with its exact JSON type, no claim we do not
    /// know, integers as JSON integers (not `1.0`), and the rules of ``problem``.
    init?(json: JSON) {
        guard case .object(let object) = json,
              Set(object.keys).isSubset(of: Self.requiredNames.union(Self.optionalNames)),
              Self.requiredNames.isSubset(of: object.keys),
              case .string(let issuer)? = object["iss"], case .string(let shareID)? = object["sub"],
              case .string(let zoneName)? = object["zone"], case .string(let owner)? = object["owner"],
              case .int(let issuedAt)? = object["iat"], case .string(let tokenID)? = object["jti"],
              case .string(let permission)? = object["perm"], case .int(let epoch)? = object["epoch"]
        else { return nil }
        var expiresAt: Int64?
        if let value = object["exp"] {
            guard case .int(let exp) = value else { return nil }
            expiresAt = exp
        }
        var maximumUses: Int?
        if let value = object["max_uses"] {
            guard case .int(let uses) = value, let uses = Int(exactly: uses) else { return nil }
            maximumUses = uses
        }
        self.init(
            issuer: issuer, shareID: shareID, zoneName: zoneName, ownerRecordName: owner, issuedAt: issuedAt,
            expiresAt: expiresAt, maximumUses: maximumUses, tokenID: tokenID, permission: permission, epoch: epoch
        )
        guard problem == nil else { return nil }
    }
}

/// One uniform error for every verification failure: the client learns nothing about which check failed.
public struct ShareTokenError: Error, Hashable, Sendable, CustomStringConvertible {
    public static let invalid = ShareTokenError()

    private init() {}

    public var description: String { "the share link is invalid, expired or revoked" }
}

/// JWS compact serialization (RFC 7515 §7.1) with EdDSA over Ed25519 (RFC 8037).
///
/// `BASE64URL(header) "." BASE64URL(payload) "." BASE64URL(signature)`, where the signature covers the ASCII
/// bytes of the first two parts exactly as they appear in the token.
enum CompactJWS {
    /// Longer tokens are refused before any decoding. Real share tokens are about 500 bytes.
    static let maximumLength = 4096

    /// The only header members a Lattice token may carry. Anything else (`crit`, `jku`, `jwk`, `x5u`, `b64`...)
    /// is refused rather than ignored.
    static let allowedHeaderNames: Set<String> = ["alg", "kid", "typ"]

    /// Why a token was refused. Internal: tests assert on it, clients only ever see ``ShareTokenError/invalid``.
    enum Rejection: Error, Equatable {
        case tooLong, notThreeParts, badEncoding, badHeader, algorithm, unknownKey, badSignature, badClaims
        case expired, issuedInFuture
    }

    /// A split token whose header is decoded but whose signature is not yet checked.
    struct Parts {
        var keyID: String
        var signingInput: ArraySlice<UInt8>
        var payload: [UInt8]
        var signature: [UInt8]
    }

    static func header(keyID: String) -> JSON {
        .object(["alg": .string("EdDSA"), "kid": .string(keyID), "typ": .string("JWT")])
    }

    /// The signing input `BASE64URL(header) "." BASE64URL(payload)` for raw header and payload bytes.
    static func signingInput(header: [UInt8], payload: [UInt8]) -> String {
        Base64URL.encode(header) + "." + Base64URL.encode(payload)
    }

    /// Splits and decodes a token and checks its header. The algorithm is pinned: it must be exactly "EdDSA",
    /// the only algorithm any key in the ring has; the token's `alg` never selects anything.
    static func parse(_ token: String) throws(Rejection) -> Parts {
        let bytes = Array(token.utf8)
        guard bytes.count <= maximumLength else { throw .tooLong }
        let dots = bytes.indices.filter { bytes[$0] == UInt8(ascii: ".") }
        guard dots.count == 2 else { throw .notThreeParts }
        let headerText = bytes[..<dots[0]]
        let payloadText = bytes[(dots[0] + 1)..<dots[1]]
        let signatureText = bytes[(dots[1] + 1)...]
        guard !headerText.isEmpty, !payloadText.isEmpty,
              let headerBytes = Base64URL.decode(utf8: headerText),
              let payload = Base64URL.decode(utf8: payloadText),
              let signature = Base64URL.decode(utf8: signatureText)
        else { throw .badEncoding }

        guard case .object(let header)? = try? JSON.parse(headerBytes),
              Set(header.keys).isSubset(of: allowedHeaderNames)
        else { throw .badHeader }
        if let type = header["typ"] { guard type == .string("JWT") else { throw .badHeader } }
        guard header["alg"] == .string("EdDSA") else { throw .algorithm }
        guard case .string(let keyID)? = header["kid"], !keyID.isEmpty else { throw .unknownKey }
        guard signature.count == Ed25519Key.signatureLength else { throw .badSignature }
        return Parts(keyID: keyID, signingInput: bytes[..<dots[1]], payload: payload, signature: signature)
    }

    /// The claims of an authenticated payload, with `exp` and `iat` checked against `nowSeconds`.
    static func claims(payload: [UInt8], nowSeconds: Int64, leewaySeconds: Int64) throws(Rejection) -> ShareClaims {
        guard let json = try? JSON.parse(payload), let claims = ShareClaims(json: json) else { throw .badClaims }
        let leeway = max(0, leewaySeconds)
        // A token is good while now < exp + leeway (RFC 7519 §4.1.4), computed without overflow.
        if let expiresAt = claims.expiresAt {
            let (latest, overflow) = expiresAt.addingReportingOverflow(leeway)
            if !overflow && nowSeconds >= latest { throw .expired }
        }
        let (latestIssue, overflow) = nowSeconds.addingReportingOverflow(leeway)
        if !overflow && claims.issuedAt > latestIssue { throw .issuedInFuture }
        return claims
    }
}
