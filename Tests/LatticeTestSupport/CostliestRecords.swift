import Foundation
import LatticeCore

/// The costliest records the write caps allow, in the two shapes that once held SQLite's one writer for
/// 12-21 s with a single request (issue 29): a stored list whose causal context names as many replicas as
/// the caps allow and holds no entries, and a state of the same list with as many entries as the caps allow,
/// every dot from one replica that context does not name. Joining the second into the first asks the stored
/// context about every entry; with a context scanned from its start that was entries x replicas steps.
///
/// Both are built as CloudKit JSON with CRDT metadata (the form `records/modify` takes) and, for the binary
/// path, encoded from it. `ms` is the clock value of every stamp: it must lie within the server's drift bound.
public enum CostliestRecords {
    public static let field = "list"
    public static let recordType = "Blob"

    /// Replica ids from 2^63 up take the longest varint (10 bytes): the most bytes per context entry.
    public static let firstWideReplica: UInt64 = 1 << 63
    /// The one replica of the entries' dots: not in the wide context, and above every replica in it, so
    /// that a context scanned in order from its start is read whole for each entry (a replica below them
    /// all would stop such a scan at its first entry).
    public static let entriesReplica: UInt64 = .max

    /// A record of one `INT64_LIST` field with `context` and `entries` (value, dot).
    public static func json(_ name: String, ms: UInt64, context: [Stamp], entries: [(Int64, Stamp)]) -> JSON {
        let created = Stamp(hlc: HLC(milliseconds: ms, counter: 0), replica: ReplicaID(1))
        return .object([
            "recordName": .string(name), "recordType": .string(recordType),
            "fields": .object([field: .object([
                "type": .string("INT64_LIST"),
                "value": .array(entries.map { .int($0.0) }),
                "crdt": .object([
                    "entries": .array(entries.map { .object(["value": .int($0.0), "stamp": $0.1.json]) }),
                    "context": .array(context.map(\.json)),
                ]),
            ])]),
            "crdt": .object(["generation": .int(1), "created": created.json]),
        ])
    }

    /// The stored shape: a context of `replicas` replicas, no entries.
    public static func wideContext(_ name: String, replicas: Int, ms: UInt64) -> JSON {
        json(name, ms: ms, context: (0 ..< UInt64(replicas)).map {
            Stamp(hlc: HLC(milliseconds: ms, counter: 1), replica: ReplicaID(firstWideReplica + $0))
        }, entries: [])
    }

    /// The pushed shape: `count` (at most 65,536) entries with distinct values, all dots from
    /// `entriesReplica` at `ms` with counters 0, 1, ...
    public static func manyEntries(_ name: String, count: Int, ms: UInt64) -> JSON {
        let dots = (0 ..< count).map {
            Stamp(hlc: HLC(milliseconds: ms, counter: UInt16($0)), replica: ReplicaID(entriesReplica))
        }
        return json(name, ms: ms, context: dots.last.map { [$0] } ?? [],
                    entries: dots.enumerated().map { (Int64($0.offset), $0.element) })
    }

    public static func record(_ json: JSON, zoneID: ZoneID) throws -> Record {
        try Record(cloudKitJSON: json, zoneID: zoneID)
    }

    /// The largest n in 1...limit whose record `make(n)` encodes within the write limit (1 MiB), and the
    /// record's JSON body size (what the JSON path would send) stays within `jsonBytes` when given.
    public static func largest(upTo limit: Int, jsonBytes: Int? = nil, zoneID: ZoneID, _ make: (Int) -> JSON) -> Int {
        func fits(_ n: Int) -> Bool {
            let json = make(n)
            if let jsonBytes, json.serializedBytes().count > jsonBytes { return false }
            guard let record = try? record(json, zoneID: zoneID) else { return false }
            return (try? RecordFrame(encoding: record)) != nil
        }
        if fits(limit) { return limit }
        var low = 1, high = limit // fits(low), !fits(high)
        while high - low > 1 {
            let middle = (low + high) / 2
            if fits(middle) { low = middle } else { high = middle }
        }
        return low
    }
}
