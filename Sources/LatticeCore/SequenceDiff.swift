/// One change to a sequence: at `position`, delete `deleted` elements and insert `inserted`.
public struct Splice<Element: Hashable & Sendable>: Hashable, Sendable {
    public var position: Int
    public var deleted: Int
    public var inserted: [Element]

    public init(position: Int, deleted: Int, inserted: [Element]) {
        self.position = position
        self.deleted = deleted
        self.inserted = inserted
    }
}

/// The smallest set of splices that turns one sequence into another, within a bounded amount of work: how
/// a whole new list or text from a plain client becomes edits that leave others' concurrent edits
/// elsewhere in place.
///
/// The common prefix and suffix are cut off in O(n); the middle is compared with Myers' O((n + m) D)
/// algorithm (D the number of elements deleted and inserted) while the work stays under `workBudget`
/// steps. Past it, the middle is replaced whole: still correct, only concurrent edits inside it do not
/// survive. Splices come in descending position order, each position counted in the original sequence,
/// so applying them one after another never shifts a later one.
public enum SequenceDiff {
    public static let defaultWorkBudget = 4_000_000

    public static func splices<Element: Hashable & Sendable>(from old: [Element], to new: [Element],
                                                             workBudget: Int = defaultWorkBudget) -> [Splice<Element>] {
        var prefix = 0
        while prefix < old.count && prefix < new.count && old[prefix] == new[prefix] { prefix += 1 }
        var suffix = 0
        while suffix < old.count - prefix && suffix < new.count - prefix
                && old[old.count - 1 - suffix] == new[new.count - 1 - suffix] {
            suffix += 1
        }
        let a = old[prefix..<(old.count - suffix)], b = new[prefix..<(new.count - suffix)]
        if a.isEmpty && b.isEmpty { return [] }
        if a.isEmpty || b.isEmpty {
            return [Splice(position: prefix, deleted: a.count, inserted: Array(b))]
        }
        guard let script = myers(Array(a), Array(b), workBudget: workBudget) else {
            return [Splice(position: prefix, deleted: a.count, inserted: Array(b))]
        }
        // `script` holds, for each element of a and b, whether it is kept; group the changes between kept
        // elements into splices.
        var result: [Splice<Element>] = []
        var i = 0, j = 0
        let (keptA, keptB) = script
        while i < a.count || j < b.count {
            if i < a.count && j < b.count && keptA[i] && keptB[j] {
                i += 1
                j += 1
                continue
            }
            let start = i
            var deleted = 0
            while i < a.count && !keptA[i] { i += 1; deleted += 1 }
            var inserted: [Element] = []
            while j < b.count && !keptB[j] { inserted.append(b[b.startIndex + j]); j += 1 }
            result.append(Splice(position: prefix + start, deleted: deleted, inserted: inserted))
        }
        return result.reversed()
    }

    /// Myers' shortest edit script: which elements of `a` and of `b` are kept (a longest common subsequence),
    /// or nil when the work would pass `workBudget`.
    static func myers<Element: Equatable>(_ a: [Element], _ b: [Element], workBudget: Int) -> ([Bool], [Bool])? {
        let n = a.count, m = b.count
        let maximum = n + m
        let offset = maximum + 1
        var frontier = [Int](repeating: 0, count: 2 * maximum + 3)
        var history: [[Int]] = []
        var work = 0
        var found = -1
        search: for d in 0...maximum {
            // The frontier before step d, on the diagonals step d reads (-d...d): O(D^2) in all.
            history.append(Array(frontier[(offset - d)...(offset + d)]))
            var k = -d
            while k <= d {
                var x: Int
                if k == -d || (k != d && frontier[offset + k - 1] < frontier[offset + k + 1]) {
                    x = frontier[offset + k + 1]
                } else {
                    x = frontier[offset + k - 1] + 1
                }
                var y = x - k
                while x < n && y < m && a[x] == b[y] {
                    x += 1
                    y += 1
                    work += 1
                }
                frontier[offset + k] = x
                work += 1
                if x >= n && y >= m {
                    found = d
                    break search
                }
                k += 2
            }
            if work > workBudget || (d + 1) * (2 * d + 3) > workBudget { return nil }
        }
        guard found >= 0 else { return nil }
        // Walk back through the saved frontiers.
        var keptA = [Bool](repeating: false, count: n), keptB = [Bool](repeating: false, count: m)
        var x = n, y = m
        var d = found
        while d > 0 {
            let previous = history[d] // diagonal k at index k + d
            let k = x - y
            let fromAbove = k == -d || (k != d && previous[k - 1 + d] < previous[k + 1 + d])
            let previousK = fromAbove ? k + 1 : k - 1
            let previousX = previous[previousK + d]
            let previousY = previousX - previousK
            let startX = fromAbove ? previousX : previousX + 1
            let startY = startX - k
            // The diagonal from (startX, startY) to (x, y) is kept.
            while x > startX && y > startY {
                x -= 1
                y -= 1
                keptA[x] = true
                keptB[y] = true
            }
            x = previousX
            y = previousY
            d -= 1
        }
        while x > 0 && y > 0 {
            x -= 1
            y -= 1
            keptA[x] = true
            keptB[y] = true
        }
        return (keptA, keptB)
    }
}
