import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Testing

/// Assets (CKAsset) over a real socket: CloudKit's three steps, resumable uploads, the limits checked before
/// a body is read, who may download what, download URLs that expire or are tampered with, deduplication and
/// collection, and safe file names.
@Suite(.tags(.postgres)) struct AssetTests {
    /// The service of a `ServiceHarness` behind the real HTTP adapter on 127.0.0.1.
    final class Served: Sendable {
        let h: ServiceHarness
        let server: HTTPServer

        init(configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
            h = try ServiceHarness(configure: configure)
            server = try HTTPServer(handler: h.service, configuration: HTTPServerConfiguration(port: 0))
        }

        deinit { server.shutdown() }

        func client() throws -> RawHTTPClient { try RawHTTPClient(port: server.port) }

        /// The path (and query) of a URL the service answered.
        static func path(_ url: String) -> String {
            guard let scheme = url.range(of: "://"), let slash = url[scheme.upperBound...].firstIndex(of: "/") else { return url }
            return String(url[slash...])
        }

        /// `assets/upload` for one field; the upload URL's path.
        func uploadURL(_ zone: String, _ record: String, field: String = "photo", token: String, owner: String? = nil,
                       database: String = "private") throws -> String {
            var zoneID: [String: JSON] = ["zoneName": .string(zone)]
            if let owner { zoneID["ownerRecordName"] = .string(owner) }
            let reply = h.call("assets/upload", .object(["zoneID": .object(zoneID), "tokens": .array([.object([
                "recordType": .string("Item"), "recordName": .string(record), "fieldName": .string(field)])])]),
                token: token, database: database)
            let url = try #require(reply["tokens"]?.arrayValue?.first?["url"]?.stringValue, "\(reply.json.serialized())")
            return Self.path(url)
        }

        /// Sends `bytes` to an upload URL in one POST; the answer.
        func post(_ path: String, _ bytes: [UInt8], type: String = "image/png") throws -> RawHTTPClient.Response {
            try client().send(method: "POST", path: path, headers: ["Content-Type": type], body: bytes)
        }

        /// Uploads `bytes` for a field and saves it in the record; the record as answered.
        @discardableResult
        func attach(_ bytes: [UInt8], zone: String, record: String, token: String, owner: String? = nil,
                    database: String = "private") throws -> JSON {
            let upload = try post(try uploadURL(zone, record, token: token, owner: owner, database: database), bytes)
            #expect(upload.status == 200, "\(String(decoding: upload.body, as: UTF8.self))")
            let receipt = try AssetReceipt(json: try JSON.parse(upload.body))
            var zoneID: [String: JSON] = ["zoneName": .string(zone)]
            if let owner { zoneID["ownerRecordName"] = .string(owner) }
            let saved = h.call("records/modify", .object([
                "zoneID": .object(zoneID),
                "operations": .array([.object(["operationType": .string("forceReplace"), "record": .object([
                    "recordName": .string(record), "recordType": .string("Item"),
                    "fields": .object(["photo": .object(["value": receipt.value, "type": .string("ASSETID")])]),
                ])])]),
            ]), token: token, database: database)
            #expect(saved.records.first?["serverErrorCode"] == nil, "\(saved.json.serialized())")
            return saved.records.first ?? .null
        }

        /// The download URL's path of a record's `photo` as `token` fetches it, with `name` for `${f}`.
        func downloadPath(_ zone: String, _ record: String, token: String, owner: String? = nil, database: String = "private",
                          name: String = "photo.png") throws -> String {
            var zoneID: [String: JSON] = ["zoneName": .string(zone)]
            if let owner { zoneID["ownerRecordName"] = .string(owner) }
            let reply = h.call("records/lookup", .object(["zoneID": .object(zoneID),
                                                           "records": .array([.object(["recordName": .string(record)])])]),
                               token: token, database: database)
            let url = try #require(reply.records.first?["fields"]?["photo"]?["value"]?["downloadURL"]?.stringValue,
                                   "\(reply.json.serialized())")
            #expect(url.hasSuffix("/${f}"))
            return Self.path(url).replacingOccurrences(of: "${f}", with: name)
        }

        func get(_ path: String, headers: [String: String] = [:], method: String = "GET") throws -> RawHTTPClient.Response {
            try client().send(method: method, path: path, headers: headers)
        }
    }

    static func random(_ count: Int, seed: UInt64) -> [UInt8] {
        var generator = SplitMix64(seed: seed)
        return (0..<count).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
    }

    static func sha256(_ bytes: [UInt8]) -> [UInt8] { Secrets.sha256(bytes) }

    /// A fresh seed (or LATTICE_SEED), printed so a failure can be replayed.
    static func seed(_ test: String) -> UInt64 {
        let seed = RandomSeed.current
        print("AssetTests.\(test): LATTICE_SEED=\(seed)")
        return seed
    }

    /// The private database of the user named `name`.
    static func privateDatabase(_ s: Served, _ name: String) throws -> StoredDatabase {
        try s.h.storage.read { tx in
            let user = try #require(try tx.user(named: name))
            return try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: user.id))
        }
    }

    /// `records/modify` in a zone of `owner`'s, through `database`.
    static func modify(_ s: Served, _ zone: String, owner: String, _ operations: [JSON], token: String,
                       database: String) -> ServiceHarness.Reply {
        s.h.call("records/modify", .object(["zoneID": .object(["zoneName": .string(zone), "ownerRecordName": .string(owner)]),
                                            "operations": .array(operations)]), token: token, database: database)
    }

    @Test func theThreeStepsEndToEndGiveBackTheSameBytes() throws {
        let s = try Served()
        let ann = try s.h.signUp("ann").token
        try s.h.createZone("Lists", token: ann)
        let seed = Self.seed("threeSteps")
        let bytes = Self.random(1_200_000, seed: seed)

        let saved = try s.attach(bytes, zone: "Lists", record: "milk", token: ann)
        let value = try #require(saved["fields"]?["photo"]?["value"])
        #expect(saved["fields"]?["photo"]?["type"]?.stringValue == "ASSETID")
        #expect(value["size"] == .int(1_200_000))
        #expect(value["fileChecksum"]?.stringValue == Data(Self.sha256(bytes)).base64EncodedString())

        let path = try s.downloadPath("Lists", "milk", token: ann)
        let whole = try s.get(path)
        #expect(whole.status == 200)
        #expect(Self.sha256(whole.body) == Self.sha256(bytes))
        #expect(whole.headers["content-type"] == "image/png")
        #expect(whole.headers["x-content-type-options"] == "nosniff")
        #expect(whole.headers["content-disposition"] == "inline; filename=\"photo.png\"; filename*=UTF-8''photo.png")
        let etag = try #require(whole.headers["etag"])
        #expect(etag == "\"" + Secrets.hex(Self.sha256(bytes)) + "\"")
        #expect(whole.headers["authorization"] == nil && !path.contains("lt_"))

        let head = try s.get(path, method: "HEAD")
        #expect(head.status == 200 && head.body.isEmpty && head.headers["content-length"] == "1200000")
        #expect(try s.get(path, headers: ["If-None-Match": etag]).status == 304)
        let part = try s.get(path, headers: ["Range": "bytes=1000-1999"])
        #expect(part.status == 206)
        #expect(part.body == Array(bytes[1000...1999]))
        #expect(part.headers["content-range"] == "bytes 1000-1999/1200000")
        let tail = try s.get(path, headers: ["Range": "bytes=-10"])
        #expect(tail.body == Array(bytes.suffix(10)))
        let outside = try s.get(path, headers: ["Range": "bytes=5000000-"])
        #expect(outside.status == 416 && outside.headers["content-range"] == "bytes */1200000")
        // If-Range with another ETag: the whole asset.
        #expect(try s.get(path, headers: ["Range": "bytes=0-9", "If-Range": "\"other\""]).status == 200)

        // The binary sync path carries the reference, not the bytes.
        let database = try Self.privateDatabase(s, "ann")
        let stored = try s.h.storage.read { tx in
            try tx.record(zoneRowID: try #require(try tx.zone(databaseID: database.id, name: "Lists")).rowID, name: "milk")
        }
        #expect((stored?.frame.count ?? .max) < 1_000)
    }

    @Test func anUploadCutMidwayResumesAtTheOffsetTheServerHolds() throws {
        let s = try Served()
        let ann = try s.h.signUp("ann").token
        try s.h.createZone("Lists", token: ann)
        let bytes = Self.random(3_000_000, seed: Self.seed("resume"))
        let path = try s.uploadURL("Lists", "eggs", token: ann)

        // A POST whose connection is cut after a third of its body.
        let cut = try s.client()
        try cut.write(Array("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/png\r\nContent-Length: \(bytes.count)\r\n\r\n".utf8))
        try cut.write(Array(bytes[0..<1_000_000]))
        // While it is open, no other request may send this upload's bytes.
        Thread.sleep(forTimeInterval: 0.1)
        let busy = try s.client().send(method: "PATCH", path: path, headers: ["Upload-Offset": "1000000"], body: [1])
        #expect(busy.status == 503)
        #expect(try JSON.parse(busy.body)["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
        cut.close()
        let cutAt = ContinuousClock.now

        var offset: Int64 = -1
        for _ in 0..<200 { // the server keeps what arrived once it sees the connection end
            let head = try s.get(path, method: "HEAD")
            #expect(head.status == 200 && head.headers["tus-resumable"] == "1.0.0")
            offset = Int64(head.headers["upload-offset"] ?? "") ?? -1
            if offset == 1_000_000 {
                #expect(head.headers["upload-length"] == "3000000")
                break
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        #expect(offset == 1_000_000)
        print("AssetTests: the cut upload's offset was seen after \(ContinuousClock.now - cutAt)")

        // The wrong offset is refused with what the server holds; the right one completes the upload.
        // (A client retries while the server still finishes the cut request: TRY_AGAIN_LATER, for a moment.)
        func patch(_ offset: Int, _ body: [UInt8]) throws -> RawHTTPClient.Response {
            for _ in 0..<100 {
                let answer = try s.client().send(method: "PATCH", path: path, headers: [
                    "Upload-Offset": String(offset), "Content-Type": "application/offset+octet-stream"], body: body)
                if answer.status != 503 { return answer }
                Thread.sleep(forTimeInterval: 0.02)
            }
            return try s.client().send(method: "PATCH", path: path, headers: ["Upload-Offset": String(offset)], body: body)
        }
        let wrong = try patch(5, [1, 2, 3])
        #expect(wrong.status == 409)
        #expect(try JSON.parse(wrong.body)["serverErrorCode"]?.stringValue == "CONFLICT")
        let middle = try patch(1_000_000, Array(bytes[1_000_000..<2_000_000]))
        #expect(middle.status == 204 && middle.headers["upload-offset"] == "2000000")
        let last = try s.client().send(method: "PATCH", path: path, headers: ["Upload-Offset": "2000000"],
                                       body: Array(bytes[2_000_000...]))
        #expect(last.status == 200)
        let receipt = try AssetReceipt(json: try JSON.parse(last.body))
        #expect(receipt.asset.checksum == Self.sha256(bytes) && receipt.asset.size == 3_000_000)
        // A retried last request answers the same receipt.
        let again = try s.client().send(method: "PATCH", path: path, headers: ["Upload-Offset": "2000000"], body: [0])
        #expect(again.status == 200)
        let repeated = try AssetReceipt(json: try JSON.parse(again.body))
        #expect(repeated == receipt)
    }

    @Test func limitsAreJudgedBeforeTheBodyIsRead() throws {
        let s = try Served { $0.quotaBytesPerDatabase = 2_000_000 }
        let ann = try s.h.signUp("ann").token
        try s.h.createZone("Lists", token: ann)

        // 60 MB declared: 413 at once, with nothing of the body sent.
        let client = try s.client()
        let path = try s.uploadURL("Lists", "big", token: ann)
        try client.write(Array("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 60000000\r\n\r\n".utf8))
        let refused = try client.readResponse(method: "POST")
        #expect(refused.status == 413)
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED")

        // Over the database's quota: QUOTA_EXCEEDED before the body, and after (a second asset that no longer fits).
        let over = try s.client()
        try over.write(Array("POST \(try s.uploadURL("Lists", "big2", token: ann)) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 3000000\r\n\r\n".utf8))
        let quota = try over.readResponse(method: "POST")
        #expect(quota.status == 413)
        #expect(try JSON.parse(quota.body)["serverErrorCode"]?.stringValue == "QUOTA_EXCEEDED")
        try s.attach(Self.random(1_500_000, seed: 1), zone: "Lists", record: "fits", token: ann)
        let second = try s.post(try s.uploadURL("Lists", "second", token: ann), Self.random(1_000_000, seed: 2))
        #expect(second.status == 413)
        #expect(try JSON.parse(second.body)["serverErrorCode"]?.stringValue == "QUOTA_EXCEEDED")

        // A body longer than the upload's declared length is refused.
        let longer = try s.client().send(method: "POST", path: try s.uploadURL("Lists", "x", token: ann),
                                         headers: ["Upload-Length": "10"], body: Array(repeating: 7, count: 20))
        #expect(longer.status == 400)
        // An unknown upload URL.
        #expect(try s.post(Assets.uploadPath + Base64URL.encode(Array(repeating: 1, count: 32)), [1]).status == 404)
    }

    @Test func theSameBytesAreStoredOnceAndCollectedAfterTheirLastReferenceGoes() throws {
        let s = try Served()
        let ann = try s.h.signUp("ann").token
        try s.h.createZone("Lists", token: ann)
        let bytes = Self.random(200_000, seed: Self.seed("dedupe"))
        try s.attach(bytes, zone: "Lists", record: "a", token: ann)
        try s.attach(bytes, zone: "Lists", record: "b", token: ann)
        let contents = s.h.storage.assetContents
        func blobs() throws -> [StoredAssetBlob] {
            try s.h.storage.read { tx in try tx.collectableAssetBlobs(before: .max, limit: 100) }
        }
        let used = try Self.privateDatabase(s, "ann")
        #expect(used.bytesUsed > 200_000 && used.bytesUsed < 400_000) // one copy charged
        let directory = (contents as? AssetFileStore)?.directory
        if let directory { #expect(try FileManager.default.contentsOfDirectory(atPath: directory).count == 1) }

        // Referenced (and claimed): nothing is collected, however late.
        s.h.clock.advance(3 * 24 * 3_600_000)
        #expect(try Assets(s.h.service.core).collect().blobs == 0)
        #expect(try s.get(try s.downloadPath("Lists", "a", token: ann)).status == 200)

        // Record a drops it: b still holds it. Then b is deleted: after the grace period it goes.
        #expect(s.h.modify("Lists", [operation("forceUpdate", "a", recordType: "Item", fields: ["photo": .object(["value": .null, "type": .string("ASSETID")])])], token: ann).status == 200)
        #expect(try Assets(s.h.service.core).collect().blobs == 0)
        #expect(s.h.modify("Lists", [.object(["operationType": .string("forceDelete"), "record": .object(["recordName": .string("b")])])], token: ann).status == 200)
        #expect(try Assets(s.h.service.core).collect().blobs == 0) // within the grace period
        s.h.clock.advance(24 * 3_600_000 + 1)
        let collected = try Assets(s.h.service.core).collect()
        #expect(collected.blobs == 1)
        #expect(try blobs().isEmpty)
        if let directory { #expect(try FileManager.default.contentsOfDirectory(atPath: directory).isEmpty) }
        let after = try Self.privateDatabase(s, "ann")
        #expect(after.bytesUsed < 100_000)
    }

    @Test func eachPersonGetsExactlyTheAccessTheRulesGive() throws {
        let s = try Served()
        let (ann, annName) = try s.h.signUp("ann")
        let bob = try s.h.signUp("bob").token   // read-write participant of Lists
        let carol = try s.h.signUp("carol").token // read-only participant of Pantry
        let dave = try s.h.signUp("dave").token   // a stranger
        for zone in ["Lists", "Pantry"] { try s.h.createZone(zone, token: ann) }
        try s.attach(Self.random(5_000, seed: 3), zone: "Lists", record: "milk", token: ann)
        try s.attach(Self.random(5_000, seed: 4), zone: "Pantry", record: "rice", token: ann)
        func share(_ zone: String, _ permission: String, with token: String) throws {
            #expect(s.h.call("shares/create", .object(["zoneID": .object(["zoneName": .string(zone)]),
                                                       "publicPermission": .string(permission)]), token: ann).status == 200)
            let url = try #require(s.h.call("shares/url", .object(["zoneID": .object(["zoneName": .string(zone)])]),
                                            token: ann)["url"]?.stringValue)
            #expect(s.h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]), token: token,
                             database: "shared").status == 200)
        }
        try share("Lists", "readWrite", with: bob)
        try share("Pantry", "readOnly", with: carol)

        // Bob reads Lists' asset and uploads into it.
        let bobPath = try s.downloadPath("Lists", "milk", token: bob, owner: annName, database: "shared")
        #expect(try s.get(bobPath).status == 200)
        try s.attach(Self.random(3_000, seed: 5), zone: "Lists", record: "bread", token: bob, owner: annName, database: "shared")
        // Carol reads Pantry's asset but cannot upload into it.
        #expect(try s.get(try s.downloadPath("Pantry", "rice", token: carol, owner: annName, database: "shared")).status == 200)
        let refused = s.h.call("assets/upload", .object(["zoneID": .object(["zoneName": .string("Pantry"), "ownerRecordName": .string(annName)]),
                                                         "tokens": .array([.object(["recordName": .string("rice"), "fieldName": .string("photo")])])]),
                               token: carol, database: "shared")
        #expect(refused.code == "PERMISSION_FAILURE")
        // Dave sees no zone of Ann's, and Ann's URLs do not work as his.
        let stranger = s.h.call("assets/upload", .object(["zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .string(annName)]),
                                                          "tokens": .array([.object(["recordName": .string("x"), "fieldName": .string("photo")])])]),
                                token: dave, database: "shared")
        #expect(stranger.code == "ZONE_NOT_FOUND")
        // A writer cannot save bytes they did not upload (a checksum seen elsewhere) into a record.
        let milk = try #require(s.h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                                     "records": .array([.object(["recordName": .string("milk")])])]),
                                         token: ann).records.first?["fields"]?["photo"]?["value"])
        try s.h.createZone("Mine", token: dave)
        let smuggled = s.h.modify("Mine", [operation("create", "stolen", recordType: "Item", fields: [
            "photo": .object(["value": .object(["fileChecksum": milk["fileChecksum"]!, "size": milk["size"]!]), "type": .string("ASSETID")])])],
                                  token: dave)
        #expect(smuggled.records.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        let copied = Self.modify(s, "Lists", owner: annName, [operation("create", "copy", recordType: "Item", fields: [
            "photo": .object(["value": .object(["fileChecksum": milk["fileChecksum"]!, "size": milk["size"]!]), "type": .string("ASSETID")])])],
                                token: bob, database: "shared")
        #expect(copied.records.first?["serverErrorCode"]?.stringValue == "PERMISSION_FAILURE")
        // ...until Bob rereferences it from a record he can read.
        let rereferenced = s.h.call("assets/rereference", .object([
            "zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .string(annName)]),
            "assets": .array([.object(["recordName": .string("milk"), "fieldName": .string("photo")])])]),
            token: bob, database: "shared")
        #expect(rereferenced["assets"]?.arrayValue?.first?["value"]?["fileChecksum"] == milk["fileChecksum"], "\(rereferenced.json.serialized())")
        let copiedAgain = Self.modify(s, "Lists", owner: annName, [operation("create", "copy", recordType: "Item", fields: [
            "photo": .object(["value": .object(["fileChecksum": milk["fileChecksum"]!, "size": milk["size"]!]), "type": .string("ASSETID")])])],
                                     token: bob, database: "shared")
        #expect(copiedAgain.records.first?["serverErrorCode"] == nil, "\(copiedAgain.json.serialized())")

        // Ann stops sharing Lists: Bob's download URL stops working at once.
        #expect(s.h.call("shares/modify", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                   "publicPermission": .string("none")]), token: ann).status == 200)
        let gone = try s.get(bobPath)
        #expect(gone.status == 403)
        #expect(try JSON.parse(gone.body)["serverErrorCode"]?.stringValue == "ACCESS_DENIED")
    }

    @Test func anExpiredOrTamperedDownloadURLIsRefused() throws {
        let s = try Served()
        let ann = try s.h.signUp("ann").token
        try s.h.createZone("Lists", token: ann)
        try s.attach(Self.random(1_000, seed: 6), zone: "Lists", record: "milk", token: ann)
        let path = try s.downloadPath("Lists", "milk", token: ann)
        #expect(try s.get(path).status == 200)

        // One character of the token changed: refused.
        let parts = path.split(separator: "/").map(String.init) // assets, download, token, name
        var token = Array(parts[2])
        token[10] = token[10] == "A" ? "B" : "A"
        let tampered = try s.get("/assets/download/\(String(token))/\(parts[3])")
        #expect(tampered.status == 403)
        #expect(try JSON.parse(tampered.body)["reason"]?.stringValue?.contains("not a valid download URL") == true)
        #expect(try s.get("/assets/download/garbage/x").status == 403)

        // Past its lifetime: refused, and a fresh fetch gives one that works.
        s.h.clock.advance((ServiceConfiguration().assets.downloadURLLifetimeSeconds + 1) * 1000)
        let expired = try s.get(path)
        #expect(expired.status == 403)
        #expect(try JSON.parse(expired.body)["reason"]?.stringValue?.contains("expired") == true)
        #expect(try s.get(try s.downloadPath("Lists", "milk", token: ann)).status == 200)
    }

    @Test func hostileFileNamesBecomeSafeContentDispositions() throws {
        let cases: [(String, String)] = [
            ("..%2F..%2Fetc%2Fpasswd", "attachment; filename=\"passwd\"; filename*=UTF-8''passwd"),
            ("%2E%2E", "attachment; filename=\"asset\"; filename*=UTF-8''asset"),
            ("a%0D%0ASet-Cookie%3A%20x%3D1", "attachment; filename=\"aSet-Cookie_ x=1\"; filename*=UTF-8''aSet-Cookie_%20x%3D1"),
            ("%22quoted%22.pdf", "attachment; filename=\"_quoted_.pdf\"; filename*=UTF-8''_quoted_.pdf"),
            ("r%C3%A9sum%C3%A9.txt", "attachment; filename=\"r_sum_.txt\"; filename*=UTF-8''r%C3%A9sum%C3%A9.txt"),
            ("${f}", "attachment; filename=\"asset\"; filename*=UTF-8''asset"),
            ("evil%E2%80%AEfdp.exe", "attachment; filename=\"evilfdp.exe\"; filename*=UTF-8''evilfdp.exe"),
        ]
        for (segment, expected) in cases {
            #expect(AssetMedia.contentDisposition(name: segment, type: "application/octet-stream") == expected, "\(segment)")
        }
        // Active types are never served as themselves.
        for type in ["text/html", "image/svg+xml", "application/javascript", "text/xml", nil] {
            #expect(AssetMedia.servedType(type) == "application/octet-stream")
        }

        // Over HTTP: an HTML upload comes back as an octet-stream attachment, sandboxed.
        let s = try Served()
        let ann = try s.h.signUp("ann").token
        try s.h.createZone("Lists", token: ann)
        let page = Array("<script>alert(1)</script>".utf8)
        let upload = try s.post(try s.uploadURL("Lists", "page", token: ann), page, type: "text/html")
        let receipt = try AssetReceipt(json: try JSON.parse(upload.body))
        #expect(s.h.modify("Lists", [operation("create", "page", recordType: "Item", fields: [
            "photo": .object(["value": receipt.value, "type": .string("ASSETID")])])], token: ann).status == 200)
        let served = try s.get(try s.downloadPath("Lists", "page", token: ann, name: "..%2Findex.html"))
        #expect(served.headers["content-type"] == "application/octet-stream")
        #expect(served.headers["content-disposition"] == "attachment; filename=\"index.html\"; filename*=UTF-8''index.html")
        #expect(served.headers["content-security-policy"] == "default-src 'none'; sandbox")
        #expect(served.body == page)
    }
}
