import Foundation
import LatticeCore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Docs/examples/haproxy-lattice.cfg, as committed from `defaults` on, in front of three real `lattice serve
/// --trusted-proxy 127.0.0.1` nodes on one PostgreSQL database: haproxy runs in the foreground on 127.0.0.1
/// with a `global` section of this test's own. Clients connect from 127.0.0.2 (a loopback address too).
/// haproxy is a test dependency that Scripts/bootstrap.sh installs; without it this test fails.
@Suite(.serialized) struct HAProxyTests {
    static var haproxyBinary: String? {
        ["/usr/sbin/haproxy", "/usr/bin/haproxy", "/usr/local/sbin/haproxy"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }

    /// The example with its addresses pointed at this test's ports.
    static func configuration(proxyPort: UInt16, statsPort: UInt16, nodePorts: [UInt16], work: String) throws -> String {
        let example = try String(contentsOf: NginxProxyTests.packageRoot.appendingPathComponent("Docs/examples/haproxy-lattice.cfg"),
                                 encoding: .utf8)
        let start = try #require(example.range(of: "\ndefaults\n"), "the example has no defaults section")
        var text = String(example[start.lowerBound...])
        for (name, address) in [("a", "10.0.0.11:8080"), ("b", "10.0.0.12:8080"), ("c", "10.0.0.13:8080")] {
            try #require(text.contains("server \(name) \(address)\n"), "the example lacks server \(name)")
        }
        try #require(text.contains("    bind :80\n") && text.contains("    bind 127.0.0.1:8404\n"))
        text = text.replacingOccurrences(of: "    bind :80\n", with: "    bind 127.0.0.1:\(proxyPort)\n")
        text = text.replacingOccurrences(of: "    bind 127.0.0.1:8404\n", with: "    bind 127.0.0.1:\(statsPort)\n")
        for (index, (name, address)) in [("a", "10.0.0.11:8080"), ("b", "10.0.0.12:8080"), ("c", "10.0.0.13:8080")].enumerated() {
            text = text.replacingOccurrences(of: "server \(name) \(address)\n",
                                             with: "server \(name) 127.0.0.1:\(nodePorts[index])\n")
        }
        // This test's own global section: the log on stdout instead of syslog, no user switch, no daemon
        // (haproxy -db keeps it in the foreground as a child of the test).
        let global = """
            global
                log stdout format raw local0
                maxconn 512
                pidfile \(work)/haproxy.pid

            """
        return global + text
    }

    /// The state of each server of `lattice_nodes` (UP, DOWN, ...) from the stats page's CSV.
    static func serverStates(statsPort: UInt16) throws -> [String: String] {
        let reply = try RawHTTPClient(port: statsPort, timeoutSeconds: 5).send(method: "GET", path: "/stats;csv")
        let lines = String(decoding: reply.body, as: UTF8.self).split(separator: "\n").map(String.init)
        guard let header = lines.first?.dropFirst(2).split(separator: ",", omittingEmptySubsequences: false),
              let statusColumn = header.firstIndex(of: "status") else { throw HarnessError("no stats CSV: \(lines.prefix(2))") }
        var states: [String: String] = [:]
        for line in lines.dropFirst() {
            let fields = line.split(separator: ",", omittingEmptySubsequences: false).map(String.init)
            guard fields.count > statusColumn, fields[0] == "lattice_nodes", !["FRONTEND", "BACKEND"].contains(fields[1]) else { continue }
            states[fields[1]] = fields[statusColumn]
        }
        return states
    }

    @Test func requestsGoThroughHAProxyADeadNodeIsTakenOutAndTheLogsShowTheClient() throws {
        guard let haproxy = Self.haproxyBinary else {
            Issue.record("haproxy is not installed: run Scripts/bootstrap.sh --tests (it installs the haproxy package)")
            return
        }
        let cluster = try NodeCluster(nodes: 3, extra: ["--trusted-proxy", "127.0.0.1"])
        let work = cluster.directory
        let proxyPort = try NginxProxyTests.freePort()
        let statsPort = try NginxProxyTests.freePort()
        let configuration = try Self.configuration(proxyPort: proxyPort, statsPort: statsPort, nodePorts: cluster.ports, work: work)
        // The long-poll allowance as committed: both timeouts over changes/wait's 60 s.
        for name in ["client", "server"] {
            let line = configuration.split(separator: "\n").first { $0.trimmingCharacters(in: .whitespaces).hasPrefix("timeout \(name) ") }
            let seconds = line.flatMap { Int($0.split(separator: " ").last?.dropLast() ?? "") } ?? 0
            #expect(seconds > 60, "timeout \(name) is \(seconds) s: long polls need more than 60 s")
        }
        try configuration.write(toFile: work + "/haproxy.cfg", atomically: true, encoding: .utf8)
        let check = Process()
        check.executableURL = URL(fileURLWithPath: haproxy)
        check.arguments = ["-c", "-f", work + "/haproxy.cfg"]
        let checkOutput = Pipe()
        check.standardOutput = checkOutput
        check.standardError = checkOutput
        try check.run()
        let checkText = String(decoding: checkOutput.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        check.waitUntilExit()
        try #require(check.terminationStatus == 0, "haproxy -c: \(checkText)")

        let proxy = Process()
        proxy.executableURL = URL(fileURLWithPath: haproxy)
        proxy.arguments = ["-db", "-f", work + "/haproxy.cfg"]
        let proxyOutput = Pipe()
        proxy.standardOutput = proxyOutput
        proxy.standardError = proxyOutput
        let reader = CLITests.PipeReader(proxyOutput.fileHandleForReading)
        try proxy.run()
        defer {
            kill(proxy.processIdentifier, SIGTERM)
            proxy.waitUntilExit()
            _ = reader.finish()
        }
        // Up: every node passed its health checks (10 s at most).
        var states: [String: String] = [:]
        for _ in 0..<100 where states.values.filter({ $0 == "UP" }).count < 3 {
            states = (try? Self.serverStates(statsPort: statsPort)) ?? [:]
            if states.values.filter({ $0 == "UP" }).count < 3 { Thread.sleep(forTimeInterval: 0.1) }
        }
        try #require(states == ["a": "UP", "b": "UP", "c": "UP"], "haproxy did not see the nodes up: \(states) \(reader.text)")

        // Through haproxy from 127.0.0.2, with a forged X-Forwarded-For: served, spread over the nodes.
        let viaProxy = try RawHTTPClient(port: proxyPort, source: "127.0.0.2")
        let signUp = try viaProxy.send(method: "POST", path: "/auth/signup", headers: ["X-Forwarded-For": "6.6.6.6"],
                                       body: Array(#"{"name":"hap"}"#.utf8))
        #expect(signUp.status == 200, "\(String(decoding: signUp.body, as: UTF8.self))")
        let token = try #require(try JSON.parse(signUp.body)["token"]?.stringValue)
        let auth = ["Authorization": "Bearer " + token]
        let zone = JSON.object(["operations": .array([.object(["operationType": .string("create"),
                                                              "zone": .object(["zoneID": zoneID("Proxied")])])])])
        #expect(try viaProxy.send(method: "POST", path: NodeClient.base + "private/zones/modify", headers: auth,
                                  body: zone.serializedBytes()).status == 200)
        var written = 0
        let write = { (index: Int, client: RawHTTPClient) throws -> Int in
            let body = JSON.object(["zoneID": zoneID("Proxied"), "operations": .array([operation("forceReplace", "item\(index)")])])
            return try client.send(method: "POST", path: NodeClient.base + "private/records/modify", headers: auth,
                                   body: body.serializedBytes()).status
        }
        for index in 0..<30 {
            let client = index % 2 == 0 ? viaProxy : try RawHTTPClient(port: proxyPort, source: "127.0.0.2")
            #expect(try write(index, client) == 200, "write \(index) through haproxy")
            written += 1
        }
        let served = (0..<3).map { node in
            (cluster.nodes[node]?.standardError ?? "").split(separator: "\n").filter { $0.contains("/records/modify") }
        }
        #expect(served.filter { !$0.isEmpty }.count >= 2, "haproxy sent every write to one node: \(served.map(\.count))")
        // The access logs: the client's address (127.0.0.2) via haproxy, never the forged one.
        let lines = served.joined()
        #expect(!lines.isEmpty && lines.allSatisfy { $0.split(separator: " ").dropFirst().first == "127.0.0.2" && $0.hasSuffix("via=127.0.0.1") },
                "\(lines.prefix(3))")
        let allLogs = (0..<3).map { cluster.nodes[$0]?.standardError ?? "" }.joined()
        #expect(allLogs.contains("/auth/signup") && !allLogs.contains("6.6.6.6"))
        // haproxy's own log (option httplog) names the client too.
        let proxyLog = reader.text.split(separator: "\n").filter { $0.contains("/records/modify") }
        #expect(!proxyLog.isEmpty && proxyLog.allSatisfy { $0.contains("127.0.0.2:") }, "\(proxyLog.prefix(2))")

        // Node b is killed: requests keep succeeding (refused connections go to another node), and the health
        // check takes it out within a few seconds.
        cluster.killNode(1)
        var failures: [Int] = []
        let killed = Date()
        var takenOut: Double?
        for index in 30..<230 where takenOut == nil || index < 60 {  // 200 writes at most, about 10 s
            let client = try RawHTTPClient(port: proxyPort, source: "127.0.0.2")
            let status = try write(index, client)
            if status == 200 { written += 1 } else { failures.append(status) }
            if takenOut == nil, (try? Self.serverStates(statsPort: statsPort))?["b"]?.hasPrefix("DOWN") == true {
                takenOut = Date().timeIntervalSince(killed)
            }
            Thread.sleep(forTimeInterval: 0.05)
        }
        print(#"{"haproxy":"node-killed","taken_out_after_s":\#(takenOut.map { String(format: "%.2f", $0) } ?? "null"),"writes":\#(written),"failures":\#(failures.count)}"#)
        #expect(failures.isEmpty, "writes failed through haproxy after the kill: \(failures)")
        let statesAfterKill = (try? Self.serverStates(statsPort: statsPort)) ?? [:]
        let out = try #require(takenOut, "haproxy never took the killed node out: \(statesAfterKill)")
        #expect(out < 5)
        #expect(try Self.serverStates(statsPort: statsPort) == ["a": "UP", "b": "DOWN", "c": "UP"])

        // Everything written is there, read through haproxy.
        let names = (0..<written).map { JSON.object(["recordName": .string("item\($0)")]) }
        let lookup = try RawHTTPClient(port: proxyPort, source: "127.0.0.2").send(
            method: "POST", path: NodeClient.base + "private/records/lookup", headers: auth,
            body: JSON.object(["zoneID": zoneID("Proxied"), "records": .array(names)]).serializedBytes())
        let found = (try JSON.parse(lookup.body)["records"]?.arrayValue ?? []).filter { $0["serverErrorCode"] == nil }
        #expect(found.count == written, "\(found.count) of \(written) records found")

        // A long poll through haproxy, woken by a write through haproxy (most likely on another node).
        let databaseToken = try JSON.parse(try viaProxy.send(method: "POST", path: NodeClient.base + "private/changes/database",
                                                             headers: auth, body: Array("{}".utf8)).body)["syncToken"]
        let poll = try RawHTTPClient(port: proxyPort, timeoutSeconds: 20, source: "127.0.0.2")
        let body = JSON.object(["syncToken": databaseToken ?? .null, "timeout": .int(30)]).serializedBytes()
        try poll.write(Array("POST \(NodeClient.base)private/changes/wait HTTP/1.1\r\nHost: lattice.example.com\r\nAuthorization: Bearer \(token)\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
        #expect(poll.staysQuiet(for: 0.5), "the long poll through haproxy did not park")
        #expect(try write(10_000, try RawHTTPClient(port: proxyPort, source: "127.0.0.2")) == 200)
        let woken = try poll.readResponse(method: "POST")
        #expect(woken.status == 200 && (try? JSON.parse(woken.body)["changed"]) == .bool(true))
    }
}
