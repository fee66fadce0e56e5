import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Issue 13 point 4: bearer tokens are listed and revoked through the API, the CLI (`lattice logout`) and
/// `lattice admin revoke-token`, and may expire.
@Suite struct TokenLifecycleTests {
    @Test func tokensAreListedByIdNeverBySecret() throws {
        let h = try ServiceHarness()
        let signUp = h.post("/auth/signup", .object(["name": .string("ann")]), token: nil)
        let token = try #require(signUp["token"]?.stringValue)
        let firstID = try #require(signUp["tokenID"]?.stringValue)
        #expect(signUp["created"]?["timestamp"]?.intValue == h.clock.now)
        #expect(signUp["expires"] == nil)
        h.clock.advance(5_000)
        let created = h.call("tokens/create", .object(["lifetimeSeconds": .int(3_600)]), token: token)
        #expect(created.status == 200, "\(created.json.serialized())")
        let second = try #require(created["token"]?.stringValue)
        #expect(created["expires"]?["timestamp"]?.intValue == h.clock.now + 3_600_000)
        #expect(h.call("users/current", token: second)["name"]?.stringValue == "ann")

        let list = h.call("tokens/list", token: second)
        #expect(list.status == 200)
        let tokens = try #require(list["tokens"]?.arrayValue)
        #expect(tokens.count == 2)
        #expect(tokens.map { $0["tokenID"]?.stringValue } == [firstID, created["tokenID"]?.stringValue])
        #expect(tokens.map { $0["current"] } == [.bool(false), .bool(true)])
        #expect(tokens[1]["expires"]?["timestamp"]?.intValue == h.clock.now + 3_600_000)
        #expect(tokens.allSatisfy { $0["expired"] == .bool(false) })
        // Neither the secrets nor their hashes are in the answer.
        let text = list.json.serialized()
        for secret in [token, second] {
            #expect(!text.contains(secret))
            #expect(!text.contains(Secrets.hex(BearerToken(text: secret)!.storedHash)))
        }
        // Tokens belong to the private database's API.
        #expect(h.call("tokens/list", token: token, database: "shared").code == "BAD_REQUEST")
        #expect(h.call("tokens/create", .object(["lifetimeSeconds": .int(5)]), token: token).code == "BAD_REQUEST")
        #expect(h.call("tokens/create", .object(["lifetimeSeconds": .string("1h")]), token: token).code == "BAD_REQUEST")
    }

    @Test func revocationTakesEffectAtOnceAndOnlyForTheCallersTokens() throws {
        let h = try ServiceHarness()
        let (ann, _) = try h.signUp("ann")
        let (bob, _) = try h.signUp("bob")
        let extra = try #require(h.call("tokens/create", token: ann)["token"]?.stringValue)
        let extraID = try #require(h.call("tokens/list", token: extra)["tokens"]?.arrayValue?
            .first { $0["current"] == .bool(true) }?["tokenID"]?.stringValue)
        let bobsID = try #require(h.call("tokens/list", token: bob)["tokens"]?.arrayValue?.first?["tokenID"]?.stringValue)

        // bob cannot revoke ann's token, and does not learn that it exists.
        let foreign = h.call("tokens/revoke", .object(["tokens": .array([.object(["tokenID": .string(extraID)])])]), token: bob)
        #expect(foreign.status == 200)
        #expect(foreign["tokens"]?.arrayValue?.first?["serverErrorCode"]?.stringValue == "NOT_FOUND")
        #expect(h.call("users/current", token: extra).status == 200)

        // By id: the very next request with it fails.
        let byID = h.call("tokens/revoke", .object(["tokens": .array([.object(["tokenID": .string(extraID)])])]), token: ann)
        #expect(byID["tokens"]?.arrayValue?.first?["revoked"] == .bool(true))
        let revoked = h.call("users/current", token: extra)
        #expect(revoked.status == 401)
        #expect(revoked.code == "AUTHENTICATION_FAILED")
        #expect(h.call("users/current", token: ann).status == 200)

        // The current one, then all of bob's.
        #expect(h.call("tokens/revoke", .object(["current": .bool(true)]), token: ann)["tokens"]?.arrayValue?.count == 1)
        #expect(h.call("users/current", token: ann).code == "AUTHENTICATION_FAILED")
        let second = try #require(h.call("tokens/create", token: bob)["token"]?.stringValue)
        let all = h.call("tokens/revoke", .object(["all": .bool(true)]), token: second)
        #expect(all["tokens"]?.arrayValue?.count == 2)
        #expect(all.json.serialized().contains(bobsID))
        #expect(h.call("users/current", token: bob).code == "AUTHENTICATION_FAILED")
        #expect(h.call("users/current", token: second).code == "AUTHENTICATION_FAILED")
        #expect(h.call("tokens/revoke", .object([:]), token: try h.signUp("carl").token).code == "BAD_REQUEST")
    }

    @Test func tokensExpireAndTheServerCapsTheirLifetime() throws {
        let h = try ServiceHarness { $0.maximumTokenLifetimeSeconds = 7_200 }
        let short = h.post("/auth/signup", .object(["name": .string("ann"), "lifetimeSeconds": .int(60)]), token: nil)
        let token = try #require(short["token"]?.stringValue)
        #expect(short["expires"]?["timestamp"]?.intValue == h.clock.now + 60_000)
        // Without a lifetime, or asking for more, a token gets the server's maximum.
        let capped = h.post("/auth/signup", .object(["name": .string("bob"), "lifetimeSeconds": .int(86_400)]), token: nil)
        #expect(capped["expires"]?["timestamp"]?.intValue == h.clock.now + 7_200_000)
        let defaulted = h.post("/auth/signup", .object(["name": .string("carl")]), token: nil)
        #expect(defaulted["expires"]?["timestamp"]?.intValue == h.clock.now + 7_200_000)
        #expect(h.post("/auth/signup", .object(["name": .string("dan"), "lifetimeSeconds": .int(0)]), token: nil)
            .code == "BAD_REQUEST")

        h.clock.advance(59_999)
        #expect(h.call("users/current", token: token).status == 200)
        h.clock.advance(1)
        let expired = h.call("users/current", token: token)
        #expect(expired.status == 401)
        #expect(expired.code == "AUTHENTICATION_FAILED")
        #expect(expired["reason"]?.stringValue?.contains("expired") == true, "\(expired.json.serialized())")
        // An expired token is listed as expired to its owner's other tokens.
        let fresh = try h.service.issueToken(userID: try #require(try h.storage.read { try $0.user(named: "ann") }).id)
        let listed = h.call("tokens/list", token: fresh.token.text)["tokens"]?.arrayValue ?? []
        #expect(listed.first?["expired"] == .bool(true))
        #expect(fresh.info.expiresMs == h.clock.now + 7_200_000)
    }

    @Test func aUserHasAtMostTheTokenLimit() throws {
        let h = try ServiceHarness { $0.maximumTokensPerUser = 3 }
        let (token, _) = try h.signUp("ann")
        #expect(h.call("tokens/create", token: token).status == 200)
        #expect(h.call("tokens/create", token: token).status == 200)
        let over = h.call("tokens/create", token: token)
        #expect(over.status == 413)
        #expect(over.code == "LIMIT_EXCEEDED")
    }

    // MARK: CLI

    @Test func logoutRevokesTheTokenOnTheServerAndForgetsItHere() throws {
        let directory = temporaryDirectory("lattice-logout")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try ServerUnderTest(data: directory + "/server")
        defer { if server.process.isRunning { server.kill(SIGTERM) } }
        let url = "http://127.0.0.1:\(server.port)"
        let home = directory + "/ann"
        let signedUp = try CLITests.ok("signup", "ann", "--server", url, "--json", home: home).json
        let token = try #require(signedUp["token"]?.stringValue)
        let client = try RawHTTPClient(port: server.port)
        func current(_ token: String) throws -> Int {
            try client.send(method: "POST", path: "/database/1/lattice/production/private/users/current",
                            headers: ["Authorization": "Bearer " + token]).status
        }
        #expect(try current(token) == 200)

        let out = try CLITests.ok("logout", home: home)
        #expect(out.stdout.contains("signed out of ann"), "\(out)")
        #expect(out.stdout.contains("revoked"))
        #expect(try current(token) == 401)
        let whoami = try CLITests.lattice("whoami", home: home)
        #expect(whoami.status == 1)
        #expect(try CLITests.lattice("logout", home: home).status == 1)

        // Signed in again with a second token, then the server goes away: nothing is forgotten.
        let second = try CLITests.ok("admin", "add-user", "bob", "--data", directory + "/server", "--json").json
        let bobsToken = try #require(second["token"]?.stringValue)
        try CLITests.ok("login", "--server", url, "--token", bobsToken, "--no-sync", home: home)
        server.kill(SIGTERM)
        let offline = try CLITests.lattice("logout", home: home)
        #expect(offline.status == 1)
        #expect(offline.stderr.contains("cannot reach"), "\(offline)")
        #expect(offline.stderr.contains("--local"))
        #expect(try CLITests.lattice("whoami", home: home).status == 0)
        // --local forgets it here only.
        let local = try CLITests.ok("logout", "--local", "--json", home: home).json
        #expect(local["token"]?.stringValue == "kept")
        #expect(try CLITests.lattice("whoami", home: home).status == 1)
    }

    @Test func adminRevokeTokenWorksWhileTheServerRuns() throws {
        let directory = temporaryDirectory("lattice-admin-revoke")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let data = directory + "/server"
        let server = try ServerUnderTest(data: data)
        defer { server.kill(SIGTERM) }
        let client = try RawHTTPClient(port: server.port)
        func current(_ token: String) throws -> Int {
            try client.send(method: "POST", path: "/database/1/lattice/production/private/users/current",
                            headers: ["Authorization": "Bearer " + token]).status
        }
        let ann = try CLITests.ok("admin", "add-user", "ann", "--data", data, "--json").json
        let annToken = try #require(ann["token"]?.stringValue)
        let annID = try #require(ann["tokenID"]?.stringValue)
        let expiring = try CLITests.ok("admin", "add-user", "bob", "--data", data, "--lifetime", "3600", "--json").json
        #expect(expiring["expiresMs"]?.intValue != nil)
        let bobToken = try #require(expiring["token"]?.stringValue)
        #expect(try current(annToken) == 200)
        #expect(try current(bobToken) == 200)

        let listed = try CLITests.ok("admin", "tokens", "ann", "--data", data).stdout
        #expect(listed.contains(annID) && listed.contains("never expires"), "\(listed)")
        #expect(!listed.contains(annToken))

        let byID = try CLITests.ok("admin", "revoke-token", annID, "--data", data)
        #expect(byID.stdout.contains("revoked token \(annID)"))
        #expect(try current(annToken) == 401)
        #expect(try current(bobToken) == 200)

        let byUser = try CLITests.ok("admin", "revoke-token", "--user", "bob", "--data", data, "--json").json
        #expect(byUser["revoked"]?.arrayValue?.count == 1)
        #expect(try current(bobToken) == 401)

        let unknown = try CLITests.lattice("admin", "revoke-token", "0123456789abcdef", "--data", data)
        #expect(unknown.status == 1)
        #expect(unknown.stderr.contains("no token"))
        #expect(try CLITests.lattice("admin", "revoke-token", "--data", data).status == 2)
    }
}
