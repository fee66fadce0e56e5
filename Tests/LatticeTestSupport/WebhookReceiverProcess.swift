import Foundation
#if canImport(Glibc)
import Glibc
#endif
import LatticeCore

/// The tests' webhook receiver (Tests/WebhookReceiver/receiver.py, Python's standard library only): a real
/// HTTP server on 127.0.0.1 that records deliveries and checks their signatures. It can be stopped and
/// started again on the same port (a receiver that is down for a while).
public final class WebhookReceiverProcess: @unchecked Sendable {
    // @unchecked: no lock; used from the test's thread only.
    public private(set) var process = Process()
    public private(set) var port: UInt16 = 0
    public var url: String { "http://127.0.0.1:\(port)/hook" }

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    public init(port: UInt16 = 0) throws { try start(port: port) }

    deinit { stop() }

    /// Starts the receiver (on `port`, or a free one) and waits until it listens (10 s at most).
    public func start(port requested: UInt16? = nil) throws {
        let urlFile = temporaryDirectory("lattice-webhooks") + "/url"
        process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/python3")
        process.arguments = [Self.root.appendingPathComponent("Tests/WebhookReceiver/receiver.py").path, "--url-file", urlFile,
                             "--port", String(requested ?? port)]
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        let deadline = Date().addingTimeInterval(10)
        var text = ""
        while Date() < deadline, process.isRunning {
            if let written = try? String(contentsOfFile: urlFile, encoding: .utf8), !written.isEmpty { text = written; break }
            Thread.sleep(forTimeInterval: 0.02)
        }
        guard let url = URL(string: text), let found = url.port else {
            stop()
            throw HarnessError("the webhook receiver did not start")
        }
        port = UInt16(found)
    }

    /// Kills the receiver (what it recorded goes with it) and waits for it.
    public func stop() {
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// How it answers from now on (`ok`, `fail`, `hang`, `huge`), and the secret it checks signatures with.
    public func control(mode: String? = nil, secret: String? = nil) throws {
        var body: [String: JSON] = [:]
        if let mode { body["mode"] = .string(mode) }
        if let secret { body["secret"] = .string(secret) }
        let reply = try RawHTTPClient(port: port).send(method: "POST", path: "/control", body: JSON.object(body).serializedBytes())
        guard reply.status == 200 else { throw HarnessError("receiver control: \(reply.status)") }
    }

    public struct Delivery: Sendable {
        public let id: String
        public let subscription: String
        public let sequence: Int64
        public let verified: Bool
        public let body: JSON
        public let mode: String
    }

    /// What it received since it started, in arrival order.
    public func deliveries() throws -> [Delivery] {
        let reply = try RawHTTPClient(port: port).send(method: "GET", path: "/deliveries")
        let list = try JSON.parse(reply.body).arrayValue ?? []
        return list.map { item in
            Delivery(id: item["id"]?.stringValue ?? "", subscription: item["subscription"]?.stringValue ?? "",
                     sequence: item["sequence"]?.intValue ?? 0, verified: item["verified"]?.boolValue ?? false,
                     body: (try? JSON.parse(Array((item["body"]?.stringValue ?? "").utf8))) ?? .null,
                     mode: item["mode"]?.stringValue ?? "")
        }
    }

    /// Waits (20 s at most, polling every 50 ms) until `condition` holds for what it received; the last list.
    @discardableResult
    public func wait(seconds: Double = 20, until condition: ([Delivery]) -> Bool) throws -> [Delivery] {
        let deadline = Date().addingTimeInterval(seconds)
        var last: [Delivery] = []
        while Date() < deadline {
            last = try deliveries()
            if condition(last) { return last }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return last
    }
}
