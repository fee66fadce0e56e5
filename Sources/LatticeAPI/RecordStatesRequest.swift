import LatticeCore

/// A `records/modify` body whose operations all carry CRDT states (what a syncing client sends), read in
/// one pass from its bytes: no `JSON` tree of the body, no tree of each record (`Record.readState`).
///
/// `read` takes only the plain form: an object with `operations` (1 to `maximumOperations` objects, each
/// `create`, `update` or `forceUpdate` of a record dictionary with CRDT metadata and its own zone id),
/// and optionally `zoneID`, `atomic` (a boolean), `desiredKeys` (strings) and `clientOperationID` (a
/// string); members it does not know are skipped as the tree read skips them. Anything else, or anything
/// over a cap, gives nil, and the server reads the body as a tree (`RecordsModifyRequest`), which answers
/// with the precise error. So what this type takes is decoded exactly as the tree read decodes it, and
/// what it does not take is answered exactly as before.
public struct RecordStatesRequest: Sendable {
    /// One operation: its type, and the record as read.
    public struct Operation: Sendable {
        public let type: RecordOperationKind
        public let state: RecordStateRead

        public var recordName: String { state.record.id.recordName }
    }

    public let operations: [Operation]
    /// The request's `zoneID` member as given (nil when absent: the server's error names it).
    public let zoneID: JSON?
    public let atomic: Bool
    /// The request's `desiredKeys` (nil: all fields).
    public let desiredKeys: Set<String>?
    /// The request's `clientOperationID` member as given (checked by `ReplayKey`).
    public let clientOperationID: JSON?

    /// Reads `bytes` in one pass; nil when the body is not in the plain form (see the type's summary).
    public static func read(_ bytes: [UInt8], maximumOperations: Int, caps: RecordStateCaps) -> RecordStatesRequest? {
        var reader = JSONReader(bytes)
        var operations: [Operation] = []
        var zoneID: JSON?, atomic: JSON?, desiredKeys: JSON?, clientOperationID: JSON?
        var seen: Set<String> = []
        var refused = false
        do {
            guard reader.next == UInt8(ascii: "{") else { return nil }
            try reader.members { reader, key in
                guard !refused, seen.insert(key).inserted else { refused = true; return try reader.skip() }
                switch key {
                case "operations":
                    guard reader.next == UInt8(ascii: "[") else { refused = true; return try reader.skip() }
                    try reader.elements { reader in
                        guard !refused, operations.count < maximumOperations,
                              let operation = try readOperation(&reader, caps: caps) else {
                            refused = true
                            return try reader.skip()
                        }
                        operations.append(operation)
                    }
                case "zoneID": zoneID = try reader.value()
                case "atomic": atomic = try reader.value()
                case "desiredKeys": desiredKeys = try reader.value()
                case "clientOperationID": clientOperationID = try reader.value()
                default: try reader.skip()
                }
            }
            try reader.end()
        } catch {
            return nil
        }
        guard !refused, !operations.isEmpty else { return nil }
        let flag: Bool
        switch atomic {
        case nil: flag = true
        case .bool(let value)?: flag = value
        default: return nil
        }
        var keys: Set<String>? = nil
        if let desiredKeys {
            guard let names = desiredKeys.arrayValue?.compactMap(\.stringValue),
                  names.count == desiredKeys.arrayValue?.count else { return nil }
            keys = Set(names)
        }
        return RecordStatesRequest(operations: operations, zoneID: zoneID, atomic: flag, desiredKeys: keys,
                                   clientOperationID: clientOperationID)
    }

    /// `{"operationType": "create" | "update" | "forceUpdate", "record": {... "crdt": ...}}`.
    private static func readOperation(_ reader: inout JSONReader, caps: RecordStateCaps) throws -> Operation? {
        guard reader.next == UInt8(ascii: "{") else { return nil }
        var type: RecordOperationKind?, state: RecordStateRead?
        var seen: [String] = []
        var refused = false
        try reader.members { reader, key in
            guard !refused, !seen.contains(key) else { refused = true; return try reader.skip() }
            seen.append(key)
            switch key {
            case "operationType":
                let name = try reader.value().stringValue
                type = name.flatMap(RecordOperationKind.init(rawValue:))
                if type == nil || type?.takesStates != true { refused = true }
            case "record":
                guard let read = try Record.readState(&reader, caps: caps) else { refused = true; return }
                state = read
            default: try reader.skip()
            }
        }
        guard !refused, let type, let state else { return nil }
        return Operation(type: type, state: state)
    }
}

/// What a `records/modify` operation does.
public enum RecordOperationKind: String, Sendable, Hashable, CaseIterable {
    case create, update, forceUpdate, replace, forceReplace, delete, forceDelete

    public var checksChangeTag: Bool { self == .update || self == .replace || self == .delete }
    public var isDelete: Bool { self == .delete || self == .forceDelete }
    public var isReplace: Bool { self == .replace || self == .forceReplace }
    /// The operations that take a CRDT state (`record.crdt`): replace takes plain values only, delete none.
    public var takesStates: Bool { self == .create || self == .update || self == .forceUpdate }
}

extension RecordStatesRequest {
    /// The body of a `records/modify` of CRDT states, as a client sends it: the same bytes `serializedBytes`
    /// gives for `{"atomic", "clientOperationID"?, "desiredKeys"?, "operations": [{"operationType", "record"}],
    /// "zoneID"}`, written straight from the records (`Record.appendCloudKitJSON`), with no tree made.
    /// `read` reads it back.
    public static func body(zoneID: ZoneID, _ operations: [(type: RecordOperationKind, record: Record)], atomic: Bool,
                            desiredKeys: [String]? = nil, clientOperationID: String? = nil) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(96 + operations.count * 640)
        out.append(contentsOf: #"{"atomic":"#.utf8)
        out.append(contentsOf: (atomic ? "true" : "false").utf8)
        if let clientOperationID {
            out.append(contentsOf: #","clientOperationID":"#.utf8)
            out.append(contentsOf: JSON.string(clientOperationID).serializedBytes())
        }
        if let desiredKeys {
            out.append(contentsOf: #","desiredKeys":"#.utf8)
            out.append(contentsOf: JSON.array(desiredKeys.map(JSON.string)).serializedBytes())
        }
        out.append(contentsOf: #","operations":["#.utf8)
        for (index, operation) in operations.enumerated() {
            if index > 0 { out.append(UInt8(ascii: ",")) }
            out.append(contentsOf: #"{"operationType":""#.utf8)
            out.append(contentsOf: operation.type.rawValue.utf8)
            out.append(contentsOf: #"","record":"#.utf8)
            operation.record.appendCloudKitJSON(into: &out)
            out.append(UInt8(ascii: "}"))
        }
        out.append(contentsOf: #"],"zoneID":"#.utf8)
        out.append(contentsOf: zoneID.cloudKitJSON.serializedBytes())
        out.append(UInt8(ascii: "}"))
        return out
    }
}

/// The items of a batch write's answer (`{"records": [...]}` of `records/modify` or `deltas/push`), read in
/// one pass keeping only the members a client acts on: which record, its error, its change tag and zone
/// position. The rest of each item (a record's header, who changed it when) is skipped, not parsed into
/// a tree.
public enum BatchAnswerItems {
    /// The members kept of each item.
    public static let members: Set<String> = [
        "recordName", "serverErrorCode", "reason", "retryAfter", "recordChangeTag", "position", "upToDate",
    ]

    /// Each item as an object of its kept members; nil when the bytes are not such an answer.
    public static func read(_ bytes: [UInt8]) -> [JSON]? {
        var reader = JSONReader(bytes)
        var items: [JSON] = []
        var found = false
        do {
            guard reader.next == UInt8(ascii: "{") else { return nil }
            try reader.members { reader, key in
                guard key == "records", reader.next == UInt8(ascii: "[") else { return try reader.skip() }
                found = true
                try reader.elements { reader in
                    guard reader.next == UInt8(ascii: "{") else { return items.append(try reader.value()) }
                    var kept: [String: JSON] = [:]
                    try reader.members { reader, key in
                        if members.contains(key) { kept[key] = try reader.value() } else { try reader.skip() }
                    }
                    items.append(.object(kept))
                }
            }
            try reader.end()
        } catch {
            return nil
        }
        return found ? items : nil
    }
}
