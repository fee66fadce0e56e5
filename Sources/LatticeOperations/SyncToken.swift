import LatticeAPI
import LatticeCore

/// The opaque sync tokens of the change feeds.
///
/// A token names a log and a position in it: `z1.<zone row id>.<position>` for a zone's record log and
/// `d1.<database id>.<position>` for a database's zone log, base64url-encoded. Clients must treat them
/// as opaque. Zone row ids are never reused, so a token from before a zone was deleted and recreated
/// names a row that is gone, and gets CHANGE_TOKEN_EXPIRED.
package struct SyncToken: Hashable, Sendable {
    package enum Log: String, Sendable {
        case zone = "z1"
        case database = "d1"
        /// A hierarchy share's own log, for its participants.
        case share = "s1"
    }

    package let log: Log
    package let owner: Int64
    package let position: Int64

    package var text: String {
        Base64URL.encode(Array("\(log.rawValue).\(owner).\(position)".utf8))
    }

    package init(log: Log, owner: Int64, position: Int64) {
        self.log = log
        self.owner = owner
        self.position = position
    }

    /// Parses a token of the expected log. - Throws: BAD_REQUEST for anything that is not one.
    package init(text: String, expected: Log) throws(ServiceError) {
        let invalid = ServiceError.badRequest("syncToken is not a token this server issued for this feed")
        guard text.utf8.count <= 200 else { throw invalid }
        guard let data = Base64URL.decode(text) else { throw invalid }
        let parts = String(decoding: data, as: UTF8.self).split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, parts[0] == expected.rawValue, let owner = Int64(parts[1]), let position = Int64(parts[2]),
              owner >= 0, position >= 0 else { throw invalid }
        self.init(log: expected, owner: owner, position: position)
    }
}
