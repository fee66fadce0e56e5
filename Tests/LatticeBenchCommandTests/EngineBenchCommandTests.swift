import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// `lattice-bench engine` run as people run it, on a tiny configuration: its lines parse, both engines push
/// and pull every record in each pair, and each scenario has its summary. No timing is asserted.
@Suite(.serialized) struct EngineBenchCommandTests {
    @Test func tinyRunPairsTheEnginesAndCountsEveryRecord() throws {
        let outcome = try SyncBenchCommandTests.bench(["engine", "--pairs", "2", "--records", "30", "--batch", "7",
                                                       "--pull-records", "250"])
        #expect(outcome.status == 0, "\(outcome)")
        let lines = try outcome.stdout.split(separator: "\n").map { try JSON.parse(String($0)) }
        #expect(lines.first?["bench"]?.stringValue == "engine")
        let measurements = lines.filter { $0["kind"]?.stringValue == "measurement" }
        for scenario in ["push", "pull"] {
            let ofScenario = measurements.filter { $0["scenario"]?.stringValue == scenario }
            #expect(ofScenario.compactMap { $0["engine"]?.stringValue }.sorted() == ["new", "new", "old", "old"], "\(scenario)")
            for line in ofScenario {
                #expect(line["status"]?.stringValue == "ok", "\(line.serialized())")
                #expect(line["records"] == .int(scenario == "push" ? 30 : 250), "\(line.serialized())")
            }
            let summary = lines.first { $0["kind"]?.stringValue == "summary" && $0["scenario"]?.stringValue == scenario }
            #expect(summary?["ratio_new_to_old"]?.doubleValue != nil, "\(scenario) summary")
        }
        // The pushes went in requests of at most --batch records: 30 records, 7 a request, 5 requests.
        for line in measurements where line["scenario"]?.stringValue == "push" {
            #expect(line["requests"] == .int(5), "\(line.serialized())")
            #expect(line["local_edit_s"]?.doubleValue != nil && line["edit_and_send_records_per_s"]?.doubleValue != nil,
                    "the edits' time beside the send's: \(line.serialized())")
        }
        let bad = try SyncBenchCommandTests.bench(["engine", "--batch", "0"])
        #expect(bad.status == 2 && bad.stderr.contains("--batch"), "\(bad)")
    }
}
