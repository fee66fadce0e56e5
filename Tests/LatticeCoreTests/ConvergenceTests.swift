import Testing
import LatticeCore

@Suite("Convergence")
struct ConvergenceTests {
    /// 3-5 replicas edit one zone and gossip deltas (`changes(since:)` against the receiver's version,
    /// whole states, and deltas computed for a third replica) over a network that reorders, duplicates and
    /// loses messages. After draining the network and syncing until quiet, every replica holds the same
    /// state and `fullState()` encodes to the same bytes everywhere.
    @Test("replicas converge under reordering, duplication and loss")
    func randomGossipConverges() {
        var coverage = Coverage()
        let runs = runCases("convergence", minimumChecks: 250, regressions: RegressionSeeds.convergence) { rng in
            var simulation = ZoneSimulation(replicaCount: rng.int(3 ... 5))
            try simulation.run(steps: rng.int(40 ... 120), &rng)
            try simulation.drain(&rng)
            try simulation.syncUntilQuiet(&rng)
            let states = simulation.replicas.map(\.state)
            let bytes = states.map(encoded)
            for (index, state) in states.enumerated().dropFirst() {
                try require(state == states[0], "replica \(index + 1) differs from replica 1 after sync:\n\(state)\n\(states[0])")
                try require(bytes[index] == bytes[0], "replica \(index + 1) encodes differently from replica 1")
            }
            // Converged replicas have nothing left to tell each other.
            try require(states.allSatisfy { $0.changes(since: states[0].version) == nil }, "changes after convergence")
            coverage.add(simulation.coverage)
            return 1
        }
        #expect(runs >= 250)
        for situation in ["create", "recreate", "delete", "edit", "failed edit leaves state unchanged", "delta sent",
                          "full state sent", "misaddressed delta sent", "duplicate delivery", "out-of-order delivery",
                          "message lost", "generation 2"] {
            #expect(coverage[situation] > 0, "simulation never produced: \(situation) (\(coverage))")
        }
    }

    /// Regression: a delta computed against replica B's version and delivered to replica C (which had not
    /// seen what B had) used to make C record every operation inside it in its version, so C claimed to
    /// hold operations the delta had left out, and `changes(since: C.version)` never sent them: C stayed
    /// without field `x` forever.
    @Test("a delta computed for another replica does not make the receiver skip operations")
    func misaddressedDelta() throws {
        var a = Replica(1, state: ZoneState(zoneID: Fixtures.zone))
        var b = Replica(2, state: ZoneState(zoneID: Fixtures.zone))
        var c = Replica(3, state: ZoneState(zoneID: Fixtures.zone))
        try a.state.create(recordName: "milk", recordType: "Item", clock: &a.clock)
        try a.state.update("milk", clock: &a.clock) { try $0.set("x", to: .int64(1), at: $1) }
        try b.state.merge(a.state.fullState())
        try a.state.update("milk", clock: &a.clock) { try $0.set("y", to: .int64(2), at: $1) }

        let forB = try #require(a.state.changes(since: b.state.version))
        #expect(forB.records.first?.fields.map(\.name) == ["y"], "the delta for B carries only y")
        try c.state.merge(forB) // misaddressed: C has seen nothing

        // Anti-entropy between A and C must still bring x to C.
        if let delta = a.state.changes(since: c.state.version) { try c.state.merge(delta) }
        #expect(c.state["milk"]?["x"] == .int64(1))
        #expect(c.state["milk"]?["y"] == .int64(2))
        #expect(c.state == a.state)
    }

    /// Regression (found by the zone delta law): an operation whose effect was superseded leaves no stamp
    /// in any record, only in the version. `changes(since:)` used to return nil when no record part was
    /// new, so that version never travelled, and "quiet" replicas kept different versions (unequal states,
    /// different `fullState()` bytes). A version-only delta must be sent.
    @Test("a version that no record carries still travels")
    func versionOnlyDelta() throws {
        var a = Replica(1, state: ZoneState(zoneID: Fixtures.zone))
        var b = Replica(2, state: ZoneState(zoneID: Fixtures.zone))
        var c = Replica(3, state: ZoneState(zoneID: Fixtures.zone))
        // Concurrent creates of one record on equal clock values: B's wins (greater replica id).
        try a.state.create(recordName: "milk", recordType: "Item", clock: &a.clock)
        try b.state.create(recordName: "milk", recordType: "Task", clock: &b.clock)
        try a.state.merge(b.state.fullState())
        try c.state.merge(b.state.fullState())
        #expect(a.state.records == c.state.records, "same records...")
        #expect(a.state.version != c.state.version, "...but A also reflects its own superseded create")

        let delta = try #require(a.state.changes(since: c.state.version), "a version-only delta must be sent")
        #expect(delta.records.isEmpty)
        try c.state.merge(delta)
        #expect(c.state == a.state)
        #expect(encoded(c.state) == encoded(a.state))
        #expect(a.state.changes(since: c.state.version) == nil)
    }

    @Test("merging a delta for another zone is refused")
    func wrongZone() throws {
        var clock = Fixtures.clock(1, time: ManualTime())
        var zone = ZoneState(zoneID: Fixtures.zone)
        var other = ZoneState(zoneID: Fixtures.otherZone)
        try other.create(recordName: "milk", recordType: "Item", clock: &clock)
        #expect(throws: ZoneError.wrongZone(expected: Fixtures.zone, got: Fixtures.otherZone)) {
            try zone.merge(other.fullState())
        }
        #expect(zone == ZoneState(zoneID: Fixtures.zone))
    }
}
