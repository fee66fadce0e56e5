import Foundation
import LatticeCore
import LatticeStore
import Testing

/// The contract of StorageNodes.swift (nodes, clocks, try-locks and the neutral copy of every table),
/// against every backend in `StorageBackends.all`.
@Suite("Storage contract: nodes and copying")
struct StorageNodesContractTests {
    private func withStorage<T>(_ backend: StorageBackend, _ body: (any Storage) throws -> T) throws -> T {
        let directory = NSTemporaryDirectory() + "lattice-nodes-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let storage = try backend.make(directory)
        defer { storage.close() }
        return try body(storage)
    }

    private func isDuplicate(_ body: () throws -> Void) -> Bool {
        do {
            try body()
            return false
        } catch StorageError.duplicate {
            return true
        } catch {
            Issue.record("expected StorageError.duplicate, got \(error)")
            return false
        }
    }

    @Test(arguments: StorageBackends.all)
    func nodesHaveUniqueNamesAndReplicaIDsAndTheirClocksOnlyRise(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let a = StoredNode(name: "a", replicaID: "00000000000000a1", clockLatest: 0, createdMs: 5)
            try storage.write { try $0.insertNode(a) }
            #expect(try storage.read { try $0.node(named: "a") } == a)
            #expect(try storage.read { try $0.node(named: "b") } == nil)
            #expect(isDuplicate {
                try storage.write { try $0.insertNode(StoredNode(name: "a", replicaID: "00000000000000b2", clockLatest: 0, createdMs: 6)) }
            })
            #expect(isDuplicate {
                try storage.write { try $0.insertNode(StoredNode(name: "b", replicaID: "00000000000000a1", clockLatest: 0, createdMs: 6)) }
            })
            try storage.write { try $0.raiseNodeClock(name: "a", to: 500) }
            try storage.write { try $0.raiseNodeClock(name: "a", to: 300) }
            #expect(try storage.read { try $0.node(named: "a") }?.clockLatest == 500)
            try storage.write { try $0.raiseNodeClock(name: "a", to: 501) }
            #expect(try storage.read { try $0.node(named: "a") }?.clockLatest == 501)
        }
    }

    @Test(arguments: StorageBackends.all)
    func aTryLockIsTakenWhenFree(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            let first = try storage.write { try $0.tryExclusiveLock("purge") }
            // Released with the transaction: the next one takes it again.
            let second = try storage.write { try $0.tryExclusiveLock("purge") }
            #expect(first && second)
        }
    }

    /// A store with a row in every table.
    private func populate(_ storage: any Storage) throws {
        try storage.write { tx in
            try tx.setMetadata("note", "it's \"quoted\"\n")
            try tx.insertNode(StoredNode(name: "main", replicaID: "00000000000000c3", clockLatest: 77, createdMs: 1))
            let ann = try tx.insertUser(name: "ann", recordName: "_00000000000000000000000000000a11", nowMs: 10)
            let bob = try tx.insertUser(name: "bob", recordName: "_00000000000000000000000000000b0b", nowMs: 11)
            try tx.insertToken(NewToken(hash: [0, 1, 2, 255], id: "00000000000000t1", userID: ann.id, createdMs: 12,
                                        expiresMs: 99_999))
            try tx.recordSignUp(address: "127.0.0.1", nowMs: 13)
            try tx.insertToken(NewToken(hash: [3], id: "d-00000000000000t2", userID: ann.id, createdMs: 12, name: "phone"))
            try tx.insertDeviceAuthorization(NewDeviceAuthorization(
                deviceCodeHash: [4, 4], userCodeHash: [5, 5], address: "127.0.0.1", deviceName: "tablet", intervalSeconds: 5,
                createdMs: 13, expiresMs: 600_013))
            _ = try tx.decideDeviceAuthorization(userCodeHash: [5, 5], approve: true, userID: ann.id, deviceName: nil, nowMs: 14)
            try tx.insertDeviceAuthorization(NewDeviceAuthorization(
                deviceCodeHash: [6], userCodeHash: [7], address: "127.0.0.2", deviceName: "it's \"quoted\"",
                intervalSeconds: 10, createdMs: 13, expiresMs: 600_013))
            try tx.recordDeviceApprovalFailure(key: "user:\(ann.id)", nowMs: 14)
            try tx.insertPasskey(NewPasskey(credentialID: [8, 0, 8], userID: ann.id, publicKey: [0xA5, 1], algorithm: -7, signCount: 2,
                                            name: "it's \"quoted\"", createdMs: 14))
            _ = try tx.recordPasskeySignIn(credentialID: [8, 0, 8], signCount: 3, nowMs: 15)
            try tx.insertPasskeyCeremony(PasskeyCeremony(challengeHash: [9, 9], purpose: .signUp, userID: nil, address: "127.0.0.1",
                                                         name: "cy", createdMs: 14, expiresMs: 300_014))
            try tx.replaceRecoveryCodes(userID: ann.id, hashes: [[1, 2], [3, 4]], nowMs: 14)
            _ = try tx.useRecoveryCode(hash: [3, 4], nowMs: 15)
            try tx.linkIdentity(issuer: "https://id.example", subject: "it's \"quoted\"", userID: ann.id, nowMs: 14)
            try tx.insertOIDCLogin(OIDCLogin(stateHash: [7, 7], issuer: "https://id.example", nonce: "n", verifier: "v",
                                             nextPath: "/share/x", linkUserID: nil, address: "127.0.0.1", createdMs: 14, expiresMs: 600_014))
            let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: ann.id))
            let zone = try tx.createZone(databaseID: database.id, name: "Lists", ownerRecordName: ann.recordName, nowMs: 14)
            _ = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(recordName: "root", recordType: "List", frame: [9, 0, 9],
                                                                     deleted: false, userRecordName: ann.recordName, nowMs: 15))
            _ = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(recordName: "item", recordType: "Item", frame: [],
                                                                     deleted: false, parentName: "root",
                                                                     userRecordName: ann.recordName, nowMs: 16))
            let share = try tx.insertShare(NewShare(publicID: "pub1", zoneRowID: zone.rowID, recordName: "share-1",
                                                    rootRecordName: "root", ownerID: ann.id, title: "Trip",
                                                    publicPermission: .readWrite, nowMs: 17))
            try tx.saveParticipant(StoredParticipant(shareID: share.id, userID: bob.id, role: .privateUser,
                                                     permission: .readOnly, status: .accepted, modifiedMs: 18))
            try tx.recordLinkUse(tokenID: "jti-1", shareID: share.id)
            try tx.insertShortLink(code: "k7m2p9q4rs", shareID: share.id, token: "it's.a.token", nowMs: 17)
            try tx.setShareMembership(shareID: share.id, recordName: "item", member: true)
            let shared = try tx.database(DatabaseKey(kind: .shared, environment: "production", ownerID: bob.id))
            try tx.markSharedZone(databaseID: shared.id, shareID: share.id, deleted: false)
            let subscription = try tx.insertSubscription(StoredSubscription(
                databaseID: database.id, userID: ann.id, name: "lists", kind: .zone, zoneName: "Lists", zoneOwner: "_a",
                recordType: nil, firesOn: 7, firesOnce: false, definition: "{}", webhookURL: "https://example.com/hook",
                webhookSecret: [9, 9], createdMs: 20, modifiedMs: 20))
            _ = try tx.raiseNotifications([NotificationTrigger(
                userID: ann.id, subscriptionRowID: subscription.rowID, zoneRowID: zone.rowID, databaseID: database.id,
                subscriptionName: "lists", kind: .zone, zoneName: "Lists", zoneOwner: "_a")], origin: "00000000000000t1")
            _ = try tx.enqueueDelivery(subscriptionRowID: subscription.rowID, userID: ann.id, url: "https://example.com/hook", nowMs: 22) { _ in Array("{}".utf8) }
            try tx.insertPushToken(StoredPushToken(hash: [4, 4], userID: ann.id, deviceTokenID: "00000000000000t1",
                                                   environment: "production", apnsEnvironment: "production",
                                                   registered: true, createdMs: 21))
            try tx.saveClientOperation(userID: ann.id, operationID: "op-1",
                                       ClientOperation(requestHash: [7, 7], status: 200, response: Array("{}".utf8)),
                                       chargedTo: database.id, nowMs: 19)
            // An asset: its upload, blob, claim, reference and (the database-backed store's) chunk.
            let checksum = [UInt8](repeating: 5, count: 32)
            _ = try tx.insertAssetUpload(StoredAssetUpload(
                secretHash: [8, 8], receipt: "r1", databaseID: database.id, zoneRowID: zone.rowID, recordType: "Item",
                recordName: "first", fieldName: "photo", userID: ann.id, content: "0000000000aa-c1", length: 3,
                contentType: "image/png", checksum: checksum, createdMs: 23, expiresMs: 99))
            try tx.insertAssetBlob(StoredAssetBlob(databaseID: database.id, checksum: checksum, size: 3, content: "0000000000aa-c1",
                                                   contentType: "image/png", createdMs: 23, touchedMs: 23))
            try tx.claimAsset(databaseID: database.id, checksum: checksum, userID: ann.id, nowMs: 23)
            try tx.addAssetReferences(databaseID: database.id, zoneRowID: zone.rowID, recordName: "first", checksums: [checksum])
            try tx.insertAssetChunk(content: "0000000000aa-c1", position: 0, bytes: [1, 2, 3])
        }
    }

    private func dump(_ storage: any Storage) throws -> [String: [[StorageValue]]] {
        try storage.read { tx in
            var tables: [String: [[StorageValue]]] = [:]
            for table in StorageTables.all {
                var rows: [[StorageValue]] = []
                try tx.exportRows(table: table.name) { rows += $0 }
                tables[table.name] = rows
            }
            return tables
        }
    }

    @Test(arguments: StorageBackends.all)
    func everyTableCopiesRowForRowIntoAnEmptyStoreWhichThenGoesOn(_ backend: StorageBackend) throws {
        try withStorage(backend) { source in
            try populate(source)
            let original = try dump(source)
            for table in StorageTables.all {
                #expect(original[table.name]?.isEmpty == false, "no row in \(table.name)")
                #expect(original[table.name]?.allSatisfy { $0.count == table.columns.count } == true)
            }
            try withStorage(backend) { target in
                for table in StorageTables.all {
                    #expect(try target.read { try $0.rowCount(table: table.name) } == 0, "a fresh store has rows in \(table.name)")
                }
                try target.write { tx in
                    for table in StorageTables.all { try tx.insertRows(table: table.name, original[table.name] ?? []) }
                    try tx.finishImport()
                }
                let copied = try dump(target)
                for table in StorageTables.all {
                    #expect(copied[table.name] == original[table.name], "\(table.name) differs after the copy")
                    #expect(try target.read { try $0.rowCount(table: table.name) } == original[table.name]?.count)
                }
                // New rows after the copy take fresh ids and the logs go on from the copied positions.
                try target.write { tx in
                    let carl = try tx.insertUser(name: "carl", recordName: "_00000000000000000000000000000ca1", nowMs: 30)
                    let ann = try #require(try tx.user(named: "ann"))
                    #expect(carl.id > ann.id)
                    let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: ann.id))
                    let zone = try #require(try tx.zone(databaseID: database.id, name: "Lists"))
                    let saved = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(
                        recordName: "third", recordType: "Item", frame: [1], deleted: false,
                        userRecordName: ann.recordName, nowMs: 31))
                    #expect(saved.seq == zone.lastSeq + 1)
                    let other = try tx.createZone(databaseID: database.id, name: "Other", ownerRecordName: ann.recordName, nowMs: 32)
                    #expect(other.rowID > zone.rowID)
                }
            }
        }
    }

    @Test(arguments: StorageBackends.all)
    func anUnknownTableIsRefused(_ backend: StorageBackend) throws {
        try withStorage(backend) { storage in
            #expect(throws: StorageError.self) { try storage.read { try $0.rowCount(table: "users; DROP TABLE users") } }
            #expect(throws: StorageError.self) { try storage.write { try $0.insertRows(table: "sqlite_master", [[.null]]) } }
        }
    }
}
