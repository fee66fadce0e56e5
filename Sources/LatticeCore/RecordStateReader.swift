/// A record dictionary with CRDT metadata, as a write carries it, read in one pass from JSON text
/// (`Record.readState`): the record, and the members of the dictionary the write itself looks at.
public struct RecordStateRead: Sendable {
    public let record: Record
    /// The `parent` member as given (nil when absent).
    public let parent: JSON?
    /// The `recordChangeTag` member as given (nil when absent).
    public let changeTag: JSON?
}

/// The caps a record dictionary is read under: fields per record and elements per array anywhere in it.
public struct RecordStateCaps: Sendable, Hashable {
    public var maximumFields: Int
    public var maximumListElements: Int

    public init(maximumFields: Int, maximumListElements: Int) {
        self.maximumFields = maximumFields
        self.maximumListElements = maximumListElements
    }
}

extension Record {
    /// Reads a record dictionary with full CRDT metadata (the form `cloudKitJSON` writes) from `reader`,
    /// in one pass: no `JSON` tree is built for the record, its fields, entries or stamps.
    ///
    /// The result, when there is one, is exactly the record `Record(cloudKitJSON:zoneID:)` makes of the
    /// same text. Nil means the dictionary is not in the plain form this reader takes, or that it breaks a
    /// rule or a cap (`caps`): a duplicate key, no `zoneID` with both names, a plain value without CRDT
    /// metadata, `fields` not an object, more fields or a longer array than the caps allow, or anything
    /// `Record(cloudKitJSON:)` refuses. The caller then parses the text as a tree, which gives the precise
    /// answer, so this reader never has to word an error.
    /// - Throws: when the text is not JSON (the caller falls back in the same way).
    public static func readState(_ reader: inout JSONReader, caps: RecordStateCaps) throws -> RecordStateRead? {
        var state = StateMembers()
        var keys = KeySet()
        var refused = false
        try reader.members { reader, key in
            guard !refused, keys.insert(key) else { refused = true; return try reader.skip() }
            if key == "fields" {
                guard reader.next == UInt8(ascii: "{") else { refused = true; return try reader.skip() }
                var fields: [Field] = []
                var names = KeySet()
                try reader.members { reader, name in
                    guard !refused, names.insert(name), fields.count < caps.maximumFields,
                          let field = try readField(name, &reader, caps: caps) else {
                        refused = true
                        return try reader.skip()
                    }
                    fields.append(field)
                }
                state.fields = fields
                return
            }
            if key == "zoneID" {
                // `{"zoneName", "ownerRecordName"}` member by member (both needed: no default owner here).
                guard reader.next == UInt8(ascii: "{") else { refused = true; return try reader.skip() }
                var zoneName: JSON?, owner: JSON?
                var zoneKeys = KeySet()
                try reader.members { reader, key in
                    guard !refused, zoneKeys.insert(key) else { refused = true; return try reader.skip() }
                    let value = try reader.value()
                    if value.largestArray > caps.maximumListElements { refused = true }
                    if key == "zoneName" { zoneName = value } else if key == "ownerRecordName" { owner = value }
                }
                guard let zoneName = zoneName?.stringValue, let owner = owner?.stringValue,
                      let zone = try? ZoneID(zoneName: zoneName, ownerRecordName: owner) else { refused = true; return }
                state.zone = zone
                return
            }
            if key == "crdt" {
                // `{"generation", "created", "deletion"?, "parent"?}` member by member.
                guard reader.next == UInt8(ascii: "{") else { refused = true; return try reader.skip() }
                var crdtKeys = KeySet()
                state.hasCRDT = true
                try reader.members { reader, key in
                    guard !refused, crdtKeys.insert(key) else { refused = true; return try reader.skip() }
                    switch key {
                    case "created", "deletion", "parent":
                        // Present, a stamp must be a valid one (null included: it is not absent).
                        guard let stamp = try readStamp(&reader, caps: caps, refused: &refused) else { refused = true; return }
                        if key == "created" { state.created = stamp } else if key == "deletion" { state.deletion = stamp } else {
                            state.parentStamp = stamp
                        }
                    default:
                        let value = try reader.value()
                        if value.largestArray > caps.maximumListElements { refused = true }
                        if key == "generation" { state.generation = value }
                    }
                }
                return
            }
            // Every other member is read whole (they are small); its arrays count against the cap too, read
            // or ignored.
            let value = try reader.value()
            if value.largestArray > caps.maximumListElements { refused = true }
            switch key {
            case "recordName": state.recordName = value
            case "recordType": state.recordType = value
            case "deleted": state.deleted = value
            case "parent": state.parent = value
            case "recordChangeTag": state.changeTag = value
            default: break
            }
        }
        guard !refused else { return nil }
        return state.record()
    }

    /// One field: a register (`crdt.stamp`) or a set (`crdt.entries` and `crdt.context`), as
    /// `Record(cloudKitJSON:)` reads it; nil for anything it would refuse or a cap, and for a list or text.
    private static func readField(_ name: String, _ reader: inout JSONReader, caps: RecordStateCaps) throws -> Field? {
        guard Names.isValid(name, kind: .fieldName), reader.next == UInt8(ascii: "{") else { return nil }
        var value: JSON?, type: JSON?
        var stamp: Stamp?, entries: [RawEntry?]?, context: [Stamp]?, contextValid = true
        var runs: JSON?, types: JSON?
        var hasCRDT = false
        var keys = KeySet()
        var refused = false
        try reader.members { reader, key in
            guard !refused, keys.insert(key) else { refused = true; return try reader.skip() }
            switch key {
            case "value": value = try reader.value()
            case "type": type = try reader.value()
            case "crdt":
                guard reader.next == UInt8(ascii: "{") else { refused = true; return try reader.skip() }
                hasCRDT = true
                var crdtKeys = KeySet()
                try reader.members { reader, key in
                    guard !refused, crdtKeys.insert(key) else { refused = true; return try reader.skip() }
                    switch key {
                    case "stamp":
                        // A register's stamp: present, it must be a valid one.
                        guard let read = try readStamp(&reader, caps: caps, refused: &refused) else { refused = true; return }
                        stamp = read
                    case "entries":
                        guard reader.next == UInt8(ascii: "[") else { refused = true; return try reader.skip() }
                        var read: [RawEntry?] = []
                        try reader.elements { reader in
                            guard !refused, read.count < caps.maximumListElements else { refused = true; return try reader.skip() }
                            read.append(try readEntry(&reader, caps: caps, refused: &refused))
                        }
                        entries = read
                    case "context":
                        guard reader.next == UInt8(ascii: "[") else { refused = true; return try reader.skip() }
                        var read: [Stamp] = []
                        try reader.elements { reader in
                            guard !refused, read.count < caps.maximumListElements else { refused = true; return try reader.skip() }
                            if let stamp = try readStamp(&reader, caps: caps, refused: &refused) { read.append(stamp) } else { contextValid = false }
                        }
                        context = read
                    case "runs":
                        let read = try reader.value()
                        if read.largestArray > caps.maximumListElements { refused = true }
                        runs = read
                    case "types":
                        let read = try reader.value()
                        if read.largestArray > caps.maximumListElements { refused = true }
                        types = read
                    default:
                        if try reader.value().largestArray > caps.maximumListElements { refused = true }
                    }
                }
            default:
                if try reader.value().largestArray > caps.maximumListElements { refused = true }
            }
        }
        guard !refused, hasCRDT else { return nil }
        if (value?.largestArray ?? 0) > caps.maximumListElements || (type?.largestArray ?? 0) > caps.maximumListElements {
            return nil
        }
        if let runs {
            // A list or text: read as the tree read does, from the members gathered.
            guard stamp == nil, entries == nil, let type, let value, contextValid, let context else { return nil }
            var crdt: [String: JSON] = ["runs": runs, "context": .array(context.map(\.json))]
            if let types { crdt["types"] = types }
            return try? Field(name: name, state: FieldState(sequenceJSON: ["crdt": .object(crdt), "type": type, "value": value],
                                                             path: ""))
        }
        if let stamp {
            // A register: `value` null is a cleared one; a missing value is refused (as a tree read does).
            guard let value else { return nil }
            guard value != .null else { return Field(name: name, state: .register(LWWRegister(value: nil, stamp: stamp))) }
            guard let typeName = type?.stringValue ?? FieldValue.inferredType(value), !typeName.hasSuffix("_LIST"),
                  let valueType = ValueType(cloudKitName: typeName),
                  let scalar = try? ScalarValue(cloudKitJSON: value, type: valueType, path: "") else { return nil }
            return Field(name: name, state: .register(LWWRegister(value: scalar, stamp: stamp)))
        }
        // A set (`_SET`; `_LIST` from clients written before lists kept their order). A list or text
        // (`crdt.runs`) is left to the tree read.
        guard let typeName = type?.stringValue, let (listType, _) = ValueType.collection(typeName),
              let entries, let context, contextValid else { return nil }
        var elements: [ORSet.Entry] = []
        elements.reserveCapacity(entries.count)
        for entry in entries {
            // An entry's value is typed by the list's type unless it names its own.
            guard let entry,
                  let element = try? ScalarValue(cloudKitJSON: entry.value, type: entry.type ?? listType, path: "") else {
                return nil
            }
            elements.append(ORSet.Entry(element: element, dot: entry.dot))
        }
        let vector = VersionVector(context.map { VersionVector.Entry(replica: $0.replica, hlc: $0.hlc) })
        return Field(name: name, state: .set(ORSet(entries: elements, context: vector)))
    }

    /// An entry as read, before the list's type (known once the whole field is read) types its value.
    private struct RawEntry {
        let value: JSON
        let type: ValueType?
        let dot: Stamp
    }

    /// One entry of a list's `crdt.entries`: `{"value", "stamp", "type"?}`; nil when it would be refused.
    private static func readEntry(_ reader: inout JSONReader, caps: RecordStateCaps, refused: inout Bool) throws
        -> RawEntry? {
        guard reader.next == UInt8(ascii: "{") else {
            try reader.skip()
            return nil
        }
        var value: JSON?, stamp: Stamp?, stampValid = true, type: ValueType?, typeValid = true
        var keys = KeySet()
        try reader.members { reader, key in
            guard !refused, keys.insert(key) else { refused = true; return try reader.skip() }
            switch key {
            case "value": value = try reader.value()
            case "stamp":
                stamp = try readStamp(&reader, caps: caps, refused: &refused)
                stampValid = stamp != nil
            case "type":
                let json = try reader.value()
                // A type that is not a string is ignored, as a tree read ignores it.
                if let name = json.stringValue {
                    type = ValueType(cloudKitName: name)
                    typeValid = type != nil
                }
                if json.largestArray > caps.maximumListElements { refused = true }
            default:
                if try reader.value().largestArray > caps.maximumListElements { refused = true }
            }
        }
        guard let value, let stamp, stampValid, typeValid else { return nil }
        if value.largestArray > caps.maximumListElements { refused = true }
        return RawEntry(value: value, type: type, dot: stamp)
    }

    /// `{"ms", "counter", "replica"}` read member by member; nil when `Stamp(json:)` would refuse it.
    private static func readStamp(_ reader: inout JSONReader, caps: RecordStateCaps, refused: inout Bool) throws -> Stamp? {
        guard reader.next == UInt8(ascii: "{") else {
            try reader.skip()
            return nil
        }
        var ms: JSON?, counter: JSON?, replica: JSON?
        var keys = KeySet()
        try reader.members { reader, key in
            guard !refused, keys.insert(key) else { refused = true; return try reader.skip() }
            let value = try reader.value()
            if value.largestArray > caps.maximumListElements { refused = true }
            switch key {
            case "ms": ms = value
            case "counter": counter = value
            case "replica": replica = value
            default: break
            }
        }
        return Stamp(ms: ms, counter: counter, replica: replica)
    }
}

/// The members of a record dictionary `Record.readState` keeps, turned into the record as
/// `Record(cloudKitJSON:zoneID:)` would make it (nil wherever that would throw).
private struct StateMembers {
    var recordName: JSON?, recordType: JSON?, deleted: JSON?, parent: JSON?, changeTag: JSON?
    /// The dictionary's zone id, read and checked (both names given).
    var zone: ZoneID?
    /// The `crdt` object's members, each stamp read and checked.
    var hasCRDT = false
    var generation: JSON?, created: Stamp?, deletion: Stamp?, parentStamp: Stamp?
    var fields: [Field]?

    func record() -> RecordStateRead? {
        guard let recordName = recordName?.stringValue, let recordType = recordType?.stringValue, let zone, hasCRDT,
              let generation = generation?.intValue, (1...Int64(UInt32.max)).contains(generation),
              let created else { return nil }
        guard let id = try? RecordID(recordName: recordName, zoneID: zone),
              (try? Names.validate(recordType, kind: .recordType)) != nil else { return nil }
        if let deleted, deleted != .bool(deletion != nil) { return nil }
        var parentRegister: LWWRegister? = nil
        if let stamp = parentStamp {
            var value: ScalarValue? = nil
            if let parent, parent != .null {
                guard case .reference(let reference)? = try? ScalarValue(cloudKitJSON: parent, type: .reference, path: "parent"),
                      reference.action == .none, reference.zoneID == nil || reference.zoneID == zone,
                      reference.recordName != recordName else { return nil }
                value = .reference(Reference(validatedRecordName: reference.recordName, zoneID: nil, action: .none))
            }
            parentRegister = LWWRegister(value: value, stamp: stamp)
        }
        var sorted = fields ?? []
        sorted.sort { compareBytes($0.name, $1.name) < 0 }
        let record = Record(id: id, recordType: recordType, generation: UInt32(generation), created: created,
                            deletion: deletion, parent: parentRegister, fields: sorted)
        return RecordStateRead(record: record, parent: parent, changeTag: changeTag)
    }
}

/// The keys of one object read so far, to refuse a duplicate as `JSON.parse` does. The first eight are
/// kept inline (short keys are small strings: no allocation for the objects of a record dictionary).
private struct KeySet {
    private var inline: (String?, String?, String?, String?, String?, String?, String?, String?)
        = (nil, nil, nil, nil, nil, nil, nil, nil)
    private var count = 0
    private var more: Set<String> = []

    /// False when `key` was read before.
    mutating func insert(_ key: String) -> Bool {
        let filled = Swift.min(count, 8)
        // A homogeneous tuple's elements are laid out as an array's (the rebinding Swift allows for them).
        let seen = withUnsafeMutablePointer(to: &inline) { tuple in
            tuple.withMemoryRebound(to: String?.self, capacity: 8) { slots in
                (0 ..< filled).contains { slots[$0] == key }
            }
        }
        if seen || (count >= 8 && more.contains(key)) { return false }
        if count < 8 {
            let index = count
            withUnsafeMutablePointer(to: &inline) { tuple in
                tuple.withMemoryRebound(to: String?.self, capacity: 8) { $0[index] = key }
            }
        } else {
            more.insert(key)
        }
        count += 1
        return true
    }
}

extension Stamp {
    /// A stamp from the members of its JSON object, checked as `Stamp(json:path:)` checks them.
    init?(ms: JSON?, counter: JSON?, replica: JSON?) {
        guard let ms = ms?.intValue, let counter = counter?.intValue, let replicaText = replica?.stringValue,
              ms >= 0 && UInt64(ms) <= HLC.maximumMilliseconds, (0...Int64(UInt16.max)).contains(counter),
              let replica = ReplicaID(hex: replicaText) else { return nil }
        self.init(hlc: HLC(milliseconds: UInt64(ms), counter: UInt16(counter)), replica: replica)
    }
}

extension JSON {
    /// The length of the longest array anywhere in the value (0 when it holds none).
    var largestArray: Int {
        switch self {
        case .array(let elements): return elements.reduce(elements.count) { Swift.max($0, $1.largestArray) }
        case .object(let members): return members.values.reduce(0) { Swift.max($0, $1.largestArray) }
        default: return 0
        }
    }
}
