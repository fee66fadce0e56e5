import Foundation
import LatticeCore
import LatticeSync
import Synchronization

/// One note as the app keeps it: its own values, and the record's archived system fields (the state the
/// engine last gave), which an edit is sent against.
struct Note: Codable, Sendable, Equatable {
    var id: String
    var title: String
    var body: String = ""
    var tags: [String] = []
    var pinned = false
    var systemFields: Data?
}

/// The app's data: notes, the engine's saved state, and the account (its token apart, in `token`).
struct Saved: Codable, Sendable {
    struct SavedAccount: Codable, Sendable {
        var serverURL: String
        var userRecordName: String
        var name: String
    }

    var account: SavedAccount?
    var state: LatticeSyncEngine.State.Serialization?
    var notes: [String: Note] = [:]
}

/// The notes app's side of the engine: it keeps the notes in `notes.json` in its home directory, gives the
/// engine records to send, and applies what the engine fetched.
final class NotesStore: LatticeSyncEngineDelegate {
    static let zone = LatticeRecordZone.ID(zoneName: "Notes")
    static let recordType = "Note"

    let home: URL
    /// Every member of the app's data, saved to `notes.json` after each change.
    let saved: Mutex<Saved>

    init(home: String) throws {
        self.home = URL(fileURLWithPath: home)
        try FileManager.default.createDirectory(at: self.home, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let file = self.home.appendingPathComponent("notes.json")
        if let data = try? Data(contentsOf: file) {
            saved = Mutex(try JSONDecoder().decode(Saved.self, from: data))
        } else {
            saved = Mutex(Saved())
        }
    }

    /// Writes `notes.json` (atomically: a crash leaves the old file or the new one).
    func save() throws {
        let data = try saved.withLock { saved in
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            return try encoder.encode(saved)
        }
        try data.write(to: home.appendingPathComponent("notes.json"), options: .atomic)
    }

    // MARK: The token, kept apart from the data (owner-only file)

    var tokenFile: URL { home.appendingPathComponent("token") }

    func account() -> Account? {
        guard let savedAccount = saved.withLock({ $0.account }),
              let token = try? String(contentsOf: tokenFile, encoding: .utf8) else { return nil }
        return Account(serverURL: savedAccount.serverURL, token: token.trimmingCharacters(in: .whitespacesAndNewlines),
                       userRecordName: savedAccount.userRecordName, name: savedAccount.name)
    }

    func install(_ account: Account?) throws {
        saved.withLock { saved in
            saved.account = account.map { .init(serverURL: $0.serverURL, userRecordName: $0.userRecordName, name: $0.name) }
        }
        if let account {
            guard FileManager.default.createFile(atPath: tokenFile.path, contents: Data(account.token.utf8),
                                                 attributes: [.posixPermissions: 0o600]) else {
                throw CocoaError(.fileWriteUnknown, userInfo: [NSFilePathErrorKey: tokenFile.path])
            }
        } else {
            try? FileManager.default.removeItem(at: tokenFile)
        }
        try save()
    }

    // MARK: Records

    static func recordID(_ id: String) -> LatticeRecord.ID { LatticeRecord.ID(recordName: id, zoneID: zone) }

    /// The record to send for a note: its archived state with the app's values set on it. Values that did
    /// not change are no edit, so only what changed is sent.
    static func record(for note: Note) -> LatticeRecord {
        var record = note.systemFields.flatMap { try? LatticeRecord(systemFields: $0) }
            ?? LatticeRecord(recordType: recordType, recordID: recordID(note.id))
        record["title"] = note.title
        record["body"] = note.body
        record["tags"] = note.tags
        record["pinned"] = note.pinned
        return record
    }

    /// A note from a fetched record. With changes of its own still waiting, the note keeps what it changed
    /// since its archived state (a three-way merge, per field and per tag) and takes the rest.
    static func note(from record: LatticeRecord, local: Note?, pending: Bool) -> Note {
        var note = Note(id: record.recordID.recordName, title: record["title"] ?? "", body: record["body"] ?? "",
                        tags: record["tags"] ?? [], pinned: record["pinned"] ?? false,
                        systemFields: try? record.encodeSystemFields())
        guard pending, let local else { return note }
        let base = local.systemFields.flatMap { try? LatticeRecord(systemFields: $0) }
        if local.title != (base?["title"] ?? "") { note.title = local.title }
        if local.body != (base?["body"] ?? "") { note.body = local.body }
        if local.pinned != (base?["pinned"] ?? false) { note.pinned = local.pinned }
        let baseTags = Set(base?["tags"] ?? [String]())
        let added = Set(local.tags).subtracting(baseTags)
        let removed = baseTags.subtracting(local.tags)
        note.tags = Set(note.tags).union(added).subtracting(removed).sorted()
        return note
    }

    // MARK: LatticeSyncEngineDelegate

    func handleEvent(_ event: LatticeSyncEngine.Event, syncEngine: LatticeSyncEngine) async {
        switch event {
        case .stateUpdate(let update):
            saved.withLock { $0.state = update.stateSerialization }
        case .accountChange(let change):
            switch change.changeType {
            case .signIn: break
            case .signOut, .switchAccounts: saved.withLock { $0.notes = [:] } // the notes were the other account's
            }
        case .fetchedDatabaseChanges(let changes):
            if changes.deletions.contains(where: { $0.zoneID == Self.zone }) { saved.withLock { $0.notes = [:] } }
        case .fetchedRecordZoneChanges(let changes):
            let pending = Set(syncEngine.state.pendingRecordZoneChanges.map(\.recordID))
            saved.withLock { saved in
                for modification in changes.modifications where modification.record.recordType == Self.recordType {
                    let id = modification.record.recordID
                    saved.notes[id.recordName] = Self.note(from: modification.record, local: saved.notes[id.recordName],
                                                           pending: pending.contains(id))
                }
                for deletion in changes.deletions { saved.notes[deletion.recordID.recordName] = nil }
            }
            // A note deleted elsewhere is not sent again.
            syncEngine.state.remove(pendingRecordZoneChanges: changes.deletions.map { .saveRecord($0.recordID) })
        case .sentRecordZoneChanges(let sent):
            saved.withLock { saved in
                for record in sent.savedRecords {
                    saved.notes[record.recordID.recordName]?.systemFields = try? record.encodeSystemFields()
                }
            }
            for failure in sent.failedRecordSaves {
                FileHandle.standardError.write(Data("lattice-notes: \(failure.record.recordID.recordName) not saved: \(failure.error)\n".utf8))
                if failure.error.code == .zoneNotFound {
                    // The zone went away: make it again, and send the note again.
                    syncEngine.state.add(pendingDatabaseChanges: [.saveZone(LatticeRecordZone(zoneID: Self.zone))])
                    syncEngine.state.add(pendingRecordZoneChanges: [.saveRecord(failure.record.recordID)])
                }
            }
        default:
            return // will/did events change nothing to save
        }
        try? save()
    }

    func nextRecordZoneChangeBatch(_ context: LatticeSyncEngine.SendChangesContext,
                                   syncEngine: LatticeSyncEngine) async -> LatticeSyncEngine.RecordZoneChangeBatch? {
        let pending = syncEngine.state.pendingRecordZoneChanges.filter { $0.recordID.zoneID == Self.zone }
        return await LatticeSyncEngine.RecordZoneChangeBatch(pendingChanges: pending) { id in
            self.saved.withLock { $0.notes[id.recordName] }.map(Self.record(for:))
        }
    }
}
