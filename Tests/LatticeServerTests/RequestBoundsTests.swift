import Foundation
import LatticeCore
@testable import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Testing

/// Issue 13, bounded work per request: every cap refused with its code before any work and with nothing
/// written, duplicates refused, answers cut at the response byte cap and resumed with nothing skipped or
/// repeated, the request deadline (TRY_AGAIN_LATER, nothing half-written), and value ranges on input.
@Suite(.tags(.postgres)) struct RequestBoundsTests {
    private let zone: JSON = .object(["zoneName": .string("Z")])

    private func query(_ h: ServiceHarness, token: String, filters: [JSON] = [], sorts: [JSON] = [],
                       limit: Int? = nil, marker: String? = nil) -> ServiceHarness.Reply {
        var query: [String: JSON] = ["recordType": .string("Item")]
        if !filters.isEmpty { query["filterBy"] = .array(filters) }
        if !sorts.isEmpty { query["sortBy"] = .array(sorts) }
        var body: [String: JSON] = ["zoneID": zone, "query": .object(query)]
        if let limit { body["resultsLimit"] = .int(Int64(limit)) }
        if let marker { body["continuationMarker"] = .string(marker) }
        return h.call("records/query", .object(body), token: token)
    }

    private func filter(_ field: String, _ comparator: String, _ fieldValue: JSON) -> JSON {
        .object(["fieldName": .string(field), "comparator": .string(comparator), "fieldValue": fieldValue])
    }

    private func ints(_ values: some Sequence<Int>) -> JSON {
        .object(["value": .array(values.map { .int(Int64($0)) }), "type": .string("INT64_LIST")])
    }

    /// Writes `count` records `r000`... with an INT64 `n` and a `text` of `textBytes` bytes, 100 per request.
    private func seed(_ h: ServiceHarness, token: String, count: Int, textBytes: Int = 10, zone name: String = "Z",
                      prefix: String = "r") throws {
        let text = String(repeating: "x", count: textBytes)
        for start in stride(from: 0, to: count, by: 100) {
            let reply = h.modify(name, (start..<min(count, start + 100)).map { index in
                operation("create", String(format: "\(prefix)%03d", index), fields: [
                    "n": value(.int(Int64(index))), "text": value(.string(text)),
                ])
            }, token: token)
            guard reply.status == 200, reply.records.allSatisfy({ $0["serverErrorCode"] == nil }) else {
                throw HarnessError("seed: \(reply.json.serialized().prefix(300))")
            }
        }
    }

    private func names(_ records: [JSON]) -> [String] { records.compactMap { $0["recordName"]?.stringValue } }

    // MARK: Caps, refused before any work

    @Test func queryFiltersSortKeysAndFilterValuesAreCapped() throws {
        let h = try ServiceHarness {
            $0.maximumQueryFilters = 3
            $0.maximumQuerySortKeys = 2
            $0.maximumFilterValues = 5
        }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try seed(h, token: token, count: 10)
        let gt = filter("n", "GREATER_THAN_OR_EQUALS", value(.int(0)))
        let four = query(h, token: token, filters: Array(repeating: gt, count: 4))
        #expect(four.status == 413 && four.code == "LIMIT_EXCEEDED", "\(four.json)")
        #expect(four["reason"]?.stringValue?.contains("4 filters") == true && four["reason"]?.stringValue?.contains("3") == true)
        #expect(names(query(h, token: token, filters: Array(repeating: gt, count: 3)).records).count == 10)

        let sort: JSON = .object(["fieldName": .string("n")])
        let threeSorts = query(h, token: token, sorts: [sort, sort, sort])
        #expect(threeSorts.code == "LIMIT_EXCEEDED" && threeSorts["reason"]?.stringValue?.contains("sort keys") == true)
        #expect(query(h, token: token, sorts: [sort, sort]).status == 200)

        let sixValues = query(h, token: token, filters: [filter("n", "IN", ints(0..<6))])
        #expect(sixValues.code == "LIMIT_EXCEEDED" && sixValues["reason"]?.stringValue?.contains("6 values") == true,
                "\(sixValues.json)")
        let notIn = query(h, token: token, filters: [filter("n", "NOT_IN", ints(0..<6))])
        #expect(notIn.code == "LIMIT_EXCEEDED")
        #expect(names(query(h, token: token, filters: [filter("n", "IN", ints([1, 3, 5, 7, 99]))]).records)
                == ["r001", "r003", "r005", "r007"])
    }

    @Test func inListsAreMatchedBySetNotByScan() throws {
        let h = try ServiceHarness { $0.maximumFilterValues = 30_000 }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try seed(h, token: token, count: 300)
        // 30,000 candidates, of which every tenth record's `n` is one (the rest are far away).
        let candidates = (0..<300).filter { $0 % 10 == 0 } + (1_000_000..<1_029_970)
        let start = Date()
        let matched = query(h, token: token, filters: [filter("n", "IN", ints(candidates))])
        print("[request bounds] IN of \(candidates.count) values over 300 records: "
              + String(format: "%.3f s", Date().timeIntervalSince(start)))
        #expect(matched.status == 200, "\(matched.json.serialized().prefix(300))")
        #expect(names(matched.records) == (0..<30).map { String(format: "r%03d", $0 * 10) })
        let excluded = query(h, token: token, filters: [filter("n", "NOT_IN", ints(candidates))], limit: 200)
        #expect(excluded.records.count == 200 && !names(excluded.records).contains("r010"))
    }

    @Test func lookupsAndFeedsNameAtMostTheLimitOfItems() throws {
        let h = try ServiceHarness { $0.maximumResultsLimit = 3 }
        let (token, _) = try h.signUp("ann")
        for name in ["A", "B", "C", "D"] { try h.createZone(name, token: token) }
        let zoneIDs = ["A", "B", "C", "D"].map { JSON.object(["zoneName": .string($0)]) }
        let records = h.call("records/lookup", .object([
            "zoneID": zoneIDs[0], "records": .array(["a", "b", "c", "d"].map { .object(["recordName": .string($0)]) }),
        ]), token: token)
        #expect(records.status == 413 && records.code == "LIMIT_EXCEEDED", "\(records.json)")
        let zones = h.call("zones/lookup", .object(["zones": .array(zoneIDs.map { .object(["zoneID": $0]) })]), token: token)
        #expect(zones.code == "LIMIT_EXCEEDED")
        let feed = h.call("changes/zone", .object(["zones": .array(zoneIDs.map { .object(["zoneID": $0]) })]), token: token)
        #expect(feed.code == "LIMIT_EXCEEDED" && feed["reason"]?.stringValue?.contains("the limit is 3") == true)
        #expect(h.call("changes/zone", .object(["zones": .array(zoneIDs.prefix(3).map { .object(["zoneID": $0]) })]),
                       token: token).zones.count == 3)
    }

    @Test func aLookupOrFeedNamingAnItemTwiceIsRefused() throws {
        let h = try ServiceHarness()
        let (token, owner) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try h.createZone("Y", token: token)
        try seed(h, token: token, count: 2)
        let lookup = h.call("records/lookup", .object([
            "zoneID": zone, "records": .array(["r000", "r001", "r000"].map { .object(["recordName": .string($0)]) }),
        ]), token: token)
        #expect(lookup.status == 400 && lookup.code == "BAD_REQUEST", "\(lookup.json)")
        let reason = lookup["reason"]?.stringValue ?? ""
        #expect(reason.contains("records[2].recordName") && reason.contains("r000") && reason.contains("records[0]"), "\(reason)")
        // The same zone spelled twice (owner left out, then given) is the same zone.
        let spelled: [JSON] = [.object(["zoneName": .string("Z")]),
                               .object(["zoneName": .string("Z"), "ownerRecordName": .string(owner)])]
        let zones = h.call("zones/lookup", .object(["zones": .array(spelled.map { .object(["zoneID": $0]) })]), token: token)
        #expect(zones.code == "BAD_REQUEST" && zones["reason"]?.stringValue?.contains("zones[1].zoneID") == true, "\(zones.json)")
        let feed = h.call("changes/zone", .object(["zones": .array([.object(["zoneID": spelled[0]]),
                                                                    .object(["zoneID": .object(["zoneName": .string("Y")])]),
                                                                    .object(["zoneID": spelled[1]])])]), token: token)
        #expect(feed.code == "BAD_REQUEST" && feed["reason"]?.stringValue?.contains("zone Z") == true, "\(feed.json)")
        // Distinct items are answered as before.
        #expect(h.call("changes/zone", .object(["zones": .array([.object(["zoneID": spelled[0]]),
                                                                 .object(["zoneID": .object(["zoneName": .string("Y")])])])]),
                       token: token).zones.count == 2)
    }

    @Test func writeCapsAreRefusedWithNothingWritten() throws {
        let h = try ServiceHarness {
            $0.maximumOperations = 3
            $0.maximumListElements = 10
            $0.maximumFieldsPerRecord = 4
        }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        let tooMany = h.modify("Z", (0..<4).map { operation("create", "m\($0)") }, token: token)
        #expect(tooMany.status == 413 && tooMany.code == "LIMIT_EXCEEDED", "\(tooMany.json)")
        // One operation over a cap fails an atomic batch whole.
        let batch = h.modify("Z", [
            operation("create", "ok"),
            operation("create", "long", fields: ["tags": .object(["value": .array((0..<11).map { .int($0) }),
                                                                  "type": .string("INT64_LIST")])]),
            operation("create", "wide", fields: Dictionary(uniqueKeysWithValues: (0..<5).map { ("f\($0)", value(.int(1))) })),
        ], token: token)
        #expect(batch.records.map(itemCode) == ["ATOMIC_ERROR", "LIMIT_EXCEEDED", "LIMIT_EXCEEDED"], "\(batch.json)")
        #expect(batch.records[1]["reason"]?.stringValue?.contains("11 elements") == true)
        #expect(h.lookup(zone, ["m0", "ok", "long", "wide"], token: token).map(itemCode) == Array(repeating: "NOT_FOUND", count: 4))
        #expect(h.call("changes/zone", .object(["zones": .array([.object(["zoneID": zone])])]), token: token)
            .zones.first?["records"]?.arrayValue?.isEmpty == true)
    }

    // MARK: The response byte cap

    /// Pages a zone's feed to its end; returns the names in page order and the pages' record bytes.
    private func pageFeed(_ h: ServiceHarness, token: String, zones: [String], limit: Int = 200)
        -> (names: [String: [String]], pages: [[Int]]) {
        var tokens: [String: String] = [:]
        var names: [String: [String]] = [:]
        var pages: [[Int]] = []
        var pending = Set(zones)
        for _ in 0..<200 where !pending.isEmpty {
            let items = zones.filter(pending.contains).map { name -> JSON in
                var item: [String: JSON] = ["zoneID": .object(["zoneName": .string(name)]), "resultsLimit": .int(Int64(limit))]
                if let token = tokens[name] { item["syncToken"] = .string(token) }
                return .object(item)
            }
            let reply = h.call("changes/zone", .object(["zones": .array(items)]), token: token)
            var sizes: [Int] = []
            for item in reply.zones {
                guard let name = item["zoneID"]?["zoneName"]?.stringValue else { continue }
                let records = item["records"]?.arrayValue ?? []
                names[name, default: []] += self.names(records)
                sizes += records.map { $0.serializedBytes().count }
                tokens[name] = item["syncToken"]?.stringValue
                if item["moreComing"] != .bool(true) { pending.remove(name) }
            }
            pages.append(sizes)
        }
        return (names, pages)
    }

    @Test func changeFeedsStopAtTheByteCapAndResumeWhereTheyStopped() throws {
        let cap = 12_000
        let h = try ServiceHarness { $0.maximumResponseBytes = cap }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try h.createZone("Y", token: token)
        try seed(h, token: token, count: 30, textBytes: 1_500)
        try seed(h, token: token, count: 30, textBytes: 1_500, zone: "Y", prefix: "y")
        let expected = (0..<30).map { String(format: "r%03d", $0) }
        let alone = pageFeed(h, token: token, zones: ["Z"])
        #expect(alone.names["Z"] == expected, "\(alone.names)")
        #expect(alone.pages.count > 2, "\(alone.pages)")
        for page in alone.pages { #expect(page.count == 1 || page.reduce(0, +) <= cap, "\(page)") }
        // Two zones in one request share the budget: the second waits with moreComing, nothing is lost.
        let both = pageFeed(h, token: token, zones: ["Z", "Y"])
        #expect(both.names["Z"] == expected)
        #expect(both.names["Y"] == (0..<30).map { String(format: "y%03d", $0) })
        for page in both.pages { #expect(page.count == 1 || page.reduce(0, +) <= cap, "\(page)") }
        // A record changed between pages comes again later, at its new position; none is skipped.
        let first = h.call("changes/zone", .object(["zones": .array([.object(["zoneID": zone])])]), token: token).zones[0]
        let firstNames = names(first["records"]?.arrayValue ?? [])
        #expect(first["moreComing"] == .bool(true) && !firstNames.isEmpty)
        #expect(h.modify("Z", [operation("forceUpdate", "r000", recordType: nil, fields: ["n": value(.int(-1))])],
                         token: token).records.first?["serverErrorCode"] == nil)
        var rest: [String] = []
        var syncToken = first["syncToken"]?.stringValue
        for _ in 0..<100 {
            let page = h.zonePage(zone, syncToken: syncToken, token: token)
            rest += names(page["records"]?.arrayValue ?? [])
            syncToken = page["syncToken"]?.stringValue
            if page["moreComing"] != .bool(true) { break }
        }
        #expect(firstNames + rest == expected + ["r000"], "\(firstNames) + \(rest)")
    }

    @Test func aHierarchyShareFeedStopsAtTheByteCapAndResumesWhereItStopped() throws {
        let cap = 12_000
        let w = try MatrixWorld { $0.maximumResponseBytes = cap }
        let text = String(repeating: "s", count: 1_500)
        let children = (0..<30).map { index in
            operation("create", String(format: "S%03d", index), fields: ["text": value(.string(text))],
                      extra: parentRef("L-child"))
        }
        #expect(w.owner("records/modify", MatrixWorld.lists, ["operations": .array(children)]).records
            .allSatisfy { $0["serverErrorCode"] == nil })
        // The participant's feed paged with the cap, and all at once by a service on the same storage
        // without it: the same records in the same order.
        func page(_ service: LatticeService?) -> (names: [String], pages: [[Int]]) {
            var names: [String] = []
            var pages: [[Int]] = []
            var syncToken: String?
            for _ in 0..<100 {
                var item: [String: JSON] = ["zoneID": w.zoneID(MatrixWorld.lists, shared: true)]
                if let syncToken { item["syncToken"] = .string(syncToken) }
                let body = JSON.object(["zones": .array([.object(item)])])
                let zoneItem: JSON
                if let service {
                    zoneItem = call(service, "changes/zone", body, token: w.token("priv-ro"),
                                    database: "shared").1["zones"]?.arrayValue?.first ?? .null
                } else {
                    zoneItem = w.h.call("changes/zone", body, token: w.token("priv-ro"), database: "shared").zones.first ?? .null
                }
                let records = zoneItem["records"]?.arrayValue ?? []
                names += self.names(records)
                pages.append(records.map { $0.serializedBytes().count })
                syncToken = zoneItem["syncToken"]?.stringValue
                if zoneItem["moreComing"] != .bool(true) { break }
            }
            return (names, pages)
        }
        var whole = w.h.service.configuration
        whole.maximumResponseBytes = 64 << 20
        let reference = page(try LatticeService(storage: w.h.storage, configuration: whole, keyRing: w.h.keyRing,
                                                log: { _ in }))
        #expect(reference.pages.count == 1 && Set(reference.names).isSuperset(of: children.compactMap {
            $0["record"]?["recordName"]?.stringValue }), "\(reference.names)")
        let capped = page(nil)
        #expect(capped.pages.count > 2, "\(capped.pages)")
        for sizes in capped.pages { #expect(sizes.count == 1 || sizes.reduce(0, +) <= cap, "\(sizes)") }
        #expect(capped.names == reference.names)
    }

    @Test func queriesStopAtTheByteCapAndTheMarkerResumes() throws {
        let cap = 12_000
        let h = try ServiceHarness { $0.maximumResponseBytes = cap }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try seed(h, token: token, count: 30, textBytes: 1_500)
        let sort: JSON = .object(["fieldName": .string("n"), "ascending": .bool(false)])
        var seen: [String] = []
        var marker: String?
        var pages = 0
        for _ in 0..<100 {
            let reply = query(h, token: token, sorts: [sort], marker: marker)
            #expect(reply.status == 200, "\(reply.json.serialized().prefix(300))")
            let sizes = reply.records.map { $0.serializedBytes().count }
            #expect(sizes.count == 1 || sizes.reduce(0, +) <= cap)
            seen += names(reply.records)
            pages += 1
            marker = reply["continuationMarker"]?.stringValue
            if marker == nil { break }
        }
        #expect(pages > 2)
        #expect(seen == (0..<30).reversed().map { String(format: "r%03d", $0) })
    }

    @Test func pullsStopAtTheByteCapAndResume() throws {
        let cap = 12_000
        let h = try ServiceHarness { $0.maximumResponseBytes = cap }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try seed(h, token: token, count: 30, textBytes: 1_500)
        var seen: [String] = []
        var syncToken: String?
        var pages = 0
        for _ in 0..<100 {
            var body: [String: JSON] = ["zoneID": zone]
            if let syncToken { body["syncToken"] = .string(syncToken) }
            let page = h.pull(body, token: token)
            #expect(page.status == 200, "\(page.error)")
            let bytes = page.frames.map(\.bytes.count).reduce(0, +)
            #expect(page.frames.count == 1 || bytes <= cap, "\(bytes)")
            seen += page.names
            pages += 1
            syncToken = page.syncToken
            if !page.moreComing { break }
        }
        #expect(pages > 2)
        #expect(seen == (0..<30).map { String(format: "r%03d", $0) })
    }

    @Test func aLookupPastTheByteCapAnswersTheRestWithAnError() throws {
        let cap = 12_000
        let h = try ServiceHarness { $0.maximumResponseBytes = cap }
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try seed(h, token: token, count: 20, textBytes: 1_500)
        let requested = (0..<20).map { String(format: "r%03d", $0) }
        let reply = h.call("records/lookup", .object([
            "zoneID": zone, "records": .array(requested.map { .object(["recordName": .string($0)]) }),
        ]), token: token)
        let codes = reply.records.map(itemCode)
        let answered = codes.prefix { $0 == "OK" }.count
        #expect(answered > 0 && answered < 20, "\(codes)")
        #expect(codes.dropFirst(answered).allSatisfy { $0 == "LIMIT_EXCEEDED" }, "\(codes)")
        #expect(reply.records[answered]["recordName"]?.stringValue == requested[answered])
        #expect(reply.records[answered]["reason"]?.stringValue?.contains("another request") == true)
        #expect(reply.response.body.count < cap + 20 * 400, "\(reply.response.body.count)")
        // A missing record is still NOT_FOUND, wherever it is.
        let mixed = h.lookup(zone, ["nope"] + requested, token: token).map(itemCode)
        #expect(mixed.first == "NOT_FOUND")
    }

    // MARK: The request deadline

    /// A second service on the harness's storage, with a request deadline of `milliseconds`.
    private func service(_ h: ServiceHarness, deadline milliseconds: Int64) throws -> LatticeService {
        var configuration = h.service.configuration
        configuration.requestDeadlineMilliseconds = milliseconds
        return try LatticeService(storage: h.storage, configuration: configuration, keyRing: h.keyRing, log: { _ in })
    }

    private func call(_ service: LatticeService, _ operation: String, _ body: JSON, token: String,
                      database: String = "private") -> (Int, JSON) {
        let response = service.respond(to: HTTPRequest(
            method: "POST", path: "/database/1/lattice/production/\(database)/\(operation)",
            headers: ["Authorization": "Bearer " + token], body: body.serializedBytes(), remoteAddress: "127.0.0.1"))
        return (response.status, (try? JSON.parse(response.body)) ?? .null)
    }

    /// A heavy query: 32 filters and a sort on a list field of 500 elements per record.
    private func heavyQuery() -> JSON {
        let contains: [JSON] = (0..<32).map { index in
            .object(["fieldName": .string("tags"), "comparator": .string("NOT_LIST_CONTAINS"),
                     "fieldValue": .object(["value": .int(Int64(-1 - index)), "type": .string("INT64")])])
        }
        return .object(["zoneID": zone, "query": .object([
            "recordType": .string("Item"), "filterBy": .array(contains),
            "sortBy": .array([.object(["fieldName": .string("tags")])]),
        ])])
    }

    @Test func aQueryPastItsDeadlineGetsTryAgainLater() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        // Grow the zone until the query takes at least half a second with no deadline to speak of (bounded:
        // at most 8 rounds), then ask again with a deadline a twentieth of that.
        let generous = try service(h, deadline: 600_000)
        var measured = 0.0
        var records = 0
        for round in 0..<8 {
            let batch = (0..<20).map { index in
                operation("create", "q\(round)-\(index)", fields: [
                    "tags": .object(["value": .array((0..<500).map { .int(Int64($0)) }), "type": .string("INT64_LIST")]),
                ])
            }
            #expect(h.modify("Z", batch, token: token).records.allSatisfy { $0["serverErrorCode"] == nil })
            records += batch.count
            let start = Date()
            let (status, _) = call(generous, "records/query", heavyQuery(), token: token)
            measured = Date().timeIntervalSince(start)
            #expect(status == 200)
            if measured >= 0.5 { break }
        }
        print("[request bounds] heavy query over \(records) records: \(String(format: "%.2f", measured)) s")
        // Timing on a shared machine swings: the deadline starts at a twentieth of the measured time and is
        // cut by four while the query still finishes inside it (at most 6 tries, never under 5 ms).
        var deadline = max(5, Int64(measured * 1000 / 20))
        var outcome: (Int, JSON) = (0, .null)
        for _ in 0..<6 {
            outcome = call(try service(h, deadline: deadline), "records/query", heavyQuery(), token: token)
            if outcome.0 != 200 { break }
            print("[request bounds] the heavy query finished inside \(deadline) ms; trying a shorter deadline")
            deadline = max(5, deadline / 4)
        }
        #expect(outcome.0 == 503 && outcome.1["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER", "\(outcome.1)")
        #expect(outcome.1["reason"]?.stringValue?.contains("deadline") == true)
    }

    /// The same without timing: a query whose deadline has passed when its work begins is stopped there.
    @Test func aQueryWhoseDeadlinePassedStopsAndIsAnsweredTryAgainLater() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try seed(h, token: token, count: 3)
        let user = try #require(try h.storage.read { try $0.user(named: "ann") })
        let body: [String: JSON] = ["zoneID": zone, "query": .object(["recordType": .string("Item")])]
        var context = RequestContext(user: user, kind: .private, environment: "production", body: body,
                                     rawBody: JSON.object(body).serializedBytes(), path: "/records/query")
        let records = Records(h.service.core)
        #expect(try records.query(context.caller, body)["records"]?.arrayValue?.count == 3)
        context.deadline = .after(milliseconds: 0)
        #expect(throws: StorageError.deadlineExceeded) { try records.query(context.caller, body) }
        #expect(h.service.internalError(StorageError.deadlineExceeded).code == .tryAgainLater)
        // And a write whose deadline passed writes nothing.
        let modify: [String: JSON] = ["zoneID": zone, "operations": .array([operation("create", "late")])]
        var write = RequestContext(user: user, kind: .private, environment: "production", body: modify,
                                   rawBody: JSON.object(modify).serializedBytes(), path: "/records/modify")
        write.deadline = .after(milliseconds: 0)
        #expect(throws: StorageError.deadlineExceeded) {
            try h.service.write(deadline: write.deadline) { tx, touched in
                try records.modifyRecordsOutcome(write.caller, modify, tx, &touched)
            }
        }
        #expect(h.lookup(zone, ["late"], token: token).map(itemCode) == ["NOT_FOUND"])
    }

    @Test func aWritePastItsDeadlineWritesNothing() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        try h.createZone("Scratch", token: token)
        // Five records with lists of 4,000 elements in one atomic request: timed into a scratch zone, then
        // sent to Z with a deadline a twentieth of that.
        func batch(_ prefix: String) -> [JSON] {
            (0..<5).map { index in
                operation("create", "\(prefix)\(index)", fields: [
                    "tags": .object(["value": .array((0..<4_000).map { .string("t\($0)") }), "type": .string("STRING_LIST")]),
                ])
            }
        }
        let generous = try service(h, deadline: 600_000)
        let start = Date()
        let (timedStatus, _) = call(generous, "records/modify", .object([
            "zoneID": .object(["zoneName": .string("Scratch")]), "operations": .array(batch("w")),
        ]), token: token)
        let measured = Date().timeIntervalSince(start)
        print("[request bounds] write of 5 lists of 4,000 elements: \(String(format: "%.2f", measured)) s")
        #expect(timedStatus == 200)
        try #require(measured >= 0.1, "the write is too quick on this machine to test a deadline against")
        // As for the query: a twentieth of the measured time, cut by four while the write still fits. Each
        // try writes into a fresh zone, whose state is compared before and after the try that was stopped.
        var deadline = max(5, Int64(measured * 1000 / 20))
        var outcome: (Int, JSON) = (0, .null)
        var target = "Z", before = JSON.null
        for attempt in 0..<6 {
            target = attempt == 0 ? "Z" : "Try\(attempt)"
            if attempt > 0 { try h.createZone(target, token: token) }
            before = h.snapshot(target, names: (0..<5).map { "w\($0)" }, token: token)
            outcome = call(try service(h, deadline: deadline), "records/modify", .object([
                "zoneID": .object(["zoneName": .string(target)]), "operations": .array(batch("w")),
            ]), token: token)
            if outcome.0 != 200 { break }
            print("[request bounds] the write finished inside \(deadline) ms; trying a shorter deadline")
            deadline = max(5, deadline / 4)
        }
        #expect(outcome.0 == 503 && outcome.1["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER", "\(outcome.1)")
        #expect(h.snapshot(target, names: (0..<5).map { "w\($0)" }, token: token) == before)
    }

    // MARK: Value ranges

    private func location(_ latitude: JSON, _ longitude: JSON, extra: [String: JSON] = [:]) -> JSON {
        var object: [String: JSON] = ["latitude": latitude, "longitude": longitude]
        for (key, value) in extra { object[key] = value }
        return .object(["value": .object(object), "type": .string("LOCATION")])
    }

    private func timestamp(_ milliseconds: Int64) -> JSON {
        .object(["value": .int(milliseconds), "type": .string("TIMESTAMP")])
    }

    @Test func valueRangesAreCheckedOnInputInJSON() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        let refused: [(String, JSON, String)] = [
            ("lat", location(.int(1000), .int(0)), "latitude"),
            ("latLow", location(.double(-90.5), .int(0)), "latitude"),
            ("lon", location(.int(0), .int(181)), "longitude"),
            ("nan", location(.string("NaN"), .int(0)), "latitude"),
            ("alt", location(.int(0), .int(0), extra: ["altitude": .string("Infinity")]), "altitude"),
            ("acc", location(.int(0), .int(0), extra: ["horizontalAccuracy": .string("NaN")]), "horizontalAccuracy"),
            ("when", location(.int(0), .int(0), extra: ["timestamp": .int(ValueDomain.latestTimestamp + 1)]), "timestamp"),
            ("late", timestamp(ValueDomain.latestTimestamp + 1), "TIMESTAMP"),
            ("early", timestamp(ValueDomain.earliestTimestamp - 1), "TIMESTAMP"),
            ("list", .object(["value": .array([.int(0), .int(Int64.max)]), "type": .string("TIMESTAMP_LIST")]), "TIMESTAMP"),
        ]
        for (name, field, word) in refused {
            let reply = h.modify("Z", [operation("create", name, fields: ["f": field])], token: token)
            let item = reply.records.first ?? .null
            #expect(itemCode(item) == "BAD_REQUEST", "\(name): \(reply.json)")
            let reason = item["reason"]?.stringValue ?? ""
            #expect(reason.contains("record \(name)") && reason.contains("field f") && reason.contains(word), "\(name): \(reason)")
        }
        // Added list elements are checked too.
        let added = h.modify("Z", [operation("create", "adds", fields: [
            "f": .object(["add": .array([.int(ValueDomain.earliestTimestamp - 1)]), "type": .string("TIMESTAMP_LIST")]),
        ])], token: token)
        #expect(itemCode(added.records.first ?? .null) == "BAD_REQUEST", "\(added.json)")
        #expect(h.lookup(zone, refused.map(\.0) + ["adds"], token: token).allSatisfy { itemCode($0) == "NOT_FOUND" })
        // The edges are inside.
        let edges = h.modify("Z", [operation("create", "edges", fields: [
            "a": location(.int(90), .int(-180), extra: ["altitude": .double(-430.5), "timestamp": .int(0)]),
            "b": location(.int(-90), .int(180)),
            "c": timestamp(ValueDomain.latestTimestamp), "d": timestamp(ValueDomain.earliestTimestamp),
        ])], token: token)
        #expect(edges.records.first?["serverErrorCode"] == nil, "\(edges.json)")
    }

    @Test func valueRangesAreCheckedOnInputInCRDTStatesAndPushedFrames() throws {
        let h = try ServiceHarness()
        let (token, owner) = try h.signUp("ann")
        try h.createZone("Z", token: token)
        var device = DeviceStates(zoneID: try ZoneID(zoneName: "Z", ownerRecordName: owner), replica: 0xB0, clock: h.clock)
        let far = try device.make("far", fields: ["at": .location(Location(latitude: 1000, longitude: 0))])
        let when = try device.make("when", fields: ["ok": .string("x"), "when": .timestamp(Int64.max)])
        var tagged = try device.make("tagged")
        try tagged.add(.location(Location(latitude: 0, longitude: 0, speed: .infinity)), to: "places", at: device.stamp())
        let fine = try device.make("fine", fields: ["at": .location(Location(latitude: 45, longitude: 7, timestamp: 0))])
        for (record, field) in [(far, "at"), (when, "when"), (tagged, "places")] {
            let name = record.id.recordName
            let json = h.modify("Z", [.object(["operationType": .string("forceUpdate"), "record": record.cloudKitJSON])],
                                token: token)
            #expect(matrixCode(json) == "BAD_REQUEST", "\(name) JSON: \(json.json.serialized().prefix(300))")
            #expect(json.records.first?["reason"]?.stringValue?.contains("record \(name) field \(field)") == true,
                    "\(json.json.serialized().prefix(300))")
            let pushed = h.push(try DeltaBytes.push(device.zoneID, [record, fine]), token: token)
            let items = Dictionary(uniqueKeysWithValues: pushed.records.map { ($0["recordName"]?.stringValue ?? "", $0) })
            #expect(items[name].map(itemCode) == "BAD_REQUEST" && items["fine"].map(itemCode) == "ATOMIC_ERROR",
                    "\(name) binary: \(pushed.json)")
            #expect(items[name]?["reason"]?.stringValue?.contains("record \(name) field \(field)") == true)
            #expect(h.lookup(zone, [name, "fine"], token: token).map(itemCode) == ["NOT_FOUND", "NOT_FOUND"])
        }
        #expect(h.push(try DeltaBytes.push(device.zoneID, [fine]), token: token).records.map(itemCode) == ["OK"])
    }
}
