import Foundation
import LatticeCore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice-bench soak` run as people run it, for a few seconds: its JSON lines parse, have the fields the
/// soak table in Docs/Benchmarks.md reads, and their counts add up. No timing is asserted.
@Suite(.serialized) struct SoakBenchCommandTests {
    @Test func aShortSoakPrintsIntervalLinesWithEveryCounter() throws {
        let directory = temporaryDirectory("lattice-bench-soak")
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let jsonl = directory + "/lines.jsonl"
        let clients = 4
        let outcome = try SyncBenchCommandTests.bench(["soak", "--minutes", "0.1", "--interval", "2", "--clients", String(clients),
                                                       "--seed", "7", "--jsonl", jsonl], timeoutSeconds: 120)
        #expect(outcome.status == 0, "\(outcome)")
        let lines = try outcome.stdout.split(separator: "\n").map { try JSON.parse(String($0)) }
        let copy = String(decoding: FileManager.default.contents(atPath: jsonl) ?? Data(), as: UTF8.self)
        #expect(copy == outcome.stdout)

        let header = try #require(lines.first)
        #expect(header["kind"]?.stringValue == "header")
        #expect(header["bench"]?.stringValue == "soak")
        #expect(header["parameters"]?["clients"] == .int(Int64(clients)))
        #expect(header["parameters"]?["minutes"]?.doubleValue == 0.1)
        #expect(header["parameters"]?["seed"]?.intValue == 7)
        let kinds = try #require(header["operations"]?.arrayValue).compactMap(\.stringValue)
        #expect(kinds == ["write", "query", "lookup", "feed", "wait"])

        // 6 s of traffic, a line every 2 s: three lines, perhaps a fourth for the requests in flight at the end.
        let intervals = lines.filter { $0["kind"]?.stringValue == "interval" }
        #expect((3...4).contains(intervals.count), "\(intervals.count) interval lines")
        var requests = 0
        for (index, line) in intervals.enumerated() {
            #expect(line["interval"]?.intValue == Int64(index + 1))
            let operations = try #require(line["operations"]?.objectValue)
            #expect(Set(operations.keys) == Set(kinds))
            var sum = 0
            for (_, operation) in operations {
                let count = Int(operation["requests"]?.intValue ?? -1)
                #expect(count >= 0)
                sum += count
                if count > 0 {
                    let p50 = try #require(operation["p50_ms"]?.doubleValue)
                    let p99 = try #require(operation["p99_ms"]?.doubleValue)
                    #expect(p50 > 0 && p50 <= p99)
                }
            }
            #expect(Int(line["requests"]?.intValue ?? -1) == sum)
            requests += sum
            #expect(line["total_requests"]?.intValue == Int64(requests))
            #expect((line["server_rss_mib"]?.doubleValue ?? 0) > 0)
            // The database, the listening socket and each client's connection at least.
            #expect((line["server_open_files"]?.intValue ?? 0) >= 3)
            #expect((line["server_sockets"]?.intValue ?? 0) >= 1)
            #expect(line["server_connections"]?.intValue != nil)
            #expect((line["data_bytes"]?.intValue ?? 0) > 0)
        }
        // Every kind of work was done over the run.
        let first = try #require(intervals.first)
        for kind in kinds {
            let done = intervals.reduce(0) { $0 + Int($1["operations"]?[kind]?["requests"]?.intValue ?? 0) }
            #expect(done > 0, "no \(kind) request in the run")
        }

        let summary = try #require(lines.last)
        #expect(summary["kind"]?.stringValue == "summary")
        #expect(summary["status"]?.stringValue == "ok", "\(summary.serialized())")
        #expect(summary["requests"]?.intValue == Int64(requests))
        #expect(summary["errors"]?.intValue == 0, "\(summary.serialized())")
        #expect(summary["intervals"]?.intValue == Int64(intervals.count))
        let full = intervals.filter { $0["partial"] != .bool(true) }
        #expect(full.count >= 2 && intervals.dropLast().allSatisfy { $0["partial"] == .bool(false) })
        #expect(summary["first_server_rss_mib"] == first["server_rss_mib"])
        #expect(summary["last_data_bytes"] == full.last?["data_bytes"])
        // Once every client has gone, their connections are closed: only the listening socket is left.
        #expect(summary["end_server_connections"]?.intValue == 0, "\(summary.serialized())")
        #expect((summary["end_server_open_files"]?.intValue ?? 99) <= (first["server_open_files"]?.intValue ?? 0))

        // The server is gone: the bench stopped and reaped it.
        let pid = try #require(header["server"]?["pid"]?.intValue)
        #expect(kill(pid_t(pid), 0) == -1 && errno == ESRCH)
    }

    @Test(arguments: [
        (["soak", "--minutes", "0"], "--minutes"),
        (["soak", "--minutes", "x"], "--minutes"),
        (["soak", "--clients", "0"], "--clients"),
        (["soak", "--interval", "-1"], "--interval"),
        (["soak", "--seed", "-3"], "--seed"),
        (["soak", "--frobnicate"], "--frobnicate"),
    ])
    func badParametersExitTwoWithAClearError(arguments: [String], named option: String) throws {
        let outcome = try SyncBenchCommandTests.bench(arguments, timeoutSeconds: 60)
        #expect(outcome.status == 2, "\(outcome)")
        #expect(outcome.stdout.isEmpty)
        #expect(outcome.stderr.contains("lattice-bench soak: error:") && outcome.stderr.contains(option), "\(outcome)")
    }
}
