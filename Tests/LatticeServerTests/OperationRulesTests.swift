import Foundation
import LatticeCore
@testable import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Testing

/// Issue point 11: the rules of `LatticeOperations` about share membership, participant changes, quotas and
/// atomic batches, one named test per rule, through the JSON (and binary) API, on SQLite and on PostgreSQL.
/// Each test checks the outcome and that nothing else changed: the owner's records and logs, the roster, and
/// what each participant sees.
@Suite(.tags(.postgres)) struct OperationRulesTests {
    // MARK: - Share membership

    @Test func aHierarchyShareHoldsItsRootAndItsDescendantsByParentOnly() throws {
        let w = try RulesWorld()
        for user in [w.bob, w.carol, w.dave] {
            #expect(w.sharedCodes(["trip", "day1", "stop1", "loose", "spare", "linked"], as: user)
                    == ["OK", "OK", "OK", "NOT_FOUND", "NOT_FOUND", "NOT_FOUND"], "\(user.name)")
            // `linked` points at the root with a DELETE_SELF reference field: only `parent` decides membership.
            let feed = w.feedFromStart(as: user).names
            #expect(Set(feed.keys) == ["trip", "day1", "stop1", w.shareRecordName], "\(user.name): \(feed)")
            #expect(feed.values.allSatisfy { !$0 })
            let queried = w.shared("records/query", ["query": .object(["recordType": .string("Item")])], as: user)
            #expect(Set(queried.records.compactMap { $0["recordName"]?.stringValue }) == ["trip", "day1", "stop1"])
        }
    }

    @Test func movingARecordOutOfTheHierarchyDeletesItAndItsDescendantsForParticipants() throws {
        let w = try RulesWorld()
        let bobFeed = w.feedFromStart(as: w.bob).token
        let carolFeed = w.feedFromStart(as: w.carol).token
        let before = w.ownerRecords()
        w.expectOK(w.ownerModify([operation("forceUpdate", "day1", recordType: nil, extra: parentRef("loose"))]), "move out")
        for (user, token) in [(w.bob, bobFeed), (w.carol, carolFeed)] {
            let since = w.feed(as: user, since: token)
            #expect(since.names == ["day1": true, "stop1": true], "\(user.name): \(since.names)")
            #expect(w.sharedCodes(["trip", "day1", "stop1"], as: user) == ["OK", "NOT_FOUND", "NOT_FOUND"])
        }
        // Only day1's parent changed; the owner still has both records, with their fields.
        let after = w.ownerRecords()
        for (name, record) in zip(RulesWorld.names, after) where name != "day1" {
            #expect(record == before[RulesWorld.names.firstIndex(of: name)!], "\(name) changed")
        }
        #expect(after[1]["parent"]?["recordName"]?.stringValue == "loose")
        #expect(after[1]["fields"] == before[1]["fields"])
    }

    @Test func aRecordMovedIntoTheHierarchyAppearsWithItsDescendants() throws {
        let w = try RulesWorld()
        w.expectOK(w.ownerModify([operation("create", "pebble", fields: ["title": value(.string("pebble"))],
                                            extra: parentRef("loose"))]), "seed pebble")
        let token = w.feedFromStart(as: w.bob).token
        #expect(w.sharedCodes(["loose", "pebble"], as: w.bob) == ["NOT_FOUND", "NOT_FOUND"])
        w.expectOK(w.ownerModify([operation("forceUpdate", "loose", recordType: nil, extra: parentRef("stop1"))]), "move in")
        let since = w.feed(as: w.bob, since: token)
        #expect(since.names == ["loose": false, "pebble": false], "\(since.names)")
        let looked = w.h.lookup(w.sharedZoneID(), ["loose", "pebble"], token: w.bob.token, database: "shared")
        #expect(looked.map { $0["fields"]?["title"]?["value"]?.stringValue } == ["loose", "pebble"])
        // Nothing else entered: spare and linked stay outside.
        #expect(w.sharedCodes(["spare", "linked"], as: w.bob) == ["NOT_FOUND", "NOT_FOUND"])
    }

    @Test func aZoneWideShareHoldsEveryRecordOfTheZoneNowAndLater() throws {
        let w = try RulesWorld()
        let board = "Board"
        try w.h.createZone(board, token: w.ann.token)
        w.expectOK(w.ownerModify([
            operation("create", "x", fields: ["title": value(.string("x"))]),
            operation("create", "y", fields: ["title": value(.string("y"))], extra: parentRef("x")),
        ], zone: board), "seed Board")
        w.expectOK(w.owner("shares/create", [:], zone: board), "zone-wide share")
        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.invite(w.bob, "readWrite")])], zone: board), "invite")
        #expect(w.accept(try w.link(zone: board), as: w.bob)["participantStatus"]?.stringValue == "accepted")
        // Made later, without a parent: in the share too.
        w.expectOK(w.ownerModify([operation("create", "z", fields: ["title": value(.string("z"))])], zone: board), "later")
        #expect(w.sharedCodes(["x", "y", "z"], as: w.bob, zone: board) == ["OK", "OK", "OK"])
        let feed = w.feedFromStart(as: w.bob, zone: board).names
        #expect(Set(feed.keys) == ["x", "y", "z", "cloudkit.zoneshare"], "\(feed)")
        // readWrite in a zone-wide share creates without a parent; the Trips zone stays as it was.
        let trips = w.ownerRecords()
        #expect(itemCode(w.sharedModify([operation("create", "w")], as: w.bob, zone: board).records.first ?? .null) == "OK")
        #expect(w.ownerRecords() == trips)
    }

    @Test func aParticipantsWriteOutsideTheShareAnswersExactlyAsAMissingRecord() throws {
        let w = try RulesWorld()
        let before = w.everything()
        let writes: [(String, (String) -> JSON)] = [
            ("update", { operation("update", $0, recordType: nil, fields: ["title": value(.string("t"))], tag: "tag") }),
            ("forceUpdate", { operation("forceUpdate", $0, recordType: nil, fields: ["title": value(.string("t"))]) }),
            ("replace", { operation("replace", $0, fields: ["title": value(.string("t"))], tag: "tag") }),
            ("delete", { operation("delete", $0, recordType: nil, tag: "tag") }),
            ("forceDelete", { operation("forceDelete", $0, recordType: nil) }),
            ("create", { operation("create", $0, fields: ["title": value(.string("t"))]) }),
        ]
        for user in [w.bob, w.carol] {
            for (label, write) in writes {
                let outside = w.sharedModify([write("spare")], as: user)
                let missing = w.sharedModify([write("sparx")], as: user)
                #expect(outside.status == missing.status, "\(user.name) \(label)")
                let item = outside.records.first ?? .null, other = missing.records.first ?? .null
                #expect(itemCode(item) != "OK", "\(user.name) \(label): \(item.serialized())")
                #expect(itemCode(item) == itemCode(other), "\(user.name) \(label): \(item.serialized()) vs \(other.serialized())")
                #expect(item["reason"]?.stringValue?.replacingOccurrences(of: "spare", with: "sparx")
                        == other["reason"]?.stringValue, "\(user.name) \(label)")
            }
        }
        w.expectUnchanged(since: before)
    }

    // MARK: - Participant changes

    @Test func invitingAddsOnePendingParticipantWhoHasNoAccessUntilAccepting() throws {
        let w = try RulesWorld()
        let eve = try w.signUp("eve")
        let (roster, records) = (w.roster(), w.ownerRecords())
        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.invite(eve, "readOnly")])]), "invite eve")
        var expected = roster
        expected["eve"] = "privateUser readOnly pending"
        #expect(w.roster() == expected)
        #expect(w.ownerRecords() == records)
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("trip")])])], as: eve).code
                == "ZONE_NOT_FOUND")
        #expect(w.accept(try w.link(), as: eve)["participantStatus"]?.stringValue == "accepted")
        expected["eve"] = "privateUser readOnly accepted"
        #expect(w.roster() == expected)
        #expect(w.sharedCodes(["trip", "spare"], as: eve) == ["OK", "NOT_FOUND"])
    }

    @Test func changingAPermissionChangesOnlyThatParticipantsWrites() throws {
        let w = try RulesWorld()
        let roster = w.roster()
        let edit = { (text: String) in [operation("forceUpdate", "stop1", recordType: nil, fields: ["title": value(.string(text))])] }
        #expect(itemCode(w.sharedModify(edit("carol"), as: w.carol).records.first ?? .null) == "PERMISSION_FAILURE")

        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.setPermission(w.carol, "readWrite")])]), "up")
        var expected = roster
        expected["carol"] = "privateUser readWrite accepted"
        #expect(w.roster() == expected)
        #expect(itemCode(w.sharedModify(edit("carol"), as: w.carol).records.first ?? .null) == "OK")

        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.setPermission(w.carol, "readOnly")])]), "down")
        #expect(w.roster() == roster)
        let records = w.ownerRecords()
        #expect(itemCode(w.sharedModify(edit("carol again"), as: w.carol).records.first ?? .null) == "PERMISSION_FAILURE")
        #expect(w.ownerRecords() == records)
        // bob's readWrite was never touched.
        #expect(itemCode(w.sharedModify(edit("bob"), as: w.bob).records.first ?? .null) == "OK")
    }

    @Test func removingAParticipantMakesTheZoneDisappearFromTheirSharedDatabase() throws {
        let w = try RulesWorld()
        let databaseToken = try #require(w.h.call("changes/database", token: w.bob.token, database: "shared")["syncToken"]?.stringValue)
        let (roster, records) = (w.roster(), w.ownerRecords())
        let carolView = w.participantView(w.carol)
        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.remove(w.bob)])]), "remove bob")
        var expected = roster
        expected["bob"] = "privateUser readWrite removed"
        #expect(w.roster() == expected)
        #expect(w.ownerRecords() == records)

        let after = w.h.call("changes/database", .object(["syncToken": .string(databaseToken)]), token: w.bob.token, database: "shared")
        #expect(after.zones.count == 1, "\(after.json.serialized())")
        #expect(after.zones.first?["zoneID"]?["zoneName"]?.stringValue == RulesWorld.zone)
        #expect(after.zones.first?["deleted"] == .bool(true), "\(after.json.serialized())")
        #expect(w.h.call("zones/list", token: w.bob.token, database: "shared").zones.isEmpty)
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("trip")])])], as: w.bob).code
                == "ZONE_NOT_FOUND")
        // carol keeps her access; only the share record (its roster) moved in her feed.
        #expect(w.sharedCodes(["trip", "day1", "stop1"], as: w.carol) == ["OK", "OK", "OK"])
        let since = w.feed(as: w.carol, since: carolView.feedToken)
        #expect(since.names == [w.shareRecordName: false], "\(since.names)")
    }

    @Test func reinvitingARemovedParticipantMakesThemPendingWithoutAccessUntilTheyAccept() throws {
        let w = try RulesWorld()
        let roster = w.roster()
        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.remove(w.bob)])]), "remove bob")
        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.invite(w.bob, "readOnly")])]), "invite again")
        var expected = roster
        expected["bob"] = "privateUser readOnly pending"
        #expect(w.roster() == expected)
        #expect(w.shared("records/lookup", ["records": .array([.object(["recordName": .string("trip")])])], as: w.bob).code
                == "ZONE_NOT_FOUND")
        #expect(w.accept(try w.link(), as: w.bob)["participantStatus"]?.stringValue == "accepted")
        expected["bob"] = "privateUser readOnly accepted"
        #expect(w.roster() == expected)
        // Back in at the permission of the new invitation, not the old one.
        let records = w.ownerRecords()
        let write = w.sharedModify([operation("forceUpdate", "stop1", recordType: nil, fields: ["title": value(.string("bob"))])], as: w.bob)
        #expect(write.records.map(itemCode) == ["PERMISSION_FAILURE"])
        #expect(w.ownerRecords() == records)
    }

    @Test func theHundredAndFirstParticipantIsRefusedAndNothingIsWritten() throws {
        let w = try RulesWorld()
        // ann, bob, carol and dave: 4. 95 more make 99; a request adding two is refused whole.
        var guests: [RulesWorld.User] = []
        for index in 0..<97 { guests.append(try w.signUp("guest\(index)")) }
        w.expectOK(w.owner("shares/modify", ["participants": .array(guests.prefix(95).map { RulesWorld.invite($0, "readOnly") })]),
                   "95 invitations")
        #expect(w.activeParticipants() == 99)
        var before = w.everything()
        let two = w.owner("shares/modify", ["participants": .array([RulesWorld.invite(guests[95], "readOnly"),
                                                                    RulesWorld.invite(guests[96], "readOnly")])])
        #expect(two.status == 409 && two.code == "TOO_MANY_PARTICIPANTS", "\(two.json.serialized())")
        w.expectUnchanged(since: before)

        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.invite(guests[95], "readOnly")])]), "the 100th")
        #expect(w.activeParticipants() == 100)
        before = w.everything()
        let last = w.owner("shares/modify", ["participants": .array([RulesWorld.invite(guests[96], "readOnly")])])
        #expect(last.status == 409 && last.code == "TOO_MANY_PARTICIPANTS", "\(last.json.serialized())")
        w.expectUnchanged(since: before)
        #expect(w.roster()["guest96"] == nil)
    }

    @Test func theOwnerCannotBeRemovedNorLoseWriteAccess() throws {
        let w = try RulesWorld()
        let before = w.everything()
        let ownRemoval = w.owner("shares/modify", ["participants": .array([RulesWorld.remove(w.ann)])])
        #expect(ownRemoval.code == "PERMISSION_FAILURE", "\(ownRemoval.json.serialized())")
        let byAdministrator = w.shared("shares/modify", ["participants": .array([RulesWorld.remove(w.ann)])], as: w.dave)
        #expect(byAdministrator.code == "PERMISSION_FAILURE", "\(byAdministrator.json.serialized())")
        let readOnly = w.owner("shares/modify", ["participants": .array([RulesWorld.setPermission(w.ann, "readOnly")])])
        #expect(readOnly.code == "PERMISSION_FAILURE", "\(readOnly.json.serialized())")
        // The refusal is all or nothing: bob's removal in the same request did not happen either.
        let mixed = w.owner("shares/modify", ["participants": .array([RulesWorld.remove(w.bob), RulesWorld.remove(w.ann)])])
        #expect(mixed.code == "PERMISSION_FAILURE", "\(mixed.json.serialized())")
        w.expectUnchanged(since: before)
        #expect(w.roster()["ann"] == "owner readWrite accepted")
    }

    @Test func aReadOnlyParticipantsWriteIsPermissionFailureAndWritesNothing() throws {
        let w = try RulesWorld()
        let before = w.everything()
        let writes: [JSON] = [
            operation("forceUpdate", "stop1", recordType: nil, fields: ["title": value(.string("carol"))]),
            operation("create", "stop2", fields: ["title": value(.string("carol"))], extra: parentRef("day1")),
            operation("forceDelete", "stop1", recordType: nil),
            operation("forceUpdate", "day1", recordType: nil, extra: parentRef("stop1")),
        ]
        for write in writes {
            let reply = w.sharedModify([write], as: w.carol)
            #expect(reply.status == 200 && reply.records.map(itemCode) == ["PERMISSION_FAILURE"], "\(reply.json.serialized())")
        }
        let batch = w.sharedModify(writes, as: w.carol, atomic: false)
        #expect(batch.records.map(itemCode) == Array(repeating: "PERMISSION_FAILURE", count: writes.count), "\(batch.json.serialized())")
        w.expectUnchanged(since: before)
    }

    // MARK: - Quotas

    @Test func aWriteOverTheQuotaIsQuotaExceededAndWritesNothing() throws {
        let q = try QuotaWorld()
        q.expectOK(q.modify([q.blob("b0"), q.blob("b1"), q.blob("b2")]), "three blobs")
        let before = q.snapshot(), bytes = try q.bytes()
        let refused = q.modify([q.blob("b3")])
        #expect(refused.records.map(itemCode) == ["QUOTA_EXCEEDED"], "\(refused.json.serialized())")
        #expect(q.snapshot() == before)
        #expect(try q.bytes() == bytes)
        #expect(bytes <= q.quota)
    }

    @Test func deletingARecordFreesRoomForTheNextWrite() throws {
        let q = try QuotaWorld()
        q.expectOK(q.modify([q.blob("b0"), q.blob("b1"), q.blob("b2")]), "three blobs")
        #expect(q.modify([q.blob("b3")]).records.map(itemCode) == ["QUOTA_EXCEEDED"])
        let full = try q.bytes()
        q.expectOK(q.modify([operation("forceDelete", "b0", recordType: nil)]), "delete b0")
        let freed = try q.bytes()
        #expect(freed < full - q.sizes.blob / 2, "a delete freed only \(full - freed) bytes")
        q.expectOK(q.modify([q.blob("b3")]), "b3 after the delete")
        #expect(try q.bytes() <= q.quota)
        #expect(q.h.lookup(q.zoneID, ["b0", "b1", "b2", "b3"], token: q.token).map(itemCode)
                == ["NOT_FOUND", "OK", "OK", "OK"])
    }

    @Test func aNonAtomicBatchWritesOnlyTheRecordsThatFit() throws {
        let q = try QuotaWorld()
        let names = ["b0", "b1", "b2", "b3", "b4", "s0"]
        let batch = q.modify(names.map { $0.hasPrefix("b") ? q.blob($0) : q.small($0) }, atomic: false)
        // Room for three blobs and a half: the fourth and fifth are refused, the small record after them fits.
        #expect(batch.records.map(itemCode) == ["OK", "OK", "OK", "QUOTA_EXCEEDED", "QUOTA_EXCEEDED", "OK"],
                "\(batch.records.map(itemCode)) with \(q.sizes)")
        #expect(q.h.lookup(q.zoneID, names, token: q.token).map(itemCode) == ["OK", "OK", "OK", "NOT_FOUND", "NOT_FOUND", "OK"])
        // Frames vary by a few bytes with their stamps.
        let bytes = try q.bytes()
        #expect(bytes <= q.quota && abs(bytes - (q.sizes.empty + 3 * q.sizes.blob + q.sizes.small)) <= 32, "\(bytes) with \(q.sizes)")
        // The same batch atomically, in a fresh world, writes nothing.
        let fresh = try QuotaWorld()
        let before = fresh.snapshot()
        let atomic = fresh.modify(names.map { $0.hasPrefix("b") ? fresh.blob($0) : fresh.small($0) })
        #expect(atomic.records.map(itemCode) == ["ATOMIC_ERROR", "ATOMIC_ERROR", "ATOMIC_ERROR", "QUOTA_EXCEEDED",
                                                 "QUOTA_EXCEEDED", "ATOMIC_ERROR"], "\(atomic.json.serialized())")
        #expect(fresh.snapshot() == before)
    }

    @Test func rememberedClientOperationIDsTakeRoomFromTheQuotaUntilPurged() throws {
        let q = try QuotaWorld()
        let ids = ["b0", "b1"].map { "remember-\($0)-" + String(repeating: "k", count: 100) }
        for (name, id) in zip(["b0", "b1"], ids) { q.expectOK(q.modify([q.blob(name)], id: id), name) }
        var remembered: Int64 = 0
        for id in ids {
            remembered += try #require(try ReplayCacheTests.remembered(q.h, "ann", id)).storedBytes(operationID: id)
        }
        let used = try q.bytes()
        // The records' frames vary by a few bytes with their stamps; the remembered answers are all the rest.
        #expect(abs(used - remembered - (q.sizes.empty + 2 * q.sizes.blob)) <= 16, "used \(used) with \(q.sizes)")
        // A record that fits beside the records alone but not beside the remembered answers as well: it takes
        // the room left and half of what the answers hold.
        let room = q.quota - used
        let target = room + remembered / 2
        print("[rules] quota \(q.quota), used \(used), remembered \(remembered), a write of about \(target) bytes")
        #expect(room > 0 && target < q.quota - (used - remembered))
        let text = String(repeating: "m", count: Int(target - (q.sizes.blob - Int64(QuotaWorld.blobLength))))
        let middle = operation("create", "m0", fields: ["blob": value(.string(text))])
        let before = q.snapshot()
        let refused = q.modify([middle])
        #expect(refused.records.map(itemCode) == ["QUOTA_EXCEEDED"], "\(refused.json.serialized())")
        #expect(q.snapshot() == before)
        #expect(try q.bytes() == used)
        // Past the horizon the remembered answers are purged, their charge is given back, and the write fits.
        q.h.clock.advance(q.h.service.configuration.clientOperationHorizonMilliseconds + 1)
        #expect(try q.h.service.purgeExpired().clientOperations == 2)
        #expect(try q.bytes() == used - remembered)
        q.expectOK(q.modify([middle]), "m0 after the purge")
        #expect(try q.bytes() <= q.quota)
    }

    @Test func aParticipantsRecordIsChargedToTheOwnerAndTheirRememberedAnswerToThemselves() throws {
        let w = try RulesWorld()
        let (annBefore, bobBefore) = (try ReplayCacheTests.privateBytes(w.h, "ann"), try ReplayCacheTests.privateBytes(w.h, "bob"))
        let reply = w.sharedModify([operation("create", "stop2", fields: ["title": value(.string("bob's"))], extra: parentRef("day1"))],
                                   as: w.bob, extra: ["clientOperationID": .string("bob-1")])
        w.expectOK(reply, "bob's create")
        let kept = try #require(try ReplayCacheTests.remembered(w.h, "bob", "bob-1"))
        #expect(try ReplayCacheTests.remembered(w.h, "ann", "bob-1") == nil)
        #expect(try ReplayCacheTests.privateBytes(w.h, "bob") == bobBefore + kept.storedBytes(operationID: "bob-1"))
        let annAfter = try ReplayCacheTests.privateBytes(w.h, "ann")
        #expect(annAfter > annBefore, "the record is the owner's to hold")
        #expect(annAfter - annBefore < 1_000, "ann was charged \(annAfter - annBefore) bytes for one small record")
    }

    @Test func aParticipantsWriteCountsAgainstTheOwnersQuotaNotTheirs() throws {
        let probe = try RulesWorld()
        let seeded = try ReplayCacheTests.privateBytes(probe.h, "ann")
        let quota = seeded + Int64(QuotaWorld.blobLength) / 2
        let w = try RulesWorld { $0.quotaBytesPerDatabase = quota }
        let before = w.everything()
        let bobBytes = try ReplayCacheTests.privateBytes(w.h, "bob")
        let blob = operation("create", "stop2", fields: ["blob": value(.string(String(repeating: "z", count: QuotaWorld.blobLength)))],
                             extra: parentRef("day1"))
        let refused = w.sharedModify([blob], as: w.bob)
        #expect(refused.records.map(itemCode) == ["QUOTA_EXCEEDED"], "\(refused.json.serialized())")
        w.expectUnchanged(since: before)
        #expect(try ReplayCacheTests.privateBytes(w.h, "bob") == bobBytes)
        // A small one fits in what is left.
        w.expectOK(w.sharedModify([operation("create", "stop2", extra: parentRef("day1"))], as: w.bob), "a small record")
        #expect(try ReplayCacheTests.privateBytes(w.h, "ann") <= quota)
    }

    @Test func rosterChangesThatGrowTheShareRecordPastTheQuotaAreRefused() throws {
        let probe = try RulesWorld()
        let seeded = try ReplayCacheTests.privateBytes(probe.h, "ann")
        let quota = seeded + 300
        let w = try RulesWorld { $0.quotaBytesPerDatabase = quota }
        var guests: [RulesWorld.User] = []
        for index in 0..<40 { guests.append(try w.signUp("guest\(index)")) }
        let before = w.everything()
        let reply = w.owner("shares/modify", ["participants": .array(guests.map { RulesWorld.invite($0, "readOnly") })])
        let used = try ReplayCacheTests.privateBytes(w.h, "ann")
        print("[rules] quota \(quota), seeded \(seeded), after 40 invitations \(used): \(reply.status) \(reply.code ?? "OK")")
        #expect(reply.code == "QUOTA_EXCEEDED", "\(reply.status) \(reply.code ?? "OK"): the database holds \(used) of \(quota) bytes")
        #expect(used <= quota)
        w.expectUnchanged(since: before)
    }

    @Test func aFullDatabaseCanStillShedParticipantsButNotTakeNewOnes() throws {
        let probe = try RulesWorld()
        let seeded = try ReplayCacheTests.privateBytes(probe.h, "ann")
        // Full, give or take: two worlds' sizes differ by a few bytes (names and tokens are random), and the
        // share record is largest before the invitations are accepted, so the world gets a little room to
        // be made, and the invitation below asks for four times as much.
        let w = try RulesWorld { $0.quotaBytesPerDatabase = seeded + 128 }
        var guests: [RulesWorld.User] = []
        for index in 0..<4 { guests.append(try w.signUp("guest\(index)")) }
        let invited = w.owner("shares/modify", ["participants": .array(guests.map { RulesWorld.invite($0, "readOnly") })])
        #expect(invited.code == "QUOTA_EXCEEDED", "\(invited.status) \(invited.code ?? "OK")")
        w.expectOK(w.owner("shares/modify", ["participants": .array([RulesWorld.remove(w.bob)])]), "removing bob from a full database")
        #expect(try ReplayCacheTests.privateBytes(w.h, "ann") <= seeded + 128 + 200, "a removal may grow the record by its tombstones only")
    }

    // MARK: - Atomic batches

    @Test func anAtomicBatchWithOneFailureWritesNothingAndAnswersEveryOtherItemAtomicError() throws {
        let w = try RulesWorld()
        let before = w.everything()
        let seq = try w.zoneSeq()
        let reply = w.ownerModify(RulesWorld.mixedBatch)
        #expect(reply.status == 200)
        #expect(reply.records.map(itemCode) == ["ATOMIC_ERROR", "ATOMIC_ERROR", "NOT_FOUND", "ATOMIC_ERROR"], "\(reply.json.serialized())")
        #expect(reply.records.map { $0["recordName"]?.stringValue } == ["fresh", "loose", "ghost", "spare"])
        #expect(reply.records.filter { itemCode($0) == "ATOMIC_ERROR" }.allSatisfy { $0["reason"]?.stringValue?.contains("atomic") == true })
        w.expectUnchanged(since: before)
        #expect(try w.zoneSeq() == seq)
    }

    @Test func aNonAtomicBatchWritesEveryOperationThatSucceeds() throws {
        let w = try RulesWorld()
        let seq = try #require(try w.zoneSeq())
        let records = w.ownerRecords()
        let reply = w.ownerModify(RulesWorld.mixedBatch, atomic: false)
        #expect(reply.records.map(itemCode) == ["OK", "OK", "NOT_FOUND", "OK"], "\(reply.json.serialized())")
        #expect(try w.zoneSeq() == seq + 3)
        let after = w.ownerRecords()
        for (index, name) in RulesWorld.names.enumerated() {
            switch name {
            case "loose": #expect(after[index]["fields"]?["title"]?["value"]?.stringValue == "edited")
            case "spare": #expect(itemCode(after[index]) == "NOT_FOUND", "\(after[index].serialized())")
            default: #expect(after[index] == records[index], "\(name) changed")
            }
        }
        #expect(w.h.lookup(w.ownerZoneID(), ["fresh", "ghost"], token: w.ann.token).map(itemCode) == ["OK", "NOT_FOUND"])
    }

    @Test func aParticipantsAtomicBatchWithOneRecordOutsideTheShareWritesNothing() throws {
        let w = try RulesWorld()
        let before = w.everything()
        let seq = try w.zoneSeq()
        let batch = [operation("forceUpdate", "stop1", recordType: nil, fields: ["title": value(.string("bob"))]),
                     operation("forceUpdate", "spare", recordType: nil, fields: ["title": value(.string("bob"))])]
        #expect(w.sharedModify(batch, as: w.bob).records.map(itemCode) == ["ATOMIC_ERROR", "NOT_FOUND"])
        w.expectUnchanged(since: before)
        #expect(try w.zoneSeq() == seq)
        let token = before.participantFeedToken(w.carol)
        #expect(w.sharedModify(batch, as: w.bob, atomic: false).records.map(itemCode) == ["OK", "NOT_FOUND"])
        #expect(w.feed(as: w.carol, since: token).names == ["stop1": false])
        #expect(w.ownerRecords()[RulesWorld.names.firstIndex(of: "spare")!] == before.ownerRecord("spare"))
    }

    @Test func anAtomicPushWithOneFailureWritesNothingAndANonAtomicOneWritesTheOthers() throws {
        let w = try RulesWorld()
        let zoneID = try ZoneID(zoneName: RulesWorld.zone, ownerRecordName: w.ann.recordName)
        var device = DeviceStates(zoneID: zoneID, replica: 0xD1, clock: w.h.clock)
        // `loose` is an Item; a state of it as a Note is refused (a record keeps its type).
        let stored = try #require(w.h.lookup(w.ownerZoneID(), ["loose"], token: w.ann.token).first)
        device.observe(try Record(cloudKitJSON: stored, zoneID: zoneID))
        let states = [try device.make("loose", type: "Note", fields: ["title": .string("a note")]),
                      try device.make("p1", fields: ["title": .string("p1")], parent: "trip"),
                      try device.make("p2", fields: ["title": .string("p2")])]
        let before = w.everything()
        let seq = try w.zoneSeq()
        let atomic = w.h.push(try DeltaBytes.push(zoneID, states), token: w.ann.token)
        #expect(atomic.status == 200 && atomic.records.map(itemCode) == ["BAD_REQUEST", "ATOMIC_ERROR", "ATOMIC_ERROR"],
                "\(atomic.json.serialized())")
        w.expectUnchanged(since: before)
        #expect(try w.zoneSeq() == seq)

        let partial = w.h.push(try DeltaBytes.push(zoneID, states, atomic: false), token: w.ann.token)
        #expect(partial.records.map(itemCode) == ["BAD_REQUEST", "OK", "OK"], "\(partial.json.serialized())")
        #expect(try w.zoneSeq() == seq.map { $0 + 2 })
        #expect(w.ownerRecords() == before.ownerRecords)
        // p1 went into the hierarchy: participants see it, and only it.
        #expect(w.feed(as: w.bob, since: before.participantFeedToken(w.bob)).names == ["p1": false])
    }

    @Test func aFailedAtomicBatchLeavesEveryLogWhereItWas() throws {
        let w = try RulesWorld()
        let before = w.everything()
        let seq = try w.zoneSeq()
        let databaseToken = w.h.call("changes/database", token: w.ann.token)["syncToken"]
        // Through records/modify by the owner, by a readWrite participant, and through deltas/push.
        _ = w.ownerModify(RulesWorld.mixedBatch)
        _ = w.sharedModify([operation("create", "stop2", extra: parentRef("day1")), operation("forceDelete", "trip", recordType: nil)],
                           as: w.bob)
        let zoneID = try ZoneID(zoneName: RulesWorld.zone, ownerRecordName: w.ann.recordName)
        var device = DeviceStates(zoneID: zoneID, replica: 0xD2, clock: w.h.clock)
        let stored = try #require(w.h.lookup(w.ownerZoneID(), ["spare"], token: w.ann.token).first)
        device.observe(try Record(cloudKitJSON: stored, zoneID: zoneID))
        _ = w.h.push(try DeltaBytes.push(zoneID, [try device.make("q1"), try device.make("spare", type: "Note")]), token: w.ann.token)
        #expect(try w.zoneSeq() == seq)
        #expect(w.h.call("changes/database", token: w.ann.token)["syncToken"] == databaseToken)
        w.expectUnchanged(since: before)
        for user in [w.bob, w.carol, w.dave] {
            #expect(w.feed(as: user, since: before.participantFeedToken(user)).names.isEmpty, "\(user.name)")
        }
    }
}

// MARK: - Worlds

/// ann's zone Trips: `trip` <- `day1` <- `stop1` (by parent), and `loose`, `spare` and `linked` (a DELETE_SELF
/// reference field to `trip`, no parent) outside. A hierarchy share of `trip` that bob (readWrite), carol
/// (readOnly) and dave (an administrator, readWrite) accepted.
struct RulesWorld {
    struct User: Sendable {
        let name: String
        let token: String
        let recordName: String
    }

    static let zone = "Trips"
    static let names = ["trip", "day1", "stop1", "loose", "spare", "linked"]
    /// Creates `fresh`, edits `loose`, updates the missing `ghost` (NOT_FOUND) and deletes `spare`.
    static let mixedBatch = [
        operation("create", "fresh", fields: ["title": value(.string("fresh"))]),
        operation("forceUpdate", "loose", recordType: nil, fields: ["title": value(.string("edited"))]),
        operation("update", "ghost", recordType: nil, fields: ["title": value(.string("x"))], tag: "tag"),
        operation("forceDelete", "spare", recordType: nil),
    ]

    let h: ServiceHarness
    let ann: User, bob: User, carol: User, dave: User
    let shareRecordName: String

    init(configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
        let h = try ServiceHarness(configure: configure)
        self.h = h
        func user(_ name: String) throws -> User {
            let (token, recordName) = try h.signUp(name)
            return User(name: name, token: token, recordName: recordName)
        }
        ann = try user("ann")
        bob = try user("bob")
        carol = try user("carol")
        dave = try user("dave")
        try h.createZone(Self.zone, token: ann.token)
        let reference: JSON = .object(["type": .string("REFERENCE"), "value": .object([
            "recordName": .string("trip"), "action": .string("DELETE_SELF")])])
        try Self.require(h.modify(Self.zone, [
            operation("create", "trip", fields: ["title": value(.string("trip"))]),
            operation("create", "day1", fields: ["title": value(.string("day1"))], extra: parentRef("trip")),
            operation("create", "stop1", fields: ["title": value(.string("stop1"))], extra: parentRef("day1")),
            operation("create", "loose", fields: ["title": value(.string("loose"))]),
            operation("create", "spare", fields: ["title": value(.string("spare"))]),
            operation("create", "linked", fields: ["title": value(.string("linked")), "about": reference]),
        ], token: ann.token), "seed")
        let zoneID: JSON = .object(["zoneName": .string(Self.zone)])
        let created = h.call("shares/create", .object(["zoneID": zoneID, "rootRecordName": .string("trip")]), token: ann.token)
        try Self.require(created, "shares/create")
        guard let shareRecordName = created["shareRecordName"]?.stringValue else {
            throw HarnessError("shares/create: \(created.json.serialized())")
        }
        self.shareRecordName = shareRecordName
        try Self.require(h.call("shares/modify", .object(["zoneID": zoneID, "participants": .array([
            Self.invite(bob, "readWrite"), Self.invite(carol, "readOnly"), Self.invite(dave, "readWrite", role: "administrator"),
        ])]), token: ann.token), "invitations")
        let link = try self.link()
        for participant in [bob, carol, dave] {
            guard accept(link, as: participant)["participantStatus"]?.stringValue == "accepted" else {
                throw HarnessError("\(participant.name) could not accept")
            }
        }
    }

    static func require(_ reply: ServiceHarness.Reply, _ what: String) throws {
        if reply.status != 200 || reply.code != nil || reply.records.contains(where: { $0["serverErrorCode"] != nil }) {
            throw HarnessError("\(what): \(reply.status) \(reply.json.serialized())")
        }
    }

    func expectOK(_ reply: ServiceHarness.Reply, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(throws: Never.self, sourceLocation: sourceLocation) { try Self.require(reply, what) }
    }

    func signUp(_ name: String) throws -> User {
        let (token, recordName) = try h.signUp(name)
        return User(name: name, token: token, recordName: recordName)
    }

    static func invite(_ user: User, _ permission: String, role: String? = nil) -> JSON {
        var object: [String: JSON] = ["operation": .string("invite"), "userName": .string(user.name),
                                      "permission": .string(permission)]
        if let role { object["role"] = .string(role) }
        return .object(object)
    }

    static func setPermission(_ user: User, _ permission: String) -> JSON {
        .object(["operation": .string("setPermission"), "userName": .string(user.name), "permission": .string(permission)])
    }

    static func remove(_ user: User) -> JSON {
        .object(["operation": .string("remove"), "userName": .string(user.name)])
    }

    // Calls

    func ownerZoneID(_ zone: String = zone) -> JSON { .object(["zoneName": .string(zone)]) }

    func sharedZoneID(_ zone: String = zone) -> JSON {
        .object(["zoneName": .string(zone), "ownerRecordName": .string(ann.recordName)])
    }

    func owner(_ operation: String, _ body: [String: JSON], zone: String = zone) -> ServiceHarness.Reply {
        var body = body
        body["zoneID"] = ownerZoneID(zone)
        return h.call(operation, .object(body), token: ann.token)
    }

    func shared(_ operation: String, _ body: [String: JSON], as user: User, zone: String = zone) -> ServiceHarness.Reply {
        var body = body
        body["zoneID"] = sharedZoneID(zone)
        return h.call(operation, .object(body), token: user.token, database: "shared")
    }

    func ownerModify(_ operations: [JSON], zone: String = zone, atomic: Bool = true) -> ServiceHarness.Reply {
        owner("records/modify", ["operations": .array(operations), "atomic": .bool(atomic)], zone: zone)
    }

    func sharedModify(_ operations: [JSON], as user: User, zone: String = zone, atomic: Bool = true,
                      extra: [String: JSON] = [:]) -> ServiceHarness.Reply {
        var body = extra
        body["operations"] = .array(operations)
        body["atomic"] = .bool(atomic)
        return shared("records/modify", body, as: user, zone: zone)
    }

    func link(zone: String = zone) throws -> String {
        let reply = owner("shares/url", [:], zone: zone)
        return try #require(reply["url"]?.stringValue, "shares/url: \(reply.json.serialized())")
    }

    func accept(_ link: String, as user: User) -> JSON {
        let reply = h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(link)])])]),
                           token: user.token, database: "shared")
        return reply.code == nil ? (reply["results"]?.arrayValue?.first ?? .null) : reply.json
    }

    /// Each named record's code in a participant's `records/lookup`.
    func sharedCodes(_ names: [String], as user: User, zone: String = zone) -> [String] {
        h.lookup(sharedZoneID(zone), names, token: user.token, database: "shared").map(itemCode)
    }

    // What there is

    /// The owner's lookup of every seeded record, in `names` order.
    func ownerRecords() -> [JSON] { h.lookup(ownerZoneID(), Self.names, token: ann.token) }

    /// The roster: user name -> "role permission status".
    func roster() -> [String: String] {
        var roster: [String: String] = [:]
        for participant in owner("shares/lookup", [:])["participants"]?.arrayValue ?? [] {
            let fields = ["role", "permission", "acceptanceStatus"].map { participant[$0]?.stringValue ?? "?" }
            roster[participant["name"]?.stringValue ?? "?"] = fields.joined(separator: " ")
        }
        return roster
    }

    func activeParticipants() -> Int { roster().values.filter { !$0.hasSuffix(" removed") }.count }

    struct Feed {
        var names: [String: Bool] = [:]
        var token: String?
    }

    /// A participant's `changes/zone` from `token` to the end: name -> deleted (the last entry of a name wins).
    func feed(as user: User, since token: String?, zone: String = zone,
              sourceLocation: SourceLocation = #_sourceLocation) -> Feed {
        var feed = Feed(token: token)
        for _ in 0..<50 {
            let page = h.zonePage(sharedZoneID(zone), syncToken: feed.token, token: user.token, database: "shared")
            guard page["serverErrorCode"] == nil, page != .null else {
                Issue.record("feed of \(user.name): \(page.serialized())", sourceLocation: sourceLocation)
                return feed
            }
            for record in page["records"]?.arrayValue ?? [] {
                feed.names[record["recordName"]?.stringValue ?? ""] = record["deleted"] == .bool(true)
            }
            feed.token = page["syncToken"]?.stringValue
            if page["moreComing"] != .bool(true) { break }
        }
        return feed
    }

    func feedFromStart(as user: User, zone: String = zone) -> Feed { feed(as: user, since: nil, zone: zone) }

    /// What a participant sees: their shared database's feed and zones, and their whole feed of the zone.
    struct ParticipantView: Equatable {
        let database: JSON
        let zones: JSON
        let feed: [String: Bool]
        let feedToken: String?
    }

    func participantView(_ user: User) -> ParticipantView {
        let feed = feedFromStart(as: user)
        return ParticipantView(database: h.call("changes/database", token: user.token, database: "shared").json,
                               zones: h.call("zones/list", token: user.token, database: "shared").json,
                               feed: feed.names, feedToken: feed.token)
    }

    /// Everything a rule may change: the owner's zone (its whole feed, token and records) and database log, the
    /// roster, and each participant's view. Equal before and after means nothing was written.
    struct Everything: Equatable {
        let owner: JSON
        let ownerRecords: [JSON]
        let roster: [String: String]
        let participants: [String: ParticipantView]

        func participantFeedToken(_ user: User) -> String? { participants[user.name]?.feedToken }

        /// The parts that differ from `other`, by name (for a short failure message).
        func changes(since other: Everything) -> [String] {
            var parts: [String] = []
            if owner != other.owner { parts.append("the owner's zone or logs") }
            if ownerRecords != other.ownerRecords { parts.append("the owner's records") }
            if roster != other.roster { parts.append("the roster: \(other.roster) -> \(roster)") }
            for name in participants.keys.sorted() where participants[name] != other.participants[name] {
                parts.append("\(name)'s view")
            }
            return parts
        }
        func ownerRecord(_ name: String) -> JSON { ownerRecords[RulesWorld.names.firstIndex(of: name)!] }
    }

    /// Expects `everything()` to equal `before`, naming what changed if not.
    func expectUnchanged(since before: Everything, sourceLocation: SourceLocation = #_sourceLocation) {
        let changes = everything().changes(since: before)
        #expect(changes.isEmpty, "changed: \(changes.joined(separator: "; "))", sourceLocation: sourceLocation)
    }

    func everything() -> Everything {
        Everything(owner: h.snapshot(Self.zone, names: Self.names, token: ann.token), ownerRecords: ownerRecords(),
                   roster: roster(),
                   participants: Dictionary(uniqueKeysWithValues: [bob, carol, dave].map { ($0.name, participantView($0)) }))
    }

    /// The last position of the zone's change log.
    func zoneSeq() throws -> Int64? {
        try h.storage.read { tx in
            let account = try #require(try tx.user(named: "ann"))
            let database = try tx.database(DatabaseKey(kind: .private, environment: "production", ownerID: account.id))
            return try tx.zone(databaseID: database.id, name: Self.zone)?.lastSeq
        }
    }
}

/// ann alone with an empty zone Trips, under a quota with room for three and a half blobs (records of one
/// `blobLength`-byte field). The sizes are measured first on a service without a quota making the same writes.
struct QuotaWorld {
    struct Sizes: CustomStringConvertible {
        /// The private database's bytes with the empty zone, one blob record, one small record.
        let empty: Int64, blob: Int64, small: Int64
        var description: String { "empty \(empty), blob \(blob), small \(small)" }
    }

    static let blobLength = 3_000
    let h: ServiceHarness
    let token: String
    let sizes: Sizes
    let quota: Int64
    let zoneID: JSON = .object(["zoneName": .string(RulesWorld.zone)])

    init() throws {
        let probe = try ServiceHarness()
        let probeToken = try probe.signUp("ann").token
        try probe.createZone(RulesWorld.zone, token: probeToken)
        let empty = try ReplayCacheTests.privateBytes(probe, "ann")
        try RulesWorld.require(probe.modify(RulesWorld.zone, [Self.blob("b9")], token: probeToken), "probe blob")
        let oneBlob = try ReplayCacheTests.privateBytes(probe, "ann")
        try RulesWorld.require(probe.modify(RulesWorld.zone, [Self.small("s9")], token: probeToken), "probe small")
        let small = try ReplayCacheTests.privateBytes(probe, "ann") - oneBlob
        sizes = Sizes(empty: empty, blob: oneBlob - empty, small: small)
        precondition(small < sizes.blob / 4, "a small record must fit in half a blob: \(sizes)")
        let quota = empty + 3 * sizes.blob + sizes.blob / 2
        self.quota = quota
        h = try ServiceHarness { $0.quotaBytesPerDatabase = quota }
        token = try h.signUp("ann").token
        try h.createZone(RulesWorld.zone, token: token)
    }

    static func blob(_ name: String) -> JSON {
        operation("create", name, fields: ["blob": value(.string(String(repeating: "z", count: blobLength)))])
    }

    static func small(_ name: String) -> JSON { operation("create", name, fields: ["blob": value(.string("s"))]) }

    func blob(_ name: String) -> JSON { Self.blob(name) }
    func small(_ name: String) -> JSON { Self.small(name) }

    func modify(_ operations: [JSON], atomic: Bool = true, id: String? = nil) -> ServiceHarness.Reply {
        var extra: [String: JSON] = ["atomic": .bool(atomic)]
        if let id { extra["clientOperationID"] = .string(id) }
        return h.modify(RulesWorld.zone, operations, token: token, extra: extra)
    }

    func bytes() throws -> Int64 { try ReplayCacheTests.privateBytes(h, "ann") }

    func snapshot() -> JSON { h.snapshot(RulesWorld.zone, names: ["b0", "b1", "b2", "b3", "b4", "s0", "m0"], token: token) }

    func expectOK(_ reply: ServiceHarness.Reply, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
        #expect(throws: Never.self, sourceLocation: sourceLocation) { try RulesWorld.require(reply, what) }
    }
}
