import Testing

@testable import LatticeCore

@Suite struct SequenceDiffTests {
    func apply<E>(_ splices: [Splice<E>], to sequence: [E]) -> [E] {
        var result = sequence
        for splice in splices {
            result.replaceSubrange(splice.position..<(splice.position + splice.deleted), with: splice.inserted)
        }
        return result
    }

    /// The length of a longest common subsequence, by the textbook table (small inputs only).
    func lcs<E: Equatable>(_ a: [E], _ b: [E]) -> Int {
        var table = [[Int]](repeating: [Int](repeating: 0, count: b.count + 1), count: a.count + 1)
        for i in 0..<a.count {
            for j in 0..<b.count {
                table[i + 1][j + 1] = a[i] == b[j] ? table[i][j] + 1 : max(table[i][j + 1], table[i + 1][j])
            }
        }
        return table[a.count][b.count]
    }

    @Test func editsFarApartBecomeTwoSplices() {
        let old = Array("first paragraph\nsecond paragraph\n".unicodeScalars)
        let new = Array("first paragraph (Alice)\nsecond paragraph, edited\n".unicodeScalars)
        let splices = SequenceDiff.splices(from: old, to: new)
        #expect(splices.count == 2)
        #expect(splices.map(\.position) == [32, 15])
        #expect(apply(splices, to: old) == new)
    }

    @Test(arguments: Array(1...40) as [UInt64])
    func randomPairsGiveAShortestScript(seed: UInt64) {
        print("sequence diff, seed \(seed)")
        var random = SplitMix64(seed: seed)
        let old = (0..<Int.random(in: 0...60, using: &random)).map { _ in Int.random(in: 0..<4, using: &random) }
        var new = old
        for _ in 0..<Int.random(in: 0...8, using: &random) {
            if !new.isEmpty && Bool.random(using: &random) {
                new.remove(at: Int.random(in: 0..<new.count, using: &random))
            } else {
                new.insert(Int.random(in: 0..<4, using: &random), at: Int.random(in: 0...new.count, using: &random))
            }
        }
        let splices = SequenceDiff.splices(from: old, to: new)
        #expect(apply(splices, to: old) == new, "seed \(seed)")
        let changed = splices.reduce(0) { $0 + $1.deleted + $1.inserted.count }
        #expect(changed == old.count + new.count - 2 * lcs(old, new), "seed \(seed)")
        #expect(zip(splices, splices.dropFirst()).allSatisfy { $0.position > $1.position }, "seed \(seed)")
    }

    @Test func pastTheBudgetTheMiddleIsReplacedWhole() {
        let old = Array(0..<600), new = old.map { $0 % 2 == 0 ? $0 : -$0 }
        let splices = SequenceDiff.splices(from: old, to: new, workBudget: 10_000)
        #expect(splices.count == 1)
        #expect(apply(splices, to: old) == new)
        let fine = SequenceDiff.splices(from: old, to: new)
        #expect(apply(fine, to: old) == new)
        #expect(fine.count == 300)
    }
}
