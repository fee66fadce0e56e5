import CLibCrypto
import Foundation

/// A libcrypto call failed. Carries the library's error code, never key material or inputs.
public struct CryptoError: Error, Hashable, Sendable, CustomStringConvertible {
    public let operation: String
    public let code: UInt

    public var description: String {
        var buffer = [CChar](repeating: 0, count: 256)
        ERR_error_string_n(code, &buffer, buffer.count)
        let detail = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return "libcrypto \(operation) failed: \(detail)"
    }

    /// Checks a libcrypto result (`1` is success) and captures the error queue otherwise.
    static func check(_ result: Int32, _ operation: String) throws(CryptoError) {
        guard result == 1 else { throw CryptoError(operation: operation, code: ERR_get_error()) }
    }
}

/// Randomness, hashing and comparison for secrets, all through libcrypto.
public enum Secrets {
    /// `count` bytes from the operating system's CSPRNG (OpenSSL `RAND_bytes`).
    public static func randomBytes(_ count: Int) throws(CryptoError) -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: count)
        try CryptoError.check(RAND_bytes(&bytes, Int32(count)), "RAND_bytes")
        return bytes
    }

    /// SHA-256 of `bytes`.
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(SHA256_DIGEST_LENGTH))
        var length: UInt32 = 0
        // EVP_Digest with SHA-256 only fails on allocation failure.
        let ok = EVP_Digest(bytes, bytes.count, &digest, &length, EVP_sha256(), nil)
        precondition(ok == 1, "EVP_Digest(SHA-256) failed")
        return digest
    }

    /// Compares two byte strings in time that depends only on their lengths (`CRYPTO_memcmp`).
    public static func constantTimeEqual(_ a: [UInt8], _ b: [UInt8]) -> Bool {
        guard a.count == b.count else { return false }
        if a.isEmpty { return true }
        return a.withUnsafeBytes { pa in b.withUnsafeBytes { pb in CRYPTO_memcmp(pa.baseAddress, pb.baseAddress, a.count) == 0 } }
    }
}

/// A bearer token: 256 random bits, shown to its owner once and stored only as its SHA-256.
///
/// The text form is `lt_` followed by 64 lowercase hex digits.
public struct BearerToken: Sendable, Hashable {
    public static let prefix = "lt_"
    public let text: String

    /// A fresh random token.
    public static func generate() throws(CryptoError) -> BearerToken {
        BearerToken(validated: prefix + Secrets.hex(try Secrets.randomBytes(32)))
    }

    private init(validated text: String) { self.text = text }

    /// Parses the text a client sent; nil when it is not shaped like a token.
    public init?(text: String) {
        guard text.hasPrefix(Self.prefix), text.utf8.count == Self.prefix.utf8.count + 64,
              text.utf8.dropFirst(Self.prefix.utf8.count).allSatisfy({ isLowerHex($0) }) else { return nil }
        self.text = text
    }

    /// What the database stores: SHA-256 of the token text. A stolen database yields no usable token.
    public var storedHash: [UInt8] { Secrets.sha256(Array(text.utf8)) }
}

extension Secrets {
    /// Lowercase hexadecimal.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(bytes.count * 2)
        for byte in bytes {
            out.append(digits[Int(byte >> 4)])
            out.append(digits[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

private func isLowerHex(_ c: UInt8) -> Bool { (c >= 48 && c <= 57) || (c >= 97 && c <= 102) }

extension Secrets {
    /// `length` characters drawn uniformly from `alphabet` (at most 256 characters) by the CSPRNG: a short
    /// code people type (a short share link's, say).
    public static func randomString(length: Int, alphabet: [Character]) throws(CryptoError) -> String {
        precondition(!alphabet.isEmpty && alphabet.count <= 256, "an alphabet of 1 to 256 characters")
        // Bytes at or above the largest multiple of the alphabet's size are drawn again, so no character is
        // likelier than another.
        let limit = 256 - 256 % alphabet.count
        var out = ""
        while out.count < length {
            for byte in try randomBytes(length * 2) where Int(byte) < limit && out.count < length {
                out.append(alphabet[Int(byte) % alphabet.count])
            }
        }
        return out
    }
}
