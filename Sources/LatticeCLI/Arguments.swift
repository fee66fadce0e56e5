import Foundation

/// A usage mistake: exit code 2, with the command's usage.
struct UsageError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// Hand-written parsing: positionals, `--option VALUE` / `--option=VALUE` (repeatable), and `--flag`s.
/// Options are long (`--name`) or `-h`; any other argument, one that begins with a single `-` included,
/// is a positional: key ids, token ids and names may begin with `-` (base64url uses it). After `--` every
/// argument is a positional, for a value that begins with `--`.
struct ParsedArguments {
    var positionals: [String] = []
    var values: [String: [String]] = [:]
    var flags: Set<String> = []

    /// - Parameters:
    ///   - valueOptions: options that take a value, without the leading `--`.
    ///   - flagOptions: options that take none.
    init(_ arguments: [String], valueOptions: Set<String>, flagOptions: Set<String>) throws(UsageError) {
        var index = 0
        var optionsEnded = false
        while index < arguments.count {
            let argument = arguments[index]
            index += 1
            guard !optionsEnded, argument.hasPrefix("--") || argument == "-h" else {
                positionals.append(argument)
                continue
            }
            if argument == "--" {
                optionsEnded = true
                continue
            }
            if argument == "-h" {
                flags.insert("help")
                continue
            }
            var name = String(argument.dropFirst(2))
            var inlineValue: String?
            if let equals = name.firstIndex(of: "=") {
                inlineValue = String(name[name.index(after: equals)...])
                name = String(name[..<equals])
            }
            if valueOptions.contains(name) {
                if let inlineValue {
                    values[name, default: []].append(inlineValue)
                } else {
                    guard index < arguments.count else { throw UsageError("--\(name) needs a value") }
                    values[name, default: []].append(arguments[index])
                    index += 1
                }
            } else if flagOptions.contains(name) || name == "help" {
                guard inlineValue == nil else { throw UsageError("--\(name) takes no value") }
                flags.insert(name)
            } else {
                throw UsageError("unknown option --\(name) (a value that begins with -- goes after --)")
            }
        }
    }

    /// The single value of an option, if given. - Throws: when given twice.
    func value(_ name: String) throws(UsageError) -> String? {
        guard let all = values[name] else { return nil }
        guard all.count == 1 else { throw UsageError("--\(name) given more than once") }
        return all[0]
    }

    func flag(_ name: String) -> Bool { flags.contains(name) }

    /// An integer option within a range.
    func integer(_ name: String, in range: ClosedRange<Int>) throws(UsageError) -> Int? {
        guard let text = try value(name) else { return nil }
        guard let number = Int(text), range.contains(number) else {
            throw UsageError("--\(name) must be an integer from \(range.lowerBound) to \(range.upperBound)")
        }
        return number
    }
}

/// Writes `lattice: message` to stderr and exits.
func fail(_ message: String, code: Int32) -> Never {
    FileHandle.standardError.write(Data("lattice: \(message)\n".utf8))
    exit(code)
}
