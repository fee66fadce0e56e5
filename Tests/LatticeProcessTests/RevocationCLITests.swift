import Foundation
import LatticeCore
import LatticeLists
@testable import LatticeSync
import LatticeTestSupport
import Testing

/// Issue 12's revocation bug, through the `lattice` binary against a real `lattice serve`: alice shares two
/// lists of her zone Lists (two hierarchy shares), bob accepts both, then loses one of them in each way
/// there is. His next sync drops exactly that list (its items and its share record too), says so, and drops
/// his unsent edits to it instead of sending them; the other list keeps working both ways.
@Suite(.serialized) struct RevocationCLITests {
    typealias World = CLITests.World

    enum Loss: String, CaseIterable {
        case removed, left, shareDeleted, publicPermissionNone, rootDeleted
    }

    /// One pair of lists shared with bob, with the ids the checks need.
    struct Pair {
        let trip: String, tripTitle: String, chores: String, choresTitle: String
        let tent: String, map: String, dishes: String
        let tripShare: String, choresShare: String
    }

    static func ok(_ arguments: String..., home: String) throws -> CLITests.Outcome {
        let (process, output, errors) = try CLITests.start(arguments, home: home)
        process.waitUntilExit()
        let outcome = CLITests.Outcome(status: process.terminationStatus, stdout: output.finish(),
                                       stderr: errors.finish())
        guard outcome.status == 0 else {
            throw HarnessError("lattice \(arguments.joined(separator: " ")) failed: \(outcome)")
        }
        return outcome
    }

    static func id(_ outcome: CLITests.Outcome) throws -> String {
        try #require(try outcome.json["id"]?.stringValue, "\(outcome)")
    }

    /// alice's "Trip <n>" (Tent, Map) and "Chores <n>" (Dishes), each shared read-write by link; bob accepts both.
    static func sharedPair(_ world: World, _ n: Int) throws -> Pair {
        let (trip, chores) = ("Trip \(n)", "Chores \(n)")
        let tripID = try id(ok("list", "create", trip, "--json", home: world.alice))
        let choresID = try id(ok("list", "create", chores, "--json", home: world.alice))
        let tent = try id(ok("list", "add", tripID, "Tent", "--json", home: world.alice))
        let map = try id(ok("list", "add", tripID, "Map", "--json", home: world.alice))
        let dishes = try id(ok("list", "add", choresID, "Dishes", "--json", home: world.alice))
        var shares: [String] = []
        for list in [tripID, choresID] {
            try ok("share", "create", list, "--public-permission", "read-write", home: world.alice)
            let url = try #require(try ok("share", "url", list, "--json", home: world.alice).json["url"]?.stringValue)
            let joined = try ok("accept", url, "--yes", "--json", home: world.bob).json
            #expect(joined["id"]?.stringValue == list && joined["permission"]?.stringValue == "readWrite", "\(joined)")
            shares.append(try id(ok("share", "participants", list, "--json", home: world.alice)))
        }
        return Pair(trip: tripID, tripTitle: trip, chores: choresID, choresTitle: chores, tent: tent, map: map,
                    dishes: dishes, tripShare: shares[0], choresShare: shares[1])
    }

    /// Takes Trip away from bob. Returns the output of the command that did it on bob's side, if any (leaving
    /// online syncs at once, so that command reports the loss).
    static func lose(_ loss: Loss, _ pair: Pair, _ world: World, offline: Bool) async throws -> CLITests.Outcome? {
        switch loss {
        case .removed:
            try ok("share", "remove", pair.trip, "bob", home: world.alice)
        case .left:
            if offline { return try ok("share", "leave", pair.trip, "--no-sync", home: world.bob) }
            return try ok("share", "leave", pair.trip, home: world.bob)
        case .shareDeleted:
            try ok("share", "delete", pair.trip, home: world.alice)
        case .publicPermissionNone:
            // The CLI has no command for it; alice's own engine makes the API call.
            let alice = try ListsReplica(home: world.alice)
            let reply = try await alice.callServer("private", "shares/modify", .object([
                "zoneID": .object(["zoneName": .string("Lists")]), "shareRecordName": .string(pair.tripShare),
                "publicPermission": .string("none"),
            ]))
            #expect(reply["publicPermission"]?.stringValue == "none", "\(reply.serialized())")
        case .rootDeleted:
            try ok("list", "delete", pair.trip, home: world.alice)
        }
        return nil
    }

    /// Names of the records bob's device holds in alice's zone.
    static func bobsRecords(_ world: World) throws -> Set<String> {
        let engine = try ListsReplica(home: world.bob)
        guard let zone = try engine.zones().first(where: { $0.database == "shared" && $0.zoneName == "Lists" }) else {
            return []
        }
        return Set(try engine.records(in: zone).map(\.recordID.recordName))
    }

    /// What must hold once bob's device heard of the loss: Trip and everything of it gone from his device,
    /// Chores there and writable, his edit to it reaching alice.
    static func checkAfterLoss(_ loss: Loss, _ pair: Pair, _ world: World, _ n: Int) throws {
        let label = "\(loss) #\(n)"
        let lists = try #require(try ok("lists", "--json", home: world.bob).json.arrayValue, "\(label)")
        #expect(!lists.contains { $0["id"]?.stringValue == pair.trip }, "\(label): bob still lists Trip: \(lists)")
        let chores = lists.first { $0["id"]?.stringValue == pair.chores }
        #expect(chores?["permission"]?.stringValue == "readWrite" && chores?["shared"] == .bool(true),
                "\(label): \(lists)")
        let show = try CLITests.lattice("list", "show", pair.trip, home: world.bob)
        #expect(show.status == 1 && show.stderr.contains("no list matches"), "\(label): \(show)")

        let held = try bobsRecords(world)
        for gone in [pair.trip, pair.tent, pair.map, pair.tripShare] {
            #expect(!held.contains(gone), "\(label): bob's device still holds \(gone) of Trip")
        }
        for kept in [pair.chores, pair.dishes, pair.choresShare] {
            #expect(held.contains(kept), "\(label): bob's device lost \(kept) of Chores")
        }

        let added = try ok("list", "add", pair.chores, "From bob \(n)", "--json", home: world.bob).json
        #expect(added["synced"] == .bool(true) && added["pending"] == .int(0), "\(label): \(added)")
        try ok("sync", home: world.alice)
        let alicesChores = try ok("list", "show", pair.chores, "--json", home: world.alice).json
        let texts = alicesChores["items"]?.arrayValue?.compactMap { $0["text"]?.stringValue } ?? []
        #expect(texts.contains("From bob \(n)") && texts.contains("Dishes"), "\(label): alice's Chores: \(texts)")

        // Reported once: the next sync has nothing more to say.
        let again = try ok("sync", "--json", home: world.bob)
        #expect(try again.json["noLongerShared"] == .array([]) && again.json["droppedEdits"] == .array([]),
                "\(label): \(again)")
        #expect(!again.stderr.contains("no longer shared"), "\(label): \(again)")
    }

    @Test func losingOneOfTwoSharesOfAZoneDropsExactlyThatListAtTheNextSync() async throws {
        let world = try World()
        for (n, loss) in Loss.allCases.enumerated() {
            let pair = try Self.sharedPair(world, n)
            let started = Date()
            let label = "\(loss) #\(n)"
            let immediate = try await Self.lose(loss, pair, world, offline: false)
            // Leaving syncs at once: that command reports it. Otherwise bob's next sync does.
            let outcome = try immediate ?? Self.ok("sync", "--json", home: world.bob)
            #expect(outcome.stderr.contains("\"\(pair.tripTitle)\" is no longer shared with you"),
                    "\(label): \(outcome)")
            if immediate == nil {
                let report = try outcome.json
                let lost = report["noLongerShared"]?.arrayValue ?? []
                #expect(lost.map { $0["id"]?.stringValue } == [pair.trip], "\(label): \(report)")
                #expect(lost.first?["title"]?.stringValue == pair.tripTitle
                        && lost.first?["owner"]?.stringValue == "alice")
                #expect(report["droppedEdits"] == .array([]) && report["removedZones"] == .array([]),
                        "\(label): \(report)")
            }
            try Self.checkAfterLoss(loss, pair, world, n)
            print("[revocation-cli] online \(loss): \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
        }
    }

    @Test func editsMadeOfflineToTheLostListAreDroppedAndReportedNeverSent() async throws {
        let world = try World()
        for (n, loss) in Loss.allCases.enumerated() {
            let pair = try Self.sharedPair(world, n)
            let started = Date()
            let label = "\(loss) #\(n)"
            // bob, offline: a new item, a check and a removal in Trip; a new item in Chores.
            let offline = try Self.id(Self.ok("list", "add", pair.trip, "Offline \(n)", "--no-sync", "--json",
                                              home: world.bob))
            try Self.ok("list", "check", pair.trip, "Tent", "--no-sync", home: world.bob)
            try Self.ok("list", "remove", pair.trip, "Map", "--no-sync", home: world.bob)
            try Self.ok("list", "add", pair.chores, "Offline chore \(n)", "--no-sync", home: world.bob)
            // Meanwhile alice edits Map (so the server's copy is newer than bob's, and only the server can tell
            // that his pending removal of it is out of reach), then Trip goes away; bob syncs later.
            try Self.ok("list", "edit", pair.trip, "Map", "--text", "Map \(n)", home: world.alice)
            _ = try await Self.lose(loss, pair, world, offline: true)
            let sync = try Self.ok("sync", "--json", home: world.bob)
            let report = try sync.json
            #expect(report["noLongerShared"]?.arrayValue?.map { $0["id"]?.stringValue } == [pair.trip],
                    "\(label): \(report)")
            let dropped = report["droppedEdits"]?.arrayValue ?? []
            #expect(Set(dropped.compactMap { $0["id"]?.stringValue }) == [offline, pair.tent, pair.map],
                    "\(label): \(report)")
            #expect(dropped.first { $0["id"]?.stringValue == pair.map }?["deletion"] == .bool(true),
                    "\(label): \(report)")
            #expect(report["sent"] == .int(1) && report["pending"] == .int(0) && report["rejected"] == .array([]),
                    "\(label): only the Chores item is sent: \(report)")
            #expect(sync.stderr.contains("\"\(pair.tripTitle)\" is no longer shared with you"), "\(label): \(sync)")
            #expect(sync.stderr.contains("your unsent change to \"Offline \(n)\" in \"\(pair.tripTitle)\" was dropped"),
                    "\(label): \(sync)")
            #expect(sync.stderr.contains("your unsent change to \"Tent\" in \"\(pair.tripTitle)\" was dropped"),
                    "\(label): \(sync)")

            // None of it reached alice; the Chores item did.
            try Self.ok("sync", home: world.alice)
            if loss != .rootDeleted {
                let trip = try Self.ok("list", "show", pair.trip, "--json", home: world.alice).json
                let items = trip["items"]?.arrayValue ?? []
                #expect(items.compactMap { $0["text"]?.stringValue } == ["Tent", "Map \(n)"],
                        "\(label): alice's Trip: \(trip)")
                #expect(items.allSatisfy { $0["done"] == .bool(false) }, "\(label): alice's Trip: \(trip)")
            }
            let chores = try Self.ok("list", "show", pair.chores, "--json", home: world.alice).json
            #expect(chores["items"]?.arrayValue?.contains { $0["text"]?.stringValue == "Offline chore \(n)" } == true,
                    "\(label): alice's Chores: \(chores)")
            try Self.checkAfterLoss(loss, pair, world, n)
            print("[revocation-cli] offline \(loss): \(String(format: "%.1f", Date().timeIntervalSince(started))) s")
        }
    }
}

extension RevocationCLITests {
    /// The last share of a zone lost: the zone goes (as before), its lists are named no longer shared and the
    /// unsent edits in it are reported dropped.
    @Test func losingTheOnlyShareOfAZoneReportsItsListsAndDroppedEdits() async throws {
        let world = try World()
        let solo = try Self.id(Self.ok("list", "create", "Solo", "--zone", "Solo", "--json", home: world.alice))
        try Self.ok("list", "add", solo, "Kept", home: world.alice)
        try Self.ok("share", "create", solo, "--public-permission", "read-write", home: world.alice)
        let url = try #require(try Self.ok("share", "url", solo, "--json", home: world.alice).json["url"]?.stringValue)
        try Self.ok("accept", url, "--yes", home: world.bob)
        let offline = try Self.id(Self.ok("list", "add", solo, "Offline", "--no-sync", "--json", home: world.bob))
        try Self.ok("share", "remove", solo, "bob", home: world.alice)

        let sync = try Self.ok("sync", "--json", home: world.bob)
        let report = try sync.json
        #expect(report["removedZones"]?.arrayValue?.map { $0["zone"]?.stringValue } == ["Solo"], "\(report)")
        #expect(report["noLongerShared"]?.arrayValue?.map { $0["id"]?.stringValue } == [solo], "\(report)")
        #expect(report["droppedEdits"]?.arrayValue?.map { $0["id"]?.stringValue } == [offline], "\(report)")
        #expect(report["sent"] == .int(0) && report["pending"] == .int(0), "\(report)")
        #expect(sync.stderr.contains("\"Solo\" is no longer shared with you"), "\(sync)")
        #expect(sync.stderr.contains("your unsent change to \"Offline\" in \"Solo\" was dropped"), "\(sync)")
        #expect(try Self.ok("lists", "--json", home: world.bob).json == .array([]))
        try Self.ok("sync", home: world.alice)
        let items = try Self.ok("list", "show", solo, "--json", home: world.alice).json["items"]?.arrayValue ?? []
        #expect(items.compactMap { $0["text"]?.stringValue } == ["Kept"])
    }
}
