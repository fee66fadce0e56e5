import LatticeCore

/// Why an identity provider's token was refused. The description says which check failed; it never
/// holds the token.
public struct TokenError: Error, Hashable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A provider's signing key from its JWK Set (RFC 7517): an RSA key (`kty` RSA, `n`, `e`) or a P-256 key
/// (`kty` EC, `crv` P-256, `x`, `y`), with its `kid`. Keys of other types, or marked for encryption
/// (`use` enc), are skipped when the set is read.
public struct ProviderKey: Sendable {
    public let id: String?
    public let key: VerifyingKey
    /// The `alg` the JWK names, if any: a token must then use exactly it.
    public let algorithm: SignatureAlgorithm?
}

/// A provider's JWK Set: the keys an ID token's signature may be checked with.
public struct ProviderKeySet: Sendable {
    public let keys: [ProviderKey]

    public init(keys: [ProviderKey]) { self.keys = keys }

    /// Reads a JWK Set; at most 50 keys are kept. - Throws: when it is not a set with at least one usable key.
    public init(json: JSON) throws(TokenError) {
        guard let items = json["keys"]?.arrayValue else { throw TokenError("the JWK Set has no keys array") }
        var keys: [ProviderKey] = []
        for item in items.prefix(50) {
            if let use = item["use"]?.stringValue, use != "sig" { continue }
            let named = item["alg"]?.stringValue
            let algorithm = named.flatMap(SignatureAlgorithm.init(rawValue:))
            if named != nil, algorithm == nil { continue } // a key for an algorithm we do not accept
            let key: VerifyingKey
            switch item["kty"]?.stringValue {
            case "RSA":
                guard let n = item["n"]?.stringValue.flatMap(Base64URL.decode), let e = item["e"]?.stringValue.flatMap(Base64URL.decode),
                      let made = try? VerifyingKey.rsa(modulus: n, exponent: e) else { continue }
                key = made
            case "EC":
                guard item["crv"]?.stringValue == "P-256", let x = item["x"]?.stringValue.flatMap(Base64URL.decode),
                      let y = item["y"]?.stringValue.flatMap(Base64URL.decode), let made = try? VerifyingKey.p256(x: x, y: y) else { continue }
                key = made
            default:
                continue
            }
            if let algorithm, algorithm != key.algorithm { continue }
            keys.append(ProviderKey(id: item["kid"]?.stringValue, key: key, algorithm: algorithm))
        }
        guard !keys.isEmpty else { throw TokenError("the JWK Set has no RS256 or ES256 signing key") }
        self.keys = keys
    }
}

/// What an ID token says, once it is verified.
public struct IDTokenClaims: Sendable, Hashable {
    public let issuer: String
    public let subject: String
    public let nonce: String?
    public let email: String?
    public let preferredUserName: String?
    public let name: String?
}

/// A JWS in compact form (RFC 7515), as an ID token comes: header, payload and signature, read with limits.
public struct ProviderJWS: Sendable {
    public static let maximumLength = 16_384

    public let header: JSON
    public let payload: JSON
    public let signingInput: [UInt8]
    public let signature: [UInt8]

    public init(_ token: String) throws(TokenError) {
        guard token.utf8.count <= Self.maximumLength else { throw TokenError("the token is longer than \(Self.maximumLength) bytes") }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else { throw TokenError("the token is not a compact JWS (three parts)") }
        guard let headerBytes = Base64URL.decode(String(parts[0])), let header = try? JSON.parse(headerBytes), header.objectValue != nil,
              let payloadBytes = Base64URL.decode(String(parts[1])), let payload = try? JSON.parse(payloadBytes), payload.objectValue != nil,
              let signature = Base64URL.decode(String(parts[2])) else {
            throw TokenError("the token's parts are not base64url JSON objects and a signature")
        }
        self.header = header
        self.payload = payload
        self.signature = signature
        signingInput = Array((parts[0] + "." + parts[1]).utf8)
    }
}

/// Verifies an OpenID Connect ID token (OpenID Connect Core 1.0, §3.1.3.7): the JWS with one of the
/// provider's keys, then the claims. Only RS256 and ES256 are accepted, and only with a key of that type:
/// `alg: none`, HMAC (`HS256`, which would let anyone who has the public key "sign"), unknown `crit`
/// extensions and every other algorithm are refused before any key is tried.
public enum IDTokenVerifier {
    /// Seconds of clock difference allowed for `exp` and `iat`.
    public static let leewaySeconds: Int64 = 60

    /// The token's `kid`, for looking up (or refreshing) the provider's keys first.
    public static func keyID(of token: String) -> String? {
        (try? ProviderJWS(token))?.header["kid"]?.stringValue
    }

    /// - Parameters:
    ///   - nonce: the nonce the flow sent (the browser's authorization-code flow); nil when none was (an app's
    ///     exchange), and then a token's own nonce is not checked.
    ///   - nowSeconds: the time, injected.
    public static func verify(_ token: String, keys: ProviderKeySet, issuer: String, audience: String, nonce: String?,
                              nowSeconds: Int64) throws(TokenError) -> IDTokenClaims {
        let jws = try ProviderJWS(token)
        guard let named = jws.header["alg"]?.stringValue else { throw TokenError("the token names no algorithm") }
        guard let algorithm = SignatureAlgorithm(rawValue: named) else {
            throw TokenError("the token's algorithm \(named.prefix(20)) is not accepted (RS256 or ES256 only)")
        }
        if jws.header["crit"] != nil { throw TokenError("the token asks for critical extensions this server does not know") }
        let kid = jws.header["kid"]?.stringValue
        let candidates = keys.keys.filter { key in
            key.key.algorithm == algorithm && (key.algorithm == nil || key.algorithm == algorithm) && (kid == nil || key.id == kid)
        }
        guard !candidates.isEmpty else {
            throw TokenError("the provider has no \(algorithm.rawValue) key\(kid.map { " with kid \($0.prefix(64))" } ?? "")")
        }
        let signature = algorithm == .es256 ? VerifyingKey.derSignature(fromJOSE: jws.signature) : jws.signature
        guard let signature, candidates.contains(where: { $0.key.verify(algorithm, signature: signature, message: jws.signingInput) }) else {
            throw TokenError("the token's signature does not verify with the provider's keys")
        }
        let claims = jws.payload
        guard claims["iss"]?.stringValue == issuer else { throw TokenError("the token's issuer is not \(issuer)") }
        let audiences: [String]
        if let one = claims["aud"]?.stringValue { audiences = [one] } else { audiences = claims["aud"]?.arrayValue?.compactMap { $0.stringValue } ?? [] }
        guard audiences.contains(audience) else { throw TokenError("the token is not for this server's client id") }
        if audiences.count > 1, claims["azp"]?.stringValue != audience {
            throw TokenError("the token has several audiences and its azp is not this server's client id")
        }
        guard let expires = claims["exp"]?.intValue else { throw TokenError("the token has no expiry") }
        // Compared without adding to the token's number, so an `exp` near Int64.max cannot overflow.
        guard nowSeconds - leewaySeconds < expires else { throw TokenError("the token expired") }
        guard let issued = claims["iat"]?.intValue, issued <= nowSeconds + leewaySeconds else {
            throw TokenError("the token has no issue time, or one in the future")
        }
        if let nonce, claims["nonce"]?.stringValue != nonce { throw TokenError("the token's nonce is not this sign-in's") }
        guard let subject = claims["sub"]?.stringValue, !subject.isEmpty, subject.utf8.count <= 255 else {
            throw TokenError("the token has no subject")
        }
        return IDTokenClaims(issuer: issuer, subject: subject, nonce: claims["nonce"]?.stringValue,
                             email: claims["email"]?.stringValue, preferredUserName: claims["preferred_username"]?.stringValue,
                             name: claims["name"]?.stringValue)
    }
}
