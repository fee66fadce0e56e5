import CLibCrypto

/// Webhook signatures: HMAC-SHA256 over `"<timestamp>.<body>"` with the subscription's webhook secret, sent as
/// `Lattice-Signature: t=<unix seconds>,v1=<64 hex digits>`. A receiver recomputes the HMAC over the
/// timestamp it was given and the raw body, compares in constant time, and refuses a timestamp too far from
/// its clock (replays).
public enum WebhookSignature {
    /// The header a delivery carries.
    public static let headerName = "Lattice-Signature"

    /// HMAC-SHA256 (`HMAC` of libcrypto).
    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        let produced = key.withUnsafeBytes { keyBytes in
            message.withUnsafeBytes { messageBytes in
                HMAC(EVP_sha256(), keyBytes.baseAddress, Int32(key.count),
                     messageBytes.baseAddress?.assumingMemoryBound(to: UInt8.self), message.count, &digest, &length)
            }
        }
        precondition(produced != nil && length == 32, "HMAC-SHA256 failed")
        return Array(digest.prefix(Int(length)))
    }

    /// The header value for `body` sent at `timestamp` (seconds since 1970).
    public static func header(secret: [UInt8], timestamp: Int64, body: [UInt8]) -> String {
        "t=\(timestamp),v1=" + Secrets.hex(hmacSHA256(key: secret, message: Array("\(timestamp).".utf8) + body))
    }

    /// Whether `header` signs `body` with `secret`, at a timestamp within `toleranceSeconds` of `now`.
    public static func verify(header: String, body: [UInt8], secret: [UInt8], now: Int64, toleranceSeconds: Int64 = 300) -> Bool {
        var timestamp: Int64?
        var signatures: [String] = []
        for part in header.split(separator: ",") {
            let pair = part.split(separator: "=", maxSplits: 1).map(String.init)
            guard pair.count == 2 else { continue }
            if pair[0] == "t" { timestamp = Int64(pair[1]) }
            if pair[0] == "v1" { signatures.append(pair[1]) }
        }
        guard let timestamp, abs(now - timestamp) <= toleranceSeconds else { return false }
        let expected = Array(Secrets.hex(hmacSHA256(key: secret, message: Array("\(timestamp).".utf8) + body)).utf8)
        return signatures.contains { Secrets.constantTimeEqual(Array($0.utf8), expected) }
    }

    /// A new webhook secret: `whsec_` and 64 hex digits (256 random bits). Its bytes (the text) are the HMAC key.
    public static func newSecret() throws(CryptoError) -> String {
        "whsec_" + Secrets.hex(try Secrets.randomBytes(32))
    }
}
