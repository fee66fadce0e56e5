import Foundation

/// A JSON record dictionary that does not describe a valid record. The message names the offending key path.
public struct RecordJSONError: Error, Hashable, Sendable, CustomStringConvertible {
    public let path: String
    public let message: String
    public init(path: String, message: String) {
        self.path = path
        self.message = message
    }
    public var description: String { "\(path): \(message)" }
}

// MARK: - Values

extension ScalarValue {
    /// The CloudKit Web Services JSON form of the value alone (without its type).
    public var cloudKitJSON: JSON {
        switch self {
        case .string(let s): return .string(s)
        case .int64(let i), .timestamp(let i): return .int(i)
        case .double(let d):
            return ScalarValue.json(d)
        case .bytes(let b): return .string(Data(b).base64EncodedString())
        case .reference(let r):
            var object: [String: JSON] = ["recordName": .string(r.recordName), "action": .string(r.action.cloudKitName)]
            if let zoneID = r.zoneID { object["zoneID"] = zoneID.cloudKitJSON }
            return .object(object)
        case .location(let l):
            var object: [String: JSON] = ["latitude": ScalarValue.json(l.latitude), "longitude": ScalarValue.json(l.longitude)]
            if let v = l.altitude { object["altitude"] = ScalarValue.json(v) }
            if let v = l.horizontalAccuracy { object["horizontalAccuracy"] = ScalarValue.json(v) }
            if let v = l.verticalAccuracy { object["verticalAccuracy"] = ScalarValue.json(v) }
            if let v = l.course { object["course"] = ScalarValue.json(v) }
            if let v = l.speed { object["speed"] = ScalarValue.json(v) }
            if let v = l.timestamp { object["timestamp"] = .int(v) }
            return .object(object)
        case .asset(let a):
            return .object(["fileChecksum": .string(a.fileChecksum), "size": .int(a.size)])
        }
    }

    /// Parses a JSON value of the given type. - Throws: `RecordJSONError` naming `path`.
    public init(cloudKitJSON json: JSON, type: ValueType, path: String) throws(RecordJSONError) {
        func fail(_ message: String) -> RecordJSONError { RecordJSONError(path: path, message: message) }
        switch type {
        case .string:
            guard let s = json.stringValue else { throw fail("expected a string for STRING") }
            self = .string(s)
        case .int64:
            guard case .int(let i) = json else { throw fail("expected an integer for INT64") }
            self = .int64(i)
        case .double:
            guard let d = ScalarValue.double(json) else { throw fail("expected a number (or NaN, Infinity) for DOUBLE") }
            self = .double(d)
        case .timestamp:
            guard let i = json.intValue else { throw fail("expected milliseconds since 1970 for TIMESTAMP") }
            self = .timestamp(i)
        case .bytes:
            guard let s = json.stringValue, let data = Data(base64Encoded: s) else {
                throw fail("expected a base64 string for BYTES")
            }
            self = .bytes([UInt8](data))
        case .reference:
            guard let object = json.objectValue, let name = object["recordName"]?.stringValue else {
                throw fail("expected {\"recordName\": ...} for REFERENCE")
            }
            let action: Reference.Action
            switch object["action"]?.stringValue {
            case nil, "NONE": action = .none
            case "DELETE_SELF": action = .deleteSelf
            default: throw fail("action must be NONE or DELETE_SELF")
            }
            let zoneID = try object["zoneID"].map { (z: JSON) throws(RecordJSONError) in
                try ZoneID(cloudKitJSON: z, defaultOwner: nil, path: path + ".zoneID")
            }
            do throws(NameError) {
                self = .reference(try Reference(recordName: name, zoneID: zoneID, action: action))
            } catch {
                throw fail(error.description)
            }
        case .location:
            guard let object = json.objectValue, let latitude = object["latitude"].flatMap(ScalarValue.double),
                  let longitude = object["longitude"].flatMap(ScalarValue.double) else {
                throw fail("expected {\"latitude\": ..., \"longitude\": ...} for LOCATION")
            }
            func part(_ key: String) throws(RecordJSONError) -> Double? {
                guard let value = object[key], value != .null else { return nil }
                guard let number = ScalarValue.double(value) else { throw fail("\(key) must be a number") }
                return number
            }
            var timestamp: Int64? = nil
            if let value = object["timestamp"], value != .null {
                guard let milliseconds = value.intValue else { throw fail("timestamp must be an integer") }
                timestamp = milliseconds
            }
            self = .location(Location(
                latitude: latitude, longitude: longitude, altitude: try part("altitude"),
                horizontalAccuracy: try part("horizontalAccuracy"), verticalAccuracy: try part("verticalAccuracy"),
                course: try part("course"), speed: try part("speed"), timestamp: timestamp))
        case .asset:
            // CloudKit's asset dictionary: `fileChecksum` and `size` name the bytes; the other keys of an
            // upload's receipt (`receipt`, `wrappingKey`, `referenceChecksum`) and a fetched `downloadURL` are
            // accepted and not kept (the server checks that the writer uploaded the bytes, not the receipt).
            guard let object = json.objectValue, let checksumText = object["fileChecksum"]?.stringValue,
                  let sizeValue = object["size"] else {
                throw fail("expected {\"fileChecksum\": ..., \"size\": ...} for ASSETID (the dictionary assets/upload's receipt gives)")
            }
            guard let data = Data(base64Encoded: checksumText), data.count == AssetValue.checksumLength else {
                throw fail("fileChecksum must be the base64 SHA-256 (32 bytes) of the asset's bytes")
            }
            guard case .int(let size) = sizeValue, let asset = AssetValue(checksum: [UInt8](data), size: size) else {
                throw fail("size must be the asset's byte count (an integer, 0 or more)")
            }
            self = .asset(asset)
        }
    }
}

extension AssetValue {
    /// The checksum as CloudKit spells `fileChecksum`: standard base64.
    public var fileChecksum: String { Data(checksum).base64EncodedString() }
}

extension ScalarValue {
    /// A double in JSON: a number, or for values JSON cannot hold, the strings "NaN", "Infinity" and
    /// "-Infinity" (a NaN's payload bits are not kept).
    static func json(_ d: Double) -> JSON {
        if d.isNaN { return .string("NaN") }
        if d.isInfinite { return .string(d < 0 ? "-Infinity" : "Infinity") }
        return .double(d)
    }

    /// The inverse of `json(_:)`.
    static func double(_ json: JSON) -> Double? {
        switch json.stringValue {
        case "NaN"?: return .nan
        case "Infinity"?: return .infinity
        case "-Infinity"?: return -.infinity
        default: return json.doubleValue
        }
    }
}

extension FieldValue {
    /// `{"value": ..., "type": "..."}` as in CloudKit Web Services.
    public var cloudKitJSON: JSON {
        switch self {
        case .scalar(let value):
            return .object(["value": value.cloudKitJSON, "type": .string(value.type.cloudKitName)])
        case .list(let type, let elements):
            return .object(["value": .array(elements.map(\.cloudKitJSON)), "type": .string(type.cloudKitName + "_LIST")])
        case .set(let type, let elements):
            return .object(["value": .array(elements.map(\.cloudKitJSON)), "type": .string(type.cloudKitName + "_SET")])
        case .text(let text):
            return .object(["value": .string(text), "type": .string("TEXT")])
        }
    }

    /// Parses `{"value": ..., "type": "..."}`; the type may be omitted for strings, integers and lists of them.
    public init(cloudKitJSON json: JSON, path: String) throws(RecordJSONError) {
        guard let object = json.objectValue, let value = object["value"] else {
            throw RecordJSONError(path: path, message: "expected {\"value\": ..., \"type\": ...}")
        }
        let typeName = object["type"]?.stringValue ?? FieldValue.inferredType(value)
        guard let typeName else { throw RecordJSONError(path: path, message: "missing \"type\"") }
        if typeName == "TEXT" {
            guard let text = value.stringValue else {
                throw RecordJSONError(path: path + ".value", message: "expected a string for TEXT")
            }
            self = .text(text)
        } else if let (type, isSet) = ValueType.collection(typeName) {
            guard let array = value.arrayValue else {
                throw RecordJSONError(path: path + ".value", message: "expected an array for \(typeName)")
            }
            var elements: [ScalarValue] = []
            for (index, element) in array.enumerated() {
                elements.append(try ScalarValue(cloudKitJSON: element, type: type, path: "\(path).value[\(index)]"))
            }
            self = isSet ? .set(type, elements) : .list(type, elements)
        } else {
            guard let type = ValueType(cloudKitName: typeName) else {
                throw RecordJSONError(path: path + ".type", message: "unknown type \(typeName)")
            }
            self = .scalar(try ScalarValue(cloudKitJSON: value, type: type, path: path + ".value"))
        }
    }

    static func inferredType(_ value: JSON) -> String? {
        switch value {
        case .string: return "STRING"
        case .int: return "INT64"
        case .double: return "DOUBLE"
        case .array(let elements): return elements.first.flatMap(inferredType).map { $0 + "_LIST" } ?? "STRING_LIST"
        default: return nil
        }
    }
}

extension ZoneID {
    /// `{"zoneName": ..., "ownerRecordName": ...}`.
    public var cloudKitJSON: JSON {
        .object(["zoneName": .string(zoneName), "ownerRecordName": .string(ownerRecordName)])
    }

    /// Parses a zone id; `defaultOwner` fills a missing `ownerRecordName` (CloudKit's "current user").
    /// A `zoneName` or `ownerRecordName` that is there but not a string (a number, a boolean, null, an
    /// object) is an error naming it, never read as missing.
    public init(cloudKitJSON json: JSON, defaultOwner: String?, path: String) throws(RecordJSONError) {
        guard let object = json.objectValue, let zoneNameJSON = object["zoneName"] else {
            throw RecordJSONError(path: path, message: "expected {\"zoneName\": ...}")
        }
        guard let zoneName = zoneNameJSON.stringValue else {
            throw RecordJSONError(path: path + ".zoneName", message: "must be a string")
        }
        let owner: String
        if let ownerJSON = object["ownerRecordName"] {
            guard let text = ownerJSON.stringValue else {
                throw RecordJSONError(path: path + ".ownerRecordName", message: "must be a string")
            }
            owner = text
        } else if let defaultOwner {
            owner = defaultOwner
        } else {
            throw RecordJSONError(path: path, message: "missing ownerRecordName")
        }
        do throws(NameError) {
            try self.init(zoneName: zoneName, ownerRecordName: owner)
        } catch {
            throw RecordJSONError(path: path, message: error.description)
        }
    }
}

// MARK: - CRDT metadata

extension Stamp {
    /// `{"ms": ..., "counter": ..., "replica": "16 hex digits"}`: every number fits a JSON double exactly.
    public var json: JSON {
        .object(["ms": .int(Int64(hlc.milliseconds)), "counter": .int(Int64(hlc.counter)),
                 "replica": .string(replica.description)])
    }

    public init(json: JSON, path: String) throws(RecordJSONError) {
        guard let object = json.objectValue, let ms = object["ms"]?.intValue, let counter = object["counter"]?.intValue,
              let replicaText = object["replica"]?.stringValue else {
            throw RecordJSONError(path: path, message: "expected {\"ms\", \"counter\", \"replica\"}")
        }
        guard ms >= 0 && UInt64(ms) <= HLC.maximumMilliseconds, (0...Int64(UInt16.max)).contains(counter),
              let replica = ReplicaID(hex: replicaText) else {
            throw RecordJSONError(path: path, message: "stamp out of range")
        }
        self.init(hlc: HLC(milliseconds: UInt64(ms), counter: UInt16(counter)), replica: replica)
    }
}

extension VersionVector {
    /// `[{"replica": ..., "ms": ..., "counter": ...}, ...]` in replica order.
    public var json: JSON {
        .array(entries.map { Stamp(hlc: $0.hlc, replica: $0.replica).json })
    }

    public init(json: JSON, path: String) throws(RecordJSONError) {
        guard let array = json.arrayValue else { throw RecordJSONError(path: path, message: "expected an array") }
        var entries: [Entry] = []
        for (index, element) in array.enumerated() {
            let stamp = try Stamp(json: element, path: "\(path)[\(index)]")
            entries.append(Entry(replica: stamp.replica, hlc: stamp.hlc))
        }
        self.init(entries)
    }
}

// MARK: - Records

extension Record {
    /// The record as a CloudKit Web Services record dictionary, with CRDT metadata under `crdt` keys
    /// (see Docs/Merge.md, "JSON form"). CloudKit clients can ignore every `crdt` key.
    public var cloudKitJSON: JSON { cloudKitJSON(fields: nil) }

    /// The record dictionary with only the fields named in `wanted` (all of them when nil): what
    /// `desiredKeys` asks for. The fields left out are not rendered at all.
    public func cloudKitJSON(fields wanted: Set<String>?) -> JSON {
        var fieldsJSON: [String: JSON] = [:]
        for field in fields where wanted?.contains(field.name) ?? true {
            switch field.state {
            case .register(let register):
                var object: [String: JSON] = ["crdt": .object(["stamp": register.stamp.json])]
                if let value = register.value {
                    object["value"] = value.cloudKitJSON
                    object["type"] = .string(value.type.cloudKitName)
                } else {
                    object["value"] = .null
                }
                fieldsJSON[field.name] = .object(object)
            case .list, .text:
                fieldsJSON[field.name] = field.state.sequenceJSON
            case .set(let set):
                guard case .set(let type, let elements)? = field.state.value else { continue }
                let entries: [JSON] = set.entries.map { entry in
                    var object: [String: JSON] = ["value": entry.element.cloudKitJSON, "stamp": entry.dot.json]
                    if entry.element.type != type { object["type"] = .string(entry.element.type.cloudKitName) }
                    return .object(object)
                }
                fieldsJSON[field.name] = .object([
                    "value": .array(elements.map(\.cloudKitJSON)),
                    "type": .string(type.cloudKitName + "_SET"),
                    "crdt": .object(["entries": .array(entries), "context": set.context.json]),
                ])
            }
        }
        var crdt: [String: JSON] = ["generation": .int(Int64(generation)), "created": created.json]
        if let deletion { crdt["deletion"] = deletion.json }
        if let parentRegister { crdt["parent"] = parentRegister.stamp.json }
        var object: [String: JSON] = [
            "recordName": .string(id.recordName),
            "recordType": .string(recordType),
            "zoneID": id.zoneID.cloudKitJSON,
            "fields": .object(fieldsJSON),
            "deleted": .bool(isDeleted),
            "crdt": .object(crdt),
        ]
        if let parentRegister {
            object["parent"] = parentRegister.value?.cloudKitJSON ?? .null
        }
        return .object(object)
    }

    /// Parses a record dictionary that carries full CRDT metadata (as produced by `cloudKitJSON`).
    ///
    /// Plain CloudKit dictionaries without `crdt` keys are not records yet: a server stamps their values
    /// with its own clock (see the HTTP API).
    public init(cloudKitJSON json: JSON, zoneID defaultZoneID: ZoneID? = nil) throws(RecordJSONError) {
        func fail(_ path: String, _ message: String) -> RecordJSONError { RecordJSONError(path: path, message: message) }
        guard let object = json.objectValue else { throw fail("record", "expected an object") }
        guard let recordName = object["recordName"]?.stringValue else { throw fail("recordName", "missing") }
        guard let recordType = object["recordType"]?.stringValue else { throw fail("recordType", "missing") }
        let zoneID: ZoneID
        if let zoneJSON = object["zoneID"] {
            zoneID = try ZoneID(cloudKitJSON: zoneJSON, defaultOwner: defaultZoneID?.ownerRecordName, path: "zoneID")
        } else if let defaultZoneID {
            zoneID = defaultZoneID
        } else {
            throw fail("zoneID", "missing")
        }
        guard let crdt = object["crdt"]?.objectValue else { throw fail("crdt", "missing CRDT metadata") }
        guard let generation = crdt["generation"]?.intValue, (1...Int64(UInt32.max)).contains(generation) else {
            throw fail("crdt.generation", "expected an integer from 1")
        }
        guard let createdJSON = crdt["created"] else { throw fail("crdt.created", "missing") }
        let created = try Stamp(json: createdJSON, path: "crdt.created")
        let deletion = try crdt["deletion"].map { (j: JSON) throws(RecordJSONError) in
            try Stamp(json: j, path: "crdt.deletion")
        }
        let id: RecordID
        do throws(NameError) {
            id = try RecordID(recordName: recordName, zoneID: zoneID)
        } catch {
            throw fail("recordName", error.description)
        }
        do throws(NameError) {
            try Names.validate(recordType, kind: .recordType)
        } catch {
            throw fail("recordType", error.description)
        }
        if let deleted = object["deleted"], deleted != .bool(deletion != nil) {
            throw fail("deleted", "disagrees with crdt.deletion")
        }
        var parent: LWWRegister? = nil
        if let parentStampJSON = crdt["parent"] {
            let stamp = try Stamp(json: parentStampJSON, path: "crdt.parent")
            var value: ScalarValue? = nil
            if let parentJSON = object["parent"], parentJSON != .null {
                guard case .reference(let reference) = try ScalarValue(cloudKitJSON: parentJSON, type: .reference,
                                                                       path: "parent"),
                      reference.action == .none, reference.zoneID == nil || reference.zoneID == zoneID,
                      reference.recordName != recordName else {
                    throw fail("parent", "must be a reference with action NONE to another record in the same zone")
                }
                value = .reference(Reference(validatedRecordName: reference.recordName, zoneID: nil, action: .none))
            }
            parent = LWWRegister(value: value, stamp: stamp)
        }
        var fields: [Field] = []
        for (name, fieldJSON) in object["fields"]?.objectValue ?? [:] {
            let path = "fields.\(name)"
            guard Names.isValid(name, kind: .fieldName) else { throw fail(path, "invalid field name") }
            guard let fieldObject = fieldJSON.objectValue, let fieldCRDT = fieldObject["crdt"]?.objectValue else {
                throw fail(path, "missing CRDT metadata")
            }
            if let stampJSON = fieldCRDT["stamp"] {
                let stamp = try Stamp(json: stampJSON, path: path + ".crdt.stamp")
                var value: ScalarValue? = nil
                if fieldObject["value"] != .null {
                    guard case .scalar(let scalar) = try FieldValue(cloudKitJSON: fieldJSON, path: path) else {
                        throw fail(path, "a register holds a scalar")
                    }
                    value = scalar
                }
                fields.append(Field(name: name, state: .register(LWWRegister(value: value, stamp: stamp))))
            } else if fieldCRDT["runs"] != nil {
                fields.append(Field(name: name, state: try FieldState(sequenceJSON: fieldObject, path: path)))
            } else {
                // A set (`_SET`; `_LIST` from clients written before lists kept their order).
                guard let typeName = fieldObject["type"]?.stringValue, let (listType, _) = ValueType.collection(typeName) else {
                    throw fail(path + ".type", "a set field needs a _SET type")
                }
                guard let entriesJSON = fieldCRDT["entries"]?.arrayValue, let contextJSON = fieldCRDT["context"] else {
                    throw fail(path + ".crdt", "expected entries and context")
                }
                let context = try VersionVector(json: contextJSON, path: path + ".crdt.context")
                var entries: [ORSet.Entry] = []
                for (index, entryJSON) in entriesJSON.enumerated() {
                    let entryPath = "\(path).crdt.entries[\(index)]"
                    guard let valueJSON = entryJSON["value"], let stampJSON = entryJSON["stamp"] else {
                        throw fail(entryPath, "expected value and stamp")
                    }
                    var type = listType
                    if let name = entryJSON["type"]?.stringValue {
                        guard let explicit = ValueType(cloudKitName: name) else { throw fail(entryPath, "unknown type") }
                        type = explicit
                    }
                    let element = try ScalarValue(cloudKitJSON: valueJSON, type: type, path: entryPath + ".value")
                    let dot = try Stamp(json: stampJSON, path: entryPath + ".stamp")
                    entries.append(ORSet.Entry(element: element, dot: dot))
                }
                fields.append(Field(name: name, state: .set(ORSet(entries: entries, context: context))))
            }
        }
        fields.sort { compareBytes($0.name, $1.name) < 0 }
        self.init(id: id, recordType: recordType, generation: UInt32(generation), created: created,
                  deletion: deletion, parent: parent, fields: fields)
    }
}

extension RecordFrame {
    /// What a server adds to a record dictionary: the change tag, and who created and last modified the
    /// record when (`{"timestamp", "userRecordName"}`).
    public struct ServerFields: Sendable {
        public var changeTag: String
        public var createdMs: Int64, createdBy: String
        public var modifiedMs: Int64, modifiedBy: String

        public init(changeTag: String, createdMs: Int64, createdBy: String, modifiedMs: Int64, modifiedBy: String) {
            self.changeTag = changeTag
            self.createdMs = createdMs
            self.createdBy = createdBy
            self.modifiedMs = modifiedMs
            self.modifiedBy = modifiedBy
        }
    }

    /// The record dictionary `decoded().cloudKitJSON(fields: [])` gives, with `server`'s members added,
    /// written straight into `out` from the frame's header: no field is decoded and no dictionary made, and
    /// the bytes are those `JSON.serializedBytes` writes for that object (keys sorted). The answer of a
    /// write that asks for no fields back (`desiredKeys: []`) is made of these.
    public func appendCloudKitJSONWithoutFields(_ server: ServerFields, into out: inout [UInt8]) {
        let zoneID = self.zoneID
        withFrame { frame in
            let header = FrameHeader(frame)
            func key(_ name: StaticString) {
                out.append(UInt8(ascii: "\""))
                out.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
                out.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
            }
            func text(_ range: Range<Int>) {
                JSON.writeString(String(decoding: UnsafeRawBufferPointer(rebasing: frame[range]), as: UTF8.self), into: &out)
            }
            func stamp(_ stamp: Stamp) { stamp.appendJSON(into: &out) }
            func who(_ ms: Int64, _ user: String) {
                out.append(UInt8(ascii: "{"))
                key("timestamp"); JSON.writeInteger(ms, into: &out)
                out.append(UInt8(ascii: ",")); key("userRecordName"); JSON.writeString(user, into: &out)
                out.append(UInt8(ascii: "}"))
            }
            // A deleted record has no parent register (as `Record` drops it).
            let hasParent = header.deletion == nil && header.parentWhole != nil
            out.append(UInt8(ascii: "{"))
            key("crdt"); out.append(UInt8(ascii: "{"))
            key("created"); stamp(header.created)
            if let deletion = header.deletion { out.append(UInt8(ascii: ",")); key("deletion"); stamp(deletion) }
            out.append(UInt8(ascii: ",")); key("generation")
            JSON.writeInteger(Int64(UInt32(truncatingIfNeeded: header.generation)), into: &out)
            if hasParent { out.append(UInt8(ascii: ",")); key("parent"); stamp(header.parentStamp) }
            out.append(UInt8(ascii: "}"))
            out.append(UInt8(ascii: ",")); key("created"); who(server.createdMs, server.createdBy)
            out.append(UInt8(ascii: ",")); key("deleted")
            out.append(contentsOf: header.deletion != nil ? Array("true".utf8) : Array("false".utf8))
            out.append(UInt8(ascii: ",")); key("fields"); out.append(contentsOf: [UInt8(ascii: "{"), UInt8(ascii: "}")])
            out.append(UInt8(ascii: ",")); key("modified"); who(server.modifiedMs, server.modifiedBy)
            if hasParent {
                out.append(UInt8(ascii: ",")); key("parent")
                var reader = BinaryReader(frame)
                reader.offset = header.parentValue
                // The bytes were validated when the frame was made; nil is a cleared parent.
                (((try? reader.value()) ?? nil)?.cloudKitJSON ?? .null).write(into: &out)
            }
            out.append(UInt8(ascii: ",")); key("recordChangeTag"); JSON.writeString(server.changeTag, into: &out)
            out.append(UInt8(ascii: ",")); key("recordName"); text(header.name)
            out.append(UInt8(ascii: ",")); key("recordType"); text(header.type)
            out.append(UInt8(ascii: ",")); key("zoneID"); out.append(UInt8(ascii: "{"))
            key("ownerRecordName"); JSON.writeString(zoneID.ownerRecordName, into: &out)
            out.append(UInt8(ascii: ",")); key("zoneName"); JSON.writeString(zoneID.zoneName, into: &out)
            out.append(contentsOf: [UInt8(ascii: "}"), UInt8(ascii: "}")])
        }
    }
}

extension Record {
    /// `cloudKitJSON(fields: wanted)` written straight into `out`: the same bytes `serializedBytes()`
    /// gives for it (keys sorted), with no dictionary made. Clients send their states this way, and answers
    /// carry records this way.
    public func appendCloudKitJSON(fields wanted: Set<String>? = nil, into out: inout [UInt8]) {
        func key(_ name: StaticString) {
            out.append(UInt8(ascii: "\""))
            out.append(contentsOf: UnsafeBufferPointer(start: name.utf8Start, count: name.utf8CodeUnitCount))
            out.append(contentsOf: [UInt8(ascii: "\""), UInt8(ascii: ":")])
        }
        func comma() { out.append(UInt8(ascii: ",")) }
        out.append(UInt8(ascii: "{"))
        key("crdt"); out.append(UInt8(ascii: "{"))
        key("created"); created.appendJSON(into: &out)
        if let deletion { comma(); key("deletion"); deletion.appendJSON(into: &out) }
        comma(); key("generation"); JSON.writeInteger(Int64(generation), into: &out)
        if let parentRegister { comma(); key("parent"); parentRegister.stamp.appendJSON(into: &out) }
        out.append(UInt8(ascii: "}"))
        comma(); key("deleted"); out.append(contentsOf: isDeleted ? Array("true".utf8) : Array("false".utf8))
        comma(); key("fields"); out.append(UInt8(ascii: "{"))
        var first = true
        for field in fields where wanted?.contains(field.name) ?? true {
            switch field.state {
            case .register(let register):
                if !first { comma() }
                first = false
                JSON.writeString(field.name, into: &out)
                out.append(UInt8(ascii: ":"))
                out.append(UInt8(ascii: "{"))
                key("crdt"); out.append(UInt8(ascii: "{")); key("stamp"); register.stamp.appendJSON(into: &out)
                out.append(UInt8(ascii: "}"))
                if let value = register.value {
                    comma(); key("type"); JSON.writeString(value.type.cloudKitName, into: &out)
                    comma(); key("value"); value.cloudKitJSON.write(into: &out)
                } else {
                    comma(); key("value"); out.append(contentsOf: "null".utf8)
                }
                out.append(UInt8(ascii: "}"))
            case .list, .text:
                if !first { comma() }
                first = false
                JSON.writeString(field.name, into: &out)
                out.append(UInt8(ascii: ":"))
                field.state.sequenceJSON.write(into: &out)
            case .set(let set):
                guard case .set(let type, let elements)? = field.state.value else { continue }
                if !first { comma() }
                first = false
                JSON.writeString(field.name, into: &out)
                out.append(UInt8(ascii: ":"))
                out.append(UInt8(ascii: "{"))
                key("crdt"); out.append(UInt8(ascii: "{"))
                key("context"); out.append(UInt8(ascii: "["))
                for (index, entry) in set.context.entries.enumerated() {
                    if index > 0 { comma() }
                    Stamp(hlc: entry.hlc, replica: entry.replica).appendJSON(into: &out)
                }
                out.append(UInt8(ascii: "]"))
                comma(); key("entries"); out.append(UInt8(ascii: "["))
                for (index, entry) in set.entries.enumerated() {
                    if index > 0 { comma() }
                    out.append(UInt8(ascii: "{"))
                    key("stamp"); entry.dot.appendJSON(into: &out)
                    if entry.element.type != type { comma(); key("type"); JSON.writeString(entry.element.type.cloudKitName, into: &out) }
                    comma(); key("value"); entry.element.cloudKitJSON.write(into: &out)
                    out.append(UInt8(ascii: "}"))
                }
                out.append(contentsOf: [UInt8(ascii: "]"), UInt8(ascii: "}")])
                comma(); key("type"); JSON.writeString(type.cloudKitName + "_SET", into: &out)
                comma(); key("value"); out.append(UInt8(ascii: "["))
                for (index, element) in elements.enumerated() {
                    if index > 0 { comma() }
                    element.cloudKitJSON.write(into: &out)
                }
                out.append(contentsOf: [UInt8(ascii: "]"), UInt8(ascii: "}")])
            }
        }
        out.append(UInt8(ascii: "}"))
        if let parentRegister { comma(); key("parent"); (parentRegister.value?.cloudKitJSON ?? .null).write(into: &out) }
        comma(); key("recordName"); JSON.writeString(id.recordName, into: &out)
        comma(); key("recordType"); JSON.writeString(recordType, into: &out)
        comma(); key("zoneID"); out.append(UInt8(ascii: "{"))
        key("ownerRecordName"); JSON.writeString(id.zoneID.ownerRecordName, into: &out)
        comma(); key("zoneName"); JSON.writeString(id.zoneID.zoneName, into: &out)
        out.append(contentsOf: [UInt8(ascii: "}"), UInt8(ascii: "}")])
    }
}

extension Stamp {
    /// `json` written straight into `out` (`{"counter", "ms", "replica"}`, as `serializedBytes` writes it).
    func appendJSON(into out: inout [UInt8]) {
        out.append(contentsOf: #"{"counter":"#.utf8)
        JSON.writeInteger(Int64(hlc.counter), into: &out)
        out.append(contentsOf: #","ms":"#.utf8)
        JSON.writeInteger(Int64(hlc.milliseconds), into: &out)
        out.append(contentsOf: #","replica":""#.utf8)
        // Sixteen lower-case hex digits (`ReplicaID.description`), no String made.
        let digits: StaticString = "0123456789abcdef"
        var value = replica.rawValue
        var hex = [UInt8](repeating: 0, count: 16)
        for index in stride(from: 15, through: 0, by: -1) {
            hex[index] = digits.utf8Start[Int(value & 0xF)]
            value >>= 4
        }
        out.append(contentsOf: hex)
        out.append(contentsOf: #""}"#.utf8)
    }
}

// MARK: - Lists and texts

extension FieldState {
    /// A list or text field's JSON form: `{"crdt": {"context": [stamps], "runs": [[replica, counter, length,
    /// parentReplica, parentCounter, deleted], ...]}, "type": "T_LIST" | "TEXT", "value": [...] | "..."}`.
    /// `runs` are the elements in document order, tombstones included (Merge.md §10); `value` the visible
    /// ones. A list whose elements are not all of the first's type says each one's in `crdt.types`.
    var sequenceJSON: JSON {
        func runsJSON(_ runs: [SequenceRun]) -> JSON {
            .array(runs.map { run in
                .array([.string(run.id.replica.description), .int(Int64(run.id.counter)), .int(Int64(run.length)),
                        run.parent.map { .string($0.replica.description) } ?? .null,
                        run.parent.map { .int(Int64($0.counter)) } ?? .null, .int(run.deleted ? 1 : 0)])
            })
        }
        switch self {
        case .list(let list):
            let elements = list.elements
            let type = elements.first?.type ?? .string
            var crdt: [String: JSON] = ["context": list.context.json, "runs": runsJSON(list.runs)]
            if elements.contains(where: { $0.type != type }) {
                crdt["types"] = .array(elements.map { .string($0.type.cloudKitName) })
            }
            return .object(["crdt": .object(crdt), "type": .string(type.cloudKitName + "_LIST"),
                            "value": .array(elements.map(\.cloudKitJSON))])
        case .text(let text):
            return .object(["crdt": .object(["context": text.context.json, "runs": runsJSON(text.runs)]),
                            "type": .string("TEXT"), "value": .string(text.text)])
        case .register, .set:
            preconditionFailure("sequenceJSON of a register or set")
        }
    }

    /// Parses `sequenceJSON`, checked as the binary form is (canonical runs in the tree's order).
    init(sequenceJSON object: [String: JSON], path: String) throws(RecordJSONError) {
        func fail(_ suffix: String, _ message: String) -> RecordJSONError { RecordJSONError(path: path + suffix, message: message) }
        guard let crdt = object["crdt"]?.objectValue, let runsJSON = crdt["runs"]?.arrayValue,
              let contextJSON = crdt["context"], let typeName = object["type"]?.stringValue else {
            throw fail(".crdt", "expected context, runs and type")
        }
        let context = try VersionVector(json: contextJSON, path: path + ".crdt.context")
        var runs: [SequenceRun] = []
        runs.reserveCapacity(runsJSON.count)
        for (index, runJSON) in runsJSON.enumerated() {
            guard let parts = runJSON.arrayValue, parts.count == 6,
                  let replicaHex = parts[0].stringValue, let replica = ReplicaID(hex: replicaHex),
                  let counter = parts[1].intValue, counter >= 1, let length = parts[2].intValue, length >= 1,
                  let deleted = parts[5].intValue, deleted == 0 || deleted == 1 else {
                throw fail(".crdt.runs[\(index)]", "expected [replica, counter, length, parentReplica, parentCounter, deleted]")
            }
            var parent: SequenceID?
            if parts[3] != .null || parts[4] != .null {
                guard let hex = parts[3].stringValue, let parentReplica = ReplicaID(hex: hex),
                      let parentCounter = parts[4].intValue, parentCounter >= 1 else {
                    throw fail(".crdt.runs[\(index)]", "a parent is a replica and a counter, or two nulls")
                }
                parent = SequenceID(counter: UInt64(parentCounter), replica: parentReplica)
            }
            runs.append(SequenceRun(id: SequenceID(counter: UInt64(counter), replica: replica), length: Int(length),
                                    parent: parent, deleted: deleted == 1))
        }
        if typeName == "TEXT" {
            guard let text = object["value"]?.stringValue else { throw fail(".value", "expected a string for TEXT") }
            do throws(CodecError) {
                self = .text(try TextState(context: context, runs: runs, values: Array(text.unicodeScalars)))
            } catch {
                throw fail(".crdt.runs", Self.sequenceRefusal(error))
            }
            return
        }
        guard let (type, isSet) = ValueType.collection(typeName), !isSet, let array = object["value"]?.arrayValue else {
            throw fail(".type", "a list or text field has a T_LIST or TEXT type and its value")
        }
        let types = crdt["types"]?.arrayValue
        if let types, types.count != array.count { throw fail(".crdt.types", "one type per value") }
        var values: [ScalarValue] = []
        values.reserveCapacity(array.count)
        for (index, element) in array.enumerated() {
            var elementType = type
            if let types {
                guard let name = types[index].stringValue, let explicit = ValueType(cloudKitName: name) else {
                    throw fail(".crdt.types[\(index)]", "unknown type")
                }
                elementType = explicit
            }
            values.append(try ScalarValue(cloudKitJSON: element, type: elementType, path: "\(path).value[\(index)]"))
        }
        do throws(CodecError) {
            self = .list(try ListState(context: context, runs: runs, values: values))
        } catch {
            throw fail(".crdt.runs", Self.sequenceRefusal(error))
        }
    }

    /// Why the runs of a JSON sequence were refused, without the offset into the binary form they were
    /// checked in (it means nothing to a JSON client).
    private static func sequenceRefusal(_ error: CodecError) -> String {
        error.code == .malformed ? "not a valid sequence: \(error.context)" : error.description
    }
}
