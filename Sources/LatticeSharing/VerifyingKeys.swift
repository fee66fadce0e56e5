import CLibCrypto
import LatticeCore

/// A signature algorithm a passkey (COSE) or an identity provider's token (JOSE) may use. Only these two
/// are accepted anywhere: `none`, HMAC (`HS256`, whose "key" an attacker could take from a public JWK)
/// and every other name have no case, so they cannot be asked for.
public enum SignatureAlgorithm: String, Sendable, Hashable, CaseIterable {
    /// ECDSA on P-256 with SHA-256 (COSE -7).
    case es256 = "ES256"
    /// RSASSA-PKCS1-v1_5 with SHA-256 (COSE -257).
    case rs256 = "RS256"

    /// The COSE algorithm number (RFC 9053), as WebAuthn names it.
    public var coseIdentifier: Int {
        switch self {
        case .es256: -7
        case .rs256: -257
        }
    }

    public init?(coseIdentifier: Int) {
        guard let found = Self.allCases.first(where: { $0.coseIdentifier == coseIdentifier }) else { return nil }
        self = found
    }
}

/// Why a public key was refused before any signature was checked.
public struct KeyError: Error, Hashable, Sendable, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// A public key that verifies ES256 or RS256 signatures, made from the key's numbers as COSE (RFC 9053)
/// and JWK (RFC 7518) carry them: a P-256 point (x, y) or an RSA modulus and exponent.
///
/// The key is checked when it is made: the point must lie on P-256 (libcrypto refuses one that does
/// not), an RSA modulus must have 2,048 to 8,192 bits and the exponent be odd and at most 32 bits, so
/// verifying costs a bounded amount of work whatever key a client or provider sends.
///
/// ```swift
/// let key = try VerifyingKey.p256(x: x, y: y)
/// key.verify(.es256, signature: der, message: signedBytes)  // true or false, never throws
/// ```
public final class VerifyingKey: @unchecked Sendable {
    // @unchecked only because `pkey` is an OpaquePointer: no lock, nothing to guard. Every member is an
    // immutable `let`, the EVP_PKEY is never changed after init, and each verification has its own
    // EVP_MD_CTX, which OpenSSL allows concurrently on one key.
    private let pkey: OpaquePointer
    /// The algorithm this key verifies: a P-256 key verifies only ES256, an RSA key only RS256.
    public let algorithm: SignatureAlgorithm

    private init(der: [UInt8], algorithm: SignatureAlgorithm) throws(KeyError) {
        var pointer: UnsafePointer<UInt8>? = nil
        let made: OpaquePointer? = der.withUnsafeBufferPointer { buffer in
            pointer = buffer.baseAddress
            return d2i_PUBKEY(nil, &pointer, buffer.count)
        }
        guard let made else {
            ERR_clear_error()
            throw KeyError("libcrypto refused the \(algorithm.rawValue) public key")
        }
        pkey = made
        self.algorithm = algorithm
    }

    deinit { EVP_PKEY_free(pkey) }

    /// A P-256 public key from its 32-byte affine coordinates.
    public static func p256(x: [UInt8], y: [UInt8]) throws(KeyError) -> VerifyingKey {
        guard x.count == 32, y.count == 32 else { throw KeyError("a P-256 coordinate is not 32 bytes") }
        // SubjectPublicKeyInfo: AlgorithmIdentifier(id-ecPublicKey, prime256v1), BIT STRING(04 || x || y).
        let algorithm = DER.sequence(DER.objectIdentifier([0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x02, 0x01])
                                     + DER.objectIdentifier([0x2A, 0x86, 0x48, 0xCE, 0x3D, 0x03, 0x01, 0x07]))
        let der = DER.sequence(algorithm + DER.bitString([0x04] + x + y))
        return try VerifyingKey(der: der, algorithm: .es256)
    }

    /// An RSA public key from its big-endian modulus and exponent.
    public static func rsa(modulus: [UInt8], exponent: [UInt8]) throws(KeyError) -> VerifyingKey {
        let n = Array(modulus.drop { $0 == 0 })
        let e = Array(exponent.drop { $0 == 0 })
        let bits = n.isEmpty ? 0 : n.count * 8 - n[0].leadingZeroBitCount
        guard (2_048...8_192).contains(bits) else { throw KeyError("an RSA modulus of \(bits) bits (2,048 to 8,192 are accepted)") }
        guard !e.isEmpty, e.count <= 4, e.last! & 1 == 1, e != [1] else { throw KeyError("an RSA exponent that is not odd, above 1 and at most 32 bits") }
        // SubjectPublicKeyInfo: AlgorithmIdentifier(rsaEncryption, NULL), BIT STRING(RSAPublicKey(n, e)).
        let algorithm = DER.sequence(DER.objectIdentifier([0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 0x01, 0x01, 0x01]) + [0x05, 0x00])
        let der = DER.sequence(algorithm + DER.bitString(DER.sequence(DER.integer(n) + DER.integer(e))))
        return try VerifyingKey(der: der, algorithm: .rs256)
    }

    /// Whether `signature` signs `message` with this key under `algorithm`. An ES256 signature is ASN.1
    /// DER (as WebAuthn sends it); `jwsES256` converts JOSE's raw `r || s` first. False for any other
    /// algorithm than the key's, and for any malformed signature.
    public func verify(_ algorithm: SignatureAlgorithm, signature: [UInt8], message: [UInt8]) -> Bool {
        guard algorithm == self.algorithm, !signature.isEmpty, signature.count <= 1_024,
              let context = try? DigestContext() else { return false }
        defer { ERR_clear_error() }
        guard EVP_DigestVerifyInit(context.pointer, nil, EVP_sha256(), nil, pkey) == 1 else { return false }
        return EVP_DigestVerify(context.pointer, signature, signature.count, message, message.count) == 1
    }

    /// JOSE's ES256 signature (64 bytes: `r || s`, RFC 7518 §3.4) as the DER `ECDSA-Sig-Value` libcrypto
    /// verifies; nil when it is not 64 bytes.
    public static func derSignature(fromJOSE raw: [UInt8]) -> [UInt8]? {
        guard raw.count == 64 else { return nil }
        return DER.sequence(DER.integer(Array(raw[0..<32])) + DER.integer(Array(raw[32..<64])))
    }
}

/// The few DER encodings a SubjectPublicKeyInfo and an ECDSA signature need.
enum DER {
    static func length(_ count: Int) -> [UInt8] {
        if count < 0x80 { return [UInt8(count)] }
        var bytes: [UInt8] = []
        var rest = count
        while rest > 0 { bytes.insert(UInt8(rest & 0xFF), at: 0); rest >>= 8 }
        return [0x80 | UInt8(bytes.count)] + bytes
    }

    static func element(_ tag: UInt8, _ content: [UInt8]) -> [UInt8] { [tag] + length(content.count) + content }
    static func sequence(_ content: [UInt8]) -> [UInt8] { element(0x30, content) }
    static func objectIdentifier(_ encoded: [UInt8]) -> [UInt8] { element(0x06, encoded) }
    static func bitString(_ content: [UInt8]) -> [UInt8] { element(0x03, [0x00] + content) }

    /// A non-negative INTEGER from big-endian bytes: leading zeros dropped, one added when the top bit is set.
    static func integer(_ bytes: [UInt8]) -> [UInt8] {
        var value = Array(bytes.drop { $0 == 0 })
        if value.isEmpty { value = [0] }
        if value[0] & 0x80 != 0 { value.insert(0, at: 0) }
        return element(0x02, value)
    }
}
