import CLibCrypto
import Foundation
import LatticeCore

/// SHA-256 over bytes that arrive in pieces (an upload's body), through libcrypto's EVP digest. Not shared
/// between threads: its owner keeps it behind its own lock.
public final class SHA256Stream {
    private let context: OpaquePointer

    public init() {
        // Allocation failure is the only way these fail.
        guard let context = EVP_MD_CTX_new() else { preconditionFailure("EVP_MD_CTX_new failed") }
        precondition(EVP_DigestInit_ex(context, EVP_sha256(), nil) == 1, "EVP_DigestInit_ex(SHA-256) failed")
        self.context = context
    }

    deinit { EVP_MD_CTX_free(context) }

    public func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        precondition(EVP_DigestUpdate(context, base, bytes.count) == 1, "EVP_DigestUpdate failed")
    }

    /// The digest of everything given; the stream is spent afterwards.
    public func finish() -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(SHA256_DIGEST_LENGTH))
        var length: UInt32 = 0
        precondition(EVP_DigestFinal_ex(context, &digest, &length) == 1 && length == 32, "EVP_DigestFinal_ex failed")
        return digest
    }
}

/// What a download URL grants: one reader the bytes of one asset as held by one record, until a time.
///
/// The server checks each use again (the reader may still read the record, the record still holds the
/// asset), so a URL stops working when access goes, however long it had left.
public struct AssetGrant: Sendable, Hashable {
    public var zoneRowID: Int64
    public var recordName: String
    public var checksum: [UInt8]
    public var size: Int64
    /// The reader's user id.
    public var readerID: Int64
    /// Seconds since 1970.
    public var expiresAt: Int64

    public init(zoneRowID: Int64, recordName: String, checksum: [UInt8], size: Int64, readerID: Int64, expiresAt: Int64) {
        self.zoneRowID = zoneRowID
        self.recordName = recordName
        self.checksum = checksum
        self.size = size
        self.readerID = readerID
        self.expiresAt = expiresAt
    }
}

/// Download URLs' tokens: the grant's fields, then an HMAC-SHA256 of them with the service's asset key,
/// base64url. No bearer token is in them, so one can be handed to an `<img>` tag or a CDN; it is short-lived.
public enum AssetURLToken {
    public enum Rejection: Error, Hashable, Sendable {
        /// Not a token, or not signed with this key (tampered).
        case invalid
        case expired
    }

    private static let version: UInt8 = 1

    public static func sign(_ grant: AssetGrant, key: [UInt8]) -> String {
        var payload: [UInt8] = [version]
        func append(_ value: Int64) { withUnsafeBytes(of: value.littleEndian) { payload.append(contentsOf: $0) } }
        append(grant.zoneRowID)
        append(grant.size)
        append(grant.readerID)
        append(grant.expiresAt)
        payload.append(contentsOf: grant.checksum)
        payload.append(contentsOf: grant.recordName.utf8)
        return Base64URL.encode(payload + WebhookSignature.hmacSHA256(key: key, message: [0x61] + payload))
    }

    public static func verify(_ token: String, key: [UInt8], nowSeconds: Int64) throws(Rejection) -> AssetGrant {
        guard token.utf8.count <= 1_024, let bytes = Base64URL.decode(token), bytes.count >= 1 + 32 + 32 + 32 else {
            throw .invalid
        }
        let payload = Array(bytes.dropLast(32)), signature = Array(bytes.suffix(32))
        guard Secrets.constantTimeEqual(signature, WebhookSignature.hmacSHA256(key: key, message: [0x61] + payload)),
              payload[0] == version else { throw .invalid }
        func integer(_ at: Int) -> Int64 {
            var value: Int64 = 0
            for index in 0..<8 { value |= Int64(payload[at + index]) << (8 * Int64(index)) }
            return value
        }
        let checksum = Array(payload[33..<65])
        guard let recordName = String(validating: payload[65...], as: UTF8.self) else { throw .invalid }
        let grant = AssetGrant(zoneRowID: integer(1), recordName: recordName, checksum: checksum, size: integer(9),
                               readerID: integer(17), expiresAt: integer(25))
        guard grant.expiresAt >= nowSeconds else { throw .expired }
        return grant
    }
}
