import Testing
import LatticeCore

/// Two replicas A (id 0xa) and B (id 0xb) with clocks on the same injected time.
private struct Pair {
    let time = ManualTime(Fixtures.epoch)
    var a: HybridLogicalClock
    var b: HybridLogicalClock
    var c: HybridLogicalClock
    init() {
        a = Fixtures.clock(0xA, time: time)
        b = Fixtures.clock(0xB, time: time)
        c = Fixtures.clock(0xC, time: time)
    }
}

private func both(_ x: Record, _ y: Record) -> (Record, Record) { (x.merging(y), y.merging(x)) }

@Suite("Record lifecycle: delete wins, recreate starts a generation")
struct RecordLifecycleTests {
    @Test("delete wins over a concurrent edit, in either merge order, even when the edit is stamped later")
    func deleteWinsOverConcurrentEdit() throws {
        var clocks = Pair()
        var base = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: clocks.a.now())
        try base.set("text", to: .string("Milk"), at: clocks.a.now())
        try base.add(.string("dairy"), to: "tags", at: clocks.a.now())
        try base.setParent(Fixtures.reference("groceries"), at: clocks.a.now())

        var deleted = base
        deleted.delete(at: clocks.a.now())
        clocks.time.advance(by: 5_000) // B's edits are stamped after the delete, but B has not seen it
        var edited = base
        try edited.set("text", to: .string("Oat milk"), at: clocks.b.now())
        try edited.add(.string("vegan"), to: "tags", at: clocks.b.now())
        try edited.remove(.string("dairy"), from: "tags", at: clocks.b.now())
        try edited.set("new", to: .int64(1), at: clocks.b.now())
        try edited.setParent(nil, at: clocks.b.now())
        #expect(edited.maximumHLC > deleted.deletion!.hlc)

        let (ab, ba) = both(deleted, edited)
        #expect(ab == ba)
        #expect(encoded(ab) == encoded(ba))
        #expect(ab.isDeleted && ab.generation == 1)
        #expect(ab.deletion == deleted.deletion)
        #expect(ab.fields.isEmpty && ab.parentRegister == nil && ab.values.isEmpty)
        #expect(ab["text"] == nil && ab.provenance(of: "text") == nil)
        #expect(ab == deleted)

        // Writes to a deleted record are refused until it is recreated.
        var tombstone = ab
        let error = #expect(throws: RecordError.self) { try tombstone.set("text", to: .string("x"), at: clocks.b.now()) }
        #expect(error?.code == .deleted)
        #expect(throws: RecordError.self) { try tombstone.add(.int64(1), to: "tags", at: clocks.b.now()) }
        #expect(throws: RecordError.self) { try tombstone.setParent(nil, at: clocks.b.now()) }
        #expect(tombstone == ab)
    }

    @Test("concurrent deletes keep the later deletion stamp")
    func concurrentDeletes() throws {
        var clocks = Pair()
        let base = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(Fixtures.epoch - 1_000, replica: 99))
        var x = base, y = base
        x.delete(at: clocks.a.now())
        y.delete(at: clocks.b.now())
        let (xy, yx) = both(x, y)
        #expect(xy == yx)
        #expect(xy.deletion == max(x.deletion!, y.deletion!))
        #expect(xy.deletion?.replica == ReplicaID(0xB), "equal clock values: the greater replica id is later")
    }

    @Test("recreate after observing the delete starts generation 2, which wins over generation-1 edits")
    func recreateWins() throws {
        var clocks = Pair()
        var base = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: clocks.a.now())
        try base.set("text", to: .string("Milk"), at: clocks.a.now())

        var a = base
        a.delete(at: clocks.a.now())
        var b = base
        clocks.time.advance(by: 60_000) // B's generation-1 edit is later than everything A does
        try b.set("text", to: .string("Oat milk"), at: clocks.b.now())
        try b.set("late", to: .int64(9), at: clocks.b.now())

        clocks.time.milliseconds = Fixtures.epoch + 10
        let recreatedAt = clocks.a.now()
        try a.recreate(recordType: "Task", at: recreatedAt)
        #expect(a.generation == 2 && !a.isDeleted && a.created == recreatedAt && a.recordType == "Task")
        #expect(a.fields.isEmpty && a.deletion == nil)
        #expect(recreatedAt.hlc < b.maximumHLC, "the generation-1 edit has the later stamp, yet must lose")

        // Edit after recreate works.
        try a.set("text", to: .string("Milk again"), at: clocks.a.now())
        try a.add(.string("fresh"), to: "tags", at: clocks.a.now())

        let (ab, ba) = both(a, b)
        #expect(ab == ba && ab == a)
        #expect(encoded(ab) == encoded(ba))
        #expect(ab.generation == 2 && ab["text"] == .string("Milk again") && ab["late"] == nil)
        #expect(ab["tags"] == .set(.string, [.string("fresh")]))

        // Generation-1 state arriving again, or a generation-1 tombstone, changes nothing.
        var replay = ab
        replay.merge(b)
        replay.merge(base)
        var tombstone = base
        tombstone.delete(at: clocks.b.now())
        replay.merge(tombstone)
        #expect(replay == ab)
    }

    @Test("concurrent recreates meet in generation 2: fields union, the type follows the later creation")
    func concurrentRecreates() throws {
        var clocks = Pair()
        var base = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: clocks.a.now())
        base.delete(at: clocks.a.now())
        var a = base, b = base
        try a.recreate(recordType: "Item", at: clocks.a.now())
        try a.set("x", to: .int64(1), at: clocks.a.now())
        clocks.time.advance(by: 1)
        try b.recreate(recordType: "Task", at: clocks.b.now())
        try b.set("y", to: .int64(2), at: clocks.b.now())
        let (ab, ba) = both(a, b)
        #expect(ab == ba)
        #expect(ab.generation == 2 && ab.recordType == "Task" && ab.created == b.created)
        #expect(ab["x"] == .int64(1) && ab["y"] == .int64(2))
    }

    @Test("on a zone: delete wins over an edit from another replica, and create on a tombstone recreates")
    func zoneLifecycle() throws {
        var a = Replica(1, state: ZoneState(zoneID: Fixtures.zone))
        var b = Replica(2, state: ZoneState(zoneID: Fixtures.zone))
        try a.state.create(recordName: "milk", recordType: "Item", clock: &a.clock)
        try b.state.merge(a.state.fullState())
        try a.state.delete("milk", clock: &a.clock)
        #expect(throws: ZoneError.recordNotFound("milk")) { try a.state.delete("milk", clock: &a.clock) }
        #expect(throws: ZoneError.recordNotFound("milk")) {
            try a.state.update("milk", clock: &a.clock) { try $0.set("x", to: nil, at: $1) }
        }
        try b.state.update("milk", clock: &b.clock) { try $0.set("text", to: .string("edit"), at: $1) }
        #expect(throws: ZoneError.recordExists("milk")) {
            try b.state.create(recordName: "milk", recordType: "Item", clock: &b.clock)
        }

        try a.state.merge(try #require(b.state.changes(since: a.state.version)))
        try b.state.merge(try #require(a.state.changes(since: b.state.version)))
        #expect(a.state == b.state)
        #expect(a.state["milk"]?.isDeleted == true && a.state.liveRecords.isEmpty)

        let recreated = try b.state.create(recordName: "milk", recordType: "Task", clock: &b.clock)
        #expect(recreated.generation == 2)
        try b.state.update("milk", clock: &b.clock) { try $0.set("text", to: .string("again"), at: $1) }
        try a.state.merge(try #require(b.state.changes(since: a.state.version)))
        #expect(a.state == b.state)
        #expect(a.state["milk"]?.generation == 2 && a.state["milk"]?["text"] == .string("again"))
    }
}

@Suite("Provenance")
struct ProvenanceTests {
    @Test("after merges, provenance names the winning replica and stamp")
    func registerProvenance() throws {
        var clocks = Pair()
        let base = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(Fixtures.epoch - 1_000, replica: 99))
        var a = base, b = base, c = base
        // Equal clock values on A and B: B (greater id) wins the tie.
        let stampA = clocks.a.now(), stampB = clocks.b.now()
        #expect(stampA.hlc == stampB.hlc && stampA < stampB)
        try a.set("text", to: .string("from A"), at: stampA)
        try b.set("text", to: .string("from B"), at: stampB)
        try c.set("other", to: .int64(1), at: clocks.c.now())
        for merged in [a.merging(b).merging(c), c.merging(b).merging(a), b.merging(c.merging(a))] {
            #expect(merged.provenance(of: "text") == .register(stampB))
            #expect(merged["text"] == .string("from B"))
            #expect(merged.provenance(of: "other")?.winner?.replica == ReplicaID(0xC))
            #expect(merged.provenance(of: "missing") == nil)
        }
        // A later clear wins and is its own provenance.
        var cleared = a.merging(b)
        let clearStamp = clocks.a.now()
        try cleared.set("text", to: nil, at: clearStamp)
        #expect(cleared.merging(b).provenance(of: "text") == .register(clearStamp))
        #expect(cleared.merging(b)["text"] == nil)
    }

    @Test("list provenance lists each element with the adds that keep it")
    func setProvenance() throws {
        var clocks = Pair()
        let base = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(Fixtures.epoch - 1_000, replica: 99))
        var a = base, b = base
        let addA = clocks.a.now(), addB = clocks.b.now()
        try a.add(.string("dairy"), to: "tags", at: addA)
        try b.add(.string("dairy"), to: "tags", at: addB)
        try b.add(.string("zzz"), to: "tags", at: clocks.b.now())
        let removeUnseen = clocks.b.now()
        try b.remove(.string("x"), from: "tags", at: removeUnseen)
        let merged = a.merging(b)
        let expected = FieldProvenance.set(elements: [(.string("dairy"), [addA, addB].sorted()), (.string("zzz"), [Stamp(hlc: addB.hlc + 1, replica: addB.replica)])],
                                           latestOperation: removeUnseen.hlc)
        #expect(merged.provenance(of: "tags") == expected)
        #expect(b.merging(a).provenance(of: "tags") == expected)
    }
}

private extension FieldProvenance {
    var winner: Stamp? { if case .register(let stamp) = self { return stamp } else { return nil } }
}

private extension HLC {
    static func + (hlc: HLC, n: UInt64) -> HLC { HLC(rawValue: hlc.rawValue + n) }
}
