import LatticeCore

// Generators of *reachable* CRDT states.
//
// Every world runs realistic operations on 2-4 replicas, each stamping with its own HybridLogicalClock
// (injected time that usually stays on the same millisecond, sometimes steps back), and merges random
// subsets of the other replicas' current states (observing their clocks first, as a real receiver does).
// Every state any replica passes through is kept as a snapshot; merge-law cases draw their operands from
// the snapshots of ONE world, so all operands are jointly reachable (stamps per replica are monotonic,
// which the OR-set's version-vector causal context relies on).

/// Counts of the situations the generators must produce; the tests assert each one occurred.
struct Coverage: CustomStringConvertible {
    var counts: [String: Int] = [:]
    mutating func hit(_ key: String, _ condition: Bool = true) { if condition { counts[key, default: 0] += 1 } }
    subscript(key: String) -> Int { counts[key] ?? 0 }
    mutating func add(_ other: Coverage) { for (key, value) in other.counts { counts[key, default: 0] += value } }
    var description: String { counts.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ") }
}

/// Tracks stamps handed out, to count equal clock values issued by different replicas.
struct StampLog {
    private var replicasByHLC: [HLC: Set<ReplicaID>] = [:]
    mutating func log(_ stamp: Stamp, into coverage: inout Coverage) {
        let inserted = replicasByHLC[stamp.hlc, default: []].insert(stamp.replica).inserted
        coverage.hit("equal HLC on two replicas", inserted && replicasByHLC[stamp.hlc]!.count == 2)
    }
}

/// The record every replica of a register/OR-set world starts from (created before the world began).
let genesisRecord = try! Record(id: Fixtures.recordID("genesis"), recordType: "Item",
                                createdAt: Fixtures.stamp(Fixtures.epoch - 60_000, replica: 99))

/// A record holding just `register` in field `value`: the register's canonical binary form.
func wrapped(_ register: LWWRegister) -> Record {
    var record = genesisRecord
    try! record.set("value", to: register.value, at: register.stamp)
    return record
}

/// The `tags` OR-set of a record from an OR-set world (empty before the first operation).
func tags(_ record: Record) -> ORSet {
    if case .set(let set)? = record.fields.first(where: { $0.name == "tags" })?.state { return set }
    return ORSet()
}

/// Merges `sources` into `replica` the way a receiver does: check and observe the clock, then join.
private func receive<S>(_ replica: inout Replica<S>, _ sources: [S], maximumHLC: (S) -> HLC, join: (inout S, S) -> Void) {
    for source in sources {
        try! replica.clock.observe(maximumHLC(source)) // every world's clocks are within the drift bound
        join(&replica.state, source)
    }
}

// MARK: - LWW register world

enum RegisterWorld {
    static let values: [ScalarValue?] = [nil, .string("a"), .string("b"), .int64(7), .double(.nan), .bytes([])]

    /// Snapshots of registers written and merged by 2-4 replicas.
    static func run(_ rng: inout SplitMix64, coverage: inout Coverage) -> [LWWRegister] {
        var replicas = (1 ... UInt64(rng.int(2 ... 4))).map { Replica<LWWRegister?>($0, state: nil) }
        var time = WorldTime()
        var log = StampLog()
        var snapshots: [LWWRegister] = []
        for _ in 0 ..< rng.int(6 ... 16) {
            time.tick(&rng, replicas)
            let i = rng.int(0 ..< replicas.count)
            if rng.chance(55) || replicas[i].state == nil {
                let stamp = replicas[i].stamp()
                log.log(stamp, into: &coverage)
                let write = LWWRegister(value: rng.pick(values), stamp: stamp)
                if replicas[i].state == nil { replicas[i].state = write } else { replicas[i].state!.set(write.value, at: stamp) }
            } else {
                let others = replicas.indices.filter { $0 != i }.compactMap { replicas[$0].state }
                guard !others.isEmpty else { continue }
                receive(&replicas[i], rng.subset(others), maximumHLC: { $0?.stamp.hlc ?? .zero }) { mine, theirs in
                    if mine == nil { mine = theirs } else if let theirs { mine!.merge(theirs) }
                }
            }
            if let state = replicas[i].state { snapshots.append(state) }
        }
        return snapshots
    }
}

// MARK: - OR-set world

enum ORSetWorld {
    static let elements: [ScalarValue] = [.string("x"), .string("y"), .int64(1)]

    /// Snapshots of records whose only field is the OR-set `tags`, changed by 2-4 replicas.
    ///
    /// Forced situations (counted in `coverage`): a remove concurrent with an add of the same element,
    /// re-adding an element after removing it, and removing an element the replica never saw.
    static func run(_ rng: inout SplitMix64, coverage: inout Coverage) -> [Record] {
        var replicas = (1 ... UInt64(rng.int(2 ... 4))).map { Replica($0, state: genesisRecord) }
        var time = WorldTime()
        var log = StampLog()
        var addDots: [ScalarValue: [Stamp]] = [:]
        var removedBy: [Int: Set<ScalarValue>] = [:]
        var snapshots: [Record] = []

        func add(_ element: ScalarValue, at i: Int) {
            let stamp = replicas[i].stamp()
            log.log(stamp, into: &coverage)
            coverage.hit("re-add after remove", removedBy[i, default: []].contains(element))
            try! replicas[i].state.add(element, to: "tags", at: stamp)
            addDots[element, default: []].append(stamp)
            snapshots.append(replicas[i].state)
        }
        func remove(_ element: ScalarValue, at i: Int) {
            let context = tags(replicas[i].state).context
            let dots = addDots[element, default: []]
            coverage.hit("remove of a never-seen element", !dots.contains { context.covers($0) })
            coverage.hit("remove concurrent with an add", dots.contains { !context.covers($0) })
            let stamp = replicas[i].stamp()
            log.log(stamp, into: &coverage)
            try! replicas[i].state.remove(element, from: "tags", at: stamp)
            removedBy[i, default: []].insert(element)
            snapshots.append(replicas[i].state)
        }

        for _ in 0 ..< rng.int(6 ... 18) {
            time.tick(&rng, replicas)
            let i = rng.int(0 ..< replicas.count)
            switch rng.int(0 ..< 100) {
            case 0 ..< 25:
                // Prefer re-adding something this replica removed.
                let removed = Array(removedBy[i, default: []]).sorted()
                add(!removed.isEmpty && rng.chance(40) ? rng.pick(removed) : rng.pick(elements), at: i)
            case 25 ..< 45:
                // Often an element this replica does not hold (never seen, or removed elsewhere).
                let absent = elements.filter { !tags(replicas[i].state).contains($0) }
                remove(!absent.isEmpty && rng.chance(40) ? rng.pick(absent) : rng.pick(elements), at: i)
            case 45 ..< 60:
                // Forced concurrency: i adds x while j, without hearing of it, removes x.
                var j = rng.int(0 ..< replicas.count - 1)
                if j >= i { j += 1 }
                let element = rng.pick(elements)
                add(element, at: i)
                remove(element, at: j)
            default:
                let others = replicas.indices.filter { $0 != i }.map { replicas[$0].state }
                receive(&replicas[i], rng.subset(others), maximumHLC: \.maximumHLC) { $0.merge($1) }
                snapshots.append(replicas[i].state)
            }
        }
        return snapshots
    }
}

// MARK: - Record world

enum RecordWorld {
    static let recordID = Fixtures.recordID("note")
    static let listElements: [ScalarValue] = [.string("x"), .string("y"), .int64(1),
                                              .reference(Fixtures.reference("milk"))]

    /// A random edit of a live record: registers (including clears), list adds/removes, the parent, and a
    /// field (`misc`) that replicas may use as a scalar or as a list, so kinds can conflict on merge.
    static func edit(_ record: inout Record, at stamp: Stamp, _ rng: inout SplitMix64) {
        if rng.chance(30) {
            RandomRecord.spliceSequences(&record, at: stamp, &rng, listNames: ["lines", "misc"], textNames: ["body", "misc"])
            return
        }
        do {
            switch rng.int(0 ..< 9) {
            case 0: try record.set("title", to: rng.bool() ? .string(rng.string()) : nil, at: stamp)
            case 1: try record.set("count", to: .int64(Int64(rng.int(0 ... 3))), at: stamp)
            case 2: try record.set("price", to: .double(rng.double()), at: stamp)
            case 3: try record.set("misc", to: rng.scalar(), at: stamp)
            case 4: try record.add(rng.pick(listElements), to: "misc", at: stamp)
            case 5, 6: try record.add(rng.pick(listElements), to: "tags", at: stamp)
            case 7: try record.remove(rng.pick(listElements), from: "tags", at: stamp)
            default: try record.setParent(rng.chance(70) ? Fixtures.reference(rng.pick(["list-1", "list-2"])) : nil, at: stamp)
            }
        } catch {
            precondition(error.code == .fieldKindMismatch, "unexpected \(error)")
        }
    }

    /// Snapshots of one record created, edited, deleted and recreated by 2-4 replicas (concurrent creates
    /// included: a replica that has not heard of the record may create it too).
    static func run(_ rng: inout SplitMix64, coverage: inout Coverage) -> [Record] {
        var replicas = (1 ... UInt64(rng.int(2 ... 4))).map { Replica<Record?>($0, state: nil) }
        var time = WorldTime()
        var log = StampLog()
        var snapshots: [Record] = []
        for _ in 0 ..< rng.int(6 ... 20) {
            time.tick(&rng, replicas)
            let i = rng.int(0 ..< replicas.count)
            let others = replicas.indices.filter { $0 != i }.compactMap { replicas[$0].state }
            let local = rng.chance(55) || others.isEmpty
            if local, var record = replicas[i].state {
                let stamp = replicas[i].stamp()
                log.log(stamp, into: &coverage)
                if record.isDeleted {
                    guard rng.chance(50) else { continue }
                    try! record.recreate(recordType: rng.pick(["Item", "Note"]), at: stamp)
                    coverage.hit("recreate")
                } else if rng.chance(12) {
                    record.delete(at: stamp)
                } else {
                    edit(&record, at: stamp, &rng)
                }
                replicas[i].state = record
            } else if local {
                guard rng.chance(40) else { continue }
                let stamp = replicas[i].stamp()
                coverage.hit("concurrent create", !replicas.allSatisfy { $0.state == nil })
                replicas[i].state = try! Record(id: recordID, recordType: rng.pick(["Item", "Note"]), createdAt: stamp)
            } else {
                receive(&replicas[i], rng.subset(others), maximumHLC: { $0?.maximumHLC ?? .zero }) { mine, theirs in
                    guard let theirs else { return }
                    if let current = mine {
                        noteConflicts(current, theirs, into: &coverage)
                        mine!.merge(theirs)
                    } else {
                        mine = theirs
                    }
                }
            }
            if let state = replicas[i].state { snapshots.append(state) }
        }
        return snapshots
    }

    static func noteConflicts(_ a: Record, _ b: Record, into coverage: inout Coverage) {
        guard a.generation == b.generation else { return coverage.hit("generations meet") }
        for (deleted, live) in [(a, b), (b, a)] {
            if let deletion = deleted.deletion, !live.isDeleted, live.maximumHLC > deletion.hlc {
                coverage.hit("delete meets a later concurrent edit")
            }
        }
        for field in a.fields {
            guard let other = b.fields.first(where: { $0.name == field.name }) else { continue }
            switch (field.state, other.state) {
            case (.register, .set), (.set, .register): coverage.hit("register meets set")
            case let (.register(x), .register(y)):
                coverage.hit("register tie on equal HLC", x.stamp.hlc == y.stamp.hlc && x.stamp.replica != y.stamp.replica)
            default: break
            }
        }
    }
}

// MARK: - Arbitrary records (codec tests)

/// Records built through the public API with arbitrary stamps (not a simulation: the codec must carry any
/// state exactly), every value type and edge case, cleared registers, lists of mixed types, parents,
/// deletions and several generations.
enum RandomRecord {
    static let registerNames = ["title", "count", "price", "data", "when", "ref", "place", "note", "a", "Z9._x"]
    static let listNames = ["tags", "items", "z.list"]
    static let types = ["Item", "Note", "T.x_1", String(repeating: "T", count: 255)]

    static func make(_ rng: inout SplitMix64, jsonSafe: Bool = false, zone: ZoneID = Fixtures.zone,
                     name: String? = nil) -> Record {
        let id = Fixtures.recordID(name ?? rng.pick(SplitMix64.recordNames), zone: zone)
        var record = try! Record(id: id, recordType: rng.pick(types), createdAt: rng.anyStamp())
        for _ in 0 ..< rng.int(0 ... 12) {
            let stamp = rng.anyStamp()
            if record.isDeleted {
                if rng.chance(60) { try! record.recreate(recordType: rng.pick(types), at: stamp) }
                continue
            }
            do {
                switch rng.int(0 ..< 20) {
                case 0 ..< 8: try record.set(rng.pick(registerNames), to: rng.chance(80) ? rng.scalar(jsonSafe: jsonSafe) : nil, at: stamp)
                case 8 ..< 11: try record.add(rng.scalar(jsonSafe: jsonSafe), to: rng.pick(listNames), at: stamp)
                case 11 ..< 14: spliceSequences(&record, at: stamp, &rng, jsonSafe: jsonSafe)
                case 14 ..< 17: try record.remove(rng.scalar(jsonSafe: jsonSafe), from: rng.pick(listNames), at: stamp)
                case 17, 18:
                    let target = rng.pick(SplitMix64.recordNames.filter { $0 != id.recordName })
                    try record.setParent(rng.chance(80) ? Fixtures.reference(target, zone: rng.bool() ? zone : nil) : nil, at: stamp)
                default: if rng.chance(50) { record.delete(at: stamp) }
                }
            } catch {
                precondition(error.code == .fieldKindMismatch, "unexpected \(error)")
            }
        }
        return record
    }

    /// A random splice of a list field or a text field named in `listNames` or `textNames` (a name in both
    /// can meet itself as two kinds).
    static func spliceSequences(_ record: inout Record, at stamp: Stamp, _ rng: inout SplitMix64, jsonSafe: Bool = false,
                                listNames: [String] = ["lines", "steps"], textNames: [String] = ["body", "notes"]) {
        let asText = rng.bool()
        let name = rng.pick(asText ? textNames : listNames)
        var count = 0
        if let value = record[name] {
            switch value {
            case .list(_, let elements): count = elements.count
            case .text(let text): count = text.unicodeScalars.count
            default: return
            }
        }
        let position = rng.int(0 ... count)
        let deleting = position < count && rng.chance(40) ? rng.int(1 ... min(3, count - position)) : 0
        do {
            if asText {
                var scalars = String.UnicodeScalarView()
                for _ in 0 ..< rng.int(0 ... 4) { scalars.append(rng.pick(Array("ab é👋\n".unicodeScalars))) }
                let inserted = String(scalars)
                try record.spliceText(name, at: position, deleting: deleting, inserting: inserted, stamp: stamp)
            } else {
                let inserted = (0 ..< rng.int(0 ... 3)).map { _ in rng.scalar(jsonSafe: jsonSafe) }
                try record.splice(name, at: position, deleting: deleting, inserting: inserted, stamp: stamp)
            }
        } catch let error as RecordError {
            precondition(error.code == .fieldKindMismatch || error.code == .deleted, "unexpected \(error)")
        } catch {
            preconditionFailure("unexpected \(error)")
        }
    }

    static func versionVector(_ rng: inout SplitMix64) -> VersionVector {
        VersionVector((0 ..< rng.int(0 ... 4)).map { _ in
            let stamp = rng.anyStamp()
            return VersionVector.Entry(replica: stamp.replica, hlc: stamp.hlc)
        })
    }

    /// A delta of 0-5 distinct records of `zone`, sorted by name as the format requires.
    static func delta(_ rng: inout SplitMix64, zone: ZoneID = Fixtures.zone) -> ZoneDelta {
        let names = Array(Set((0 ..< rng.int(0 ... 5)).map { _ in rng.pick(SplitMix64.recordNames) })).sorted {
            Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8))
        }
        return ZoneDelta(zoneID: zone, since: versionVector(&rng), version: versionVector(&rng),
                         records: names.map { make(&rng, zone: zone, name: $0) })
    }
}
