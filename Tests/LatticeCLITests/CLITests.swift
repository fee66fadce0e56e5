import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// The `lattice` client commands as people run them: the real binary against a real `lattice serve`, each
/// home (device) in its own directory.
@Suite(.serialized) struct CLITests {
    static let deadLink = "this share link is invalid, expired or revoked"

    // MARK: Tests

    @Test func twoHomesShareAListEditOfflineSyncAndShowTheSameList() throws {
        let world = try World()
        let created = try Self.ok("list", "create", "Groceries", "--json", home: world.alice)
        let list = try #require(try created.json["id"]?.stringValue)
        let milk = try Self.ok("list", "add", "Groceries", "Milk", "--tag", "dairy", "--json", home: world.alice).json
        #expect(milk["list"]?.stringValue == list)
        #expect(milk["synced"] == .bool(true))
        try Self.ok("list", "add", "Groceries", "Eggs", home: world.alice)

        let shown = try Self.ok("list", "show", "Groceries", "--json", home: world.alice).json
        #expect(Set(shown.objectValue?.keys.map { $0 } ?? []) == ["id", "title", "owner", "permission", "items"])
        #expect(shown["id"]?.stringValue == list && shown["title"]?.stringValue == "Groceries")
        #expect(shown["owner"]?.stringValue == "alice" && shown["permission"]?.stringValue == "owner")
        let items = try #require(shown["items"]?.arrayValue)
        #expect(items.map { $0["text"]?.stringValue } == ["Milk", "Eggs"])
        #expect(Set(items[0].objectValue?.keys.map { $0 } ?? []) == ["id", "text", "done", "tags", "position", "note", "attachments"])
        #expect(items[0]["tags"] == .array([.string("dairy")]) && items[0]["done"] == .bool(false))

        try Self.ok("share", "create", "Groceries", "--public-permission", "read-write", home: world.alice)
        let link = try Self.ok("share", "url", "Groceries", "--json", home: world.alice)
        let url = try #require(try link.json["url"]?.stringValue)
        let accepted = try Self.ok("accept", url, "--yes", "--json", home: world.bob).json
        #expect(accepted == .object(["id": .string(list), "title": .string("Groceries"), "owner": .string("alice"),
                                     "permission": .string("readWrite")]))
        // The home from --home given before the command, or from $LATTICE_HOME.
        let bobsLists = try Self.ok("--home", world.bob, "--json", "lists").json
        let (whoami, whoamiOutput, whoamiErrors) = try Self.start(["whoami", "--json"], home: nil,
                                                                  latticeHome: world.bob)
        whoami.waitUntilExit()
        _ = whoamiErrors.finish()
        #expect(try JSON.parse(whoamiOutput.finish())["name"]?.stringValue == "bob")
        #expect(bobsLists == .array([.object(["id": .string(list), "title": .string("Groceries"),
                                              "owner": .string("alice"), "shared": .bool(true),
                                              "permission": .string("readWrite")])]))

        // Both offline: the same item's text on both sides; the tag removed on one side and added on the other.
        let queued = try Self.ok("list", "edit", "Groceries", "Milk", "--text", "Oat milk", "--remove-tag", "dairy",
                                 "--no-sync", home: world.alice)
        #expect(queued.stdout.contains("queued (1 change pending); run lattice sync when online"), "\(queued)")
        try Self.ok("list", "edit", "Groceries", "milk", "--text", "Whole milk", "--add-tag", "dairy",
                    "--add-tag", "cold", "--no-sync", home: world.bob)
        let bread = try Self.ok("list", "add", "Groceries", "Bread", "--no-sync", "--json", home: world.bob).json
        #expect(bread["synced"] == .bool(false) && bread["pending"] == .int(2))
        try Self.ok("list", "check", "Groceries", "Eggs", "--no-sync", home: world.alice)

        try Self.ok("sync", home: world.bob)
        try Self.ok("sync", home: world.alice)
        let last = try Self.ok("sync", "--json", home: world.bob).json
        #expect(last["online"] == .bool(true) && last["pending"] == .int(0))

        let aliceView = try Self.ok("list", "show", "Groceries", "--json", home: world.alice).json
        let bobView = try Self.ok("list", "show", list, "--json", home: world.bob).json
        #expect(aliceView["items"] == bobView["items"])
        #expect(aliceView["title"] == bobView["title"] && aliceView["owner"] == bobView["owner"])
        #expect(bobView["permission"]?.stringValue == "readWrite")
        let merged = try #require(aliceView["items"]?.arrayValue)
        #expect(merged.map { $0["text"]?.stringValue ?? "" }.filter { $0.hasSuffix("milk") }.count == 1)
        let milkItem = try #require(merged.first { $0["text"]?.stringValue?.hasSuffix("milk") == true })
        #expect(["Oat milk", "Whole milk"].contains(milkItem["text"]?.stringValue ?? ""))
        #expect(milkItem["tags"] == .array([.string("cold"), .string("dairy")])) // add wins over the concurrent remove
        #expect(merged.contains { $0["text"] == .string("Bread") })
        #expect(merged.contains { $0["text"] == .string("Eggs") && $0["done"] == .bool(true) })

        let people = try Self.ok("list", "show", "Groceries", home: world.bob).stdout
        #expect(people.contains("[x] Eggs") && people.contains("#cold #dairy"), "\(people)")
    }

    /// `lattice explain`: the winning write of a field and of each tag, from this device and from another;
    /// a change not sent yet says so.
    @Test func explainNamesTheWinningWriteAndAnUnsentChange() throws {
        let world = try World()
        try Self.ok("list", "create", "Trip", home: world.alice)
        try Self.ok("list", "add", "Trip", "Tent", "--tag", "gear", home: world.alice)
        let mine = try Self.ok("explain", "Trip", "Tent", "text", "--json", home: world.alice).json
        #expect(mine["kind"]?.stringValue == "register" && mine["value"]?.stringValue == "Tent", "\(mine.serialized())")
        #expect(mine["winner"]?["thisDevice"] == .bool(true))
        let tags = try Self.ok("explain", "Trip", "Tent", "tags", "--json", home: world.alice).json
        #expect(tags["kind"]?.stringValue == "set" && tags["elements"]?.arrayValue?.first?["value"]?.stringValue == "gear",
                "\(tags.serialized())")
        let title = try Self.ok("explain", "Trip", "title", home: world.alice)
        #expect(title.stdout.contains("the write of this device"), "\(title)")

        // bob, who joins the list, sees alice's device as the writer.
        try Self.ok("share", "create", "Trip", "--public-permission", "read-write", home: world.alice)
        let link = try #require(try Self.ok("share", "url", "Trip", "--json", home: world.alice).json["url"]?.stringValue)
        try Self.ok("accept", link, "--yes", home: world.bob)
        let theirs = try Self.ok("explain", "Trip", "Tent", "text", "--json", home: world.bob).json
        #expect(theirs["winner"]?["thisDevice"] == .bool(false) && theirs["winner"]?["replica"] == mine["winner"]?["replica"],
                "\(theirs.serialized())")

        // A change not sent yet has no winner until the server has it.
        try Self.ok("list", "edit", "Trip", "Tent", "--text", "Big tent", "--no-sync", home: world.bob)
        let unsent = try Self.ok("explain", "Trip", "Big tent", "text", "--json", home: world.bob).json
        #expect(unsent == .object(["record": mine["record"] ?? .null, "field": .string("text"), "kind": .string("unsent"),
                                   "value": .string("Big tent")]), "\(unsent.serialized())")
        try Self.ok("sync", home: world.bob)
        let sent = try Self.ok("explain", "Trip", "Big tent", "text", "--json", home: world.bob).json
        #expect(sent["value"]?.stringValue == "Big tent" && sent["winner"]?["thisDevice"] == .bool(true), "\(sent.serialized())")
        let missing = try Self.lattice("explain", "Trip", "Big tent", "colour", home: world.bob)
        #expect(missing.status == 1 && missing.stderr.contains("has no field colour"), "\(missing)")
    }

    @Test func refusedWritesRevokedAccessAndDeadLinksAreReported() throws {
        let world = try World()
        let (list, url) = try world.sharedGroceries()

        // Made read-only behind bob's back: his next change is refused and undone.
        try Self.ok("share", "set-permission", "Groceries", "bob", "read-only", home: world.alice)
        let refused = try Self.lattice("list", "add", "Groceries", "Sneaky", home: world.bob)
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.stderr.contains("the server refused") && refused.stderr.contains("restored"), "\(refused)")
        let after = try Self.ok("list", "show", list, "--json", home: world.bob).json
        #expect(after["permission"]?.stringValue == "readOnly")
        #expect(after["items"]?.arrayValue?.map { $0["text"]?.stringValue } == ["Milk", "Eggs"])
        let readOnly = try Self.lattice("list", "check", "Groceries", "Milk", home: world.bob)
        #expect(readOnly.status == 1 && readOnly.stderr.contains("read-only"), "\(readOnly)")

        // A rotated link no longer works.
        try Self.ok("share", "url", "Groceries", "--rotate", home: world.alice)
        try Self.ok("signup", "carol", "--server", world.url, home: world.directory + "/carol")
        let stale = try Self.lattice("accept", url, "--yes", home: world.directory + "/carol")
        #expect(stale.status == 1 && stale.stderr.contains(Self.deadLink), "\(stale)")

        // Removing bob: his next sync says so and the list leaves his lists.
        let participants = try Self.ok("share", "participants", "Groceries", "--json", home: world.alice).json
        let names = participants["participants"]?.arrayValue?.compactMap { $0["name"]?.stringValue }
        #expect(names?.sorted() == ["alice", "bob"])
        try Self.ok("share", "remove", "Groceries", "bob", home: world.alice)
        let sync = try Self.ok("sync", home: world.bob)
        #expect(sync.stderr.contains("\"Groceries\" is no longer shared with you"), "\(sync)")
        #expect(try Self.ok("lists", "--json", home: world.bob).json == .array([]))

        // A deleted share's link fails the same way.
        let again = try Self.ok("share", "url", "Groceries", "--json", home: world.alice)
        let fresh = try #require(try again.json["url"]?.stringValue)
        try Self.ok("share", "delete", "Groceries", home: world.alice)
        let deleted = try Self.lattice("accept", fresh, "--yes", home: world.directory + "/carol")
        #expect(deleted.status == 1 && deleted.stderr.contains(Self.deadLink), "\(deleted)")
    }

    /// The server's "not now" is said at once: a second sign-up from one address, over `--signup-per-address
    /// 1`, exits 1 within 2 s (the hour-long Retry-After is not waited out) with the reason and when to try
    /// again.
    @Test func aRefusedSignUpSaysWhyAndWhenAtOnce() throws {
        let directory = temporaryDirectory("lattice-cli-signup")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try ServerUnderTest(data: directory + "/server", extra: ["--signup-per-address", "1"])
        defer { server.kill(SIGTERM) }
        let url = "http://127.0.0.1:\(server.port)"
        try Self.ok("signup", "ann", "--server", url, home: directory + "/ann")

        let started = Date()
        let second = try Self.lattice("signup", "bob", "--server", url, home: directory + "/bob")
        let seconds = Date().timeIntervalSince(started)
        #expect(second.status == 1, "\(second)")
        #expect(seconds < 2, "the refusal took \(seconds) s")
        #expect(second.stderr.contains("sign-up refused: too many sign-ups from this address"), "\(second)")
        #expect(second.stderr.contains("(THROTTLED); try again in 60 minutes"), "\(second)")
        #expect(!second.stderr.contains("waiting"), "nothing was waited for: \(second)")
    }

    @Test func usageErrorsExitTwoAndOtherErrorsExitOne() throws {
        let home = temporaryDirectory("lattice-cli-home")
        defer { try? FileManager.default.removeItem(atPath: home) }
        let usageMistakes: [[String]] = [
            [], ["frobnicate"], ["list"], ["list", "add", "Groceries"], ["list", "frob", "x"],
            ["list", "show", "a", "b"], ["list", "show", "a", "--tag", "x"], ["list", "edit", "L", "I"],
            ["lists", "--bogus"], ["share"], ["share", "url", "L", "--expires", "3x"],
            ["share", "url", "L", "--max-uses", "0"], ["share", "create", "L", "--public-permission", "everyone"],
            ["share", "set-permission", "L", "bob", "admin"], ["share", "invite", "L", "bob", "--role", "owner"],
            ["signup", "ann"], ["signup", "ann", "--server", "nope"], ["login", "--server", "http://127.0.0.1:1", "--token", "t", "--name", "x"],
            ["devices", "frob"], ["devices", "approve"],
            ["accept", "http://127.0.0.1:1/share/x"], ["sync", "--no-sync"], ["watch", "a", "b"], ["explain", "L"],
            ["help", "nothing"],
        ]
        for arguments in usageMistakes {
            let (process, output, errors) = try Self.start(arguments, home: arguments.isEmpty ? nil : home)
            process.waitUntilExit()
            let outcome = Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
            #expect(outcome.status == 2, "\(arguments): \(outcome)")
            #expect(outcome.stderr.contains("usage:"), "\(arguments): \(outcome)")
        }
        // Not signed in, a server that is not there: errors, not usage mistakes.
        let errors = [["lists"], ["whoami"], ["list", "show", "Groceries"],
                      ["signup", "ann", "--server", "http://127.0.0.1:1"],
                      ["login", "--server", "http://127.0.0.1:1"]] // the device sign-in (DeviceFlowCLITests), no server
        for arguments in errors {
            let (process, output, errors) = try Self.start(arguments, home: home)
            process.waitUntilExit()
            let outcome = Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
            #expect(outcome.status == 1, "\(arguments): \(outcome)")
        }
    }

    /// Key and token ids are base64url, so one in 64 begins with `-`: such an argument is the id, not an
    /// unknown option, and after `--` even one that begins with `--` is.
    @Test func anIdThatBeginsWithADashIsAnArgumentNotAnOption() throws {
        let data = temporaryDirectory("lattice-cli-dash")
        defer { try? FileManager.default.removeItem(atPath: data) }
        _ = try Self.ok("admin", "add-user", "dana", "--data", data)
        func run(_ arguments: [String]) throws -> Outcome {
            let (process, output, errors) = try Self.start(arguments, home: nil)
            process.waitUntilExit()
            return Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
        }
        for arguments in [["admin", "retire-share-key", "-6Irlq", "--data", data],
                          ["admin", "retire-share-key", "--data", data, "--", "--6Irlq"],
                          ["admin", "revoke-token", "-x1", "--data", data]] {
            let outcome = try run(arguments)
            #expect(outcome.status == 1, "\(arguments): \(outcome)")
            #expect(!outcome.stderr.contains("usage:") && outcome.stderr.contains(arguments.contains("--") ? "--6Irlq" : arguments[2]),
                    "\(arguments): \(outcome)")
        }
        let unknown = try run(["admin", "retire-share-key", "--6Irlq", "--data", data])
        #expect(unknown.status == 2 && unknown.stderr.contains("goes after --"), "\(unknown)")
    }

    @Test func helpTextsNameEveryCommand() throws {
        let top = try Self.ok("--help").stdout
        let commands = [
            "signup NAME --server URL", "login --server URL --token TOKEN", "whoami", "lists", "list create TITLE",
            "list show LIST", "list add LIST TEXT", "list check LIST ITEM", "list uncheck LIST ITEM",
            "list edit LIST ITEM", "list remove LIST ITEM", "list rename LIST TITLE", "list delete LIST", "sync",
            "watch [LIST]", "share create LIST", "share create --zone ZONE", "share invite LIST USER",
            "share set-permission LIST USER", "share remove LIST USER", "share participants LIST", "share url LIST",
            "share delete LIST", "share leave LIST", "accept URL [--yes]", "explain LIST ITEM FIELD",
            "serve --data DIR", "--home DIR", "--json", "--no-sync", "login --server URL ", "devices [approve CODE",
        ]
        for command in commands {
            #expect(top.contains(command), "lattice --help lacks \(command)")
        }
        let list = try Self.ok("list", "--help").stdout
        for subcommand in ["create", "show", "add", "check", "uncheck", "edit", "remove", "rename", "delete"] {
            #expect(list.contains("list \(subcommand) "), "lattice list --help lacks \(subcommand)")
        }
        #expect(list.contains("--add-tag T") && list.contains("--remove-tag T") && list.contains("--tag T"))
        let share = try Self.ok("share", "--help").stdout
        for subcommand in ["create", "invite", "set-permission", "remove", "participants", "url", "delete", "leave"] {
            #expect(share.contains("share \(subcommand) "), "lattice share --help lacks \(subcommand)")
        }
        let options = ["--public-permission", "--permission", "--role administrator", "--expires", "--max-uses",
                       "--rotate"]
        for option in options {
            #expect(share.contains(option), "lattice share --help lacks \(option)")
        }
        for command in ["signup", "login", "whoami", "lists", "sync", "watch", "accept", "explain"] {
            let help = try Self.ok(command, "--help").stdout
            #expect(help.hasPrefix("usage: lattice \(command)"), "\(command) --help: \(help)")
            #expect(try Self.ok("help", command).stdout == help)
        }
        #expect(try Self.ok("list", "add", "--help").stdout == list)
    }

    @Test func watchPrintsAnotherHomesChangeWithinTwoSecondsAndStopsCleanlyOnSIGINT() throws {
        let world = try World()
        let (list, _) = try world.sharedGroceries()
        let (watch, output, errors) = try Self.start(["watch", "Groceries"], home: world.bob)
        defer { if watch.isRunning { kill(watch.processIdentifier, SIGKILL) } }
        let ready = Date().addingTimeInterval(20)
        while !errors.text.contains("watching") && Date() < ready && watch.isRunning { usleep(20_000) }
        #expect(errors.text.contains("watching \"Groceries\""), "\(errors.text)")

        try Self.ok("list", "add", list, "Pancakes", "--tag", "breakfast", home: world.alice)
        let changed = Date()
        while !output.text.contains("Pancakes") && Date().timeIntervalSince(changed) < 5 { usleep(10_000) }
        let latency = Date().timeIntervalSince(changed)
        #expect(output.text.contains("+ Groceries: [ ] Pancakes  #breakfast"), "\(output.text)")
        #expect(latency < 2, "watch took \(latency) s")

        try Self.ok("list", "check", list, "Milk", home: world.alice)
        let checked = Date()
        while !output.text.contains("checked") && Date().timeIntervalSince(checked) < 5 { usleep(10_000) }
        #expect(output.text.contains("~ Groceries: [x] Milk  #dairy  (checked)"), "\(output.text)")

        kill(watch.processIdentifier, SIGINT)
        watch.waitUntilExit()
        #expect(watch.terminationReason == .exit && watch.terminationStatus == 0)
        _ = output.finish()
        _ = errors.finish()
    }
}
