import Foundation
import LatticeCore
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// The service scenario of `lattice-bench text`: one record with a `TEXT` field in a real `lattice serve`
/// (SQLite, the embedded default), edited by two clients (two connections with a device token each) that
/// take turns sending the trace's patches in batches as `splices` (`records/modify`, forceUpdate). Every
/// batch is one write: the server reads the stored state, applies the splices, and writes the state back
/// (fsync'd). At the end a `records/lookup` must read `endContent`.
enum TextServiceBench {
    static func run(_ trace: EditingTrace, batch: Int, localPatchesPerSecond: Double?) -> [String: JSONValue] {
        let root = NSTemporaryDirectory() + "lattice-bench-text-\(getpid())"
        var line: [String: JSONValue] = ["kind": .string("text-service"), "trace": .string(trace.name),
                                         "batch_patches": .integer(batch), "clients": .integer(2)]
        guard let server = BenchServer.startScratch(
            command: "text", root: root,
            extra: ["--requests-per-second-per-account", "0", "--quota-per-database", "1000000000000",
                    "--disk-budget", "1000000000000"],
            timeout: 1_800) else {
            line["error"] = .string("the server did not start")
            return line
        }
        defer {
            server.stop()
            try? FileManager.default.removeItem(atPath: root)
        }
        do {
            let first = FanoutBench.API(transport: try HTTPTransport(serverURL: server.url))
            let second = FanoutBench.API(transport: try HTTPTransport(serverURL: server.url))
            let owner = try first.signUp("writer")
            guard let device = try first.call("private", "tokens/issue", .object([:]), token: owner)["token"]?.stringValue else {
                throw SystemError.message("tokens/issue: no token")
            }
            let clients = [(first, owner), (second, device)]
            let zone: JSON = .object(["zoneName": .string("Text")])
            _ = try first.call("private", "zones/modify", .object(["operations": .array([.object([
                "operationType": .string("create"), "zone": .object(["zoneID": zone])])])]), token: owner)
            var start = String.UnicodeScalarView()
            start.append(contentsOf: trace.startContent)
            _ = try first.call("private", "records/modify", .object([
                "zoneID": zone, "desiredKeys": .array([]),
                "operations": .array([.object(["operationType": .string("create"), "record": .object([
                    "recordName": .string("doc"), "recordType": .string("Document"),
                    "fields": .object(["body": .object(["value": .string(String(start)), "type": .string("TEXT")])])])])]),
            ]), token: owner)

            // The patches in order, cut into batches; each batch goes from one client, the next from the other.
            var splices: [JSON] = []
            splices.reserveCapacity(trace.patchCount)
            for transaction in trace.transactions {
                for patch in transaction.patches {
                    var inserted = String.UnicodeScalarView()
                    inserted.append(contentsOf: patch.inserted)
                    splices.append(.array([.int(Int64(patch.position)), .int(Int64(patch.deleted)), .string(String(inserted))]))
                }
            }
            // The bodies are built (and their sizes counted) before the clock starts; each is serialized when
            // it is sent, as a client would.
            let bodies: [JSON] = stride(from: 0, to: splices.count, by: batch).map { index in
                .object([
                    "zoneID": zone, "desiredKeys": .array([]),
                    "operations": .array([.object(["operationType": .string("forceUpdate"), "record": .object([
                        "recordName": .string("doc"),
                        "fields": .object(["body": .object(["splices": .array(Array(splices[index ..< min(index + batch, splices.count)])),
                                                            "type": .string("TEXT")])])])])]),
                ])
            }
            let requestBytes = bodies.reduce(0) { $0 + $1.serializedBytes().count }
            let idle = FanoutBench.residentKiB(server.pid) ?? 0
            var peak = idle
            var latencies: [Double] = []
            let started = monotonicNanoseconds()
            for (turn, body) in bodies.enumerated() {
                let (api, token) = clients[turn % 2]
                let sent = monotonicNanoseconds()
                let answer = try api.call("private", "records/modify", body, token: token)
                latencies.append(Double(monotonicNanoseconds() - sent) / 1e9)
                if let error = answer["records"]?.arrayValue?.first?["serverErrorCode"]?.stringValue {
                    throw SystemError.message("batch \(turn) (from patch \(turn * batch)) refused: \(error) \(answer)")
                }
                if (turn + 1) % 16 == 0, let now = FanoutBench.residentKiB(server.pid) { peak = max(peak, now) }
            }
            let seconds = Double(monotonicNanoseconds() - started) / 1e9
            let looked = try second.call("private", "records/lookup", .object([
                "zoneID": zone, "records": .array([.object(["recordName": .string("doc")])])]), token: device)
            let final = looked["records"]?.arrayValue?.first?["fields"]?["body"]?["value"]?.stringValue
            latencies.sort()
            func percentile(_ p: Double) -> JSONValue {
                latencies.isEmpty ? .null : SyncBench.rounded(latencies[min(latencies.count - 1, Int(Double(latencies.count) * p))] * 1000, 2)
            }
            let rate = Double(splices.count) / seconds
            line["patches"] = .integer(splices.count)
            line["requests"] = .integer(latencies.count)
            line["seconds"] = SyncBench.rounded(seconds, 3)
            line["patches_per_s"] = .double(rate.rounded())
            line["request_ms_p50"] = percentile(0.5)
            line["request_ms_p99"] = percentile(0.99)
            line["request_body_bytes"] = .integer(requestBytes)
            line["final_ok"] = .bool(final == trace.endContent)
            line["server_rss_idle_kib"] = .integer(idle)
            line["server_rss_peak_kib"] = .integer(peak)
            if let local = localPatchesPerSecond, local > 0 {
                line["local_patches_per_s"] = .double(local.rounded())
                line["service_vs_local"] = SyncBench.rounded(rate / local, 4)
            }
        } catch {
            line["error"] = .string("\(error)")
        }
        return line
    }
}
