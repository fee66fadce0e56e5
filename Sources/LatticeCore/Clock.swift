/// A hybrid logical clock value: milliseconds since the Unix epoch in the high 48 bits and a logical
/// counter in the low 16 bits, so plain integer order is the clock's order.
public struct HLC: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible {
    public var rawValue: UInt64

    public init(rawValue: UInt64) { self.rawValue = rawValue }

    public init(milliseconds: UInt64, counter: UInt16) {
        self.rawValue = (milliseconds << 16) | UInt64(counter)
    }

    public static let zero = HLC(rawValue: 0)

    /// The physical part, in milliseconds since the Unix epoch.
    public var milliseconds: UInt64 { rawValue >> 16 }
    /// The logical part that orders events within one millisecond.
    public var counter: UInt16 { UInt16(truncatingIfNeeded: rawValue) }

    public static func < (lhs: HLC, rhs: HLC) -> Bool { lhs.rawValue < rhs.rawValue }

    /// `milliseconds.counter`, e.g. `1764489600000.3`.
    public var description: String { "\(milliseconds).\(counter)" }
}

/// The timestamp of one write: totally ordered by (hlc, replica), so equal clock values are broken by
/// replica id and no two writes ever compare equal unless they are the same write.
public struct Stamp: Hashable, Comparable, Sendable, CustomStringConvertible {
    public var hlc: HLC
    public var replica: ReplicaID

    public init(hlc: HLC, replica: ReplicaID) {
        self.hlc = hlc
        self.replica = replica
    }

    @inline(__always)
    public static func < (lhs: Stamp, rhs: Stamp) -> Bool {
        lhs.hlc.rawValue != rhs.hlc.rawValue ? lhs.hlc.rawValue < rhs.hlc.rawValue
            : lhs.replica.rawValue < rhs.replica.rawValue
    }

    public var description: String { "\(hlc)@\(replica)" }
}

/// A remote timestamp the clock refused to follow.
public struct ClockError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The offending timestamp.
    public let remote: HLC
    /// The local physical time when it was refused, in milliseconds.
    public let localMilliseconds: UInt64
    /// The bound it exceeded, in milliseconds.
    public let maximumDriftMilliseconds: UInt64

    public var description: String {
        let ahead = remote.milliseconds &- localMilliseconds
        return "timestamp \(remote) is \(ahead) ms ahead of the local clock; at most \(maximumDriftMilliseconds) ms "
            + "is accepted (is the sending device's clock wrong?)"
    }
}

/// A hybrid logical clock (Kulkarni et al.) for one replica, reading time from an injected source.
///
/// - `now()` returns a stamp greater than every stamp this clock issued or observed before.
/// - `observe(_:)` advances the clock past a remote timestamp, so a write made after seeing another
///   write is always ordered after it.
/// - A remote timestamp more than `maximumDrift` ahead of local physical time is **rejected** with a
///   `ClockError`; it does not move the clock. Otherwise one replica with a clock a year fast would drag
///   every clock a year ahead and its writes would win every later conflict.
///
/// ```swift
/// var clock = HybridLogicalClock(replica: ReplicaID(1), time: { 1_764_489_600_000 })
/// let a = clock.now()        // 1764489600000.0@...01
/// let b = clock.now()        // 1764489600000.1@...01 (same millisecond: the counter moves)
/// ```
public struct HybridLogicalClock: Sendable {
    /// Five minutes, the default bound on how far ahead a remote timestamp may be.
    public static let defaultMaximumDrift: UInt64 = 5 * 60 * 1000

    public let replica: ReplicaID
    public let maximumDriftMilliseconds: UInt64
    /// The greatest clock value issued or observed so far.
    public private(set) var latest: HLC
    private let time: @Sendable () -> UInt64

    /// - Parameters:
    ///   - time: physical time in milliseconds since the Unix epoch (inject a fixed or stepping source in tests).
    ///   - latest: the last value persisted by a previous run, so a restarted replica never goes backwards.
    public init(replica: ReplicaID, maximumDriftMilliseconds: UInt64 = defaultMaximumDrift,
                latest: HLC = .zero, time: @escaping @Sendable () -> UInt64) {
        self.replica = replica
        self.maximumDriftMilliseconds = maximumDriftMilliseconds
        self.latest = latest
        self.time = time
    }

    /// A fresh stamp for a local write.
    public mutating func now() -> Stamp {
        let physical = HLC(milliseconds: min(time(), HLC.maximumMilliseconds), counter: 0)
        latest = physical > latest ? physical : HLC(rawValue: latest.rawValue &+ 1)
        return Stamp(hlc: latest, replica: replica)
    }

    /// Checks a remote timestamp against the drift bound without moving the clock.
    public func check(_ remote: HLC) throws(ClockError) {
        let physical = time()
        let (bound, overflow) = physical.addingReportingOverflow(maximumDriftMilliseconds)
        if !overflow && remote.milliseconds > bound {
            throw ClockError(remote: remote, localMilliseconds: physical,
                             maximumDriftMilliseconds: maximumDriftMilliseconds)
        }
    }

    /// Advances the clock past a remote timestamp after checking the drift bound.
    public mutating func observe(_ remote: HLC) throws(ClockError) {
        try check(remote)
        if remote > latest { latest = remote }
    }
}

extension HLC {
    /// The largest millisecond value the 48-bit physical part holds (year 10889).
    public static let maximumMilliseconds: UInt64 = (1 << 48) - 1
}
