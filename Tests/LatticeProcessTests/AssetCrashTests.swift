import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice serve` killed with SIGKILL while an asset's bytes arrive: after the restart no partial asset is
/// visible (its bytes cannot be saved in a record, no download serves them), the upload resumes or starts
/// over, and once the abandoned upload's time is past, collection leaves no file behind.
@Suite(.serialized) struct AssetCrashTests {
    static let base = "/database/1/lattice/production/private/"

    static func call(_ port: UInt16, _ operation: String, _ body: String, token: String) throws -> JSON {
        let reply = try RawHTTPClient(port: port).send(method: "POST", path: base + operation,
                                                       headers: ["Authorization": "Bearer " + token], body: Array(body.utf8))
        return try JSON.parse(reply.body)
    }

    @Test func aKillMidUploadLeavesNoVisiblePartialAssetAndNoFileAfterCollection() throws {
        guard TestBackend.current == .sqlite else { return } // the files of the embedded default; PostgreSQL: PostgresNodesTests
        let data = temporaryDirectory("lattice-asset-crash")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let server = try ServerUnderTest(data: data)
        let signup = try RawHTTPClient(port: server.port).send(method: "POST", path: "/auth/signup", body: Array(#"{"name":"ann"}"#.utf8))
        let token = try #require(try JSON.parse(signup.body)["token"]?.stringValue)
        _ = try Self.call(server.port, "zones/modify", #"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Lists"}}}]}"#,
                          token: token)
        let uploads = try Self.call(server.port, "assets/upload", #"{"zoneID":{"zoneName":"Lists"},"tokens":["#
                                    + #"{"recordType":"Item","recordName":"a","fieldName":"photo"},{"recordType":"Item","recordName":"b","fieldName":"photo"}]}"#,
                                    token: token)
        let paths = (uploads["tokens"]?.arrayValue ?? []).compactMap { $0["url"]?.stringValue }.map { url in
            String(url[url.range(of: "/assets/upload/")!.lowerBound...])
        }
        try #require(paths.count == 2)
        let seed = RandomSeed.current
        print("AssetCrashTests: LATTICE_SEED=\(seed)")
        var generator = SplitMix64(seed: seed)
        let bytes = (0..<4_000_000).map { _ in UInt8(truncatingIfNeeded: generator.next()) }

        // Two uploads under way (one a POST, one a PATCH after a first part), killed mid-body.
        let first = try RawHTTPClient(port: server.port)
        try first.write(Array("POST \(paths[0]) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: \(bytes.count)\r\n\r\n".utf8))
        try first.write(Array(bytes[0..<1_500_000]))
        let second = try RawHTTPClient(port: server.port)
        try second.write(Array("POST \(paths[1]) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: \(bytes.count)\r\n\r\n".utf8))
        try second.write(Array(bytes[0..<700_000]))
        usleep(200_000)
        server.kill(SIGKILL)

        let again = try ServerUnderTest(data: data)
        // Nothing complete: HEAD says what is held, and no record can take the bytes (there is no blob).
        let head = try RawHTTPClient(port: again.port).send(method: "HEAD", path: paths[0])
        #expect(head.status == 200)
        let held = Int(head.headers["upload-offset"] ?? "") ?? -1
        #expect(held >= 0 && held <= 1_500_000)
        let checksum = Data(Array(repeating: UInt8(0), count: 32)).base64EncodedString()
        let smuggled = try Self.call(again.port, "records/modify", #"{"zoneID":{"zoneName":"Lists"},"operations":[{"operationType":"create","#
                                     + #""record":{"recordName":"x","recordType":"Item","fields":{"photo":{"type":"ASSETID","value":"#
                                     + #"{"fileChecksum":"\#(checksum)","size":\#(held)}}}}}]}"#, token: token)
        #expect(smuggled["records"]?.arrayValue?.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        // The first upload resumes to completion after the restart (a restarted node takes its own leases over).
        let rest = try RawHTTPClient(port: again.port).send(method: "PATCH", path: paths[0], headers: ["Upload-Offset": String(held)],
                                                            body: Array(bytes[max(0, held)...]))
        #expect(rest.status == 200, "\(String(decoding: rest.body, as: UTF8.self))")
        again.kill(SIGTERM)

        // A day and more later, the second (abandoned) upload and the unsaved first one are collected:
        // no row and no file is left.
        let assets = data + "/" + SQLiteStorage.assetDirectoryName
        #expect(try FileManager.default.contentsOfDirectory(atPath: assets).count == 2)
        var configuration = ServiceConfiguration()
        configuration.now = { Int64(Date().timeIntervalSince1970 * 1000) + 3 * 24 * 3_600_000 }
        let (storage, service) = try DataDirectory.openService(data, configuration: configuration)
        defer { storage.close() }
        let collected = try service.collectAssets()
        #expect(collected.uploads == 2 && collected.blobs == 1)
        #expect(try FileManager.default.contentsOfDirectory(atPath: assets).isEmpty)
        let rows = try storage.read { tx in try tx.expiredAssetUploads(nowMs: Int64.max, limit: 10).count }
        #expect(rows == 0)
    }
}
