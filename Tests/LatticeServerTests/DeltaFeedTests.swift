import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// The binary path and the change logs: a push moves the logs `changes/zone` and `changes/database` read,
/// `deltas/pull` pages them exactly as `changes/zone` does (tokens, expiry, missing zones), `known` positions
/// leave a device's own writes out, and binary and JSON writes of the same states store the same bytes.
@Suite(.tags(.postgres)) struct DeltaFeedTests {
    typealias World = DeltaPushTests.World

    private func codes(_ reply: ServiceHarness.Reply) -> [String] { reply.records.map(itemCode) }

    /// The JSON item of `changes/zone` as the frame a device would make of it.
    private func frame(ofJSON item: JSON, zoneID: ZoneID) throws -> RecordFrame {
        try RecordFrame(encoding: try Record(cloudKitJSON: item, zoneID: zoneID))
    }

    // MARK: 6. Change logs

    @Test func aPushMovesTheZoneAndDatabaseLogs() throws {
        var w = try World()
        let zoneBefore = try #require(w.h.zonePage(w.zone, token: w.token)["syncToken"]?.stringValue)
        let databaseBefore = try #require(w.h.call("changes/database", token: w.token)["syncToken"]?.stringValue)
        let positionBefore = try w.h.position(zoneBefore)

        let pushed = w.push(try DeltaBytes.push(w.zoneID, [try w.device.make("c"), try w.device.make("d")]))
        #expect(codes(pushed) == ["OK", "OK"], "\(pushed.json)")
        let positions = pushed.records.compactMap { $0["position"]?.intValue }
        #expect(positions.count == 2 && positions.allSatisfy { $0 > positionBefore } && Set(positions).count == 2)

        let zoneAfter = w.h.zonePage(w.zone, syncToken: zoneBefore, token: w.token)
        #expect(zoneAfter["records"]?.arrayValue?.compactMap { $0["recordName"]?.stringValue } == ["c", "d"])
        #expect(try w.h.position(zoneAfter["syncToken"]?.stringValue) == positions.max())
        // The change tags of the push answer are those the feed shows.
        #expect(zoneAfter["records"]?.arrayValue?.map { $0["recordChangeTag"] } == pushed.records.map { $0["recordChangeTag"] })
        let database = w.h.call("changes/database", .object(["syncToken": .string(databaseBefore)]), token: w.token)
        #expect(database.zones.compactMap { $0["zoneID"]?["zoneName"]?.stringValue } == ["Lists"], "\(database.json)")
        #expect(database["syncToken"]?.stringValue != databaseBefore)
        // The same pull from the old token gives the same page, in binary.
        let pulled = w.h.pull(["zoneID": w.zone, "syncToken": .string(zoneBefore)], token: w.token)
        #expect(pulled.status == 200 && pulled.contentType == SyncMessage.contentType)
        #expect(pulled.names == ["c", "d"] && pulled.syncToken == zoneAfter["syncToken"]?.stringValue && !pulled.moreComing)

        // A push that changes nothing (the same states again) moves no log.
        let again = w.push(try DeltaBytes.push(w.zoneID, try pulled.frames.map { try $0.decoded() }))
        #expect(codes(again) == ["OK", "OK"] && again.records.allSatisfy { $0["upToDate"] == .bool(true) })
        #expect(again.records.compactMap { $0["position"]?.intValue } == positions)
        #expect(w.h.zonePage(w.zone, token: w.token)["syncToken"] == zoneAfter["syncToken"])
        #expect(w.h.call("changes/database", token: w.token)["syncToken"] == database["syncToken"])
    }

    @Test func pullPagesExactlyLikeChangesZone() throws {
        let seed = RandomSeed.current
        print("DeltaFeedTests.pullPagesExactlyLikeChangesZone seed=\(seed)")
        var random = SplitMix64(seed: seed)
        var w = try World()
        // 30 records in pushes of random sizes, then random updates (binary and JSON) and deletions.
        var records: [String: Record] = [:]
        var pending = try (0..<30).map { try w.device.make(String(format: "r%02d", $0), fields: ["n": .int64(Int64($0))]) }
        while !pending.isEmpty {
            let batch = Array(pending.prefix(Int.random(in: 1...7, using: &random)))
            pending.removeFirst(batch.count)
            #expect(codes(w.push(try DeltaBytes.push(w.zoneID, batch))).allSatisfy { $0 == "OK" })
            for record in batch { records[record.id.recordName] = record }
        }
        var deletedNames: Set<String> = []
        for round in 0..<12 {
            let live = records.keys.sorted().filter { !deletedNames.contains($0) }
            let name = live[Int.random(in: 0..<live.count, using: &random)]
            switch Int.random(in: 0..<3, using: &random) {
            case 0:
                let edited = try w.device.setting(try w.stored(name), "round", to: .int64(Int64(round)))
                #expect(codes(w.push(try DeltaBytes.push(w.zoneID, [edited]))) == ["OK"])
            case 1:
                let edit = operation("forceUpdate", name, recordType: nil, fields: ["json": value(.int(Int64(round)))])
                #expect(matrixCode(w.h.modify("Lists", [edit], token: w.token)) == "OK")
            default:
                var deleted = try w.stored(name)
                w.device.observe(deleted)
                deleted.delete(at: w.device.stamp())
                #expect(codes(w.push(try DeltaBytes.push(w.zoneID, [deleted]))) == ["OK"])
                deletedNames.insert(name)
            }
        }

        // From no token and from a token in the middle, with several page sizes: page by page the same
        // records (changes/zone in log order, the delta in name order), tokens and moreComing.
        let middle = try #require(w.h.zonePage(w.zone, limit: 13, token: w.token)["syncToken"]?.stringValue)
        for start in [nil, middle] as [String?] {
            for limit in [1, 5, 7, 200] {
                var jsonToken = start, binaryToken = start
                var pages = 0
                var seen: [String] = []
                while pages < 100 {
                    pages += 1
                    let json = w.h.zonePage(w.zone, syncToken: jsonToken, limit: limit, token: w.token)
                    var body: [String: JSON] = ["zoneID": w.zone, "resultsLimit": .int(Int64(limit))]
                    if let binaryToken { body["syncToken"] = .string(binaryToken) }
                    let binary = w.h.pull(body, token: w.token)
                    let items = json["records"]?.arrayValue ?? []
                    let jsonNames = items.compactMap { $0["recordName"]?.stringValue }
                    #expect(binary.status == 200, "\(binary.error)")
                    #expect(binary.names == jsonNames.sorted(), "limit \(limit) page \(pages)")
                    #expect(binary.syncToken == json["syncToken"]?.stringValue)
                    #expect(binary.moreComing == (json["moreComing"] == .bool(true)))
                    #expect(jsonNames.count <= limit)
                    // The states: the pulled frame is what the JSON state encodes to, byte for byte.
                    let byName = Dictionary(uniqueKeysWithValues: binary.frames.map { ($0.recordName, $0) })
                    for item in items {
                        let name = item["recordName"]?.stringValue ?? ""
                        #expect(try frame(ofJSON: item, zoneID: w.zoneID).bytes == byName[name]?.bytes, "\(name)")
                    }
                    seen += jsonNames
                    jsonToken = json["syncToken"]?.stringValue
                    binaryToken = binary.syncToken
                    if !binary.moreComing { break }
                }
                #expect(Set(seen).count == seen.count, "a record came twice")
                if start == nil { #expect(Set(seen) == Set(records.keys).union(["a", "b"]), "limit \(limit)") }
            }
        }
        // Both refuse the same bad limits and tokens the same way.
        let databaseToken = try #require(w.h.call("changes/database", token: w.token)["syncToken"])
        for (key, bad) in [("resultsLimit", JSON.int(0)), ("resultsLimit", .int(-3)), ("resultsLimit", .string("5")),
                           ("syncToken", .string("garbage")), ("syncToken", databaseToken), ("syncToken", .int(1))] {
            let json = w.h.call("changes/zone", .object(["zones": .array([.object(["zoneID": w.zone, key: bad])])]),
                                token: w.token)
            let binary = w.h.pull(["zoneID": w.zone, key: bad], token: w.token)
            #expect(binary.status == 400 && binary.code == "BAD_REQUEST", "\(key) \(bad): \(binary.error)")
            #expect(json.zones.first.map(itemCode) == binary.code, "\(key) \(bad)")
        }
        for bad in [JSON.null, .string("Lists"), .object(["zoneName": .int(3)]), .object(["zoneName": .string("a/b")]),
                    .object(["zoneName": .string("Lists"), "ownerRecordName": .bool(true)])] {
            let binary = w.h.pull(["zoneID": bad], token: w.token)
            #expect(binary.code == "BAD_REQUEST", "zoneID \(bad): \(binary.error)")
        }
        #expect(w.h.pull([:], token: w.token).code == "BAD_REQUEST")
        // The public database has no feed.
        let publicPull = w.h.pull(["zoneID": .object(["zoneName": .string("_defaultZone")])], token: w.token, database: "public")
        #expect(publicPull.code == "BAD_REQUEST", "\(publicPull.error)")
    }

    @Test func oldTokensExpireAndMissingZonesAreNotFound() throws {
        var w = try World { $0.tombstoneHorizonMilliseconds = 60_000 }
        let before = try #require(w.h.zonePage(w.zone, token: w.token)["syncToken"]?.stringValue)
        var doomed = try w.stored("a")
        w.device.observe(doomed)
        doomed.delete(at: w.device.stamp())
        #expect(codes(w.push(try DeltaBytes.push(w.zoneID, [doomed]))) == ["OK"])
        let deletion = w.h.pull(["zoneID": w.zone, "syncToken": .string(before)], token: w.token)
        #expect(deletion.names == ["a"] && deletion.frames.first?.isDeleted == true)
        let after = try #require(deletion.syncToken)

        w.h.clock.advance(120_000)
        #expect(try w.h.service.purgeExpired().tombstones == 1)
        let expired = w.h.pull(["zoneID": w.zone, "syncToken": .string(before)], token: w.token)
        #expect(expired.status == 410 && expired.code == "CHANGE_TOKEN_EXPIRED", "\(expired.error)")
        #expect(expired.contentType?.hasPrefix("application/json") == true)
        #expect(w.h.pull(["zoneID": w.zone, "syncToken": .string(after)], token: w.token).status == 200)
        #expect(w.h.pull(["zoneID": w.zone], token: w.token).names == ["b"])

        // Deleted and recreated: a token of the old zone has expired.
        for type in ["delete", "create"] {
            _ = w.h.call("zones/modify", .object(["operations": .array([
                .object(["operationType": .string(type), "zone": .object(["zoneID": w.zone])]),
            ])]), token: w.token)
        }
        let recreated = w.h.pull(["zoneID": w.zone, "syncToken": .string(after)], token: w.token)
        #expect(recreated.status == 410 && recreated.code == "CHANGE_TOKEN_EXPIRED", "\(recreated.error)")

        // A zone that does not exist: ZONE_NOT_FOUND both ways, and nothing is created.
        let zonesBefore = w.h.call("zones/list", token: w.token).json
        let nope = JSON.object(["zoneName": .string("Nope")])
        let pulled = w.h.pull(["zoneID": nope], token: w.token)
        #expect(pulled.status == 404 && pulled.code == "ZONE_NOT_FOUND", "\(pulled.error)")
        var elsewhere = DeviceStates(zoneID: try ZoneID(zoneName: "Nope", ownerRecordName: w.owner), replica: 0xE,
                                     clock: w.h.clock)
        let pushed = w.push(try DeltaBytes.push(elsewhere.zoneID, [try elsewhere.make("x")]))
        #expect(pushed.status == 404 && pushed.code == "ZONE_NOT_FOUND", "\(pushed.json)")
        #expect(w.h.call("zones/list", token: w.token).json == zonesBefore)
        // ... except _defaultZone, which always exists: a push creates it.
        let (carol, carolName) = try w.h.signUp("carol")
        var carols = DeviceStates(zoneID: try ZoneID(zoneName: Names.systemZoneName, ownerRecordName: carolName), replica: 0xC,
                                  clock: w.h.clock)
        let empty = w.h.pull(["zoneID": .object(["zoneName": .string(Names.systemZoneName)])], token: carol)
        #expect(empty.status == 200 && empty.names.isEmpty, "\(empty.error)")
        #expect(codes(w.h.push(try DeltaBytes.push(carols.zoneID, [try carols.make("first")]), token: carol)) == ["OK"])
        let defaultZone = JSON.object(["zoneName": .string(Names.systemZoneName)])
        #expect(w.h.pull(["zoneID": defaultZone, "syncToken": .string(empty.syncToken ?? "")], token: carol).names == ["first"])
    }

    // MARK: 9. The same states in binary and in JSON

    /// Random concurrent states of a few records (every value type, lists, parents, deletions and
    /// recreations), made by three devices of `zoneID`: the same sequence for the same seed.
    private func concurrentStates(zoneID: ZoneID, seed: UInt64, clock: TestClock) throws -> [[Record]] {
        var random = SplitMix64(seed: seed)
        var devices = (1...3).map { DeviceStates(zoneID: zoneID, replica: UInt64(0xA0 + $0), clock: clock) }
        let names = (0..<8).map { "rec\($0)" }
        // Each device's view of each record.
        var views: [[String: Record]] = Array(repeating: [:], count: 3)
        var batches: [[Record]] = []
        let values: [() -> ScalarValue] = [
            { .string(["", "milk", "Ωmega", "a\u{0}b"][Int.random(in: 0..<4, using: &random)]) },
            { .int64(Int64.random(in: -1_000...1_000, using: &random)) },
            { .double([0.5, -0.0, 1e300, 3.25][Int.random(in: 0..<4, using: &random)]) },
            { .bytes((0..<Int.random(in: 0..<6, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }) },
            { .timestamp(1_764_489_600_000 + Int64.random(in: 0..<10_000, using: &random)) },
            { .location(Location(latitude: 47.5, longitude: 8.25, altitude: Bool.random(using: &random) ? 400 : nil)) },
            { .reference(try! Reference(recordName: "rec\(Int.random(in: 0..<8, using: &random))",
                                        zoneID: try! ZoneID(zoneName: "Elsewhere", ownerRecordName: "_someone"))) },
        ]
        for _ in 0..<12 {
            var batch: [String: Record] = [:]
            for _ in 0..<Int.random(in: 1...5, using: &random) {
                let device = Int.random(in: 0..<3, using: &random)
                let name = names[Int.random(in: 0..<names.count, using: &random)]
                var record = try views[device][name] ?? Record(id: RecordID(recordName: name, zoneID: zoneID), recordType: "Item",
                                                                  createdAt: devices[device].stamp())
                // Sometimes the device first hears of another device's state.
                if Bool.random(using: &random), let other = views[(device + 1) % 3][name] {
                    record.merge(other)
                    devices[device].observe(other)
                }
                let stamp = devices[device].stamp()
                switch Int.random(in: 0..<10, using: &random) {
                case 0: if !record.isDeleted { record.delete(at: stamp) }
                case 1: if record.isDeleted { try record.recreate(recordType: "Item", at: stamp) }
                case 2: if !record.isDeleted {
                    let parent = names[Int.random(in: 0..<names.count, using: &random)]
                    if parent != name { try record.setParent(try Reference(recordName: parent), at: stamp) }
                }
                case 3, 4: if !record.isDeleted { try record.add(values[0](), to: "tags", at: stamp) }
                case 5: if !record.isDeleted, case .list(_, let elements)? = record["tags"], let element = elements.first {
                    try record.remove(element, from: "tags", at: stamp)
                }
                default: if !record.isDeleted {
                    let field = "f\(Int.random(in: 0..<3, using: &random))"
                    let kind = Int.random(in: 0..<values.count, using: &random)
                    try record.set(field, to: Bool.random(using: &random) ? values[kind]() : nil, at: stamp)
                }
                }
                views[device][name] = record
                batch[name] = batch[name].map { $0.merging(record) } ?? record
            }
            batches.append(batch.keys.sorted().map { batch[$0]! })
        }
        return batches
    }

    @Test func binaryAndJSONWritesOfTheSameStatesStoreTheSameBytes() throws {
        let seed = RandomSeed.current
        print("DeltaFeedTests.binaryAndJSONWritesOfTheSameStatesStoreTheSameBytes seed=\(seed)")
        let h = try ServiceHarness()
        let (token, owner) = try h.signUp("ann")
        for zone in ["Bin", "Json"] { try h.createZone(zone, token: token) }
        let binZone = try ZoneID(zoneName: "Bin", ownerRecordName: owner)
        let jsonZone = try ZoneID(zoneName: "Json", ownerRecordName: owner)
        let binBatches = try concurrentStates(zoneID: binZone, seed: seed, clock: h.clock)
        let jsonBatches = try concurrentStates(zoneID: jsonZone, seed: seed, clock: h.clock)
        var expected: [String: Record] = [:]
        for (binary, json) in zip(binBatches, jsonBatches) {
            let pushed = h.push(try DeltaBytes.push(binZone, binary, atomic: false), token: token)
            let operations = json.map { JSON.object(["operationType": .string("forceUpdate"), "record": $0.cloudKitJSON]) }
            let modified = h.modify("Json", operations, token: token, extra: ["atomic": .bool(false)])
            #expect(codes(pushed) == codes(modified),
                    "seed \(seed): \(pushed.json.serialized().prefix(400)) vs \(modified.json.serialized().prefix(400))")
            for record in binary where codes(pushed)[binary.firstIndex(of: record)!] == "OK" {
                let name = record.id.recordName
                expected[name] = expected[name].map { $0.merging(record) } ?? record
            }
        }
        #expect(!expected.isEmpty)

        // The stored frames: byte-identical after the zone header, and equal to the reference model's join.
        func pulled(_ zone: String) -> [String: [UInt8]] {
            let page = h.pull(["zoneID": .object(["zoneName": .string(zone)])], token: token)
            let header = 5 + 1 + zone.utf8.count + 1 + owner.utf8.count
            return Dictionary(uniqueKeysWithValues: page.frames.map { ($0.recordName, Array($0.bytes.dropFirst(header))) })
        }
        let bin = pulled("Bin"), json = pulled("Json")
        #expect(bin.keys.sorted() == expected.keys.sorted(), "seed \(seed)")
        #expect(bin == json, "seed \(seed): binary and JSON writes stored different frames")
        let header = 5 + 1 + 3 + 1 + owner.utf8.count
        for (name, record) in expected {
            #expect(Array(try BinaryCodec.encode(record).dropFirst(header)) == bin[name], "seed \(seed): \(name)")
        }
        // records/lookup answers the same, once the server's stamps and the zone are left out.
        let names = expected.keys.sorted()
        let strip = { (item: JSON) -> JSON in
            guard case .object(var object) = withoutServerStamps(item) else { return item }
            object["zoneID"] = nil
            return .object(object)
        }
        let binLookup = h.lookup(.object(["zoneName": .string("Bin")]), names, token: token).map(strip)
        let jsonLookup = h.lookup(.object(["zoneName": .string("Json")]), names, token: token).map(strip)
        #expect(binLookup == jsonLookup, "seed \(seed)")
    }

    // MARK: 10. known

    @Test func knownPositionsLeaveOwnWritesOutAndTheRestIn() throws {
        var w = try World()
        let start = try #require(w.h.zonePage(w.zone, token: w.token)["syncToken"]?.stringValue)
        let records = try (0..<10).map { try w.device.make("k\($0)", fields: ["n": .int64(Int64($0))]) }
        let pushed = w.push(try DeltaBytes.push(w.zoneID, records))
        let positions = pushed.records.compactMap { $0["position"]?.intValue }
        #expect(positions.count == 10 && pushed.records.allSatisfy { $0["upToDate"] == .bool(true) })
        let all = w.h.pull(["zoneID": w.zone, "syncToken": .string(start)], token: w.token)
        #expect(all.names == records.map(\.id.recordName) && all.skipped.isEmpty)

        // k3...k5 known (with an overlapping and an adjacent range): named in skipped, left out of the delta.
        let ranges: [JSON] = [.array([.int(positions[3]), .int(positions[4])]), .array([.int(positions[4]), .int(positions[5])]),
                              .array([.int(positions[9] + 5), .int(positions[9] + 50)])]
        let known = w.h.pull(["zoneID": w.zone, "syncToken": .string(start), "known": .array(ranges)], token: w.token)
        #expect(known.skipped == ["k3", "k4", "k5"], "\(known.skipped)")
        #expect(known.names == ["k0", "k1", "k2", "k6", "k7", "k8", "k9"])
        #expect(known.syncToken == all.syncToken && known.moreComing == all.moreComing)

        // k4 written again by someone else: its position moved out of the known range, so it is delivered.
        let edited = w.h.modify("Lists", [operation("forceUpdate", "k4", recordType: nil, fields: ["n": value(.int(40))])],
                                token: w.token)
        #expect(matrixCode(edited) == "OK")
        let moved = w.h.pull(["zoneID": w.zone, "syncToken": .string(start), "known": .array(ranges)], token: w.token)
        #expect(moved.skipped == ["k3", "k5"] && moved.names.contains("k4"), "\(moved.skipped) \(moved.names)")
        #expect(try moved.frames.first { $0.recordName == "k4" }?.decoded()["n"] == .scalar(.int64(40)))
        // Paged: skipped records count against the page like any other and the pages still cover everything.
        var token: String? = start
        var delivered: [String] = [], skipped: [String] = []
        for _ in 0..<20 {
            var body: [String: JSON] = ["zoneID": w.zone, "resultsLimit": .int(3), "known": .array(ranges)]
            if let token { body["syncToken"] = .string(token) }
            let page = w.h.pull(body, token: w.token)
            #expect(page.names.count + page.skipped.count <= 3)
            delivered += page.names
            skipped += page.skipped
            token = page.syncToken
            if !page.moreComing { break }
        }
        #expect(Set(delivered + skipped) == Set(records.map(\.id.recordName)) && skipped.sorted() == ["k3", "k5"])

        // Bad known: BAD_REQUEST, whatever else the request says.
        let bad: [(String, JSON)] = [
            ("not an array", .string("1-3")), ("an object", .object(["from": .int(1)])),
            ("a bare number pair", .array([.int(1), .int(2)])),
            ("a triple", .array([.array([.int(1), .int(2), .int(3)])])), ("a single", .array([.array([.int(1)])])),
            ("strings", .array([.array([.string("1"), .string("2")])])), ("from > to", .array([.array([.int(5), .int(3)])])),
            ("negative", .array([.array([.int(-1), .int(2)])])), ("fractions", .array([.array([.double(1.5), .int(2)])])),
            ("1001 ranges", .array((0...1_000).map { .array([.int(Int64($0) * 2), .int(Int64($0) * 2)]) })),
        ]
        for (label, json) in bad {
            let refused = w.h.pull(["zoneID": w.zone, "known": json], token: w.token)
            #expect(refused.status == 400 && refused.code == "BAD_REQUEST", "\(label): \(refused.error)")
            #expect(refused.error["reason"]?.stringValue?.contains("known") == true, "\(label): \(refused.error)")
        }
        let thousand = w.h.pull(["zoneID": w.zone, "syncToken": .string(start),
                                 "known": .array((0..<1_000).map { .array([.int(Int64($0) * 2), .int(Int64($0) * 2)]) })],
                                token: w.token)
        #expect(thousand.status == 200, "\(thousand.error)")
        #expect(Set(thousand.skipped + thousand.names) == Set(records.map(\.id.recordName)))
    }

    // MARK: 7. Long polls

    /// ann shares `Lists` (rooted at `L-root`) read-write by a link bob accepted; bob has a zone of his own.
    final class WaitWorld {
        let h: ServiceHarness
        let ann: (token: String, recordName: String)
        let bob: (token: String, recordName: String)
        let carol: (token: String, recordName: String)
        var annDevice: DeviceStates
        var bobsOwn: DeviceStates
        var bobInShare: DeviceStates

        init() throws {
            h = try ServiceHarness()
            ann = try h.signUp("ann")
            bob = try h.signUp("bob")
            carol = try h.signUp("carol")
            try h.createZone("Lists", token: ann.token)
            try h.createZone("Mine", token: bob.token)
            let seeded = h.modify("Lists", [operation("create", "L-root"),
                                            operation("create", "L-child", extra: parentRef("L-root"))], token: ann.token)
            guard matrixCode(seeded) == "OK" else { throw HarnessError("seed: \(seeded.json.serialized())") }
            let lists = JSON.object(["zoneName": .string("Lists")])
            let share = h.call("shares/create", .object(["zoneID": lists, "rootRecordName": .string("L-root"),
                                                         "publicPermission": .string("readWrite")]), token: ann.token)
            guard share.code == nil else { throw HarnessError("share: \(share.json.serialized())") }
            guard let url = h.call("shares/url", .object(["zoneID": lists]), token: ann.token)["url"]?.stringValue else {
                throw HarnessError("no share url")
            }
            let accepted = h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(url)])])]),
                                  token: bob.token, database: "shared")
            guard accepted["results"]?.arrayValue?.first?["participantStatus"]?.stringValue == "accepted" else {
                throw HarnessError("accept: \(accepted.json.serialized())")
            }
            let annLists = try ZoneID(zoneName: "Lists", ownerRecordName: ann.recordName)
            annDevice = DeviceStates(zoneID: annLists, replica: 0xA, clock: h.clock)
            bobsOwn = DeviceStates(zoneID: try ZoneID(zoneName: "Mine", ownerRecordName: bob.recordName), replica: 0xB,
                                   clock: h.clock)
            bobInShare = DeviceStates(zoneID: annLists, replica: 0xB, clock: h.clock)
        }

        /// bob's current database tokens.
        func bobsTokens() throws -> (private: String, shared: String) {
            (try #require(h.call("changes/database", token: bob.token)["syncToken"]?.stringValue),
             try #require(h.call("changes/database", token: bob.token, database: "shared")["syncToken"]?.stringValue))
        }

        func park(_ body: JSON, token: String, path: String = "private") -> ResponseBox {
            let slot = ResponseBox()
            h.service.handle(HTTPRequest(method: "POST", path: ServiceHarness.databasePath(path, "changes/wait"),
                                         headers: ["Authorization": "Bearer " + token], body: body.serializedBytes())) {
                slot.set($0)
            }
            return slot
        }

        func waitBody(_ tokens: (private: String, shared: String), timeout: Int = 20) -> JSON {
            .object(["databases": .array([
                .object(["database": .string("private"), "syncToken": .string(tokens.private)]),
                .object(["database": .string("shared"), "syncToken": .string(tokens.shared)]),
            ]), "timeout": .int(Int64(timeout))])
        }

        func lChild(as device: inout DeviceStates, _ n: Int64, token: String, database: String) throws -> ServiceHarness.Reply {
            let item = try #require(h.lookup(.object(["zoneName": .string("Lists"), "ownerRecordName": .string(ann.recordName)]),
                                             ["L-child"], token: token, database: database).first)
            let edited = try device.setting(try Record(cloudKitJSON: item, zoneID: device.zoneID), "n", to: .int64(n))
            return h.push(try DeltaBytes.push(device.zoneID, [edited]), token: token, database: database)
        }
    }

    private func answer(_ slot: ResponseBox, within seconds: Double) -> JSON? {
        slot.wait(seconds: seconds).flatMap { try? JSON.parse($0.body) }
    }

    @Test func oneParkedWaitOnBothDatabasesWakesOnAPushToEither() throws {
        let w = try WaitWorld()
        var latencies: [String: Double] = [:]
        let pushes: [(String, (WaitWorld) throws -> ServiceHarness.Reply)] = [
            ("bob's other device into his private zone", { w in
                w.h.push(try DeltaBytes.push(w.bobsOwn.zoneID, [try w.bobsOwn.make("m\(w.h.clock.now)")]), token: w.bob.token)
            }),
            ("ann into the zone she shares with bob", { w in
                try w.lChild(as: &w.annDevice, 1, token: w.ann.token, database: "private")
            }),
            ("bob's other device into ann's zone (shared database)", { w in
                try w.lChild(as: &w.bobInShare, 2, token: w.bob.token, database: "shared")
            }),
        ]
        for (label, push) in pushes {
            let tokens = try w.bobsTokens()
            let slot = w.park(w.waitBody(tokens), token: w.bob.token)
            #expect(w.h.service.notifier.waiterCount == 1, "\(label): one parked request covers both databases")
            #expect(slot.wait(seconds: 0.2) == nil, "\(label): answered before any change")
            let began = Date()
            let pushed = try push(w)
            #expect(matrixCode(pushed) == "OK", "\(label): \(pushed.json.serialized())")
            let woken = answer(slot, within: 5)
            latencies[label] = Date().timeIntervalSince(began)
            #expect(woken?["changed"] == .bool(true), "\(label): \(String(describing: woken))")
            #expect(w.h.service.notifier.waiterCount == 0)
            // Woken after the commit: the database feed from the parked tokens shows the change.
            let now = try w.bobsTokens()
            #expect(now.private != tokens.private || now.shared != tokens.shared, "\(label)")
        }
        let printed = latencies.map { "\($0.key): \(String(format: "%.1f", $0.value * 1000)) ms" }.sorted()
        print("[changes/wait] push-to-wake latencies: " + printed.joined(separator: "; "))
        #expect(latencies.values.allSatisfy { $0 < 2 })

        // Writes bob cannot see do not wake him: carol's own zone, and ann's zone outside the share.
        let tokens = try w.bobsTokens()
        let quiet = w.park(w.waitBody(tokens, timeout: 1), token: w.bob.token)
        var carols = DeviceStates(zoneID: try ZoneID(zoneName: Names.systemZoneName, ownerRecordName: w.carol.recordName),
                                  replica: 0xC, clock: w.h.clock)
        let carolsPush = w.h.push(try DeltaBytes.push(carols.zoneID, [try carols.make("c")]), token: w.carol.token)
        let outsidePush = w.h.push(try DeltaBytes.push(w.annDevice.zoneID, [try w.annDevice.make("outside")]), token: w.ann.token)
        #expect(matrixCode(carolsPush) == "OK" && matrixCode(outsidePush) == "OK")
        let timedOut = answer(quiet, within: 5)
        #expect(timedOut?["changed"] == .bool(false), "\(String(describing: timedOut))")

        // Tokens already behind: answered at once, whichever database is behind.
        let later = w.h.push(try DeltaBytes.push(w.bobsOwn.zoneID, [try w.bobsOwn.make("later")]), token: w.bob.token)
        #expect(matrixCode(later) == "OK")
        #expect(matrixCode(try w.lChild(as: &w.annDevice, 3, token: w.ann.token, database: "private")) == "OK")
        let current = try w.bobsTokens()
        #expect(current.private != tokens.private && current.shared != tokens.shared)
        for stale in [(private: tokens.private, shared: current.shared), (private: current.private, shared: tokens.shared)] {
            let began = Date()
            let early = answer(w.park(w.waitBody(stale, timeout: 30), token: w.bob.token), within: 1)
            #expect(early?["changed"] == .bool(true) && Date().timeIntervalSince(began) < 0.5, "\(String(describing: early))")
        }
        // A database given without a token waits for the next change from now.
        let fresh = w.park(.object(["databases": .array([.object(["database": .string("shared")])]), "timeout": .int(1)]),
                           token: w.bob.token)
        #expect(answer(fresh, within: 5)?["changed"] == .bool(false))
    }

    @Test func invalidDatabasesInAWaitAreBadRequests() throws {
        let w = try WaitWorld()
        let tokens = try w.bobsTokens()
        let zoneToken = try #require(w.h.zonePage(.object(["zoneName": .string("Mine")]), token: w.bob.token)["syncToken"])
        let entry = { (database: JSON, token: JSON?) -> JSON in
            var object: [String: JSON] = ["database": database]
            if let token { object["syncToken"] = token }
            return .object(object)
        }
        let bad: [(String, JSON)] = [
            ("not an array", .object(["databases": .string("private")])),
            ("empty", .object(["databases": .array([])])),
            ("three", .object(["databases": .array([entry(.string("private"), nil), entry(.string("shared"), nil),
                                                    entry(.string("private"), nil)])])),
            ("public", .object(["databases": .array([entry(.string("public"), nil)])])),
            ("twice the same", .object(["databases": .array([entry(.string("private"), nil), entry(.string("private"), nil)])])),
            ("unknown", .object(["databases": .array([entry(.string("other"), nil)])])),
            ("no name", .object(["databases": .array([.object(["syncToken": .string(tokens.private)])])])),
            ("a number", .object(["databases": .array([entry(.int(1), nil)])])),
            ("not an object", .object(["databases": .array([.string("private")])])),
            ("token not a string", .object(["databases": .array([entry(.string("private"), .int(5))])])),
            ("garbage token", .object(["databases": .array([entry(.string("private"), .string("garbage"))])])),
            ("a zone token", .object(["databases": .array([entry(.string("private"), zoneToken)])])),
            ("syncToken and databases", .object(["syncToken": .string(tokens.private),
                                                 "databases": .array([entry(.string("shared"), nil)])])),
            ("a bad timeout", .object(["databases": .array([entry(.string("shared"), nil)]), "timeout": .int(-1)])),
        ]
        for (label, body) in bad {
            let reply = w.answer(w.park(body, token: w.bob.token), within: 2)
            #expect(reply?["serverErrorCode"]?.stringValue == "BAD_REQUEST", "\(label): \(String(describing: reply))")
            #expect(w.h.service.notifier.waiterCount == 0, "\(label) left a waiter")
        }
        // The public database has no feed to wait on, with or without databases.
        let publicWait = w.answer(w.park(w.waitBody(tokens, timeout: 1), token: w.bob.token, path: "public"), within: 2)
        #expect(publicWait?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        // ann's private-database token in bob's wait names another database: it has expired for him.
        let annsPrivate = try #require(w.h.call("changes/database", token: w.ann.token)["syncToken"])
        let foreignBody = JSON.object(["databases": .array([entry(.string("private"), annsPrivate)]), "timeout": .int(1)])
        let foreign = w.answer(w.park(foreignBody, token: w.bob.token), within: 3)
        #expect(foreign?["serverErrorCode"]?.stringValue == "CHANGE_TOKEN_EXPIRED", "\(String(describing: foreign))")
    }
}

extension DeltaFeedTests.WaitWorld {
    func answer(_ slot: ResponseBox, within seconds: Double) -> JSON? {
        slot.wait(seconds: seconds).flatMap { try? JSON.parse($0.body) }
    }
}
