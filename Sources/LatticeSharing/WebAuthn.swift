import LatticeCore

/// The relying party a passkey is made for: its RP ID (a domain, the public URL's host) and the origins
/// its pages are served from.
public struct RelyingParty: Sendable, Hashable {
    public let id: String
    public let origins: [String]
    public let name: String

    public init(id: String, origins: [String], name: String = "Lattice") {
        self.id = id
        self.origins = origins
        self.name = name
    }

    /// The relying party of a server reached at `publicURL`: the host as RP ID, and the URL's origin.
    public init?(publicURL: String) {
        guard let schemeEnd = publicURL.range(of: "://") else { return nil }
        let scheme = publicURL[..<schemeEnd.lowerBound].lowercased()
        guard scheme == "http" || scheme == "https" else { return nil }
        let rest = publicURL[schemeEnd.upperBound...]
        let authority = rest.prefix { $0 != "/" && $0 != "?" && $0 != "#" }.lowercased()
        guard !authority.isEmpty, !authority.contains("@") else { return nil }
        let host: Substring
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else { return nil }
            host = authority[authority.index(after: authority.startIndex)..<close]
        } else {
            host = authority.prefix { $0 != ":" }
        }
        guard !host.isEmpty else { return nil }
        self.init(id: String(host), origins: ["\(scheme)://\(authority)"])
    }
}

/// Why a passkey ceremony was refused: the response is malformed, or it is well formed and fails a check.
public struct WebAuthnError: Error, Hashable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A passkey as registration made it: what the server keeps.
public struct RegisteredPasskey: Sendable, Hashable {
    public let credentialID: [UInt8]
    /// The credential's COSE public key, as the authenticator sent it.
    public let publicKey: [UInt8]
    public let algorithm: SignatureAlgorithm
    public let signCount: UInt32
    public let userVerified: Bool
    /// The authenticator may sync the passkey to the person's other devices (flag BE).
    public let backupEligible: Bool
}

/// The part of a sign-in assertion the server keeps: the new counter.
public struct VerifiedAssertion: Sendable, Hashable {
    public let signCount: UInt32
    public let userVerified: Bool
}

/// WebAuthn (W3C Web Authentication, Level 2) registration and assertion checks, §7.1 and §7.2: the
/// client data (type, challenge, origin), the authenticator data (RP ID hash, user presence and, when
/// asked, verification, the counter) and, for a sign-in, the signature with the stored key.
///
/// Attestation: the server asks for `"none"` and accepts any format without checking its statement: a
/// passkey proves it holds its key at every sign-in, and Lattice trusts no authenticator maker more than
/// another. Keys: ES256 (P-256) and RS256 only.
public enum WebAuthn {
    /// At most this many bytes of client data, authenticator data or attestation object are read.
    public static let maximumInputBytes = 16_384
    /// Credential ids are at most 1,023 bytes (WebAuthn §5.8.3's bound).
    public static let maximumCredentialIDBytes = 1_023

    /// Checks a registration (`navigator.credentials.create`) against the challenge the server issued.
    public static func verifyRegistration(clientDataJSON: [UInt8], attestationObject: [UInt8], challenge: [UInt8],
                                          relyingParty: RelyingParty, requireUserVerification: Bool)
        throws(WebAuthnError) -> RegisteredPasskey {
        try checkClientData(clientDataJSON, type: "webauthn.create", challenge: challenge, relyingParty: relyingParty)
        guard attestationObject.count <= maximumInputBytes else { throw WebAuthnError("the attestation object is too large") }
        let object: CBOR
        do { object = try CBOR.decode(attestationObject) } catch { throw WebAuthnError("the attestation object is not CBOR: \(error)") }
        guard object["fmt"]?.textValue != nil, case .map? = object["attStmt"],
              let authData = object["authData"]?.bytesValue else {
            throw WebAuthnError("the attestation object lacks fmt, attStmt or authData")
        }
        let data = try AuthenticatorData(authData, relyingParty: relyingParty, requireUserVerification: requireUserVerification)
        guard let credential = data.credential else { throw WebAuthnError("the authenticator data holds no credential (flag AT)") }
        return RegisteredPasskey(credentialID: credential.id, publicKey: credential.publicKey, algorithm: credential.algorithm,
                                 signCount: data.signCount, userVerified: data.userVerified, backupEligible: data.backupEligible)
    }

    /// Checks a sign-in (`navigator.credentials.get`) against the challenge and the stored passkey. The
    /// counter must grow when either side has one (a clone would repeat it); 0 on both sides means the
    /// authenticator keeps none, as synced passkeys do.
    public static func verifyAssertion(clientDataJSON: [UInt8], authenticatorData: [UInt8], signature: [UInt8],
                                       challenge: [UInt8], relyingParty: RelyingParty, publicKey: [UInt8],
                                       storedSignCount: UInt32, requireUserVerification: Bool)
        throws(WebAuthnError) -> VerifiedAssertion {
        try checkClientData(clientDataJSON, type: "webauthn.get", challenge: challenge, relyingParty: relyingParty)
        let data = try AuthenticatorData(authenticatorData, relyingParty: relyingParty,
                                         requireUserVerification: requireUserVerification)
        let key = try verifyingKey(cose: publicKey)
        let signed = authenticatorData + Secrets.sha256(clientDataJSON)
        guard signature.count <= 1_024, key.verify(key.algorithm, signature: signature, message: signed) else {
            throw WebAuthnError("the signature does not verify with the passkey's key")
        }
        if data.signCount != 0 || storedSignCount != 0 {
            guard data.signCount > storedSignCount else {
                throw WebAuthnError("the sign counter did not grow (\(data.signCount) after \(storedSignCount)): the passkey may be cloned")
            }
        }
        return VerifiedAssertion(signCount: data.signCount, userVerified: data.userVerified)
    }

    /// The key of a COSE_Key (RFC 9052 §7, RFC 9053): EC2 on P-256 with ES256 (-7), or RSA with RS256 (-257).
    public static func verifyingKey(cose: [UInt8]) throws(WebAuthnError) -> VerifyingKey {
        let key: CBOR
        do { key = try CBOR.decode(cose) } catch { throw WebAuthnError("the public key is not CBOR: \(error)") }
        return try verifyingKey(key)
    }

    static func verifyingKey(_ key: CBOR) throws(WebAuthnError) -> VerifyingKey {
        guard let algorithmNumber = key[3]?.intValue, let algorithm = SignatureAlgorithm(coseIdentifier: algorithmNumber) else {
            throw WebAuthnError("the passkey's algorithm \(key[3]?.intValue.map(String.init) ?? "(none)") is not ES256 (-7) or RS256 (-257)")
        }
        do throws(KeyError) {
            switch (algorithm, key[1]?.intValue) {
            case (.es256, 2?):
                guard key[-1]?.intValue == 1, let x = key[-2]?.bytesValue, let y = key[-3]?.bytesValue else {
                    throw KeyError("an ES256 key needs curve P-256 (1), x and y")
                }
                return try VerifyingKey.p256(x: x, y: y)
            case (.rs256, 3?):
                guard let n = key[-1]?.bytesValue, let e = key[-2]?.bytesValue else { throw KeyError("an RS256 key needs n and e") }
                return try VerifyingKey.rsa(modulus: n, exponent: e)
            default:
                throw KeyError("the key type \(key[1]?.intValue.map(String.init) ?? "(none)") does not match \(algorithm.rawValue)")
            }
        } catch {
            throw WebAuthnError("the passkey's public key is refused: \(error)")
        }
    }

    /// §7.1 steps 7-12 / §7.2 steps 11-14: type, challenge, origin, not cross-origin.
    static func checkClientData(_ bytes: [UInt8], type: String, challenge: [UInt8], relyingParty: RelyingParty)
        throws(WebAuthnError) {
        guard bytes.count <= maximumInputBytes else { throw WebAuthnError("the client data is too large") }
        let json: JSON
        do { json = try JSON.parse(bytes) } catch { throw WebAuthnError("the client data is not JSON") }
        guard json["type"]?.stringValue == type else {
            throw WebAuthnError("the client data's type is \(json["type"]?.stringValue?.prefix(40) ?? "missing"), not \(type)")
        }
        guard let sent = json["challenge"]?.stringValue.flatMap(Base64URL.decode),
              Secrets.constantTimeEqual(sent, challenge) else {
            throw WebAuthnError("the client data's challenge is not the one this server issued")
        }
        guard let origin = json["origin"]?.stringValue, relyingParty.origins.contains(origin) else {
            throw WebAuthnError("the client data's origin \(json["origin"]?.stringValue?.prefix(100) ?? "(none)") is not this server's")
        }
        if json["crossOrigin"] == .bool(true) { throw WebAuthnError("the ceremony ran in a cross-origin frame") }
    }
}

/// Authenticator data (WebAuthn §6.1): the RP ID hash, the flags, the counter and, with flag AT, the
/// attested credential (AAGUID, id, COSE key).
struct AuthenticatorData {
    struct Credential {
        let id: [UInt8]
        let publicKey: [UInt8]
        let algorithm: SignatureAlgorithm
    }

    let signCount: UInt32
    let userVerified: Bool
    let backupEligible: Bool
    let credential: Credential?

    init(_ bytes: [UInt8], relyingParty: RelyingParty, requireUserVerification: Bool) throws(WebAuthnError) {
        guard bytes.count >= 37, bytes.count <= WebAuthn.maximumInputBytes else {
            throw WebAuthnError("the authenticator data is \(bytes.count) bytes")
        }
        guard Secrets.constantTimeEqual(Array(bytes[0..<32]), Secrets.sha256(Array(relyingParty.id.utf8))) else {
            throw WebAuthnError("the passkey is for another site (its RP ID hash is not \(relyingParty.id)'s)")
        }
        let flags = bytes[32]
        guard flags & 0x01 != 0 else { throw WebAuthnError("the person's presence was not confirmed (flag UP)") }
        userVerified = flags & 0x04 != 0
        if requireUserVerification, !userVerified { throw WebAuthnError("the person was not verified (flag UV)") }
        backupEligible = flags & 0x08 != 0
        signCount = bytes[33..<37].reduce(0) { $0 << 8 | UInt32($1) }
        guard flags & 0x40 != 0 else {
            credential = nil
            return
        }
        // Attested credential data: AAGUID (16), id length (2), id, COSE key (CBOR); extensions may follow.
        guard bytes.count >= 55 else { throw WebAuthnError("the attested credential data is cut short") }
        let length = Int(bytes[53]) << 8 | Int(bytes[54])
        guard length > 0, length <= WebAuthn.maximumCredentialIDBytes, bytes.count > 55 + length else {
            throw WebAuthnError("the credential id is \(length) bytes, or cut short")
        }
        let id = Array(bytes[55..<(55 + length)])
        let rest = Array(bytes[(55 + length)...])
        let key: CBOR, used: Int
        do { (key, used) = try CBOR.decodePrefix(rest) } catch { throw WebAuthnError("the credential's public key is not CBOR: \(error)") }
        if used < rest.count, flags & 0x80 == 0 { throw WebAuthnError("bytes follow the public key without extensions (flag ED)") }
        let verifying = try WebAuthn.verifyingKey(key)
        credential = Credential(id: id, publicKey: Array(rest[..<used]), algorithm: verifying.algorithm)
    }
}
