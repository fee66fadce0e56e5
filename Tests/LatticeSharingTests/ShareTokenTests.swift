import CLibCrypto
import Foundation
import LatticeCore
@testable import LatticeSharing
import Testing

@Suite struct Ed25519KeyTests {
    static func bytes(hex: String) -> [UInt8] {
        var out = [UInt8]()
        var index = hex.startIndex
        while index < hex.endIndex {
            let next = hex.index(index, offsetBy: 2)
            out.append(UInt8(hex[index..<next], radix: 16)!)
            index = next
        }
        return out
    }

    @Test func rfc8032TestVector1() throws {
        let seed = Self.bytes(hex: "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60")
        let key = try Ed25519Key(privateKey: seed)
        #expect(Secrets.hex(key.publicKeyBytes) == "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a")
        let signature = try key.sign([])
        #expect(Secrets.hex(signature) == "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155"
            + "5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b")
        let verifier = try Ed25519Key(publicKey: key.publicKeyBytes)
        #expect(verifier.verify(signature: signature, message: []))
        #expect(!verifier.verify(signature: signature, message: [0]))
    }

    @Test func rfc8037ExampleJWSAndThumbprint() throws {
        // RFC 8037 appendix A.1-A.4: the key, its RFC 7638 thumbprint and the compact JWS of
        // "Example of Ed25519 signing".
        let key = try Ed25519Key(privateKey: Base64URL.decode("nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A")!)
        #expect(Base64URL.encode(key.publicKeyBytes) == "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
        #expect(key.thumbprint == "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k")
        let input = CompactJWS.signingInput(header: Array(#"{"alg":"EdDSA"}"#.utf8),
                                            payload: Array("Example of Ed25519 signing".utf8))
        #expect(input == "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc")
        #expect(Base64URL.encode(try key.sign(Array(input.utf8)))
            == "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg")
    }

    @Test func rawExportImportAndMisuse() throws {
        let key = try Ed25519Key.generate()
        let other = try Ed25519Key.generate()
        #expect(key.publicKeyBytes != other.publicKeyBytes && key.canSign)
        let seed = try key.privateKeyBytes()
        let reloaded = try Ed25519Key(privateKey: seed)
        #expect(reloaded.publicKeyBytes == key.publicKeyBytes)
        let message = Array("share".utf8)
        #expect(reloaded.verify(signature: try key.sign(message), message: message))
        #expect(!other.verify(signature: try key.sign(message), message: message))

        let publicOnly = try Ed25519Key(publicKey: key.publicKeyBytes)
        #expect(!publicOnly.canSign)
        #expect(throws: CryptoError.self) { try publicOnly.sign(message) }
        #expect(throws: CryptoError.self) { try publicOnly.privateKeyBytes() }
        #expect(throws: CryptoError.self) { try Ed25519Key(privateKey: Array(seed.prefix(31))) }
        #expect(throws: CryptoError.self) { try Ed25519Key(publicKey: key.publicKeyBytes + [0]) }
        #expect(!publicOnly.verify(signature: Array(try key.sign(message).prefix(63)), message: message))
    }

    @Test func rejectedSignatureLeavesNoLibcryptoError() throws {
        let key = try Ed25519Key.generate()
        ERR_clear_error()
        #expect(!key.verify(signature: [UInt8](repeating: 0xFF, count: 64), message: [1, 2, 3]))
        #expect(ERR_peek_error() == 0)
    }
}

@Suite struct ShareTokenTests {
    @Test func signAndVerifyRoundTrip() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let claims = try ShareFixtures.claims()
        let token = try ring.sign(claims)
        #expect(try ring.verify(token, nowSeconds: ShareFixtures.now) == claims)

        let parts = ShareFixtures.parts(token)
        #expect(parts.count == 3)
        // The header is exactly this text: the algorithm and key are fixed by the ring, not the caller.
        #expect(Base64URL.decode(parts[0]) == Array(#"{"alg":"EdDSA","kid":"\#(ring.activeKeyID)","typ":"JWT"}"#.utf8))
        let payload = ShareFixtures.decodeJSON(parts[1])
        #expect(payload == .object([
            "iss": .string("https://lattice.example"), "sub": .string("share-7f3a"), "zone": .string("Lists"),
            "owner": .string("_9a1c"), "iat": .int(ShareFixtures.now), "exp": .int(ShareFixtures.now + 3600),
            "max_uses": .int(5), "jti": .string(claims.tokenID), "perm": .string("readWrite"), "epoch": .int(3),
        ]))
        #expect(Base64URL.decode(claims.tokenID)?.count == 16 && claims.tokenID.utf8.count == 22)
        #expect(try ShareClaims.newTokenID() != claims.tokenID)
        print("share token (\(token.utf8.count) bytes): \(token)")
    }

    @Test func optionalClaimsAreLeftOut() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        var claims = try ShareFixtures.claims()
        claims.expiresAt = nil
        claims.maximumUses = nil
        claims.permission = "readOnly"
        let token = try ring.sign(claims)
        let payload = ShareFixtures.decodeJSON(ShareFixtures.parts(token)[1])
        #expect(payload["exp"] == nil && payload["max_uses"] == nil)
        #expect(try ring.verify(token, nowSeconds: ShareFixtures.now + 100 * 365 * 86400) == claims)
    }

    @Test(arguments: [UInt64(0x5EED), 7, UInt64.random(in: 0...UInt64.max)])
    func randomClaimsRoundTrip(seed: UInt64) throws {
        print("share claims round trips, seed \(seed)")
        var random = SplitMix64(seed: seed)
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        func text() -> String {
            let scalars: [Unicode.Scalar] = ["a", "Z", "0", "-", "/", "\"", "\\", "\n", "\u{7F}", "é", "😀", "\u{0}"]
            return String(String.UnicodeScalarView((0..<Int.random(in: 1...20, using: &random)).map { _ in
                scalars.randomElement(using: &random)!
            }))
        }
        for _ in 0..<100 {
            let issuedAt = Int64.random(in: 0...ShareFixtures.now, using: &random)
            let claims = ShareClaims(
                issuer: text(), shareID: text(), zoneName: text(), ownerRecordName: text(), issuedAt: issuedAt,
                expiresAt: Bool.random(using: &random)
                    ? nil : Int64.random(in: ShareFixtures.now...Int64.max, using: &random),
                maximumUses: Bool.random(using: &random) ? nil : Int.random(in: 1...Int.max, using: &random),
                tokenID: text(), permission: Bool.random(using: &random) ? "readOnly" : "readWrite",
                epoch: Int64.random(in: 0...Int64.max, using: &random)
            )
            let token = try ring.sign(claims)
            #expect(try ring.verify(token, nowSeconds: ShareFixtures.now) == claims, "seed \(seed)")
        }
    }

    @Test func signRefusesClaimsThatCouldNotVerify() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let good = try ShareFixtures.claims()
        var cases: [ShareClaims] = []
        for change in [{ (c: inout ShareClaims) in c.permission = "admin" }, { $0.permission = "readonly" },
                       { $0.maximumUses = 0 }, { $0.maximumUses = -1 }, { $0.shareID = "" }, { $0.issuer = "" },
                       { $0.zoneName = "" }, { $0.ownerRecordName = "" }, { $0.tokenID = "" }, { $0.issuedAt = -1 },
                       { $0.epoch = -1 }, { $0.issuer = String(repeating: "x", count: 4000) }] {
            var claims = good
            change(&claims)
            cases.append(claims)
        }
        for claims in cases {
            #expect(throws: ShareKeyRingError.self) { try ring.sign(claims) }
        }
    }

    @Test func jwksShape() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let jwks = ring.jwks()
        guard case .object(let top) = jwks, top.count == 1, case .array(let keys)? = top["keys"] else {
            Issue.record("JWKS is not {\"keys\": [...]}: \(jwks.serialized())")
            return
        }
        #expect(keys.count == 1)
        let key = keys[0]
        #expect(key.objectValue.map { Set($0.keys) } == ["kty", "crv", "x", "kid", "use", "alg"])
        #expect(key["kty"] == .string("OKP") && key["crv"] == .string("Ed25519"))
        #expect(key["use"] == .string("sig") && key["alg"] == .string("EdDSA"))
        #expect(key["kid"] == .string(ring.activeKeyID))
        let x = try #require(key["x"]?.stringValue.flatMap(Base64URL.decode))
        #expect(x.count == 32)
        #expect(try Ed25519Key(publicKey: x).thumbprint == ring.activeKeyID)
        print("JWKS: \(jwks.serialized())")
    }

    // MARK: Tampering

    @Test func everyClaimMutatedKeepingTheSignatureFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let token = try ring.sign(try ShareFixtures.claims())
        let parts = ShareFixtures.parts(token)
        guard case .object(let payload) = ShareFixtures.decodeJSON(parts[1]) else { Issue.record("payload"); return }

        var variants: [(String, [String: JSON])] = []
        for (name, value) in payload {
            var changed = payload
            switch value {
            case .string(let text):
                changed[name] = .string(text + "x")
                variants.append(("\(name) edited", changed))
                changed[name] = .int(1)
                variants.append(("\(name) as an integer", changed))
            case .int(let number):
                changed[name] = .int(number + 1)
                variants.append(("\(name) + 1", changed))
                changed[name] = .int(number - 1)
                variants.append(("\(name) - 1", changed))
                changed[name] = .string(String(number))
                variants.append(("\(name) as a string", changed))
            default:
                Issue.record("unexpected claim type for \(name)")
            }
            changed = payload
            changed[name] = nil
            variants.append(("\(name) removed", changed))
        }
        var extra = payload
        extra["admin"] = .bool(true)
        variants.append(("unknown claim added", extra))
        var permission = payload
        permission["perm"] = .string("readOnly")
        variants.append(("perm lowered", permission))
        #expect(variants.count >= 30)

        for (label, variant) in variants {
            let forged = [parts[0], ShareFixtures.encodeJSON(.object(variant)), parts[2]].joined(separator: ".")
            #expect(ShareFixtures.rejection(ring, forged) == .badSignature, "\(label)")
        }
        // The unmodified payload, re-encoded by the same serializer, is the original token: the forgeries above
        // differ only in the claim named.
        #expect([parts[0], ShareFixtures.encodeJSON(.object(payload)), parts[2]].joined(separator: ".") == token)
        #expect(ShareFixtures.rejection(ring, token) == nil)
    }

    @Test func everySignatureBitFlipFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let token = try ring.sign(try ShareFixtures.claims())
        let parts = ShareFixtures.parts(token)
        let signature = try #require(Base64URL.decode(parts[2]))
        for byte in signature.indices {
            for bit in 0..<8 {
                var flipped = signature
                flipped[byte] ^= 1 << bit
                let forged = parts[0] + "." + parts[1] + "." + Base64URL.encode(flipped)
                #expect(ShareFixtures.rejection(ring, forged) == .badSignature, "byte \(byte) bit \(bit)")
            }
        }
    }

    @Test func everyCharacterReplacedFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let token = Array(try ring.sign(try ShareFixtures.claims()).utf8)
        for index in token.indices where token[index] != UInt8(ascii: ".") {
            var forged = token
            forged[index] = token[index] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
            #expect(ShareFixtures.rejection(ring, String(decoding: forged, as: UTF8.self)) != nil, "index \(index)")
        }
    }

    @Test func truncationAtEveryLengthFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let token = try ring.sign(try ShareFixtures.claims())
        for length in 0..<token.utf8.count {
            let truncated = String(decoding: token.utf8.prefix(length), as: UTF8.self)
            #expect(ShareFixtures.rejection(ring, truncated) != nil, "length \(length)")
        }
        // Cutting from the front fails too.
        for start in 1..<token.utf8.count {
            #expect(ShareFixtures.rejection(ring, String(decoding: token.utf8.dropFirst(start), as: UTF8.self)) != nil)
        }
    }

    @Test func unknownOrForeignKeyIDFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        let (other, otherDirectory) = try ShareFixtures.ring()
        defer { directory.remove(); otherDirectory.remove() }
        let claims = try ShareFixtures.claims()

        // A token from another server's key: its kid is unknown here.
        #expect(ShareFixtures.rejection(ring, try other.sign(claims)) == .unknownKey)

        // Our token relabelled with another kid, signature kept.
        let parts = ShareFixtures.parts(try ring.sign(claims))
        for kid: JSON in [.string(other.activeKeyID), .string("nope"), .string(""), .int(1), .null] {
            let header = JSON.object(["alg": .string("EdDSA"), "kid": kid, "typ": .string("JWT")])
            let forged = [ShareFixtures.encodeJSON(header), parts[1], parts[2]].joined(separator: ".")
            #expect(ShareFixtures.rejection(ring, forged) == .unknownKey, "kid \(kid)")
        }
        // No kid at all.
        let noKid = ShareFixtures.encodeJSON(.object(["alg": .string("EdDSA"), "typ": .string("JWT")]))
        #expect(ShareFixtures.rejection(ring, [noKid, parts[1], parts[2]].joined(separator: ".")) == .unknownKey)
        // The other ring's key signing a token that claims our kid: the signature does not match our key.
        let header = CompactJWS.header(keyID: ring.activeKeyID).serializedBytes()
        let impostor = try other.signUnchecked(header: header, payload: claims.json.serializedBytes())
        #expect(ShareFixtures.rejection(ring, impostor) == .badSignature)
    }

    @Test func algNoneWithEmptySignatureFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let payload = ShareFixtures.encodeJSON(try ShareFixtures.claims().json)
        for header: JSON in [
            .object(["alg": .string("none"), "kid": .string(ring.activeKeyID), "typ": .string("JWT")]),
            .object(["alg": .string("none")]),
            .object(["alg": .string("None"), "kid": .string(ring.activeKeyID)]),
        ] {
            let encoded = ShareFixtures.encodeJSON(header)
            #expect(ShareFixtures.rejection(ring, encoded + "." + payload + ".") == .algorithm)
            #expect(ShareFixtures.rejection(ring, encoded + "." + payload) == .notThreeParts)
        }
    }

    /// HMAC-SHA256 through libcrypto (`EVP_Q_mac`).
    static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length = 0
        let result = EVP_Q_mac(
            nil, "HMAC", nil, "SHA256", nil, key, key.count, message, message.count, &out, 32, &length
        )
        precondition(result != nil && length == 32, "HMAC failed")
        return out
    }

    @Test func hmacHelperMatchesRFC4231() {
        let mac = Self.hmacSHA256(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8))
        #expect(Secrets.hex(mac)
            == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    @Test func hs256WithThePublicKeyAsSecretFails() throws {
        // The classic confusion attack: a verifier that takes `alg` from the token would check an HMAC keyed
        // with the public key, which the attacker knows. The ring pins EdDSA to every kid.
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let jwk = ring.jwks()["keys"]!.arrayValue![0]
        let x = jwk["x"]!.stringValue!
        let raw = Base64URL.decode(x)!
        let der = [0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00] + raw
        let pem = "-----BEGIN PUBLIC KEY-----\n\(Data(der).base64EncodedString())\n-----END PUBLIC KEY-----\n"
        let secrets: [(String, [UInt8])] = [
            ("raw x", raw), ("x text", Array(x.utf8)), ("PEM", Array(pem.utf8)), ("JWK JSON", jwk.serializedBytes()),
        ]
        let payload = try ShareFixtures.claims().json.serializedBytes()
        for alg in ["HS256", "HS512", "hs256"] {
            for (label, secret) in secrets {
                let header = JSON.object(["alg": .string(alg), "kid": .string(ring.activeKeyID), "typ": .string("JWT")])
                let input = CompactJWS.signingInput(header: header.serializedBytes(), payload: payload)
                let mac = Self.hmacSHA256(key: secret, message: Array(input.utf8))
                let forged = input + "." + Base64URL.encode(mac)
                #expect(ShareFixtures.rejection(ring, forged) == .algorithm, "\(alg) \(label)")
                // Even padded out to an Ed25519 signature's length, an HMAC is no signature.
                let padded = input + "." + Base64URL.encode(mac + mac)
                #expect(ShareFixtures.rejection(ring, padded) == .algorithm, "\(alg) \(label) padded")
            }
        }
    }

    @Test func expiryAndIssueTimeUseTheLeeway() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        var claims = try ShareFixtures.claims()
        let exp = ShareFixtures.now + 3600
        claims.expiresAt = exp
        let token = try ring.sign(claims)
        #expect(ShareFixtures.rejection(ring, token, now: exp - 1) == nil)
        #expect(ShareFixtures.rejection(ring, token, now: exp) == nil)              // within the 60 s leeway
        #expect(ShareFixtures.rejection(ring, token, now: exp + 59) == nil)
        #expect(ShareFixtures.rejection(ring, token, now: exp + 60) == .expired)    // beyond it
        #expect(ShareFixtures.rejection(ring, token, now: exp + 86400) == .expired)
        #expect(ShareFixtures.rejection(ring, token, now: exp, leeway: 0) == .expired)
        #expect(ShareFixtures.rejection(ring, token, now: exp + 100, leeway: -5) == .expired)

        // Issued in the future: fine within the leeway, refused beyond it.
        let issued = ShareFixtures.now
        #expect(ShareFixtures.rejection(ring, token, now: issued - 60) == nil)
        #expect(ShareFixtures.rejection(ring, token, now: issued - 61) == .issuedInFuture)

        // Extremes do not overflow.
        claims.expiresAt = Int64.max
        #expect(ShareFixtures.rejection(ring, try ring.sign(claims), now: Int64.max, leeway: Int64.max) == nil)
        #expect(ShareFixtures.rejection(ring, try ring.sign(claims), now: Int64.min, leeway: Int64.max)
            == .issuedInFuture)  // iat is far ahead of Int64.min even with the largest leeway
        claims.expiresAt = Int64.min
        #expect(ShareFixtures.rejection(ring, try ring.sign(claims), now: ShareFixtures.now) == .expired)
        #expect(ShareFixtures.rejection(ring, try ring.sign(claims), now: ShareFixtures.now, leeway: Int64.max)
            == .expired)  // Int64.min + Int64.max = -1: still long past
    }

    @Test func malformedCompactSerializationFails() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let token = try ring.sign(try ShareFixtures.claims())
        let parts = ShareFixtures.parts(token)
        var forged: [String] = [
            token + ".", token + ".AAAA", "." + token, parts[0] + ".." + parts[1] + "." + parts[2],
            parts[0] + "." + parts[1] + "." + parts[2] + "." + parts[2],
            token.replacingOccurrences(of: ".", with: ".."),
            "", ".", "..", "...", " " + token, token + " ", token + "\n", token.uppercased(),
            String(repeating: "A", count: 5000), token + String(repeating: "A", count: 4096),
        ]
        for index in 0..<3 {
            for suffix in ["=", "==", "%3D", "+", "/", " ", "é", "\u{0}", "*"] {
                var changed = parts
                changed[index] += suffix
                forged.append(changed.joined(separator: "."))
            }
            // Standard base64 alphabet and padding in place of base64url.
            var standard = parts
            standard[index] = Data(Base64URL.decode(parts[index])!).base64EncodedString()
            if standard[index] != parts[index] { forged.append(standard.joined(separator: ".")) }
        }
        for text in forged {
            #expect(ShareFixtures.rejection(ring, text) != nil, "\(text.prefix(80))")
        }
        #expect(ShareFixtures.rejection(ring, String(repeating: "A", count: 5000)) == .tooLong)
        #expect(ShareFixtures.rejection(ring, token) == nil)
    }

    /// Headers and payloads that ARE signed by the active key but are malformed: the structural checks must
    /// refuse them on their own, not rely on the signature.
    @Test func validlySignedButMalformedTokensFail() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let kid = JSON.string(ring.activeKeyID)
        let goodHeader = CompactJWS.header(keyID: ring.activeKeyID)
        let goodClaims = try ShareFixtures.claims().json
        guard case .object(let claims) = goodClaims, case .object(let header) = goodHeader else { return }
        func token(header: [UInt8], payload: [UInt8]) throws -> String {
            try ring.signUnchecked(header: header, payload: payload)
        }
        #expect(ShareFixtures.rejection(
            ring, try token(header: goodHeader.serializedBytes(), payload: goodClaims.serializedBytes())) == nil)

        // Headers.
        var headers: [(String, [UInt8], CompactJWS.Rejection)] = []
        func add(_ label: String, _ change: (inout [String: JSON]) -> Void, _ reason: CompactJWS.Rejection) {
            var changed = header
            change(&changed)
            headers.append((label, JSON.object(changed).serializedBytes(), reason))
        }
        add("crit", { $0["crit"] = .array([.string("exp")]) }, .badHeader)
        add("jku", { $0["jku"] = .string("https://evil.example/jwks") }, .badHeader)
        add("jwk", { $0["jwk"] = .object(["kty": .string("OKP")]) }, .badHeader)
        add("b64 false", { $0["b64"] = .bool(false) }, .badHeader)
        add("typ JOSE", { $0["typ"] = .string("JOSE") }, .badHeader)
        add("typ number", { $0["typ"] = .int(1) }, .badHeader)
        add("alg missing", { $0["alg"] = nil }, .algorithm)
        add("alg Ed25519", { $0["alg"] = .string("Ed25519") }, .algorithm)
        add("alg eddsa", { $0["alg"] = .string("eddsa") }, .algorithm)
        add("alg ES256", { $0["alg"] = .string("ES256") }, .algorithm)
        add("alg array", { $0["alg"] = .array([.string("EdDSA")]) }, .algorithm)
        add("alg null", { $0["alg"] = .null }, .algorithm)
        add("kid number", { $0["kid"] = .int(1) }, .unknownKey)
        add("no typ (allowed)", { $0["typ"] = nil }, .badClaims)  // reaches the claims: see the payload below
        headers.append(("not an object", JSON.array([.string("EdDSA"), kid]).serializedBytes(), .badHeader))
        headers.append(("not JSON", Array("{alg:EdDSA}".utf8), .badHeader))
        headers.append(("empty", [], .badEncoding))
        let duplicateAlg = #"{"alg":"none","alg":"EdDSA","kid":\#(kid.serialized()),"typ":"JWT"}"#
        headers.append(("duplicate alg", Array(duplicateAlg.utf8), .badHeader))
        headers.append(("whitespace (allowed)",
                        Array(#"{ "alg" : "EdDSA", "kid" : \#(kid.serialized()) }"#.utf8), .badClaims))
        let badPayload = Array(#"{"iss":1}"#.utf8)
        for (label, bytes, reason) in headers {
            // A payload the claims check refuses, so a header that passes shows up as .badClaims.
            #expect(ShareFixtures.rejection(ring, try token(header: bytes, payload: badPayload)) == reason, "\(label)")
        }
        let headerWithoutType = Array(#"{"alg":"EdDSA","kid":\#(kid.serialized())}"#.utf8)
        let withoutType = try token(header: headerWithoutType, payload: goodClaims.serializedBytes())
        #expect(ShareFixtures.rejection(ring, withoutType) == nil)

        // Payloads.
        var payloads: [(String, [UInt8])] = []
        func change(_ label: String, _ edit: (inout [String: JSON]) -> Void) {
            var changed = claims
            edit(&changed)
            payloads.append((label, JSON.object(changed).serializedBytes()))
        }
        for name in ShareClaims.requiredNames { change("\(name) missing") { $0[name] = nil } }
        for (name, value) in claims {
            for wrong: JSON in [.null, .bool(true), .array([value]), .object(["v": value]), .double(1.5)] {
                change("\(name) as \(wrong.serialized())") { $0[name] = wrong }
            }
            if case .int(let number) = value {
                change("\(name) as a string") { $0[name] = .string(String(number)) }
                // LatticeCore writes an integral double as an integer, so spell the number forms out in text.
                for spelled in ["\(number).0", "\(number)e0", "\(number)0e-1"] {
                    let text = goodClaims.serialized()
                        .replacingOccurrences(of: "\"\(name)\":\(number)", with: "\"\(name)\":\(spelled)")
                    payloads.append(("\(name) as \(spelled)", Array(text.utf8)))
                }
            } else {
                change("\(name) as an integer") { $0[name] = .int(7) }
            }
        }
        for name in ["sub", "iss", "zone", "owner", "jti"] { change("\(name) empty") { $0[name] = .string("") } }
        for perm in ["admin", "readonly", "ReadWrite", "none", "owner", ""] {
            change("perm \(perm)") { $0["perm"] = .string(perm) }
        }
        change("max_uses 0") { $0["max_uses"] = .int(0) }
        change("max_uses -1") { $0["max_uses"] = .int(-1) }
        change("exp null") { $0["exp"] = .null }
        change("max_uses null") { $0["max_uses"] = .null }
        change("iat negative") { $0["iat"] = .int(-1) }
        change("epoch negative") { $0["epoch"] = .int(-1) }
        change("unknown claim") { $0["role"] = .string("owner") }
        change("nbf") { $0["nbf"] = .int(0) }
        payloads.append(("array", JSON.array([goodClaims]).serializedBytes()))
        payloads.append(("string", JSON.string("claims").serializedBytes()))
        payloads.append(("not JSON", Array("{iss:1}".utf8)))
        payloads.append(("trailing text", goodClaims.serializedBytes() + Array(" x".utf8)))
        let duplicatePerm = goodClaims.serialized().dropLast() + #","perm":"readWrite"}"#
        payloads.append(("duplicate perm", Array(duplicatePerm.utf8)))
        #expect(payloads.count > 60)
        for (label, bytes) in payloads {
            #expect(ShareFixtures.rejection(
                ring, try token(header: goodHeader.serializedBytes(), payload: bytes)) == .badClaims, "\(label)")
        }
        // The largest max_uses an Int holds is fine.
        change("max_uses max") { $0["max_uses"] = .int(Int64.max) }
        let largest = try token(header: goodHeader.serializedBytes(), payload: payloads.last!.1)
        #expect(ShareFixtures.rejection(ring, largest) == nil)
    }

    @Test func publicErrorSaysNothingSpecific() {
        #expect(ShareTokenError.invalid.description == "the share link is invalid, expired or revoked")
        #expect(ShareTokenError.invalid == ShareTokenError.invalid)
    }
}
