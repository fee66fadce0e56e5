import Foundation
import Synchronization
import Testing
import LatticeCore

// MARK: - Seeded randomness

/// Every randomised test draws from LatticeCore's `SplitMix64`, so a seed reproduces a run exactly. The
/// helpers below (`int`, `chance`, `pick`, `shuffle`) are implemented here rather than taken from the
/// standard library, so a recorded seed keeps meaning the same thing across toolchain versions.
extension SplitMix64 {
    /// A uniform integer in `range` (modulo bias is irrelevant at these sizes).
    mutating func int(_ range: Range<Int>) -> Int {
        precondition(!range.isEmpty)
        return range.lowerBound + Int(next() % UInt64(range.count))
    }

    mutating func int(_ range: ClosedRange<Int>) -> Int { int(range.lowerBound ..< range.upperBound + 1) }

    /// True with probability `percent`/100.
    mutating func chance(_ percent: Int) -> Bool { int(0 ..< 100) < percent }

    mutating func bool() -> Bool { next() & 1 == 1 }

    mutating func pick<T>(_ items: [T]) -> T { items[int(0 ..< items.count)] }

    mutating func shuffle<T>(_ items: inout [T]) {
        guard items.count > 1 else { return }
        for index in stride(from: items.count - 1, to: 0, by: -1) {
            items.swapAt(index, int(0 ... index))
        }
    }

    mutating func shuffled<T>(_ items: [T]) -> [T] {
        var copy = items
        shuffle(&copy)
        return copy
    }

    /// A random non-empty subset of `items`, in random order.
    mutating func subset<T>(_ items: [T]) -> [T] {
        let all = shuffled(items)
        return Array(all.prefix(int(1 ... max(1, all.count))))
    }

    mutating func bytes(_ count: Int) -> [UInt8] { (0 ..< count).map { _ in UInt8(truncatingIfNeeded: next()) } }
}

/// Seeds that pin a once-failing (or deliberately interesting) case. Each is the *case* seed printed by
/// `runCases` on failure ("case seed N failed"); it runs before the fresh random cases on every run.
/// To replay a whole run instead, set `LATTICE_SEED` to the printed base seed ("... seed: N").
/// Note: a case seed replays the same case only while the generators stay unchanged.
enum RegressionSeeds {
    static let lwwLaws: [UInt64] = [1, 2, 0xDEAD_BEEF]
    static let orSetLaws: [UInt64] = [1, 2, 0xDEAD_BEEF]
    static let recordLaws: [UInt64] = [1, 2, 0xDEAD_BEEF]
    /// 16222597344019148195, 8343338957723548956, 1933536823977755811: the delta law failed on versions
    /// (a superseded operation's version never travelled; see `versionOnlyDelta` in ConvergenceTests).
    static let zoneLaws: [UInt64] = [1, 2, 0xDEAD_BEEF, 16_222_597_344_019_148_195, 8_343_338_957_723_548_956,
                                     1_933_536_823_977_755_811]
    static let convergence: [UInt64] = [1, 2, 0xDEAD_BEEF]
    static let codec: [UInt64] = [1, 2, 3]
    /// 8645067001919827678: validation against known frames reported a different `maximumHLC`.
    static let fuzz: [UInt64] = [1, 2, 3, 8_645_067_001_919_827_678, 5_566_689_070_229_310_794]
    static let clock: [UInt64] = [1, 2, 3]
}

/// The base seed of a randomised test: `LATTICE_SEED` from the environment when set (to replay a whole
/// run), otherwise fresh randomness.
func freshSeed() -> UInt64 {
    if let text = ProcessInfo.processInfo.environment["LATTICE_SEED"], let seed = UInt64(text) { return seed }
    return UInt64.random(in: .min ... .max)
}

/// Thrown by `require(_:_:)`; `runCases` catches it and reports the case seed.
struct CaseFailure: Error, CustomStringConvertible {
    let description: String
}

/// Runs randomised cases until `body` has reported at least `minimumChecks` checks (it returns how many
/// it made). Case seeds are drawn from one printed base seed, after the fixed `regressions`. The first
/// failing case stops the loop and records an issue naming its case seed, ready to paste into
/// `RegressionSeeds`. Returns the number of checks made.
@discardableResult
func runCases(_ name: String, minimumChecks: Int, regressions: [UInt64] = [], seed: UInt64 = freshSeed(),
              sourceLocation: SourceLocation = #_sourceLocation,
              _ body: (inout SplitMix64) throws -> Int) -> Int {
    print("\(name) seed: \(seed)")
    var seeds = SplitMix64(seed: seed)
    var checks = 0
    var pending = regressions
    while !pending.isEmpty || checks < minimumChecks {
        let caseSeed = pending.isEmpty ? seeds.next() : pending.removeFirst()
        var rng = SplitMix64(seed: caseSeed)
        do {
            checks += try body(&rng)
        } catch {
            Issue.record("\(name): case seed \(caseSeed) failed (base seed \(seed)): \(error)",
                         sourceLocation: sourceLocation)
            return checks
        }
    }
    return checks
}

/// A cheap check for hot loops: nothing is recorded unless it fails; then `runCases` reports the case.
func require(_ condition: Bool, _ message: @autoclosure () -> String) throws(CaseFailure) {
    if !condition { throw CaseFailure(description: message()) }
}

// MARK: - Injected time

/// A settable physical time source for `HybridLogicalClock` (milliseconds since 1970).
final class ManualTime: Sendable {
    private let value: Atomic<UInt64>

    init(_ milliseconds: UInt64 = Fixtures.epoch) { value = Atomic(milliseconds) }

    var milliseconds: UInt64 {
        get { value.load(ordering: .relaxed) }
        set { value.store(newValue, ordering: .relaxed) }
    }

    func advance(by milliseconds: UInt64) { self.milliseconds += milliseconds }

    var source: @Sendable () -> UInt64 { { [self] in self.milliseconds } }
}

// MARK: - Fixtures

enum Fixtures {
    /// 2025-11-30T08:00:00Z.
    static let epoch: UInt64 = 1_764_489_600_000
    static let zone = try! ZoneID(zoneName: "Groceries", ownerRecordName: "_owner1")
    static let otherZone = try! ZoneID(zoneName: "_defaultZone", ownerRecordName: "_a9c1")
    static func recordID(_ name: String = "milk", zone: ZoneID = Fixtures.zone) -> RecordID {
        try! RecordID(recordName: name, zoneID: zone)
    }
    static func reference(_ name: String, zone: ZoneID? = nil, action: Reference.Action = .none) -> Reference {
        try! Reference(recordName: name, zoneID: zone, action: action)
    }
    static func stamp(_ milliseconds: UInt64, _ counter: UInt16 = 0, replica: UInt64) -> Stamp {
        Stamp(hlc: HLC(milliseconds: milliseconds, counter: counter), replica: ReplicaID(replica))
    }
    static func clock(_ replica: UInt64, time: ManualTime) -> HybridLogicalClock {
        HybridLogicalClock(replica: ReplicaID(replica), time: time.source)
    }
}

// MARK: - Simulated replicas

/// One simulated replica: its own clock reading its own (skewable) time source, and its state.
struct Replica<State> {
    let id: ReplicaID
    let time: ManualTime
    var clock: HybridLogicalClock
    var state: State

    init(_ number: UInt64, state: State, time: UInt64 = Fixtures.epoch) {
        id = ReplicaID(number)
        self.time = ManualTime(time)
        clock = HybridLogicalClock(replica: id, time: self.time.source)
        self.state = state
    }

    mutating func stamp() -> Stamp { clock.now() }
}

/// Shared "true" time for a group of replicas. Most ticks leave the millisecond unchanged, so replicas
/// often stamp equal clock values and ties fall to the replica id; some replicas' clocks step backwards.
struct WorldTime {
    var now: UInt64 = Fixtures.epoch

    mutating func tick<S>(_ rng: inout SplitMix64, _ replicas: [Replica<S>]) {
        switch rng.int(0 ..< 10) {
        case 0 ..< 6: break
        case 6 ..< 9: now += 1
        default: now += UInt64(rng.int(2 ... 40))
        }
        for replica in replicas {
            switch rng.int(0 ..< 10) {
            case 0 ..< 7: replica.time.milliseconds = now
            case 7, 8: replica.time.milliseconds = now - UInt64(rng.int(1 ... 3)) // behind, may go backwards
            default: replica.time.milliseconds = now + UInt64(rng.int(1 ... 2))
            }
        }
    }
}

// MARK: - Random values

extension SplitMix64 {
    static let strings = ["", "milk", "Milk", "eggs", "héllo", "e\u{301}", "\u{E9}", "😀 party", "a\u{0}b",
                          "tab\tline\nbreak", "quote\"back\\slash", "\u{7F}del", "日本語"]
    static let recordNames = ["milk", "eggs", "bread", "list-1", "a.b", "Z", String(repeating: "n", count: 255)]
    static let zones: [ZoneID] = [Fixtures.zone, Fixtures.otherZone,
                                  try! ZoneID(zoneName: "Shared.zone", ownerRecordName: "_owner2")]

    /// Interesting doubles: -0, infinities and NaN; NaNs with a sign bit or payload unless `jsonSafe`
    /// (JSON writes every NaN as "NaN", so only the canonical one survives a JSON round trip).
    mutating func double(jsonSafe: Bool = false) -> Double {
        var pool: [Double] = [0, 1, -1, 0.5, 3.25, 1e-7, 1e300, -2.5e-300, .leastNonzeroMagnitude,
                              .greatestFiniteMagnitude, 1e15, 123_456_789.125, Double(Int64.max),
                              -0.0, .infinity, -.infinity, .nan]
        if !jsonSafe {
            pool += [-.nan, .signalingNaN, Double(bitPattern: 0x7FF8_0000_0000_BEEF), Double(bitPattern: 0xFFF0_0000_0000_0001)]
        }
        if chance(25) { return Double(int(-1_000_000 ... 1_000_000)) / 64 }
        return pick(pool)
    }

    mutating func string() -> String {
        chance(80) ? pick(Self.strings) : String(repeating: pick(["a", "é", "€", "𝄞"]), count: int(0 ... 40))
    }

    mutating func reference() -> Reference {
        Fixtures.reference(pick(Self.recordNames), zone: chance(50) ? pick(Self.zones) : nil,
                           action: bool() ? .none : .deleteSelf)
    }

    mutating func location(jsonSafe: Bool = false) -> Location {
        func maybe(_ rng: inout SplitMix64) -> Double? { rng.bool() ? rng.double(jsonSafe: jsonSafe) : nil }
        return Location(latitude: double(jsonSafe: jsonSafe), longitude: double(jsonSafe: jsonSafe),
                        altitude: maybe(&self), horizontalAccuracy: maybe(&self), verticalAccuracy: maybe(&self),
                        course: maybe(&self), speed: maybe(&self),
                        timestamp: bool() ? Int64(bitPattern: next()) : nil)
    }

    /// Any scalar value, every type and edge case included.
    mutating func scalar(jsonSafe: Bool = false) -> ScalarValue {
        switch int(0 ..< 7) {
        case 0: return .string(string())
        case 1: return .int64(chance(30) ? pick([Int64.min, Int64.max, 0, -1]) : Int64(int(-1000 ... 1000)))
        case 2: return .double(double(jsonSafe: jsonSafe))
        case 3: return .bytes(bytes(int(0 ... 24)))
        case 4: return .timestamp(chance(20) ? pick([Int64.min, Int64.max]) : Int64(Fixtures.epoch) + Int64(int(0 ... 9999)))
        case 5: return .reference(reference())
        default: return .location(location(jsonSafe: jsonSafe))
        }
    }

    /// A stamp anywhere in the 64-bit space (for codec tests; merge tests use real clocks).
    mutating func anyStamp() -> Stamp {
        let hlc = chance(20) ? pick([1, UInt64.max, 1 << 63]) : (Fixtures.epoch << 16) + UInt64(int(0 ... 100_000))
        let replica = chance(20) ? pick([0, UInt64.max, 1 << 35]) : UInt64(int(1 ... 6))
        return Stamp(hlc: HLC(rawValue: hlc), replica: ReplicaID(replica))
    }
}

// MARK: - Encodings

/// The canonical bytes of a record; records in these tests never exceed the size limit.
func encoded(_ record: Record) -> [UInt8] { try! BinaryCodec.encode(record) }

func encoded(_ delta: ZoneDelta) -> [UInt8] { try! BinaryCodec.encode(delta) }

func encoded(_ zone: ZoneState) -> [UInt8] { try! BinaryCodec.encode(zone.fullState()) }

extension Array where Element == UInt8 {
    /// Lower-case hex, two digits a byte (for failure messages).
    var hex: String { map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined() }
}
