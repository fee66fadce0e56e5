import Testing

@testable import LatticeCore

/// The straightforward sequence the run-based `SequenceState` is held to: one dictionary entry per element,
/// the order recomputed from the tree on every read (pre-order, children by descending id).
struct ReferenceSequence<Element: Hashable> {
    struct Node {
        var parent: SequenceID?
        var value: Element?
        var deleted: Bool
    }

    var nodes: [SequenceID: Node] = [:]
    var greatest: UInt64 = 0
    var context = VersionVector()

    var order: [SequenceID] {
        var children: [SequenceID?: [SequenceID]] = [:]
        for (id, node) in nodes { children[node.parent, default: []].append(id) }
        var result: [SequenceID] = []
        var stack: [SequenceID] = (children[nil] ?? []).sorted()
        while let id = stack.popLast() {
            result.append(id)
            stack.append(contentsOf: (children[id] ?? []).sorted())
        }
        return result
    }

    var visible: [SequenceID] { order.filter { !nodes[$0]!.deleted } }

    var elements: [Element] { visible.map { nodes[$0]!.value! } }

    mutating func insert(_ values: [Element], at position: Int, stamp: Stamp) {
        guard !values.isEmpty else { return }
        var parent = position == 0 ? nil : visible[position - 1]
        for value in values {
            greatest += 1
            let id = SequenceID(counter: greatest, replica: stamp.replica)
            nodes[id] = Node(parent: parent, value: value, deleted: false)
            parent = id
        }
        context.record(stamp)
    }

    mutating func delete(from position: Int, length: Int, stamp: Stamp) {
        guard length > 0 else { return }
        for id in visible[position..<(position + length)] { nodes[id]!.deleted = true }
        context.record(stamp)
    }

    mutating func merge(_ other: ReferenceSequence) {
        for (id, node) in other.nodes {
            if var mine = nodes[id] {
                if node.deleted {
                    mine.deleted = true
                    mine.value = nil
                }
                nodes[id] = mine
            } else {
                nodes[id] = node
            }
            greatest = max(greatest, id.counter)
        }
        context.merge(other.context)
    }

    /// Every element with its parent and deletion, for comparing with a `SequenceState`'s runs.
    var elementList: [(SequenceID, SequenceID?, Bool)] {
        order.map { ($0, nodes[$0]!.parent, nodes[$0]!.deleted) }
    }
}

extension SequenceState {
    /// Every element with its parent and deletion, in document order.
    var elementList: [(SequenceID, SequenceID?, Bool)] {
        var result: [(SequenceID, SequenceID?, Bool)] = []
        for run in runs {
            for offset in 0..<run.length {
                let id = SequenceID(counter: run.id.counter + UInt64(offset), replica: run.id.replica)
                let parent = offset == 0 ? run.parent : SequenceID(counter: id.counter - 1, replica: id.replica)
                result.append((id, parent, run.deleted))
            }
        }
        return result
    }
}

func sameElements(_ a: [(SequenceID, SequenceID?, Bool)], _ b: [(SequenceID, SequenceID?, Bool)]) -> Bool {
    a.count == b.count && zip(a, b).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 && $0.2 == $1.2 }
}

@Suite struct SequenceTests {
    let a = ReplicaID(0xA), b = ReplicaID(0xB), c = ReplicaID(0xC)

    func stamp(_ ms: UInt64, _ replica: ReplicaID) -> Stamp { Stamp(hlc: HLC(milliseconds: ms, counter: 0), replica: replica) }

    func text(_ string: String, by replica: ReplicaID, at ms: UInt64 = 1) throws -> TextState {
        var state = TextState()
        try state.insert(Array(string.unicodeScalars), at: 0, stamp: stamp(ms, replica))
        return state
    }

    @Test func typingMakesOneRunAndDeletesLeaveTombstones() throws {
        var state = TextState()
        for (index, scalar) in "hello".unicodeScalars.enumerated() {
            try state.insert([scalar], at: index, stamp: stamp(UInt64(index + 1), a))
        }
        #expect(state.text == "hello")
        #expect(state.runs == [SequenceRun(id: SequenceID(counter: 1, replica: a), length: 5, parent: nil, deleted: false)])
        try state.delete(from: 1, length: 3, stamp: stamp(10, a))
        #expect(state.text == "ho")
        #expect(state.runs.map(\.deleted) == [false, true, false])
        try state.insert(Array("ey".unicodeScalars), at: 1, stamp: stamp(11, a))
        #expect(state.text == "heyo")
        #expect(throws: SequenceError.self) { try state.insert(["x"], at: 5, stamp: stamp(12, a)) }
        #expect(throws: SequenceError.self) { try state.delete(from: 3, length: 2, stamp: stamp(12, a)) }
    }

    @Test func concurrentInsertsAtOnePlaceKeepBothNewerFirstAndDoNotInterleave() throws {
        let base = try text("ab", by: a)
        var left = base, right = base
        try left.insert(Array("xxx".unicodeScalars), at: 1, stamp: stamp(2, a))
        try right.insert(Array("yyy".unicodeScalars), at: 1, stamp: stamp(2, b))
        var joined = left
        joined.merge(right)
        var other = right
        other.merge(left)
        #expect(joined == other)
        // Same counters: replica b's run is the greater id, so it comes first.
        #expect(joined.text == "ayyyxxxb")
    }

    @Test func twoPeopleEditingDifferentParagraphsBothKeepTheirEdits() throws {
        let base = try text("first paragraph\nsecond paragraph\n", by: a)
        var alice = base, bob = base
        try alice.insert(Array(" (Alice)".unicodeScalars), at: 15, stamp: stamp(5, a))
        try bob.delete(from: 16, length: 6, stamp: stamp(5, b))
        try bob.insert(Array("2nd".unicodeScalars), at: 16, stamp: stamp(6, b))
        alice.merge(bob)
        #expect(alice.text == "first paragraph (Alice)\n2nd paragraph\n")
    }

    @Test func anEncodedStateRoundTripsAndTheDecoderRefusesNonCanonicalForms() throws {
        var state = try text("héllo wörld 👋", by: a)
        try state.delete(from: 2, length: 3, stamp: stamp(3, b))
        var other = try text("xyz", by: c, at: 2)
        other.merge(state)
        let bytes = other.encoded()
        let decoded = try TextState(decoding: bytes)
        #expect(decoded == other)
        #expect(decoded.encoded() == bytes)
        #expect(decoded.text == other.text)

        // Truncations and trailing bytes are refused, never crash.
        for cut in 0..<bytes.count { #expect(throws: CodecError.self) { try TextState(decoding: Array(bytes[..<cut])) } }
        #expect(throws: CodecError.self) { try TextState(decoding: bytes + [0]) }
        // Every single-byte change is either refused or decodes to a canonical state.
        for index in bytes.indices {
            for delta: UInt8 in [1, 0x80] {
                var changed = bytes
                changed[index] &+= delta
                if let state = try? TextState(decoding: changed) { #expect(state.encoded() == changed) }
            }
        }
    }

    @Test func runsOutOfTheTreesOrderAreRefused() throws {
        var left = try text("ab", by: a)
        left.merge(try text("cd", by: b))
        #expect(left.text == "cdab")
        let bytes = left.encoded()
        // context (2 entries of 9 bytes), 2 replicas of 8 bytes, the run count, then two runs of 4 bytes.
        let runs = 1 + 2 * 9 + 1 + 2 * 8 + 1
        #expect(bytes.count == runs + 8 + 1 + 4)
        var swapped = bytes
        swapped.replaceSubrange(runs..<(runs + 8), with: Array(bytes[(runs + 4)..<(runs + 8)] + bytes[runs..<(runs + 4)]))
        #expect(throws: CodecError.self) { try TextState(decoding: swapped) }
        // A run whose parent is written out as 9@A, which is not before it (nor present).
        var orphan = bytes
        orphan.replaceSubrange((runs + 7)..<(runs + 8), with: [4, 0, 9])
        #expect(throws: CodecError.self) { try TextState(decoding: orphan) }
    }

    @Test func aListKeepsOrderAndDuplicates() throws {
        var list = ListState()
        try list.insert([.int64(3), .int64(1), .int64(3), .int64(2)], at: 0, stamp: stamp(1, a))
        #expect(list.elements == [.int64(3), .int64(1), .int64(3), .int64(2)])
        let decoded = try ListState(decoding: list.encoded())
        #expect(decoded.elements == [.int64(3), .int64(1), .int64(3), .int64(2)])
        #expect(decoded == list)
    }

    /// Random edits and joins on three replicas, the run-based state held to the reference after every
    /// step, every state round-tripped through its bytes; at the end all replicas converge.
    @Test(arguments: Array(1...24) as [UInt64])
    func randomHistoriesMatchTheReferenceAndConverge(seed: UInt64) throws {
        print("sequence random history, seed \(seed)")
        var random = SplitMix64(seed: seed)
        let replicas = [a, b, c]
        var states = [TextState](repeating: TextState(), count: 3)
        var references = [ReferenceSequence<Unicode.Scalar>](repeating: ReferenceSequence(), count: 3)
        var ms: UInt64 = 1
        let alphabet = Array("abcdefghij".unicodeScalars)
        for step in 0..<300 {
            ms += 1
            let r = Int.random(in: 0..<3, using: &random)
            let stamp = Stamp(hlc: HLC(milliseconds: ms, counter: 0), replica: replicas[r])
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<5:
                let position = Int.random(in: 0...states[r].count, using: &random)
                let values = (0..<Int.random(in: 1...4, using: &random)).map { _ in alphabet.randomElement(using: &random)! }
                try states[r].insert(values, at: position, stamp: stamp)
                references[r].insert(values, at: position, stamp: stamp)
            case 5..<7 where states[r].count > 0:
                let position = Int.random(in: 0..<states[r].count, using: &random)
                let length = Int.random(in: 1...min(5, states[r].count - position), using: &random)
                try states[r].delete(from: position, length: length, stamp: stamp)
                references[r].delete(from: position, length: length, stamp: stamp)
            default:
                let from = Int.random(in: 0..<3, using: &random)
                // The one-walk join and the join that rebuilds the order from the tree agree.
                let mine = SequenceJoin<Unicode.Scalar>.Side(pieces: states[r].flatPieces, values: states[r].values)
                let theirs = SequenceJoin<Unicode.Scalar>.Side(pieces: states[from].flatPieces, values: states[from].values)
                if !mine.pieces.isEmpty && !theirs.pieces.isEmpty {
                    let walked = try #require(SequenceJoin.interleave(mine, theirs), "seed \(seed) step \(step)")
                    let rebuilt = SequenceJoin.join([mine, theirs])
                    #expect(walked.pieces.map(\.run) == rebuilt.pieces.map(\.run), "seed \(seed) step \(step)")
                    #expect(walked.values == rebuilt.values, "seed \(seed) step \(step)")
                }
                states[r].merge(states[from])
                references[r].merge(references[from])
            }
            #expect(states[r].elements == references[r].elements, "seed \(seed) step \(step)")
            #expect(sameElements(states[r].elementList, references[r].elementList), "seed \(seed) step \(step)")
            let decoded = try TextState(decoding: states[r].encoded())
            #expect(decoded == states[r], "seed \(seed) step \(step)")
            states[r] = decoded
        }
        // Join everything in two different orders: the same state, the same bytes.
        var forward = states[0], backward = states[2]
        forward.merge(states[1]); forward.merge(states[2])
        backward.merge(states[1]); backward.merge(states[0])
        #expect(forward == backward)
        #expect(forward.encoded() == backward.encoded())
        var reference = references[0]
        reference.merge(references[1]); reference.merge(references[2])
        #expect(forward.elements == reference.elements)
        // Idempotent, and absorbing a part changes nothing.
        var again = forward
        again.merge(forward)
        again.merge(states[1])
        #expect(again == forward)
    }

    @Test(arguments: [11, 12, 13] as [UInt64])
    func theJoinIsCommutativeAssociativeAndIdempotent(seed: UInt64) throws {
        print("sequence merge laws, seed \(seed)")
        var random = SplitMix64(seed: seed)
        let replicas = [a, b, c]
        var states = [ListState](repeating: ListState(), count: 3)
        for step in 0..<120 {
            let r = Int.random(in: 0..<3, using: &random)
            let stamp = Stamp(hlc: HLC(milliseconds: UInt64(step + 1), counter: 0), replica: replicas[r])
            if states[r].count > 0 && Int.random(in: 0..<4, using: &random) == 0 {
                try states[r].delete(from: Int.random(in: 0..<states[r].count, using: &random), length: 1, stamp: stamp)
            } else if Int.random(in: 0..<5, using: &random) == 0 {
                states[r].merge(states[Int.random(in: 0..<3, using: &random)])
            } else {
                try states[r].insert([.int64(Int64(step % 4))], at: Int.random(in: 0...states[r].count, using: &random), stamp: stamp)
            }
        }
        let (x, y, z) = (states[0], states[1], states[2])
        func join(_ p: ListState, _ q: ListState) -> ListState { var p = p; p.merge(q); return p }
        #expect(join(x, y) == join(y, x))
        #expect(join(join(x, y), z) == join(x, join(y, z)))
        #expect(join(x, x) == x)
        #expect(join(x, y).encoded() == join(y, x).encoded())
    }
}
