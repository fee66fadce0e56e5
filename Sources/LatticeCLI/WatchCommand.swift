import Dispatch
import Foundation
import LatticeCore
import LatticeLists
import LatticeSync
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

// lattice watch: sync, wait on the server's push path (changes/wait), sync again, print what changed.

/// How SIGINT/SIGTERM stop the watch loop: at once while it waits on the server (nothing is being
/// written), or after the sync in progress.
final class WatchStop: Sendable {
    private struct State {
        var working = false
        var requested = false
    }
    private let state = Mutex(State())

    /// From the signal source's queue.
    func request() {
        state.withLock { state in
            state.requested = true
            if !state.working {
                // Waiting on a long poll or a retry pause: no transaction is open, stdout is flushed below.
                fflush(nil)
                writeStandardError("\nlattice: watch stopped\n")
                _exit(0)
            }
        }
    }

    /// Enters a sync; false when a stop came first.
    func beginWork() -> Bool {
        state.withLock { state in
            if state.requested { return false }
            state.working = true
            return true
        }
    }

    /// Leaves a sync; false when a stop came during it.
    func endWork() -> Bool {
        fflush(nil)
        return state.withLock { state in
            state.working = false
            return !state.requested
        }
    }
}

/// Takes SIGINT and SIGTERM with dispatch sources (nothing runs in signal context). A plain function,
/// not a main.swift closure: the handler runs on a dispatch queue.
func installStopSignals(_ stop: WatchStop) -> [any DispatchSourceSignal] {
    [SIGINT, SIGTERM].map { number in
        signal(number, SIG_IGN)
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { stop.request() }
        source.resume()
        return source
    }
}

/// The lists and items this device shows, to tell what a sync changed.
struct ListsSnapshot {
    var lists: [String: ListSummary] = [:]
    var items: [String: [String: ListItem]] = [:]
    var order: [String] = []

    init(_ lists: Lists, only listID: String?) throws {
        for list in try lists.all() where listID == nil || list.id == listID {
            self.lists[list.id] = list
            order.append(list.id)
            var byID: [String: ListItem] = [:]
            for item in try lists.items(of: list) { byID[item.id] = item }
            items[list.id] = byID
        }
    }

    /// What changed from `old` to this snapshot, in print order.
    func changes(since old: ListsSnapshot) -> [WatchChange] {
        var changes: [WatchChange] = []
        for id in old.order where lists[id] == nil {
            changes.append(.listRemoved(old.lists[id]!))
        }
        for id in order {
            let list = lists[id]!
            guard let before = old.lists[id] else {
                changes.append(.listAdded(list))
                for item in sortedItems(id) { changes.append(.itemAdded(item, list)) }
                continue
            }
            if before.title != list.title || before.permission != list.permission || before.shared != list.shared {
                changes.append(.listChanged(list, before: before))
            }
            let oldItems = old.items[id] ?? [:]
            for (itemID, item) in oldItems.sorted(by: { ($0.value.position, $0.key) < ($1.value.position, $1.key) })
            where items[id]?[itemID] == nil {
                changes.append(.itemRemoved(item, list))
            }
            for item in sortedItems(id) {
                if let previous = oldItems[item.id] {
                    if previous != item { changes.append(.itemChanged(item, before: previous, list)) }
                } else {
                    changes.append(.itemAdded(item, list))
                }
            }
        }
        return changes
    }

    private func sortedItems(_ listID: String) -> [ListItem] {
        (items[listID] ?? [:]).values.sorted { ($0.position, $0.id) < ($1.position, $1.id) }
    }
}

enum WatchChange {
    case listAdded(ListSummary)
    case listChanged(ListSummary, before: ListSummary)
    case listRemoved(ListSummary)
    case itemAdded(ListItem, ListSummary)
    case itemChanged(ListItem, before: ListItem, ListSummary)
    case itemRemoved(ListItem, ListSummary)

    var json: JSON {
        switch self {
        case .listAdded(let list):
            return .object(["change": .string("listAdded"), "list": listJSON(list)])
        case .listChanged(let list, let before):
            return .object(["change": .string("listChanged"), "list": listJSON(list), "before": listJSON(before)])
        case .listRemoved(let list):
            return .object(["change": .string("listRemoved"), "list": listJSON(list)])
        case .itemAdded(let item, let list):
            return .object(["change": .string("itemAdded"), "list": listJSON(list), "item": itemJSON(item)])
        case .itemChanged(let item, let before, let list):
            return .object(["change": .string("itemChanged"), "list": listJSON(list), "item": itemJSON(item),
                            "before": itemJSON(before)])
        case .itemRemoved(let item, let list):
            return .object(["change": .string("itemRemoved"), "list": listJSON(list), "item": itemJSON(item)])
        }
    }

    var line: String {
        func describe(_ item: ListItem) -> String {
            "\(checkbox(item.done)) \(item.text)" + (item.tags.isEmpty ? "" : "  " + tagWords(item.tags))
        }
        switch self {
        case .listAdded(let list):
            let access = list.permission == "owner" ? "" : ", \(permissionWord(list.permission))"
            return "+ list \"\(list.title)\" (owner \(ownerLabel(list))\(access))"
        case .listChanged(let list, let before):
            var parts: [String] = []
            if before.title != list.title { parts.append("renamed to \"\(list.title)\"") }
            if before.permission != list.permission {
                parts.append("your access is now \(permissionWord(list.permission))")
            }
            if before.shared != list.shared { parts.append(list.shared ? "now shared" : "no longer shared") }
            return "~ list \"\(before.title)\" " + parts.joined(separator: ", ")
        case .listRemoved(let list):
            return list.zone.database == "shared" ? "- list \"\(list.title)\" is no longer shared with you"
                                                  : "- list \"\(list.title)\" was deleted"
        case .itemAdded(let item, let list):
            return "+ \(list.title): \(describe(item))"
        case .itemChanged(let item, let before, let list):
            var parts: [String] = []
            if before.text != item.text { parts.append("was \"\(before.text)\"") }
            if before.done != item.done { parts.append(item.done ? "checked" : "unchecked") }
            let added = item.tags.filter { !before.tags.contains($0) }
            let removed = before.tags.filter { !item.tags.contains($0) }
            if !added.isEmpty { parts.append("tagged " + tagWords(added)) }
            if !removed.isEmpty { parts.append("untagged " + tagWords(removed)) }
            if before.position != item.position { parts.append("moved") }
            return "~ \(list.title): \(describe(item))  (\(parts.joined(separator: ", ")))"
        case .itemRemoved(let item, let list):
            return "- \(list.title): \(item.text)"
        }
    }
}

func runWatch(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments)
    if options.help { return print(watchUsage) }
    guard options.positionals.count <= 1 else { throw UsageError("unexpected argument \(options.positionals[1])") }
    let query = options.positionals.first
    let (engine, lists) = try options.openLists()
    let server = engine.account?.serverURL ?? "the server"

    let stop = WatchStop()
    let sources = installStopSignals(stop)
    defer { sources.forEach { $0.cancel() } }

    guard stop.beginWork() else { return }
    var online = try waitForAsyncWork { try await engine.sync() }.online
    let target = try query.map { try lists.resolve($0) }
    var snapshot = try ListsSnapshot(lists, only: target?.id)
    writeStandardError("watching " + (target.map { "\"\($0.title)\"" } ?? "all lists") + " on \(server)"
                       + (online ? "" : " (offline for now: retrying)") + "; Ctrl-C stops\n")
    guard stop.endWork() else { return }

    // The server's "not now" (THROTTLED, TRY_AGAIN_LATER): said on stderr, then waited out here, between
    // requests (a stop signal still ends the process at once), not retried at once.
    var pause: Double = 0
    func notNow(_ error: LatticeSyncError) {
        writeStandardError("the server asked to wait (\(error.reason)); "
                           + (error.retryAdvice.map { $0.replacingOccurrences(of: "try again", with: "trying again") }
                              ?? "trying again in 2 seconds") + "\n")
        pause = max(2, error.retryAfter ?? 2)
    }

    while true {
        if pause > 0 {
            Thread.sleep(forTimeInterval: pause)
            pause = 0
        }
        var changed = !online
        do {
            // One parked request on both databases; the server answers the moment either changes, and a
            // stop signal ends the process at once, so the wait can be long.
            if online { changed = try waitForAsyncWork { try await engine.waitForChanges(timeoutSeconds: 25) } }
        } catch let error as LatticeSyncError where error.code == .networkUnavailable {
            if online { writeStandardError("lost \(server); retrying\n") }
            online = false
        } catch let error as LatticeSyncError where error.isNotNow {
            notNow(error)
            continue
        } catch let error as LatticeSyncError where error.code != .notAuthenticated {
            changed = true // e.g. an expired token: the sync below starts over
        }
        if !online { Thread.sleep(forTimeInterval: 2) }
        guard stop.beginWork() else { return }
        if changed {
            let labels = try RecordLabels(lists)
            let report = try waitForAsyncWork { try await engine.sync() }
            if report.online && !online { writeStandardError("back online\n") }
            online = report.online
            let next = try ListsSnapshot(lists, only: target?.id)
            for change in next.changes(since: snapshot) {
                print(options.json ? change.json.serialized() : change.line)
            }
            for line in labels.refusals(report) { writeStandardError(line + "\n") }
            if let error = report.notNow { notNow(error) } // what was not sent stays queued
            snapshot = next
            if let target, next.lists[target.id] == nil {
                _ = stop.endWork()
                return // the watched list is gone
            }
        }
        guard stop.endWork() else { return }
    }
}
