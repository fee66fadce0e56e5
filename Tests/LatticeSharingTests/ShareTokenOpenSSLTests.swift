import Foundation
import LatticeCore
@testable import LatticeSharing
import Testing

/// Interoperability: tokens verify with tools that share no code with Lattice.
@Suite struct ShareTokenOpenSSLTests {
    static let openssl = "/usr/bin/openssl"

    /// Runs a program, printing the command line and its output for the log.
    static func run(_ arguments: [String], in directory: String) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: arguments[0])
        process.arguments = Array(arguments.dropFirst())
        process.currentDirectoryURL = URL(fileURLWithPath: directory)
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        let output = String(decoding: data, as: UTF8.self)
        print("$ " + arguments.map { $0.contains(" ") ? "'\($0)'" : $0 }.joined(separator: " "))
        print(output, terminator: output.hasSuffix("\n") ? "" : "\n")
        print("(exit status \(process.terminationStatus))")
        return (process.terminationStatus, output)
    }

    /// The PEM SubjectPublicKeyInfo of an Ed25519 JWK: DER prefix 30 2a 30 05 06 03 2b 65 70 03 21 00, then x.
    static func pem(jwk: JSON) throws -> String {
        let x = try #require(jwk["x"]?.stringValue.flatMap(Base64URL.decode))
        let der: [UInt8] = [0x30, 0x2A, 0x30, 0x05, 0x06, 0x03, 0x2B, 0x65, 0x70, 0x03, 0x21, 0x00] + x
        return "-----BEGIN PUBLIC KEY-----\n\(Data(der).base64EncodedString())\n-----END PUBLIC KEY-----\n"
    }

    static var repositoryRoot: URL {
        // Tests/LatticeSharingTests/<this file> -> the package root.
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
    }

    @Test func opensslVerifiesATokenAgainstTheJWKS() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.openssl) else {
            print("NOTE: \(Self.openssl) is missing; skipping the openssl interoperability test")
            return
        }
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let token = try ring.sign(try ShareFixtures.claims())
        let parts = ShareFixtures.parts(token)
        let kid = ShareFixtures.decodeJSON(parts[0])["kid"]
        let jwk = try #require(ring.jwks()["keys"]?.arrayValue?.first { $0["kid"] == kid })

        let work = try ShareTemporaryDirectory()
        defer { work.remove() }
        func write(_ name: String, _ bytes: [UInt8]) throws {
            try Data(bytes).write(to: URL(fileURLWithPath: work.path + "/" + name))
        }
        let pem = try Self.pem(jwk: jwk)
        try write("pub.pem", Array(pem.utf8))
        try write("input", Array((parts[0] + "." + parts[1]).utf8))
        try write("sig", try #require(Base64URL.decode(parts[2])))
        print("token: \(token)")
        print("JWK: \(jwk.serialized())")
        print("pub.pem:\n\(pem)", terminator: "")

        let verify = [Self.openssl, "pkeyutl", "-verify", "-pubin", "-inkey", "pub.pem", "-rawin", "-in", "input",
                      "-sigfile", "sig"]
        let good = try Self.run(verify, in: work.path)
        #expect(good.status == 0 && good.output.contains("Signature Verified Successfully"))

        // openssl reads the same key from the PEM: its raw public key is the JWK's x.
        let text = try Self.run([Self.openssl, "pkey", "-pubin", "-in", "pub.pem", "-noout", "-text"], in: work.path)
        #expect(text.status == 0 && text.output.contains("ED25519 Public-Key"))

        // One byte of the signing input changed: openssl refuses it.
        var input = Array((parts[0] + "." + parts[1]).utf8)
        input[input.count / 2] ^= 0x01
        try write("input", input)
        let bad = try Self.run(verify, in: work.path)
        #expect(bad.status != 0 && bad.output.contains("Signature Verification Failure"))
        #expect(!bad.output.contains("Signature Verified Successfully"))
    }

    @Test func opensslSignatureVerifiesInLattice() throws {
        // The other direction: openssl signs with a key Lattice exported; the ring's verifier accepts it.
        guard FileManager.default.isExecutableFile(atPath: Self.openssl) else {
            print("NOTE: \(Self.openssl) is missing; skipping the openssl interoperability test")
            return
        }
        let work = try ShareTemporaryDirectory()
        defer { work.remove() }
        _ = try Self.run([Self.openssl, "genpkey", "-algorithm", "ed25519", "-out", "priv.pem"], in: work.path)
        let der = try Self.run(
            [Self.openssl, "pkey", "-in", "priv.pem", "-outform", "DER", "-out", "priv.der"], in: work.path
        )
        #expect(der.status == 0)
        // PKCS#8 DER for Ed25519 ends with the 32-byte seed.
        let seed = Array(try Data(contentsOf: URL(fileURLWithPath: work.path + "/priv.der")).suffix(32))
        let key = try Ed25519Key(privateKey: seed)
        let message = Array("eyJhbGciOiJFZERTQSJ9.e30".utf8)
        try Data(message).write(to: URL(fileURLWithPath: work.path + "/input"))
        let sign = try Self.run([Self.openssl, "pkeyutl", "-sign", "-inkey", "priv.pem", "-rawin", "-in", "input",
                                 "-out", "sig"], in: work.path)
        #expect(sign.status == 0)
        let signature = Array(try Data(contentsOf: URL(fileURLWithPath: work.path + "/sig")))
        #expect(signature == (try key.sign(message)))  // Ed25519 is deterministic
        #expect(try Ed25519Key(publicKey: key.publicKeyBytes).verify(signature: signature, message: message))
    }

    @Test func verifyScriptChecksAShareURLOffline() throws {
        let script = Self.repositoryRoot.appendingPathComponent("Scripts/verify-share-url.sh").path
        guard FileManager.default.isExecutableFile(atPath: Self.openssl),
              FileManager.default.isExecutableFile(atPath: "/usr/bin/python3") else {
            print("NOTE: openssl or python3 is missing; skipping the verify-share-url.sh test")
            return
        }
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let work = try ShareTemporaryDirectory()
        defer { work.remove() }
        let now = Int64(Date().timeIntervalSince1970)
        let jwksPath = work.path + "/jwks.json"
        func saveJWKS() throws { try Data(ring.jwks().serializedBytes()).write(to: URL(fileURLWithPath: jwksPath)) }
        try saveJWKS()

        let oldToken = try ring.sign(try ShareFixtures.claims(now: now))
        let url = "https://lattice.example/share/" + oldToken
        let valid = try Self.run(["/bin/bash", script, url, jwksPath], in: work.path)
        #expect(valid.status == 0 && valid.output.contains("Signature Verified Successfully"))
        #expect(valid.output.contains("VALID"))

        // A changed claim: openssl refuses the signature.
        let parts = ShareFixtures.parts(oldToken)
        guard case .object(var claims) = ShareFixtures.decodeJSON(parts[1]) else { return }
        claims["perm"] = .string("readWrite")
        claims["max_uses"] = .int(1_000_000)
        let forged = [parts[0], ShareFixtures.encodeJSON(.object(claims)), parts[2]].joined(separator: ".")
        let tampered = try Self.run(
            ["/bin/bash", script, "https://lattice.example/share/" + forged, jwksPath], in: work.path
        )
        #expect(tampered.status == 1 && tampered.output.contains("Signature Verification Failure"))

        // Expired but genuine: status 3.
        var expiring = try ShareFixtures.claims(now: now - 7200)
        expiring.expiresAt = now - 3600
        let expired = try Self.run(["/bin/bash", script, try ring.sign(expiring), jwksPath], in: work.path)
        #expect(expired.status == 3 && expired.output.contains("EXPIRED"))

        // After rotation and retirement the old key leaves the JWKS: the old URL no longer verifies.
        let oldKey = ring.activeKeyID
        _ = try ring.rotate(nowMilliseconds: now * 1000)
        try ring.retire(keyID: oldKey)
        try saveJWKS()
        let retired = try Self.run(["/bin/bash", script, url, jwksPath], in: work.path)
        #expect(retired.status == 1 && retired.output.contains("not in the JWKS"))
        let freshURL = "https://lattice.example/share/" + (try ring.sign(try ShareFixtures.claims(now: now)))
        let fresh = try Self.run(["/bin/bash", script, freshURL, jwksPath], in: work.path)
        #expect(fresh.status == 0)

        // alg none and HS256 are refused before openssl runs.
        let none = ShareFixtures.encodeJSON(.object(["alg": .string("none"), "kid": .string(ring.activeKeyID)]))
        let unsigned = try Self.run(["/bin/bash", script, none + "." + parts[1] + ".", jwksPath], in: work.path)
        #expect(unsigned.status == 1 && unsigned.output.contains("alg must be EdDSA"))
    }
}
