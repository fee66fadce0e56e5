// Pieces of `lattice-bench soak`: a small keep-alive HTTP/1.1 client over a POSIX socket (lighter than
// URLSession, so 32 clients on a small machine measure the server, not the client), per-interval statistics
// per operation kind, and the server's counters read from /proc.

import Foundation
import LatticeCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// One keep-alive connection to 127.0.0.1:`port`; every read and write has a timeout. Not thread-safe.
final class SoakConnection {
    struct Answer {
        var status: Int
        var body: [UInt8]
    }

    private let port: UInt16
    private let timeoutSeconds: Double
    private var fd: Int32 = -1
    private var buffer: [UInt8] = []
    private var start = 0

    init(port: UInt16, timeoutSeconds: Double) {
        self.port = port
        self.timeoutSeconds = timeoutSeconds
    }

    deinit { close() }

    func close() {
        if fd >= 0 { Glibc.close(fd); fd = -1 }
        buffer = []
        start = 0
    }

    private func connectIfNeeded() throws {
        guard fd < 0 else { return }
        let socketFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard socketFD >= 0 else { throw SystemError.posix("socket", errno) }
        var timeout = timeval(tv_sec: Int(timeoutSeconds), tv_usec: Int((timeoutSeconds - timeoutSeconds.rounded(.down)) * 1e6))
        setsockopt(socketFD, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(socketFD, SOL_SOCKET, SO_SNDTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var one: Int32 = 1
        setsockopt(socketFD, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socketFD, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            let code = errno
            Glibc.close(socketFD)
            throw SystemError.posix("connect to 127.0.0.1:\(port)", code)
        }
        fd = socketFD
    }

    /// POSTs `body` to `path` (with `token`) and reads the answer. A failure closes the connection (the next
    /// call opens a new one) and throws.
    func post(_ path: String, token: String?, body: [UInt8]) throws -> Answer {
        do {
            try connectIfNeeded()
            var head = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Type: application/json\r\n"
                + "Content-Length: \(body.count)\r\n"
            if let token { head += "Authorization: Bearer \(token)\r\n" }
            head += "\r\n"
            try write(Array(head.utf8) + body)
            return try readAnswer()
        } catch {
            close()
            throw error
        }
    }

    private func write(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let sent = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if sent < 0 {
                if errno == EINTR { continue }
                throw SystemError.posix("send", errno)
            }
            offset += sent
        }
    }

    private func fill() throws {
        if start > 1 << 20 {
            buffer.removeFirst(start)
            start = 0
        }
        var chunk = [UInt8](repeating: 0, count: 64 * 1024)
        while true {
            let count = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if count > 0 {
                buffer += chunk[..<count]
                return
            }
            if count == 0 { throw SystemError.message("the server closed the connection") }
            if errno == EINTR { continue }
            throw SystemError.posix(errno == EAGAIN ? "recv (timed out)" : "recv", errno)
        }
    }

    private func line() throws -> String {
        while true {
            if let end = buffer[start...].firstIndex(of: 10) {
                var bytes = buffer[start..<end]
                if bytes.last == 13 { bytes = bytes.dropLast() }
                start = end + 1
                return String(decoding: bytes, as: UTF8.self)
            }
            try fill()
        }
    }

    private func readAnswer() throws -> Answer {
        while true {
            let statusLine = try line()
            let parts = statusLine.split(separator: " ", maxSplits: 2)
            guard parts.count >= 2, let status = Int(parts[1]) else {
                throw SystemError.message("not an HTTP status line: \(statusLine.prefix(60))")
            }
            var length = 0
            var chunked = false
            var closeAfter = false
            while true {
                let header = try line()
                if header.isEmpty { break }
                let lower = header.lowercased()
                if lower.hasPrefix("content-length:") { length = Int(lower.dropFirst(15).trimmingCharacters(in: .whitespaces)) ?? 0 }
                if lower.hasPrefix("transfer-encoding:") && lower.contains("chunked") { chunked = true }
                if lower.hasPrefix("connection:") && lower.contains("close") { closeAfter = true }
            }
            if (100..<200).contains(status) { continue }
            var body: [UInt8] = []
            if chunked {
                while true {
                    guard let size = Int(try line().split(separator: ";").first.map(String.init) ?? "", radix: 16) else {
                        throw SystemError.message("bad chunk size")
                    }
                    if size == 0 {
                        while try !line().isEmpty {}
                        break
                    }
                    body += try take(size)
                    _ = try line()
                }
            } else {
                body = try take(length)
            }
            if closeAfter { close() }
            return Answer(status: status, body: body)
        }
    }

    private func take(_ count: Int) throws -> [UInt8] {
        while buffer.count - start < count { try fill() }
        defer { start += count }
        return Array(buffer[start..<start + count])
    }
}

/// Latencies and errors per operation kind for the current interval, and totals since the start.
final class SoakStats: Sendable {
    struct Interval {
        var latencies: [String: [Double]] = [:]
        var errors: [String: Int] = [:]
        /// Error kinds seen ("records/modify 429 THROTTLED", "changes/zone transport: ..."), for the line.
        var errorKinds: [String: Int] = [:]
    }

    private struct State {
        var interval = Interval()
        var requests = 0
        var errors = 0
    }

    /// The interval and the totals under one lock, so an interval line's totals match its interval.
    private let state = Mutex(State())
    /// Set to end the clients early (they stop at their end time anyway).
    let stopping = Atomic<Bool>(false)

    func record(_ kind: String, seconds: Double, error: String?) {
        state.withLock {
            $0.interval.latencies[kind, default: []].append(seconds)
            $0.requests += 1
            if let error {
                $0.errors += 1
                $0.interval.errors[kind, default: 0] += 1
                if $0.interval.errorKinds.count < 50 || $0.interval.errorKinds[error] != nil {
                    $0.interval.errorKinds[error, default: 0] += 1
                }
            }
        }
    }

    /// The interval so far with the totals at that moment; the next interval starts empty.
    func take() -> (interval: Interval, requests: Int, errors: Int) {
        state.withLock {
            let taken = ($0.interval, $0.requests, $0.errors)
            $0.interval = Interval()
            return taken
        }
    }

    var total: (requests: Int, errors: Int) { state.withLock { ($0.requests, $0.errors) } }
}

/// Counters of the server process from /proc.
enum ServerCounters {
    /// Entries in /proc/PID/fd, and how many of them are sockets (the listening one included).
    static func descriptors(pid: pid_t) -> (open: Int, sockets: Int) {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd") else { return (-1, -1) }
        var sockets = 0
        var target = [CChar](repeating: 0, count: 256)
        let prefix = Array("socket:".utf8).map { CChar(bitPattern: $0) }
        for entry in entries {
            let count = readlink("/proc/\(pid)/fd/\(entry)", &target, target.count - 1)
            if count >= prefix.count && Array(target[0..<prefix.count]) == prefix { sockets += 1 }
        }
        return (entries.count, sockets)
    }

    /// TCP connections to 127.0.0.1:`port` in state ESTABLISHED, from /proc/net/tcp (both directions are
    /// listed there; only the server's side, local port = `port`, is counted).
    static func establishedConnections(port: UInt16) -> Int {
        // Read to the end: /proc files report no size, and a one-page read sees only the first connections.
        guard let bytes = try? readWholeFile("/proc/net/tcp") else { return -1 }
        let text = String(decoding: bytes, as: UTF8.self)
        let local = String(format: ":%04X", port)
        var count = 0
        for line in text.split(separator: "\n").dropFirst() {
            let fields = line.split(separator: " ")
            guard fields.count > 3 else { continue }
            if fields[1].hasSuffix(local) && fields[3] == "01" { count += 1 }
        }
        return count
    }

    /// Bytes of the files in `directory` (the database, its WAL and shared memory, the key ring).
    static func directoryBytes(_ directory: String) -> Int {
        guard let entries = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return -1 }
        var total = 0
        for entry in entries {
            var info = stat()
            if stat(directory + "/" + entry, &info) == 0 && (info.st_mode & S_IFMT) == S_IFREG { total += Int(info.st_size) }
        }
        return total
    }
}
