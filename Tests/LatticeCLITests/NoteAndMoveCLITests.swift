import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// `lattice list note` and `lattice list move` between two homes (devices) of a real `lattice serve`: a note
/// is a text merged character by character, so two people who edit different paragraphs offline both keep
/// their edits; a move sets one position register, so concurrent moves and inserts converge without any
/// item shown twice.
@Suite(.serialized) struct NoteAndMoveCLITests {
    typealias World = LatticeCLI.World

    private static func items(_ home: String) throws -> [JSON] {
        try LatticeCLI.ok("list", "show", "Groceries", "--json", home: home).json["items"]?.arrayValue ?? []
    }

    private static func note(_ home: String, _ item: String = "Milk") throws -> String {
        try LatticeCLI.ok("list", "note", "Groceries", item, "--json", home: home).json["note"]?.stringValue ?? "(none)"
    }

    @Test func twoPeopleEditDifferentParagraphsOfOneNoteOfflineAndBothKeepTheirEdits() throws {
        let world = try World()
        _ = try world.sharedGroceries()
        let first = "Whole milk, 2 litres.\nThe green carton.\nFrom the corner shop."
        let set = try LatticeCLI.ok("list", "note", "Groceries", "Milk", first, "--json", home: world.alice).json
        #expect(set["synced"] == .bool(true))
        try LatticeCLI.ok("sync", home: world.bob)
        #expect(try Self.note(world.bob) == first)

        // Offline, alice rewrites the first paragraph and bob the last.
        try LatticeCLI.ok("list", "note", "Groceries", "Milk", "Oat milk, 1 litre.\nThe green carton.\nFrom the corner shop.",
                          "--no-sync", home: world.alice)
        let file = world.directory + "/bob-note.txt"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("Whole milk, 2 litres.\nThe green carton.\nFrom the market, if open.".utf8)))
        try LatticeCLI.ok("list", "note", "Groceries", "Milk", "--file", file, "--no-sync", home: world.bob)
        try LatticeCLI.ok("sync", home: world.alice)
        try LatticeCLI.ok("sync", home: world.bob)
        try LatticeCLI.ok("sync", home: world.alice)
        let merged = "Oat milk, 1 litre.\nThe green carton.\nFrom the market, if open."
        #expect(try Self.note(world.alice) == merged)
        #expect(try Self.note(world.bob) == merged)

        // The note shows under its item, and explain says who wrote which runs of it.
        let shown = try LatticeCLI.ok("list", "show", "Groceries", home: world.bob).stdout
        #expect(shown.contains("      The green carton."), "\(shown)")
        let explained = try LatticeCLI.ok("explain", "Groceries", "Milk", "note", "--json", home: world.alice).json
        #expect(explained["kind"] == .string("text"))
        let runs = try #require(explained["runs"]?.arrayValue)
        #expect(runs.map { $0["values"]?.arrayValue?.first?.stringValue ?? "" }.joined() == merged)
        #expect(runs.contains { $0["thisDevice"] == .bool(true) } && runs.contains { $0["thisDevice"] == .bool(false) },
                "runs from both devices: \(runs)")
        let text = try LatticeCLI.ok("explain", "Groceries", "Milk", "note", home: world.alice).stdout
        #expect(text.contains("a text merged character by character") && text.contains("this device"), "\(text)")

        // Clearing, and bad input.
        try LatticeCLI.ok("list", "note", "Groceries", "Milk", "", home: world.bob)
        try LatticeCLI.ok("sync", home: world.alice)
        #expect(try Self.note(world.alice) == "")
        let both = try LatticeCLI.lattice("list", "note", "Groceries", "Milk", "x", "--file", file, home: world.alice)
        #expect(both.status != 0 && both.stderr.contains("not both"), "\(both.stderr)")
        let missing = try LatticeCLI.lattice("list", "note", "Groceries", "Milk", "--file", world.directory + "/nope", home: world.alice)
        #expect(missing.status != 0 && missing.stderr.contains("cannot read"), "\(missing.stderr)")
    }

    @Test func concurrentMovesAndInsertsConvergeWithoutDuplicates() throws {
        let world = try World()
        _ = try world.sharedGroceries()
        for text in ["Bread", "Apples", "Tea"] { try LatticeCLI.ok("list", "add", "Groceries", text, home: world.alice) }
        try LatticeCLI.ok("sync", home: world.bob)
        #expect(try Self.items(world.bob).map { $0["text"]?.stringValue ?? "" } == ["Milk", "Eggs", "Bread", "Apples", "Tea"])

        let moved = try LatticeCLI.ok("list", "move", "Groceries", "Tea", "1", "--json", home: world.alice).json
        #expect(moved["position"] == .int(1) && moved["synced"] == .bool(true))
        #expect(try Self.items(world.alice).map { $0["text"]?.stringValue ?? "" } == ["Tea", "Milk", "Eggs", "Bread", "Apples"])

        // Offline on both: alice moves Bread to the top and Milk to the end; bob moves Bread to second place
        // (of his older view) and adds an item.
        try LatticeCLI.ok("list", "move", "Groceries", "Bread", "1", "--no-sync", home: world.alice)
        try LatticeCLI.ok("list", "move", "Groceries", "Milk", "5", "--no-sync", home: world.alice)
        try LatticeCLI.ok("list", "move", "Groceries", "Bread", "2", "--no-sync", home: world.bob)
        try LatticeCLI.ok("list", "add", "Groceries", "Cheese", "--no-sync", home: world.bob)
        try LatticeCLI.ok("sync", home: world.alice)
        try LatticeCLI.ok("sync", home: world.bob)
        try LatticeCLI.ok("sync", home: world.alice)
        let aliceOrder = try Self.items(world.alice).map { $0["text"]?.stringValue ?? "" }
        let bobOrder = try Self.items(world.bob).map { $0["text"]?.stringValue ?? "" }
        #expect(aliceOrder == bobOrder)
        #expect(aliceOrder.sorted() == ["Apples", "Bread", "Cheese", "Eggs", "Milk", "Tea"], "every item once: \(aliceOrder)")

        let past = try LatticeCLI.lattice("list", "move", "Groceries", "Tea", "99", home: world.alice)
        #expect(past.status != 0 && past.stderr.contains("past the end"), "\(past.stderr)")
        let zero = try LatticeCLI.lattice("list", "move", "Groceries", "Tea", "0", home: world.alice)
        #expect(zero.status != 0 && zero.stderr.contains("from 1"), "\(zero.stderr)")
    }
}
