import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// `lattice-bench devices` and `lattice-bench fanout` run as people run them, on tiny configurations: their
/// lines parse and the counts add up. No timing is asserted.
@Suite(.serialized) struct DevicesAndFanoutBenchCommandTests {
    static func lines(_ outcome: CLITests.Outcome) throws -> [JSON] {
        try outcome.stdout.split(separator: "\n").map { try JSON.parse(String($0)) }
    }

    @Test func tinyDevicesRunAcknowledgesEveryRecordBesideBothCeilings() throws {
        let outcome = try SyncBenchCommandTests.bench(["devices", "--devices", "6", "--changes", "3", "--records-per-change", "2",
                                                       "--drivers", "3", "--ceiling-rows", "50"])
        #expect(outcome.status == 0, "\(outcome)")
        let lines = try Self.lines(outcome)
        #expect(lines.first?["bench"]?.stringValue == "devices")
        let service = try #require(lines.first { $0["scenario"]?.stringValue == "devices" })
        #expect(service["records"] == .int(6 * 3 * 2) && service["requests"] == .int(6 * 3), "\(service.serialized())")
        #expect(service["server_cpu_us_per_request"]?.doubleValue != nil)
        let ceilings = lines.filter { $0["scenario"]?.stringValue == "ceiling" }.compactMap { $0["batch"]?.intValue }
        #expect(ceilings == [1, 50])
        let summary = try #require(lines.first { $0["kind"]?.stringValue == "summary" })
        #expect(summary["ratio_to_ceiling_1"]?.doubleValue != nil && summary["ratio_to_ceiling_50"]?.doubleValue != nil)
    }

    @Test func tinyFanoutRunNotifiesEveryListeningDevice() throws {
        let outcome = try SyncBenchCommandTests.bench(["fanout", "--connections", "40", "--participants", "5", "--rounds", "2",
                                                       "--idle-seconds", "1"])
        #expect(outcome.status == 0, "\(outcome)")
        let lines = try Self.lines(outcome)
        let memory = try #require(lines.first { $0["scenario"]?.stringValue == "memory" })
        #expect(memory["streams"] == .int(40) && memory["server_rss_per_stream_bytes"] != nil, "\(memory.serialized())")
        let rounds = lines.filter { $0["scenario"]?.stringValue == "fanout" && $0["kind"]?.stringValue == "measurement" }
        #expect(rounds.count == 2 && rounds.allSatisfy { $0["notified"] == .int(10) && $0["status"] == .string("ok") },
                "\(rounds.map { $0.serialized() })")
        let summary = try #require(lines.first { $0["kind"]?.stringValue == "summary" })
        #expect(summary["missed"] == .int(0) && summary["p99_ms"]?.doubleValue != nil)
    }

    @Test(arguments: [
        (["devices", "--devices", "0"], "--devices"),
        (["devices", "--records-per-change", "3"], "--records-per-change"),
        (["devices", "--seconds", "-1"], "--seconds"),
        (["devices", "--frobnicate"], "--frobnicate"),
        (["fanout", "--connections", "1"], "--connections"),
        (["fanout", "--participants", "101"], "--participants"),
        (["fanout", "--connections", "10", "--participants", "6"], "--connections"),
    ])
    func badParametersExitTwoWithAClearError(arguments: [String], named option: String) throws {
        let outcome = try SyncBenchCommandTests.bench(arguments, timeoutSeconds: 60)
        #expect(outcome.status == 2, "\(outcome)")
        #expect(outcome.stdout.isEmpty)
        #expect(outcome.stderr.contains("lattice-bench \(arguments[0]): error:") && outcome.stderr.contains(option), "\(outcome)")
    }
}
