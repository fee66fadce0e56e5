import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// Issue 30: people who joined from a link come back with a passkey or a recovery code, in-process on the
/// test backend (`LATTICE_TEST_BACKEND`). The same flows in a real browser (WebDriver's virtual
/// authenticator) are in Tests/BrowserTests/passkey_tests.py.
@Suite(.tags(.postgres)) struct PasskeyFlowTests {
    static let page = BrowserSessionTests.page
    static var preSession: [String: String] { page.merging(["X-Lattice-CSRF": "new-session"]) { $1 } }

    /// An authenticator for the harness's relying party (the public URL http://127.0.0.1:8080).
    static func authenticator(signCount: UInt32 = 1) -> TestAuthenticator {
        var authenticator = TestAuthenticator(.es256, signCount: signCount)
        authenticator.rpID = "127.0.0.1"
        authenticator.origin = "http://127.0.0.1:8080"
        return authenticator
    }

    static func post(_ h: ServiceHarness, _ path: String, _ body: JSON, headers: [String: String] = preSession) -> ServiceHarness.Reply {
        h.raw("POST", path, body: body.serializedBytes(), headers: headers)
    }

    static func challenge(_ options: ServiceHarness.Reply) throws -> [UInt8] {
        try #require(options["challenge"]?.stringValue.flatMap(Base64URL.decode), "\(options.json.serialized())")
    }

    /// What `PublicKeyCredential.toJSON()` gives for a registration.
    static func registration(_ a: TestAuthenticator, _ challenge: [UInt8], name: String? = nil) -> JSON {
        let response: JSON = .object([
            "clientDataJSON": .string(Base64URL.encode(a.clientData("webauthn.create", challenge))),
            "attestationObject": .string(Base64URL.encode(a.attestationObject(a.authenticatorData(flags: 0x45, attested: true)))),
        ])
        var body: [String: JSON] = ["credential": .object([
            "id": .string(Base64URL.encode(a.credentialID)), "rawId": .string(Base64URL.encode(a.credentialID)),
            "type": .string("public-key"), "response": response])]
        if let name { body["name"] = .string(name) }
        return .object(body)
    }

    /// What `PublicKeyCredential.toJSON()` gives for a sign-in.
    static func assertion(_ a: inout TestAuthenticator, _ challenge: [UInt8], handle: String? = nil,
                          tamper: (inout [UInt8]) -> Void = { _ in }) -> JSON {
        var signed = a.assert(challenge)
        tamper(&signed.signature)
        var response: [String: JSON] = [
            "clientDataJSON": .string(Base64URL.encode(signed.clientData)),
            "authenticatorData": .string(Base64URL.encode(signed.authenticatorData)),
            "signature": .string(Base64URL.encode(signed.signature)),
        ]
        if let handle { response["userHandle"] = .string(Base64URL.encode(Array(handle.utf8))) }
        return .object(["credential": .object([
            "id": .string(Base64URL.encode(a.credentialID)), "rawId": .string(Base64URL.encode(a.credentialID)),
            "type": .string("public-key"), "response": .object(response)])])
    }

    /// Signs `name` up with a passkey; returns the session's cookie pair and the recovery codes.
    static func signUp(_ h: ServiceHarness, _ name: String, _ a: TestAuthenticator) throws -> (cookie: String, codes: [String]) {
        let options = post(h, "/auth/passkey/signup/options", .object(["name": .string(name)]))
        try #require(options.status == 200, "\(options.json.serialized())")
        #expect(options["rp"]?["id"] == .string("127.0.0.1") && options["user"]?["name"] == .string(name))
        #expect(options["authenticatorSelection"]?["residentKey"] == .string("required"))
        let done = post(h, "/auth/passkey/signup", registration(a, try challenge(options), name: "Phone"))
        try #require(done.status == 200, "\(done.json.serialized())")
        let session = try BrowserSessionTests.session(from: done)
        let codes = try #require(done["recoveryCodes"]?.arrayValue).compactMap { $0.stringValue }
        return (session.cookie, codes)
    }

    /// Signs in with the passkey of `a`; the reply.
    static func signIn(_ h: ServiceHarness, _ a: inout TestAuthenticator, handle: String? = nil) throws -> ServiceHarness.Reply {
        let options = post(h, "/auth/passkey/signin/options", .object([:]))
        try #require(options.status == 200, "\(options.json.serialized())")
        #expect(options["rpId"] == .string("127.0.0.1"))
        return post(h, "/auth/passkey/signin", assertion(&a, try challenge(options), handle: handle))
    }

    @Test func aPasskeySignUpComesBackOnAnyBrowserWithTheSamePasskey() throws {
        let h = try ServiceHarness()
        var phone = Self.authenticator()
        let (cookie, codes) = try Self.signUp(h, "ann", phone)
        #expect(codes.count == 10 && Set(codes).count == 10 && codes.allSatisfy { $0.count == 14 && $0.split(separator: "-").count == 3 })
        #expect(h.raw("GET", "/auth/session", headers: ["Cookie": cookie])["name"] == .string("ann"))
        // Signed out (or on another browser: a passkey synced there is the same key), the passkey signs in.
        let again = try Self.signIn(h, &phone)
        #expect(again.status == 200 && again["name"] == .string("ann"), "\(again.json.serialized())")
        let second = try BrowserSessionTests.session(from: again)
        #expect(second.cookie != cookie)
        #expect(h.raw("GET", "/auth/session", headers: ["Cookie": second.cookie])["name"] == .string("ann"))
        #expect(again["recoveryCodes"] == nil, "codes are shown at sign-up only")
        // And again: the counter grows each time.
        #expect(try Self.signIn(h, &phone).status == 200)
    }

    @Test func everyForgedOrReplayedSignInIsRefused() throws {
        let h = try ServiceHarness()
        var phone = Self.authenticator(signCount: 5)
        _ = try Self.signUp(h, "ann", phone)
        // A forged signature.
        let options = Self.post(h, "/auth/passkey/signin/options", .object([:]))
        let forged = Self.post(h, "/auth/passkey/signin", Self.assertion(&phone, try Self.challenge(options)) { $0[10] ^= 1 })
        #expect(forged.code == "AUTHENTICATION_FAILED" && forged.response.header("Set-Cookie") == nil, "\(forged.json.serialized())")
        // The challenge was spent by the refusal: a good assertion of it is refused too.
        let spent = Self.post(h, "/auth/passkey/signin", Self.assertion(&phone, try Self.challenge(options)))
        #expect(spent.code == "AUTHENTICATION_FAILED" && spent["reason"]?.stringValue?.contains("start again") == true)
        // A challenge the server never issued.
        let invented = Self.post(h, "/auth/passkey/signin", Self.assertion(&phone, Array(repeating: 7, count: 32)))
        #expect(invented.code == "AUTHENTICATION_FAILED")
        // A replayed assertion (same counter) for a fresh challenge: the counter did not grow.
        let fresh = Self.post(h, "/auth/passkey/signin/options", .object([:]))
        var clone = phone
        #expect(Self.post(h, "/auth/passkey/signin", Self.assertion(&phone, try Self.challenge(fresh))).status == 200)
        let fresh2 = Self.post(h, "/auth/passkey/signin/options", .object([:]))
        let cloned = Self.post(h, "/auth/passkey/signin", Self.assertion(&clone, try Self.challenge(fresh2)))
        #expect(cloned.code == "AUTHENTICATION_FAILED" && cloned["reason"]?.stringValue?.contains("counter") == true,
                "\(cloned.json.serialized())")
        // Another site's passkey, and a passkey this server does not know.
        var evil = Self.authenticator()
        evil.rpID = "evil.example"
        let o3 = Self.post(h, "/auth/passkey/signin/options", .object([:]))
        #expect(Self.post(h, "/auth/passkey/signin", Self.assertion(&evil, try Self.challenge(o3))).code == "AUTHENTICATION_FAILED")
        var stranger = Self.authenticator()
        let o4 = Self.post(h, "/auth/passkey/signin/options", .object([:]))
        let unknown = Self.post(h, "/auth/passkey/signin", Self.assertion(&stranger, try Self.challenge(o4)))
        #expect(unknown.code == "AUTHENTICATION_FAILED" && unknown["reason"]?.stringValue?.contains("not registered") == true)
        // A sign-up's challenge does not sign in.
        let signUpOptions = Self.post(h, "/auth/passkey/signup/options", .object(["name": .string("bob")]))
        #expect(Self.post(h, "/auth/passkey/signin", Self.assertion(&phone, try Self.challenge(signUpOptions))).code
                == "AUTHENTICATION_FAILED")
        // Only from this server's pages: no CSRF header, or another site, is refused before anything.
        #expect(Self.post(h, "/auth/passkey/signin/options", .object([:]), headers: Self.page).code == "ACCESS_DENIED")
        var crossSite = Self.preSession
        crossSite["Origin"] = "https://evil.example"
        crossSite["Sec-Fetch-Site"] = "cross-site"
        #expect(Self.post(h, "/auth/passkey/signin/options", .object([:]), headers: crossSite).code == "ACCESS_DENIED")
        // Malformed bodies are BAD_REQUEST.
        #expect(Self.post(h, "/auth/passkey/signin", .object(["credential": .string("x")])).code == "BAD_REQUEST")
        #expect(Self.post(h, "/auth/passkey/signin", .object(["credential": .object(["type": .string("public-key"),
                                                                                      "rawId": .string("!!")])])).code == "BAD_REQUEST")
    }

    @Test func aTakenNameIsRefusedWhenTheSignUpStartsAndWhenItEnds() throws {
        let h = try ServiceHarness()
        _ = try h.signUp("ann")
        #expect(Self.post(h, "/auth/passkey/signup/options", .object(["name": .string("ANN")])).code == "EXISTS")
        #expect(Self.post(h, "/auth/passkey/signup/options", .object(["name": .string("no spaces")])).code == "BAD_REQUEST")
        let options = Self.post(h, "/auth/passkey/signup/options", .object(["name": .string("bob")]))
        _ = try h.signUp("bob") // taken meanwhile, by someone else
        let done = Self.post(h, "/auth/passkey/signup", Self.registration(Self.authenticator(), try Self.challenge(options)))
        #expect(done.code == "EXISTS", "\(done.json.serialized())")
    }

    @Test func aSignedInAccountAddsRenamesAndRemovesPasskeys() throws {
        let h = try ServiceHarness()
        var phone = Self.authenticator()
        _ = try Self.signUp(h, "ann", phone)
        let signedIn = try Self.signIn(h, &phone)
        let session = try BrowserSessionTests.session(from: signedIn)
        var headers = Self.page
        headers["Cookie"] = session.cookie
        headers["X-Lattice-CSRF"] = session.csrf
        var laptop = Self.authenticator()
        h.clock.advance(1_000) // added later than the phone's: listed after it
        let options = Self.post(h, "/auth/passkey/register/options", .object([:]), headers: headers)
        #expect(options.status == 200 && options["excludeCredentials"]?.arrayValue?.count == 1, "\(options.json.serialized())")
        let added = Self.post(h, "/auth/passkey/register", Self.registration(laptop, try Self.challenge(options), name: "Laptop"),
                              headers: headers)
        #expect(added.status == 200 && added["name"] == .string("Laptop"), "\(added.json.serialized())")
        // The same passkey twice is refused.
        let again = Self.post(h, "/auth/passkey/register/options", .object([:]), headers: headers)
        #expect(Self.post(h, "/auth/passkey/register", Self.registration(laptop, try Self.challenge(again)), headers: headers).code == "EXISTS")
        let list = Self.post(h, "/auth/passkeys/list", .object([:]), headers: headers)
        let passkeys = try #require(list["passkeys"]?.arrayValue)
        #expect(passkeys.map { $0["name"] } == [.string("Phone"), .string("Laptop")])
        #expect(list["recoveryCodesLeft"] == .int(10))
        let laptopID = try #require(passkeys[1]["passkeyID"])
        let renamed = Self.post(h, "/auth/passkeys/rename", .object(["passkeyID": laptopID, "name": .string("Work laptop")]), headers: headers)
        #expect(renamed["passkeys"]?.arrayValue?.last?["name"] == .string("Work laptop"))
        // Without the CSRF value a session cannot change passkeys.
        var noCSRF = headers
        noCSRF["X-Lattice-CSRF"] = nil
        #expect(Self.post(h, "/auth/passkeys/delete", .object(["passkeyID": laptopID]), headers: noCSRF).code == "ACCESS_DENIED")
        #expect(Self.post(h, "/auth/passkeys/delete", .object(["passkeyID": laptopID]), headers: headers)["passkeys"]?.arrayValue?.count == 1)
        #expect(try Self.signIn(h, &laptop).code == "AUTHENTICATION_FAILED", "a removed passkey signs in no more")
        // Another account cannot touch ann's passkeys.
        let bob = try h.signUp("bob")
        let phoneID = try #require(passkeys[0]["passkeyID"])
        let foreign = h.raw("POST", "/auth/passkeys/delete", body: JSON.object(["passkeyID": phoneID]).serializedBytes(), token: bob.token)
        #expect(foreign.code == "NOT_FOUND")
        #expect(try Self.signIn(h, &phone).status == 200)
    }

    @Test func aRecoveryCodeSignsInOnceAndNewCodesRetireTheOldOnes() throws {
        let h = try ServiceHarness()
        // A browser sign-up by name gets codes too.
        let signUp = Self.post(h, "/auth/signup", .object(["name": .string("ann"), "session": .bool(true)]))
        let codes = try #require(signUp["recoveryCodes"]?.arrayValue).compactMap { $0.stringValue }
        #expect(codes.count == 10)
        let typed = codes[3].lowercased().replacingOccurrences(of: "-", with: " ")
        let first = Self.post(h, "/auth/recovery", .object(["code": .string(typed)]))
        #expect(first.status == 200 && first["name"] == .string("ann") && first["recoveryCodesLeft"] == .int(9), "\(first.json.serialized())")
        let second = Self.post(h, "/auth/recovery", .object(["code": .string(codes[3])]))
        #expect(second.code == "AUTHENTICATION_FAILED" && second.response.header("Set-Cookie") == nil, "used once")
        #expect(Self.post(h, "/auth/recovery", .object(["code": .string("ABCD")])).code == "BAD_REQUEST")
        // New codes from the signed-in session; the old ones stop working.
        let session = try BrowserSessionTests.session(from: first)
        var headers = Self.page
        headers["Cookie"] = session.cookie
        headers["X-Lattice-CSRF"] = session.csrf
        let fresh = try #require(Self.post(h, "/auth/recovery/codes", .object([:]), headers: headers)["recoveryCodes"]?.arrayValue)
        #expect(fresh.count == 10)
        #expect(Self.post(h, "/auth/recovery", .object(["code": .string(codes[4])])).code == "AUTHENTICATION_FAILED")
        #expect(Self.post(h, "/auth/recovery", .object(["code": fresh[0]])).status == 200)
    }

    @Test func ceremoniesAreBoundedPerAddressAndForgottenWhenExpired() throws {
        let h = try ServiceHarness()
        for index in 0..<20 {
            let options = Self.post(h, "/auth/passkey/signin/options", .object([:]))
            #expect(options.status == 200, "ceremony \(index)")
        }
        let refused = Self.post(h, "/auth/passkey/signin/options", .object([:]))
        #expect(refused.code == "THROTTLED" && refused.response.header("Retry-After") != nil, "\(refused.json.serialized())")
        h.clock.advance(5 * 60 * 1000)
        #expect(Self.post(h, "/auth/passkey/signin/options", .object([:])).status == 200, "expired ones are forgotten")
        let live = try h.storage.read { try $0.livePasskeyCeremonies(address: nil, nowMs: h.clock.now) }
        #expect(live == 1)
    }
}
