/// The identity of one element of a sequence: a Lamport counter and the replica that inserted it.
///
/// Ordered by counter, then replica. A replica gives each element it inserts the counter one past the
/// greatest the sequence holds, so an element's counter is greater than its parent's and than every
/// element its inserter had seen (the rule the order in `SequenceState` relies on).
public struct SequenceID: Hashable, Sendable, Comparable, CustomStringConvertible {
    public var counter: UInt64
    public var replica: ReplicaID

    public init(counter: UInt64, replica: ReplicaID) {
        self.counter = counter
        self.replica = replica
    }

    @inline(__always)
    public static func < (a: SequenceID, b: SequenceID) -> Bool {
        a.counter != b.counter ? a.counter < b.counter : a.replica.rawValue < b.replica.rawValue
    }

    /// The element inserted right after this one in the same run (the next counter, same replica).
    @inline(__always)
    var next: SequenceID { SequenceID(counter: counter &+ 1, replica: replica) }

    public var description: String { "\(counter)@\(replica)" }
}

/// A sequence edit that does not fit the sequence.
public struct SequenceError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        /// A position past the end.
        case outOfRange
        /// Counters would pass `SequenceState.maximumCounter`.
        case counterExhausted
    }
    public let code: Code
    public let message: String

    public var description: String { message }
}

/// One run of a sequence in document order: consecutive elements of one replica (counters `id.counter`,
/// `id.counter + 1`, ...), each the child of the one before, all visible or all deleted.
public struct SequenceRun: Hashable, Sendable {
    /// The first element.
    public var id: SequenceID
    public var length: Int
    /// The first element's parent: the element it was inserted after; nil for the sequence's start.
    public var parent: SequenceID?
    public var deleted: Bool

    /// The run's last element.
    public var last: SequenceID { SequenceID(counter: id.counter + UInt64(length) - 1, replica: id.replica) }

    /// True when `next` continues this run: the same replica, the next counter, the same deletion, and its
    /// parent is this run's last element.
    @inline(__always)
    func isContinued(by next: SequenceRun) -> Bool {
        next.id.replica == id.replica && next.id.counter == id.counter &+ UInt64(length) && next.deleted == deleted
            && next.parent == last
    }
}

/// A replicated sequence: an ordered list that keeps duplicates, or a text (elements are Unicode scalars).
///
/// **Order.** Every element has an id (`SequenceID`) and a parent, the element it was inserted right after
/// (none for the start). The document is the pre-order walk of that tree with each element's children in
/// descending id order (RGA, Roh et al. 2011). A new element gets a counter greater than any in the
/// sequence, so it lands right after its parent, where its writer put it; two replicas inserting at one
/// place at once both keep their elements, the newer insertion first. A run typed forwards is a chain of
/// children, so two people typing at one place at once never interleave character by character.
///
/// **Deletion** keeps the element as a tombstone (its id, parent and run, not its value), so a concurrent
/// insert after it still has a place. **Moves** are a delete and an insert; there is no move operation.
///
/// **The join** is a union of elements (a deleted element stays deleted) with the order recomputed from the
/// tree, so it is commutative, associative and idempotent; it costs O(r log r) for r runs. `context` records
/// the clock stamp of every edit, like an OR-set's, so the delta machinery can tell a newer state.
///
/// Storage: runs in document order in chunks of at most `chunkCapacity` with their visible counts, values
/// in one array (`values`), and a cached position, so an edit near the last one is O(chunk) and a far one
/// O(runs / chunk).
public struct SequenceState<Element: Hashable & Sendable>: Sendable {
    /// The largest counter a sequence may use (2^48 - 1): far beyond any real history, and small enough
    /// that counter arithmetic never overflows.
    public static var maximumCounter: UInt64 { (1 << 48) - 1 }

    struct Piece: Sendable {
        var run: SequenceRun
        /// Where the run's values start in `values`; -1 for a deleted run (its values are dropped).
        var start: Int
    }

    struct Chunk: Sendable {
        var pieces: [Piece]
        var visible: Int
    }

    static var chunkCapacity: Int { 64 }

    var chunks: [Chunk]
    /// The values of visible elements (and of elements deleted here since the last rebuild).
    var values: [Element]
    /// The stamps of the edits this state reflects.
    public private(set) var context: VersionVector
    /// The greatest counter in the sequence (0 when empty).
    public private(set) var greatestCounter: UInt64
    /// Visible elements.
    public private(set) var count: Int
    /// The chunk of the last lookup and the visible elements before it.
    var cursor = (chunk: 0, before: 0)
    /// In the cursor's chunk: the piece of the last lookup and the visible elements before it in the chunk.
    /// Edits change pieces only at or after it, so it stays true; a chunk split resets it.
    var pieceCursor = (piece: 0, before: 0)

    public init() {
        chunks = []
        values = []
        context = VersionVector()
        greatestCounter = 0
        count = 0
    }

    public var isEmpty: Bool { count == 0 }

    /// The newest edit this state reflects.
    public var latestOperation: HLC { context.maximumHLC }

    // MARK: Reading

    /// The visible elements in order.
    public var elements: [Element] {
        var result: [Element] = []
        result.reserveCapacity(count)
        for chunk in chunks {
            for piece in chunk.pieces where !piece.run.deleted {
                result.append(contentsOf: values[piece.start..<(piece.start + piece.run.length)])
            }
        }
        return result
    }

    /// Every run in document order, tombstones included, merged where one continues another.
    public var runs: [SequenceRun] {
        var result: [SequenceRun] = []
        for chunk in chunks {
            for piece in chunk.pieces {
                if let last = result.last, last.isContinued(by: piece.run) {
                    result[result.count - 1].length += piece.run.length
                } else {
                    result.append(piece.run)
                }
            }
        }
        return result
    }

    /// The visible runs in order with their values (who wrote what, for `lattice explain`).
    public var visibleRuns: [(run: SequenceRun, values: ArraySlice<Element>)] {
        var result: [(run: SequenceRun, values: ArraySlice<Element>)] = []
        for chunk in chunks {
            for piece in chunk.pieces where !piece.run.deleted {
                result.append((piece.run, values[piece.start..<(piece.start + piece.run.length)]))
            }
        }
        return result
    }

    // MARK: Local edits

    /// Inserts `newElements` so the first sits at visible `position`, as `stamp`'s replica; `stamp` is
    /// recorded in `context`. Returns the id of the first inserted element.
    @discardableResult
    @_specialize(where Element == Unicode.Scalar)
    @_specialize(where Element == ScalarValue)
    public mutating func insert(_ newElements: [Element], at position: Int, stamp: Stamp) throws(SequenceError) -> SequenceID? {
        guard position >= 0 && position <= count else {
            throw SequenceError(code: .outOfRange, message: "position \(position) is past the end (\(count) elements)")
        }
        let n = newElements.count
        guard n > 0 else { return nil }
        guard greatestCounter < Self.maximumCounter - UInt64(n) else {
            throw SequenceError(code: .counterExhausted, message: "the sequence has used every counter")
        }
        let id = SequenceID(counter: greatestCounter + 1, replica: stamp.replica)
        let start = values.count
        values.append(contentsOf: newElements)
        greatestCounter += UInt64(n)
        count += n
        context.record(stamp)
        let run = SequenceRun(id: id, length: n, parent: nil, deleted: false)
        guard position > 0 else {
            // First in the document: the root's newest child.
            if chunks.isEmpty { chunks.append(Chunk(pieces: [], visible: 0)) }
            chunks[0].pieces.insert(Piece(run: run, start: start), at: 0)
            chunks[0].visible += n
            cursor = (0, 0)
            pieceCursor = (0, 0)
            splitIfFull(0)
            return id
        }
        let (c, k, offset) = locate(position - 1)
        let parent = chunks[c].pieces[k]
        let parentID = SequenceID(counter: parent.run.id.counter + UInt64(offset), replica: parent.run.id.replica)
        let piece = Piece(run: SequenceRun(id: id, length: n, parent: parentID, deleted: false), start: start)
        if offset == parent.run.length - 1 {
            // After a run's last element: extend the run when the new elements continue it.
            if parent.run.id.replica == id.replica && parent.run.id.counter + UInt64(parent.run.length) == id.counter
                && parent.start + parent.run.length == start {
                chunks[c].pieces[k].run.length += n
            } else {
                chunks[c].pieces.insert(piece, at: k + 1)
            }
        } else {
            let (head, tail) = Self.split(parent, at: offset + 1)
            chunks[c].pieces[k] = head
            chunks[c].pieces.insert(piece, at: k + 1)
            chunks[c].pieces.insert(tail, at: k + 2)
        }
        chunks[c].visible += n
        splitIfFull(c)
        return id
    }

    /// Records `stamp` in `context` without touching the elements: an edit that changes nothing (such as
    /// one that creates an empty field) still travels in deltas, like every other edit.
    public mutating func noteEdit(_ stamp: Stamp) {
        context.record(stamp)
    }

    /// Deletes `length` visible elements from `position`, recording `stamp`. Returns how many it deleted.
    @discardableResult
    @_specialize(where Element == Unicode.Scalar)
    @_specialize(where Element == ScalarValue)
    public mutating func delete(from position: Int, length: Int, stamp: Stamp) throws(SequenceError) -> Int {
        // Compared without adding, so no input overflows.
        guard position >= 0 && length >= 0 && position <= count && length <= count - position else {
            throw SequenceError(code: .outOfRange, message: "\(length) elements from \(position) go past the end (\(count) elements)")
        }
        guard length > 0 else { return 0 }
        var remaining = length
        while remaining > 0 {
            let (c, k, offset) = locate(position)
            let piece = chunks[c].pieces[k]
            let taken = min(remaining, piece.run.length - offset)
            // The piece becomes up to three: before, deleted, after.
            var index = k
            if offset > 0 {
                let (head, tail) = Self.split(piece, at: offset)
                chunks[c].pieces[k] = head
                chunks[c].pieces.insert(tail, at: k + 1)
                index = k + 1
            }
            if taken < chunks[c].pieces[index].run.length {
                let (head, tail) = Self.split(chunks[c].pieces[index], at: taken)
                chunks[c].pieces[index] = head
                chunks[c].pieces.insert(tail, at: index + 1)
            }
            chunks[c].pieces[index].run.deleted = true
            chunks[c].pieces[index].start = -1
            absorbNeighbours(chunk: c, piece: index)
            chunks[c].visible -= taken
            count -= taken
            remaining -= taken
            splitIfFull(c)
        }
        context.record(stamp)
        return length
    }

    /// Merges the deleted piece at `k` with deleted neighbours in its chunk that continue the same run
    /// (backspacing over a run leaves one tombstone, not one per character).
    mutating func absorbNeighbours(chunk c: Int, piece k: Int) {
        var k = k
        if k > 0, chunks[c].pieces[k - 1].run.deleted, chunks[c].pieces[k - 1].run.isContinued(by: chunks[c].pieces[k].run) {
            chunks[c].pieces[k - 1].run.length += chunks[c].pieces[k].run.length
            chunks[c].pieces.remove(at: k)
            k -= 1
            if pieceCursor.piece > k { pieceCursor = (0, 0) }
        }
        if k + 1 < chunks[c].pieces.count, chunks[c].pieces[k + 1].run.deleted,
           chunks[c].pieces[k].run.isContinued(by: chunks[c].pieces[k + 1].run) {
            chunks[c].pieces[k].run.length += chunks[c].pieces[k + 1].run.length
            chunks[c].pieces.remove(at: k + 1)
        }
    }

    /// Splits a piece before its element `offset` (0 < offset < length).
    static func split(_ piece: Piece, at offset: Int) -> (Piece, Piece) {
        var head = piece, tail = piece
        head.run.length = offset
        tail.run.id.counter += UInt64(offset)
        tail.run.length = piece.run.length - offset
        tail.run.parent = SequenceID(counter: tail.run.id.counter - 1, replica: piece.run.id.replica)
        if piece.start >= 0 { tail.start = piece.start + offset }
        return (head, tail)
    }

    /// The chunk, piece and offset of the visible element at `position` (< count), from the cached cursor:
    /// an edit next to the last one finds its piece at once.
    @_specialize(where Element == Unicode.Scalar)
    @_specialize(where Element == ScalarValue)
    mutating func locate(_ position: Int) -> (chunk: Int, piece: Int, offset: Int) {
        var (c, before) = cursor
        if c >= chunks.count { (c, before) = (0, 0) }
        var (k, pieceBefore) = pieceCursor
        if c != cursor.chunk || k >= chunks[c].pieces.count { (k, pieceBefore) = (0, 0) }
        if position < before {
            (k, pieceBefore) = (0, 0)
            repeat {
                c -= 1
                before -= chunks[c].visible
            } while position < before
        } else if position >= before + chunks[c].visible {
            (k, pieceBefore) = (0, 0)
            repeat {
                before += chunks[c].visible
                c += 1
            } while position >= before + chunks[c].visible
        }
        cursor = (c, before)
        let inside = position - before
        let found: (Int, Int) = chunks[c].pieces.withUnsafeBufferPointer { pieces in
            if inside < pieceBefore {
                repeat {
                    k -= 1
                    if !pieces[k].run.deleted { pieceBefore -= pieces[k].run.length }
                } while inside < pieceBefore
            } else {
                while true {
                    if !pieces[k].run.deleted {
                        if inside < pieceBefore + pieces[k].run.length { break }
                        pieceBefore += pieces[k].run.length
                    }
                    k += 1
                }
            }
            return (k, pieceBefore)
        }
        pieceCursor = found
        return (c, found.0, inside - found.1)
    }

    mutating func splitIfFull(_ c: Int) {
        guard chunks[c].pieces.count > 2 * Self.chunkCapacity else { return }
        let tail = Array(chunks[c].pieces[Self.chunkCapacity...])
        chunks[c].pieces.removeSubrange(Self.chunkCapacity...)
        let moved = tail.reduce(0) { $0 + ($1.run.deleted ? 0 : $1.run.length) }
        chunks[c].visible -= moved
        chunks.insert(Chunk(pieces: tail, visible: moved), at: c + 1)
        pieceCursor = (0, 0)
        if cursor.chunk != c { cursor = (0, 0) }
    }

    // MARK: Join

    /// Joins `other` into this state: the union of both sides' elements, in the order their tree gives.
    @_specialize(where Element == Unicode.Scalar)
    @_specialize(where Element == ScalarValue)
    public mutating func merge(_ other: SequenceState) {
        if other.chunks.isEmpty {
            context.merge(other.context)
            return
        }
        var merged = context
        merged.merge(other.context)
        if chunks.isEmpty {
            self = other
            context = merged
            return
        }
        let mine = SequenceJoin<Element>.Side(pieces: flatPieces, values: values)
        let theirs = SequenceJoin<Element>.Side(pieces: other.flatPieces, values: other.values)
        // Both sides list their shared elements in the same order, so one walk over both suffices; sides
        // that disagree (only malformed ones can) take the join that rebuilds the order from the tree.
        let joined = SequenceJoin.interleave(mine, theirs) ?? SequenceJoin.join([mine, theirs])
        self = SequenceState(ordered: joined.pieces, values: joined.values, context: merged)
    }

    var flatPieces: [Piece] { chunks.flatMap(\.pieces) }

    /// A state from pieces already in document order (merged where they continue each other).
    @_specialize(where Element == Unicode.Scalar)
    @_specialize(where Element == ScalarValue)
    init(ordered pieces: [Piece], values: [Element], context: VersionVector) {
        chunks = []
        var index = 0
        var greatest: UInt64 = 0
        var visible = 0
        while index < pieces.count {
            let end = min(pieces.count, index + Self.chunkCapacity)
            let slice = Array(pieces[index..<end])
            var chunkVisible = 0
            for piece in slice {
                if !piece.run.deleted { chunkVisible += piece.run.length }
                greatest = max(greatest, piece.run.id.counter + UInt64(piece.run.length) - 1)
            }
            chunks.append(Chunk(pieces: slice, visible: chunkVisible))
            visible += chunkVisible
            index = end
        }
        self.values = values
        self.context = context
        self.greatestCounter = greatest
        self.count = visible
    }
}

extension SequenceState: Equatable, Hashable {
    /// Equal when both hold the same runs, the same visible values and the same context.
    public static func == (a: SequenceState, b: SequenceState) -> Bool {
        a.context == b.context && a.count == b.count && a.runs == b.runs && a.elements == b.elements
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(context)
        hasher.combine(runs)
        hasher.combine(elements)
    }
}

/// The join of sequence states, on runs: the union of their elements with the order rebuilt from the tree.
enum SequenceJoin<Element: Hashable & Sendable> {
    typealias Piece = SequenceState<Element>.Piece

    struct Side {
        var pieces: [Piece]
        var values: [Element]
    }

    /// The joined pieces in document order (continuing runs merged) and their values. A piece whose parent
    /// is missing (only a malformed state has one) is never reached from the start and is left out.
    static func join(_ sides: [Side]) -> (pieces: [Piece], values: [Element]) {
        let segments = union(sides)
        let cut = splitAtParents(segments)
        return walk(cut, sides: sides)
    }

    /// The elements one side holds: for each replica, sorted disjoint counter ranges.
    struct Index {
        var ranges: [ReplicaID: [Range<UInt64>]] = [:]

        init(_ pieces: [Piece]) {
            var byReplica: [ReplicaID: [Range<UInt64>]] = [:]
            for piece in pieces {
                byReplica[piece.run.id.replica, default: []].append(piece.run.id.counter..<(piece.run.id.counter + UInt64(piece.run.length)))
            }
            for (replica, list) in byReplica {
                var sorted = list.sorted { $0.lowerBound < $1.lowerBound }
                var kept: [Range<UInt64>] = []
                kept.reserveCapacity(sorted.count)
                for range in sorted {
                    if let last = kept.last, last.upperBound >= range.lowerBound {
                        kept[kept.count - 1] = last.lowerBound..<max(last.upperBound, range.upperBound)
                    } else {
                        kept.append(range)
                    }
                }
                sorted = kept
                byReplica[replica] = sorted
            }
            ranges = byReplica
        }

        /// Whether `id` is held, and how many elements from it on share that answer (within its replica).
        func lookup(_ id: SequenceID) -> (held: Bool, span: UInt64) {
            guard let list = ranges[id.replica] else { return (false, .max) }
            var low = 0, high = list.count
            while low < high {
                let middle = (low + high) / 2
                if list[middle].upperBound <= id.counter { low = middle + 1 } else { high = middle }
            }
            guard low < list.count else { return (false, .max) }
            let range = list[low]
            if range.lowerBound <= id.counter { return (true, range.upperBound - id.counter) }
            return (false, range.lowerBound - id.counter)
        }
    }

    /// The join of two consistent sides in one walk over both (O(r + n) after indexing each): shared
    /// elements come in the same order on both sides; between them, an element only one side holds goes
    /// first when the other side's next element is shared, and of two elements each held by one side only,
    /// the greater id goes first (the walk's order then equals the tree's: an element after another in
    /// the tree with a greater id is in its subtree, so both sides hold the first). Nil when the sides
    /// list shared elements in different orders (malformed input).
    static func interleave(_ a: Side, _ b: Side) -> (pieces: [Piece], values: [Element])? {
        let indexA = Index(a.pieces), indexB = Index(b.pieces)
        var pieces: [Piece] = []
        pieces.reserveCapacity(max(a.pieces.count, b.pieces.count) + 8)
        var values: [Element] = []
        values.reserveCapacity(max(a.values.count, b.values.count) + 8)
        var i = 0, offsetA = 0, j = 0, offsetB = 0

        func emit(_ piece: Piece, offset: Int, length: Int, deleted: Bool, from side: Side, alternative: (Piece, Int, Side)?) {
            var run = piece.run
            if offset > 0 {
                run.id.counter += UInt64(offset)
                run.parent = SequenceID(counter: run.id.counter - 1, replica: run.id.replica)
            }
            run.length = length
            run.deleted = deleted
            var out = Piece(run: run, start: -1)
            if !deleted {
                out.start = values.count
                if piece.start >= 0 {
                    values.append(contentsOf: side.values[(piece.start + offset)..<(piece.start + offset + length)])
                } else if let (other, otherOffset, otherSide) = alternative, other.start >= 0 {
                    values.append(contentsOf: otherSide.values[(other.start + otherOffset)..<(other.start + otherOffset + length)])
                }
            }
            if let last = pieces.last, last.run.isContinued(by: out.run) {
                pieces[pieces.count - 1].run.length += length
            } else {
                pieces.append(out)
            }
        }

        /// Once the other side is done: emits what `piece` holds from `offset` on up to the next element the
        /// other side holds (none should be left); nil when the next element is one it holds.
        func emitRest(_ piece: Piece, offset: Int, from side: Side, against index: Index) -> Int? {
            let id = SequenceID(counter: piece.run.id.counter + UInt64(offset), replica: piece.run.id.replica)
            let held = index.lookup(id)
            if held.held { return nil }
            let n = Int(min(UInt64(piece.run.length - offset), held.span))
            emit(piece, offset: offset, length: n, deleted: piece.run.deleted, from: side, alternative: nil)
            return n
        }

        while i < a.pieces.count || j < b.pieces.count {
            if i < a.pieces.count && j < b.pieces.count {
                let pa = a.pieces[i], pb = b.pieces[j]
                let idA = SequenceID(counter: pa.run.id.counter + UInt64(offsetA), replica: pa.run.id.replica)
                let idB = SequenceID(counter: pb.run.id.counter + UInt64(offsetB), replica: pb.run.id.replica)
                let leftA = pa.run.length - offsetA, leftB = pb.run.length - offsetB
                if idA == idB {
                    let n = min(leftA, leftB)
                    let deleted = pa.run.deleted || pb.run.deleted
                    if pa.start >= 0 || deleted {
                        emit(pa, offset: offsetA, length: n, deleted: deleted, from: a, alternative: (pb, offsetB, b))
                    } else {
                        emit(pb, offset: offsetB, length: n, deleted: deleted, from: b, alternative: nil)
                    }
                    offsetA += n
                    offsetB += n
                } else {
                    let inB = indexB.lookup(idA), inA = indexA.lookup(idB)
                    let takeA: Bool
                    switch (inB.held, inA.held) {
                    case (false, false): takeA = idB < idA
                    case (false, true): takeA = true
                    case (true, false): takeA = false
                    case (true, true): return nil
                    }
                    if takeA {
                        let n = Int(min(UInt64(leftA), inB.span))
                        emit(pa, offset: offsetA, length: n, deleted: pa.run.deleted, from: a, alternative: nil)
                        offsetA += n
                    } else {
                        let n = Int(min(UInt64(leftB), inA.span))
                        emit(pb, offset: offsetB, length: n, deleted: pb.run.deleted, from: b, alternative: nil)
                        offsetB += n
                    }
                }
            } else if i < a.pieces.count {
                guard let n = emitRest(a.pieces[i], offset: offsetA, from: a, against: indexB) else { return nil }
                offsetA += n
            } else {
                guard let n = emitRest(b.pieces[j], offset: offsetB, from: b, against: indexA) else { return nil }
                offsetB += n
            }
            if i < a.pieces.count && offsetA == a.pieces[i].run.length { i += 1; offsetA = 0 }
            if j < b.pieces.count && offsetB == b.pieces[j].run.length { j += 1; offsetB = 0 }
        }
        return (pieces, values)
    }

    /// An element path entry of `isTreeOrder`.
    struct Open {
        var run: SequenceRun
        /// The counter of the run's last element still open (an element whose later child was seen
        /// closes the elements after it).
        var limit: UInt64
        /// The latest child of the element at `limit`.
        var lastChild: SequenceID?
    }

    /// True when `pieces` (holding no element twice) are the pre-order walk of their tree with children in
    /// descending id order, every parent present: each run's parent is an open element on the path from the
    /// start (popping what it closes), and comes after that element's previous child with a smaller id.
    /// O(r) for r runs.
    static func isTreeOrder(_ pieces: [Piece]) -> Bool {
        var path: [Open] = []
        var lastRootChild: SequenceID?
        for piece in pieces {
            let run = piece.run
            guard let parent = run.parent else {
                if let last = lastRootChild, !(run.id < last) { return false }
                lastRootChild = run.id
                path.removeAll(keepingCapacity: true)
                path.append(Open(run: run, limit: run.last.counter, lastChild: nil))
                continue
            }
            while let top = path.last, !(top.run.id.replica == parent.replica && top.run.id.counter <= parent.counter
                                         && parent.counter <= top.limit) {
                path.removeLast()
            }
            guard !path.isEmpty else { return false }
            let top = path.count - 1
            let previous: SequenceID?
            if parent.counter < path[top].limit {
                previous = parent.next
                path[top].limit = parent.counter
            } else {
                previous = path[top].lastChild
            }
            if let previous, !(run.id < previous) { return false }
            path[top].lastChild = run.id
            path.append(Open(run: run, limit: run.last.counter, lastChild: nil))
        }
        return true
    }

    /// A piece of the union with where its values come from (side, index into that side's values; -1 when
    /// deleted).
    struct Segment {
        var run: SequenceRun
        var side: Int
        var start: Int
    }

    /// The union of the sides' elements as disjoint segments, sorted by (replica, counter).
    static func union(_ sides: [Side]) -> [Segment] {
        var all: [Segment] = []
        all.reserveCapacity(sides.reduce(0) { $0 + $1.pieces.count })
        for (index, side) in sides.enumerated() {
            for piece in side.pieces { all.append(Segment(run: piece.run, side: index, start: piece.start)) }
        }
        all.sort { a, b in
            a.run.id.replica != b.run.id.replica ? a.run.id.replica.rawValue < b.run.id.replica.rawValue
                : a.run.id.counter < b.run.id.counter
        }
        guard sides.count > 1 else { return all }
        // Cut overlapping segments into disjoint ones: a deleted element stays deleted.
        var result: [Segment] = []
        result.reserveCapacity(all.count)
        var index = 0
        while index < all.count {
            // The group of segments of one replica that overlap one another.
            let replica = all[index].run.id.replica
            var groupEnd = index + 1
            var reach = all[index].run.id.counter + UInt64(all[index].run.length)
            while groupEnd < all.count && all[groupEnd].run.id.replica == replica && all[groupEnd].run.id.counter < reach {
                reach = max(reach, all[groupEnd].run.id.counter + UInt64(all[groupEnd].run.length))
                groupEnd += 1
            }
            if groupEnd == index + 1 {
                result.append(all[index])
            } else {
                cutGroup(all[index..<groupEnd], into: &result)
            }
            index = groupEnd
        }
        return result
    }

    /// Disjoint segments covering a group of overlapping ones (few: one per side, usually two).
    static func cutGroup(_ group: ArraySlice<Segment>, into result: inout [Segment]) {
        var bounds: [UInt64] = []
        for segment in group {
            bounds.append(segment.run.id.counter)
            bounds.append(segment.run.id.counter + UInt64(segment.run.length))
        }
        bounds.sort()
        var previous: UInt64?
        for bound in bounds {
            defer { previous = bound }
            guard let low = previous, bound > low else { continue }
            var chosen: Segment?
            var deleted = false
            var parent: SequenceID??
            for segment in group where segment.run.id.counter <= low && low < segment.run.id.counter + UInt64(segment.run.length) {
                let offset = Int(low - segment.run.id.counter)
                let own: SequenceID? = offset == 0 ? segment.run.parent
                    : SequenceID(counter: low - 1, replica: segment.run.id.replica)
                // Honest states agree on an element's parent; for ones that do not, the least wins.
                if let known = parent {
                    if Self.parentPrecedes(own, known) { parent = own }
                } else {
                    parent = own
                }
                deleted = deleted || segment.run.deleted
                if chosen == nil || (chosen!.start < 0 && segment.start >= 0) {
                    var piece = segment
                    piece.run.id.counter = low
                    piece.run.length = Int(bound - low)
                    if piece.start >= 0 { piece.start += offset }
                    chosen = piece
                }
            }
            guard var piece = chosen, let parent else { continue }
            piece.run.parent = parent
            piece.run.deleted = deleted
            if deleted { piece.start = -1 }
            result.append(piece)
        }
    }

    static func parentPrecedes(_ a: SequenceID?, _ b: SequenceID?) -> Bool {
        switch (a, b) {
        case (nil, nil): return false
        case (nil, _): return true
        case (_, nil): return false
        case let (a?, b?): return a < b
        }
    }

    /// Cuts segments after every element that is the parent of a segment other than its own continuation,
    /// so only a segment's last element has children besides the next element of its run.
    static func splitAtParents(_ segments: [Segment]) -> [Segment] {
        // Explicit parents, sorted like the segments.
        var parents: [SequenceID] = []
        for segment in segments {
            guard let parent = segment.run.parent else { continue }
            if parent.replica == segment.run.id.replica && parent.counter &+ 1 == segment.run.id.counter { continue }
            parents.append(parent)
        }
        guard !parents.isEmpty else { return segments }
        parents.sort { $0.replica != $1.replica ? $0.replica.rawValue < $1.replica.rawValue : $0.counter < $1.counter }
        var result: [Segment] = []
        result.reserveCapacity(segments.count + parents.count)
        var p = 0
        for segment in segments {
            var current = segment
            let replica = current.run.id.replica.rawValue
            // Skip parents before this segment.
            while p < parents.count && (parents[p].replica.rawValue < replica
                    || (parents[p].replica.rawValue == replica && parents[p].counter < current.run.id.counter)) {
                p += 1
            }
            while p < parents.count && parents[p].replica.rawValue == replica
                    && parents[p].counter < current.run.last.counter {
                let offset = Int(parents[p].counter - current.run.id.counter) + 1
                var head = current
                head.run.length = offset
                result.append(head)
                current.run.id.counter += UInt64(offset)
                current.run.length -= offset
                current.run.parent = SequenceID(counter: current.run.id.counter - 1, replica: current.run.id.replica)
                if current.start >= 0 { current.start += offset }
                p += 1
                while p < parents.count && parents[p] == parents[p - 1] { p += 1 }
            }
            result.append(current)
        }
        return result
    }

    /// The pre-order walk: each segment, then the children of its last element, newest first.
    static func walk(_ segments: [Segment], sides: [Side]) -> (pieces: [Piece], values: [Element]) {
        // Children grouped by parent, sorted by (parent, child descending).
        var order = Array(segments.indices)
        order.sort { a, b in
            let pa = segments[a].run.parent, pb = segments[b].run.parent
            if pa != pb { return parentPrecedes(pa, pb) }
            return segments[b].run.id < segments[a].run.id
        }
        // Where each parent's children begin in `order`: one dictionary entry per parent.
        var firstChild: [SequenceID: Int] = [:]
        firstChild.reserveCapacity(segments.count)
        var rootChildren = 0..<0
        var index = 0
        while index < order.count {
            let parent = segments[order[index]].run.parent
            var end = index + 1
            while end < order.count && segments[order[end]].run.parent == parent { end += 1 }
            if let parent { firstChild[parent] = index } else { rootChildren = index..<end }
            index = end
        }
        func children(of id: SequenceID) -> Range<Int> {
            guard let first = firstChild[id] else { return 0..<0 }
            var end = first + 1
            while end < order.count && segments[order[end]].run.parent == id { end += 1 }
            return first..<end
        }
        var pieces: [Piece] = []
        pieces.reserveCapacity(segments.count)
        var values: [Element] = []
        values.reserveCapacity(sides.reduce(0) { $0 + $1.values.count })
        var stack: [Int] = rootChildren.reversed().map { order[$0] }
        while let next = stack.popLast() {
            let segment = segments[next]
            var piece = Piece(run: segment.run, start: -1)
            if !segment.run.deleted {
                piece.start = values.count
                values.append(contentsOf: sides[segment.side].values[segment.start..<(segment.start + segment.run.length)])
            }
            if let last = pieces.last, last.run.isContinued(by: piece.run) {
                pieces[pieces.count - 1].run.length += piece.run.length
            } else {
                pieces.append(piece)
            }
            for child in children(of: segment.run.last).reversed() { stack.append(order[child]) }
        }
        return (pieces, values)
    }
}
