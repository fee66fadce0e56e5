import Testing
import LatticeCore

/// Exhaustive model check of the add-wins OR-set on a single element `x`.
///
/// **Model.** Three replicas (ids 1, 2, 3) share one list field. A replica performs local operations,
/// each `add(x)` or `remove(x)` (both choices are explored at every step), and after each operation sends
/// its whole state to both peers. A sent state may be delivered to a peer at *any* later point, any number
/// of times, or never: every delivery order, delay, reordering, duplication and loss is explored.
/// (Relaying is covered too: a relayed state is the join of operation states the relay received, and
/// receiving those directly reaches the same causal histories; associativity is tested in
/// MergeLawTests.) All clocks read the same millisecond, so replicas keep issuing equal HLC values and
/// ties fall to the replica id; every clock observes what its replica merges, as a real receiver does.
///
/// **Bound.** At most 4 operations per replica and at most `totalOperations` = 4 in all (4+0+0, 3+1+0,
/// 2+2+0, 2+1+1, ... in every order and every add/remove choice), with every delivery interleaving:
/// 139,676 reachable global states, about 7 s in a debug build. Every reachable global state is visited
/// once (depth-first search with a visited set), which covers every interleaving of operations and
/// deliveries within the bound. (A total of 5 already exceeds 10^6 states, and 4 per replica on all three
/// replicas, 12 operations, is far beyond reach for an every-delivery-order search.)
///
/// **Specification**, checked in every reachable state of every replica. A state reflects a set H of
/// operations (its causal history). An add `a ∈ H` survives iff no other operation in H has `a` in its
/// causal past (a later add of `x` replaces it; a later remove deletes it). The set must hold exactly the
/// surviving adds' dots, and its causal context must be exactly the greatest stamp per replica in H;
/// so `x` is present iff some add in H was observed by no remove in H. In particular:
/// - add(x) concurrent with remove(x) (neither saw the other) leaves x present;
/// - a remove made after observing every add leaves x absent.
/// Because the whole OR-set is compared with the one the specification derives from H, a replica's
/// state is a function of H, which is what makes the visited-set key (operations and histories) sound.
@Suite("Add-wins OR-set, exhaustive")
struct AddWinsExhaustiveTests {
    static let element = ScalarValue.string("x")
    static let replicas = 3
    static let operationsPerReplica = 4
    static let totalOperations = 4
    static let time: @Sendable () -> UInt64 = { Fixtures.epoch }

    /// Operation `replica * operationsPerReplica + k` is replica `replica`'s k-th operation (one bit each).
    struct Operation {
        var isAdd: Bool
        var stamp: Stamp
        /// Operations the issuing replica had seen: its causal past.
        var past: UInt16
        /// The state the replica sent right after the operation.
        var sent: ORSet
    }

    struct World {
        var sets = Array(repeating: ORSet(), count: AddWinsExhaustiveTests.replicas)
        var history = Array(repeating: UInt16(0), count: AddWinsExhaustiveTests.replicas)
        var latest = Array(repeating: HLC.zero, count: AddWinsExhaustiveTests.replicas)
        var done = Array(repeating: 0, count: AddWinsExhaustiveTests.replicas)
        var operations = [Operation?](repeating: nil, count: AddWinsExhaustiveTests.replicas * AddWinsExhaustiveTests.operationsPerReplica)
        var adds: UInt16 = 0
        var executed: UInt16 = 0
        /// What changed last: the replica whose state changed, and the operation just performed (if any).
        var changed = 0
        var newOperation: Int? = nil

        /// Everything that determines the world: each operation's kind and causal past, and each history
        /// (12 operation bits each). Computed with one history or one new operation substituted, so a
        /// successor's key is known before any merge is done.
        struct Key: Hashable {
            var pasts: (UInt64, UInt64, UInt64), rest: UInt64
            static func == (a: Key, b: Key) -> Bool { a.pasts == b.pasts && a.rest == b.rest }
            func hash(into hasher: inout Hasher) {
                hasher.combine(pasts.0); hasher.combine(pasts.1); hasher.combine(pasts.2); hasher.combine(rest)
            }
        }

        func key(replica: Int = -1, history newHistory: UInt16 = 0, operation: Int = -1, isAdd: Bool = false) -> Key {
            var words: (UInt64, UInt64, UInt64) = (0, 0, 0)
            for id in operations.indices {
                let past = id == operation ? history[replica] : operations[id]?.past ?? 0
                let shifted = UInt64(past) << (UInt64(id % 4) * 16)
                switch id / 4 {
                case 0: words.0 |= shifted
                case 1: words.1 |= shifted
                default: words.2 |= shifted
                }
            }
            var adds = self.adds, executed = self.executed
            if operation >= 0 {
                executed |= 1 << operation
                if isAdd { adds |= 1 << operation }
            }
            var rest = UInt64(adds) | UInt64(executed) << 12
            for r in history.indices {
                var h = history[r]
                if r == replica { h = operation >= 0 ? h | 1 << operation : newHistory }
                rest |= UInt64(h) << (24 + 12 * UInt64(r))
            }
            return Key(pasts: words, rest: rest)
        }
    }

    struct Statistics {
        var states = 0
        var addConcurrentWithRemove = 0
        var removeAfterObservingEveryAdd = 0
        var equalHLCTies = 0
        var redundantDeliveries = 0
    }

    /// The OR-set the specification derives from history `h`, or a description of a violation.
    static func check(_ set: ORSet, history h: UInt16, in world: World, statistics: inout Statistics) -> String? {
        var observed: UInt16 = 0
        var entries: [ORSet.Entry] = []
        var context: [VersionVector.Entry] = []
        for (id, operation) in world.operations.enumerated() where h & (1 << id) != 0 {
            let operation = operation!
            observed |= operation.past
            context.append(VersionVector.Entry(replica: operation.stamp.replica, hlc: operation.stamp.hlc))
        }
        let surviving = world.adds & h & ~observed
        for id in 0 ..< 16 where surviving & (1 << id) != 0 {
            entries.append(ORSet.Entry(element: element, dot: world.operations[id]!.stamp))
        }
        let expected = ORSet(entries: entries, context: VersionVector(context))
        guard set == expected else { return "state \(set) but the specification gives \(expected)" }

        // The two headline rules, stated directly.
        let removes = world.executed & ~world.adds & h
        for a in 0 ..< 16 where world.adds & h & (1 << a) != 0 {
            for r in 0 ..< 16 where removes & (1 << r) != 0 {
                let add = world.operations[a]!, remove = world.operations[r]!
                guard remove.past & (1 << a) == 0, add.past & (1 << r) == 0, observed & (1 << a) == 0 else { continue }
                statistics.addConcurrentWithRemove += 1
                if !set.contains(element) { return "add \(add.stamp) concurrent with remove \(remove.stamp) did not win" }
            }
        }
        let allAdds = world.adds & h
        if allAdds != 0, (0 ..< 16).contains(where: { removes & (1 << $0) != 0 && world.operations[$0]!.past & allAdds == allAdds }) {
            statistics.removeAfterObservingEveryAdd += 1
            if set.contains(element) { return "a remove observed every add, yet x is present" }
        }
        return nil
    }

    /// Visits every reachable world; returns statistics and the first violation, if any.
    static func explore() -> (Statistics, String?) {
        var statistics = Statistics()
        var visited: Set<World.Key> = [World().key()]
        var stack = [World()]

        func visit(_ world: World) -> String? {
            statistics.states += 1
            let r = world.changed
            if let violation = check(world.sets[r], history: world.history[r], in: world, statistics: &statistics) {
                return "replica \(r + 1) with history \(String(world.history[r], radix: 2)): \(violation)"
            }
            stack.append(world)
            return nil
        }

        while let world = stack.popLast() {
            let total = world.done.reduce(0, +)
            // A local operation.
            for r in 0 ..< replicas where world.done[r] < operationsPerReplica && total < totalOperations {
                for isAdd in [true, false] {
                    let id = r * operationsPerReplica + world.done[r]
                    guard visited.insert(world.key(replica: r, operation: id, isAdd: isAdd)).inserted else { continue }
                    var next = world
                    var clock = HybridLogicalClock(replica: ReplicaID(UInt64(r + 1)), latest: next.latest[r], time: time)
                    let stamp = clock.now()
                    if isAdd { next.sets[r].add(element, at: stamp) } else { next.sets[r].remove(element, at: stamp) }
                    if next.operations.contains(where: { $0?.stamp.hlc == stamp.hlc }) { statistics.equalHLCTies += 1 }
                    next.operations[id] = Operation(isAdd: isAdd, stamp: stamp, past: next.history[r], sent: next.sets[r])
                    if isAdd { next.adds |= 1 << id }
                    next.executed |= 1 << id
                    next.history[r] |= 1 << id
                    next.latest[r] = clock.latest
                    next.done[r] += 1
                    next.changed = r
                    next.newOperation = id
                    if let failure = visit(next) { return (statistics, failure) }
                }
            }
            // A delivery of any state a peer has sent.
            for id in world.operations.indices {
                guard let operation = world.operations[id] else { continue }
                let snapshotHistory = operation.past | 1 << id
                for to in 0 ..< replicas where to != id / operationsPerReplica {
                    let merged = world.history[to] | snapshotHistory
                    if merged == world.history[to] {
                        // A duplicate or stale delivery must change nothing. Checked once per new pair of
                        // (receiver state, sent state): when either appeared in this world.
                        guard to == world.changed || id == world.newOperation else { continue }
                        statistics.redundantDeliveries += 1
                        if world.sets[to].merging(operation.sent) != world.sets[to] {
                            return (statistics, "a stale delivery changed replica \(to + 1)")
                        }
                        continue
                    }
                    guard visited.insert(world.key(replica: to, history: merged)).inserted else { continue }
                    var next = world
                    var clock = HybridLogicalClock(replica: ReplicaID(UInt64(to + 1)), latest: next.latest[to], time: time)
                    do { try clock.observe(operation.sent.latestOperation) } catch { return (statistics, "\(error)") }
                    next.sets[to].merge(operation.sent)
                    next.latest[to] = clock.latest
                    next.history[to] = merged
                    next.changed = to
                    next.newOperation = nil
                    if let failure = visit(next) { return (statistics, failure) }
                }
            }
        }
        return (statistics, nil)
    }

    @Test("every interleaving of operations and deliveries obeys add-wins (3 replicas, ≤ 4 operations)")
    func exhaustive() {
        let (statistics, failure) = Self.explore()
        #expect(failure == nil, "\(failure ?? "")")
        #expect(statistics.states == 139_676, "the explored space changed size; update the bound comment")
        print("add-wins exhaustive: \(statistics.states) states, \(statistics.addConcurrentWithRemove) concurrent add/remove "
              + "checks, \(statistics.removeAfterObservingEveryAdd) observed-remove checks, "
              + "\(statistics.redundantDeliveries) duplicate/stale deliveries")
        #expect(statistics.addConcurrentWithRemove > 0)
        #expect(statistics.removeAfterObservingEveryAdd > 0)
        #expect(statistics.equalHLCTies > 0)
        #expect(statistics.redundantDeliveries > 0)
    }
}
