import Foundation
import LatticeCore

// `lattice demo`: two replicas editing the same shared list offline and converging by CRDT merge, with the
// bytes that cross between them.

let demoUsage = """
    usage: lattice demo [--json]

    Runs two in-process replicas (a laptop and a phone) through a concurrent offline edit of one
    shopping-list item, exchanges binary deltas both ways and shows that both end byte-identical,
    with which replica won each field. --json prints the merged record in CloudKit JSON form.
    """

func wallClockMilliseconds() -> UInt64 {
    UInt64(Date().timeIntervalSince1970 * 1000)
}

/// One device: a replica id, its clock and its copy of the zone.
struct Device {
    let name: String
    var clock: HybridLogicalClock
    var zone: ZoneState

    init(name: String, replica: UInt64, zoneID: ZoneID) {
        self.name = name
        clock = HybridLogicalClock(replica: ReplicaID(replica), time: { wallClockMilliseconds() })
        zone = ZoneState(zoneID: zoneID)
    }

    /// Receives bytes from another device: validate, check the clock bound, merge.
    mutating func receive(_ bytes: [UInt8]) throws {
        guard !bytes.isEmpty else { return } // the peer had nothing to send
        try zone.merge(encoded: bytes, clock: &clock)
    }

    /// What this device would send to a peer holding `peerVersion`, encoded.
    func bytesToSend(to peerVersion: VersionVector) -> [UInt8] {
        zone.encodedChanges(since: peerVersion) ?? []
    }

    func describe(_ recordName: String) -> String {
        guard let record = zone[recordName] else { return "  (missing)" }
        return record.values.map { name, value in "    \(name): \(render(value))" }.joined(separator: "\n")
    }
}

func render(_ value: FieldValue) -> String {
    switch value {
    case .scalar(let scalar): return render(scalar)
    case .list(_, let elements), .set(_, let elements): return "[" + elements.map(render).joined(separator: ", ") + "]"
    case .text(let text): return "\"\(text)\""
    }
}

func render(_ value: ScalarValue) -> String {
    switch value {
    case .string(let s): return "\"\(s)\""
    case .int64(let i): return String(i)
    case .double(let d): return String(d)
    case .timestamp(let t): return "@\(t)"
    case .bytes(let b): return "<\(b.count) bytes>"
    case .reference(let r): return "→\(r.recordName)"
    case .location(let l): return "(\(l.latitude), \(l.longitude))"
    case .asset(let a): return "<asset \(a.size) bytes>"
    }
}

func runDemo(json: Bool) throws {
    let zoneID = try ZoneID(zoneName: "Lists", ownerRecordName: "_demo")
    var laptop = Device(name: "laptop", replica: 0xA1, zoneID: zoneID)
    var phone = Device(name: "phone", replica: 0xB2, zoneID: zoneID)

    // 1. The laptop creates a list and one item.
    try laptop.zone.create(recordName: "groceries", recordType: "List", clock: &laptop.clock)
    try laptop.zone.update("groceries", clock: &laptop.clock) { record, stamp in
        try record.set("title", to: .string("Groceries"), at: stamp)
    }
    let parent = try Reference(recordName: "groceries")
    try laptop.zone.create(recordName: "milk", recordType: "Item", parent: parent, clock: &laptop.clock)
    try laptop.zone.update("milk", clock: &laptop.clock) { record, stamp in
        try record.set("text", to: .string("Milk"), at: stamp)
        try record.set("done", to: .int64(0), at: stamp)
        try record.add(.string("dairy"), to: "tags", at: stamp)
    }

    // 2. The phone receives the whole zone.
    let initial = laptop.zone.encodedFullState()
    try phone.receive(initial)
    if !json {
        print("1. laptop creates list \"Groceries\" with item \"milk\"; phone receives it (\(initial.count) bytes)")
        print(laptop.describe("milk"))
    }

    // 3. Both edit offline, concurrently.
    try laptop.zone.update("milk", clock: &laptop.clock) { record, stamp in
        try record.set("text", to: .string("Oat milk"), at: stamp)
        try record.add(.string("vegan"), to: "tags", at: stamp)
    }
    try phone.zone.update("milk", clock: &phone.clock) { record, stamp in
        try record.set("done", to: .int64(1), at: stamp)
        try record.remove(.string("dairy"), from: "tags", at: stamp)
        try record.add(.string("urgent"), to: "tags", at: stamp)
    }
    try phone.zone.update("milk", clock: &phone.clock) { record, stamp in
        try record.set("text", to: .string("Oat milk, 2 l"), at: stamp)
    }
    if !json {
        print("\n2. offline, concurrently:")
        print("   laptop sets text \"Oat milk\", adds tag vegan")
        print("   phone checks it off, removes tag dairy, adds tag urgent, then sets text \"Oat milk, 2 l\"")
    }

    // 4. They sync: each sends what the other has not seen, in binary.
    let toPhone = laptop.bytesToSend(to: phone.zone.version)
    let toLaptop = phone.bytesToSend(to: laptop.zone.version)
    try phone.receive(toPhone)
    try laptop.receive(toLaptop)

    let laptopBytes = laptop.zone.encodedFullState()
    let phoneBytes = phone.zone.encodedFullState()
    let converged = laptopBytes == phoneBytes
    guard let merged = laptop.zone["milk"] else { throw ZoneError.recordNotFound("milk") }

    if json {
        print(merged.cloudKitJSON.serialized())
    } else {
        print("\n3. sync: laptop → phone \(toPhone.count) bytes, phone → laptop \(toLaptop.count) bytes")
        print("   laptop now:\n\(laptop.describe("milk"))")
        print("   phone now:\n\(phone.describe("milk"))")
        print("   converged: \(converged ? "yes, byte-identical state (\(laptopBytes.count) bytes)" : "NO")")
        print("\n4. explain (who won each field):")
        for field in merged.fields {
            switch merged.provenance(of: field.name) {
            case .register(let stamp)?:
                let device = stamp.replica == laptop.clock.replica ? "laptop" : "phone"
                print("   \(field.name): written by \(device) (replica \(stamp.replica)) at \(stamp.hlc)")
            case .set(let elements, _)?:
                let parts = elements.map { value, dots in
                    "\(render(value)) added by " + dots.map { $0.replica == laptop.clock.replica ? "laptop" : "phone" }
                        .joined(separator: "+")
                }
                print("   \(field.name): " + parts.joined(separator: ", "))
            case .runs(let runs, _)?:
                let parts = runs.map { run, values in
                    values.map(render).joined(separator: ", ") + " by "
                        + (run.id.replica == laptop.clock.replica ? "laptop" : "phone")
                }
                print("   \(field.name): " + parts.joined(separator: ", "))
            case nil:
                break
            }
        }
        print("   tag dairy: removed by the phone after it saw the add, so it stays removed")
    }
    if !converged { exit(1) }
}

