import Testing
import LatticeCore

@Suite("Hybrid logical clock")
struct ClockTests {
    let time = ManualTime(Fixtures.epoch)

    @Test("HLC packs milliseconds and counter so integer order is clock order")
    func packing() {
        let hlc = HLC(milliseconds: Fixtures.epoch, counter: 3)
        #expect(hlc.milliseconds == Fixtures.epoch && hlc.counter == 3)
        #expect(hlc.rawValue == Fixtures.epoch << 16 | 3)
        #expect(HLC(milliseconds: 5, counter: .max) < HLC(milliseconds: 6, counter: 0))
        #expect(hlc.description == "1764489600000.3")
        // Stamps order by clock value, then replica id.
        #expect(Fixtures.stamp(1000, replica: 9) < Fixtures.stamp(1000, 1, replica: 1))
        #expect(Fixtures.stamp(1000, replica: 1) < Fixtures.stamp(1000, replica: 2))
    }

    @Test("now() reads the injected time and counts within one millisecond")
    func readsInjectedTime() {
        var clock = Fixtures.clock(7, time: time)
        #expect(clock.now() == Fixtures.stamp(Fixtures.epoch, 0, replica: 7))
        #expect(clock.now() == Fixtures.stamp(Fixtures.epoch, 1, replica: 7))
        time.advance(by: 1)
        #expect(clock.now() == Fixtures.stamp(Fixtures.epoch + 1, 0, replica: 7))
        #expect(clock.latest == HLC(milliseconds: Fixtures.epoch + 1, counter: 0))
    }

    @Test("now() stays monotonic when physical time goes backwards")
    func monotonicWhenTimeGoesBack() {
        var clock = Fixtures.clock(1, time: time)
        let first = clock.now()
        time.milliseconds = Fixtures.epoch - 10_000
        let second = clock.now()
        time.milliseconds = 0
        let third = clock.now()
        #expect(first < second && second < third)
        #expect(third.hlc == HLC(milliseconds: Fixtures.epoch, counter: 2))
        time.milliseconds = Fixtures.epoch + 5
        #expect(clock.now().hlc == HLC(milliseconds: Fixtures.epoch + 5, counter: 0))
    }

    @Test("the counter carries into the millisecond instead of wrapping")
    func counterOverflow() {
        var clock = Fixtures.clock(1, time: time)
        var previous = clock.now()
        for _ in 0 ..< Int(UInt16.max) + 10 {
            let next = clock.now()
            #expect(next > previous)
            previous = next
        }
        #expect(previous.hlc == HLC(milliseconds: Fixtures.epoch + 1, counter: 9))
    }

    @Test("a restarted clock continues after its persisted latest value")
    func restart() {
        let persisted = HLC(milliseconds: Fixtures.epoch + 60_000, counter: 4)
        var clock = HybridLogicalClock(replica: ReplicaID(1), latest: persisted, time: time.source)
        #expect(clock.now().hlc == HLC(milliseconds: Fixtures.epoch + 60_000, counter: 5))
    }

    @Test("observe() orders the next local write after the remote one")
    func observeOrdersLaterWrites() throws {
        var clock = Fixtures.clock(1, time: time)
        _ = clock.now()
        // A remote write 60 s ahead (within the bound) from a replica with a *smaller* id.
        let remote = Fixtures.stamp(Fixtures.epoch + 60_000, 7, replica: 0)
        try clock.observe(remote.hlc)
        #expect(clock.latest == remote.hlc)
        let next = clock.now()
        #expect(next > remote)
        #expect(next.hlc == HLC(milliseconds: Fixtures.epoch + 60_000, counter: 8))
        // Observing something older changes nothing.
        try clock.observe(HLC(milliseconds: 1, counter: 0))
        #expect(clock.latest == next.hlc)
    }

    @Test("a remote timestamp more than 5 minutes ahead is rejected and does not move the clock")
    func rejectsFarFuture() throws {
        var clock = Fixtures.clock(1, time: time)
        let before = clock.now()
        #expect(HybridLogicalClock.defaultMaximumDrift == 300_000)
        #expect(clock.maximumDriftMilliseconds == 300_000)

        let atBound = HLC(milliseconds: Fixtures.epoch + 300_000, counter: 0xFFFF)
        try clock.check(atBound) // exactly 5 minutes ahead is still accepted

        let tooFar = HLC(milliseconds: Fixtures.epoch + 300_001, counter: 0)
        let error = try #require(throws: ClockError.self) { try clock.observe(tooFar) }
        #expect(error.remote == tooFar && error.localMilliseconds == Fixtures.epoch && error.maximumDriftMilliseconds == 300_000)
        #expect(error.description.contains("300001 ms ahead of the local clock"))
        #expect(error.description.contains("at most 300000 ms"))
        #expect(clock.latest == before.hlc, "a rejected timestamp must not move the clock")
        #expect(throws: ClockError.self) { try clock.check(HLC(milliseconds: Fixtures.epoch + 365 * 86_400_000, counter: 0)) }

        // Once local time catches up, the same timestamp is fine.
        time.advance(by: 1)
        try clock.observe(tooFar)
        #expect(clock.latest == tooFar)
    }

    @Test("a custom drift bound is honoured")
    func customBound() throws {
        var clock = HybridLogicalClock(replica: ReplicaID(1), maximumDriftMilliseconds: 1_000, time: time.source)
        try clock.observe(HLC(milliseconds: Fixtures.epoch + 1_000, counter: 0))
        let error = #expect(throws: ClockError.self) { try clock.observe(HLC(milliseconds: Fixtures.epoch + 1_001, counter: 0)) }
        #expect(error?.maximumDriftMilliseconds == 1_000)
        #expect(error?.description.contains("1001 ms ahead of the local clock; at most 1000 ms is accepted") == true)
        var strict = HybridLogicalClock(replica: ReplicaID(2), maximumDriftMilliseconds: 0, time: time.source)
        #expect(throws: ClockError.self) { try strict.observe(HLC(milliseconds: Fixtures.epoch + 1, counter: 0)) }
        try strict.observe(HLC(milliseconds: Fixtures.epoch, counter: 99))
    }

    @Test("random walks of time, writes and observations stay strictly monotonic")
    func randomWalk() {
        let checks = runCases("clock random walk", minimumChecks: 20_000, regressions: RegressionSeeds.clock) { rng in
            let time = ManualTime(Fixtures.epoch)
            var clock = HybridLogicalClock(replica: ReplicaID(UInt64(rng.int(1 ... 3))), time: time.source)
            var previous = Stamp(hlc: .zero, replica: ReplicaID(0))
            var greatestSeen = HLC.zero
            for _ in 0 ..< 50 {
                switch rng.int(0 ..< 10) {
                case 0 ..< 3: time.milliseconds = UInt64(Int64(time.milliseconds) + Int64(rng.int(-50 ... 50)))
                case 3 ..< 5:
                    let remote = HLC(milliseconds: time.milliseconds + UInt64(rng.int(0 ... 400_000)), counter: UInt16(rng.int(0 ... 3)))
                    do {
                        try clock.observe(remote)
                        try require(remote.milliseconds <= time.milliseconds + 300_000, "accepted \(remote) beyond the bound")
                        greatestSeen = max(greatestSeen, remote)
                    } catch {
                        try require(remote.milliseconds > time.milliseconds + 300_000, "rejected \(remote) within the bound")
                    }
                default:
                    let stamp = clock.now()
                    try require(stamp > previous, "\(stamp) is not after \(previous)")
                    try require(stamp.hlc > greatestSeen, "\(stamp) is not after the observed \(greatestSeen)")
                    try require(stamp.hlc.milliseconds >= time.milliseconds, "\(stamp) is behind physical time")
                    previous = stamp
                }
            }
            return 50
        }
        #expect(checks >= 20_000)
    }
}

/// Replicas with wrong clocks, on the zone receive path (`clock.observe(delta.maximumHLC)` before merging).
@Suite("Clock skew")
struct ClockSkewTests {
    struct Peer {
        var replica: Replica<ZoneState>

        init(_ number: UInt64, time: UInt64) { replica = Replica(number, state: ZoneState(zoneID: Fixtures.zone), time: time) }

        mutating func write(_ text: String) throws {
            try replica.state.update("milk", clock: &replica.clock) { try $0.set("text", to: .string(text), at: $1) }
        }

        /// Receives everything `sender` has that this peer lacks, as the receive path does: the delta is
        /// refused whole when its newest stamp is beyond the drift bound.
        mutating func receive(from sender: Peer) throws {
            guard let delta = sender.replica.state.changes(since: replica.state.version) else { return }
            try replica.clock.observe(delta.maximumHLC)
            try replica.state.merge(delta)
        }

        var text: ScalarValue? {
            if case .scalar(let value)? = replica.state["milk"]?["text"] { return value }
            return nil
        }
    }

    /// Three peers holding the same `milk` record, created by `a`.
    static func peers(skewOfC: UInt64) throws -> (Peer, Peer, Peer) {
        var a = Peer(1, time: Fixtures.epoch), b = Peer(2, time: Fixtures.epoch), c = Peer(3, time: Fixtures.epoch + skewOfC)
        try a.replica.state.create(recordName: "milk", recordType: "Item", clock: &a.replica.clock)
        try b.receive(from: a)
        try c.receive(from: a)
        return (a, b, c)
    }

    @Test("a replica whose clock is a year fast does not win its fields")
    func yearAhead() throws {
        let year: UInt64 = 365 * 86_400_000
        var (a, b, c) = try Self.peers(skewOfC: year)
        try c.write("from the future")
        let cStamp = try #require(c.replica.state["milk"]?.provenance(of: "text"))
        #expect(cStamp == .register(Fixtures.stamp(Fixtures.epoch + year, 0, replica: 3)))

        let aClock = a.replica.clock.latest
        #expect(throws: ClockError.self) { try a.receive(from: c) }
        #expect(throws: ClockError.self) { try b.receive(from: c) }
        #expect(a.replica.clock.latest == aClock, "the healthy clock was not dragged ahead")
        #expect(a.text == nil && b.text == nil, "nothing of the refused delta was merged")

        // The healthy replicas keep writing and syncing; their values stand.
        a.replica.time.advance(by: 1_000)
        try a.write("honest")
        try b.receive(from: a)
        #expect(a.text == .string("honest") && b.text == .string("honest"))
        #expect(a.replica.state == b.replica.state)
        // The fast replica can still receive (its own write wins locally), but cannot spread it.
        try c.receive(from: a)
        #expect(c.text == .string("from the future"))
        #expect(throws: ClockError.self) { try b.receive(from: c) }
        #expect(b.text == .string("honest"))

        // Without the check, the year-fast write would have won everywhere: the guard matters.
        var unguarded = b.replica.state
        try unguarded.merge(c.replica.state.fullState())
        #expect(unguarded["milk"]?["text"] == .scalar(.string("from the future")))
    }

    @Test("a replica a few minutes fast is accepted, and a later write that observed it wins")
    func minutesAhead() throws {
        var (a, b, c) = try Self.peers(skewOfC: 4 * 60_000)
        try c.write("fast")
        a.replica.time.advance(by: 1_000)
        try a.write("concurrent") // truly concurrent with c's write, and stamped earlier: it loses
        try a.receive(from: c)
        #expect(a.text == .string("fast"))
        #expect(a.replica.clock.latest >= HLC(milliseconds: Fixtures.epoch + 240_000, counter: 0))

        try a.write("after seeing") // observed c's stamp, so ordered after it despite a's slower clock
        let provenance = try #require(a.replica.state["milk"]?.provenance(of: "text"))
        #expect(provenance == .register(Fixtures.stamp(Fixtures.epoch + 240_000, 1, replica: 1)))
        try c.receive(from: a)
        try b.receive(from: a)
        try b.receive(from: c)
        for peer in [a, b, c] { #expect(peer.text == .string("after seeing")) }
        #expect(a.replica.state == c.replica.state && b.replica.state == c.replica.state)
    }
}
