import Foundation
import LatticeCore
@testable import LatticeSharing

/// A fresh directory under the system temporary directory, removed by `remove()`.
struct ShareTemporaryDirectory {
    let path: String

    init() throws {
        var template = Array((NSTemporaryDirectory() + "/lattice-sharing.XXXXXX").utf8CString)
        guard let result = mkdtemp(&template) else { throw POSIXError(.EIO) }
        path = String(cString: result)
    }

    func remove() { try? FileManager.default.removeItem(atPath: path) }
}

enum ShareFixtures {
    static let now: Int64 = 1_764_489_600  // seconds

    static func claims(now: Int64 = now) throws -> ShareClaims {
        ShareClaims(
            issuer: "https://lattice.example", shareID: "share-7f3a", zoneName: "Lists", ownerRecordName: "_9a1c",
            issuedAt: now, expiresAt: now + 3600, maximumUses: 5, tokenID: try ShareClaims.newTokenID(),
            permission: "readWrite", epoch: 3
        )
    }

    /// A key ring in a fresh temporary directory.
    static func ring() throws -> (ShareKeyRing, ShareTemporaryDirectory) {
        let directory = try ShareTemporaryDirectory()
        return (try ShareKeyRing.open(directory: directory.path, nowMilliseconds: now * 1000), directory)
    }

    static func parts(_ token: String) -> [String] {
        token.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
    }

    static func decodeJSON(_ part: String) -> JSON { try! JSON.parse(Base64URL.decode(part)!) }

    static func encodeJSON(_ json: JSON) -> String { Base64URL.encode(json.serializedBytes()) }

    /// The refusal reason, or nil when the token verifies.
    static func rejection(
        _ ring: ShareKeyRing, _ token: String, now: Int64 = now, leeway: Int64 = 60
    ) -> CompactJWS.Rejection? {
        do {
            _ = try ring.check(token, nowSeconds: now, leewaySeconds: leeway)
            return nil
        } catch {
            // The public entry point must agree: a refusal there is always the one uniform error.
            do {
                _ = try ring.verify(token, nowSeconds: now, leewaySeconds: leeway)
                fatalError("check refused a token that verify accepted")
            } catch {
                precondition(error == .invalid)
            }
            return error
        }
    }

    static func fileMode(_ path: String) -> mode_t {
        var info = stat()
        precondition(stat(path, &info) == 0)
        return info.st_mode & 0o7777
    }
}
