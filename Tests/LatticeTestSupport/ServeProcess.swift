import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// Real processes for the test targets that start them: the `lattice` executable, a running `lattice serve`,
// throwaway directories and the tests' plain error.

/// A fresh directory under the system's temporary directory.
public func temporaryDirectory(_ label: String = "lattice-server") -> String {
    let path = NSTemporaryDirectory() + "\(label)-\(UUID().uuidString)"
    try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    return path
}

/// A test's own failure, with its text.
public struct HarnessError: Error, CustomStringConvertible {
    public let description: String
    public init(_ description: String) { self.description = description }
}

/// The `lattice` executable next to the test bundle (`swift build --build-tests` builds both), or
/// `$LATTICE_BIN`.
public var latticeBinary: String {
    if let path = ProcessInfo.processInfo.environment["LATTICE_BIN"] { return path }
    let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
    var directory = executable.deletingLastPathComponent()
    // The test binary sits inside LatticePackageTests.xctest on some layouts.
    if directory.lastPathComponent.hasSuffix(".xctest") { directory = directory.deletingLastPathComponent() }
    return directory.appendingPathComponent("lattice").path
}

/// What a process wrote to a pipe, collected by a reader thread.
public final class CollectedOutput: Sendable {
    public let state = Mutex<(bytes: Data, ended: Bool)>((Data(), false))
    public init() {}
}

/// Reads `lattice serve`'s first line, "listening on http://127.0.0.1:PORT", and returns the port.
/// `exited` says what to add when the process ended before printing it (say, its log's tail).
public func listeningPort(from handle: FileHandle, exited: () -> String) throws -> UInt16 {
    var line = [UInt8]()
    while true {
        let byte = handle.readData(ofLength: 1)
        guard let first = byte.first else { throw HarnessError("lattice serve exited before listening" + exited()) }
        if first == UInt8(ascii: "\n") { break }
        line.append(first)
    }
    let text = String(decoding: line, as: UTF8.self)
    guard text.hasPrefix("listening on http://127.0.0.1:"), let port = UInt16(text.split(separator: ":").last ?? "") else {
        throw HarnessError("unexpected first line: \(text)")
    }
    return port
}

/// A running `lattice serve` process.
public final class ServerUnderTest {
    public let process = Process()
    public let port: UInt16
    private let errors = Pipe()
    private let collected = CollectedOutput()

    /// `lattice serve` on the data directory `data` (on PostgreSQL: the database made for it, see
    /// `TestBackend`), on a free port.
    public convenience init(data: String, extra: [String] = []) throws {
        try self.init(arguments: try TestBackend.serveArguments(data: data) + ["--port", "0"] + extra)
    }

    /// `lattice serve ARGUMENTS`; they must bind 127.0.0.1 (the default host).
    public init(arguments: [String], environment: [String: String]? = nil) throws {
        process.executableURL = URL(fileURLWithPath: latticeBinary)
        process.arguments = ["serve"] + arguments
        if let environment { process.environment = environment }
        let output = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        // Drain stderr all along (the access log writes a line per request there): a full pipe would
        // block the server.
        let errorHandle = errors.fileHandleForReading
        let collected = self.collected
        Thread {
            while true {
                let data = errorHandle.availableData
                if data.isEmpty { break }
                collected.state.withLock { $0.bytes += data }
            }
            collected.state.withLock { $0.ended = true }
        }.start()
        let collectedErrors = self.collected
        port = try listeningPort(from: output.fileHandleForReading) {
            Thread.sleep(forTimeInterval: 0.2)
            return ": " + String(decoding: collectedErrors.state.withLock { $0.bytes }.suffix(2000), as: UTF8.self)
        }
    }

    public var pid: Int32 { process.processIdentifier }

    public func kill(_ signal: Int32) {
        Glibc.kill(process.processIdentifier, signal)
        process.waitUntilExit()
    }

    /// Everything the server wrote to stderr so far (all of it, once the process has exited).
    public var standardError: String {
        if !process.isRunning {
            for _ in 0..<200 where !collected.state.withLock({ $0.ended }) { Thread.sleep(forTimeInterval: 0.01) }
        }
        return String(decoding: collected.state.withLock { $0.bytes }, as: UTF8.self)
    }
}

/// A `lattice serve --database` node, stderr collected all along (a full pipe would block it).
public final class ServeNode {
    public let process = Process()
    public let port: UInt16
    private let errors = Pipe()
    private let collected = CollectedOutput()

    public init(database: String, name: String, port: UInt16, publicURL: String) throws {
        process.executableURL = URL(fileURLWithPath: latticeBinary)
        process.arguments = ["serve", "--database", database, "--node-name", name, "--port", String(port),
                             "--public-url", publicURL, "--database-pool", "4"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let handle = errors.fileHandleForReading
        let collected = self.collected
        Thread {
            while true {
                let data = handle.availableData
                if data.isEmpty { break }
                collected.state.withLock { $0.bytes += data }
            }
            collected.state.withLock { $0.ended = true }
        }.start()
        self.port = try listeningPort(from: output.fileHandleForReading) {
            "\n" + String(decoding: collected.state.withLock { $0.bytes }, as: UTF8.self)
        }
    }

    public var url: String { "http://127.0.0.1:\(port)" }

    public func stop() {
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
    }
}
