import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// `deltas/push` holds to every rule of `records/modify`: authentication, the media type, bad bytes refused
/// whole and named, the limits and quotas, atomic batches and `clientOperationID` idempotency. In-process.
@Suite struct DeltaPushTests {
    /// ann with zone `Lists` holding `a` and `b` (plain creates), and a device making states for it.
    struct World {
        let h: ServiceHarness
        let token: String
        let owner: String
        var device: DeviceStates
        var zoneID: ZoneID { device.zoneID }
        let zone: JSON = .object(["zoneName": .string("Lists")])

        init(_ configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
            h = try ServiceHarness(configure: configure)
            (token, owner) = try h.signUp("ann")
            try h.createZone("Lists", token: token)
            let seeded = h.modify("Lists", [operation("create", "a", fields: ["text": value(.string("A"))]),
                                            operation("create", "b", fields: ["text": value(.string("B"))])], token: token)
            guard seeded.records.allSatisfy({ $0["serverErrorCode"] == nil }) else {
                throw HarnessError("seed: \(seeded.json.serialized())")
            }
            device = DeviceStates(zoneID: try ZoneID(zoneName: "Lists", ownerRecordName: owner), replica: 0xD1, clock: h.clock)
        }

        func push(_ body: [UInt8], contentType: String? = SyncMessage.contentType) -> ServiceHarness.Reply {
            h.push(body, token: token, contentType: contentType)
        }

        func snapshot(_ names: [String]) -> JSON { h.snapshot("Lists", names: names, token: token) }

        /// The stored state of `a`, as a device that fetched it holds it.
        func stored(_ name: String) throws -> Record {
            let item = try #require(h.lookup(zone, [name], token: token).first)
            return try Record(cloudKitJSON: item, zoneID: zoneID)
        }
    }

    private func codes(_ reply: ServiceHarness.Reply) -> [String] { reply.records.map(itemCode) }

    // MARK: 1. Authentication and the media type

    @Test func authenticationComesFirstThenTheMediaTypeAndTheEnvelope() throws {
        var w = try World()
        let body = try DeltaBytes.push(w.zoneID, [try w.device.make("x")])
        let before = w.snapshot(["x"])
        let unknown = String(w.token.dropLast()) + (w.token.hasSuffix("0") ? "1" : "0")
        for (path, payload) in [("deltas/push", body), ("deltas/pull", JSON.object(["zoneID": w.zone]).serializedBytes())] {
            let url = ServiceHarness.databasePath("private", path)
            let anonymous = w.h.raw("POST", url, body: payload, headers: ["Content-Type": SyncMessage.contentType])
            #expect(anonymous.status == 421 && anonymous.code == "AUTHENTICATION_REQUIRED", "\(path): \(anonymous.json)")
            #expect(anonymous.response.header("Content-Type")?.hasPrefix("application/json") == true)
            // No token and a wrong media type: still the authentication error.
            let both = w.h.raw("POST", url, body: payload, headers: ["Content-Type": "text/plain"])
            #expect(both.status == 421 && both.code == "AUTHENTICATION_REQUIRED", "\(path): \(both.json)")
            for bad in ["not-a-token", unknown] {
                let refused = w.h.raw("POST", url, body: payload, token: bad, headers: ["Content-Type": SyncMessage.contentType])
                #expect(refused.status == 401 && refused.code == "AUTHENTICATION_FAILED", "\(path) \(bad): \(refused.json)")
            }
            let basic = w.h.raw("POST", url, body: payload, headers: ["Authorization": "Basic YW5uOnB3",
                                                                       "Content-Type": SyncMessage.contentType])
            #expect(basic.status == 401 && basic.code == "AUTHENTICATION_FAILED", "\(path): \(basic.json)")
        }

        // Signed in: the media type must be the delta's, version 1 (or no version).
        for type in [nil, "application/json", "application/octet-stream", "application/vnd.lattice.delta; version=2",
                     "application/vnd.lattice.deltas", "application/vnd.lattice.delta; version=1.0"] as [String?] {
            let refused = w.push(body, contentType: type)
            #expect(refused.status == 400 && refused.code == "BAD_REQUEST", "\(type ?? "no type"): \(refused.json)")
            #expect(refused["reason"]?.stringValue?.contains("Content-Type") == true, "\(refused.json)")
        }
        // Bodies that are not a push envelope.
        let delta = try DeltaBytes.delta(w.zoneID, [try w.device.make("x")])
        let record = try BinaryCodec.encode(try w.device.make("x"))
        var badFlags = body
        badFlags[6] = 2 // the flags byte after an empty clientOperationID: only bit 1 (atomic) exists
        var laterVersion = body
        laterVersion[3] = 2
        let pullMessage = SyncMessage.Pull(syncToken: "t", moreComing: false, removed: [], lostShares: [], delta: delta).encoded()
        let notEnvelopes: [(String, [UInt8])] = [
            ("empty", []), ("JSON", Array(#"{"operations":[]}"#.utf8)), ("a bare delta", delta), ("a record file", record),
            ("unknown flags", badFlags), ("format version 2", laterVersion), ("a pull answer", pullMessage),
            ("the magic only", Array("LTC".utf8)), ("an envelope without a delta", Array(body.prefix(7))),
        ]
        for (label, bytes) in notEnvelopes {
            let refused = w.push(bytes)
            #expect(refused.status == 400 && refused.code == "BAD_REQUEST", "\(label): \(refused.json)")
        }
        #expect(w.snapshot(["x"]) == before, "a refused push changed the zone")

        // The media type without a version means version 1, and media types are case-insensitive.
        for type in ["application/vnd.lattice.delta", "Application/VND.Lattice.Delta; Version=1"] {
            let accepted = w.push(try DeltaBytes.push(w.zoneID, [try w.device.make("ok-\(type.count)")]), contentType: type)
            #expect(accepted.status == 200 && codes(accepted) == ["OK"], "\(type): \(accepted.json)")
        }
        // deltas/pull takes JSON: a binary body is a BAD_REQUEST.
        let binaryPull = w.h.raw("POST", ServiceHarness.databasePath("private", "deltas/pull"), body: body, token: w.token,
                                 headers: ["Content-Type": SyncMessage.contentType])
        #expect(binaryPull.status == 400 && binaryPull.code == "BAD_REQUEST", "\(binaryPull.json)")
    }

    // MARK: 2. Bad bytes

    @Test func badBytesAreRefusedWholeNamingTheRecordAndNothingIsApplied() throws {
        var w = try World()
        let a = try w.device.setting(try w.stored("a"), "text", to: .string("A, edited"))
        // Texts long enough that a delta cut inside record 1 still holds room for its record count.
        let text = { (letter: String) in ScalarValue.string(String(repeating: letter, count: 80)) }
        let records = [a, try w.device.make("c", fields: ["text": text("C")]),
                       try w.device.make("d", fields: ["text": text("D")], tags: ["x", "y"]),
                       try w.device.make("e", fields: ["text": text("E")], parent: "c"),
                       try w.device.make("f", fields: ["text": text("F")])]
        let names = records.map(\.id.recordName)
        let delta = try DeltaBytes.delta(w.zoneID, records)
        #expect(DeltaBytes.layout(delta).frames.count == 5)
        let before = w.snapshot(names)
        let beforeWithG = w.snapshot(names + ["g"])

        var flipped = delta
        flipped[DeltaBytes.flagsOffset(delta, frame: 2)] ^= 0x80
        let (head, frames) = DeltaBytes.layout(delta)
        let other = try ZoneID(zoneName: "Other", ownerRecordName: w.owner)
        let cases: [(label: String, delta: [UInt8], reason: [String])] = [
            ("truncated inside record 1", Array(delta[..<(frames[1].lowerBound + 70)]), ["record 1 (c)", "ends early"]),
            ("truncated in the header", Array(delta.prefix(9)), ["ends early"]),
            ("truncated after the record count", Array(delta[..<(head + 30)]), ["record count"]),
            ("a flipped byte in record 2", flipped, ["record 2 (d)", "record flags"]),
            ("records out of name order", DeltaBytes.reordered(delta, [0, 1, 3, 2, 4]), ["record 3 (d)", "name order"]),
            ("a parent in another zone", DeltaBytes.withForeignParent(delta, frame: 3, parent: "c", zone: other),
             ["record 3 (e)", "parent"]),
            ("trailing bytes", delta + [0, 0], ["after the end"]),
        ]
        for test in cases {
            for atomic in [true, false] {
                let reply = w.push(DeltaBytes.push(test.delta, atomic: atomic))
                let reason = reply["reason"]?.stringValue ?? ""
                print("[deltas/push] \(test.label): \(reply.status) \(reason)")
                #expect(reply.status == 400 && reply.code == "BAD_REQUEST", "\(test.label): \(reply.json)")
                for part in test.reason { #expect(reason.contains(part), "\(test.label): \(reason)") }
                if !test.reason.contains(where: { $0.hasPrefix("record ") }) {
                    // An error outside every frame names no record.
                    #expect(!reason.contains("record 0"), "\(test.label): \(reason)")
                }
                #expect(w.snapshot(names) == before, "\(test.label) (atomic \(atomic)) changed the zone")
            }
        }

        // A delta with no records, and one with a stamp from an hour ahead: refused whole as well.
        let empty = w.push(DeltaBytes.push(BinaryCodec.encodeDelta(zoneID: w.zoneID, frames: [])))
        #expect(empty.status == 400 && empty.code == "BAD_REQUEST", "\(empty.json)")
        var future = DeviceStates(zoneID: w.zoneID, replica: 0xF0, clock: TestClock(w.h.clock.now + 3_600_000))
        let ahead = w.push(try DeltaBytes.push(w.zoneID, [records[1], try future.make("g")], atomic: false))
        #expect(ahead.status == 400 && ahead.code == "BAD_REQUEST", "\(ahead.json)")
        #expect(ahead["reason"]?.stringValue?.contains("ms ahead") == true, "\(ahead.json)")
        #expect(w.snapshot(names + ["g"]) == beforeWithG)

        // The zone of a delta is its header's: another user's zone in the private database is refused, and
        // neither zone changes.
        let (bobToken, bob) = try w.h.signUp("bob")
        try w.h.createZone("Lists", token: bobToken)
        let bobsBefore = w.h.snapshot("Lists", names: ["c"], token: bobToken)
        var bobsDevice = DeviceStates(zoneID: try ZoneID(zoneName: "Lists", ownerRecordName: bob), replica: 0xB0,
                                      clock: w.h.clock)
        let intoBob = w.push(try DeltaBytes.push(bobsDevice.zoneID, [try bobsDevice.make("c")]))
        #expect(intoBob.status == 403 && intoBob.code == "ACCESS_DENIED", "\(intoBob.json)")
        #expect(w.h.snapshot("Lists", names: ["c"], token: bobToken) == bobsBefore)
        #expect(w.snapshot(names) == before)

        // The same records, well formed, are accepted: the refusals above were about the bytes.
        let accepted = w.push(DeltaBytes.push(delta))
        #expect(codes(accepted) == ["OK", "OK", "OK", "OK", "OK"], "\(accepted.json)")
        #expect(w.snapshot(names) != before, "the snapshot does not see writes")
        #expect(w.h.lookup(w.zone, ["a"], token: w.token).first?["fields"]?["text"]?["value"]?.stringValue == "A, edited")
    }

    // MARK: 3. Limits and quotas

    @Test func limitsAreThoseOfRecordsModify() throws {
        var w = try World()
        let many = try (0...400).map { try w.device.make(String(format: "r%03d", $0)) }
        let names = many.map(\.id.recordName)
        let before = w.snapshot(names)
        let tooMany = w.push(try DeltaBytes.push(w.zoneID, many))
        #expect(tooMany.status == 413 && tooMany.code == "LIMIT_EXCEEDED", "\(tooMany.json)")
        #expect(tooMany["reason"]?.stringValue?.contains("400") == true)
        #expect(w.snapshot(names) == before)
        let fourHundred = w.push(try DeltaBytes.push(w.zoneID, Array(many.prefix(400))))
        #expect(fourHundred.status == 200 && codes(fourHundred).allSatisfy { $0 == "OK" } && fourHundred.records.count == 400)

        // A record over 1 MiB (a delta may carry one: merged states travel up to 16 MiB), in a body under 2 MiB.
        var big = try w.device.make("big")
        try big.set("text", to: .string(String(repeating: "x", count: 1_100_000)), at: w.device.stamp())
        let small = try w.device.make("small", fields: ["text": .string("small")])
        let oversized = try BinaryCodec.encode(ZoneDelta(zoneID: w.zoneID, since: VersionVector(), version: VersionVector(),
                                                         records: [big, small]))
        let before2 = w.snapshot(["big", "small"])
        let atomic = w.push(DeltaBytes.push(oversized, atomic: true))
        #expect(codes(atomic) == ["LIMIT_EXCEEDED", "ATOMIC_ERROR"], "\(atomic.json)")
        #expect(atomic.records.first?["reason"]?.stringValue?.contains("big") == true)
        #expect(w.snapshot(["big", "small"]) == before2)
        let partial = w.push(DeltaBytes.push(oversized, atomic: false))
        #expect(codes(partial) == ["LIMIT_EXCEEDED", "OK"], "\(partial.json)")
        #expect(w.h.lookup(w.zone, ["big", "small"], token: w.token).map(itemCode) == ["NOT_FOUND", "OK"])
    }

    /// Fields per record and elements per list are bounded as in records/modify (small limits here), per
    /// record and before the join; the same state in JSON gets the same answer.
    @Test func fieldAndListBoundsAreThoseOfRecordsModify() throws {
        var w = try World {
            $0.maximumListElements = 1_000
            $0.maximumFieldsPerRecord = 100
        }
        var tags = try w.device.make("tags")
        for index in 0...1_000 { try tags.add(.int64(Int64(index)), to: "tags", at: w.device.stamp()) }
        var fields = try w.device.make("fields")
        for index in 0...100 { try fields.set(String(format: "f%04d", index), to: .int64(1), at: w.device.stamp()) }
        var fits = try w.device.make("fits")
        for index in 0..<1_000 { try fits.add(.int64(Int64(index)), to: "tags", at: w.device.stamp()) }
        for index in 0..<99 { try fits.set(String(format: "f%04d", index), to: .int64(1), at: w.device.stamp()) }
        for record in [tags, fields] {
            let name = record.id.recordName
            let json = w.h.modify("Lists", [.object(["operationType": .string("forceUpdate"), "record": record.cloudKitJSON])],
                                  token: w.token)
            let binary = w.push(try DeltaBytes.push(w.zoneID, [record, fits]))
            print("[deltas/push] \(name): JSON \(matrixCode(json)), binary \(codes(binary))")
            #expect(matrixCode(json) == "LIMIT_EXCEEDED", "\(name) JSON: \(json.json.serialized().prefix(300))")
            #expect(codes(binary) == (name < "fits" ? ["LIMIT_EXCEEDED", "ATOMIC_ERROR"] : ["ATOMIC_ERROR", "LIMIT_EXCEEDED"]),
                    "\(name) binary: \(binary.json.serialized().prefix(300))")
            #expect(binary.records.first { itemCode($0) == "LIMIT_EXCEEDED" }?["reason"]?.stringValue?.contains(name) == true)
            #expect(w.h.lookup(w.zone, [name, "fits"], token: w.token).map(itemCode) == ["NOT_FOUND", "NOT_FOUND"])
        }
        #expect(codes(w.push(try DeltaBytes.push(w.zoneID, [fits]))) == ["OK"])
    }

    @Test func quotaExceededRollsTheBatchBack() throws {
        var w = try World { $0.quotaBytesPerDatabase = 64 * 1024 }
        let chunk = String(repeating: "q", count: 20_000)
        let records = try (0..<5).map { try w.device.make("q\($0)", fields: ["text": .string(chunk)]) }
        let names = records.map(\.id.recordName)
        let before = w.snapshot(names)
        let atomic = w.push(try DeltaBytes.push(w.zoneID, records))
        #expect(codes(atomic).contains("QUOTA_EXCEEDED"), "\(atomic.json)")
        #expect(codes(atomic).allSatisfy { $0 == "QUOTA_EXCEEDED" || $0 == "ATOMIC_ERROR" }, "\(atomic.json)")
        #expect(w.snapshot(names) == before)
        // Non-atomic: what fits is written, the rest is refused, and the answer says which.
        let partial = w.push(try DeltaBytes.push(w.zoneID, records, atomic: false))
        let answered = codes(partial)
        #expect(answered.contains("OK") && answered.contains("QUOTA_EXCEEDED"), "\(answered)")
        #expect(w.h.lookup(w.zone, names, token: w.token).map(itemCode) == answered.map { $0 == "OK" ? "OK" : "NOT_FOUND" })
    }

    // MARK: 4. Atomic batches

    @Test func atomicPushesAreAllOrNothingAndOthersStandAlone() throws {
        var w = try World()
        // `a` is an Item on the server; this state is a Note created later: its type would change.
        w.device.observe(try w.stored("a"))
        let note = try w.device.make("a", type: "Note", fields: ["text": .string("a note")])
        let c = try w.device.make("c", fields: ["text": .string("C")])
        let d = try w.device.make("d")
        let names = ["a", "c", "d"]
        let before = w.snapshot(names)
        let atomic = w.push(try DeltaBytes.push(w.zoneID, [note, c, d], atomic: true))
        #expect(atomic.status == 200 && codes(atomic) == ["BAD_REQUEST", "ATOMIC_ERROR", "ATOMIC_ERROR"], "\(atomic.json)")
        #expect(atomic.records.map { $0["recordName"]?.stringValue } == ["a", "c", "d"])
        #expect(atomic.records[0]["reason"]?.stringValue?.contains("type") == true)
        #expect(w.snapshot(names) == before)

        let partial = w.push(try DeltaBytes.push(w.zoneID, [note, c, d], atomic: false))
        #expect(codes(partial) == ["BAD_REQUEST", "OK", "OK"], "\(partial.json)")
        let looked = w.h.lookup(w.zone, names, token: w.token)
        #expect(looked.map { $0["recordType"]?.stringValue } == ["Item", "Item", "Item"])
        #expect(looked[0]["fields"]?["text"]?["value"]?.stringValue == "A")
        #expect(looked[1]["fields"]?["text"]?["value"] == .string("C"))
        // The answer is written straight into bytes: they are the canonical JSON (keys sorted, compact) of what
        // it says, as `JSON.serializedBytes` writes it, error items included.
        #expect(partial.response.body == partial.json.serializedBytes(), "\(String(decoding: partial.response.body, as: UTF8.self))")
        #expect(partial.json["zoneID"] == .object(["zoneName": .string("Lists"), "ownerRecordName": .string(w.owner)]))
        // Each success carries its change tag and zone position; upToDate says the server holds the state sent.
        for item in partial.records.dropFirst() {
            #expect(item["recordChangeTag"]?.stringValue != nil && item["position"]?.intValue != nil)
            #expect(item["upToDate"] == .bool(true))
        }
    }

    // MARK: 5. clientOperationID

    @Test func aRetriedPushAppliesOnceAndReplaysTheFirstAnswer() throws {
        var w = try World()
        let x = try w.device.make("x", fields: ["n": .int64(1)])
        let a = try w.device.setting(try w.stored("a"), "n", to: .int64(1))
        let body = try DeltaBytes.push(w.zoneID, [a, x], atomic: false, id: "op-1")
        let first = w.push(body)
        #expect(codes(first) == ["OK", "OK"] && first.response.header("Lattice-Replayed") == nil, "\(first.json)")
        // Another write to x meanwhile: a replay answers what the first push answered, without applying it again.
        let edited = w.h.modify("Lists", [operation("forceUpdate", "x", recordType: nil, fields: ["n": value(.int(2))])],
                                token: w.token)
        #expect(matrixCode(edited) == "OK")
        let afterEdit = w.snapshot(["a", "x"])
        let retry = w.push(body)
        #expect(retry.status == first.status && retry.response.body == first.response.body)
        #expect(retry.response.header("Lattice-Replayed") == "true")
        #expect(w.snapshot(["a", "x"]) == afterEdit)
        // Without the id the same bytes are a new push, answered afresh: x is no longer what was sent.
        let fresh = w.push(try DeltaBytes.push(w.zoneID, [a, x], atomic: false))
        #expect(fresh.response.header("Lattice-Replayed") == nil)
        #expect(fresh.records.last?["upToDate"] == .bool(false))
        #expect(fresh.records.last?["recordChangeTag"] == edited.records.first?["recordChangeTag"])

        // The same id with another body, or on another endpoint, is a client bug.
        let other = w.push(try DeltaBytes.push(w.zoneID, [try w.device.make("y")], atomic: false, id: "op-1"))
        #expect(other.status == 400 && other.code == "BAD_REQUEST", "\(other.json)")
        #expect(other["reason"]?.stringValue?.contains("op-1") == true)
        let flagOnly = w.push(try DeltaBytes.push(w.zoneID, [a, x], atomic: true, id: "op-1"))
        #expect(flagOnly.code == "BAD_REQUEST", "\(flagOnly.json)")
        let viaJSON = w.h.modify("Lists", [operation("create", "z")], token: w.token,
                                 extra: ["clientOperationID": .string("op-1")])
        #expect(viaJSON.code == "BAD_REQUEST", "\(viaJSON.json)")
        #expect(itemCode(w.h.lookup(w.zone, ["y"], token: w.token)[0]) == "NOT_FOUND")
        // Ids belong to their user: bob's op-1 is his own.
        let (bobToken, bob) = try w.h.signUp("bob")
        var bobs = DeviceStates(zoneID: try ZoneID(zoneName: Names.systemZoneName, ownerRecordName: bob), replica: 0xB0,
                                clock: w.h.clock)
        let bobsPush = w.h.push(try DeltaBytes.push(bobs.zoneID, [try bobs.make("x")], id: "op-1"), token: bobToken)
        #expect(codes(bobsPush) == ["OK"] && bobsPush.response.header("Lattice-Replayed") == nil, "\(bobsPush.json)")

        // A failed atomic push is not remembered: its retry runs again (and fails again).
        w.device.observe(try w.stored("a"))
        let bad = try DeltaBytes.push(w.zoneID, [try w.device.make("a", type: "Note"), try w.device.make("w")], id: "op-2")
        for _ in 0..<2 {
            let failed = w.push(bad)
            #expect(codes(failed) == ["BAD_REQUEST", "ATOMIC_ERROR"] && failed.response.header("Lattice-Replayed") == nil)
        }
        // Ids are 1 to 128 bytes.
        let long = w.push(try DeltaBytes.push(w.zoneID, [try w.device.make("v")], id: String(repeating: "i", count: 129)))
        #expect(long.code == "BAD_REQUEST", "\(long.json)")
    }
}
