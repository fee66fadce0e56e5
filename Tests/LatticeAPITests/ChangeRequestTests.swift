import Testing
import LatticeAPI
import LatticeCore

@Suite("change requests")
struct ChangeRequestTests {
    let limits = RequestLimits(maximumOperations: 3, maximumResultsLimit: 50)

    private func reason(_ text: String) -> String? {
        do { _ = try DatabaseChangesRequest(json: try JSON.parse(text), limits: limits); return nil }
        catch { return (error as? ServiceError)?.reason ?? "not a ServiceError: \(error)" }
    }

    @Test("changes/database: the server's messages")
    func messages() {
        #expect(reason(#"{"resultsLimit": 0}"#) == "resultsLimit must be a positive integer")
        #expect(reason(#"{"resultsLimit": "5"}"#) == "resultsLimit must be a positive integer")
        #expect(reason(#"{"syncToken": 5}"#) == "syncToken must be a string")
        #expect(reason(#"{"syncToken": 5, "resultsLimit": -1}"#) == "resultsLimit must be a positive integer")
        #expect(reason("{}") == nil)
    }

    @Test("changes/database: encode then decode (random, seed printed), limit clamped")
    func roundTrips() throws {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("ChangeRequestTests.roundTrips seed \(seed)")
        var random = SplitMix64(seed: seed)
        for _ in 0..<200 {
            let request = DatabaseChangesRequest(
                syncToken: Bool.random(using: &random) ? nil : "t" + String(random.next()),
                resultsLimit: Bool.random(using: &random) ? nil : Int.random(in: 1...100, using: &random))
            let decoded = try DatabaseChangesRequest(json: request.json, limits: limits)
            #expect(decoded == request, "seed \(seed)")
            #expect(decoded.effectiveLimit(limits) == min(request.resultsLimit ?? 50, 50), "seed \(seed)")
        }
    }
}

@Suite("changes/zone requests")
struct ZoneChangesRequestTests {
    let limits = RequestLimits(maximumOperations: 3, maximumResultsLimit: 2)

    @Test("changes/zone: the server's messages, per zone")
    func messages() throws {
        let request = try ZoneChangesRequest(json: try JSON.parse(#"""
            {"resultsLimit": 0, "zones": [{"zoneID": {"zoneName": "A"}, "resultsLimit": 3, "syncToken": 1},
                                          {"zoneID": {"zoneName": "B"}}]}
            """#), limits: limits)
        func reason(_ index: Int) -> String? {
            do { _ = try request.zones[index].get(); return nil } catch { return error.reason }
        }
        #expect(reason(0) == "zones[0].syncToken must be a string")
        #expect(reason(1) == "resultsLimit must be a positive integer")
        let missing = try ZoneChangesRequest(json: try JSON.parse(#"{"zones": [{}]}"#), limits: limits)
        #expect(throws: ServiceError.self) { try missing.zones[0].get() }
        if case .failure(let error) = missing.zones[0] { #expect(error.reason == "zones[0].zoneID is missing") }
    }

    @Test("changes/zone: encode then decode (random, seed printed)")
    func roundTrips() throws {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("ZoneChangesRequestTests.roundTrips seed \(seed)")
        var random = SplitMix64(seed: seed)
        for _ in 0..<200 {
            let items = (0..<Int.random(in: 0...2, using: &random)).map { _ in
                ZoneChangesItem(zoneID: WireZoneID(zoneName: "Z" + String(random.next() % 1000)),
                                syncToken: Bool.random(using: &random) ? nil : "t" + String(random.next()),
                                resultsLimit: Bool.random(using: &random) ? nil : Int.random(in: 1...9, using: &random))
            }
            let decoded = try ZoneChangesRequest(json: ZoneChangesRequest(zones: items).json, limits: limits)
            #expect(try decoded.zones.map { try $0.get() } == items, "seed \(seed)")
        }
    }
}
