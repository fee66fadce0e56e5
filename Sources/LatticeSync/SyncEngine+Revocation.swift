import Foundation
import LatticeAPI
import LatticeCore

/// A hierarchy share this device lost while other shares of the same zone stay: the participant was
/// removed or left, the share was deleted, its `publicPermission` went back to none, or the owner deleted
/// its root. The sync dropped its records from the device.
public struct LostShare: Sendable, Hashable {
    public let database: String
    public let zone: String
    public let owner: String
    /// The share's root record (for a shared list, the list).
    public let rootRecordName: String
    public let shareRecordName: String?

    public init(database: String, zone: String, owner: String, rootRecordName: String, shareRecordName: String?) {
        self.database = database
        self.zone = zone
        self.owner = owner
        self.rootRecordName = rootRecordName
        self.shareRecordName = shareRecordName
    }
}

/// A local edit that was never sent and never will be: its record went out of this device's reach (a lost
/// share, a zone that went away, a record the owner moved out of a share).
public struct DroppedEdit: Sendable, Hashable {
    public let database: String
    public let zone: String
    public let owner: String
    public let recordName: String
    /// The root of the lost share the record was in, when the device could tell.
    public let rootRecordName: String?
    /// The unsent edit was the record's deletion.
    public let deletion: Bool

    public init(database: String, zone: String, owner: String, recordName: String, rootRecordName: String?, deletion: Bool) {
        self.database = database
        self.zone = zone
        self.owner = owner
        self.recordName = recordName
        self.rootRecordName = rootRecordName
        self.deletion = deletion
    }
}

/// What one page of a zone's feed took away from the device.
struct AccessLoss {
    var lostShares: [LostShare] = []
    var droppedEdits: [DroppedEdit] = []
}

// Revocation on the device. The server's hierarchy feed names a lost share once, in `lostShares`, and sends
// a deletion without CRDT state for each record the participant had from it. The device drops, before the
// page is applied, the share's records it holds: the root, every record whose parent chain reaches the root,
// and the share's `cloudkit.share` record, except records the same page brings whole (they are visible
// through another share). Unsent edits among them are dropped and reported, never sent.
extension SyncEngine {
    /// Drops what a page of the zone's feed takes out of reach, and reports the unsent edits that go with
    /// it. Runs inside the page's transaction, before its records are applied.
    func dropOutOfReach(_ page: ZonePage, zone: LocalZone, _ tx: LocalTransaction) throws -> AccessLoss {
        var loss = AccessLoss()
        let whole = Set(page.frames.map(\.recordName))
        var reported: Set<String> = []
        func dropped(_ local: LocalRecord, root: String?) {
            guard reported.insert(local.name).inserted else { return }
            loss.droppedEdits.append(DroppedEdit(zone, local, root: root))
        }
        let lost = page.lostShares.map { share in
            LostShare(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName,
                      rootRecordName: share.rootRecordName, shareRecordName: share.shareRecordName)
        }
        if !lost.isEmpty {
            let locals = try tx.records(zoneID: zone.id)
            let decoded = Dictionary(locals.compactMap { local in
                (try? RecordFrame(stored: local.frame).decoded()).map { (local.name, $0) }
            }, uniquingKeysWith: { first, _ in first })
            for share in lost {
                loss.lostShares.append(share)
                for local in locals where !whole.contains(local.name)
                    && Self.belongs(local.name, to: share, decoded) {
                    if local.dirty != 0 { dropped(local, root: share.rootRecordName) }
                    try tx.deleteRecord(zoneID: zone.id, name: local.name)
                }
            }
        }
        // Records that left what this device may see; applying the page drops them.
        for name in page.removed {
            guard let local = try tx.record(zoneID: zone.id, name: name), local.dirty != 0 else { continue }
            dropped(local, root: nil)
        }
        return loss
    }

    /// Whether a local record belongs to a lost share: its root, its share record, or a record whose parent
    /// chain (as this device has it) reaches the root.
    private static func belongs(_ name: String, to share: LostShare, _ records: [String: Record]) -> Bool {
        if name == share.rootRecordName || name == share.shareRecordName { return true }
        if let record = records[name], record.recordType == "cloudkit.share",
           record["rootRecordName"] == .string(share.rootRecordName) { return true }
        var current = name
        var seen: Set<String> = []
        while seen.insert(current).inserted && seen.count <= 1_000 {
            guard let parent = records[current]?.parent?.recordName else { return false }
            if parent == share.rootRecordName { return true }
            current = parent
        }
        return false
    }

    /// Adds a page's losses to the report and tells the caller.
    func note(_ loss: AccessLoss, in report: inout SyncReport) {
        for share in loss.lostShares where !report.lostShares.contains(share) {
            report.lostShares.append(share)
            onEvent(.shareLost(share))
        }
        for edit in loss.droppedEdits where !report.droppedEdits.contains(where: { $0.sameRecord(as: edit) }) {
            report.droppedEdits.append(edit)
            onEvent(.editDropped(edit))
        }
    }

    /// Pending deletions in zones that lost a share in this sync. A deleted record keeps no parent, so the
    /// device cannot tell which share it was in; the server can: a deletion of a record it no longer shows
    /// (`NOT_FOUND`) is dropped and reported instead of sent. Runs after the first fetch, before sending.
    func dropUnreachablePendingDeletions(_ report: inout SyncReport) throws {
        guard !report.lostShares.isEmpty, let account else { return }
        let client = try client(for: account)
        var checked: Set<Int64> = []
        for share in report.lostShares {
            guard let zone = try store.transaction({ try $0.zone(database: share.database, zoneName: share.zone,
                                                                  owner: share.owner) }),
                  checked.insert(zone.id).inserted else { continue }
            let deletions = try store.transaction { try $0.dirtyRecords() }.filter { local in
                local.zoneID == zone.id && (try? RecordFrame(stored: local.frame))?.isDeleted == true
            }
            var start = 0
            while start < deletions.count {
                let batch = Array(deletions[start..<min(start + 200, deletions.count)])
                start += batch.count
                let reply: JSON
                do {
                    let request = RecordsLookupRequest(
                        zoneID: WireZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName),
                        recordNames: batch.map(\.name))
                    reply = try client.call(zone.database, "records/lookup", request.json, token: account.token)
                } catch let error as ServerError where error.serverErrorCode == .zoneNotFound {
                    break // the whole zone went away; the next fetch removes it
                }
                let answers = reply["records"]?.arrayValue ?? []
                var loss = AccessLoss()
                try store.transaction { tx in
                    for (local, answer) in zip(batch, answers)
                    where answer["serverErrorCode"]?.stringValue == ServerErrorCode.notFound.rawValue {
                        try tx.deleteRecord(zoneID: zone.id, name: local.name)
                        loss.droppedEdits.append(DroppedEdit(zone, local, root: nil))
                    }
                }
                note(loss, in: &report)
            }
        }
    }

    /// Deletes a zone that went away (every share of a shared zone lost, or the zone deleted on the server)
    /// and reports the unsent edits that went with it. The caller reports the zone itself.
    func removeZone(_ zone: LocalZone, _ report: inout SyncReport) throws {
        let loss = try store.transaction { tx in
            let dirty = try tx.records(zoneID: zone.id).filter { $0.dirty != 0 }
            try tx.deleteZone(zone.id)
            return AccessLoss(droppedEdits: dirty.map { DroppedEdit(zone, $0, root: nil) })
        }
        note(loss, in: &report)
    }

    func removeZone(database: String, zoneName: String, owner: String, _ report: inout SyncReport) throws {
        guard let zone = try store.transaction({ try $0.zone(database: database, zoneName: zoneName, owner: owner) })
        else { return }
        try removeZone(zone, &report)
    }
}

extension DroppedEdit {
    init(_ zone: LocalZone, _ local: LocalRecord, root: String?) {
        self.init(database: zone.database, zone: zone.zoneName, owner: zone.ownerRecordName, recordName: local.name,
                  rootRecordName: root, deletion: (try? RecordFrame(stored: local.frame))?.isDeleted == true)
    }

    func sameRecord(as other: DroppedEdit) -> Bool {
        database == other.database && zone == other.zone && owner == other.owner && recordName == other.recordName
    }
}
