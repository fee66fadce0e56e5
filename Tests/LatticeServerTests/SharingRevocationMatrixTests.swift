import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// Revocation takes effect on the very next request, and wakes a participant parked in changes/wait.
extension AuthorizationMatrixTests {
    struct Revocation: Sendable {
        let label: String
        /// Who loses access, and in which zone.
        let victims: [String]
        let zone: String
        /// Who keeps it (checked afterwards), in `zone`.
        let bystanders: [String]
        let act: @Sendable (MatrixWorld) -> ServiceHarness.Reply
    }

    static let revocations: [Revocation] = [
        Revocation(label: "the owner removes a participant", victims: ["priv-rw"], zone: MatrixWorld.lists,
                   bystanders: ["priv-ro", "admin-rw"]) { w in
            w.owner("shares/modify", MatrixWorld.lists, ["participants": .array([
                .object(["operation": .string("remove"), "userName": .string("priv-rw")])])])
        },
        Revocation(label: "an administrator removes a participant", victims: ["priv-ro"], zone: MatrixWorld.lists,
                   bystanders: ["priv-rw"]) { w in
            w.shared("shares/modify", MatrixWorld.lists, ["participants": .array([
                .object(["operation": .string("remove"), "userName": .string("priv-ro")])])], as: "admin-rw")
        },
        Revocation(label: "the owner removes an administrator", victims: ["admin-ro"], zone: MatrixWorld.lists,
                   bystanders: ["priv-rw", "admin-rw"]) { w in
            w.owner("shares/modify", MatrixWorld.lists, ["participants": .array([
                .object(["operation": .string("remove"), "userName": .string("admin-ro")])])])
        },
        Revocation(label: "an administrator leaves", victims: ["admin-ro"], zone: MatrixWorld.lists,
                   bystanders: ["priv-rw"]) { w in
            w.shared("shares/leave", MatrixWorld.lists, as: "admin-ro")
        },
        Revocation(label: "the participant leaves", victims: ["priv-rw"], zone: MatrixWorld.lists,
                   bystanders: ["priv-ro"]) { w in
            w.shared("shares/leave", MatrixWorld.lists, as: "priv-rw")
        },
        Revocation(label: "the share is deleted", victims: ["priv-rw", "admin-ro"], zone: MatrixWorld.lists,
                   bystanders: []) { w in
            w.owner("shares/delete", MatrixWorld.lists)
        },
        Revocation(label: "the owner deletes the share's root", victims: ["priv-rw", "admin-rw"], zone: MatrixWorld.lists,
                   bystanders: []) { w in
            w.owner("records/modify", MatrixWorld.lists, ["operations": .array([operation("forceDelete", "L-root", recordType: nil)])])
        },
        Revocation(label: "publicPermission set to none", victims: ["pub-ro", "pub-rw"], zone: MatrixWorld.pub,
                   bystanders: []) { w in
            w.owner("shares/modify", MatrixWorld.pub, ["publicPermission": .string("none")])
        },
        Revocation(label: "publicPermission lowered to readOnly (not a revocation: the public users stay)", victims: [],
                   zone: MatrixWorld.pub, bystanders: ["pub-ro", "pub-rw"]) { w in
            w.owner("shares/modify", MatrixWorld.pub, ["publicPermission": .string("readOnly")])
        },
    ]

    @Test(arguments: 0..<revocations.count)
    func revocationTakesEffectOnTheNextRequest(_ index: Int) throws {
        let scenario = Self.revocations[index]
        let w = try MatrixWorld()
        defer { w.h.service.beginShutdown() }
        let zone = scenario.zone
        let record = zone == MatrixWorld.lists ? "L-child" : "P-child"
        let lookupBody: [String: JSON] = ["records": .array([.object(["recordName": .string(record)])])]
        var databaseTokens: [String: String] = [:]
        var zoneTokens: [String: String] = [:]
        var slots: [String: ResponseBox] = [:]
        for who in scenario.victims {
            #expect(w.shared("records/lookup", zone, lookupBody, as: who).records.first?["serverErrorCode"] == nil, "\(who) before")
            databaseTokens[who] = try #require(w.h.call("changes/database", token: w.token(who), database: "shared")["syncToken"]?.stringValue)
            zoneTokens[who] = try #require(w.shared("changes/zone", zone, ["zones": .array([.object(["zoneID": w.zoneID(zone, shared: true)])])],
                                                    as: who).zones.first?["syncToken"]?.stringValue)
            slots[who] = w.h.park(token: w.token(who), syncToken: databaseTokens[who])
        }
        #expect(w.h.service.notifier.waiterCount == scenario.victims.count)
        for (who, slot) in slots { #expect(!slot.isSet, "\(who)'s wait answered before the revocation") }

        let acted = scenario.act(w)
        #expect(matrixCode(acted) == "OK", "\(scenario.label): \(acted.json.serialized())")

        for who in scenario.victims {
            // The very next requests.
            let lookup = w.shared("records/lookup", zone, lookupBody, as: who)
            let query = w.shared("records/query", zone, ["query": .object(["recordType": .string("Item")])], as: who)
            let modify = w.shared("records/modify", zone, ["operations": .array([
                operation("forceUpdate", record, recordType: nil, fields: ["n": value(.int(1))])])], as: who)
            let feed = w.h.call("changes/zone", .object(["zones": .array([.object([
                "zoneID": w.zoneID(zone, shared: true), "syncToken": .string(zoneTokens[who]!)])])]), token: w.token(who), database: "shared")
            let share = w.shared("shares/lookup", zone, as: who)
            let url = w.shared("shares/url", zone, as: who)
            let codes = [matrixCode(lookup), matrixCode(query), matrixCode(modify), matrixCode(feed), matrixCode(share), matrixCode(url)]
            print("[revocation] \(scenario.label): \(who) lookup/query/modify/changes-zone/shares-lookup/shares-url -> \(codes)")
            #expect(codes.allSatisfy { $0 == "ZONE_NOT_FOUND" }, "\(scenario.label), \(who): \(codes)")
            #expect(w.ownerView(zone, record)["fields"]?["n"] == nil, "\(who)'s write landed after the revocation")
            #expect(!w.h.call("zones/list", token: w.token(who), database: "shared").zones.contains {
                $0["zoneID"]?["zoneName"]?.stringValue == zone
            })
            let changes = w.h.call("changes/database", .object(["syncToken": .string(databaseTokens[who]!)]), token: w.token(who),
                                   database: "shared")
            #expect(changes.zones.contains { $0["zoneID"]?["zoneName"]?.stringValue == zone && $0["deleted"] == .bool(true) },
                    "\(scenario.label), \(who): changes/database should report the zone deleted: \(changes.json.serialized())")
            // The parked wait was woken.
            let woken = slots[who]!.wait(seconds: 5)
            #expect(woken.map { (try? JSON.parse($0.body))?["changed"] } == .bool(true),
                    "\(scenario.label): \(who)'s changes/wait was not woken: \(woken.map { String(decoding: $0.body, as: UTF8.self) } ?? "no answer in 5 s")")
        }
        for who in scenario.bystanders {
            #expect(w.shared("records/lookup", zone, lookupBody, as: who).records.first?["serverErrorCode"] == nil,
                    "\(scenario.label): bystander \(who) lost access")
        }
        // Access stays revoked: an old link does not bring a removed participant back.
        if scenario.victims.contains("priv-rw") && zone == MatrixWorld.lists && scenario.label.contains("remov") {
            #expect(w.accept(w.listsLink, as: "priv-rw")["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
        }
        if zone == MatrixWorld.pub && !scenario.victims.isEmpty {
            // The share is private now: the public link lets no one in.
            #expect(w.accept(w.pubLinkReadWrite, as: "pub-rw")["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
        }
    }
}

extension AuthorizationMatrixTests {
    /// `changes/wait` with a token the log has already moved past answers `changed: true` at once, whatever the
    /// timeout, 0 included (the matrix's changes/wait cells use timeout 0).
    @Test func waitWithTimeoutZeroSeesAChangeAlreadyMade() throws {
        let w = try MatrixWorld()
        let rounds = 25
        var missed: [String: Int] = [:]
        for round in 0..<rounds {
            for (step, (who, database, timeout)) in [("ann", "private", 0), ("priv-rw", "shared", 0), ("ann", "private", 1),
                                                     ("priv-rw", "shared", 1)].enumerated() {
                let token = try #require(w.h.call("changes/database", token: w.token(who), database: database)["syncToken"]?.stringValue)
                let touched = w.owner("records/modify", MatrixWorld.lists, ["operations": .array([
                    operation("forceUpdate", "L-child", recordType: nil, fields: ["round": value(.int(Int64(round * 4 + step)))])])])
                // (a new value each time: storing the value a field already has writes nothing)
                #expect(matrixCode(touched) == "OK")
                let reply = w.h.call("changes/wait", .object(["syncToken": .string(token), "timeout": .int(Int64(timeout))]),
                                     token: w.token(who), database: database)
                if reply["changed"] != .bool(true) { missed["\(who) \(database) timeout \(timeout)", default: 0] += 1 }
            }
        }
        print("[wait] changes/wait after a change, answers changed:false out of \(rounds) each: \(missed)")
        #expect(missed.isEmpty, "changes/wait answered changed:false although the log had moved past the token: \(missed) (of \(rounds) each)")
    }
}
