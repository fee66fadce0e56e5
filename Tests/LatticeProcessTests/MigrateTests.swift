import Foundation
import LatticeCore
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice admin migrate`: a SQLite deployment made through the real CLI and API, copied into a fresh
/// PostgreSQL database (the test cluster of `LATTICE_TEST_POSTGRES_URL`), then served by two
/// `lattice serve --database` nodes.
@Suite(.serialized) struct MigrateTests {
    /// A `lattice serve --database` node (LatticeTestSupport).
    typealias Node = ServeNode

    static let privateDatabase = "/database/1/lattice/production/private/"
    static let sharedDatabase = "/database/1/lattice/production/shared/"

    /// A POST with a bearer token and a JSON body; the answer's JSON (any status other than 200 throws).
    static func post(_ port: UInt16, _ path: String, token: String, _ body: JSON) throws -> JSON {
        let client = try RawHTTPClient(port: port)
        let reply = try client.send(method: "POST", path: path, headers: ["Authorization": "Bearer " + token],
                                    body: body.serializedBytes())
        guard reply.status == 200 else {
            throw HarnessError("\(path) answered \(reply.status): \(String(decoding: reply.body, as: UTF8.self))")
        }
        return try JSON.parse(reply.body)
    }

    /// The rows of every table, read through the storage's own count.
    static func counts(_ storage: any Storage) throws -> [String: Int] {
        try storage.read { tx in
            var counts: [String: Int] = [:]
            for table in StorageTables.all { counts[table.name] = try tx.rowCount(table: table.name) }
            return counts
        }
    }

    @Test func aSQLiteDeploymentMovedToPostgreSQLKeepsAccountsSharesTokensAndSyncTokens() throws {
        let target = try PostgresTestDatabase.create()
        defer { target.drop() }
        let directory = temporaryDirectory("lattice-migrate")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let data = directory + "/server"
        let alice = directory + "/alice", bob = directory + "/bob", carolHome = directory + "/carol"

        // The SQLite deployment, made through the CLI and the API (with an identity provider, for its tables).
        let provider = try OIDCProviderProcess(clientIDs: ["lattice-app"])
        defer { provider.stop() }
        let sqlite = try ServerUnderTest(data: data, extra: ["--access-log", "off", "--oidc-issuer", provider.issuer,
                                                             "--oidc-client-id", "lattice-app",
                                                             "--webhook-private-addresses", "allow"])
        let url = "http://127.0.0.1:\(sqlite.port)"
        let aliceToken = try #require(try CLITests.ok("signup", "alice", "--server", url, "--json", home: alice)
            .json["token"]?.stringValue)
        let bobToken = try #require(try CLITests.ok("signup", "bob", "--server", url, "--json", home: bob)
            .json["token"]?.stringValue)
        let carol = try CLITests.ok("admin", "add-user", "carol", "--data", data, "--lifetime", "86400", "--json").json
        let carolTokenID = try #require(carol["tokenID"]?.stringValue)
        try CLITests.ok("login", "--server", url, "--token", try #require(carol["token"]?.stringValue), home: carolHome)
        let list = try #require(try CLITests.ok("list", "create", "Groceries", "--json", home: alice).json["id"]?.stringValue)
        for item in ["Milk", "Eggs", "Bread"] { try CLITests.ok("list", "add", list, item, "--tag", "food", home: alice) }
        try CLITests.ok("list", "remove", list, "Bread", home: alice) // a tombstone
        try CLITests.ok("share", "create", list, "--public-permission", "read-write", home: alice)
        let link = try #require(try CLITests.ok("share", "url", list, "--max-uses", "2", "--json", home: alice)
            .json["url"]?.stringValue)
        try CLITests.ok("accept", link, "--yes", home: bob) // the link's first of two uses
        let chores = try #require(try CLITests.ok("list", "create", "Chores", "--json", home: alice).json["id"]?.stringValue)
        try CLITests.ok("list", "add", chores, "Sweep", home: alice)
        try CLITests.ok("share", "create", chores, home: alice) // private: invitations only
        try CLITests.ok("share", "invite", chores, "carol", "--permission", "read-only", home: alice)
        // A subscription and a registered push token of alice's: bob's change below raises a notification.
        let subscribed = try Self.post(sqlite.port, Self.privateDatabase + "subscriptions/modify", token: aliceToken, .object([
            "operations": .array([.object(["operationType": .string("create"), "subscription": .object([
                "subscriptionID": .string("everything"), "subscriptionType": .string("database"),
                // A receiver that is never there: its deliveries stay in the outbox, pending.
                "webhook": .object(["url": .string("http://127.0.0.1:9/hook")])])])])]))
        #expect(subscribed["subscriptions"]?.arrayValue?.first?["serverErrorCode"] == nil)
        let push = try Self.post(sqlite.port, Self.privateDatabase + "tokens/create", token: aliceToken,
                                 .object(["apnsEnvironment": .string("production")]))
        let pushToken = try #require(push["apnsToken"])
        _ = try Self.post(sqlite.port, Self.privateDatabase + "tokens/register", token: aliceToken,
                          .object(["apnsEnvironment": .string("production"), "apnsToken": pushToken]))
        try CLITests.ok("list", "check", list, "Eggs", home: bob)
        // An attachment (an asset: its bytes are a file in the data directory), and an upload left unfinished.
        let photo = directory + "/milk.jpg"
        let photoBytes = (0..<1_300_000).map { UInt8(truncatingIfNeeded: $0 &* 2_654_435_761 >> 7) }
        #expect(FileManager.default.createFile(atPath: photo, contents: Data(photoBytes)))
        try CLITests.ok("list", "attach", list, "Milk", photo, home: alice)
        let unfinished = try Self.post(sqlite.port, Self.privateDatabase + "assets/upload", token: aliceToken, .object([
            "zoneID": .object(["zoneName": .string("Lists")]),
            "tokens": .array([.object(["recordName": .string("later"), "fieldName": .string("photo")])])]))
        let unfinishedURL = try #require(unfinished["tokens"]?.arrayValue?.first?["url"]?.stringValue)
        let unfinishedPath = String(unfinishedURL[unfinishedURL.range(of: "/assets/upload/")!.lowerBound...])
        let part = try RawHTTPClient(port: sqlite.port).send(method: "POST", path: unfinishedPath,
                                                             headers: ["Upload-Length": "3000"], body: Array(photoBytes[0..<1000]))
        #expect(part.status == 204)
        try CLITests.ok("sync", home: alice)
        // A device sign-in waiting, and a failed approval (a code nobody shows, unless by a 1 in 20^8 chance).
        let device = try RawHTTPClient(port: sqlite.port).send(method: "POST", path: "/auth/device/start",
                                                               body: Array(#"{"deviceName": "tablet"}"#.utf8))
        #expect(device.status == 200)
        let wrongCode = try RawHTTPClient(port: sqlite.port).send(
            method: "POST", path: "/auth/device/approve", headers: ["Authorization": "Bearer " + aliceToken],
            body: Array(#"{"userCode": "BCDF-GHJK"}"#.utf8))
        #expect(wrongCode.status == 404)
        // A browser sign-up with a passkey (its recovery codes too), a passkey challenge left waiting, an
        // app's ID token exchanged (an external identity) and a provider sign-in left under way.
        let page = ["Origin": url, "X-Lattice-CSRF": "new-session"]
        let options = try JSON.parse(try RawHTTPClient(port: sqlite.port).send(
            method: "POST", path: "/auth/passkey/signup/options", headers: page, body: Array(#"{"name": "dora"}"#.utf8)).body)
        let challenge = try #require(options["challenge"]?.stringValue.flatMap(Base64URL.decode), "\(options.serialized())")
        var authenticator = TestAuthenticator(.es256, signCount: 1)
        authenticator.rpID = "127.0.0.1"
        authenticator.origin = url
        let registration = JSON.object(["credential": .object([
            "rawId": .string(Base64URL.encode(authenticator.credentialID)), "type": .string("public-key"),
            "response": .object([
                "clientDataJSON": .string(Base64URL.encode(authenticator.clientData("webauthn.create", challenge))),
                "attestationObject": .string(Base64URL.encode(authenticator.attestationObject(
                    authenticator.authenticatorData(flags: 0x45, attested: true)))),
            ])])])
        let dora = try RawHTTPClient(port: sqlite.port).send(method: "POST", path: "/auth/passkey/signup", headers: page,
                                                             body: registration.serializedBytes())
        #expect(dora.status == 200, "\(String(decoding: dora.body, as: UTF8.self))")
        _ = try RawHTTPClient(port: sqlite.port).send(method: "POST", path: "/auth/passkey/signin/options", headers: page,
                                                      body: Array("{}".utf8))
        let exchanged = try RawHTTPClient(port: sqlite.port).send(method: "POST", path: "/auth/oidc/token", body: JSON.object([
            "issuer": .string(provider.issuer), "idToken": .string(try provider.mint("good", audience: "lattice-app"))]).serializedBytes())
        #expect(exchanged.status == 200, "\(String(decoding: exchanged.body, as: UTF8.self))")
        let started = try RawHTTPClient(port: sqlite.port).send(method: "GET", path: "/auth/oidc/start?provider=0")
        #expect(started.status == 200)

        // Sync tokens issued before the move: alice's database and zone feeds, bob's shared database.
        let databaseFeed = try Self.post(sqlite.port, Self.privateDatabase + "changes/database", token: aliceToken, .object([:]))
        let databaseToken = try #require(databaseFeed["syncToken"]?.stringValue)
        let zones = try #require(databaseFeed["zones"]?.arrayValue).compactMap { $0["zoneID"] }
        #expect(!zones.isEmpty)
        let zoneFeed = try Self.post(sqlite.port, Self.privateDatabase + "changes/zone", token: aliceToken,
                                     .object(["zones": .array(zones.map { .object(["zoneID": $0]) })]))
        let zoneAnswers = try #require(zoneFeed["zones"]?.arrayValue)
        let zoneTokens = zoneAnswers.compactMap { $0["syncToken"]?.stringValue }
        #expect(zoneTokens.count == zones.count && zoneAnswers.allSatisfy { $0["moreComing"] == .bool(false) })
        let sharedFeed = try Self.post(sqlite.port, Self.sharedDatabase + "changes/database", token: bobToken, .object([:]))
        let sharedToken = try #require(sharedFeed["syncToken"]?.stringValue)
        #expect(sharedFeed["zones"]?.arrayValue?.count == 1)
        let listsBefore = try CLITests.ok("lists", "--json", home: bob).json

        // The server stops (writes after the snapshot would not be copied); every table has rows.
        sqlite.kill(SIGTERM)
        let source = try SQLiteStorage(path: data + "/" + SQLiteStorage.fileName)
        let sourceCounts = try Self.counts(source)
        source.close()
        // The server keeps nothing in metadata; SQLite keeps asset bytes in files, not chunk rows.
        for table in StorageTables.all where table.name != "metadata" && table.name != "asset_chunks" {
            #expect((sourceCounts[table.name] ?? 0) > 0, "the source has no rows in \(table.name): \(sourceCounts)")
        }

        let migrated = try CLITests.ok("admin", "migrate", "--data", data, "--to", target.url, "--json").json
        var expected: [String: JSON] = [:]
        for (table, count) in sourceCounts { expected[table] = .int(Int64(count)) }
        #expect(migrated["tables"] == .object(expected), "\(migrated)")
        #expect(migrated["shareKeys"] == .int(1) && migrated["checked"] == .bool(true))
        let storage = try PostgresStorage(url: target.url, poolSize: 1)
        defer { storage.close() }
        var targetCounts = try Self.counts(storage)
        #expect(targetCounts["metadata"] == (sourceCounts["metadata"] ?? 0) + 1) // share_keys
        targetCounts["metadata"] = sourceCounts["metadata"]
        // The asset files became chunk rows: the attachment's 2 (1 MiB each) and the unfinished upload's 1.
        #expect(targetCounts["asset_chunks"] == 3, "\(targetCounts)")
        #expect(migrated["assetContents"] == .int(2) && migrated["assetBytes"] == .int(1_301_000), "\(migrated)")
        targetCounts["asset_chunks"] = sourceCounts["asset_chunks"]
        #expect(targetCounts == sourceCounts)
        let ringFile = try String(contentsOfFile: data + "/share-keys.json", encoding: .utf8)
        #expect(try storage.read { try $0.metadata("share_keys") } == ringFile)

        // Two nodes on the database; node a takes the old server's address, which the homes and the link name.
        let nodeA = try Node(database: target.url, name: "a", port: sqlite.port, publicURL: url)
        defer { nodeA.stop() }
        let nodeB = try Node(database: target.url, name: "b", port: 0, publicURL: url)
        defer { nodeB.stop() }

        // The homes' stored tokens still name the right positions: nothing to fetch, nothing refetched.
        let quiet = try CLITests.ok("sync", "--json", home: alice).json
        #expect(quiet["online"] == .bool(true) && quiet["fetched"] == .int(0) && quiet["pending"] == .int(0), "\(quiet)")
        #expect(try CLITests.ok("lists", "--json", home: bob).json == listsBefore)
        // The pre-move tokens, on the other node: the same positions, nothing new yet.
        let sameZones = try Self.post(nodeB.port, Self.privateDatabase + "changes/zone", token: aliceToken,
            .object(["zones": .array(zip(zones, zoneTokens).map { .object(["zoneID": $0, "syncToken": .string($1)]) })]))
        for (answer, token) in zip(try #require(sameZones["zones"]?.arrayValue), zoneTokens) {
            #expect(answer["records"] == .array([]) && answer["syncToken"]?.stringValue == token, "\(answer)")
        }
        let sameDatabase = try Self.post(nodeB.port, Self.privateDatabase + "changes/database", token: aliceToken,
                                         .object(["syncToken": .string(databaseToken)]))
        #expect(sameDatabase["zones"] == .array([]) && sameDatabase["syncToken"]?.stringValue == databaseToken)

        // A write through node a shows on node b after exactly those tokens, and only the write.
        try CLITests.ok("list", "add", list, "Butter", home: alice)
        let newZones = try Self.post(nodeB.port, Self.privateDatabase + "changes/zone", token: aliceToken,
            .object(["zones": .array(zip(zones, zoneTokens).map { .object(["zoneID": $0, "syncToken": .string($1)]) })]))
        let changed = try #require(newZones["zones"]?.arrayValue).flatMap { $0["records"]?.arrayValue ?? [] }
        #expect(changed.count == 1, "\(newZones)")
        #expect(changed.first?.serialized().contains("Butter") == true, "\(changed)")
        let newDatabase = try Self.post(nodeB.port, Self.privateDatabase + "changes/database", token: aliceToken,
                                        .object(["syncToken": .string(databaseToken)]))
        #expect(newDatabase["zones"]?.arrayValue?.count == 1)
        let newShared = try Self.post(nodeB.port, Self.sharedDatabase + "changes/database", token: bobToken,
                                      .object(["syncToken": .string(sharedToken)]))
        #expect(newShared["zones"]?.arrayValue?.count == 1, "\(newShared)")

        // The CLI's lists, shares and tokens against the nodes.
        let bobOnB = directory + "/bob-on-b"
        try CLITests.ok("login", "--server", nodeB.url, "--token", bobToken, home: bobOnB)
        let shown = try CLITests.ok("list", "show", list, "--json", home: bobOnB).json
        let items = try #require(shown["items"]?.arrayValue)
        #expect(Set(items.compactMap { $0["text"]?.stringValue }) == ["Milk", "Eggs", "Butter"])
        #expect(items.contains { $0["text"] == .string("Eggs") && $0["done"] == .bool(true) })
        #expect(shown["permission"]?.stringValue == "readWrite" && shown["owner"] != nil, "\(shown)")
        // The attachment's bytes, from the database now: downloaded whole through node b. The unfinished
        // upload resumes there from the bytes it had.
        let out = directory + "/out"
        try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true)
        try CLITests.ok("list", "get", list, "Milk", "--out", out, home: bobOnB)
        #expect(FileManager.default.contents(atPath: out + "/milk.jpg") == Data(photoBytes))
        let resumed = try RawHTTPClient(port: nodeB.port).send(method: "PATCH", path: unfinishedPath, headers: ["Upload-Offset": "1000"],
                                                               body: Array(photoBytes[1000..<3000]))
        #expect(resumed.status == 200, "\(String(decoding: resumed.body, as: UTF8.self))")
        let participants = try CLITests.ok("share", "participants", list, "--json", home: alice).stdout
        #expect(participants.contains("bob"), "\(participants)")
        let invited = try CLITests.ok("share", "participants", chores, "--json", home: alice).stdout
        #expect(invited.contains("carol"), "\(invited)")
        let carolTokens = try CLITests.ok("admin", "tokens", "carol", "--database", target.url, "--json").json
        #expect(carolTokens.arrayValue?.compactMap { $0["tokenID"]?.stringValue } == [carolTokenID])
        #expect(carolTokens.arrayValue?.first?["expiresMs"] != nil)
        try CLITests.ok("sync", home: carolHome) // carol's expiring token still authenticates

        // The link signed before the move: its second use works on node b, a third is refused (the count moved).
        let dave = directory + "/dave", erin = directory + "/erin"
        try CLITests.ok("signup", "dave", "--server", nodeB.url, home: dave)
        try CLITests.ok("accept", link, "--yes", home: dave)
        try CLITests.ok("signup", "erin", "--server", nodeB.url, home: erin)
        let refused = try CLITests.lattice("accept", link, "--yes", home: erin)
        #expect(refused.status == 1, "\(refused)")

        // A second migrate into the now non-empty target is refused and writes nothing.
        let before = try Self.counts(storage)
        let again = try CLITests.lattice("admin", "migrate", "--data", data, "--to", target.url)
        #expect(again.status == 1, "\(again)")
        #expect(again.stderr.contains("not empty") && again.stderr.contains("nothing was written"), "\(again)")
        #expect(try Self.counts(storage) == before)
    }

    /// Migrating while the server takes writes copies one consistent snapshot: no record is newer than its
    /// zone's last position, no zone newer than its database's log, and every copied position is dense.
    @Test func aMigrationDuringWritesCopiesOneConsistentSnapshot() throws {
        let target = try PostgresTestDatabase.create()
        defer { target.drop() }
        let directory = temporaryDirectory("lattice-migrate-live")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let data = directory + "/server"
        let server = try ServerUnderTest(data: data, extra: ["--access-log", "off"])
        defer { server.kill(SIGTERM) }
        let token = try #require(try CLITests.ok("admin", "add-user", "writer", "--data", data, "--json").json["token"]?
            .stringValue)
        let zone: JSON = .object(["zoneName": .string("Live")])
        _ = try Self.post(server.port, Self.privateDatabase + "zones/modify", token: token, .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": zone])]),
        ])]))
        // A writer saving batches of 20 new records until told to stop (at most 20 s).
        let stop = Atomic<Bool>(false)
        let written = Atomic<Int>(0)
        let port = server.port
        let writer = Thread {
            let began = Date()
            var batch = 0
            while !stop.load(ordering: .acquiring) && Date().timeIntervalSince(began) < 20 {
                let operations: [JSON] = (0..<20).map { operation("create", "r\(batch)-\($0)", fields: ["n": value(.int(Int64($0)))]) }
                if (try? Self.post(port, Self.privateDatabase + "records/modify", token: token,
                                   .object(["zoneID": zone, "operations": .array(operations)]))) != nil {
                    written.add(20, ordering: .relaxed)
                }
                batch += 1
            }
        }
        writer.start()
        for _ in 0..<200 where written.load(ordering: .relaxed) < 200 { usleep(20_000) }
        let migrated = try CLITests.ok("admin", "migrate", "--data", data, "--to", target.url, "--json").json
        stop.store(true, ordering: .releasing)
        for _ in 0..<1000 where !writer.isFinished { usleep(20_000) }
        let copiedRecords = try #require(migrated["tables"]?["records"]?.intValue)
        #expect(copiedRecords >= 200, "\(migrated)")

        let storage = try PostgresStorage(url: target.url, poolSize: 1)
        defer { storage.close() }
        try storage.read { tx in
            var zones: [[StorageValue]] = [], records: [[StorageValue]] = [], databases: [[StorageValue]] = []
            try tx.exportRows(table: "zones") { zones += $0 }
            try tx.exportRows(table: "records") { records += $0 }
            try tx.exportRows(table: "databases") { databases += $0 }
            func integer(_ value: StorageValue) -> Int64 { if case .integer(let v) = value { return v }; return -1 }
            for zoneRow in zones {
                let id = integer(zoneRow[0]), lastSeq = integer(zoneRow[5]), databaseSeq = integer(zoneRow[7])
                let positions = records.filter { integer($0[0]) == id }.map { integer($0[5]) }.sorted()
                // Every save in this zone made a new record, so its positions are exactly 1...last_seq.
                let dense: [Int64] = lastSeq > 0 ? Array(1...lastSeq) : []
                #expect(positions == dense, "zone \(id): last_seq \(lastSeq), \(positions.count) records")
                let database = try #require(databases.first { integer($0[0]) == integer(zoneRow[1]) })
                #expect(databaseSeq <= integer(database[4]), "zone \(id) is newer than its database's log")
            }
        }
    }

    @Test func badSourcesAndTargetsGetClearErrors() throws {
        let directory = temporaryDirectory("lattice-migrate-errors")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let data = directory + "/server"
        try CLITests.ok("admin", "add-user", "ann", "--data", data)

        let notAURL = try CLITests.lattice("admin", "migrate", "--data", data, "--to", directory + "/elsewhere")
        #expect(notAURL.status == 2 && notAURL.stderr.contains("postgres://"), "\(notAURL)")
        let noTarget = try CLITests.lattice("admin", "migrate", "--data", data)
        #expect(noTarget.status == 2 && noTarget.stderr.contains("--to"), "\(noTarget)")

        // Nothing listens on port 1: a quick, clear failure that never shows the password.
        let began = Date()
        let unreachable = try CLITests.lattice("admin", "migrate", "--data", data, "--to",
                                               "postgresql://lattice:s3cr3t-pw@127.0.0.1:1/lattice?connect_timeout=3")
        #expect(unreachable.status == 1 && unreachable.stderr.contains("cannot open"), "\(unreachable)")
        #expect(!unreachable.stderr.contains("s3cr3t-pw") && !unreachable.stdout.contains("s3cr3t-pw"), "\(unreachable)")
        #expect(Date().timeIntervalSince(began) < 30)

        let missing = try CLITests.lattice("admin", "migrate", "--data", directory + "/nowhere", "--to",
                                           "postgresql://lattice@127.0.0.1:1/lattice")
        #expect(missing.status == 1 && missing.stderr.contains("is not a directory"), "\(missing)")
        try FileManager.default.createDirectory(atPath: directory + "/empty", withIntermediateDirectories: true)
        let empty = try CLITests.lattice("admin", "migrate", "--data", directory + "/empty", "--to",
                                         "postgresql://lattice@127.0.0.1:1/lattice")
        #expect(empty.status == 1 && empty.stderr.contains("no lattice.sqlite"), "\(empty)")
    }
}
