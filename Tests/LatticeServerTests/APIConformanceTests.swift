import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// What third-party tools found (schemathesis against Docs/openapi.json, a naive CloudKit client): wrongly
/// typed zone ids, error items that break the schema or echo a secret, and missing zones in reads.
@Suite struct APIConformanceTests {
    /// Values of the wrong type for a zone id's string members.
    static let illTyped: [(label: String, value: JSON)] = [
        ("a number", .int(5)), ("a boolean", .bool(true)), ("an object", .object(["name": .string("ann")])),
        ("an array", .array([.string("ann")])), ("null", .null),
    ]

    struct World {
        let h: ServiceHarness
        let ann: String, annName: String
        let bob: String, bobName: String

        init() throws {
            h = try ServiceHarness()
            (ann, annName) = try h.signUp("ann")
            (bob, bobName) = try h.signUp("bob")
            try h.createZone("Lists", token: ann)
            let created = h.modify("Lists", [
                operation("create", "groceries", recordType: "List", fields: ["title": value(.string("Groceries"))]),
                operation("create", "milk", fields: ["text": value(.string("Milk"))],
                          extra: ["parent": .object(["recordName": .string("groceries")])]),
            ], token: ann)
            precondition(created.records.allSatisfy { $0["serverErrorCode"] == nil }, created.json.serialized())
        }

        func zoneNames(_ token: String) -> [String] {
            h.call("zones/list", token: token).zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue }
        }
    }

    // MARK: Wrongly typed zone ids

    /// Every endpoint that takes a zone id answers BAD_REQUEST naming the member, instead of reading a
    /// wrongly typed `ownerRecordName` as "the caller"; nothing is created or written.
    @Test(arguments: illTyped.map(\.label))
    func wronglyTypedOwnerRecordNameIsBadRequestEverywhere(_ label: String) throws {
        let w = try World()
        let bad = try #require(Self.illTyped.first { $0.label == label }).value
        let zoneID = JSON.object(["zoneName": .string("Lists"), "ownerRecordName": bad])

        let lookup = w.h.call("records/lookup", .object(["zoneID": zoneID, "records": .array([
            .object(["recordName": .string("milk")]),
        ])]), token: w.ann)
        #expect(lookup.status == 400 && lookup.code == "BAD_REQUEST", "\(label): \(lookup.json.serialized())")
        #expect(lookup["reason"]?.stringValue == "zoneID.ownerRecordName: must be a string")

        let query = w.h.call("records/query", .object(["zoneID": zoneID, "query": .object(["recordType": .string("Item")])]),
                             token: w.ann)
        #expect(query.status == 400 && query.code == "BAD_REQUEST", "\(label): \(query.json.serialized())")
        #expect(query["reason"]?.stringValue == "zoneID.ownerRecordName: must be a string")

        let modify = w.h.call("records/modify", .object(["zoneID": zoneID, "operations": .array([
            operation("create", "eggs", fields: ["text": value(.string("Eggs"))]),
        ])]), token: w.ann)
        #expect(modify.status == 400 && modify.code == "BAD_REQUEST", "\(label): \(modify.json.serialized())")
        #expect(modify["reason"]?.stringValue == "zoneID.ownerRecordName: must be a string")

        let changes = w.h.call("changes/zone", .object(["zones": .array([.object(["zoneID": zoneID])])]), token: w.ann)
        #expect(changes.status == 200)
        #expect(changes.zones.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST", "\(label): \(changes.json.serialized())")
        #expect(changes.zones.first?["reason"]?.stringValue == "zones[0].zoneID.ownerRecordName: must be a string")

        let zonesLookup = w.h.call("zones/lookup", .object(["zones": .array([.object(["zoneID": zoneID]), zoneID])]),
                                   token: w.ann)
        #expect(zonesLookup.zones.map { $0["serverErrorCode"]?.stringValue } == ["BAD_REQUEST", "BAD_REQUEST"],
                "\(label): \(zonesLookup.json.serialized())")
        #expect(zonesLookup.zones.map { $0["reason"]?.stringValue } == [
            "zones[0].zoneID.ownerRecordName: must be a string", "zones[1].ownerRecordName: must be a string",
        ])

        let created = w.h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"),
                     "zone": .object(["zoneID": .object(["zoneName": .string("Fresh"), "ownerRecordName": bad])])]),
        ])]), token: w.ann)
        #expect(created.zones.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST", "\(label): \(created.json.serialized())")
        #expect(created.zones.first?["reason"]?.stringValue
                == "operations[0].zone.zoneID.ownerRecordName: must be a string")

        // Nothing happened: no zone, no record.
        #expect(w.zoneNames(w.ann) == ["_defaultZone", "Lists"])
        let eggs = w.h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                       "records": .array([.object(["recordName": .string("eggs")])])]),
                            token: w.ann)
        #expect(eggs.records.first?["serverErrorCode"]?.stringValue == "NOT_FOUND")

        // In the shared and public databases too: BAD_REQUEST, not ZONE_NOT_FOUND.
        for database in ["shared", "public"] {
            let zone = JSON.object(["zoneName": .string(database == "public" ? "_defaultZone" : "Lists"), "ownerRecordName": bad])
            let reply = w.h.call("records/lookup", .object(["zoneID": zone, "records": .array([])]), token: w.bob,
                                 database: database)
            #expect(reply.status == 400 && reply.code == "BAD_REQUEST", "\(database) \(label): \(reply.json.serialized())")
        }
    }

    @Test(arguments: illTyped.map(\.label))
    func wronglyTypedZoneNameIsBadRequestEverywhere(_ label: String) throws {
        let w = try World()
        let bad = try #require(Self.illTyped.first { $0.label == label }).value
        let zoneID = JSON.object(["zoneName": bad])
        let lookup = w.h.call("records/lookup", .object(["zoneID": zoneID, "records": .array([])]), token: w.ann)
        #expect(lookup.status == 400 && lookup["reason"]?.stringValue == "zoneID.zoneName: must be a string",
                "\(label): \(lookup.json.serialized())")
        let changes = w.h.call("changes/zone", .object(["zones": .array([.object(["zoneID": zoneID])])]), token: w.ann)
        #expect(changes.zones.first?["reason"]?.stringValue == "zones[0].zoneID.zoneName: must be a string",
                "\(label): \(changes.json.serialized())")
        let zonesLookup = w.h.call("zones/lookup", .object(["zones": .array([zoneID])]), token: w.ann)
        #expect(zonesLookup.zones.first?["reason"]?.stringValue == "zones[0].zoneName: must be a string")
        let created = w.h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": zoneID])]),
        ])]), token: w.ann)
        #expect(created.zones.first?["reason"]?.stringValue == "operations[0].zone.zoneID.zoneName: must be a string")
        #expect(w.zoneNames(w.ann) == ["_defaultZone", "Lists"])
    }

    /// The forms that do mean the caller still do: left out, the placeholder, the caller's own name.
    @Test func ownerLeftOutPlaceholderOrOwnNameMeanTheCaller() throws {
        let w = try World()
        for owner: JSON? in [nil, .string(Zones.currentUserPlaceholder), .string(w.annName)] {
            var zoneID: [String: JSON] = ["zoneName": .string("Lists")]
            zoneID["ownerRecordName"] = owner
            let reply = w.h.call("records/lookup", .object(["zoneID": .object(zoneID), "records": .array([
                .object(["recordName": .string("milk")]),
            ])]), token: w.ann)
            #expect(reply.records.first?["recordName"]?.stringValue == "milk", "\(reply.json.serialized())")
            #expect(reply.records.first?["zoneID"] == .object(["zoneName": .string("Lists"), "ownerRecordName": .string(w.annName)]))
        }
    }

    // MARK: Error items of changes/zone

    /// Per-zone error items carry the zone id as the server read it (all strings, owner filled in), or no
    /// zone id when the request's was ill-formed; every answer fits the ZoneChangesResponse schema.
    @Test func zoneChangeErrorItemsEchoOnlyWellFormedZoneIDs() throws {
        let w = try World()
        let schema = try SchemaCheck.openAPI()
        let requests: [JSON] = [
            .object(["zoneID": .object(["zoneName": .string("Lists")])]),
            .object(["zoneID": .object(["zoneName": .string("Nope")])]),
            .object(["zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .string(w.bobName)])]),
            .object(["zoneID": .object(["zoneName": .int(7)])]),
            .object(["zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .bool(false)])]),
            .object(["zoneID": .string("Lists")]),
            .object(["syncToken": .string("x")]),
            .object(["zoneID": .object(["zoneName": .string("a/b")])]),
            // Another zone than item 0's: a request naming one zone twice is refused whole.
            .object(["zoneID": .object(["zoneName": .string("_defaultZone")]), "syncToken": .string("not a token")]),
        ]
        let reply = w.h.call("changes/zone", .object(["zones": .array(requests)]), token: w.ann)
        #expect(reply.status == 200)
        #expect(schema.violations(reply.json, schema: "ZoneChangesResponse") == [], "\(reply.json.serialized())")
        let items = reply.zones
        try #require(items.count == requests.count)
        func owned(_ name: String, by owner: String) -> JSON {
            .object(["zoneName": .string(name), "ownerRecordName": .string(owner)])
        }
        #expect(items[0]["serverErrorCode"] == nil && items[0]["records"]?.arrayValue?.count == 2)
        #expect(items[1]["serverErrorCode"]?.stringValue == "ZONE_NOT_FOUND")
        #expect(items[1]["zoneID"] == owned("Nope", by: w.annName) && items[1]["zoneName"]?.stringValue == "Nope")
        #expect(items[2]["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
        #expect(items[2]["zoneID"] == owned("Lists", by: w.bobName))
        for index in 3...7 {
            #expect(items[index]["serverErrorCode"]?.stringValue == "BAD_REQUEST", "\(items[index].serialized())")
            #expect(items[index]["zoneID"] == nil, "item \(index) echoes an ill-formed zone id: \(items[index].serialized())")
            #expect(items[index]["zoneName"]?.stringValue != nil)
        }
        #expect(items[3]["zoneName"]?.stringValue == "" && items[7]["zoneName"]?.stringValue == "a/b")
        #expect(items[8]["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        #expect(items[8]["zoneID"] == owned("_defaultZone", by: w.annName))
    }

    // MARK: Share-link error items

    /// A failed link's item has `"value": ""`, never the token; answers fit the ShareLinksResponse schema.
    @Test func shareLinkErrorItemsNeverEchoTheToken() throws {
        let w = try World()
        let schema = try SchemaCheck.openAPI()
        let share = w.h.call("shares/create", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                       "rootRecordName": .string("groceries")]), token: w.ann)
        #expect(share.status == 200, "\(share.json.serialized())")
        let invited = w.h.call("shares/modify", .object(["zoneID": .object(["zoneName": .string("Lists")]), "participants": .array([
            .object(["operation": .string("invite"), "userName": .string("bob"), "permission": .string("readWrite")]),
        ])]), token: w.ann)
        #expect(invited.status == 200, "\(invited.json.serialized())")
        let url = try #require(w.h.call("shares/url", .object(["zoneID": .object(["zoneName": .string("Lists")])]),
                                        token: w.ann)["url"]?.stringValue)
        let token = String(try #require(url.split(separator: "/").last))
        var tamperedBytes = Array(token.utf8)
        tamperedBytes[tamperedBytes.count - 3] = tamperedBytes[tamperedBytes.count - 3] == UInt8(ascii: "A")
            ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let tampered = String(decoding: tamperedBytes, as: UTF8.self)

        func links(_ operation: String, _ links: [JSON], as caller: String) throws -> [JSON] {
            let reply = w.h.call(operation, .object(["shortGUIDs": .array(links)]), token: caller, database: "shared")
            #expect(reply.status == 200, "\(operation): \(reply.json.serialized())")
            #expect(schema.violations(reply.json, schema: "ShareLinksResponse") == [], "\(operation): \(reply.json.serialized())")
            let body = String(decoding: reply.response.body, as: UTF8.self)
            #expect(!body.contains(token) && !body.contains(tampered), "\(operation) echoes a share token: \(body)")
            return reply["results"]?.arrayValue ?? []
        }
        func errors(_ results: [JSON]) -> [String?] { results.map { $0["serverErrorCode"]?.stringValue } }
        func values(_ results: [JSON]) -> [String?] { results.map { $0["value"]?.stringValue } }

        // records/resolve: a tampered link (as a URL and as a bare token), a non-string value, a good link.
        let resolved = try links("records/resolve", [
            .object(["value": .string(url.replacingOccurrences(of: token, with: tampered))]), .string(tampered),
            .object(["value": .int(5)]), .object(["value": .string(url)]),
        ], as: w.bob)
        #expect(errors(resolved) == ["ACCESS_DENIED", "ACCESS_DENIED", "BAD_REQUEST", nil], "\(resolved)")
        #expect(values(resolved) == ["", "", "", nil])

        // records/accept: the owner's own link, a tampered one, then bob joins, is removed and tries again.
        let own = try links("records/accept", [.object(["value": .string(url)]), .string(tampered)], as: w.ann)
        #expect(errors(own) == ["BAD_REQUEST", "ACCESS_DENIED"] && values(own) == ["", ""])
        #expect(errors(try links("records/accept", [.string(url)], as: w.bob)) == [nil])
        let removed = w.h.call("shares/modify", .object(["zoneID": .object(["zoneName": .string("Lists")]), "participants": .array([
            .object(["operation": .string("remove"), "userName": .string("bob")]),
        ])]), token: w.ann)
        #expect(removed.status == 200, "\(removed.json.serialized())")
        let again = try links("records/accept", [.string(url)], as: w.bob)
        #expect(errors(again) == ["PERMISSION_FAILURE"] && values(again) == [""])
    }

    // MARK: Reads in a missing zone

    /// As in CloudKit Web Services: a read naming a zone that does not exist is a whole-request 404
    /// ZONE_NOT_FOUND. `_defaultZone` always exists, so before its first write it reads as empty.
    @Test func readsInAMissingZoneAreZoneNotFound() throws {
        let w = try World()
        let schema = try SchemaCheck.openAPI()
        try w.h.createZone("Scratch", token: w.ann)
        let deleted = w.h.call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("delete"), "zone": .object(["zoneID": .object(["zoneName": .string("Scratch")])])]),
        ])]), token: w.ann)
        #expect(deleted.zones.first?["deleted"] == .bool(true))

        for zone in ["Nope", "Scratch"] {
            let zoneID = JSON.object(["zoneName": .string(zone)])
            let lookup = w.h.call("records/lookup", .object(["zoneID": zoneID, "records": .array([
                .object(["recordName": .string("milk")]),
            ])]), token: w.ann)
            #expect(lookup.status == 404 && lookup.code == "ZONE_NOT_FOUND", "\(zone): \(lookup.json.serialized())")
            #expect(lookup["reason"]?.stringValue == "zone \(zone) does not exist")
            #expect(schema.violations(lookup.json, schema: "Error") == [])
            let query = w.h.call("records/query", .object(["zoneID": zoneID, "query": .object(["recordType": .string("Item")])]),
                                 token: w.ann)
            #expect(query.status == 404 && query.code == "ZONE_NOT_FOUND", "\(zone): \(query.json.serialized())")
            #expect(schema.violations(query.json, schema: "Error") == [])
        }

        // An existing zone: per-record NOT_FOUND, and a query with no match is an empty page.
        let zoneID = JSON.object(["zoneName": .string("Lists")])
        let missing = w.h.call("records/lookup", .object(["zoneID": zoneID, "records": .array([
            .object(["recordName": .string("nope")]), .object(["recordName": .string("milk")]),
        ])]), token: w.ann)
        #expect(missing.status == 200 && missing.records.map { $0["serverErrorCode"]?.stringValue } == ["NOT_FOUND", nil])
        #expect(schema.violations(missing.json, schema: "RecordsResponse") == [], "\(missing.json.serialized())")
        let none = w.h.call("records/query", .object(["zoneID": zoneID, "query": .object(["recordType": .string("Nothing")])]),
                            token: w.ann)
        #expect(none.status == 200 && none.records.isEmpty)

        // _defaultZone before its first write.
        let defaultZone = JSON.object(["zoneName": .string("_defaultZone")])
        let early = w.h.call("records/lookup", .object(["zoneID": defaultZone, "records": .array([
            .object(["recordName": .string("milk")]),
        ])]), token: w.bob)
        #expect(early.status == 200 && early.records.first?["serverErrorCode"]?.stringValue == "NOT_FOUND",
                "\(early.json.serialized())")
        let emptyQuery = w.h.call("records/query", .object(["zoneID": defaultZone, "query": .object([:])]), token: w.bob)
        #expect(emptyQuery.status == 200 && emptyQuery.records.isEmpty, "\(emptyQuery.json.serialized())")
    }
}
