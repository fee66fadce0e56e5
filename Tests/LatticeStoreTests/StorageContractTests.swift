import Foundation
import LatticeCore
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing

/// One storage backend under test: a name for the report and a factory for a fresh, empty store.
struct StorageBackend: Sendable, CustomTestStringConvertible {
    let name: String
    /// Opens a fresh, empty store. A file-based backend keeps its files under `directory`, which the
    /// suite creates for the test and removes afterwards.
    let make: @Sendable (_ directory: String) throws -> any Storage

    var testDescription: String { name }
}

/// Every backend the contract runs against. A new backend adds one line here.
enum StorageBackends {
    static let sqlite = StorageBackend(name: "SQLite") { directory in
        try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
    }

    /// A fresh database per test on the cluster in `LATTICE_TEST_POSTGRES_URL` (copied from a template migrated
    /// once), dropped when the store closes. Without the variable every PostgreSQL case fails, saying how to
    /// get a cluster (Scripts/test.sh starts one).
    static let postgres = StorageBackend(name: "PostgreSQL") { _ in
        try PostgresTestDatabase.create().openStorage(poolSize: 2)
    }

    static let all: [StorageBackend] = [sqlite, postgres]
}

/// The behaviour every `Storage` backend must have, operation by operation. Each test runs once per backend.
@Suite("Storage contract")
struct StorageContractTests {
    // MARK: Fixtures

    /// Runs `body` on a fresh store of `backend`, then closes it and removes its files.
    private func withStorage<T>(_ backend: StorageBackend, _ body: (any Storage) throws -> T) throws -> T {
        let directory = NSTemporaryDirectory() + "lattice-contract-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let storage = try backend.make(directory)
        defer { storage.close() }
        return try body(storage)
    }

    private static let ann = "_00000000000000000000000000000a11"
    private static let bob = "_00000000000000000000000000000b0b"
    private static let carl = "_00000000000000000000000000000ca1"

    private func privateKey(_ ownerID: Int64 = 1) -> DatabaseKey {
        DatabaseKey(kind: .private, environment: "production", ownerID: ownerID)
    }

    /// A live zone in ann's private database.
    private func makeZone(_ tx: any StorageTransaction, _ name: String = "Lists", nowMs: Int64 = 1_000) throws -> StoredZone {
        let database = try tx.database(privateKey())
        return try tx.createZone(databaseID: database.id, name: name, ownerRecordName: Self.ann, nowMs: nowMs)
    }

    private func write(_ name: String, type: String = "Item", frame: [UInt8] = [1, 2, 3], deleted: Bool = false,
                       parent: String? = nil, by user: String = ann, at nowMs: Int64 = 2_000) -> RecordWrite {
        RecordWrite(recordName: name, recordType: type, frame: frame, deleted: deleted, parentName: parent,
                    userRecordName: user, nowMs: nowMs)
    }

    private func share(_ zone: StoredZone, _ publicID: String, record: String, root: String? = nil, ownerID: Int64,
                       permission: SharePermission = .none, nowMs: Int64 = 3_000) -> NewShare {
        NewShare(publicID: publicID, zoneRowID: zone.rowID, recordName: record, rootRecordName: root, ownerID: ownerID,
                 title: "Trip", publicPermission: permission, nowMs: nowMs)
    }

    private func expectDuplicate(_ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) {
        let error = #expect(throws: StorageError.self, sourceLocation: sourceLocation) { try body() }
        if let error, case .duplicate = error { return }
        if let error { Issue.record("expected StorageError.duplicate, got \(error)", sourceLocation: sourceLocation) }
    }

    private struct Marker: Error, Equatable {}

    /// The error `body` throws, or nil.
    private func thrownError(_ body: () throws -> Void) -> (any Error)? {
        do {
            try body()
            return nil
        } catch {
            return error
        }
    }

    private func isDuplicate(_ error: (any Error)?) -> Bool {
        if case StorageError.duplicate? = error as? StorageError { return true }
        return false
    }

    // MARK: Metadata

    @Test(arguments: StorageBackends.all)
    func metadataIsAbsentUntilSetAndSetOverwrites(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            #expect(try storage.read { try $0.metadata("schema-note") } == nil)
            try storage.write { tx throws in
                try tx.setMetadata("schema-note", "first")
                try tx.setMetadata("other", "x")
                #expect(try tx.metadata("schema-note") == "first")
            }
            try storage.write { try $0.setMetadata("schema-note", "second") }
            try storage.read { tx throws in
                #expect(try tx.metadata("schema-note") == "second")
                #expect(try tx.metadata("other") == "x")
                #expect(try tx.metadata("Schema-Note") == nil)
            }
        }
    }

    // MARK: Users and tokens

    @Test(arguments: StorageBackends.all)
    func usersAreFoundByEveryKeyAndNamesAreUnique(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (ann, bob) = try storage.write { tx throws in
                (try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 10),
                 try tx.insertUser(name: "bob", recordName: Self.bob, nowMs: 20))
            }
            #expect(ann.name == "ann" && ann.recordName == Self.ann && ann.createdMs == 10)
            #expect(bob.name == "bob" && bob.recordName == Self.bob && bob.createdMs == 20)
            #expect(ann.id != bob.id)
            try storage.read { tx throws in
                #expect(try tx.user(named: "ann") == ann)
                #expect(try tx.user(recordName: Self.bob) == bob)
                #expect(try tx.user(id: ann.id) == ann)
                #expect(try tx.user(named: "carl") == nil)
                #expect(try tx.user(recordName: Self.carl) == nil)
                #expect(try tx.user(id: max(ann.id, bob.id) + 100) == nil)
            }
            expectDuplicate { try storage.write { _ = try $0.insertUser(name: "ann", recordName: Self.carl, nowMs: 30) } }
            expectDuplicate { try storage.write { _ = try $0.insertUser(name: "carl", recordName: Self.ann, nowMs: 30) } }
            // Neither refused insert left a row behind.
            #expect(try storage.read { try $0.user(recordName: Self.carl) } == nil)
            #expect(try storage.read { try $0.user(named: "carl") } == nil)
        }
    }

    /// A user name is taken whatever its case and look-alikes (`StorageRules.userNameKey`): "Ann" and "ANN"
    /// are "ann", and so is "Ann" spelled with a capital I for the l of "bill" or a zero for an o; looking a
    /// name up finds the account its key names, the exact name first.
    @Test(arguments: StorageBackends.all)
    func userNamesAreUniqueWhateverTheirCaseAndLookAlikes(_ backend: StorageBackend) throws {
        #expect(StorageRules.userNameKey("Mom") == StorageRules.userNameKey("mom"))
        #expect(StorageRules.userNameKey("biIl") == StorageRules.userNameKey("bill"))
        #expect(StorageRules.userNameKey("bi1l") == StorageRules.userNameKey("bill"))
        #expect(StorageRules.userNameKey("j0e") == StorageRules.userNameKey("Joe"))
        #expect(StorageRules.userNameKey("rnary") == StorageRules.userNameKey("mary"))
        #expect(StorageRules.userNameKey("ann") != StorageRules.userNameKey("anna"))
        try withStorage(backend) { storage in
            let mom = try storage.write { try $0.insertUser(name: "mom", recordName: Self.ann, nowMs: 1) }
            for taken in ["Mom", "MOM", "rnom", "m0m"] {
                expectDuplicate { try storage.write { _ = try $0.insertUser(name: taken, recordName: Self.bob, nowMs: 2) } }
            }
            #expect(try storage.read { try $0.user(recordName: Self.bob) } == nil)
            #expect(try storage.read { try $0.user(named: "MOM") } == mom)
            #expect(try storage.read { try $0.user(named: "mum") } == nil)
            // The key is kept in SQL by the same rule (the migration keys the names a database holds).
            let keyed = try storage.read { tx throws in
                var rows: [[StorageValue]] = []
                try tx.exportRows(table: "users") { rows += $0 }
                return rows
            }
            #expect(keyed.first?.last == .text(StorageRules.userNameKey("mom")))
        }
    }

    @Test(arguments: StorageBackends.all)
    func tokensFindTheirUserAndHashesAreUnique(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let hash: [UInt8] = Array(repeating: 7, count: 32)
            let (ann, bob) = try storage.write { tx throws in
                let ann = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 10)
                let bob = try tx.insertUser(name: "bob", recordName: Self.bob, nowMs: 10)
                try tx.insertToken(hash: hash, userID: ann.id, nowMs: 11)
                try tx.insertToken(hash: [0] + hash.dropFirst(), userID: bob.id, nowMs: 11)
                return (ann, bob)
            }
            try storage.read { tx throws in
                #expect(try tx.user(tokenHash: hash) == ann)
                #expect(try tx.user(tokenHash: [0] + hash.dropFirst()) == bob)
                #expect(try tx.user(tokenHash: Array(repeating: 8, count: 32)) == nil)
                #expect(try tx.user(tokenHash: []) == nil)
            }
            expectDuplicate { try storage.write { try $0.insertToken(hash: hash, userID: bob.id, nowMs: 12) } }
            #expect(try storage.read { try $0.user(tokenHash: hash) } == ann)
        }
    }

    @Test(arguments: StorageBackends.all)
    func tokensHaveIdsExpiriesAndCanBeRevoked(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (ann, bob) = try storage.write { tx throws in
                let ann = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 10)
                let bob = try tx.insertUser(name: "bob", recordName: Self.bob, nowMs: 10)
                try tx.insertToken(NewToken(hash: [1], id: "t-ann-1", userID: ann.id, createdMs: 20))
                try tx.insertToken(NewToken(hash: [2], id: "t-ann-2", userID: ann.id, createdMs: 30, expiresMs: 5_000))
                try tx.insertToken(NewToken(hash: [3], id: "t-bob-1", userID: bob.id, createdMs: 25))
                return (ann, bob)
            }
            let annFirst = StoredToken(id: "t-ann-1", userID: ann.id, createdMs: 20, expiresMs: nil)
            let annSecond = StoredToken(id: "t-ann-2", userID: ann.id, createdMs: 30, expiresMs: 5_000)
            try storage.read { tx throws in
                #expect(try tx.tokens(userID: ann.id) == [annFirst, annSecond])
                #expect(try tx.token(id: "t-ann-2") == annSecond)
                #expect(try tx.token(id: "nope") == nil)
                // The owner comes with the token, expired or not: the caller decides about expiry.
                let found = try #require(try tx.tokenOwner(hash: [2]))
                #expect(found.token == annSecond && found.user == ann)
                #expect(try tx.tokenOwner(hash: [3])?.user == bob)
                #expect(try tx.tokenOwner(hash: [9]) == nil)
            }
            // A taken id is a duplicate, like a taken hash.
            expectDuplicate { try storage.write { try $0.insertToken(NewToken(hash: [4], id: "t-ann-1", userID: bob.id, createdMs: 1)) } }
            expectDuplicate { try storage.write { try $0.insertToken(NewToken(hash: [1], id: "fresh", userID: bob.id, createdMs: 1)) } }
            // Revocation: by id, then all of a user's; gone at once for lookups by hash.
            #expect(try storage.write { try $0.deleteToken(id: "t-ann-1") })
            #expect(try storage.write { try $0.deleteToken(id: "t-ann-1") } == false)
            #expect(try storage.read { try $0.tokenOwner(hash: [1]) } == nil)
            #expect(try storage.read { try $0.user(tokenHash: [1]) } == nil)
            #expect(try storage.write { try $0.deleteTokens(userID: ann.id) } == 1)
            try storage.read { tx throws in
                #expect(try tx.tokens(userID: ann.id).isEmpty)
                #expect(try tx.tokenOwner(hash: [2]) == nil)
                #expect(try tx.tokens(userID: bob.id).map(\.id) == ["t-bob-1"])
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func tokensKeepTheirDeviceName(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let ann = try storage.write { tx throws in
                let ann = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 10)
                try tx.insertToken(NewToken(hash: [1], id: "d-1", userID: ann.id, createdMs: 20, name: "phone"))
                try tx.insertToken(NewToken(hash: [2], id: "plain", userID: ann.id, createdMs: 30))
                return ann
            }
            try storage.read { tx throws in
                #expect(try tx.tokens(userID: ann.id).map(\.name) == ["phone", nil])
                #expect(try tx.token(id: "d-1")?.name == "phone")
                #expect(try tx.tokenOwner(hash: [1])?.token == StoredToken(id: "d-1", userID: ann.id, createdMs: 20,
                                                                             expiresMs: nil, name: "phone"))
                #expect(try tx.tokenOwner(hash: [1])?.user == ann)
            }
        }
    }

    // MARK: Device authorizations

    private func deviceAuthorization(_ byte: UInt8, address: String = "10.0.0.1", name: String = "phone",
                                     createdMs: Int64 = 1_000, expiresMs: Int64 = 601_000) -> NewDeviceAuthorization {
        NewDeviceAuthorization(deviceCodeHash: Array(repeating: byte, count: 32), userCodeHash: Array(repeating: byte &+ 100, count: 32),
                               address: address, deviceName: name, intervalSeconds: 5, createdMs: createdMs,
                               expiresMs: expiresMs)
    }

    @Test(arguments: StorageBackends.all)
    func deviceAuthorizationsAreFoundByEitherHashCountedAndForgottenWhenExpired(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { tx throws in
                try tx.insertDeviceAuthorization(deviceAuthorization(1))
                try tx.insertDeviceAuthorization(deviceAuthorization(2, address: "10.0.0.2", expiresMs: 300_000))
                try tx.insertDeviceAuthorization(deviceAuthorization(3))
            }
            let expected = StoredDeviceAuthorization(
                deviceCodeHash: Array(repeating: 1, count: 32), userCodeHash: Array(repeating: 101, count: 32),
                address: "10.0.0.1", deviceName: "phone", status: .pending, userID: nil, intervalSeconds: 5, lastPollMs: 0,
                createdMs: 1_000, expiresMs: 601_000)
            try storage.read { tx throws in
                #expect(try tx.deviceAuthorization(deviceCodeHash: Array(repeating: 1, count: 32)) == expected)
                #expect(try tx.deviceAuthorization(userCodeHash: Array(repeating: 101, count: 32)) == expected)
                #expect(try tx.deviceAuthorization(deviceCodeHash: Array(repeating: 101, count: 32)) == nil)
                #expect(try tx.deviceAuthorization(userCodeHash: Array(repeating: 1, count: 32)) == nil)
                #expect(try tx.liveDeviceAuthorizations(address: "10.0.0.1", nowMs: 2_000) == 2)
                #expect(try tx.liveDeviceAuthorizations(address: "10.0.0.2", nowMs: 2_000) == 1)
                #expect(try tx.liveDeviceAuthorizations(address: nil, nowMs: 2_000) == 3)
                // Expired at expiresMs exactly.
                #expect(try tx.liveDeviceAuthorizations(address: nil, nowMs: 300_000) == 2)
                #expect(try tx.liveDeviceAuthorizations(address: "10.0.0.9", nowMs: 2_000) == 0)
            }
            // Either code taken is a duplicate, and the write stays usable.
            var taken = deviceAuthorization(9)
            taken.userCodeHash = Array(repeating: 101, count: 32)
            expectDuplicate { try storage.write { try $0.insertDeviceAuthorization(taken) } }
            var takenDevice = deviceAuthorization(1)
            takenDevice.userCodeHash = Array(repeating: 50, count: 32)
            expectDuplicate { try storage.write { try $0.insertDeviceAuthorization(takenDevice) } }
            try storage.write { tx throws in
                #expect(throws: StorageError.self) { try tx.savepoint { try tx.insertDeviceAuthorization(taken) } }
                try tx.insertDeviceAuthorization(deviceAuthorization(4))
            }
            #expect(try storage.write { try $0.forgetDeviceAuthorizations(expiredAt: 300_000) } == 1)
            try storage.read { tx throws in
                #expect(try tx.deviceAuthorization(deviceCodeHash: Array(repeating: 2, count: 32)) == nil)
                #expect(try tx.liveDeviceAuthorizations(address: nil, nowMs: 0) == 3)
                #expect(try tx.rowCount(table: "device_authorizations") == 3)
            }
            #expect(try storage.write { try $0.forgetDeviceAuthorizations(expiredAt: 601_000) } == 3)
            #expect(try storage.read { try $0.rowCount(table: "device_authorizations") } == 0)
        }
    }

    @Test(arguments: StorageBackends.all)
    func aDeviceAuthorizationIsDecidedOnceAndClaimedOnce(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let device = Array(repeating: UInt8(1), count: 32), user = Array(repeating: UInt8(101), count: 32)
            let denied = Array(repeating: UInt8(2), count: 32), deniedUser = Array(repeating: UInt8(102), count: 32)
            try storage.write { tx throws in
                try tx.insertDeviceAuthorization(deviceAuthorization(1))
                try tx.insertDeviceAuthorization(deviceAuthorization(2))
                try tx.insertDeviceAuthorization(deviceAuthorization(3, expiresMs: 5_000))
            }
            // Nothing to claim while pending.
            #expect(try storage.write { try $0.claimDeviceAuthorization(deviceCodeHash: device, nowMs: 2_000) } == nil)
            try storage.write { tx throws in
                try tx.recordDevicePoll(deviceCodeHash: device, nowMs: 2_000, intervalSeconds: 10)
                #expect(try tx.deviceAuthorization(deviceCodeHash: device)?.lastPollMs == 2_000)
                #expect(try tx.deviceAuthorization(deviceCodeHash: device)?.intervalSeconds == 10)
            }
            // Decided once: a second decision changes nothing; an expired one cannot be decided.
            #expect(try storage.write { try $0.decideDeviceAuthorization(userCodeHash: user, approve: true, userID: 7,
                                                                        deviceName: "laptop", nowMs: 3_000) })
            #expect(try storage.write { try $0.decideDeviceAuthorization(userCodeHash: user, approve: false, userID: 8,
                                                                        deviceName: nil, nowMs: 3_000) } == false)
            #expect(try storage.write { try $0.decideDeviceAuthorization(userCodeHash: deniedUser, approve: false, userID: 8,
                                                                        deviceName: nil, nowMs: 3_000) })
            #expect(try storage.write { try $0.decideDeviceAuthorization(userCodeHash: Array(repeating: 103, count: 32),
                                                                        approve: true, userID: 7, deviceName: nil,
                                                                        nowMs: 5_000) } == false)
            try storage.read { tx throws in
                let approved = try #require(try tx.deviceAuthorization(deviceCodeHash: device))
                #expect(approved.status == .approved && approved.userID == 7 && approved.deviceName == "laptop")
                let refused = try #require(try tx.deviceAuthorization(deviceCodeHash: denied))
                #expect(refused.status == .denied && refused.userID == 8 && refused.deviceName == "phone")
                #expect(try tx.deviceAuthorization(userCodeHash: Array(repeating: 103, count: 32))?.status == .pending)
            }
            // A denied one is never claimed; an approved one once, and not after it expired.
            #expect(try storage.write { try $0.claimDeviceAuthorization(deviceCodeHash: denied, nowMs: 4_000) } == nil)
            #expect(try storage.write { try $0.claimDeviceAuthorization(deviceCodeHash: device, nowMs: 601_000) } == nil)
            let claimed = try storage.write { try $0.claimDeviceAuthorization(deviceCodeHash: device, nowMs: 4_000) }
            #expect(claimed?.status == .issued && claimed?.userID == 7 && claimed?.deviceName == "laptop")
            #expect(try storage.write { try $0.claimDeviceAuthorization(deviceCodeHash: device, nowMs: 4_000) } == nil)
            #expect(try storage.read { try $0.deviceAuthorization(deviceCodeHash: device)?.status } == .issued)
        }
    }

    /// Racing decisions and claims, each in its own write transaction on its own thread (on PostgreSQL, on
    /// separate connections at once): exactly one of each wins.
    @Test(arguments: StorageBackends.all)
    func racingDecisionsAndClaimsOfOneDeviceAuthorizationHaveOneWinner(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            for round in UInt8(1)...UInt8(6) {
                try storage.write { try $0.insertDeviceAuthorization(deviceAuthorization(round)) }
                let device = Array(repeating: round, count: 32), user = Array(repeating: round &+ 100, count: 32)
                let decided = Mutex<[Int64]>([]), claimed = Mutex<Int>(0), failures = Mutex<[String]>([])
                let group = DispatchGroup()
                for account in Int64(1)...4 {
                    group.enter()
                    Thread {
                        defer { group.leave() }
                        do {
                            if try storage.write({ tx in
                                try tx.decideDeviceAuthorization(userCodeHash: user, approve: true, userID: account,
                                                                 deviceName: nil, nowMs: 2_000)
                            }) { decided.withLock { $0.append(account) } }
                        } catch {
                            failures.withLock { $0.append("\(error)") }
                        }
                    }.start()
                }
                #expect(group.wait(timeout: .now() + 60) == .success)
                for _ in 0..<4 {
                    group.enter()
                    Thread {
                        defer { group.leave() }
                        do {
                            if try storage.write({ try $0.claimDeviceAuthorization(deviceCodeHash: device, nowMs: 3_000) }) != nil {
                                claimed.withLock { $0 += 1 }
                            }
                        } catch {
                            failures.withLock { $0.append("\(error)") }
                        }
                    }.start()
                }
                #expect(group.wait(timeout: .now() + 60) == .success)
                #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0 })")
                let winners = decided.withLock { $0 }
                #expect(winners.count == 1, "round \(round): \(winners)")
                #expect(claimed.withLock { $0 } == 1, "round \(round)")
                #expect(try storage.read { try $0.deviceAuthorization(deviceCodeHash: device)?.userID } == winners.first)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func failedDeviceApprovalsAreCountedPerKeyInAWindow(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { tx throws in
                for at in [Int64(100), 200, 300] { try tx.recordDeviceApprovalFailure(key: "user:1", nowMs: at) }
                try tx.recordDeviceApprovalFailure(key: "ip:10.0.0.1", nowMs: 250)
            }
            try storage.read { tx throws in
                #expect(try tx.deviceApprovalFailures(key: "user:1", sinceMs: 0) == SignUpWindow(count: 3, oldestMs: 100))
                #expect(try tx.deviceApprovalFailures(key: "user:1", sinceMs: 200) == SignUpWindow(count: 2, oldestMs: 200))
                #expect(try tx.deviceApprovalFailures(key: "ip:10.0.0.1", sinceMs: 0) == SignUpWindow(count: 1, oldestMs: 250))
                #expect(try tx.deviceApprovalFailures(key: "user:2", sinceMs: 0) == SignUpWindow(count: 0, oldestMs: nil))
            }
            try storage.write { try $0.forgetDeviceApprovalFailures(before: 250) }
            try storage.read { tx throws in
                #expect(try tx.deviceApprovalFailures(key: "user:1", sinceMs: 0) == SignUpWindow(count: 1, oldestMs: 300))
                #expect(try tx.deviceApprovalFailures(key: "ip:10.0.0.1", sinceMs: 0).count == 1)
                #expect(try tx.rowCount(table: "device_approval_failures") == 2)
            }
        }
    }

    // MARK: Sign-ups

    @Test(arguments: StorageBackends.all)
    func signUpsAreCountedPerAddressAndInAllInAWindow(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { tx throws in
                try tx.recordSignUp(address: "10.0.0.1", nowMs: 100)
                try tx.recordSignUp(address: "10.0.0.1", nowMs: 200)
                try tx.recordSignUp(address: "10.0.0.2", nowMs: 150)
                try tx.recordSignUp(address: "10.0.0.1", nowMs: 300)
            }
            try storage.read { tx throws in
                #expect(try tx.signUps(address: "10.0.0.1", sinceMs: 0) == SignUpWindow(count: 3, oldestMs: 100))
                #expect(try tx.signUps(address: "10.0.0.1", sinceMs: 150) == SignUpWindow(count: 2, oldestMs: 200))
                #expect(try tx.signUps(address: "10.0.0.1", sinceMs: 200) == SignUpWindow(count: 2, oldestMs: 200))
                #expect(try tx.signUps(address: nil, sinceMs: 0) == SignUpWindow(count: 4, oldestMs: 100))
                #expect(try tx.signUps(address: nil, sinceMs: 120) == SignUpWindow(count: 3, oldestMs: 150))
                #expect(try tx.signUps(address: "10.0.0.3", sinceMs: 0) == SignUpWindow(count: 0, oldestMs: nil))
                #expect(try tx.signUps(address: nil, sinceMs: 301) == SignUpWindow(count: 0, oldestMs: nil))
            }
            try storage.write { try $0.forgetSignUps(before: 200) }
            try storage.read { tx throws in
                #expect(try tx.signUps(address: nil, sinceMs: 0) == SignUpWindow(count: 2, oldestMs: 200))
                #expect(try tx.signUps(address: "10.0.0.2", sinceMs: 0).count == 0)
            }
        }
    }

    // MARK: Databases

    @Test(arguments: StorageBackends.all)
    func databasesAreCreatedOnFirstUseInAWrite(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let key = privateKey(5)
            // A read sees a database that does not exist yet as empty, and does not create it.
            let unseen = try storage.read { try $0.database(key) }
            #expect(unseen == StoredDatabase(id: 0, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0))
            let created = try storage.write { try $0.database(key) }
            #expect(created.id != 0)
            #expect(created == StoredDatabase(id: created.id, key: key, lastSeq: 0, purgedSeq: 0, bytesUsed: 0))
            let others = try storage.write { tx throws in
                [try tx.database(DatabaseKey(kind: .shared, environment: "production", ownerID: 5)),
                 try tx.database(DatabaseKey(kind: .private, environment: "development", ownerID: 5)),
                 try tx.database(privateKey(6)),
                 try tx.database(DatabaseKey(kind: .public, environment: "production", ownerID: 0))]
            }
            #expect(Set(others.map(\.id) + [created.id]).count == 5)
            try storage.read { tx throws in
                #expect(try tx.database(key) == created)
                #expect(try tx.database(id: created.id) == created)
                for database in others { #expect(try tx.database(id: database.id) == database) }
                #expect(try tx.database(id: (others.map(\.id) + [created.id]).max()! + 1) == nil)
            }
            #expect(try storage.write { try $0.database(key) } == created)
        }
    }

    // MARK: Zones

    @Test(arguments: StorageBackends.all)
    func zonesAreCreatedUniquelyAndDeletedForGood(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (lists, notes) = try storage.write { tx in (try makeZone(tx, "Lists", nowMs: 100), try makeZone(tx, "Notes", nowMs: 110)) }
            #expect(lists.name == "Lists" && lists.ownerRecordName == Self.ann && !lists.deleted)
            #expect(lists.lastSeq == 0 && lists.purgedSeq == 0 && lists.createdMs == 100 && lists.modifiedMs == 100)
            #expect(notes.databaseID == lists.databaseID && notes.rowID != lists.rowID)
            #expect(notes.databaseSeq > lists.databaseSeq)
            try storage.read { tx throws in
                #expect(try tx.zone(databaseID: lists.databaseID, name: "Lists") == lists)
                #expect(try tx.zone(rowID: notes.rowID) == notes)
                #expect(try tx.zone(databaseID: lists.databaseID, name: "lists") == nil)
                #expect(try tx.liveZones(databaseID: lists.databaseID).map(\.name) == ["Lists", "Notes"])
                #expect(try tx.database(id: lists.databaseID)?.lastSeq == notes.databaseSeq)
            }
            expectDuplicate {
                try storage.write { tx throws in
                    _ = try tx.createZone(databaseID: lists.databaseID, name: "Lists", ownerRecordName: Self.ann, nowMs: 120)
                }
            }
            // The same name in another database is another zone.
            let elsewhere = try storage.write { tx throws in
                try tx.createZone(databaseID: try tx.database(privateKey(2)).id, name: "Lists", ownerRecordName: Self.bob,
                                  nowMs: 130)
            }
            #expect(elsewhere.rowID != lists.rowID)

            try storage.write { tx throws in
                _ = try tx.saveRecord(zoneRowID: lists.rowID, write("a", frame: [1, 2, 3, 4]))
                try tx.deleteZone(rowID: lists.rowID, nowMs: 500)
            }
            let deleted = try #require(try storage.read { try $0.zone(rowID: lists.rowID) })
            try storage.read { tx throws in
                #expect(deleted.deleted && deleted.modifiedMs == 500 && deleted.name == "Lists")
                #expect(deleted.databaseSeq == (try tx.database(id: lists.databaseID)?.lastSeq))
                #expect(try tx.zone(databaseID: lists.databaseID, name: "Lists") == nil)
                #expect(try tx.liveZones(databaseID: lists.databaseID).map(\.name) == ["Notes"])
                #expect(try tx.record(zoneRowID: lists.rowID, name: "a") == nil)
                #expect(try tx.recordChanges(zoneRowID: lists.rowID, after: 0, limit: 10).isEmpty)
                // Its records' bytes are freed.
                #expect(try tx.database(id: lists.databaseID)?.bytesUsed == 0)
            }
            // Deleting again, or a missing zone, changes nothing.
            try storage.write { tx throws in
                try tx.deleteZone(rowID: lists.rowID, nowMs: 900)
                try tx.deleteZone(rowID: elsewhere.rowID + 1_000, nowMs: 900)
            }
            #expect(try storage.read { try $0.zone(rowID: lists.rowID) } == deleted)
            // A saved record needs a live zone.
            #expect(throws: StorageError.self) {
                try storage.write { _ = try $0.saveRecord(zoneRowID: lists.rowID, write("b")) }
            }
            // The name is free again, and the new zone is a new row.
            let again = try storage.write { tx in try makeZone(tx, "Lists", nowMs: 600) }
            #expect(again.rowID != lists.rowID && again.rowID != notes.rowID && again.rowID != elsewhere.rowID)
            #expect(again.lastSeq == 0 && again.databaseSeq > deleted.databaseSeq)
        }
    }

    /// `saveRecords` is `saveRecord` in a loop, with the counters moved once: the same rows, tags and
    /// creators, consecutive zone positions, one database position, the same bytes used.
    @Test(arguments: StorageBackends.all)
    func aBatchSaveEqualsSavingOneByOne(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (one, many) = try storage.write { tx in (try makeZone(tx, "One"), try makeZone(tx, "Many")) }
            // Both zones start with the same records: "b" live, "c" a tombstone created by bob.
            for zone in [one, many] {
                try storage.write { tx throws in
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("b", frame: [1], by: Self.bob, at: 10))
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("c", frame: [2], by: Self.bob, at: 11))
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("c", frame: [3], deleted: true, by: Self.bob, at: 12))
                }
            }
            let writes = [write("a", frame: [4, 4], at: 20), write("b", frame: [5, 5, 5], by: Self.carl, at: 21),
                          write("c", frame: [6], by: Self.carl, at: 22), write("d", frame: [7], deleted: true, at: 23)]
            let singly = try storage.write { tx in try writes.map { try tx.saveRecord(zoneRowID: one.rowID, $0) } }
            let batched = try storage.write { tx in
                try tx.saveRecords(zoneRowID: many.rowID, writes,
                                   previous: try writes.map { try tx.record(zoneRowID: many.rowID, name: $0.recordName) })
            }
            func comparable(_ record: StoredRecord) -> [String] {
                [record.recordName, record.recordType, "\(record.frame)", "\(record.deleted)", "\(record.createdMs)",
                 record.createdBy, "\(record.modifiedMs)", record.modifiedBy, record.parentName ?? "-"]
            }
            #expect(singly.map(comparable) == batched.map(comparable))
            // Positions follow the order given, consecutively, after the three earlier saves.
            #expect(batched.map(\.seq) == [4, 5, 6, 7])
            #expect(Set(batched.map(\.changeTag)).count == 4)
            // The creator rule: a save over a live record keeps its creator, one over a tombstone starts anew.
            #expect(batched[1].createdBy == Self.bob && batched[2].createdBy == Self.carl)
            try storage.read { tx throws in
                let zoneOne = try #require(try tx.zone(rowID: one.rowID)), zoneMany = try #require(try tx.zone(rowID: many.rowID))
                #expect(zoneOne.lastSeq == 7 && zoneMany.lastSeq == 7)
                // One database position for the batch: the zone's is the database's newest.
                #expect(zoneMany.databaseSeq == (try tx.database(id: many.databaseID)?.lastSeq))
                #expect(try tx.recordChanges(zoneRowID: many.rowID, after: 3, limit: 10).map(\.recordName) == ["a", "b", "c", "d"])
                for name in ["a", "b", "c", "d"] {
                    #expect(try tx.record(zoneRowID: many.rowID, name: name).map(comparable)
                            == (try tx.record(zoneRowID: one.rowID, name: name)).map(comparable))
                }
            }
            // Bytes used grow by the same amount either way: both zones hold the same frames.
            let used = try storage.read { try $0.database(id: one.databaseID)?.bytesUsed }
            #expect(used == Int64(2 * (2 + 3 + 1 + 1)))
        }
    }

    @Test(arguments: StorageBackends.all)
    func zoneChangesPageThroughTheDatabaseLogInOrder(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (a, b, c) = try storage.write { tx throws in
                (try makeZone(tx, "A"), try makeZone(tx, "B"), try makeZone(tx, "C"))
            }
            try storage.write { tx throws in
                _ = try tx.saveRecord(zoneRowID: a.rowID, write("r")) // A moves to the end of the log
                try tx.deleteZone(rowID: b.rowID, nowMs: 5_000)       // then B, deleted
            }
            let all = try storage.read { try $0.zoneChanges(databaseID: a.databaseID, after: 0, limit: 100) }
            #expect(all.map(\.rowID) == [c.rowID, a.rowID, b.rowID])
            #expect(all.map(\.deleted) == [false, false, true])
            #expect(all.map(\.databaseSeq) == all.map(\.databaseSeq).sorted() && Set(all.map(\.databaseSeq)).count == 3)
            #expect(all.last?.databaseSeq == (try storage.read { try $0.database(id: a.databaseID)?.lastSeq }))
            // Paging one at a time gives the same log.
            var paged: [StoredZone] = []
            var cursor: Int64 = 0
            for _ in 0..<10 {
                let page = try storage.read { try $0.zoneChanges(databaseID: a.databaseID, after: cursor, limit: 1) }
                #expect(page.count <= 1)
                guard let last = page.last else { break }
                paged += page
                cursor = last.databaseSeq
            }
            #expect(paged == all)
            #expect(try storage.read { try $0.zoneChanges(databaseID: a.databaseID, after: all[0].databaseSeq, limit: 100) }
                    == Array(all.dropFirst()))
            let other = try storage.write { try $0.database(privateKey(9)) }
            #expect(try storage.read { try $0.zoneChanges(databaseID: other.id, after: 0, limit: 100) }.isEmpty)
        }
    }

    // MARK: Records

    @Test(arguments: StorageBackends.all)
    func savesAllocateZoneAndDatabasePositionsAndNewTags(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let zone = try storage.write { tx in try makeZone(tx) }
            var saved: [StoredRecord] = []
            var zoneBefore = zone
            for (index, name) in ["r1", "r2", "r1", "r3", "r1"].enumerated() {
                let record = try storage.write { tx throws in
                    try tx.saveRecord(zoneRowID: zone.rowID, write(name, frame: Array(repeating: UInt8(index), count: index + 1),
                                                                   by: index == 0 ? Self.ann : Self.bob,
                                                                   at: 1_000 + Int64(index)))
                }
                let zoneAfter = try #require(try storage.read { try $0.zone(rowID: zone.rowID) })
                // The next position in the zone's log, and the zone moves to the end of its database's log.
                #expect(record.seq > zoneBefore.lastSeq && record.seq == zoneAfter.lastSeq)
                #expect(zoneAfter.databaseSeq > zoneBefore.databaseSeq)
                #expect(zoneAfter.databaseSeq == (try storage.read { try $0.database(id: zone.databaseID)?.lastSeq }))
                #expect(zoneAfter.modifiedMs == 1_000 + Int64(index))
                #expect(record.changeTag == StorageRules.changeTag(zoneRowID: zone.rowID, seq: record.seq))
                #expect(record.recordName == name && record.frame.count == index + 1)
                saved.append(record)
                zoneBefore = zoneAfter
            }
            #expect(Set(saved.map(\.changeTag)).count == saved.count)
            let r1 = try #require(try storage.read { try $0.record(zoneRowID: zone.rowID, name: "r1") })
            // The latest state, created by the first save, modified by the last.
            #expect(r1 == saved[4])
            #expect(r1.frame == [4, 4, 4, 4, 4] && r1.recordType == "Item" && !r1.deleted)
            #expect(r1.createdMs == 1_000 && r1.createdBy == Self.ann)
            #expect(r1.modifiedMs == 1_004 && r1.modifiedBy == Self.bob)
            // bytesUsed counts the current frames: r1 (5), r2 (2), r3 (4).
            #expect(try storage.read { try $0.database(id: zone.databaseID)?.bytesUsed } == 11)
            #expect(try storage.read { try $0.record(zoneRowID: zone.rowID, name: "r4") } == nil)
        }
    }

    @Test(arguments: StorageBackends.all)
    func aRecordSavedOverItsTombstoneHasANewCreator(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let zone = try storage.write { tx in try makeZone(tx) }
            func save(_ deleted: Bool, by user: String, at ms: Int64) throws -> StoredRecord {
                try storage.write { tx throws in
                    let previous = try tx.record(zoneRowID: zone.rowID, name: "r")
                    let change = write("r", deleted: deleted, by: user, at: ms)
                    let saved = try tx.saveRecord(zoneRowID: zone.rowID, change)
                    let rule = StorageRules.creation(of: change, replacing: previous)
                    #expect(saved.createdMs == rule.createdMs && saved.createdBy == rule.createdBy)
                    return saved
                }
            }
            let created = try save(false, by: Self.ann, at: 10)
            #expect(created.createdBy == Self.ann && created.createdMs == 10)
            let edited = try save(false, by: Self.bob, at: 20)
            #expect(edited.createdBy == Self.ann && edited.createdMs == 10 && edited.modifiedBy == Self.bob)
            let tombstone = try save(true, by: Self.bob, at: 30)
            #expect(tombstone.deleted && tombstone.createdBy == Self.ann && tombstone.createdMs == 10)
            // Deleting a tombstone again continues it.
            let again = try save(true, by: Self.carl, at: 40)
            #expect(again.createdBy == Self.ann && again.createdMs == 10 && again.modifiedBy == Self.carl)
            // Written live over the tombstone: a new record.
            let recreated = try save(false, by: Self.carl, at: 50)
            #expect(recreated.createdBy == Self.carl && recreated.createdMs == 50 && !recreated.deleted)
            #expect(try storage.read { try $0.record(zoneRowID: zone.rowID, name: "r") } == recreated)
            // A name never seen: created now by the writer, whether or not the write is a deletion.
            let fresh = try storage.write { tx throws in
                try tx.saveRecord(zoneRowID: zone.rowID, write("t", deleted: true, by: Self.bob, at: 60))
            }
            #expect(fresh.createdBy == Self.bob && fresh.createdMs == 60)
        }
    }

    @Test(arguments: StorageBackends.all)
    func recordsOfATypeAreLiveAndInNameOrder(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (zone, other) = try storage.write { tx throws in
                let zone = try makeZone(tx)
                let other = try makeZone(tx, "Other")
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("b", type: "Item"))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("a", type: "Item"))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("c", type: "List"))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("d", type: "Item", deleted: true))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("e", type: "Item"))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("e", type: "Item", deleted: true))
                _ = try tx.saveRecord(zoneRowID: other.rowID, write("a0", type: "Item"))
                return (zone, other)
            }
            try storage.read { tx throws in
                #expect(try tx.records(zoneRowID: zone.rowID, recordType: "Item").map(\.recordName) == ["a", "b"])
                #expect(try tx.records(zoneRowID: zone.rowID, recordType: nil).map(\.recordName) == ["a", "b", "c"])
                #expect(try tx.records(zoneRowID: zone.rowID, recordType: "List").map(\.recordName) == ["c"])
                #expect(try tx.records(zoneRowID: zone.rowID, recordType: "Nothing").isEmpty)
                #expect(try tx.records(zoneRowID: other.rowID, recordType: nil).map(\.recordName) == ["a0"])
                let a = try #require(try tx.record(zoneRowID: zone.rowID, name: "a"))
                #expect(try tx.records(zoneRowID: zone.rowID, recordType: "Item").first == a)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "d")?.deleted == true)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func recordChangesPageInCommitOrderWithTombstones(_ backend: StorageBackend) throws {
        let seed = UInt64.random(in: 1...UInt64.max)
        print("StorageContractTests.recordChangesPageInCommitOrderWithTombstones seed: \(seed)")
        var random = SplitMix64(seed: seed)
        try withStorage(backend) { storage in
            let zone = try storage.write { tx in try makeZone(tx) }
            // The expected log: each name at its latest position, with its latest state.
            var latest: [String: StoredRecord] = [:]
            for batch in 0..<12 {
                try storage.write { tx throws in
                    for _ in 0..<Int(random.next() % 6 + 1) {
                        let name = "r\(random.next() % 10)"
                        let frame = (0..<Int(random.next() % 8)).map { _ in UInt8(truncatingIfNeeded: random.next()) }
                        let saved = try tx.saveRecord(zoneRowID: zone.rowID,
                                                      write(name, frame: frame, deleted: random.next() % 4 == 0,
                                                            at: Int64(batch)))
                        latest[name] = saved
                    }
                }
            }
            let expected = latest.values.sorted { $0.seq < $1.seq }
            let all = try storage.read { try $0.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 1_000) }
            #expect(all == expected, "seed \(seed)")
            // Any page size gives the same log.
            for limit in [1, 2, 3, Int(random.next() % 5) + 1] {
                var paged: [StoredRecord] = []
                var cursor: Int64 = 0
                for _ in 0..<100 {
                    let page = try storage.read { try $0.recordChanges(zoneRowID: zone.rowID, after: cursor, limit: limit) }
                    #expect(page.count <= limit)
                    guard let last = page.last else { break }
                    paged += page
                    cursor = last.seq
                }
                #expect(paged == expected, "seed \(seed), limit \(limit)")
            }
            let end = try #require(expected.last?.seq)
            #expect(try storage.read { try $0.recordChanges(zoneRowID: zone.rowID, after: end, limit: 10) }.isEmpty)
            // Live records by name agree with the log.
            let live = expected.filter { !$0.deleted }.sorted { $0.recordName < $1.recordName }
            #expect(try storage.read { try $0.records(zoneRowID: zone.rowID, recordType: nil) } == live, "seed \(seed)")
            let bytes = latest.values.reduce(0) { $0 + Int64($1.frame.count) }
            #expect(try storage.read { try $0.database(id: zone.databaseID)?.bytesUsed } == bytes, "seed \(seed)")
        }
    }

    @Test(arguments: StorageBackends.all)
    func childrenAreTheLiveRecordsUnderAParent(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let zone = try storage.write { tx throws in
                let zone = try makeZone(tx)
                for (name, parent, deleted) in [("p", nil, false), ("c2", "p", false), ("c1", "p", false), ("c3", "q", false),
                                                ("c4", "p", true), ("c5", "p", false), ("c5", "q", false)] as [(String, String?, Bool)] {
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write(name, deleted: deleted, parent: parent))
                }
                return zone
            }
            try storage.read { tx throws in
                #expect(try tx.children(zoneRowID: zone.rowID, parentName: "p") == ["c1", "c2"])
                #expect(try tx.children(zoneRowID: zone.rowID, parentName: "q") == ["c3", "c5"])
                #expect(try tx.children(zoneRowID: zone.rowID, parentName: "c1").isEmpty)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "c5")?.parentName == "q")
                #expect(try tx.record(zoneRowID: zone.rowID, name: "p")?.parentName == nil)
            }
        }
    }

    /// The counts stand for the reads (`recordCount` for `records`, `childCount` for `children`): live records
    /// only, per type or all types, per parent, per zone; seen inside the write that made them; none once the
    /// zone is deleted. Randomised: a seeded mix of types, parents, rewrites and tombstones.
    @Test(arguments: StorageBackends.all)
    func countsAgreeWithTheReadsTheyStandFor(_ backend: StorageBackend) throws {
        let seed = UInt64.random(in: 1...UInt64.max)
        print("StorageContractTests.countsAgreeWithTheReadsTheyStandFor seed: \(seed)")
        var random = SplitMix64(seed: seed)
        let types = ["Item", "List", "Note"]
        let parents: [String?] = [nil, "p", "q", "r0"]
        try withStorage(backend) { storage in
            let (zone, other) = try storage.write { tx throws in (try makeZone(tx), try makeZone(tx, "Other")) }
            func expectCountsMatchReads(_ tx: any StorageTransaction, _ zoneRowID: Int64, _ note: String) throws {
                for type in (types as [String?]) + ["Nothing", nil] {
                    #expect(try tx.recordCount(zoneRowID: zoneRowID, recordType: type)
                                == tx.records(zoneRowID: zoneRowID, recordType: type).count,
                            "seed \(seed), \(note), type \(type ?? "nil")")
                }
                for case let parent? in parents + ["nobody"] {
                    #expect(try tx.childCount(zoneRowID: zoneRowID, parentName: parent)
                                == tx.children(zoneRowID: zoneRowID, parentName: parent).count,
                            "seed \(seed), \(note), parent \(parent)")
                }
            }
            for batch in 0..<8 {
                try storage.write { tx throws in
                    for _ in 0..<Int(random.next() % 8 + 1) {
                        let target = random.next() % 4 == 0 ? other : zone
                        let name = "r\(random.next() % 12)"
                        _ = try tx.saveRecord(zoneRowID: target.rowID,
                                              write(name, type: types[Int(random.next() % 3)],
                                                    frame: [UInt8](repeating: 7, count: Int(random.next() % 64)),
                                                    deleted: random.next() % 4 == 0,
                                                    parent: parents[Int(random.next() % 4)], at: Int64(batch)))
                    }
                    // Inside the write, before it commits.
                    try expectCountsMatchReads(tx, zone.rowID, "batch \(batch), in the write")
                }
                try storage.read { tx throws in
                    try expectCountsMatchReads(tx, zone.rowID, "batch \(batch)")
                    try expectCountsMatchReads(tx, other.rowID, "batch \(batch), other zone")
                }
            }
            // A tombstone is not counted, and a record back over its tombstone is counted once.
            try storage.write { tx throws in
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("fixed", type: "Item", parent: "p"))
                let before = (try tx.recordCount(zoneRowID: zone.rowID, recordType: "Item"),
                              try tx.childCount(zoneRowID: zone.rowID, parentName: "p"))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("fixed", type: "Item", deleted: true, parent: "p"))
                #expect(try tx.recordCount(zoneRowID: zone.rowID, recordType: "Item") == before.0 - 1, "seed \(seed)")
                #expect(try tx.childCount(zoneRowID: zone.rowID, parentName: "p") == before.1 - 1, "seed \(seed)")
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("fixed", type: "Item", parent: "p"))
                #expect(try tx.recordCount(zoneRowID: zone.rowID, recordType: "Item") == before.0, "seed \(seed)")
                #expect(try tx.childCount(zoneRowID: zone.rowID, parentName: "p") == before.1, "seed \(seed)")
            }
            // A deleted zone has no records left to count; the other zone keeps its own.
            let otherCount = try storage.read { try $0.recordCount(zoneRowID: other.rowID, recordType: nil) }
            try storage.write { tx throws in try tx.deleteZone(rowID: zone.rowID, nowMs: 9_000) }
            try storage.read { tx throws in
                #expect(try tx.recordCount(zoneRowID: zone.rowID, recordType: nil) == 0, "seed \(seed)")
                #expect(try tx.recordCount(zoneRowID: zone.rowID, recordType: "Item") == 0, "seed \(seed)")
                #expect(try tx.childCount(zoneRowID: zone.rowID, parentName: "p") == 0, "seed \(seed)")
                #expect(try tx.recordCount(zoneRowID: other.rowID, recordType: nil) == otherCount, "seed \(seed)")
            }
        }
    }

    // MARK: Shares

    @Test(arguments: StorageBackends.all)
    func sharesAreStoredAsGivenAndFoundLiveOrDeleted(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (owner, zone) = try storage.write { tx throws in
                (try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1), try makeZone(tx))
            }
            let first = try storage.write { tx throws in
                try tx.insertShare(share(zone, "sh_1", record: "cloudkit.zoneshare", ownerID: owner.id, permission: .readWrite))
            }
            #expect(first == StoredShare(id: first.id, publicID: "sh_1", zoneRowID: zone.rowID, recordName: "cloudkit.zoneshare",
                                         rootRecordName: nil, ownerID: owner.id, title: "Trip", publicPermission: .readWrite,
                                         urlEpoch: StorageRules.firstURLEpoch, deleted: false, lastSeq: 0))
            var second = try storage.write { tx throws in
                var new = share(zone, "sh_2", record: "Share-2", root: "trip", ownerID: owner.id, permission: .readOnly)
                new.urlEpoch = 7
                return try tx.insertShare(new)
            }
            #expect(second.rootRecordName == "trip" && second.urlEpoch == 7 && second.id != first.id)
            #expect(try storage.read { try $0.share(id: second.id) }?.publicPermission == .readOnly)
            expectDuplicate { try storage.write { _ = try $0.insertShare(share(zone, "sh_3", record: "Share-2", ownerID: owner.id)) } }
            expectDuplicate { try storage.write { _ = try $0.insertShare(share(zone, "sh_1", record: "Share-9", ownerID: owner.id)) } }
            try storage.read { tx throws in
                #expect(try tx.share(publicID: "sh_1") == first)
                #expect(try tx.share(id: second.id) == second)
                #expect(try tx.share(publicID: "sh_3") == nil)
                #expect(try tx.shares(zoneRowID: zone.rowID) == [first, second])
            }
            // updateShare writes title, public permission, URL epoch and the deleted flag.
            second.title = "Trip (old)"
            second.publicPermission = .readOnly
            second.urlEpoch = 8
            second.deleted = true
            try storage.write { try $0.updateShare(second) }
            try storage.read { tx throws in
                #expect(try tx.share(id: second.id) == second)
                #expect(try tx.share(publicID: "sh_2") == second)
                #expect(try tx.shares(zoneRowID: zone.rowID) == [first])
            }
            // A deleted share's record name may be used again.
            let third = try storage.write { tx in try tx.insertShare(share(zone, "sh_3", record: "Share-2", ownerID: owner.id)) }
            #expect(try storage.read { try $0.shares(zoneRowID: zone.rowID) } == [first, third])
        }
    }

    @Test(arguments: StorageBackends.all)
    func participantsAreSavedPerShareAndUser(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (ann, bob, carl, first, second, gone) = try storage.write { tx throws in
                let ann = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let bob = try tx.insertUser(name: "bob", recordName: Self.bob, nowMs: 1)
                let carl = try tx.insertUser(name: "carl", recordName: Self.carl, nowMs: 1)
                let zone = try makeZone(tx)
                let first = try tx.insertShare(share(zone, "sh_1", record: "S1", root: "a", ownerID: ann.id))
                let second = try tx.insertShare(share(zone, "sh_2", record: "S2", root: "b", ownerID: ann.id))
                var gone = try tx.insertShare(share(zone, "sh_3", record: "S3", root: "c", ownerID: ann.id))
                gone.deleted = true
                try tx.updateShare(gone)
                return (ann, bob, carl, first, second, gone)
            }
            try storage.write { tx throws in
                try tx.saveParticipant(StoredParticipant(shareID: first.id, userID: carl.id, role: .privateUser,
                                                         permission: .readOnly, status: .pending, modifiedMs: 10))
                try tx.saveParticipant(StoredParticipant(shareID: first.id, userID: ann.id, role: .owner,
                                                         permission: .readWrite, status: .accepted, modifiedMs: 10))
                try tx.saveParticipant(StoredParticipant(shareID: second.id, userID: bob.id, role: .privateUser,
                                                         permission: .readOnly, status: .accepted, modifiedMs: 11))
                try tx.saveParticipant(StoredParticipant(shareID: first.id, userID: bob.id, role: .privateUser,
                                                         permission: .readOnly, status: .pending, modifiedMs: 12))
                try tx.saveParticipant(StoredParticipant(shareID: gone.id, userID: bob.id, role: .privateUser,
                                                         permission: .readOnly, status: .accepted, modifiedMs: 12))
            }
            // Saving again replaces the row of (share, user).
            let accepted = StoredParticipant(shareID: first.id, userID: bob.id, role: .administrator, permission: .readWrite,
                                             status: .accepted, modifiedMs: 20)
            try storage.write { try $0.saveParticipant(accepted) }
            try storage.read { tx throws in
                let rows = try tx.participants(shareID: first.id)
                #expect(rows.map(\.userID) == [ann.id, bob.id, carl.id].sorted())
                #expect(rows.first { $0.userID == bob.id } == accepted)
                #expect(rows.first { $0.userID == carl.id }?.status == .pending)
                #expect(try tx.participants(shareID: gone.id).map(\.userID) == [bob.id])
                // Participations: live shares only, in share order, with the given status.
                let bobs = try tx.participations(userID: bob.id, status: .accepted)
                #expect(bobs.map { $0.share } == [first, second])
                let inSecond = StoredParticipant(shareID: second.id, userID: bob.id, role: .privateUser, permission: .readOnly,
                                                 status: .accepted, modifiedMs: 11)
                #expect(bobs.map { $0.participant } == [accepted, inSecond])
                #expect(try tx.participations(userID: bob.id, status: .pending).isEmpty)
                #expect(try tx.participations(userID: carl.id, status: .pending).map { $0.share.id } == [first.id])
                #expect(try tx.participations(userID: carl.id, status: .accepted).isEmpty)
            }
        }
    }

    /// Roles, permissions and statuses cross the seam as enums; a stored spelling no case knows (a damaged row,
    /// or one written by a newer build) is a `StorageError`, never a trap, and never read as some other case.
    @Test(arguments: StorageBackends.all)
    func aStoredRolePermissionOrStatusNoCaseKnowsIsADamagedRow(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (ann, bob, carl, shared) = try storage.write { tx throws in
                let ann = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let bob = try tx.insertUser(name: "bob", recordName: Self.bob, nowMs: 1)
                let carl = try tx.insertUser(name: "carl", recordName: Self.carl, nowMs: 1)
                let shared = try tx.insertShare(share(try makeZone(tx), "sh_1", record: "S1", ownerID: ann.id))
                return (ann, bob, carl, shared)
            }
            // The stored spellings are the enums' raw values (no migration from the strings stored before).
            let rows = try storage.read { tx throws in
                var rows: [[StorageValue]] = []
                try tx.exportRows(table: "shares") { rows += $0 }
                return rows
            }
            #expect(rows.first?[7] == .text("none"))
            try storage.write { tx throws in
                try tx.saveParticipant(StoredParticipant(shareID: shared.id, userID: ann.id, role: .owner,
                                                         permission: .readWrite, status: .accepted, modifiedMs: 10))
                try tx.insertRows(table: "share_participants", [
                    [.integer(shared.id), .integer(bob.id), .text("superUser"), .text("readOnly"), .text("accepted"),
                     .integer(11)],
                    [.integer(shared.id), .integer(carl.id), .text("privateUser"), .text("readOnly"), .text("invited"),
                     .integer(12)],
                ])
            }
            let participantRows = try storage.read { tx throws in
                var rows: [[StorageValue]] = []
                try tx.exportRows(table: "share_participants") { rows += $0 }
                return rows
            }
            #expect(participantRows.contains([.integer(shared.id), .integer(ann.id), .text("owner"), .text("readWrite"),
                                              .text("accepted"), .integer(10)]))
            func expectDamaged(_ body: () throws -> Void, sourceLocation: SourceLocation = #_sourceLocation) {
                let error = #expect(throws: StorageError.self, sourceLocation: sourceLocation) { try body() }
                guard let error else { return }
                if case .failure(let text) = error, text.contains("damaged") { return }
                Issue.record("expected a damaged-row StorageError.failure, got \(error)", sourceLocation: sourceLocation)
            }
            expectDamaged { _ = try storage.read { try $0.participants(shareID: shared.id) } }
            expectDamaged { _ = try storage.read { try $0.participations(userID: bob.id, status: .accepted) } }
            // A status no case spells matches no status asked for.
            #expect(try storage.read { try $0.participations(userID: carl.id, status: .pending) }.isEmpty)
            // The owner's row is fine, and so is the share itself.
            #expect(try storage.read { try $0.participations(userID: ann.id, status: .accepted) }.count == 1)
            #expect(try storage.read { try $0.share(id: shared.id) }?.publicPermission == SharePermission.none)
            try storage.write { tx throws in
                try tx.insertRows(table: "shares", [[.integer(shared.id + 100), .text("sh_2"), .integer(shared.zoneRowID),
                                                     .text("S2"), .null, .integer(ann.id), .text(""), .text("everyone"),
                                                     .integer(1), .integer(0), .integer(0), .integer(3_000)]])
            }
            expectDamaged { _ = try storage.read { try $0.share(publicID: "sh_2") } }
            expectDamaged { _ = try storage.read { try $0.shares(zoneRowID: shared.zoneRowID) } }
            // A device sign-in whose status no case spells is damaged too, never read as denied.
            try storage.write { tx throws in
                try tx.insertRows(table: "device_authorizations", [[
                    .blob([1, 2, 3]), .blob([4, 5, 6]), .text("127.0.0.1"), .text("laptop"), .text("approvedMaybe"), .null,
                    .integer(5), .integer(0), .integer(1), .integer(9_999_999),
                ]])
            }
            expectDamaged { _ = try storage.read { try $0.deviceAuthorization(deviceCodeHash: [1, 2, 3]) } }
            expectDamaged { _ = try storage.read { try $0.deviceAuthorization(userCodeHash: [4, 5, 6]) } }
        }
    }

    /// Inside one write transaction, a read after each kind of write sees the write, whatever the backend
    /// remembered from reads before it (PostgreSQL caches rows it holds locked: `PostgresTransactionCache`).
    @Test(arguments: StorageBackends.all)
    func aReadAfterEachKindOfWriteInTheSameTransactionSeesTheWrite(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (ann, zone) = try storage.write { tx throws in
                (try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1), try makeZone(tx))
            }
            try storage.write { tx throws in
                // Records: read (and prefetched) first, then saved one at a time and in a batch.
                let database = try tx.database(privateKey())
                try tx.prefetchRecords(zoneRowID: zone.rowID, names: ["a", "b", "c"])
                #expect(try tx.record(zoneRowID: zone.rowID, name: "a") == nil)
                #expect(try tx.zone(rowID: zone.rowID)?.lastSeq == 0)
                let a = try tx.saveRecord(zoneRowID: zone.rowID, write("a", frame: [1, 2]))
                #expect(try tx.record(zoneRowID: zone.rowID, name: "a") == a)
                #expect(try tx.zone(rowID: zone.rowID)?.lastSeq == a.seq)
                #expect(try tx.database(id: database.id)?.bytesUsed == database.bytesUsed + 2)
                let saved = try tx.saveRecords(zoneRowID: zone.rowID, [write("b", frame: [1]), write("a", frame: [9])],
                                               previous: [nil, a])
                #expect(try tx.record(zoneRowID: zone.rowID, name: "b") == saved[0])
                #expect(try tx.record(zoneRowID: zone.rowID, name: "a") == saved[1])
                #expect(try tx.record(zoneRowID: zone.rowID, name: "c") == nil)
                #expect(try tx.zone(databaseID: database.id, name: zone.name)?.lastSeq == saved[1].seq)
                #expect(try tx.database(privateKey()).bytesUsed == database.bytesUsed + 2)
                #expect(try tx.database(id: database.id)?.lastSeq == zone.databaseSeq + 2)

                // Shares: the zone's live shares read first, then inserted, updated and moved.
                #expect(try tx.shares(zoneRowID: zone.rowID).isEmpty)
                var first = try tx.insertShare(share(zone, "sh_1", record: "S1", root: "a", ownerID: ann.id))
                #expect(try tx.shares(zoneRowID: zone.rowID) == [first])
                first.title = "Renamed"
                first.publicPermission = .readWrite
                try tx.updateShare(first)
                #expect(try tx.shares(zoneRowID: zone.rowID) == [first])
                #expect(try tx.share(id: first.id) == first)
                try tx.setShareMembership(shareID: first.id, recordName: "a", member: true)
                #expect(try tx.shares(zoneRowID: zone.rowID).map(\.lastSeq) == [first.lastSeq + 1])
                #expect(try tx.share(publicID: "sh_1")?.lastSeq == first.lastSeq + 1)

                // Remembered operations: the count read with a lookup, then one saved (and charged), then forgotten.
                let before = try tx.database(id: database.id)!
                #expect(try tx.clientOperation(userID: ann.id, operationID: "op-1") == nil)
                #expect(try tx.clientOperationCount(userID: ann.id) == 0)
                let operation = ClientOperation(requestHash: [1, 2, 3], status: 200, response: [4, 5])
                try tx.saveClientOperation(userID: ann.id, operationID: "op-1", operation, chargedTo: database.id,
                                           nowMs: 5)
                #expect(try tx.clientOperationCount(userID: ann.id) == 1)
                #expect(try tx.clientOperation(userID: ann.id, operationID: "op-1") == operation)
                let charged = operation.storedBytes(operationID: "op-1")
                #expect(try tx.database(id: database.id)?.bytesUsed == before.bytesUsed + charged)
                #expect(try tx.forgetOldestClientOperations(userID: ann.id, count: 1) == 1)
                #expect(try tx.clientOperationCount(userID: ann.id) == 0)
                #expect(try tx.database(id: database.id)?.bytesUsed == before.bytesUsed)

                // A savepoint rolled back: the reads after it see the rows as they were before it.
                let beforeSavepoint = try tx.record(zoneRowID: zone.rowID, name: "b")
                struct Undo: Error {}
                _ = try? tx.savepoint { () throws -> Void in
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("b", frame: [7, 7, 7]))
                    #expect(try tx.record(zoneRowID: zone.rowID, name: "b")?.frame == [7, 7, 7])
                    throw Undo()
                }
                #expect(try tx.record(zoneRowID: zone.rowID, name: "b") == beforeSavepoint)
                #expect(try tx.database(id: database.id)?.bytesUsed == before.bytesUsed)

                // A zone deleted: its records, its name and its shares go, its bytes come back.
                try tx.deleteZone(rowID: zone.rowID, nowMs: 6)
                #expect(try tx.zone(rowID: zone.rowID)?.deleted == true)
                #expect(try tx.zone(databaseID: database.id, name: zone.name) == nil)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "a") == nil)
                #expect(try tx.database(id: database.id)?.bytesUsed == 0)
                #expect(throws: StorageError.self) {
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("d"))
                }
            }
        }
    }

    /// A purge in a write that read the rows first: the reads after it see what it removed and the positions
    /// it raised.
    @Test(arguments: StorageBackends.all)
    func aReadAfterAPurgeInTheSameTransactionSeesWhatItRemoved(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let zone = try storage.write { tx throws in
                _ = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let zone = try makeZone(tx)
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("gone", deleted: true, at: 10))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("kept", at: 10))
                return zone
            }
            try storage.write { tx throws in
                let tombstone = try #require(try tx.record(zoneRowID: zone.rowID, name: "gone"))
                #expect(try tx.zone(rowID: zone.rowID)?.purgedSeq == 0)
                let report = try tx.purge(before: 1_000_000, operationsBeforeMs: 0, limit: 100)
                #expect(report.tombstones == 1)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "gone") == nil)
                #expect(try tx.zone(rowID: zone.rowID)?.purgedSeq == tombstone.seq)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "kept") != nil)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func linkUsesCountPerToken(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let shareID = try storage.write { tx throws in
                let owner = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                return try tx.insertShare(share(try makeZone(tx), "sh_1", record: "S", ownerID: owner.id)).id
            }
            #expect(try storage.read { try $0.linkUses(tokenID: "jti-1") } == 0)
            try storage.write { tx throws in
                try tx.recordLinkUse(tokenID: "jti-1", shareID: shareID)
                try tx.recordLinkUse(tokenID: "jti-1", shareID: shareID)
                try tx.recordLinkUse(tokenID: "jti-2", shareID: shareID)
            }
            try storage.write { try $0.recordLinkUse(tokenID: "jti-1", shareID: shareID) }
            try storage.read { tx throws in
                #expect(try tx.linkUses(tokenID: "jti-1") == 3)
                #expect(try tx.linkUses(tokenID: "jti-2") == 1)
                #expect(try tx.linkUses(tokenID: "jti-3") == 0)
            }
        }
    }

    /// Short links: a code points at one share's token; a taken code is a duplicate and changes nothing;
    /// pruning keeps a share's newest codes and leaves other shares' alone.
    /// Subscriptions are unique per database; notifications coalesce per subscription and zone and keep who
    /// made the run of changes; a device skips a row all of whose changes after its cursor were its own.
    @Test(arguments: StorageBackends.all)
    func notificationsCoalesceAndRememberTheirOrigin(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (subscription, user) = try storage.write { tx throws in
                let user = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: user.id))
                let made = try tx.insertSubscription(StoredSubscription(
                    databaseID: database.id, userID: user.id, name: "lists", kind: .zone, zoneName: "Lists",
                    zoneOwner: Self.ann, recordType: nil, firesOn: 7, firesOnce: false, definition: "{}", createdMs: 1,
                    modifiedMs: 1))
                return (made, user)
            }
            expectDuplicate { _ = try storage.write { try $0.insertSubscription(subscription) } }
            let trigger = NotificationTrigger(userID: user.id, subscriptionRowID: subscription.rowID, zoneRowID: 9,
                                              databaseID: subscription.databaseID, subscriptionName: "lists", kind: .zone,
                                              zoneName: "Lists", zoneOwner: Self.ann)
            // Phone, phone, laptop: one row, last made by the laptop after the phone's position 2.
            for origin in ["phone", "phone", "laptop"] {
                _ = try storage.write { try $0.raiseNotifications([trigger], origin: origin) }
            }
            try storage.read { tx throws in
                let rows = try tx.notifications(userID: user.id, after: 0, limit: 10)
                #expect(rows.count == 1 && rows.first?.seq == 3 && rows.first?.origin == "laptop" && rows.first?.runAfter == 2)
                #expect(rows.first?.concerns(device: "laptop", after: 2) == false, "only its own change since 2")
                #expect(rows.first?.concerns(device: "laptop", after: 1) == true, "the phone's change at 2 is news")
                #expect(rows.first?.concerns(device: "phone", after: 2) == true)
                #expect(try tx.lastNotificationSeq(userID: user.id) == 3)
            }
            // A spent firesOnce subscription keeps its notification until the purge forgets it.
            #expect(try storage.write { try $0.deleteSubscription(rowID: subscription.rowID, keepingNotifications: true) })
            try storage.read { tx throws in #expect(try tx.notifications(userID: user.id, after: 0, limit: 10).count == 1) }
            #expect(try storage.write { try $0.forgetOrphanNotifications(limit: 10) } == 1)
            try storage.read { tx throws in #expect(try tx.notifications(userID: user.id, after: 0, limit: 10).isEmpty) }
            // Push tokens go with their device token, revoked or expired.
            try storage.write { tx throws in
                try tx.insertToken(NewToken(hash: [9, 1], id: "0000000000000ex1", userID: user.id, createdMs: 1, expiresMs: 100))
                try tx.insertPushToken(StoredPushToken(hash: [7, 1], userID: user.id, deviceTokenID: "0000000000000ex1",
                                                       environment: "production", apnsEnvironment: "production",
                                                       registered: true, createdMs: 1))
                try tx.insertPushToken(StoredPushToken(hash: [7, 2], userID: user.id, deviceTokenID: "gone",
                                                       environment: "production", apnsEnvironment: "production",
                                                       registered: true, createdMs: 1))
            }
            #expect(try storage.write { try $0.forgetOrphanPushTokens(nowMs: 50, limit: 10) } == 1, "the one without a token")
            #expect(try storage.read { try $0.pushToken(hash: [7, 1], nowMs: 50) } != nil)
            #expect(try storage.write { try $0.forgetOrphanPushTokens(nowMs: 100, limit: 10) } == 1, "the expired one")
        }
    }

    /// The outbox: deliveries numbered per subscription, claimed one at a time per subscription and in order,
    /// never by two nodes at once, retried, dead-lettered, replayed and purged.
    @Test(arguments: StorageBackends.all)
    func webhookDeliveriesAreClaimedInOrderOncePerNode(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let subscriptions = try storage.write { tx throws in
                let user = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: user.id))
                return try ["one", "two"].map { name in
                    try tx.insertSubscription(StoredSubscription(
                        databaseID: database.id, userID: user.id, name: name, kind: .database, zoneName: nil, zoneOwner: nil,
                        recordType: nil, firesOn: 7, firesOnce: false, definition: "{}", webhookURL: "http://127.0.0.1:1/",
                        webhookSecret: [1], createdMs: 1, modifiedMs: 1))
                }
            }
            let (one, two) = (subscriptions[0], subscriptions[1])
            func claim(_ node: String, _ now: Int64) throws -> [StoredDelivery] {
                try storage.write { tx throws in try tx.claimDeliveries(node: node, nowMs: now, leaseMs: 1_000, limit: 10) }
            }
            try storage.write { tx throws in
                for index in 1...3 {
                    let made = try tx.enqueueDelivery(subscriptionRowID: one.rowID, userID: one.userID, url: "http://a/", nowMs: 10) { _ in Array("\(index)".utf8) }
                    #expect(made.seq == Int64(index) && made.state == .pending)
                }
                _ = try tx.enqueueDelivery(subscriptionRowID: two.rowID, userID: two.userID, url: "http://b/", nowMs: 10) { _ in [] }
            }
            // Node a takes the first of each subscription; node b, meanwhile, nothing.
            let first = try claim("a", 20)
            #expect(Set(first.map { "\($0.subscriptionRowID)/\($0.seq)" }) == ["\(one.rowID)/1", "\(two.rowID)/1"])
            #expect(first.allSatisfy { $0.attempts == 1 && $0.claimedBy == "a" })
            #expect(try claim("b", 21).isEmpty)
            let head = try #require(first.first { $0.subscriptionRowID == one.rowID })
            #expect(try storage.write { try $0.finishDelivery(id: head.id, node: "b", outcome: .delivered(status: 200), nowMs: 22) }
                    == false, "b holds no claim")
            #expect(try storage.write { try $0.finishDelivery(id: head.id, node: "a", outcome: .delivered(status: 200), nowMs: 22) })
            let other = try #require(first.first { $0.subscriptionRowID == two.rowID })
            #expect(try storage.write {
                try $0.finishDelivery(id: other.id, node: "a", outcome: .retry(status: 503, error: "busy", nextAttemptMs: 500),
                                      nowMs: 22)
            })
            // Now the second of `one` is due; `two`'s waits for its retry time.
            let second = try claim("b", 30)
            #expect(second.map(\.seq) == [2] && second.first?.subscriptionRowID == one.rowID)
            // b dies holding it: its lease runs out and a takes it again.
            #expect(try claim("a", 500).count == 1,
                    "two's retry only: one's second is still leased to b")
            let retaken = try claim("a", 1_100)
            #expect(retaken.map(\.seq) == [2] && retaken.first?.attempts == 2, "\(retaken)")
            guard retaken.count == 1 else { return }
            #expect(try storage.write {
                try $0.finishDelivery(id: retaken[0].id, node: "a", outcome: .failed(status: nil, error: "refused"), nowMs: 1_200)
            })
            // A dead-lettered delivery no longer holds back the next.
            let third = try claim("a", 1_300)
            #expect(third.map(\.seq) == [3])
            #expect(try storage.write { try $0.releaseDeliveryClaims(node: "a") } >= 1)
            try storage.read { tx throws in
                let failed = try tx.deliveries(subscriptionRowID: one.rowID, state: .failed, afterSeq: 0, limit: 10)
                #expect(failed.map(\.seq) == [2] && failed.first?.lastError == "refused")
                #expect(try tx.deliveries(subscriptionRowID: one.rowID, state: nil, afterSeq: 1, limit: 10).map(\.seq) == [2, 3])
            }
            #expect(try storage.write { try $0.replayDeliveries(subscriptionRowID: one.rowID, seqs: nil, nowMs: 1_400) } == 1)
            let replayed = try claim("a", 1_500)
            #expect(replayed.contains { $0.subscriptionRowID == one.rowID && $0.seq == 2 && $0.attempts == 1 })
            #expect(try storage.write { try $0.purgeDeliveries(finishedBefore: 100, limit: 10) } == 1, "the delivered first one")
        }
    }

    @Test(arguments: StorageBackends.all)
    func shortLinksPointAtTokensAndPruneOldestFirst(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (first, second) = try storage.write { tx throws in
                let owner = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let zone = try makeZone(tx)
                return (try tx.insertShare(share(zone, "sh_1", record: "S1", root: "A", ownerID: owner.id)).id,
                        try tx.insertShare(share(zone, "sh_2", record: "S2", root: "B", ownerID: owner.id)).id)
            }
            try storage.write { tx throws in
                for index in 1...4 {
                    try tx.insertShortLink(code: "code\(index)", shareID: first, token: "token-\(index)", nowMs: Int64(index))
                }
                try tx.insertShortLink(code: "other", shareID: second, token: "token-x", nowMs: 1)
            }
            expectDuplicate { try storage.write { try $0.insertShortLink(code: "code1", shareID: second, token: "t", nowMs: 9) } }
            try storage.read { tx throws in
                #expect(try tx.shortLink(code: "code1")?.token == "token-1")
                #expect(try tx.shortLink(code: "code1")?.shareID == first, "the duplicate changed nothing")
                #expect(try tx.shortLink(code: "nope") == nil)
            }
            #expect(try storage.write { try $0.pruneShortLinks(shareID: first, keeping: 2) } == 2)
            try storage.read { tx throws in
                #expect(try tx.shortLink(code: "code1") == nil && tx.shortLink(code: "code2") == nil)
                #expect(try tx.shortLink(code: "code3")?.token == "token-3" && tx.shortLink(code: "code4") != nil)
                #expect(try tx.shortLink(code: "other")?.token == "token-x")
            }
            #expect(try storage.write { try $0.pruneShortLinks(shareID: first, keeping: 0) } == 2)
            #expect(try storage.read { try $0.shortLink(code: "code4") } == nil)
            #expect(try storage.read { try $0.shortLink(code: "other") } != nil)
        }
    }

    @Test(arguments: StorageBackends.all)
    func aShareLogKeepsEachRecordAtItsLatestPosition(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (first, second) = try storage.write { tx throws in
                let owner = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let zone = try makeZone(tx)
                return (try tx.insertShare(share(zone, "sh_1", record: "S1", root: "a", ownerID: owner.id)),
                        try tx.insertShare(share(zone, "sh_2", record: "S2", root: "x", ownerID: owner.id)))
            }
            try storage.write { tx throws in
                try tx.setShareMembership(shareID: first.id, recordName: "a", member: true)
                try tx.setShareMembership(shareID: first.id, recordName: "b", member: true)
                try tx.setShareMembership(shareID: second.id, recordName: "x", member: true)
            }
            try storage.write { try $0.setShareMembership(shareID: first.id, recordName: "a", member: false) }
            try storage.read { tx throws in
                #expect(try tx.shareMembership(shareID: first.id, recordName: "a") == false)
                #expect(try tx.shareMembership(shareID: first.id, recordName: "b") == true)
                #expect(try tx.shareMembership(shareID: first.id, recordName: "x") == nil)
                #expect(try tx.shareMembership(shareID: second.id, recordName: "x") == true)
                let log = try tx.shareChanges(shareID: first.id, after: 0, limit: 10)
                #expect(log.map(\.recordName) == ["b", "a"] && log.map(\.member) == [true, false])
                #expect(log[0].seq < log[1].seq)
                #expect(log[1].seq == (try tx.share(id: first.id)?.lastSeq))
                #expect(try tx.shareChanges(shareID: first.id, after: 0, limit: 1) == [log[0]])
                #expect(try tx.shareChanges(shareID: first.id, after: log[0].seq, limit: 10) == [log[1]])
                #expect(try tx.shareChanges(shareID: first.id, after: log[1].seq, limit: 10).isEmpty)
                #expect(try tx.shareChanges(shareID: second.id, after: 0, limit: 10).map(\.recordName) == ["x"])
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func aSharedDatabaseLogKeepsEachShareAtItsLatestPosition(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (shared, first, second) = try storage.write { tx throws in
                let owner = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let zone = try makeZone(tx)
                let shared = try tx.database(DatabaseKey(kind: .shared, environment: "production", ownerID: 2))
                return (shared, try tx.insertShare(share(zone, "sh_1", record: "S1", root: "a", ownerID: owner.id)),
                        try tx.insertShare(share(zone, "sh_2", record: "S2", root: "b", ownerID: owner.id)))
            }
            try storage.write { tx throws in
                try tx.markSharedZone(databaseID: shared.id, shareID: first.id, deleted: false)
                try tx.markSharedZone(databaseID: shared.id, shareID: second.id, deleted: false)
            }
            try storage.write { try $0.markSharedZone(databaseID: shared.id, shareID: first.id, deleted: true) }
            try storage.read { tx throws in
                let log = try tx.sharedZoneChanges(databaseID: shared.id, after: 0, limit: 10)
                #expect(log.map(\.shareID) == [second.id, first.id] && log.map(\.deleted) == [false, true])
                #expect(log[0].databaseSeq < log[1].databaseSeq)
                #expect(log[1].databaseSeq == (try tx.database(id: shared.id)?.lastSeq))
                #expect(try tx.sharedZoneChanges(databaseID: shared.id, after: 0, limit: 1) == [log[0]])
                #expect(try tx.sharedZoneChanges(databaseID: shared.id, after: log[0].databaseSeq, limit: 5) == [log[1]])
                #expect(try tx.sharedZoneChanges(databaseID: shared.id, after: log[1].databaseSeq, limit: 5).isEmpty)
                #expect(try tx.sharedZoneChanges(databaseID: shared.id + 1, after: 0, limit: 5).isEmpty)
            }
        }
    }

    // MARK: Client operations

    @Test(arguments: StorageBackends.all)
    func clientOperationsAreRememberedPerUser(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let operation = ClientOperation(requestHash: Array(repeating: 3, count: 32), status: 200, response: Array("{}".utf8))
            #expect(try storage.read { try $0.clientOperation(userID: 1, operationID: "op-1") } == nil)
            try storage.write { try $0.saveClientOperation(userID: 1, operationID: "op-1", operation, chargedTo: 0, nowMs: 10) }
            try storage.read { tx throws in
                #expect(try tx.clientOperation(userID: 1, operationID: "op-1") == operation)
                #expect(try tx.clientOperation(userID: 2, operationID: "op-1") == nil)
                #expect(try tx.clientOperation(userID: 1, operationID: "op-2") == nil)
            }
            let empty = ClientOperation(requestHash: [], status: 409, response: [])
            try storage.write { try $0.saveClientOperation(userID: 2, operationID: "op-1", empty, chargedTo: 0, nowMs: 10) }
            #expect(try storage.read { try $0.clientOperation(userID: 2, operationID: "op-1") } == empty)
            expectDuplicate {
                try storage.write { try $0.saveClientOperation(userID: 1, operationID: "op-1", empty, chargedTo: 0, nowMs: 11) }
            }
            #expect(try storage.read { try $0.clientOperation(userID: 1, operationID: "op-1") } == operation)
        }
    }

    @Test(arguments: StorageBackends.all)
    func rememberedOperationsAreChargedAndTheOldestForgottenFirst(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let operation = ClientOperation(requestHash: Array(repeating: 3, count: 32), status: 200, response: Array("{}".utf8))
            let charge = operation.storedBytes(operationID: "op-1")
            #expect(charge == Int64("op-1".utf8.count + 32 + 2 + 32))
            let database = try storage.write { tx throws in
                let database = try tx.database(privateKey(1))
                for (index, at) in [30, 10, 20].enumerated() {
                    try tx.saveClientOperation(userID: 1, operationID: "op-\(index + 1)", operation, chargedTo: database.id,
                                               nowMs: Int64(at))
                }
                try tx.saveClientOperation(userID: 2, operationID: "op-1", operation, chargedTo: 0, nowMs: 5)
                return database
            }
            try storage.read { tx throws in
                #expect(try tx.database(id: database.id)?.bytesUsed == 3 * charge)
                #expect(try tx.clientOperationCount(userID: 1) == 3)
                #expect(try tx.clientOperationCount(userID: 2) == 1)
            }
            // The oldest by save time (op-2 at 10, then op-3 at 20) go first, and give their charge back.
            #expect(try storage.write { try $0.forgetOldestClientOperations(userID: 1, count: 2) } == 2)
            try storage.read { tx throws in
                #expect(try tx.clientOperation(userID: 1, operationID: "op-2") == nil)
                #expect(try tx.clientOperation(userID: 1, operationID: "op-3") == nil)
                #expect(try tx.clientOperation(userID: 1, operationID: "op-1") == operation)
                #expect(try tx.clientOperation(userID: 2, operationID: "op-1") == operation)
                #expect(try tx.database(id: database.id)?.bytesUsed == charge)
            }
            #expect(try storage.write { try $0.forgetOldestClientOperations(userID: 1, count: 0) } == 0)
            // Purging past the horizon gives the rest back too.
            let report = try storage.write { try $0.purge(before: 0, operationsBeforeMs: 31, limit: 1_000) }
            #expect(report.clientOperations == 2)
            #expect(try storage.read { try $0.database(id: database.id)?.bytesUsed } == 0)
            #expect(try storage.read { try $0.clientOperationCount(userID: 1) } == 0)
        }
    }

    @Test(arguments: StorageBackends.all)
    func sizeOnDiskGrowsWithData(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let before = try storage.sizeOnDisk()
            #expect(before > 0)
            try storage.write { tx throws in
                let zone = try makeZone(tx)
                for index in 0..<50 {
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("r\(index)", frame: Array(repeating: UInt8(index), count: 4_000)))
                }
            }
            #expect(try storage.sizeOnDisk() >= before + 50 * 4_000)
        }
    }

    // MARK: Transactions

    @Test(arguments: StorageBackends.all)
    func aSavepointThatThrowsUndoesOnlyItsOwnWrites(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let zone = try storage.write { tx in try makeZone(tx) }
            let (kept, afterwards) = try storage.write { tx throws in
                let kept = try tx.saveRecord(zoneRowID: zone.rowID, write("kept"))
                let undone = thrownError {
                    try tx.savepoint {
                        _ = try tx.saveRecord(zoneRowID: zone.rowID, write("undone"))
                        try tx.setMetadata("undone", "1")
                        throw Marker()
                    }
                }
                #expect(undone as? Marker == Marker())
                // A failed storage operation inside a savepoint leaves the transaction usable.
                let duplicate = thrownError {
                    try tx.savepoint {
                        _ = try tx.saveRecord(zoneRowID: zone.rowID, write("undone-too"))
                        _ = try tx.createZone(databaseID: zone.databaseID, name: zone.name, ownerRecordName: Self.ann, nowMs: 1)
                    }
                }
                #expect(isDuplicate(duplicate), "\(String(describing: duplicate))")
                // Nested: the inner savepoint's writes go, the outer one's stay.
                var inner: (any Error)?
                let value = try tx.savepoint { () throws -> Int in
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("outer"))
                    inner = thrownError {
                        try tx.savepoint {
                            _ = try tx.saveRecord(zoneRowID: zone.rowID, write("inner"))
                            throw Marker()
                        }
                    }
                    return 42
                }
                #expect(inner as? Marker == Marker())
                #expect(value == 42)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "undone") == nil)
                let afterwards = try tx.saveRecord(zoneRowID: zone.rowID, write("afterwards"))
                return (kept, afterwards)
            }
            try storage.read { tx throws in
                let names = try tx.records(zoneRowID: zone.rowID, recordType: nil).map(\.recordName)
                #expect(names == ["afterwards", "kept", "outer"])
                #expect(try tx.metadata("undone") == nil)
                // Positions taken by undone writes were given back: the log has no holes.
                let log = try tx.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 10)
                #expect(log.map(\.recordName) == ["kept", "outer", "afterwards"])
                #expect(log.map(\.seq) == [kept.seq, kept.seq + 1, kept.seq + 2] && afterwards.seq == kept.seq + 2)
                #expect(try tx.zone(rowID: zone.rowID)?.lastSeq == afterwards.seq)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func aWriteWhoseBodyThrowsWritesNothing(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let zone = try storage.write { tx in try makeZone(tx) }
            let before = try storage.read { tx in (try tx.zone(rowID: zone.rowID), try tx.database(id: zone.databaseID)) }
            var userID: Int64 = 0
            #expect(throws: Marker.self) {
                try storage.write { tx throws in
                    try tx.setMetadata("k", "v")
                    let user = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                    userID = user.id
                    try tx.insertToken(hash: [1], userID: user.id, nowMs: 1)
                    _ = try tx.database(privateKey(77))
                    _ = try tx.createZone(databaseID: zone.databaseID, name: "Other", ownerRecordName: Self.ann, nowMs: 1)
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("r", frame: [9, 9]))
                    _ = try tx.insertShare(share(zone, "sh_1", record: "S", ownerID: user.id))
                    try tx.saveClientOperation(userID: user.id, operationID: "op", ClientOperation(requestHash: [], status: 200,
                                                                                                 response: []), chargedTo: 0, nowMs: 1)
                    try tx.deleteZone(rowID: zone.rowID, nowMs: 2)
                    throw Marker()
                }
            }
            try storage.read { tx throws in
                #expect(try tx.metadata("k") == nil)
                #expect(try tx.user(named: "ann") == nil)
                #expect(try tx.user(tokenHash: [1]) == nil)
                #expect(try tx.database(privateKey(77)).id == 0)
                #expect(try tx.zone(databaseID: zone.databaseID, name: "Other") == nil)
                #expect(try tx.zone(rowID: zone.rowID) == before.0)
                #expect(try tx.database(id: zone.databaseID) == before.1)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "r") == nil)
                #expect(try tx.share(publicID: "sh_1") == nil)
                #expect(userID != 0)
                #expect(try tx.user(id: userID) == nil)
                #expect(try tx.clientOperation(userID: userID, operationID: "op") == nil)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func aReadTransactionRefusesWrites(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let (owner, zone) = try storage.write { tx throws in
                (try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1), try makeZone(tx))
            }
            let before = try storage.read { tx in (try tx.zone(rowID: zone.rowID), try tx.database(id: zone.databaseID)) }
            try storage.read { tx throws in
                #expect(throws: StorageError.self) { try tx.setMetadata("k", "v") }
                #expect(throws: StorageError.self) { _ = try tx.insertUser(name: "bob", recordName: Self.bob, nowMs: 1) }
                #expect(throws: StorageError.self) { try tx.insertToken(hash: [1], userID: owner.id, nowMs: 1) }
                #expect(throws: StorageError.self) {
                    _ = try tx.createZone(databaseID: zone.databaseID, name: "Other", ownerRecordName: Self.ann, nowMs: 1)
                }
                #expect(throws: StorageError.self) { _ = try tx.saveRecord(zoneRowID: zone.rowID, write("r")) }
                #expect(throws: StorageError.self) { try tx.deleteZone(rowID: zone.rowID, nowMs: 2) }
                #expect(throws: StorageError.self) { _ = try tx.insertShare(share(zone, "sh_1", record: "S", ownerID: owner.id)) }
                #expect(throws: StorageError.self) {
                    try tx.saveClientOperation(userID: owner.id, operationID: "op",
                                               ClientOperation(requestHash: [], status: 200, response: []), chargedTo: 0,
                                               nowMs: 1)
                }
                #expect(throws: StorageError.self) { try tx.recordSignUp(address: "10.0.0.1", nowMs: 1) }
                #expect(throws: StorageError.self) { _ = try tx.deleteTokens(userID: owner.id) }
                #expect(throws: StorageError.self) { _ = try tx.purge(before: .max, operationsBeforeMs: .max, limit: 1_000) }
            }
            try storage.read { tx throws in
                #expect(try tx.metadata("k") == nil)
                #expect(try tx.user(named: "bob") == nil)
                #expect(try tx.zone(databaseID: zone.databaseID, name: "Other") == nil)
                #expect(try tx.zone(rowID: zone.rowID) == before.0)
                #expect(try tx.database(id: zone.databaseID) == before.1)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "r") == nil)
                #expect(try tx.share(publicID: "sh_1") == nil)
            }
        }
    }

    // MARK: Purge

    @Test(arguments: StorageBackends.all)
    func purgeRemovesOnlyWhatIsPastItsHorizon(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let horizon: Int64 = 200
            let setup = try storage.write { tx throws in
                let owner = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let zone = try makeZone(tx, "Lists", nowMs: 50)
                let live = try tx.saveRecord(zoneRowID: zone.rowID, write("live", frame: [1], at: 100))
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("old", frame: [1, 1], at: 90))
                let oldTombstone = try tx.saveRecord(zoneRowID: zone.rowID, write("old", frame: [2, 2, 2], deleted: true, at: 100))
                let older = try tx.saveRecord(zoneRowID: zone.rowID, write("older", frame: [3, 3, 3, 3], deleted: true, at: 99))
                let atHorizon = try tx.saveRecord(zoneRowID: zone.rowID, write("edge", frame: [4], deleted: true, at: horizon))
                let recent = try tx.saveRecord(zoneRowID: zone.rowID, write("recent", frame: [5, 5], deleted: true, at: 300))

                let plain = try makeZone(tx, "Plain", nowMs: 50)
                _ = try tx.saveRecord(zoneRowID: plain.rowID, write("x", frame: [6], at: 60))
                try tx.deleteZone(rowID: plain.rowID, nowMs: 100)
                let shared = try makeZone(tx, "Shared", nowMs: 50)
                var gone = try tx.insertShare(share(shared, "sh_1", record: "S", ownerID: owner.id))
                gone.deleted = true
                try tx.updateShare(gone)
                try tx.deleteZone(rowID: shared.rowID, nowMs: 100)
                let late = try makeZone(tx, "Late", nowMs: 50)
                try tx.deleteZone(rowID: late.rowID, nowMs: 300)

                let operation = ClientOperation(requestHash: [1], status: 200, response: [2])
                try tx.saveClientOperation(userID: owner.id, operationID: "old", operation, chargedTo: 0, nowMs: 100)
                try tx.saveClientOperation(userID: owner.id, operationID: "new", operation, chargedTo: 0, nowMs: 250)
                return (owner, zone, live, oldTombstone, older, atHorizon, recent, plain, shared, late)
            }
            let (owner, zone, live, oldTombstone, older, atHorizon, recent, plain, shared, late) = setup
            let before = try storage.read { tx throws in
                (try tx.zone(rowID: plain.rowID)!, try tx.zone(rowID: shared.rowID)!, try tx.database(id: zone.databaseID)!)
            }
            #expect(before.2.bytesUsed == 1 + 3 + 4 + 1 + 2)

            let report = try storage.write { try $0.purge(before: horizon, operationsBeforeMs: 200, limit: 1_000) }
            #expect(report == PurgeReport(tombstones: 2, zones: 1, clientOperations: 1))
            try storage.read { tx throws in
                // Tombstones last changed before the horizon are gone; the rest stay.
                #expect(try tx.record(zoneRowID: zone.rowID, name: "old") == nil)
                #expect(try tx.record(zoneRowID: zone.rowID, name: "older") == nil)
                #expect(try tx.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 10) == [live, atHorizon, recent])
                let purgedZone = try #require(try tx.zone(rowID: zone.rowID))
                #expect(purgedZone.purgedSeq == max(oldTombstone.seq, older.seq))
                #expect(purgedZone.lastSeq == recent.seq)
                // Deleted zones before the horizon go, unless a share was made in them.
                #expect(try tx.zone(rowID: plain.rowID) == nil)
                #expect(try tx.zone(rowID: shared.rowID) == before.1)
                #expect(try tx.zone(rowID: late.rowID)?.deleted == true)
                let database = try #require(try tx.database(id: zone.databaseID))
                #expect(database.purgedSeq == before.0.databaseSeq)
                #expect(database.lastSeq == before.2.lastSeq)
                #expect(database.bytesUsed == 1 + 1 + 2)
                #expect(try tx.zoneChanges(databaseID: zone.databaseID, after: 0, limit: 10).map(\.rowID)
                        == [zone.rowID, shared.rowID, late.rowID])
                // Client operations saved before their horizon are forgotten.
                #expect(try tx.clientOperation(userID: owner.id, operationID: "old") == nil)
                #expect(try tx.clientOperation(userID: owner.id, operationID: "new") != nil)
            }
            // Purging again finds nothing and lowers no purged position.
            let zoneAfter = try storage.read { try $0.zone(rowID: zone.rowID) }
            let databaseAfter = try storage.read { try $0.database(id: zone.databaseID) }
            #expect(try storage.write { try $0.purge(before: horizon, operationsBeforeMs: 200, limit: 1_000) } == PurgeReport())
            #expect(try storage.read { try $0.zone(rowID: zone.rowID) } == zoneAfter)
            #expect(try storage.read { try $0.database(id: zone.databaseID) } == databaseAfter)
            // A later horizon takes the rest, and the zone's purged position reaches its newest tombstone.
            let rest = try storage.write { try $0.purge(before: 1_000, operationsBeforeMs: 1_000, limit: 1_000) }
            #expect(rest == PurgeReport(tombstones: 2, zones: 1, clientOperations: 1))
            try storage.read { tx throws in
                #expect(try tx.zone(rowID: zone.rowID)?.purgedSeq == recent.seq)
                #expect(try tx.recordChanges(zoneRowID: zone.rowID, after: 0, limit: 10) == [live])
                #expect(try tx.zone(rowID: late.rowID) == nil)
                #expect(try tx.zone(rowID: shared.rowID) == before.1)
                #expect(try tx.database(id: zone.databaseID)?.purgedSeq == before.2.lastSeq)
                #expect(try tx.database(id: zone.databaseID)?.bytesUsed == 1)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func purgeInSmallBatchesRemovesExactlyTheExpiredRows(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let horizon: Int64 = 500
            let limit = 7
            // 20 expired tombstones in two zones, 4 young ones and 3 live records; 9 deleted zones a share was
            // made in (more than a batch, with lower ids than the rest), 4 that go and 1 too young; 6 expired
            // remembered operations (4 charged to the database) and 2 young ones: 30 rows to remove.
            let operation = ClientOperation(requestHash: [1, 2], status: 200, response: [3, 4, 5])
            let setup = try storage.write { tx throws in
                let owner = try tx.insertUser(name: "ann", recordName: Self.ann, nowMs: 1)
                let first = try makeZone(tx, "First", nowMs: 10)
                let second = try makeZone(tx, "Second", nowMs: 10)
                var kept: [StoredZone] = []
                for index in 0..<9 {
                    let zone = try makeZone(tx, "Kept\(index)", nowMs: 10)
                    _ = try tx.insertShare(share(zone, "sh_\(index)", record: "S", ownerID: owner.id))
                    try tx.deleteZone(rowID: zone.rowID, nowMs: 100)
                    kept.append(zone)
                }
                var gone: [StoredZone] = []
                for index in 0..<4 {
                    let zone = try makeZone(tx, "Gone\(index)", nowMs: 10)
                    _ = try tx.saveRecord(zoneRowID: zone.rowID, write("x", frame: [9], at: 20))
                    try tx.deleteZone(rowID: zone.rowID, nowMs: 100 + Int64(index))
                    gone.append(try #require(try tx.zone(rowID: zone.rowID)))
                }
                let young = try makeZone(tx, "Young", nowMs: 10)
                try tx.deleteZone(rowID: young.rowID, nowMs: 600)
                var live: [StoredRecord] = [], youngTombstones: [StoredRecord] = []
                var newestExpired: [Int64: Int64] = [:]
                for index in 0..<20 {
                    let zone = index % 3 == 0 ? second : first
                    let record = try tx.saveRecord(zoneRowID: zone.rowID, write("old\(index)", frame: [1, 2], deleted: true,
                                                                              at: 100 + Int64(index)))
                    newestExpired[zone.rowID] = max(newestExpired[zone.rowID] ?? 0, record.seq)
                }
                for index in 0..<4 {
                    youngTombstones.append(try tx.saveRecord(zoneRowID: (index % 2 == 0 ? first : second).rowID,
                                                             write("new\(index)", frame: [7], deleted: true, at: horizon + Int64(index))))
                }
                for index in 0..<3 {
                    live.append(try tx.saveRecord(zoneRowID: first.rowID, write("live\(index)", frame: [5, 5, 5], at: 50)))
                }
                for index in 0..<8 {
                    try tx.saveClientOperation(userID: owner.id, operationID: "op\(index)", operation,
                                               chargedTo: index % 2 == 0 ? first.databaseID : 0,
                                               nowMs: index < 6 ? 100 + Int64(index) : horizon + Int64(index))
                }
                return (owner, first, second, kept, gone, young, live, youngTombstones, newestExpired)
            }
            let (owner, first, second, kept, gone, young, live, youngTombstones, newestExpired) = setup
            let before = try storage.read { tx throws in
                (try tx.database(id: first.databaseID)!, try kept.map { try tx.zone(rowID: $0.rowID)! })
            }
            let expiredCharges = (0..<6).filter { $0 % 2 == 0 }.map { operation.storedBytes(operationID: "op\($0)") }.reduce(0, +)

            var total = PurgeReport(complete: false)
            var batches = 0
            while !total.complete && batches < 30 {
                let batch = try storage.write { try $0.purge(before: horizon, operationsBeforeMs: horizon, limit: limit) }
                #expect(batch.removed <= limit, "batch \(batches + 1) removed \(batch.removed) rows over its limit of \(limit)")
                #expect(batch.complete || batch.removed == limit, "batch \(batches + 1) stopped short: \(batch)")
                total.tombstones += batch.tombstones
                total.zones += batch.zones
                total.clientOperations += batch.clientOperations
                total.complete = batch.complete
                batches += 1
            }
            #expect(total == PurgeReport(tombstones: 20, zones: 4, clientOperations: 6, complete: true))
            #expect(batches >= 5, "30 rows in \(batches) batches of at most \(limit)")
            try storage.read { tx throws in
                // The expired tombstones are gone, the young ones and the live records stay; each zone's purged
                // position is its newest expired tombstone's.
                #expect(try tx.recordChanges(zoneRowID: first.rowID, after: 0, limit: 100)
                        == [youngTombstones[0], youngTombstones[2]] + live)
                #expect(try tx.recordChanges(zoneRowID: second.rowID, after: 0, limit: 100)
                        == [youngTombstones[1], youngTombstones[3]])
                #expect(try tx.zone(rowID: first.rowID)?.purgedSeq == newestExpired[first.rowID])
                #expect(try tx.zone(rowID: second.rowID)?.purgedSeq == newestExpired[second.rowID])
                // Deleted zones a share was made in stay as they were, the young one stays, the rest are gone.
                #expect(try kept.map { try tx.zone(rowID: $0.rowID) } == before.1)
                #expect(try tx.zone(rowID: young.rowID)?.deleted == true)
                for zone in gone { #expect(try tx.zone(rowID: zone.rowID) == nil) }
                let database = try #require(try tx.database(id: first.databaseID))
                #expect(database.purgedSeq == gone.map(\.databaseSeq).max())
                #expect(database.bytesUsed == before.0.bytesUsed - 20 * 2 - expiredCharges)
                for index in 0..<8 {
                    #expect((try tx.clientOperation(userID: owner.id, operationID: "op\(index)") == nil) == (index < 6))
                }
            }
            // Another batch finds nothing; a limit below 1 is refused.
            #expect(try storage.write { try $0.purge(before: horizon, operationsBeforeMs: horizon, limit: limit) } == PurgeReport())
            #expect(throws: StorageError.self) {
                _ = try storage.write { try $0.purge(before: horizon, operationsBeforeMs: horizon, limit: 0) }
            }
        }
    }

    // MARK: Reading a batch ahead

    @Test(arguments: StorageBackends.all)
    func prefetchedRecordsAnswerAsLookupsDoUntilTheNextWrite(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { tx throws in
                let zone = try makeZone(tx)
                let other = try makeZone(tx, "Other")
                let stored = ["a", "c", "m"] + (0..<40).map { "p\($0 + 100)" }
                _ = try tx.saveRecords(zoneRowID: zone.rowID, stored.map { write($0, frame: Array($0.utf8)) },
                                       previous: stored.map { _ in nil })
                _ = try tx.saveRecord(zoneRowID: other.rowID, write("b", frame: [7]))
                func answers(_ names: [String]) throws -> [[UInt8]?] {
                    try names.map { try tx.record(zoneRowID: zone.rowID, name: $0)?.frame }
                }
                // A dense batch (its range holds two of its three names) and a sparse one (the range from
                // "a" to "z" holds 43 rows for 4 names): the answers are those of plain lookups either way.
                for batch in [["a", "b", "c"], ["a", "b", "c", "z"], ["p120", "p121", "zz"]] {
                    let plain = try answers(batch + ["m", "p105"])
                    try tx.prefetchRecords(zoneRowID: zone.rowID, names: batch)
                    #expect(try answers(batch + ["m", "p105"]) == plain, "\(batch)")
                    #expect(try tx.record(zoneRowID: other.rowID, name: "b")?.frame == [7], "another zone's b")
                }
                // A write after the read-ahead is seen by the next lookup.
                try tx.prefetchRecords(zoneRowID: zone.rowID, names: ["a", "b", "c"])
                #expect(try tx.record(zoneRowID: zone.rowID, name: "b") == nil)
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("b", frame: [9]))
                #expect(try tx.record(zoneRowID: zone.rowID, name: "b")?.frame == [9])
                _ = try tx.saveRecord(zoneRowID: zone.rowID, write("a", frame: [8]))
                #expect(try tx.record(zoneRowID: zone.rowID, name: "a")?.frame == [8])
            }
        }
    }

    // MARK: Closing

    @Test(arguments: StorageBackends.all)
    func aClosedStorageRefusesWork(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { try $0.setMetadata("k", "v") }
            storage.close()
            #expect(throws: StorageError.closed) { try storage.read { try $0.metadata("k") } }
            #expect(throws: StorageError.closed) { try storage.write { try $0.setMetadata("k", "w") } }
            storage.close() // closing twice is harmless
            #expect(throws: StorageError.closed) { try storage.read { _ in 1 } }
        }
    }
}


// MARK: Passkeys, their ceremonies and recovery codes

extension StorageContractTests {
    private func passkey(_ byte: UInt8, user: Int64 = 1, createdMs: Int64 = 1_000) -> NewPasskey {
        NewPasskey(credentialID: Array(repeating: byte, count: 16), userID: user, publicKey: [0xA5, byte], algorithm: -7,
                   signCount: 3, name: "key \(byte)", createdMs: createdMs)
    }

    @Test(arguments: StorageBackends.all)
    func passkeysAreFoundByCredentialListedPerUserAndTheirCounterOnlyGrows(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { tx throws in
                try tx.insertPasskey(passkey(1, createdMs: 2_000))
                try tx.insertPasskey(passkey(2, createdMs: 1_000))
                try tx.insertPasskey(passkey(3, user: 2))
            }
            expectDuplicate { try storage.write { try $0.insertPasskey(passkey(1, user: 2)) } }
            try storage.read { tx throws in
                #expect(try tx.passkey(credentialID: Array(repeating: 1, count: 16)) == StoredPasskey(passkey: passkey(1, createdMs: 2_000), lastUsedMs: nil))
                #expect(try tx.passkey(credentialID: [9]) == nil)
                #expect(try tx.passkeys(userID: 1).map(\.passkey.name) == ["key 2", "key 1"], "oldest first")
                #expect(try tx.passkeys(userID: 3).isEmpty)
            }
            let id = Array(repeating: UInt8(1), count: 16)
            try storage.write { tx throws in
                #expect(try tx.recordPasskeySignIn(credentialID: id, signCount: 4, nowMs: 5_000))
                #expect(try !tx.recordPasskeySignIn(credentialID: id, signCount: 4, nowMs: 6_000), "a counter that did not grow")
                #expect(try !tx.recordPasskeySignIn(credentialID: id, signCount: 2, nowMs: 6_000))
                #expect(try tx.recordPasskeySignIn(credentialID: id, signCount: 0, nowMs: 7_000), "no counter kept")
                #expect(try !tx.renamePasskey(credentialID: id, userID: 2, name: "stolen"), "only the owner renames")
                #expect(try tx.renamePasskey(credentialID: id, userID: 1, name: "Phone"))
                #expect(try !tx.deletePasskey(credentialID: Array(repeating: 3, count: 16), userID: 1), "only the owner deletes")
                #expect(try tx.deletePasskey(credentialID: Array(repeating: 2, count: 16), userID: 1))
            }
            try storage.read { tx throws in
                let stored = try #require(try tx.passkey(credentialID: id))
                #expect(stored.passkey.signCount == 0 && stored.lastUsedMs == 7_000 && stored.passkey.name == "Phone")
                #expect(try tx.passkeys(userID: 1).count == 1 && tx.passkeys(userID: 2).count == 1)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func aCeremonyIsTakenOnceWhileLiveCountedPerAddressAndForgotten(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            func ceremony(_ byte: UInt8, _ purpose: PasskeyCeremonyPurpose = .signIn, address: String = "10.0.0.1",
                          expiresMs: Int64 = 301_000) -> PasskeyCeremony {
                PasskeyCeremony(challengeHash: Array(repeating: byte, count: 32), purpose: purpose, userID: purpose == .register ? 7 : nil,
                                address: address, name: purpose == .signUp ? "ann" : nil, createdMs: 1_000, expiresMs: expiresMs)
            }
            try storage.write { tx throws in
                try tx.insertPasskeyCeremony(ceremony(1, .signUp))
                try tx.insertPasskeyCeremony(ceremony(2, .register, address: "10.0.0.2"))
                try tx.insertPasskeyCeremony(ceremony(3, expiresMs: 100_000))
            }
            expectDuplicate { try storage.write { try $0.insertPasskeyCeremony(ceremony(1)) } }
            try storage.read { tx throws in
                #expect(try tx.livePasskeyCeremonies(address: "10.0.0.1", nowMs: 2_000) == 2)
                #expect(try tx.livePasskeyCeremonies(address: nil, nowMs: 2_000) == 3)
                #expect(try tx.livePasskeyCeremonies(address: nil, nowMs: 100_000) == 2, "expired at expiresMs exactly")
            }
            try storage.write { tx throws in
                #expect(try tx.takePasskeyCeremony(challengeHash: Array(repeating: 1, count: 32), nowMs: 2_000) == ceremony(1, .signUp))
                #expect(try tx.takePasskeyCeremony(challengeHash: Array(repeating: 1, count: 32), nowMs: 2_000) == nil, "once")
                #expect(try tx.takePasskeyCeremony(challengeHash: Array(repeating: 3, count: 32), nowMs: 100_000) == nil, "expired")
                #expect(try tx.takePasskeyCeremony(challengeHash: Array(repeating: 2, count: 32), nowMs: 2_000)?.userID == 7)
                #expect(try tx.forgetPasskeyCeremonies(expiredAt: 100_000) == 1)
                #expect(try tx.livePasskeyCeremonies(address: nil, nowMs: 0) == 0)
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func aRecoveryCodeWorksOnceAndNewCodesReplaceTheOldOnes(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let first = (1...3).map { Array(repeating: UInt8($0), count: 32) }
            try storage.write { tx throws in
                try tx.replaceRecoveryCodes(userID: 5, hashes: first, nowMs: 1_000)
                try tx.replaceRecoveryCodes(userID: 6, hashes: [Array(repeating: 9, count: 32)], nowMs: 1_000)
            }
            try storage.write { tx throws in
                #expect(try tx.useRecoveryCode(hash: first[1], nowMs: 2_000) == 5)
                #expect(try tx.useRecoveryCode(hash: first[1], nowMs: 3_000) == nil, "used once")
                #expect(try tx.useRecoveryCode(hash: Array(repeating: 8, count: 32), nowMs: 3_000) == nil)
                #expect(try tx.unusedRecoveryCodes(userID: 5) == 2)
                try tx.replaceRecoveryCodes(userID: 5, hashes: [Array(repeating: 4, count: 32)], nowMs: 4_000)
                #expect(try tx.useRecoveryCode(hash: first[0], nowMs: 5_000) == nil, "replaced")
                #expect(try tx.unusedRecoveryCodes(userID: 5) == 1)
                #expect(try tx.unusedRecoveryCodes(userID: 6) == 1, "another account's codes stay")
            }
        }
    }
}

// MARK: External identities and OpenID Connect sign-ins

extension StorageContractTests {
    @Test(arguments: StorageBackends.all)
    func anIdentityIsLinkedToOneAccountAndASignInIsTakenOnce(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            try storage.write { tx throws in
                try tx.linkIdentity(issuer: "https://a.example", subject: "s1", userID: 5, nowMs: 1_000)
                try tx.linkIdentity(issuer: "https://b.example", subject: "s1", userID: 6, nowMs: 1_000)
            }
            expectDuplicate { try storage.write { try $0.linkIdentity(issuer: "https://a.example", subject: "s1", userID: 7, nowMs: 2_000) } }
            try storage.write { tx throws in
                #expect(try tx.useIdentity(issuer: "https://a.example", subject: "s1", nowMs: 3_000) == 5)
                #expect(try tx.useIdentity(issuer: "https://a.example", subject: "S1", nowMs: 3_000) == nil, "subjects are exact")
                #expect(try tx.identities(userID: 5) == 1 && tx.identities(userID: 7) == 0)
            }
            func login(_ byte: UInt8, address: String = "10.0.0.1", expiresMs: Int64 = 601_000) -> OIDCLogin {
                OIDCLogin(stateHash: Array(repeating: byte, count: 32), issuer: "https://a.example", nonce: "n\(byte)", verifier: "v\(byte)",
                          nextPath: "/", linkUserID: byte == 2 ? 5 : nil, address: address, createdMs: 1_000, expiresMs: expiresMs)
            }
            try storage.write { tx throws in
                try tx.insertOIDCLogin(login(1))
                try tx.insertOIDCLogin(login(2, address: "10.0.0.2"))
                try tx.insertOIDCLogin(login(3, expiresMs: 100_000))
            }
            expectDuplicate { try storage.write { try $0.insertOIDCLogin(login(1)) } }
            try storage.write { tx throws in
                #expect(try tx.liveOIDCLogins(address: "10.0.0.1", nowMs: 2_000) == 2)
                #expect(try tx.liveOIDCLogins(address: nil, nowMs: 100_000) == 2)
                #expect(try tx.takeOIDCLogin(stateHash: Array(repeating: 1, count: 32), nowMs: 2_000) == login(1))
                #expect(try tx.takeOIDCLogin(stateHash: Array(repeating: 1, count: 32), nowMs: 2_000) == nil, "once")
                #expect(try tx.takeOIDCLogin(stateHash: Array(repeating: 3, count: 32), nowMs: 100_000) == nil, "expired")
                #expect(try tx.takeOIDCLogin(stateHash: Array(repeating: 2, count: 32), nowMs: 2_000)?.linkUserID == 5)
                #expect(try tx.forgetOIDCLogins(expiredAt: 100_000) == 1)
            }
        }
    }
}
