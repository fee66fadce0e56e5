import Foundation
import LatticeCore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice serve --quota-per-database`, `--requests-per-second-per-account` and `--trusted-proxy` with
/// IPv6: each takes effect on a real server, and a bad value is refused at start-up naming the flag.
@Suite(.serialized) struct ServeLimitFlagTests {
    static let base = CrashSuite.base

    @Test func aTinyQuotaPerDatabaseRefusesAWriteWithQuotaExceeded() throws {
        let data = temporaryDirectory("lattice-quota-flag")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let token = try CrashSuite.addUser("quota", data: data)
        let server = try ServerUnderTest(data: data, extra: ["--quota-per-database", "4K"])
        defer { server.kill(SIGTERM) }
        let client = try RawHTTPClient(port: server.port, timeoutSeconds: 10)
        let headers = ["Authorization": "Bearer " + token]
        func write(_ name: String, bytes: Int) throws -> RawHTTPClient.Response {
            try client.send(method: "POST", path: Self.base + "records/modify", headers: headers, body: JSON.object([
                "zoneID": .object(["zoneName": .string("_defaultZone")]),
                "operations": .array([operation("create", name,
                                                fields: ["text": value(.string(String(repeating: "x", count: bytes)))])]),
            ]).serializedBytes())
        }
        // A small record fits in 4 KiB; an 8 KB one does not (under the default 1 GiB quota it would).
        let small = try write("small", bytes: 100)
        #expect(small.status == 200, "\(String(decoding: small.body, as: UTF8.self))")
        let large = try write("large", bytes: 8_000)
        let answer = try JSON.parse(large.body)
        let record = answer["records"]?.arrayValue?.first
        let code = record?["serverErrorCode"]?.stringValue ?? answer["serverErrorCode"]?.stringValue
        #expect(code == "QUOTA_EXCEEDED", "\(large.status) \(String(decoding: large.body, as: UTF8.self))")
        let reason = record?["reason"]?.stringValue ?? answer["reason"]?.stringValue ?? ""
        #expect(reason.contains("its quota is 4096"), "\(reason)")
    }

    @Test func aRateOfTwoPerSecondThrottlesAQuickRunOfRequests() throws {
        let data = temporaryDirectory("lattice-rate-flag")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let token = try CrashSuite.addUser("rate", data: data)
        let server = try ServerUnderTest(data: data, extra: ["--requests-per-second-per-account", "2"])
        defer { server.kill(SIGTERM) }
        let client = try RawHTTPClient(port: server.port, timeoutSeconds: 10)
        let headers = ["Authorization": "Bearer " + token]
        // A burst of 4 (2 x the rate) is served; then, sent back to back, a request is throttled long
        // before the bucket could refill a whole request per 0.5 s.
        var statuses: [Int] = []
        var throttled: RawHTTPClient.Response?
        let started = ContinuousClock.now
        for _ in 0..<10 {
            let reply = try client.send(method: "POST", path: Self.base + "zones/list", headers: headers,
                                        body: Array("{}".utf8))
            statuses.append(reply.status)
            if reply.status == 429 { throttled = reply; break }
        }
        let elapsed = ContinuousClock.now - started
        #expect(Array(statuses.prefix(4)) == [200, 200, 200, 200], "\(statuses)")
        let refusal = try #require(throttled, "no request throttled: \(statuses) in \(elapsed)")
        #expect(try JSON.parse(refusal.body)["serverErrorCode"]?.stringValue == "THROTTLED")
        #expect(refusal.headers["retry-after"] != nil)
        // The rate is the flag's, not the default 200/s: with 2/s the fifth quick one is refused.
        if elapsed < .milliseconds(400) { #expect(statuses.count == 5, "\(statuses) in \(elapsed)") }
    }

    @Test func badLimitFlagsAreRefusedNamingTheFlag() throws {
        let data = temporaryDirectory("lattice-limit-flags")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let cases: [([String], String)] = [
            (["--quota-per-database", "0"], "--quota-per-database must be a positive number of bytes"),
            (["--quota-per-database", "lots"], "--quota-per-database must be a positive number of bytes"),
            (["--quota-per-database", "9999999T"], "--quota-per-database must be a positive number of bytes"),
            (["--requests-per-second-per-account", "-1"], "--requests-per-second-per-account must be an integer from 0 to 1000000"),
            (["--requests-per-second-per-account", "2.5"], "--requests-per-second-per-account must be an integer from 0 to 1000000"),
            (["--trusted-proxy", "2001:db8::/129"], "--trusted-proxy must be an IPv4 or IPv6 address or CIDR block"),
            (["--trusted-proxy", "127.0.0.1", "--trusted-proxy", "10.0.0.0/8,10.1.0.0/16"],
             "not 10.0.0.0/8,10.1.0.0/16"),
            (["--trusted-proxy", "[::1]"], "--trusted-proxy must be an IPv4 or IPv6 address or CIDR block"),
        ]
        for (flags, message) in cases {
            let refused = try Self.run(["serve", "--data", data + "/server", "--port", "0"] + flags)
            #expect(refused.status == 2 && refused.stderr.contains(message), "\(flags): \(refused)")
        }
        let help = try CLITests.lattice("serve", "--help")
        for flag in ["--quota-per-database BYTES", "--requests-per-second-per-account N", "2001:db8::/32"] {
            #expect(help.stdout.contains(flag), "\(flag) in lattice serve --help")
        }
    }

    @Test func anIPv6TrustedProxyBlockIsAcceptedAndAnIPv4OneStillForwards() throws {
        let data = temporaryDirectory("lattice-proxy-flag")
        defer { try? FileManager.default.removeItem(atPath: data) }
        let accessLog = data + "-access.log"
        defer { try? FileManager.default.removeItem(atPath: accessLog) }
        let server = try ServerUnderTest(
            data: data, extra: ["--trusted-proxy", "2001:db8:ffff::/48", "--trusted-proxy", "127.0.0.0/8",
                                "--access-log", accessLog])
        defer { server.kill(SIGTERM) }
        let reply = try RawHTTPClient(port: server.port).send(
            method: "GET", path: "/healthz", headers: ["X-Forwarded-For": "2001:db8:5:6::1, 2001:db8:ffff::99"])
        #expect(reply.status == 200)
        // 2001:db8:ffff::99 is a trusted proxy too, so the client is the hop left of it, logged in full.
        var logged = ""
        for _ in 0..<100 {  // 10 s at most
            logged = (try? String(contentsOfFile: accessLog, encoding: .utf8)) ?? ""
            if logged.contains("/healthz") { break }
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(logged.contains(" 2001:db8:5:6::1 GET /healthz "), "\(logged)")
    }

    /// `lattice ARGUMENTS`, which must exit within 30 s (a refused flag exits at once); killed otherwise.
    private static func run(_ arguments: [String]) throws -> CLITests.Outcome {
        let (process, output, errors) = try CLITests.start(arguments, home: nil)
        var polls = 0
        while process.isRunning && polls < 300 {
            Thread.sleep(forTimeInterval: 0.1)
            polls += 1
        }
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        return CLITests.Outcome(status: process.terminationStatus, stdout: output.finish(), stderr: errors.finish())
    }
}
