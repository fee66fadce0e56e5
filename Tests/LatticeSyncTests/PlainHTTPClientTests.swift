import Foundation
#if canImport(Glibc)
import Glibc
#endif
@testable import LatticeSync
import Synchronization
import Testing

/// A scripted HTTP peer on 127.0.0.1: each request it reads (head and Content-Length body) gets the
/// action `script` returns for it (counted over all connections, from 0).
private final class ScriptedPeer: Sendable {
    enum Action: Sendable {
        case answer(String, thenClose: Bool = false)
        /// Close the connection without a byte of answer.
        case drop
        /// Read the request and say nothing until the peer stops.
        case hang
    }

    let port: UInt16
    private let listener: Int32
    /// `listenerClosed`: the accept loop closed the listener (its descriptor number may belong to another
    /// socket of the process since, so `stop` must not touch it).
    private let state = Mutex<(connections: Int, requests: [String], stopped: Bool, listenerClosed: Bool)>((0, [], false, false))
    private let script: @Sendable (Int) -> Action

    init(_ script: @escaping @Sendable (Int) -> Action) throws {
        self.script = script
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let bound = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard bound == 0, listen(fd, 8) == 0 else {
            close(fd)
            throw TransportError("cannot listen")
        }
        var size = socklen_t(MemoryLayout<sockaddr_in>.size)
        withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { _ = getsockname(fd, $0, &size) }
        }
        listener = fd
        port = UInt16(bigEndian: address.sin_port)
        let thread = Thread { [self] in acceptLoop() }
        thread.start()
    }

    var connections: Int { state.withLock { $0.connections } }
    var requests: [String] { state.withLock { $0.requests } }

    func stop() {
        state.withLock { state in
            state.stopped = true
            if !state.listenerClosed { shutdown(listener, Int32(SHUT_RDWR)) }
        }
    }

    private var stopped: Bool { state.withLock { $0.stopped } }

    /// Accepts for at most 600 seconds (a bound, not a time-out of the test: with Swift Testing running the
    /// suites in parallel on two cores, an async test may wait minutes for a thread before its first request),
    /// each connection served on a thread of its own.
    private func acceptLoop() {
        let started = Date()
        while !stopped && Date().timeIntervalSince(started) < 600 {
            var entry = pollfd(fd: listener, events: Int16(POLLIN), revents: 0)
            guard poll(&entry, 1, 100) > 0 else { continue }
            let connection = accept(listener, nil, nil)
            guard connection >= 0 else { break }
            state.withLock { $0.connections += 1 }
            Thread { [self] in serve(connection) }.start()
        }
        state.withLock { state in
            close(listener)
            state.listenerClosed = true
        }
    }

    /// Serves a connection until it has been idle for 120 s since its last request (a bound from the last
    /// request, not from the connection's start: a test starved of threads for minutes between two requests,
    /// as the accept loop allows, must find its kept connection still open).
    private func serve(_ fd: Int32) {
        defer { close(fd) }
        var buffer: [UInt8] = []
        var started = Date()
        while !stopped && Date().timeIntervalSince(started) < 120 {
            // One request: the head, then Content-Length bytes of body.
            guard let request = readRequest(fd, &buffer) else { return }
            started = Date()
            let index = state.withLock { state in
                state.requests.append(request)
                return state.requests.count - 1
            }
            switch script(index) {
            case .answer(let text, let thenClose):
                let bytes = Array(text.utf8)
                _ = bytes.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                if thenClose { return }
            case .drop:
                return
            case .hang:
                while !stopped && Date().timeIntervalSince(started) < 120 { usleep(20_000) }
                return
            }
        }
    }

    private func readRequest(_ fd: Int32, _ buffer: inout [UInt8]) -> String? {
        let marker: [UInt8] = [13, 10, 13, 10]
        while true {
            if let end = (0..<max(0, buffer.count - 3)).first(where: { Array(buffer[$0..<($0 + 4)]) == marker }) {
                let head = String(decoding: buffer[..<end], as: UTF8.self)
                let length = head.split(separator: "\r\n").compactMap { line -> Int? in
                    line.lowercased().hasPrefix("content-length:") ? Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) : nil
                }.first ?? 0
                if buffer.count >= end + 4 + length {
                    let request = String(decoding: buffer[..<(end + 4 + length)], as: UTF8.self)
                    buffer.removeFirst(end + 4 + length)
                    return request
                }
            }
            var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard !stopped, poll(&entry, 1, 100) >= 0 else { return nil }
            if entry.revents == 0 { continue }
            var chunk = [UInt8](repeating: 0, count: 4096)
            let got = recv(fd, &chunk, chunk.count, 0)
            guard got > 0 else { return nil }
            buffer.append(contentsOf: chunk[..<got])
        }
    }
}

private func client(_ peer: ScriptedPeer, path: String = "") throws -> PlainHTTPClient {
    try PlainHTTPClient(url: URL(string: "http://127.0.0.1:\(peer.port)\(path)")!)
}

private func post(_ body: String, to path: String = "/api/x") -> TransportRequest {
    TransportRequest(method: "POST", path: path, headers: ["Authorization": "Bearer t"], body: Array(body.utf8))
}

/// The client's two forms: async (`send`, waits holding no thread) and blocking (`sendBlocking`, waits on
/// the caller's thread). Every behaviour below holds for both.
enum ClientForm: CaseIterable, Sendable {
    case async, blocking
}

extension PlainHTTPClient {
    fileprivate func send(_ request: TransportRequest, timeout: TimeInterval, form: ClientForm) async throws -> TransportResponse {
        switch form {
        case .async: try await withTaskExecutorPreference(SerialQueueExecutor.shared) { try await send(request, timeout: timeout) }
        case .blocking: try sendBlocking(request, timeout: timeout)
        }
    }
}

/// Runs jobs one at a time on a serial Dispatch queue. The async cases run on one (`shared`) so that their
/// resumptions need none of Swift's shared threads, which the suites that wait for subprocesses can hold
/// for a long time in a full test run.
final class SerialQueueExecutor: TaskExecutor {
    static let shared = SerialQueueExecutor()
    let queue = DispatchQueue(label: "lattice.tests.serial-executor")

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

@Suite struct PlainHTTPClientTests {
    @Test(arguments: ClientForm.allCases) func keepsOneConnectionForRequestsOneAfterAnother(_ form: ClientForm) async throws {
        let peer = try ScriptedPeer { index in
            .answer("HTTP/1.1 200 OK\r\nContent-Length: 7\r\nX-Thing: a\r\nx-thing: b\r\n\r\n{\"n\":\(index)}")
        }
        defer { peer.stop() }
        let http = try client(peer, path: "/base/")
        for index in 0..<3 {
            let response = try await http.send(post("{}"), timeout: 5, form: form)
            #expect(response.status == 200)
            #expect(String(decoding: response.body, as: UTF8.self) == "{\"n\":\(index)}")
            #expect(response.headers["x-thing"] == "a, b")
        }
        #expect(peer.connections == 1)
        let first = try #require(peer.requests.first)
        #expect(first.hasPrefix("POST /base/api/x HTTP/1.1\r\n"))
        #expect(first.contains("\r\nHost: 127.0.0.1:\(peer.port)\r\n"))
        #expect(first.contains("\r\nContent-Type: application/json\r\n"))
        #expect(first.contains("\r\nContent-Length: 2\r\n"))
        #expect(first.contains("\r\nAuthorization: Bearer t\r\n"))
        #expect(first.hasSuffix("\r\n\r\n{}"))
    }

    @Test(arguments: ClientForm.allCases) func readsChunkedAnswersAndSkipsInterimOnes(_ form: ClientForm) async throws {
        let peer = try ScriptedPeer { _ in
            .answer("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
                    + "4;ext=1\r\nabcd\r\n3\r\nefg\r\n0\r\nTrailer: x\r\n\r\n")
        }
        defer { peer.stop() }
        let http = try client(peer)
        let response = try await http.send(post("{}"), timeout: 5, form: form)
        #expect(response.status == 201)
        #expect(String(decoding: response.body, as: UTF8.self) == "abcdefg")
        _ = try await http.send(post("{}"), timeout: 5, form: form)
        #expect(peer.connections == 1)
    }

    @Test(arguments: ClientForm.allCases) func aConnectionTheServerLetGoIsReplaced(_ form: ClientForm) async throws {
        // 0: answered, connection kept open. 1: the server closes without answering (a kept connection it
        // let go): the client tries once more on a new connection, which answers 2.
        let peer = try ScriptedPeer { index in
            index == 1 ? .drop : .answer("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\n\(index)")
        }
        defer { peer.stop() }
        let http = try client(peer)
        #expect(try await http.send(post("{}"), timeout: 5, form: form).body == Array("0".utf8))
        #expect(try await http.send(post("{}"), timeout: 5, form: form).body == Array("2".utf8))
        #expect(peer.connections == 2)
    }

    @Test(arguments: ClientForm.allCases) func aClosedConnectionIsNotReused(_ form: ClientForm) async throws {
        // Answers that end the connection: `Connection: close`, or a body without a length.
        let peer = try ScriptedPeer { index in
            index == 0 ? .answer("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\na", thenClose: true)
                       : .answer("HTTP/1.1 200 OK\r\n\r\nuntil the end", thenClose: true)
        }
        defer { peer.stop() }
        let http = try client(peer)
        #expect(try await http.send(post("{}"), timeout: 5, form: form).body == Array("a".utf8))
        #expect(try await http.send(post("{}"), timeout: 5, form: form).body == Array("until the end".utf8))
        #expect(try await http.send(post("{}"), timeout: 5, form: form).status == 200)
        #expect(peer.connections == 3)
    }

    @Test(arguments: ClientForm.allCases) func badOrOversizedAnswersAreTransportErrors(_ form: ClientForm) async throws {
        let huge = String(repeating: "a", count: PlainHTTPClient.maximumHeaderBytes + 10)
        let answers = [
            "SMTP ready\r\n\r\n",
            "HTTP/1.1 200 OK\r\nX-Big: \(huge)\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: \(PlainHTTPClient.maximumBodyBytes + 1)\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: -3\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        ]
        let peer = try ScriptedPeer { index in .answer(answers[min(index, answers.count - 1)], thenClose: true) }
        defer { peer.stop() }
        let http = try client(peer)
        for answer in answers {
            await #expect(throws: TransportError.self, "\(answer.prefix(40).debugDescription)") {
                try await http.send(post("{}"), timeout: 5, form: form)
            }
        }
    }

    @Test(arguments: ClientForm.allCases) func anAnswerThatNeverComesTimesOut(_ form: ClientForm) async throws {
        let peer = try ScriptedPeer { _ in .hang }
        defer { peer.stop() }
        let http = try client(peer)
        let (error, elapsed) = await withTaskExecutorPreference(SerialQueueExecutor.shared) {
            let started = Date()
            let error = await #expect(throws: TransportError.self) { try await http.send(post("{}"), timeout: 0.3, form: form) }
            return (error, Date().timeIntervalSince(started))
        }
        #expect(error?.description.contains("timed out") == true, "\(String(describing: error))")
        #expect(elapsed < 5)
    }

    @Test(arguments: ClientForm.allCases) func aRefusedConnectionIsATransportError(_ form: ClientForm) async throws {
        // A port nobody listens on: bind one, note it, close it.
        let peer = try ScriptedPeer { _ in .drop }
        let port = peer.port
        peer.stop()
        usleep(200_000)
        let http = try PlainHTTPClient(url: URL(string: "http://127.0.0.1:\(port)")!)
        let error = await #expect(throws: TransportError.self) { try await http.send(post("{}"), timeout: 2, form: form) }
        #expect(error?.description.contains("cannot reach http://127.0.0.1:\(port)") == true, "\(String(describing: error))")
    }

    @Test func cancellingTheTaskEndsTheExchangeAtOnce() async throws {
        let peer = try ScriptedPeer { _ in .hang }
        defer { peer.stop() }
        let http = try client(peer)
        let (result, elapsed) = await withTaskExecutorPreference(SerialQueueExecutor.shared) {
            let exchange = Task(executorPreference: SerialQueueExecutor.shared) { try await http.send(post("{}"), timeout: 30) }
            try? await Task.sleep(for: .milliseconds(200))
            let started = ContinuousClock.now
            exchange.cancel()
            let result = await exchange.result
            return (result, ContinuousClock.now - started)
        }
        #expect(elapsed < .seconds(2))
        guard case .failure(let error) = result else {
            Issue.record("the exchange did not fail")
            return
        }
        #expect(error is CancellationError, "\(error)")
    }

    /// Waiting for an answer holds no thread: 32 exchanges run as tasks on one serial queue (one job at a
    /// time, so an exchange that held its thread while waiting would let no other start), and all 32 are
    /// under way at once (the peer holds 32 connections, none answered). Cancelling them ends them all.
    @Test func waitingExchangesHoldNoThread() async throws {
        let peer = try ScriptedPeer { _ in .hang }
        defer { peer.stop() }
        let http = try client(peer)
        let group = Task(executorPreference: SerialQueueExecutor()) {
            await withTaskGroup(of: Bool.self) { group in
                for _ in 0..<32 {
                    group.addTask {
                        do {
                            _ = try await http.send(post("{}"), timeout: 60) // the peer hangs up after 120 s
                            return false
                        } catch {
                            return error is CancellationError
                        }
                    }
                }
                return await group.reduce(0) { $0 + ($1 ? 1 : 0) }
            }
        }
        // Watched from a serial queue of its own too: the check needs none of Swift's shared threads either.
        let waiting = await withTaskExecutorPreference(SerialQueueExecutor.shared) {
            let began = ContinuousClock.now
            while peer.connections < 32 && ContinuousClock.now - began < .seconds(20) { try? await Task.sleep(for: .milliseconds(20)) }
            let waiting = peer.connections
            group.cancel()
            return waiting
        }
        #expect(waiting == 32, "exchanges waiting at once: \(waiting)")
        #expect(await group.value == 32, "every exchange ends with CancellationError")
    }

    @Test func proxiesInTheEnvironmentLeaveTheWorkToURLSession() throws {
        let url = URL(string: "http://127.0.0.1:1")!
        #expect(PlainHTTPClient.serves(url, environment: [:]))
        #expect(!PlainHTTPClient.serves(url, environment: ["http_proxy": "http://proxy:3128"]))
        #expect(!PlainHTTPClient.serves(url, environment: ["ALL_PROXY": "socks5://proxy"]))
        #expect(PlainHTTPClient.serves(url, environment: ["http_proxy": ""]))
        #expect(!PlainHTTPClient.serves(URL(string: "https://example.org")!, environment: [:]))
    }
}
