import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore

/// Short share links (`{public URL}/s/{code}`): a random code that points at one signed link. The code only
/// points: every use checks the signed link it names (`verifiedLink`), so rotating a share's links or
/// stopping sharing leaves its codes answering exactly as the revoked long link does. Docs/Sharing.md.
extension Shares {
    /// The short codes a share keeps; making one more forgets its oldest (its long link keeps working).
    package static let shortLinksPerShare = 50

    package static func shortURL(publicURL: String, code: String) -> String {
        (publicURL.hasSuffix("/") ? String(publicURL.dropLast()) : publicURL) + "/s/" + code
    }

    /// Stores a fresh code for `token`, a signed link of `share`, and returns the short URL.
    package func makeShortLink(token: String, share: StoredShare, _ tx: any StorageTransaction) throws -> String {
        // About 49 bits per code: a collision is all but impossible; a few draws settle one anyway.
        for _ in 0..<4 {
            let code = try Secrets.randomString(length: ShortLinkCode.length, alphabet: ShortLinkCode.alphabet)
            do {
                try tx.insertShortLink(code: code, shareID: share.id, token: token, nowMs: core.configuration.now())
            } catch StorageError.duplicate {
                continue
            }
            _ = try tx.pruneShortLinks(shareID: share.id, keeping: Self.shortLinksPerShare)
            return Self.shortURL(publicURL: core.publicURL, code: code)
        }
        throw ServiceError(.internalError, "no free short link code")
    }

    /// The token of the signed link `code` points at, when that link still works; otherwise the error every
    /// invalid link gets (the same for an unknown code, a revoked link and a share no longer shared).
    package func shortLinkToken(code: String, _ tx: any StorageTransaction) throws -> String {
        guard let normalized = ShortLinkCode.normalized(code), let link = try tx.shortLink(code: normalized) else {
            throw ServiceError(.accessDenied, ShareTokenError.invalid.description)
        }
        let (_, share) = try verifiedLink(link.token, tx)
        guard share.id == link.shareID else { throw ServiceError(.accessDenied, ShareTokenError.invalid.description) }
        return link.token
    }

    /// A link as `records/resolve|accept` received it (a token, cut from a signed URL by `ShareLinksRequest`,
    /// or a short link) as the token of a signed link.
    package func linkToken(_ link: String, _ tx: any StorageTransaction) throws -> String {
        guard let code = ShareLinkText.shortCode(fromLink: link) else { return link }
        return try shortLinkToken(code: code, tx)
    }

    /// `GET /s/{code}`: the signed link a short link points at, with the punctuation a sentence left after the
    /// code ignored. Every failure is the invalid-link error.
    package func resolveShortLink(_ text: String, deadline: RequestDeadline?) throws -> ShortLinkResolution {
        let code = ShortLinkCode.normalized(ShareLinkText.withoutTrailingPunctuation(text).replacingSlashSuffix())
        guard let code else { throw ServiceError(.accessDenied, ShareTokenError.invalid.description) }
        let token = try core.storage.read(deadline: deadline) { tx in try shortLinkToken(code: code, tx) }
        return ShortLinkResolution(url: Self.shareURL(publicURL: core.publicURL, token: token),
                                   shortURL: Self.shortURL(publicURL: core.publicURL, code: code))
    }
}

private extension String {
    /// Without one trailing `/` (`/s/{code}/`).
    func replacingSlashSuffix() -> String { hasSuffix("/") ? String(dropLast()) : self }
}
