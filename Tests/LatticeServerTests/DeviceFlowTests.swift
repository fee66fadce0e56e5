import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Issue 15, a person's second device: `POST /auth/device/start`, `/auth/device/approve` and
/// `/auth/device/token` (RFC 8628's device flow), in-process on the test backend (`LATTICE_TEST_BACKEND`).
@Suite struct DeviceFlowTests {
    /// A request from `address`, as the HTTP adapter would hand it over.
    static func send(_ h: ServiceHarness, _ path: String, _ body: JSON, token: String? = nil, address: String = "10.0.0.1",
                     headers: [String: String] = [:]) -> ServiceHarness.Reply {
        var headers = headers
        if let token { headers["Authorization"] = "Bearer " + token }
        let response = h.service.respond(to: HTTPRequest(method: "POST", path: path, headers: headers,
                                                         body: body.serializedBytes(), remoteAddress: address))
        return ServiceHarness.Reply(status: response.status, json: (try? JSON.parse(response.body)) ?? .null,
                                    response: response)
    }

    struct Started {
        let deviceCode: String
        let userCode: String
    }

    static func start(_ h: ServiceHarness, name: String? = "phone", address: String = "10.0.0.1") throws -> Started {
        let reply = send(h, "/auth/device/start", .object(name.map { ["deviceName": .string($0)] } ?? [:]), address: address)
        try #require(reply.status == 200, "\(reply.json.serialized())")
        return Started(deviceCode: try #require(reply["deviceCode"]?.stringValue),
                       userCode: try #require(reply["userCode"]?.stringValue))
    }

    static func poll(_ h: ServiceHarness, _ started: Started, address: String = "10.0.0.1") -> ServiceHarness.Reply {
        send(h, "/auth/device/token", .object(["deviceCode": .string(started.deviceCode)]), address: address)
    }

    static func approve(_ h: ServiceHarness, _ code: String, token: String, address: String = "10.0.0.2",
                        extra: [String: JSON] = [:]) -> ServiceHarness.Reply {
        var body: [String: JSON] = ["userCode": .string(code)]
        for (key, value) in extra { body[key] = value }
        return send(h, "/auth/device/approve", .object(body), token: token, address: address)
    }

    @Test func withTheWebPagesTheCodeIsTypedOnTheDevicesPage() throws {
        let web = try ServiceHarness { $0.webRoot = temporaryDirectory() }
        let reply = Self.send(web, "/auth/device/start", .object(["deviceName": .string("phone")]))
        #expect(reply["verificationURI"]?.stringValue == web.service.publicURL + "/web/devices.html")
        #expect(reply["message"]?.stringValue?.contains("open \(web.service.publicURL)/web/devices.html") == true)
        let bare = try ServiceHarness { $0.webRoot = nil }
        let plain = Self.send(bare, "/auth/device/start", .object(["deviceName": .string("phone")]))
        #expect(plain["verificationURI"]?.stringValue == bare.service.publicURL)
        #expect(plain["message"]?.stringValue?.contains("devices.html") == false)
    }

    @Test func aStartedDeviceIsApprovedAndGetsItsOwnNamedTokenExactlyOnce() throws {
        let h = try ServiceHarness()
        let alice = try h.signUp("alice")
        let reply = Self.send(h, "/auth/device/start", .object(["deviceName": .string("laptop")]))
        #expect(reply.status == 200)
        let userCode = try #require(reply["userCode"]?.stringValue)
        let deviceCode = try #require(reply["deviceCode"]?.stringValue)
        #expect(userCode.count == 9 && Array(userCode)[4] == "-", "\(userCode)")
        #expect(userCode.filter { $0 != "-" }.allSatisfy { Devices.userCodeAlphabet.contains($0) })
        #expect(deviceCode.hasPrefix("ld_") && deviceCode.count == 67)
        #expect(reply["expiresIn"] == .int(600) && reply["interval"] == .int(5))
        #expect(reply["verificationURI"]?.stringValue == h.service.publicURL)
        #expect(reply["message"]?.stringValue?.contains("lattice devices approve \(userCode)") == true)
        let started = Started(deviceCode: deviceCode, userCode: userCode)

        // Only hashes are stored: neither code appears in any column of the row.
        let exported: [[StorageValue]] = try h.storage.read { tx in
            var rows: [[StorageValue]] = []
            try tx.exportRows(table: "device_authorizations") { rows += $0 }
            return rows
        }
        #expect(exported.count == 1)
        let secrets = [Array(deviceCode.utf8), Array(userCode.utf8), Array(userCode.replacingOccurrences(of: "-", with: "").utf8)]
        for value in exported.flatMap({ $0 }) {
            switch value {
            case .text(let text): #expect(!secrets.contains(Array(text.utf8)))
            case .blob(let bytes): #expect(!secrets.contains(bytes))
            default: break
            }
        }

        let pending = Self.poll(h, started)
        #expect(pending.status == 400 && pending.code == "AUTHORIZATION_PENDING", "\(pending.json.serialized())")
        #expect(pending.response.header("Retry-After") == "5")
        // Typed in lower case without the dash, renamed by the approver.
        let typed = userCode.lowercased().replacingOccurrences(of: "-", with: "")
        let approved = Self.approve(h, typed, token: alice.token, extra: ["deviceName": .string("work laptop")])
        #expect(approved.status == 200, "\(approved.json.serialized())")
        #expect(approved["approved"] == .bool(true) && approved["userCode"]?.stringValue == userCode)
        #expect(approved["deviceName"]?.stringValue == "work laptop")
        // Approving twice is refused: the code works once.
        #expect(Self.approve(h, userCode, token: alice.token).code == "NOT_FOUND")

        h.clock.advance(5_000)
        let issued = Self.poll(h, started)
        #expect(issued.status == 200, "\(issued.json.serialized())")
        let token = try #require(issued["token"]?.stringValue)
        let tokenID = try #require(issued["tokenID"]?.stringValue)
        #expect(tokenID.hasPrefix("d-") && token != alice.token)
        #expect(issued["name"]?.stringValue == "alice" && issued["userRecordName"]?.stringValue == alice.recordName)
        #expect(issued["deviceName"]?.stringValue == "work laptop")
        #expect(h.call("users/current", token: token)["name"] == .string("alice"))

        // Listed among alice's tokens as a device, by name; the device's own list marks it current.
        let listed = try #require(h.call("tokens/list", token: alice.token)["tokens"]?.arrayValue)
        let device = try #require(listed.first { $0["tokenID"]?.stringValue == tokenID })
        #expect(device["kind"] == .string("device") && device["deviceName"] == .string("work laptop"))
        #expect(device["current"] == .bool(false))
        let own = try #require(h.call("tokens/list", token: token)["tokens"]?.arrayValue)
        #expect(own.first { $0["current"] == .bool(true) }?["tokenID"]?.stringValue == tokenID)

        // Once only: the next poll is told the code was used.
        h.clock.advance(5_000)
        let again = Self.poll(h, started)
        #expect(again.status == 410 && again.code == "EXPIRED_TOKEN", "\(again.json.serialized())")
        #expect(again["reason"]?.stringValue?.contains("already") == true)
    }

    @Test func pollingFasterThanTheIntervalSlowsTheDeviceDown() throws {
        let h = try ServiceHarness()
        let started = try Self.start(h)
        #expect(Self.poll(h, started).code == "AUTHORIZATION_PENDING")
        let fast = Self.poll(h, started)
        #expect(fast.status == 429 && fast.code == "SLOW_DOWN", "\(fast.json.serialized())")
        #expect(fast["retryAfter"] == .int(10) && fast.response.header("Retry-After") == "10")
        // The interval is now 10 s: 5 s later is still too soon, and it grows again.
        h.clock.advance(5_000)
        let stillFast = Self.poll(h, started)
        #expect(stillFast.code == "SLOW_DOWN" && stillFast["retryAfter"] == .int(15))
        h.clock.advance(15_000)
        #expect(Self.poll(h, started).code == "AUTHORIZATION_PENDING")
        // A second of leeway for the nodes' clocks: 14 s after, with an interval of 15 s, is in time.
        h.clock.advance(14_000)
        #expect(Self.poll(h, started).code == "AUTHORIZATION_PENDING")
    }

    @Test func aCodeExpiresAfterTenMinutesForApprovalAndPolling() throws {
        let h = try ServiceHarness()
        let alice = try h.signUp("alice")
        let started = try Self.start(h)
        h.clock.advance(600_000)
        let late = Self.approve(h, started.userCode, token: alice.token)
        #expect(late.status == 404 && late.code == "NOT_FOUND", "\(late.json.serialized())")
        let expired = Self.poll(h, started)
        #expect(expired.status == 410 && expired.code == "EXPIRED_TOKEN")
        // Just inside the lifetime it works.
        let fresh = try Self.start(h)
        h.clock.advance(599_000)
        #expect(Self.approve(h, fresh.userCode, token: alice.token)["approved"] == .bool(true))
        #expect(Self.poll(h, fresh).status == 200)
        // A made-up device code is the same error as an expired one; a missing one is a bad request.
        let madeUp = Started(deviceCode: "ld_" + String(repeating: "ab", count: 32), userCode: "")
        #expect(Self.poll(h, madeUp).code == "EXPIRED_TOKEN")
        #expect(Self.send(h, "/auth/device/token", .object([:])).code == "BAD_REQUEST")
        #expect(Self.poll(h, Started(deviceCode: "lt_nope", userCode: "")).code == "EXPIRED_TOKEN")
    }

    @Test func aDeniedDeviceIsToldSoAndGetsNoToken() throws {
        let h = try ServiceHarness()
        let alice = try h.signUp("alice")
        let started = try Self.start(h)
        let denied = Self.approve(h, started.userCode, token: alice.token, extra: ["deny": .bool(true)])
        #expect(denied.status == 200 && denied["approved"] == .bool(false), "\(denied.json.serialized())")
        let answer = Self.poll(h, started)
        #expect(answer.status == 403 && answer.code == "ACCESS_DENIED", "\(answer.json.serialized())")
        #expect(Self.approve(h, started.userCode, token: alice.token).code == "NOT_FOUND")
        #expect(try #require(h.call("tokens/list", token: alice.token)["tokens"]?.arrayValue).count == 1)
    }

    @Test func malformedCodesAreBadRequestsAndApprovalNeedsASignedInCaller() throws {
        let h = try ServiceHarness()
        let alice = try h.signUp("alice")
        for code in ["ABC", "AAAA-AAAA", "BCDF-GHJK-L", ""] {
            #expect(Self.approve(h, code, token: alice.token).code == "BAD_REQUEST", "\(code)")
        }
        #expect(Self.send(h, "/auth/device/approve", .object(["userCode": .string("BCDF-GHJK")])).code
                == "AUTHENTICATION_REQUIRED")
        #expect(Self.send(h, "/auth/device/approve", .object(["userCode": .string("BCDF-GHJK")]), token: "lt_nope").code
                == "AUTHENTICATION_FAILED")
        #expect(Self.send(h, "/auth/device/start", .object(["deviceName": .string("a\u{7}b")])).code == "BAD_REQUEST")
        #expect(Self.send(h, "/auth/device/start", .object(["deviceName": .string(String(repeating: "x", count: 65))])).code
                == "BAD_REQUEST")
        #expect(Self.approve(h, "BCDF-GHJK", token: alice.token, extra: ["deny": .string("yes")]).code == "BAD_REQUEST")
        // Bad requests are not counted as guesses: the right code still works at once.
        let started = try Self.start(h)
        #expect(Self.approve(h, started.userCode, token: alice.token)["approved"] == .bool(true))
    }

    @Test func aBrowserSessionApprovesWithItsCSRFValueOnly() throws {
        let h = try ServiceHarness()
        let session = try BrowserSessionTests.signUp(h, "carol")
        let started = try Self.start(h)
        var headers = BrowserSessionTests.page
        headers["Cookie"] = session.cookie
        let body = JSON.object(["userCode": .string(started.userCode)])
        let without = Self.send(h, "/auth/device/approve", body, headers: headers)
        #expect(without.status == 403 && without.code == "ACCESS_DENIED", "\(without.json.serialized())")
        headers["X-Lattice-CSRF"] = session.csrf
        let with = Self.send(h, "/auth/device/approve", body, headers: headers)
        #expect(with["approved"] == .bool(true), "\(with.json.serialized())")
        h.clock.advance(5_000)
        let issued = Self.poll(h, started)
        #expect(issued["name"]?.stringValue == "carol", "\(issued.json.serialized())")
    }

    @Test func wrongCodesAreThrottledPerAccountAndPerAddressInTheDatabase() throws {
        let h = try ServiceHarness {
            $0.deviceApprovalFailuresPerAccount = 3
            $0.deviceApprovalFailuresPerAddress = 5
        }
        let alice = try h.signUp("alice"), bob = try h.signUp("bob"), carl = try h.signUp("carl")
        let started = try Self.start(h)
        // Wrong codes: a code of the right shape that no device shows.
        let wrong = started.userCode == "BCDF-GHJK" ? "BCDF-GHJL" : "BCDF-GHJK"
        for _ in 0..<3 {
            let reply = Self.approve(h, wrong, token: alice.token, address: "10.0.0.7")
            #expect(reply.status == 404 && reply.code == "NOT_FOUND")
        }
        // Alice's account is out of tries, even with the right code and from another address.
        let throttled = Self.approve(h, started.userCode, token: alice.token, address: "10.0.0.8")
        #expect(throttled.status == 429 && throttled.code == "THROTTLED", "\(throttled.json.serialized())")
        #expect((throttled["retryAfter"]?.intValue ?? 0) > 3_000)
        // Bob from the same address: two more failures fill the address's five.
        for _ in 0..<2 { #expect(Self.approve(h, wrong, token: bob.token, address: "10.0.0.7").code == "NOT_FOUND") }
        #expect(Self.approve(h, started.userCode, token: bob.token, address: "10.0.0.7").code == "THROTTLED")
        // Carl from another address is not held up, and the right code works.
        #expect(Self.approve(h, started.userCode, token: carl.token, address: "10.0.0.9")["approved"] == .bool(true))
        // The window moves on: an hour later alice may try again.
        h.clock.advance(3_600_000)
        let later = try Self.start(h)
        #expect(Self.approve(h, later.userCode, token: alice.token, address: "10.0.0.7")["approved"] == .bool(true))
        // Old failures were forgotten, not kept: only the ones in the window stay.
        let kept = try h.storage.read { try $0.rowCount(table: "device_approval_failures") }
        #expect(kept == 0)
    }

    @Test func waitingAuthorizationsAreBoundedPerAddressAndInTotalAndExpiredOnesArePurged() throws {
        let h = try ServiceHarness {
            $0.deviceAuthorizationsPerAddress = 2
            $0.deviceAuthorizationsGlobal = 3
        }
        _ = try Self.start(h, address: "10.1.0.1")
        _ = try Self.start(h, address: "10.1.0.1")
        let third = Self.send(h, "/auth/device/start", .object([:]), address: "10.1.0.1")
        #expect(third.status == 429 && third.code == "THROTTLED", "\(third.json.serialized())")
        _ = try Self.start(h, address: "10.1.0.2")
        let full = Self.send(h, "/auth/device/start", .object([:]), address: "10.1.0.3")
        #expect(full.code == "THROTTLED" && full["reason"]?.stringValue?.contains("server") == true)
        #expect(try h.storage.read { try $0.rowCount(table: "device_authorizations") } == 3)
        // Once they expire they stop counting, and the next start deletes them.
        h.clock.advance(600_000)
        _ = try Self.start(h, address: "10.1.0.3")
        #expect(try h.storage.read { try $0.rowCount(table: "device_authorizations") } == 1)
        // So does the purge, with failed approvals past their window.
        let alice = try h.signUp("alice")
        #expect(Self.approve(h, "BCDF-GHJK", token: alice.token).code == "NOT_FOUND")
        #expect(try h.storage.read { try $0.rowCount(table: "device_approval_failures") } == 2)
        h.clock.advance(3_600_000)
        try h.service.purgeExpired()
        #expect(try h.storage.read { try $0.rowCount(table: "device_authorizations") } == 0)
        #expect(try h.storage.read { try $0.rowCount(table: "device_approval_failures") } == 0)
    }

    @Test func aRevokedDeviceTokenStopsWorkingAtOnce() throws {
        let h = try ServiceHarness()
        let alice = try h.signUp("alice")
        let started = try Self.start(h)
        #expect(Self.approve(h, started.userCode, token: alice.token)["approved"] == .bool(true))
        let issued = Self.poll(h, started)
        let token = try #require(issued["token"]?.stringValue)
        let id = try #require(issued["tokenID"]?.stringValue)
        #expect(h.call("zones/list", token: token).status == 200)
        let revoked = h.call("tokens/revoke", .object(["tokens": .array([.object(["tokenID": .string(id)])])]), token: alice.token)
        #expect(revoked["tokens"]?.arrayValue?.first?["revoked"] == .bool(true))
        let refused = h.call("zones/list", token: token)
        #expect(refused.status == 401 && refused.code == "AUTHENTICATION_FAILED")
        #expect(h.call("zones/list", token: alice.token).status == 200)
    }

    /// Racing approvals of one code, by two accounts, and racing polls of the approved code, on two services
    /// of one storage (on PostgreSQL: two nodes, each with its own connection pool): exactly one approval is
    /// kept and exactly one token is made.
    @Test func racingApprovalsAndPollsOnTwoNodesMintExactlyOneToken() throws {
        let h = try ServiceHarness()
        let second: LatticeService
        var otherStorage: (any Storage)? = nil
        if let url = h.databaseURL {
            let storage = try PostgresStorage(url: url, poolSize: 4)
            otherStorage = storage
            var configuration = h.service.configuration
            configuration.nodeName = "second"
            second = try LatticeService(storage: storage, configuration: configuration, log: { _ in })
        } else {
            second = h.service
        }
        defer { otherStorage?.close() }
        let services = [h.service, second]
        let alice = try h.signUp("alice"), bob = try h.signUp("bob")
        for round in 0..<5 {
            let started = try Self.start(h, address: "10.2.0.\(round)")
            let approvals = Mutex<[(String, Bool)]>([])
            let group = DispatchGroup()
            for (index, user) in [("alice", alice.token), ("bob", bob.token), ("alice", alice.token)].enumerated() {
                group.enter()
                Thread {
                    let response = services[index % 2].respond(to: HTTPRequest(
                        method: "POST", path: "/auth/device/approve", headers: ["Authorization": "Bearer " + user.1],
                        body: JSON.object(["userCode": .string(started.userCode)]).serializedBytes(), remoteAddress: "10.3.0.1"))
                    let json = (try? JSON.parse(response.body)) ?? .null
                    approvals.withLock { $0.append((user.0, json["approved"] == .bool(true))) }
                    group.leave()
                }.start()
            }
            #expect(group.wait(timeout: .now() + 60) == .success)
            let winners = approvals.withLock { $0 }.filter(\.1)
            #expect(winners.count == 1, "round \(round): \(approvals.withLock { $0 })")
            h.clock.advance(5_000)
            let tokens = Mutex<[String]>([])
            for index in 0..<6 {
                group.enter()
                Thread {
                    let response = services[index % 2].respond(to: HTTPRequest(
                        method: "POST", path: "/auth/device/token",
                        body: JSON.object(["deviceCode": .string(started.deviceCode)]).serializedBytes(),
                        remoteAddress: "10.2.0.\(round)"))
                    if response.status == 200, let json = try? JSON.parse(response.body), let name = json["name"]?.stringValue {
                        tokens.withLock { $0.append(name) }
                    }
                    group.leave()
                }.start()
            }
            #expect(group.wait(timeout: .now() + 60) == .success)
            #expect(tokens.withLock { $0 } == [winners.first?.0 ?? "?"], "round \(round)")
        }
    }
}

/// Two `lattice serve --database` nodes on one PostgreSQL database (`LATTICE_TEST_POSTGRES_URL`): a sign-in
/// started on one node is approved on the other and polled on the first; the token works on both.
@Suite(.serialized) struct DeviceFlowNodesTests {
    static func post(_ port: UInt16, _ path: String, token: String? = nil, _ body: JSON) throws -> (Int, JSON) {
        let reply = try RawHTTPClient(port: port).send(method: "POST", path: path,
                                                       headers: token.map { ["Authorization": "Bearer " + $0] } ?? [:],
                                                       body: body.serializedBytes())
        return (reply.status, (try? JSON.parse(reply.body)) ?? .null)
    }

    @Test func aSignInStartedOnOneNodeIsApprovedOnAnotherAndPolledOnTheFirst() throws {
        let database = try PostgresTestDatabase.create()
        defer { database.drop() }
        let publicURL = "http://lattice.test"
        let a = try ServeNode(database: database.url, name: "a", port: 0, publicURL: publicURL)
        defer { a.stop() }
        let b = try ServeNode(database: database.url, name: "b", port: 0, publicURL: publicURL)
        defer { b.stop() }
        let (signedUp, account) = try Self.post(a.port, "/auth/signup", .object(["name": .string("alice")]))
        #expect(signedUp == 200)
        let token = try #require(account["token"]?.stringValue)
        let (started, authorization) = try Self.post(b.port, "/auth/device/start", .object(["deviceName": .string("phone")]))
        #expect(started == 200)
        let deviceCode = try #require(authorization["deviceCode"]?.stringValue)
        let userCode = try #require(authorization["userCode"]?.stringValue)
        #expect(try Self.post(a.port, "/auth/device/token", .object(["deviceCode": .string(deviceCode)])).1["serverErrorCode"]
                == .string("AUTHORIZATION_PENDING"))
        let (approved, decision) = try Self.post(a.port, "/auth/device/approve", token: token,
                                                 .object(["userCode": .string(userCode)]))
        #expect(approved == 200 && decision["approved"] == .bool(true), "\(decision)")
        // Polled on b right after the poll on a: too soon, since the last poll is kept in the database, not
        // per node; the interval is now 10 s.
        #expect(try Self.post(b.port, "/auth/device/token", .object(["deviceCode": .string(deviceCode)])).1["serverErrorCode"]
                == .string("SLOW_DOWN"))
        Thread.sleep(forTimeInterval: 10)
        let (issued, answer) = try Self.post(b.port, "/auth/device/token", .object(["deviceCode": .string(deviceCode)]))
        #expect(issued == 200, "\(answer)")
        let deviceToken = try #require(answer["token"]?.stringValue)
        for node in [a, b] {
            let (status, user) = try Self.post(node.port, "/database/1/lattice/production/private/users/current",
                                               token: deviceToken, .object([:]))
            #expect(status == 200 && user["name"] == .string("alice"))
        }
        // Used: at once, on the other node too.
        #expect(try Self.post(a.port, "/auth/device/token", .object(["deviceCode": .string(deviceCode)])).1["serverErrorCode"]
                == .string("EXPIRED_TOKEN"))
    }
}

/// `lattice serve`'s device sign-in flags reach the service.
@Suite(.serialized) struct DeviceFlowServeFlagTests {
    @Test func theWaitingSignInsPerAddressFlagIsEnforced() throws {
        let directory = temporaryDirectory("lattice-device-flags")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try ServerUnderTest(data: directory + "/server",
                                                            extra: ["--device-sign-ins-per-address", "1"])
        defer { server.kill(SIGTERM) }
        func start() throws -> Int {
            try RawHTTPClient(port: server.port).send(method: "POST", path: "/auth/device/start", body: Array("{}".utf8)).status
        }
        #expect(try start() == 200)
        #expect(try start() == 429)
        let refused = try CLITests.lattice("serve", "--data", directory + "/other", "--device-approval-failures-per-account", "0")
        #expect(refused.status == 2 && refused.stderr.contains("from 1 to 1000000"), "\(refused)")
    }
}

/// The same flow with the real `lattice` binary against a real `lattice serve`: home B signs in with a code
/// that home A approves, uses the account, and is signed out when A revokes its token.
@Suite(.serialized) struct DeviceFlowCLITests {
    @Test func aSecondHomeSignsInWithACodeTheFirstApprovesAndIsRevokedFromIt() throws {
        let world = try CLITests.World()
        try CLITests.ok("list", "create", "Groceries", home: world.alice)
        let phone = world.directory + "/alice-phone"
        let (process, output, errors) = try CLITests.start(["login", "--server", world.url, "--name", "phone"], home: phone)
        defer { if process.isRunning { process.terminate() } }
        // The code shows within a few seconds (bounded wait).
        var code: String? = nil
        for _ in 0..<200 where code == nil {
            code = output.text.split(whereSeparator: \.isWhitespace).map(String.init).first { word in
                word.count == 9 && Array(word)[4] == "-" && word.filter { $0 != "-" }.allSatisfy(\.isUppercase)
            }
            if code == nil { Thread.sleep(forTimeInterval: 0.05) }
        }
        let shown = try #require(code, "no code in: \(output.text) \(errors.text)")
        #expect(output.text.contains("lattice devices approve \(shown)"))

        let approved = try CLITests.ok("devices", "approve", shown.lowercased(), home: world.alice)
        #expect(approved.stdout.contains("approved phone"), "\(approved)")
        // B polls every 5 s: it is signed in within one interval or two.
        for _ in 0..<300 where process.isRunning { Thread.sleep(forTimeInterval: 0.05) }
        #expect(!process.isRunning)
        process.waitUntilExit()
        let finished = CLITests.Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
        #expect(finished.status == 0, "\(finished)")
        #expect(finished.stdout.contains("signed in as alice"), "\(finished)")
        let lists = try CLITests.ok("lists", "--json", home: phone).json
        #expect(lists.arrayValue?.compactMap { $0["title"]?.stringValue } == ["Groceries"], "\(lists)")
        try CLITests.ok("list", "add", "Groceries", "Milk", home: phone)

        // A lists both devices; the phone's is named and not this device.
        let devices = try CLITests.ok("devices", "--json", home: world.alice).json
        let rows = try #require(devices.arrayValue)
        #expect(rows.count == 2, "\(devices)")
        let phoneRow = try #require(rows.first { $0["name"] == .string("phone") })
        #expect(phoneRow["kind"] == .string("device") && phoneRow["thisDevice"] == .bool(false))
        #expect(rows.first { $0["thisDevice"] == .bool(true) }?["kind"] == .string("bearer"))
        let table = try CLITests.ok("devices", home: world.alice).stdout
        #expect(table.contains("phone") && table.contains("this device"), "\(table)")
        let phoneID = try #require(phoneRow["id"]?.stringValue)

        // Revoked from A: B's next request fails, saying what to do.
        let revoked = try CLITests.ok("devices", "revoke", phoneID, home: world.alice)
        #expect(revoked.stdout.contains("revoked \(phoneID)"))
        let refused = try CLITests.lattice("sync", home: phone)
        #expect(refused.status == 1, "\(refused)")
        #expect(refused.stderr.contains("no longer accepts this home's token"), "\(refused)")
        #expect(try CLITests.lattice("devices", "revoke", phoneID, home: world.alice).stderr.contains("no device or token"))
        // A wrong code is refused with a clear message, not a hang.
        let wrong = try CLITests.lattice("devices", "approve", "BCDF-GHJK", home: world.alice)
        #expect(wrong.status == 1 && wrong.stderr.contains("no device is waiting for the code BCDF-GHJK"), "\(wrong)")
        let malformed = try CLITests.lattice("devices", "approve", "nope", home: world.alice)
        #expect(malformed.status == 1 && malformed.stderr.contains("8 letters"), "\(malformed)")

        // Denied from A: the waiting device stops with a clear message and is not signed in.
        let tablet = world.directory + "/tablet"
        let (waiting, waitingOutput, waitingErrors) = try CLITests.start(["login", "--server", world.url], home: tablet)
        defer { if waiting.isRunning { waiting.terminate() } }
        var tabletCode: String? = nil
        for _ in 0..<200 where tabletCode == nil {
            tabletCode = waitingOutput.text.split(whereSeparator: \.isWhitespace).map(String.init).first { word in
                word.count == 9 && Array(word)[4] == "-" && word.filter { $0 != "-" }.allSatisfy(\.isUppercase)
            }
            if tabletCode == nil { Thread.sleep(forTimeInterval: 0.05) }
        }
        let denyCode = try #require(tabletCode, "no code in: \(waitingOutput.text) \(waitingErrors.text)")
        #expect(try CLITests.ok("devices", "deny", denyCode, home: world.alice).stdout.contains("denied"))
        for _ in 0..<300 where waiting.isRunning { Thread.sleep(forTimeInterval: 0.05) }
        waiting.waitUntilExit()
        #expect(waiting.terminationStatus == 1)
        #expect(waitingErrors.finish().contains("the sign-in was denied on the other device"))
        #expect(try CLITests.lattice("whoami", home: tablet).status == 1)

        // Ten wrong codes an hour per account (one above): the eleventh try is refused at once, not retried.
        for _ in 0..<9 { #expect(try CLITests.lattice("devices", "approve", "BCDF-GHJK", home: world.alice).status == 1) }
        let began = Date()
        let throttled = try CLITests.lattice("devices", "approve", "BCDF-GHJK", home: world.alice)
        #expect(throttled.status == 1 && throttled.stderr.contains("too many wrong device codes for this account"),
                "\(throttled)")
        #expect(Date().timeIntervalSince(began) < 10)
    }
}
