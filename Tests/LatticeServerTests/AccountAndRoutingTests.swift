import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
@testable import LatticeServer
@testable import LatticeStore
import LatticeSQLite
import LatticeTestSupport
import Testing

/// Routing, sign-up, authentication and the error taxonomy, in-process (Request -> Response).
@Suite struct AccountAndRoutingTests {
    @Test func healthzAnswers200AndUnknownRoutesAre404() throws {
        let h = try ServiceHarness()
        #expect(h.raw("GET", "/healthz").status == 200)
        let missing = h.raw("GET", "/nope")
        #expect(missing.status == 404)
        #expect(missing.code == "NOT_FOUND")
        #expect(missing.response.header("Content-Type")?.hasPrefix("application/json") == true)
        let wrongMethod = h.raw("GET", "/database/1/lattice/production/private/zones/list")
        #expect(wrongMethod.status == 405 && wrongMethod.code == "METHOD_NOT_ALLOWED")
        #expect(wrongMethod.response.header("Allow") == "POST")
        let unknownOperation = h.call("records/explode", token: nil)
        #expect(unknownOperation.code == "NOT_FOUND")
        let (token, _) = try h.signUp("ann")
        #expect(h.post("/database/1/other/production/private/zones/list", .object([:]), token: token).code == "NOT_FOUND")
        #expect(h.post("/database/1/lattice/staging/private/zones/list", .object([:]), token: token).code == "BAD_REQUEST")
        #expect(h.post("/database/1/lattice/production/global/zones/list", .object([:]), token: token).code == "BAD_REQUEST")
    }

    @Test func signUpMakesCloudKitStyleUsersWithUniqueNames() throws {
        let h = try ServiceHarness()
        let reply = h.post("/auth/signup", .object(["name": .string("ann")]), token: nil)
        #expect(reply.status == 200)
        let recordName = try #require(reply["userRecordName"]?.stringValue)
        #expect(recordName.hasPrefix("_") && recordName.utf8.count == 33)
        #expect(recordName.dropFirst().allSatisfy { $0.isHexDigit && !$0.isUppercase })
        let token = try #require(reply["token"]?.stringValue)
        #expect(token.utf8.count == 3 + 64) // 256 random bits in hex

        let current = h.call("users/current", token: token)
        #expect(current["userRecordName"]?.stringValue == recordName)
        #expect(current["name"]?.stringValue == "ann")

        let again = h.post("/auth/signup", .object(["name": .string("ann")]), token: nil)
        #expect(again.status == 409 && again.code == "EXISTS")
        for bad in ["", "-x", "a b", "é", String(repeating: "a", count: 65)] {
            #expect(h.post("/auth/signup", .object(["name": .string(bad)]), token: nil).code == "BAD_REQUEST", "\(bad)")
        }
        #expect(h.post("/auth/signup", .object(["name": .int(3)]), token: nil).code == "BAD_REQUEST")
    }

    @Test func tokensAreStoredOnlyAsHashes() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        h.storage.close()
        var bytes = [UInt8]()
        // Every file under the directory (the asset store's directory included).
        for case let file as String in FileManager.default.enumerator(atPath: h.directory)?.allObjects ?? [] {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: h.directory + "/" + file, isDirectory: &isDirectory),
                  !isDirectory.boolValue else { continue }
            bytes += [UInt8](try Data(contentsOf: URL(fileURLWithPath: h.directory + "/" + file)))
        }
        let needle = Array(token.utf8.dropFirst(3).prefix(32))
        let found = bytes.indices.dropLast(needle.count).contains { bytes[$0..<($0 + needle.count)].elementsEqual(needle) }
        #expect(!found)
    }

    @Test func closedRegistrationRefusesSignUpButAdminCanAddUsers() throws {
        let h = try ServiceHarness { $0.registrationOpen = false }
        let reply = h.post("/auth/signup", .object(["name": .string("ann")]), token: nil)
        #expect(reply.status == 403 && reply.code == "ACCESS_DENIED")
        let account = try h.service.createAccount(name: "ann")
        #expect(h.call("users/current", token: account.token.text)["name"]?.stringValue == "ann")
        #expect(throws: ServiceError.self) { try h.service.createAccount(name: "ann") }
    }

    @Test func authenticationFailures() throws {
        let h = try ServiceHarness()
        let (ann, _) = try h.signUp("ann")
        let (_, bobName) = try h.signUp("bob")

        let none = h.call("zones/list", token: nil)
        #expect(none.status == 421 && none.code == "AUTHENTICATION_REQUIRED")
        let bad = h.call("zones/list", token: "lt_" + String(repeating: "0", count: 64))
        #expect(bad.status == 401 && bad.code == "AUTHENTICATION_FAILED")
        let malformed = h.raw("POST", "/database/1/lattice/production/private/zones/list", headers: ["Authorization": "Basic abc"])
        #expect(malformed.code == "AUTHENTICATION_FAILED")

        // Ann names a zone in Bob's private database.
        let foreign = h.call("records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Lists"), "ownerRecordName": .string(bobName)]),
            "records": .array([.object(["recordName": .string("x")])]),
        ]), token: ann)
        #expect(foreign.status == 403 && foreign.code == "ACCESS_DENIED")
        #expect(h.modify("Lists", [operation("create", "x")], token: ann,
                         extra: ["zoneID": .object(["zoneName": .string("Lists"),
                                                    "ownerRecordName": .string(bobName)])]).code == "ACCESS_DENIED")
    }

    @Test func malformedBodiesAndWrongTypesAreBadRequests() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        let path = "/database/1/lattice/production/private/records/modify"
        for body in ["{", "[]", "{\"zoneID\": 1}", "nul", "{\"a\":1}x", "\u{FF}"] {
            let reply = h.raw("POST", path, body: Array(body.utf8), token: token)
            #expect(reply.status == 400 && reply.code == "BAD_REQUEST", "\(body)")
            #expect(reply["reason"]?.stringValue?.isEmpty == false)
        }
        try h.createZone("Lists", token: token)
        let cases: [JSON] = [
            .object(["zoneID": .object(["zoneName": .string("Lists")]), "operations": .string("x")]),
            .object(["zoneID": .object(["zoneName": .string("Lists")]), "operations": .array([.int(1)])]),
            .object(["zoneID": .object(["zoneName": .string("Lists")]), "atomic": .string("yes"),
                     "operations": .array([operation("create", "a")])]),
        ]
        for body in cases {
            #expect(h.call("records/modify", body, token: token).code == "BAD_REQUEST", "\(body.serialized())")
        }
        // Per-operation type errors come back per item.
        let typed = h.modify("Lists", [
            operation("create", "a", fields: ["n": .object(["value": .string("x"), "type": .string("INT64")])]),
        ], token: token)
        #expect(typed.records.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        let unknownType = h.modify("Lists", [
            operation("create", "a", fields: ["n": .object(["value": .int(1), "type": .string("WIDGET")])]),
        ], token: token)
        #expect(unknownType.records.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        let badOperation = h.modify("Lists", [operation("upsert", "a")], token: token)
        #expect(badOperation.records.first?["serverErrorCode"]?.stringValue == "BAD_REQUEST")
    }

    @Test func throttledRequestsCarryRetryAfter() throws {
        let h = try ServiceHarness { $0.rateLimit = .init(requestsPerSecond: 1, burst: 3) }
        let (token, _) = try h.signUp("ann")
        var replies: [ServiceHarness.Reply] = []
        for _ in 0..<5 { replies.append(h.call("zones/list", token: token)) }
        let throttled = try #require(replies.first { $0.code == "THROTTLED" })
        #expect(throttled.status == 429)
        #expect(throttled.response.header("Retry-After") == "1")
        #expect(throttled["retryAfter"]?.intValue == 1)
        h.clock.advance(5_000)
        #expect(h.call("zones/list", token: token).status == 200)
    }

    @Test func aLockedDatabaseAnswersTryAgainLater() throws {
        let directory = temporaryDirectory()
        let path = directory + "/" + SQLiteStorage.fileName
        let storage = try SQLiteStorage(path: path, busyTimeoutMilliseconds: 50)
        defer { storage.close() }
        var configuration = ServiceConfiguration()
        configuration.rateLimit = nil
        let service = try LatticeService(storage: storage, configuration: configuration, log: { _ in })
        let token = try service.createAccount(name: "ann").token.text
        // Another process holds the write lock.
        let other = try Connection(path: path)
        try other.execute("BEGIN IMMEDIATE")
        let response = service.respond(to: HTTPRequest(
            method: "POST", path: "/database/1/lattice/production/private/zones/modify",
            headers: ["Authorization": "Bearer " + token],
            body: Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Z"}}}]}"#.utf8)))
        try other.execute("ROLLBACK")
        #expect(response.status == 503)
        let json = try JSON.parse(response.body)
        #expect(json["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
        #expect(response.header("Retry-After") != nil && json["retryAfter"] != nil)
    }

    @Test func internalErrorsHideTheirDetails() throws {
        let h = try ServiceHarness()
        let (token, _) = try h.signUp("ann")
        try h.createZone("Lists", token: token)
        #expect(h.modify("Lists", [operation("create", "a")], token: token).records.first?["recordChangeTag"] != nil)
        // Corrupt the stored frame behind the service's back.
        let other = try Connection(path: h.directory + "/" + SQLiteStorage.fileName)
        try other.execute("UPDATE records SET frame = x'00'")
        let reply = h.call("records/lookup", .object(["zoneID": .object(["zoneName": .string("Lists")]),
                                                      "records": .array([.object(["recordName": .string("a")])])]),
                           token: token)
        #expect(reply.status == 500 && reply.code == "INTERNAL_ERROR")
        let text = reply.json.serialized()
        #expect(!text.contains("SELECT") && !text.contains("records") && !text.contains("frame") && !text.contains(token))
    }
}
