import LatticeCore
import LatticeStore
import Testing

@Suite("Storage rules")
struct StorageRulesTests {
    /// The change tag is the zone row and the log position in base 36, as `String(_:radix:)` spells them,
    /// at the edges of every digit count and for a seeded sample.
    @Test func aChangeTagSpellsBothNumbersInBase36() {
        var values: [Int64] = [0, 1, 9, 10, 35, 36, 1_295, 1_296, 46_655, 46_656, Int64.max - 1, Int64.max]
        var power: Int64 = 36 // 36^1 to 36^12, the last power below Int64.max
        while true {
            values += [power - 1, power, power + 1]
            guard power <= Int64.max / 36 else { break }
            power *= 36
        }
        let seed = UInt64(RequestDeadline.nowNanoseconds())
        print("aChangeTagSpellsBothNumbersInBase36 seed \(seed)")
        var random = SplitMix64(seed: seed)
        values += (0..<200).map { _ in Int64.random(in: 0...Int64.max, using: &random) }
        for zone in values {
            for seq in values.prefix(24) + [Int64.random(in: 0...Int64.max, using: &random)] {
                #expect(StorageRules.changeTag(zoneRowID: zone, seq: seq)
                        == String(zone, radix: 36) + "-" + String(seq, radix: 36))
            }
        }
        #expect(StorageRules.changeTag(zoneRowID: 7, seq: 40) == "7-14")
        #expect(StorageRules.changeTag(zoneRowID: -1, seq: 5) == "-1-5")
    }
}
