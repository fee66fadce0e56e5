import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Synchronization
import Testing

/// The whole server on a real socket (127.0.0.1): many clients at once, then a check of what they were told.
@Suite(.serialized) struct LoopbackTests {
    /// The real service behind the real adapter: a body over 2 MiB is refused from its Content-Length with
    /// the API's JSON error, malformed HTTP gets a 4xx, and the server keeps serving.
    @Test func oversizedAndMalformedRequestsAgainstTheService() throws {
        let directory = temporaryDirectory("lattice-limits")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let storage = try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
        defer { storage.close() }
        let service = try LatticeService(storage: storage, configuration: ServiceConfiguration())
        let server = try HTTPServer(handler: service, configuration: HTTPServerConfiguration(port: 0))
        defer { server.shutdown() }
        let token = try service.createAccount(name: "ann").token.text

        let big = [UInt8](repeating: UInt8(ascii: " "), count: 2 * 1024 * 1024 + 1)
        let refused = try RawHTTPClient(port: server.port).send(
            method: "POST", path: "/database/1/lattice/production/private/records/modify",
            headers: ["Authorization": "Bearer " + token], body: big)
        #expect(refused.status == 413)
        #expect(try JSON.parse(refused.body)["serverErrorCode"]?.stringValue == "LIMIT_EXCEEDED")

        let garbage = try RawHTTPClient(port: server.port).sendRaw(Array("GET / HTTP/9.9\r\nHost x\r\n\r\n".utf8))
        let statusLine = String(decoding: garbage.prefix(12), as: UTF8.self)
        #expect(statusLine.hasPrefix("HTTP/1.1 4") || statusLine.hasPrefix("HTTP/1.0 4") || statusLine.contains(" 505"))

        let fine = try RawHTTPClient(port: server.port).send(method: "GET", path: "/healthz")
        #expect(fine.status == 200)
    }

    /// 32 clients run `records/modify` for 10 seconds. Afterwards every acknowledged write is present with
    /// its fields merged, and the change feed lists each record exactly once.
    @Test func thirtyTwoConcurrentClientsForTenSeconds() throws {
        let directory = temporaryDirectory("lattice-loopback")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let storage = try SQLiteStorage(path: directory + "/" + SQLiteStorage.fileName)
        defer { storage.close() }
        var configuration = ServiceConfiguration()
        configuration.rateLimit = nil
        let service = try LatticeService(storage: storage, configuration: configuration)
        let server = try HTTPServer(handler: service, configuration: HTTPServerConfiguration(port: 0))
        defer { server.shutdown() }

        let users = try (0..<4).map { try service.createAccount(name: "user\($0)") }
        let clients = 32
        for (userIndex, user) in users.enumerated() {
            let client = try RawHTTPClient(port: server.port)
            let headers = ["Authorization": "Bearer " + user.token.text]
            let zone = try client.send(method: "POST", path: "/database/1/lattice/production/private/zones/modify",
                                       headers: headers,
                                       body: Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Load"}}}]}"#.utf8))
            #expect(zone.status == 200)
            // The records the clients update: 8 shared by a user's clients, 20 of each client's own.
            let names = (0..<8).map { "shared-\($0)" }
                + stride(from: userIndex, to: clients, by: users.count).flatMap { client in (0..<20).map { "c\(client)-\($0)" } }
            let creates: [JSON] = names.map { name in
                .object(["operationType": .string("create"),
                         "record": .object(["recordName": .string(name), "recordType": .string("Item")])])
            }
            let created = try client.send(method: "POST", path: "/database/1/lattice/production/private/records/modify",
                                          headers: headers,
                                          body: JSON.object(["zoneID": .object(["zoneName": .string("Load")]),
                                                             "operations": .array(creates)]).serializedBytes())
            #expect(created.status == 200)
        }

        let duration: TimeInterval = 10
        let start = Date()
        // What each client was told succeeded: record -> field -> last acknowledged value; record -> tags.
        struct Acknowledged {
            var fields: [String: [String: Int64]] = [:]
            var tags: [String: Set<String>] = [:]
            var latencies: [Double] = []
            var failures: [String] = []
        }
        let results = Mutex<[Int: Acknowledged]>([:])
        let done = DispatchGroup()
        for index in 0..<clients {
            done.enter()
            let thread = Thread {
                defer { done.leave() }
                var acknowledged = Acknowledged()
                let user = users[index % users.count]
                do {
                    let client = try RawHTTPClient(port: server.port, timeoutSeconds: 30)
                    var iteration = 0
                    while Date().timeIntervalSince(start) < duration {
                        // Each client writes its own field on records it shares with the other clients of its
                        // user, plus one of its own, and adds a tag.
                        let sharedName = "shared-\(iteration % 8)"
                        let ownName = "c\(index)-\(iteration % 20)"
                        let field = "f\(index)"
                        let tag = "t\(index)-\(iteration)"
                        let operations: [JSON] = [sharedName, ownName].map { name in
                            .object(["operationType": .string("forceUpdate"), "record": .object([
                                "recordName": .string(name), "recordType": .string("Item"),
                                "fields": .object([
                                    field: .object(["value": .int(Int64(iteration))]),
                                    "tags": .object(["add": .array([.string(tag)])]),
                                ]),
                            ])])
                        }
                        let body = JSON.object(["zoneID": .object(["zoneName": .string("Load")]),
                                                "operations": .array(operations)]).serializedBytes()
                        let began = Date()
                        let reply = try client.send(method: "POST", path: "/database/1/lattice/production/private/records/modify",
                                                    headers: ["Authorization": "Bearer " + user.token.text], body: body)
                        acknowledged.latencies.append(Date().timeIntervalSince(began))
                        let json = try JSON.parse(reply.body)
                        let items = json["records"]?.arrayValue ?? []
                        if reply.status == 200, items.count == 2, items.allSatisfy({ $0["serverErrorCode"] == nil }) {
                            for name in [sharedName, ownName] {
                                acknowledged.fields["\(user.user.name)/\(name)", default: [:]][field] = Int64(iteration)
                                acknowledged.tags["\(user.user.name)/\(name)", default: []].insert(tag)
                            }
                        } else {
                            acknowledged.failures.append("\(reply.status) \(json.serialized().prefix(300))")
                        }
                        iteration += 1
                    }
                } catch {
                    acknowledged.failures.append("\(error)")
                }
                results.withLock { $0[index] = acknowledged }
            }
            thread.stackSize = 1 << 20
            thread.start()
        }
        done.wait()
        let elapsed = Date().timeIntervalSince(start)
        let all = results.withLock { $0 }
        #expect(all.count == clients)
        let failures = all.values.flatMap(\.failures)
        #expect(failures.count == 0, "first failures: \(failures.prefix(3))")

        // Expected final state: per record, each client's last acknowledged value and every acknowledged tag.
        var expectedFields: [String: [String: Int64]] = [:]
        var expectedTags: [String: Set<String>] = [:]
        for acknowledged in all.values {
            for (record, fields) in acknowledged.fields {
                for (field, value) in fields { expectedFields[record, default: [:]][field] = value }
            }
            for (record, tags) in acknowledged.tags { expectedTags[record, default: []].formUnion(tags) }
        }
        let latencies = all.values.flatMap(\.latencies).sorted()
        let requests = latencies.count
        #expect(requests > clients)
        let p50 = latencies[requests / 2] * 1000
        let p99 = latencies[min(requests - 1, requests * 99 / 100)] * 1000
        print(#"{"loopback":"records/modify","clients":\#(clients),"seconds":\#(String(format: "%.1f", elapsed)),"#
              + #""requests":\#(requests),"requests_per_s":\#(String(format: "%.0f", Double(requests) / elapsed)),"#
              + #""p50_ms":\#(String(format: "%.2f", p50)),"p99_ms":\#(String(format: "%.2f", p99))}"#)

        // Every acknowledged write is there, merged; the feed lists each record once.
        for user in users {
            let client = try RawHTTPClient(port: server.port, timeoutSeconds: 30)
            let headers = ["Authorization": "Bearer " + user.token.text]
            var feedNames: [String] = []
            var syncToken: JSON = .null
            var records: [String: JSON] = [:]
            repeat {
                var request: [String: JSON] = ["zoneID": .object(["zoneName": .string("Load")]), "resultsLimit": .int(50)]
                if syncToken != .null { request["syncToken"] = syncToken }
                let reply = try client.send(method: "POST", path: "/database/1/lattice/production/private/changes/zone",
                                            headers: headers,
                                            body: JSON.object(["zones": .array([.object(request)])]).serializedBytes())
                let zone = try #require(try JSON.parse(reply.body)["zones"]?.arrayValue?.first)
                for record in zone["records"]?.arrayValue ?? [] {
                    let name = record["recordName"]?.stringValue ?? ""
                    feedNames.append(name)
                    records[name] = record
                }
                syncToken = zone["syncToken"] ?? .null
                if zone["moreComing"] != .bool(true) { break }
            } while true
            let expectedNames = Set(expectedFields.keys.filter { $0.hasPrefix(user.user.name + "/") }
                .map { String($0.dropFirst(user.user.name.count + 1)) })
            #expect(feedNames.count == Set(feedNames).count, "the feed lists a record twice")
            #expect(Set(feedNames) == expectedNames)
            for name in expectedNames {
                let key = "\(user.user.name)/\(name)"
                let record = try #require(records[name])
                for (field, value) in expectedFields[key] ?? [:] {
                    #expect(record["fields"]?[field]?["value"]?.intValue == value, "\(key).\(field)")
                }
                let tags = Set(record["fields"]?["tags"]?["value"]?.arrayValue?.compactMap(\.stringValue) ?? [])
                #expect(tags == expectedTags[key], "\(key).tags")
            }
        }
    }
}
