/// For each replica, the greatest clock value of its operations that a state reflects.
///
/// `vector[r] == h` promises that every operation replica `r` stamped at or below `h` is reflected.
/// Entries are kept sorted by replica id; a missing replica means `HLC.zero` (nothing seen).
public struct VersionVector: Hashable, Sendable, CustomStringConvertible {
    public struct Entry: Hashable, Sendable {
        public var replica: ReplicaID
        public var hlc: HLC
        public init(replica: ReplicaID, hlc: HLC) {
            self.replica = replica
            self.hlc = hlc
        }
    }

    public private(set) var entries: [Entry]

    public init() { entries = [] }

    /// Builds a vector from entries in any order; for a repeated replica the greatest value counts.
    public init<S: Sequence>(_ entries: S) where S.Element == Entry {
        self.entries = []
        for entry in entries { advance(entry.replica, to: entry.hlc) }
    }

    /// Entries already sorted by replica with no repeats (decoders check this).
    init(sortedEntries: [Entry]) { entries = sortedEntries }

    public var isEmpty: Bool { entries.isEmpty }

    public subscript(replica: ReplicaID) -> HLC {
        for entry in entries where entry.replica == replica { return entry.hlc }
        return .zero
    }

    /// True when the operation stamped `stamp` is reflected.
    @inline(__always)
    public func covers(_ stamp: Stamp) -> Bool {
        for entry in entries where entry.replica == stamp.replica { return stamp.hlc <= entry.hlc }
        return false
    }

    /// Raises the entry for `replica` to at least `hlc`.
    public mutating func advance(_ replica: ReplicaID, to hlc: HLC) {
        var index = 0
        while index < entries.count {
            let current = entries[index]
            if current.replica == replica {
                if hlc > current.hlc { entries[index].hlc = hlc }
                return
            }
            if current.replica > replica { break }
            index += 1
        }
        if hlc > .zero { entries.insert(Entry(replica: replica, hlc: hlc), at: index) }
    }

    /// Records one operation.
    @inline(__always)
    public mutating func record(_ stamp: Stamp) { advance(stamp.replica, to: stamp.hlc) }

    /// Pointwise maximum (the join of version vectors).
    public mutating func merge(_ other: VersionVector) {
        if other.entries.isEmpty || other.entries == entries { return }
        if entries.isEmpty { entries = other.entries; return }
        var result: [Entry] = []
        result.reserveCapacity(entries.count + other.entries.count)
        var i = 0, j = 0
        while i < entries.count || j < other.entries.count {
            if j == other.entries.count || (i < entries.count && entries[i].replica < other.entries[j].replica) {
                result.append(entries[i]); i += 1
            } else if i == entries.count || other.entries[j].replica < entries[i].replica {
                result.append(other.entries[j]); j += 1
            } else {
                result.append(Entry(replica: entries[i].replica, hlc: max(entries[i].hlc, other.entries[j].hlc)))
                i += 1; j += 1
            }
        }
        entries = result
    }

    public func merging(_ other: VersionVector) -> VersionVector {
        var copy = self
        copy.merge(other)
        return copy
    }

    /// True when `self` reflects everything `other` does (pointwise `>=`).
    public func dominates(_ other: VersionVector) -> Bool {
        other.entries.allSatisfy { self[$0.replica] >= $0.hlc }
    }

    /// True when some entry of `self` is above `other`: `self` holds something `other` lacks.
    public func exceeds(_ other: VersionVector) -> Bool {
        entries.contains { $0.hlc > other[$0.replica] }
    }

    /// The greatest clock value in the vector.
    public var maximumHLC: HLC { entries.map(\.hlc).max() ?? .zero }

    public var description: String {
        "[" + entries.map { "\($0.replica): \($0.hlc)" }.joined(separator: ", ") + "]"
    }
}
