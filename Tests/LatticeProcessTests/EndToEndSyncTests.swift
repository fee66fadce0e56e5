import Foundation
import LatticeCore
import LatticeLists
@testable import LatticeSync
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Issue 6's end-to-end scenarios: a real `lattice serve` process on 127.0.0.1 and several homes driven
/// through the sync library over real HTTP.
@Suite(.serialized, .tags(.postgres)) struct EndToEndSyncTests {
    /// A server process and devices (homes) pointed at it.
    final class Cluster {
        let data = temporaryDirectory("lattice-e2e")
        let server: ServerUnderTest
        var url: String { "http://127.0.0.1:\(server.port)" }

        init() throws {
            server = try ServerUnderTest(data: data + "/server")
        }

        deinit {
            server.kill(SIGTERM)
            try? FileManager.default.removeItem(atPath: data)
        }

        /// A device. `offline` stops its syncs from reaching the server (edits queue locally).
        func device(_ label: String) throws -> Device {
            Device(engine: try ListsReplica(home: data + "/home-\(label)"))
        }
    }

    struct Device {
        let engine: ListsReplica
        var lists: Lists { Lists(replica: engine) }

        func list(_ title: String) throws -> ListSummary { try lists.resolve(title) }
        func items(_ title: String) throws -> [ListItem] { try lists.items(of: try list(title)) }

        /// A share URL for a list (hierarchy share created on first use).
        func shareURL(_ list: ListSummary, publicPermission: String, extra: [String: JSON] = [:]) async throws -> String {
            let zone: JSON = .object(["zoneName": .string(list.zone.zoneName)])
            let existing = try? await engine.callServer("private", "shares/lookup", .object(["zoneID": zone]))
            if existing?["shareRecordName"] == nil {
                let created = try await engine.callServer("private", "shares/create", .object([
                    "zoneID": zone, "rootRecordName": .string(list.id), "title": .string(list.title),
                    "publicPermission": .string(publicPermission),
                ]))
                precondition(created["shareRecordName"] != nil, created.serialized())
            }
            var body: [String: JSON] = ["zoneID": zone]
            for (key, value) in extra { body[key] = value }
            guard let url = try await engine.callServer("private", "shares/url", .object(body))["url"]?.stringValue else {
                throw HarnessError("no url")
            }
            return url
        }

        func accept(_ url: String) async throws -> JSON {
            let link = JSON.object(["shortGUIDs": .array([.object(["value": .string(url)])])])
            return try await engine.callServer("shared", "records/accept", link)["results"]?.arrayValue?.first ?? .null
        }
    }

    @Test func sharedListEditedOfflineOnBothSidesConverges() async throws {
        let seed = RandomSeed.current
        print("EndToEndSyncTests.sharedListEditedOfflineOnBothSidesConverges seed=\(seed)")
        var random = SplitMix64(seed: seed)
        let cluster = try Cluster()
        let alice = try cluster.device("alice")
        let bob = try cluster.device("bob")
        try await alice.engine.signUpAndSignIn(name: "alice", serverURL: cluster.url)
        try await bob.engine.signUpAndSignIn(name: "bob", serverURL: cluster.url)

        let list = try alice.lists.create(title: "Trip")
        let tent = try alice.lists.add("Tent", tags: ["gear"], to: list)
        _ = try alice.lists.add("Map", to: list)
        #expect(try await alice.engine.sync().queued == 0)
        let url = try await alice.shareURL(list, publicPermission: "readWrite")
        #expect(try await bob.accept(url)["participantStatus"]?.stringValue == "accepted")
        try await bob.engine.sync()
        #expect(try bob.items("Trip").map(\.text) == ["Tent", "Map"])

        // Offline on both sides: the same item's text; the tag removed on one side and added again on the other.
        try alice.lists.edit(tent, in: list, text: "Tent (2 person)", addTags: [], removeTags: ["gear"])
        let bobTent = try bob.lists.resolveItem("Tent", in: try bob.list("Trip"))
        try bob.lists.edit(bobTent, in: try bob.list("Trip"), text: "Big tent", addTags: ["gear", "heavy"], removeTags: [])
        _ = try bob.lists.add("Stove", to: try bob.list("Trip"))
        try alice.lists.setDone(try alice.lists.resolveItem("Map", in: list), in: list, true)

        // Syncs in a random order until quiet.
        for _ in 0..<4 {
            for device in [alice, bob].shuffled(using: &random) { try await device.engine.sync() }
        }
        let aliceView = try alice.items("Trip")
        let bobView = try bob.items("Trip")
        #expect(aliceView == bobView)
        let merged = try #require(aliceView.first { $0.id == tent.id })
        #expect(merged.tags.sorted() == ["gear", "heavy"]) // the add wins over the concurrent remove
        #expect(["Tent (2 person)", "Big tent"].contains(merged.text)) // a single winner
        #expect(aliceView.map(\.text).contains("Stove"))
        #expect(aliceView.first { $0.text == "Map" }?.done == true)
    }

    @Test func threeDevicesOfTwoUsersConvergeAfterAThousandRandomOperations() async throws {
        let seed = RandomSeed.current
        print("EndToEndSyncTests.threeDevicesOfTwoUsersConverge seed=\(seed)")
        var random = SplitMix64(seed: seed)
        let cluster = try Cluster()
        let laptop = try cluster.device("alice-laptop")
        let phone = try cluster.device("alice-phone")
        let bob = try cluster.device("bob")
        let alice = try await laptop.engine.signUpAndSignIn(name: "alice", serverURL: cluster.url)
        try await phone.engine.signIn(serverURL: cluster.url, token: alice.token)
        try await bob.engine.signUpAndSignIn(name: "bob", serverURL: cluster.url)
        let list = try laptop.lists.create(title: "Shared")
        try await laptop.engine.sync()
        _ = try await bob.accept(try await laptop.shareURL(list, publicPermission: "readWrite"))
        let devices = [laptop, phone, bob]
        for device in devices { try await device.engine.sync() }

        let words = ["apples", "bread", "cheese", "dates", "eggs", "figs"]
        for step in 0..<1_000 {
            let device = devices[Int.random(in: 0..<3, using: &random)]
            let mine = try device.list("Shared")
            let items = try device.lists.items(of: mine)
            switch Int.random(in: 0..<10, using: &random) {
            case 0..<3 where items.count < 40:
                _ = try device.lists.add(words.randomElement(using: &random)!, tags: [words.randomElement(using: &random)!], to: mine)
            case 3..<5 where !items.isEmpty:
                let item = items.randomElement(using: &random)!
                try device.lists.edit(item, in: mine, text: words.randomElement(using: &random)! + " \(step)",
                                      addTags: [words.randomElement(using: &random)!], removeTags: [])
            case 5..<7 where !items.isEmpty:
                let item = items.randomElement(using: &random)!
                try device.lists.edit(item, in: mine, text: nil, addTags: [], removeTags: item.tags.shuffled(using: &random).prefix(1).map { $0 })
            case 7 where !items.isEmpty:
                try device.lists.setDone(items.randomElement(using: &random)!, in: mine, Bool.random(using: &random))
            case 8 where items.count > 5:
                try device.lists.remove(items.randomElement(using: &random)!, in: mine)
            default:
                try await device.engine.sync() // a random sync point
            }
        }
        for _ in 0..<3 { for device in devices { try await device.engine.sync() } }
        let views = try devices.map { try $0.items("Shared") }
        #expect(views[0] == views[1] && views[1] == views[2], "seed \(seed)")
        #expect(try devices.allSatisfy { try $0.engine.pendingCount() == 0 })
    }

    @Test func readOnlyEditsAreRefusedAndRevocationRemovesTheList() async throws {
        let cluster = try Cluster()
        let alice = try cluster.device("alice")
        let bob = try cluster.device("bob")
        try await alice.engine.signUpAndSignIn(name: "alice", serverURL: cluster.url)
        let bobAccount = try await bob.engine.signUpAndSignIn(name: "bob", serverURL: cluster.url)
        let list = try alice.lists.create(title: "Chores")
        _ = try alice.lists.add("Dishes", to: list)
        try await alice.engine.sync()
        // A private share: bob is invited read-only and accepts the URL.
        _ = try await alice.engine.callServer("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string(list.zone.zoneName)]), "rootRecordName": .string(list.id),
        ]))
        _ = try await alice.engine.callServer("private", "shares/modify", .object([
            "zoneID": .object(["zoneName": .string(list.zone.zoneName)]),
            "participants": .array([.object(["operation": .string("invite"), "userName": .string("bob"),
                                             "permission": .string("readOnly")])]),
        ]))
        let url = try await alice.shareURL(list, publicPermission: "none")
        #expect(try await bob.accept(url)["participantPermission"]?.stringValue == "readOnly")
        try await bob.engine.sync()
        let shared = try bob.list("Chores")
        #expect(shared.permission == "readOnly")

        // An edit that gets past the local check is refused by the server and reverted.
        let dishes = try bob.lists.resolveItem("Dishes", in: shared)
        var record = try #require(try bob.engine.record(dishes.id, in: shared.zone))
        record["text"] = "Nope"
        try bob.engine.save(record, in: shared.zone)
        let report = try await bob.engine.sync()
        #expect(report.rejected.map(\.code) == ["PERMISSION_FAILURE"])
        #expect(try bob.items("Chores").map(\.text) == ["Dishes"])

        // Removal revokes: bob's next sync reports it and the list leaves his lists.
        _ = try await alice.engine.callServer("private", "shares/modify", .object([
            "zoneID": .object(["zoneName": .string(list.zone.zoneName)]),
            "participants": .array([.object(["operation": .string("remove"), "userRecordName": .string(bobAccount.userRecordName)])]),
        ]))
        let after = try await bob.engine.sync()
        #expect(after.removedZones.count == 1)
        #expect(try bob.lists.all().isEmpty)
    }

    @Test func urlsOfDeletedOrRotatedSharesFailClearly() async throws {
        let cluster = try Cluster()
        let alice = try cluster.device("alice")
        let bob = try cluster.device("bob")
        try await alice.engine.signUpAndSignIn(name: "alice", serverURL: cluster.url)
        try await bob.engine.signUpAndSignIn(name: "bob", serverURL: cluster.url)
        let list = try alice.lists.create(title: "Party")
        try await alice.engine.sync()
        let old = try await alice.shareURL(list, publicPermission: "readOnly")
        _ = try await alice.shareURL(list, publicPermission: "readOnly", extra: ["rotate": .bool(true)])
        let rotated = try await bob.accept(old)
        #expect(rotated["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
        #expect(rotated["reason"]?.stringValue == "the share link is invalid, expired or revoked")
        let fresh = try await alice.shareURL(list, publicPermission: "readOnly")
        _ = try await alice.engine.callServer("private", "shares/delete",
                                        .object(["zoneID": .object(["zoneName": .string(list.zone.zoneName)])]))
        #expect(try await bob.accept(fresh)["reason"]?.stringValue == "the share link is invalid, expired or revoked")
    }

    @Test func aZoneWideShareCarriesEveryListIncludingLaterOnes() async throws {
        let cluster = try Cluster()
        let alice = try cluster.device("alice")
        let bob = try cluster.device("bob")
        try await alice.engine.signUpAndSignIn(name: "alice", serverURL: cluster.url)
        try await bob.engine.signUpAndSignIn(name: "bob", serverURL: cluster.url)
        _ = try alice.lists.create(title: "One", zone: "Family")
        _ = try alice.lists.create(title: "Two", zone: "Family")
        try await alice.engine.sync()
        _ = try await alice.engine.callServer("private", "shares/create", .object([
            "zoneID": .object(["zoneName": .string("Family")]), "publicPermission": .string("readWrite"),
        ]))
        let url = try await #require(try alice.engine.callServer("private", "shares/url", .object([
            "zoneID": .object(["zoneName": .string("Family")]),
        ]))["url"]?.stringValue)
        _ = try await bob.accept(url)
        try await bob.engine.sync()
        #expect(try bob.lists.all().map(\.title) == ["One", "Two"])
        _ = try alice.lists.create(title: "Three", zone: "Family")
        try await alice.engine.sync()
        try await bob.engine.sync()
        #expect(try bob.lists.all().map(\.title) == ["One", "Three", "Two"])
    }
}
