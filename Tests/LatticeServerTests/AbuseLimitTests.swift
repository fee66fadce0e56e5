import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeStore
import Testing

/// Issue 13 point 4: sign-up limits (per address and global, in the database), failed-token throttling per
/// address, and the server-wide disk budget.
@Suite struct AbuseLimitTests {
    /// A request to `service` as if from `address`.
    static func send(_ service: LatticeService, _ path: String, _ body: JSON = .object([:]), token: String? = nil,
                     from address: String) -> ServiceHarness.Reply {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer " + token }
        let response = service.respond(to: HTTPRequest(method: "POST", path: path, headers: headers,
                                                       body: body.serializedBytes(), remoteAddress: address))
        return ServiceHarness.Reply(status: response.status, json: (try? JSON.parse(response.body)) ?? .null,
                                    response: response)
    }

    static func signUp(_ service: LatticeService, _ name: String, from address: String) -> ServiceHarness.Reply {
        send(service, "/auth/signup", .object(["name": .string(name)]), from: address)
    }

    static let currentUser = "/database/1/lattice/production/private/users/current"

    // MARK: Sign-up

    @Test func signUpsAreLimitedPerAddressAndGloballyAcrossRestartsAndProcesses() throws {
        let h = try ServiceHarness { configuration in
            configuration.signUpsPerAddress = 3
            configuration.signUpsGlobal = 5
            configuration.signUpWindowMilliseconds = 3_600_000
        }
        let service = h.service
        for index in 0..<3 {
            let reply = Self.signUp(service, "a\(index)", from: "10.0.0.1")
            #expect(reply.status == 200, "\(reply.json.serialized())")
            h.clock.advance(1_000)
        }
        // The fourth from the same address: THROTTLED until the oldest of the three leaves the window.
        let refused = Self.signUp(service, "a3", from: "10.0.0.1")
        #expect(refused.status == 429)
        #expect(refused.code == "THROTTLED")
        #expect(refused.response.header("Retry-After") == String(3_600 - 3))
        #expect(refused["retryAfter"]?.intValue == Int64(3_597))
        #expect(refused["reason"]?.stringValue?.contains("from this address") == true)
        // Another address is not limited by the first one's count, but by the global one.
        #expect(Self.signUp(service, "b0", from: "10.0.0.2").status == 200)
        #expect(Self.signUp(service, "b1", from: "10.0.0.2").status == 200)
        let global = Self.signUp(service, "c0", from: "10.0.0.3")
        #expect(global.code == "THROTTLED")
        #expect(global["reason"]?.stringValue?.contains("on this server") == true)
        #expect(global.response.header("Retry-After") != nil)
        // Nothing of a refused sign-up is written.
        #expect(try h.storage.read { try $0.user(named: "a3") } == nil)
        #expect(try h.storage.read { try $0.user(named: "c0") } == nil)
        // The administrator's accounts are not sign-ups: not limited, not counted.
        _ = try service.createAccount(name: "admin-made")
        #expect(try h.storage.read { try $0.signUps(address: nil, sinceMs: 0).count } == 5)

        // A restarted service, and a second process on the same database, see the same counts.
        let second = try SQLiteStorage(path: h.directory + "/" + SQLiteStorage.fileName)
        defer { second.close() }
        let other = try LatticeService(storage: second, configuration: service.configuration, log: { _ in })
        #expect(Self.signUp(other, "a3", from: "10.0.0.1").code == "THROTTLED")
        #expect(Self.signUp(other, "c0", from: "10.0.0.3").code == "THROTTLED")

        // The window slides: an hour after the first sign-up, one place is free again (globally too).
        h.clock.advance(3_600_000 - 3_000)
        let again = Self.signUp(other, "a3", from: "10.0.0.1")
        #expect(again.status == 200, "\(again.json.serialized())")
        #expect(Self.signUp(service, "a4", from: "10.0.0.1").code == "THROTTLED")
    }

    @Test func closedRegistrationStaysClosedWhateverTheLimits() throws {
        let h = try ServiceHarness { configuration in
            configuration.registrationOpen = false
            configuration.signUpsPerAddress = 100
        }
        let reply = Self.signUp(h.service, "eve", from: "10.0.0.1")
        #expect(reply.status == 403)
        #expect(reply.code == "ACCESS_DENIED")
        #expect(try h.storage.read { try $0.signUps(address: nil, sinceMs: 0).count } == 0)
    }

    // MARK: Failed authentications

    @Test func badTokensFromOneAddressAreThrottledAndOthersAreNot() throws {
        let h = try ServiceHarness { configuration in
            configuration.failedAuthenticationLimit = .init(requestsPerSecond: 1.0 / 60, burst: 5)
        }
        let (good, _) = try h.signUp("ann")
        let bad = "lt_" + String(repeating: "0", count: 64)
        for attempt in 0..<5 {
            let reply = Self.send(h.service, Self.currentUser, token: attempt % 2 == 0 ? bad : "nonsense", from: "10.0.0.9")
            #expect(reply.status == 401, "attempt \(attempt): \(reply.json.serialized())")
        }
        let throttled = Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.9")
        #expect(throttled.status == 429)
        #expect(throttled.code == "THROTTLED")
        #expect(Int(throttled.response.header("Retry-After") ?? "") ?? 0 >= 1)
        #expect(Self.send(h.service, Self.currentUser, token: "nonsense", from: "10.0.0.9").code == "THROTTLED")
        // A good token is still served from the throttled address (one bad client behind a NAT or proxy
        // does not lock the others out), and does not count.
        #expect(Self.send(h.service, Self.currentUser, token: good, from: "10.0.0.9").status == 200)
        // Other addresses are unaffected: good tokens work, bad ones get 401.
        #expect(Self.send(h.service, Self.currentUser, token: good, from: "10.0.0.8").status == 200)
        #expect(Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.8").status == 401)
        // A request without a token is no guess: 421 as ever, even from the throttled address.
        #expect(Self.send(h.service, Self.currentUser, from: "10.0.0.9").status == 421)
        // A minute later one failure is allowed again.
        h.clock.advance(60_000)
        #expect(Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.9").status == 401)
        #expect(Self.send(h.service, Self.currentUser, token: bad, from: "10.0.0.9").status == 429)
    }

    // MARK: Disk budget

    @Test func overTheDiskBudgetWritesThatAddDataAreRefusedWhileReadsAndDeletionsWork() throws {
        let budget: Int64 = 2 * 1024 * 1024
        let h = try ServiceHarness { configuration in configuration.diskBudgetBytes = budget }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        #expect(h.modify("Lists", [operation("create", "keep", fields: ["title": .object(["value": .string("kept")])])],
                         token: token).status == 200)
        let payload = String(repeating: "x", count: 200_000)
        var refused: ServiceHarness.Reply? = nil
        for index in 0..<40 { // 40 × 200 KB is 8 MB, well past the 2 MiB budget
            let reply = h.modify("Lists", [operation("create", "big\(index)", fields: ["blob": .object(["value": .string(payload)])])],
                                 token: token)
            if reply.status != 200 { refused = reply; break }
        }
        let full = try #require(refused, "no write was refused over a \(budget)-byte budget")
        #expect(full.status == 413)
        #expect(full.code == "QUOTA_EXCEEDED")
        #expect(full["reason"]?.stringValue?.contains("the server is full") == true, "\(full.json.serialized())")
        #expect(try h.storage.sizeOnDisk() >= budget)
        // Other writes that add data are refused too, sign-up included.
        #expect(h.call("zones/modify", .object(["operations": .array([.object(["operationType": .string("create"),
            "zone": .object(["zoneID": .object(["zoneName": .string("More")])])])])]), token: token).code == "QUOTA_EXCEEDED")
        #expect(h.post("/auth/signup", .object(["name": .string("bob")]), token: nil).code == "QUOTA_EXCEEDED")
        #expect(h.call("shares/create", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                  "rootRecordName": .string("keep")]), token: token).code == "QUOTA_EXCEEDED")
        // Reads keep working.
        let read = h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                      "records": .array([.object(["recordName": .string("keep")])])]), token: token)
        #expect(read.status == 200)
        #expect(read.records.first?["fields"]?["title"]?["value"]?.stringValue == "kept")
        #expect(h.call("zones/list", token: token).status == 200)
        #expect(h.call("users/current", token: token).status == 200)
        // Deletions keep working, and so do token revocations.
        let deleted = h.modify("Lists", [operation("forceDelete", "big0", recordType: nil)], token: token)
        #expect(deleted.status == 200, "\(deleted.json.serialized())")
        #expect(deleted.records.first?["serverErrorCode"] == nil)
        #expect(h.call("zones/modify", .object(["operations": .array([.object(["operationType": .string("delete"),
            "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])])])]), token: token).status == 200)
        #expect(h.call("tokens/list", token: token).status == 200)
    }
}
