import Foundation
import LatticeCore
import LatticeLists
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// What every client command (signup ... explain) shares: the global options and the home they pick,
// the engine with its progress line, output for people or --json, and the sync after a change.

/// A failure for people to read: the process prints it and exits with status 1.
struct CommandFailure: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

/// A client command's arguments: its own options plus `--home DIR`, `--json`, `--no-sync` and `--help`.
struct ClientOptions {
    static let globalValueOptions: Set<String> = ["home"]
    static let globalFlagOptions: Set<String> = ["json", "no-sync"]

    let parsed: ParsedArguments
    /// The device's home: `--home`, else `$LATTICE_HOME`, else `~/.lattice`.
    let home: String

    var json: Bool { parsed.flag("json") }
    var noSync: Bool { parsed.flag("no-sync") }
    var help: Bool { parsed.flag("help") }
    var positionals: [String] { parsed.positionals }

    init(_ arguments: [String], valueOptions: Set<String> = [], flagOptions: Set<String> = []) throws(UsageError) {
        parsed = try ParsedArguments(arguments, valueOptions: valueOptions.union(Self.globalValueOptions),
                                     flagOptions: flagOptions.union(Self.globalFlagOptions))
        home = try Self.home(option: try parsed.value("home"))
    }

    static func home(option: String?) throws(UsageError) -> String {
        if let option {
            guard !option.isEmpty else { throw UsageError("--home needs a directory") }
            return option
        }
        if let variable = ProcessInfo.processInfo.environment["LATTICE_HOME"], !variable.isEmpty { return variable }
        return NSHomeDirectory() + "/.lattice"
    }

    /// Exactly the positionals `names` describes (after the subcommand, if any).
    func operands(_ given: [String], _ names: String...) throws(UsageError) -> [String] {
        guard given.count == names.count else {
            let wanted = names.isEmpty ? "no arguments" : names.joined(separator: " ")
            if given.count > names.count {
                throw UsageError("unexpected argument \(given[names.count]) "
                                 + "(expected \(wanted); quote text with spaces)")
            }
            let missing = names[given.count...].joined(separator: " ")
            throw UsageError(given.isEmpty ? "missing \(missing)" : "missing \(missing) (expected \(wanted))")
        }
        for (value, name) in zip(given, names) where value.isEmpty { throw UsageError("\(name) cannot be empty") }
        return given
    }

    /// Refuses value options that the subcommand does not take.
    func allowOnly(_ allowed: Set<String>, in subcommand: String) throws(UsageError) {
        let given = Set(parsed.values.keys).subtracting(Self.globalValueOptions)
        if let extra = given.subtracting(allowed).sorted().first {
            throw UsageError("--\(extra) is not an option of \(subcommand)")
        }
    }

    func allowFlags(_ allowed: Set<String>, in subcommand: String) throws(UsageError) {
        let given = parsed.flags.subtracting(Self.globalFlagOptions).subtracting(["help"])
        if let extra = given.subtracting(allowed).sorted().first {
            throw UsageError("--\(extra) is not an option of \(subcommand)")
        }
    }

    /// Opens the home's replica. Files are owner-only (the replica holds the bearer token). A fetch of many
    /// records shows progress on stderr when that is a terminal.
    func openEngine(creating: Bool = false) throws -> ListsReplica {
        if !creating && !FileManager.default.fileExists(atPath: home) {
            throw CommandFailure("\(home) is not a Lattice home yet: " + SyncError.notSignedIn.description)
        }
        umask(0o077)
        let engine = try ListsReplica(home: home)
        if isatty(STDERR_FILENO) == 1 {
            let progress = FetchProgressLine()
            engine.onFetchProgress = { progress.handle($0) }
        }
        return engine
    }

    /// The engine of a signed-in home, with its lists.
    func openLists() throws -> (ListsReplica, Lists) {
        let engine = try openEngine()
        guard engine.account != nil else { throw CommandFailure(SyncError.notSignedIn.description) }
        return (engine, Lists(replica: engine))
    }
}

/// A raw call with the home's account for an operation that is online only (sharing, tokens, devices).
func callServer(_ engine: ListsReplica, _ database: String, _ operation: String, _ body: JSON) throws -> JSON {
    guard let account = engine.account else { throw SyncError.notSignedIn }
    return try waitForAsyncWork { try await AccountClient(serverURL: account.serverURL).call(database, operation, body, as: account) }
}

/// "fetched N records" on one rewritten stderr line while a sync fetches.
final class FetchProgressLine: Sendable {
    /// Whether a line is shown. Guards nothing else.
    private let shown = Mutex(false)

    /// Records fetched so far, or nil when the fetch ended.
    func handle(_ records: Int?) {
        if let records {
            writeStandardError("\rfetching changes: \(records) records")
            shown.withLock { $0 = true }
        } else if shown.withLock({ shown in defer { shown = false }; return shown }) {
            writeStandardError("\n")
        }
    }
}

func writeStandardError(_ text: String) {
    FileHandle.standardError.write(Data(text.utf8))
}

/// A line for people: stdout normally, stderr under --json (stdout then holds only JSON).
func notice(_ text: String, _ options: ClientOptions) {
    if options.json { writeStandardError(text + "\n") } else { print(text) }
}

func printJSON(_ value: JSON) {
    print(value.serialized())
}

// MARK: Vocabulary

/// `read-only`/`read-write` as the API spells them, or nil.
func apiPermission(_ word: String, allowNone: Bool = false) -> String? {
    switch word {
    case "read-only", "readOnly": return "readOnly"
    case "read-write", "readWrite": return "readWrite"
    case "none" where allowNone: return "none"
    default: return nil
    }
}

/// The API's permission or role words as people read them.
func permissionWord(_ permission: String) -> String {
    switch permission {
    case "readOnly": return "read-only"
    case "readWrite": return "read-write"
    case "privateUser": return "invited user"
    case "publicUser": return "public user"
    default: return permission
    }
}

func ownerLabel(_ list: ListSummary) -> String { list.ownerName ?? list.ownerRecordName }

func listJSON(_ list: ListSummary) -> JSON {
    .object(["id": .string(list.id), "title": .string(list.title), "owner": .string(ownerLabel(list)),
             "shared": .bool(list.shared), "permission": .string(list.permission)])
}

func itemJSON(_ item: ListItem) -> JSON {
    .object(["id": .string(item.id), "text": .string(item.text), "done": .bool(item.done),
             "tags": .array(item.tags.map(JSON.string)), "position": .double(item.position), "note": .string(item.note),
             "attachments": .array(item.attachments.map { attachment in
                 .object(["name": .string(attachment.name), "size": .int(attachment.asset.size),
                          "fileChecksum": .string(attachment.asset.fileChecksum)])
             })])
}

func checkbox(_ done: Bool) -> String { done ? "[x]" : "[ ]" }

func tagWords(_ tags: [String]) -> String { tags.map { "#" + $0 }.joined(separator: " ") }

/// Rows padded into columns (the last column is not padded).
func alignedRows(_ rows: [[String]], indent: String = "") -> [String] {
    let columns = rows.map(\.count).max() ?? 0
    var widths = [Int](repeating: 0, count: columns)
    for row in rows {
        for (index, cell) in row.enumerated() { widths[index] = max(widths[index], cell.count) }
    }
    return rows.map { row in
        var line = indent
        for (index, cell) in row.enumerated() {
            if index == row.count - 1 {
                line += cell
            } else {
                line += cell + String(repeating: " ", count: widths[index] - cell.count + 2)
            }
        }
        while line.hasSuffix(" ") { line.removeLast() }
        return line
    }
}

// MARK: Syncing after a change

/// What a sync after a change did.
struct SyncOutcome {
    /// The sync reached the server.
    var synced = false
    /// Changes still waiting for the server.
    var pending = 0
    /// One line per refused change; the local copies went back to the server's state.
    var refusals: [String] = []

    /// Exit status 1 when the server refused something.
    func finish() throws {
        guard !refusals.isEmpty else { return }
        throw CommandFailure(refusals.joined(separator: "\n"))
    }

    var json: [String: JSON] { ["synced": .bool(synced), "pending": .int(Int64(pending))] }
}

/// Syncs after a local change, unless --no-sync, and says what people need to know: that the change is
/// queued (offline or --no-sync), that the server refused a change (the local copy was restored), that a
/// list is no longer shared with them.
func syncAfterChange(_ engine: ListsReplica, _ lists: Lists, _ options: ClientOptions) throws -> SyncOutcome {
    var outcome = SyncOutcome()
    if options.noSync {
        outcome.pending = try engine.pendingCount()
        notice("queued (\(outcome.pending) \(plural(outcome.pending, "change")) pending); "
               + "run lattice sync when online", options)
        return outcome
    }
    let labels = try RecordLabels(lists)
    let report = try waitForAsyncWork { try await engine.sync() }
    outcome.pending = report.queued
    outcome.synced = report.online && report.notNow == nil
    if !report.online {
        notice("the server cannot be reached: queued (\(report.queued) \(plural(report.queued, "change")) pending); "
               + "run lattice sync when online", options)
    } else if let notNow = report.notNow {
        notice(notNowLine(notNow, queued: report.queued), options)
    }
    outcome.refusals = labels.refusals(report)
    for line in labels.removals(report) { writeStandardError(line + "\n") }
    return outcome
}

/// Names of this device's lists and items before a sync, so what the sync refused or removed can be named.
struct RecordLabels {
    private var names: [String: String] = [:]
    private var listsByZone: [String: [ListSummary]] = [:]
    /// The list of each item, by zone key and item id.
    private var listOfItem: [String: ListSummary] = [:]

    init(_ lists: Lists) throws {
        for list in try lists.all() {
            names[list.id] = "list \"\(list.title)\""
            let key = Self.zoneKey(list.zone.database, list.zone.zoneName, list.ownerRecordName)
            listsByZone[key, default: []].append(list)
            for item in try lists.items(of: list) {
                names[item.id] = "\"\(item.text)\" in \"\(list.title)\""
                listOfItem[key + "/" + item.id] = list
            }
        }
    }

    private static func zoneKey(_ database: String, _ zone: String, _ owner: String) -> String {
        database + "/" + zone + "/" + owner
    }

    func label(_ recordName: String) -> String { names[recordName] ?? recordName }

    func refusals(_ report: ListsSyncReport) -> [String] {
        report.rejected.map { rejected in
            "the server refused the change to \(label(rejected.recordName)) (\(rejected.code): \(rejected.reason)); "
                + "this device's copy was restored to the server's"
        }
    }

    /// The list a lost share was rooted at, as this device knew it before the sync.
    private func list(_ share: ListsSyncReport.LostShare) -> ListSummary? {
        listsByZone[Self.zoneKey(share.database, share.zone, share.owner)]?.first { $0.id == share.rootRecordName }
    }

    /// The lost list a dropped edit went with: the record's list (or the list itself, or the lost share's
    /// root) when this sync lost that list's share or its zone. Nil for a record that left a list still
    /// shared (the owner moved it out).
    private func lostList(_ edit: ListsSyncReport.DroppedEdit, _ report: ListsSyncReport) -> ListSummary? {
        let key = Self.zoneKey(edit.database, edit.zone, edit.owner)
        guard let list = listOfItem[key + "/" + edit.recordName]
            ?? listsByZone[key]?.first(where: { $0.id == edit.recordName || $0.id == edit.rootRecordName })
        else { return nil }
        let zoneGone = report.removedZones.contains { Self.zoneKey($0.database, $0.zone, $0.owner) == key }
        let shareLost = report.lostShares.contains {
            Self.zoneKey($0.database, $0.zone, $0.owner) == key && $0.rootRecordName == list.id
        }
        return zoneGone || shareLost ? list : nil
    }

    /// The lists that are no longer shared with this device: lost shares and the lists of shared zones that
    /// went away. `{"id","title","owner","zone"}` each, for `lattice sync --json`.
    func noLongerShared(_ report: ListsSyncReport) -> [JSON] {
        var lists: [JSON] = report.lostShares.map { share in
            let known = list(share)
            return .object(["id": .string(share.rootRecordName), "title": .string(known?.title ?? ""),
                            "owner": .string(known.map(ownerLabel) ?? share.owner), "zone": .string(share.zone)])
        }
        for removed in report.removedZones where removed.database == "shared" {
            for gone in listsByZone[Self.zoneKey(removed.database, removed.zone, removed.owner)] ?? [] {
                lists.append(.object(["id": .string(gone.id), "title": .string(gone.title),
                                      "owner": .string(ownerLabel(gone)), "zone": .string(removed.zone)]))
            }
        }
        return lists
    }

    /// `{"id","zone","deletion","list"?}` for each unsent edit the sync dropped, for `lattice sync --json`.
    func droppedEdits(_ report: ListsSyncReport) -> [JSON] {
        report.droppedEdits.map { edit in
            var object: [String: JSON] = ["id": .string(edit.recordName), "zone": .string(edit.zone),
                                          "deletion": .bool(edit.deletion)]
            if let list = lostList(edit, report) { object["list"] = .string(list.id) }
            return .object(object)
        }
    }

    func removals(_ report: ListsSyncReport) -> [String] {
        var lines: [String] = []
        for share in report.lostShares {
            let title = list(share).map { "\"\($0.title)\"" } ?? "list \(share.rootRecordName)"
            lines.append("\(title) is no longer shared with you")
        }
        for edit in report.droppedEdits {
            let why: String
            if edit.database == "private" {
                why = "zone \(edit.zone) was deleted on the server"
            } else if let list = lostList(edit, report) {
                why = "\"\(list.title)\" is no longer shared with you"
            } else {
                why = "you no longer have access to it"
            }
            let what = edit.deletion && label(edit.recordName) == edit.recordName
                ? "removal of \(edit.recordName)" : "change to \(label(edit.recordName))"
            lines.append("your unsent \(what) was dropped: \(why)")
        }
        for removed in report.removedZones {
            let gone = listsByZone[Self.zoneKey(removed.database, removed.zone, removed.owner)] ?? []
            if removed.database == "shared" {
                if gone.isEmpty {
                    lines.append("lists of zone \(removed.zone) are no longer shared with you")
                }
                for list in gone { lines.append("\"\(list.title)\" is no longer shared with you") }
            } else {
                let titles = gone.map { "\"\($0.title)\"" }.joined(separator: ", ")
                lines.append("zone \(removed.zone) was deleted on the server"
                             + (gone.isEmpty ? "" : ": " + titles + " went with it"))
            }
        }
        return lines
    }
}

func plural(_ count: Int, _ word: String) -> String { count == 1 ? word : word + "s" }

/// What a sync stopped by the server's "not now" means for the person: the reason, what stays queued, when
/// to try again.
func notNowLine(_ error: LatticeSyncError, queued: Int) -> String {
    "the server asked to wait (\(error.reason)): queued (\(queued) \(plural(queued, "change")) pending); "
        + (error.retryAdvice.map { $0 + " with lattice sync" } ?? "run lattice sync later")
}

/// Server and connection errors in words for people.
func describeClientError(_ error: any Error) -> String {
    if let error = error as? ServerError {
        if error.isNotNow {
            return "the server asked to wait: \(error.reason) (\(error.code))"
                + (error.retryAdvice.map { "; " + $0 } ?? "")
        }
        switch error.serverErrorCode {
        case .authenticationFailed?:
            return "the server no longer accepts this home's token (\(error.reason)); sign in again with lattice login"
        case .zoneNotFound?:
            return "the server has no such zone (\(error.reason)); run lattice sync"
        default:
            return "the server refused: \(error.reason) (\(error.code))"
        }
    }
    if let error = error as? TransportError {
        return "the server cannot be reached (\(error.description)); this needs a connection"
    }
    if let error = error as? LatticeSyncError {
        let code = error.serverErrorCode ?? error.code.rawValue
        if error.isNotNow {
            return "the server asked to wait: \(error.reason) (\(code))" + (error.retryAdvice.map { "; " + $0 } ?? "")
        }
        switch error.code {
        case .notAuthenticated:
            return "the server no longer accepts this home's token (\(error.reason)); sign in again with lattice login"
        case .networkUnavailable:
            return "the server cannot be reached (\(error.reason)); this needs a connection"
        case .zoneNotFound:
            return "the server has no such zone (\(error.reason)); run lattice sync"
        default:
            return "the server refused: \(error.reason) (\(code))"
        }
    }
    return "\(error)"
}

/// "1.2 MB", "830 bytes": a size for people.
func byteCount(_ bytes: Int64) -> String {
    if bytes < 1_000 { return "\(bytes) \(bytes == 1 ? "byte" : "bytes")" }
    if bytes < 1_000_000 { return String(format: "%.1f kB", Double(bytes) / 1e3) }
    return String(format: "%.1f MB", Double(bytes) / 1e6)
}
