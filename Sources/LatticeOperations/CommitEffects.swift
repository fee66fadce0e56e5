import LatticeAPI
import LatticeCore
import LatticeStore

/// What one write transaction changed, gathered while it runs, for what happens at its commit:
/// - `databaseIDs`: the databases whose logs moved (announced to other nodes; long polls and push streams on
///   them wake);
/// - `zones`: which zone each of them saw change (a zone of the owner's private database, or a shared zone
///   as a participant's shared database sees it), for zone subscriptions;
/// - `records`: each record written, with what happened to it, for query subscriptions;
/// - `origin`: the device (token id) that made the change, which is not notified of it.
///
/// `OperationsCore.write` hands it to `Subscriptions.fire` inside the same transaction, so the
/// notifications a change raises commit with it or not at all.
public struct CommitEffects: Sendable {
    /// A zone that changed, as one database sees it.
    package struct ZoneChange: Hashable, Sendable {
        package var databaseID: Int64
        package var zoneRowID: Int64
        package var zoneName: String
        package var ownerRecordName: String
    }

    /// One record written: created (new, or saved over its tombstone), updated, or deleted.
    package struct RecordChange: Sendable {
        package var databaseID: Int64
        package var zone: StoredZone
        package var recordName: String
        package var recordType: String
        package var event: SubscriptionEvent
        /// The stored state before the write (nil for a new record).
        package var before: StoredRecord?
        /// The state written.
        package var after: RecordFrame
    }

    package private(set) var databaseIDs: Set<Int64> = []
    package private(set) var zones: Set<ZoneChange> = []
    package private(set) var records: [RecordChange] = []
    /// The token id of the request that made the change; nil for changes no device made.
    package var origin: String?

    public init() {}

    /// A database's log moved.
    package mutating func insert(_ databaseID: Int64) { databaseIDs.insert(databaseID) }

    /// `zone` changed as database `databaseID` sees it (its own database unless given: a participant's
    /// shared database for a shared zone); made by `caller`'s device.
    package mutating func zoneChanged(_ zone: StoredZone, in databaseID: Int64? = nil, caller: Caller) {
        let database = databaseID ?? zone.databaseID
        databaseIDs.insert(database)
        zones.insert(ZoneChange(databaseID: database, zoneRowID: zone.rowID, zoneName: zone.name,
                                ownerRecordName: zone.ownerRecordName))
        origin = caller.tokenID
    }

    /// A record of `zone` was written: `before` is what was stored (nil: nothing), `after` what is now.
    package mutating func recordWritten(_ zone: StoredZone, before: StoredRecord?, after: StoredRecord, frame: RecordFrame,
                                        caller: Caller) {
        zoneChanged(zone, caller: caller)
        let existed = before.map { !$0.deleted } ?? false
        let event: SubscriptionEvent
        switch (existed, after.deleted) {
        case (false, false): event = .create
        case (true, false): event = .update
        case (true, true): event = .delete
        case (false, true): return // a tombstone written over nothing live: nothing a query sees changed
        }
        records.append(RecordChange(databaseID: zone.databaseID, zone: zone, recordName: after.recordName,
                                    recordType: after.recordType, event: event, before: before, after: frame))
    }

    package var isEmpty: Bool { databaseIDs.isEmpty }

    package func sorted() -> [Int64] { databaseIDs.sorted() }
}
