import Foundation
import LatticeCore
import LatticeSync

/// A list as the CLI shows it.
public struct ListSummary: Sendable, Hashable {
    public let id: String
    public let title: String
    public let ownerRecordName: String
    /// The owner's user name when known (yours, or remembered when you accepted the share).
    public let ownerName: String?
    /// In a share (yours or someone else's).
    public let shared: Bool
    /// "owner", "readWrite" or "readOnly".
    public let permission: String
    public let zone: LocalZone
}

/// One item of a list.
public struct ListItem: Sendable, Hashable {
    public let id: String
    public let text: String
    public let done: Bool
    public let tags: [String]
    public let position: Double
}

public enum ListsError: Error, CustomStringConvertible, Sendable {
    case notFound(kind: String, query: String)
    case ambiguous(kind: String, query: String, candidates: [String])
    case readOnly(String)
    case invalid(String)

    public var description: String {
        switch self {
        case let .notFound(kind, query): return "no \(kind) matches \"\(query)\""
        case let .ambiguous(kind, query, candidates):
            return "\"\(query)\" matches several \(kind)s:\n" + candidates.map { "  " + $0 }.joined(separator: "\n")
        case .readOnly(let title): return "you have read-only access to \"\(title)\""
        case .invalid(let message): return message
        }
    }
}

/// Collaborative lists on top of the sync engine.
///
/// A list is a `List` record (field `title`); each item is an `Item` record whose `parent` is the list, so a
/// root-record share of the list carries its items. Item fields `text`, `done` and `position` are
/// last-writer-wins registers and `tags` is an add-wins set. Items show in `position` order, ties broken
/// by id, so concurrent inserts get the same order on every device.
public final class Lists: Sendable {
    public let engine: SyncEngine
    public static let defaultZone = "Lists"

    public init(engine: SyncEngine) { self.engine = engine }

    // MARK: Reading

    public func all() throws -> [ListSummary] {
        guard let account = engine.account else { throw SyncError.notSignedIn }
        var lists: [ListSummary] = []
        for zone in try engine.zones() {
            let records = try engine.records(in: zone).filter { !$0.isDeleted }
            let shares = records.filter { $0.recordType == "cloudkit.share" }
            for record in records where record.recordType == "List" {
                let share = shares.first { $0["rootRecordName"] == .string(record.id.recordName) }
                    ?? shares.first { $0.id.recordName == "cloudkit.zoneshare" }
                let permission: String
                if zone.database == "private" {
                    permission = "owner"
                } else {
                    permission = share.flatMap { Self.permission(of: account.userRecordName, in: $0) } ?? "readOnly"
                }
                let title: String
                if case .scalar(.string(let text))? = record["title"] { title = text } else { title = "" }
                let ownerName = zone.database == "private" ? account.name : try engine.userName(zone.ownerRecordName)
                lists.append(ListSummary(id: record.id.recordName, title: title, ownerRecordName: zone.ownerRecordName,
                                         ownerName: ownerName, shared: share != nil, permission: permission, zone: zone))
            }
        }
        return lists.sorted { ($0.title, $0.id) < ($1.title, $1.id) }
    }

    /// A participant's permission, from the share record's `participants` entries
    /// ("userRecordName role permission status").
    static func permission(of user: String, in share: Record) -> String? {
        guard case .list(_, let entries)? = share["participants"] else { return nil }
        for case .string(let entry) in entries {
            let parts = entry.split(separator: " ").map(String.init)
            if parts.count == 4, parts[0] == user, parts[3] == "accepted" { return parts[1] == "owner" ? "owner" : parts[2] }
        }
        return nil
    }

    /// A list by id, id prefix or title. An ambiguous query is an error listing the candidates.
    public func resolve(_ query: String) throws -> ListSummary {
        let lists = try all()
        return try Self.pick(lists, query: query, kind: "list", id: \.id, label: \.title)
    }

    public func items(of list: ListSummary) throws -> [ListItem] {
        try engine.records(in: list.zone)
            .filter { !$0.isDeleted && $0.recordType == "Item" && $0.parent?.recordName == list.id }
            .map(Self.item)
            .sorted { ($0.position, $0.id) < ($1.position, $1.id) }
    }

    public func resolveItem(_ query: String, in list: ListSummary) throws -> ListItem {
        try Self.pick(try items(of: list), query: query, kind: "item", id: \.id, label: \.text)
    }

    static func item(_ record: Record) -> ListItem {
        var text = ""
        var done = false
        var position = 0.0
        var tags: [String] = []
        if case .scalar(.string(let value))? = record["text"] { text = value }
        if case .scalar(.int64(let value))? = record["done"] { done = value != 0 }
        switch record["position"] {
        case .scalar(.double(let value))?: position = value
        case .scalar(.int64(let value))?: position = Double(value)
        default: break
        }
        if case .list(_, let elements)? = record["tags"] {
            tags = elements.compactMap { if case .string(let tag) = $0 { return tag } else { return nil } }
        }
        return ListItem(id: record.id.recordName, text: text, done: done, tags: tags, position: position)
    }

    /// Exact id, then exact label, then id prefix, then a unique label match ignoring case.
    static func pick<T>(_ candidates: [T], query: String, kind: String, id: KeyPath<T, String>, label: KeyPath<T, String>)
        throws -> T {
        if let exact = candidates.first(where: { $0[keyPath: id] == query }) { return exact }
        for matcher in [
            { (c: T) in c[keyPath: label] == query },
            { (c: T) in c[keyPath: id].hasPrefix(query) },
            { (c: T) in c[keyPath: label].lowercased() == query.lowercased() },
        ] {
            let matches = candidates.filter(matcher)
            if matches.count == 1 { return matches[0] }
            if matches.count > 1 {
                throw ListsError.ambiguous(kind: kind, query: query,
                                           candidates: matches.map { "\($0[keyPath: id])  \($0[keyPath: label])" })
            }
        }
        throw ListsError.notFound(kind: kind, query: query)
    }

    // MARK: Writing (local first; the caller syncs)

    private func writable(_ list: ListSummary) throws {
        if list.permission == "readOnly" { throw ListsError.readOnly(list.title) }
    }

    static func newID(_ prefix: String) -> String {
        var random = SystemRandomNumberGenerator()
        return prefix + String(random.next() & 0xFFFF_FFFF_FFFF, radix: 16).leftPadded(to: 12)
    }

    @discardableResult
    public func create(title: String, zone zoneName: String? = nil) throws -> ListSummary {
        let zone = try engine.privateZone(zoneName ?? Self.defaultZone)
        let id = Self.newID("l")
        try engine.edit(id, in: zone, creating: "List") { record, stamp in
            try record.set("title", to: .string(title), at: stamp())
        }
        return try resolve(id)
    }

    @discardableResult
    public func add(_ text: String, tags: [String] = [], to list: ListSummary) throws -> ListItem {
        try writable(list)
        let position = (try items(of: list).map(\.position).max() ?? 0) + 1
        let id = Self.newID("i")
        let parent = try Reference(recordName: list.id)
        let record = try engine.edit(id, in: list.zone, creating: "Item") { record, stamp in
            try record.setParent(parent, at: stamp())
            try record.set("text", to: .string(text), at: stamp())
            try record.set("done", to: .int64(0), at: stamp())
            try record.set("position", to: .double(position), at: stamp())
            try record.add(tags.map { .string($0) }, to: "tags", at: stamp())
        }
        return Self.item(try record.decoded())
    }

    public func setDone(_ item: ListItem, in list: ListSummary, _ done: Bool) throws {
        try writable(list)
        try engine.edit(item.id, in: list.zone) { record, stamp in
            try record.set("done", to: .int64(done ? 1 : 0), at: stamp())
        }
    }

    public func edit(_ item: ListItem, in list: ListSummary, text: String?, addTags: [String], removeTags: [String]) throws {
        try writable(list)
        try engine.edit(item.id, in: list.zone) { record, stamp in
            if let text { try record.set("text", to: .string(text), at: stamp()) }
            try record.remove(removeTags.map { .string($0) }, from: "tags", at: stamp())
            try record.add(addTags.map { .string($0) }, to: "tags", at: stamp())
        }
    }

    public func remove(_ item: ListItem, in list: ListSummary) throws {
        try writable(list)
        try engine.delete([item.id], in: list.zone)
    }

    public func rename(_ list: ListSummary, to title: String) throws {
        try writable(list)
        try engine.edit(list.id, in: list.zone) { record, stamp in
            try record.set("title", to: .string(title), at: stamp())
        }
    }

    /// Deletes the list and its items (owner only for shared lists: the server refuses others).
    public func delete(_ list: ListSummary) throws {
        try writable(list)
        try engine.delete(try items(of: list).map(\.id) + [list.id], in: list.zone)
    }

    // MARK: Explain

    /// Who won a field of an item (or of the list itself when `item` is nil): the winning write's replica
    /// and hybrid-logical-clock time, and whether it was this device.
    public func explain(_ list: ListSummary, item: ListItem?, field: String) throws -> String {
        let name = item?.id ?? list.id
        guard let record = try engine.record(name, in: list.zone) else { throw ListsError.notFound(kind: "record", query: name) }
        let mine = engine.replicaID
        func who(_ stamp: Stamp) -> String {
            let date = Date(timeIntervalSince1970: Double(stamp.hlc.milliseconds) / 1000)
            let device = stamp.replica == mine ? "this device" : "replica \(stamp.replica)"
            return "\(device) at \(date) (hlc \(stamp.hlc))"
        }
        switch record.provenance(of: field) {
        case .register(let stamp)?:
            let value = record[field].map { "\($0)" } ?? "cleared"
            return "\(field) = \(value): written by \(who(stamp))"
        case .set(let elements, let latest)?:
            var lines = ["\(field): add-wins set, latest operation at hlc \(latest)"]
            for (value, dots) in elements { lines.append("  \(value) kept by the add(s) of " + dots.map(who).joined(separator: "; ")) }
            return lines.joined(separator: "\n")
        case nil:
            throw ListsError.invalid("\(name) has no field \(field)")
        }
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
