#if canImport(Darwin)
import Darwin
#elseif canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization

/// HTTP/1.1 over plain TCP, for `http://` servers: what `HTTPTransport` uses unless the URL is `https://`
/// or a proxy is configured in the environment (then URLSession does the work).
///
/// A sync client's exchanges are small POSTs, one after another, to one server; URLSession (libcurl and
/// Dispatch on Linux) spent about as much CPU per request as the server's whole HTTP layer. This client
/// keeps up to `maximumIdle` keep-alive connections and does blocking I/O on the caller's thread, each
/// wait bounded by the exchange's deadline (`poll`). The answer is bounded too: at most
/// `maximumHeaderBytes` of status line and headers, at most `maximumBodyBytes` of body; more is a
/// `TransportError`, as is anything that is not HTTP/1.x.
///
/// A kept connection the server has closed meanwhile is noticed before use (it polls readable) and
/// dropped; one that fails before any byte of the answer arrived is retried once on a new connection,
/// as a browser does. `ServerClient` then applies its own retry rules as for any `TransportError`.
final class PlainHTTPClient: Sendable {
    let host: String
    let port: UInt16
    /// `host[:port]` as the `Host` header carries it.
    let authority: String
    /// The path of the server URL without its trailing slashes: requests' paths are appended to it.
    let basePath: String
    /// Idle keep-alive connections, newest last.
    private let idle = Mutex<[PlainHTTPConnection]>([])

    static let maximumIdle = 4
    static let maximumHeaderBytes = 64 * 1024
    static let maximumBodyBytes = 256 * 1024 * 1024

    init(url: URL) throws(TransportError) {
        guard url.scheme == "http", let host = url.host, !host.isEmpty else {
            throw TransportError("\(url.absoluteString) is not an http:// URL")
        }
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
        self.host = bare
        port = UInt16(url.port ?? 80)
        let shown = bare.contains(":") ? "[\(bare)]" : bare
        authority = url.port.map { "\(shown):\($0)" } ?? shown
        var path = url.path
        while path.hasSuffix("/") { path.removeLast() }
        basePath = path
    }

    /// Whether HTTP to `url` may skip URLSession: plain `http://` and no proxy named in the environment
    /// (URLSession honours `http_proxy` and `all_proxy`; this client connects directly).
    static func serves(_ url: URL, environment: [String: String] = ProcessInfo.processInfo.environment) -> Bool {
        guard url.scheme == "http" else { return false }
        let proxies = ["http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"]
        return !proxies.contains { !(environment[$0] ?? "").isEmpty }
    }

    func send(_ request: TransportRequest, timeout: TimeInterval) throws(TransportError) -> TransportResponse {
        let deadline = Deadline(seconds: timeout)
        let bytes = encode(request)
        while let kept = idle.withLock({ $0.popLast() }) {
            guard kept.isQuiet else { continue } // closed by the server (or stray bytes): not usable
            do throws(PlainHTTPFailure) {
                return try exchange(bytes, method: request.method, on: kept, deadline: deadline)
            } catch {
                guard case .failed(let reason) = error else { break } // let go meanwhile: try a new one
                throw TransportError("cannot reach http://\(authority): \(reason)")
            }
        }
        do throws(PlainHTTPFailure) {
            let fresh = try PlainHTTPConnection(host: host, port: port, deadline: deadline)
            return try exchange(bytes, method: request.method, on: fresh, deadline: deadline)
        } catch {
            switch error {
            case .beforeAnswer(let reason), .failed(let reason):
                throw TransportError("cannot reach http://\(authority): \(reason)")
            }
        }
    }

    /// The request's bytes: request line, `Host`, the caller's headers, `Content-Length`, body.
    private func encode(_ request: TransportRequest) -> [UInt8] {
        var head = "\(request.method) \(basePath)\(request.path) HTTP/1.1\r\nHost: \(authority)\r\n"
        var hasType = false
        for (name, value) in request.headers.sorted(by: { $0.key < $1.key }) {
            let lowered = name.lowercased()
            guard lowered != "host", lowered != "content-length", lowered != "connection" else { continue }
            if lowered == "content-type" { hasType = true }
            head += "\(name): \(value)\r\n"
        }
        if !request.body.isEmpty && !hasType { head += "Content-Type: application/json\r\n" }
        if !request.body.isEmpty || request.method == "POST" || request.method == "PUT" {
            head += "Content-Length: \(request.body.count)\r\n"
        }
        head += "\r\n"
        var bytes = Array(head.utf8)
        bytes.append(contentsOf: request.body)
        return bytes
    }

    /// One request and its answer on `connection`; the connection is kept for the next one when the
    /// answer allows it (HTTP/1.1 without `Connection: close`, a delimited body, nothing left over).
    private func exchange(_ bytes: [UInt8], method: String, on connection: PlainHTTPConnection,
                          deadline: Deadline) throws(PlainHTTPFailure) -> TransportResponse {
        var reader = ResponseReader(connection: connection, deadline: deadline)
        do {
            try connection.write(bytes, deadline: deadline)
        } catch {
            // The server may have answered early (a body it refuses) and closed: that answer counts.
            guard let early = try? reader.response(method: method) else { throw error }
            return early.response
        }
        let answer = try reader.response(method: method)
        if answer.keepAlive && reader.isDrained {
            idle.withLock { connections in
                if connections.count < Self.maximumIdle { connections.append(connection) }
            }
        }
        return answer.response
    }
}

/// Why an exchange failed: `beforeAnswer` when no byte of the answer had arrived (a kept connection the
/// server closed: worth one more try on a new one), otherwise `failed`.
enum PlainHTTPFailure: Error {
    case beforeAnswer(String)
    case failed(String)
}

/// A point in time the exchange must finish by (the monotonic clock).
struct Deadline {
    let nanoseconds: UInt64

    init(seconds: TimeInterval) {
        let span = UInt64(max(0, min(seconds, 86_400)) * 1e9)
        nanoseconds = Deadline.now() &+ span
    }

    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// Milliseconds left for `poll`, at least 1 while any time is left; nil when it has passed.
    var remainingMilliseconds: Int32? {
        let current = Deadline.now()
        guard current < nanoseconds else { return nil }
        return Int32(min(UInt64(Int32.max), max(1, (nanoseconds - current) / 1_000_000)))
    }
}

/// The socket calls whose spelling differs between Linux and Apple platforms.
enum SocketCalls {
    #if canImport(Darwin)
    static let stream = SOCK_STREAM

    /// A socket that never blocks, is closed on exec and raises no SIGPIPE (Darwin sets each apart).
    static func nonBlockingSocket(_ family: Int32, _ type: Int32, _ proto: Int32) -> Int32 {
        let fd = socket(family, type, proto)
        guard fd >= 0 else { return fd }
        var on: Int32 = 1
        guard fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) == 0, fcntl(fd, F_SETFD, FD_CLOEXEC) == 0,
              setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &on, socklen_t(MemoryLayout<Int32>.size)) == 0 else {
            let code = errno
            close(fd)
            errno = code
            return -1
        }
        return fd
    }

    static func send(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
        Darwin.send(fd, bytes, count, 0) // SO_NOSIGPIPE is set on the socket
    }
    #else
    static let stream = Int32(SOCK_STREAM.rawValue)

    /// A socket that never blocks and is closed on exec, in one call.
    static func nonBlockingSocket(_ family: Int32, _ type: Int32, _ proto: Int32) -> Int32 {
        socket(family, type | Int32(SOCK_NONBLOCK.rawValue) | Int32(SOCK_CLOEXEC.rawValue), proto)
    }

    /// `send` that raises no SIGPIPE when the peer has gone (MSG_NOSIGNAL).
    static func send(_ fd: Int32, _ bytes: UnsafeRawPointer, _ count: Int) -> Int {
        Glibc.send(fd, bytes, count, Int32(MSG_NOSIGNAL))
    }
    #endif
}

/// One TCP connection (non-blocking socket), closed when the last reference goes.
final class PlainHTTPConnection: Sendable {
    let descriptor: Int32

    /// Connects to the first address of `host` that accepts within the deadline.
    init(host: String, port: UInt16, deadline: Deadline) throws(PlainHTTPFailure) {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = SocketCalls.stream
        hints.ai_flags = AI_NUMERICSERV
        var list: UnsafeMutablePointer<addrinfo>?
        let found = getaddrinfo(host, String(port), &hints, &list)
        guard found == 0, let first = list else {
            throw .beforeAnswer("cannot resolve \(host): \(String(cString: gai_strerror(found)))")
        }
        defer { freeaddrinfo(list) }
        var reason = "no address for \(host)"
        var entry: UnsafeMutablePointer<addrinfo>? = first
        while let address = entry {
            entry = address.pointee.ai_next
            let fd = SocketCalls.nonBlockingSocket(address.pointee.ai_family, address.pointee.ai_socktype,
                                                   address.pointee.ai_protocol)
            guard fd >= 0 else { reason = PlainHTTPConnection.describe("socket"); continue }
            if connect(fd, address.pointee.ai_addr, address.pointee.ai_addrlen) == 0
                || (errno == EINPROGRESS && PlainHTTPConnection.finishConnect(fd, deadline: deadline, reason: &reason)) {
                var on: Int32 = 1
                setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &on, socklen_t(MemoryLayout<Int32>.size))
                descriptor = fd
                return
            }
            if errno != EINPROGRESS { reason = PlainHTTPConnection.describe("connect") }
            close(fd)
        }
        throw .beforeAnswer(reason)
    }

    deinit { close(descriptor) }

    private static func finishConnect(_ fd: Int32, deadline: Deadline, reason: inout String) -> Bool {
        guard wait(fd, for: Int16(POLLOUT), deadline: deadline) else {
            reason = "connect timed out"
            return false
        }
        var failure: Int32 = 0
        var size = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ERROR, &failure, &size) == 0, failure == 0 else {
            reason = "connect failed: \(String(cString: strerror(failure)))"
            return false
        }
        return true
    }

    static func describe(_ call: String, _ code: Int32 = errno) -> String {
        "\(call) failed: \(String(cString: strerror(code)))"
    }

    /// Waits until `fd` is ready for `events` (or in error); false when the deadline passes first.
    static func wait(_ fd: Int32, for events: Int16, deadline: Deadline) -> Bool {
        while let milliseconds = deadline.remainingMilliseconds {
            var entry = pollfd(fd: fd, events: events, revents: 0)
            let ready = poll(&entry, 1, Int32(milliseconds))
            if ready > 0 { return true }
            if ready < 0 && errno != EINTR { return true } // the next call reports the error
        }
        return false
    }

    /// No bytes waiting and not closed by the peer: fit to carry the next request.
    var isQuiet: Bool {
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        return poll(&entry, 1, 0) == 0
    }

    /// Writes all of `bytes`; a failure is `beforeAnswer` (the server has answered nothing yet).
    func write(_ bytes: [UInt8], deadline: Deadline) throws(PlainHTTPFailure) {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes.withUnsafeBytes { raw in
                SocketCalls.send(descriptor, raw.baseAddress! + offset, raw.count - offset)
            }
            if sent >= 0 {
                offset += sent
            } else if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR {
                guard PlainHTTPConnection.wait(descriptor, for: Int16(POLLOUT), deadline: deadline) else {
                    throw .failed("sending the request timed out")
                }
            } else {
                throw .beforeAnswer(PlainHTTPConnection.describe("send"))
            }
        }
    }

    /// Receives up to `into.count` bytes; 0 when the peer closed the connection.
    func read(into scratch: UnsafeMutableRawBufferPointer, deadline: Deadline) throws(PlainHTTPFailure) -> Int {
        while true {
            let got = recv(descriptor, scratch.baseAddress, scratch.count, 0)
            if got >= 0 { return got }
            let code = errno
            if code == EAGAIN || code == EWOULDBLOCK || code == EINTR {
                guard PlainHTTPConnection.wait(descriptor, for: Int16(POLLIN), deadline: deadline) else {
                    throw .failed("the answer timed out")
                }
            } else {
                throw .failed(PlainHTTPConnection.describe("recv", code))
            }
        }
    }
}

/// Reads one HTTP/1.x answer from a connection, within the client's bounds.
struct ResponseReader {
    let connection: PlainHTTPConnection
    let deadline: Deadline
    private var buffer: [UInt8] = []
    private var index = 0
    /// Bytes received so far, over all answers (interim ones included).
    private var received = 0

    init(connection: PlainHTTPConnection, deadline: Deadline) {
        self.connection = connection
        self.deadline = deadline
    }

    /// Nothing was received past the answer.
    var isDrained: Bool { index == buffer.count }

    /// The final answer (interim 1xx answers are read past) and whether the connection may be kept.
    mutating func response(method: String) throws(PlainHTTPFailure) -> (response: TransportResponse, keepAlive: Bool) {
        while true {
            let head = try readHead()
            guard let statusLine = head.first else { throw .failed("an empty answer") }
            let parts = statusLine.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
            guard parts.count >= 2, parts[0] == "HTTP/1.1" || parts[0] == "HTTP/1.0", parts[1].count == 3,
                  let status = Int(parts[1]), (100...599).contains(status) else {
                throw .failed("not an HTTP/1.x answer: \(statusLine.prefix(80).debugDescription)")
            }
            var headers: [String: String] = [:]
            for line in head.dropFirst() {
                guard let colon = line.firstIndex(of: ":") else { throw .failed("a header line without a colon") }
                let name = line[..<colon].lowercased()
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                headers[name] = headers[name].map { $0 + ", " + value } ?? value
            }
            if (100..<200).contains(status) {
                guard status != 101 else { throw .failed("the server switched protocols") }
                continue
            }
            let connectionTokens = (headers["connection"] ?? "").lowercased().split(separator: ",")
                .map { $0.trimmingCharacters(in: .whitespaces) }
            var keepAlive = parts[0] == "HTTP/1.1" ? !connectionTokens.contains("close") : connectionTokens.contains("keep-alive")
            let body: [UInt8]
            if method == "HEAD" || status == 204 || status == 304 {
                body = []
            } else if let coding = headers["transfer-encoding"] {
                guard coding.lowercased() == "chunked" else { throw .failed("transfer coding \(coding) is not supported") }
                body = try readChunked()
            } else if let text = headers["content-length"] {
                guard let length = Int(text), length >= 0 else { throw .failed("a bad Content-Length \(text)") }
                guard length <= PlainHTTPClient.maximumBodyBytes else {
                    throw .failed("an answer of \(length) bytes, over \(PlainHTTPClient.maximumBodyBytes)")
                }
                body = try take(length)
            } else {
                body = try readToEnd()
                keepAlive = false
            }
            return (TransportResponse(status: status, headers: headers, body: body), keepAlive)
        }
    }

    /// Receives up to `limit` more bytes (at most 64 KiB at a time) onto the buffer; 0 at the end of
    /// the connection.
    private mutating func receive(limit: Int) throws(PlainHTTPFailure) -> Int {
        if index > 0 && index == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            index = 0
        }
        let got = try withUnsafeTemporaryAllocation(byteCount: max(1, min(limit, 64 * 1024)), alignment: 1) {
            scratch throws(PlainHTTPFailure) -> Int in
            let got = try connection.read(into: scratch, deadline: deadline)
            buffer.append(contentsOf: scratch[..<got])
            return got
        }
        received += got
        return got
    }

    /// Receives more; the end of the connection is `beforeAnswer` while nothing at all has arrived.
    private mutating func fill(limit: Int) throws(PlainHTTPFailure) {
        guard try receive(limit: limit) > 0 else {
            throw received == 0 ? .beforeAnswer("the connection closed before an answer")
                                : .failed("the connection closed in the middle of the answer")
        }
    }

    /// The status line and header lines, up to the empty line.
    private mutating func readHead() throws(PlainHTTPFailure) -> [Substring] {
        var searched = 0 // bytes past `index` known to hold no head end
        while true {
            if let end = headEnd(from: index + searched), end - index <= PlainHTTPClient.maximumHeaderBytes {
                guard let text = String(validating: buffer[index..<end], as: UTF8.self) else {
                    throw .failed("an answer head that is not UTF-8")
                }
                index = end + 4
                return text.split(separator: "\r\n", omittingEmptySubsequences: false)
            }
            guard buffer.count - index <= PlainHTTPClient.maximumHeaderBytes else {
                throw .failed("an answer head over \(PlainHTTPClient.maximumHeaderBytes) bytes")
            }
            searched = max(0, buffer.count - index - 3)
            try fill(limit: PlainHTTPClient.maximumHeaderBytes + 4 - (buffer.count - index))
        }
    }

    /// Where `\r\n\r\n` starts, searching from `start`.
    private func headEnd(from start: Int) -> Int? {
        var position = start
        while position + 3 < buffer.count {
            if buffer[position] == 13 && buffer[position + 1] == 10 && buffer[position + 2] == 13 && buffer[position + 3] == 10 {
                return position
            }
            position += 1
        }
        return nil
    }

    /// Exactly `count` bytes.
    private mutating func take(_ count: Int) throws(PlainHTTPFailure) -> [UInt8] {
        while buffer.count - index < count { try fill(limit: count - (buffer.count - index)) }
        defer { index += count }
        return Array(buffer[index..<(index + count)])
    }

    /// One CRLF-terminated line (chunk sizes and trailers), at most 4 KiB.
    private mutating func line() throws(PlainHTTPFailure) -> [UInt8] {
        while true {
            if let end = buffer[index...].firstIndex(of: 10), end > index, buffer[end - 1] == 13 {
                defer { index = end + 1 }
                return Array(buffer[index..<(end - 1)])
            }
            guard buffer.count - index < 4096 else { throw .failed("a chunk line over 4096 bytes") }
            try fill(limit: 4096)
        }
    }

    private mutating func readChunked() throws(PlainHTTPFailure) -> [UInt8] {
        var body: [UInt8] = []
        while true {
            let sizeLine = try line()
            let digits = sizeLine.prefix { $0 != UInt8(ascii: ";") }
            guard let text = String(validating: digits, as: UTF8.self),
                  let size = Int(text.trimmingCharacters(in: .whitespaces), radix: 16), size >= 0 else {
                throw .failed("a bad chunk size")
            }
            if size == 0 {
                while !(try line()).isEmpty {} // trailers, ignored
                return body
            }
            guard size <= PlainHTTPClient.maximumBodyBytes - body.count else {
                throw .failed("an answer over \(PlainHTTPClient.maximumBodyBytes) bytes")
            }
            body.append(contentsOf: try take(size))
            guard try line().isEmpty else { throw .failed("a chunk without its CRLF") }
        }
    }

    /// The rest of the connection (a body without a length ends with it).
    private mutating func readToEnd() throws(PlainHTTPFailure) -> [UInt8] {
        while true {
            guard buffer.count - index <= PlainHTTPClient.maximumBodyBytes else {
                throw .failed("an answer over \(PlainHTTPClient.maximumBodyBytes) bytes")
            }
            if try receive(limit: PlainHTTPClient.maximumBodyBytes) == 0 {
                defer { index = buffer.count }
                return Array(buffer[index...])
            }
        }
    }
}
