import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing

/// A storage that forwards to another and lets a test play the backend's part in multi-node delivery:
/// it keeps every `observeChanges` handler (so a test can deliver another node's announcement or a
/// `.resynchronize`), and it can be made unreachable (every read and write throws `.busy`, as
/// PostgresStorage does while the database is away).
final class ObservedStorage: Storage, Sendable {
    let inner: any Storage
    private let handlers = Mutex<[@Sendable (StorageChange) -> Void]>([])
    private let unreachable = Atomic<Bool>(false)

    init(_ inner: any Storage) { self.inner = inner }

    var assetContents: any AssetContentStore { inner.assetContents }

    func deliver(_ change: StorageChange) {
        for handler in handlers.withLock({ $0 }) { handler(change) }
    }

    func setUnreachable(_ value: Bool) { unreachable.store(value, ordering: .sequentiallyConsistent) }

    private func check() throws {
        if unreachable.load(ordering: .sequentiallyConsistent) { throw StorageError.busy }
    }

    func read<T>(deadline: RequestDeadline?, lane: ReadLane, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try check()
        return try inner.read(deadline: deadline, lane: lane, body)
    }

    func write<T>(deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try check()
        return try inner.write(deadline: deadline, body)
    }

    func close() { inner.close() }
    func sizeOnDisk() throws -> Int64 { try inner.sizeOnDisk() }
    func observeChanges(_ handler: @escaping @Sendable (StorageChange) -> Void) throws {
        handlers.withLock { $0.append(handler) }
    }
    func claimNode(_ name: String) throws {}
}

/// Two services (nodes "a" and "b") over one storage: what one commits, the other hears of only through
/// the storage's announcements, as with two processes on one PostgreSQL.
final class TwoNodes: Sendable {
    let directory = temporaryDirectory("lattice-nodes")
    let sqlite: SQLiteStorage
    let storage: ObservedStorage
    let a: LatticeService
    let b: LatticeService

    init() throws {
        sqlite = try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
        storage = ObservedStorage(sqlite)
        func configuration(_ node: String) -> ServiceConfiguration {
            var configuration = ServiceConfiguration()
            configuration.nodeName = node
            configuration.rateLimit = nil
            configuration.signUpsPerAddress = nil
            configuration.signUpsGlobal = nil
            return configuration
        }
        a = try LatticeService(storage: storage, configuration: configuration("a"), log: { _ in })
        b = try LatticeService(storage: storage, configuration: configuration("b"), log: { _ in })
    }

    deinit {
        sqlite.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    func post(_ service: LatticeService, _ path: String, _ body: JSON, token: String? = nil) -> (Int, JSON) {
        var headers: [String: String] = [:]
        if let token { headers["Authorization"] = "Bearer " + token }
        let response = service.respond(to: HTTPRequest(method: "POST", path: path, headers: headers,
                                                       body: body.serializedBytes(), remoteAddress: "127.0.0.1"))
        return (response.status, (try? JSON.parse(response.body)) ?? .null)
    }

    func signUp(_ name: String, on service: LatticeService) throws -> String {
        let (status, json) = post(service, "/auth/signup", .object(["name": .string(name)]))
        guard status == 200, let token = json["token"]?.stringValue else { throw HarnessError("signup: \(json.serialized())") }
        return token
    }

    func call(_ service: LatticeService, _ operation: String, _ body: JSON, token: String) -> (Int, JSON) {
        post(service, "/database/1/lattice/production/private/\(operation)", body, token: token)
    }

    /// A record write in zone Lists through `service`.
    func write(_ service: LatticeService, _ name: String, token: String) throws {
        let (status, json) = call(service, "records/modify", .object([
            "zoneID": .object(["zoneName": .string("Lists")]), "operations": .array([operation("create", name)]),
        ]), token: token)
        guard status == 200, json["records"]?.arrayValue?.first?["serverErrorCode"] == nil else {
            throw HarnessError("write: \(json.serialized())")
        }
    }

    /// Parks `changes/wait` on `service` from the database's position now.
    func park(_ service: LatticeService, token: String) throws -> ResponseBox {
        let (_, feed) = call(service, "changes/database", .object([:]), token: token)
        let syncToken = try #require(feed["syncToken"]?.stringValue)
        let box = ResponseBox()
        service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/changes/wait",
                                   headers: ["Authorization": "Bearer " + token],
                                   body: JSON.object(["syncToken": .string(syncToken), "timeout": .int(30)]).serializedBytes(),
                                   remoteAddress: "127.0.0.1")) { box.set($0) }
        return box
    }
}

@Suite struct SeveralNodesTests {
    @Test func anotherNodesAnnouncementWakesOnlyTheWaitersOfItsDatabases() throws {
        let nodes = try TwoNodes()
        let ann = try nodes.signUp("ann", on: nodes.a)
        let (_, zone) = nodes.call(nodes.a, "zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])]),
        ])]), token: ann)
        #expect(zone["zones"]?.arrayValue?.count == 1)
        #expect(nodes.a.replicaID != nodes.b.replicaID)

        let parked = try nodes.park(nodes.a, token: ann)
        #expect(nodes.a.notifier.waiterCount == 1)
        let watched = try #require(nodes.a.notifier.watchedDatabaseIDs.first)
        // Node b commits: node a's waiter is not told by b's process.
        try nodes.write(nodes.b, "from-b", token: ann)
        #expect(parked.wait(seconds: 0.3) == nil)
        // An announcement of another database reads nothing and wakes nothing.
        nodes.storage.deliver(.databases([watched + 1000]))
        #expect(parked.wait(seconds: 0.3) == nil)
        // The announcement of b's commit wakes it.
        let started = Date()
        nodes.storage.deliver(.databases([watched]))
        let woken = try #require(parked.wait(seconds: 5))
        #expect(try JSON.parse(woken.body)["changed"] == .bool(true))
        print("SeveralNodesTests: woken \(Int(Date().timeIntervalSince(started) * 1000)) ms after the announcement")
        #expect(nodes.a.notifier.waiterCount == 0)
    }

    @Test func resynchronizeRereadsEveryParkedWaiterAndWakesThoseBehind() throws {
        let nodes = try TwoNodes()
        let ann = try nodes.signUp("ann", on: nodes.a)
        let bob = try nodes.signUp("bob", on: nodes.b)
        for token in [ann, bob] {
            _ = nodes.call(nodes.a, "zones/modify", .object(["operations": .array([
                .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])]),
            ])]), token: token)
        }
        let annWaits = try nodes.park(nodes.a, token: ann)
        let bobWaits = try nodes.park(nodes.a, token: bob)
        #expect(nodes.a.notifier.waiterCount == 2)
        // A resynchronize with nothing new wakes nobody.
        nodes.storage.deliver(.resynchronize)
        #expect(annWaits.wait(seconds: 0.3) == nil && bobWaits.wait(seconds: 0.1) == nil)
        // Ann's database moves on node b while the announcement is lost; the resynchronize finds it.
        try nodes.write(nodes.b, "lost-announcement", token: ann)
        nodes.storage.deliver(.resynchronize)
        let woken = try #require(annWaits.wait(seconds: 5))
        #expect(try JSON.parse(woken.body)["changed"] == .bool(true))
        #expect(bobWaits.wait(seconds: 0.3) == nil)
        #expect(nodes.a.notifier.waiterCount == 1)
        nodes.a.beginShutdown()
        #expect(bobWaits.wait(seconds: 5)?.status == 503)
    }

    @Test func aFailedRereadIsRetriedUntilTheDatabaseIsBack() throws {
        let nodes = try TwoNodes()
        let ann = try nodes.signUp("ann", on: nodes.a)
        _ = nodes.call(nodes.a, "zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])]),
        ])]), token: ann)
        let parked = try nodes.park(nodes.a, token: ann)
        try nodes.write(nodes.b, "x", token: ann)
        nodes.storage.setUnreachable(true)
        nodes.storage.deliver(.databases(Array(nodes.a.notifier.watchedDatabaseIDs)))
        #expect(parked.wait(seconds: 0.5) == nil)
        nodes.storage.setUnreachable(false)
        // The retry (1 s later) re-reads every waiter.
        let woken = try #require(parked.wait(seconds: 5))
        #expect(try JSON.parse(woken.body)["changed"] == .bool(true))
    }

    @Test func anUnreachableDatabaseIsTryAgainLaterAndHealthzSaysSoUntilItIsBack() throws {
        let nodes = try TwoNodes()
        let ann = try nodes.signUp("ann", on: nodes.a)
        let health = { (method: String) in nodes.a.respond(to: HTTPRequest(method: method, path: "/healthz", headers: [:],
                                                                          body: [], remoteAddress: "127.0.0.1")) }
        nodes.a.probeStorage(deadlineMilliseconds: 500)
        #expect(health("GET").status == 200)
        nodes.storage.setUnreachable(true)
        let (status, json) = nodes.call(nodes.a, "zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("L")])])]),
        ])]), token: ann)
        #expect(status == 503 && json["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
        #expect(json["retryAfter"] != nil)
        nodes.a.probeStorage(deadlineMilliseconds: 500)
        let down = health("GET")
        #expect(down.status == 503)
        #expect(down.headers.contains { $0.name == "Retry-After" })
        #expect(try JSON.parse(down.body)["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
        #expect(try JSON.parse(down.body)["reason"]?.stringValue == "the database cannot be reached")
        #expect(health("HEAD").status == 503)
        // Back: the next probe reports it, and writes succeed without a restart.
        nodes.storage.setUnreachable(false)
        nodes.a.probeStorage(deadlineMilliseconds: 500)
        #expect(health("HEAD").status == 200)
        let (again, _) = nodes.call(nodes.a, "zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("L")])])]),
        ])]), token: ann)
        #expect(again == 200)
    }

    // MARK: The share-key ring in the database

    @Test func aRingInTheDatabaseIsSharedAndRotationsReachEveryNodeOnItsNextUse() throws {
        let nodes = try TwoNodes()
        let ringA = try ShareKeyRing.open(store: DatabaseShareKeyStore(storage: nodes.storage), nowMilliseconds: 1_000)
        let ringB = try ShareKeyRing.open(store: DatabaseShareKeyStore(storage: nodes.storage), nowMilliseconds: 2_000)
        #expect(ringA.activeKeyID == ringB.activeKeyID)
        // The stored text is the key file's format.
        let stored = try #require(try nodes.storage.read { try $0.metadata(DatabaseShareKeyStore.contentsKey) })
        let file = try JSON.parse(Array(stored.utf8))
        #expect(file["format"] == .string("lattice-share-keys") && file["version"] == .int(1))

        let claims = ShareClaims(issuer: "https://lattice.example", shareID: "sh_1", zoneName: "Lists",
                                 ownerRecordName: "_owner", issuedAt: 1, tokenID: try ShareClaims.newTokenID(),
                                 permission: "readOnly", epoch: 1)
        let old = try ringA.sign(claims)
        let oldKey = ringA.activeKeyID
        let rotated = try ringB.rotate(nowMilliseconds: 3_000)
        #expect(ringA.activeKeyID == rotated)
        let fresh = try ringA.sign(claims)
        #expect(fresh != old)
        #expect((try? ringB.verify(fresh, nowSeconds: 2)) != nil)
        #expect((try? ringA.verify(old, nowSeconds: 2)) != nil)
        try ringA.retire(keyID: oldKey)
        #expect((try? ringB.verify(old, nowSeconds: 2)) == nil)
        #expect((try? ringA.verify(old, nowSeconds: 2)) == nil)
        #expect(ringB.keys.map(\.retired) == [true, false])

        // Two rotations at once from two rings: neither is lost (read-modify-write under one lock).
        let first = try ringA.rotate(nowMilliseconds: 4_000)
        let second = try ringB.rotate(nowMilliseconds: 5_000)
        #expect(Set(ringA.keys.map(\.keyID)).isSuperset(of: [first, second]))
        #expect(ringA.activeKeyID == second)

        // The cost of noticing a rotation: one point read of the version marker per sign or verify.
        let store = DatabaseShareKeyStore(storage: nodes.storage)
        let started = Date()
        for _ in 0..<1000 { _ = try store.version() }
        let microseconds = Date().timeIntervalSince(started) * 1000
        print("SeveralNodesTests: version marker read on SQLite: \(String(format: "%.1f", microseconds)) µs each (1000 reads)")
    }

    @Test func aKeyFileCopiedIntoTheDatabaseKeepsVerifyingItsLinks() throws {
        let directory = temporaryDirectory("lattice-keys")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let fileRing = try ShareKeyRing.open(directory: directory, nowMilliseconds: 1_000)
        let claims = ShareClaims(issuer: "https://lattice.example", shareID: "sh_1", zoneName: "Lists",
                                 ownerRecordName: "_owner", issuedAt: 1, tokenID: try ShareClaims.newTokenID(),
                                 permission: "readOnly", epoch: 1)
        let link = try fileRing.sign(claims)
        // What `lattice admin migrate` does: the file's text, as it is, into metadata share_keys.
        let nodes = try TwoNodes()
        let text = try String(contentsOfFile: fileRing.path, encoding: .utf8)
        try nodes.storage.write { try $0.setMetadata(DatabaseShareKeyStore.contentsKey, text) }
        let ring = try ShareKeyRing.open(store: DatabaseShareKeyStore(storage: nodes.storage), nowMilliseconds: 9_000)
        #expect(ring.activeKeyID == fileRing.activeKeyID)
        #expect(try ring.verify(link, nowSeconds: 2) == fileRing.verify(link, nowSeconds: 2))
        #expect(try ring.sign(claims) == link)
        // Corrupt contents are an error, never replaced.
        try nodes.storage.write { try $0.setMetadata(DatabaseShareKeyStore.contentsKey, "{}") }
        #expect(throws: ShareKeyRingError.self) {
            _ = try ShareKeyRing.open(store: DatabaseShareKeyStore(storage: nodes.storage), nowMilliseconds: 9_000)
        }
    }

    // MARK: Options and the public URL

    @Test func storageOptions() throws {
        #expect(try StorageLocation.fromOptions(data: "/d", database: nil, poolSize: nil, environment: [:]) == .dataDirectory("/d"))
        // --data wins over the environment; the environment serves when neither flag is given.
        let environment = [StorageLocation.databaseEnvironmentVariable: "postgresql://u:secret@h/db"]
        #expect(try StorageLocation.fromOptions(data: "/d", database: nil, poolSize: nil, environment: environment)
            == .dataDirectory("/d"))
        #expect(try StorageLocation.fromOptions(data: nil, database: nil, poolSize: 3, environment: environment)
            == .database(url: "postgresql://u:secret@h/db", poolSize: 3))
        #expect(try StorageLocation.fromOptions(data: nil, database: "host=/tmp dbname=x", poolSize: nil, environment: [:])
            == .database(url: "host=/tmp dbname=x", poolSize: StorageLocation.defaultPoolSize))
        #expect(StorageLocation.defaultPoolSize == 2 * ProcessInfo.processInfo.activeProcessorCount)
        for (data, database, pool) in [("/d", "postgres://h/db", nil), (nil, nil, nil), ("/d", nil, 4), (nil, "postgres://h/db", 0),
                                       (nil, " ", nil)] as [(String?, String?, Int?)] {
            #expect(throws: StorageLocation.OptionProblem.self) {
                _ = try StorageLocation.fromOptions(data: data, database: database, poolSize: pool, environment: [:])
            }
        }
        #expect(StorageLocation.nodeNameProblem("node-a.1_b") == nil)
        for bad in ["", "a b", "a/b", String(repeating: "n", count: 65), "é"] {
            #expect(StorageLocation.nodeNameProblem(bad) != nil, "\(bad)")
        }
    }

    @Test func theFirstNodeStoresThePublicURLAndANodeWithAnotherIsRefused() throws {
        let nodes = try TwoNodes()
        try OpenedDeployment.checkPublicURL("https://lattice.example", storage: nodes.storage)
        try OpenedDeployment.checkPublicURL("https://lattice.example", storage: nodes.storage)
        do {
            try OpenedDeployment.checkPublicURL("http://127.0.0.1:8081", storage: nodes.storage)
            Issue.record("a second URL was accepted")
        } catch let failure as OpenedDeployment.Failure {
            #expect(failure.description.contains("http://127.0.0.1:8081") && failure.description.contains("https://lattice.example"))
        }
        #expect(try nodes.storage.read { try $0.metadata(OpenedDeployment.publicURLKey) } == "https://lattice.example")
    }

    @Test func purgeRunsUnderItsTryLock() throws {
        // SQLite's one process always gets the lock (PostgreSQL's skip is PostgresNodesTests'); the purge
        // runs inside the locked write.
        let nodes = try TwoNodes()
        #expect(try nodes.a.purgeUnlessRunningElsewhere() != nil)
    }

    // MARK: The command line

    @Test func serveAndAdminRefuseConflictingOrIncompleteStorageOptions() throws {
        let data = temporaryDirectory("lattice-options")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let both = try CLITests.lattice("serve", "--data", data, "--database", "postgresql://u:hunter2@127.0.0.1:1/db",
                                        "--port", "0")
        #expect(both.status == 2 && both.stderr.contains("not both"), "\(both)")
        let noURL = try CLITests.lattice("serve", "--database", "postgresql://u:hunter2@127.0.0.1:1/db", "--port", "0")
        #expect(noURL.status == 2 && noURL.stderr.contains("--public-url is required with --database"), "\(noURL)")
        let badName = try CLITests.lattice("serve", "--data", data, "--node-name", "a/b", "--port", "0")
        #expect(badName.status == 2 && badName.stderr.contains("--node-name"), "\(badName)")
        let poolWithData = try CLITests.lattice("admin", "share-keys", "--data", data, "--database-pool", "3")
        #expect(poolWithData.status == 2 && poolWithData.stderr.contains("--database-pool goes with --database"))
        let adminBoth = try CLITests.lattice("admin", "tokens", "ann", "--data", data, "--database", "postgresql:///x")
        #expect(adminBoth.status == 2 && adminBoth.stderr.contains("not both"), "\(adminBoth)")
        for outcome in [both, noURL, badName, poolWithData, adminBoth] {
            #expect(!outcome.stderr.contains("hunter2") && !outcome.stdout.contains("hunter2"))
        }
        let help = try CLITests.lattice("serve", "--help")
        #expect(help.status == 0 && help.stdout.contains("--database URL") && help.stdout.contains("--node-name NAME")
            && help.stdout.contains("--database-pool N"))
    }

    @Test func anUnreachableDatabaseIsReportedWithoutItsPassword() throws {
        // Nothing listens on port 1: the connection fails, and the message names the URL redacted.
        let outcome = try CLITests.lattice("serve", "--database", "postgresql://lattice:hunter2@127.0.0.1:1/lattice",
                                           "--public-url", "http://127.0.0.1:8080", "--port", "0")
        #expect(outcome.status == 1, "\(outcome)")
        #expect(!outcome.stderr.contains("hunter2") && !outcome.stdout.contains("hunter2"), "\(outcome)")
        let admin = try CLITests.lattice("admin", "share-keys", "--database", "postgresql://lattice:hunter2@127.0.0.1:1/lattice")
        #expect(admin.status == 1 && !admin.stderr.contains("hunter2"), "\(admin)")
    }
}

/// The node clock's lease (NodeClockLease) through the service, on any backend: the node's row is written
/// when the clock passes its reservation and not on every write, and a node restarted after it was killed
/// (nothing saved at the end: a new service on the storage, as a new process would open it), with its wall
/// clock set back a minute, still stamps above everything the killed one committed.
enum ClockLeaseCheck {
    static func run(_ storage: any Storage, label: String) throws {
        let wall = Atomic<Int64>(1_900_000_000_000)
        var configuration = ServiceConfiguration()
        configuration.nodeName = "lease"
        configuration.rateLimit = nil
        configuration.signUpsPerAddress = nil
        configuration.signUpsGlobal = nil
        configuration.now = { wall.load(ordering: .sequentiallyConsistent) }
        func write(_ service: LatticeService, _ name: String, token: String) throws {
            let (status, json) = PostgresNodesTests.post(service, "/database/1/lattice/production/private/records/modify", .object([
                "zoneID": .object(["zoneName": .string("_defaultZone")]),
                "operations": .array([operation("forceReplace", name, fields: ["n": .object(["value": .string(name)])])]),
            ]), token: token)
            guard status == 200, json["records"]?.arrayValue?.first?["serverErrorCode"] == nil else {
                throw HarnessError("\(label) write: \(json.serialized())")
            }
        }
        func mark() throws -> Int64 { try #require(try storage.read { try $0.node(named: "lease") }).clockLatest }
        let lease = NodeClockLease.defaultLeaseMilliseconds

        let first = try LatticeService(storage: storage, configuration: configuration, log: { _ in })
        let (status, signup) = PostgresNodesTests.post(first, "/auth/signup", .object(["name": .string("lea")]))
        let token = try #require(signup["token"]?.stringValue, "\(label): signup \(status) \(signup.serialized())")
        try write(first, "r0", token: token)
        // The first write reserved `lease` ahead of the wall clock.
        let reserved = try mark()
        #expect(reserved == Int64(HLC(milliseconds: UInt64(wall.load(ordering: .sequentiallyConsistent) + lease), counter: 0).rawValue),
                "\(label)")
        // Writes inside the reservation leave the row alone.
        for index in 1...20 {
            wall.add(100, ordering: .sequentiallyConsistent)
            try write(first, "r\(index)", token: token)
        }
        #expect(try mark() == reserved, "\(label): the row moved inside its reservation")
        #expect(Int64(first.core.clock.withLock { $0.latest.rawValue }) <= reserved, "\(label)")
        // Past the reservation, a write moves it on.
        wall.add(lease, ordering: .sequentiallyConsistent)
        try write(first, "r21", token: token)
        let moved = try mark()
        #expect(moved > reserved, "\(label)")
        let stamped = first.core.clock.withLock { $0.latest.rawValue }
        #expect(Int64(stamped) <= moved, "\(label)")

        // Killed (nothing more is written), restarted with the wall clock a minute behind.
        wall.add(-60_000, ordering: .sequentiallyConsistent)
        let second = try LatticeService(storage: storage, configuration: configuration, log: { _ in })
        #expect(second.replicaID == first.replicaID, "\(label)")
        let next = second.core.tick()
        #expect(next.hlc.rawValue > stamped, "\(label): the restarted clock went back: \(next.hlc.rawValue) <= \(stamped)")
        // Its writes still commit and stamp above the old ones.
        try write(second, "r0", token: token)
        #expect(second.core.clock.withLock { $0.latest.rawValue } > stamped, "\(label)")
        #expect(try mark() >= Int64(second.core.clock.withLock { $0.latest.rawValue }), "\(label)")
    }
}

extension SeveralNodesTests {
    @Test func aRestartedNodeStampsAboveEverythingItCommittedBeforeItWasKilled() throws {
        let directory = temporaryDirectory("lattice-lease")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let storage = try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
        defer { storage.close() }
        try ClockLeaseCheck.run(storage, label: "sqlite")
    }
}
