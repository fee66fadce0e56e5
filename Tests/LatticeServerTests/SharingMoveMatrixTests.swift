import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// Moving records in and out of a shared hierarchy: only the owner moves things out; what leaves disappears
/// for participants and comes to their feed as a deletion; what comes back appears.
extension AuthorizationMatrixTests {
    /// A participant's incremental feed of a zone in the shared database.
    final class ParticipantFeed {
        let w: MatrixWorld
        let who: String
        let zone: String
        var token: String?

        init(_ w: MatrixWorld, _ who: String, _ zone: String) {
            self.w = w
            self.who = who
            self.zone = zone
        }

        /// The records since the last call: name -> deleted? (the last entry of a name wins), until moreComing is false.
        func next(sourceLocation: SourceLocation = #_sourceLocation) -> [String: Bool] {
            var names: [String: Bool] = [:]
            for _ in 0..<50 {
                var request: [String: JSON] = ["zoneID": w.zoneID(zone, shared: true)]
                if let token { request["syncToken"] = .string(token) }
                let reply = w.h.call("changes/zone", .object(["zones": .array([.object(request)])]), token: w.token(who),
                                     database: "shared")
                guard let item = reply.zones.first, item["serverErrorCode"] == nil else {
                    Issue.record("feed of \(who): \(reply.json.serialized())", sourceLocation: sourceLocation)
                    return names
                }
                for record in item["records"]?.arrayValue ?? [] {
                    names[record["recordName"]?.stringValue ?? ""] = record["deleted"] == .bool(true)
                }
                token = item["syncToken"]?.stringValue
                if item["moreComing"] != .bool(true) { break }
            }
            return names
        }
    }

    private func lookupCode(_ w: MatrixWorld, _ name: String, as who: String, zone: String = MatrixWorld.lists) -> String {
        matrixCode(w.shared("records/lookup", zone, ["records": .array([.object(["recordName": .string(name)])])], as: who))
    }

    private func queried(_ w: MatrixWorld, as who: String) -> Set<String> {
        Set(w.shared("records/query", MatrixWorld.lists, ["query": .object(["recordType": .string("Item")])], as: who)
            .records.compactMap { $0["recordName"]?.stringValue })
    }

    private func move(_ w: MatrixWorld, _ name: String, to parentName: String?) {
        let reply = w.owner("records/modify", MatrixWorld.lists, ["operations": .array([
            operation("forceUpdate", name, recordType: nil, extra: ["parent": parentName.map { .object(["recordName": .string($0)]) } ?? .null]),
        ])])
        #expect(matrixCode(reply) == "OK", "move \(name): \(reply.json.serialized())")
    }

    @Test func movingSubtreesOutAndBackIn() throws {
        let w = try MatrixWorld(guests: 1)
        let lists = MatrixWorld.lists
        let made = w.owner("records/modify", lists, ["operations": .array([
            operation("create", "A", fields: ["title": value(.string("A"))], extra: parentRef("L-root")),
            operation("create", "A1", fields: ["title": value(.string("A1"))], extra: parentRef("A")),
            operation("create", "A2", fields: ["title": value(.string("A2"))], extra: parentRef("A")),
            operation("create", "A1x", fields: ["title": value(.string("A1x"))], extra: parentRef("A1")),
            operation("create", "B", fields: ["title": value(.string("B"))], extra: parentRef("L-root")),
            operation("create", "B1", fields: ["title": value(.string("B1"))], extra: parentRef("B")),
        ])])
        #expect(matrixCode(made) == "OK", "\(made.json.serialized())")
        let subtreeA = ["A", "A1", "A2", "A1x"]
        let feed = ParticipantFeed(w, "priv-rw", lists)
        let initial = feed.next()
        for name in subtreeA + ["B", "B1", "L-root", "L-child", "L-grand"] {
            #expect(initial[name] == false, "\(name) is in the first feed")
        }
        #expect(initial["L-outside"] == nil)

        // Out: every record of the subtree is a deletion in the feed, NOT_FOUND to lookups, absent from queries.
        move(w, "A", to: "L-outside")
        var changes = feed.next()
        print("[moves] after moving A out: \(changes.sorted { $0.key < $1.key })")
        for name in subtreeA {
            #expect(changes[name] == true, "\(name) should arrive as deleted: \(changes)")
            for who in ["priv-rw", "priv-ro", "admin-rw"] {
                #expect(lookupCode(w, name, as: who) == "NOT_FOUND", "\(who) looks \(name) up")
            }
        }
        #expect(queried(w, as: "priv-rw").isDisjoint(with: subtreeA))
        #expect(changes["L-root"] == nil && changes["B"] == nil, "unrelated records in the feed: \(changes)")
        // A fresh feed (from no token) has nothing of the subtree.
        let fresh = ParticipantFeed(w, "admin-ro", lists).next()
        #expect(subtreeA.allSatisfy { fresh[$0] != false }, "\(fresh)")

        // While out: the owner's edits and a new child under a moved-out record are never visible.
        let edits = w.owner("records/modify", lists, ["operations": .array([
            operation("forceUpdate", "A1", recordType: nil, fields: ["title": value(.string("A1 edited while out"))]),
            operation("create", "A3", fields: ["title": value(.string("A3"))], extra: parentRef("A")),
            operation("create", "A1y", fields: ["title": value(.string("A1y"))], extra: parentRef("A1")),
        ])])
        #expect(matrixCode(edits) == "OK")
        changes = feed.next()
        #expect(changes.isEmpty, "edits outside the share reached the feed: \(changes)")
        for name in ["A3", "A1y", "A1"] {
            #expect(lookupCode(w, name, as: "priv-rw") == "NOT_FOUND")
        }
        // Nor can the participant reach them by writing.
        #expect(matrixCode(w.shared("records/modify", lists, ["operations": .array([
            operation("forceUpdate", "A1", recordType: nil, fields: ["title": value(.string("x"))])])], as: "priv-rw")) == "NOT_FOUND")
        #expect(matrixCode(w.shared("records/modify", lists, ["operations": .array([
            operation("create", "A4", extra: parentRef("A"))])], as: "priv-rw")) == "PERMISSION_FAILURE")
        #expect(itemCode(w.ownerView(lists, "A4")) == "NOT_FOUND")

        // Back in: all of it appears, with the edits made meanwhile, and the children created meanwhile.
        move(w, "A", to: "L-root")
        changes = feed.next()
        print("[moves] after moving A back: \(changes.sorted { $0.key < $1.key })")
        for name in subtreeA + ["A3", "A1y"] {
            #expect(changes[name] == false, "\(name) should arrive whole: \(changes)")
            #expect(lookupCode(w, name, as: "priv-ro") == "OK", "\(name)")
        }
        let a1 = w.shared("records/lookup", lists, ["records": .array([.object(["recordName": .string("A1")])])], as: "priv-rw")
        #expect(a1.records.first?["fields"]?["title"]?["value"]?.stringValue == "A1 edited while out")
        #expect(queried(w, as: "priv-rw").isSuperset(of: subtreeA + ["A3", "A1y"]))

        // B goes out for good; what is made under it is never seen, from any token.
        let before = ParticipantFeed(w, "admin-rw", lists)
        _ = before.next()
        move(w, "B", to: nil)
        #expect(matrixCode(w.owner("records/modify", lists, ["operations": .array([
            operation("create", "B2", extra: parentRef("B")), operation("create", "B2a", extra: parentRef("B2")),
        ])])) == "OK")
        let afterB = before.next()
        #expect(afterB["B"] == true && afterB["B1"] == true, "\(afterB)")
        #expect(afterB["B2"] == nil && afterB["B2a"] == nil, "\(afterB)")
        let fromScratch = ParticipantFeed(w, "priv-ro", lists).next()
        for name in ["B", "B1", "B2", "B2a"] {
            #expect(fromScratch[name] != false, "\(name) visible from scratch: \(fromScratch)")
            #expect(lookupCode(w, name, as: "priv-ro") == "NOT_FOUND")
        }

        // Moves between two shares of the zone: A goes under a second share's root.
        let second = w.owner("shares/create", lists, ["rootRecordName": .string("L-outside"), "title": .string("Outside")])
        #expect(matrixCode(second) == "OK", "\(second.json.serialized())")
        let secondName = try #require(second["shareRecordName"])
        #expect(matrixCode(w.owner("shares/modify", lists, ["shareRecordName": secondName, "participants": .array([
            .object(["operation": .string("invite"), "userName": .string("guest0"), "permission": .string("readOnly")])])])) == "OK")
        let secondLink = try #require(w.owner("shares/url", lists, ["shareRecordName": secondName])["url"]?.stringValue)
        #expect(w.accept(secondLink, as: "guest0")["participantStatus"]?.stringValue == "accepted")
        let guestFeed = ParticipantFeed(w, "guest0", lists)
        let guestInitial = guestFeed.next()
        #expect(guestInitial["L-outside"] == false && guestInitial["A"] == nil && guestInitial["L-root"] == nil, "\(guestInitial)")
        move(w, "A", to: "L-outside")
        let leftFirst = feed.next()
        let enteredSecond = guestFeed.next()
        for name in subtreeA + ["A3", "A1y"] {
            #expect(leftFirst[name] == true, "\(name) left the first share: \(leftFirst)")
            #expect(enteredSecond[name] == false, "\(name) entered the second share: \(enteredSecond)")
            #expect(lookupCode(w, name, as: "guest0") == "OK")
            #expect(lookupCode(w, name, as: "priv-rw") == "NOT_FOUND")
        }
    }

    @Test func participantsCannotMoveRecordsOut() throws {
        let w = try MatrixWorld()
        let lists = MatrixWorld.lists
        // Each attempt gets its own pair M<n> > M<n>-kid under L-root, so one that gets through cannot hide the next.
        var count = 0
        func attempt(_ label: String, _ who: String, expected: String, _ makeOperation: (String) -> JSON) {
            count += 1
            let m = "M\(count)"
            #expect(matrixCode(w.owner("records/modify", lists, ["operations": .array([
                operation("create", m, fields: ["title": value(.string(m))], extra: parentRef("L-root")),
                operation("create", m + "-kid", fields: ["title": value(.string("kid"))], extra: parentRef(m)),
            ])])) == "OK")
            let names = [m, m + "-kid", "L-child", "L-outside"]
            let before = names.map { w.ownerView(lists, $0) }
            let reply = w.shared("records/modify", lists, ["operations": .array([makeOperation(m)])], as: who)
            let code = matrixCode(reply)
            print("[moves] \(label) by \(who) -> \(code)")
            #expect(code == expected, "\(label): \(reply.json.serialized())")
            let after = names.map { w.ownerView(lists, $0) }
            if code != "OK" { #expect(after == before, "\(label) was refused but changed something") }
            for name in [m, m + "-kid"] {
                #expect(lookupCode(w, name, as: "priv-ro") == "OK", "\(label): \(name) left the share")
            }
        }
        let tag = { (name: String) in w.ownerView(lists, name)["recordChangeTag"]?.stringValue }
        attempt("forceUpdate parent -> outside record", "priv-rw", expected: "PERMISSION_FAILURE") {
            operation("forceUpdate", $0, recordType: nil, extra: parentRef("L-outside"))
        }
        attempt("forceUpdate parent -> null", "priv-rw", expected: "PERMISSION_FAILURE") {
            operation("forceUpdate", $0, recordType: nil, extra: ["parent": .null])
        }
        attempt("forceUpdate parent -> a record that does not exist", "priv-rw", expected: "PERMISSION_FAILURE") {
            operation("forceUpdate", $0, recordType: nil, extra: parentRef("nowhere"))
        }
        attempt("update parent -> outside record (with the tag)", "priv-rw", expected: "PERMISSION_FAILURE") {
            operation("update", $0, recordType: nil, tag: tag($0), extra: parentRef("L-outside"))
        }
        attempt("forceReplace parent -> outside record", "priv-rw", expected: "PERMISSION_FAILURE") {
            operation("forceReplace", $0, fields: ["title": value(.string("M"))], extra: parentRef("L-outside"))
        }
        attempt("an administrator moves a record out", "admin-rw", expected: "PERMISSION_FAILURE") {
            operation("forceUpdate", $0, recordType: nil, extra: parentRef("L-outside"))
        }
        // replace clears what it is not given, the parent included: without a parent it would move the record out.
        attempt("forceReplace without a parent", "priv-rw", expected: "PERMISSION_FAILURE") {
            operation("forceReplace", $0, fields: ["title": value(.string("M"))])
        }
        attempt("replace without a parent (with the tag)", "admin-rw", expected: "PERMISSION_FAILURE") {
            operation("replace", $0, fields: ["title": value(.string("M"))], tag: tag($0))
        }
        // readOnly: no move at all, even inside.
        attempt("readOnly moves inside", "priv-ro", expected: "PERMISSION_FAILURE") {
            operation("forceUpdate", $0 + "-kid", recordType: nil, extra: parentRef("L-child"))
        }
        // A record outside cannot be pulled in by a participant.
        attempt("pull an outside record in", "priv-rw", expected: "NOT_FOUND") { _ in
            operation("forceUpdate", "L-outside", recordType: nil, extra: parentRef("L-root"))
        }
        // Moving inside the hierarchy is an edit like any other, and so is a replace that keeps the parent.
        attempt("move inside the share", "priv-rw", expected: "OK") {
            operation("forceUpdate", $0 + "-kid", recordType: nil, extra: parentRef("L-child"))
        }
        #expect(w.ownerView(lists, "M\(count)-kid")["parent"]?["recordName"]?.stringValue == "L-child")
        attempt("forceReplace keeping the parent", "priv-rw", expected: "OK") {
            operation("forceReplace", $0, fields: ["title": value(.string("M2"))], extra: parentRef("L-root"))
        }
    }
}
