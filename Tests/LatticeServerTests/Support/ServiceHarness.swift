import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeStore
import LatticeTestSupport
import Synchronization

/// A wall clock tests move by hand.
final class TestClock: Sendable {
    private let milliseconds: Mutex<Int64>

    init(_ start: Int64 = 1_764_489_600_000) { milliseconds = Mutex(start) }

    var now: Int64 { milliseconds.withLock { $0 } }
    func advance(_ delta: Int64) { milliseconds.withLock { $0 += delta } }
}

/// A service on a fresh SQLite file (or, with `LATTICE_TEST_BACKEND=postgres`, a fresh PostgreSQL database:
/// see `TestBackend`) with a hand-moved clock, and helpers to call it as JSON.
final class ServiceHarness: Sendable {
    let clock: TestClock
    let storage: any Storage
    /// The PostgreSQL database the storage is on (closing the storage drops it); nil on SQLite.
    let databaseURL: String?
    let service: LatticeService
    let keyRing: ShareKeyRing
    let directory: String

    /// `wrapStorage` may put a storage of the test's in front of the backend (`RecordingStorage`, say).
    init(configure: (inout ServiceConfiguration) -> Void = { _ in },
         wrapStorage: (any Storage) -> any Storage = { $0 }) throws {
        directory = temporaryDirectory()
        clock = TestClock()
        let (backend, url) = try TestBackend.makeStorage(directory: directory)
        (storage, databaseURL) = (wrapStorage(backend), url)
        var configuration = ServiceConfiguration()
        let clock = self.clock
        configuration.now = { clock.now }
        configuration.rateLimit = nil
        // Tests sign many users up from one address and send bad tokens on purpose; AbuseLimitTests turn
        // these limits on.
        configuration.signUpsPerAddress = nil
        configuration.signUpsGlobal = nil
        configuration.failedAuthenticationLimit = nil
        configure(&configuration)
        keyRing = try ShareKeyRing.open(directory: directory, nowMilliseconds: clock.now)
        service = try LatticeService(storage: storage, configuration: configuration, keyRing: keyRing, log: { _ in })
    }

    deinit {
        storage.close()
        try? FileManager.default.removeItem(atPath: directory)
    }

    struct Reply {
        let status: Int
        let json: JSON
        let response: HTTPResponse

        subscript(key: String) -> JSON? { json[key] }
        var code: String? { json["serverErrorCode"]?.stringValue }
        var records: [JSON] { json["records"]?.arrayValue ?? [] }
        var zones: [JSON] { json["zones"]?.arrayValue ?? [] }
    }

    func raw(_ method: String, _ path: String, body: [UInt8] = [], token: String? = nil,
             headers: [String: String] = [:]) -> Reply {
        var headers = headers
        if let token { headers["Authorization"] = "Bearer " + token }
        let response = service.respond(to: HTTPRequest(method: method, path: path, headers: headers, body: body,
                                                       remoteAddress: "127.0.0.1"))
        let json = (try? JSON.parse(response.body)) ?? .null
        return Reply(status: response.status, json: json, response: response)
    }

    func post(_ path: String, _ body: JSON, token: String?) -> Reply {
        raw("POST", path, body: body.serializedBytes(), token: token)
    }

    /// `POST /database/1/lattice/production/{database}/{operation}`.
    func call(_ operation: String, _ body: JSON = .object([:]), token: String?, database: String = "private") -> Reply {
        post("/database/1/lattice/production/\(database)/\(operation)", body, token: token)
    }

    /// Signs a user up; returns (token, userRecordName).
    func signUp(_ name: String) throws -> (token: String, recordName: String) {
        let reply = post("/auth/signup", .object(["name": .string(name)]), token: nil)
        guard reply.status == 200, let token = reply["token"]?.stringValue,
              let recordName = reply["userRecordName"]?.stringValue else {
            throw HarnessError("signup failed: \(reply.status) \(reply.json.serialized())")
        }
        return (token, recordName)
    }

    func createZone(_ name: String, token: String) throws {
        let reply = call("zones/modify", .object(["operations": .array([
            .object(["operationType": .string("create"), "zone": .object(["zoneID": .object(["zoneName": .string(name)])])]),
        ])]), token: token)
        guard reply.status == 200, reply.zones.first?["serverErrorCode"] == nil else {
            throw HarnessError("zone create failed: \(reply.json.serialized())")
        }
    }

    /// One `records/modify` with the given operations in `zone`.
    func modify(_ zone: String, _ operations: [JSON], token: String, extra: [String: JSON] = [:]) -> Reply {
        var body: [String: JSON] = ["zoneID": .object(["zoneName": .string(zone)]), "operations": .array(operations)]
        for (key, value) in extra { body[key] = value }
        return call("records/modify", .object(body), token: token)
    }
}
