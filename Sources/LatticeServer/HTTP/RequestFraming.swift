/// How a request says where its body ends, checked from the headers before any body is read (RFC 9112 §6.1,
/// §6.3). A framing that a proxy in front and this server could read two ways is refused, never guessed at:
/// the bytes one reads as body the other would read as the next request (request smuggling).
///
/// Headers are as `HTTPExchange` gathers them: names lowercased, a repeated header joined with ", ", so two
/// `Content-Length` headers look like one list.
enum RequestFraming {
    /// The refusal for an ambiguous or unsupported framing, or nil for a plain one: no body headers, one
    /// `Content-Length` (the same value repeated counts as one), or `Transfer-Encoding: chunked` alone.
    static func refusal(_ headers: [String: String]) -> HTTPRefusal? {
        if let transferEncoding = headers["transfer-encoding"] {
            guard headers["content-length"] == nil else {
                return .ambiguousFraming("a request must not have both Content-Length and Transfer-Encoding")
            }
            let codings = listElements(transferEncoding).map { $0.lowercased() }
            guard !codings.isEmpty else {
                return .ambiguousFraming("Transfer-Encoding names no transfer coding")
            }
            if codings.dropLast().contains("chunked") {
                return .ambiguousFraming("chunked must be the final transfer coding, and applied once")
            }
            if let unknown = codings.first(where: { $0 != "chunked" }) { return .unsupportedTransferCoding(unknown) }
            return nil
        }
        if let contentLength = headers["content-length"] {
            let values = listElements(contentLength)
            guard !values.isEmpty, values.allSatisfy(isDecimal) else {
                return .ambiguousFraming("Content-Length must be one decimal number")
            }
            guard Set(values.map(withoutLeadingZeros)).count == 1 else {
                return .ambiguousFraming("the request has Content-Length values that differ")
            }
        }
        return nil
    }

    /// The body length a `Content-Length` value declares, for a value `refusal` let pass (a repeated value
    /// counts once); nil when there is none, or it is not one decimal number that fits.
    static func declaredLength(_ contentLength: String?) -> Int? {
        guard let contentLength else { return nil }
        let values = Set(listElements(contentLength).map(withoutLeadingZeros))
        guard values.count == 1, let value = values.first, value.allSatisfy(\.isASCIIDigit) else { return nil }
        return Int(value)
    }

    /// The non-empty elements of a comma-separated header list, without surrounding spaces and tabs (RFC 9110
    /// §5.6.1: empty elements are ignored).
    private static func listElements(_ value: String) -> [Substring] {
        value.split(separator: ",", omittingEmptySubsequences: false).map(trimmed).filter { !$0.isEmpty }
    }

    private static func trimmed(_ text: Substring) -> Substring {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = text.firstIndex(where: { !isSpace($0) }), let last = text.lastIndex(where: { !isSpace($0) })
        else { return "" }
        return text[first...last]
    }

    private static func isDecimal(_ text: Substring) -> Bool { !text.isEmpty && text.allSatisfy(\.isASCIIDigit) }

    private static func withoutLeadingZeros(_ text: Substring) -> Substring {
        let trimmed = text.drop { $0 == "0" }
        return trimmed.isEmpty ? "0" : trimmed
    }
}

extension Character {
    fileprivate var isASCIIDigit: Bool { ("0"..."9").contains(self) && isASCII }
}
