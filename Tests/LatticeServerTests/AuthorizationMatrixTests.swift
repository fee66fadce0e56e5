import Foundation
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeSharing
import LatticeTestSupport
import Synchronization
import Testing

// The sharing authorization matrix: every endpoint that touches records or shares, called by every kind of
// caller, with both permissions, against records inside a share and outside it. The roles are built for
// real through the API (invite, URL, accept, remove). Each cell is asserted: the exact serverErrorCode (or
// success), and for every write that a refused request changed nothing, seen by the owner afterwards.
//
// The other parts of the sharing test plan live in extensions of this suite (Sharing*MatrixTests.swift):
// smuggled fields, tampered links, the participant limit, moves, revocation.

// MARK: - The world

struct MatrixAccount: Sendable {
    let name: String
    let token: String
    let recordName: String
}

/// Three zones of one owner ("ann"):
/// - `Lists`: a hierarchy share rooted at `L-root` (`L-root` > `L-child` > `L-grand`; `L-outside` is outside),
///   private: two administrators, two private users, two removed and two pending invitees (readOnly and
///   readWrite of each);
/// - `Pub`: a hierarchy share rooted at `P-root` (same shape), public with readWrite: two public users, one
///   joined through a readOnly link, one through a readWrite link (CloudKit does not mix public and invited
///   participants in one share);
/// - `Other`: not shared (`O-root` > `O-rec`).
/// Plus a stranger and `guests` spare accounts.
final class MatrixWorld: Sendable {
    static let lists = "Lists", pub = "Pub", other = "Other"
    static let roleAccounts = ["admin-ro", "admin-rw", "priv-ro", "priv-rw", "pub-ro", "pub-rw", "removed-ro", "removed-rw",
                               "pending-ro", "pending-rw", "stranger"]

    let h: ServiceHarness
    let ann: MatrixAccount
    let accounts: [String: MatrixAccount]
    /// The share links made while seeding (set once, in `init`).
    private struct Links {
        var lists = ""
        var pubReadOnly = ""
        var pubReadWrite = ""
    }
    private let links = Mutex(Links())
    var listsLink: String { links.withLock { $0.lists } }
    var pubLinkReadOnly: String { links.withLock { $0.pubReadOnly } }
    var pubLinkReadWrite: String { links.withLock { $0.pubReadWrite } }

    init(guests: Int = 0, configure: (inout ServiceConfiguration) -> Void = { _ in }) throws {
        h = try ServiceHarness(configure: configure)
        let signedUp = try h.signUp("ann")
        ann = MatrixAccount(name: "ann", token: signedUp.token, recordName: signedUp.recordName)
        var accounts: [String: MatrixAccount] = [:]
        for name in Self.roleAccounts + (0..<guests).map({ "guest\($0)" }) {
            let account = try h.signUp(name)
            accounts[name] = MatrixAccount(name: name, token: account.token, recordName: account.recordName)
        }
        self.accounts = accounts
        for zone in [Self.lists, Self.pub, Self.other] { try h.createZone(zone, token: ann.token) }
        for (zone, p) in [(Self.lists, "L"), (Self.pub, "P")] {
            try expectOK(h.modify(zone, [
                operation("create", "\(p)-root", fields: ["title": value(.string("root"))]),
                operation("create", "\(p)-child", fields: ["title": value(.string("child"))], extra: parentRef("\(p)-root")),
                operation("create", "\(p)-grand", fields: ["title": value(.string("grand"))], extra: parentRef("\(p)-child")),
                operation("create", "\(p)-outside", fields: ["title": value(.string("outside"))]),
            ], token: ann.token), "seed \(zone)")
        }
        try expectOK(h.modify(Self.other, [
            operation("create", "O-root", fields: ["title": value(.string("root"))]),
            operation("create", "O-rec", fields: ["title": value(.string("rec"))], extra: parentRef("O-root")),
        ], token: ann.token), "seed Other")

        // Lists: invited participants.
        try expectOK(owner("shares/create", Self.lists, ["rootRecordName": .string("L-root"), "title": .string("Lists")]),
                     "create Lists share")
        try expectOK(owner("shares/modify", Self.lists, ["participants": .array([
            invite("admin-ro", "readOnly", role: "administrator"), invite("admin-rw", "readWrite", role: "administrator"),
            invite("priv-ro", "readOnly"), invite("priv-rw", "readWrite"),
            invite("removed-ro", "readOnly"), invite("removed-rw", "readWrite"),
            invite("pending-ro", "readOnly"), invite("pending-rw", "readWrite"),
        ])]), "invite")
        let listsLink = try link(Self.lists, permission: "readWrite")
        links.withLock { $0.lists = listsLink }
        for name in ["admin-ro", "admin-rw", "priv-ro", "priv-rw", "removed-ro", "removed-rw"] {
            try expectAccepted(accept(listsLink, as: name), name)
        }
        try expectOK(owner("shares/modify", Self.lists, ["participants": .array([
            .object(["operation": .string("remove"), "userName": .string("removed-ro")]),
            .object(["operation": .string("remove"), "userName": .string("removed-rw")]),
        ])]), "remove")

        // Pub: public participants.
        try expectOK(owner("shares/create", Self.pub, ["rootRecordName": .string("P-root"), "title": .string("Pub"),
                                                        "publicPermission": .string("readWrite")]), "create Pub share")
        let pubLinkReadOnly = try link(Self.pub, permission: "readOnly")
        let pubLinkReadWrite = try link(Self.pub, permission: "readWrite")
        links.withLock {
            $0.pubReadOnly = pubLinkReadOnly
            $0.pubReadWrite = pubLinkReadWrite
        }
        try expectAccepted(accept(pubLinkReadOnly, as: "pub-ro"), "pub-ro")
        try expectAccepted(accept(pubLinkReadWrite, as: "pub-rw"), "pub-rw")
    }

    func account(_ name: String) -> MatrixAccount {
        guard let account = accounts[name] else { fatalError("no account \(name)") }
        return account
    }

    func token(_ name: String) -> String { name == "ann" ? ann.token : account(name).token }

    /// A zone id: the owner names it in the private database; anyone else names it with its owner.
    func zoneID(_ zone: String, shared: Bool) -> JSON {
        shared ? .object(["zoneName": .string(zone), "ownerRecordName": .string(ann.recordName)])
               : .object(["zoneName": .string(zone)])
    }

    /// A call by the owner in the private database, about `zone`.
    func owner(_ operation: String, _ zone: String, _ body: [String: JSON] = [:]) -> ServiceHarness.Reply {
        var body = body
        body["zoneID"] = zoneID(zone, shared: false)
        return h.call(operation, .object(body), token: ann.token)
    }

    /// A call by a participant (or anyone else) in the shared database, about the owner's `zone`.
    func shared(_ operation: String, _ zone: String, _ body: [String: JSON] = [:], as name: String) -> ServiceHarness.Reply {
        var body = body
        body["zoneID"] = zoneID(zone, shared: true)
        return h.call(operation, .object(body), token: token(name), database: "shared")
    }

    func link(_ zone: String, permission: String, extra: [String: JSON] = [:]) throws -> String {
        var body = extra
        body["permission"] = .string(permission)
        let reply = owner("shares/url", zone, body)
        return try #require(reply["url"]?.stringValue, "shares/url: \(reply.json.serialized())")
    }

    /// `records/accept` of one link; the result item.
    func accept(_ link: String, as name: String) -> JSON {
        let reply = h.call("records/accept", .object(["shortGUIDs": .array([.object(["value": .string(link)])])]),
                           token: token(name), database: "shared")
        return reply.code == nil ? (reply["results"]?.arrayValue?.first ?? .null) : reply.json
    }

    func resolve(_ link: String, as name: String) -> JSON {
        let reply = h.call("records/resolve", .object(["shortGUIDs": .array([.object(["value": .string(link)])])]),
                           token: token(name), database: "shared")
        return reply.code == nil ? (reply["results"]?.arrayValue?.first ?? .null) : reply.json
    }

    /// The owner's view of a record: its lookup item, serialized (a NOT_FOUND item when it is gone).
    func ownerView(_ zone: String, _ name: String) -> JSON {
        owner("records/lookup", zone, ["records": .array([.object(["recordName": .string(name)])])]).records.first ?? .null
    }

    /// The owner's view of a zone's share (its error, without the random uuid, when there is none).
    func shareView(_ zone: String) -> JSON {
        let reply = owner("shares/lookup", zone)
        guard let code = reply.code else { return reply.json }
        return .object(["serverErrorCode": .string(code), "reason": reply["reason"] ?? .null])
    }

    /// A participant's entry in the owner's view of the share.
    func participant(_ zone: String, _ name: String) -> JSON? {
        let recordName = name == "ann" ? ann.recordName : account(name).recordName
        return shareView(zone)["participants"]?.arrayValue?.first { $0["userRecordName"]?.stringValue == recordName }
    }

    private func invite(_ name: String, _ permission: String, role: String? = nil) -> JSON {
        var object: [String: JSON] = ["operation": .string("invite"), "userName": .string(name),
                                      "permission": .string(permission)]
        if let role { object["role"] = .string(role) }
        return .object(object)
    }

    private func expectOK(_ reply: ServiceHarness.Reply, _ what: String) throws {
        let failed = reply.code != nil || reply.records.contains { $0["serverErrorCode"] != nil }
        if reply.status != 200 || failed { throw HarnessError("\(what): \(reply.status) \(reply.json.serialized())") }
    }

    private func expectAccepted(_ result: JSON, _ what: String) throws {
        guard result["participantStatus"]?.stringValue == "accepted" else {
            throw HarnessError("accept by \(what): \(result.serialized())")
        }
    }
}

func parentRef(_ name: String) -> [String: JSON] { ["parent": .object(["recordName": .string(name)])] }

/// The error code of a reply: the whole request's, else the first item's (records, zones or results), else "OK".
func matrixCode(_ reply: ServiceHarness.Reply) -> String {
    if let code = reply.code { return code }
    for key in ["records", "zones", "results"] {
        if let code = reply[key]?.arrayValue?.first?["serverErrorCode"]?.stringValue { return code }
    }
    return reply.status == 200 ? "OK" : "HTTP\(reply.status)"
}

func itemCode(_ item: JSON) -> String { item["serverErrorCode"]?.stringValue ?? "OK" }

/// Short forms for the printed table.
func shortCode(_ code: String) -> String {
    switch code {
    case "NOT_FOUND": return "NF"
    case "ZONE_NOT_FOUND": return "ZNF"
    case "PERMISSION_FAILURE": return "PF"
    case "BAD_REQUEST": return "BR"
    case "ACCESS_DENIED": return "AD"
    case "ATOMIC_ERROR": return "AE"
    case "CONFLICT": return "CF"
    case "TOO_MANY_PARTICIPANTS": return "TMP"
    default: return code
    }
}

extension ServiceHarness {
    /// Parks a `changes/wait` in the shared (or private) database; the answer arrives in the returned slot.
    func park(token: String, syncToken: String?, timeout: Int = 20, database: String = "shared") -> ResponseBox {
        let slot = ResponseBox()
        var body: [String: JSON] = ["timeout": .int(Int64(timeout))]
        if let syncToken { body["syncToken"] = .string(syncToken) }
        service.handle(HTTPRequest(method: "POST", path: "/database/1/lattice/production/\(database)/changes/wait",
                                   headers: ["Authorization": "Bearer " + token], body: JSON.object(body).serializedBytes())) {
            slot.set($0)
        }
        return slot
    }
}

// MARK: - The matrix

enum MatrixCaller: String, CaseIterable {
    case owner, administrator, privateUser, publicUser, removed, pending, stranger
}

struct MatrixRow: Hashable {
    let caller: MatrixCaller
    /// nil for the owner and the stranger, who have no participant permission.
    let permission: SharePermission?

    static let all: [MatrixRow] = MatrixCaller.allCases.flatMap { caller -> [MatrixRow] in
        caller == .owner || caller == .stranger ? [MatrixRow(caller: caller, permission: nil)]
            : [MatrixRow(caller: caller, permission: .readOnly), MatrixRow(caller: caller, permission: .readWrite)]
    }

    var label: String { "\(caller.rawValue)/\(permission.map { $0 == .readOnly ? "RO" : "RW" } ?? "-")" }
    var isOwner: Bool { caller == .owner }
    /// Accepted in their home share.
    var isActive: Bool { caller == .administrator || caller == .privateUser || caller == .publicUser }
    var readWrite: Bool { permission == .readWrite }

    var account: String {
        let suffix = permission == .readOnly ? "-ro" : "-rw"
        switch caller {
        case .owner: return "ann"
        case .administrator: return "admin" + suffix
        case .privateUser: return "priv" + suffix
        case .publicUser: return "pub" + suffix
        case .removed: return "removed" + suffix
        case .pending: return "pending" + suffix
        case .stranger: return "stranger"
        }
    }

    /// The zone of the share this caller belongs to (or would): Pub for public users, Lists for the rest.
    var home: String { caller == .publicUser ? MatrixWorld.pub : MatrixWorld.lists }
    var otherShared: String { caller == .publicUser ? MatrixWorld.lists : MatrixWorld.pub }
    var database: String { isOwner ? "private" : "shared" }
}

enum MatrixTarget: String, CaseIterable {
    /// A record inside the caller's share (not its root).
    case inShare
    /// The root record of the caller's share.
    case root
    /// A record in the same zone, outside the hierarchy.
    case outside
    /// Another zone of the owner, shared with others (not with this caller).
    case otherShared
    /// Another zone of the owner, not shared at all.
    case unshared

    var sameZone: Bool { self == .inShare || self == .root || self == .outside }

    func zone(_ row: MatrixRow) -> String {
        switch self {
        case .inShare, .root, .outside: return row.home
        case .otherShared: return row.otherShared
        case .unshared: return MatrixWorld.other
        }
    }

    /// The existing record this target names.
    func record(_ row: MatrixRow) -> String {
        let p = { (zone: String) in zone == MatrixWorld.lists ? "L" : zone == MatrixWorld.pub ? "P" : "O" }
        switch self {
        case .inShare: return "\(p(row.home))-child"
        case .root: return "\(p(row.home))-root"
        case .outside: return "\(p(row.home))-outside"
        case .otherShared: return "\(p(row.otherShared))-child"
        case .unshared: return "O-rec"
        }
    }

    var explanation: String {
        switch self {
        case .inShare: return "a record inside the caller's share (L-child, or P-child for public users)"
        case .root: return "the root of the caller's share (L-root / P-root)"
        case .outside: return "a record of the owner in the same zone, outside the hierarchy (L-outside / P-outside)"
        case .otherShared: return "another zone of the owner, shared with others (Pub, or Lists for public users)"
        case .unshared: return "another zone of the owner, not shared (Other)"
        }
    }
}

enum MatrixEndpoint: String, CaseIterable {
    case lookup, query, create, update, forceUpdate, replace, forceReplace, delete, forceDelete
    case changesZone, changesDatabase, changesWait, zonesList
    case sharesLookup, sharesModify, sharesURL, sharesDelete, sharesLeave, resolve, accept

    var header: String {
        switch self {
        case .lookup: return "lkp"
        case .query: return "qry"
        case .create: return "crt"
        case .update: return "upd"
        case .forceUpdate: return "fUpd"
        case .replace: return "rpl"
        case .forceReplace: return "fRpl"
        case .delete: return "del"
        case .forceDelete: return "fDel"
        case .changesZone: return "chZ"
        case .changesDatabase: return "chDB"
        case .changesWait: return "wait"
        case .zonesList: return "zLst"
        case .sharesLookup: return "sLkp"
        case .sharesModify: return "sMod"
        case .sharesURL: return "sURL"
        case .sharesDelete: return "sDel"
        case .sharesLeave: return "sLv"
        case .resolve: return "rslv"
        case .accept: return "acpt"
        }
    }

    var isRecordWrite: Bool {
        [.create, .update, .forceUpdate, .replace, .forceReplace, .delete, .forceDelete].contains(self)
    }

    /// Share-level endpoints see only the zone: `root` and `outside` are the same cell as `inShare`.
    var zoneLevel: Bool {
        [.sharesLookup, .sharesModify, .sharesURL, .sharesDelete, .sharesLeave, .resolve, .accept].contains(self)
    }

    /// What the cell must answer. "OK+"/"OK-": success, with the target present/absent in the answer;
    /// "=": the same cell as `inShare`; "·": not applicable (no share to link to).
    func expected(_ row: MatrixRow, _ target: MatrixTarget) -> String {
        if zoneLevel && (target == .root || target == .outside) { return "=" }
        let owner = row.isOwner
        let zoneVisible = owner || (row.isActive && target.sameZone)
        let recordVisible = owner || (row.isActive && (target == .inShare || target == .root))
        let manager = row.caller == .administrator
        switch self {
        case .lookup:
            return !zoneVisible ? "ZONE_NOT_FOUND" : recordVisible ? "OK" : "NOT_FOUND"
        case .query, .changesZone:
            return !zoneVisible ? "ZONE_NOT_FOUND" : recordVisible ? "OK+" : "OK-"
        case .create:
            if !zoneVisible { return "ZONE_NOT_FOUND" }
            if owner { return "OK" }
            if target == .outside { return "PERMISSION_FAILURE" } // no parent inside the share
            return row.readWrite ? "OK" : "PERMISSION_FAILURE"
        case .forceReplace:
            // It makes a missing record, so a record outside the share is judged as a missing name: its
            // parent (outside too) is not inside the share.
            if !zoneVisible { return "ZONE_NOT_FOUND" }
            if owner { return "OK" }
            if target == .outside { return "PERMISSION_FAILURE" }
            return row.readWrite ? "OK" : "PERMISSION_FAILURE"
        case .update, .forceUpdate, .replace, .delete, .forceDelete:
            if !zoneVisible { return "ZONE_NOT_FOUND" }
            if owner { return "OK" }
            if target == .outside { return "NOT_FOUND" }
            if target == .root && (self == .delete || self == .forceDelete) { return "PERMISSION_FAILURE" }
            return row.readWrite ? "OK" : "PERMISSION_FAILURE"
        case .changesDatabase, .changesWait:
            return recordVisible ? "OK+" : "OK-"
        case .zonesList:
            return zoneVisible ? "OK+" : "OK-"
        case .sharesLookup:
            if owner { return target == .unshared ? "NOT_FOUND" : "OK" }
            return zoneVisible ? "OK" : "ZONE_NOT_FOUND"
        case .sharesModify:
            // The cell invites a fresh user: a public share takes no invitations.
            if owner { return target == .unshared ? "NOT_FOUND" : target == .otherShared ? "BAD_REQUEST" : "OK" }
            if !zoneVisible { return "ZONE_NOT_FOUND" }
            return manager ? "OK" : "PERMISSION_FAILURE"
        case .sharesURL:
            if owner { return target == .unshared ? "NOT_FOUND" : "OK" }
            if !zoneVisible { return "ZONE_NOT_FOUND" }
            return manager ? "OK" : "PERMISSION_FAILURE"
        case .sharesDelete:
            if owner { return target == .unshared ? "NOT_FOUND" : "OK" }
            return zoneVisible ? "PERMISSION_FAILURE" : "ZONE_NOT_FOUND"
        case .sharesLeave:
            if owner { return "BAD_REQUEST" } // the owner has nothing to leave; a share is deleted instead
            if row.caller == .pending && target == .inShare { return "OK" } // declines the invitation (issue 30)
            return zoneVisible ? "OK" : "ZONE_NOT_FOUND"
        case .resolve:
            return target == .unshared ? "·" : "OK"
        case .accept:
            if target == .unshared { return "·" }
            if owner { return "BAD_REQUEST" }
            if target == .inShare {
                return row.isActive || row.caller == .pending ? "OK" : "PERMISSION_FAILURE"
            }
            // The other share: Pub is public (anyone joins); Lists is private (a public user of Pub cannot).
            return row.caller == .publicUser ? "PERMISSION_FAILURE" : "OK"
        }
    }
}

/// The cells, filled as the matrix runs, printed at the end.
final class MatrixTable {
    struct Cell {
        var expected: String
        var actual: String
        var note: String
    }

    private(set) var cells: [String: Cell] = [:]

    static func key(_ row: MatrixRow, _ target: MatrixTarget, _ endpoint: MatrixEndpoint) -> String {
        "\(row.label)|\(target.rawValue)|\(endpoint.rawValue)"
    }

    /// Records a cell and asserts it.
    func record(_ row: MatrixRow, _ target: MatrixTarget, _ endpoint: MatrixEndpoint, actual: String, note: String = "",
                sourceLocation: SourceLocation = #_sourceLocation) {
        let expected = endpoint.expected(row, target)
        cells[Self.key(row, target, endpoint)] = Cell(expected: expected, actual: actual, note: note)
        #expect(actual == expected, "\(row.label) × \(target.rawValue) × \(endpoint.rawValue): expected \(expected), got \(actual) \(note)",
                sourceLocation: sourceLocation)
    }

    func render() -> String {
        var lines: [String] = []
        lines.append("[authorization matrix] codes: OK, NF=NOT_FOUND, ZNF=ZONE_NOT_FOUND, PF=PERMISSION_FAILURE, "
                     + "BR=BAD_REQUEST; OK+/OK- = success with the target present/absent; '=' same as inShare; "
                     + "'·' n/a; '*' marks a cell that differs from the expected value")
        for target in MatrixTarget.allCases {
            lines.append("target \(target.rawValue): \(target.explanation)")
            lines.append("caller/perm".padding(toLength: 18, withPad: " ", startingAt: 0)
                         + MatrixEndpoint.allCases.map { $0.header.padding(toLength: 5, withPad: " ", startingAt: 0) }.joined())
            for row in MatrixRow.all {
                var line = row.label.padding(toLength: 18, withPad: " ", startingAt: 0)
                for endpoint in MatrixEndpoint.allCases {
                    let expected = endpoint.expected(row, target)
                    var text: String
                    if let cell = cells[Self.key(row, target, endpoint)] {
                        text = shortCode(cell.actual) + (cell.actual == cell.expected ? "" : "*")
                    } else {
                        text = expected == "=" || expected == "·" ? expected : "?"
                    }
                    line += text.padding(toLength: 5, withPad: " ", startingAt: 0)
                }
                lines.append(line)
            }
        }
        let wrong = cells.filter { $0.value.actual != $0.value.expected }.sorted { $0.key < $1.key }
        lines.append("cells asserted: \(cells.count), differing: \(wrong.count)")
        for (key, cell) in wrong {
            lines.append("  * \(key): expected \(cell.expected), got \(cell.actual) \(cell.note)")
        }
        return lines.joined(separator: "\n")
    }
}

@Suite(.serialized, .tags(.postgres)) struct AuthorizationMatrixTests {
    @Test func everyEndpointEveryCallerEveryTarget() throws {
        let table = MatrixTable()
        defer { print(table.render()) }
        try readCells(table)
        try notificationCells(table)
        try writeCells(table)
        try shareCells(table)
        try acceptCells(table)
        try leaveCells(table)
        try ownerDeletionCells(table)
        // Every applicable cell was asserted.
        for row in MatrixRow.all {
            for target in MatrixTarget.allCases {
                for endpoint in MatrixEndpoint.allCases where !["=", "·"].contains(endpoint.expected(row, target)) {
                    #expect(table.cells[MatrixTable.key(row, target, endpoint)] != nil,
                            "cell \(row.label) × \(target.rawValue) × \(endpoint.rawValue) was not run")
                }
            }
        }
    }

    /// The same questions for a zone-wide share (`cloudkit.zoneshare`): every record of the zone is in it, there is
    /// no root, and nothing else of the owner is reachable.
    @Test func zoneWideShareCells() throws {
        let w = try MatrixWorld(guests: 2)
        let other = MatrixWorld.other
        #expect(matrixCode(w.owner("shares/create", other, ["title": .string("Everything")])) == "OK")
        #expect(matrixCode(w.owner("shares/modify", other, ["participants": .array([
            .object(["operation": .string("invite"), "userName": .string("guest0"), "permission": .string("readOnly")]),
            .object(["operation": .string("invite"), "userName": .string("guest1"), "permission": .string("readWrite")]),
        ])])) == "OK")
        let link = try w.link(other, permission: "readWrite")
        for guest in ["guest0", "guest1"] { #expect(w.accept(link, as: guest)["participantStatus"]?.stringValue == "accepted") }
        var lines: [String] = ["[zone-wide matrix] guest0 = readOnly, guest1 = readWrite, priv-rw = not in this share"]
        var counter = 0
        for (who, readWrite, member) in [("guest0", false, true), ("guest1", true, true), ("priv-rw", true, false), ("stranger", false, false)] {
            var cells: [String] = []
            func cell(_ label: String, _ expected: String, _ actual: String, _ changed: Bool? = nil) {
                let mark = actual == expected ? "" : "*"
                cells.append("\(label)=\(shortCode(actual))\(mark)")
                #expect(actual == expected, "zone-wide \(who) \(label): expected \(expected), got \(actual)")
                if let changed, actual != "OK" { #expect(!changed, "zone-wide \(who) \(label): refused but changed") }
            }
            let zoneGone = "ZONE_NOT_FOUND"
            let lookup = w.shared("records/lookup", other, ["records": .array([.object(["recordName": .string("O-rec")])])], as: who)
            cell("lkp", member ? "OK" : zoneGone, matrixCode(lookup))
            let query = w.shared("records/query", other, ["query": .object(["recordType": .string("Item")])], as: who)
            let names = Set(query.records.compactMap { $0["recordName"]?.stringValue })
            cell("qry", member ? "OK+" : zoneGone, matrixCode(query) == "OK" ? (names.isSuperset(of: ["O-root", "O-rec"]) ? "OK+" : "OK-") : matrixCode(query))
            let feed = w.shared("changes/zone", other, ["zones": .array([.object(["zoneID": w.zoneID(other, shared: true)])])], as: who)
            let fed = Set((feed.zones.first?["records"]?.arrayValue ?? []).compactMap { $0["recordName"]?.stringValue })
            cell("chZ", member ? "OK+" : zoneGone, matrixCode(feed) == "OK" ? (fed.isSuperset(of: ["O-root", "O-rec"]) ? "OK+" : "OK-") : matrixCode(feed))
            let writeExpected = !member ? zoneGone : readWrite ? "OK" : "PERMISSION_FAILURE"
            // The operation each label sends is chosen by the switch below.
            for (label, name) in [
                ("crt-top", "Z\(counter)"), ("crt-under", "Z\(counter)u"), ("fUpd", "O-root"), ("fDel", "Z\(counter)d"),
            ] {
                if label == "fDel" {
                    #expect(matrixCode(w.owner("records/modify", other, ["operations": .array([operation("create", name)])])) == "OK")
                }
                let before = w.ownerView(other, name)
                let record: JSON
                switch label {
                case "crt-top": record = operation("create", name, fields: ["n": value(.int(1))])
                case "crt-under": record = operation("create", name, fields: ["n": value(.int(1))], extra: parentRef("O-rec"))
                case "fUpd": record = operation("forceUpdate", name, recordType: nil, fields: ["n": value(.int(Int64(counter)))])
                default: record = operation("forceDelete", name, recordType: nil)
                }
                let reply = w.shared("records/modify", other, ["operations": .array([record])], as: who)
                cell(label, writeExpected, matrixCode(reply), w.ownerView(other, name) != before)
            }
            counter += 1
            let shareBefore = w.shareView(other)
            let shareRecord = w.shared("records/modify", other, ["operations": .array([
                operation("forceUpdate", "cloudkit.zoneshare", recordType: nil, fields: ["title": value(.string("mine"))])])], as: who)
            cell("shareRec", member ? "PERMISSION_FAILURE" : zoneGone, matrixCode(shareRecord), w.shareView(other) != shareBefore)
            cell("sDel", member ? "PERMISSION_FAILURE" : zoneGone, matrixCode(w.shared("shares/delete", other, as: who)),
                 w.shareView(other) != shareBefore)
            // A zone-wide participant reaches nothing else of the owner.
            cell("Lists", who == "priv-rw" ? "OK" : zoneGone,
                 matrixCode(w.shared("records/lookup", MatrixWorld.lists, ["records": .array([])], as: who)))
            lines.append("  \(who): " + cells.joined(separator: " "))
        }
        print(lines.joined(separator: "\n"))
    }

    private func zoneID(_ w: MatrixWorld, _ row: MatrixRow, _ zone: String) -> JSON {
        w.zoneID(zone, shared: !row.isOwner)
    }

    private func call(_ w: MatrixWorld, _ row: MatrixRow, _ operation: String, _ zone: String?,
                      _ body: [String: JSON] = [:]) -> ServiceHarness.Reply {
        var body = body
        if let zone { body["zoneID"] = zoneID(w, row, zone) }
        return w.h.call(operation, .object(body), token: w.token(row.account), database: row.database)
    }

    // MARK: Reads: lookup, query, changes/zone, zones/list, shares/lookup, records/resolve

    private func readCells(_ table: MatrixTable) throws {
        let w = try MatrixWorld()
        for row in MatrixRow.all {
            for target in MatrixTarget.allCases {
                let zone = target.zone(row)
                let name = target.record(row)
                let looked = call(w, row, "records/lookup", zone, ["records": .array([.object(["recordName": .string(name)])])])
                var lookupCode = matrixCode(looked)
                if lookupCode == "OK", looked.records.first?["recordName"]?.stringValue != name { lookupCode = "OK(wrong record)" }
                table.record(row, target, .lookup, actual: lookupCode)

                let queried = call(w, row, "records/query", zone, ["query": .object(["recordType": .string("Item")])])
                table.record(row, target, .query, actual: presence(queried, queried.records, name))

                let feed = call(w, row, "changes/zone", nil, ["zones": .array([.object(["zoneID": zoneID(w, row, zone)])])])
                let feedRecords = feed.zones.first?["records"]?.arrayValue ?? []
                table.record(row, target, .changesZone,
                             actual: presence(feed, feedRecords.filter { $0["deleted"] != .bool(true) }, name))

                let zones = call(w, row, "zones/list", nil)
                let listed = zones.zones.contains { $0["zoneID"]?["zoneName"]?.stringValue == zone }
                table.record(row, target, .zonesList, actual: matrixCode(zones) == "OK" ? (listed ? "OK+" : "OK-") : matrixCode(zones))

                guard !target.sameZone || target == .inShare else { continue }
                let before = w.shareView(zone)
                table.record(row, target, .sharesLookup, actual: matrixCode(call(w, row, "shares/lookup", zone)))

                if target != .unshared {
                    let link = target == .inShare ? homeLink(w, row) : otherLink(w, row)
                    let resolved = w.resolve(link, as: row.account)
                    var code = itemCode(resolved)
                    let wanted = expectedStatus(row, target)
                    if code == "OK", resolved["currentStatus"]?.stringValue != wanted {
                        code = "OK(currentStatus \(resolved["currentStatus"]?.stringValue ?? "nil"), not \(wanted))"
                    }
                    table.record(row, target, .resolve, actual: code)
                }
                #expect(w.shareView(zone) == before, "\(row.label) \(target.rawValue): a read changed the share")
            }
        }
        // Resolving granted nothing: the pending invitees are still pending and see nothing.
        for name in ["pending-ro", "pending-rw", "stranger"] {
            #expect(w.shared("records/lookup", MatrixWorld.lists, ["records": .array([])], as: name).code == "ZONE_NOT_FOUND")
        }
    }

    private func presence(_ reply: ServiceHarness.Reply, _ records: [JSON], _ name: String) -> String {
        let code = matrixCode(reply)
        guard code == "OK" else { return code }
        return records.contains { $0["recordName"]?.stringValue == name } ? "OK+" : "OK-"
    }

    private func homeLink(_ w: MatrixWorld, _ row: MatrixRow) -> String {
        row.caller == .publicUser ? (row.readWrite ? w.pubLinkReadWrite : w.pubLinkReadOnly) : w.listsLink
    }

    private func otherLink(_ w: MatrixWorld, _ row: MatrixRow) -> String {
        row.caller == .publicUser ? w.listsLink : w.pubLinkReadWrite
    }

    /// The caller's current status in the share a link names, as records/resolve reports it.
    private func expectedStatus(_ row: MatrixRow, _ target: MatrixTarget) -> String {
        if row.isOwner { return "accepted" }
        guard target == .inShare else { return "none" }
        switch row.caller {
        case .administrator, .privateUser, .publicUser: return "accepted"
        case .removed: return "removed"
        case .pending: return "pending"
        default: return "none"
        }
    }

    // MARK: changes/database and changes/wait: does a change by the owner reach the caller?

    private func notificationCells(_ table: MatrixTable) throws {
        let w = try MatrixWorld()
        var counter = 0
        for target in MatrixTarget.allCases {
            // Rows grouped by home share: a touch in one group's target must not be confused with another's.
            for group in [MatrixRow.all.filter { $0.caller != .publicUser }, MatrixRow.all.filter { $0.caller == .publicUser }] {
                var tokens: [MatrixRow: String] = [:]
                for row in group {
                    tokens[row] = try #require(call(w, row, "changes/database", nil)["syncToken"]?.stringValue, "\(row.label)")
                }
                counter += 1
                let zone = target.zone(group[0])
                let touched = w.owner("records/modify", zone, ["operations": .array([
                    operation("forceUpdate", target.record(group[0]), recordType: nil, fields: ["touch": value(.int(Int64(counter)))]),
                ])])
                #expect(matrixCode(touched) == "OK", "touch: \(touched.json.serialized())")
                for row in group {
                    let waited = call(w, row, "changes/wait", nil, ["syncToken": .string(tokens[row]!), "timeout": .int(0)])
                    let changed = waited["changed"]?.boolValue
                    table.record(row, target, .changesWait,
                                 actual: matrixCode(waited) != "OK" ? matrixCode(waited) : changed == true ? "OK+" : changed == false ? "OK-" : "OK?")
                    let changes = call(w, row, "changes/database", nil, ["syncToken": .string(tokens[row]!)])
                    let listed = changes.zones.contains {
                        $0["zoneID"]?["zoneName"]?.stringValue == zone && $0["deleted"] != .bool(true)
                    }
                    table.record(row, target, .changesDatabase,
                                 actual: matrixCode(changes) != "OK" ? matrixCode(changes) : listed ? "OK+" : "OK-")
                }
            }
        }
        // From a nil token: a removed participant sees the zone deleted; pending and strangers see nothing.
        for name in ["removed-ro", "removed-rw"] {
            let zones = w.h.call("changes/database", token: w.token(name), database: "shared").zones
            #expect(zones.count == 1 && zones.first?["deleted"] == .bool(true), "\(name): \(zones)")
        }
        for name in ["pending-ro", "pending-rw", "stranger"] {
            #expect(w.h.call("changes/database", token: w.token(name), database: "shared").zones.isEmpty, "\(name)")
        }
    }

    // MARK: records/modify: every operation type

    private func writeCells(_ table: MatrixTable) throws {
        let w = try MatrixWorld()
        var counter = 0
        for row in MatrixRow.all {
            for target in MatrixTarget.allCases {
                let zone = target.zone(row)
                for endpoint in MatrixEndpoint.allCases where endpoint.isRecordWrite {
                    counter += 1
                    let k = Int64(counter)
                    if row.isOwner && target == .root && (endpoint == .delete || endpoint == .forceDelete) {
                        continue // deleting the root deletes the share: run on a world of its own (ownerDeletionCells)
                    }
                    // The record the operation is about: a fresh one made by the owner for this cell (the root
                    // is the root), so cells stay independent.
                    var name = target.record(row)
                    if endpoint == .create {
                        name = "N\(counter)"
                    } else if target != .root {
                        name = "F\(counter)"
                        let made = w.owner("records/modify", zone, ["operations": .array([
                            operation("create", name, fields: ["title": value(.string("fresh"))], extra: parentRef(target.record(row))),
                        ])])
                        #expect(matrixCode(made) == "OK", "seed \(name): \(made.json.serialized())")
                    }
                    let before = w.ownerView(zone, name)
                    let tag = before["recordChangeTag"]?.stringValue
                    let parentName = endpoint == .create ? target.record(row) : before["parent"]?["recordName"]?.stringValue
                    let reply = call(w, row, "records/modify", zone, ["operations": .array([
                        writeOperation(endpoint, name: name, tag: tag, parent: parentName, k: k),
                    ])])
                    let code = matrixCode(reply)
                    let after = w.ownerView(zone, name)
                    var note = ""
                    if code == "OK" {
                        if let problem = effectProblem(endpoint, before: before, after: after, parent: parentName, k: k) {
                            note = "(succeeded but \(problem))"
                        }
                        if endpoint != .create && endpoint != .delete && endpoint != .forceDelete && !row.isOwner,
                           after["modified"]?["userRecordName"]?.stringValue != w.account(row.account).recordName {
                            note += "(modified.userRecordName is not the caller)"
                        }
                    } else if after != before {
                        note = "(REFUSED BUT CHANGED: \(before.serialized()) -> \(after.serialized()))"
                    }
                    table.record(row, target, endpoint, actual: note.isEmpty ? code : code + "!", note: note)
                }
            }
        }
    }

    private func writeOperation(_ endpoint: MatrixEndpoint, name: String, tag: String?, parent parentName: String?,
                                k: Int64) -> JSON {
        var extra: [String: JSON] = [:]
        if let parentName, [.create, .replace, .forceReplace].contains(endpoint) { extra = parentRef(parentName) }
        let fields = ["n": value(.int(k))]
        switch endpoint {
        case .create: return operation("create", name, fields: fields, extra: extra)
        case .update: return operation("update", name, recordType: nil, fields: fields, tag: tag)
        case .forceUpdate: return operation("forceUpdate", name, recordType: nil, fields: fields)
        case .replace: return operation("replace", name, fields: fields, tag: tag, extra: extra)
        case .forceReplace: return operation("forceReplace", name, fields: fields, extra: extra)
        case .delete: return operation("delete", name, recordType: nil, tag: tag)
        default: return operation("forceDelete", name, recordType: nil)
        }
    }

    /// Why a successful write did not do what it said, or nil.
    private func effectProblem(_ endpoint: MatrixEndpoint, before: JSON, after: JSON, parent: String?, k: Int64) -> String? {
        switch endpoint {
        case .delete, .forceDelete:
            return itemCode(after) == "NOT_FOUND" ? nil : "the record is still there"
        default:
            guard itemCode(after) == "OK" else { return "the record is gone: \(after.serialized())" }
            if after["fields"]?["n"]?["value"]?.intValue != k { return "field n is not \(k)" }
            if after["parent"]?["recordName"]?.stringValue != parent { return "the parent changed" }
            if endpoint == .create, after["created"]?["userRecordName"] == nil { return "no creator" }
            return nil
        }
    }

    // MARK: shares/modify, shares/url, shares/delete (participants; the owner's deletes run on worlds of their own)

    private func shareCells(_ table: MatrixTable) throws {
        let w = try MatrixWorld(guests: 40)
        var guest = 0
        for row in MatrixRow.all {
            for target in [MatrixTarget.inShare, .otherShared, .unshared] {
                let zone = target.zone(row)
                var before = w.shareView(zone)
                let invited = "guest\(guest)"
                guest += 1
                let modified = call(w, row, "shares/modify", zone, ["title": .string("T-\(invited)"), "participants": .array([
                    .object(["operation": .string("invite"), "userName": .string(invited), "permission": .string("readOnly")]),
                ])])
                let modifyCode = matrixCode(modified)
                var after = w.shareView(zone)
                var note = ""
                if modifyCode == "OK" {
                    let entry = after["participants"]?.arrayValue?.first {
                        $0["userRecordName"]?.stringValue == w.account(invited).recordName
                    }
                    if entry?["acceptanceStatus"]?.stringValue != "pending" || after["title"]?.stringValue != "T-\(invited)" {
                        note = "(the invitation or the title is missing)"
                    }
                } else if after != before {
                    note = "(REFUSED BUT CHANGED)"
                }
                table.record(row, target, .sharesModify, actual: note.isEmpty ? modifyCode : modifyCode + "!", note: note)

                before = w.shareView(zone)
                let url = call(w, row, "shares/url", zone, ["permission": .string("readOnly")])
                let urlCode = matrixCode(url)
                after = w.shareView(zone)
                note = ""
                if urlCode == "OK" {
                    if url["url"]?.stringValue?.contains("/share/") != true { note = "(no url)" }
                    if after != before { note += "(a plain shares/url changed the share)" }
                } else if after != before {
                    note = "(REFUSED BUT CHANGED)"
                }
                table.record(row, target, .sharesURL, actual: note.isEmpty ? urlCode : urlCode + "!", note: note)

                guard !row.isOwner else { continue }
                before = w.shareView(zone)
                let deleted = call(w, row, "shares/delete", zone)
                let deleteCode = matrixCode(deleted)
                after = w.shareView(zone)
                note = ""
                if deleteCode != "OK", after != before { note = "(REFUSED BUT CHANGED)" }
                table.record(row, target, .sharesDelete, actual: note.isEmpty ? deleteCode : deleteCode + "!", note: note)
            }
        }
    }

    // MARK: records/accept (a world of its own: accepting joins)

    private func acceptCells(_ table: MatrixTable) throws {
        let w = try MatrixWorld()
        for row in MatrixRow.all {
            for target in [MatrixTarget.inShare, .otherShared] {
                let zone = target.zone(row)
                let link = target == .inShare ? homeLink(w, row) : otherLink(w, row)
                let before = w.participant(zone, row.account)
                let result = w.accept(link, as: row.account)
                let code = itemCode(result)
                let after = w.participant(zone, row.account)
                var note = ""
                if code == "OK" {
                    if after?["acceptanceStatus"]?.stringValue != "accepted" { note = "(not accepted after accept)" }
                    if let before, before["acceptanceStatus"]?.stringValue == "accepted", after != before {
                        note += "(accepting again changed the participant: \(before.serialized()) -> \(after?.serialized() ?? "nil"))"
                    }
                    if before == nil, after?["role"]?.stringValue != "publicUser" { note += "(did not join as publicUser)" }
                    if w.shared("records/lookup", zone, ["records": .array([])], as: row.account).code != nil {
                        note += "(no access after accepting)"
                    }
                } else if after != before {
                    note = "(REFUSED BUT CHANGED)"
                }
                table.record(row, target, .accept, actual: note.isEmpty ? code : code + "!", note: note)
            }
        }
    }

    // MARK: shares/leave (a world of its own: leaving is for good)

    private func leaveCells(_ table: MatrixTable) throws {
        let w = try MatrixWorld()
        for row in MatrixRow.all {
            for target in [MatrixTarget.otherShared, .unshared, .inShare] {
                let zone = target.zone(row)
                let before = w.shareView(zone)
                let left = call(w, row, "shares/leave", zone)
                let code = matrixCode(left)
                var note = ""
                if code == "OK" {
                    if w.participant(zone, row.account)?["acceptanceStatus"]?.stringValue != "removed" { note = "(not removed)" }
                    if w.shared("records/lookup", zone, ["records": .array([])], as: row.account).code != "ZONE_NOT_FOUND" {
                        note += "(still has access)"
                    }
                } else if w.shareView(zone) != before {
                    note = "(REFUSED BUT CHANGED)"
                }
                table.record(row, target, .sharesLeave, actual: note.isEmpty ? code : code + "!", note: note)
            }
        }
    }

    // MARK: The owner's destructive cells: shares/delete and deleting a root

    private func ownerDeletionCells(_ table: MatrixTable) throws {
        let owner = MatrixRow(caller: .owner, permission: nil)
        do {
            let w = try MatrixWorld()
            for target in [MatrixTarget.inShare, .otherShared, .unshared] {
                let zone = target.zone(owner)
                let before = w.shareView(zone)
                let code = matrixCode(w.owner("shares/delete", zone))
                var note = ""
                if code == "OK" {
                    if w.shareView(zone)["serverErrorCode"]?.stringValue != "NOT_FOUND" { note = "(the share is still there)" }
                    let participant = zone == MatrixWorld.lists ? "priv-rw" : "pub-rw"
                    if w.shared("records/lookup", zone, ["records": .array([])], as: participant).code != "ZONE_NOT_FOUND" {
                        note += "(\(participant) still has access)"
                    }
                    if itemCode(w.ownerView(zone, zone == MatrixWorld.lists ? "L-root" : "P-root")) != "OK" {
                        note += "(deleting the share deleted the root)"
                    }
                } else if w.shareView(zone) != before {
                    note = "(REFUSED BUT CHANGED)"
                }
                table.record(owner, target, .sharesDelete, actual: note.isEmpty ? code : code + "!", note: note)
            }
        }
        do {
            let w = try MatrixWorld()
            for endpoint in [MatrixEndpoint.delete, .forceDelete] {
                let zone = endpoint == .delete ? MatrixWorld.lists : MatrixWorld.pub
                let root = endpoint == .delete ? "L-root" : "P-root"
                let participant = endpoint == .delete ? "priv-rw" : "pub-rw"
                let tag = w.ownerView(zone, root)["recordChangeTag"]?.stringValue
                let reply = w.owner("records/modify", zone, ["operations": .array([
                    writeOperation(endpoint, name: root, tag: tag, parent: nil, k: 0),
                ])])
                let code = matrixCode(reply)
                var note = ""
                if code == "OK" {
                    if itemCode(w.ownerView(zone, root)) != "NOT_FOUND" { note = "(the root is still there)" }
                    if w.shareView(zone)["serverErrorCode"]?.stringValue != "NOT_FOUND" { note += "(the share survived its root)" }
                    if w.shared("records/lookup", zone, ["records": .array([])], as: participant).code != "ZONE_NOT_FOUND" {
                        note += "(\(participant) still has access)"
                    }
                }
                // The same cell for the owner whatever the home zone: the root of a share.
                table.record(owner, .root, endpoint, actual: note.isEmpty ? code : code + "!", note: note)
            }
        }
    }
}
