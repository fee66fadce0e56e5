/// An add-wins observed-remove set without tombstones (the optimized OR-set of Bieniusa et al., 2012).
///
/// State: live entries `(element, dot)`, where a dot is the `Stamp` of the add that created it, plus a
/// causal context: a `VersionVector` of every operation on this set that the state reflects. Removing
/// an element deletes its entries; the context remembers that their dots were seen, so a merge can tell
/// "removed here" (dot covered by my context, absent from my entries) from "not seen yet" (not covered).
///
/// - `add` replaces the element's observed dots with one fresh dot.
/// - `remove` drops the element's observed dots. A concurrent add (a dot the remover never saw)
///   survives: **add wins**.
/// - Entries are sorted by (element, dot), so `elements` comes out in ascending `ScalarValue` order,
///   the same on every replica.
public struct ORSet: Hashable, Sendable {
    public struct Entry: Hashable, Sendable {
        public var element: ScalarValue
        public var dot: Stamp
        public init(element: ScalarValue, dot: Stamp) {
            self.element = element
            self.dot = dot
        }
    }

    public private(set) var entries: [Entry]
    public private(set) var context: VersionVector

    public init() {
        entries = []
        context = VersionVector()
    }

    /// Rebuilds a set from decoded parts; entries are sorted and de-duplicated, and entries whose dot the
    /// context does not cover are kept (their dots are added to the context) so the state is well formed.
    public init(entries: [Entry], context: VersionVector) {
        var context = context
        var sorted = entries
        if !ORSet.isStrictlySorted(sorted) {
            sorted.sort(by: ORSet.entryPrecedes)
            sorted = sorted.enumerated().filter { $0.offset == 0 || sorted[$0.offset - 1] != $0.element }.map(\.element)
        }
        // The dots the context misses, added in one merge (O(n log n), not an insertion per dot).
        let missing = sorted.lazy.filter { !context.covers($0.dot) }.map { VersionVector.Entry(replica: $0.dot.replica, hlc: $0.dot.hlc) }
        context.merge(VersionVector(missing))
        self.entries = sorted
        self.context = context
    }

    /// Entries already strictly sorted and covered by `context` (decoders check this).
    init(sortedEntries: [Entry], context: VersionVector) {
        self.entries = sortedEntries
        self.context = context
    }

    /// The distinct visible elements, in ascending order.
    public var elements: [ScalarValue] {
        var result: [ScalarValue] = []
        result.reserveCapacity(entries.count)
        for entry in entries where result.last.map({ ScalarValue.compare($0, entry.element) != 0 }) ?? true {
            result.append(entry.element)
        }
        return result
    }

    public func contains(_ element: ScalarValue) -> Bool {
        entries.contains { ScalarValue.compare($0.element, element) == 0 }
    }

    /// The dots that keep `element` in the set (several after concurrent adds).
    public func dots(of element: ScalarValue) -> [Stamp] {
        entries.filter { ScalarValue.compare($0.element, element) == 0 }.map(\.dot)
    }

    /// The newest operation (add or remove) this state reflects.
    public var latestOperation: HLC { context.maximumHLC }

    public mutating func add(_ element: ScalarValue, at stamp: Stamp) {
        entries.removeAll { ScalarValue.compare($0.element, element) == 0 }
        let entry = Entry(element: element, dot: stamp)
        let index = entries.firstIndex { ORSet.entryPrecedes(entry, $0) } ?? entries.endIndex
        entries.insert(entry, at: index)
        context.record(stamp)
    }

    /// Removes the element as observed here. Removing an element never seen changes nothing but the context.
    public mutating func remove(_ element: ScalarValue, at stamp: Stamp) {
        entries.removeAll { ScalarValue.compare($0.element, element) == 0 }
        context.record(stamp)
    }

    /// Removes `removed` and adds `added` in one pass: each added element gets the single dot `stamp`
    /// (replacing the dots seen), each removed one loses its entries; an element in both ends up added.
    /// O((n + m) log(n + m)) for n entries and m elements. Returns false, changing nothing, when there is
    /// nothing to add and nothing present to remove.
    @discardableResult
    public mutating func apply(removing removed: [ScalarValue], adding added: [ScalarValue], at stamp: Stamp) -> Bool {
        let additions = ScalarValue.sortedUnique(added)
        let dropped = ScalarValue.sortedUnique(removed + additions)
        func isDropped(_ element: ScalarValue) -> Bool {
            var low = 0, high = dropped.count
            while low < high {
                let mid = (low + high) / 2
                let order = ScalarValue.compare(dropped[mid], element)
                if order == 0 { return true }
                if order < 0 { low = mid + 1 } else { high = mid }
            }
            return false
        }
        let kept = entries.filter { !isDropped($0.element) }
        if additions.isEmpty && kept.count == entries.count { return false }
        // Merge the kept entries (sorted) with the new ones (sorted by element; one dot each).
        var result: [Entry] = []
        result.reserveCapacity(kept.count + additions.count)
        var i = 0, j = 0
        while i < kept.count || j < additions.count {
            if j == additions.count || (i < kept.count && ScalarValue.compare(kept[i].element, additions[j]) < 0) {
                result.append(kept[i])
                i += 1
            } else {
                result.append(Entry(element: additions[j], dot: stamp))
                j += 1
            }
        }
        entries = result
        context.record(stamp)
        return true
    }

    /// The join: an entry survives if both sides hold it, or one side holds it and the other never saw its dot.
    public mutating func merge(_ other: ORSet) {
        if entries == other.entries {
            context.merge(other.context)
            return
        }
        var result: [Entry] = []
        result.reserveCapacity(max(entries.count, other.entries.count))
        var i = 0, j = 0
        let mine = entries, theirs = other.entries
        while i < mine.count || j < theirs.count {
            if j == theirs.count || (i < mine.count && ORSet.entryPrecedes(mine[i], theirs[j])) {
                if !other.context.covers(mine[i].dot) { result.append(mine[i]) }
                i += 1
            } else if i == mine.count || ORSet.entryPrecedes(theirs[j], mine[i]) {
                if !context.covers(theirs[j].dot) { result.append(theirs[j]) }
                j += 1
            } else {
                result.append(mine[i])
                i += 1
                j += 1
            }
        }
        entries = result
        context.merge(other.context)
    }

    public func merging(_ other: ORSet) -> ORSet {
        var copy = self
        copy.merge(other)
        return copy
    }

    @inline(__always)
    static func entryPrecedes(_ a: Entry, _ b: Entry) -> Bool {
        let order = ScalarValue.compare(a.element, b.element)
        return order != 0 ? order < 0 : a.dot < b.dot
    }

    static func isStrictlySorted(_ entries: [Entry]) -> Bool {
        var index = 1
        while index < entries.count {
            if !entryPrecedes(entries[index - 1], entries[index]) { return false }
            index += 1
        }
        return true
    }
}
