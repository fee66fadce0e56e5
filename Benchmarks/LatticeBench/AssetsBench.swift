import Dispatch
import Foundation
import LatticeCore
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `lattice-bench assets`: asset uploads and downloads through `lattice serve` (SQLite) from several clients
/// at once, for each asset size, beside the disk's sequential write ceiling with `fsync` measured in the same
/// run; and the server's resident memory while the bytes stream (it must stay flat: no asset is held whole).
struct AssetsBenchOptions: Sendable {
    var sizes: [Int] = [1_000, 1_000_000, 50_000_000]
    var clients = 4
    /// Bytes each (size, direction) run moves in all, at least one asset per client.
    var bytesPerRun = 400_000_000
    /// Assets each client moves at most per run (the small sizes).
    var maximumAssetsPerClient = 500
    var ceilingMiB = 512
    var timeout = 1_200.0
    var jsonlPath: String?
    var help = false

    static let usage = """
        usage: lattice-bench assets [--sizes 1000,1000000,50000000] [--clients N] [--bytes-per-run N]
                                    [--max-assets-per-client N] [--ceiling-mib N] [--timeout S] [--jsonl FILE]

        Starts `lattice serve` (SQLite, its default) and measures, for each asset size:
          upload    --clients clients at once, each on its own connection and account, POST their assets'
                    bytes to upload URLs (assets/upload), streamed from a 256 KiB buffer (each asset's
                    first bytes unique, so nothing is deduplicated); MB/s over the wall time
          download  the same clients GET every asset back through its download URL, reading and dropping
                    the bytes; MB/s
        Each run moves --bytes-per-run bytes (at least one asset a client, at most
        --max-assets-per-client). Beside them, the disk's ceiling: --ceiling-mib MiB written in 1 MiB
        pieces to a file beside the server's data, then fsync, MB/s. The server's resident memory is
        sampled every 10 ms: idle before each run, and its peak during the run.

        options:
          --sizes LIST           asset sizes in bytes, comma-separated, each 1 to 52428800
          --clients N            clients at once, 1 to 64 (default 4)
          --bytes-per-run N      bytes per run (default 400000000)
          --max-assets-per-client N   (default 500)
          --ceiling-mib N        the ceiling's file size (default 512)
          --timeout S            the whole run is stopped, server included, after S seconds (default 1200)
          --jsonl FILE           also write every JSON line to FILE
          -h, --help             show this help and exit
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> AssetsBenchOptions {
        var options = AssetsBenchOptions()
        var scanner = OptionScanner(arguments)
        while scanner.next() {
            switch scanner.name {
            case "--sizes":
                let text = try scanner.value()
                let sizes = text.split(separator: ",").compactMap { Int($0) }
                guard !sizes.isEmpty, sizes.count == text.split(separator: ",").count,
                      sizes.allSatisfy({ (1...52_428_800).contains($0) }) else {
                    throw UsageError(message: "--sizes takes byte counts 1 to 52428800, comma-separated")
                }
                options.sizes = sizes
            case "--clients": options.clients = try scanner.integer(in: 1...64)
            case "--bytes-per-run": options.bytesPerRun = try scanner.integer(in: 1...100_000_000_000)
            case "--max-assets-per-client": options.maximumAssetsPerClient = try scanner.integer(in: 1...100_000)
            case "--ceiling-mib": options.ceilingMiB = try scanner.integer(in: 1...65_536)
            case "--timeout": options.timeout = try scanner.seconds()
            case "--jsonl": options.jsonlPath = try scanner.value()
            case "-h", "--help":
                try scanner.flag()
                options.help = true
            default: throw scanner.unknown()
            }
        }
        return options
    }

    var parametersJSON: JSONValue {
        .object(["sizes": .array(sizes.map { .int(Int64($0)) }), "clients": .int(Int64(clients)),
                 "bytes_per_run": .int(Int64(bytesPerRun)), "max_assets_per_client": .int(Int64(maximumAssetsPerClient)),
                 "ceiling_mib": .int(Int64(ceilingMiB))])
    }

    func assetsPerClient(size: Int) -> Int {
        max(1, min(maximumAssetsPerClient, bytesPerRun / max(1, size * clients)))
    }
}

enum AssetsBench {
    static let piece = 256 * 1024

    static func run(_ options: AssetsBenchOptions, argv: [String]) -> Int32 {
        guard var output = LineOutput.forCommand("assets", jsonl: options.jsonlPath) else { return 2 }
        defer { output.close() }
        let root = NSTemporaryDirectory() + "lattice-bench-assets-\(getpid())"
        guard let server = BenchServer.startScratch(
            command: "assets", root: root,
            extra: ["--requests-per-second-per-account", "0", "--quota-per-database", "1000000000000",
                    "--open-uploads-per-user", "100000", "--asset-max-mib", "50", "--disk-budget", "1000000000000"],
            timeout: options.timeout) else { return 1 }
        defer {
            server.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
        output.emit(server.headerLine(bench: "assets", argv: argv, parameters: options.parametersJSON))
        do {
            let port = UInt16(server.url.split(separator: ":").last.map(String.init) ?? "") ?? 0
            let api = FanoutBench.API(transport: try HTTPTransport(serverURL: server.url))
            output.emit(["kind": .string("ceiling"), "what": .string("sequential write then fsync, 1 MiB pieces"),
                         "mib": .int(Int64(options.ceilingMiB)),
                         "mb_per_s": SyncBench.rounded(try diskCeiling(directory: root, mib: options.ceilingMiB), 1)])
            let tokens = try (0..<options.clients).map { client -> String in
                let token = try api.signUp("client-\(client)")
                _ = try api.call("private", "zones/modify", .object(["operations": .array([.object([
                    "operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string("Files")])])])])]),
                                 token: token)
                return token
            }
            for size in options.sizes {
                let perClient = options.assetsPerClient(size: size)
                // Upload URLs first (not timed): 100 per request.
                let urls: [[String]] = try tokens.map { token in
                    var paths: [String] = []
                    while paths.count < perClient {
                        let batch = min(100, perClient - paths.count)
                        let answer = try api.call("private", "assets/upload", .object([
                            "zoneID": .object(["zoneName": .string("Files")]),
                            "tokens": .array((0..<batch).map { index in .object([
                                "recordType": .string("File"), "recordName": .string("s\(size)-\(paths.count + index)"),
                                "fieldName": .string("file")]) }),
                        ]), token: token)
                        paths += (answer["tokens"]?.arrayValue ?? []).compactMap { $0["url"]?.stringValue }.map(path)
                    }
                    return paths
                }
                let uploaded = try measure(output: &output, server: server, direction: "upload", size: size, options: options) { client in
                    try upload(port: port, paths: urls[client], size: size, client: client)
                }
                // Save each client's assets into records (not timed), then fetch their download URLs.
                let downloads: [[String]] = try tokens.enumerated().map { client, token in
                    var paths: [String] = []
                    let receipts = uploaded[client]
                    for start in stride(from: 0, to: receipts.count, by: 100) {
                        let slice = receipts[start..<min(start + 100, receipts.count)]
                        let names = slice.indices.map { "s\(size)-\($0)" }
                        _ = try api.call("private", "records/modify", .object([
                            "zoneID": .object(["zoneName": .string("Files")]),
                            "operations": .array(zip(names, slice).map { name, receipt in .object([
                                "operationType": .string("forceReplace"), "record": .object([
                                    "recordName": .string(name), "recordType": .string("File"),
                                    "fields": .object(["file": .object(["value": receipt, "type": .string("ASSETID")])])])]) }),
                            "desiredKeys": .array([]),
                        ]), token: token)
                        let looked = try api.call("private", "records/lookup", .object([
                            "zoneID": .object(["zoneName": .string("Files")]),
                            "records": .array(names.map { .object(["recordName": .string($0)]) })]), token: token)
                        paths += (looked["records"]?.arrayValue ?? []).compactMap {
                            $0["fields"]?["file"]?["value"]?["downloadURL"]?.stringValue
                        }.map { path($0).replacingOccurrences(of: "${f}", with: "file.bin") }
                    }
                    return paths
                }
                _ = try measure(output: &output, server: server, direction: "download", size: size, options: options) { client in
                    try download(port: port, paths: downloads[client], size: size)
                    return []
                }
            }
            return 0
        } catch {
            writeText(2, "lattice-bench assets: error: \(error)\n")
            return 1
        }
    }

    static func path(_ url: String) -> String {
        guard let scheme = url.range(of: "://"), let slash = url[scheme.upperBound...].firstIndex(of: "/") else { return url }
        return String(url[slash...])
    }

    /// Runs `work` on every client at once, samples the server's memory meanwhile, emits the run's line, and
    /// returns each client's results.
    static func measure(output: inout LineOutput, server: BenchServer, direction: String, size: Int,
                        options: AssetsBenchOptions, _ work: @escaping @Sendable (Int) throws -> [JSON]) throws -> [[JSON]] {
        Thread.sleep(forTimeInterval: 0.5)
        let idle = FanoutBench.residentKiB(server.pid) ?? 0
        let peak = Atomic<Int>(idle)
        let sampling = Atomic<Bool>(true)
        let sampler = Thread {
            while sampling.load(ordering: .relaxed) {
                if let now = FanoutBench.residentKiB(server.pid), now > peak.load(ordering: .relaxed) { peak.store(now, ordering: .relaxed) }
                usleep(10_000)
            }
        }
        sampler.start()
        let results = Mutex<[Int: Result<[JSON], any Error>]>([:])
        let group = DispatchGroup()
        let started = Date()
        for client in 0..<options.clients {
            group.enter()
            Thread {
                defer { group.leave() }
                let outcome = Result { try work(client) }
                results.withLock { $0[client] = outcome }
            }.start()
        }
        group.wait()
        let seconds = Date().timeIntervalSince(started)
        sampling.store(false, ordering: .relaxed)
        Thread.sleep(forTimeInterval: 0.05)
        let collected = try (0..<options.clients).map { client in try results.withLock { $0[client]! }.get() }
        let assets = options.assetsPerClient(size: size) * options.clients
        let bytes = Double(assets) * Double(size)
        output.emit(["kind": .string("assets"), "direction": .string(direction), "size_bytes": .int(Int64(size)),
                     "clients": .int(Int64(options.clients)), "assets": .int(Int64(assets)), "bytes": .int(Int64(bytes)),
                     "seconds": SyncBench.rounded(seconds, 3), "mb_per_s": SyncBench.rounded(bytes / seconds / 1e6, 1),
                     "assets_per_s": SyncBench.rounded(Double(assets) / seconds, 1),
                     "server_rss_idle_kib": .int(Int64(idle)), "server_rss_peak_kib": .int(Int64(peak.load(ordering: .relaxed))),
                     "server_rss_growth_kib": .int(Int64(peak.load(ordering: .relaxed) - idle))])
        return collected
    }

    /// The disk's ceiling: `mib` MiB written in 1 MiB pieces to a fresh file, then `fsync`; MB/s.
    static func diskCeiling(directory: String, mib: Int) throws -> Double {
        let file = directory + "/ceiling.bin"
        let fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard fd >= 0 else { throw SystemError.message("cannot create \(file)") }
        defer {
            close(fd)
            unlink(file)
        }
        var buffer = [UInt8](repeating: 0, count: 1 << 20)
        for index in buffer.indices { buffer[index] = UInt8(truncatingIfNeeded: index &* 2_654_435_761 >> 13) }
        let started = Date()
        for _ in 0..<mib {
            guard buffer.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == buffer.count else {
                throw SystemError.message("write to \(file) failed")
            }
        }
        guard fsync(fd) == 0 else { throw SystemError.message("fsync of \(file) failed") }
        return Double(mib << 20) / Date().timeIntervalSince(started) / 1e6
    }

    /// POSTs each asset's bytes to its upload path on one kept-alive connection, streamed from one buffer
    /// (the first 16 bytes name the client and asset); the receipts' asset dictionaries.
    static func upload(port: UInt16, paths: [String], size: Int, client: Int) throws -> [JSON] {
        let connection = try BenchConnection(port: port)
        var block = [UInt8](repeating: 0, count: piece)
        for index in block.indices { block[index] = UInt8(truncatingIfNeeded: (index &* 31) ^ (index >> 9)) }
        var receipts: [JSON] = []
        for (index, path) in paths.enumerated() {
            try connection.send(Array("POST \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: \(size)\r\n\r\n".utf8))
            var unique = [UInt8](repeating: 0, count: 16)
            withUnsafeBytes(of: UInt64(client).littleEndian) { unique.replaceSubrange(0..<8, with: $0) }
            withUnsafeBytes(of: UInt64(index).littleEndian) { unique.replaceSubrange(8..<16, with: $0) }
            var sent = 0
            while sent < size {
                let count = min(piece, size - sent)
                if sent == 0 {
                    let head = min(16, count)
                    block.replaceSubrange(0..<head, with: unique[0..<head])
                }
                try block.withUnsafeBytes { try connection.send(UnsafeRawBufferPointer(rebasing: $0[0..<count])) }
                sent += count
            }
            let (status, body) = try connection.readResponse(keepBody: true)
            guard status == 200, let receipt = try JSON.parse(body)["singleFile"] else {
                throw SystemError.message("upload: \(status) \(String(decoding: body.prefix(300), as: UTF8.self))")
            }
            receipts.append(receipt)
        }
        return receipts
    }

    /// GETs every download path on one kept-alive connection, reading the bytes in pieces and dropping them.
    static func download(port: UInt16, paths: [String], size: Int) throws {
        let connection = try BenchConnection(port: port)
        for path in paths {
            try connection.send(Array("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8))
            let (status, _) = try connection.readResponse(keepBody: false, expectedLength: size)
            guard status == 200 else { throw SystemError.message("download: \(status)") }
        }
    }
}

/// One blocking loopback connection of the bench: sends, and reads answers with a Content-Length, keeping
/// the body or only counting it (a 256 KiB buffer; never the whole asset).
final class BenchConnection {
    private let fd: Int32
    private var buffer = [UInt8](repeating: 0, count: 256 * 1024)
    private var pending: [UInt8] = []

    init(port: UInt16) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw SystemError.message("socket failed") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = port.bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(fd)
            throw SystemError.message("connect to 127.0.0.1:\(port) failed")
        }
        // The head and the body go out in separate writes: without this, Nagle's algorithm holds the second
        // until the first is acknowledged (a delayed ACK: 40 ms per small asset).
        var noDelay: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &noDelay, socklen_t(MemoryLayout<Int32>.size))
        var timeout = timeval(tv_sec: 60, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(fd) }

    func send(_ bytes: [UInt8]) throws { try bytes.withUnsafeBytes { try send($0) } }

    func send(_ bytes: UnsafeRawBufferPointer) throws {
        var done = 0
        while done < bytes.count {
            let count = Glibc.send(fd, bytes.baseAddress! + done, bytes.count - done, Int32(MSG_NOSIGNAL))
            if count < 0 && errno == EINTR { continue }
            guard count > 0 else { throw SystemError.message("send failed: \(String(cString: strerror(errno)))") }
            done += count
        }
    }

    private func fill() throws {
        let count = buffer.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        guard count > 0 else { throw SystemError.message("the server closed the connection or timed out") }
        pending.append(contentsOf: buffer[0..<count])
    }

    /// The status and (when `keepBody`) the body of the next answer.
    func readResponse(keepBody: Bool, expectedLength: Int? = nil) throws -> (Int, [UInt8]) {
        let marker: [UInt8] = [13, 10, 13, 10]
        var end: Int?
        while end == nil {
            if pending.count >= 4 {
                for index in 0...(pending.count - 4) where pending[index..<(index + 4)].elementsEqual(marker) {
                    end = index
                    break
                }
            }
            if end == nil { try fill() }
        }
        let head = String(decoding: pending[0..<end!], as: UTF8.self)
        pending.removeFirst(end! + 4)
        let lines = head.split(separator: "\r\n")
        let status = Int(lines.first?.split(separator: " ").dropFirst().first ?? "") ?? 0
        var length = 0
        for line in lines.dropFirst() where line.lowercased().hasPrefix("content-length:") {
            length = Int(line.split(separator: ":")[1].trimmingCharacters(in: .whitespaces)) ?? 0
        }
        if let expectedLength, status == 200, length != expectedLength {
            throw SystemError.message("an answer of \(length) bytes, not \(expectedLength)")
        }
        var body: [UInt8] = []
        var left = length
        while left > 0 {
            if pending.isEmpty { try fill() }
            let take = min(left, pending.count)
            if keepBody { body.append(contentsOf: pending[0..<take]) }
            pending.removeFirst(take)
            left -= take
        }
        return (status, body)
    }
}
