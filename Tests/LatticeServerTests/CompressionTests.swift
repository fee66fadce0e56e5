import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// Database answers are gzip-compressed for clients that accept it (issue 30: the web client's first load).
@Suite struct CompressionTests {
    /// `gzip -dc` of `bytes`: a decoder that shares no code with ours.
    static func gunzip(_ bytes: [UInt8]) throws -> [UInt8] {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("gz-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let file = directory.appendingPathComponent("answer.gz")
        try Data(bytes).write(to: file)
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/gzip")
        process.arguments = ["-dc", file.path]
        let pipe = Pipe()
        process.standardOutput = pipe
        try process.run()
        let data = pipe.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "gzip -dc failed")
        return [UInt8](data)
    }

    /// A zone with enough records that its feed is several kilobytes of JSON.
    static func world() throws -> (ServiceHarness, String) {
        let h = try ServiceHarness()
        let ann = try h.signUp("ann")
        try h.createZone("Trips", token: ann.token)
        let operations: [JSON] = (0..<40).map { index in
            .object(["operationType": .string("create"), "record": .object([
                "recordName": .string("stop\(index)"), "recordType": .string("Stop"),
                "fields": .object(["title": .object(["value": .string("Stop number \(index) on the long road")])]),
            ])])
        }
        #expect(h.modify("Trips", operations, token: ann.token).status == 200)
        return (h, ann.token)
    }

    static func feed(_ h: ServiceHarness, _ token: String, acceptEncoding: String?) -> HTTPResponse {
        var headers = ["authorization": "Bearer " + token]
        if let acceptEncoding { headers["accept-encoding"] = acceptEncoding }
        let body = JSON.object(["zones": .array([.object(["zoneID": .object(["zoneName": .string("Trips")])])])]).serializedBytes()
        return h.service.respond(to: HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/changes/zone",
                                                 headers: headers, body: body, remoteAddress: "127.0.0.1"))
    }

    @Test func aLargeAnswerIsGzippedForAClientThatAcceptsItAndDecodesToTheSameJSON() throws {
        let (h, token) = try Self.world()
        let plain = Self.feed(h, token, acceptEncoding: nil)
        let zipped = Self.feed(h, token, acceptEncoding: "gzip, deflate, br")
        #expect(plain.status == 200 && zipped.status == 200, "\(String(decoding: plain.body, as: UTF8.self))")
        #expect(plain.header("Content-Encoding") == nil)
        #expect(zipped.header("Content-Encoding") == "gzip")
        #expect(plain.header("Vary") == "Accept-Encoding" && zipped.header("Vary") == "Accept-Encoding")
        print("[compression] changes/zone: \(plain.body.count) bytes plain, \(zipped.body.count) gzipped")
        #expect(zipped.body.count * 3 < plain.body.count, "JSON of many similar records compresses well")
        let decoded = try Self.gunzip(zipped.body)
        // The same records either way (server times may differ between the two calls, so compare the records).
        let a = try JSON.parse(plain.body)["zones"], b = try JSON.parse(decoded)["zones"]
        #expect(a != nil && a == b)
    }

    @Test(arguments: ["identity", "gzip;q=0", "br", "*;q=0", "gzip;q=0, *"])
    func aClientThatDoesNotAcceptGzipGetsThePlainAnswer(_ header: String) throws {
        let (h, token) = try Self.world()
        let response = Self.feed(h, token, acceptEncoding: header)
        #expect(response.header("Content-Encoding") == nil, "Accept-Encoding: \(header)")
        #expect(try JSON.parse(response.body)["zones"]?.arrayValue?.first?["records"] != nil)
    }

    @Test func acceptEncodingIsReadAsRFC9110Says() {
        #expect(Gzip.isAccepted("gzip"))
        #expect(Gzip.isAccepted("GZIP;q=0.5"))
        #expect(Gzip.isAccepted("*"))
        #expect(Gzip.isAccepted("x-gzip"))
        #expect(!Gzip.isAccepted(nil))
        #expect(!Gzip.isAccepted("gzip;q=0"))
        #expect(!Gzip.isAccepted("gzip;q=0, *"), "refused by name wins over the wildcard")
        #expect(!Gzip.isAccepted(String(repeating: "gzip,", count: 300)), "an over-long header is ignored")
    }

    @Test func smallAnswersAuthAnswersAndBinaryOnesAreNotCompressed() throws {
        let (h, token) = try Self.world()
        var headers = ["authorization": "Bearer " + token, "accept-encoding": "gzip"]
        let small = h.service.respond(to: HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/users/current",
                                                      headers: headers, body: Array("{}".utf8), remoteAddress: "127.0.0.1"))
        #expect(small.status == 200 && small.header("Content-Encoding") == nil)
        headers["authorization"] = nil
        let signup = h.service.respond(to: HTTPRequest(method: "POST", path: "/auth/signup", headers: headers,
                                                       body: Array(#"{"name": "bea"}"#.utf8), remoteAddress: "127.0.0.1"))
        #expect(signup.status == 200 && signup.header("Content-Encoding") == nil, "answers with secrets are never compressed")
    }

    @Test func aWebFileIsGzippedWithItsOwnEntityTagAndStillRevalidates() throws {
        let root = temporaryDirectory()
        let script = String(repeating: "export const greeting = 'hello';\n", count: 200)
        try script.write(toFile: root + "/app.js", atomically: true, encoding: .utf8)
        let h = try ServiceHarness { $0.webRoot = root }
        func get(_ headers: [String: String]) -> HTTPResponse {
            h.service.respond(to: HTTPRequest(method: "GET", path: "/web/app.js", headers: headers, remoteAddress: "127.0.0.1"))
        }
        let plain = get([:])
        let zipped = get(["accept-encoding": "gzip"])
        #expect(plain.status == 200 && zipped.status == 200)
        #expect(plain.header("Content-Encoding") == nil && zipped.header("Content-Encoding") == "gzip")
        #expect(try Self.gunzip(zipped.body) == plain.body)
        let plainTag = try #require(plain.header("ETag")), zippedTag = try #require(zipped.header("ETag"))
        #expect(zippedTag == String(plainTag.dropLast()) + "-gzip\"", "\(plainTag) \(zippedTag)")
        // Each form revalidates with its own tag: 304, naming the tag of the form it stands for.
        let again = get(["accept-encoding": "gzip", "if-none-match": zippedTag])
        #expect(again.status == 304 && again.header("ETag") == zippedTag && again.body.isEmpty)
        let plainAgain = get(["if-none-match": plainTag])
        #expect(plainAgain.status == 304 && plainAgain.header("ETag") == plainTag)
        // A changed file matches neither.
        try (script + "// changed\n").write(toFile: root + "/app.js", atomically: true, encoding: .utf8)
        #expect(get(["accept-encoding": "gzip", "if-none-match": zippedTag]).status == 200)
    }

    @Test func gzipRoundTripsBytesOfEverySize() throws {
        var generator = SplitMix64(seed: 30)
        print("[compression] seed 30")
        for length in [0, 1, 1_023, 1_024, 70_000] {
            let bytes = (0..<length).map { _ in UInt8(truncatingIfNeeded: generator.next() % 7) }
            let zipped = try #require(Gzip.compress(bytes))
            #expect(try Self.gunzip(zipped) == bytes, "\(length) bytes")
        }
    }
}
