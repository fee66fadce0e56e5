import Foundation
import LatticeCore
@testable import LatticeOperations
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// The hierarchy feed of a participant who loses one of two shares of a zone: the lost share is named once in
/// `lostShares`, its records come as deletions without CRDT state (paged by `resultsLimit`), nothing the
/// participant never had is named, and the other share's feed goes on.
@Suite struct RevocationFeedTests {
    enum Loss: String, CaseIterable {
        case removed, left, shareDeleted, publicPermissionNone, rootDeleted
    }

    /// ann's zone Lists: T > T1, T > T2 > T2a and C > C1, with a read-write public share rooted at T and one
    /// at C. bob accepted both, eve only C's.
    final class World {
        let h: ServiceHarness
        let ann: String, bob: String, eve: String
        let annRecordName: String
        private(set) var tShare = "", cShare = ""

        init() throws {
            h = try ServiceHarness()
            let signedUp = try h.signUp("ann")
            (ann, annRecordName) = signedUp
            bob = try h.signUp("bob").token
            eve = try h.signUp("eve").token
            try h.createZone("Lists", token: ann)
            let seeded = h.modify("Lists", [
                operation("create", "T"), operation("create", "T1", extra: parentRef("T")),
                operation("create", "T2", extra: parentRef("T")), operation("create", "T2a", extra: parentRef("T2")),
                operation("create", "C"), operation("create", "C1", extra: parentRef("C")),
            ], token: ann)
            guard !seeded.records.contains(where: { $0["serverErrorCode"] != nil }) else {
                throw HarnessError("seed: \(seeded.json.serialized())")
            }
            var links: [String: String] = [:]
            for root in ["T", "C"] {
                let created = owner("shares/create", ["rootRecordName": .string(root),
                                                      "publicPermission": .string("readWrite")])
                let name = try #require(created["shareRecordName"]?.stringValue, "\(created.json.serialized())")
                if root == "T" { tShare = name } else { cShare = name }
                let url = owner("shares/url", ["shareRecordName": .string(name), "permission": .string("readWrite")])
                links[root] = try #require(url["url"]?.stringValue, "\(url.json.serialized())")
            }
            for (who, roots) in [(bob, ["T", "C"]), (eve, ["C"])] {
                for root in roots {
                    let link = JSON.object(["shortGUIDs": .array([.object(["value": .string(links[root]!)])])])
                    let reply = h.call("records/accept", link, token: who, database: "shared")
                    guard reply["results"]?.arrayValue?.first?["participantStatus"]?.stringValue == "accepted" else {
                        throw HarnessError("accept \(root): \(reply.json.serialized())")
                    }
                }
            }
        }

        func owner(_ operation: String, _ body: [String: JSON]) -> ServiceHarness.Reply {
            var body = body
            body["zoneID"] = .object(["zoneName": .string("Lists")])
            return h.call(operation, .object(body), token: ann)
        }

        /// One page of `changes/zone` in the shared database.
        func page(_ token: String, syncToken: String?, limit: Int? = nil) -> JSON {
            var request: [String: JSON] = ["zoneID": .object(["zoneName": .string("Lists"),
                                                              "ownerRecordName": .string(annRecordName)])]
            if let syncToken { request["syncToken"] = .string(syncToken) }
            if let limit { request["resultsLimit"] = .int(Int64(limit)) }
            return h.call("changes/zone", .object(["zones": .array([.object(request)])]), token: token,
                          database: "shared").zones.first ?? .null
        }

        /// Every page until `moreComing` is false (at most 50): the pages and the last token.
        func drain(_ token: String, syncToken: String?, limit: Int? = nil) throws -> (pages: [JSON], token: String) {
            var pages: [JSON] = []
            var position = syncToken
            for _ in 0..<50 {
                let page = page(token, syncToken: position, limit: limit)
                #expect(page["serverErrorCode"] == nil, "\(page.serialized())")
                pages.append(page)
                position = try #require(page["syncToken"]?.stringValue)
                if page["moreComing"] != .bool(true) { return (pages, position!) }
            }
            throw HarnessError("the feed did not end in 50 pages")
        }

        func lose(_ loss: Loss) -> ServiceHarness.Reply {
            switch loss {
            case .removed:
                return owner("shares/modify", ["shareRecordName": .string(tShare), "participants": .array([
                    .object(["operation": .string("remove"), "userName": .string("bob")])])])
            case .left:
                return h.call("shares/leave", .object([
                    "zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .string(annRecordName)]),
                    "shareRecordName": .string(tShare)]), token: bob, database: "shared")
            case .shareDeleted:
                return owner("shares/delete", ["shareRecordName": .string(tShare)])
            case .publicPermissionNone:
                return owner("shares/modify", ["shareRecordName": .string(tShare), "publicPermission": .string("none")])
            case .rootDeleted:
                return h.modify("Lists", [operation("forceDelete", "T", recordType: nil)], token: ann)
            }
        }
    }

    static func names(_ pages: [JSON], whole: Bool) -> [String] {
        pages.flatMap { $0["records"]?.arrayValue ?? [] }.filter { ($0["crdt"] != nil) == whole }
            .compactMap { $0["recordName"]?.stringValue }
    }

    /// The share ids a feed token names, decoded (tests only: clients treat tokens as opaque).
    static func shareIDs(_ token: String) throws -> [Int64] {
        try ShareFeedToken.parse(token).positions.keys.sorted() + ShareFeedToken.parse(token).drains.keys.sorted()
    }

    @Test(arguments: Loss.allCases)
    func aLostShareIsNamedOnceAndDrainedInPagesAndTheOtherShareGoesOn(_ loss: Loss) throws {
        let w = try World()
        let before = try w.drain(w.bob, syncToken: nil)
        #expect(Set(Self.names(before.pages, whole: true)) == ["T", "T1", "T2", "T2a", "C", "C1", w.tShare, w.cShare])
        w.h.clock.advance(1_000)
        let acted = w.lose(loss)
        #expect(acted.status == 200 && !acted.records.contains { $0["serverErrorCode"] != nil },
                "\(acted.json.serialized())")
        w.h.clock.advance(1_000)
        // After the loss: T3 enters T (when T lives on), C1 changes.
        if loss != .rootDeleted {
            _ = w.h.modify("Lists", [operation("create", "T3", extra: parentRef("T"))], token: w.ann)
        }
        _ = w.h.modify("Lists", [operation("forceUpdate", "C1", fields: ["n": value(.int(1))])], token: w.ann)

        let after = try w.drain(w.bob, syncToken: before.token, limit: 2)
        let lost = after.pages.flatMap { $0["lostShares"]?.arrayValue ?? [] }
        #expect(lost == [.object(["rootRecordName": .string("T"), "shareRecordName": .string(w.tShare)])],
                "\(loss): \(lost)")
        #expect(after.pages.first?["lostShares"] != nil, "\(loss): the loss is named on the first page")
        #expect(after.pages.count >= 3, "\(loss): with resultsLimit 2 the drain takes several pages: \(after.pages)")
        #expect(after.pages.allSatisfy { ($0["records"]?.arrayValue?.count ?? 0) <= 2 })
        // The share record changes with the roster, past bob's position, so a removal does not drain it; it is
        // named in lostShares either way.
        let drained = Set(Self.names(after.pages, whole: false))
        #expect(drained.subtracting([w.tShare]) == ["T", "T1", "T2", "T2a"], "\(loss): \(after.pages)")
        #expect(Self.names(after.pages, whole: true) == ["C1"], "\(loss): \(after.pages)")
        let everything = after.pages.flatMap { $0["records"]?.arrayValue ?? [] }.map { $0.serialized() }.joined()
        #expect(!everything.contains("T3"), "\(loss): a record that entered after the loss was named")
        // The token no longer holds the share: quiet from here on, and C goes on.
        #expect(try Self.shareIDs(after.token).count == 1)
        let quiet = w.page(w.bob, syncToken: after.token)
        #expect(quiet["records"] == .array([]) && quiet["lostShares"] == nil && quiet["moreComing"] == .bool(false),
                "\(loss): \(quiet.serialized())")
        _ = w.h.modify("Lists", [operation("create", "C2", extra: parentRef("C"))], token: w.ann)
        #expect(Self.names([w.page(w.bob, syncToken: after.token)], whole: true) == ["C2"])
    }

    /// A token is not signed, so a caller may name shares in it: one they never had yields nothing, and a
    /// drain position in one they had names no record changed after they lost it.
    @Test func forgedTokensNameNothingTheCallerNeverHad() throws {
        let w = try World()
        let bobs = try w.drain(w.bob, syncToken: nil)
        let ids = try Self.shareIDs(bobs.token)
        let eves = try w.drain(w.eve, syncToken: nil)
        let cID = try #require(try Self.shareIDs(eves.token).first)
        let tID = try #require(ids.first { $0 != cID })
        #expect(Set(Self.names(eves.pages, whole: true)) == ["C", "C1", w.cShare])

        // eve never had T: a position or a drain naming it gives her nothing of it.
        for forged in ["s1.\(cID):0,\(tID):9999", "s1.\(cID):0,\(tID):9999:0"] {
            let token = Data(forged.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
            let pages = try w.drain(w.eve, syncToken: token)
            #expect(pages.pages.allSatisfy { $0["lostShares"] == nil }, "\(forged): \(pages.pages)")
            let named = Set(Self.names(pages.pages, whole: true) + Self.names(pages.pages, whole: false))
            #expect(named == ["C", "C1", w.cShare], "\(forged): \(pages.pages)")
        }

        // bob is removed from T; T2 changes and T3 enters afterwards. A position far ahead names only what
        // he had: nothing changed after the loss.
        w.h.clock.advance(1_000)
        #expect(w.lose(.removed).status == 200)
        w.h.clock.advance(1_000)
        _ = w.h.modify("Lists", [operation("create", "T3", extra: parentRef("T")),
                                 operation("forceUpdate", "T2", fields: ["n": value(.int(1))])], token: w.ann)
        let ahead = Data("s1.\(cID):0,\(tID):9999".utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
        let pages = try w.drain(w.bob, syncToken: ahead)
        let named = Set(Self.names(pages.pages, whole: false))
        #expect(named == ["T", "T1", w.tShare], "T2 changed and T2a's parent changed after the loss: \(named)")
    }

    /// A root is in its share wherever its parent points: the owner moving it under a record outside every
    /// share keeps the share, and moving it under another share's hierarchy is refused.
    @Test func movingARootDoesNotEndItsShare() throws {
        let w = try World()
        let before = try w.drain(w.bob, syncToken: nil)
        _ = w.h.modify("Lists", [operation("create", "X")], token: w.ann)
        let moved = w.h.modify("Lists", [operation("forceUpdate", "T", recordType: nil, extra: parentRef("X"))],
                               token: w.ann)
        #expect(matrixCode(moved) == "OK", "\(moved.json.serialized())")
        let after = try w.drain(w.bob, syncToken: before.token)
        #expect(after.pages.allSatisfy { $0["lostShares"] == nil }, "\(after.pages)")
        #expect(Self.names(after.pages, whole: true) == ["T"] && Self.names(after.pages, whole: false).isEmpty,
                "\(after.pages)")
        let refused = w.h.modify("Lists", [operation("forceUpdate", "T", recordType: nil, extra: parentRef("C1"))],
                                 token: w.ann)
        #expect(matrixCode(refused) == "ALREADY_SHARED", "\(refused.json.serialized())")
        #expect(w.page(w.bob, syncToken: after.token)["records"] == .array([]))
    }

    @Test func malformedShareFeedTokensAreRefused() throws {
        let w = try World()
        for body in ["s1.1:5:6", "s1.1:5,1:6", "s1.1:-1", "s1.1:2:3:4", "s1.x:1", "z1.1.1"] {
            let token = Data(body.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
            #expect(w.page(w.bob, syncToken: token)["serverErrorCode"]?.stringValue == "BAD_REQUEST", "\(body)")
        }
        let state = ShareFeedToken.State(positions: [3: 7, 1: 0], drains: [2: .init(bound: 9, after: 4)])
        #expect(try ShareFeedToken.parse(ShareFeedToken.text(state)) == state)
    }
}
