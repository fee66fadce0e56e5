import Testing
import LatticeAPI
import LatticeCore

/// The reason a decode throws, or nil.
private func reason(_ body: () throws -> Void) -> String? {
    do { try body(); return nil } catch { return (error as? ServiceError)?.reason ?? "not a ServiceError: \(error)" }
}

private func body(_ text: String) -> JSON { try! JSON.parse(text) }

@Suite("zone requests")
struct ZoneRequestTests {
    let limits = RequestLimits(maximumOperations: 3, maximumResultsLimit: 2)

    @Test("items: the server's messages for a missing list, a wrong element and too many")
    func itemsMessages() {
        #expect(reason { _ = try ZonesLookupRequest(json: body("{}"), limits: limits) } == "expected \"zones\": [...]")
        #expect(reason { _ = try ZonesLookupRequest(json: body(#"{"zones": 3}"#), limits: limits) } == "expected \"zones\": [...]")
        #expect(reason { _ = try ZonesLookupRequest(json: body(#"{"zones": [{}, 7]}"#), limits: limits) }
                == "zones[1] must be an object")
        do {
            _ = try ZonesLookupRequest(json: body(#"{"zones": [{}, {}, {}]}"#), limits: limits)
            Issue.record("three zones passed a limit of two")
        } catch {
            #expect(error.code == .limitExceeded)
            #expect(error.reason == "3 items in zones; the limit is 2 per request")
        }
        #expect(reason { _ = try ZonesModifyRequest(json: body("{}"), limits: limits) } == "expected \"operations\": [...]")
    }

    @Test("zone ids: the server's path-precise messages")
    func zoneIDMessages() throws {
        #expect(reason { _ = try WireZoneID(json: nil, path: "zoneID") } == "zoneID is missing")
        #expect(reason { _ = try WireZoneID(json: .string("a"), path: "zoneID") } == "zoneID must be {\"zoneName\": ...}")
        let lookup = try ZonesLookupRequest(json: body(#"{"zones": [{"zoneID": {"zoneName": 5}}, {"ownerRecordName": "x"}]}"#),
                                            limits: limits)
        #expect(reason { _ = try lookup.zones[0].get() } == "zones[0].zoneID.zoneName: must be a string")
        #expect(reason { _ = try lookup.zones[1].get() } == "zones[1]: expected {\"zoneName\": ...}")
        let owner = try WireZoneID(json: body(#"{"zoneName": "Z", "ownerRecordName": "__defaultOwner__"}"#), path: "z")
        #expect(owner == WireZoneID(zoneName: "Z"))
    }

    @Test("zones/modify: a bad operation fails alone, zone id checked before the operation type")
    func modifyMessages() throws {
        let request = try ZonesModifyRequest(json: body(#"""
            {"operations": [{"operationType": "rename", "zone": {"zoneID": {"zoneName": "A"}}},
                            {"operationType": "rename", "zone": {"zoneName": 1}},
                            {"operationType": "create", "zone": {"zoneName": "B"}}]}
            """#), limits: limits)
        #expect(reason { _ = try request.operations[0].get() } == "operations[0].operationType must be create or delete")
        #expect(reason { _ = try request.operations[1].get() } == "operations[1].zone.zoneID.zoneName: must be a string")
        #expect(try request.operations[2].get() == ZoneOperation(.create, WireZoneID(zoneName: "B")))
    }

    @Test("zone requests survive encode then decode (random, seed printed)")
    func roundTrips() throws {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("ZoneRequestTests.roundTrips seed \(seed)")
        var random = SplitMix64(seed: seed)
        func name() -> String { "Zone" + String(Int.random(in: 0..<1_000_000, using: &random)) }
        for _ in 0..<200 {
            let ids = (0..<Int.random(in: 0...2, using: &random)).map { _ in
                WireZoneID(zoneName: name(), ownerRecordName: Bool.random(using: &random) ? nil : "_" + name())
            }
            let lookup = try ZonesLookupRequest(json: ZonesLookupRequest(zones: ids).json, limits: limits)
            #expect(try lookup.zones.map { try $0.get() } == ids, "seed \(seed)")
            let operations = ids.map { ZoneOperation(Bool.random(using: &random) ? .create : .delete, $0) }
            let modify = try ZonesModifyRequest(json: ZonesModifyRequest(operations: operations).json, limits: limits)
            #expect(try modify.operations.map { try $0.get() } == operations, "seed \(seed)")
        }
    }
}
