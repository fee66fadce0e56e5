import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeStore
import Testing

/// Issue 13 point 4 for the sign-in exchanges that take no bearer token: wrong sign-in links, session cookies
/// and device codes draw from the same per-address failure budget as bad tokens, and an address that has
/// used it up is THROTTLED before any storage work.
@Suite struct SignInThrottleTests {
    static let page = ["Origin": "http://127.0.0.1:8080", "Host": "127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"]
    static let wrongSecret = "lt_" + String(repeating: "0", count: 64)

    static func send(_ h: ServiceHarness, _ method: String, _ path: String, _ body: JSON? = nil,
                     headers: [String: String] = [:], from address: String) -> ServiceHarness.Reply {
        let response = h.service.respond(to: HTTPRequest(method: method, path: path, headers: headers,
                                                         body: body?.serializedBytes() ?? [], remoteAddress: address))
        return ServiceHarness.Reply(status: response.status, json: (try? JSON.parse(response.body)) ?? .null,
                                    response: response)
    }

    static func exchange(_ h: ServiceHarness, _ secret: String, from address: String) -> ServiceHarness.Reply {
        var headers = page
        headers["X-Lattice-CSRF"] = "new-session"
        return send(h, "POST", "/auth/link", .object(["secret": .string(secret)]), headers: headers, from: address)
    }

    static func harness() throws -> ServiceHarness {
        try ServiceHarness { configuration in
            configuration.failedAuthenticationLimit = .init(requestsPerSecond: 1.0 / 60, burst: 5)
        }
    }

    @Test func wrongSignInLinksSessionsAndDeviceCodesShareTheFailureBudget() throws {
        let h = try Self.harness()
        let (ann, _) = try h.signUp("ann")
        let guesser = "10.0.0.9"
        // Five failures of three kinds, each answered as itself.
        #expect(Self.exchange(h, Self.wrongSecret, from: guesser).code == "AUTHENTICATION_FAILED")
        #expect(Self.exchange(h, "not a secret", from: guesser).code == "AUTHENTICATION_FAILED")
        let cookie = ["Cookie": "lattice_session=" + Self.wrongSecret]
        #expect(Self.send(h, "GET", "/auth/session", headers: cookie, from: guesser).code == "AUTHENTICATION_FAILED")
        let unknownDevice = JSON.object(["deviceCode": .string("ld_" + String(repeating: "a", count: 64))])
        #expect(Self.send(h, "POST", "/auth/device/token", unknownDevice, from: guesser).code == "EXPIRED_TOKEN")
        #expect(Self.send(h, "POST", "/auth/device/token", .object(["deviceCode": .string("ld_short")]), from: guesser).code
                == "EXPIRED_TOKEN")
        // The sixth guess of any kind, and a bad bearer token, are THROTTLED with Retry-After.
        let throttled = Self.exchange(h, Self.wrongSecret, from: guesser)
        #expect(throttled.status == 429 && throttled.code == "THROTTLED", "\(throttled.json.serialized())")
        #expect(Int(throttled.response.header("Retry-After") ?? "") ?? 0 >= 1)
        #expect(Self.send(h, "POST", "/auth/device/token", unknownDevice, from: guesser).code == "THROTTLED")
        #expect(Self.send(h, "GET", "/auth/session", headers: cookie, from: guesser).code == "THROTTLED")
        #expect(Self.send(h, "POST", "/database/1/lattice/production/private/users/current", .object([:]),
                          headers: ["Authorization": "Bearer " + Self.wrongSecret], from: guesser).code == "THROTTLED")

        // A real link from the throttled address waits too (refused before the database is asked), and is not
        // used up by that: from another address it still signs in, once.
        let url = try #require(h.call("tokens/signinLink", token: ann)["url"]?.stringValue)
        let secret = String(url.split(separator: "=").last!)
        #expect(Self.exchange(h, secret, from: guesser).code == "THROTTLED")
        let other = Self.exchange(h, secret, from: "10.0.0.8")
        #expect(other.status == 200 && other["name"] == .string("ann"), "\(other.json.serialized())")
        // Other addresses keep their own budget.
        #expect(Self.exchange(h, Self.wrongSecret, from: "10.0.0.8").code == "AUTHENTICATION_FAILED")

        // A minute later the guesser has one failure again, then is throttled again.
        h.clock.advance(60_000)
        #expect(Self.exchange(h, Self.wrongSecret, from: guesser).code == "AUTHENTICATION_FAILED")
        #expect(Self.exchange(h, Self.wrongSecret, from: guesser).code == "THROTTLED")
    }

    @Test func answersThatAreNoGuessDoNotCount() throws {
        let h = try Self.harness()
        let address = "10.0.0.7"
        // No cookie, a poll with no code at all, and a sign-out without a session are no guesses: they never
        // use up the budget, however many.
        for _ in 0..<10 {
            #expect(Self.send(h, "GET", "/auth/session", from: address).code == "AUTHENTICATION_REQUIRED")
            #expect(Self.send(h, "POST", "/auth/device/token", .object([:]), from: address).code == "BAD_REQUEST")
            #expect(Self.send(h, "POST", "/auth/signout", headers: Self.page, from: address).code == "AUTHENTICATION_REQUIRED")
        }
        #expect(Self.exchange(h, Self.wrongSecret, from: address).code == "AUTHENTICATION_FAILED")
    }

    @Test func aThrottledAddressIsRefusedWithoutTouchingStorage() throws {
        let h = try Self.harness()
        let guesser = "10.0.0.6"
        for _ in 0..<5 { _ = Self.exchange(h, Self.wrongSecret, from: guesser) }
        // With the storage closed, a request that reached it would fail as TRY_AGAIN_LATER or an internal error;
        // the throttled address is answered THROTTLED, so nothing was asked of the database.
        h.service.storage.close()
        #expect(Self.exchange(h, Self.wrongSecret, from: guesser).code == "THROTTLED")
        #expect(Self.send(h, "POST", "/auth/device/token",
                          .object(["deviceCode": .string("ld_" + String(repeating: "b", count: 64))]), from: guesser).code
                == "THROTTLED")
        #expect(Self.exchange(h, Self.wrongSecret, from: "10.0.0.5").code != "THROTTLED")
    }
}
