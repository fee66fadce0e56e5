import CLibCrypto
import LatticeSharing

/// A P-256 or RSA key pair made by libcrypto for tests: it signs what a passkey or an identity provider
/// would, and gives its public numbers as COSE and JWK carry them.
public final class TestSigningKey: @unchecked Sendable {
    // @unchecked: no lock; `pkey` is set once in init and only read (each signature has its own context).
    private let pkey: OpaquePointer
    public let algorithm: SignatureAlgorithm

    public init(_ algorithm: SignatureAlgorithm, rsaBits: Int32 = 2_048) {
        self.algorithm = algorithm
        let context = EVP_PKEY_CTX_new_id(algorithm == .es256 ? EVP_PKEY_EC : EVP_PKEY_RSA, nil)!
        defer { EVP_PKEY_CTX_free(context) }
        precondition(EVP_PKEY_keygen_init(context) == 1)
        if algorithm == .es256 {
            precondition(EVP_PKEY_CTX_set_ec_paramgen_curve_nid(context, NID_X9_62_prime256v1) == 1)
        } else {
            precondition(EVP_PKEY_CTX_set_rsa_keygen_bits(context, rsaBits) == 1)
        }
        var made: OpaquePointer? = nil
        precondition(EVP_PKEY_keygen(context, &made) == 1)
        pkey = made!
    }

    deinit { EVP_PKEY_free(pkey) }

    private func number(_ name: String) -> [UInt8] {
        var bn: OpaquePointer? = nil
        precondition(EVP_PKEY_get_bn_param(pkey, name, &bn) == 1, "no \(name)")
        defer { BN_free(bn) }
        var bytes = [UInt8](repeating: 0, count: Int((BN_num_bits(bn) + 7) / 8))
        _ = BN_bn2bin(bn, &bytes)
        return bytes
    }

    private static func padded(_ bytes: [UInt8], to count: Int) -> [UInt8] {
        [UInt8](repeating: 0, count: max(0, count - bytes.count)) + bytes
    }

    /// P-256: the 32-byte coordinates.
    public var x: [UInt8] { Self.padded(number("qx"), to: 32) }
    public var y: [UInt8] { Self.padded(number("qy"), to: 32) }
    /// RSA: the modulus and exponent.
    public var modulus: [UInt8] { number("n") }
    public var exponent: [UInt8] { number("e") }

    public func verifyingKey() throws -> VerifyingKey {
        algorithm == .es256 ? try VerifyingKey.p256(x: x, y: y) : try VerifyingKey.rsa(modulus: modulus, exponent: exponent)
    }

    /// A SHA-256 signature of `message`: DER for ES256 (as WebAuthn), PKCS #1 v1.5 for RS256.
    public func sign(_ message: [UInt8]) -> [UInt8] {
        let context = EVP_MD_CTX_new()!
        defer { EVP_MD_CTX_free(context) }
        precondition(EVP_DigestSignInit(context, nil, EVP_sha256(), nil, pkey) == 1)
        var length = 0
        precondition(EVP_DigestSign(context, nil, &length, message, message.count) == 1)
        var signature = [UInt8](repeating: 0, count: length)
        precondition(EVP_DigestSign(context, &signature, &length, message, message.count) == 1)
        return Array(signature.prefix(length))
    }

    /// An ES256 signature as JOSE writes it: `r || s`, 32 bytes each.
    public func signJOSE(_ message: [UInt8]) -> [UInt8] {
        let der = sign(message)
        guard algorithm == .es256 else { return der }
        // SEQUENCE { INTEGER r, INTEGER s }, short lengths for P-256.
        var index = 2
        func integer() -> [UInt8] {
            precondition(der[index] == 0x02)
            let length = Int(der[index + 1])
            let value = Array(der[(index + 2)..<(index + 2 + length)])
            index += 2 + length
            return Self.padded(Array(value.drop { $0 == 0 }), to: 32)
        }
        return integer() + integer()
    }
}
