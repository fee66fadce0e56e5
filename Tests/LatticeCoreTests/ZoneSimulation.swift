import LatticeCore

/// Several replicas of one zone, each with its own clock, editing records and exchanging deltas through
/// an unreliable network that delays, reorders, duplicates and drops messages.
struct ZoneSimulation {
    static let recordNames = ["milk", "eggs", "bread"]

    struct Message {
        var to: Int
        var delta: ZoneDelta
    }

    var replicas: [Replica<ZoneState>]
    var time = WorldTime()
    var network: [Message] = []
    var coverage = Coverage()
    /// Every state any replica passed through (for the zone merge laws).
    var snapshots: [ZoneState] = []
    /// If true, some messages carry a delta computed against a *third* replica's version (a relayed or
    /// misaddressed delta), whose `since` the receiver need not dominate.
    var misaddressedDeltas = true

    init(replicaCount: Int) {
        replicas = (1 ... UInt64(replicaCount)).map { Replica($0, state: ZoneState(zoneID: Fixtures.zone)) }
    }

    // MARK: Local operations

    /// One random local operation at replica `i`: create/recreate, edit, or delete a record.
    mutating func localOperation(at i: Int, _ rng: inout SplitMix64) throws {
        let name = rng.pick(Self.recordNames)
        var replica = replicas[i]
        defer { replicas[i] = replica; snapshots.append(replica.state) }
        guard let record = replica.state[name], !record.isDeleted else {
            // Absent or a tombstone: create it (a recreate starts the next generation).
            let recreating = replica.state[name] != nil
            let parent = rng.chance(30) ? Fixtures.reference(rng.pick(Self.recordNames.filter { $0 != name })) : nil
            try replica.state.create(recordName: name, recordType: rng.pick(["Item", "List"]), parent: parent,
                                     clock: &replica.clock)
            coverage.hit(recreating ? "recreate" : "create")
            if recreating { coverage.hit("generation \(replica.state[name]!.generation)") }
            return
        }
        if rng.chance(10) {
            try replica.state.delete(name, clock: &replica.clock)
            coverage.hit("delete")
            return
        }
        let before = replica.state
        do {
            try replica.state.update(name, clock: &replica.clock) { record, stamp in
                RecordWorld.edit(&record, at: stamp, &rng)
                // `edit` swallows kind mismatches; provoke a real failing edit now and then.
                if rng.chance(5) { try record.set("_bad", to: nil, at: stamp) }
            }
            coverage.hit("edit")
        } catch {
            // A failed edit must leave the state exactly as it was.
            try require(replica.state == before, "a failed update changed the zone: \(error)")
            coverage.hit("failed edit leaves state unchanged")
        }
    }

    // MARK: Messages

    /// Delivers `delta` to replica `to` as a real receiver does: the clock checks and observes the newest
    /// stamp (rejecting far-future input), then the delta is merged. Half of the deliveries take the wire
    /// path instead: the encoded bytes, validated against the receiver's frames, then joined byte-wise.
    mutating func deliver(_ delta: ZoneDelta, to: Int, _ rng: inout SplitMix64) throws {
        if rng.bool() {
            var replica = replicas[to]
            try replica.state.merge(encoded: BinaryCodec.encode(delta), clock: &replica.clock)
            replicas[to] = replica
            coverage.hit("delivered as bytes")
        } else {
            try replicas[to].clock.observe(delta.maximumHLC)
            try replicas[to].state.merge(delta)
        }
        snapshots.append(replicas[to].state)
    }

    /// Queues one message from a random sender to a random receiver.
    mutating func send(_ rng: inout SplitMix64) {
        let from = rng.int(0 ..< replicas.count)
        var to = rng.int(0 ..< replicas.count - 1)
        if to >= from { to += 1 }
        let sender = replicas[from].state
        let delta: ZoneDelta?
        switch rng.int(0 ..< 10) {
        case 0, 1:
            delta = sender.fullState()
            coverage.hit("full state sent")
        case 2 where misaddressedDeltas && replicas.count > 2:
            // Computed against some other replica's version, delivered to `to` anyway.
            let third = rng.pick(replicas.indices.filter { $0 != from && $0 != to })
            delta = sender.changes(since: replicas[third].state.version)
            coverage.hit("misaddressed delta sent", delta != nil)
        default:
            delta = sender.changes(since: replicas[to].state.version)
            coverage.hit("delta sent", delta != nil)
        }
        if let delta { network.append(Message(to: to, delta: delta)) }
    }

    /// Delivers a random in-flight message; sometimes it stays in flight and arrives again later.
    mutating func deliverOne(_ rng: inout SplitMix64) throws {
        guard !network.isEmpty else { return }
        let index = rng.int(0 ..< network.count)
        let message = network[index]
        if rng.chance(25) {
            coverage.hit("duplicate delivery")
        } else {
            network.remove(at: index)
        }
        coverage.hit("out-of-order delivery", index != 0)
        try deliver(message.delta, to: message.to, &rng)
    }

    /// Random operations, sends, deliveries, drops and clock ticks.
    mutating func run(steps: Int, _ rng: inout SplitMix64) throws {
        for _ in 0 ..< steps {
            time.tick(&rng, replicas)
            switch rng.int(0 ..< 100) {
            case 0 ..< 45: try localOperation(at: rng.int(0 ..< replicas.count), &rng)
            case 45 ..< 70: send(&rng)
            case 70 ..< 96: try deliverOne(&rng)
            default:
                if !network.isEmpty {
                    network.remove(at: rng.int(0 ..< network.count))
                    coverage.hit("message lost")
                }
            }
        }
    }

    /// Delivers whatever is still in flight, in random order.
    mutating func drain(_ rng: inout SplitMix64) throws {
        rng.shuffle(&network)
        while let message = network.popLast() { try deliver(message.delta, to: message.to, &rng) }
    }

    /// Anti-entropy: every replica sends every other replica `changes(since: receiver.version)` until a
    /// whole round sends nothing. Returns the number of rounds; throws if it does not settle.
    @discardableResult
    mutating func syncUntilQuiet(_ rng: inout SplitMix64, maximumRounds: Int = 20) throws -> Int {
        for round in 1 ... maximumRounds {
            var sent = false
            let pairs = rng.shuffled(replicas.indices.flatMap { i in replicas.indices.filter { $0 != i }.map { (i, $0) } })
            for (from, to) in pairs {
                if let delta = replicas[from].state.changes(since: replicas[to].state.version) {
                    try deliver(delta, to: to, &rng)
                    sent = true
                }
            }
            if !sent { return round }
        }
        throw CaseFailure(description: "replicas still exchanging deltas after \(maximumRounds) rounds")
    }
}
