import Foundation
import LatticeCore

/// Checks answers against the schemas of Docs/openapi.json, the way a schema-driven client (schemathesis)
/// does. It knows the keywords the document uses: `$ref`, `allOf`, `oneOf`, `type` with `nullable`,
/// `enum`, `required`, `properties`, `additionalProperties`, `items`, `minItems`/`maxItems`,
/// `minLength`/`maxLength` and `minimum`/`maximum`. `format`, `pattern` and `default` are not checked.
struct SchemaCheck {
    let document: JSON

    /// Docs/openapi.json of this checkout.
    static func openAPI() throws -> SchemaCheck {
        let url = OpenAPITests.packageRoot.appendingPathComponent("Docs/openapi.json")
        return SchemaCheck(document: try JSON.parse([UInt8](try Data(contentsOf: url))))
    }

    /// Every way `value` breaks the schema `#/components/schemas/<name>`; empty when it conforms.
    func violations(_ value: JSON, schema name: String) -> [String] {
        var problems: [String] = []
        check(value, .object(["$ref": .string("#/components/schemas/" + name)]), at: "$", &problems)
        return problems
    }

    private func resolve(_ reference: String) -> JSON? {
        guard reference.hasPrefix("#/") else { return nil }
        var target: JSON? = document
        for key in reference.dropFirst(2).split(separator: "/") { target = target?[String(key)] }
        return target
    }

    private func check(_ value: JSON, _ schema: JSON, at path: String, _ problems: inout [String]) {
        if let reference = schema["$ref"]?.stringValue {
            guard let target = resolve(reference) else { return problems.append("\(path): dangling \(reference)") }
            return check(value, target, at: path, &problems)
        }
        for part in schema["allOf"]?.arrayValue ?? [] { check(value, part, at: path, &problems) }
        if let choices = schema["oneOf"]?.arrayValue {
            var matching = 0
            var reasons: [String] = []
            for choice in choices {
                var inner: [String] = []
                check(value, choice, at: path, &inner)
                if inner.isEmpty { matching += 1 } else { reasons.append(inner.joined(separator: "; ")) }
            }
            if matching != 1 {
                problems.append("\(path): matches \(matching) of the oneOf choices (\(reasons.joined(separator: " | ")))")
            }
        }
        if value == .null {
            if schema["type"] != nil && schema["nullable"] != .bool(true) { problems.append("\(path): null") }
            return
        }
        if let type = schema["type"]?.stringValue, !Self.has(value, type: type) {
            return problems.append("\(path): expected \(type), got \(value.serialized())")
        }
        if let allowed = schema["enum"]?.arrayValue, !allowed.contains(value) {
            problems.append("\(path): \(value.serialized()) is not one of \(JSON.array(allowed).serialized())")
        }
        switch value {
        case .object(let object):
            for key in schema["required"]?.arrayValue?.compactMap(\.stringValue) ?? [] where object[key] == nil {
                problems.append("\(path): missing \(key)")
            }
            let properties = schema["properties"]?.objectValue ?? [:]
            for (key, member) in object {
                if let property = properties[key] {
                    check(member, property, at: path + "." + key, &problems)
                } else if let extra = schema["additionalProperties"] {
                    if extra == .bool(false) {
                        problems.append("\(path): unexpected \(key)")
                    } else if extra.objectValue != nil {
                        check(member, extra, at: path + "." + key, &problems)
                    }
                }
            }
        case .array(let elements):
            if let minimum = schema["minItems"]?.intValue, elements.count < minimum {
                problems.append("\(path): fewer than \(minimum) items")
            }
            if let maximum = schema["maxItems"]?.intValue, elements.count > maximum {
                problems.append("\(path): more than \(maximum) items")
            }
            if let items = schema["items"] {
                for (index, element) in elements.enumerated() { check(element, items, at: "\(path)[\(index)]", &problems) }
            }
        case .string(let text):
            if let minimum = schema["minLength"]?.intValue, text.count < minimum { problems.append("\(path): too short") }
            if let maximum = schema["maxLength"]?.intValue, text.count > maximum { problems.append("\(path): too long") }
        case .int, .double:
            let number = value.doubleValue ?? 0
            if let minimum = schema["minimum"]?.doubleValue, number < minimum { problems.append("\(path): below \(minimum)") }
            if let maximum = schema["maximum"]?.doubleValue, number > maximum { problems.append("\(path): above \(maximum)") }
        default:
            break
        }
    }

    private static func has(_ value: JSON, type: String) -> Bool {
        switch (type, value) {
        case ("object", .object), ("array", .array), ("string", .string), ("boolean", .bool): return true
        case ("integer", .int): return true
        case ("integer", .double(let number)): return number.rounded() == number
        case ("number", .int), ("number", .double): return true
        default: return false
        }
    }
}
