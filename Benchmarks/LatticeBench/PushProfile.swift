// `lattice-bench push`: the server's side of a push alone, in-process: `LatticeService.respond(to:)` on
// `deltas/push` (or, with `--wire json`, `records/modify` with CRDT states as the engine's JSON path sends
// them) requests of new records (no HTTP, no client engine), one at a time, next to the storage
// ceiling of the same frames in the same process. For profiling the writer's turn (`perf record -g`).

import Foundation
import LatticeCore
import LatticeServer
import LatticeStore

struct PushProfileOptions {
    var batch = 200
    var pushes = 200
    var users = 4
    /// `binary` (`deltas/push`) or `json` (`records/modify` with CRDT states, `desiredKeys: []`).
    var wire = "binary"
    var help = false

    static let usage = """
        usage: lattice-bench push [--batch B] [--pushes N] [--users U] [--wire binary|json]

        Starts the service in-process on a fresh SQLite data directory (WAL, synchronous=FULL, the default
        limits without the rate limit), signs up U accounts (default 4) with one zone each, and sends N
        (default 200) binary deltas/push requests of B new records (default 200; the sync benchmark's Item
        shape) straight to LatticeService.respond(to:), one at a time, round-robin over the accounts, each
        with a clientOperationID as the engine sends. With --wire json the same records go as records/modify
        bodies of CRDT states (forceUpdate, atomic false, desiredKeys []), as the engine's JSON path sends
        them. The requests are built before the clock starts. Then
        it writes the same frames with the storage ceiling of `lattice-bench sync` (B rows per transaction).
        Prints one JSON line: records_per_s, push p50/p99/mean ms, the process's CPU time per push
        (push_cpu_ms, user + system: steadier than the wall clock on a shared machine), ceiling rows/s
        and the ratio.
        """

    static func parse(_ arguments: [String]) throws(UsageError) -> PushProfileOptions {
        var options = PushProfileOptions()
        var index = 0
        func number(_ name: String, _ range: ClosedRange<Int>) throws(UsageError) -> Int {
            index += 1
            guard index < arguments.count, let n = Int(arguments[index]), range.contains(n) else {
                throw UsageError(message: "\(name) must be \(range.lowerBound) to \(range.upperBound)")
            }
            return n
        }
        while index < arguments.count {
            switch arguments[index] {
            case "--batch": options.batch = try number("--batch", 1...400)
            case "--pushes": options.pushes = try number("--pushes", 1...100_000)
            case "--users": options.users = try number("--users", 1...64)
            case "--wire":
                index += 1
                guard index < arguments.count, ["binary", "json"].contains(arguments[index]) else {
                    throw UsageError(message: "--wire must be binary or json")
                }
                options.wire = arguments[index]
            case "-h", "--help": options.help = true
            default: throw UsageError(message: "unknown option \(arguments[index])")
            }
            index += 1
        }
        return options
    }
}

/// User plus system CPU seconds of this process so far.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(RUSAGE_SELF.rawValue, &usage)
    return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
}

enum PushProfile {
    static func run(_ options: PushProfileOptions) -> Int32 {
        printOneLine("push") { try withScratchService("push") { try measure(options, $0, directory: $1) } }
    }

    private static func measure(_ options: PushProfileOptions, _ service: LatticeService, directory: String) throws -> [String: JSONValue] {

        struct Account { let token: String; let zoneID: ZoneID }
        let accounts = try (0..<options.users).map { index -> Account in
            let account = try service.createAccount(name: "push\(index)")
            let token = account.token.text
            let reply = service.respond(to: HTTPRequest(
                method: "POST", path: "/database/1/lattice/production/private/zones/modify",
                headers: ["Content-Type": "application/json", "Authorization": "Bearer " + token],
                body: Array(#"{"operations":[{"operationType":"create","zone":{"zoneID":{"zoneName":"Push"}}}]}"#.utf8),
                remoteAddress: "127.0.0.1"))
            guard reply.status == 200 else { throw SystemError.message("zones/modify answered HTTP \(reply.status)") }
            return Account(token: token, zoneID: try ZoneID(zoneName: "Push", ownerRecordName: account.user.recordName))
        }

        // Every request built first: the frames of the sync benchmark's Item, stamped near the wall clock.
        let replica = ReplicaID(0x5EED_0000_0000_0001)
        let wallMs = UInt64(Date().timeIntervalSince1970 * 1000)
        var counter: UInt64 = 0
        func stamp() -> Stamp {
            counter += 1
            return Stamp(hlc: HLC(milliseconds: wallMs - 60_000 + counter / 60_000, counter: UInt16(counter % 60_000)),
                         replica: replica)
        }
        var requests: [HTTPRequest] = []
        var ceilingRows: [CeilingRow] = []
        for push in 0..<options.pushes {
            let account = accounts[push % accounts.count]
            let frames = try (0..<options.batch).map { item -> RecordFrame in
                let name = "p\(push)-r\(item)"
                var edit = try RecordEdit(creating: RecordID(recordName: name, zoneID: account.zoneID), recordType: "Item",
                                          at: stamp())
                try edit.set("name", to: .string("item \(name)"), at: stamp())
                try edit.set("n", to: .int64(Int64(item)), at: stamp())
                try edit.add([.string("alpha"), .string("tag\(item % 7)")], to: "tags", at: stamp())
                guard let frame = try edit.applied() else { throw SystemError.message("an edit produced no frame") }
                return frame
            }
            if push < accounts.count * 4 {
                ceilingRows += frames.map { CeilingRow(zone: Int64(push + 1), name: $0.recordName, frame: $0.bytes) }
            }
            if options.wire == "json" {
                let operations = try frames.map { frame in
                    JSON.object(["operationType": .string("forceUpdate"), "record": try frame.decoded().cloudKitJSON])
                }
                let body = JSON.object([
                    "zoneID": account.zoneID.cloudKitJSON, "atomic": .bool(false),
                    "clientOperationID": .string(UUID().uuidString), "operations": .array(operations),
                    "desiredKeys": .array([]),
                ])
                requests.append(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/records/modify",
                                            headers: ["Content-Type": "application/json",
                                                      "Authorization": "Bearer " + account.token],
                                            body: body.serializedBytes(), remoteAddress: "127.0.0.1"))
                continue
            }
            let body = SyncMessage.Push(clientOperationID: UUID().uuidString, atomic: false,
                                        delta: BinaryCodec.encodeDelta(zoneID: account.zoneID, frames: frames)).encoded()
            requests.append(HTTPRequest(method: "POST", path: "/database/1/lattice/production/private/deltas/push",
                                        headers: ["Content-Type": SyncMessage.contentType,
                                                  "Authorization": "Bearer " + account.token],
                                        body: body, remoteAddress: "127.0.0.1"))
        }

        var latencies: [Double] = []
        latencies.reserveCapacity(requests.count)
        let cpuBefore = processCPUSeconds()
        let began = monotonicNanoseconds()
        for request in requests {
            let start = monotonicNanoseconds()
            let response = service.respond(to: request)
            latencies.append(Double(monotonicNanoseconds() - start) / 1e6)
            guard response.status == 200 else {
                throw SystemError.message("\(request.path) answered HTTP \(response.status): "
                                          + String(decoding: response.body.prefix(300), as: UTF8.self))
            }
        }
        let seconds = Double(monotonicNanoseconds() - began) / 1e9
        let cpuSeconds = processCPUSeconds() - cpuBefore
        let records = options.pushes * options.batch

        let ceiling = try StorageCeiling.measure(rows: ceilingRows, target: max(20_000, ceilingRows.count),
                                                 batch: options.batch, path: directory + "/ceiling.sqlite",
                                                 budgetSeconds: 30)
        let ceilingRate = Double(ceiling.rows) / ceiling.seconds
        let rate = Double(records) / seconds
        func rounded(_ value: Double, _ places: Double = 100) -> JSONValue { .double((value * places).rounded() / places) }
        return [
            "kind": .string("push_in_process"),
            "endpoint": .string(options.wire == "json" ? "records/modify" : "deltas/push"),
            "batch": .integer(options.batch),
            "pushes": .integer(options.pushes),
            "users": .integer(options.users),
            "records": .integer(records),
            "seconds": rounded(seconds, 1000),
            "records_per_s": rounded(rate, 1),
            "push_p50_ms": rounded(percentile(latencies, 0.5) ?? 0),
            "push_p99_ms": rounded(percentile(latencies, 0.99) ?? 0),
            "push_mean_ms": rounded(latencies.reduce(0, +) / Double(max(1, latencies.count))),
            // CPU (user + system) of the process per push: steadier than the wall clock on a shared machine.
            "push_cpu_ms": rounded(cpuSeconds * 1000 / Double(options.pushes)),
            "ceiling_rows_per_s": rounded(ceilingRate, 1),
            "ratio_service_to_ceiling": rounded(rate / ceilingRate),
        ]
    }
}
