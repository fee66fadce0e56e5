/// Connection strings, as libpq reads them: a `postgresql://` (or `postgres://`) URL, or `key=value` pairs.
enum PostgresConnectionString {
    /// Whether `text` is meant for PostgreSQL: a `postgres://` or `postgresql://` URL, or libpq key=value pairs.
    static func isPostgres(_ text: String) -> Bool {
        let lower = text.lowercased()
        return lower.hasPrefix("postgres://") || lower.hasPrefix("postgresql://")
    }

    /// `text` with every password replaced by `***`: the `user:password@` part and a `password=` query
    /// parameter of a URL, or a `password=` pair of key=value form (quoted or not). For messages and logs.
    static func redacted(_ text: String) -> String {
        if isPostgres(text) { return redactedURL(text) }
        return redactedPairs(text)
    }

    private static func redactedURL(_ url: String) -> String {
        guard let schemeEnd = url.range(of: "://") else { return url }
        var result = String(url[..<schemeEnd.upperBound])
        var rest = Substring(url[schemeEnd.upperBound...])
        // The authority ends at the first '/', '?' or '#'; a password sits before its last '@'.
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        if let at = authority.lastIndex(of: "@") {
            let userInfo = authority[..<at]
            if let colon = userInfo.firstIndex(of: ":") {
                result += userInfo[..<colon] + ":***"
            } else {
                result += userInfo
            }
            result += authority[at...]
        } else {
            result += authority
        }
        rest = rest[authorityEnd...]
        guard let question = rest.firstIndex(of: "?") else { return result + rest }
        result += rest[...question]
        let query = rest[rest.index(after: question)...]
        let fragmentStart = query.firstIndex(of: "#") ?? query.endIndex
        let pairs = query[..<fragmentStart].split(separator: "&", omittingEmptySubsequences: false).map { pair -> String in
            let key = pair.split(separator: "=", maxSplits: 1).first.map(String.init) ?? ""
            return key.lowercased() == "password" ? key + "=***" : String(pair)
        }
        return result + pairs.joined(separator: "&") + query[fragmentStart...]
    }

    /// key=value pairs: values may be single-quoted with backslash escapes, and '=' may have spaces around it.
    private static func redactedPairs(_ text: String) -> String {
        let characters = Array(text)
        var output = ""
        var index = 0
        while index < characters.count {
            // Copy whitespace.
            while index < characters.count, characters[index].isWhitespace {
                output.append(characters[index])
                index += 1
            }
            // The key.
            var key = ""
            while index < characters.count, characters[index] != "=", !characters[index].isWhitespace {
                key.append(characters[index])
                index += 1
            }
            output += key
            // Spaces and '='.
            while index < characters.count, characters[index].isWhitespace || characters[index] == "=" {
                output.append(characters[index])
                index += 1
            }
            // The value.
            var value = ""
            if index < characters.count, characters[index] == "'" {
                value.append("'")
                index += 1
                while index < characters.count {
                    let character = characters[index]
                    value.append(character)
                    index += 1
                    if character == "\\", index < characters.count {
                        value.append(characters[index])
                        index += 1
                    } else if character == "'" {
                        break
                    }
                }
            } else {
                while index < characters.count, !characters[index].isWhitespace {
                    value.append(characters[index])
                    index += 1
                }
            }
            output += key.lowercased() == "password" ? "***" : value
        }
        return output
    }
}
