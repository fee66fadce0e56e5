import CLibCrypto
import LatticeCore

/// An Ed25519 key held by libcrypto: a key pair that signs, or a public key that only verifies.
///
/// Signing and verifying are one-shot `EVP_DigestSign` / `EVP_DigestVerify` with no digest (Ed25519
/// hashes internally, RFC 8032 "pure" mode). Raw forms are the 32-byte seed and the 32-byte public key,
/// the same bytes as a JWK's `d` and `x` (RFC 8037).
///
/// ```swift
/// let key = try Ed25519Key.generate()
/// let signature = try key.sign(Array("hello".utf8))
/// let verifier = try Ed25519Key(publicKey: key.publicKeyBytes)
/// verifier.verify(signature: signature, message: Array("hello".utf8))  // true
/// ```
public final class Ed25519Key: @unchecked Sendable {
    // @unchecked only because `pkey` is an OpaquePointer: there is no lock and nothing to guard, as every
    // member is an immutable `let` and the EVP_PKEY is never mutated after init; OpenSSL allows concurrent
    // signing and verifying with one key as long as each operation has its own EVP_MD_CTX, which it does here.
    private let pkey: OpaquePointer

    /// The 32-byte public key (JWK `x`).
    public let publicKeyBytes: [UInt8]

    /// Whether this key can sign (it holds the private seed).
    public let canSign: Bool

    public static let keyLength = 32
    public static let signatureLength = 64

    private init(pkey: OpaquePointer, canSign: Bool) throws(CryptoError) {
        self.pkey = pkey
        self.canSign = canSign
        var length = Ed25519Key.keyLength
        var bytes = [UInt8](repeating: 0, count: length)
        do {
            try CryptoError.check(EVP_PKEY_get_raw_public_key(pkey, &bytes, &length), "EVP_PKEY_get_raw_public_key")
        } catch {
            EVP_PKEY_free(pkey)
            throw error
        }
        precondition(length == Ed25519Key.keyLength, "Ed25519 public key is not 32 bytes")
        publicKeyBytes = bytes
    }

    deinit { EVP_PKEY_free(pkey) }

    /// A fresh key pair from libcrypto's CSPRNG.
    public static func generate() throws(CryptoError) -> Ed25519Key {
        guard let context = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nil) else {
            throw CryptoError(operation: "EVP_PKEY_CTX_new_id(ED25519)", code: ERR_get_error())
        }
        defer { EVP_PKEY_CTX_free(context) }
        try CryptoError.check(EVP_PKEY_keygen_init(context), "EVP_PKEY_keygen_init")
        var generated: OpaquePointer?
        try CryptoError.check(EVP_PKEY_keygen(context, &generated), "EVP_PKEY_keygen")
        guard let pkey = generated else { throw CryptoError(operation: "EVP_PKEY_keygen", code: ERR_get_error()) }
        return try Ed25519Key(pkey: pkey, canSign: true)
    }

    /// The key pair for a 32-byte private seed (JWK `d`).
    public convenience init(privateKey seed: [UInt8]) throws(CryptoError) {
        guard seed.count == Ed25519Key.keyLength else {
            throw CryptoError.invalidLength("EVP_PKEY_new_raw_private_key")
        }
        guard let pkey = EVP_PKEY_new_raw_private_key(EVP_PKEY_ED25519, nil, seed, seed.count) else {
            throw CryptoError(operation: "EVP_PKEY_new_raw_private_key", code: ERR_get_error())
        }
        try self.init(pkey: pkey, canSign: true)
    }

    /// A verify-only key for a 32-byte public key (JWK `x`).
    public convenience init(publicKey bytes: [UInt8]) throws(CryptoError) {
        guard bytes.count == Ed25519Key.keyLength else {
            throw CryptoError.invalidLength("EVP_PKEY_new_raw_public_key")
        }
        guard let pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nil, bytes, bytes.count) else {
            throw CryptoError(operation: "EVP_PKEY_new_raw_public_key", code: ERR_get_error())
        }
        try self.init(pkey: pkey, canSign: false)
    }

    /// The 32-byte private seed (JWK `d`). Secret: store it only in a 0600 file.
    public func privateKeyBytes() throws(CryptoError) -> [UInt8] {
        guard canSign else { throw CryptoError(operation: "EVP_PKEY_get_raw_private_key (public key only)", code: 0) }
        var length = Ed25519Key.keyLength
        var bytes = [UInt8](repeating: 0, count: length)
        try CryptoError.check(EVP_PKEY_get_raw_private_key(pkey, &bytes, &length), "EVP_PKEY_get_raw_private_key")
        precondition(length == Ed25519Key.keyLength, "Ed25519 private key is not 32 bytes")
        return bytes
    }

    /// The 64-byte Ed25519 signature of `message`.
    public func sign(_ message: [UInt8]) throws(CryptoError) -> [UInt8] {
        guard canSign else { throw CryptoError(operation: "EVP_DigestSign (public key only)", code: 0) }
        let context = try DigestContext()
        try CryptoError.check(EVP_DigestSignInit(context.pointer, nil, nil, nil, pkey), "EVP_DigestSignInit")
        var signature = [UInt8](repeating: 0, count: Ed25519Key.signatureLength)
        var length = signature.count
        try CryptoError.check(
            EVP_DigestSign(context.pointer, &signature, &length, message, message.count), "EVP_DigestSign"
        )
        precondition(length == Ed25519Key.signatureLength, "Ed25519 signature is not 64 bytes")
        return signature
    }

    /// Whether `signature` is a valid Ed25519 signature of `message` by this key.
    ///
    /// libcrypto does the comparison in constant time (`CRYPTO_memcmp`) and refuses an `S` at or above the group
    /// order. Any failure, including a libcrypto error, is `false`; libcrypto's error queue is cleared so a
    /// rejected signature leaves nothing behind for an unrelated later call to report.
    public func verify(signature: [UInt8], message: [UInt8]) -> Bool {
        guard signature.count == Ed25519Key.signatureLength, let context = try? DigestContext() else { return false }
        defer { ERR_clear_error() }
        guard EVP_DigestVerifyInit(context.pointer, nil, nil, nil, pkey) == 1 else { return false }
        return EVP_DigestVerify(context.pointer, signature, signature.count, message, message.count) == 1
    }

    /// RFC 7638 JWK thumbprint, used as the key ID: base64url(SHA-256(`{"crv":"Ed25519","kty":"OKP","x":...}`)).
    /// LatticeCore's serializer writes exactly the form RFC 7638 hashes: sorted keys, no whitespace.
    public var thumbprint: String {
        let x = Base64URL.encode(publicKeyBytes)
        let members = JSON.object(["crv": .string("Ed25519"), "kty": .string("OKP"), "x": .string(x)])
        return Base64URL.encode(Secrets.sha256(members.serializedBytes()))
    }
}

/// One `EVP_MD_CTX`, freed when the operation ends.
final class DigestContext {
    let pointer: OpaquePointer

    init() throws(CryptoError) {
        guard let pointer = EVP_MD_CTX_new() else {
            throw CryptoError(operation: "EVP_MD_CTX_new", code: ERR_get_error())
        }
        self.pointer = pointer
    }

    deinit { EVP_MD_CTX_free(pointer) }
}

extension CryptoError {
    /// A raw key of the wrong length, refused before it reaches libcrypto (code 0: no libcrypto error).
    static func invalidLength(_ operation: String) -> CryptoError {
        CryptoError(operation: "\(operation) (key is not \(Ed25519Key.keyLength) bytes)", code: 0)
    }
}
