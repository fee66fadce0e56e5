import Foundation
import LatticeCore
@testable import LatticeOperations
import LatticeTestSupport
import Testing

/// An identity provider's keys as a node holds them (issue 30), with the tests' real provider
/// (Tests/OIDCProvider on joserfc, on 127.0.0.1) and the service's clock moved by hand: a key the provider
/// stops publishing stops verifying once the cached keys are an hour old, the cached keys still serve when
/// the provider is down, and an endless answer from the provider is cut off at once.
@Suite(.serialized) struct OIDCProviderKeysTests {
    static let client = "lattice-app"

    /// A provider and a service that accepts it, the service's clock set to the real time (the provider's
    /// tokens carry real times).
    static func world() throws -> (OIDCProviderProcess, ServiceHarness) {
        let provider = try OIDCProviderProcess(clientIDs: [client])
        let h = try ServiceHarness { $0.oidcProviders = [OIDCProviderConfiguration(issuer: provider.issuer, clientID: client)] }
        h.clock.advance(Int64(Date().timeIntervalSince1970 * 1000) - h.clock.now)
        return (provider, h)
    }

    static func exchange(_ h: ServiceHarness, _ provider: OIDCProviderProcess, _ token: String) -> ServiceHarness.Reply {
        h.post("/auth/oidc/token", .object(["issuer": .string(provider.issuer), "idToken": .string(token)]), token: nil)
    }

    @Test func aKeyTheProviderDropsStopsVerifyingWithinTheKeysLifetime() throws {
        let (provider, h) = try Self.world()
        defer { provider.stop() }
        let hour = OpenIDConnect.keyLifetimeMilliseconds / 1000
        #expect(Self.exchange(h, provider, try provider.mint("good", audience: Self.client)).status == 200)
        // The provider drops k1 (rotated out, or compromised); tokens signed with it are still around.
        _ = try provider.get("/test/retire?kid=k1")
        let early = Self.exchange(h, provider, try provider.mint("good", audience: Self.client))
        #expect(early.status == 200, "within the hour the node's keys still hold k1: \(early.json.serialized())")
        #expect(try provider.counts()["/jwks"] == 1)
        // An hour on, the next token makes the node fetch the keys again, and k1 is gone from them.
        h.clock.advance(OpenIDConnect.keyLifetimeMilliseconds)
        let late = Self.exchange(h, provider, try provider.mint("good", audience: Self.client, shiftSeconds: hour))
        #expect(late.status == 401 && late.code == "AUTHENTICATION_FAILED", "\(late.json.serialized())")
        #expect(late["reason"]?.stringValue?.contains("k1") == true, "\(late.json.serialized())")
        #expect(try provider.counts()["/jwks"] == 2)
        // The key still published verifies, with no further fetch.
        let es256 = Self.exchange(h, provider, try provider.mint("es256", audience: Self.client, shiftSeconds: hour))
        #expect(es256.status == 200, "\(es256.json.serialized())")
        #expect(try provider.counts()["/jwks"] == 2)
        // Another hour on with the provider down: the fetch fails and the cached keys still serve.
        let whileDown = try provider.mint("es256", audience: Self.client, shiftSeconds: 2 * hour)
        provider.stop()
        h.clock.advance(OpenIDConnect.keyLifetimeMilliseconds)
        let down = Self.exchange(h, provider, whileDown)
        #expect(down.status == 200, "\(down.json.serialized())")
    }

    @Test(arguments: [false, true])
    func anEndlessAnswerFromTheProviderIsCutOffAtOnce(declaringItsLength: Bool) throws {
        let (provider, h) = try Self.world()
        defer { provider.stop() }
        _ = try provider.get("/test/endless?path=/jwks" + (declaringItsLength ? "&declare=1" : ""))
        let started = Date()
        let reply = Self.exchange(h, provider, try provider.mint("good", audience: Self.client))
        let seconds = Date().timeIntervalSince(started)
        #expect(reply.status == 503 && reply.code == "TRY_AGAIN_LATER", "\(reply.json.serialized())")
        #expect(reply["reason"]?.stringValue?.contains("too large") == true, "\(reply.json.serialized())")
        // Cut off after 256 KiB, not after the 10 s time limit.
        #expect(seconds < 3, "took \(seconds) s")
    }
}
