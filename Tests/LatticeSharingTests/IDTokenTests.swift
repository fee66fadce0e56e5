import LatticeCore
import LatticeSharing
import LatticeTestSupport
import Testing

/// An identity provider's ID tokens (issue 30): every forgery the issue lists is refused.
@Suite struct IDTokenTests {
    static let issuer = "http://127.0.0.1:9000"
    static let client = "lattice-web"
    static let now: Int64 = 1_800_000_000

    static func jwk(_ key: TestSigningKey, kid: String, alg: Bool = true) -> JSON {
        var object: [String: JSON] = ["kid": .string(kid), "use": .string("sig")]
        if alg { object["alg"] = .string(key.algorithm.rawValue) }
        switch key.algorithm {
        case .es256:
            object["kty"] = .string("EC")
            object["crv"] = .string("P-256")
            object["x"] = .string(Base64URL.encode(key.x))
            object["y"] = .string(Base64URL.encode(key.y))
        case .rs256:
            object["kty"] = .string("RSA")
            object["n"] = .string(Base64URL.encode(key.modulus))
            object["e"] = .string(Base64URL.encode(key.exponent))
        }
        return .object(object)
    }

    static func claims(_ changes: [String: JSON?] = [:]) -> JSON {
        var object: [String: JSON] = ["iss": .string(issuer), "aud": .string(client), "sub": .string("user-42"),
                                      "exp": .int(now + 300), "iat": .int(now - 5), "nonce": .string("n-1"),
                                      "preferred_username": .string("Ann")]
        for (key, value) in changes { object[key] = value }
        return .object(object)
    }

    static func token(_ key: TestSigningKey, kid: String = "k1", claims: JSON = claims(), header: [String: JSON] = [:]) -> String {
        var head: [String: JSON] = ["alg": .string(key.algorithm.rawValue), "kid": .string(kid), "typ": .string("JWT")]
        for (name, value) in header { head[name] = value }
        let input = Base64URL.encode(JSON.object(head).serializedBytes()) + "." + Base64URL.encode(claims.serializedBytes())
        return input + "." + Base64URL.encode(key.signJOSE(Array(input.utf8)))
    }

    static func verify(_ token: String, _ keys: ProviderKeySet, nonce: String? = "n-1", now: Int64 = now) throws(TokenError) -> IDTokenClaims {
        try IDTokenVerifier.verify(token, keys: keys, issuer: issuer, audience: client, nonce: nonce, nowSeconds: now)
    }

    @Test(arguments: [SignatureAlgorithm.rs256, .es256])
    func aTokenSignedByTheProviderVerifies(_ algorithm: SignatureAlgorithm) throws {
        let key = TestSigningKey(algorithm)
        let keys = try ProviderKeySet(json: .object(["keys": .array([Self.jwk(key, kid: "k1")])]))
        let claims = try Self.verify(Self.token(key), keys)
        #expect(claims.subject == "user-42" && claims.issuer == Self.issuer && claims.preferredUserName == "Ann")
        #expect(IDTokenVerifier.keyID(of: Self.token(key)) == "k1")
        // An app's exchange sends no nonce of ours: the token's is not checked then.
        #expect(try Self.verify(Self.token(key, claims: Self.claims(["nonce": nil])), keys, nonce: nil).subject == "user-42")
    }

    @Test func everyForgeryIsRefused() throws {
        let key = TestSigningKey(.rs256)
        let keys = try ProviderKeySet(json: .object(["keys": .array([Self.jwk(key, kid: "k1")])]))
        let good = Self.token(key)
        let parts = good.split(separator: ".").map(String.init)
        var forgedSignature = Base64URL.decode(parts[2])!
        forgedSignature[5] ^= 1
        let header = { (alg: String) in Base64URL.encode(JSON.object(["alg": .string(alg), "kid": .string("k1")]).serializedBytes()) }
        // HS256 "signed" with the provider's public key as the HMAC secret: what a confused verifier accepts.
        let hs256 = header("HS256") + "." + parts[1] + "." + Base64URL.encode(Secrets.sha256(key.modulus + Array(parts[1].utf8)))
        let stranger = TestSigningKey(.rs256)
        let forgeries: [(String, String, String?)] = [
            ("a forged signature", parts[0] + "." + parts[1] + "." + Base64URL.encode(forgedSignature), "signature"),
            ("alg none", header("none") + "." + parts[1] + ".", "algorithm"),
            ("HS256 with the public key", hs256, "algorithm"),
            ("signed by another key with the same kid", Self.token(stranger), "signature"),
            ("an unknown kid", Self.token(key, kid: "k9"), "kid"),
            ("expired", Self.token(key, claims: Self.claims(["exp": .int(Self.now - 61)])), "expired"),
            ("issued in the future", Self.token(key, claims: Self.claims(["iat": .int(Self.now + 600)])), "issue time"),
            ("no expiry", Self.token(key, claims: Self.claims(["exp": nil])), "expiry"),
            ("another issuer", Self.token(key, claims: Self.claims(["iss": .string("https://evil.example")])), "issuer"),
            ("another audience", Self.token(key, claims: Self.claims(["aud": .string("someone-else")])), "client id"),
            ("several audiences, azp not ours", Self.token(key, claims: Self.claims(["aud": .array([.string(Self.client), .string("x")])])), "azp"),
            ("another sign-in's nonce", Self.token(key, claims: Self.claims(["nonce": .string("n-2")])), "nonce"),
            ("no subject", Self.token(key, claims: Self.claims(["sub": nil])), "subject"),
            ("a critical extension", Self.token(key, header: ["crit": .array([.string("b64")])]), "critical"),
            ("an ES256 header on an RSA key", Self.token(TestSigningKey(.es256)), "no ES256 key"),
            ("not a JWS", "a.b", "three parts"),
            ("too long", String(repeating: "a", count: 20_000), "longer"),
        ]
        for (what, token, reason) in forgeries {
            do {
                _ = try Self.verify(token, keys)
                Issue.record("\(what) was accepted")
            } catch {
                if let reason { #expect(error.description.contains(reason), "\(what): \(error)") }
            }
        }
        // The several-audiences case is accepted when azp names us.
        let both = Self.token(key, claims: Self.claims(["aud": .array([.string(Self.client), .string("x")]), "azp": .string(Self.client)]))
        #expect(try Self.verify(both, keys).subject == "user-42")
        // Within the leeway an expiry a few seconds ago still passes (clocks differ).
        #expect(try Self.verify(Self.token(key, claims: Self.claims(["exp": .int(Self.now - 30)])), keys).subject == "user-42")
    }

    @Test func keySetsKeepOnlyUsableSigningKeys() throws {
        let rsa = TestSigningKey(.rs256), ec = TestSigningKey(.es256)
        var encryption = Self.jwk(rsa, kid: "enc").objectValue!
        encryption["use"] = .string("enc")
        var hmac = Self.jwk(rsa, kid: "hmac").objectValue!
        hmac["alg"] = .string("HS256")
        let set = try ProviderKeySet(json: .object(["keys": .array([
            .object(encryption), .object(hmac), .object(["kty": .string("oct"), "k": .string("c2VjcmV0")]),
            Self.jwk(rsa, kid: "r"), Self.jwk(ec, kid: "e", alg: false),
        ])]))
        #expect(set.keys.map(\.id) == ["r", "e"])
        #expect(throws: TokenError.self) { try ProviderKeySet(json: .object(["keys": .array([.object(hmac)])])) }
        #expect(throws: TokenError.self) { try ProviderKeySet(json: .object(["nokeys": .null])) }
    }
}

extension IDTokenTests {
    /// Times at the edges of Int64 are compared without overflowing: an `exp` of Int64.max is far in the
    /// future, one of Int64.min long past.
    @Test func expiryTimesAtTheEdgesDoNotOverflow() throws {
        let key = TestSigningKey(.es256)
        let keys = try ProviderKeySet(json: .object(["keys": .array([Self.jwk(key, kid: "k1")])]))
        #expect(try Self.verify(Self.token(key, claims: Self.claims(["exp": .int(.max)])), keys).subject == "user-42")
        #expect(throws: TokenError("the token expired")) {
            try Self.verify(Self.token(key, claims: Self.claims(["exp": .int(.min)])), keys)
        }
        #expect(throws: TokenError.self) { try Self.verify(Self.token(key, claims: Self.claims(["iat": .int(.max)])), keys) }
    }
}
