import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// Bodies that try to smuggle fields past the sharing rules: another owner's zone, forged metadata and CRDT
/// states, roles and permissions a caller may not grant. Each is refused with its code and changes nothing,
/// or (for server-assigned metadata) is ignored.
extension AuthorizationMatrixTests {
    /// A snapshot of everything a smuggled request could change, as the owner sees it.
    private func snapshot(_ w: MatrixWorld) -> [String: JSON] {
        var state: [String: JSON] = [:]
        for (zone, names) in [(MatrixWorld.lists, ["L-root", "L-child", "L-grand", "L-outside"]),
                              (MatrixWorld.pub, ["P-root", "P-child", "P-outside"]), (MatrixWorld.other, ["O-root", "O-rec"])] {
            for name in names { state["\(zone)/\(name)"] = w.ownerView(zone, name) }
        }
        state["share Lists"] = w.shareView(MatrixWorld.lists)
        state["share Pub"] = w.shareView(MatrixWorld.pub)
        state["share Other"] = w.shareView(MatrixWorld.other)
        state["zones"] = w.h.call("zones/list", token: w.ann.token).json
        return state
    }

    private func expectUnchanged(_ before: [String: JSON], _ after: [String: JSON], _ what: String,
                                 sourceLocation: SourceLocation = #_sourceLocation) {
        for key in before.keys.sorted() where before[key] != after[key] {
            Issue.record("\(what) changed \(key): \(before[key]!.serialized()) -> \(after[key]?.serialized() ?? "nil")",
                         sourceLocation: sourceLocation)
        }
    }

    @Test func smuggledOwnerRecordNameInThePrivateDatabase() throws {
        let w = try MatrixWorld()
        let annZone: JSON = .object(["zoneName": .string(MatrixWorld.lists), "ownerRecordName": .string(w.ann.recordName)])
        for name in ["priv-rw", "admin-rw", "stranger"] {
            let before = snapshot(w)
            let token = w.token(name)
            func code(_ operation: String, _ body: [String: JSON]) -> String {
                matrixCode(w.h.call(operation, .object(body), token: token, database: "private"))
            }
            let cases: [(String, [String: JSON])] = [
                ("records/lookup", ["zoneID": annZone, "records": .array([.object(["recordName": .string("L-outside")])])]),
                ("records/query", ["zoneID": annZone, "query": .object(["recordType": .string("Item")])]),
                ("records/modify", ["zoneID": annZone, "operations": .array([
                    operation("forceUpdate", "L-outside", recordType: nil, fields: ["n": value(.int(1))])])]),
                ("records/modify", ["zoneID": annZone, "operations": .array([operation("forceDelete", "L-child", recordType: nil)])]),
                ("records/modify", ["zoneID": annZone, "operations": .array([operation("create", "smuggled")])]),
                ("changes/zone", ["zones": .array([.object(["zoneID": annZone])])]),
                ("zones/lookup", ["zones": .array([annZone])]),
                ("zones/modify", ["operations": .array([.object(["operationType": .string("delete"),
                                                                 "zone": .object(["zoneID": annZone])])])]),
                ("zones/modify", ["operations": .array([.object(["operationType": .string("create"), "zone": .object([
                    "zoneID": .object(["zoneName": .string("Planted"), "ownerRecordName": .string(w.ann.recordName)])])])])]),
                ("shares/create", ["zoneID": annZone, "rootRecordName": .string("L-outside"), "publicPermission": .string("readWrite")]),
                ("shares/lookup", ["zoneID": annZone]),
                ("shares/modify", ["zoneID": annZone, "participants": .array([.object([
                    "operation": .string("invite"), "userName": .string(name), "permission": .string("readWrite"),
                    "role": .string("administrator")])])]),
                ("shares/url", ["zoneID": annZone, "rotate": .bool(true)]),
                ("shares/delete", ["zoneID": annZone]),
            ]
            for (operation, body) in cases {
                let got = code(operation, body)
                print("[smuggle] \(name) private-database \(operation) naming ann's zone -> \(got)")
                #expect(got == "ACCESS_DENIED", "\(name) \(operation) \(body): \(got)")
            }
            expectUnchanged(before, snapshot(w), "\(name) naming ann's zone in the private database")
        }
        // The participants still have exactly their access; the stranger still none.
        #expect(w.shared("records/lookup", MatrixWorld.lists, ["records": .array([.object(["recordName": .string("L-child")])])],
                         as: "priv-rw").records.first?["serverErrorCode"] == nil)
        #expect(w.shared("records/lookup", MatrixWorld.lists, ["records": .array([])], as: "stranger").code == "ZONE_NOT_FOUND")

        // In the shared database: the owner's own zone, or a zone named with another participant as owner, is not there.
        let before = snapshot(w)
        let ownZone: JSON = .object(["zoneName": .string(MatrixWorld.lists), "ownerRecordName": .string(w.ann.recordName)])
        for (token, zoneID, who) in [
            (w.ann.token, ownZone, "the owner, own zone"),
            (w.token("priv-rw"), JSON.object(["zoneName": .string(MatrixWorld.lists),
                                              "ownerRecordName": .string(w.account("admin-rw").recordName)]), "priv-rw, owner=admin-rw"),
            (w.token("priv-rw"), JSON.object(["zoneName": .string(MatrixWorld.lists),
                                              "ownerRecordName": .string("__defaultOwner__")]), "priv-rw, owner=__defaultOwner__"),
            (w.token("priv-rw"), JSON.object(["zoneName": .string(MatrixWorld.lists)]), "priv-rw, no owner"),
            (w.token("priv-rw"), JSON.object(["zoneName": .string("lists"), "ownerRecordName": .string(w.ann.recordName)]),
             "priv-rw, zone name in another case"),
        ] {
            let lookup = w.h.call("records/lookup", .object(["zoneID": zoneID, "records": .array([
                .object(["recordName": .string("L-child")])])]), token: token, database: "shared")
            let modify = w.h.call("records/modify", .object(["zoneID": zoneID, "operations": .array([
                operation("forceUpdate", "L-child", recordType: nil, fields: ["n": value(.int(2))])])]), token: token, database: "shared")
            print("[smuggle] shared database, \(who): lookup -> \(matrixCode(lookup)), modify -> \(matrixCode(modify))")
            #expect(matrixCode(lookup) == "ZONE_NOT_FOUND", "\(who)")
            #expect(matrixCode(modify) == "ZONE_NOT_FOUND", "\(who)")
        }
        expectUnchanged(before, snapshot(w), "shared-database zone smuggling")
    }

    @Test func smuggledMetadataInParticipantWrites() throws {
        let w = try MatrixWorld()
        let bob = w.account("priv-rw"), carol = w.account("priv-ro")
        let lists = MatrixWorld.lists
        let creator = w.ownerView(lists, "L-child")["created"]
        let forged: [String: JSON] = [
            "created": .object(["timestamp": .int(1), "userRecordName": .string(w.ann.recordName)]),
            "modified": .object(["timestamp": .int(1), "userRecordName": .string(w.ann.recordName)]),
            "recordChangeTag": .string("forged-tag"),
        ]
        func modify(_ name: String, _ operations: [JSON]) -> ServiceHarness.Reply {
            w.shared("records/modify", lists, ["operations": .array(operations)], as: name)
        }

        // Plain writes: the server's metadata is the server's. created/modified/recordChangeTag are ignored by
        // forceUpdate and create; a forged tag on update is a CONFLICT.
        var reply = modify("priv-rw", [operation("forceUpdate", "L-child", recordType: nil, fields: ["n": value(.int(1))], extra: forged)])
        #expect(matrixCode(reply) == "OK", "\(reply.json.serialized())")
        var view = w.ownerView(lists, "L-child")
        #expect(view["created"] == creator, "created was rewritten: \(view.serialized())")
        #expect(view["modified"]?["userRecordName"]?.stringValue == bob.recordName, "\(view.serialized())")
        #expect(view["modified"]?["timestamp"]?.intValue == w.h.clock.now, "\(view.serialized())")
        #expect(view["recordChangeTag"]?.stringValue != "forged-tag")

        reply = modify("priv-rw", [operation("create", "smuggled-child", fields: ["n": value(.int(1))],
                                             extra: forged.merging(parentRef("L-child")) { a, _ in a })])
        #expect(matrixCode(reply) == "OK", "\(reply.json.serialized())")
        view = w.ownerView(lists, "smuggled-child")
        #expect(view["created"]?["userRecordName"]?.stringValue == bob.recordName, "\(view.serialized())")
        #expect(view["modified"]?["userRecordName"]?.stringValue == bob.recordName, "\(view.serialized())")
        #expect(view["created"]?["timestamp"]?.intValue == w.h.clock.now)

        var before = snapshot(w)
        reply = modify("priv-rw", [operation("update", "L-child", recordType: nil, fields: ["n": value(.int(9))], tag: "forged-tag")])
        #expect(matrixCode(reply) == "CONFLICT", "\(reply.json.serialized())")
        reply = modify("priv-ro", [operation("forceUpdate", "L-child", recordType: nil, fields: ["n": value(.int(9))], extra: forged)])
        #expect(matrixCode(reply) == "PERMISSION_FAILURE", "\(reply.json.serialized())")
        reply = modify("priv-ro", [operation("create", "ro-child", fields: ["n": value(.int(9))],
                                             extra: forged.merging(parentRef("L-child")) { a, _ in a })])
        #expect(matrixCode(reply) == "PERMISSION_FAILURE", "\(reply.json.serialized())")
        expectUnchanged(before, snapshot(w), "forged plain metadata")
        #expect(itemCode(w.ownerView(lists, "ro-child")) == "NOT_FOUND")

        // CRDT states: a participant sends the record's state with CRDT metadata (as a syncing client does).
        // Each attempt works on a fresh record of its own (made by the owner under L-root), built from what the
        // participant may read and then edited, so one attempt that gets through cannot hide the next.
        // Stamps ahead of the server's clock (well inside the allowed drift), each later than the one before:
        // the server's clock follows an observed stamp, so a reused stamp would lose to the server's own edits.
        var stampMs = w.h.clock.now
        func nextStamp() -> JSON {
            stampMs += 1_000
            return .object(["ms": .int(stampMs), "counter": .int(0), "replica": .string("00000000000000ab")])
        }
        var freshCount = 0
        func fresh() -> String {
            freshCount += 1
            let name = "S\(freshCount)"
            let made = w.owner("records/modify", lists, ["operations": .array([
                operation("create", name, fields: ["title": value(.string(name))], extra: parentRef("L-root")),
                operation("create", name + "-kid", fields: ["title": value(.string("kid"))], extra: parentRef(name)),
            ])])
            #expect(matrixCode(made) == "OK")
            return name
        }
        func state(_ name: String, as who: String) throws -> [String: JSON] {
            let looked = w.shared("records/lookup", lists, ["records": .array([.object(["recordName": .string(name)])])], as: who)
            var record = try #require(looked.records.first?.objectValue, "\(looked.json.serialized())")
            #expect(record["crdt"] != nil, "a lookup carries the CRDT state: \(record)")
            for key in ["recordChangeTag", "created", "modified"] { record[key] = nil }
            return record
        }
        func crdt(_ record: [String: JSON], _ edit: (inout [String: JSON]) -> Void) -> [String: JSON] {
            var record = record
            var metadata = record["crdt"]?.objectValue ?? [:]
            edit(&metadata)
            record["crdt"] = .object(metadata)
            return record
        }
        func send(_ kind: String, _ record: [String: JSON], as who: String) -> ServiceHarness.Reply {
            modify(who, [.object(["operationType": .string(kind), "record": .object(record)])])
        }
        let newField: JSON = .object(["crdtfield": .object(["value": .string("x"), "type": .string("STRING"),
                                                            "crdt": .object(["stamp": nextStamp()])])])
        /// One attempt: (label, who, operation type, expected code, the state to send for a record name).
        typealias Attempt = (String, String, String, String, (String) throws -> [String: JSON])
        let attempts: [Attempt] = [
            ("an unedited state (a no-op merge)", "priv-rw", "forceUpdate", "OK", { try state($0, as: "priv-rw") }),
            ("a new field value", "priv-rw", "forceUpdate", "OK", { try state($0, as: "priv-rw").merging(["fields": newField]) { _, b in b } }),
            ("a new field value, readOnly", "priv-ro", "forceUpdate", "PERMISSION_FAILURE",
             { try state($0, as: "priv-ro").merging(["fields": newField]) { _, b in b } }),
            ("a deletion stamp, readOnly", "priv-ro", "forceUpdate", "PERMISSION_FAILURE", { name in
                var record = crdt(try state(name, as: "priv-ro")) { $0["deletion"] = nextStamp() }
                record["deleted"] = .bool(true)
                return record
            }),
            ("a newer crdt.parent stamp and no parent (cleared)", "priv-rw", "forceUpdate", "PERMISSION_FAILURE", { name in
                var record = crdt(try state(name, as: "priv-rw")) { $0["parent"] = nextStamp() }
                record["parent"] = nil
                return record
            }),
            ("a newer crdt.parent stamp and parent null", "priv-rw", "forceUpdate", "PERMISSION_FAILURE", { name in
                var record = crdt(try state(name, as: "priv-rw")) { $0["parent"] = nextStamp() }
                record["parent"] = .null
                return record
            }),
            ("a newer crdt.parent stamp and a parent outside", "priv-rw", "forceUpdate", "PERMISSION_FAILURE", { name in
                var record = crdt(try state(name, as: "priv-rw")) { $0["parent"] = nextStamp() }
                record["parent"] = .object(["recordName": .string("L-outside"), "action": .string("NONE")])
                return record
            }),
            ("a newer crdt.parent stamp, no parent, on the child of the record", "admin-rw", "forceUpdate", "PERMISSION_FAILURE", { name in
                var record = crdt(try state(name + "-kid", as: "admin-rw")) { $0["parent"] = nextStamp() }
                record["parent"] = nil
                return record
            }),
            ("the next generation without a parent (replaces the record wholesale)", "priv-rw", "forceUpdate", "PERMISSION_FAILURE", { name in
                let current = try state(name, as: "priv-rw")
                let generation = current["crdt"]?["generation"]?.intValue ?? 1
                var record = crdt(current) {
                    $0["generation"] = .int(generation + 1)
                    $0["created"] = nextStamp()
                    $0["parent"] = nil
                    $0["deletion"] = nil
                }
                record["parent"] = nil
                record["fields"] = .object([:])
                return record
            }),
            ("a state naming another zone", "priv-rw", "forceUpdate", "BAD_REQUEST", { name in
                var record = try state(name, as: "priv-rw")
                record["zoneID"] = .object(["zoneName": .string(MatrixWorld.other), "ownerRecordName": .string(w.ann.recordName)])
                return record
            }),
            ("a stamp a day ahead", "priv-rw", "forceUpdate", "BAD_REQUEST", { name in
                var record = try state(name, as: "priv-rw")
                record["fields"] = .object(["late": .object(["value": .string("x"), "type": .string("STRING"), "crdt": .object([
                    "stamp": .object(["ms": .int(w.h.clock.now + 24 * 3_600_000), "counter": .int(0), "replica": .string("00000000000000ab")]),
                ])])])
                return record
            }),
            ("another record type", "priv-rw", "forceUpdate", "BAD_REQUEST", { name in
                var record = crdt(try state(name, as: "priv-rw")) { $0["created"] = nextStamp() }
                record["recordType"] = .string("Evil")
                return record
            }),
            ("a state with created/modified claiming the owner", "priv-rw", "forceUpdate", "OK", { name in
                try state(name, as: "priv-rw").merging(forged.merging(["fields": newField]) { _, b in b }) { _, b in b }
            }),
        ]
        for (label, who, kind, expected, build) in attempts {
            let name = fresh()
            let state = try build(name)
            let before = snapshot(w).merging(["\(name)": w.ownerView(lists, name), "\(name)-kid": w.ownerView(lists, name + "-kid")]) { a, _ in a }
            let reply = send(kind, state, as: who)
            let code = matrixCode(reply)
            print("[smuggle] CRDT state, \(label), by \(who) -> \(code)")
            #expect(code == expected, "CRDT state, \(label): \(reply.json.serialized())")
            let after = snapshot(w).merging(["\(name)": w.ownerView(lists, name), "\(name)-kid": w.ownerView(lists, name + "-kid")]) { a, _ in a }
            if code != "OK" {
                expectUnchanged(before, after, "refused CRDT state (\(label))")
            } else {
                let others = { (state: [String: JSON]) in state.filter { !$0.key.hasPrefix("S") && $0.key != "zones" } }
                expectUnchanged(others(before), others(after), "CRDT state (\(label))")
                let view = after["\(name)"] ?? .null
                #expect(view["created"]?["userRecordName"]?.stringValue == w.ann.recordName, "\(label): \(view.serialized())")
                if view != before["\(name)"] {
                    #expect(view["modified"]?["userRecordName"]?.stringValue == bob.recordName, "\(label): \(view.serialized())")
                }
            }
            // Whatever was sent, the record and its child are still in the share.
            for record in [name, name + "-kid"] {
                #expect(itemCode(w.shared("records/lookup", lists, ["records": .array([.object(["recordName": .string(record)])])],
                                          as: "priv-ro").records.first ?? .null) == "OK", "\(label): \(record) left the share")
            }
        }

        // Deleting the root through a state that carries a deletion stamp (an update, not a delete operation).
        before = snapshot(w)
        let root = try state("L-root", as: "priv-rw")
        var deletion = crdt(root) { $0["deletion"] = nextStamp() }
        deletion["deleted"] = .bool(true)
        for kind in ["forceUpdate", "update"] {
            var body = deletion
            if kind == "update" { body["recordChangeTag"] = w.ownerView(lists, "L-root")["recordChangeTag"] }
            let reply = send(kind, body, as: "priv-rw")
            print("[smuggle] priv-rw \(kind) of L-root with a CRDT deletion stamp -> \(matrixCode(reply))")
            #expect(matrixCode(reply) == "PERMISSION_FAILURE", "root deleted through a CRDT state (\(kind)): \(reply.json.serialized())")
        }

        // The share's own record is not a record a participant writes, plainly or as a state.
        let shareName = try #require(w.shareView(lists)["shareRecordName"]?.stringValue)
        reply = modify("priv-rw", [operation("forceUpdate", shareName, recordType: nil, fields: ["title": value(.string("mine"))])])
        #expect(matrixCode(reply) == "PERMISSION_FAILURE", "\(reply.json.serialized())")
        reply = modify("priv-rw", [operation("forceDelete", shareName, recordType: nil)])
        #expect(matrixCode(reply) == "PERMISSION_FAILURE", "\(reply.json.serialized())")
        reply = modify("priv-rw", [operation("forceReplace", shareName, recordType: "cloudkit.share",
                                             fields: ["participants": .object(["value": .array([.string("\(bob.recordName) owner readWrite accepted")]),
                                                                               "type": .string("STRING_LIST")])])])
        #expect(matrixCode(reply) == "PERMISSION_FAILURE", "\(reply.json.serialized())")
        expectUnchanged(before, snapshot(w), "the root and the share record")
        // Whatever happened above, carol is still read-only and bob still a private user.
        #expect(w.participant(lists, "priv-ro")?["permission"]?.stringValue == "readOnly")
        #expect(w.participant(lists, "priv-rw")?["role"]?.stringValue == "privateUser")
        _ = carol
    }

    @Test func smuggledRolesAndPermissionsInSharesModify() throws {
        let w = try MatrixWorld(guests: 4)
        let lists = MatrixWorld.lists
        func invite(_ user: String, _ permission: String, role: String?) -> JSON {
            var object: [String: JSON] = ["operation": .string("invite"), "userName": .string(user), "permission": .string(permission)]
            if let role { object["role"] = .string(role) }
            return .object(object)
        }
        func participantOp(_ operation: String, _ user: String, permission: String? = nil) -> JSON {
            var object: [String: JSON] = ["operation": .string(operation), "userName": .string(user)]
            if let permission { object["permission"] = .string(permission) }
            return .object(object)
        }
        // (who, zone, body, expected code)
        let cases: [(String, String, [String: JSON], String, String)] = [
            ("ann", lists, ["participants": .array([invite("guest0", "readWrite", role: "owner")])], "BAD_REQUEST",
             "the owner invites a second owner"),
            ("admin-rw", lists, ["participants": .array([invite("guest0", "readWrite", role: "owner")])], "BAD_REQUEST",
             "an administrator invites an owner"),
            ("admin-rw", lists, ["participants": .array([invite("guest0", "readWrite", role: "publicUser")])], "BAD_REQUEST",
             "an administrator invites a publicUser"),
            ("admin-rw", lists, ["participants": .array([invite("guest0", "readWrite", role: "administrator")])], "PERMISSION_FAILURE",
             "an administrator makes an administrator"),
            ("admin-rw", lists, ["participants": .array([invite("priv-ro", "readWrite", role: "administrator")])], "PERMISSION_FAILURE",
             "an administrator promotes a private user to administrator"),
            ("priv-rw", lists, ["participants": .array([invite("guest0", "readOnly", role: nil)])], "PERMISSION_FAILURE",
             "a private user invites"),
            ("priv-rw", lists, ["participants": .array([invite("guest0", "readWrite", role: "administrator")])], "PERMISSION_FAILURE",
             "a private user makes an administrator"),
            ("priv-ro", lists, ["participants": .array([participantOp("setPermission", "priv-ro", permission: "readWrite")])],
             "PERMISSION_FAILURE", "a readOnly private user raises their own permission"),
            ("priv-ro", lists, ["participants": .array([invite("priv-ro", "readWrite", role: nil)])], "PERMISSION_FAILURE",
             "a readOnly private user re-invites themselves with readWrite"),
            ("pub-ro", MatrixWorld.pub, ["participants": .array([participantOp("setPermission", "pub-ro", permission: "readWrite")])],
             "PERMISSION_FAILURE", "a readOnly public user raises their own permission"),
            ("pub-ro", MatrixWorld.pub, ["publicPermission": .string("readWrite")], "PERMISSION_FAILURE",
             "a public user sets publicPermission"),
            ("admin-ro", lists, ["participants": .array([participantOp("setPermission", "admin-ro", permission: "readWrite")])],
             "PERMISSION_FAILURE", "a readOnly administrator raises their own permission"),
            ("admin-ro", lists, ["participants": .array([invite("admin-ro", "readWrite", role: nil)])], "PERMISSION_FAILURE",
             "a readOnly administrator re-invites themselves with readWrite"),
            ("admin-rw", lists, ["participants": .array([participantOp("setPermission", "ann", permission: "readOnly")])],
             "PERMISSION_FAILURE", "an administrator lowers the owner"),
            ("admin-rw", lists, ["participants": .array([participantOp("remove", "ann")])], "PERMISSION_FAILURE",
             "an administrator removes the owner"),
            ("admin-rw", lists, ["participants": .array([participantOp("remove", "admin-ro")])], "PERMISSION_FAILURE",
             "an administrator removes another administrator"),
            ("admin-rw", lists, ["participants": .array([invite("admin-ro", "readOnly", role: nil)])], "PERMISSION_FAILURE",
             "an administrator demotes another administrator by re-inviting them"),
            ("admin-rw", lists, ["participants": .array([participantOp("setPermission", "admin-ro", permission: "readWrite")])],
             "PERMISSION_FAILURE", "an administrator changes another administrator's permission"),
            ("admin-rw", lists, ["participants": .array([invite("ann", "readOnly", role: nil)])], "BAD_REQUEST",
             "an administrator re-invites the owner"),
            ("admin-rw", lists, ["participants": .array([participantOp("promote", "priv-ro")])], "BAD_REQUEST",
             "an unknown participant operation"),
            ("priv-rw", lists, ["publicPermission": .string("readWrite")], "PERMISSION_FAILURE",
             "a private user makes the share public"),
            ("priv-rw", lists, ["title": .string("mine")], "PERMISSION_FAILURE", "a private user renames the share"),
            // One good invitation and one smuggled: the request is one transaction, nothing of it stays.
            ("admin-rw", lists, ["participants": .array([invite("guest1", "readOnly", role: nil),
                                                          invite("guest2", "readWrite", role: "administrator")])],
             "PERMISSION_FAILURE", "a good invitation next to a smuggled administrator"),
        ]
        for (who, zone, body, expected, what) in cases {
            // Each case on a world of its own: one that gets through cannot change the ground for the next.
            let w = try MatrixWorld(guests: 4)
            let before = snapshot(w)
            let reply = who == "ann" ? w.owner("shares/modify", zone, body) : w.shared("shares/modify", zone, body, as: who)
            print("[smuggle] \(what) -> \(matrixCode(reply))")
            #expect(matrixCode(reply) == expected, "\(what): \(reply.json.serialized())")
            expectUnchanged(before, snapshot(w), what)
        }
        // Fields that are not a shares/modify input are ignored, never applied: owner, root, epoch, participants' roles.
        let before = w.shareView(lists)
        let reply = w.shared("shares/modify", lists, [
            "title": .string("Renamed"), "ownerRecordName": .string(w.account("admin-rw").recordName),
            "rootRecordName": .string("L-outside"), "urlEpoch": .int(99), "shareRecordName": before["shareRecordName"]!,
            "recordType": .string("Evil"),
        ], as: "admin-rw")
        #expect(matrixCode(reply) == "OK", "\(reply.json.serialized())")
        let after = w.shareView(lists)
        #expect(after["title"]?.stringValue == "Renamed")
        for key in ["rootRecordName", "urlEpoch", "participants", "zoneID", "recordType"] {
            #expect(after[key] == before[key], "shares/modify applied \(key): \(after.serialized())")
        }
        // A participant cannot make a share in the owner's zone from the shared database.
        let created = w.shared("shares/create", lists, ["rootRecordName": .string("L-outside")], as: "admin-rw")
        #expect(matrixCode(created) == "BAD_REQUEST", "\(created.json.serialized())")
        // Still readOnly: carol's write is refused.
        #expect(matrixCode(w.shared("records/modify", lists, ["operations": .array([
            operation("forceUpdate", "L-child", recordType: nil, fields: ["n": value(.int(5))])])], as: "priv-ro")) == "PERMISSION_FAILURE")
    }
}
