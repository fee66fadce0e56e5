import Foundation
import LatticeCore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// Docs/examples/nginx-lattice.conf, as committed, in front of a real `lattice serve --trusted-proxy
/// 127.0.0.1`: nginx runs on 127.0.0.1 as the current user with its prefix and temporary files in a
/// temporary directory. Clients connect from 127.0.0.2 and 127.0.0.3 (loopback addresses too).
/// nginx is a test dependency that Scripts/bootstrap.sh installs; without it this test fails.
@Suite(.serialized) struct NginxProxyTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    static var nginxBinary: String? {
        let candidates = ["/usr/sbin/nginx", "/usr/bin/nginx", "/usr/local/sbin/nginx", "/usr/local/bin/nginx"]
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// A port free right now on 127.0.0.1.
    static func freePort() throws -> UInt16 {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        var size = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { socketAddress in
                bind(descriptor, socketAddress, size) == 0 && getsockname(descriptor, socketAddress, &size) == 0
            }
        }
        guard bound else { throw HarnessError("cannot find a free port") }
        return UInt16(bigEndian: address.sin_port)
    }

    @Test func forwardedAddressesReachTheAccessLogAndTheLimitsAndSpoofedOnesDoNot() throws {
        guard let nginx = Self.nginxBinary else {
            Issue.record("nginx is not installed: run Scripts/bootstrap.sh (it installs the nginx package)")
            return
        }
        let work = temporaryDirectory("lattice-nginx")
        defer { try? FileManager.default.removeItem(atPath: work) }
        let accessLog = work + "/access.log"
        let lattice = try ServerUnderTest(
            data: work + "/data",
            extra: ["--trusted-proxy", "127.0.0.1", "--access-log", accessLog, "--per-address-connections", "2"])
        defer { lattice.kill(SIGTERM) }

        // The committed example, pointed at this Lattice and a free port.
        let proxyPort = try Self.freePort()
        var site = try String(contentsOf: Self.packageRoot.appendingPathComponent("Docs/examples/nginx-lattice.conf"),
                              encoding: .utf8)
        #expect(site.contains("server 127.0.0.1:8080;") && site.contains("listen 80;"))
        site = site.replacingOccurrences(of: "server 127.0.0.1:8080;", with: "server 127.0.0.1:\(lattice.port);")
        site = site.replacingOccurrences(of: "listen 80;", with: "listen 127.0.0.1:\(proxyPort);")
        try site.write(toFile: work + "/lattice.conf", atomically: true, encoding: .utf8)
        let main = """
            \(geteuid() == 0 ? "user root;" : "")
            daemon off;
            worker_processes 1;
            pid \(work)/nginx.pid;
            error_log \(work)/error.log warn;
            events { worker_connections 256; }
            http {
                access_log off;
                client_body_temp_path \(work)/client_body;
                proxy_temp_path \(work)/proxy;
                fastcgi_temp_path \(work)/fastcgi;
                uwsgi_temp_path \(work)/uwsgi;
                scgi_temp_path \(work)/scgi;
                include \(work)/lattice.conf;
            }
            """
        try main.write(toFile: work + "/nginx.conf", atomically: true, encoding: .utf8)
        let proxy = Process()
        proxy.executableURL = URL(fileURLWithPath: nginx)
        proxy.arguments = ["-p", work, "-c", work + "/nginx.conf", "-e", work + "/error.log"]
        proxy.standardOutput = FileHandle.nullDevice
        proxy.standardError = FileHandle.nullDevice
        try proxy.run()
        defer {
            kill(proxy.processIdentifier, SIGQUIT)
            proxy.waitUntilExit()
        }
        var up = false
        for _ in 0..<100 where !up {  // 10 s at most
            if (try? RawHTTPClient(port: proxyPort, timeoutSeconds: 2).send(method: "GET", path: "/healthz"))?.status == 200 {
                up = true
            } else {
                Thread.sleep(forTimeInterval: 0.1)
            }
        }
        let nginxErrors = (try? String(contentsOfFile: work + "/error.log", encoding: .utf8)) ?? ""
        try #require(up, "nginx did not start: \(nginxErrors)")

        // Through nginx from 127.0.0.2, with a forged X-Forwarded-For: Lattice sees 127.0.0.2.
        let viaProxy = try RawHTTPClient(port: proxyPort, source: "127.0.0.2")
        let signUp = try viaProxy.send(method: "POST", path: "/auth/signup",
                                       headers: ["X-Forwarded-For": "6.6.6.6"], body: Array(#"{"name":"ada"}"#.utf8))
        #expect(signUp.status == 200)
        let token = try #require(try JSON.parse(signUp.body)["token"]?.stringValue)
        // Straight to Lattice from 127.0.0.3 (not a trusted proxy): the header is ignored.
        let direct = try RawHTTPClient(port: lattice.port, source: "127.0.0.3")
        #expect(try direct.send(method: "HEAD", path: "/healthz", headers: ["X-Forwarded-For": "7.7.7.7"]).status == 200)

        let lines = try waitForLines(accessLog) { lines in
            lines.contains { $0.contains("/auth/signup") } && lines.contains { $0.contains(" HEAD /healthz ") }
        }
        let signUpLine = try #require(lines.first { $0.contains("/auth/signup") })
        #expect(signUpLine.split(separator: " ").dropFirst().first == "127.0.0.2", "\(signUpLine)")
        #expect(signUpLine.contains(" POST /auth/signup 200 ") && signUpLine.hasSuffix("via=127.0.0.1"))
        let directLine = try #require(lines.first { $0.contains(" HEAD /healthz ") })
        #expect(directLine.split(separator: " ").dropFirst().first == "127.0.0.3", "\(directLine)")
        #expect(!directLine.contains("via="))
        #expect(!lines.joined().contains("6.6.6.6") && !lines.joined().contains("7.7.7.7"))

        // Per-client limits see the forwarded address: with two long polls parked from 127.0.0.2 through
        // nginx (whose own connections to Lattice, more than 2, are exempt), 127.0.0.2's next request gets
        // 429 while 127.0.0.3 through the same proxy is served.
        let auth = ["Authorization": "Bearer " + token]
        let wait = "/database/1/lattice/production/private/changes/wait"
        let current = "/database/1/lattice/production/private/users/current"
        // One poll at a time, each seen parked (no answer for 0.5 s) before the next or any probe is sent:
        // a probe still in flight when a poll arrives would take that poll's slot.
        var polls: [RawHTTPClient] = []
        for _ in 0..<20 where polls.count < 2 {  // 20 tries, about 15 s at most
            let poll = try RawHTTPClient(port: proxyPort, timeoutSeconds: 2, source: "127.0.0.2")
            let body = Array(#"{"timeout":50}"#.utf8)
            try poll.write(Array("POST \(wait) HTTP/1.1\r\nHost: lattice.example.com\r\nAuthorization: Bearer \(token)\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
            if poll.staysQuiet(for: 0.5) { polls.append(poll) } else { poll.close(); Thread.sleep(forTimeInterval: 0.2) }
        }
        try #require(polls.count == 2, "the two long polls through nginx did not both park")
        var throttled: RawHTTPClient.Response?
        var statuses: [Int] = []
        for _ in 0..<100 where throttled == nil {  // 10 s at most
            let reply = try RawHTTPClient(port: proxyPort, source: "127.0.0.2").send(method: "POST", path: current, headers: auth)
            statuses.append(reply.status)
            if reply.status == 429 { throttled = reply } else { Thread.sleep(forTimeInterval: 0.1) }
        }
        if throttled == nil {
            // Say what the polls got instead of parking.
            let answers = polls.map { poll in (try? poll.readResponse()).map { "\($0.status) \(String(decoding: $0.body, as: UTF8.self))" } ?? "none" }
            Issue.record("probe statuses \(Set(statuses)); polls answered: \(answers); log: \(lattice.standardError.suffix(2000))")
        }
        let refusal = try #require(throttled, "127.0.0.2 was never limited behind the proxy")
        #expect(try JSON.parse(refusal.body)["serverErrorCode"]?.stringValue == "THROTTLED")
        let other = try RawHTTPClient(port: proxyPort, source: "127.0.0.3").send(method: "POST", path: current, headers: auth)
        #expect(other.status == 200)

        // The clients go away: nginx closes its connections to Lattice, which frees the polls' slots.
        for poll in polls { poll.close() }
        var freed = false
        for _ in 0..<100 where !freed {  // 10 s at most, far under the polls' 50 s
            let reply = try RawHTTPClient(port: proxyPort, source: "127.0.0.2").send(method: "POST", path: current, headers: auth)
            if reply.status == 200 { freed = true } else { Thread.sleep(forTimeInterval: 0.1) }
        }
        #expect(freed, "the closed polls kept 127.0.0.2's slots")

        // An asset through nginx: 5 MB streamed to its upload URL, saved, and downloaded back whole.
        let lists = "/database/1/lattice/production/private/"
        _ = try RawHTTPClient(port: proxyPort).send(method: "POST", path: lists + "zones/modify", headers: auth,
            body: Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Lists"}}}]}"#.utf8))
        let tokens = try JSON.parse(try RawHTTPClient(port: proxyPort).send(method: "POST", path: lists + "assets/upload", headers: auth,
            body: Array(#"{"zoneID":{"zoneName":"Lists"},"tokens":[{"recordName":"milk","fieldName":"photo"}]}"#.utf8)).body)
        let uploadURL = try #require(tokens["tokens"]?.arrayValue?.first?["url"]?.stringValue, "\(tokens.serialized())")
        let uploadPath = String(uploadURL[uploadURL.range(of: "/assets/upload/")!.lowerBound...])
        let bytes = (0..<5_000_000).map { UInt8(truncatingIfNeeded: $0 &* 40_503 >> 5) }
        let uploaded = try RawHTTPClient(port: proxyPort, timeoutSeconds: 30).send(method: "POST", path: uploadPath,
                                                                                   headers: ["Content-Type": "image/jpeg"], body: bytes)
        #expect(uploaded.status == 200, "\(String(decoding: uploaded.body, as: UTF8.self))")
        let receipt = try #require(try JSON.parse(uploaded.body)["singleFile"])
        let saved = try RawHTTPClient(port: proxyPort).send(method: "POST", path: lists + "records/modify", headers: auth,
            body: JSON.object(["zoneID": .object(["zoneName": .string("Lists")]), "operations": .array([.object([
                "operationType": .string("create"), "record": .object(["recordName": .string("milk"), "recordType": .string("Item"),
                    "fields": .object(["photo": .object(["type": .string("ASSETID"), "value": receipt])])])])])]).serializedBytes())
        let download = try #require(try JSON.parse(saved.body)["records"]?.arrayValue?.first?["fields"]?["photo"]?["value"]?["downloadURL"]?
            .stringValue, "\(String(decoding: saved.body, as: UTF8.self))")
        let downloadPath = String(download[download.range(of: "/assets/download/")!.lowerBound...])
            .replacingOccurrences(of: "${f}", with: "milk.jpg")
        let served = try RawHTTPClient(port: proxyPort, timeoutSeconds: 30).send(method: "GET", path: downloadPath)
        #expect(served.status == 200 && served.body == bytes)
        // Over the proxy's own cap: nginx answers 413 before Lattice sees the body.
        let tooBig = try RawHTTPClient(port: proxyPort).send(method: "POST", path: uploadPath,
                                                             headers: ["Content-Length": "60000000"])
        #expect(tooBig.status == 413)
    }

    /// The access log's lines once `ready` holds for them (10 s at most).
    private func waitForLines(_ path: String, until ready: ([String]) -> Bool) throws -> [String] {
        var lines: [String] = []
        for _ in 0..<100 {
            let text = (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
            lines = text.split(separator: "\n").map(String.init)
            if ready(lines) { return lines }
            Thread.sleep(forTimeInterval: 0.1)
        }
        throw HarnessError("the access log \(path) lacks the expected lines: \(lines)")
    }
}
