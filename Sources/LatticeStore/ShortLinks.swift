/// Short share links: a short random code that points at a signed share link (its token) of one share. The
/// code is only a pointer; the signed link it names is checked as any other (LatticeOperations'
/// `Shares.shortLink`), so a link revoked by a new URL epoch or a share no longer shared leaves its codes
/// pointing at a link that no longer works.

/// Short codes of share links (ShortLinks.swift).
public protocol ShortLinkStorage {
    /// Stores `code` -> (`shareID`, `token`). - Throws: `StorageError.duplicate` when the code is taken.
    func insertShortLink(code: String, shareID: Int64, token: String, nowMs: Int64) throws
    /// The share and token a code points at, nil for an unknown code.
    func shortLink(code: String) throws -> (shareID: Int64, token: String)?
    /// Keeps the `keeping` newest codes of a share and deletes the rest (all of them for 0); returns how many
    /// went.
    func pruneShortLinks(shareID: Int64, keeping: Int) throws -> Int
}

enum ShortLinkTables {
    static func migration(integer: String, text: String) -> String {
        """
        CREATE TABLE share_short_links(
            code \(text) PRIMARY KEY,
            share_id \(integer) NOT NULL,
            token \(text) NOT NULL,
            created_ms \(integer) NOT NULL);
        CREATE INDEX share_short_links_share ON share_short_links(share_id, created_ms);
        """
    }
}
