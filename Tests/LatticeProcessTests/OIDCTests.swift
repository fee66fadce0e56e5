import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// Issue 30: an app exchanges an ID token from a configured OpenID Connect provider for a device token;
/// every forgery is refused. A real `lattice serve` and a real provider (Tests/OIDCProvider on joserfc),
/// both on 127.0.0.1.
@Suite(.serialized) struct OIDCTests {
    static let client = "lattice-app"

    struct World {
        let provider: OIDCProviderProcess
        let server: ServerUnderTest

        init() throws {
            provider = try OIDCProviderProcess(clientIDs: [OIDCTests.client, "lattice-web"])
            server = try ServerUnderTest(data: temporaryDirectory(), extra: [
                "--oidc-issuer", provider.issuer, "--oidc-client-id", OIDCTests.client, "--signup-per-address", "0"])
        }

        func exchange(_ token: String, issuer: String? = nil) throws -> (status: Int, json: JSON) {
            let body = JSON.object(["issuer": .string(issuer ?? provider.issuer), "idToken": .string(token),
                                    "deviceName": .string("test app")]).serializedBytes()
            let reply = try RawHTTPClient(port: server.port).send(method: "POST", path: "/auth/oidc/token", body: body)
            return (reply.status, (try? JSON.parse(reply.body)) ?? .null)
        }

        func whoami(_ token: String) throws -> String? {
            let reply = try RawHTTPClient(port: server.port).send(
                method: "POST", path: "/database/1/lattice/production/private/users/current",
                headers: ["Authorization": "Bearer " + token], body: Array("{}".utf8))
            return try JSON.parse(reply.body)["name"]?.stringValue
        }
    }

    @Test func anAppsIDTokenBecomesADeviceTokenOfOneAccount() throws {
        let w = try World()
        defer { w.server.kill(SIGTERM); w.provider.stop() }
        let first = try w.exchange(try w.provider.mint("good", audience: Self.client))
        #expect(first.status == 200, "\(first.json.serialized())")
        let token = try #require(first.json["token"]?.stringValue)
        #expect(first.json["deviceName"] == .string("test app"))
        #expect(try w.whoami(token) == "olive", "the account is named after preferred_username")
        // The same person again (ES256 this time) is the same account.
        let second = try w.exchange(try w.provider.mint("es256", audience: Self.client))
        #expect(second.status == 200 && second.json["userRecordName"] == first.json["userRecordName"], "\(second.json.serialized())")
        // Another person of the same provider with the same preferred name gets an account of their own.
        let other = try w.exchange(try w.provider.mint("good", audience: Self.client, subject: "app-user-2"))
        #expect(other.status == 200 && other.json["userRecordName"] != first.json["userRecordName"])
        #expect(try w.whoami(try #require(other.json["token"]?.stringValue)) == "olive-2")
    }

    @Test func everyForgedTokenIsRefused() throws {
        let w = try World()
        defer { w.server.kill(SIGTERM); w.provider.stop() }
        let forgeries = ["expired": "expired", "wrong-audience": "client id", "wrong-issuer": "issuer", "future": "issue time",
                         "forged-signature": "signature", "alg-none": "algorithm", "hs256-public-key": "algorithm",
                         "unknown-kid": "kid"]
        for (variant, reason) in forgeries.sorted(by: { $0.key < $1.key }) {
            let reply = try w.exchange(try w.provider.mint(variant, audience: Self.client))
            #expect(reply.status == 401 && reply.json["serverErrorCode"] == .string("AUTHENTICATION_FAILED"),
                    "\(variant): \(reply.status) \(reply.json.serialized())")
            #expect(reply.json["reason"]?.stringValue?.contains(reason) == true, "\(variant): \(reply.json.serialized())")
        }
        // A token for the right audience at a provider this server does not accept.
        let foreign = try w.exchange(try w.provider.mint("good", audience: Self.client), issuer: "https://other.example")
        #expect(foreign.status == 400 && foreign.json["serverErrorCode"] == .string("BAD_REQUEST"))
        let malformed = try RawHTTPClient(port: w.server.port).send(method: "POST", path: "/auth/oidc/token", body: Array("{}".utf8))
        #expect(malformed.status == 400)
    }

    @Test func aRotatedKeyIsFetchedOnceAndUnknownKidsDoNotHammerTheProvider() throws {
        let w = try World()
        defer { w.server.kill(SIGTERM); w.provider.stop() }
        #expect(try w.exchange(try w.provider.mint("good", audience: Self.client)).status == 200)
        let before = try w.provider.counts()["/jwks"] ?? 0
        let counts = try w.provider.counts()
        #expect(before == 1, "discovery fetched the keys once: \(counts)")
        // The provider rotates in a new key: the first token signed with it makes the server fetch the keys again.
        _ = try w.provider.get("/test/rotate")
        let rotated = try w.exchange(try w.provider.mint("rotated", audience: Self.client))
        #expect(rotated.status == 200, "\(rotated.json.serialized())")
        #expect(try w.provider.counts()["/jwks"] == 2)
        // 30 tokens with kids nobody has: refused (401, then 429 once the address has failed 20 sign-ins), and
        // the keys are not fetched again within the minute.
        for _ in 0..<30 {
            let refused = try w.exchange(try w.provider.mint("unknown-kid", audience: Self.client))
            #expect(refused.status == 401 || refused.status == 429, "\(refused.json.serialized())")
        }
        let after = try w.provider.counts()
        #expect(after["/jwks"] == 2, "\(after)")
        #expect(try w.provider.counts()["/.well-known/openid-configuration"] == 1)
    }
}
