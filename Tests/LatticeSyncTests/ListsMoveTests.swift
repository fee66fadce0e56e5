import Foundation
import LatticeCore
import LatticeLists
import LatticeSync
import Testing

/// `Lists.move`: an item lands exactly where asked, and when moves into one gap use up the doubles between
/// two neighbours, the items are renumbered without changing the order.
@Suite struct ListsMoveTests {
    @Test func movesIntoOneGapRenumberWhenTheDoublesRunOutAndKeepTheOrder() async throws {
        let world = try SyncWorld()
        let engine = try ListsReplica(home: world.directory + "/home-moves",
                                      transport: InProcessTransport(service: world.service, online: OnlineSwitch()))
        let lists = Lists(replica: engine)
        try await engine.signUpAndSignIn(name: "alice", serverURL: "http://127.0.0.1:8080")
        let list = try lists.create(title: "Groceries")
        var expected = ["a", "b", "c", "d", "e", "f"]
        for text in expected { _ = try lists.add(text, to: list) }
        var renumbered = 0
        // The last item to second place, again and again: each lands between the first and the one moved
        // before, so the gap halves every time (52 halvings use up a double's precision near 1).
        for _ in 0 ..< 60 {
            let items = try lists.items(of: list)
            let last = try #require(items.last)
            try lists.move(last, in: list, to: 2)
            expected.insert(expected.removeLast(), at: 1)
            let after = try lists.items(of: list)
            #expect(after.map(\.text) == expected)
            #expect(Set(after.map(\.position)).count == after.count, "positions are distinct: \(after.map(\.position))")
            if after.map(\.position) == [1, 2, 3, 4, 5, 6] { renumbered += 1 }
        }
        #expect(renumbered >= 1, "no move ran out of room between two neighbours")
        let items = try lists.items(of: list)
        #expect(throws: ListsError.self) { try lists.move(items[0], in: list, to: 0) }
        #expect(throws: ListsError.self) { try lists.move(items[0], in: list, to: 7) }
        try lists.move(items[0], in: list, to: 6)
        #expect(try lists.items(of: list).last?.id == items[0].id)
    }
}
