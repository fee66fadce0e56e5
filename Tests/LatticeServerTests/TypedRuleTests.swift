import Foundation
import LatticeAPI
import LatticeCore
@testable import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Testing

/// The rules of the operations, called as operations (typed requests in, `Answer`s and rosters out, no
/// HTTP), on SQLite and on PostgreSQL (`LATTICE_TEST_BACKEND=postgres`): atomic batches, quotas, share
/// membership and participant changes. Each test states one rule and checks what is stored after it, not
/// only the answer. (The HTTP-level matrices, AuthorizationMatrixTests and its sharing extensions, check the
/// same rules cell by cell through the API.)
@Suite(.tags(.postgres)) struct TypedRuleTests {
    /// A service with one account and zone `Z` in it, and the operations called as that account.
    struct World {
        let h: ServiceHarness
        let ann: UserAccount
        let token: String

        init(configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
            h = try ServiceHarness(configure: configure)
            let (token, _) = try h.signUp("ann")
            self.token = token
            ann = try #require(try h.storage.read { try $0.user(named: "ann") })
            try h.createZone("Z", token: token)
        }

        var core: OperationsCore { h.service.core }
        var zone: WireZoneID { WireZoneID(zoneName: "Z") }

        func caller(_ user: UserAccount? = nil, _ database: DatabaseKind = .private) -> Caller {
            Caller(user: user ?? ann, database: database, environment: "production", tokenID: nil, deadline: nil)
        }

        /// `records/modify` with plain values, as a typed operation.
        func modify(_ operations: [JSON], atomic: Bool? = nil, as user: UserAccount? = nil,
                    database: DatabaseKind = .private, zone: JSON? = nil) throws -> [JSON] {
            var body: [String: JSON] = ["zoneID": zone ?? self.zone.json, "operations": .array(operations)]
            if let atomic { body["atomic"] = .bool(atomic) }
            let answer = try Records(core).modify(caller(user, database), body, replay: nil)
            return try JSON.parse(answer.body)["records"]?.arrayValue ?? []
        }

        /// The zone's stored row (its change log position and the database's bytes).
        func zoneRow() throws -> (lastSeq: Int64, bytesUsed: Int64) {
            try h.storage.read { tx in
                let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: ann.id))
                let zone = try #require(try tx.zone(databaseID: database.id, name: "Z"))
                return (zone.lastSeq, database.bytesUsed)
            }
        }

        func stored(_ name: String) throws -> StoredRecord? {
            try h.storage.read { tx in
                let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: ann.id))
                let zone = try #require(try tx.zone(databaseID: database.id, name: "Z"))
                return try tx.record(zoneRowID: zone.rowID, name: name)
            }
        }
    }

    static func create(_ name: String, type: String = "Item", text: String = "x", parent: String? = nil) -> JSON {
        var record: [String: JSON] = ["recordName": .string(name), "recordType": .string(type),
                                      "fields": .object(["text": .object(["value": .string(text)])])]
        if let parent { record["parent"] = .object(["recordName": .string(parent), "action": .string("NONE")]) }
        return .object(["operationType": .string("create"), "record": .object(record)])
    }

    static func codes(_ items: [JSON]) -> [String] { items.map { $0["serverErrorCode"]?.stringValue ?? "OK" } }

    // MARK: Atomic batches

    @Test func anAtomicBatchWithOneFailureWritesNothingAndAnswersEveryOtherItemAtomicError() throws {
        let world = try World()
        #expect(Self.codes(try world.modify([Self.create("a")])) == ["OK"])
        let before = try world.zoneRow()
        let items = try world.modify([Self.create("b"), Self.create("a"), Self.create("c")])
        #expect(Self.codes(items) == ["ATOMIC_ERROR", "EXISTS", "ATOMIC_ERROR"])
        #expect(try world.stored("b") == nil && world.stored("c") == nil)
        #expect(try world.zoneRow().lastSeq == before.lastSeq, "the zone's log moved for a batch that failed")
        #expect(try world.zoneRow().bytesUsed == before.bytesUsed)
    }

    @Test func aBatchThatIsNotAtomicWritesEveryOperationThatStandsAlone() throws {
        let world = try World()
        #expect(Self.codes(try world.modify([Self.create("a")])) == ["OK"])
        let items = try world.modify([Self.create("b"), Self.create("a"), Self.create("c")], atomic: false)
        #expect(Self.codes(items) == ["OK", "EXISTS", "OK"])
        #expect(try world.stored("b") != nil && world.stored("c") != nil)
    }

    @Test func anAtomicPushWithOneRefusedStateWritesNothing() throws {
        // A list of 4 elements is over this server's cap of 3: that record is refused before any work.
        let world = try World { $0.maximumListElements = 3 }
        let zoneID = try ZoneID(zoneName: "Z", ownerRecordName: world.ann.recordName)
        func frame(_ name: String, tags: Int) throws -> RecordFrame {
            var counter: UInt16 = 0
            func stamp() -> Stamp {
                counter += 1
                return Stamp(hlc: HLC(milliseconds: UInt64(world.h.clock.now) - 1_000, counter: counter), replica: ReplicaID(9))
            }
            var edit = try RecordEdit(creating: RecordID(recordName: name, zoneID: zoneID), recordType: "Item", at: stamp())
            try edit.add((0 ..< tags).map { .int64(Int64($0)) }, to: "tags", at: stamp())
            return try #require(try edit.applied())
        }
        let before = try world.zoneRow()
        for atomic in [true, false] {
            let push = SyncMessage.Push(clientOperationID: nil, atomic: atomic, delta: BinaryCodec.encodeDelta(
                zoneID: zoneID, frames: [try frame("p\(atomic)1", tags: 1), try frame("p\(atomic)2", tags: 4)]))
            let answer = try Deltas(world.core).push(world.caller(), push, replay: nil)
            let items = try JSON.parse(answer.body)["records"]?.arrayValue ?? []
            #expect(Self.codes(items) == (atomic ? ["ATOMIC_ERROR", "LIMIT_EXCEEDED"] : ["OK", "LIMIT_EXCEEDED"]), "atomic \(atomic)")
            #expect(try world.stored("p\(atomic)1") == nil ? atomic : !atomic)
            #expect(try world.stored("p\(atomic)2") == nil)
            if atomic { #expect(try world.zoneRow().lastSeq == before.lastSeq) }
        }
    }

    // MARK: Quotas

    @Test func aWriteOverTheQuotaIsRefusedWritesNothingAndADeleteFreesRoom() throws {
        let world = try World { $0.quotaBytesPerDatabase = 1_500 }
        let big = String(repeating: "q", count: 600)
        #expect(Self.codes(try world.modify([Self.create("a", text: big)])) == ["OK"])
        let before = try world.zoneRow()
        #expect(before.bytesUsed <= 1_500)
        // Two more of the same size cannot fit: atomic, neither is written.
        #expect(Self.codes(try world.modify([Self.create("b", text: big), Self.create("c", text: big)]))
                    .contains("QUOTA_EXCEEDED"))
        #expect(try world.stored("b") == nil && world.stored("c") == nil)
        #expect(try world.zoneRow().bytesUsed == before.bytesUsed)
        // Not atomic: the one that fits is written, the one after it is refused.
        #expect(Self.codes(try world.modify([Self.create("b", text: big), Self.create("c", text: big)], atomic: false))
                    == ["OK", "QUOTA_EXCEEDED"])
        let full = try world.zoneRow().bytesUsed
        #expect(full <= 1_500)
        // A delete leaves a small tombstone: room for another record.
        #expect(Self.codes(try world.modify([.object(["operationType": .string("forceDelete"),
                                                      "record": .object(["recordName": .string("a")])])])) == ["OK"])
        #expect(try world.zoneRow().bytesUsed < full)
        #expect(Self.codes(try world.modify([Self.create("c", text: big)])) == ["OK"])
    }

    @Test func rememberedOperationsAreChargedToThePrivateQuota() throws {
        let world = try World { $0.quotaBytesPerDatabase = 900 }
        let body: [String: JSON] = ["zoneID": world.zone.json, "operations": .array([Self.create("a", text: "small")]),
                                    "clientOperationID": .string(String(repeating: "k", count: 128))]
        let bytes = JSON.object(body).serializedBytes()
        let key = try #require(try ReplayKey.of(body, operation: "/records/modify", bytes: bytes))
        let first = try Records(world.core).modify(world.caller(), body, replay: key)
        #expect(!first.replayed)
        let used = try world.zoneRow().bytesUsed
        let remembered = try world.h.storage.read { try $0.clientOperationCount(userID: world.ann.id) }
        #expect(remembered == 1)
        // The answer remembered counts: the database holds more than the record alone.
        let record = try #require(try world.stored("a")).frame.count
        #expect(used > Int64(record), "used \(used), record \(record)")
        // The retry is answered from what was remembered, and writes nothing more.
        let again = try Records(world.core).modify(world.caller(), body, replay: key)
        #expect(again.replayed && again.body == first.body)
        #expect(try world.zoneRow().bytesUsed == used)
    }

    // MARK: Share membership and participants

    /// Ann's list `L` with item `i` (child of `L`) and a list `M` outside; a hierarchy share of `L`.
    struct Shared {
        let world: World
        let bob: UserAccount
        let shareRecordName: String

        init() throws {
            world = try World()
            _ = try world.h.signUp("bob")
            bob = try #require(try world.h.storage.read { try $0.user(named: "bob") })
            #expect(Self.codes(try world.modify([TypedRuleTests.create("L", type: "List"), TypedRuleTests.create("i", parent: "L"),
                                                TypedRuleTests.create("M", type: "List")])) == ["OK", "OK", "OK"])
            let world = self.world
            let created = try world.core.write { tx, touched in
                try Shares(world.core).createShare(world.caller(), ShareCreateRequest(zoneID: world.zone, rootRecordName: "L")
                    .json.objectValue ?? [:], tx, &touched)
            }
            let name = created["shareRecordName"]?.stringValue ?? created["recordName"]?.stringValue
            guard let name else { throw HarnessError("shares/create answered \(created.serialized())") }
            shareRecordName = name
        }

        static func codes(_ items: [JSON]) -> [String] { TypedRuleTests.codes(items) }

        func members() throws -> Set<String> {
            try world.h.storage.read { tx in
                let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: world.ann.id))
                let zone = try #require(try tx.zone(databaseID: database.id, name: "Z"))
                let share = try #require(try tx.shares(zoneRowID: zone.rowID).first)
                return Set(try ["L", "i", "M"].filter { try Shares(world.core).isMember($0, of: share, zone: zone, tx) })
            }
        }

        func roster() throws -> ShareRoster {
            try world.h.storage.read { tx in
                let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: world.ann.id))
                let zone = try #require(try tx.zone(databaseID: database.id, name: "Z"))
                let share = try #require(try tx.shares(zoneRowID: zone.rowID).first)
                return try Shares(world.core).roster(share, tx)
            }
        }

        func changeParticipants(_ changes: [ShareParticipantChange]) throws -> JSON {
            let request = ShareModifyRequest(target: ShareTarget(zoneID: world.zone, shareRecordName: shareRecordName),
                                             participants: changes)
            return try world.core.write { tx, touched in
                try Shares(world.core).modifyShare(world.caller(), request.json.objectValue ?? [:], tx, &touched)
            }
        }
    }

    @Test func aHierarchyShareHoldsItsRootAndDescendantsAndFollowsParentMoves() throws {
        let shared = try Shared()
        #expect(try shared.members() == ["L", "i"])
        // `i` moves under `M`: it leaves the share; back under `L`: it is in again.
        let move = { (parent: String) -> JSON in
            .object(["operationType": .string("forceUpdate"), "record": .object([
                "recordName": .string("i"), "parent": .object(["recordName": .string(parent), "action": .string("NONE")]),
            ])])
        }
        #expect(Shared.codes(try shared.world.modify([move("M")])) == ["OK"])
        #expect(try shared.members() == ["L"])
        #expect(Shared.codes(try shared.world.modify([move("L")])) == ["OK"])
        #expect(try shared.members() == ["L", "i"])
    }

    @Test func participantsAreInvitedChangedAndRemovedAndTheOwnerStays() throws {
        let shared = try Shared()
        let bob = ParticipantIdentity.userName("bob")
        _ = try shared.changeParticipants([ShareParticipantChange(.invite(.readOnly, role: .privateUser), bob)])
        #expect(try shared.roster().participant(shared.bob.id)?.permission == .readOnly)
        _ = try shared.changeParticipants([ShareParticipantChange(.setPermission(.readWrite), bob)])
        #expect(try shared.roster().participant(shared.bob.id)?.permission == .readWrite)
        _ = try shared.changeParticipants([ShareParticipantChange(.remove, bob)])
        // Kept as removed (so the participant's devices learn they lost the share), with no access.
        #expect(try shared.roster().participant(shared.bob.id)?.status == .removed)
        #expect(try shared.roster().access(of: shared.bob.id) == SharePermission.none)
        // The owner cannot be removed: refused, and the roster is unchanged.
        let before = try shared.roster()
        #expect(throws: ServiceError.self) {
            _ = try shared.changeParticipants([ShareParticipantChange(.remove, .userName("ann"))])
        }
        #expect(try shared.roster() == before)
        #expect(try shared.roster().participant(shared.world.ann.id)?.role == .owner)
    }

    @Test func aReadOnlyParticipantsWriteIsRefusedAndWritesNothing() throws {
        let shared = try Shared()
        _ = try shared.changeParticipants([ShareParticipantChange(.invite(.readOnly, role: .privateUser), .userName("bob"))])
        // Bob accepts through the share's link (an invited participant's accept).
        let link = try shared.world.core.write { tx, touched in
            try Shares(shared.world.core).shareURL(shared.world.caller(), ShareURLRequest(
                target: ShareTarget(zoneID: shared.world.zone, shareRecordName: shared.shareRecordName)).json.objectValue ?? [:],
                tx, &touched)
        }
        let url = try #require(link["url"]?.stringValue, "\(link.serialized())")
        _ = try shared.world.core.write { tx, touched in
            try Shares(shared.world.core).acceptShares(shared.world.caller(shared.bob, .shared),
                                                       ShareLinksRequest(links: [url]).json.objectValue ?? [:], tx, &touched)
        }
        #expect(try shared.roster().participant(shared.bob.id)?.status == .accepted)
        let zone = WireZoneID(zoneName: "Z", ownerRecordName: shared.world.ann.recordName).json
        let before = try shared.world.zoneRow()
        let items = try shared.world.modify([TypedRuleTests.create("j", parent: "L")], as: shared.bob, database: .shared, zone: zone)
        #expect(Shared.codes(items) == ["PERMISSION_FAILURE"])
        #expect(try shared.world.stored("j") == nil)
        #expect(try shared.world.zoneRow().lastSeq == before.lastSeq)
    }
}
