import Testing
import LatticeAPI
import LatticeCore

/// The reason a decode throws, or nil.
private func reason(_ body: () throws -> Void) -> String? {
    do { try body(); return nil } catch { return (error as? ServiceError)?.reason ?? "not a ServiceError: \(error)" }
}

private func body(_ text: String) -> JSON { try! JSON.parse(text) }

@Suite("share requests")
struct ShareRequestTests {
    @Test("shares/create: zone id, root, title, public permission, in the server's order")
    func createMessages() throws {
        #expect(reason { _ = try ShareCreateRequest(json: body("{}")) } == "zoneID is missing")
        #expect(reason { _ = try ShareCreateRequest(json: body(#"{"zoneID": {"zoneName": "Z"}, "rootRecordName": 1, "title": 2}"#)) }
                == "rootRecordName must be a string")
        #expect(reason { _ = try ShareCreateRequest(json: body(#"{"zoneID": {"zoneName": "Z"}, "title": 2, "publicPermission": 3}"#)) }
                == "title must be a string of at most 1024 bytes")
        let long = String(repeating: "é", count: 513) // 1026 bytes
        #expect(reason { _ = try ShareCreateRequest(json: .object(["zoneID": .object(["zoneName": .string("Z")]),
                                                                   "title": .string(long)])) }
                == "title must be a string of at most 1024 bytes")
        #expect(reason { _ = try ShareCreateRequest(json: body(#"{"zoneID": {"zoneName": "Z"}, "publicPermission": "all"}"#)) }
                == "publicPermission must be none, readOnly or readWrite")
        let request = try ShareCreateRequest(json: body(#"{"zoneID": {"zoneName": "Z"}, "publicPermission": "none"}"#))
        #expect(request == ShareCreateRequest(zoneID: WireZoneID(zoneName: "Z"), publicPermission: SharePermission.none))
    }

    @Test("the share target: zone id before shareRecordName")
    func targetMessages() {
        #expect(reason { _ = try ShareTarget(json: body(#"{"zoneID": 1, "shareRecordName": 2}"#)) }
                == "zoneID must be {\"zoneName\": ...}")
        #expect(reason { _ = try ShareTarget(json: body(#"{"zoneID": {"zoneName": "Z"}, "shareRecordName": 2}"#)) }
                == "shareRecordName must be a string")
    }

    @Test("shares/modify: the participants' path-precise messages, each in its turn")
    func modifyMessages() throws {
        let zone = #""zoneID": {"zoneName": "Z"}"#
        #expect(reason { _ = try ShareModifyRequest(json: body("{\(zone), \"title\": 1, \"publicPermission\": 2}")) }
                == "title must be a string of at most 1024 bytes")
        #expect(reason { _ = try ShareModifyRequest(json: body("{\(zone), \"publicPermission\": 2, \"participants\": 3}")) }
                == "publicPermission must be none, readOnly or readWrite")
        #expect(reason { _ = try ShareModifyRequest(json: body("{\(zone), \"participants\": 3}")) } == "expected \"participants\": [...]")
        #expect(reason { _ = try ShareModifyRequest(json: body("{\(zone), \"participants\": [{}, 4]}")) }
                == "participants[1] must be an object")
        let request = try ShareModifyRequest(json: body("""
            {\(zone), "participants": [
                {"operation": "invite", "userName": "bob", "permission": "readWrite"},
                {"operation": "invite", "permission": "readWrite"},
                {"operation": "invite", "userName": "bob"},
                {"operation": "invite", "userName": "bob", "permission": "none"},
                {"operation": "invite", "userName": "bob", "permission": "readOnly", "role": "owner"},
                {"operation": "setPermission", "userRecordName": "_b", "permission": 7},
                {"operation": "promote", "userName": "bob"},
                {"operation": "remove", "userName": 5, "userRecordName": "_b"},
                {"operation": "invite", "userName": "bob", "permission": "readOnly", "role": 9},
                {"operation": "invite", "userName": "bob", "permission": "readOnly", "role": "administrator"}]}
            """))
        #expect(try request.participants[0].get() == ShareParticipantChange(.invite(.readWrite, role: .privateUser), .userName("bob")))
        #expect(reason { _ = try request.participants[1].get() } == "participants[1] needs userName or userRecordName")
        #expect(reason { _ = try request.participants[2].get() } == "participants[2].permission is required")
        #expect(reason { _ = try request.participants[3].get() } == "participants[3].permission must be readOnly or readWrite")
        #expect(reason { _ = try request.participants[4].get() } == "participants[4].role must be privateUser or administrator")
        #expect(reason { _ = try request.participants[5].get() } == "participants[5].permission must be readOnly or readWrite")
        #expect(reason { _ = try request.participants[6].get() }
                == "participants[6].operation must be invite, setPermission or remove")
        #expect(try request.participants[7].get() == ShareParticipantChange(.remove, .userRecordName("_b")))
        #expect(try request.participants[8].get() == ShareParticipantChange(.invite(.readOnly, role: .privateUser), .userName("bob")))
        #expect(try request.participants[9].get() == ShareParticipantChange(.invite(.readOnly, role: .administrator), .userName("bob")))
    }

    @Test("shares/modify: at most 200 participants")
    func participantLimit() {
        let many = JSON.object(["zoneID": .object(["zoneName": .string("Z")]),
                                "participants": .array(Array(repeating: .object([:]), count: 201))])
        do {
            _ = try ShareModifyRequest(json: many)
            Issue.record("201 participants passed")
        } catch {
            #expect(error.code == .limitExceeded)
            #expect(error.reason == "201 items in participants; the limit is 200 per request")
        }
    }

    @Test("shares/url: rotate, permission, expiry, uses, in the server's order")
    func urlMessages() throws {
        let zone = #""zoneID": {"zoneName": "Z"}"#
        #expect(reason { _ = try ShareURLRequest(json: body("{\(zone), \"rotate\": 1, \"permission\": 2}")) }
                == "rotate must be true or false")
        #expect(reason { _ = try ShareURLRequest(json: body("{\(zone), \"permission\": \"none\"}")) }
                == "permission must be readOnly or readWrite")
        for bad in ["0", "315360001", "1.5", "\"60\""] {
            #expect(reason { _ = try ShareURLRequest(json: body("{\(zone), \"expiresInSeconds\": \(bad), \"maxUses\": 0}")) }
                    == "expiresInSeconds must be from 1 to 10 years in seconds")
        }
        for bad in ["0", "1000001", "true"] {
            #expect(reason { _ = try ShareURLRequest(json: body("{\(zone), \"maxUses\": \(bad)}")) } == "maxUses must be a positive integer")
        }
        let request = try ShareURLRequest(json: body("{\(zone), \"expiresInSeconds\": 315360000, \"maxUses\": 1000000}"))
        #expect(request.expiresInSeconds == 315_360_000 && request.maxUses == 1_000_000)
    }

    @Test("records/resolve|accept: a link that is no string fails alone; a URL is cut to its token")
    func linkMessages() throws {
        #expect(reason { _ = try ShareLinksRequest(json: body("{}")) } == "expected \"shortGUIDs\": [...]")
        #expect(reason { _ = try ShareLinksRequest(json: body(#"{"shortGUIDs": [1]}"#)) } == "shortGUIDs[0] must be an object")
        let request = try ShareLinksRequest(json: body(#"""
            {"shortGUIDs": [{"value": "http://h/share/abc"}, "tok", {"value": 3}]}
            """#))
        #expect(try request.links[0].get() == "abc")
        #expect(try request.links[1].get() == "tok")
        #expect(reason { _ = try request.links[2].get() } == "expected {\"value\": token}")
        do {
            _ = try ShareLinksRequest(json: .object(["shortGUIDs": .array(Array(repeating: .string("t"), count: 21))]))
            Issue.record("21 links passed")
        } catch {
            #expect(error.reason == "21 items in shortGUIDs; the limit is 20 per request")
        }
    }

    @Test("share answers: a link's error item never carries the token; metadata without a participant")
    func answers() throws {
        let metadata = ShareMetadata(shareRecordName: "S", title: "T", zoneID: WireZoneID(zoneName: "Z", ownerRecordName: "_o"),
                                     ownerRecordName: "_o", ownerName: "olga", linkPermission: .readOnly,
                                     publicPermission: .none, currentStatus: .removed, participantStatus: .removed)
        let links = ShareLinksResponse(results: [.success(metadata), .failure(ServiceError(.accessDenied, "no"))])
        let json = links.json
        #expect(json["results"]?.arrayValue?[1]["value"] == .string(""))
        #expect(json["results"]?.arrayValue?[1]["serverErrorCode"] == .string("ACCESS_DENIED"))
        #expect(json["results"]?.arrayValue?[0]["participantStatus"] == .string("removed"))
        #expect(json["results"]?.arrayValue?[0]["participantPermission"] == .string("none"))
        #expect(json["results"]?.arrayValue?[0]["participantRole"] == nil)
        let back = try #require(ShareLinksResponse(json: json))
        #expect(try back.results[0].get() == metadata)
        #expect(reason { _ = try back.results[1].get() } == "no")
    }

    @Test("share requests and answers survive encode then decode (random, seed printed)")
    func roundTrips() throws {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("ShareRequestTests.roundTrips seed \(seed)")
        var random = SplitMix64(seed: seed)
        func name() -> String { "N" + String(Int.random(in: 0..<1_000_000, using: &random)) }
        func maybe<T>(_ value: @autoclosure () -> T) -> T? { Bool.random(using: &random) ? value() : nil }
        func permission(allowNone: Bool) -> SharePermission {
            (allowNone ? SharePermission.allCases : [.readOnly, .readWrite]).randomElement(using: &random)!
        }
        for _ in 0..<200 {
            let zoneID = WireZoneID(zoneName: name(), ownerRecordName: maybe("_" + name()))
            let target = ShareTarget(zoneID: zoneID, shareRecordName: maybe(name()))
            #expect(try ShareTarget(json: target.json) == target, "seed \(seed)")
            let create = ShareCreateRequest(zoneID: zoneID, rootRecordName: maybe(name()), title: maybe(name()),
                                            publicPermission: maybe(permission(allowNone: true)))
            #expect(try ShareCreateRequest(json: create.json) == create, "seed \(seed)")
            let changes = (0..<Int.random(in: 0...3, using: &random)).map { _ -> ShareParticipantChange in
                let user: ParticipantIdentity = Bool.random(using: &random) ? .userName(name()) : .userRecordName("_" + name())
                switch Int.random(in: 0..<3, using: &random) {
                case 0: return ShareParticipantChange(.invite(permission(allowNone: false),
                                                              role: Bool.random(using: &random) ? .administrator : .privateUser), user)
                case 1: return ShareParticipantChange(.setPermission(permission(allowNone: false)), user)
                default: return ShareParticipantChange(.remove, user)
                }
            }
            let modify = ShareModifyRequest(target: target, title: maybe(name()), publicPermission: maybe(permission(allowNone: true)),
                                            participants: changes)
            let decoded = try ShareModifyRequest(json: modify.json)
            #expect(decoded.target == target && decoded.title == modify.title && decoded.publicPermission == modify.publicPermission,
                    "seed \(seed)")
            #expect(try decoded.participants.map { try $0.get() } == changes, "seed \(seed)")
            let url = ShareURLRequest(target: target, permission: maybe(permission(allowNone: false)),
                                      expiresInSeconds: maybe(Int64.random(in: 1...ShareURLRequest.maximumLifetimeSeconds, using: &random)),
                                      maxUses: maybe(Int.random(in: 1...ShareURLRequest.maximumUses, using: &random)),
                                      rotate: maybe(Bool.random(using: &random)))
            #expect(try ShareURLRequest(json: url.json) == url, "seed \(seed)")
            let tokens = (0..<Int.random(in: 0...3, using: &random)).map { _ in name() }
            #expect(try ShareLinksRequest(json: ShareLinksRequest(links: tokens).json).links.map { try $0.get() } == tokens)

            let participants = (0..<Int.random(in: 0...3, using: &random)).map { _ in
                ShareParticipantDescription(userRecordName: "_" + name(), name: name(),
                                            role: ShareRole.allCases.randomElement(using: &random)!,
                                            permission: permission(allowNone: true),
                                            acceptanceStatus: AcceptanceStatus.allCases.randomElement(using: &random)!)
            }
            let owned = WireZoneID(zoneName: zoneID.zoneName, ownerRecordName: "_" + name())
            let share = ShareDescription(shareRecordName: name(), zoneID: owned, title: name(),
                                         publicPermission: permission(allowNone: true), participants: participants,
                                         urlEpoch: Int64.random(in: 0...9, using: &random), rootRecordName: maybe(name()))
            #expect(ShareDescription(json: share.json) == share, "seed \(seed)")
            #expect(ShareLeaveResponse(json: ShareLeaveResponse(zoneID: owned).json) == ShareLeaveResponse(zoneID: owned))
            #expect(ShareDeleteResponse(json: ShareDeleteResponse(shareRecordName: share.shareRecordName).json)?.shareRecordName
                    == share.shareRecordName)
            let answer = ShareURLResponse(url: name(), token: name(), permission: permission(allowNone: false),
                                          epoch: Int64.random(in: 0...9, using: &random),
                                          expiresAt: maybe(Int64.random(in: 0...1 << 40, using: &random)),
                                          maxUses: maybe(Int.random(in: 1...9, using: &random)))
            #expect(ShareURLResponse(json: answer.json) == answer, "seed \(seed)")
            let joined = Bool.random(using: &random)
            let metadata = ShareMetadata(
                shareRecordName: name(), title: name(), zoneID: owned, ownerRecordName: owned.ownerRecordName!,
                ownerName: name(), linkPermission: permission(allowNone: false), publicPermission: permission(allowNone: true),
                rootRecordName: maybe(name()), currentStatus: maybe(AcceptanceStatus.allCases.randomElement(using: &random)!),
                participantRole: joined ? .privateUser : nil, participantPermission: joined ? .readOnly : .none,
                participantStatus: joined ? .accepted : maybe(.removed))
            #expect(ShareMetadata(json: metadata.json) == metadata, "seed \(seed)")
        }
    }
}
