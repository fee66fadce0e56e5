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

/// The browser's authorization-code flow as a program drives it (`Accept: application/json`: start, the
/// provider's authorize endpoint, the callback with the binding cookie), against a real `lattice serve`
/// with a confidential and a public client side by side.
@Suite(.serialized) struct OIDCBrowserFlowTests {
    static let client = "lattice-web"

    /// Start → provider → callback; the callback's status and JSON.
    static func signIn(_ server: ServerUnderTest, _ provider: OIDCProviderProcess, index: Int) throws -> (status: Int, json: JSON) {
        let start = try RawHTTPClient(port: server.port).send(method: "GET", path: "/auth/oidc/start?provider=\(index)",
                                                              headers: ["Accept": "application/json"])
        let location = try #require(try JSON.parse(start.body)["location"]?.stringValue, "start: \(start.status)")
        let cookie = try #require(start.headers["set-cookie"]?.split(separator: ";").first.map(String.init), "no binding cookie")
        let authorizeURL = try #require(URLComponents(string: location))
        #expect(authorizeURL.port.map(UInt16.init) == provider.port, "\(location)")
        let authorize = try RawHTTPClient(port: provider.port).send(
            method: "GET", path: authorizeURL.percentEncodedPath + "?" + (authorizeURL.percentEncodedQuery ?? ""))
        let back = try #require(authorize.headers["location"].flatMap(URLComponents.init(string:)), "authorize: \(authorize.status)")
        let callback = try RawHTTPClient(port: server.port).send(
            method: "GET", path: back.percentEncodedPath + "?" + (back.percentEncodedQuery ?? ""),
            headers: ["Accept": "application/json", "Cookie": cookie])
        return (callback.status, (try? JSON.parse(callback.body)) ?? .null)
    }

    static func secretFile(_ secret: String) throws -> String {
        let path = temporaryDirectory("lattice-oidc-secret") + "/secret"
        try (secret + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test func aConfidentialAndAPublicClientSignInSideBySide() throws {
        let confidential = try OIDCProviderProcess(clientIDs: [Self.client], clientSecrets: [Self.client: "s3cret"])
        defer { confidential.stop() }
        let open = try OIDCProviderProcess(clientIDs: [Self.client])
        defer { open.stop() }
        _ = try open.get("/test/user?sub=p-2&preferred_username=popeye")
        let server = try ServerUnderTest(data: temporaryDirectory(), extra: [
            "--oidc-issuer", confidential.issuer, "--oidc-client-id", Self.client, "--oidc-client-secret-file", try Self.secretFile("s3cret"),
            "--oidc-issuer", open.issuer, "--oidc-client-id", Self.client, "--signup-per-address", "0"])
        defer { server.kill(SIGTERM) }
        let first = try Self.signIn(server, confidential, index: 0)
        #expect(first.status == 200 && first.json["name"] == .string("olive"), "\(first.status) \(first.json.serialized())")
        let second = try Self.signIn(server, open, index: 1)
        #expect(second.status == 200 && second.json["name"] == .string("popeye"), "\(second.status) \(second.json.serialized())")
        // The provider saw the secret for the confidential client only: a wrong one is refused there.
        let wrong = try ServerUnderTest(data: temporaryDirectory(), extra: [
            "--oidc-issuer", confidential.issuer, "--oidc-client-id", Self.client, "--oidc-client-secret-file", try Self.secretFile("guess")])
        defer { wrong.kill(SIGTERM) }
        let refused = try Self.signIn(wrong, confidential, index: 0)
        #expect(refused.status == 401 && refused.json["serverErrorCode"] == .string("AUTHENTICATION_FAILED"), "\(refused.json.serialized())")
        #expect(refused.json["reason"]?.stringValue?.contains("refused the sign-in (401)") == true, "\(refused.json.serialized())")
    }

    /// `lattice ARGUMENTS`, killed if still running after 30 s (a refused option exits at once; an
    /// accepted one would serve on).
    static func boundedRun(_ arguments: [String]) throws -> CLITests.Outcome {
        let (process, output, errors) = try CLITests.start(arguments, home: nil)
        let deadline = Date().addingTimeInterval(30)
        while process.isRunning, Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        return CLITests.Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
    }

    @Test func badProviderOptionsStopServeNamingTheOption() throws {
        let data = temporaryDirectory("lattice-oidc-flags")
        let secret = try Self.secretFile("s3cret")
        let empty = try Self.secretFile("")
        let issuer = "https://id.example.com"
        let cases: [([String], String)] = [
            (["--oidc-issuer", issuer], "give each --oidc-issuer its --oidc-client-id"),
            (["--oidc-client-id", "x"], "give each --oidc-issuer its --oidc-client-id"),
            (["--oidc-client-secret-file", secret, "--oidc-issuer", issuer, "--oidc-client-id", "x"],
             "give each --oidc-client-secret-file after its --oidc-issuer"),
            (["--oidc-issuer", issuer, "--oidc-client-id", "x", "--oidc-client-secret-file", secret, "--oidc-client-secret-file", secret],
             "at most one per issuer"),
            (["--oidc-issuer", "ftp://id.example.com", "--oidc-client-id", "x"], "--oidc-issuer must be an http(s) URL"),
            (["--oidc-issuer", issuer + "?a=b", "--oidc-client-id", "x"], "without query or fragment"),
            (["--oidc-issuer", issuer, "--oidc-client-id", "x", "--oidc-issuer", issuer, "--oidc-client-id", "y"], "given twice"),
            (["--oidc-issuer", issuer, "--oidc-client-id", ""], "--oidc-client-id must be 1 to 255 bytes"),
            (["--oidc-issuer", issuer, "--oidc-client-id", "x", "--oidc-client-secret-file", data + "/none"], "cannot read"),
            (["--oidc-issuer", issuer, "--oidc-client-id", "x", "--oidc-client-secret-file", empty], "is empty"),
        ]
        for (flags, message) in cases {
            let refused = try Self.boundedRun(["serve", "--data", data + "/server", "--port", "0"] + flags)
            #expect(refused.status == 2 && refused.stderr.contains(message), "\(flags): \(refused)")
        }
        let help = try CLITests.lattice("serve", "--help")
        #expect(help.stdout.contains("--oidc-client-secret-file PATH") && help.stdout.contains("a public client has none"))
    }
}
