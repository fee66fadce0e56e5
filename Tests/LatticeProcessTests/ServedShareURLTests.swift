import Foundation
import LatticeCore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A real share URL from a real `lattice serve`, verified with the real `openssl` binary against the JWKS the
/// server publishes at /.well-known/jwks.json, as a person would do it (Scripts/verify-share-url.sh).
@Suite(.serialized) struct ServedShareURLTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    private func run(_ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        process.arguments = arguments
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: data, as: UTF8.self))
    }

    @Test func opensslVerifiesAServedShareURLAndRefusesAChangedByte() throws {
        guard FileManager.default.isExecutableFile(atPath: "/usr/bin/openssl") else {
            Issue.record("openssl is missing; Scripts/bootstrap.sh installs it with libssl-dev")
            return
        }
        let data = temporaryDirectory("lattice-openssl")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data + "/server")
        defer { server.kill(SIGTERM) }
        let client = try RawHTTPClient(port: server.port)
        func post(_ path: String, _ body: String, token: String? = nil) throws -> JSON {
            var headers: [String: String] = [:]
            if let token { headers["Authorization"] = "Bearer " + token }
            return try JSON.parse(try client.send(method: "POST", path: path, headers: headers, body: Array(body.utf8)).body)
        }
        let token = try #require(try post("/auth/signup", #"{"name":"ann"}"#)["token"]?.stringValue)
        let base = "/database/1/lattice/production/private/"
        _ = try post(base + "zones/modify", #"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Trips"}}}]}"#, token: token)
        _ = try post(base + "records/modify", #"{"zoneID":{"zoneName":"Trips"},"operations":[{"operationType":"create","record":{"recordName":"rome","recordType":"List"}}]}"#, token: token)
        _ = try post(base + "shares/create", #"{"zoneID":{"zoneName":"Trips"},"rootRecordName":"rome","title":"Rome"}"#, token: token)
        let url = try #require(try post(base + "shares/url", #"{"zoneID":{"zoneName":"Trips"}}"#, token: token)["url"]?.stringValue)
        #expect(url.hasPrefix("http://127.0.0.1:\(server.port)/share/"))

        let jwks = try client.send(method: "GET", path: "/.well-known/jwks.json")
        #expect(jwks.status == 200)
        let jwksFile = data + "/jwks.json"
        try Data(jwks.body).write(to: URL(fileURLWithPath: jwksFile))

        let script = Self.packageRoot + "/Scripts/verify-share-url.sh"
        let good = try run(["bash", script, url, jwksFile])
        print("$ Scripts/verify-share-url.sh \(url) jwks.json\n\(good.output)exit \(good.status)")
        #expect(good.status == 0)
        #expect(good.output.contains("Signature Verified Successfully"))

        // One byte of the signature changed: openssl refuses it, and so does the server.
        var bytes = Array(url.utf8)
        let signatureIndex = bytes.lastIndex(of: UInt8(ascii: "."))! + 10
        bytes[signatureIndex] = bytes[signatureIndex] == UInt8(ascii: "A") ? UInt8(ascii: "B") : UInt8(ascii: "A")
        let tampered = String(decoding: bytes, as: UTF8.self)
        let bad = try run(["bash", script, tampered, jwksFile])
        print("$ Scripts/verify-share-url.sh <one byte changed> jwks.json\n\(bad.output)exit \(bad.status)")
        #expect(bad.status == 1)
        #expect(bad.output.contains("Signature Verification Failure"))
        let bob = try #require(try post("/auth/signup", #"{"name":"bob"}"#)["token"]?.stringValue)
        let refused = try post("/database/1/lattice/production/shared/records/accept",
                               #"{"shortGUIDs":[{"value":"\#(tampered)"}]}"#, token: bob)
        #expect(refused["results"]?.arrayValue?.first?["reason"]?.stringValue == "the share link is invalid, expired or revoked")
    }
}
