import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// A server data directory and a CLI home written by the release before record fields held sequences
/// (Tests/Fixtures/previous-release), opened by this one: the `*_LIST` fields written then were add-wins
/// sets and read as `*_SET` now, with the same values; they keep merging as sets (an add from the CLI home
/// stays add-wins); a `*_LIST` write converts one into an ordered list; a plain client's whole-string save
/// of a text is applied as a minimal diff, so a device's concurrent edit elsewhere in it survives.
@Suite(.serialized) struct PreviousReleaseTests {
    static let fixture = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fixtures/previous-release").path
    static let token = "lt_91c76eba2d4929b9de61a5be80feb9f3f5f3ceb04aca53eec5c4b5d6e1868da1"
    static let database = "/database/1/lattice/production/private/"
    /// The port the fixture's CLI home was signed in against.
    static let port: UInt16 = 18_093

    /// A field's value and type, without the CRDT state the answer also carries.
    static func plain(_ field: JSON?) -> JSON {
        .object(["value": field?["value"] ?? .null, "type": field?["type"] ?? .null])
    }

    static func lookup(_ names: [String], zone: String) throws -> [JSON] {
        try MigrateTests.post(port, database + "records/lookup", token: token, .object([
            "zoneID": .object(["zoneName": .string(zone)]),
            "records": .array(names.map { .object(["recordName": .string($0)]) })]))["records"]?.arrayValue ?? []
    }

    static func modify(_ record: String, zone: String = "Fixture", _ fields: [String: JSON]) throws -> JSON {
        let answer = try MigrateTests.post(port, database + "records/modify", token: token, .object([
            "zoneID": .object(["zoneName": .string(zone)]),
            "operations": .array([.object(["operationType": .string("forceUpdate"),
                                           "record": .object(["recordName": .string(record), "fields": .object(fields)])])])]))
        return answer["records"]?.arrayValue?.first ?? .null
    }

    @Test func dataWrittenBeforeSequencesKeepsWorkingAndConvertsOnAListWrite() throws {
        let directory = temporaryDirectory("lattice-previous-release")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try FileManager.default.copyItem(atPath: Self.fixture, toPath: directory + "/copy")
        let data = directory + "/copy/data", home = directory + "/copy/home"
        let server = try ServerUnderTest(arguments: ["--data", data, "--port", String(Self.port), "--access-log", "off"])
        defer { server.kill(SIGTERM) }

        // Stored sets read back with their values, typed as the sets they always were.
        let r1 = try #require(try Self.lookup(["r1"], zone: "Fixture").first)
        #expect(Self.plain(r1["fields"]?["numbers"]) == .object(["value": .array([.int(1), .int(2), .int(3)]), "type": .string("INT64_SET")]))
        #expect(Self.plain(r1["fields"]?["tags"]) == .object(["value": .array([.string("dairy"), .string("fresh")]), "type": .string("STRING_SET")]))
        #expect(r1["fields"]?["refs"]?["type"] == .string("REFERENCE_SET"))
        #expect(r1["fields"]?["title"]?["type"] == .string("STRING"))

        // add/remove keep set semantics on a stored set, whatever list type the client names.
        let tagged = try Self.modify("r1", ["tags": .object(["add": .array([.string("cold"), .string("dairy")]),
                                                               "type": .string("STRING_LIST")])])
        #expect(Self.plain(tagged["fields"]?["tags"]) == .object(["value": .array([.string("cold"), .string("dairy"), .string("fresh")]),
                                                        "type": .string("STRING_SET")]), "\(tagged)")

        // A list write converts the field: from now on it keeps order and repeats (CloudKit's meaning).
        let listed = try Self.modify("r1", ["numbers": .object(["value": .array([.int(3), .int(1), .int(3), .int(2)]),
                                                                  "type": .string("INT64_LIST")])])
        #expect(Self.plain(listed["fields"]?["numbers"]) == .object(["value": .array([.int(3), .int(1), .int(3), .int(2)]),
                                                           "type": .string("INT64_LIST")]), "\(listed)")
        let reread = try #require(try Self.lookup(["r1"], zone: "Fixture").first)
        #expect(reread["fields"]?["numbers"]?["value"] == .array([.int(3), .int(1), .int(3), .int(2)]))

        // The CLI home of the previous release opens, shows its list, and syncs; tags stay add-wins sets.
        let shown = try CLITests.ok("list", "show", "Groceries", "--json", home: home).json
        let items = try #require(shown["items"]?.arrayValue)
        #expect(items.map { $0["text"]?.stringValue ?? "" } == ["Milk", "Bread", "Apples"])
        #expect(items[2]["tags"] == .array([.string("fresh"), .string("fruit")]))
        try CLITests.ok("list", "edit", "Groceries", "Milk", "--add-tag", "cold", home: home)
        try CLITests.ok("list", "note", "Groceries", "Milk", "The green carton.", home: home)
        let synced = try CLITests.ok("sync", "--json", home: home).json
        #expect(synced["pending"] == .int(0), "\(synced)")
        let milkID = try #require(items[0]["id"]?.stringValue)
        let milk = try #require(try Self.lookup([milkID], zone: "Lists").first)
        #expect(Self.plain(milk["fields"]?["tags"]) == .object(["value": .array([.string("cold"), .string("dairy")]), "type": .string("STRING_SET")]),
                "\(milk)")
        #expect(Self.plain(milk["fields"]?["note"]) == .object(["value": .string("The green carton."), "type": .string("TEXT")]), "\(milk)")

        // The device edits the note's second paragraph offline while a plain JSON client saves the whole
        // note with its first paragraph changed: the server applies that save as a minimal diff, so after
        // the device syncs the note holds both edits.
        try CLITests.ok("list", "note", "Groceries", "Milk", "First paragraph.\nSecond paragraph.", home: home)
        try CLITests.ok("list", "note", "Groceries", "Milk", "First paragraph.\nSecond paragraph, from the device.",
                        "--no-sync", home: home)
        let plain = try Self.modify(milkID, zone: "Lists", ["note": .object([
            "value": .string("First paragraph, from a plain client.\nSecond paragraph."), "type": .string("TEXT")])])
        #expect(plain["fields"]?["note"]?["value"] == .string("First paragraph, from a plain client.\nSecond paragraph."), "\(plain)")
        try CLITests.ok("sync", home: home)
        let merged = "First paragraph, from a plain client.\nSecond paragraph, from the device."
        let both = try #require(try Self.lookup([milkID], zone: "Lists").first)
        #expect(both["fields"]?["note"]?["value"] == .string(merged), "\(both)")
        #expect(try CLITests.ok("list", "note", "Groceries", "Milk", "--json", home: home).json["note"] == .string(merged))

        // A plain update (not forceUpdate) made from an older read is refused, as CloudKit refuses it, so
        // a whole-string save never undoes an edit its sender did not see.
        let stale = try RawHTTPClient(port: Self.port).send(
            method: "POST", path: Self.database + "records/modify", headers: ["Authorization": "Bearer " + Self.token],
            body: JSON.object([
                "zoneID": .object(["zoneName": .string("Lists")]),
                "operations": .array([.object(["operationType": .string("update"), "record": .object([
                    "recordName": .string(milkID), "recordChangeTag": try #require(plain["recordChangeTag"]),
                    "fields": .object(["note": .object(["value": .string("Stale."), "type": .string("TEXT")])])])])])]).serializedBytes())
        let staleAnswer = try JSON.parse(stale.body)
        #expect(staleAnswer["records"]?.arrayValue?.first?["serverErrorCode"] == .string("CONFLICT"), "\(staleAnswer)")
    }
}
