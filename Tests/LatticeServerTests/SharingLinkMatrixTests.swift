import Foundation
import LatticeCore
@testable import LatticeServer
@testable import LatticeSharing
import Testing

/// Tampered and dead share links through `records/accept` (and `records/resolve`): every one answers the same
/// error, with the same code and the same reason, and nobody joins.
extension AuthorizationMatrixTests {
    static let invalidLinkReason = "the share link is invalid, expired or revoked"

    private func tokenOf(_ url: String) -> String {
        guard let range = url.range(of: "/share/") else { return url }
        return String(url[range.upperBound...])
    }

    private func segments(_ token: String) -> [String] { token.split(separator: ".", omittingEmptySubsequences: false).map(String.init) }

    private func decoded(_ segment: String) throws -> [String: JSON] {
        let bytes = try #require(Base64URL.decode(segment))
        return try #require(try JSON.parse(bytes).objectValue)
    }

    private func encoded(_ object: [String: JSON]) -> String { Base64URL.encode(JSON.object(object).serializedBytes()) }

    /// The token with its payload replaced and its signature kept.
    private func withPayload(_ token: String, _ payload: [String: JSON]) -> String {
        let parts = segments(token)
        return parts[0] + "." + encoded(payload) + "." + parts[2]
    }

    /// The token with its header replaced and its signature kept.
    private func withHeader(_ token: String, _ header: [String: JSON]) -> String {
        let parts = segments(token)
        return encoded(header) + "." + parts[1] + "." + parts[2]
    }

    private func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var block = key.count > 64 ? Secrets.sha256(key) : key
        block += [UInt8](repeating: 0, count: 64 - block.count)
        let inner = Secrets.sha256(block.map { $0 ^ 0x36 } + message)
        return Secrets.sha256(block.map { $0 ^ 0x5C } + inner)
    }

    /// Collects the answers to dead links; all must be the one uniform error.
    final class DeadLinkLog {
        var answers: [String: [String]] = [:] // "CODE|reason" -> labels
        var count = 0

        func add(_ label: String, _ result: JSON) {
            count += 1
            let key = "\(result["serverErrorCode"]?.stringValue ?? "OK")|\(result["reason"]?.stringValue ?? "")"
            answers[key, default: []].append(label)
        }

        func check(sourceLocation: SourceLocation = #_sourceLocation) {
            let uniform = "ACCESS_DENIED|\(AuthorizationMatrixTests.invalidLinkReason)"
            for (answer, labels) in answers where answer != uniform {
                Issue.record("\(labels.count) dead links answered \(answer) instead of the uniform error: \(labels.prefix(20))",
                             sourceLocation: sourceLocation)
            }
            print("[links] \(count) dead-link answers; distinct answers: \(answers.keys.sorted())")
        }
    }

    /// Accepts and resolves a dead link as `who`; both answers go to the log.
    private func tryDead(_ w: MatrixWorld, _ log: DeadLinkLog, _ label: String, _ link: String, as who: String,
                         resolve: Bool = true) {
        log.add("accept " + label, w.accept(link, as: who))
        if resolve { log.add("resolve " + label, w.resolve(link, as: who)) }
    }

    @Test func tamperedLinksAllAnswerTheSameError() throws {
        let w = try MatrixWorld(guests: 2)
        let pub = MatrixWorld.pub
        let url = try w.link(pub, permission: "readOnly", extra: ["expiresInSeconds": .int(3600), "maxUses": .int(50)])
        let token = tokenOf(url)
        let parts = segments(token)
        #expect(parts.count == 3)
        let header = try decoded(parts[0])
        let payload = try decoded(parts[1])
        #expect(Set(payload.keys) == ["iss", "sub", "zone", "owner", "iat", "exp", "max_uses", "jti", "perm", "epoch"],
                "\(payload.keys.sorted())")
        // The edit pipeline is faithful: an unedited payload gives back the very token.
        #expect(withPayload(token, payload) == token)
        #expect(withHeader(token, header) == token)
        // Control: the link works (for a spare account), so every failure below is the tampering.
        #expect(w.accept(url, as: "guest0")["participantStatus"]?.stringValue == "accepted")
        let rosterBefore = w.shareView(pub)

        let log = DeadLinkLog()
        let listsPayload = try decoded(segments(tokenOf(w.listsLink))[1])
        // Every claim mutated, removed, retyped; plus an extra claim. Signature kept.
        let replacements: [String: [JSON]] = [
            "iss": [.string("https://evil.example"), .string((payload["iss"]?.stringValue ?? "") + "/")],
            "sub": [listsPayload["sub"]!, .string((payload["sub"]?.stringValue ?? "") + "0"), .string("")],
            "zone": [.string(MatrixWorld.lists), .string(MatrixWorld.other)],
            "owner": [.string(w.account("stranger").recordName), .string("_defaultOwner")],
            "iat": [.int((payload["iat"]?.intValue ?? 0) - 1), .int((payload["iat"]?.intValue ?? 0) + 1)],
            "exp": [.int((payload["exp"]?.intValue ?? 0) + 365 * 86_400), .int((payload["exp"]?.intValue ?? 0) - 1)],
            "max_uses": [.int(1_000_000), .int(51)],
            "jti": [.string("AAAAAAAAAAAAAAAAAAAAAA"), listsPayload["jti"]!],
            "perm": [.string("readWrite"), .string("owner")],
            "epoch": [.int((payload["epoch"]?.intValue ?? 0) + 1), .int(-1)],
        ]
        for key in payload.keys.sorted() {
            for (index, replacement) in (replacements[key] ?? []).enumerated() {
                var edited = payload
                edited[key] = replacement
                tryDead(w, log, "claim \(key) changed #\(index)", withPayload(token, edited), as: "stranger")
            }
            var removed = payload
            removed[key] = nil
            tryDead(w, log, "claim \(key) removed", withPayload(token, removed), as: "stranger")
            var retyped = payload
            retyped[key] = payload[key]?.stringValue != nil ? .int(1) : .string(payload[key]?.serialized() ?? "")
            tryDead(w, log, "claim \(key) retyped", withPayload(token, retyped), as: "stranger")
        }
        var extra = payload
        extra["admin"] = .bool(true)
        tryDead(w, log, "extra claim", withPayload(token, extra), as: "stranger")
        extra = payload
        extra["exp"] = nil
        extra["max_uses"] = nil
        tryDead(w, log, "limits stripped", withPayload(token, extra), as: "stranger")

        // Signature bit flips: every bit.
        let signature = try #require(Base64URL.decode(parts[2]))
        #expect(signature.count == 64)
        for bit in 0..<(signature.count * 8) {
            var flipped = signature
            flipped[bit / 8] ^= UInt8(1 << (bit % 8))
            tryDead(w, log, "signature bit \(bit)", parts[0] + "." + parts[1] + "." + Base64URL.encode(flipped), as: "stranger",
                    resolve: bit % 64 == 0)
        }
        // Every character of the header and payload text replaced by another base64url character.
        let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
        var text = Array(token)
        let lastSigned = parts[0].count + 1 + parts[1].count
        for index in 0..<lastSigned where text[index] != "." {
            let original = text[index]
            text[index] = alphabet[(alphabet.firstIndex(of: original)! + 1) % alphabet.count]
            tryDead(w, log, "signed text char \(index)", String(text), as: "stranger", resolve: false)
            text[index] = original
        }
        // Truncations and extensions.
        var truncated: [(String, String)] = (1...8).map { ("last \($0) chars dropped", String(token.dropLast($0))) }
        truncated += [
            ("signature dropped", parts[0] + "." + parts[1] + "."),
            ("signature and dot dropped", parts[0] + "." + parts[1]),
            ("header only", parts[0]),
            ("first char dropped", String(token.dropFirst())),
            ("empty", ""),
            ("half", String(token.prefix(token.count / 2))),
            ("extra segment", token + ".AAAA"),
            ("trailing char", token + "A"),
            ("padding", token + "=="),
            ("leading space", " " + token),
            ("trailing newline", token + "\n"),
            ("signature doubled", token + parts[2]),
            ("parts swapped", parts[1] + "." + parts[0] + "." + parts[2]),
        ]
        for (label, broken) in truncated { tryDead(w, log, label, broken, as: "stranger") }
        // Random truncation points (seeded; the seed is printed).
        let seed = ProcessInfo.processInfo.environment["MATRIX_SEED"].flatMap { UInt64($0) } ?? UInt64(Date().timeIntervalSince1970 * 1000)
        var generator = SplitMix64(seed: seed)
        print("[links] truncation seed \(seed) (rerun with MATRIX_SEED=\(seed))")
        for _ in 0..<40 {
            let length = Int.random(in: 0..<token.count, using: &generator)
            tryDead(w, log, "prefix \(length)", String(token.prefix(length)), as: "stranger", resolve: false)
        }

        // The header: wrong kid, alg none, HS256 (HMAC keyed with the public key, the classic confusion), others.
        let kid = header["kid"]!
        let jwk = try #require(w.h.keyRing.jwks()["keys"]?.arrayValue?.first)
        let publicKey = try #require(Base64URL.decode(jwk["x"]?.stringValue ?? ""))
        let headers: [(String, [String: JSON])] = [
            ("unknown kid", ["alg": .string("EdDSA"), "kid": .string("not-a-key"), "typ": .string("JWT")]),
            ("empty kid", ["alg": .string("EdDSA"), "kid": .string(""), "typ": .string("JWT")]),
            ("no kid", ["alg": .string("EdDSA"), "typ": .string("JWT")]),
            ("numeric kid", ["alg": .string("EdDSA"), "kid": .int(1), "typ": .string("JWT")]),
            ("kid with suffix", ["alg": .string("EdDSA"), "kid": .string((kid.stringValue ?? "") + "x"), "typ": .string("JWT")]),
            ("alg none", ["alg": .string("none"), "kid": kid, "typ": .string("JWT")]),
            ("alg None", ["alg": .string("None"), "kid": kid, "typ": .string("JWT")]),
            ("alg NONE", ["alg": .string("NONE"), "kid": kid]),
            ("alg missing", ["kid": kid, "typ": .string("JWT")]),
            ("alg HS256", ["alg": .string("HS256"), "kid": kid, "typ": .string("JWT")]),
            ("alg ES256", ["alg": .string("ES256"), "kid": kid, "typ": .string("JWT")]),
            ("alg RS256", ["alg": .string("RS256"), "kid": kid, "typ": .string("JWT")]),
            ("alg Ed25519", ["alg": .string("Ed25519"), "kid": kid, "typ": .string("JWT")]),
            ("alg eddsa", ["alg": .string("eddsa"), "kid": kid, "typ": .string("JWT")]),
            ("crit", ["alg": .string("EdDSA"), "kid": kid, "typ": .string("JWT"), "crit": .array([.string("exp")])]),
            ("jku", ["alg": .string("EdDSA"), "kid": kid, "typ": .string("JWT"), "jku": .string("https://evil.example/jwks")]),
            ("jwk", ["alg": .string("EdDSA"), "kid": kid, "typ": .string("JWT"), "jwk": jwk]),
            ("typ JOSE", ["alg": .string("EdDSA"), "kid": kid, "typ": .string("JOSE")]),
        ]
        for (label, edited) in headers {
            let signingInput = encoded(edited) + "." + parts[1]
            tryDead(w, log, label + ", signature kept", withHeader(token, edited), as: "stranger")
            tryDead(w, log, label + ", empty signature", signingInput + ".", as: "stranger")
            if label == "alg HS256" || label == "alg none" {
                for (secretName, secret) in [("raw public key", publicKey), ("x text", Array((jwk["x"]?.stringValue ?? "").utf8)),
                                             ("JWK JSON", jwk.serializedBytes())] {
                    let mac = hmacSHA256(key: secret, message: Array(signingInput.utf8))
                    tryDead(w, log, "\(label) HMAC over \(secretName)", signingInput + "." + Base64URL.encode(mac), as: "stranger")
                }
            }
        }

        // Validly signed by the server's own key, with claims the server must still refuse: its checks of the
        // share, zone, owner, issuer and epoch hold even if a signature were obtained for them.
        let signedVariants: [(String, (inout [String: JSON]) -> Void)] = [
            ("signed, other issuer", { $0["iss"] = .string("https://evil.example") }),
            ("signed, other zone", { $0["zone"] = .string(MatrixWorld.other) }),
            ("signed, other owner", { $0["owner"] = .string(w.account("stranger").recordName) }),
            ("signed, unknown share", { $0["sub"] = .string("sh_000000000000000000000000") }),
            ("signed, Lists share with Pub's zone", { $0["sub"] = listsPayload["sub"]! }),
            ("signed, future epoch", { $0["epoch"] = .int(7) }),
            ("signed, perm none", { $0["perm"] = .string("none") }),
            ("signed, max_uses 0", { $0["max_uses"] = .int(0) }),
            ("signed, issued in the future", { $0["iat"] = .int(w.h.clock.now / 1000 + 3600) }),
            ("signed, expired long ago", { $0["exp"] = .int(w.h.clock.now / 1000 - 3600) }),
        ]
        for (label, edit) in signedVariants {
            var claims = payload
            edit(&claims)
            let signed = try w.h.keyRing.signUnchecked(header: JSON.object(header).serializedBytes(),
                                                       payload: JSON.object(claims).serializedBytes())
            tryDead(w, log, label, signed, as: "stranger")
        }
        // Sanity for the signed variants: an unedited re-signed payload does work.
        let resigned = try w.h.keyRing.signUnchecked(header: JSON.object(header).serializedBytes(),
                                                     payload: JSON.object(payload).serializedBytes())
        #expect(w.accept(resigned, as: "guest1")["participantStatus"]?.stringValue == "accepted")

        // The payload edited to readWrite, by a public user who joined readOnly: refused, still readOnly.
        var upgraded = try decoded(segments(tokenOf(w.pubLinkReadOnly))[1])
        upgraded["perm"] = .string("readWrite")
        tryDead(w, log, "pub-ro's own link edited to readWrite", withPayload(tokenOf(w.pubLinkReadOnly), upgraded), as: "pub-ro")
        #expect(w.participant(pub, "pub-ro")?["permission"]?.stringValue == "readOnly")

        log.check()
        #expect(log.count > 700)
        // Nobody joined through a dead link.
        #expect(w.h.call("zones/list", token: w.token("stranger"), database: "shared").zones.isEmpty)
        let rosterAfter = w.shareView(pub)
        let guest1 = w.account("guest1").recordName
        #expect(rosterAfter["participants"]?.arrayValue?.filter { $0["userRecordName"]?.stringValue != guest1 }
                == rosterBefore["participants"]?.arrayValue)
    }

    @Test func expiredRotatedDeletedAndUsedUpLinks() throws {
        let w = try MatrixWorld(guests: 16)
        let pub = MatrixWorld.pub
        let log = DeadLinkLog()
        func accepted(_ link: String, _ who: String) -> Bool {
            let result = w.accept(link, as: who)
            let ok = result["participantStatus"]?.stringValue == "accepted"
            if !ok { Issue.record("\(who) could not accept: \(result.serialized())") }
            return ok
        }

        // Used up: max 2 distinct joins; a joined user accepting again is not a new use.
        let twice = try w.link(pub, permission: "readWrite", extra: ["maxUses": .int(2)])
        _ = accepted(twice, "guest0")
        _ = accepted(twice, "guest1")
        _ = accepted(twice, "guest0")
        tryDead(w, log, "used up", twice, as: "guest2")

        // Rotated: rotate moves the epoch; older links die, the new one works.
        let old = try w.link(pub, permission: "readWrite")
        _ = accepted(old, "guest3")
        let rotated = w.owner("shares/url", pub, ["rotate": .bool(true)])
        let fresh = try #require(rotated["url"]?.stringValue)
        tryDead(w, log, "rotated out", old, as: "guest4")
        tryDead(w, log, "rotated out (maxUses link)", twice, as: "guest4")
        _ = accepted(fresh, "guest4")
        // An administrator rotating is a manager's right too (Lists has administrators).
        let listsOld = w.listsLink
        let adminRotated = w.shared("shares/url", MatrixWorld.lists, ["rotate": .bool(true)], as: "admin-rw")
        #expect(matrixCode(adminRotated) == "OK")
        tryDead(w, log, "rotated out by an administrator", listsOld, as: "pending-ro")
        #expect(w.participant(MatrixWorld.lists, "pending-ro")?["acceptanceStatus"]?.stringValue == "pending")

        // Deleted share: its links die, and stay dead when the zone is shared again.
        #expect(matrixCode(w.owner("shares/create", MatrixWorld.other, ["publicPermission": .string("readWrite")])) == "OK")
        let doomed = try w.link(MatrixWorld.other, permission: "readWrite")
        _ = accepted(doomed, "guest5")
        #expect(matrixCode(w.owner("shares/delete", MatrixWorld.other)) == "OK")
        tryDead(w, log, "deleted share", doomed, as: "guest6")
        #expect(matrixCode(w.owner("shares/create", MatrixWorld.other, ["publicPermission": .string("readWrite")])) == "OK")
        tryDead(w, log, "deleted share, zone shared again", doomed, as: "guest6")
        // guest5 was in the deleted share: not carried into the new one.
        #expect(w.participant(MatrixWorld.other, "guest5") == nil)

        // Expired, with about 60 s of leeway: good while now < exp + 60.
        let startSeconds = w.h.clock.now / 1000
        let expiring = try w.link(pub, permission: "readWrite", extra: ["expiresInSeconds": .int(100)])
        #expect(try decoded(segments(tokenOf(expiring))[1])["exp"]?.intValue == startSeconds + 100)
        w.h.clock.advance((100 + 59) * 1000)
        _ = accepted(expiring, "guest7") // 59 s past exp: inside the leeway
        w.h.clock.advance(1000)
        tryDead(w, log, "expired (exp + 60 s)", expiring, as: "guest8")
        w.h.clock.advance(3600 * 1000)
        tryDead(w, log, "expired (exp + 1 h)", expiring, as: "guest8")
        _ = accepted(try w.link(pub, permission: "readWrite"), "guest8") // a fresh link still works

        // Signing key rotation: old links keep verifying until their key is retired; the new key's kid on an
        // old signature is a wrong kid.
        let beforeRotation = try w.link(pub, permission: "readWrite")
        let oldKey = w.h.keyRing.activeKeyID
        let newKey = try w.h.keyRing.rotate(nowMilliseconds: w.h.clock.now)
        _ = accepted(beforeRotation, "guest9")
        let afterRotation = try w.link(pub, permission: "readWrite")
        var header = try decoded(segments(tokenOf(beforeRotation))[0])
        #expect(header["kid"]?.stringValue == oldKey)
        header["kid"] = .string(newKey)
        tryDead(w, log, "old signature under the new kid", withHeader(tokenOf(beforeRotation), header), as: "guest10")
        try w.h.keyRing.retire(keyID: oldKey)
        tryDead(w, log, "retired key", beforeRotation, as: "guest10")
        _ = accepted(afterRotation, "guest10")

        log.check()
        for who in ["guest2", "guest6"] {
            #expect(w.h.call("zones/list", token: w.token(who), database: "shared").zones.isEmpty, "\(who) joined through a dead link")
        }
    }
}
