import Foundation
#if canImport(Glibc)
import Glibc
#endif
import LatticeCore
import LatticeTestSupport
import Testing

/// Webhooks against a real `lattice serve` and a real receiver (Tests/WebhookReceiver/receiver.py): signed
/// deliveries, in order per subscription, none lost while the receiver is down or the server is killed,
/// dead letters listed and replayed, and a receiver that hangs or answers 10 MB does not hold up writes.
@Suite(.serialized) struct WebhookTests {
    static let database = "/database/1/lattice/production/private/"
    /// Webhooks to the loopback receiver, retried quickly.
    static let flags = ["--access-log", "off", "--webhook-private-addresses", "allow", "--webhook-retry-ms", "100",
                        "--webhook-timeout", "2"]

    struct Account {
        let port: UInt16
        let token: String

        func post(_ operation: String, _ body: JSON) throws -> (status: Int, json: JSON) {
            let reply = try RawHTTPClient(port: port).send(method: "POST", path: WebhookTests.database + operation,
                                                           headers: ["Authorization": "Bearer " + token],
                                                           body: body.serializedBytes())
            return (reply.status, (try? JSON.parse(reply.body)) ?? .null)
        }

        /// A zone subscription with a webhook to `url`; its signing key.
        func subscribe(_ name: String, url: String) throws -> String {
            let (status, json) = try post("subscriptions/modify", .object(["operations": .array([.object([
                "operationType": .string("create"), "subscription": .object([
                    "subscriptionID": .string(name), "subscriptionType": .string("zone"),
                    "zoneID": .object(["zoneName": .string("Lists")]), "webhook": .object(["url": .string(url)])]),
            ])])]))
            let item = json["subscriptions"]?.arrayValue?.first
            guard status == 200, let secret = item?["webhook"]?["secret"]?.stringValue else {
                throw HarnessError("subscribe: \(json.serialized())")
            }
            return secret
        }

        func write(_ name: String) throws {
            let (status, json) = try post("records/modify", .object([
                "zoneID": .object(["zoneName": .string("Lists")]),
                "operations": .array([.object(["operationType": .string("create"), "record": .object([
                    "recordName": .string(name), "recordType": .string("Item"),
                    "fields": .object(["title": .object(["value": .string(name)])])])])]),
            ]))
            guard status == 200, json["records"]?.arrayValue?.first?["serverErrorCode"] == nil else {
                throw HarnessError("write \(name): \(json.serialized())")
            }
        }
    }

    static func account(_ port: UInt16, _ name: String) throws -> Account {
        let reply = try RawHTTPClient(port: port).send(method: "POST", path: "/auth/signup",
                                                       body: JSON.object(["name": .string(name)]).serializedBytes())
        guard let token = try JSON.parse(reply.body)["token"]?.stringValue else { throw HarnessError("signup failed") }
        let account = Account(port: port, token: token)
        let (status, _) = try account.post("zones/modify", .object(["operations": .array([.object([
            "operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Lists")])])])])]))
        guard status == 200 else { throw HarnessError("zone") }
        return account
    }

    /// Each subscription's deliveries arrived in sequence order, without a gap or a repeat.
    static func inOrder(_ deliveries: [WebhookReceiverProcess.Delivery], subscription: String) -> [Int64] {
        deliveries.filter { $0.subscription == subscription && $0.mode == "ok" }.map(\.sequence)
    }

    @Test func deliveriesAreSignedOrderedAndSurviveAReceiverThatIsDown() throws {
        let receiver = try WebhookReceiverProcess()
        let directory = temporaryDirectory("lattice-webhooks")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try ServerUnderTest(data: directory + "/data", extra: Self.flags)
        defer { server.kill(SIGTERM) }
        let ann = try Self.account(server.port, "ann")
        let secret = try ann.subscribe("lists", url: receiver.url)
        #expect(secret.hasPrefix("whsec_"))
        try receiver.control(mode: "ok", secret: secret)
        // The secret is shown once: list and lookup name the URL only.
        let listed = try ann.post("subscriptions/list", .object([:])).json["subscriptions"]?.arrayValue?.first
        #expect(listed?["webhook"] == .object(["url": .string(receiver.url)]))

        for index in 1...3 { try ann.write("item-\(index)") }
        let first = try receiver.wait { Self.inOrder($0, subscription: "lists").count >= 3 }
        #expect(Self.inOrder(first, subscription: "lists") == [1, 2, 3])
        #expect(first.allSatisfy { $0.verified }, "every signature verifies")
        let body = try #require(first.first?.body)
        #expect(body["id"]?.stringValue == first.first?.id && body["sequence"] == .int(1))
        #expect(body["zones"]?.arrayValue?.first?["records"]?.arrayValue?.first?["recordName"] == .string("item-1"))

        // Down for a while: three more changes wait in the outbox and come, in order, once it is back.
        receiver.stop()
        for index in 4...6 { try ann.write("item-\(index)") }
        Thread.sleep(forTimeInterval: 1)
        let pending = try ann.post("subscriptions/deliveries", .object(["subscriptionID": .string("lists"),
                                                                        "state": .string("pending")]))
        #expect((pending.json["deliveries"]?.arrayValue?.count ?? 0) == 3, "\(pending.json.serialized())")
        #expect(pending.json["deliveries"]?.arrayValue?.first?["attempts"]?.intValue ?? 0 >= 1)
        try receiver.start()
        try receiver.control(mode: "ok", secret: secret)
        let after = try receiver.wait { Self.inOrder($0, subscription: "lists").count >= 3 }
        #expect(Self.inOrder(after, subscription: "lists") == [4, 5, 6])
        #expect(after.allSatisfy { $0.verified })
        #expect(Set(after.map(\.id)).count == after.count, "no duplicates by idempotency id")
    }

    @Test func aDeliveryInFlightWhenTheServerIsKilledIsSentAfterTheRestart() throws {
        let receiver = try WebhookReceiverProcess()
        let directory = temporaryDirectory("lattice-webhooks")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var server = try ServerUnderTest(data: directory + "/data", extra: Self.flags)
        let ann = try Self.account(server.port, "ann")
        let secret = try ann.subscribe("lists", url: receiver.url)
        // The receiver holds the request: the delivery is committed and under way when the server dies.
        try receiver.control(mode: "hang", secret: secret)
        try ann.write("item-1")
        Thread.sleep(forTimeInterval: 0.5)
        server.kill(SIGKILL)
        try receiver.control(mode: "ok")
        server = try ServerUnderTest(data: directory + "/data", extra: Self.flags)
        defer { server.kill(SIGTERM) }
        let delivered = try receiver.wait { Self.inOrder($0, subscription: "lists") == [1] }
        #expect(Self.inOrder(delivered, subscription: "lists") == [1], "\(delivered.map(\.sequence))")
        #expect(delivered.filter { $0.mode == "ok" }.allSatisfy { $0.verified })
    }

    @Test func deadLettersAreListedAndReplayedAndAStuckReceiverDoesNotSlowWrites() throws {
        let receiver = try WebhookReceiverProcess()
        let directory = temporaryDirectory("lattice-webhooks")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try ServerUnderTest(data: directory + "/data",
                                         extra: Self.flags + ["--webhook-attempts", "2", "--webhook-concurrency", "2"])
        defer { server.kill(SIGTERM) }
        let ann = try Self.account(server.port, "ann")
        let secret = try ann.subscribe("lists", url: receiver.url)

        // A receiver that answers 500: two attempts, then the dead-letter state.
        try receiver.control(mode: "fail", secret: secret)
        try ann.write("item-1")
        var failed: [JSON] = []
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline {
            failed = try ann.post("subscriptions/deliveries", .object(["subscriptionID": .string("lists"),
                                                                       "state": .string("failed")])).json["deliveries"]?.arrayValue ?? []
            if !failed.isEmpty { break }
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(failed.count == 1 && failed.first?["attempts"] == .int(2) && failed.first?["lastStatus"] == .int(500),
                "\(failed)")
        try receiver.control(mode: "ok")
        let replayed = try ann.post("subscriptions/replay", .object(["subscriptionID": .string("lists")]))
        #expect(replayed.json["replayed"] == .int(1))
        let delivered = try receiver.wait { Self.inOrder($0, subscription: "lists") == [1] }
        #expect(Self.inOrder(delivered, subscription: "lists") == [1])

        // Writes against a receiver that hangs, then one that answers 10 MB, beside writes with none busy: the
        // probe's latencies (printed) and every write acknowledged.
        func probe(_ label: String, _ count: Int) throws -> [Double] {
            var latencies: [Double] = []
            for index in 0..<count {
                let started = Date()
                try ann.write("\(label)-\(index)")
                latencies.append(Date().timeIntervalSince(started) * 1000)
            }
            return latencies.sorted()
        }
        let calm = try probe("calm", 30)
        try receiver.control(mode: "hang")
        let hanging = try probe("hang", 30)
        try receiver.control(mode: "huge")
        let huge = try probe("huge", 30)
        func summary(_ values: [Double]) -> String {
            "p50 \(String(format: "%.1f", values[values.count / 2])) ms, max \(String(format: "%.1f", values.last ?? 0)) ms"
        }
        print("WebhookTests: writes with a calm receiver \(summary(calm)); hanging \(summary(hanging)); "
              + "answering 10 MB \(summary(huge))")
        // Sends run apart from writes: a stuck receiver adds no wait of its 2 s time-out to any write.
        #expect((hanging.last ?? 0) < 2_000 && (huge.last ?? 0) < 2_000)
        let health = try RawHTTPClient(port: server.port).send(method: "GET", path: "/healthz")
        #expect(health.status == 200)
    }
}
