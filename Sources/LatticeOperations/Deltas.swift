import LatticeAPI
import LatticeCore

import LatticeStore

/// The binary sync path: `deltas/push` and `deltas/pull` carry a zone's changes as canonical binary
/// frames (`SyncMessage`, Content-Type `application/vnd.lattice.delta; version=1`), with every rule of
/// `records/modify` and `changes/zone`. Docs/API.md describes both.
/// Deltas: the binary sync path. `deltas/push` joins a delta's record states through the one write path
/// (`Records.plan`, `Records.writeBatch`); `deltas/pull` pages a zone's feed (`Feeds.zoneFeedPage`) as
/// frames.
public struct Deltas: Sendable, OperationArea {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// `deltas/push`: joins each record state of the delta into the zone, as `records/modify` joins CRDT
    /// states sent with `forceUpdate`. Answers, per record in the delta's order, its change tag, its zone
    /// position, and `upToDate` (the stored state is exactly the one sent, so the device needs nothing
    /// back), or the error.
    /// `deltas/push` under the envelope's `clientOperationID`, if any (`Idempotency`): validated and split
    /// outside the write transaction (`preparePush`), then joined inside it.
    public func push(_ caller: Caller, _ push: SyncMessage.Push, replay: ReplayKey?) throws -> Answer {
        let prepared = try preparePush(push)
        return try Idempotency(core).batch(caller, replay: replay, form: .push(prepared), isSmall: {
            // Rendered in the transaction (and remembered whole) only when even the answer's lower bound is
            // under the limit; a larger one is remembered in its compact form and rendered after the commit.
            $0.minimumAnswerBytes <= Idempotency.wholeAnswerLimit
        }, render: { $0.answer() }) { tx, touched in
            try pushDelta(caller, prepared, atomic: push.atomic, tx, &touched)
        }
    }
}

/// A push's delta validated and split into record frames: done before the write transaction, so
/// concurrent pushes check their bytes in parallel and the writer only plans and saves.
struct PreparedPush {
    let delta: EncodedDelta
    let frames: [RecordFrame]
    let names: [String]
    /// Frames over the size caps or holding a value outside its domain, by index: each answers its error.
    var refused: [Int: ServiceError] = [:]
}

extension Deltas {
    func preparePush(_ push: SyncMessage.Push) throws -> PreparedPush {
        let delta: EncodedDelta
        do {
            delta = try EncodedDelta(validating: push.delta)
        } catch {
            throw ServiceError.badRequest("the delta is not valid: \(SyncMessage.describe(error, in: push.delta))")
        }
        guard delta.recordCount > 0 else { throw ServiceError.badRequest("the delta carries no records") }
        guard delta.recordCount <= configuration.maximumOperations else {
            throw ServiceError(.limitExceeded, "a push carries at most \(configuration.maximumOperations) records, not "
                           + "\(delta.recordCount)")
        }
        var prepared = PreparedPush(delta: delta, frames: delta.recordFrames(), names: delta.recordNames)
        // The bounds records/modify checks on JSON, before any work and outside the write transaction: the
        // size of the state, fields, elements per list, and the value domain.
        for (index, (incoming, name)) in zip(prepared.frames, prepared.names).enumerated() {
            if incoming.exceedsWriteLimit {
                prepared.refused[index] = ServiceError(.limitExceeded, "record \(name) is \(incoming.encodedSize) bytes; "
                                                   + "the limit is \(Record.maximumEncodedSize)")
                continue
            }
            let shape = incoming.shape
            if shape.fieldCount > configuration.maximumFieldsPerRecord {
                prepared.refused[index] = ServiceError(.limitExceeded, "record \(name) has \(shape.fieldCount) fields; the "
                                                   + "limit is \(configuration.maximumFieldsPerRecord)")
            } else if shape.largestListCount > configuration.maximumListElements {
                prepared.refused[index] = ServiceError(.limitExceeded, "record \(name) holds a list of "
                                                   + "\(shape.largestListCount) elements; the limit is "
                                                   + "\(configuration.maximumListElements)")
            } else if shape.largestContextCount > configuration.maximumListElements {
                // A causal context is an array on the JSON path too, bounded by the same limit.
                prepared.refused[index] = ServiceError(.limitExceeded, "record \(name) holds a list whose causal "
                                                   + "context names \(shape.largestContextCount) replicas; the "
                                                   + "limit is \(configuration.maximumListElements)")
            } else if let violation = incoming.domainViolation {
                prepared.refused[index] = ServiceError.badRequest("record \(name) field \(violation.field): \(violation.reason)")
            }
        }
        return prepared
    }

    func pushDelta(_ caller: Caller, _ prepared: PreparedPush, atomic: Bool, _ tx: any StorageTransaction,
                   _ touched: inout CommitEffects) throws -> PushOutcome {
        let delta = prepared.delta
        let zoneJSON = JSON.object(["zoneName": .string(delta.zoneID.zoneName),
                                    "ownerRecordName": .string(delta.zoneID.ownerRecordName)])
        let resolved = try zones.resolveZone(zoneJSON, caller, tx, path: "delta.zoneID", creatingDefault: true)
        guard let zone = resolved.zone else {
            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist; create it with zones/modify")
        }
        // The drift bound applies to the whole delta: one timestamp too far ahead refuses it all.
        try core.observe(delta.maximumHLC, path: "delta")
        let frames = prepared.frames, names = prepared.names, refused = prepared.refused
        let outcomes = try records.writeBatch(names: names, atomic: atomic, zone: zone, resolved: resolved, caller: caller, tx,
                                      &touched, distinctNames: true) { index, shares in
            let incoming = frames[index]
            let parent: String?? = incoming.parentName.map { .some($0) } ?? nil
            return try records.plan(names[index], kind: .forceUpdate, createsMissing: true, requestedParent: parent,
                                 changeTag: nil, zone: zone, resolved: resolved, shareRecordNames: shares,
                                 caller: caller, tx: tx) { existing, live in
                // Found by `preparePush` (sharing and tag checks come first, as for any write).
                if let error = refused[index] { throw error }
                return try records.join(incoming, into: existing, live: live, kind: .forceUpdate, path: "record \(names[index])")
            }
        }
        return PushOutcome(zoneID: resolved.zoneID, zoneRowID: zone.rowID, prepared: prepared, outcomes: outcomes)
    }

    /// `deltas/pull {"zoneID", "syncToken"?, "resultsLimit"?, "known"?: [[from, to], ...], "shares"?}`: one page
    /// of the zone's changes since the token, as `changes/zone` pages them, in binary. Records whose current
    /// zone position lies in a `known` range (the device's own acknowledged writes, `upToDate` in their push
    /// answer) are left out of the frames and only named (`skipped`); the token moves past them all the same.
    /// With `shares: true` the page names the share of each root record of a hierarchy share it holds
    /// (`sharedRoots`, CloudKit's `share` reference), whatever page the share's own record comes in.
    public func pull(_ caller: Caller, _ body: [String: JSON]) throws -> [UInt8] {
        guard caller.database != .public else {
            throw ServiceError.badRequest("the public database has no change feed (as in CloudKit)")
        }
        let request = try DeltaPullRequest(json: .object(body))
        let known = KnownPositions(ranges: request.known)
        let zoneID = try zones.zoneID(request.zoneID, caller)
        // The page stops before the frame that would pass `maximumResponseBytes` (a skipped record counts
        // its name), with `moreComing` and a token that resumes there.
        var budget = ResponseBudget(limit: configuration.maximumResponseBytes)
        var frames: [RecordFrame] = []
        var skipped: [String] = []
        var sharedRoots: [SyncMessage.SharedRoot] = []
        var shareNames: [String: String]? // read with the first record, when asked for
        let page = try storage.read(deadline: caller.deadline) { tx in
            try Feeds(core).zoneFeedPage(syncToken: request.syncToken, resultsLimit: request.resultsLimit, zoneID: zoneID,
                                         caller, tx, maximumLimit: configuration.maximumPullRecords) { stored in
                try caller.deadline.check()
                if request.shares && !stored.deleted {
                    if shareNames == nil { shareNames = try Shares(core).shareRecordNamesByRoot(in: zoneID, caller, tx) }
                    if let share = shareNames?[stored.recordName] {
                        sharedRoots.append(SyncMessage.SharedRoot(rootRecordName: stored.recordName, shareRecordName: share))
                    }
                }
                if known.contains(stored.seq) {
                    guard budget.admit(bytes: stored.recordName.utf8.count + 1) else { return false }
                    skipped.append(stored.recordName)
                } else {
                    guard budget.admit(bytes: stored.frame.count) else { return false }
                    frames.append(try frame(stored))
                }
                return true
            }
        }
        let delta = BinaryCodec.encodeDelta(zoneID: page.zoneID, frames: frames)
        return SyncMessage.Pull(syncToken: page.syncToken, moreComing: page.moreComing, removed: page.removed,
                                lostShares: page.lostShares, skipped: skipped, sharedRoots: sharedRoots, delta: delta).encoded()
    }
}

/// What a `deltas/push` did, item by item in the delta's order; its answer is rendered from it
/// (`answer()`), after the commit when it is large (`Idempotency.batch`).
struct PushOutcome: BatchOutcome {
    let zoneID: ZoneID
    let zoneRowID: Int64
    let prepared: PreparedPush
    let outcomes: [Result<AppliedWrite, ServiceError>]

    var names: [String] { prepared.names }

    /// A lower bound of the answer's size: every item, saved or failed, holds its record name and more than
    /// 65 bytes besides (`{"position":…,"recordChangeTag":"…","recordName":"…","upToDate":…}`; an error item
    /// names its record, code and reason).
    var minimumAnswerBytes: Int { prepared.names.reduce(0) { $0 + $1.utf8.count + 65 } }

    /// The answer: per record, its change tag, zone position and `upToDate`, or its error.
    func answer() -> Answer {
        var answer = PushAnswer(zoneID: zoneID, capacity: outcomes.count)
        for (index, outcome) in outcomes.enumerated() {
            switch outcome {
            case .success(let write):
                answer.append(name: prepared.names[index], changeTag: write.stored.changeTag, position: write.stored.seq,
                              upToDate: write.frame.bytes == prepared.frames[index].bytes)
            case .failure(let error):
                answer.append(failed: error.json(item: (key: "recordName", value: prepared.names[index])))
            }
        }
        return Answer(bytes: answer.serialized())
    }
}

/// The JSON answer of `deltas/push`, written item by item into its bytes: the same bytes as
/// `JSON.serializedBytes` writes for `{"records": [...], "zoneID": {...}}` (keys sorted), without building a
/// dictionary per record.
struct PushAnswer {
    private var bytes: [UInt8] = []
    private let zoneID: ZoneID
    private var count = 0

    init(zoneID: ZoneID, capacity: Int) {
        self.zoneID = zoneID
        bytes.reserveCapacity(64 + capacity * 112)
        bytes.append(contentsOf: #"{"records":["#.utf8)
    }

    private mutating func separate() {
        if count > 0 { bytes.append(UInt8(ascii: ",")) }
        count += 1
    }

    /// A saved (or already up-to-date) record: `{"position", "recordChangeTag", "recordName", "upToDate"}`.
    mutating func append(name: String, changeTag: String, position: Int64, upToDate: Bool) {
        separate()
        bytes.append(contentsOf: #"{"position":"#.utf8)
        bytes.append(contentsOf: String(position).utf8)
        bytes.append(contentsOf: #","recordChangeTag":"#.utf8)
        bytes.append(contentsOf: JSON.string(changeTag).serializedBytes())
        bytes.append(contentsOf: #","recordName":"#.utf8)
        bytes.append(contentsOf: JSON.string(name).serializedBytes())
        bytes.append(contentsOf: upToDate ? #","upToDate":true}"#.utf8 : #","upToDate":false}"#.utf8)
    }

    /// A failed record's error item.
    mutating func append(failed item: JSON) {
        separate()
        bytes.append(contentsOf: item.serializedBytes())
    }

    /// The answer's bytes.
    func serialized() -> [UInt8] {
        var out = bytes
        out.append(contentsOf: #"],"zoneID":"#.utf8)
        out.append(contentsOf: zoneID.cloudKitJSON.serializedBytes())
        out.append(UInt8(ascii: "}"))
        return out
    }
}

/// Inclusive ranges of positions, coalesced and searched by binary search.
struct KnownPositions {
    private let ranges: [ClosedRange<Int64>]

    init(ranges: [ClosedRange<Int64>]) {
        var merged: [ClosedRange<Int64>] = []
        for range in ranges.sorted(by: { $0.lowerBound < $1.lowerBound }) {
            if let last = merged.last, range.lowerBound <= last.upperBound &+ 1 {
                merged[merged.count - 1] = last.lowerBound...max(last.upperBound, range.upperBound)
            } else {
                merged.append(range)
            }
        }
        self.ranges = merged
    }

    func contains(_ position: Int64) -> Bool {
        var low = 0, high = ranges.count
        while low < high {
            let mid = (low + high) / 2
            if ranges[mid].upperBound < position { low = mid + 1 } else { high = mid }
        }
        return low < ranges.count && ranges[low].contains(position)
    }
}
