import Foundation
import LatticeCore
import LatticeTestSupport
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Several real `lattice serve` processes on one fresh PostgreSQL database, each with its own
/// `--node-name` and port, all with one `--public-url`: the set-up of MultiNodeTests and HAProxyTests.
public final class NodeCluster {
    /// The one public URL every node signs share links for (it is never dialled: clients use the ports).
    public static let publicURL = "https://lattice.multinode.test"

    public let directory = temporaryDirectory("lattice-nodes")
    /// The PostgreSQL cluster the database is on (the shared test cluster, or a test's own).
    public let clusterURL: String
    public let databaseURL: String
    public let extra: [String]
    public private(set) var nodes: [ServerUnderTest?] = []

    /// `count` nodes named n0, n1, ...; `extra` goes to every `lattice serve`.
    public init(nodes count: Int = 3, clusterURL: String? = nil, extra: [String] = []) throws {
        self.clusterURL = try clusterURL ?? TestPostgres.requireClusterURL()
        databaseURL = try TestPostgres.createDatabase("nodes", cluster: self.clusterURL)
        self.extra = extra
        for index in 0..<count { nodes.append(try startNode(index)) }
        print(#"{"multinode":"cluster","nodes":\#(count),"ports":[\#(ports.map(String.init).joined(separator: ","))]}"#)
    }

    deinit {
        for node in nodes { node?.kill(SIGTERM) }
        TestPostgres.dropDatabase(databaseURL, cluster: clusterURL)
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// The arguments of node `index`. Sign-up limits are off: the tests make many accounts from 127.0.0.1.
    public func arguments(_ index: Int) -> [String] {
        ["--database", databaseURL, "--node-name", "n\(index)", "--public-url", Self.publicURL, "--port", "0",
         "--signup-per-address", "0", "--signup-global", "0"] + extra
    }

    private func startNode(_ index: Int) throws -> ServerUnderTest {
        try ServerUnderTest(arguments: arguments(index))
    }

    public var count: Int { nodes.count }
    public var ports: [UInt16] { nodes.map { $0?.port ?? 0 } }
    public func port(_ index: Int) -> UInt16 { nodes[index]?.port ?? 0 }
    public func url(_ index: Int) -> String { "http://127.0.0.1:\(port(index))" }

    /// `kill -9` of one node; it stays down.
    public func killNode(_ index: Int) {
        nodes[index]?.kill(SIGKILL)
        nodes[index] = nil
    }

    /// The stderr of every node so far (for failure messages): its lines other than the access log (the
    /// server's own messages, such as an internal error's cause), then the last `limit` bytes.
    public func logs(limit: Int = 1500) -> String {
        nodes.enumerated().map { index, node in
            let text = node?.standardError ?? ""
            let messages = text.split(separator: "\n").filter { !$0.contains(" 127.0.0.1 ") }.suffix(40)
            return "n\(index): messages:\n" + messages.joined(separator: "\n") + "\nn\(index) tail: " + String(text.suffix(limit))
        }.joined(separator: "\n")
    }

    /// Runs `lattice admin ARGUMENTS --database URL`; returns its outcome.
    /// `lattice admin` with `arguments`, against the cluster's database. `--database` goes first, after the
    /// subcommand, so arguments may end with `--` and a value that begins with `--` (a key id can).
    public func admin(_ arguments: [String]) throws -> LatticeCLI.Outcome {
        let command = arguments.prefix(1) + ["--database", databaseURL] + arguments.dropFirst()
        let (process, output, errors) = try LatticeCLI.start(["admin"] + command, home: nil)
        process.waitUntilExit()
        return LatticeCLI.Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
    }
}

/// One JSON answer from a node.
public struct NodeReply {
    public let status: Int
    public let json: JSON
    public let headers: [String: String]

    public subscript(key: String) -> JSON? { json[key] }
    public var code: String? { json["serverErrorCode"]?.stringValue }
    public var text: String { json.serialized() }
}

/// A keep-alive JSON client for one thread, reconnecting after a failed request (a node killed, or a
/// connection the server closed).
public final class NodeClient {
    public var port: UInt16
    public let timeoutSeconds: Double
    private var connection: RawHTTPClient?

    public init(port: UInt16, timeoutSeconds: Double = 10) {
        self.port = port
        self.timeoutSeconds = timeoutSeconds
    }

    public static let base = "/database/1/lattice/production/"

    /// POST `path` (absolute, or an operation under the database `database`) with a JSON body.
    public func post(_ path: String, _ body: JSON = .object([:]), token: String?, database: String? = nil,
              headers: [String: String] = [:]) throws -> NodeReply {
        let fullPath = database.map { Self.base + $0 + "/" + path } ?? path
        var headers = headers
        if let token { headers["Authorization"] = "Bearer " + token }
        do {
            if connection == nil { connection = try RawHTTPClient(port: port, timeoutSeconds: timeoutSeconds) }
            let response = try connection!.send(method: "POST", path: fullPath, headers: headers, body: body.serializedBytes())
            if response.headers["connection"]?.lowercased() == "close" { disconnect() }
            return NodeReply(status: response.status, json: (try? JSON.parse(response.body)) ?? .null,
                             headers: response.headers)
        } catch {
            disconnect()
            throw error
        }
    }

    public func disconnect() {
        connection?.close()
        connection = nil
    }

    /// Signs `name` up; returns (token, userRecordName).
    public func signUp(_ name: String) throws -> (token: String, recordName: String) {
        let reply = try post("/auth/signup", .object(["name": .string(name)]), token: nil)
        guard reply.status == 200, let token = reply["token"]?.stringValue,
              let recordName = reply["userRecordName"]?.stringValue else {
            throw HarnessError("signup \(name) on port \(port): \(reply.status) \(reply.text)")
        }
        return (token, recordName)
    }

    /// `post` that must answer 200, retried (bounded: 50 tries, 10 s) while it answers 503 or 429.
    @discardableResult
    public func ok(_ path: String, _ body: JSON = .object([:]), token: String?, database: String? = "private") throws -> NodeReply {
        let started = Date()
        for _ in 0..<50 where Date().timeIntervalSince(started) < 10 {
            let reply = try post(path, body, token: token, database: database)
            if reply.status == 200 { return reply }
            guard reply.status == 503 || reply.status == 429 else {
                throw HarnessError("\(path) on port \(port): \(reply.status) \(reply.text)")
            }
            Thread.sleep(forTimeInterval: 0.1)
        }
        throw HarnessError("\(path) on port \(port): still busy after 10 s")
    }
}

/// Zone ids as JSON.
public func zoneID(_ name: String, owner: String? = nil) -> JSON {
    var zone: [String: JSON] = ["zoneName": .string(name)]
    if let owner { zone["ownerRecordName"] = .string(owner) }
    return .object(zone)
}

/// The log position in a change tag (its last `-` part, base 36).
public func changeTagPosition(_ tag: String?) -> Int64? {
    guard let tag, let last = tag.split(separator: "-").last else { return nil }
    return Int64(last, radix: 36)
}
