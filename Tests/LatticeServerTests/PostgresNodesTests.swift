import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing

/// Two serving deployments (nodes "a" and "b", as two `lattice serve --database` processes would open
/// them) on one throwaway PostgreSQL database: announcements, the shared key ring, the purge try-lock, the
/// node claim and the one public URL, for real. Needs `LATTICE_TEST_POSTGRES_URL` (Scripts/test.sh).
@Suite(.serialized) struct PostgresNodesTests {
    static let publicURL = "https://lattice.test"

    final class Cluster: Sendable {
        let database: PostgresTestDatabase
        /// The nodes opened so far, closed with the cluster.
        private let nodes = Mutex<[OpenedDeployment]>([])
        /// Their HTTP servers, shut down before the nodes close.
        private let servers = Mutex<[HTTPServer]>([])

        init() throws { database = try PostgresTestDatabase.create() }

        deinit {
            servers.withLock { $0.forEach { $0.shutdown() } }
            nodes.withLock { $0.forEach { $0.close() } }
            database.drop()
        }

        var location: StorageLocation { .database(url: database.url, poolSize: 3) }

        /// A node behind a real HTTP server on 127.0.0.1.
        func served(_ name: String) throws -> (node: OpenedDeployment, server: HTTPServer) {
            let node = try node(name)
            let server = try HTTPServer(handler: node.service, configuration: HTTPServerConfiguration(port: 0))
            servers.withLock { $0.append(server) }
            return (node, server)
        }

        func node(_ name: String, publicURL: String = PostgresNodesTests.publicURL) throws -> OpenedDeployment {
            var configuration = ServiceConfiguration()
            configuration.nodeName = name
            configuration.rateLimit = nil
            configuration.signUpsPerAddress = nil
            configuration.signUpsGlobal = nil
            let node = try OpenedDeployment.open(location, configuration: configuration, purpose: .serving,
                                                 publicURL: publicURL, log: { _ in })
            nodes.withLock { $0.append(node) }
            return node
        }
    }

    static func post(_ service: LatticeService, _ path: String, _ body: JSON, token: String? = nil) -> (Int, JSON) {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer " + token }
        let response = service.respond(to: HTTPRequest(method: "POST", path: path, headers: headers,
                                                       body: body.serializedBytes(), remoteAddress: "127.0.0.1"))
        return (response.status, (try? JSON.parse(response.body)) ?? .null)
    }

    static func call(_ service: LatticeService, _ operation: String, _ body: JSON, token: String) -> (Int, JSON) {
        post(service, "/database/1/lattice/production/private/\(operation)", body, token: token)
    }

    static func signUp(_ name: String, _ service: LatticeService) throws -> String {
        let (status, json) = post(service, "/auth/signup", .object(["name": .string(name)]))
        guard status == 200, let token = json["token"]?.stringValue else { throw HarnessError("signup: \(json.serialized())") }
        return token
    }

    static func createZone(_ service: LatticeService, token: String) throws {
        let (status, json) = call(service, "zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])]),
        ])]), token: token)
        guard status == 200 else { throw HarnessError("zone: \(json.serialized())") }
    }

    @Test func aWriteOnOneNodeWakesALongPollOnTheOtherWithinASecond() throws {
        let cluster = try Cluster()
        let a = try cluster.node("a"), b = try cluster.node("b")
        #expect(a.service.replicaID != b.service.replicaID)
        let ann = try Self.signUp("ann", a.service)
        try Self.createZone(b.service, token: ann)
        var latencies: [Double] = []
        for round in 0..<3 {
            let (_, feed) = Self.call(a.service, "changes/database", .object([:]), token: ann)
            let syncToken = try #require(feed["syncToken"]?.stringValue)
            let box = ResponseBox()
            a.service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/changes/wait",
                                         headers: ["Authorization": "Bearer " + ann],
                                         body: JSON.object(["syncToken": .string(syncToken), "timeout": .int(20)]).serializedBytes(),
                                         remoteAddress: "127.0.0.1")) { box.set($0) }
            #expect(a.service.notifier.waiterCount == 1)
            #expect(box.wait(seconds: 0.2) == nil)
            let started = Date()
            let (status, _) = Self.call(b.service, "records/modify", .object([
                "zoneID": .object(["zoneName": .string("Lists")]), "operations": .array([operation("create", "r\(round)")]),
            ]), token: ann)
            #expect(status == 200)
            let woken = try #require(box.wait(seconds: 5))
            let seconds = Date().timeIntervalSince(started)
            latencies.append(seconds)
            #expect(try JSON.parse(woken.body)["changed"] == .bool(true))
            #expect(seconds < 1, "round \(round): woken after \(seconds) s")
        }
        print("PostgresNodesTests: long poll on a woken by a write on b after "
              + latencies.map { "\(Int($0 * 1000)) ms" }.joined(separator: ", ") + " (write included)")
    }

    /// A push stream held by node a hears of a write committed on node b (through the database's
    /// announcement), not of the device's own write, and a reconnect to node b resumes where it left off.
    @Test func aPushStreamOnOneNodeHearsOfAWriteOnTheOther() throws {
        let cluster = try Cluster()
        let (a, serverA) = try cluster.served("a"), (b, serverB) = try cluster.served("b")
        let ann = try Self.signUp("ann", a.service)
        let (_, issued) = Self.call(a.service, "tokens/issue", .object([:]), token: ann)
        let phone = try #require(issued["token"]?.stringValue)
        try Self.createZone(b.service, token: ann)
        let (subscribed, _) = Self.call(b.service, "subscriptions/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "subscription": .object([
                "subscriptionID": .string("lists"), "subscriptionType": .string("zone"),
                "zoneID": .object(["zoneName": .string("Lists")])])])])]), token: ann)
        #expect(subscribed == 200)
        let (_, made) = Self.call(a.service, "tokens/create", .object(["apnsEnvironment": .string("production")]), token: phone)
        let push = try #require(made["apnsToken"]?.stringValue)
        let (registered, _) = Self.call(b.service, "tokens/register", .object([
            "apnsEnvironment": .string("production"), "apnsToken": .string(push)]), token: phone)
        #expect(registered == 200)

        func open(_ port: UInt16, lastEventID: String? = nil) throws -> RawHTTPClient {
            let client = try RawHTTPClient(port: port, timeoutSeconds: 5)
            var head = "GET /push/\(push) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            if let lastEventID { head += "Last-Event-ID: \(lastEventID)\r\n" }
            try client.write(Array((head + "\r\n").utf8))
            #expect(try client.readUntil("event: ready").found)
            return client
        }
        let stream = try open(serverA.port)
        let started = Date()
        let (ownWrite, _) = Self.call(b.service, "records/modify", .object([
            "zoneID": .object(["zoneName": .string("Lists")]), "operations": .array([operation("create", "mine")]),
        ]), token: phone)
        #expect(ownWrite == 200)
        let (otherWrite, _) = Self.call(b.service, "records/modify", .object([
            "zoneID": .object(["zoneName": .string("Lists")]), "operations": .array([operation("create", "theirs")]),
        ]), token: ann)
        #expect(otherWrite == 200)
        let heard = try stream.readUntil("event: notification")
        #expect(heard.found, "\(heard.text)")
        print("PostgresNodesTests: a push stream on a heard of a write on b after \(Int(Date().timeIntervalSince(started) * 1000)) ms")
        let data = try stream.readUntil("\n\n").text
        #expect(data.contains("\"subscriptionID\":\"lists\""))
        // One notification: the phone's own write raised none for it (the later write's row is the one read).
        #expect(!(try stream.readUntil("event: notification", within: 1).found))

        // The device moves to node b from before that notification: it gets it again there.
        let resumed = try open(serverB.port, lastEventID: "0")
        #expect(try resumed.readUntil("event: notification").found)
    }

    /// An asset uploaded through node a (cut midway, resumed through node b) is downloaded whole through node
    /// b, with the SHA-256 it was uploaded with: the bytes live in PostgreSQL, not on a node's disk.
    @Test func anAssetUploadedThroughOneNodeIsServedByTheOther() throws {
        let cluster = try Cluster()
        let (a, serverA) = try cluster.served("a"), (b, serverB) = try cluster.served("b")
        let ann = try Self.signUp("ann", a.service)
        try Self.createZone(a.service, token: ann)
        let seed = RandomSeed.current
        print("PostgresNodesTests.anAsset: LATTICE_SEED=\(seed)")
        var generator = SplitMix64(seed: seed)
        let bytes = (0..<3_500_000).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
        let (_, tokens) = Self.call(a.service, "assets/upload", .object([
            "zoneID": .object(["zoneName": .string("Lists")]),
            "tokens": .array([.object(["recordType": .string("Item"), "recordName": .string("milk"), "fieldName": .string("photo")])]),
        ]), token: ann)
        let url = try #require(tokens["tokens"]?.arrayValue?.first?["url"]?.stringValue, "\(tokens.serialized())")
        let path = String(url.dropFirst(Self.publicURL.count))

        // Through a: 2.5 MB of 3.5, then the connection is cut. What a kept (whole chunks) resumes through b.
        let cut = try RawHTTPClient(port: serverA.port)
        try cut.write(Array("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: image/jpeg\r\nContent-Length: \(bytes.count)\r\n\r\n".utf8))
        try cut.write(Array(bytes[0..<2_500_000]))
        cut.close()
        var offset = -1
        for _ in 0..<250 {
            let head = try RawHTTPClient(port: serverB.port).send(method: "HEAD", path: path)
            if head.headers["upload-length"] != nil, let held = Int(head.headers["upload-offset"] ?? ""), held > 0 {
                offset = held
                let retry = try RawHTTPClient(port: serverB.port).send(method: "PATCH", path: path, headers: ["Upload-Offset": String(held)],
                                                                       body: Array(bytes[held...]))
                if retry.status == 503 { Thread.sleep(forTimeInterval: 0.02); continue } // a still finishes the cut request
                #expect(retry.status == 200, "\(String(decoding: retry.body, as: UTF8.self))")
                let receipt = try AssetReceipt(json: try JSON.parse(retry.body))
                #expect(receipt.asset.checksum == Secrets.sha256(bytes))
                let (saved, _) = Self.call(b.service, "records/modify", .object([
                    "zoneID": .object(["zoneName": .string("Lists")]),
                    "operations": .array([operation("create", "milk", fields: [
                        "photo": .object(["value": receipt.value, "type": .string("ASSETID")])])]),
                ]), token: ann)
                #expect(saved == 200)
                break
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        #expect(offset >= AssetChunkStore.chunkSize && offset <= 2_500_000)
        print("PostgresNodesTests.anAsset: node a kept \(offset) bytes of the cut upload")

        let (_, looked) = Self.call(a.service, "records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Lists")]), "records": .array([.object(["recordName": .string("milk")])]),
        ]), token: ann)
        let download = try #require(looked["records"]?.arrayValue?.first?["fields"]?["photo"]?["value"]?["downloadURL"]?.stringValue)
        let downloadPath = String(download.dropFirst(Self.publicURL.count)).replacingOccurrences(of: "${f}", with: "milk.jpg")
        let served = try RawHTTPClient(port: serverB.port).send(method: "GET", path: downloadPath)
        #expect(served.status == 200)
        #expect(Secrets.sha256(served.body) == Secrets.sha256(bytes))
        let part = try RawHTTPClient(port: serverB.port).send(method: "GET", path: downloadPath,
                                                                headers: ["Range": "bytes=1048000-1049999"])
        #expect(part.status == 206 && part.body == Array(bytes[1_048_000...1_049_999])) // across a chunk boundary
    }

    @Test func aKeyRotatedThroughOneNodeSignsAndRetiresOnTheOther() throws {
        let cluster = try Cluster()
        let a = try cluster.node("a"), b = try cluster.node("b")
        #expect(a.keyRing.activeKeyID == b.keyRing.activeKeyID)
        let claims = ShareClaims(issuer: Self.publicURL, shareID: "sh_1", zoneName: "Lists", ownerRecordName: "_owner",
                                 issuedAt: 1, tokenID: try ShareClaims.newTokenID(), permission: "readOnly", epoch: 1)
        let old = try b.keyRing.sign(claims)
        let oldKey = b.keyRing.activeKeyID
        let rotated = try a.keyRing.rotate(nowMilliseconds: 5_000)
        #expect(b.keyRing.activeKeyID == rotated)
        #expect(try b.keyRing.sign(claims) != old)
        try a.keyRing.retire(keyID: oldKey)
        #expect((try? b.keyRing.verify(old, nowSeconds: 2)) == nil)
        // What every sign and verify pays to notice a rotation: one read of the version marker.
        let store = DatabaseShareKeyStore(storage: b.storage)
        let started = Date()
        for _ in 0..<200 { _ = try store.version() }
        print("PostgresNodesTests: share-key version read \(String(format: "%.0f", Date().timeIntervalSince(started) * 1e6 / 200)) µs each (200 reads)")
    }

    @Test func purgeSkipsARoundWhileAnotherNodeHoldsItsLock() throws {
        let cluster = try Cluster()
        let a = try cluster.node("a"), b = try cluster.node("b")
        #expect(try a.service.purgeUnlessRunningElsewhere() != nil)
        // 0: a purged, 1: a skipped, 2: a failed.
        let outcome = Mutex<Int>(-1)
        try b.storage.write { tx in
            let held = try tx.tryExclusiveLock("purge")
            #expect(held)
            let done = DispatchSemaphore(value: 0)
            Thread {
                let result: Int
                do { result = try a.service.purgeUnlessRunningElsewhere() == nil ? 1 : 0 } catch { result = 2 }
                outcome.withLock { $0 = result }
                done.signal()
            }.start()
            #expect(done.wait(timeout: .now() + 10) == .success)
        }
        #expect(outcome.withLock { $0 } == 1, "a purged (0) or failed (2) while b held the lock")
        #expect(try a.service.purgeUnlessRunningElsewhere() != nil)
    }

    @Test func aSecondProcessAsOneNodeAndANodeWithAnotherPublicURLAreRefused() throws {
        let cluster = try Cluster()
        _ = try cluster.node("a")
        do {
            _ = try cluster.node("a")
            Issue.record("a second node a started")
        } catch let failure as OpenedDeployment.Failure {
            #expect(failure.description.contains("running as node a"), "\(failure)")
        }
        do {
            _ = try cluster.node("b", publicURL: "http://127.0.0.1:9999")
            Issue.record("a node with another public URL started")
        } catch let failure as OpenedDeployment.Failure {
            #expect(failure.description.contains("http://127.0.0.1:9999") && failure.description.contains(Self.publicURL))
        }
        // The refused node released its claim: b starts with the right URL.
        _ = try cluster.node("b")
    }

    @Test func adminCommandsWorkAgainstTheDatabaseBesideRunningNodes() throws {
        let cluster = try Cluster()
        let a = try cluster.node("a")
        let added = try CLITests.ok("admin", "add-user", "carol", "--database", cluster.database.url, "--json")
        let token = try #require(try added.json["token"]?.stringValue)
        let (status, json) = Self.post(a.service, "/database/1/lattice/production/private/users/current", .object([:]), token: token)
        #expect(status == 200 && json["name"]?.stringValue == "carol")
        let listed = try CLITests.ok("admin", "tokens", "carol", "--database", cluster.database.url, "--json")
        #expect(try listed.json.arrayValue?.count == 1)
        let before = a.keyRing.activeKeyID
        try CLITests.ok("admin", "rotate-share-key", "--database", cluster.database.url)
        #expect(a.keyRing.activeKeyID != before)
        let keys = try CLITests.ok("admin", "share-keys", "--database", cluster.database.url, "--json")
        #expect(try keys.json.arrayValue?.count == 2)
        let retired = try CLITests.lattice("admin", "retire-share-key", "--database", cluster.database.url, "--", before)
        #expect(retired.status == 0, "\(retired)")
        #expect(a.keyRing.keys.first { $0.keyID == before }?.retired == true)
        // $LATTICE_DATABASE_URL serves when neither flag is given.
        let process = Process()
        process.executableURL = URL(fileURLWithPath: latticeBinary)
        process.arguments = ["admin", "share-keys", "--json"]
        var environment = ProcessInfo.processInfo.environment
        environment[StorageLocation.databaseEnvironmentVariable] = cluster.database.url
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        try process.run()
        let listedKeys = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        #expect(process.terminationStatus == 0)
        #expect(try JSON.parse(Array(listedKeys)).arrayValue?.count == 2)
        try CLITests.ok("admin", "revoke-token", "--user", "carol", "--database", cluster.database.url)
        #expect(Self.post(a.service, "/database/1/lattice/production/private/users/current", .object([:]), token: token).0 == 401)
    }

    /// Runs `work(i)` for i in 0..<count on threads at once, returning the outcomes by index.
    static func concurrently<T: Sendable>(_ count: Int, _ work: @escaping @Sendable (Int) -> T) -> [T] {
        let results = Mutex<[Int: T]>([:])
        let group = DispatchGroup()
        let start = DispatchSemaphore(value: 0)
        for index in 0..<count {
            group.enter()
            Thread {
                start.wait()
                let outcome = work(index)
                results.withLock { $0[index] = outcome }
                group.leave()
            }.start()
        }
        for _ in 0..<count { start.signal() }
        _ = group.wait(timeout: .now() + 60)
        return results.withLock { dictionary in (0..<count).compactMap { dictionary[$0] } }
    }

    @Test func aSingleUseLinkAndTheParticipantCapHoldAcrossTwoNodes() throws {
        let cluster = try Cluster()
        let a = try cluster.node("a"), b = try cluster.node("b")
        let nodes = [a.service, b.service]
        let ann = try Self.signUp("ann", a.service)
        try Self.createZone(a.service, token: ann)
        let zone = JSON.object(["zoneName": .string("Lists")])
        let (created, share) = Self.call(a.service, "shares/create", .object(["zoneID": zone, "publicPermission": .string("readOnly")]),
                                         token: ann)
        #expect(created == 200, "\(share.serialized())")
        let guests = try (0..<107).map { try Self.signUp("g\($0)", nodes[$0 % 2]) }

        // A single-use link accepted by six guests at once through both nodes: exactly one joins.
        let (_, link) = Self.call(b.service, "shares/url", .object(["zoneID": zone, "permission": .string("readOnly"),
                                                                    "maxUses": .int(1)]), token: ann)
        let url = try #require(link["url"]?.stringValue, "\(link.serialized())")
        let joins = Self.concurrently(6) { index in
            let (_, answer) = PostgresNodesTests.post(nodes[index % 2], "/database/1/lattice/production/shared/records/accept",
                                                      .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                                      token: guests[index])
            return answer["results"]?.arrayValue?.first?["serverErrorCode"] == nil
        }
        #expect(joins.count == 6 && joins.filter { $0 }.count == 1, "joins: \(joins)")

        // 2 participants now (ann and the link's one); invite 95 more, then 6 at once through both nodes
        // for the last 3 places.
        @Sendable func invite(_ names: [Int], on service: LatticeService) -> Int {
            Self.call(service, "shares/modify", .object(["zoneID": zone, "participants": .array(names.map {
                .object(["operation": .string("invite"), "userName": .string("g\($0)"), "permission": .string("readOnly")])
            })]), token: ann).0
        }
        let closed = Self.call(a.service, "shares/modify", .object(["zoneID": zone, "publicPermission": .string("none")]),
                               token: ann)
        #expect(closed.0 == 200, "\(closed.1.serialized().prefix(400))")
        let bulk = Self.call(a.service, "shares/modify", .object(["zoneID": zone, "participants": .array((6..<101).map {
            .object(["operation": .string("invite"), "userName": .string("g\($0)"), "permission": .string("readOnly")])
        })]), token: ann)
        #expect(bulk.0 == 200, "\(bulk.1.serialized().prefix(400))")
        func active(_ service: LatticeService) -> Int {
            let (_, lookup) = Self.call(service, "shares/lookup", .object(["zoneID": zone]), token: ann)
            return (lookup["participants"]?.arrayValue ?? []).filter { $0["acceptanceStatus"]?.stringValue != "removed" }.count
        }
        let free = 100 - active(a.service)
        #expect((1...4).contains(free), "\(free) places left")
        let invited = Self.concurrently(6) { index in invite([101 + index], on: nodes[index % 2]) }
        #expect(invited.filter { $0 == 200 }.count == free, "statuses: \(invited), \(free) places were free")
        #expect(invited.allSatisfy { $0 == 200 || $0 == 409 }, "statuses: \(invited)")
        #expect(active(b.service) == 100)
    }

    @Test func acceptsAndWritesInTheOwnersZoneDoNotDeadlock() throws {
        let cluster = try Cluster()
        let a = try cluster.node("a"), b = try cluster.node("b")
        let ann = try Self.signUp("ann", a.service)
        try Self.createZone(a.service, token: ann)
        let zone = JSON.object(["zoneName": .string("Lists")])
        _ = Self.call(a.service, "shares/create", .object(["zoneID": zone, "publicPermission": .string("readWrite")]), token: ann)
        let (_, link) = Self.call(a.service, "shares/url", .object(["zoneID": zone]), token: ann)
        let url = try #require(link["url"]?.stringValue, "\(link.serialized())")
        let guests = try (0..<8).map { try Self.signUp("g\($0)", b.service) }
        // Four writers in ann's zone through node a while eight guests accept through node b.
        let outcomes = Self.concurrently(12) { index -> (String, Double, Bool) in
            let started = Date()
            if index < 4 {
                var ok = true
                for round in 0..<5 {
                    ok = ok && PostgresNodesTests.call(a.service, "records/modify", .object([
                        "zoneID": zone, "operations": .array([operation("create", "w\(index)-\(round)")]),
                    ]), token: ann).0 == 200
                }
                return ("write", Date().timeIntervalSince(started) / 5, ok)
            }
            let (_, answer) = PostgresNodesTests.post(b.service, "/database/1/lattice/production/shared/records/accept",
                                                      .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                                      token: guests[index - 4])
            return ("accept", Date().timeIntervalSince(started),
                    answer["results"]?.arrayValue?.first?["serverErrorCode"] == nil)
        }
        #expect(outcomes.count == 12 && outcomes.allSatisfy(\.2), "\(outcomes)")
        let slowest = outcomes.map(\.1).max() ?? 0
        print("PostgresNodesTests: accepts and writes at once, slowest \(Int(slowest * 1000)) ms")
        // A deadlock is broken only after PostgreSQL's deadlock_timeout (1 s).
        #expect(slowest < 0.9, "\(outcomes)")
    }
}
