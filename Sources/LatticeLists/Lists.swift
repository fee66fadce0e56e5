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
    /// Files attached to the item (`Lists.attach`), by name.
    public var attachments: [ListAttachment] = []
    /// The item's note: a text field merged character by character, so two people can edit it at once.
    public var note: String = ""
}

/// A file attached to an item: an asset (field `attachments`, an ASSETID list) and the name it was attached
/// under (field `attachmentNames`: `"<SHA-256 hex>/<name>"` entries, an add-wins set like the assets).
public struct ListAttachment: Sendable, Hashable {
    public let asset: AssetValue
    public let name: String
    /// The field that holds it: `attachments`, or `photo` (the photo the web client attaches).
    public var fieldName = "attachments"
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

/// Collaborative lists on top of the app's replica (`ListsReplica`, on LatticeSync's public engine).
///
/// A list is a `List` record (field `title`); each item is an `Item` record whose `parent` is the list, so a
/// root-record share of the list carries its items. Item fields `text`, `done` and `position` are
/// last-writer-wins registers, `tags` is an add-wins set (`STRING_SET`) and `note` a text merged character
/// by character (`TEXT`). Items show in `position` order, ties broken by id, so concurrent inserts get the
/// same order on every device. A move sets the moved item's `position` between its new neighbours' (one
/// register per item: concurrent moves and inserts converge, and no item is ever shown twice).
public final class Lists: Sendable {
    public let replica: ListsReplica
    public static let defaultZone = "Lists"

    public init(replica: ListsReplica) { self.replica = replica }

    // MARK: Reading

    public func all() throws -> [ListSummary] {
        guard let account = replica.account else { throw SyncError.notSignedIn }
        var lists: [ListSummary] = []
        for zone in try replica.zones() {
            let records = try replica.records(in: zone)
            let shares = records.filter { $0.recordType == "cloudkit.share" }
            for record in records where record.recordType == "List" {
                let root = record.recordID.recordName
                let share = shares.first { $0["rootRecordName"] == root }
                    ?? shares.first { $0.recordID.recordName == "cloudkit.zoneshare" }
                let permission: String
                if zone.database == "private" {
                    permission = "owner"
                } else {
                    permission = share.flatMap { Self.permission(of: account.userRecordName, in: $0) } ?? "readOnly"
                }
                let title: String = record["title"] ?? ""
                let ownerName = zone.database == "private" ? account.name : try replica.userName(zone.ownerRecordName)
                lists.append(ListSummary(id: root, title: title, ownerRecordName: zone.ownerRecordName,
                                         ownerName: ownerName, shared: share != nil, permission: permission, zone: zone))
            }
        }
        return lists.sorted { ($0.title, $0.id) < ($1.title, $1.id) }
    }

    /// A participant's permission, from the share record's `participants` entries
    /// ("userRecordName role permission status").
    static func permission(of user: String, in share: LatticeRecord) -> String? {
        let entries: [String] = share["participants"] ?? []
        for entry in entries {
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
        try replica.records(in: list.zone)
            .filter { $0.recordType == "Item" && $0.parent?.recordID.recordName == list.id }
            .map(Self.item)
            .sorted { ($0.position, $0.id) < ($1.position, $1.id) }
    }

    public func resolveItem(_ query: String, in list: ListSummary) throws -> ListItem {
        try Self.pick(try items(of: list), query: query, kind: "item", id: \.id, label: \.text)
    }

    static func item(_ record: LatticeRecord) -> ListItem {
        let position: Double = record["position"] ?? (record["position"] as Int64?).map(Double.init) ?? 0
        let done: Bool = record["done"] ?? false
        // Tags are a set; should two devices ever have written them as a list, each tag shows once.
        var tags: [String] = []
        for tag in record["tags"] ?? [String]() where !tags.contains(tag) { tags.append(tag) }
        var note = ""
        if case .text(let text)? = record.fieldValue("note") { note = text }
        return ListItem(id: record.recordID.recordName, text: record["text"] ?? "", done: done, tags: tags,
                        position: position, attachments: attachments(record), note: note)
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

    /// A record of the list's zone to edit: the one this device holds, or a new one.
    private func editable(_ name: String, in zone: LocalZone, creating recordType: String? = nil) throws -> LatticeRecord {
        if let record = try replica.record(name, in: zone) { return record }
        guard let recordType else { throw SyncError.notFound(name) }
        return LatticeRecord(recordType: recordType, recordID: .init(recordName: name, zoneID: replica.zoneID(zone)))
    }

    @discardableResult
    public func create(title: String, zone zoneName: String? = nil) throws -> ListSummary {
        let zone = try replica.privateZone(zoneName ?? Self.defaultZone)
        let id = Self.newID("l")
        var record = try editable(id, in: zone, creating: "List")
        record["title"] = title
        try replica.save(record, in: zone)
        return try resolve(id)
    }

    @discardableResult
    public func add(_ text: String, tags: [String] = [], to list: ListSummary) throws -> ListItem {
        try writable(list)
        let position = (try items(of: list).map(\.position).max() ?? 0) + 1
        var record = try editable(Self.newID("i"), in: list.zone, creating: "Item")
        record.parent = .init(recordID: .init(recordName: list.id, zoneID: replica.zoneID(list.zone)))
        record["text"] = text
        record["done"] = false
        record["position"] = position
        if !tags.isEmpty { record.insert(tags, intoSetForKey: "tags") }
        try replica.save(record, in: list.zone)
        return Self.item(record)
    }

    public func setDone(_ item: ListItem, in list: ListSummary, _ done: Bool) throws {
        try writable(list)
        var record = try editable(item.id, in: list.zone)
        record["done"] = done
        try replica.save(record, in: list.zone)
    }

    public func edit(_ item: ListItem, in list: ListSummary, text: String?, addTags: [String], removeTags: [String]) throws {
        try writable(list)
        var record = try editable(item.id, in: list.zone)
        if let text { record["text"] = text }
        if !removeTags.isEmpty { record.remove(removeTags, fromListForKey: "tags") }
        if !addTags.isEmpty { record.insert(addTags, intoSetForKey: "tags") }
        try replica.save(record, in: list.zone)
    }

    /// Sets an item's note to `note`, as the fewest splices from the note this device holds (so another
    /// person's concurrent edits elsewhere in it stay). An empty note clears it.
    public func setNote(_ item: ListItem, in list: ListSummary, _ note: String) throws {
        try writable(list)
        var record = try editable(item.id, in: list.zone)
        if case .text(let current)? = record.fieldValue("note"), current == note { return }
        if record.fieldValue("note") == nil && note.isEmpty { return }
        record.setText(note, forKey: "note")
        try replica.save(record, in: list.zone)
    }

    /// Moves an item so it is shown at `index` (from 1) among the list's items: its `position` becomes the
    /// midpoint of its new neighbours' (one before the first, one after the last). When no double lies
    /// between them, every item is renumbered 1, 2, 3... in the new order. Returns the item's new index.
    @discardableResult
    public func move(_ item: ListItem, in list: ListSummary, to index: Int) throws -> Int {
        try writable(list)
        var others = try items(of: list).filter { $0.id != item.id }
        guard index >= 1 && index <= others.count + 1 else {
            throw ListsError.invalid("position \(index) is outside 1...\(others.count + 1)")
        }
        let before = index >= 2 ? others[index - 2].position : nil
        let after = index <= others.count ? others[index - 1].position : nil
        let position: Double? = switch (before, after) {
        case let (b?, a?): Self.midpoint(b, a)
        case let (b?, nil): b + 1
        case let (nil, a?): a - 1
        case (nil, nil): item.position
        }
        if let position, position.isFinite {
            var record = try editable(item.id, in: list.zone)
            record["position"] = position
            try replica.save(record, in: list.zone)
            return index
        }
        // No room between the neighbours: renumber everything in the new order.
        others.insert(item, at: index - 1)
        for (offset, each) in others.enumerated() where each.position != Double(offset + 1) {
            var record = try editable(each.id, in: list.zone)
            record["position"] = Double(offset + 1)
            try replica.save(record, in: list.zone)
        }
        return index
    }

    /// A double strictly between `a` and `b` (a < b), or nil when there is none.
    static func midpoint(_ a: Double, _ b: Double) -> Double? {
        guard a < b else { return nil }
        let middle = a / 2 + b / 2
        return middle > a && middle < b ? middle : nil
    }

    /// Attaches a file to an item: it is copied into the home's asset store now (hashed as it is copied) and
    /// uploaded with the next sync, before the item's change is sent.
    @discardableResult
    public func attach(_ file: URL, to item: ListItem, in list: ListSummary) throws -> ListAttachment {
        try writable(list)
        guard let store = replica.assets else { throw ListsError.invalid("this home has no asset store") }
        let asset = try store.importFile(file)
        let name = Self.attachmentName(file.lastPathComponent)
        var record = try editable(item.id, in: list.zone)
        record.append(contentsOf: [asset], toListForKey: Self.attachmentsKey)
        record.append(contentsOf: [asset.checksumHex + "/" + name], toListForKey: Self.attachmentNamesKey)
        try replica.save(record, in: list.zone)
        return ListAttachment(asset: asset, name: name)
    }

    /// The file of an attachment, downloaded (and cached in the home) if this device does not have it.
    public func file(of attachment: ListAttachment, of item: ListItem, in list: ListSummary) async throws -> URL {
        try await replica.assetFile(attachment.asset, record: item.id, fieldName: attachment.fieldName, in: list.zone)
    }

    static let attachmentsKey = "attachments"
    static let photoKey = "photo"
    static let attachmentNamesKey = "attachmentNames"

    /// A file name kept for an attachment: its last path component, without control characters or slashes,
    /// at most 200 bytes; `attachment` when nothing is left.
    static func attachmentName(_ name: String) -> String {
        var kept = String(name.unicodeScalars.filter { $0.value >= 0x20 && $0.value != 0x7F && $0 != "/" && $0 != "\\" })
        while kept.hasPrefix(".") { kept.removeFirst() }
        while kept.utf8.count > 200 { kept.removeLast() }
        return kept.isEmpty ? "attachment" : kept
    }

    static func attachments(_ record: LatticeRecord) -> [ListAttachment] {
        let assets: [AssetValue] = record[attachmentsKey] ?? []
        let names: [String] = record[attachmentNamesKey] ?? []
        var byChecksum: [String: String] = [:]
        for entry in names {
            guard let slash = entry.firstIndex(of: "/") else { continue }
            byChecksum[String(entry[..<slash])] = String(entry[entry.index(after: slash)...])
        }
        var attachments = assets.map { ListAttachment(asset: $0, name: byChecksum[$0.checksumHex] ?? "attachment") }
            .sorted { ($0.name, $0.asset.checksumHex) < ($1.name, $1.asset.checksumHex) }
        // The web client's photo of the item (one ASSETID field, no file name kept).
        if let photo: AssetValue = record[photoKey] {
            attachments.insert(ListAttachment(asset: photo, name: "photo", fieldName: photoKey), at: 0)
        }
        return attachments
    }

    public func remove(_ item: ListItem, in list: ListSummary) throws {
        try writable(list)
        try replica.delete([item.id], in: list.zone)
    }

    public func rename(_ list: ListSummary, to title: String) throws {
        try writable(list)
        var record = try editable(list.id, in: list.zone)
        record["title"] = title
        try replica.save(record, in: list.zone)
    }

    /// Deletes the list and its items (owner only for shared lists: the server refuses others).
    public func delete(_ list: ListSummary) throws {
        try writable(list)
        try replica.delete(try items(of: list).map(\.id) + [list.id], in: list.zone)
    }
}

extension String {
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
