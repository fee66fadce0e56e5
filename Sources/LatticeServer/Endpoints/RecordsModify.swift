import LatticeCore
import LatticeStore

/// One operation of a `records/modify` request.
struct RecordOperation {
    enum Kind: String, CaseIterable {
        case create, update, forceUpdate, replace, forceReplace, delete, forceDelete

        var checksChangeTag: Bool { self == .update || self == .replace || self == .delete }
        var isDelete: Bool { self == .delete || self == .forceDelete }
        var isReplace: Bool { self == .replace || self == .forceReplace }
    }

    let kind: Kind
    let recordName: String
    let record: [String: JSON]
    let path: String
}

extension LatticeService {
    /// `records/modify`: applies the operations to one zone, atomically by default.
    ///
    /// - Atomic (the default): any failed operation fails the batch; nothing is written, the failed
    ///   operations report their own error and every other one ATOMIC_ERROR.
    /// - `"atomic": false`: each operation stands alone.
    func modifyRecords(_ context: RequestContext, _ tx: any StorageTransaction, _ touched: inout Set<Int64>) throws
        -> HTTPResponse {
        let operationsJSON = try items(context.body, "operations", limit: configuration.maximumOperations)
        guard !operationsJSON.isEmpty else { throw APIError.badRequest("operations is empty") }
        var atomic = true
        if let value = context.body["atomic"] {
            guard let flag = value.boolValue else { throw APIError.badRequest("atomic must be true or false") }
            atomic = flag
        }
        let resolved = try resolveZone(context.body["zoneID"], context, tx, path: "zoneID", creatingDefault: true)
        guard let zone = resolved.zone else {
            throw APIError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist; create it with zones/modify")
        }
        // The zone's share records, read once: records/modify never creates or deletes shares mid-batch.
        let shareRecordNames = Set(try tx.shares(zoneRowID: zone.rowID).map(\.recordName))
        var outcomes: [Result<JSON, APIError>] = []
        var changedNames: [String] = []
        for (index, json) in operationsJSON.enumerated() {
            let path = "operations[\(index)]"
            do {
                let operation = try parseOperation(json, path: path)
                let result = try tx.savepoint { () throws -> (JSON, Bool) in
                    try apply(operation, zone: zone, resolved: resolved, shareRecordNames: shareRecordNames,
                              context: context, tx: tx)
                }
                if result.1 { changedNames.append(operation.recordName) }
                outcomes.append(.success(result.0))
            } catch {
                outcomes.append(.failure(internalError(error)))
            }
        }
        let failed = outcomes.contains { if case .failure = $0 { return true } else { return false } }
        let names = operationsJSON.map { $0["record"]?["recordName"]?.stringValue ?? "" }
        if atomic && failed {
            // Roll the whole transaction back: nothing of the batch is written.
            let items: [JSON] = zip(outcomes, names).map { outcome, name in
                switch outcome {
                case .failure(let error): return error.json(item: (key: "recordName", value: name))
                case .success:
                    return APIError(.atomicError, "not saved: another operation in this atomic batch failed")
                        .json(item: (key: "recordName", value: name))
                }
            }
            throw AtomicBatchFailure(response: .json(.object(["records": .array(items)])))
        }
        if !changedNames.isEmpty {
            touched.insert(zone.databaseID)
            // The owner deleting a hierarchy root deletes its share, as in CloudKit.
            if !resolved.isShared {
                for share in try tx.shares(zoneRowID: zone.rowID) {
                    guard let root = share.rootRecordName, changedNames.contains(root),
                          try tx.record(zoneRowID: zone.rowID, name: root)?.deleted == true else { continue }
                    try removeShare(share, try roster(share, tx), zone: zone, context: context, tx, &touched)
                }
            }
            try checkSharesStayDisjoint(zone, tx)
            try recordsChanged(changedNames, in: zone, context: context, tx, &touched)
        }
        let items: [JSON] = zip(outcomes, names).map { outcome, name in
            switch outcome {
            case .success(let json): return json
            case .failure(let error): return error.json(item: (key: "recordName", value: name))
            }
        }
        return .json(.object(["records": .array(items)]))
    }

    private func parseOperation(_ json: JSON, path: String) throws -> RecordOperation {
        guard let typeName = json["operationType"]?.stringValue, let kind = RecordOperation.Kind(rawValue: typeName) else {
            throw APIError.badRequest("\(path).operationType must be one of "
                                      + RecordOperation.Kind.allCases.map(\.rawValue).joined(separator: ", "))
        }
        guard let record = json["record"]?.objectValue else { throw APIError.badRequest("\(path).record is missing") }
        guard let recordName = record["recordName"]?.stringValue else {
            throw APIError.badRequest("\(path).record.recordName is missing")
        }
        do {
            try Names.validate(recordName, kind: .recordName)
        } catch {
            throw APIError.badRequest("\(path).record.recordName: \(error.description)")
        }
        return RecordOperation(kind: kind, recordName: recordName, record: record, path: path + ".record")
    }

    /// Applies one operation; returns the item to answer and whether anything was written.
    private func apply(_ operation: RecordOperation, zone: StoredZone, resolved: ResolvedZone,
                       shareRecordNames: Set<String>, context: RequestContext,
                       tx: any StorageTransaction) throws -> (JSON, Bool) {
        let zoneID = resolved.zoneID
        let stored = try tx.record(zoneRowID: zone.rowID, name: operation.recordName)
        let existing = try stored.map(decode)
        let live = existing.map { !$0.isDeleted } ?? false
        let path = operation.path

        // Shares: a participant writes only inside what they accepted, with readWrite; the owner changes
        // share records only through shares/*.
        if resolved.isShared {
            if shareRecordNames.contains(operation.recordName) {
                throw APIError(.permissionFailure, "a share record is changed with shares/modify, by its owner or an administrator")
            }
            let requestedParent: String?? = operation.record["parent"].map { $0 == .null ? nil : $0["recordName"]?.stringValue ?? "" }
            try checkParticipantWrite(operation, live: live, requestedParent: requestedParent, resolved, tx)
        } else if context.kind == .private, shareRecordNames.contains(operation.recordName) {
            throw APIError.badRequest("record \(operation.recordName) is a share; change it with shares/modify or shares/delete")
        }

        if operation.kind.checksChangeTag {
            guard let stored, live else {
                throw APIError(.notFound, "record \(operation.recordName) does not exist")
            }
            guard let tag = operation.record["recordChangeTag"]?.stringValue else {
                throw APIError.badRequest("\(path).recordChangeTag is required for \(operation.kind.rawValue); "
                                          + "use force\(operation.kind.rawValue.prefix(1).uppercased())"
                                          + "\(operation.kind.rawValue.dropFirst()) to skip the check")
            }
            guard tag == stored.changeTag else {
                throw APIError(.conflict, "record \(operation.recordName) changed on the server (tag \(stored.changeTag), "
                               + "not \(tag))", serverRecord: recordJSON(stored, existing!, desiredKeys: nil))
            }
        }
        if context.kind == .public, let stored, live, operation.kind != .create,
           stored.createdBy != context.user.recordName {
            throw APIError(.accessDenied, "only the creator of a public record may change or delete it")
        }

        var record: Record
        if operation.kind.isDelete {
            guard var current = existing, live else { throw APIError(.notFound, "record \(operation.recordName) does not exist") }
            current.delete(at: tick())
            record = current
        } else if operation.record["crdt"] != nil {
            record = try mergeState(operation, existing: existing, live: live, zoneID: zoneID)
        } else {
            record = try applyPlainValues(operation, existing: existing, live: live, zoneID: zoneID)
        }

        try checkParticipantPlacement(record, before: existing, live: live, resolved, tx)
        // A CRDT state can carry a deletion too: the root of a share is still the owner's to delete.
        if resolved.isShared, record.isDeleted, live, !operation.kind.isDelete,
           try grant(for: operation.recordName, resolved, tx)?.share.rootRecordName == operation.recordName {
            throw APIError(.permissionFailure, "only the owner deletes the root record of a share")
        }
        if let existing, existing == record {
            return (recordJSON(stored!, existing, desiredKeys: nil), false) // nothing new: no change, no new tag
        }
        let frame: [UInt8]
        do {
            frame = try BinaryCodec.encode(record)
        } catch {
            throw APIError(.limitExceeded, "record \(operation.recordName) would exceed the limit of "
                           + "\(Record.maximumEncodedSize) bytes per record")
        }
        let saved = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(
            recordName: operation.recordName, recordType: record.recordType, frame: frame, deleted: record.isDeleted,
            parentName: record.parent?.recordName, userRecordName: context.user.recordName, nowMs: configuration.now()))
        if let database = try tx.database(id: zone.databaseID), database.bytesUsed > configuration.quotaBytesPerDatabase {
            throw APIError(.quotaExceeded, "the database would hold \(database.bytesUsed) bytes; its quota is "
                           + "\(configuration.quotaBytesPerDatabase)")
        }
        return (recordJSON(saved, record, desiredKeys: nil), true)
    }

    /// A record dictionary with `crdt` metadata is a CRDT state: it is joined with the server's copy.
    private func mergeState(_ operation: RecordOperation, existing: Record?, live: Bool, zoneID: ZoneID) throws -> Record {
        guard !operation.kind.isReplace else {
            throw APIError.badRequest("\(operation.path): replace takes plain values; send CRDT states with "
                                      + "create, update or forceUpdate")
        }
        let incoming: Record
        do {
            incoming = try Record(cloudKitJSON: .object(operation.record), zoneID: zoneID)
        } catch {
            throw APIError.badRequest("\(operation.path).\(error.description)")
        }
        guard incoming.id.zoneID == zoneID else {
            throw APIError.badRequest("\(operation.path).zoneID differs from the request's zone")
        }
        if operation.kind == .create, live {
            throw APIError(.exists, "record \(operation.recordName) already exists")
        }
        let refused = clock.withLock { clock -> ClockError? in
            do throws(ClockError) {
                try clock.observe(incoming.maximumHLC)
                return nil
            } catch {
                return error
            }
        }
        if let refused { throw APIError.badRequest("\(operation.path): \(refused.description)") }
        guard let existing, live else { return existing.map { $0.merging(incoming) } ?? incoming }
        let merged = existing.merging(incoming)
        guard merged.isDeleted || merged.recordType == existing.recordType else {
            throw APIError.badRequest("\(operation.path).recordType: the record is a \(existing.recordType) on the server; "
                                      + "a record's type cannot change")
        }
        return merged
    }

    /// Plain CloudKit values, as curl would send them: the server stamps each edit with its own clock.
    private func applyPlainValues(_ operation: RecordOperation, existing: Record?, live: Bool, zoneID: ZoneID) throws
        -> Record {
        let path = operation.path
        let recordType = operation.record["recordType"]?.stringValue
        var record: Record
        do {
            // create makes a record; so does forceReplace when there is none.
            if operation.kind == .create || (operation.kind == .forceReplace && !live) {
                if live { throw APIError(.exists, "record \(operation.recordName) already exists") }
                guard let recordType else { throw APIError.badRequest("\(path).recordType is missing") }
                do {
                    try Names.validate(recordType, kind: .recordType)
                } catch {
                    throw APIError.badRequest("\(path).recordType: \(error.description)")
                }
                if var tombstone = existing {
                    try tombstone.recreate(recordType: recordType, at: tick())
                    record = tombstone
                } else {
                    record = try Record(id: RecordID(recordName: operation.recordName, zoneID: zoneID), recordType: recordType,
                                        createdAt: tick())
                }
            } else {
                guard let current = existing, live else {
                    throw APIError(.notFound, "record \(operation.recordName) does not exist")
                }
                if let recordType, recordType != current.recordType {
                    throw APIError.badRequest("\(path).recordType is \(current.recordType) on the server; a record's "
                                              + "type cannot change")
                }
                record = current
            }
            let fields = operation.record["fields"]
            guard fields == nil || fields?.objectValue != nil else { throw APIError.badRequest("\(path).fields must be an object") }
            let edits = fields?.objectValue ?? [:]
            if operation.kind.isReplace {
                // Replace: every field not given is cleared, and so is the parent.
                for field in record.fields where edits[field.name] == nil {
                    try clearField(field.name, in: &record)
                }
                if operation.record["parent"] == nil, record.parent != nil { try record.setParent(nil, at: tick()) }
            }
            for name in edits.keys.sorted() {
                try applyFieldEdit(name, edits[name]!, to: &record, path: "\(path).fields.\(name)")
            }
            if let parentJSON = operation.record["parent"] {
                if parentJSON == .null {
                    try record.setParent(nil, at: tick())
                } else {
                    guard case .reference(let reference) = try ScalarValue(cloudKitJSON: parentJSON, type: .reference,
                                                                           path: path + ".parent") else {
                        throw APIError.badRequest("\(path).parent must be a reference")
                    }
                    if reference.zoneID != nil, reference.zoneID != zoneID {
                        throw APIError.badRequest("\(path).parent must be in the same zone")
                    }
                    if reference.action != .none {
                        throw APIError.badRequest("\(path).parent must have action NONE, as in CloudKit")
                    }
                    try record.setParent(Reference(recordName: reference.recordName), at: tick())
                }
            }
        } catch let error as APIError {
            throw error
        } catch let error as RecordError {
            throw APIError.badRequest("\(path): \(error.description)")
        } catch let error as RecordJSONError {
            throw APIError.badRequest(error.description)
        } catch let error as NameError {
            throw APIError.badRequest("\(path): \(error.description)")
        }
        return record
    }

    /// One field of a plain update:
    /// - `{"value": v, "type": T}` sets a scalar, or makes a list hold exactly the given elements;
    /// - `{"value": null}` clears the field;
    /// - `{"add": [...], "remove": [...], "type": "T_LIST"}` adds and removes list elements.
    private func applyFieldEdit(_ name: String, _ json: JSON, to record: inout Record, path: String) throws {
        guard let object = json.objectValue else { throw APIError.badRequest("\(path) must be an object") }
        if object["add"] != nil || object["remove"] != nil {
            guard object["value"] == nil else { throw APIError.badRequest("\(path): give value, or add/remove, not both") }
            let type = try listElementType(object, path: path)
            for element in try listElements(object["remove"], type: type, path: path + ".remove") {
                try record.remove(element, from: name, at: tick())
            }
            for element in try listElements(object["add"], type: type, path: path + ".add") {
                try record.add(element, to: name, at: tick())
            }
            return
        }
        guard let value = object["value"] else { throw APIError.badRequest("\(path).value is missing") }
        if value == .null {
            try clearField(name, in: &record)
            return
        }
        switch try FieldValue(cloudKitJSON: json, path: path) {
        case .scalar(let scalar):
            try record.set(name, to: scalar, at: tick())
        case .list(_, let elements):
            let wanted = Set(elements)
            if case .list(_, let current)? = record[name] {
                for element in current where !wanted.contains(element) { try record.remove(element, from: name, at: tick()) }
                for element in elements where !current.contains(element) { try record.add(element, to: name, at: tick()) }
            } else {
                // A new list field (on a scalar field the core refuses the kind change).
                for element in wanted.sorted() { try record.add(element, to: name, at: tick()) }
            }
        }
    }

    private func clearField(_ name: String, in record: inout Record) throws {
        switch record[name] {
        case .list(_, let elements)?:
            for element in elements { try record.remove(element, from: name, at: tick()) }
        case .scalar?:
            try record.set(name, to: nil, at: tick())
        case nil:
            break
        }
    }

    private func listElementType(_ object: [String: JSON], path: String) throws -> ValueType {
        if let typeName = object["type"]?.stringValue {
            guard typeName.hasSuffix("_LIST"), let type = ValueType(cloudKitName: String(typeName.dropLast(5))) else {
                throw APIError.badRequest("\(path).type must be a list type such as STRING_LIST")
            }
            return type
        }
        let sample = object["add"]?.arrayValue?.first ?? object["remove"]?.arrayValue?.first
        switch sample {
        case .string?, nil: return .string
        case .int?: return .int64
        case .double?: return .double
        default: throw APIError.badRequest("\(path).type is needed for these elements")
        }
    }

    private func listElements(_ json: JSON?, type: ValueType, path: String) throws -> [ScalarValue] {
        guard let json else { return [] }
        guard let array = json.arrayValue else { throw APIError.badRequest("\(path) must be an array") }
        return try array.enumerated().map { index, element in
            try ScalarValue(cloudKitJSON: element, type: type, path: "\(path)[\(index)]")
        }
    }

    /// A fresh stamp from the server's clock.
    func tick() -> Stamp {
        clock.withLock { $0.now() }
    }

    func decode(_ stored: StoredRecord) throws -> Record {
        do {
            return try BinaryCodec.decodeRecord(stored.frame)
        } catch {
            throw StorageError.failure("stored record \(stored.recordName) does not decode: \(error)")
        }
    }

    /// The CloudKit record dictionary plus the server's fields: change tag, created and modified.
    func recordJSON(_ stored: StoredRecord, _ record: Record, desiredKeys: Set<String>?) -> JSON {
        guard case .object(var object) = record.cloudKitJSON else { return record.cloudKitJSON }
        object["recordChangeTag"] = .string(stored.changeTag)
        object["created"] = .object(["timestamp": .int(stored.createdMs), "userRecordName": .string(stored.createdBy)])
        object["modified"] = .object(["timestamp": .int(stored.modifiedMs), "userRecordName": .string(stored.modifiedBy)])
        if let desiredKeys, case .object(let fields)? = object["fields"] {
            object["fields"] = .object(fields.filter { desiredKeys.contains($0.key) })
        }
        return .object(object)
    }
}

/// Thrown inside the write transaction to roll an atomic batch back while still answering per item.
struct AtomicBatchFailure: Error {
    let response: HTTPResponse
}
