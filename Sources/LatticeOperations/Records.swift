import LatticeAPI
import LatticeCore

import LatticeStore

/// One operation of a `records/modify` request.
struct RecordOperation {
    typealias Kind = RecordOperationKind

    let kind: Kind
    let recordName: String
    let record: [String: JSON]
    let path: String
}

/// A write decided inside the transaction but not saved yet.
struct PlannedWrite {
    let recordName: String
    /// The row before the write (nil for a new record).
    let stored: StoredRecord?
    /// The record's state after the write.
    let after: RecordFrame
    /// What to save; nil when the record already reflected the write.
    let write: RecordWrite?
    /// The assets the write adds and lets go (`Assets.checkAddedAssets`), for the references kept on save.
    var assets = AssetChanges()
}

/// A record write as applied inside the transaction: the row as stored and its frame.
struct AppliedWrite {
    let stored: StoredRecord
    let frame: RecordFrame
}

/// A batch write's outcome, item by item in the request's order: what the replay cache keeps of a large
/// answer (`Idempotency.batch`).
protocol BatchOutcome {
    /// The zone row written.
    var zoneRowID: Int64 { get }
    var names: [String] { get }
    var outcomes: [Result<AppliedWrite, ServiceError>] { get }
}

/// What `records/modify` did, before its answer is rendered: the zone, and per operation (in order) the
/// record as written or the error.
struct ModifyOutcome: BatchOutcome {
    let zoneRowID: Int64
    let names: [String]
    let outcomes: [Result<AppliedWrite, ServiceError>]
    /// The request's `desiredKeys`: the fields each answered record carries (nil: all).
    let desiredKeys: Set<String>?
    /// Who the answer is for (its download URLs are theirs).
    var reader: UserAccount? = nil

    /// Bytes of the records written (their stored frames).
    var frameBytes: Int {
        outcomes.reduce(0) { total, result in
            if case .success(let write) = result { return total + write.frame.bytes.count }
            return total
        }
    }
}

/// Records: `records/modify` (plain values and CRDT states), the one write path every record change takes
/// (`plan`, `writeBatch`, shared with `deltas/push`), and the reads `records/lookup` and `records/query`
/// (RecordQueries.swift).
public struct Records: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// `records/modify`: applies the operations to one zone, atomically by default, under the body's
    /// `clientOperationID` if it has one (`Idempotency`).
    ///
    /// - Atomic (the default): any failed operation fails the batch; nothing is written, the failed
    ///   operations report their own error and every other one ATOMIC_ERROR.
    /// - `"atomic": false`: each operation stands alone.
    ///
    /// The size caps are checked first, before the write transaction (`recordsModifyRefusals`); an
    /// operation over them answers its error as if it had failed in it.
    public func modify(_ caller: Caller, _ body: [String: JSON], replay: ReplayKey?) throws -> Answer {
        let refused = try recordsModifyRefusals(body) // the size caps, before the write lock is taken
        let names = (body["operations"]?.arrayValue ?? []).map { $0["record"]?["recordName"]?.stringValue ?? "" }
        // What a replay of a large answer needs; when desiredKeys is ill-formed the request fails and
        // nothing is remembered.
        let form = Idempotency.ReplayForm.records(zoneID: body["zoneID"], names: names,
                                                  desiredKeys: (try? RequestReader(body).desiredKeys())?.map(Set.init))
        return try Idempotency(core).batch(caller, replay: replay, form: form, isSmall: {
            $0.frameBytes <= Idempotency.wholeAnswerLimit / 2
        }, render: renderModify) { tx, touched in
            try modifyRecordsOutcome(caller, body, tx, &touched, refused: refused)
        }
    }

    /// `records/modify` of CRDT states read in one pass (`RecordStatesRequest`): the same checks, join and
    /// answer as the body read as a tree, with each state's frame made before the write transaction.
    public func modify(_ caller: Caller, _ request: RecordStatesRequest, replay: ReplayKey?) throws -> Answer {
        // Encoded outside the writer; an encoding error is thrown where the tree read throws it (in the plan).
        let frames = request.operations.map { operation in
            Result { try RecordFrame(encoding: operation.state.record) }
        }
        let names = request.operations.map(\.recordName)
        let form = Idempotency.ReplayForm.records(zoneID: request.zoneID, names: names, desiredKeys: request.desiredKeys)
        return try Idempotency(core).batch(caller, replay: replay, form: form, isSmall: {
            $0.frameBytes <= Idempotency.wholeAnswerLimit / 2
        }, render: renderModify) { tx, touched in
            let resolved = try zones.resolveZone(request.zoneID, caller, tx, path: "zoneID", creatingDefault: true)
            guard let zone = resolved.zone else {
                throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist; create it with zones/modify")
            }
            let outcomes = try writeBatch(names: names, atomic: request.atomic, zone: zone, resolved: resolved,
                                          caller: caller, tx, &touched) { index, shareRecordNames in
                let operation = request.operations[index]
                let path = "operations[\(index)].record"
                let requestedParent: String?? = operation.state.parent.map { $0 == .null ? nil : $0["recordName"]?.stringValue ?? "" }
                return try plan(operation.recordName, kind: operation.type,
                                createsMissing: operation.type == .create || operation.type == .forceUpdate,
                                requestedParent: requestedParent, changeTag: operation.state.changeTag, zone: zone,
                                resolved: resolved, shareRecordNames: shareRecordNames, caller: caller,
                                tx: tx) { existing, live in
                    let incoming = try checkedState(operation.state.record, frame: frames[index].get(),
                                                    zoneID: resolved.zoneID, path: path)
                    return try join(incoming, into: existing, live: live, kind: operation.type, path: path)
                }
            }
            return ModifyOutcome(zoneRowID: zone.rowID, names: names, outcomes: outcomes, desiredKeys: request.desiredKeys,
                                 reader: caller.user)
        }
    }

    /// The writes of `records/modify` inside the transaction, without rendering the answer: rendering a
    /// record's JSON can cost more than writing it, and happens after the commit (`renderModify`), so the
    /// writer is not held for it.
    func modifyRecordsOutcome(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction,
                              _ touched: inout CommitEffects, refused: [Int: ServiceError] = [:]) throws -> ModifyOutcome {
        let operationsJSON = try RequestReader(body).items("operations", limit: configuration.maximumOperations)
        guard !operationsJSON.isEmpty else { throw ServiceError.badRequest("operations is empty") }
        let atomic = try atomicFlag(body["atomic"])
        let desiredKeys = try RequestReader(body).desiredKeys().map(Set.init)
        let resolved = try zones.resolveZone(body["zoneID"], caller, tx, path: "zoneID", creatingDefault: true)
        guard let zone = resolved.zone else {
            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist; create it with zones/modify")
        }
        let names = operationsJSON.map { $0["record"]?["recordName"]?.stringValue ?? "" }
        let outcomes = try writeBatch(names: names, atomic: atomic, zone: zone, resolved: resolved,
                                      caller: caller, tx, &touched) { index, shareRecordNames in
            if let error = refused[index] { throw error }
            let operation = try self.parseOperation(operationsJSON[index], path: "operations[\(index)]")
            return try self.apply(operation, zone: zone, resolved: resolved, shareRecordNames: shareRecordNames,
                                  caller: caller, tx: tx)
        }
        return ModifyOutcome(zoneRowID: zone.rowID, names: names, outcomes: outcomes, desiredKeys: desiredKeys,
                             reader: caller.user)
    }

    /// The answer of `records/modify`: each item the record as written (with the fields `desiredKeys`
    /// names, all by default), or its error. Past `maximumResponseBytes` of records (counted on their stored
    /// frames, so it is known before rendering), a record is answered without its fields
    /// (`fieldsOmitted: true`; `records/lookup` has them): 400 small edits of large records cannot make an
    /// answer hundreds of times the size of the request. With `desiredKeys: []` no record carries fields,
    /// and none is counted.
    func renderModify(_ outcome: ModifyOutcome) throws -> Answer {
        // No fields asked for: each record's header is all its item needs, written straight as bytes.
        if outcome.desiredKeys?.isEmpty == true { return Self.renderWithoutFields(outcome) }
        var budget = ResponseBudget(limit: configuration.maximumResponseBytes)
        let items: [JSON] = try zip(outcome.outcomes, outcome.names).map { result, name in
            switch result {
            case .success(let write):
                guard budget.admit(bytes: write.frame.bytes.count) else { return Self.recordWithoutFields(write.stored) }
                return try recordJSON(write.stored, try decode(write.frame), desiredKeys: outcome.desiredKeys,
                                      links: outcome.reader.map { AssetLinks(reader: $0, zoneRowID: outcome.zoneRowID) })
            case .failure(let error): return error.json(item: (key: "recordName", value: name))
            }
        }
        return Answer(.object(["records": .array(items)]))
    }

    /// `{"records": [...]}` of a write that asked for no fields (`desiredKeys: []`): the same bytes as the
    /// tree of each record without fields would serialize to, written from the frames' headers.
    static func renderWithoutFields(_ outcome: ModifyOutcome) -> Answer {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(16 + outcome.outcomes.count * 420)
        bytes.append(contentsOf: #"{"records":["#.utf8)
        for (index, (result, name)) in zip(outcome.outcomes, outcome.names).enumerated() {
            if index > 0 { bytes.append(UInt8(ascii: ",")) }
            switch result {
            case .success(let write):
                let stored = write.stored
                write.frame.appendCloudKitJSONWithoutFields(.init(changeTag: stored.changeTag, createdMs: stored.createdMs,
                                                                  createdBy: stored.createdBy, modifiedMs: stored.modifiedMs,
                                                                  modifiedBy: stored.modifiedBy), into: &bytes)
            case .failure(let error):
                bytes.append(contentsOf: error.json(item: (key: "recordName", value: name)).serializedBytes())
            }
        }
        bytes.append(contentsOf: "]}".utf8)
        return Answer(bytes: bytes)
    }

    func atomicFlag(_ value: JSON?) throws -> Bool {
        guard let value else { return true }
        guard let flag = value.boolValue else { throw ServiceError.badRequest("atomic must be true or false") }
        return flag
    }

    /// Runs the writes of one batch to one zone: each is planned in order (checks and join, no storage
    /// writes), and the planned ones are saved together (`saveRecords`: the zone's counters move once per
    /// batch). A record named again later in the batch is saved before it is planned again, so every plan
    /// starts from the stored state. Then the zone's shares are kept up to date. Atomic: any failure rolls
    /// the whole transaction back and answers every item (the failed ones with their error, the others
    /// ATOMIC_ERROR). Each write gets the zone's share record names. `distinctNames`: the caller knows no name
    /// repeats (a validated delta is in strict name order), so the batch is saved in one go without tracking names.
    func writeBatch(names: [String], atomic: Bool, zone: StoredZone, resolved: ResolvedZone, caller: Caller,
                    _ tx: any StorageTransaction, _ touched: inout CommitEffects, distinctNames: Bool = false,
                    plan planWrite: (_ index: Int, _ shareRecordNames: Set<String>) throws -> PlannedWrite) throws
        -> [Result<AppliedWrite, ServiceError>] {
        // The zone's share records, read once: a batch never creates or deletes shares mid-way. A zone
        // without shares gets none from the batch, so the share bookkeeping after the writes is skipped.
        let zoneShares = try tx.shares(zoneRowID: zone.rowID)
        let shareRecordNames = Set(zoneShares.map(\.recordName))
        var slots: [Result<AppliedWrite, ServiceError>?] = Array(repeating: nil, count: names.count)
        var changedNames: [String] = []
        // The planned writes waiting to be saved, as three parallel arrays (handed to the store as they are).
        var pendingIndexes: [Int] = [], pendingWrites: [RecordWrite] = [], pendingStored: [StoredRecord?] = []
        var pendingAfter: [RecordFrame] = []
        var pendingAssets: [AssetChanges] = []
        pendingIndexes.reserveCapacity(names.count)
        pendingWrites.reserveCapacity(names.count)
        pendingStored.reserveCapacity(names.count)
        pendingAfter.reserveCapacity(names.count)
        changedNames.reserveCapacity(names.count)
        var pendingNames: Set<String> = []
        var bytesUsed = try tx.database(id: zone.databaseID)?.bytesUsed ?? 0
        let assets = Assets(core)
        // Every plan reads its record first: one read for the batch on a backend with round trips.
        try tx.prefetchRecords(zoneRowID: zone.rowID, names: names)
        func flush() throws {
            guard !pendingIndexes.isEmpty else { return }
            let saved = try tx.saveRecords(zoneRowID: zone.rowID, pendingWrites, previous: pendingStored)
            for (position, record) in saved.enumerated() {
                slots[pendingIndexes[position]] = .success(AppliedWrite(stored: record, frame: pendingAfter[position]))
                changedNames.append(record.recordName)
                touched.recordWritten(zone, before: pendingStored[position], after: record, frame: pendingAfter[position],
                                      caller: caller)
                try assets.updateReferences(zone: zone, recordName: record.recordName, pendingAssets[position], tx)
            }
            pendingIndexes.removeAll(keepingCapacity: true)
            pendingWrites.removeAll(keepingCapacity: true)
            pendingStored.removeAll(keepingCapacity: true)
            pendingAfter.removeAll(keepingCapacity: true)
            pendingAssets.removeAll(keepingCapacity: true)
            pendingNames = []
        }
        for index in names.indices {
            // Each record's join is bounded by the caps (O((E + R) log R) in its entries and context), and the
            // batch stops at the request's deadline between records: nothing is written when it does.
            if let deadline = caller.deadline, deadline.hasPassed { throw StorageError.deadlineExceeded }
            if !distinctNames, pendingNames.contains(names[index]) { try flush() }
            do {
                let plan = try planWrite(index, shareRecordNames)
                guard let record = plan.write else {
                    slots[index] = .success(AppliedWrite(stored: plan.stored!, frame: plan.after))
                    continue
                }
                let growth = Int64(record.frame.count) - Int64(plan.stored?.frame.count ?? 0)
                guard bytesUsed + growth <= configuration.quotaBytesPerDatabase else {
                    throw ServiceError(.quotaExceeded, "the database would hold \(bytesUsed + growth) bytes; its quota is "
                                   + "\(configuration.quotaBytesPerDatabase)")
                }
                bytesUsed += growth
                pendingIndexes.append(index)
                pendingWrites.append(record)
                pendingStored.append(plan.stored)
                pendingAfter.append(plan.after)
                pendingAssets.append(plan.assets)
                if !distinctNames { pendingNames.insert(plan.recordName) }
            } catch StorageError.deadlineExceeded {
                throw StorageError.deadlineExceeded // the whole request stops: TRY_AGAIN_LATER, nothing written
            } catch {
                slots[index] = .failure(internalError(error))
            }
        }
        let anyFailed = slots.contains { if case .failure? = $0 { return true } else { return false } }
        if !(atomic && anyFailed) { try flush() } // an atomic batch that failed writes nothing more
        let outcomes = slots.map { $0 ?? .failure(ServiceError(.atomicError, "not saved: another operation in this atomic batch failed")) }
        let failed = outcomes.contains { if case .failure = $0 { return true } else { return false } }
        if atomic && failed {
            // Roll the whole transaction back: nothing of the batch is written.
            let items: [JSON] = zip(outcomes, names).map { outcome, name in
                switch outcome {
                case .failure(let error): return error.json(item: (key: "recordName", value: name))
                case .success:
                    return ServiceError(.atomicError, "not saved: another operation in this atomic batch failed")
                        .json(item: (key: "recordName", value: name))
                }
            }
            throw AtomicBatchFailed(answer: .object(["records": .array(items)]))
        }
        if !changedNames.isEmpty {
            guard !zoneShares.isEmpty else { return outcomes }
            // The owner deleting a hierarchy root deletes its share, as in CloudKit.
            if !resolved.isShared {
                let changed = Set(changedNames)
                for share in try tx.shares(zoneRowID: zone.rowID) {
                    guard let root = share.rootRecordName, changed.contains(root),
                          try tx.record(zoneRowID: zone.rowID, name: root)?.deleted == true else { continue }
                    try shares.removeShare(share, try shares.roster(share, tx), zone: zone, caller: caller, tx, &touched)
                }
            }
            try shares.checkSharesStayDisjoint(zone, tx)
            try shares.recordsChanged(changedNames, in: zone, caller: caller, tx, &touched)
        }
        return outcomes
    }

    private func parseOperation(_ json: JSON, path: String) throws -> RecordOperation {
        guard let typeName = json["operationType"]?.stringValue, let kind = RecordOperation.Kind(rawValue: typeName) else {
            throw ServiceError.badRequest("\(path).operationType must be one of "
                                      + RecordOperation.Kind.allCases.map(\.rawValue).joined(separator: ", "))
        }
        guard let record = json["record"]?.objectValue else { throw ServiceError.badRequest("\(path).record is missing") }
        guard let recordName = record["recordName"]?.stringValue else {
            throw ServiceError.badRequest("\(path).record.recordName is missing")
        }
        do {
            try Names.validate(recordName, kind: .recordName)
        } catch {
            throw ServiceError.badRequest("\(path).record.recordName: \(error.description)")
        }
        return RecordOperation(kind: kind, recordName: recordName, record: record, path: path + ".record")
    }

    /// Applies one operation of `records/modify`.
    private func apply(_ operation: RecordOperation, zone: StoredZone, resolved: ResolvedZone,
                       shareRecordNames: Set<String>, caller: Caller,
                       tx: any StorageTransaction) throws -> PlannedWrite {
        // The size caps were checked before the transaction (`recordsModifyRefusals`).
        let requestedParent: String?? = operation.record["parent"].map { $0 == .null ? nil : $0["recordName"]?.stringValue ?? "" }
        // create and forceReplace make a missing record, and so does a CRDT state sent with forceUpdate.
        let kind = operation.kind
        let createsMissing = kind == .create || kind == .forceReplace
            || (kind == .forceUpdate && operation.record["crdt"] != nil)
        return try plan(operation.recordName, kind: kind, createsMissing: createsMissing, requestedParent: requestedParent,
                         changeTag: operation.record["recordChangeTag"], zone: zone, resolved: resolved,
                         shareRecordNames: shareRecordNames, caller: caller, tx: tx) { existing, live in
            if operation.kind.isDelete {
                guard let existing, live else { throw ServiceError(.notFound, "record \(operation.recordName) does not exist") }
                var edit = try RecordEdit(editing: existing)
                edit.delete(at: tick())
                return try edit.applied()
            }
            if operation.record["crdt"] != nil {
                guard !operation.kind.isReplace else {
                    throw ServiceError.badRequest("\(operation.path): replace takes plain values; send CRDT states with "
                                              + "create, update or forceUpdate")
                }
                let incoming = try incomingState(operation, zoneID: resolved.zoneID)
                return try join(incoming, into: existing, live: live, kind: operation.kind, path: operation.path)
            }
            return try applyPlainValues(operation, existing: existing, live: live, zoneID: resolved.zoneID)
        }
    }

    /// The one write path for a record, whatever brought the change (plain values, a CRDT state in JSON, a
    /// binary delta): the sharing and change-tag checks, then `change` computes the new state from the
    /// stored frame (nil: nothing changes), then the placement checks and the write limit. `writeBatch`
    /// saves the result. `createsMissing`: the write makes the record when none is stored (else a missing
    /// record is NOT_FOUND).
    func plan(_ recordName: String, kind: RecordOperation.Kind, createsMissing: Bool, requestedParent: String??,
              changeTag: JSON?, zone: StoredZone, resolved: ResolvedZone, shareRecordNames: Set<String>,
              caller: Caller, tx: any StorageTransaction, _ change: (RecordFrame?, Bool) throws -> RecordFrame?) throws -> PlannedWrite {
        var stored = try tx.record(zoneRowID: zone.rowID, name: recordName)
        var existing = try stored.map(frame)
        var live = existing.map { !$0.isDeleted } ?? false

        // Shares: a participant writes only inside what they accepted, with readWrite; the owner changes
        // share records only through shares/*. A live record outside every share the caller accepted (another
        // share's record included) is judged exactly as a missing name would be: every check below runs as
        // if nothing were stored, so each refusal is the missing name's. Only a write that a missing name
        // would make is refused otherwise (`nameTakenOutsideShares`), as it would land outside the shares.
        var outsideShares = false
        if resolved.isShared {
            if live, try shares.grant(for: recordName, resolved, tx) == nil {
                outsideShares = true
                (stored, existing, live) = (nil, nil, false)
            } else if !shareRecordNames.isEmpty, shareRecordNames.contains(recordName) {
                throw ServiceError(.permissionFailure, "a share record is changed with shares/modify, by its owner or an administrator")
            }
            try shares.checkParticipantWrite(recordName, isDelete: kind.isDelete, live: live, createsMissing: createsMissing,
                                      requestedParent: requestedParent, resolved, tx)
        } else if caller.database == .private, !shareRecordNames.isEmpty, shareRecordNames.contains(recordName) {
            throw ServiceError.badRequest("record \(recordName) is a share; change it with shares/modify or shares/delete")
        }

        if kind.checksChangeTag {
            guard let stored, let existing, live else {
                throw ServiceError(.notFound, "record \(recordName) does not exist")
            }
            guard let tag = changeTag?.stringValue else {
                throw ServiceError.badRequest("recordChangeTag is required for \(kind.rawValue); "
                                          + "use force\(kind.rawValue.prefix(1).uppercased())"
                                          + "\(kind.rawValue.dropFirst()) to skip the check")
            }
            guard tag == stored.changeTag else {
                throw ServiceError(.conflict, "record \(recordName) changed on the server (tag \(stored.changeTag), "
                               + "not \(tag))", serverRecord: try recordJSON(stored, try decode(existing), desiredKeys: nil,
                                                                     links: AssetLinks(reader: caller.user, zoneRowID: zone.rowID)))
            }
        }
        if caller.database == .public, let stored, live, kind != .create, stored.createdBy != caller.user.recordName {
            throw ServiceError(.accessDenied, "only the creator of a public record may change or delete it")
        }

        let result: RecordFrame?
        do {
            result = try change(existing, live)
        } catch let error as RecordError where error.code == .tooLarge {
            throw ServiceError(.limitExceeded, "record \(recordName) would exceed the limit of "
                           + "\(Record.maximumEncodedSize) bytes per record")
        }
        guard let after = result ?? existing else { throw ServiceError(.internalError, "a write produced no record") }
        try shares.checkParticipantPlacement(after, before: existing, live: live, resolved, tx)
        // A CRDT state can carry a deletion too: the root of a share is still the owner's to delete.
        if resolved.isShared, after.isDeleted, live, !kind.isDelete,
           try shares.grant(for: recordName, resolved, tx)?.share.rootRecordName == recordName {
            throw ServiceError(.permissionFailure, "only the owner deletes the root record of a share")
        }
        guard let result else {
            return PlannedWrite(recordName: recordName, stored: stored, after: after, write: nil) // nothing new
        }
        if result.exceedsWriteLimit {
            throw ServiceError(.limitExceeded, "record \(recordName) would exceed the limit of "
                           + "\(Record.maximumEncodedSize) bytes per record")
        }
        if outsideShares { throw Self.nameTakenOutsideShares(recordName) }
        // An asset the write adds must be the writer's to save (uploaded or rereferenced) in this database.
        let assetChanges = try Assets(core).checkAddedAssets(result, before: existing, zone: zone, caller: caller, tx)
        return PlannedWrite(recordName: recordName, stored: stored, after: result, write: RecordWrite(
            recordName: recordName, recordType: result.recordType, frame: result.bytes, deleted: result.isDeleted,
            parentName: result.parentName, userRecordName: caller.user.recordName, nowMs: configuration.now()), assets: assetChanges)
    }

    /// A participant's write that would make a record whose name a record outside their shares holds: a
    /// missing name would be written, this one cannot be (record names are unique in a zone). The one
    /// answer that differs from a missing name's, and only where a missing name's is success.
    static func nameTakenOutsideShares(_ recordName: String) -> ServiceError {
        ServiceError(.permissionFailure, "record name \(recordName) cannot be used in this share; choose another name")
    }

    /// A CRDT state (a record dictionary with `crdt` metadata) as a frame, after the drift check.
    private func incomingState(_ operation: RecordOperation, zoneID: ZoneID) throws -> RecordFrame {
        let incoming: Record
        do {
            incoming = try Record(cloudKitJSON: .object(operation.record), zoneID: zoneID)
        } catch {
            throw ServiceError.badRequest("\(operation.path).\(error.description)")
        }
        return try checkedState(incoming, frame: try RecordFrame(encoding: incoming), zoneID: zoneID, path: operation.path)
    }

    /// The checks of an incoming state once decoded, in the order the write makes them: its zone is the
    /// request's, its clock within the drift bound, its values in their domains.
    private func checkedState(_ incoming: Record, frame: @autoclosure () throws -> RecordFrame, zoneID: ZoneID,
                              path: String) throws -> RecordFrame {
        guard incoming.id.zoneID == zoneID else {
            throw ServiceError.badRequest("\(path).zoneID differs from the request's zone")
        }
        try observe(incoming.maximumHLC, path: path)
        let frame = try frame()
        if let violation = frame.domainViolation {
            throw ServiceError.badRequest("record \(incoming.id.recordName) field \(violation.field): \(violation.reason)")
        }
        return frame
    }

    /// Checks a remote clock value against the drift bound (`OperationsCore.observe`).
    func observe(_ hlc: HLC, path: String) throws { try core.observe(hlc, path: path) }

    /// Joins an incoming CRDT state into the stored frame, on bytes. Nil when nothing changes.
    func join(_ incoming: RecordFrame, into existing: RecordFrame?, live: Bool, kind: RecordOperation.Kind,
              path: String) throws -> RecordFrame? {
        if kind == .create, live {
            throw ServiceError(.exists, "record \(incoming.recordName) already exists")
        }
        guard let result = RecordFrame.join(existing, incoming) else { return nil }
        if let existing, live, !result.isDeleted, result.recordType != existing.recordType {
            throw ServiceError.badRequest("\(path).recordType: the record is a \(existing.recordType) on the server; "
                                      + "a record's type cannot change")
        }
        return result
    }

    /// The size caps of a `records/modify` request, checked before the write transaction: the number of
    /// operations (LIMIT_EXCEEDED for the whole request), and per operation fields per record and elements
    /// per array anywhere in it (LIMIT_EXCEEDED for that operation, answered by `modify`). One walk
    /// over the request, O(its size).
    func recordsModifyRefusals(_ body: [String: JSON]) throws -> [Int: ServiceError] {
        let operations = try RequestReader(body).items("operations", limit: configuration.maximumOperations)
        var refused: [Int: ServiceError] = [:]
        for (index, json) in operations.enumerated() {
            guard let record = json["record"]?.objectValue else { continue } // parseOperation names the problem
            do {
                try checkSize(of: record, path: "operations[\(index)].record")
            } catch let error as ServiceError {
                refused[index] = error
            }
        }
        return refused
    }

    /// Bounds the work of one operation before any is done: fields per record and elements per array.
    private func checkSize(of record: [String: JSON], path: String) throws {
        if let fields = record["fields"]?.objectValue, fields.count > configuration.maximumFieldsPerRecord {
            throw ServiceError(.limitExceeded, "\(path).fields has \(fields.count) fields; the limit is "
                           + "\(configuration.maximumFieldsPerRecord)")
        }
        // Every array anywhere in the record (list values, add/remove, CRDT entries and contexts).
        var pending: [JSON] = [.object(record)]
        while let json = pending.popLast() {
            switch json {
            case .array(let elements):
                guard elements.count <= configuration.maximumListElements else {
                    throw ServiceError(.limitExceeded, "\(path) holds a list of \(elements.count) elements; the "
                                   + "limit is \(configuration.maximumListElements)")
                }
                pending.append(contentsOf: elements.filter { $0.arrayValue != nil || $0.objectValue != nil })
            case .object(let members):
                pending.append(contentsOf: members.values.filter { $0.arrayValue != nil || $0.objectValue != nil })
            default:
                break
            }
        }
    }

    /// Plain CloudKit values, as curl would send them: the server stamps each edit with its own clock, and
    /// the edit is joined into the stored frame like any other state (`RecordEdit`).
    private func applyPlainValues(_ operation: RecordOperation, existing: RecordFrame?, live: Bool, zoneID: ZoneID) throws
        -> RecordFrame? {
        let path = operation.path
        let recordType = operation.record["recordType"]?.stringValue
        do {
            var edit: RecordEdit
            // create makes a record; so does forceReplace when there is none.
            if operation.kind == .create || (operation.kind == .forceReplace && !live) {
                if live { throw ServiceError(.exists, "record \(operation.recordName) already exists") }
                guard let recordType else { throw ServiceError.badRequest("\(path).recordType is missing") }
                do {
                    try Names.validate(recordType, kind: .recordType)
                } catch {
                    throw ServiceError.badRequest("\(path).recordType: \(error.description)")
                }
                edit = try RecordEdit(creating: RecordID(recordName: operation.recordName, zoneID: zoneID),
                                      recordType: recordType, over: existing, at: tick())
            } else {
                guard let existing, live else {
                    throw ServiceError(.notFound, "record \(operation.recordName) does not exist")
                }
                if let recordType, recordType != existing.recordType {
                    throw ServiceError.badRequest("\(path).recordType is \(existing.recordType) on the server; a record's "
                                              + "type cannot change")
                }
                edit = try RecordEdit(editing: existing)
            }
            let fields = operation.record["fields"]
            guard fields == nil || fields?.objectValue != nil else { throw ServiceError.badRequest("\(path).fields must be an object") }
            let edits = fields?.objectValue ?? [:]
            if operation.kind.isReplace {
                // Replace: every field not given is cleared, and so is the parent.
                try edit.clearFields(except: Set(edits.keys), at: tick())
                if operation.record["parent"] == nil { try edit.setParent(nil, at: tick()) }
            }
            for name in edits.keys.sorted() {
                try applyFieldEdit(name, edits[name]!, to: &edit, path: "\(path).fields.\(name)",
                                   recordName: operation.recordName)
            }
            if let parentJSON = operation.record["parent"] {
                if parentJSON == .null {
                    try edit.setParent(nil, at: tick())
                } else {
                    guard case .reference(let reference) = try ScalarValue(cloudKitJSON: parentJSON, type: .reference,
                                                                           path: path + ".parent") else {
                        throw ServiceError.badRequest("\(path).parent must be a reference")
                    }
                    if reference.zoneID != nil, reference.zoneID != zoneID {
                        throw ServiceError.badRequest("\(path).parent must be in the same zone")
                    }
                    if reference.action != .none {
                        throw ServiceError.badRequest("\(path).parent must have action NONE, as in CloudKit")
                    }
                    try edit.setParent(Reference(recordName: reference.recordName), at: tick())
                }
            }
            return try edit.applied()
        } catch let error as ServiceError {
            throw error
        } catch let error as RecordError where error.code == .tooLarge {
            throw error
        } catch let error as RecordError {
            throw ServiceError.badRequest("\(path): \(error.description)")
        } catch let error as RecordJSONError {
            throw ServiceError.badRequest(error.description)
        } catch let error as NameError {
            throw ServiceError.badRequest("\(path): \(error.description)")
        }
    }

    /// One field of a plain update:
    /// - `{"value": v, "type": T}` sets a scalar; makes a list (`T_LIST`) or text (`TEXT`) read exactly
    ///   the value by the fewest splices, so concurrent edits elsewhere in it stay; makes a set (`T_SET`)
    ///   hold exactly the given elements;
    /// - `{"value": null}` clears the field;
    /// - `{"add": [...], "remove": [...], "type": "T_LIST" | "T_SET"}` edits the field as its stored kind
    ///   means: a set adds and removes elements (add-wins); a list appends the elements it does not hold
    ///   and deletes every occurrence of the removed ones. The type decides only what a missing field becomes;
    /// - `{"splices": [[position, deleteCount, inserted], ...], "type": "TEXT" | "T_LIST"}` edits a text
    ///   (inserted: a string) or list (inserted: an array) in place, one splice after another (each
    ///   position counts in the value the splices before it left; Unicode scalars for a text).
    private func applyFieldEdit(_ name: String, _ json: JSON, to edit: inout RecordEdit, path: String,
                                recordName: String) throws {
        guard let object = json.objectValue else { throw ServiceError.badRequest("\(path) must be an object") }
        if let splices = object["splices"] {
            guard object["value"] == nil, object["add"] == nil, object["remove"] == nil else {
                throw ServiceError.badRequest("\(path): give value, add/remove, or splices, not two of them")
            }
            try applySplices(splices, name: name, type: object["type"], to: &edit, path: path, recordName: recordName)
            return
        }
        if object["add"] != nil || object["remove"] != nil {
            guard object["value"] == nil else { throw ServiceError.badRequest("\(path): give value, or add/remove, not both") }
            let (type, isSet) = try listElementType(object, path: path)
            let removed = try listElements(object["remove"], type: type, path: path + ".remove")
            let added = try listElements(object["add"], type: type, path: path + ".add")
            if let violation = FieldValue.list(type, added).domainViolation {
                throw ServiceError.badRequest("record \(recordName) field \(name) (\(path).add): \(violation)")
            }
            // Both follow the field's stored kind (a set stays a set); the type decides only what a missing
            // field becomes.
            try edit.removeElements(removed, from: name, at: tick())
            try edit.addElements(added, to: name, creatingSet: isSet, at: tick())
            return
        }
        guard let value = object["value"] else { throw ServiceError.badRequest("\(path).value is missing") }
        if value == .null {
            try edit.clear(name, at: tick())
            return
        }
        let parsed = try FieldValue(cloudKitJSON: json, path: path)
        if let violation = parsed.domainViolation {
            throw ServiceError.badRequest("record \(recordName) field \(name) (\(path)): \(violation)")
        }
        switch parsed {
        case .scalar(let scalar):
            try edit.set(name, to: scalar, at: tick())
        case .list(_, let elements):
            try edit.setList(name, to: elements, at: tick())
        case .set(_, let elements):
            try edit.setSet(name, to: elements, at: tick())
        case .text(let text):
            try edit.setText(name, to: text, at: tick())
        }
    }

    /// Splices one field edit may carry: each costs a walk to its position, so their number is bounded.
    static let maximumSplices = 4_096

    /// `splices` of a text or list field: `[[position, deleteCount, inserted], ...]`.
    private func applySplices(_ json: JSON, name: String, type: JSON?, to edit: inout RecordEdit, path: String,
                              recordName: String) throws {
        guard let typeName = type?.stringValue else {
            throw ServiceError.badRequest("\(path).type is needed with splices: TEXT or a list type such as STRING_LIST")
        }
        guard let splices = json.arrayValue else { throw ServiceError.badRequest("\(path).splices must be an array") }
        guard splices.count <= Self.maximumSplices else {
            throw ServiceError(.limitExceeded, "\(path).splices has \(splices.count) splices; at most \(Self.maximumSplices) "
                                             + "go in one request (send the rest in another, or the whole value)")
        }
        // A list's element type, read once (nil for a text, or for a type that is neither).
        let listType = typeName == "TEXT" ? nil : ValueType.collection(typeName).flatMap { $0.isSet ? nil : $0.element }
        for (index, splice) in splices.enumerated() {
            let splicePath = "\(path).splices[\(index)]"
            guard let parts = splice.arrayValue, parts.count == 3, let position = parts[0].intValue, position >= 0,
                  let deleted = parts[1].intValue, deleted >= 0 else {
                throw ServiceError.badRequest("\(splicePath) must be [position, deleteCount, inserted] with counts from 0")
            }
            if typeName == "TEXT" {
                guard let inserted = parts[2].stringValue else {
                    throw ServiceError.badRequest("\(splicePath): a text's inserted part is a string")
                }
                try edit.spliceText(name, at: Int(position), deleting: Int(deleted), inserting: inserted, at: tick())
            } else {
                guard let elementType = listType else {
                    throw ServiceError.badRequest("\(path).type with splices must be TEXT or a list type such as STRING_LIST")
                }
                let inserted = try listElements(parts[2], type: elementType, path: splicePath + "[2]")
                if let violation = FieldValue.list(elementType, inserted).domainViolation {
                    throw ServiceError.badRequest("record \(recordName) field \(name) (\(splicePath)): \(violation)")
                }
                try edit.splice(name, at: Int(position), deleting: Int(deleted), inserting: inserted, at: tick())
            }
        }
    }

    /// The element type of an add/remove edit, and whether the field is a set (`T_SET`) or a list.
    private func listElementType(_ object: [String: JSON], path: String) throws -> (ValueType, isSet: Bool) {
        if let typeName = object["type"]?.stringValue {
            guard let (type, isSet) = ValueType.collection(typeName) else {
                throw ServiceError.badRequest("\(path).type must be a list or set type such as STRING_LIST or STRING_SET")
            }
            return (type, isSet)
        }
        let sample = object["add"]?.arrayValue?.first ?? object["remove"]?.arrayValue?.first
        switch sample {
        case .string?, nil: return (.string, false)
        case .int?: return (.int64, false)
        case .double?: return (.double, false)
        default: throw ServiceError.badRequest("\(path).type is needed for these elements")
        }
    }

    private func listElements(_ json: JSON?, type: ValueType, path: String) throws -> [ScalarValue] {
        guard let json else { return [] }
        guard let array = json.arrayValue else { throw ServiceError.badRequest("\(path) must be an array") }
        return try array.enumerated().map { index, element in
            try ScalarValue(cloudKitJSON: element, type: type, path: "\(path)[\(index)]")
        }
    }

    /// A written record past the answer's byte cap: what identifies it and its new change tag, no fields.
    static func recordWithoutFields(_ stored: StoredRecord) -> JSON {
        .object([
            "recordName": .string(stored.recordName),
            "recordType": .string(stored.recordType),
            "recordChangeTag": .string(stored.changeTag),
            "deleted": .bool(stored.deleted),
            "created": .object(["timestamp": .int(stored.createdMs), "userRecordName": .string(stored.createdBy)]),
            "modified": .object(["timestamp": .int(stored.modifiedMs), "userRecordName": .string(stored.modifiedBy)]),
            "fieldsOmitted": .bool(true),
        ])
    }
}

/// Thrown inside the write transaction to roll an atomic batch back, carrying its answer (every item with
/// its error or ATOMIC_ERROR); the batch's entry point (`Idempotency.batch`) catches it after the rollback
/// and answers it as the outcome it is.
struct AtomicBatchFailed: Error {
    let answer: JSON
}
