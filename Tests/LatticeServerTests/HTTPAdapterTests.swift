import Dispatch
import Foundation
import LatticeTestSupport
import Synchronization
import Testing

@testable import LatticeServer

/// The libmicrohttpd adapter over real sockets on 127.0.0.1, with small fake handlers.
@Suite(.serialized) struct HTTPAdapterTests {
    // MARK: Round trips

    @Test func getAndPostRoundTripOnOneKeepAliveConnection() throws {
        let handler = EchoHandler()
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)

        let get = try client.send(method: "GET", path: "/items/a%20b?x=1&y=%20z", headers: ["X-Test": "abc"])
        #expect(get.status == 200)
        #expect(get.headers["content-type"] == "application/octet-stream")
        #expect(get.headers["x-method"] == "GET")
        #expect(get.headers["x-path"] == "/items/a%20b")
        #expect(get.headers["x-query"] == "x=1&y=%20z")
        #expect(get.headers["x-test-echo"] == "abc")
        #expect(get.headers["x-remote"] == "127.0.0.1")
        #expect(get.body == Array("hello".utf8))

        let payload = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 31) }
        let post = try client.send(method: "POST", path: "/echo", headers: ["Content-Type": "application/x-lattice"],
                                   body: payload)
        #expect(post.status == 201)
        #expect(post.headers["x-method"] == "POST")
        #expect(post.headers["x-content-type-echo"] == "application/x-lattice")
        #expect(post.body == payload)

        let empty = try client.send(method: "DELETE", path: "/nothing")
        #expect(empty.status == 204)
        #expect(empty.body.isEmpty)
        #expect(handler.handledCount == 3)
    }

    @Test func repeatedRequestHeadersAreJoined() throws {
        let server = try HTTPServer(handler: EchoHandler(), configuration: testConfiguration())
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        try client.write(Array("GET / HTTP/1.1\r\nHost: x\r\nX-Test: one\r\nx-test: two\r\n\r\n".utf8))
        let response = try client.readResponse()
        #expect(response.status == 200)
        #expect(response.headers["x-test-echo"] == "one, two")
    }

    // MARK: Body cap

    @Test func contentLengthOverTheCapIsAnsweredBeforeTheBodyArrives() throws {
        let handler = EchoHandler(maximumBodySize: 1024)
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        // Only the head goes out: the answer must come without the server waiting for 10 MB.
        try client.write(Array("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n".utf8))
        let response = try client.readResponse()
        #expect(response.status == 413)
        #expect(response.body == Array("too large".utf8))
        #expect(handler.handledCount == 0)

        let atTheCap = try RawHTTPClient(port: server.port)
            .send(method: "POST", path: "/echo", body: [UInt8](repeating: 7, count: 1024))
        #expect(atTheCap.status == 201)
        #expect(atTheCap.body.count == 1024)
        #expect(handler.handledCount == 1)
    }

    @Test func chunkedBodyOverTheCapIsDiscardedAndAnsweredAtTheEnd() throws {
        let handler = EchoHandler(maximumBodySize: 1024)
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        let chunks = (0..<64).map { [UInt8](repeating: UInt8($0), count: 1000) }
        let response = try client.send(method: "POST", path: "/upload", headers: ["Transfer-Encoding": "chunked"],
                                       body: RawHTTPClient.chunked(chunks))
        #expect(response.status == 413)
        #expect(response.body == Array("too large".utf8))
        #expect(handler.handledCount == 0)

        let atTheCap = try RawHTTPClient(port: server.port).send(
            method: "POST", path: "/echo", headers: ["Transfer-Encoding": "chunked"],
            body: RawHTTPClient.chunked([[UInt8](repeating: 1, count: 1000), [UInt8](repeating: 2, count: 24)]))
        #expect(atTheCap.status == 201)
        #expect(atTheCap.body == [UInt8](repeating: 1, count: 1000) + [UInt8](repeating: 2, count: 24))
        #expect(handler.handledCount == 1)
    }

    // MARK: Malformed HTTP

    @Test(arguments: [
        "GARBAGE GARBAGE\r\n\r\n",
        "GET / HTTX/1.1\r\nHost: x\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\nThis header has no colon\r\n\r\n",
        "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: twelve\r\n\r\n",
    ])
    func malformedRequestGetsA4xxAndTheServerKeepsServing(garbage: String) throws {
        let handler = EchoHandler()
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }

        let reply = try RawHTTPClient(port: server.port, timeoutSeconds: 5).sendRaw(Array(garbage.utf8))
        let statusLine = String(decoding: reply.prefix { $0 != 13 }, as: UTF8.self)
        let status = statusLine.split(separator: " ").dropFirst().first.flatMap { Int($0) }
        #expect(status.map { (400..<500).contains($0) } == true, "status line: \(statusLine.debugDescription)")
        #expect(handler.handledCount == 0)

        let next = try RawHTTPClient(port: server.port).send(method: "GET", path: "/after")
        #expect(next.status == 200)
        #expect(eventually { server.inFlightRequestCount == 0 })
    }

    /// Framings that two parsers could read two ways (RFC 9112 §6.1, §6.3), each followed by a request smuggled
    /// in the bytes a lenient server would read as the next request: the status the server must answer, and
    /// whether libmicrohttpd answers it itself before the access handler runs (a first `Content-Length` that
    /// is not one decimal number, when there is no Transfer-Encoding: the library's own 400, an HTML body).
    static let ambiguousFramings: [(name: String, head: String, status: Int, byLibrary: Bool)] = [
        ("Content-Length with chunked", "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400, false),
        ("chunked with Content-Length", "Transfer-Encoding: chunked\r\nContent-Length: 40\r\n", 400, false),
        ("Content-Length with an unknown coding", "Content-Length: 5\r\nTransfer-Encoding: gzip\r\n", 400, false),
        ("two different Content-Lengths", "Content-Length: 5\r\nContent-Length: 40\r\n", 400, false),
        ("Content-Length 0 then another", "Content-Length: 0\r\nContent-Length: 5\r\n", 400, false),
        ("a number then a non-number", "Content-Length: 5\r\nContent-Length: 5x\r\n", 400, false),
        ("a Content-Length list that differs", "Content-Length: 5, 40\r\n", 400, true),
        ("a non-numeric Content-Length", "Content-Length: 5x\r\n", 400, true),
        ("a signed Content-Length", "Content-Length: +5\r\n", 400, true),
        ("an unknown coding", "Transfer-Encoding: gzip\r\n", 501, false),
        ("an unknown coding before chunked", "Transfer-Encoding: gzip, chunked\r\n", 501, false),
        ("an unknown coding in a header of its own", "Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", 501,
         false),
        ("identity", "Transfer-Encoding: identity\r\n", 501, false),
        ("chunked with a parameter", "Transfer-Encoding: chunked;ext=1\r\n", 501, false),
        ("chunked not last", "Transfer-Encoding: chunked, gzip\r\n", 400, false),
        ("chunked twice", "Transfer-Encoding: chunked, chunked\r\n", 400, false),
        ("chunked twice in two headers", "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", 400, false),
        ("an empty Transfer-Encoding", "Transfer-Encoding: ,\r\n", 400, false),
    ]

    /// Hole 3: each ambiguous framing gets its 400 or 501 at once (not after a timeout), as a JSON error with
    /// `Connection: close`, and the connection is closed right after it, so the smuggled `GET /smuggled`
    /// behind the body (whichever way the body is read) is never answered and never reaches the handler. On
    /// the old code CL with chunked (either order), two differing Content-Lengths and chunked twice were
    /// answered 201 and the smuggled request 200 on the same connection, and an unknown coding got no answer
    /// before the read timed out. The cases the library answers itself passed before too; they are here so
    /// that stays true.
    @Test(arguments: 0..<ambiguousFramings.count)
    func ambiguousFramingIsRefusedAndTheConnectionClosed(_ index: Int) throws {
        let (name, head, expected, byLibrary) = Self.ambiguousFramings[index]
        let handler = EchoHandler()
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port, timeoutSeconds: 3)
        let smuggled = "GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
        let request = "POST /echo HTTP/1.1\r\nHost: x\r\n" + head + "\r\n" + "0\r\n\r\nG" + smuggled
        let started = ContinuousClock.now
        try client.write(Array(request.utf8))
        let response = try client.readResponse(method: "POST")
        let elapsed = ContinuousClock.now - started
        #expect(response.status == expected, "\(name): \(String(decoding: response.body, as: UTF8.self))")
        #expect(elapsed < .seconds(2), "\(name): answered after \(elapsed)")
        #expect(response.headers["connection"]?.lowercased() == "close", "\(name): \(response.headers)")
        let (rest, closed) = try client.readUntilClose()
        #expect(closed, "\(name): the connection stayed open")
        if byLibrary {
            // libmicrohttpd 0.9.75 writes its status line and headers twice before its HTML body: harmless, as
            // the connection closes, but no second answer of ours may follow.
            let text = String(decoding: response.body + rest, as: UTF8.self)
            #expect(!text.contains("HTTP/1.1 2") && !text.contains("smuggled"), "\(name): \(text)")
        } else {
            #expect(response.headers["content-type"] == "application/json; charset=utf-8", "\(name)")
            let code = expected == 501 ? "NOT_IMPLEMENTED" : "BAD_REQUEST"
            #expect(String(decoding: response.body, as: UTF8.self).contains("\"serverErrorCode\":\"\(code)\""),
                    "\(name)")
            #expect(rest.isEmpty, "\(name): more came after the answer: \(String(decoding: rest, as: UTF8.self))")
        }
        #expect(handler.handledCount == 0, "\(name): the handler ran")
        #expect(try RawHTTPClient(port: server.port).send(method: "GET", path: "/after").status == 200)
    }

    /// The framings that stay accepted: one Content-Length, the same value in two headers (RFC 9112 §6.3 lets a
    /// recipient take it as one; libmicrohttpd refuses a list in one header itself), chunked alone in any
    /// case, and an empty body, each on a connection that stays open for a second request.
    @Test func plainFramingsAreStillAccepted() throws {
        let handler = EchoHandler()
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }
        let cases: [(head: String, body: String)] = [
            ("Content-Length: 5\r\n", "hello"),
            ("Content-Length: 5\r\nContent-Length: 5\r\n", "hello"),
            ("Content-Length: 05\r\nContent-Length: 5\r\n", "hello"),
            ("Content-Length: 0\r\n", ""),
            ("Transfer-Encoding: chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
            ("Transfer-Encoding: Chunked\r\n", "5\r\nhello\r\n0\r\n\r\n"),
        ]
        for (head, body) in cases {
            let client = try RawHTTPClient(port: server.port, timeoutSeconds: 3)
            try client.write(Array(("POST /echo HTTP/1.1\r\nHost: x\r\n" + head + "\r\n" + body).utf8))
            let response = try client.readResponse(method: "POST")
            #expect(response.status == 201, "\(head.debugDescription)")
            #expect(response.body == Array((body.contains("hello") ? "hello" : "").utf8), "\(head.debugDescription)")
            #expect(try client.send(method: "GET", path: "/again").status == 200, "\(head.debugDescription)")
        }
        #expect(handler.handledCount == cases.count * 2)
    }

    @Test func binaryGarbageIsDroppedAndTheServerKeepsServing() throws {
        let handler = EchoHandler()
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        defer { server.shutdown() }

        // No request line at all (a TLS hello, say): the library closes without an answer.
        let client = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
        try client.write([0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xFC, 0x03, 0x03, 0x0D, 0x0A, 0x0D, 0x0A])
        let (reply, closed) = try client.readUntilClose()
        #expect(closed)
        #expect(reply.isEmpty || String(decoding: reply.prefix(10), as: UTF8.self) == "HTTP/1.1 4")
        #expect(handler.handledCount == 0)

        #expect(try RawHTTPClient(port: server.port).send(method: "GET", path: "/after").status == 200)
    }

    // MARK: Late answers

    @Test func lateAnswersDoNotHoldTheThreadPool() throws {
        let handler = LateHandler()
        var configuration = testConfiguration()
        configuration.threadPoolSize = 2
        let server = try HTTPServer(handler: handler, configuration: configuration)
        defer { server.shutdown() }

        let late = (0..<10).map { index in
            Background {
                try RawHTTPClient(port: server.port).send(method: "GET", path: "/late/\(index)")
            }
        }
        #expect(eventually { handler.parkedCount == 10 })

        // All ten are parked on a pool of two threads; a normal request must still be answered now.
        let normal = try RawHTTPClient(port: server.port).send(method: "GET", path: "/now")
        #expect(normal.status == 200)
        #expect(normal.body == Array("now".utf8))
        #expect(handler.lateAnsweredCount == 0, "the normal request finished before the late ones")

        handler.releaseLateAnswers(after: .milliseconds(300))
        for (index, request) in late.enumerated() {
            let response = try request.wait()
            #expect(response.status == 200)
            #expect(response.body == Array("late /late/\(index)".utf8))
        }
        #expect(handler.lateAnsweredCount == 10)
        #expect(eventually { server.inFlightRequestCount == 0 })
    }

    @Test func answersFromOtherThreadsRightAwaySurviveTheSuspendRace() throws {
        // The answer often lands between `handle` returning and the connection being suspended.
        let server = try HTTPServer(handler: OtherThreadHandler(), configuration: testConfiguration())
        defer { server.shutdown() }
        let clients = (0..<4).map { worker in
            Background {
                let client = try RawHTTPClient(port: server.port)
                for request in 0..<100 {
                    let response = try client.send(method: "GET", path: "/\(worker)/\(request)")
                    guard response.status == 200, response.body == Array("/\(worker)/\(request)".utf8) else {
                        throw RawHTTPClient.Failure("wrong answer to /\(worker)/\(request): \(response)")
                    }
                }
                return 100
            }
        }
        for client in clients { #expect(try client.wait() == 100) }
        #expect(eventually { server.inFlightRequestCount == 0 })
    }

    // MARK: Shutdown

    @Test func shutdownLetsRequestsInFlightFinishAndThenRefusesConnections() throws {
        let handler = ShutdownHandler()
        let server = try HTTPServer(handler: handler, configuration: testConfiguration())
        let port = server.port

        let slow = Background { try RawHTTPClient(port: port).send(method: "GET", path: "/slow") }
        let poll = Background { try RawHTTPClient(port: port).send(method: "GET", path: "/poll") }
        #expect(eventually { handler.receivedCount == 2 })

        let stopping = Background { server.shutdown() }
        let slowResponse = try slow.wait()
        #expect(slowResponse.status == 200)
        #expect(slowResponse.body == Array("slow done".utf8))
        let pollResponse = try poll.wait()
        #expect(pollResponse.status == 200)
        #expect(pollResponse.body == Array("released by shutdown".utf8))
        #expect(pollResponse.headers["connection"]?.lowercased() == "close")
        try stopping.wait()

        server.shutdown()
        #expect(handler.beginShutdownCount == 1)
        #expect(server.inFlightRequestCount == 0)
        #expect(throws: RawHTTPClient.Failure.self) { try RawHTTPClient(port: port) }
    }

    @Test func shutdownAnswersWhatTheHandlerLeavesWaitingAfterTheGracePeriod() throws {
        let handler = ForgetfulHandler()
        var configuration = testConfiguration()
        configuration.shutdownGracePeriodSeconds = 1
        let server = try HTTPServer(handler: handler, configuration: configuration)

        let waiting = Background { try RawHTTPClient(port: server.port).send(method: "GET", path: "/forever") }
        #expect(eventually { handler.keptResponders.count == 1 })
        server.shutdown()
        let response = try waiting.wait()
        #expect(response.status == 503)
        #expect(server.inFlightRequestCount == 0)
        // The handler answering after all is harmless.
        for respond in handler.keptResponders { respond(HTTPResponse(status: 200)) }
    }

    // MARK: Timeouts and start-up errors

    @Test func idleConnectionIsClosedAfterTheTimeout() throws {
        var configuration = testConfiguration()
        configuration.connectionTimeoutSeconds = 1
        let server = try HTTPServer(handler: EchoHandler(), configuration: configuration)
        defer { server.shutdown() }

        let client = try RawHTTPClient(port: server.port, timeoutSeconds: 10)
        #expect(try client.send(method: "GET", path: "/").status == 200)
        let started = ContinuousClock.now
        let (bytes, closed) = try client.readUntilClose()
        #expect(closed, "the server closed the idle connection")
        #expect(bytes.isEmpty)
        #expect(ContinuousClock.now - started < .seconds(8))

        let silent = try RawHTTPClient(port: server.port, timeoutSeconds: 10)
        #expect(try silent.readUntilClose().closed)
    }

    @Test func startingOnABusyPortOrANonIPv4HostThrows() throws {
        let first = try HTTPServer(handler: EchoHandler(), configuration: testConfiguration())
        defer { first.shutdown() }
        var busy = testConfiguration()
        busy.port = first.port
        #expect(throws: HTTPServerError.cannotListen(host: "127.0.0.1", port: first.port)) {
            try HTTPServer(handler: EchoHandler(), configuration: busy)
        }
        #expect(HTTPServerError.cannotListen(host: "127.0.0.1", port: 8080).description
                == "cannot listen on 127.0.0.1:8080 (address in use?)")

        var named = testConfiguration()
        named.host = "localhost"
        #expect(throws: HTTPServerError.hostIsNotIPv4("localhost")) {
            try HTTPServer(handler: EchoHandler(), configuration: named)
        }
        var noThreads = testConfiguration()
        noThreads.threadPoolSize = 0
        #expect(throws: HTTPServerError.self) { try HTTPServer(handler: EchoHandler(), configuration: noThreads) }
    }
}

// MARK: - Helpers

private func testConfiguration() -> HTTPServerConfiguration {
    HTTPServerConfiguration(host: "127.0.0.1", port: 0, threadPoolSize: 2, connectionTimeoutSeconds: 10)
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

/// Runs blocking work on its own thread (not the cooperative pool) and hands back its result.
private final class Background<Value: Sendable>: Sendable {
    private let result = Mutex<Result<Value, any Error>?>(nil)
    private let finished = DispatchSemaphore(value: 0)

    init(_ work: @escaping @Sendable () throws -> Value) {
        Thread { [self] in finish(with: Result { try work() }) }.start()
    }

    private func finish(with outcome: Result<Value, any Error>) {
        result.withLock { $0 = outcome }
        finished.signal()
    }

    func wait(seconds: Int = 30) throws -> Value {
        guard finished.wait(timeout: .now() + .seconds(seconds)) == .success else {
            throw RawHTTPClient.Failure("background work did not finish in \(seconds) s")
        }
        finished.signal()
        return try result.withLock { $0! }.get()
    }
}

// MARK: - Fake handlers

/// Answers synchronously: GET with "hello", POST by echoing the body, DELETE with 204; reports what it saw
/// in `X-` headers.
private final class EchoHandler: HTTPHandler {
    let maximumBodySize: Int
    private let handled = Mutex(0)

    init(maximumBodySize: Int = 1 << 20) {
        self.maximumBodySize = maximumBodySize
    }

    var handledCount: Int { handled.withLock { $0 } }

    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        handled.withLock { $0 += 1 }
        let headers: [(name: String, value: String)] = [
            ("Content-Type", "application/octet-stream"),
            ("X-Method", request.method),
            ("X-Path", request.path),
            ("X-Query", request.query),
            ("X-Remote", request.remoteAddress),
            ("X-Test-Echo", request.header("X-Test") ?? ""),
            ("X-Content-Type-Echo", request.header("content-type") ?? ""),
        ]
        switch request.method {
        case "POST": respond(HTTPResponse(status: 201, headers: headers, body: request.body))
        case "DELETE": respond(HTTPResponse(status: 204, headers: headers))
        default: respond(HTTPResponse(status: 200, headers: headers, body: Array("hello".utf8)))
        }
    }

    func responseForOversizedBody() -> HTTPResponse {
        HTTPResponse(status: 413, headers: [("Content-Type", "text/plain")], body: Array("too large".utf8))
    }

    func beginShutdown() {}
}

/// `/now` is answered at once; `/late/...` is parked until the test releases it, then answered from a
/// timer thread.
private final class LateHandler: HTTPHandler {
    private struct State {
        var parked: [(path: String, respond: HTTPResponder)] = []
        var lateAnswered = 0
    }

    private let state = Mutex(State())
    let maximumBodySize = 1024

    var parkedCount: Int { state.withLock { $0.parked.count } }
    var lateAnsweredCount: Int { state.withLock { $0.lateAnswered } }

    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        if request.path.hasPrefix("/late/") {
            state.withLock { $0.parked.append((request.path, respond)) }
        } else {
            respond(HTTPResponse(status: 200, body: Array("now".utf8)))
        }
    }

    func releaseLateAnswers(after delay: DispatchTimeInterval) {
        let parked = state.withLock { $0.parked }
        for (path, respond) in parked {
            DispatchQueue.global().asyncAfter(deadline: .now() + delay) { [self] in
                state.withLock { $0.lateAnswered += 1 }
                respond(HTTPResponse(status: 200, body: Array("late \(path)".utf8)))
            }
        }
    }

    func responseForOversizedBody() -> HTTPResponse { HTTPResponse(status: 413) }
    func beginShutdown() {}
}

/// Answers every request from another thread as soon as it can, echoing the path.
private final class OtherThreadHandler: HTTPHandler {
    let maximumBodySize = 1024

    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        let path = request.path
        DispatchQueue.global().async { respond(HTTPResponse(status: 200, body: Array(path.utf8))) }
    }

    func responseForOversizedBody() -> HTTPResponse { HTTPResponse(status: 413) }
    func beginShutdown() {}
}

/// `/slow` answers after 300 ms from a timer thread; `/poll` waits until `beginShutdown`.
private final class ShutdownHandler: HTTPHandler {
    private struct State {
        var received = 0
        var beginShutdownCalls = 0
        var polls: [HTTPResponder] = []
    }

    private let state = Mutex(State())
    let maximumBodySize = 1024

    var receivedCount: Int { state.withLock { $0.received } }
    var beginShutdownCount: Int { state.withLock { $0.beginShutdownCalls } }

    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        state.withLock { $0.received += 1 }
        if request.path == "/poll" {
            state.withLock { $0.polls.append(respond) }
        } else {
            DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(300)) {
                respond(HTTPResponse(status: 200, body: Array("slow done".utf8)))
            }
        }
    }

    func beginShutdown() {
        let polls = state.withLock { state in
            state.beginShutdownCalls += 1
            defer { state.polls = [] }
            return state.polls
        }
        for respond in polls { respond(HTTPResponse(status: 200, body: Array("released by shutdown".utf8))) }
    }

    func responseForOversizedBody() -> HTTPResponse { HTTPResponse(status: 413) }
}

/// Keeps every responder and never calls it, not even on shutdown.
private final class ForgetfulHandler: HTTPHandler {
    private let responders = Mutex<[HTTPResponder]>([])
    let maximumBodySize = 1024

    var keptResponders: [HTTPResponder] { responders.withLock { $0 } }

    func handle(_ request: HTTPRequest, respond: @escaping HTTPResponder) {
        responders.withLock { $0.append(respond) }
    }

    func responseForOversizedBody() -> HTTPResponse { HTTPResponse(status: 413) }
    func beginShutdown() {}
}
