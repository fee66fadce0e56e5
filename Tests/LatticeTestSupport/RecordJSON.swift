import LatticeCore

// JSON shorthands for request bodies, shared by the in-process and the real-process tests.

/// `{"operationType": type, "record": {...}}` with plain values.
public func operation(_ type: String, _ name: String, recordType: String? = "Item", fields: [String: JSON] = [:],
                      tag: String? = nil, extra: [String: JSON] = [:]) -> JSON {
    var record: [String: JSON] = ["recordName": .string(name)]
    if let recordType { record["recordType"] = .string(recordType) }
    if !fields.isEmpty { record["fields"] = .object(fields) }
    if let tag { record["recordChangeTag"] = .string(tag) }
    for (key, value) in extra { record[key] = value }
    return .object(["operationType": .string(type), "record": .object(record)])
}

public func value(_ v: JSON) -> JSON { .object(["value": v]) }
