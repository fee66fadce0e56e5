import LatticeCore
@testable import LatticeSharing
import LatticeTestSupport
import Testing

@Suite struct WebAuthnTests {
    static let rp = RelyingParty(id: "localhost", origins: ["http://localhost:8080"])
    static let challenge = (0..<32).map { UInt8($0) }

    static func register(_ authenticator: TestAuthenticator, flags: UInt8 = 0x45, challenge: [UInt8] = challenge,
                         type: String = "webauthn.create", origin: String? = nil, rpID: String? = nil, cose: CBOR? = nil,
                         requireUV: Bool = false) throws(WebAuthnError) -> RegisteredPasskey {
        try WebAuthn.verifyRegistration(
            clientDataJSON: authenticator.clientData(type, challenge, origin: origin),
            attestationObject: authenticator.attestationObject(authenticator.authenticatorData(flags: flags, attested: true, rpID: rpID, cose: cose)),
            challenge: Self.challenge, relyingParty: rp, requireUserVerification: requireUV)
    }

    @Test(arguments: [SignatureAlgorithm.es256, .rs256])
    func aPasskeyRegistersAndSignsIn(_ algorithm: SignatureAlgorithm) throws {
        var authenticator = TestAuthenticator(algorithm, signCount: 5)
        let passkey = try Self.register(authenticator)
        #expect(passkey.credentialID == authenticator.credentialID)
        #expect(passkey.algorithm == algorithm && passkey.signCount == 5 && passkey.userVerified)
        let signIn = (0..<32).map { UInt8(255 - $0) }
        let assertion = authenticator.assert(signIn)
        let verified = try WebAuthn.verifyAssertion(
            clientDataJSON: assertion.clientData, authenticatorData: assertion.authenticatorData, signature: assertion.signature,
            challenge: signIn, relyingParty: Self.rp, publicKey: passkey.publicKey, storedSignCount: passkey.signCount,
            requireUserVerification: true)
        #expect(verified.signCount == 6)
    }

    @Test func registrationsThatFailACheckAreRefused() throws {
        let good = TestAuthenticator()
        let refusals: [(String, () throws(WebAuthnError) -> RegisteredPasskey)] = [
            ("another origin", { () throws(WebAuthnError) in try Self.register(good, origin: "http://evil.example") }),
            ("another RP ID", { () throws(WebAuthnError) in try Self.register(good, rpID: "evil.example") }),
            ("another challenge", { () throws(WebAuthnError) in try Self.register(good, challenge: [1, 2, 3]) }),
            ("a sign-in's type", { () throws(WebAuthnError) in try Self.register(good, type: "webauthn.get") }),
            ("no user presence", { () throws(WebAuthnError) in try Self.register(good, flags: 0x44) }),
            ("no user verification when required", { () throws(WebAuthnError) in try Self.register(good, flags: 0x41, requireUV: true) }),
            ("EdDSA", { () throws(WebAuthnError) in
                try Self.register(good, cose: .map([.init(key: .int(1), value: .int(1)), .init(key: .int(3), value: .int(-8)),
                                                    .init(key: .int(-1), value: .int(6)), .init(key: .int(-2), value: .bytes([UInt8](repeating: 1, count: 32)))]))
            }),
            ("an RS256 key labelled EC2", { () throws(WebAuthnError) in
                try Self.register(good, cose: .map([.init(key: .int(1), value: .int(2)), .init(key: .int(3), value: .int(-257))]))
            }),
            ("a point off the curve", { () throws(WebAuthnError) in
                var y = good.key.y
                y[0] ^= 1
                return try Self.register(good, cose: .map([.init(key: .int(1), value: .int(2)), .init(key: .int(3), value: .int(-7)),
                                                           .init(key: .int(-1), value: .int(1)), .init(key: .int(-2), value: .bytes(good.key.x)),
                                                           .init(key: .int(-3), value: .bytes(y))]))
            }),
        ]
        for (what, attempt) in refusals {
            #expect(throws: WebAuthnError.self, "\(what)") { try attempt() }
        }
        // Not CBOR, and CBOR the decoder refuses.
        #expect(throws: WebAuthnError.self) {
            try WebAuthn.verifyRegistration(clientDataJSON: good.clientData("webauthn.create", Self.challenge), attestationObject: [0xBF, 0xFF],
                                            challenge: Self.challenge, relyingParty: Self.rp, requireUserVerification: false)
        }
    }

    @Test func signInsThatFailACheckAreRefused() throws {
        var authenticator = TestAuthenticator(signCount: 10)
        let passkey = try Self.register(authenticator)
        func verify(_ a: (clientData: [UInt8], authenticatorData: [UInt8], signature: [UInt8]), challenge: [UInt8] = Self.challenge,
                    stored: UInt32 = 10, key: [UInt8]? = nil) throws(WebAuthnError) {
            _ = try WebAuthn.verifyAssertion(clientDataJSON: a.clientData, authenticatorData: a.authenticatorData, signature: a.signature,
                                             challenge: challenge, relyingParty: Self.rp, publicKey: key ?? passkey.publicKey,
                                             storedSignCount: stored, requireUserVerification: false)
        }
        var forged = authenticator.assert(Self.challenge)
        forged.signature[8] ^= 0x01
        #expect(throws: WebAuthnError.self, "a forged signature") { try verify(forged) }
        #expect(throws: WebAuthnError.self, "another challenge") { try verify(authenticator.assert([9, 9])) }
        #expect(throws: WebAuthnError.self, "another origin") { try verify(authenticator.assert(Self.challenge, origin: "https://evil.example")) }
        #expect(throws: WebAuthnError.self, "another RP") { try verify(authenticator.assert(Self.challenge, rpID: "evil.example")) }
        #expect(throws: WebAuthnError.self, "no presence") { try verify(authenticator.assert(Self.challenge, flags: 0x04)) }
        let replayed = authenticator.assert(Self.challenge)
        try verify(replayed)
        #expect(throws: WebAuthnError.self, "a counter that did not grow") { try verify(replayed, stored: authenticator.signCount) }
        let stranger = try Self.register(TestAuthenticator())
        #expect(throws: WebAuthnError.self, "another passkey's key") { try verify(authenticator.assert(Self.challenge), key: stranger.publicKey) }
        // An authenticator that keeps no counter (synced passkeys): 0 after 0 is fine.
        var synced = TestAuthenticator(signCount: 0)
        let syncedKey = try Self.register(synced)
        let a = synced.assert(Self.challenge)
        _ = try WebAuthn.verifyAssertion(clientDataJSON: a.clientData, authenticatorData: a.authenticatorData, signature: a.signature,
                                         challenge: Self.challenge, relyingParty: Self.rp, publicKey: syncedKey.publicKey,
                                         storedSignCount: 0, requireUserVerification: false)
    }

    @Test func theRelyingPartyComesFromThePublicURL() {
        #expect(RelyingParty(publicURL: "https://lists.example.com") == RelyingParty(id: "lists.example.com", origins: ["https://lists.example.com"]))
        #expect(RelyingParty(publicURL: "http://localhost:8080/") == RelyingParty(id: "localhost", origins: ["http://localhost:8080"]))
        #expect(RelyingParty(publicURL: "HTTPS://Lists.Example.com:8443/x")?.origins == ["https://lists.example.com:8443"])
        #expect(RelyingParty(publicURL: "ftp://x") == nil)
        #expect(RelyingParty(publicURL: "https://user@host") == nil)
    }

    @Test func cborIsDecodedWithinItsLimits() throws {
        let item = CBOR.map([.init(key: .int(1), value: .array([.text("a"), .bytes([1, 2]), .bool(true), .null, .int(-300)]))])
        #expect(try CBOR.decode(item.encoded) == item)
        #expect(throws: CBOR.DecodeError.self, "indefinite length") { try CBOR.decode([0x9F, 0x01, 0xFF]) }
        #expect(throws: CBOR.DecodeError.self, "a tag") { try CBOR.decode([0xC0, 0x01]) }
        #expect(throws: CBOR.DecodeError.self, "a float") { try CBOR.decode([0xF9, 0x3C, 0x00]) }
        #expect(throws: CBOR.DecodeError.self, "trailing bytes") { try CBOR.decode([0x01, 0x02]) }
        #expect(throws: CBOR.DecodeError.self, "a duplicate key") { try CBOR.decode([0xA2, 0x01, 0x01, 0x01, 0x02]) }
        #expect(throws: CBOR.DecodeError.self, "cut short") { try CBOR.decode([0x5A, 0xFF, 0xFF, 0xFF, 0xFF, 0x00]) }
        #expect(throws: CBOR.DecodeError.self, "a huge array header") { try CBOR.decode([0x9B] + [UInt8](repeating: 0xFF, count: 8)) }
        let deep = [UInt8](repeating: 0x81, count: 50) + [0x01]
        #expect(throws: CBOR.DecodeError.self, "nested too deep") { try CBOR.decode(deep) }
    }
}
