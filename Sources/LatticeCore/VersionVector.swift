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
    /// O(n log n): the entries are sorted once, not inserted one by one.
    public init<S: Sequence>(_ entries: S) where S.Element == Entry {
        let sorted = entries.sorted { $0.replica != $1.replica ? $0.replica < $1.replica : $0.hlc < $1.hlc }
        var kept: [Entry] = []
        kept.reserveCapacity(sorted.count)
        for entry in sorted where entry.hlc > .zero {
            // Sorted by replica, then clock: the last of a replica's run is its greatest value.
            if let last = kept.last, last.replica == entry.replica { kept[kept.count - 1] = entry } else { kept.append(entry) }
        }
        self.entries = kept
    }

    /// Entries already sorted by replica with no repeats (decoders check this).
    init(sortedEntries: [Entry]) { entries = sortedEntries }

    public var isEmpty: Bool { entries.isEmpty }

    /// The index of `replica`'s entry, or where it would be inserted (binary search: O(log n)).
    @inline(__always)
    private func position(of replica: ReplicaID) -> (index: Int, found: Bool) {
        var low = 0, high = entries.count
        while low < high {
            let middle = (low + high) >> 1
            let current = entries[middle].replica
            if current == replica { return (middle, true) }
            if current < replica { low = middle + 1 } else { high = middle }
        }
        return (low, false)
    }

    public subscript(replica: ReplicaID) -> HLC {
        let (index, found) = position(of: replica)
        return found ? entries[index].hlc : .zero
    }

    /// True when the operation stamped `stamp` is reflected. O(log n).
    @inline(__always)
    public func covers(_ stamp: Stamp) -> Bool {
        let (index, found) = position(of: stamp.replica)
        return found && stamp.hlc <= entries[index].hlc
    }

    /// Raises the entry for `replica` to at least `hlc`.
    public mutating func advance(_ replica: ReplicaID, to hlc: HLC) {
        let (index, found) = position(of: replica)
        if found {
            if hlc > entries[index].hlc { entries[index].hlc = hlc }
        } else if hlc > .zero {
            entries.insert(Entry(replica: replica, hlc: hlc), at: index)
        }
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
