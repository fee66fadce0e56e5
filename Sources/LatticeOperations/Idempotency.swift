import LatticeAPI
import LatticeCore

import LatticeSharing
import LatticeStore

/// Idempotency, the replay cache: what a write with a `clientOperationID` leaves behind so that a retry with the same
/// id and body applies once and is answered again (`Answer.replayed`, which HTTP shows as `Lattice-Replayed: true`).
///
/// A remembered operation keeps the request's hash, the status and a short answer:
/// - `records/modify` answers of more than `wholeAnswerLimit / 2` bytes of records and `deltas/push`
///   answers over `wholeAnswerLimit` bytes (both rendered after the commit, `batch`) keep only
///   the zone row they wrote and the items that failed (with their error). A replay names the records
///   from the retried body (the same bytes, by the hash) and renders each one's current state. That is
///   correct for CRDT state: the server's state of a record only grows past the first answer, so the
///   current state contains what the first answer said. A record since deleted shows its tombstone; a
///   zone since deleted answers its items ZONE_NOT_FOUND; in the shared database a record no longer
///   shared with the caller answers NOT_FOUND, and a caller who lost the zone gets the zone's error
///   (nothing leaks past a revocation).
///   A CONFLICT item keeps its error but not its `serverRecord`; a replay shows the record's current state
///   there.
/// - Every other answer (and small ones) is kept whole: they are bounded by their own caps.
///
/// Each remembered operation is charged to the caller's private database quota (in the request's
/// environment) until it is forgotten, and a user keeps at most `maximumClientOperationsPerUser`
/// (saving one more forgets their oldest first).
/// A JSON answer of an operation, as bytes, and whether it is a replay of an earlier one (the HTTP layer
/// adds `Lattice-Replayed: true`). Operations answer with status 200; errors are thrown as `ServiceError`.
public struct Answer: Sendable {
    public var body: [UInt8]
    public var replayed: Bool

    public init(bytes: [UInt8], replayed: Bool = false) {
        self.body = bytes
        self.replayed = replayed
    }

    public init(_ json: JSON) { self.init(bytes: json.serializedBytes()) }
}

/// What makes a write replayable: the body's `clientOperationID`, checked, and the hash of the operation
/// and its body bytes (the same id with another body is refused).
public struct ReplayKey: Sendable {
    public let operationID: String
    public let requestHash: [UInt8]

    /// The key of a request whose body has a `clientOperationID`; nil when it has none. `operation` names
    /// the operation (its path), `bytes` are the body as sent.
    /// - Throws: BAD_REQUEST `clientOperationID must be a string of 1 to 128 bytes`.
    public static func of(_ body: [String: JSON], operation: String, bytes: [UInt8]) throws -> ReplayKey? {
        guard let json = body["clientOperationID"] else { return nil }
        guard let operationID = json.stringValue, (1...128).contains(operationID.utf8.count) else {
            throw ServiceError.badRequest("clientOperationID must be a string of 1 to 128 bytes")
        }
        return ReplayKey(operationID: operationID, requestHash: Secrets.sha256(Array(operation.utf8) + [0] + bytes))
    }
}

/// The replay cache's operations. See the top of this file.
public struct Idempotency: Sendable, OperationArea {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// Answers at most this long are remembered whole.
    static let wholeAnswerLimit = 2_048

    /// How a write's answer can be rebuilt on replay.
    enum ReplayForm {
        case whole
        /// `records/modify`: items in operation order, named by `operations[i].record.recordName`, in the
        /// request's zone, with the fields `desiredKeys` names.
        case records(zoneID: JSON?, names: [String], desiredKeys: Set<String>?)
        /// `deltas/push`: items in the delta's order.
        case push(PreparedPush)
    }

    private enum Tag: UInt8 {
        case whole = 0, records = 1, push = 2

        /// The tag of a form's compact copy (`.whole` for a form kept whole).
        init(_ form: ReplayForm) {
            switch form {
            case .whole: self = .whole
            case .records: self = .records
            case .push: self = .push
            }
        }
    }

    /// Runs a write under a client operation id (`replay`, nil when the body has none): a retried request
    /// with the same id and body gets its answer again (remembered whole) instead of applying twice; the same
    /// id with another body is BAD_REQUEST. Batch writes, whose answers can be large, go through `batch`.
    public func run(_ caller: Caller, replay: ReplayKey?,
                    _ body: (any StorageTransaction, inout CommitEffects) throws -> JSON) throws -> Answer {
        guard let replay else {
            return Answer(try core.write(deadline: caller.deadline) { tx, touched in try body(tx, &touched) })
        }
        return try core.write(deadline: caller.deadline) { tx, touched in
            if let earlier = try recall(replay, caller, tx) { return try replayed(earlier, .whole, caller, tx) }
            let answer = Answer(try body(tx, &touched))
            try remember(ClientOperation(requestHash: replay.requestHash, status: 200,
                                         response: try shortAnswer(answer, .whole, caller, tx)),
                         operationID: replay.operationID, caller, tx)
            return answer
        }
    }

    /// A batch write (`records/modify`, `deltas/push`) under a client operation id, if there is one. The
    /// writer is held for the writes only: what is remembered of a large answer is the compact form, taken
    /// from the outcome (no rendered answer is parsed), and the answer is rendered after the commit. A small
    /// one (`isSmall`) is rendered inside the transaction and remembered as `run` would (whole, so a replay
    /// is the first answer byte for byte). An atomic batch that failed rolls back and is answered as the
    /// outcome it is (every item with its error or ATOMIC_ERROR); nothing is remembered of it.
    func batch<Outcome: BatchOutcome>(
        _ caller: Caller, replay: ReplayKey?, form: ReplayForm, isSmall: (Outcome) -> Bool,
        render: (Outcome) throws -> Answer,
        _ body: (any StorageTransaction, inout CommitEffects) throws -> Outcome) throws -> Answer {
        let answer: BatchAnswer<Outcome>
        do {
            answer = try core.write(deadline: caller.deadline) { tx, touched in
                guard let replay else { return .done(try body(tx, &touched)) }
                if let earlier = try recall(replay, caller, tx) { return .rendered(try replayed(earlier, form, caller, tx)) }
                let outcome = try body(tx, &touched)
                if isSmall(outcome) {
                    let answer = try render(outcome)
                    try remember(ClientOperation(requestHash: replay.requestHash, status: 200,
                                                 response: try shortAnswer(answer, form, caller, tx)),
                                 operationID: replay.operationID, caller, tx)
                    return .rendered(answer)
                }
                var failed: [JSON] = []
                for (index, result) in outcome.outcomes.enumerated() {
                    guard case .failure(let error) = result else { continue }
                    guard case .object(var item) = error.json(item: (key: "recordName", value: outcome.names[index])) else { continue }
                    // A CONFLICT's serverRecord is not kept: a replay shows the current one.
                    if item["serverRecord"] != nil { item["serverRecord"] = .bool(true) }
                    failed.append(.array([.int(Int64(index)), .object(item)]))
                }
                let compact = JSON.object(["zone": .int(outcome.zoneRowID), "items": .int(Int64(outcome.names.count)),
                                           "failed": .array(failed)])
                try remember(ClientOperation(requestHash: replay.requestHash, status: 200,
                                             response: [Tag(form).rawValue] + compact.serializedBytes()),
                             operationID: replay.operationID, caller, tx)
                return .done(outcome)
            }
        } catch let failure as AtomicBatchFailed {
            return Answer(failure.answer)
        }
        switch answer {
        case .rendered(let answer): return answer
        case .done(let outcome): return try render(outcome)
        }
    }

    /// What a batch write's transaction hands back: an answer rendered already (a replay, or a small
    /// answer), or the outcome to render after the commit.
    private enum BatchAnswer<Outcome> {
        case rendered(Answer)
        case done(Outcome)
    }

    /// The remembered operation a retry names, if any. - Throws: BAD_REQUEST when the id was used for a
    /// different request.
    private func recall(_ replay: ReplayKey, _ caller: Caller, _ tx: any StorageTransaction) throws -> ClientOperation? {
        guard let earlier = try tx.clientOperation(userID: caller.user.id, operationID: replay.operationID) else { return nil }
        guard earlier.requestHash == replay.requestHash else {
            throw ServiceError.badRequest("clientOperationID \(replay.operationID) was already used for a different request")
        }
        return earlier
    }

    /// Saves a remembered operation, charged to the caller's private database (against its quota), after
    /// forgetting the user's oldest ones past the cap.
    private func remember(_ remembered: ClientOperation, operationID: String, _ caller: Caller,
                          _ tx: any StorageTransaction) throws {
        let userID = caller.user.id
        let charged = try tx.database(DatabaseKey(kind: .private, environment: caller.environment, ownerID: userID))
        let bytes = remembered.storedBytes(operationID: operationID)
        guard charged.bytesUsed + bytes <= configuration.quotaBytesPerDatabase else {
            throw ServiceError(.quotaExceeded, "remembering clientOperationID \(operationID) (\(bytes) bytes) would put your "
                           + "private database over its quota of \(configuration.quotaBytesPerDatabase) bytes")
        }
        // The cap: forget the oldest first, before this one is saved (so it is never the one forgotten).
        let cap = max(1, configuration.maximumClientOperationsPerUser)
        let count = try tx.clientOperationCount(userID: userID)
        if count >= cap { _ = try tx.forgetOldestClientOperations(userID: userID, count: count - cap + 1) }
        try tx.saveClientOperation(userID: userID, operationID: operationID, remembered, chargedTo: charged.id,
                                   nowMs: configuration.now())
    }

    /// The bytes remembered for an answer: a tag, then the whole body or the compact form.
    private func shortAnswer(_ answer: Answer, _ form: ReplayForm, _ caller: Caller,
                             _ tx: any StorageTransaction) throws -> [UInt8] {
        let zoneJSON: JSON?
        let count: Int
        switch form {
        case .whole: return [Tag.whole.rawValue] + answer.body
        case .records(let zoneID, let names, _): (zoneJSON, count) = (zoneID, names.count)
        case .push(let prepared): (zoneJSON, count) = (Self.zoneJSON(of: prepared), prepared.names.count)
        }
        guard answer.body.count > Self.wholeAnswerLimit,
              let zone = try zones.resolveZone(zoneJSON, caller, tx, path: "zoneID").zone else {
            return [Tag.whole.rawValue] + answer.body
        }
        var failed: [JSON] = []
        // Only an answer with a failed item is parsed (the common all-saved answer is not): a cheap scan
        // for the error key first.
        if Self.contains(answer.body, Self.errorKey) {
            guard let items = (try? JSON.parse(answer.body))?["records"]?.arrayValue, items.count == count else {
                return [Tag.whole.rawValue] + answer.body
            }
            for (index, item) in items.enumerated() where item["serverErrorCode"] != nil {
                // A CONFLICT's serverRecord (up to a whole record) is not kept: a replay shows the current one.
                guard case .object(var object) = item, object["serverRecord"] != nil else {
                    failed.append(.array([.int(Int64(index)), item]))
                    continue
                }
                object["serverRecord"] = .bool(true)
                failed.append(.array([.int(Int64(index)), .object(object)]))
            }
        }
        let compact = JSON.object(["zone": .int(zone.rowID), "items": .int(Int64(count)), "failed": .array(failed)])
        return [Tag(form).rawValue] + compact.serializedBytes()
    }

    private static let errorKey = Array("\"serverErrorCode\"".utf8)

    /// Whether `needle` (not empty) occurs in `haystack`: a scan for its first byte, then a compare.
    private static func contains(_ haystack: [UInt8], _ needle: [UInt8]) -> Bool {
        guard let first = needle.first, haystack.count >= needle.count else { return false }
        let last = haystack.count - needle.count
        var index = 0
        while index <= last {
            if haystack[index] == first, haystack[index..<(index + needle.count)].elementsEqual(needle) { return true }
            index += 1
        }
        return false
    }

    /// The answer to a retry, from what was remembered.
    private func replayed(_ earlier: ClientOperation, _ form: ReplayForm, _ caller: Caller,
                          _ tx: any StorageTransaction) throws -> Answer {
        // Every remembered answer is a 200's (a write that fails throws, rolls back and is not remembered).
        guard let first = earlier.response.first, let tag = Tag(rawValue: first) else {
            // Remembered before the short form (schema v2): the bytes are the whole answer.
            return Answer(bytes: earlier.response, replayed: true)
        }
        let rest = Array(earlier.response.dropFirst())
        guard tag != .whole else { return Answer(bytes: rest, replayed: true) }
        guard let compact = try? JSON.parse(rest), let zoneRowID = compact["zone"]?.intValue,
              let count = compact["items"]?.intValue else {
            throw StorageError.failure("a remembered client operation does not decode")
        }
        var failures: [Int: JSON] = [:]
        for entry in compact["failed"]?.arrayValue ?? [] {
            if let index = entry.arrayValue?.first?.intValue, let item = entry.arrayValue?.last { failures[Int(index)] = item }
        }
        switch (tag, form) {
        case (.records, .records(let zoneID, let names, let desiredKeys)):
            let resolved = try zones.resolveZone(zoneID, caller, tx, path: "zoneID")
            guard names.count == count else { throw StorageError.failure("a remembered records/modify does not match its body") }
            let items: [JSON] = try names.enumerated().map { index, name in
                let render = { (stored: StoredRecord) throws -> JSON in
                    try self.recordJSON(stored, try self.decode(stored), desiredKeys: desiredKeys,
                                        links: AssetLinks(reader: caller.user, zoneRowID: zoneRowID))
                }
                guard let failure = failures[index] else {
                    return try currentItem(name, resolved, zoneRowID: zoneRowID, tx, render: render)
                }
                guard case .object(var object) = failure, object["serverRecord"] == .bool(true) else { return failure }
                // The record as it is now, where the first answer had it as it was then.
                // Whole, as a CONFLICT's serverRecord always is (desiredKeys shapes the saved records only).
                let current = try currentItem(name, resolved, zoneRowID: zoneRowID, tx) { stored in
                    try self.recordJSON(stored, try self.decode(stored), desiredKeys: nil,
                                        links: AssetLinks(reader: caller.user, zoneRowID: zoneRowID))
                }
                object["serverRecord"] = current["serverErrorCode"] == nil && current["deleted"] != .bool(true) ? current : nil
                return .object(object)
            }
            return Answer(bytes: JSON.object(["records": .array(items)]).serializedBytes(), replayed: true)
        case (.push, .push(let prepared)):
            let resolved = try zones.resolveZone(Self.zoneJSON(of: prepared), caller, tx, path: "delta.zoneID")
            guard prepared.names.count == count else { throw StorageError.failure("a remembered push does not match its body") }
            let items: [JSON] = try zip(prepared.names, prepared.frames).enumerated().map { index, pair in
                let (name, incoming) = pair
                if let failure = failures[index] { return failure }
                return try currentItem(name, resolved, zoneRowID: zoneRowID, tx) { stored in
                    .object(["recordName": .string(name), "recordChangeTag": .string(stored.changeTag),
                             "position": .int(stored.seq), "upToDate": .bool(stored.frame == incoming.bytes)])
                }
            }
            return Answer(bytes: JSON.object(["zoneID": resolved.zoneID.cloudKitJSON, "records": .array(items)]).serializedBytes(),
                          replayed: true)
        default:
            throw StorageError.failure("a remembered client operation is of another kind than its request")
        }
    }

    /// One replayed item: the record's current state, or why it cannot be shown.
    private func currentItem(_ name: String, _ resolved: ResolvedZone, zoneRowID: Int64, _ tx: any StorageTransaction,
                             render: (StoredRecord) throws -> JSON) throws -> JSON {
        guard let zone = resolved.zone, zone.rowID == zoneRowID else {
            return ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) was deleted after this operation was applied")
                .json(item: (key: "recordName", value: name))
        }
        if resolved.isShared, try shares.grant(for: name, resolved, tx) == nil {
            return ServiceError(.notFound, "record \(name) is no longer shared with you").json(item: (key: "recordName", value: name))
        }
        guard let stored = try tx.record(zoneRowID: zone.rowID, name: name) else {
            // Deleted since, and its tombstone purged.
            return .object(["recordName": .string(name), "deleted": .bool(true)])
        }
        return try render(stored)
    }

    private static func zoneJSON(of prepared: PreparedPush) -> JSON {
        .object(["zoneName": .string(prepared.delta.zoneID.zoneName),
                 "ownerRecordName": .string(prepared.delta.zoneID.ownerRecordName)])
    }
}
