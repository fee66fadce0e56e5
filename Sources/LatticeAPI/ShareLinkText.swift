import LatticeCore

/// Share links as people paste them: a signed link (`…/share/{token}`), a short link (`…/s/{code}`) or a bare
/// token, with the punctuation a sentence or a messaging app leaves after it (`… see https://…/s/abc.`).
public enum ShareLinkText {
    /// Punctuation a messaging app or a sentence leaves after a link, as typed or percent-encoded. Neither a
    /// token (base64url) nor a short code ends so.
    public static let trailingPunctuation = [".", ",", ")", "]", "}", ">", "!", "?", "'", "\"", ";", ":", "*",
                                             "%22", "%27", "%29", "%3E", "%3e", "%5D", "%5d", "%7D", "%7d"]

    /// `text` without the punctuation `trailingPunctuation` lists at its end (blanks are not punctuation: a
    /// link with them stays invalid). Bounded by the text's length.
    public static func withoutTrailingPunctuation(_ text: String) -> String {
        var rest = Substring(text)
        while let suffix = trailingPunctuation.first(where: { rest.hasSuffix($0) }) { rest = rest.dropLast(suffix.count) }
        return String(rest)
    }

    /// The short code of a short link (`https://host/s/k7m2p9x4qa`, with or without trailing punctuation or
    /// a trailing slash), lowercased; nil when `text` is not a short link of a well-formed code.
    public static func shortCode(fromLink text: String) -> String? {
        let trimmed = withoutTrailingPunctuation(text)
        guard let range = trimmed.ranges(of: "/s/").last else { return nil }
        var code = String(trimmed[range.upperBound...])
        if code.hasSuffix("/") { code.removeLast() }
        return ShortLinkCode.normalized(code)
    }
}

/// The code of a short share link: `ShortLinkCode.length` characters from an alphabet without look-alikes
/// (no 0/o, 1/l/i), so it reads aloud and types on a phone. The server stores code -> signed link.
public enum ShortLinkCode {
    public static let alphabet = Array("23456789abcdefghjkmnpqrstuvwxyz")
    public static let length = 10

    /// `text` lowercased when it is a well-formed code, else nil.
    public static func normalized(_ text: String) -> String? {
        guard text.count == length else { return nil }
        let lowered = text.lowercased()
        guard lowered.allSatisfy({ alphabet.contains($0) }) else { return nil }
        return lowered
    }
}

/// `GET /s/{code}` for an API client: the signed link a short link points at.
public struct ShortLinkResolution: Sendable, Hashable {
    /// The signed share link (`…/share/{token}`): what `records/resolve` and `records/accept` take, and what
    /// verifies offline against the server's published keys.
    public var url: String
    public var shortURL: String

    public init(url: String, shortURL: String) {
        self.url = url
        self.shortURL = shortURL
    }

    public init?(json: JSON) {
        guard let url = json["url"]?.stringValue, let shortURL = json["shortURL"]?.stringValue else { return nil }
        self.init(url: url, shortURL: shortURL)
    }

    public var json: JSON { .object(["url": .string(url), "shortURL": .string(shortURL)]) }
}
