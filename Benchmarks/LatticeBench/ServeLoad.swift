// `lattice-bench serve`: request rate and latency of the real server (libmicrohttpd + SQLite with
// synchronous=FULL) under many concurrent clients on 127.0.0.1, as one JSON line.

import Foundation
import LatticeCore
import LatticeOperations
import LatticeServer
import LatticeStore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

struct ServeLoadOptions {
    var clients = 32
    var users = 4
    var seconds = 10.0
    var help = false

    static let usage = """
        usage: lattice-bench serve [--clients N] [--users U] [--seconds S]

        Starts the Lattice server in-process on 127.0.0.1 (a free port, a fresh SQLite data directory
        in WAL mode with synchronous=FULL) and runs N clients (default 32), spread over U accounts
        (default 4), each sending records/modify requests back to back on a keep-alive connection for
        S seconds (default 10). Each request updates two records: one shared by the clients of an
        account, one of the client's own, with one field and one list add each. Prints one JSON line:
        requests, requests_per_s, p50/p90/p99/max latency in ms, failures.
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> ServeLoadOptions {
        var options = ServeLoadOptions()
        var index = 0
        func value(_ name: String) throws(UsageError) -> String {
            index += 1
            guard index < arguments.count else { throw UsageError(message: "\(name) needs a value") }
            return arguments[index]
        }
        while index < arguments.count {
            let argument = arguments[index]
            switch argument {
            case "--clients":
                guard let n = Int(try value(argument)), (1...256).contains(n) else {
                    throw UsageError(message: "--clients must be 1 to 256")
                }
                options.clients = n
            case "--users":
                guard let n = Int(try value(argument)), (1...256).contains(n) else {
                    throw UsageError(message: "--users must be 1 to 256")
                }
                options.users = n
            case "--seconds":
                guard let s = Double(try value(argument)), s > 0, s <= 3600 else {
                    throw UsageError(message: "--seconds must be more than 0 and at most 3600")
                }
                options.seconds = s
            case "-h", "--help":
                options.help = true
            default:
                throw UsageError(message: "unknown option \(argument)")
            }
            index += 1
        }
        guard options.users <= options.clients else { throw UsageError(message: "--users must not exceed --clients") }
        return options
    }
}

enum ServeLoad {
    static func run(_ options: ServeLoadOptions) -> Int32 {
        printOneLine("serve") { try withScratchService("serve") { service, _ in try measure(options, service) } }
    }

    private static func measure(_ options: ServeLoadOptions, _ service: LatticeService) throws -> [String: JSONValue] {
        let server = try HTTPServer(handler: service, configuration: HTTPServerConfiguration(port: 0))
        defer { server.shutdown() }
        let port = server.port

        let tokens = try (0..<options.users).map { try service.createAccount(name: "load\($0)").token.text }
        for (user, token) in tokens.enumerated() {
            let client = try LoadClient(port: port)
            _ = try client.post("/database/1/lattice/production/private/zones/modify", token: token,
                                body: Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Load"}}}]}"#.utf8))
            let names = (0..<8).map { "shared-\($0)" }
                + stride(from: user, to: options.clients, by: options.users).flatMap { c in (0..<20).map { "c\(c)-\($0)" } }
            for chunk in stride(from: 0, to: names.count, by: 200) {
                let operations: [JSON] = names[chunk..<min(chunk + 200, names.count)].map { name in
                    .object(["operationType": .string("create"),
                             "record": .object(["recordName": .string(name), "recordType": .string("Item")])])
                }
                let status = try client.post("/database/1/lattice/production/private/records/modify", token: token,
                                             body: JSON.object(["zoneID": .object(["zoneName": .string("Load")]),
                                                                "operations": .array(operations)]).serializedBytes())
                guard status == 200 else { throw LoadClient.Failure("setup failed with HTTP \(status)") }
            }
        }

        let latencies = Mutex<[Double]>([])
        let failures = Atomic<Int>(0)
        let group = DispatchGroup()
        let start = monotonicNanoseconds()
        let end = start + UInt64(options.seconds * 1e9)
        for index in 0..<options.clients {
            group.enter()
            let token = tokens[index % tokens.count]
            let thread = Thread {
                defer { group.leave() }
                var mine: [Double] = []
                do {
                    let client = try LoadClient(port: port)
                    var iteration = 0
                    while monotonicNanoseconds() < end {
                        let operations: [JSON] = ["shared-\(iteration % 8)", "c\(index)-\(iteration % 20)"].map { name in
                            .object(["operationType": .string("forceUpdate"), "record": .object([
                                "recordName": .string(name),
                                "fields": .object([
                                    "f\(index)": .object(["value": .int(Int64(iteration))]),
                                    "tags": .object(["add": .array([.string("t\(index)-\(iteration)")])]),
                                ]),
                            ])])
                        }
                        let body = JSON.object(["zoneID": .object(["zoneName": .string("Load")]),
                                                "operations": .array(operations)]).serializedBytes()
                        let began = monotonicNanoseconds()
                        let status = try client.post("/database/1/lattice/production/private/records/modify",
                                                     token: token, body: body)
                        mine.append(Double(monotonicNanoseconds() - began) / 1e6)
                        if status != 200 { failures.add(1, ordering: .relaxed) }
                        iteration += 1
                    }
                } catch {
                    failures.add(1, ordering: .relaxed)
                }
                latencies.withLock { $0 += mine }
            }
            thread.start()
        }
        group.wait()
        let elapsed = Double(monotonicNanoseconds() - start) / 1e9
        let sorted = latencies.withLock { $0 }.sorted()
        func percentile(_ p: Double) -> Double {
            sorted.isEmpty ? 0 : sorted[min(sorted.count - 1, Int(Double(sorted.count) * p))]
        }
        func rounded(_ value: Double) -> JSONValue { .double((value * 100).rounded() / 100) }
        return [
            "kind": .string("serve_load"),
            "endpoint": .string("records/modify"),
            "clients": .integer(options.clients),
            "users": .integer(options.users),
            "seconds": rounded(elapsed),
            "requests": .integer(sorted.count),
            "requests_per_s": rounded(Double(sorted.count) / elapsed),
            "p50_ms": rounded(percentile(0.50)),
            "p90_ms": rounded(percentile(0.90)),
            "p99_ms": rounded(percentile(0.99)),
            "max_ms": rounded(sorted.last ?? 0),
            "failures": .integer(failures.load(ordering: .relaxed)),
            "threads": .integer(ProcessInfo.processInfo.activeProcessorCount),
        ]
    }
}

/// A minimal keep-alive HTTP/1.1 client for the load: POST with a bearer token, read the status line,
/// headers and a Content-Length body (what the Lattice server sends).
final class LoadClient {
    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    private let descriptor: Int32
    private var buffer: [UInt8] = []

    init(port: UInt16) throws {
        descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard descriptor >= 0 else { throw Failure("socket failed") }
        var noDelay: Int32 = 1
        setsockopt(descriptor, Int32(IPPROTO_TCP), TCP_NODELAY, &noDelay, socklen_t(MemoryLayout<Int32>.size))
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard result == 0 else {
            close(descriptor)
            throw Failure("connect to 127.0.0.1:\(port) failed")
        }
    }

    deinit { close(descriptor) }

    /// Sends a POST and returns the response status (the body is read and dropped).
    func post(_ path: String, token: String, body: [UInt8]) throws -> Int {
        let head = "POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer \(token)\r\n"
            + "Content-Type: application/json\r\nContent-Length: \(body.count)\r\n\r\n"
        let request = Array(head.utf8) + body
        try request.withUnsafeBytes { try writeAll(descriptor, $0, what: "request") }
        // Headers.
        var headerEnd: Int?
        while headerEnd == nil {
            headerEnd = buffer.indices.dropLast(3).first { buffer[$0] == 13 && buffer[$0 + 1] == 10 && buffer[$0 + 2] == 13 && buffer[$0 + 3] == 10 }
            if headerEnd == nil { try fill() }
        }
        let head2 = String(decoding: buffer[..<headerEnd!], as: UTF8.self)
        let lines = head2.split(separator: "\r\n")
        guard let statusLine = lines.first, let status = Int(statusLine.split(separator: " ").dropFirst().first ?? "") else {
            throw Failure("bad status line")
        }
        var length = 0
        for line in lines.dropFirst() where line.lowercased().hasPrefix("content-length:") {
            length = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) ?? 0
        }
        let bodyStart = headerEnd! + 4
        while buffer.count < bodyStart + length { try fill() }
        buffer.removeFirst(bodyStart + length)
        return status
    }

    private func fill() throws {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        guard count > 0 else { throw Failure("connection closed") }
        buffer += chunk[..<count]
    }
}

/// Runs `body` with an in-process service on a fresh SQLite file in a temporary directory (removed after;
/// `body` may put scratch files there too),
/// with the server's default configuration but no rate limit, for the in-process benchmarks.
func withScratchService<T>(_ label: String, _ body: (LatticeService, _ directory: String) throws -> T) throws -> T {
    let directory = NSTemporaryDirectory() + "lattice-bench-\(label)-\(getpid())"
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    defer { try? FileManager.default.removeItem(atPath: directory) }
    let storage = try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
    defer { storage.close() }
    var configuration = ServiceConfiguration()
    configuration.rateLimit = nil
    return try body(try LatticeService(storage: storage, configuration: configuration), directory)
}
