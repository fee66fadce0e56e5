import Testing
import LatticeAPI
import LatticeCore

private func body(_ text: String) -> JSON { try! JSON.parse(text) }

@Suite("answers")
struct ResponseTests {
    @Test("service errors decode from error objects; an unknown code keeps its text")
    func serviceErrors() throws {
        let conflict = try #require(ServiceError(json: body(#"""
            {"recordName": "a", "serverErrorCode": "CONFLICT", "reason": "changed", "serverRecord": {"recordName": "a"},
             "extra": 1}
            """#), itemKey: "recordName"))
        #expect(conflict.code == .conflict && conflict.reason == "changed" && conflict.serverRecord == body(#"{"recordName": "a"}"#))
        #expect(conflict.fields == ["extra": .int(1)])
        #expect(conflict.json(item: (key: "recordName", value: "a")) == body(#"""
            {"recordName": "a", "serverErrorCode": "CONFLICT", "reason": "changed", "serverRecord": {"recordName": "a"},
             "extra": 1}
            """#))
        let throttled = try #require(ServiceError(json: body(#"{"serverErrorCode": "THROTTLED", "reason": "slow", "retryAfter": 1.5}"#)))
        #expect(throttled.code == .throttled && throttled.retryAfter == 2)
        #expect(ServiceError(json: body(#"{"serverErrorCode": "TRY_AGAIN_LATER"}"#))?.retryAfter == 1)
        let unknown = try #require(ServiceError(json: body(#"{"serverErrorCode": "NEW_CODE", "reason": "r"}"#)))
        #expect(unknown.code == .internalError && unknown.codeName == "NEW_CODE" && unknown.description == "NEW_CODE: r")
        #expect(unknown.json(item: (key: "recordName", value: "x"))["serverErrorCode"] == .string("NEW_CODE"))
        #expect(ServiceError(json: body(#"{"recordName": "a"}"#)) == nil)
        #expect(ServiceError(json: body(#"{"serverErrorCode": 3}"#)) == nil)
        // Every code of the taxonomy survives encode then decode.
        for code in ServerErrorCode.allCases {
            let error = ServiceError(code, "why", retryAfter: 7)
            let decoded = try #require(ServiceError(json: error.json()))
            #expect(decoded.code == code && decoded.reason == "why" && decoded.retryAfter == 7 && decoded.fields.isEmpty)
        }
    }

    @Test("record answers: records and error items, encode then decode")
    func recordAnswers() throws {
        let text = #"""
            {"records": [{"recordName": "a", "recordType": "T", "recordChangeTag": "1"},
                         {"recordName": "b", "serverErrorCode": "NOT_FOUND", "reason": "record b does not exist"},
                         {"recordName": "c", "serverErrorCode": "ATOMIC_ERROR", "reason": "not saved"}]}
            """#
        let modify = try RecordsModifyResponse(json: body(text))
        #expect(modify.records.map(\.recordName) == ["a", "b", "c"])
        #expect(modify.records[0].record?["recordChangeTag"] == .string("1"))
        #expect(modify.records[1].error?.code == .notFound && modify.records[2].error?.code == .atomicError)
        #expect(modify.json == body(text))
        #expect(try RecordsLookupResponse(json: body(text)).json == body(text))
        #expect(try DeltasPushResponse(json: body(text)).json == body(text))
        #expect(throws: AnswerError.self) { try RecordsModifyResponse(json: body(#"{"records": [{"recordType": "T"}]}"#)) }
        #expect(throws: AnswerError.self) { try RecordsLookupResponse(json: body("{}")) }
        let query = RecordsQueryResponse(records: [["recordName": .string("a")]], continuationMarker: "m")
        #expect(try RecordsQueryResponse(json: query.json) == query)
        #expect(try RecordsQueryResponse(json: body(#"{"records": []}"#)).continuationMarker == nil)
        let user = UsersCurrentResponse(userRecordName: "_u", name: "alice")
        #expect(try UsersCurrentResponse(json: user.json) == user)
    }

    @Test("change-feed answers, encode then decode")
    func feedAnswers() throws {
        let database = DatabaseChangesResponse(zones: [.init(zoneID: WireZoneID(zoneName: "A", ownerRecordName: "_o")),
                                                       .init(zoneID: WireZoneID(zoneName: "B", ownerRecordName: "_o"), deleted: true)],
                                               syncToken: "t", moreComing: true)
        #expect(try DatabaseChangesResponse(json: database.json) == database)
        #expect(throws: AnswerError.self) { try DatabaseChangesResponse(json: body(#"{"zones": [{"zoneID": {"zoneName": "A"}}], "syncToken": "t"}"#)) }
        let text = #"""
            {"zones": [{"zoneID": {"zoneName": "A", "ownerRecordName": "_o"}, "records": [{"recordName": "r", "deleted": true}],
                        "syncToken": "s", "moreComing": false,
                        "lostShares": [{"shareRecordName": "s1", "rootRecordName": "root"}, {"shareRecordName": "s2"}]},
                       {"zoneName": "B", "zoneID": {"zoneName": "B", "ownerRecordName": "_o"}, "serverErrorCode": "ZONE_NOT_FOUND",
                        "reason": "zone B does not exist"},
                       {"zoneName": "", "serverErrorCode": "BAD_REQUEST", "reason": "zones[2].zoneID is missing"}]}
            """#
        let zones = try ZoneChangesResponse(json: body(text))
        #expect(zones.zones[0].page?.lostShares == [SyncMessage.LostShare(rootRecordName: "root", shareRecordName: "s1"),
                                                   SyncMessage.LostShare(rootRecordName: "", shareRecordName: "s2")])
        #expect(zones.zones[1].zoneID == WireZoneID(zoneName: "B", ownerRecordName: "_o"))
        if case .failure(let error) = zones.zones[1].result { #expect(error.code == .zoneNotFound && error.fields.isEmpty) }
        #expect(zones.zones[2].zoneID == nil && zones.zones[2].zoneName == "")
        #expect(zones.json == body(text))
        #expect(try ChangesWaitResponse(json: body(#"{"changed": true}"#)).changed)
        #expect(try !ChangesWaitResponse(json: ChangesWaitResponse(changed: false).json).changed)
    }

    @Test("zone answers, encode then decode")
    func zoneAnswers() throws {
        let list = #"""
            {"zones": [{"zoneID": {"zoneName": "_defaultZone", "ownerRecordName": "_o"}, "atomic": true},
                       {"zoneID": {"zoneName": "A", "ownerRecordName": "_o"}, "atomic": true, "syncToken": "t"}]}
            """#
        let zones = try ZonesListResponse(json: body(list))
        #expect(zones.zones[1].syncToken == "t" && zones.zones[0].syncToken == nil)
        #expect(zones.zones[0].otherMembers == ["atomic": .bool(true)])
        #expect(zones.json == body(list))
        let modify = #"""
            {"zones": [{"zoneID": {"zoneName": "A", "ownerRecordName": "_o"}, "deleted": true},
                       {"zoneName": "B", "serverErrorCode": "ZONE_NOT_FOUND", "reason": "zone B does not exist"}]}
            """#
        let answer = try ZonesModifyResponse(json: body(modify))
        #expect(answer.zones[0].zone?.deleted == true && answer.zones[1].error?.code == .zoneNotFound)
        #expect(answer.zones[1].zoneName == "B")
        #expect(answer.json == body(modify))
        #expect(try ZonesLookupResponse(json: body(modify)).json == body(modify))
    }
}
