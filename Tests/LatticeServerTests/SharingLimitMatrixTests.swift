import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import Synchronization
import Testing

/// At most 100 participants, the owner included: the 101st is TOO_MANY_PARTICIPANTS and changes nothing,
/// sequentially and under concurrent adds starting from 95.
extension AuthorizationMatrixTests {
    /// Thread-safe outcomes of concurrent requests.
    final class MatrixOutcomes: Sendable {
        private let items = Mutex<[(String, String)]>([])
        func append(_ who: String, _ code: String) { items.withLock { $0.append((who, code)) } }
        var values: [(String, String)] { items.withLock { $0 } }
    }

    /// Runs `body` on `count` threads released together; retries an answer of TRY_AGAIN_LATER, as a client would.
    private func concurrently(_ count: Int, _ body: @escaping @Sendable (Int) -> String) -> [Int: String] {
        let gate = DispatchSemaphore(value: 0)
        let done = DispatchGroup()
        let outcomes = MatrixOutcomes()
        for index in 0..<count {
            done.enter()
            let thread = Thread {
                gate.wait()
                var code = body(index)
                var attempts = 0
                while code == "TRY_AGAIN_LATER" && attempts < 50 {
                    attempts += 1
                    Thread.sleep(forTimeInterval: 0.01)
                    code = body(index)
                }
                outcomes.append(String(index), code)
                done.leave()
            }
            thread.start()
        }
        for _ in 0..<count { gate.signal() }
        done.wait()
        return Dictionary(uniqueKeysWithValues: outcomes.values.map { (Int($0.0)!, $0.1) })
    }

    private func activeParticipants(_ share: JSON) -> [JSON] {
        (share["participants"]?.arrayValue ?? []).filter { $0["acceptanceStatus"]?.stringValue != "removed" }
    }

    private func inviteBody(_ names: [String], permission: String = "readOnly") -> [String: JSON] {
        ["participants": .array(names.map {
            .object(["operation": .string("invite"), "userName": .string($0), "permission": .string(permission)])
        })]
    }

    @Test func theHundredAndFirstParticipantSequentially() throws {
        let w = try MatrixWorld(guests: 100)
        let lists = MatrixWorld.lists
        // Lists starts with the owner, 4 accepted and 2 pending participants (and 2 removed, who do not count).
        #expect(activeParticipants(w.shareView(lists)).count == 7)
        for index in 0..<93 {
            let reply = w.owner("shares/modify", lists, inviteBody(["guest\(index)"]))
            #expect(matrixCode(reply) == "OK", "invitation \(index): \(reply.json.serialized())")
        }
        var before = w.shareView(lists)
        #expect(activeParticipants(before).count == 100)
        for (what, body, who) in [
            ("the 101st invitation", inviteBody(["guest93"]), "ann"),
            ("the 101st invitation by an administrator", inviteBody(["guest93"]), "admin-rw"),
            ("re-inviting a removed participant", inviteBody(["removed-ro"]), "ann"),
            ("two at once", inviteBody(["guest94", "guest95"]), "ann"),
        ] {
            let reply = who == "ann" ? w.owner("shares/modify", lists, body) : w.shared("shares/modify", lists, body, as: who)
            #expect(matrixCode(reply) == "TOO_MANY_PARTICIPANTS", "\(what): \(reply.json.serialized())")
            #expect(w.shareView(lists) == before, "\(what) changed the share")
        }
        // At the limit, changing someone already in is fine.
        #expect(matrixCode(w.owner("shares/modify", lists, inviteBody(["pending-ro"], permission: "readWrite"))) == "OK")
        // One out, one in; the next is refused again.
        #expect(matrixCode(w.owner("shares/modify", lists, ["participants": .array([
            .object(["operation": .string("remove"), "userName": .string("guest0")])])])) == "OK")
        #expect(matrixCode(w.owner("shares/modify", lists, inviteBody(["guest93"]))) == "OK")
        before = w.shareView(lists)
        #expect(matrixCode(w.owner("shares/modify", lists, inviteBody(["guest94"]))) == "TOO_MANY_PARTICIPANTS")
        #expect(w.shareView(lists) == before)
        #expect(activeParticipants(before).count == 100)

        // Public joins count the same: Pub has the owner and two public users.
        let pub = MatrixWorld.pub
        for index in 0..<97 {
            let result = w.accept(w.pubLinkReadWrite, as: "guest\(index)")
            #expect(result["participantStatus"]?.stringValue == "accepted", "join \(index): \(result.serialized())")
        }
        before = w.shareView(pub)
        #expect(activeParticipants(before).count == 100)
        let refused = w.accept(w.pubLinkReadWrite, as: "guest97")
        #expect(refused["serverErrorCode"]?.stringValue == "TOO_MANY_PARTICIPANTS", "\(refused.serialized())")
        #expect(w.shareView(pub) == before)
        #expect(w.shared("records/lookup", pub, ["records": .array([])], as: "guest97").code == "ZONE_NOT_FOUND")
        // Accepting again at the limit is still a no-op success for someone already in.
        #expect(w.accept(w.pubLinkReadWrite, as: "guest5")["participantStatus"]?.stringValue == "accepted")
    }

    @Test func concurrentAddsStartingFromNinetyFive() throws {
        let w = try MatrixWorld(guests: 110)
        let lists = MatrixWorld.lists
        // 7 + 88 = 95.
        #expect(matrixCode(w.owner("shares/modify", lists, inviteBody((0..<88).map { "guest\($0)" }))) == "OK")
        let before = w.shareView(lists)
        #expect(activeParticipants(before).count == 95)

        // Ten concurrent invitations, each its own request, from the owner and an administrator.
        let contenders = (88..<98).map { "guest\($0)" }
        let outcomes = concurrently(contenders.count) { index in
            let body = self.inviteBody([contenders[index]])
            return matrixCode(index % 2 == 0 ? w.owner("shares/modify", lists, body)
                                             : w.shared("shares/modify", lists, body, as: "admin-rw"))
        }
        let winners = contenders.indices.filter { outcomes[$0] == "OK" }.map { contenders[$0] }
        let losers = contenders.indices.filter { outcomes[$0] == "TOO_MANY_PARTICIPANTS" }.map { contenders[$0] }
        print("[limits] concurrent invitations from 95: winners \(winners), losers \(losers), all \(outcomes.sorted { $0.key < $1.key })")
        #expect(winners.count == 5 && losers.count == 5, "\(outcomes)")
        let after = w.shareView(lists)
        #expect(activeParticipants(after).count == 100)
        // The share is the one before plus the winners, and nothing of the losers.
        let names = { (share: JSON) in Set((share["participants"]?.arrayValue ?? []).compactMap { $0["userRecordName"]?.stringValue }) }
        #expect(names(after) == names(before).union(winners.map { w.account($0).recordName }))
        for loser in losers {
            #expect(!names(after).contains(w.account(loser).recordName))
            #expect(w.h.call("zones/list", token: w.token(loser), database: "shared").zones.isEmpty)
            #expect(w.resolve(w.listsLink, as: loser)["currentStatus"]?.stringValue == "none")
        }
        let unchangedKeys = ["title", "publicPermission", "rootRecordName", "urlEpoch", "shareRecordName", "zoneID"]
        for key in unchangedKeys { #expect(after[key] == before[key], "\(key)") }
        let kept = (after["participants"]?.arrayValue ?? []).filter { entry in
            !winners.contains { w.account($0).recordName == entry["userRecordName"]?.stringValue }
        }
        #expect(kept == before["participants"]?.arrayValue, "an existing participant changed")

        // Concurrent public joins from 95: Pub has 3; 92 join one by one, then 10 at once.
        let pub = MatrixWorld.pub
        for index in 0..<92 {
            #expect(w.accept(w.pubLinkReadWrite, as: "guest\(index)")["participantStatus"]?.stringValue == "accepted")
        }
        let pubBefore = w.shareView(pub)
        #expect(activeParticipants(pubBefore).count == 95)
        let joiners = (92..<102).map { "guest\($0)" }
        let joined = concurrently(joiners.count) { index in
            itemCode(w.accept(w.pubLinkReadWrite, as: joiners[index]))
        }
        let joinWinners = joiners.indices.filter { joined[$0] == "OK" }.map { joiners[$0] }
        print("[limits] concurrent public joins from 95: \(joined.sorted { $0.key < $1.key })")
        #expect(joinWinners.count == 5 && joined.values.filter { $0 == "TOO_MANY_PARTICIPANTS" }.count == 5, "\(joined)")
        let pubAfter = w.shareView(pub)
        #expect(activeParticipants(pubAfter).count == 100)
        #expect(names(pubAfter) == names(pubBefore).union(joinWinners.map { w.account($0).recordName }))
    }

    @Test func singleUseLinkUnderConcurrentAccepts() throws {
        let w = try MatrixWorld(guests: 8)
        let once = try w.link(MatrixWorld.pub, permission: "readWrite", extra: ["maxUses": .int(1)])
        let outcomes = concurrently(8) { index in itemCode(w.accept(once, as: "guest\(index)")) }
        print("[limits] concurrent accepts of a single-use link: \(outcomes.sorted { $0.key < $1.key })")
        #expect(outcomes.values.filter { $0 == "OK" }.count == 1, "\(outcomes)")
        #expect(outcomes.values.filter { $0 == "ACCESS_DENIED" }.count == 7, "\(outcomes)")
        let joined = (0..<8).filter { w.participant(MatrixWorld.pub, "guest\($0)") != nil }
        #expect(joined.count == 1, "joined: \(joined)")
    }
}
