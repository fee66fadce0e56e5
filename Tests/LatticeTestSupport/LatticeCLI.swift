import Foundation
import LatticeCore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The `lattice` client commands as people run them: the real binary, each home (device) in its own
/// directory. The CLI tests use it as `CLITests.ok(...)`; the other test targets that run the binary say
/// `CLITests` for it too (a typealias in their Support folder).
public enum LatticeCLI {
    /// Everything a reader thread got from a pipe.
    public final class PipeReader: Sendable {
        private let bytes = Mutex<[UInt8]>([])
        private let done = DispatchSemaphore(value: 0)

        public init(_ handle: FileHandle) {
            Thread { [self] in
                while true {
                    let data = handle.availableData
                    if data.isEmpty { break }
                    bytes.withLock { $0 += data }
                }
                done.signal()
            }.start()
        }

        public var text: String { String(decoding: bytes.withLock { $0 }, as: UTF8.self) }

        /// Waits for end of file.
        public func finish() -> String {
            done.wait()
            done.signal()
            return text
        }
    }

    public struct Outcome: CustomStringConvertible {
        public let status: Int32
        public let stdout: String
        public let stderr: String

        public init(status: Int32, stdout: String, stderr: String) {
            self.status = status
            self.stdout = stdout
            self.stderr = stderr
        }

        public var json: JSON { get throws { try JSON.parse(stdout.trimmingCharacters(in: .whitespacesAndNewlines)) } }
        public var description: String { "exit \(status)\nstdout: \(stdout)\nstderr: \(stderr)" }
    }

    /// A started `lattice` process with its output collected; stdin is /dev/null (not a terminal).
    public static func start(_ arguments: [String], home: String?, latticeHome: String? = nil) throws
        -> (Process, PipeReader, PipeReader) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: latticeBinary)
        process.arguments = arguments + (home.map { ["--home", $0] } ?? [])
        var environment = ProcessInfo.processInfo.environment
        environment["LATTICE_HOME"] = latticeHome
        process.environment = environment
        let output = Pipe()
        let errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        process.standardInput = FileHandle.nullDevice
        try process.run()
        return (process, PipeReader(output.fileHandleForReading), PipeReader(errors.fileHandleForReading))
    }

    @discardableResult
    public static func lattice(_ arguments: String..., home: String? = nil) throws -> Outcome {
        try lattice(arguments: arguments, home: home)
    }

    @discardableResult
    public static func lattice(arguments: [String], home: String? = nil) throws -> Outcome {
        let (process, output, errors) = try start(arguments, home: home)
        process.waitUntilExit()
        return Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
    }

    /// Runs a command that must succeed.
    @discardableResult
    public static func ok(_ arguments: String..., home: String? = nil) throws -> Outcome {
        try ok(arguments: arguments, home: home)
    }

    /// Runs a command that must succeed.
    @discardableResult
    public static func ok(arguments: [String], home: String? = nil) throws -> Outcome {
        let outcome = try lattice(arguments: arguments, home: home)
        guard outcome.status == 0 else {
            throw HarnessError("lattice \(arguments.joined(separator: " ")) failed: \(outcome)")
        }
        return outcome
    }

    /// A server and two signed-up homes, alice's and bob's.
    public final class World {
        public let directory = temporaryDirectory("lattice-cli")
        public let server: ServerUnderTest
        public var url: String { "http://127.0.0.1:\(server.port)" }
        public var alice: String { directory + "/alice" }
        public var bob: String { directory + "/bob" }

        public init() throws {
            server = try ServerUnderTest(data: directory + "/server")
            try LatticeCLI.ok("signup", "alice", "--server", url, home: alice)
            try LatticeCLI.ok("signup", "bob", "--server", url, "--json", home: bob)
        }

        /// alice's list "Groceries" with Milk (#dairy) and Eggs, shared by a public link bob accepted.
        public func sharedGroceries(permission: String = "read-write") throws -> (list: String, url: String) {
            let created = try LatticeCLI.ok("list", "create", "Groceries", "--json", home: alice)
            guard let list = try created.json["id"]?.stringValue else { throw HarnessError("no list id: \(created)") }
            try LatticeCLI.ok("list", "add", "Groceries", "Milk", "--tag", "dairy", home: alice)
            try LatticeCLI.ok("list", "add", list, "Eggs", home: alice)
            try LatticeCLI.ok("share", "create", "Groceries", "--public-permission", permission, home: alice)
            let link = try LatticeCLI.ok("share", "url", "Groceries", "--json", home: alice)
            guard let url = try link.json["url"]?.stringValue else { throw HarnessError("no share url: \(link)") }
            try LatticeCLI.ok("accept", url, "--yes", home: bob)
            return (list, url)
        }

        deinit {
            server.kill(SIGTERM)
            try? FileManager.default.removeItem(atPath: directory)
        }
    }
}
