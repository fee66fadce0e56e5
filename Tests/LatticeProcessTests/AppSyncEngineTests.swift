import Foundation
import LatticeCore
import LatticeSync
import LatticeTestSupport
import Synchronization
import Testing

/// A notes app on `LatticeSyncEngine`'s public API, as an app developer would write it: it keeps its own
/// notes (each a `LatticeRecord`, its unsent edits included), queues changes, gives records when asked and
/// applies what the events bring.
final class NotesDevice: LatticeSyncEngineDelegate {
    struct Model {
        var notes: [LatticeRecord.ID: LatticeRecord] = [:]
        var events: [String] = []
        var serialization: LatticeSyncEngine.State.Serialization?
        var sent: [LatticeSyncEngine.Event.SentRecordZoneChanges] = []
        var batches: [UUID] = []
        var accountChanges: [LatticeSyncEngine.Event.AccountChange] = []
        var deletions: [LatticeSyncEngine.Event.FetchedRecordZoneChanges.Deletion] = []
        var provenance: [String: FieldProvenance] = [:]
        var zoneDeletions: [LatticeRecordZone.ID] = []
        /// Edits made from inside the record provider (a later edit while a batch is built).
        var editWhileBatching: (@Sendable (LatticeRecord.ID) -> Void)?
    }

    let model = Mutex(Model())
    let zone = LatticeRecordZone.ID(zoneName: "Notes")

    func handleEvent(_ event: LatticeSyncEngine.Event, syncEngine: LatticeSyncEngine) async {
        model.withLock { model in
            model.events.append(event.name)
            switch event {
            case .stateUpdate(let update): model.serialization = update.stateSerialization
            case .accountChange(let change):
                model.accountChanges.append(change)
                if case .signOut = change.changeType { model.notes = [:] }
            case .fetchedDatabaseChanges(let changes):
                model.zoneDeletions += changes.deletions.map(\.zoneID)
            case .fetchedRecordZoneChanges(let changes):
                for modification in changes.modifications {
                    let id = modification.record.recordID
                    let local = model.notes[id]
                    model.notes[id] = local.map { modification.record.replaying(editsOf: $0) } ?? modification.record
                    model.provenance.merge(modification.provenance) { $1 }
                }
                for deletion in changes.deletions {
                    model.notes[deletion.recordID] = nil
                    model.deletions.append(deletion)
                }
            case .sentRecordZoneChanges(let sent):
                model.sent.append(sent)
                for record in sent.savedRecords {
                    // A later edit (queued after the batch was asked for) stays as the app has it.
                    let covered = sent.coveredEdits[record.recordID] ?? 0
                    if (syncEngine.state.editNumber(of: record.recordID) ?? 0) <= covered { model.notes[record.recordID] = record }
                }
            default: break
            }
        }
        // Deleted notes are not sent again.
        let deleted = model.withLock { model in model.deletions.map(\.recordID) }
        let stale = syncEngine.state.pendingRecordZoneChanges.filter { change in
            if case .saveRecord(let id) = change { return deleted.contains(id) && model.withLock { $0.notes[id] == nil } }
            return false
        }
        syncEngine.state.remove(pendingRecordZoneChanges: stale)
    }

    func nextRecordZoneChangeBatch(_ context: LatticeSyncEngine.SendChangesContext,
                                   syncEngine: LatticeSyncEngine) async -> LatticeSyncEngine.RecordZoneChangeBatch? {
        let pending = syncEngine.state.pendingRecordZoneChanges
        let batch = await LatticeSyncEngine.RecordZoneChangeBatch(pendingChanges: pending) { id in
            let record = self.model.withLock { $0.notes[id] }
            if let hook = self.model.withLock({ $0.editWhileBatching }) { hook(id) }
            return record
        }
        if let batch { model.withLock { $0.batches.append(batch.batchID) } }
        return batch
    }

    // MARK: What the app does

    func edit(_ engine: LatticeSyncEngine, _ name: String, _ change: (inout LatticeRecord) -> Void) {
        let id = LatticeRecord.ID(recordName: name, zoneID: zone)
        model.withLock { model in
            var record = model.notes[id] ?? LatticeRecord(recordType: "Note", recordID: id)
            change(&record)
            model.notes[id] = record
        }
        engine.state.add(pendingRecordZoneChanges: [.saveRecord(id)])
    }

    func delete(_ engine: LatticeSyncEngine, _ name: String) {
        let id = LatticeRecord.ID(recordName: name, zoneID: zone)
        model.withLock { $0.notes[id] = nil }
        engine.state.add(pendingRecordZoneChanges: [.deleteRecord(id)])
    }

    /// The notes as plain values, for comparing devices.
    var snapshot: [String: String] {
        model.withLock { model in
            var result: [String: String] = [:]
            for (id, record) in model.notes {
                result[id.recordName] = record.allKeys().map { "\($0)=\(record.fieldValue($0).map { "\($0)" } ?? "-")" }
                    .joined(separator: ";")
            }
            return result
        }
    }

    var events: [String] { model.withLock { $0.events } }
    func clearEvents() { model.withLock { $0.events = [] } }
}

@Suite(.serialized) struct AppSyncEngineTests {
    /// A server, an account, and engines for devices of that account.
    final class World {
        let server: ServerUnderTest
        let account: Account
        let url: String

        init() async throws {
            server = try ServerUnderTest(data: temporaryDirectory("app-engine"))
            url = "http://127.0.0.1:\(server.port)"
            account = try await AccountClient(serverURL: url).signUp(name: "nora")
        }

        func device(state: LatticeSyncEngine.State.Serialization? = nil, account: Account? = nil,
                    provenance: Bool = false) -> (NotesDevice, LatticeSyncEngine) {
            let device = NotesDevice()
            var configuration = LatticeSyncEngine.Configuration(database: .private, account: account ?? self.account,
                                                                stateSerialization: state, delegate: device)
            configuration.automaticallySync = false
            configuration.includesFieldProvenance = provenance
            configuration.requestTimeout = 10
            return (device, LatticeSyncEngine(configuration))
        }

        deinit { server.kill(SIGTERM) }
    }

    /// Makes the zone from the first device.
    static func makeZone(_ engine: LatticeSyncEngine, _ device: NotesDevice) async throws {
        engine.state.add(pendingDatabaseChanges: [.saveZone(LatticeRecordZone(zoneID: device.zone))])
        try await engine.sendChanges()
    }

    @Test func randomConcurrentEditsOnThreeDevicesConverge() async throws {
        let world = try await World()
        let seed = RandomSeed.current
        print("AppSyncEngineTests.randomConcurrentEditsOnThreeDevicesConverge seed=\(seed) (LATTICE_SEED=\(seed) replays it)")
        var random = SplitMix64(seed: seed)
        let devices = (0..<3).map { _ in world.device() }
        try await Self.makeZone(devices[0].1, devices[0].0)
        let names = (0..<8).map { "note\($0)" }
        for round in 0..<12 {
            for _ in 0..<6 {
                let (device, engine) = devices[Int(random.next() % 3)]
                let name = names[Int(random.next() % UInt64(names.count))]
                switch random.next() % 10 {
                case 0...3: device.edit(engine, name) { $0["title"] = "t\(random.next() % 5)" }
                case 4...5: device.edit(engine, name) { $0["pinned"] = random.next() % 2 == 0 }
                case 6...7:
                    let tag = "tag\(random.next() % 4)"
                    device.edit(engine, name) { $0.insert([tag], intoSetForKey: "tags") }
                case 8: device.edit(engine, name) { $0.remove(["tag\(random.next() % 4)"], fromListForKey: "tags") }
                default: device.delete(engine, name)
                }
            }
            // Each device sends or fetches, or both, in a random order.
            for index in (0..<3).shuffled(using: &random) {
                let (_, engine) = devices[index]
                if random.next() % 2 == 0 { try await engine.sendChanges() }
                if random.next() % 2 == 0 { try await engine.fetchChanges() }
            }
            _ = round
        }
        for (_, engine) in devices { try await engine.sendChanges() }
        for (_, engine) in devices { try await engine.fetchChanges() }
        let snapshots = devices.map(\.0.snapshot)
        #expect(snapshots[0] == snapshots[1] && snapshots[1] == snapshots[2], "seed \(seed): \(snapshots)")
        #expect(!snapshots[0].isEmpty, "seed \(seed): some notes survive")
        for (_, engine) in devices { #expect(engine.state.pendingRecordZoneChanges.isEmpty, "seed \(seed)") }
    }

    @Test func concurrentEditsOfOneRecordMergeByEditTimeWithoutAConflict() async throws {
        let world = try await World()
        let (laptop, a) = world.device(provenance: true)
        let (phone, b) = world.device(provenance: true)
        try await Self.makeZone(a, laptop)
        laptop.edit(a, "n") { $0["title"] = "Groceries"; $0["body"] = "milk" }
        try await a.sendChanges()
        try await b.fetchChanges()
        // Offline on both: the phone edits the title first, the laptop later, then the phone edits the body
        // (its change queued again); the laptop's arrives first. Each edit counts from when it was queued.
        phone.edit(b, "n") { $0["title"] = "Shopping" }
        try await Task.sleep(for: .milliseconds(5))
        laptop.edit(a, "n") { $0["title"] = "Weekly groceries"; $0.insert(["food"], intoSetForKey: "tags") }
        try await Task.sleep(for: .milliseconds(5))
        phone.edit(b, "n") { $0["body"] = "oat milk"; $0.insert(["errand"], intoSetForKey: "tags") }
        try await a.sendChanges()
        try await b.sendChanges()
        let sentByPhone = try #require(phone.model.withLock { $0.sent.last })
        #expect(sentByPhone.failedRecordSaves.isEmpty, "no serverRecordChanged: \(sentByPhone.failedRecordSaves.map(\.error))")
        try await a.fetchChanges()
        try await b.fetchChanges()
        #expect(laptop.snapshot == phone.snapshot)
        let note = try #require(phone.model.withLock { $0.notes[.init(recordName: "n", zoneID: phone.zone)] })
        #expect(note["title"] as String? == "Weekly groceries", "the later edit wins, though it arrived first")
        #expect(note["body"] as String? == "oat milk")
        #expect(note["tags"] as [String]? == ["errand", "food"])
        // Provenance: the title was won by the laptop's replica.
        guard case .register(let stamp)? = phone.model.withLock({ $0.provenance["title"] }) else {
            Issue.record("no provenance for title")
            return
        }
        #expect(stamp.replica == a.state.replicaID)
    }

    /// A text field edited on two devices offline (one by a splice, one by setting the whole text) keeps both
    /// edits; an ordered list keeps its order and repeats; the edits survive an archive round trip.
    @Test func textAndOrderedListsMergeAcrossDevices() async throws {
        let world = try await World()
        let (laptop, a) = world.device()
        let (phone, b) = world.device()
        try await Self.makeZone(a, laptop)
        laptop.edit(a, "n") { $0.setText("Milk.\nEggs.\nBread.", forKey: "body"); $0["steps"] = [3, 1, 3, 2] as [Int64] }
        try await a.sendChanges()
        try await b.fetchChanges()
        let id = LatticeRecord.ID(recordName: "n", zoneID: phone.zone)
        #expect(phone.model.withLock { $0.notes[id]?["steps"] as [Int64]? } == [3, 1, 3, 2])

        // Offline: the laptop splices "Oat " into the first line, the phone rewrites the last line and moves
        // a step by delete + insert.
        var failure: (any Error)?
        laptop.edit(a, "n") { record in
            do { try record.spliceText(forKey: "body", at: 0, deleting: 0, inserting: "Oat ") } catch { failure = error }
        }
        phone.edit(b, "n") { record in
            record.setText("Milk.\nEggs.\nRye bread.", forKey: "body")
            do {
                try record.splice(listForKey: "steps", at: 0, deleting: 1, inserting: [] as [Int64])
                try record.splice(listForKey: "steps", at: 3, deleting: 0, inserting: [3] as [Int64])
            } catch { failure = error }
        }
        #expect(failure == nil, "\(String(describing: failure))")
        // A splice past the end is refused before it is queued.
        laptop.edit(a, "n") { record in
            #expect(throws: LatticeSyncError.self) { try record.spliceText(forKey: "body", at: 99, deleting: 0, inserting: "x") }
        }
        // The phone's queued edits survive an archive round trip (an app that persists its records).
        try phone.model.withLock { model in
            let record = try #require(model.notes[id])
            model.notes[id] = try LatticeRecord(archive: record.encodeWithEdits())
        }
        try await a.sendChanges()
        try await b.sendChanges()
        try await a.fetchChanges()
        try await b.fetchChanges()
        #expect(laptop.snapshot == phone.snapshot)
        let note = try #require(laptop.model.withLock { $0.notes[.init(recordName: "n", zoneID: laptop.zone)] })
        #expect(note.fieldValue("body") == .text("Oat Milk.\nEggs.\nRye bread."))
        #expect(note["steps"] as [Int64]? == [1, 3, 2, 3])
    }

    @Test func theStrictSavePolicyReportsServerRecordChanged() async throws {
        let world = try await World()
        let (laptop, a) = world.device()
        let (phone, b) = world.device()
        try await Self.makeZone(a, laptop)
        laptop.edit(a, "n") { $0["title"] = "one" }
        try await a.sendChanges()
        try await b.fetchChanges()
        laptop.edit(a, "n") { $0["title"] = "two" }
        try await a.sendChanges()
        // The phone's copy carries the old change tag.
        phone.edit(b, "n") { $0["title"] = "three" }
        let id = LatticeRecord.ID(recordName: "n", zoneID: phone.zone)
        let record = try #require(phone.model.withLock { $0.notes[id] })
        final class Strict: LatticeSyncEngineDelegate {
            let record: LatticeRecord
            let sent = Mutex<[LatticeSyncEngine.Event.SentRecordZoneChanges]>([])
            init(_ record: LatticeRecord) { self.record = record }
            func handleEvent(_ event: LatticeSyncEngine.Event, syncEngine: LatticeSyncEngine) async {
                if case .sentRecordZoneChanges(let s) = event { sent.withLock { $0.append(s) } }
            }
            func nextRecordZoneChangeBatch(_ context: LatticeSyncEngine.SendChangesContext,
                                           syncEngine: LatticeSyncEngine) async -> LatticeSyncEngine.RecordZoneChangeBatch? {
                guard sent.withLock({ $0.isEmpty }) else { return nil }
                var batch = LatticeSyncEngine.RecordZoneChangeBatch(recordsToSave: [record])
                batch.savePolicy = .ifServerRecordUnchanged
                return batch
            }
        }
        let strict = Strict(record)
        var configuration = LatticeSyncEngine.Configuration(database: .private, account: world.account,
                                                            stateSerialization: phone.model.withLock { $0.serialization },
                                                            delegate: strict)
        configuration.automaticallySync = false
        let engine = LatticeSyncEngine(configuration)
        try await engine.sendChanges()
        let answer = try #require(strict.sent.withLock { $0.first })
        let failure = try #require(answer.failedRecordSaves.first, "saved: \(answer.savedRecords)")
        #expect(failure.error.code == .serverRecordChanged, "\(failure.error)")
        _ = b
    }

    @Test func stateSerializationSurvivesARestartWithPendingChanges() async throws {
        let world = try await World()
        var saved: LatticeSyncEngine.State.Serialization?
        let (laptop, a) = world.device()
        try await Self.makeZone(a, laptop)
        try await a.fetchChanges()
        laptop.clearEvents()
        laptop.edit(a, "kept") { $0["title"] = "made before the restart" }
        // The app saves the state at each stateUpdate; the one after the edit holds it.
        let deadline = ContinuousClock.now + .seconds(5)
        while !laptop.events.contains("stateUpdate") && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        saved = laptop.model.withLock { $0.serialization }
        let encoded = try JSONEncoder().encode(try #require(saved))
        let notes = laptop.model.withLock { $0.notes }
        // The process ends; the app saved its notes and the serialization, and starts again.
        let restored = try JSONDecoder().decode(LatticeSyncEngine.State.Serialization.self, from: encoded)
        let (again, b) = world.device(state: restored)
        again.model.withLock { $0.notes = notes }
        #expect(b.state.pendingRecordZoneChanges == [.saveRecord(.init(recordName: "kept", zoneID: again.zone))])
        #expect(b.state.replicaID == a.state.replicaID, "the same device")
        #expect(b.state.pendingRecordZoneChanges(first: 400) == b.state.pendingRecordZoneChanges)
        #expect(b.state.pendingRecordZoneChanges(first: 0).isEmpty && b.state.pendingRecordZoneChanges(first: -1).isEmpty)
        try await b.sendChanges()
        #expect(b.state.pendingRecordZoneChanges.isEmpty)
        let (other, c) = world.device()
        try await c.fetchChanges()
        #expect(other.snapshot["kept"] == "title=string(\"made before the restart\")" || other.snapshot["kept"]?.contains("made before") == true,
                "\(other.snapshot)")
        // The restarted engine fetches from its saved tokens: only what changed since.
        again.clearEvents()
        try await b.fetchChanges()
        #expect(!again.events.contains("fetchedRecordZoneChanges") || again.model.withLock { $0.notes.count } == 1)
    }

    @Test func unsentEditsArchivedWithTheirMomentsAreStampedAsPreciselyAfterARestart() async throws {
        let world = try await World()
        let (laptop, a) = world.device()
        let (phone, b) = world.device()
        try await Self.makeZone(a, laptop)
        laptop.edit(a, "n") { $0["title"] = "one"; $0["body"] = "one" }
        try await a.sendChanges()
        try await b.fetchChanges()
        // The laptop, offline: the title at 10:00; the phone's title at 10:05, sent; the laptop body at 10:10.
        laptop.edit(a, "n") { $0["title"] = "laptop title" }
        try await Task.sleep(for: .milliseconds(5))
        phone.edit(b, "n") { $0["title"] = "phone title" }
        try await b.sendChanges()
        try await Task.sleep(for: .milliseconds(5))
        laptop.clearEvents()
        laptop.edit(a, "n") { $0["body"] = "laptop body" }
        let deadline = ContinuousClock.now + .seconds(5)
        while !laptop.events.contains("stateUpdate") && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(5)) }
        // The app keeps the record with its unsent edits and the state, and starts again.
        let id = LatticeRecord.ID(recordName: "n", zoneID: laptop.zone)
        let archive = try #require(laptop.model.withLock { $0.notes[id] }).encodeWithEdits()
        let restoredRecord = try LatticeRecord(archive: archive)
        #expect(restoredRecord.changedKeys() == ["body", "title"] && restoredRecord["title"] as String? == "laptop title")
        let (again, c) = world.device(state: laptop.model.withLock { $0.serialization })
        again.model.withLock { $0.notes[id] = restoredRecord }
        try await c.sendChanges()
        try await b.fetchChanges()
        let sentAgain = again.model.withLock { $0.sent }
        #expect(sentAgain.flatMap(\.savedRecords).map(\.recordID) == [id], "saved: \(sentAgain.map(\.savedRecords)), failed: \(sentAgain.map(\.failedRecordSaves)), events \(again.events)")
        #expect(phone.snapshot["n"]?.contains("phone title") == true, "the phone's later title wins: \(phone.snapshot)")
        #expect(phone.snapshot["n"]?.contains("laptop body") == true, "\(phone.snapshot)")
        #expect(throws: LatticeSyncError.self) { try LatticeRecord(archive: Data("{}".utf8)) }
    }

    @Test func eventsComeInTheDocumentedOrder() async throws {
        let world = try await World()
        let (device, engine) = world.device()
        try await Self.makeZone(engine, device)
        #expect(Array(device.events.prefix(2)) == ["accountChange", "stateUpdate"], "\(device.events)")
        // The zone queued before the send made a state update of its own, soon after it was queued.
        #expect(Array(device.events.dropFirst(2).drop { $0 == "stateUpdate" })
                    == ["willSendChanges", "sentDatabaseChanges", "stateUpdate", "didSendChanges"], "\(device.events)")
        device.clearEvents()
        device.edit(engine, "a") { $0["title"] = "A" }
        device.edit(engine, "b") { $0["title"] = "B" }
        try await engine.sendChanges()
        let send = device.events
        // The queued changes' own state updates come when the actor is free (documented as soon after).
        #expect(send.filter { $0 != "stateUpdate" } == ["willSendChanges", "sentRecordZoneChanges", "didSendChanges"], "\(send)")
        #expect(send.suffix(2) == ["stateUpdate", "didSendChanges"], "the batch's state update before didSendChanges: \(send)")
        // Another device writes; this one fetches it (its own new records, held by the server exactly as
        // sent, are left out of the pull).
        let (other, second) = world.device()
        other.edit(second, "c") { $0["title"] = "C" }
        try await second.sendChanges()
        device.clearEvents()
        try await engine.fetchChanges()
        #expect(Set(device.snapshot.keys) == ["a", "b", "c"], "\(device.snapshot)")
        #expect(device.events == ["willFetchChanges", "fetchedDatabaseChanges", "stateUpdate", "willFetchRecordZoneChanges",
                                  "fetchedRecordZoneChanges", "stateUpdate", "didFetchRecordZoneChanges", "stateUpdate",
                                  "didFetchChanges"], "\(device.events)")
        device.clearEvents()
        try await engine.fetchChanges()
        #expect(device.events == ["willFetchChanges", "stateUpdate", "didFetchChanges"], "nothing changed: \(device.events)")
    }

    @Test func aSentBatchNamesItselfAndTheEditsItCovered() async throws {
        let world = try await World()
        let (device, engine) = world.device()
        try await Self.makeZone(engine, device)
        device.edit(engine, "a") { $0["title"] = "first" }
        let id = LatticeRecord.ID(recordName: "a", zoneID: device.zone)
        let firstEdit = try #require(engine.state.editNumber(of: id))
        // While the batch is built, the app edits the note again (as a person typing on).
        device.model.withLock { model in
            model.editWhileBatching = { [weak device, engine] id in
                device?.model.withLock { model in model.notes[id]?["title"] = "second" }
                engine.state.add(pendingRecordZoneChanges: [.saveRecord(id)])
            }
        }
        try await engine.sendChanges()
        device.model.withLock { $0.editWhileBatching = nil }
        let sent = device.model.withLock { $0.sent }
        let batches = device.model.withLock { $0.batches }
        #expect(sent.count >= 1 && sent.map(\.batchID) == Array(batches.prefix(sent.count)), "each event names its batch")
        let first = try #require(sent.first)
        #expect(first.coveredEdits[id] == firstEdit, "the batch covered the first edit")
        let later = try #require(engine.state.editNumber(of: id), "the later edit still waits")
        #expect(later > firstEdit)
        try await engine.sendChanges()
        #expect(engine.state.pendingRecordZoneChanges.isEmpty)
        let (other, reader) = world.device()
        try await reader.fetchChanges()
        #expect(other.snapshot["a"]?.contains("second") == true, "\(other.snapshot)")
    }

    @Test func signingOutDropsThePendingChangesAndSaysWhich() async throws {
        let world = try await World()
        let (device, engine) = world.device()
        try await Self.makeZone(engine, device)
        device.edit(engine, "unsent") { $0["title"] = "never sent" }
        try await engine.setAccount(nil)
        let change = try #require(device.model.withLock { $0.accountChanges.last })
        guard case .signOut(let previous) = change.changeType else {
            Issue.record("expected a sign-out: \(change.changeType)")
            return
        }
        #expect(previous == world.account.userRecordName)
        #expect(change.droppedPendingChanges == [.saveRecord(.init(recordName: "unsent", zoneID: device.zone))])
        #expect(engine.state.pendingRecordZoneChanges.isEmpty && engine.state.pendingDatabaseChanges.isEmpty)
        await #expect(throws: LatticeSyncError.self) { try await engine.fetchChanges() }
        // Another account on the same device starts clean and is told as a sign-in.
        let other = try await AccountClient(serverURL: world.url).signUp(name: "otto")
        try await engine.setAccount(other)
        guard case .signIn(let current)? = device.model.withLock({ $0.accountChanges.last?.changeType }) else {
            Issue.record("expected a sign-in")
            return
        }
        #expect(current == other.userRecordName)
        // A state saved for one account, given with another, is a switch.
        let saved = device.model.withLock { $0.serialization }
        let (switched, third) = world.device(state: saved, account: world.account)
        try await third.fetchChanges()
        guard case .switchAccounts(let from, let to)? = switched.model.withLock({ $0.accountChanges.first?.changeType }) else {
            Issue.record("expected a switch")
            return
        }
        #expect(from == other.userRecordName && to == world.account.userRecordName)
    }

    @Test func offlineTheErrorIsNetworkUnavailableAndChangesStay() async throws {
        let world = try await World()
        let (device, engine) = world.device()
        try await Self.makeZone(engine, device)
        device.edit(engine, "a") { $0["title"] = "offline" }
        world.server.kill(SIGKILL)
        do {
            try await engine.sendChanges()
            Issue.record("a send with the server gone succeeded")
        } catch let error as LatticeSyncError {
            #expect(error.code == .networkUnavailable, "\(error)")
        }
        #expect(engine.state.pendingRecordZoneChanges.count == 1)
        #expect(device.events.last == "didSendChanges", "a failed send still ends with its did event: \(device.events)")
    }

    @Test func automaticSyncFetchesWhenTheServerSaysAndSendsWhatIsQueued() async throws {
        let world = try await World()
        let (laptop, a) = world.device()
        try await Self.makeZone(a, laptop)
        let phone = NotesDevice()
        var configuration = LatticeSyncEngine.Configuration(database: .private, account: world.account,
                                                            stateSerialization: nil, delegate: phone)
        configuration.requestTimeout = 10
        let b = LatticeSyncEngine(configuration) // automaticallySync: the default
        func eventually(_ what: String, _ condition: () async throws -> Bool) async throws {
            let deadline = ContinuousClock.now + .seconds(20)
            while try await !condition() {
                guard ContinuousClock.now < deadline else { throw HarnessError("not within 20 s: \(what)") }
                try await Task.sleep(for: .milliseconds(50))
            }
        }
        try await eventually("the phone's first fetch") { phone.events.contains("didFetchChanges") }
        laptop.edit(a, "n") { $0["title"] = "from the laptop" }
        try await a.sendChanges()
        try await eventually("the laptop's note on the phone, from the parked changes/wait") {
            phone.snapshot["n"]?.contains("from the laptop") == true
        }
        phone.edit(b, "m") { $0["title"] = "from the phone" }
        try await eventually("the phone's note sent by itself") { b.state.pendingRecordZoneChanges.isEmpty }
        try await a.fetchChanges()
        #expect(laptop.snapshot["m"]?.contains("from the phone") == true, "\(laptop.snapshot)")
        await b.cancelOperations()
    }

    /// A device waiting for the server (`waitForServerChanges`) holds the account's push stream: a change sent
    /// by another device (its own token) ends the wait; the engine made its push token and a database
    /// subscription of each database on first use, and the stream went through `GET /push/{token}`.
    @Test func aWaitEndsOnThePushStreamWhenAnotherDeviceSends() async throws {
        let world = try await World()
        let (laptop, a) = world.device()
        try await Self.makeZone(a, laptop)
        try await a.fetchChanges()
        let client = try AccountClient(serverURL: world.url)
        let issued = try await client.call("private", "tokens/issue", .object([:]), as: world.account)
        let phoneAccount = try await client.signIn(token: try #require(issued["token"]?.stringValue))
        let (phone, b) = world.device(account: phoneAccount)
        try await b.fetchChanges()
        // The first wait sets the stream up; with nothing new it times out.
        #expect(try await LatticeSyncEngine.waitForServerChanges(of: [a], timeoutSeconds: 1) == false)
        let waiting = Task { try await LatticeSyncEngine.waitForServerChanges(of: [a], timeoutSeconds: 30) }
        try await Task.sleep(for: .milliseconds(500))
        let sent = ContinuousClock.now
        phone.edit(b, "n") { $0["title"] = "from the phone" }
        try await b.sendChanges()
        #expect(try await waiting.value == true)
        #expect(ContinuousClock.now - sent < .seconds(10))
        let subscriptions = try await client.call("private", "subscriptions/list", .object([:]), as: world.account)
        #expect(subscriptions["subscriptions"]?.arrayValue?.contains { $0["subscriptionID"] == .string("lattice.sync.private") }
                == true, "\(subscriptions.serialized())")
        try await a.fetchChanges()
        #expect(laptop.snapshot["n"]?.contains("from the phone") == true)
        // The waits parked on the stream, not on changes/wait: every changes/wait was the 0 s check, and the
        // stream's access-log line is written when it ends (the server stops here).
        world.server.kill(SIGTERM)
        let log = world.server.standardError
        #expect(log.contains("GET /push/{token} 200"), "\(log.suffix(2000))")
        let waits = log.split(separator: "\n").filter { $0.contains("changes/wait 200") }
        #expect(!waits.isEmpty && waits.allSatisfy { line in
            line.split(separator: " ").first { $0.hasSuffix("ms") }.flatMap { Double($0.dropLast(2)) }.map { $0 < 200 } ?? false
        }, "\(waits)")
    }

    /// The owner's device makes the Notes zone with one note and shares the whole zone with a new user, gus,
    /// who accepts a link (`short`: the short one); gus's engine on the shared database has fetched it.
    struct SharedZone {
        let owner: NotesDevice, ownerEngine: LatticeSyncEngine
        let accepted: AccountClient.AcceptedShare
        let guest: NotesDevice, guestEngine: LatticeSyncEngine
        let client: AccountClient
        let zone: JSON
    }

    static func shareNotes(_ world: World, title: String, permission: String, short: Bool) async throws -> SharedZone {
        let (owner, a) = world.device()
        try await makeZone(a, owner)
        owner.edit(a, "n") { $0["title"] = title }
        try await a.sendChanges()
        let client = try AccountClient(serverURL: world.url)
        let zone: JSON = .object(["zoneName": .string("Notes")])
        _ = try await client.call("private", "shares/create", .object(["zoneID": zone, "publicPermission": .string(permission)]),
                            as: world.account)
        let urls = try await client.call("private", "shares/url", .object(["zoneID": zone]), as: world.account)
        let link = try #require(urls[short ? "shortURL" : "url"]?.stringValue)
        let account = try await client.signUp(name: "gus")
        let accepted = try await client.acceptShare(link, as: account)
        let guest = NotesDevice()
        var configuration = LatticeSyncEngine.Configuration(database: .shared, account: account, stateSerialization: nil,
                                                            delegate: guest)
        configuration.automaticallySync = false
        let engine = LatticeSyncEngine(configuration)
        try await engine.fetchChanges()
        return SharedZone(owner: owner, ownerEngine: a, accepted: accepted, guest: guest, guestEngine: engine, client: client,
                          zone: zone)
    }

    @Test func aSharedZoneIsAcceptedFetchedEditedAndItsEndArrivesAsAnEvent() async throws {
        let world = try await World()
        let shared = try await Self.shareNotes(world, title: "Shared note", permission: "readWrite", short: true)
        let (owner, a, accepted, device, client, zone) = (shared.owner, shared.ownerEngine, shared.accepted, shared.guest,
                                                          shared.client, shared.zone)
        #expect(accepted.permission == "readWrite" && accepted.ownerName == "nora" && accepted.rootRecordName == nil)
        let sharedEngine = shared.guestEngine
        let id = LatticeRecord.ID(recordName: "n", zoneID: accepted.zoneID)
        var record = try #require(device.model.withLock { $0.notes[id] }, "the shared note: \(device.snapshot)")
        #expect(record["title"] as String? == "Shared note")
        record["title"] = "Edited by gus"
        device.model.withLock { $0.notes[id] = record }
        sharedEngine.state.add(pendingRecordZoneChanges: [.saveRecord(id)])
        try await sharedEngine.sendChanges()
        try await a.fetchChanges()
        #expect(owner.snapshot["n"]?.contains("Edited by gus") == true, "\(owner.snapshot)")
        // The owner stops sharing: the guest hears the zone is gone.
        _ = try await client.call("private", "shares/delete", .object(["zoneID": zone]), as: world.account)
        device.clearEvents()
        try await sharedEngine.fetchChanges()
        #expect(device.events.contains("fetchedDatabaseChanges") || device.events.contains("didFetchRecordZoneChanges"), "\(device.events)")
        let gone = device.model.withLock { $0.zoneDeletions }
        #expect(gone.contains(accepted.zoneID), "the zone's end is an event: \(device.events)")
    }

    @Test func aReadOnlyParticipantsSaveFailsPerRecordAndADeletedZoneReachesTheOtherDevices() async throws {
        let world = try await World()
        let sharing = try await Self.shareNotes(world, title: "Read only for gus", permission: "readOnly", short: false)
        let (owner, a, accepted, device, shared) = (sharing.owner, sharing.ownerEngine, sharing.accepted, sharing.guest,
                                                    sharing.guestEngine)
        #expect(accepted.permission == "readOnly")
        let id = LatticeRecord.ID(recordName: "n", zoneID: accepted.zoneID)
        var record = try #require(device.model.withLock { $0.notes[id] })
        record["title"] = "gus was here"
        device.model.withLock { $0.notes[id] = record }
        shared.state.add(pendingRecordZoneChanges: [.saveRecord(id)])
        try await shared.sendChanges()
        let sent = try #require(device.model.withLock { $0.sent.last })
        #expect(sent.savedRecords.isEmpty)
        #expect(sent.failedRecordSaves.map(\.error.code) == [.permissionFailure], "\(sent.failedRecordSaves.map(\.error))")
        #expect(shared.state.pendingRecordZoneChanges.isEmpty, "a refused save is taken off the queue, as in CloudKit")
        // The owner deletes the zone from a second device's queue of database changes; the first device and
        // the participant hear of it.
        let (laptop, b) = world.device()
        try await b.fetchChanges()
        b.state.add(pendingDatabaseChanges: [.deleteZone(owner.zone)])
        try await b.sendChanges()
        let deleted = laptop.model.withLock { $0.events }
        #expect(deleted.contains("sentDatabaseChanges"), "\(deleted)")
        try await a.fetchChanges()
        #expect(owner.model.withLock { $0.zoneDeletions } == [owner.zone])
        try await shared.fetchChanges()
        #expect(device.model.withLock { $0.zoneDeletions }.contains(accepted.zoneID), "\(device.events)")
    }

    @Test func aSharedRootCarriesItsShareUntilTheShareIsDeleted() async throws {
        let world = try await World()
        let (owner, a) = world.device()
        try await Self.makeZone(a, owner)
        owner.edit(a, "list") { $0["title"] = "Groceries" }
        owner.edit(a, "item") { item in
            item["title"] = "Milk"
            item.parent = .init(recordID: .init(recordName: "list", zoneID: owner.zone))
        }
        try await a.sendChanges()
        let (laptop, b) = world.device()
        try await b.fetchChanges()
        let listID = LatticeRecord.ID(recordName: "list", zoneID: laptop.zone)
        #expect(laptop.model.withLock { $0.notes[listID] }?.share == nil)

        let client = try AccountClient(serverURL: world.url)
        let zone: JSON = .object(["zoneName": .string("Notes")])
        let made = try await client.call("private", "shares/create", .object(["zoneID": zone, "rootRecordName": .string("list")]),
                                   as: world.account)
        let shareName = try #require(made["shareRecordName"]?.stringValue)
        // The HTTP API shows it on the root, as CloudKit's record dictionary does.
        let looked = try await client.call("private", "records/lookup", .object([
            "zoneID": zone, "records": .array([.object(["recordName": .string("list")]), .object(["recordName": .string("item")])]),
        ]), as: world.account)
        #expect(looked["records"]?.arrayValue?.first?["share"]?["recordName"]?.stringValue == shareName, "\(looked)")
        #expect(looked["records"]?.arrayValue?.last?["share"] == nil)

        // Sharing changed the root: the next fetch gives it again, with its share; the child has none.
        try await b.fetchChanges()
        let list = try #require(laptop.model.withLock { $0.notes[listID] })
        #expect(list.share?.recordID == LatticeRecord.ID(recordName: shareName, zoneID: laptop.zone))
        #expect(laptop.model.withLock { $0.notes[.init(recordName: "item", zoneID: laptop.zone)] }?.share == nil)
        #expect(laptop.model.withLock { $0.notes[.init(recordName: shareName, zoneID: laptop.zone)] }?.recordType
                == LatticeRecord.shareRecordType)
        // Kept in the system fields.
        #expect(try LatticeRecord(systemFields: list.encodeSystemFields()).share == list.share)
        // The share's record changes again (a new title) and now comes after the root in the zone's log: a
        // new device still gets the root with its share (each page names the shares of its roots).
        _ = try await client.call("private", "shares/modify", .object([
            "zoneID": zone, "shareRecordName": .string(shareName), "title": .string("Groceries, shared"),
        ]), as: world.account)
        let (fresh, e) = world.device()
        try await e.fetchChanges()
        #expect(fresh.model.withLock { $0.notes[listID] }?.share == list.share)
        // And in the state: a device restarted from it still knows the share when the root changes again.
        let (restarted, c) = world.device(state: laptop.model.withLock { $0.serialization })
        owner.edit(a, "list") { $0["title"] = "Groceries for Sunday" }
        try await a.sendChanges()
        try await c.fetchChanges()
        #expect(restarted.model.withLock { $0.notes[listID] }?.share == list.share)

        _ = try await client.call("private", "shares/delete", .object(["zoneID": zone, "shareRecordName": .string(shareName)]),
                            as: world.account)
        try await b.fetchChanges()
        #expect(laptop.model.withLock { $0.notes[listID] }?.share == nil, "the deleted share is gone from the root")
        #expect(laptop.model.withLock { $0.notes[listID] }?["title"] as String? == "Groceries for Sunday")
    }

    @Test func cancelOperationsEndsAFetchAtOnce() async throws {
        let world = try await World()
        let (device, engine) = world.device()
        try await Self.makeZone(engine, device)
        // Stop the server without killing it: its requests hang until cancelled.
        kill(world.server.pid, SIGSTOP)
        defer { kill(world.server.pid, SIGCONT) }
        let fetch = Task { try await engine.fetchChanges() }
        try await Task.sleep(for: .milliseconds(300))
        let started = ContinuousClock.now
        await engine.cancelOperations()
        let result = await fetch.result
        #expect(ContinuousClock.now - started < .seconds(3), "cancelled at once")
        guard case .failure(let error as LatticeSyncError) = result else {
            Issue.record("the fetch did not fail: \(result)")
            return
        }
        #expect(error.code == .operationCancelled, "\(error)")
    }
}
