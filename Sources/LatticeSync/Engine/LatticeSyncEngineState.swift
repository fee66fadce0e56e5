import Foundation
import LatticeCore
import Synchronization

extension LatticeSyncEngine {
    /// What the engine knows between launches, as `CKSyncEngine.State`: the pending changes the app queued
    /// and the sync state (change tokens, this device's replica id and clock). The app saves its
    /// `Serialization` on every `stateUpdate` event and gives it back at the next launch.
    ///
    /// Each time a change is queued, the device's hybrid logical clock stamps it, and every edit the app made
    /// to the record (in its `LatticeRecord`) before that counts from that stamp in a merge: an edit queued
    /// offline at 10:00 loses to one queued elsewhere at 10:05, whatever order they reach the server in.
    /// Edits made in an earlier run of the app, or made after the change was last queued (a record built
    /// afresh when the batch is asked for), count from the last time it was queued. Queueing the same change
    /// again also gives it a new edit number (`editNumber(of:)`), so a send tells which edits it covered.
    public final class State: Sendable {
        /// The sync state in a form the app persists (`Codable`), opaque to it, as
        /// `CKSyncEngine.State.Serialization`.
        public struct Serialization: Codable, Sendable, Hashable {
            var stored: Stored
        }

        /// The most times one change's queueings are remembered (older edits take the time of a later one).
        static let maximumMarks = 64

        /// `storage` holds every mutable member.
        private let storage: Mutex<Stored>
        private let now: @Sendable () -> UInt64
        /// Told when the app changes the pending changes (the engine schedules a send, and a state update).
        private let onChange: Mutex<(@Sendable () -> Void)?> = Mutex(nil)

        init(_ serialization: Serialization?, now: @escaping @Sendable () -> UInt64) {
            var stored = serialization?.stored ?? Stored()
            if stored.replicaID == 0 {
                var random = SystemRandomNumberGenerator()
                stored.replicaID = random.next() | 1
            }
            storage = Mutex(stored)
            self.now = now
        }

        func setOnChange(_ handler: (@Sendable () -> Void)?) { onChange.withLock { $0 = handler } }

        private func changed() { onChange.withLock { $0 }?() }

        // MARK: Pending changes (the app's side, as CKSyncEngine.State)

        /// The record changes waiting to be sent, oldest first.
        public var pendingRecordZoneChanges: [PendingRecordZoneChange] {
            storage.withLock { $0.pendingRecords.map(\.change) }
        }

        /// The first `count` record changes waiting to be sent, oldest first: what a delegate needs for a
        /// batch (`RecordZoneChangeBatch` takes at most `maximumRecords`), without a copy of a long queue
        /// for every batch. (CKSyncEngine has only the whole list.)
        public func pendingRecordZoneChanges(first count: Int) -> [PendingRecordZoneChange] {
            storage.withLock { $0.pendingRecords.prefix(max(count, 0)).map(\.change) }
        }

        /// The zone changes waiting to be sent, oldest first.
        public var pendingDatabaseChanges: [PendingDatabaseChange] {
            storage.withLock { $0.pendingZones }
        }

        /// Queues record changes. A save and a delete of the same record replace each other (the later one
        /// stays); adding a change that is already queued moves it to its new edit.
        public func add(pendingRecordZoneChanges changes: [PendingRecordZoneChange]) {
            guard !changes.isEmpty else { return }
            storage.withLock { stored in
                var clock = stored.clock(now)
                // One pass over the queue, whatever the number of changes (an app may queue thousands at once).
                let ids = Set(changes.map(\.recordID))
                var earlierMarks: [LatticeRecord.ID: [EditMark]] = [:]
                stored.pendingRecords.removeAll { entry in
                    guard ids.contains(entry.change.recordID) else { return false }
                    earlierMarks[entry.change.recordID] = entry.marks
                    return true
                }
                var added: [LatticeRecord.ID: Int] = [:]
                for change in changes {
                    // The marks of a change queued before stay: each edit is stamped by the first mark after it.
                    var marks: [EditMark]
                    if let index = added[change.recordID] {
                        marks = stored.pendingRecords[index].marks
                        stored.pendingRecords.remove(at: index)
                        added = added.mapValues { $0 > index ? $0 - 1 : $0 }
                    } else {
                        marks = earlierMarks[change.recordID] ?? []
                    }
                    stored.nextEdit += 1
                    let stamp = clock.now().hlc.rawValue
                    marks.append(EditMark(moment: .now(), stamp: stamp))
                    if marks.count > Self.maximumMarks { marks.removeFirst(marks.count - Self.maximumMarks) }
                    added[change.recordID] = stored.pendingRecords.count
                    stored.pendingRecords.append(PendingEntry(change: change, edit: stored.nextEdit, stamp: stamp, marks: marks))
                }
                stored.clockLatest = clock.latest.rawValue
            }
            changed()
        }

        /// Takes record changes off the queue (the app no longer wants them sent).
        public func remove(pendingRecordZoneChanges changes: [PendingRecordZoneChange]) {
            guard !changes.isEmpty else { return }
            let removing = Set(changes)
            storage.withLock { $0.pendingRecords.removeAll { removing.contains($0.change) } }
            changed()
        }

        /// Queues zone changes (a save and a delete of the same zone replace each other).
        public func add(pendingDatabaseChanges changes: [PendingDatabaseChange]) {
            guard !changes.isEmpty else { return }
            storage.withLock { stored in
                for change in changes {
                    stored.pendingZones.removeAll { $0.zoneID == change.zoneID }
                    stored.pendingZones.append(change)
                }
            }
            changed()
        }

        public func remove(pendingDatabaseChanges changes: [PendingDatabaseChange]) {
            guard !changes.isEmpty else { return }
            let removing = Set(changes)
            storage.withLock { $0.pendingZones.removeAll { removing.contains($0) } }
            changed()
        }

        /// The number of the latest edit queued for a record (it grows with every `add`), nil when none
        /// waits. `Event.SentRecordZoneChanges.coveredEdits` says which edit a save covered: a larger
        /// number here means a later edit that still waits.
        public func editNumber(of recordID: LatticeRecord.ID) -> UInt64? {
            storage.withLock { stored in stored.pendingRecords.last { $0.change.recordID == recordID }?.edit }
        }

        /// This device's replica id: it signs every stamp of the edits sent from here.
        public var replicaID: ReplicaID { ReplicaID(storage.withLock { $0.replicaID }) }

        /// The state as it is now, for a program about to exit (a command-line tool): the `stateUpdate`
        /// events carry the same, but the one for a change queued just now may not have come yet.
        /// (CKSyncEngine has no such accessor.)
        public var currentSerialization: Serialization { Serialization(stored: storage.withLock { $0 }) }

        // MARK: The engine's side

        /// The serialization to hand to the app.
        var serialization: Serialization { currentSerialization }

        func read<T>(_ body: (Stored) -> T) -> T { storage.withLock { body($0) } }

        func update<T>(_ body: (inout Stored) throws -> T) rethrows -> T { try storage.withLock { try body(&$0) } }
    }

    /// One queued record change with its edit number and the clock value it was last queued at.
    struct PendingEntry: Codable, Hashable, Sendable {
        var change: PendingRecordZoneChange
        var edit: UInt64
        var stamp: UInt64
        /// Each time it was queued since it was last sent, oldest first.
        var marks: [EditMark] = []
    }

    /// A moment a change was queued, and the clock value it got.
    struct EditMark: Codable, Hashable, Sendable {
        var moment: EditMoment
        var stamp: UInt64
    }

    /// A zone's sync state.
    struct ZoneEntry: Codable, Hashable, Sendable {
        var zoneID: LatticeRecordZone.ID
        var token: String?
        /// Positions of this device's writes the server holds exactly as sent, since the last complete pull.
        var known: [[Int64]] = []
    }

    /// What a serialization holds (version 1).
    struct Stored: Codable, Hashable, Sendable {
        var version = 1
        var replicaID: UInt64 = 0
        var clockLatest: UInt64 = 0
        /// The account the state belongs to: its server and user record name (never its token).
        var accountServerURL: String?
        var accountUserRecordName: String?
        var databaseToken: String?
        var zones: [ZoneEntry] = []
        var pendingRecords: [PendingEntry] = []
        var pendingZones: [PendingDatabaseChange] = []
        var nextEdit: UInt64 = 0

        func clock(_ now: @escaping @Sendable () -> UInt64) -> HybridLogicalClock {
            HybridLogicalClock(replica: ReplicaID(replicaID), latest: HLC(rawValue: clockLatest), time: now)
        }

        func zone(_ id: LatticeRecordZone.ID) -> ZoneEntry? { zones.first { $0.zoneID == id } }

        /// The queued changes of these records. A batch is usually the first changes of the queue, so the
        /// scan stops once all are found.
        func pendingEntries(_ ids: Set<LatticeRecord.ID>) -> [LatticeRecord.ID: PendingEntry] {
            var found: [LatticeRecord.ID: PendingEntry] = [:]
            for entry in pendingRecords where ids.contains(entry.change.recordID) {
                found[entry.change.recordID] = entry
                if found.count == ids.count { break }
            }
            return found
        }

        /// Takes these records' changes off the queue unless queued again after edit number `edit` (the
        /// scan stops once all are found).
        mutating func removePending(_ ids: Set<LatticeRecord.ID>, editsUpTo edit: UInt64) {
            var seen = 0
            var removing: [Int] = []
            for (index, entry) in pendingRecords.enumerated() where ids.contains(entry.change.recordID) {
                if entry.edit <= edit { removing.append(index) }
                seen += 1
                if seen == ids.count { break }
            }
            guard !removing.isEmpty else { return }
            // The usual case, a batch of the first changes: one move of what stays, no copies.
            if removing.last == removing.count - 1 {
                pendingRecords.removeSubrange(0..<removing.count)
                return
            }
            var kept: [PendingEntry] = []
            kept.reserveCapacity(pendingRecords.count - removing.count)
            var next = 0
            for (index, entry) in pendingRecords.enumerated() {
                if next < removing.count && removing[next] == index { next += 1 } else { kept.append(entry) }
            }
            pendingRecords = kept
        }

        mutating func setZone(_ entry: ZoneEntry) {
            if let index = zones.firstIndex(where: { $0.zoneID == entry.zoneID }) { zones[index] = entry } else {
                zones.append(entry)
            }
        }

        /// Forgets everything of the account (tokens, zones, pending changes); keeps the replica id and clock.
        mutating func forgetAccountData() {
            databaseToken = nil
            zones = []
            pendingRecords = []
            pendingZones = []
        }
    }
}
