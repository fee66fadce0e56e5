import Foundation
import LatticeCore
@testable import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Testing

/// No existence oracle: a participant's write to a name held by a record outside their share answers byte
/// for byte what the same write to a missing name answers, for every operation type, parent and permission,
/// through `records/modify` (plain values and CRDT states) and `deltas/push`. The one cell where the two
/// cannot agree is a write a missing name would make (success): the taken name is refused instead, and the
/// record outside the share is never touched.
extension AuthorizationMatrixTests {
    /// How a cell's write is sent.
    enum ExistenceWrite: String, CaseIterable {
        case create, update, forceUpdate, replace, forceReplace, delete, forceDelete
        /// A CRDT state through `records/modify` forceUpdate, and the same state through `deltas/push`.
        case crdtForceUpdate, deltaPush
    }

    /// The parent a cell's write names: none, a record inside the share, one outside it, one that is missing.
    enum ExistenceParent: String, CaseIterable {
        case none, inShare, outside, missing

        func name(_ p: String) -> String? {
            switch self {
            case .none: return nil
            case .inShare: return "\(p)-child"
            case .outside: return "\(p)-outside"
            case .missing: return "\(p)-nothing"
            }
        }
    }

    /// A reply as the comparison sees it: status and body, without the random `uuid` of a whole-request error.
    private func comparable(_ reply: ServiceHarness.Reply) -> String {
        var json = reply.json
        if case .object(var object) = json {
            object["uuid"] = nil
            json = .object(object)
        }
        return "\(reply.status) \(json.serialized())"
    }

    @Test func aWriteToANameOutsideTheShareAnswersAsAMissingName() throws {
        let missing = try MatrixWorld(), taken = try MatrixWorld()
        let rows = ["priv-ro", "priv-rw", "admin-ro", "admin-rw", "pub-ro", "pub-rw"]
        var k = 0
        var table: [String] = []
        var identical = 0
        for account in rows {
            let zone = account.hasPrefix("pub") ? MatrixWorld.pub : MatrixWorld.lists
            let p = zone == MatrixWorld.pub ? "P" : "L"
            // One device per world (each world's owner has its own record name, so its own zone ID).
            var devices = try [missing, taken].map { w in
                DeviceStates(zoneID: try ZoneID(zoneName: zone, ownerRecordName: w.ann.recordName),
                             replica: UInt64(0x200 + k), clock: w.h.clock)
            }
            var line: [String] = []
            for write in ExistenceWrite.allCases {
                for parent in ExistenceParent.allCases {
                    k += 1
                    let name = "X\(k)"
                    // In `taken`, the owner holds the name outside the share: at the top of the zone, or
                    // under the record outside the share.
                    let placement = k % 2 == 0 ? [:] : parentRef("\(p)-outside")
                    let made = taken.owner("records/modify", zone, ["operations": .array([
                        operation("create", name, fields: ["title": value(.string("ann's"))], extra: placement)])])
                    try #require(matrixCode(made) == "OK", "seed \(name): \(made.json.serialized())")
                    let ownersRecord = taken.ownerView(zone, name)

                    let parentName = parent.name(p)
                    func send(_ w: MatrixWorld, device: inout DeviceStates) throws -> ServiceHarness.Reply {
                        let state = try device.make(name, fields: ["n": .int64(Int64(k))], parent: parentName)
                        switch write {
                        case .deltaPush:
                            return w.h.push(try DeltaBytes.push(device.zoneID, [state]), token: w.token(account),
                                            database: "shared")
                        case .crdtForceUpdate:
                            return w.shared("records/modify", zone, ["operations": .array([
                                .object(["operationType": .string("forceUpdate"), "record": state.cloudKitJSON])])], as: account)
                        default:
                            var extra: [String: JSON] = [:]
                            if let parentName { extra = parentRef(parentName) }
                            let needsTag = write == .update || write == .replace || write == .delete
                            let body = operation(write.rawValue, name, fields: ["n": value(.int(Int64(k)))],
                                                 tag: needsTag ? "1-1" : nil, extra: extra)
                            return w.shared("records/modify", zone, ["operations": .array([body])], as: account)
                        }
                    }
                    let asMissing = try send(missing, device: &devices[0]), asTaken = try send(taken, device: &devices[1])
                    let cell = "\(account) \(write.rawValue) parent=\(parent.rawValue)"
                    if matrixCode(asMissing) == "OK" {
                        // A missing name is written; the taken one must not be (it is outside the share).
                        let item = asTaken.records.first ?? .null
                        #expect(asTaken.status == 200 && item["serverErrorCode"] == .string("PERMISSION_FAILURE")
                                && item["reason"] == .string(Records.nameTakenOutsideShares(name).reason),
                                "\(cell): \(asTaken.json.serialized())")
                        line.append("\(write.rawValue)/\(parent.rawValue)=OK|taken")
                    } else {
                        #expect(comparable(asMissing) == comparable(asTaken),
                                "\(cell): missing \(comparable(asMissing)) but taken \(comparable(asTaken))")
                        if comparable(asMissing) == comparable(asTaken) { identical += 1 }
                        line.append("\(write.rawValue)/\(parent.rawValue)=\(shortCode(matrixCode(asMissing)))")
                    }
                    #expect(taken.ownerView(zone, name) == ownersRecord, "\(cell) changed the record outside the share")
                }
            }
            table.append("\(account): " + line.joined(separator: " "))
        }
        print("[existence oracle] \(identical) refusals identical byte for byte; per cell (missing name):\n"
              + table.joined(separator: "\n"))
        // Nothing else moved either: the shares' roots are where they were.
        for w in [missing, taken] {
            #expect(itemCode(w.ownerView(MatrixWorld.lists, "L-root")) == "OK")
            #expect(w.shareView(MatrixWorld.lists)["serverErrorCode"] == nil)
        }
    }

    /// Another share's `cloudkit.share` record is a record outside the caller's share like any other: a
    /// write to its name answers as a missing name's, not "a share record is changed with shares/modify".
    @Test func anotherSharesRecordNameAnswersAsAMissingName() throws {
        let missing = try MatrixWorld(), taken = try MatrixWorld()
        // In `taken`, a second hierarchy share in Lists, rooted at L-outside; bob (priv-rw) is not in it.
        let second = taken.owner("shares/create", MatrixWorld.lists, ["rootRecordName": .string("L-outside"),
                                                                      "title": .string("Second")])
        #expect(second.status == 200, "\(second.json.serialized())")
        let shareName = try #require(second["shareRecordName"]?.stringValue, "\(second.json.serialized())")
        let before = taken.ownerView(MatrixWorld.lists, shareName)
        for kind in ExistenceWrite.allCases where kind != .crdtForceUpdate && kind != .deltaPush {
            for parent in [nil, "L-child"] {
                let extra = parent.map(parentRef) ?? [:]
                let needsTag = kind == .update || kind == .replace || kind == .delete
                let body = operation(kind.rawValue, shareName, fields: ["n": value(.int(1))], tag: needsTag ? "1-1" : nil,
                                     extra: extra)
                let asMissing = missing.shared("records/modify", MatrixWorld.lists, ["operations": .array([body])], as: "priv-rw")
                let asTaken = taken.shared("records/modify", MatrixWorld.lists, ["operations": .array([body])], as: "priv-rw")
                let cell = "\(kind.rawValue) parent=\(parent ?? "none")"
                print("[existence oracle] another share's record name, \(cell): missing \(matrixCode(asMissing)), "
                      + "taken \(matrixCode(asTaken))")
                if matrixCode(asMissing) == "OK" {
                    // Written in `missing`: the owner deletes it again, so the next cell meets a missing name.
                    let gone = missing.owner("records/modify", MatrixWorld.lists, ["operations": .array([
                        operation("forceDelete", shareName, recordType: nil)])])
                    #expect(matrixCode(gone) == "OK", "\(gone.json.serialized())")
                    #expect(asTaken.records.first?["reason"] == .string(Records.nameTakenOutsideShares(shareName).reason),
                            "\(cell): \(asTaken.json.serialized())")
                } else {
                    #expect(comparable(asMissing) == comparable(asTaken), "\(cell): \(comparable(asMissing)) vs \(comparable(asTaken))")
                }
            }
        }
        #expect(taken.ownerView(MatrixWorld.lists, shareName) == before)
    }
}
