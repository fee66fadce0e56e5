import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A tiny blocking HTTP/1.1 client over one POSIX socket to 127.0.0.1, for tests against a real server.
///
/// Keep-alive: one client sends requests one after another on its connection. Every read has a timeout
/// (`SO_RCVTIMEO`), so a test fails instead of hanging. Not thread-safe: use one client per thread.
///
/// ```swift
/// let client = try RawHTTPClient(port: server.port)
/// let response = try client.send(method: "GET", path: "/health")
/// #expect(response.status == 200)
/// ```
public final class RawHTTPClient {
    public typealias Response = (status: Int, headers: [String: String], body: [UInt8])

    public struct Failure: Error, CustomStringConvertible {
        public let description: String

        public init(_ description: String) {
            self.description = description
        }

        /// A failed system call, with `errno` spelled out.
        public static func system(_ call: String, _ code: Int32 = errno) -> Failure {
            Failure("\(call) failed: \(String(cString: strerror(code))) (errno \(code))")
        }
    }

    public let port: UInt16
    private var descriptor: Int32
    /// Bytes received and not yet consumed, from `readIndex` on.
    private var received: [UInt8] = []
    private var readIndex = 0

    /// Connects to 127.0.0.1:`port`, from `source` (another loopback address such as 127.0.0.2) when
    /// given. Throws when the connection is refused or does not open in time.
    public init(port: UInt16, timeoutSeconds: Double = 10, source: String? = nil) throws {
        self.port = port
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure.system("socket") }
        let wholeSeconds = timeoutSeconds.rounded(.down)
        var timeout = timeval(tv_sec: Int(wholeSeconds), tv_usec: Int((timeoutSeconds - wholeSeconds) * 1_000_000))
        let timeoutSize = socklen_t(MemoryLayout<timeval>.size)
        setsockopt(descriptor, SOL_SOCKET, SO_RCVTIMEO, &timeout, timeoutSize)
        setsockopt(descriptor, SOL_SOCKET, SO_SNDTIMEO, &timeout, timeoutSize)
        var noDelay: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &noDelay, socklen_t(MemoryLayout<Int32>.size))

        if let source {
            var local = sockaddr_in()
            local.sin_family = sa_family_t(AF_INET)
            inet_pton(AF_INET, source, &local.sin_addr)
            let bound = withUnsafePointer(to: &local) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bind(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
                }
            }
            guard bound == 0 else {
                let failure = Failure.system("bind to \(source)")
                Glibc.close(descriptor)
                descriptor = -1
                throw failure
            }
        }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        guard connected == 0 else {
            let failure = Failure.system("connect to 127.0.0.1:\(port)")
            Glibc.close(descriptor)
            descriptor = -1
            throw failure
        }
    }

    deinit {
        close()
    }

    public func close() {
        if descriptor >= 0 {
            Glibc.close(descriptor)
            descriptor = -1
        }
    }

    /// Sends one request and reads its response. Adds `Host`, and `Content-Length` when there is a body and
    /// no `Transfer-Encoding` header (with one, `body` goes out as is: see `chunked(_:)`). Response header
    /// names are lowercased; repeated ones are joined with ", ".
    public func send(method: String, path: String, headers: [String: String] = [:], body: [UInt8] = []) throws -> Response {
        var head = "\(method) \(path) HTTP/1.1\r\n"
        let names = Set(headers.keys.map { $0.lowercased() })
        if !names.contains("host") { head += "Host: 127.0.0.1:\(port)\r\n" }
        if !names.contains("content-length") && !names.contains("transfer-encoding")
            && (!body.isEmpty || method == "POST" || method == "PUT") {
            head += "Content-Length: \(body.count)\r\n"
        }
        for (name, value) in headers.sorted(by: { $0.key < $1.key }) { head += "\(name): \(value)\r\n" }
        head += "\r\n"
        do {
            try write(Array(head.utf8) + body)
        } catch {
            // The server may have answered early (say, a body over its cap) and closed: read that answer.
            if let response = try? readResponse(method: method) { return response }
            throw error
        }
        return try readResponse(method: method)
    }

    /// Sends `bytes` as they are, then reads until the server closes the connection or the read times out.
    public func sendRaw(_ bytes: [UInt8]) throws -> [UInt8] {
        try write(bytes)
        return try readUntilClose().bytes
    }

    /// Writes all of `bytes`.
    public func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes {
                Glibc.send(descriptor, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL))
            }
            if sent < 0 {
                if errno == EINTR { continue }
                throw Failure.system("send")
            }
            offset += sent
        }
    }

    /// Reads one response (skipping interim 1xx ones), its body sized by Content-Length, chunked encoding, or
    /// the end of the connection.
    public func readResponse(method: String = "GET") throws -> Response {
        while true {
            let statusLine = try readLine()
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
                throw Failure("not an HTTP status line: \(statusLine.debugDescription)")
            }
            var headers: [String: String] = [:]
            while true {
                let line = try readLine()
                if line.isEmpty { break }
                guard let colon = line.firstIndex(of: ":") else {
                    throw Failure("bad header line: \(line.debugDescription)")
                }
                let name = line[..<colon].lowercased()
                let value = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                headers[name] = headers[name].map { $0 + ", " + value } ?? value
            }
            if (100..<200).contains(status) && status != 101 { continue }

            if method == "HEAD" || status == 204 || status == 304 || (100..<200).contains(status) {
                return (status, headers, [])
            }
            if headers["transfer-encoding"]?.lowercased().contains("chunked") == true {
                return (status, headers, try readChunkedBody())
            }
            if let lengthText = headers["content-length"] {
                guard let length = Int(lengthText), length >= 0 else {
                    throw Failure("bad Content-Length \(lengthText)")
                }
                return (status, headers, try readExactly(length))
            }
            return (status, headers, try readUntilClose().bytes)
        }
    }

    /// Reads until the server closes the connection (`closed`) or a read times out (not `closed`).
    public func readUntilClose() throws -> (bytes: [UInt8], closed: Bool) {
        while true {
            switch try fill() {
            case .data: continue
            case .closed:
                defer { consumeAll() }
                return (Array(received[readIndex...]), true)
            case .timedOut:
                defer { consumeAll() }
                return (Array(received[readIndex...]), false)
            }
        }
    }

    /// Reads until `marker` arrives (what came up to its end is answered and consumed), the server closes the
    /// connection, a read times out (the client's timeout), or `seconds` pass in all (a stream that keeps
    /// sending something else). For a streamed answer (server-sent events).
    public func readUntil(_ marker: String, within seconds: Double = 15) throws -> (text: String, found: Bool, closed: Bool) {
        let needle = Array(marker.utf8)
        let deadline = Date().addingTimeInterval(seconds)
        while true {
            if Date() > deadline {
                defer { consumeAll() }
                return (String(decoding: received[readIndex...], as: UTF8.self), false, false)
            }
            let pending = received[readIndex...]
            if let range = Self.firstRange(of: needle, in: pending) {
                let text = String(decoding: received[readIndex..<range.upperBound], as: UTF8.self)
                readIndex = range.upperBound
                return (text, true, false)
            }
            switch try fill() {
            case .data: continue
            case .closed:
                defer { consumeAll() }
                return (String(decoding: received[readIndex...], as: UTF8.self), false, true)
            case .timedOut:
                defer { consumeAll() }
                return (String(decoding: received[readIndex...], as: UTF8.self), false, false)
            }
        }
    }

    private static func firstRange(of needle: [UInt8], in haystack: ArraySlice<UInt8>) -> Range<Int>? {
        guard !needle.isEmpty, haystack.count >= needle.count else { return nil }
        var start = haystack.startIndex
        while start + needle.count <= haystack.endIndex {
            if haystack[start..<(start + needle.count)].elementsEqual(needle) { return start..<(start + needle.count) }
            start += 1
        }
        return nil
    }

    /// `chunks` in chunked transfer encoding, with the final empty chunk.
    public static func chunked(_ chunks: [[UInt8]]) -> [UInt8] {
        var encoded: [UInt8] = []
        for chunk in chunks where !chunk.isEmpty {
            encoded += Array((String(chunk.count, radix: 16) + "\r\n").utf8) + chunk + [13, 10]
        }
        return encoded + Array("0\r\n\r\n".utf8)
    }

    /// True if nothing arrives (no bytes, no close) within `seconds`: the request sent is still pending.
    public func staysQuiet(for seconds: Double) -> Bool {
        if readIndex < received.count { return false }
        var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
        while true {
            let ready = poll(&entry, 1, Int32(seconds * 1000))
            if ready < 0 && errno == EINTR { continue }
            return ready == 0
        }
    }

    // MARK: Reading

    private enum FillResult { case data, closed, timedOut }

    /// One `recv` into the buffer.
    private func fill() throws -> FillResult {
        if readIndex > 64 * 1024 {
            received.removeFirst(readIndex)
            readIndex = 0
        }
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(descriptor, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                received += chunk[..<count]
                return .data
            }
            if count == 0 { return .closed }
            switch errno {
            case EINTR: continue
            case EAGAIN, EWOULDBLOCK: return .timedOut
            case ECONNRESET: return .closed
            default: throw Failure.system("recv")
            }
        }
    }

    private func fillOrThrow(_ what: String) throws {
        switch try fill() {
        case .data: return
        case .closed: throw Failure("connection closed while reading \(what)")
        case .timedOut: throw Failure("timed out reading \(what)")
        }
    }

    private func consumeAll() {
        received = []
        readIndex = 0
    }

    private func readLine() throws -> String {
        while true {
            if let end = received[readIndex...].firstIndex(of: 10) {
                var line = received[readIndex..<end]
                if line.last == 13 { line = line.dropLast() }
                readIndex = end + 1
                return String(decoding: line, as: UTF8.self)
            }
            try fillOrThrow("a line")
        }
    }

    private func readExactly(_ count: Int) throws -> [UInt8] {
        while received.count - readIndex < count { try fillOrThrow("a body of \(count) bytes") }
        defer { readIndex += count }
        return Array(received[readIndex..<readIndex + count])
    }

    private func readChunkedBody() throws -> [UInt8] {
        var body: [UInt8] = []
        while true {
            let sizeLine = try readLine()
            let sizeText = sizeLine.split(separator: ";", maxSplits: 1).first.map(String.init) ?? ""
            guard let size = Int(sizeText.trimmingCharacters(in: .whitespaces), radix: 16), size >= 0 else {
                throw Failure("bad chunk size line: \(sizeLine.debugDescription)")
            }
            if size == 0 {
                while try !readLine().isEmpty {}  // trailers
                return body
            }
            body += try readExactly(size)
            guard try readLine().isEmpty else { throw Failure("chunk not followed by CRLF") }
        }
    }
}
