import Dispatch
import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

@testable import LatticeServer

/// The adapter's connection hardening over real sockets on 127.0.0.x: header and body deadlines, the
/// per-address limit and trusted proxies, the worker pool and its fairness, the token checked from the
/// headers, the body budget, Host, and parked long polls (capped per account, released when the client
/// goes away).
@Suite(.serialized) struct ConnectionLimitTests {
    // MARK: Deadlines

    @Test func slowlorisHeadersAreDroppedWithinTheDeadlineWhileAnotherClientIsServed() throws {
        var configuration = limitConfiguration()
        configuration.headerTimeoutSeconds = 1
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        // One byte of header every 200 ms: never idle, never complete.
        let slow = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
        try slow.write(Array("GET /slow HTTP/1.1\r\nHost: x\r\n".utf8))
        var dropped = false
        for index in 0..<50 {  // 10 s at most; the deadline is 1 s
            Thread.sleep(forTimeInterval: 0.2)
            if (try? slow.write(Array("X-Slow-\(index): y\r\n".utf8))) == nil { dropped = true; break }
            if index == 2 {
                // Meanwhile another client is served.
                let other = try RawHTTPClient(port: server.port).send(method: "GET", path: "/fast")
                #expect(other.status == 200)
            }
            if server.connectionCounters.droppedSlow > 0 { dropped = true; break }
        }
        #expect(dropped, "the slow-header connection was dropped")
        #expect(try slow.readUntilClose().closed)
        #expect(handler.handledPaths.contains("/slow") == false)
        #expect(server.connectionCounters.droppedSlow >= 1)
    }

    @Test func aSlowBodyIsDropped() throws {
        var configuration = limitConfiguration()
        configuration.bodyRateGraceSeconds = 1
        configuration.minimumBodyBytesPerSecond = 1000
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        let slow = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
        try slow.write(Array("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n".utf8))
        var dropped = false
        for _ in 0..<50 {  // 10 s at most; 10 bytes per 200 ms is far under 1000 B/s
            Thread.sleep(forTimeInterval: 0.2)
            if (try? slow.write([UInt8](repeating: 65, count: 10))) == nil { dropped = true; break }
            if server.connectionCounters.droppedSlow > 0 { dropped = true; break }
        }
        #expect(dropped, "the slow-body connection was dropped")
        #expect(try slow.readUntilClose().closed)
        #expect(handler.handledPaths.isEmpty)
        #expect(eventually { server.inFlightRequestCount == 0 && server.bufferedBodyBytes == 0 })
        // A body at a normal pace still goes through.
        let fine = try RawHTTPClient(port: server.port).send(method: "POST", path: "/upload",
                                                             body: [UInt8](repeating: 1, count: 100_000))
        #expect(fine.status == 200)
    }

    // MARK: Per-address limit and trusted proxies

    @Test func thePerAddressLimitDropsTheExtraConnectionOfOneAddressOnly() throws {
        var configuration = limitConfiguration()
        configuration.perIPConnectionLimit = 3
        let server = try HTTPServer(handler: GateHandler(), configuration: configuration)
        defer { server.shutdown() }

        var held: [RawHTTPClient] = []
        for _ in 0..<3 {
            let client = try RawHTTPClient(port: server.port, source: "127.0.0.2")
            #expect(try client.send(method: "GET", path: "/held").status == 200)
            held.append(client)
        }
        let extra = try RawHTTPClient(port: server.port, timeoutSeconds: 5, source: "127.0.0.2")
        #expect(throws: (any Error).self) { try extra.send(method: "GET", path: "/extra") }
        #expect(server.connectionCounters.droppedOverLimit == 1)

        let otherAddress = try RawHTTPClient(port: server.port, source: "127.0.0.3")
        #expect(try otherAddress.send(method: "GET", path: "/other").status == 200)

        #expect(server.openConnections(from: "127.0.0.2") == 3)
        held.removeFirst().close()
        #expect(eventually { server.openConnections(from: "127.0.0.2") == 2 })
        let again = try RawHTTPClient(port: server.port, source: "127.0.0.2")
        #expect(try again.send(method: "GET", path: "/again").status == 200)
    }

    @Test func aTrustedProxyIsExemptAndItsForwardedClientsAreCountedInstead() throws {
        var configuration = limitConfiguration()
        configuration.perIPConnectionLimit = 2
        configuration.trustedProxies = ["127.0.0.4/32"]
        configuration.workersPerClient = 4
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        // Four connections from the proxy, over the per-address limit of 2: all served, and each request
        // is the client's named last in X-Forwarded-For.
        let proxy = try (0..<4).map { _ in try RawHTTPClient(port: server.port, source: "127.0.0.4") }
        for (index, connection) in proxy.enumerated() {
            let reply = try connection.send(method: "GET", path: "/who",
                                            headers: ["X-Forwarded-For": "9.9.9.9, 10.0.0.\(index + 1)"])
            #expect(reply.status == 200)
            #expect(reply.headers["x-remote"] == "10.0.0.\(index + 1)")
        }
        #expect(server.connectionCounters.droppedOverLimit == 0)

        // From anyone else the header is ignored.
        let direct = try RawHTTPClient(port: server.port, source: "127.0.0.5")
        let spoofed = try direct.send(method: "GET", path: "/who", headers: ["X-Forwarded-For": "10.0.0.1"])
        #expect(spoofed.headers["x-remote"] == "127.0.0.5")

        // Through the proxy, one forwarded client has at most 2 requests in flight.
        let parked = (0..<2).map { index in
            let connection = HandOff(proxy[index])
            return Background {
                try connection.value.send(method: "GET", path: "/hold", headers: ["X-Forwarded-For": "10.0.0.9"])
            }
        }
        #expect(eventually { handler.heldCount == 2 })
        let third = try proxy[2].send(method: "GET", path: "/hold", headers: ["X-Forwarded-For": "10.0.0.9"])
        #expect(third.status == 429)
        #expect(third.headers["retry-after"] == "1")
        #expect(try JSON.parse(third.body)["serverErrorCode"]?.stringValue == "THROTTLED")
        let otherClient = try proxy[3].send(method: "GET", path: "/who", headers: ["X-Forwarded-For": "10.0.0.8"])
        #expect(otherClient.status == 200)
        handler.releaseAll()
        for request in parked { #expect(try request.wait().status == 200) }
    }

    @Test func twoIPv6AddressesOfOneSlash64ShareTheForwardedClientLimitAndTheLogKeepsEachAddress() throws {
        var configuration = limitConfiguration()
        configuration.perIPConnectionLimit = 2
        configuration.trustedProxies = ["127.0.0.1", "2001:db8:ffff::/48"]
        configuration.workersPerClient = 4
        let lines = Mutex<[String]>([])
        configuration.accessLog = { line in lines.withLock { $0.append(line) } }
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        // 127.0.0.1 is a trusted proxy, and so is the inner hop 2001:db8:ffff::7: the client is the address
        // left of it. Two addresses of 2001:db8:1:2::/64 hold the /64's two requests in flight.
        let proxy = try (0..<4).map { _ in try RawHTTPClient(port: server.port) }
        let parked = ["2001:db8:1:2::a", "2001:db8:1:2:ffff:ffff:ffff:fffe"].enumerated().map { index, client in
            let connection = HandOff(proxy[index])
            return Background {
                try connection.value.send(method: "GET", path: "/hold",
                                          headers: ["X-Forwarded-For": "198.51.100.1, \(client), 2001:db8:ffff::7"])
            }
        }
        #expect(eventually { handler.heldCount == 2 })
        // A third address of the same /64 is refused: it is the same client for the limit.
        let third = try proxy[2].send(method: "GET", path: "/hold", headers: ["X-Forwarded-For": "2001:db8:1:2::c"])
        #expect(third.status == 429)
        #expect(try JSON.parse(third.body)["serverErrorCode"]?.stringValue == "THROTTLED")
        // The neighbouring /64 is another client.
        let neighbour = try proxy[3].send(method: "GET", path: "/who", headers: ["X-Forwarded-For": "2001:db8:1:3::a"])
        #expect(neighbour.status == 200)
        #expect(neighbour.headers["x-remote"] == "2001:db8:1:3::a")
        handler.releaseAll()
        for request in parked { #expect(try request.wait().status == 200) }
        // The access log shows each full address, not the /64.
        #expect(eventually {
            let logged = lines.withLock { $0 }
            return logged.contains { $0.contains(" 2001:db8:1:2::a ") }
                && logged.contains { $0.contains(" 2001:db8:1:2:ffff:ffff:ffff:fffe ") }
        }, "access log: \(lines.withLock { $0 })")
        #expect(lines.withLock { $0 }.allSatisfy { !$0.contains("/64") })
    }

    // MARK: Worker pool

    @Test func aLongHandlerOnTheWorkerPoolDoesNotDelayHealthzOnAnotherConnection() throws {
        var configuration = limitConfiguration()
        configuration.threadPoolSize = 1  // one HTTP thread: before the pool, a long handler blocked it
        configuration.workerThreads = 2
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        let long = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold") }
        #expect(eventually { handler.heldCount == 1 })
        let health = try RawHTTPClient(port: server.port).send(method: "GET", path: "/healthz")
        #expect(health.status == 200)
        #expect(handler.heldCount == 1 && handler.releasedCount == 0, "/healthz finished while the long one ran")
        // A pooled request of another client runs too.
        let other = try RawHTTPClient(port: server.port).send(method: "GET", path: "/fast", headers: ["X-Client": "b"])
        #expect(other.status == 200)
        #expect(handler.releasedCount == 0)
        handler.releaseAll()
        #expect(try long.wait().status == 200)
    }

    @Test func oneClientCannotOccupyEveryWorkerAndItsLineIsBounded() throws {
        var configuration = limitConfiguration()
        configuration.workerThreads = 3
        configuration.workersPerClient = 1
        configuration.queuedRequestsPerClient = 1
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        // Client a: one running, one waiting in line, the third refused with 429.
        let first = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "a"]) }
        #expect(eventually { handler.heldCount == 1 })
        let second = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "a"]) }
        #expect(eventually { server.queuedRequestCount == 1 })
        let third = try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "a"])
        #expect(third.status == 429)
        #expect(try JSON.parse(third.body)["serverErrorCode"]?.stringValue == "THROTTLED")
        #expect(handler.heldCount == 1, "client a runs one request at a time although threads are free")

        // Client b still gets a worker at once.
        let other = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "b"]) }
        #expect(eventually { handler.heldCount == 2 })
        handler.releaseAll()
        #expect(eventually { handler.heldCount == 3 })
        handler.releaseAll()
        for request in [first, second, other] { #expect(try request.wait().status == 200) }
    }

    @Test func theLastFreeWorkerIsKeptForAClientWithNothingRunning() throws {
        var configuration = limitConfiguration()
        configuration.workerThreads = 4
        configuration.workersPerClient = 2
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }
        // Clients a and b each want two long requests: a gets two threads, b one; b's second waits rather
        // than take the last free thread.
        var held: [Background<RawHTTPClient.Response>] = []
        for client in ["a", "a", "b", "b"] {
            held.append(Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": client]) })
            if held.count <= 3 { #expect(eventually { handler.heldCount == held.count }) }
        }
        #expect(eventually { server.queuedRequestCount == 1 })
        #expect(handler.heldCount == 3, "client b ran a second request on the last free thread")
        // Client c, with nothing running, gets that thread at once.
        let other = try RawHTTPClient(port: server.port).send(method: "GET", path: "/fast", headers: ["X-Client": "c"])
        #expect(other.status == 200)
        #expect(handler.releasedCount == 0 && handler.heldCount == 3)
        handler.releaseAll()
        #expect(eventually { handler.heldCount == 4 })
        handler.releaseAll()
        for request in held { #expect(try request.wait().status == 200) }
    }

    @Test func aFullQueueAnswersTryAgainLater() throws {
        var configuration = limitConfiguration()
        configuration.workerThreads = 1
        configuration.requestQueueLimit = 1
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }
        let running = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "a"]) }
        #expect(eventually { handler.heldCount == 1 })
        let waiting = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "b"]) }
        #expect(eventually { server.queuedRequestCount == 1 })
        let refused = try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "c"])
        #expect(refused.status == 503)
        #expect(refused.headers["retry-after"] == "1")
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
        handler.releaseAll()
        #expect(eventually { handler.heldCount == 2 })
        handler.releaseAll()
        #expect(try running.wait().status == 200)
        #expect(try waiting.wait().status == 200)
    }

    @Test func aRequestWaitingInLinePastTheBoundGetsTryAgainLater() throws {
        var configuration = limitConfiguration()
        configuration.workerThreads = 1
        configuration.maximumQueueWaitMilliseconds = 300
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }
        let running = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "a"]) }
        #expect(eventually { handler.heldCount == 1 })
        let started = ContinuousClock.now
        let waited = try RawHTTPClient(port: server.port).send(method: "GET", path: "/hold", headers: ["X-Client": "b"])
        let elapsed = ContinuousClock.now - started
        #expect(waited.status == 503)
        #expect(waited.headers["retry-after"] == "1")
        #expect(try JSON.parse(waited.body)["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")
        #expect(elapsed >= .milliseconds(300) && elapsed < .seconds(5), "answered after \(elapsed)")
        #expect(server.queuedRequestCount == 0)
        // The expired request never ran; the held one still finishes.
        handler.releaseAll()
        #expect(try running.wait().status == 200)
        #expect(handler.heldCount == 1)
    }

    // MARK: Before the body

    @Test func aBadOrMissingTokenIsRefusedBeforeTheBodyIsSent() throws {
        let harness = try ServiceHarness()
        let server = try HTTPServer(handler: harness.service, configuration: limitConfiguration())
        defer { server.shutdown() }
        let path = "/database/1/lattice/production/private/records/modify"

        // Only the head goes out, announcing a megabyte: the answer must come without it.
        let bad = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
        try bad.write(Array("POST \(path) HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer lat_nonsense\r\nContent-Length: 1000000\r\n\r\n".utf8))
        let refused = try bad.readResponse()
        #expect(refused.status == 401)
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "AUTHENTICATION_FAILED")

        let missing = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
        try missing.write(Array("POST \(path) HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n".utf8))
        let required = try missing.readResponse()
        #expect(required.status == 421)
        #expect(try JSON.parse(required.body)["serverErrorCode"]?.stringValue == "AUTHENTICATION_REQUIRED")
        #expect(server.bufferedBodyBytes == 0)

        // A good token's request reads its body and runs.
        let (token, _) = try harness.signUp("ada")
        let good = try RawHTTPClient(port: server.port).send(
            method: "POST", path: "/database/1/lattice/production/private/users/current",
            headers: ["Authorization": "Bearer " + token], body: Array("{}".utf8))
        #expect(good.status == 200)
    }

    @Test func bodiesPastTheServerWideBudgetGetTryAgainLaterBeforeBeingBuffered() throws {
        var configuration = limitConfiguration()
        configuration.bodyBufferBudgetBytes = 1000
        let handler = GateHandler()
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        // A holds 800 bytes of the budget with its declared body still on the way.
        let holder = try RawHTTPClient(port: server.port)
        try holder.write(Array("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 800\r\n\r\n".utf8) + [UInt8](repeating: 1, count: 100))
        #expect(eventually { server.bufferedBodyBytes == 800 })

        // B's 300 would pass the budget: 503 before its body is read.
        let over = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
        try over.write(Array("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 300\r\n\r\n".utf8))
        let refused = try over.readResponse()
        #expect(refused.status == 503)
        #expect(refused.headers["retry-after"] == "1")
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER")

        // A chunked body that grows past the budget is refused the same way, once it is in.
        let chunked = try RawHTTPClient(port: server.port).send(
            method: "POST", path: "/upload", headers: ["Transfer-Encoding": "chunked"],
            body: RawHTTPClient.chunked([[UInt8](repeating: 2, count: 150), [UInt8](repeating: 3, count: 150)]))
        #expect(chunked.status == 503)

        try holder.write([UInt8](repeating: 1, count: 700))
        #expect(try holder.readResponse().status == 200)
        #expect(eventually { server.bufferedBodyBytes == 0 })
        let retried = try RawHTTPClient(port: server.port).send(method: "POST", path: "/upload",
                                                                body: [UInt8](repeating: 4, count: 300))
        #expect(retried.status == 200)
        #expect(handler.handledPaths.count == 2)
    }

    @Test func http11WithoutHostIsABadRequest() throws {
        let harness = try ServiceHarness()
        let server = try HTTPServer(handler: harness.service, configuration: limitConfiguration())
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        try client.write(Array("GET /healthz HTTP/1.1\r\n\r\n".utf8))
        let reply = try client.readResponse()
        #expect(reply.status == 400)
        #expect(try JSON.parse(reply.body)["serverErrorCode"]?.stringValue == "BAD_REQUEST")
        #expect(reply.headers["content-type"]?.hasPrefix("application/json") == true)

        // HTTP/1.0 has no Host requirement; with Host, HTTP/1.1 is served.
        let old = try RawHTTPClient(port: server.port)
        try old.write(Array("GET /healthz HTTP/1.0\r\n\r\n".utf8))
        #expect(try old.readResponse().status == 200)
        #expect(try RawHTTPClient(port: server.port).send(method: "GET", path: "/healthz").status == 200)
    }

    // MARK: Long polls

    @Test func parkedLongPollsAreCappedPerAccount() throws {
        let harness = try ServiceHarness { $0.maximumParkedWaitsPerUser = 2 }
        let (token, _) = try harness.signUp("ada")
        let (other, _) = try harness.signUp("bob")
        let boxes = (0..<2).map { _ in ResponseBox() }
        for box in boxes { park(harness, token: token, into: box) }
        #expect(harness.service.notifier.waiterCount == 2)

        let third = harness.call("changes/wait", .object(["timeout": .int(30)]), token: token)
        #expect(third.status == 429)
        #expect(third.code == "THROTTLED")
        #expect(third.response.header("Retry-After") == "1")

        // Another account is not affected.
        let bobs = ResponseBox()
        park(harness, token: other, into: bobs)
        #expect(harness.service.notifier.waiterCount == 3)

        // A change answers ada's two; her slots are free again.
        try harness.createZone("Z", token: token)
        for box in boxes { #expect(box.wait(seconds: 10)?.status == 200) }
        let again = ResponseBox()
        park(harness, token: token, into: again)
        #expect(again.isSet == false)
        harness.service.beginShutdown()
        #expect(again.wait(seconds: 10) != nil)
        #expect(bobs.wait(seconds: 10) != nil)
    }

    @Test func aParkedPollWhoseClientClosesIsFreed() throws {
        let harness = try ServiceHarness()
        let (token, _) = try harness.signUp("ada")
        let server = try HTTPServer(handler: harness.service, configuration: limitConfiguration())
        defer { server.shutdown() }

        let client = try RawHTTPClient(port: server.port)
        try client.write(Array(("POST /database/1/lattice/production/private/changes/wait HTTP/1.1\r\nHost: x\r\n"
                                + "Authorization: Bearer \(token)\r\nContent-Length: 14\r\n\r\n{\"timeout\":60}").utf8))
        #expect(eventually { harness.service.notifier.waiterCount == 1 })
        client.close()
        // Well before the 60 s timeout, the waiter and its slot are released and the connection closed.
        #expect(eventually { harness.service.notifier.waiterCount == 0 })
        #expect(eventually { server.inFlightRequestCount == 0 && server.connectionCounters.open == 0 })
        #expect(server.connectionCounters.abandoned == 1)
    }

    private func park(_ harness: ServiceHarness, token: String, into box: ResponseBox) {
        harness.service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/changes/wait",
                                           headers: ["Authorization": "Bearer " + token],
                                           body: Array(#"{"timeout":30}"#.utf8), remoteAddress: "127.0.0.1")) {
            box.set($0)
        }
    }
}

// MARK: - Helpers

private func limitConfiguration() -> HTTPServerConfiguration {
    var configuration = HTTPServerConfiguration(host: "127.0.0.1", port: 0, threadPoolSize: 2, connectionTimeoutSeconds: 10)
    // Requests held in line by these tests wait as long as the test needs (the bound has its own test).
    configuration.maximumQueueWaitMilliseconds = 120_000
    return configuration
}

/// Polls `condition` until it holds or `seconds` pass.
private func eventually(within seconds: Double = 10, _ condition: () -> Bool) -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
    while !condition() {
        if ContinuousClock.now >= deadline { return false }
        Thread.sleep(forTimeInterval: 0.005)
    }
    return true
}

/// A client handed to one other thread, which alone uses it from then on.
///
/// `@unchecked Sendable` with no lock: the one member, `value`, is an immutable `let`, but `Value` (a
/// `RawHTTPClient`) is not Sendable; each use here hands it to one `Background` thread and the creating thread
/// never touches that client again, so no two threads use `value` at once.
private final class HandOff<Value>: @unchecked Sendable {
    let value: Value
    init(_ value: Value) { self.value = value }
}

/// Runs blocking work on its own thread and hands back its result.
private final class Background<Value: Sendable>: Sendable {
    private let result = Mutex<Result<Value, any Error>?>(nil)
    private let finished = DispatchSemaphore(value: 0)

    init(_ work: @escaping @Sendable () throws -> Value) {
        Thread { [self] in
            let outcome = Result { try work() }
            result.withLock { $0 = outcome }
            finished.signal()
        }.start()
    }

    func wait(seconds: Int = 30) throws -> Value {
        guard finished.wait(timeout: .now() + .seconds(seconds)) == .success else {
            throw RawHTTPClient.Failure("background work did not finish in \(seconds) s")
        }
        finished.signal()
        return try result.withLock { $0! }.get()
    }
}

/// `/healthz` is cheap (inline); `/hold` blocks its worker until `releaseAll()`; anything else answers
/// 200 at once. The pool share is the `X-Client` header, else the address; `X-Remote` echoes the address.
private final class GateHandler: HTTPHandler {
    private struct State {
        var held = 0
        var released = 0
        var paths: [String] = []
        var generation = 0
    }

    private let state = Mutex(State())
    private let condition = NSCondition()
    let maximumBodySize = 1 << 20

    var heldCount: Int { state.withLock { $0.held } }
    var releasedCount: Int { state.withLock { $0.released } }
    var handledPaths: [String] { state.withLock { $0.paths } }

    func admit(_ head: HTTPRequestHead) -> HTTPAdmission {
        head.path == "/healthz" ? .inline : .pool(client: head.header("x-client") ?? head.remoteAddress, principal: nil)
    }

    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        state.withLock { $0.paths.append(request.path) }
        if request.path == "/hold" {
            let generation = state.withLock { state in
                state.held += 1
                return state.generation
            }
            condition.lock()
            let deadline = Date().addingTimeInterval(20)
            while state.withLock({ $0.generation }) == generation && Date() < deadline {
                _ = condition.wait(until: deadline)
            }
            condition.unlock()
            state.withLock { $0.released += 1 }
        }
        respond(HTTPResponse(status: 200, headers: [("X-Remote", request.remoteAddress)], body: Array(request.path.utf8)))
    }

    /// Lets every `/hold` that is waiting now finish.
    func releaseAll() {
        condition.lock()
        state.withLock { $0.generation += 1 }
        condition.broadcast()
        condition.unlock()
    }

    func responseForOversizedBody() -> HTTPResponse { HTTPResponse(status: 413) }
    func beginShutdown() {}
}
