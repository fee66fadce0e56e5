import Foundation
import LatticeCore
import Synchronization

/// A zone of records, as `CKRecordZone`: only its identity for now.
public struct LatticeRecordZone: Hashable, Sendable, Codable {
    /// A zone's identity, as `CKRecordZone.ID`: its name and its owner's user record name.
    public struct ID: Hashable, Sendable, Codable, CustomStringConvertible {
        /// The owner of zones of the signed-in user, as `CKCurrentUserDefaultName`: the engine puts the
        /// account's user record name in its place when it talks to the server, and reports the user's own
        /// zones with it.
        public static let currentUserOwnerName = "__defaultOwner__"

        public var zoneName: String
        public var ownerName: String

        public init(zoneName: String, ownerName: String = ID.currentUserOwnerName) {
            self.zoneName = zoneName
            self.ownerName = ownerName
        }

        public var description: String { "\(zoneName) of \(ownerName)" }
    }

    public var zoneID: ID

    public init(zoneID: ID) { self.zoneID = zoneID }
    public init(zoneName: String) { zoneID = ID(zoneName: zoneName) }
}

/// A value a record's field holds, as CloudKit's `CKRecordValueProtocol`: strings, integers, doubles,
/// Booleans (stored as 0 and 1, as CloudKit does), dates (milliseconds), bytes, references, and arrays of
/// them (ordered lists, `T_LIST`; an add-wins set field, `T_SET`, also reads as an array, Merge.md §3).
/// A `String` also reads a text field (`TEXT`); it is written as a text with `setText(_:forKey:)`.
public protocol LatticeRecordValue: Sendable {
    /// The field's value as Lattice stores it.
    var latticeFieldValue: FieldValue { get }
    /// The value read back from a field, nil when the field holds another type.
    init?(latticeFieldValue: FieldValue)
}

/// A scalar a record can hold, alone or in a list.
public protocol LatticeScalarValue: LatticeRecordValue {
    var latticeScalar: ScalarValue { get }
    init?(latticeScalar: ScalarValue)
}

extension LatticeScalarValue {
    public var latticeFieldValue: FieldValue { .scalar(latticeScalar) }
    public init?(latticeFieldValue: FieldValue) {
        guard case .scalar(let scalar) = latticeFieldValue else { return nil }
        self.init(latticeScalar: scalar)
    }
}

extension String: LatticeScalarValue {
    public var latticeScalar: ScalarValue { .string(self) }
    public init?(latticeScalar: ScalarValue) {
        guard case .string(let value) = latticeScalar else { return nil }
        self = value
    }

    /// A `STRING` field's value, or a `TEXT` field's text.
    public init?(latticeFieldValue: FieldValue) {
        switch latticeFieldValue {
        case .scalar(.string(let value)), .text(let value): self = value
        default: return nil
        }
    }
}

extension Int64: LatticeScalarValue {
    public var latticeScalar: ScalarValue { .int64(self) }
    public init?(latticeScalar: ScalarValue) {
        guard case .int64(let value) = latticeScalar else { return nil }
        self = value
    }
}

extension Int: LatticeScalarValue {
    public var latticeScalar: ScalarValue { .int64(Int64(self)) }
    public init?(latticeScalar: ScalarValue) {
        guard case .int64(let value) = latticeScalar, let int = Int(exactly: value) else { return nil }
        self = int
    }
}

extension Double: LatticeScalarValue {
    public var latticeScalar: ScalarValue { .double(self) }
    public init?(latticeScalar: ScalarValue) {
        guard case .double(let value) = latticeScalar else { return nil }
        self = value
    }
}

extension Bool: LatticeScalarValue {
    public var latticeScalar: ScalarValue { .int64(self ? 1 : 0) }
    public init?(latticeScalar: ScalarValue) {
        guard case .int64(let value) = latticeScalar else { return nil }
        self = value != 0
    }
}

extension Date: LatticeScalarValue {
    /// Milliseconds since 1970, as Lattice's `TIMESTAMP` (CloudKit's precision).
    public var latticeScalar: ScalarValue { .timestamp(Int64((timeIntervalSince1970 * 1000).rounded())) }
    public init?(latticeScalar: ScalarValue) {
        guard case .timestamp(let value) = latticeScalar else { return nil }
        self = Date(timeIntervalSince1970: Double(value) / 1000)
    }
}

extension Data: LatticeScalarValue {
    public var latticeScalar: ScalarValue { .bytes([UInt8](self)) }
    public init?(latticeScalar: ScalarValue) {
        guard case .bytes(let value) = latticeScalar else { return nil }
        self = Data(value)
    }
}

extension AssetValue: LatticeScalarValue {
    /// An asset (CKAsset): its SHA-256 and size; the bytes are in the engine's `AssetStore` or on the server.
    public var latticeScalar: ScalarValue { .asset(self) }
    public init?(latticeScalar: ScalarValue) {
        guard case .asset(let value) = latticeScalar else { return nil }
        self = value
    }
}

extension Array: LatticeRecordValue where Element: LatticeScalarValue {
    /// A list field. Its element type is taken from the first element (`STRING` for an empty list of
    /// strings, as for any empty list whose type cannot be told otherwise).
    public var latticeFieldValue: FieldValue {
        .list(first?.latticeScalar.type ?? Self.elementType, map(\.latticeScalar))
    }

    /// A list field's elements in order, or a set field's in ascending order.
    public init?(latticeFieldValue: FieldValue) {
        let elements: [ScalarValue]
        switch latticeFieldValue {
        case .list(_, let values), .set(_, let values): elements = values
        default: return nil
        }
        var result: [Element] = []
        result.reserveCapacity(elements.count)
        for element in elements {
            guard let value = Element(latticeScalar: element) else { return nil }
            result.append(value)
        }
        self = result
    }

    static var elementType: ValueType {
        switch Element.self {
        case is Int64.Type, is Int.Type, is Bool.Type: return .int64
        case is Double.Type: return .double
        case is Date.Type: return .timestamp
        case is Data.Type: return .bytes
        case is AssetValue.Type: return .asset
        default: return .string
        }
    }
}

/// A record as an app sees it, with `CKRecord`'s everyday surface: its type and ID, fields by key,
/// `changedKeys()`, a parent reference and system fields to archive.
///
/// Its merge semantics are Lattice's (Merge.md): a record holds the last state the engine gave (its
/// "system fields", which here include every field's CRDT state) and the edits made since, in order.
/// Sending it sends only the edits that change something, each stamped with the time its change was
/// queued (`State.add(pendingRecordZoneChanges:)`, see `State`), and the server joins them with what
/// other devices wrote: no `serverRecordChanged`, unless a batch asks for the strict save policy. Setting
/// a field to the value it has sends nothing, so an app may rebuild a record from its own data when the
/// batch is asked for.
public struct LatticeRecord: Sendable, CustomStringConvertible {
    /// A record's identity, as `CKRecord.ID`.
    public struct ID: Hashable, Sendable, Codable, CustomStringConvertible {
        public var recordName: String
        public var zoneID: LatticeRecordZone.ID

        public init(recordName: String, zoneID: LatticeRecordZone.ID) {
            self.recordName = recordName
            self.zoneID = zoneID
        }

        /// A new ID with a random name (a UUID), as `CKRecord.ID(zoneID:)`.
        public init(zoneID: LatticeRecordZone.ID) {
            self.init(recordName: UUID().uuidString, zoneID: zoneID)
        }

        public var description: String { "\(recordName) in \(zoneID)" }

        /// Equal IDs have equal names: the name alone is hashed (a batch looks records up by ID several
        /// times each; names rarely repeat across zones, and equality still compares the zone).
        public func hash(into hasher: inout Hasher) { hasher.combine(recordName) }
    }

    /// A reference to another record, as `CKRecord.Reference` (the parent, or a field's value).
    public struct Reference: Hashable, Sendable {
        public enum Action: Sendable { case none, deleteSelf }
        public var recordID: ID
        public var action: Action

        public init(recordID: ID, action: Action = .none) {
            self.recordID = recordID
            self.action = action
        }
    }

    /// One edit made since the record was given, in order.
    enum Edit: Sendable {
        case set(String, FieldValue?)
        /// Adds to a collection field as its kind means (`RecordEdit.addElements`); `set` creates a missing
        /// field as an add-wins set rather than a list.
        case add(String, [ScalarValue], set: Bool)
        case remove(String, [ScalarValue])
        /// At a position (Unicode scalars of a text, elements of a list), deletes a count and inserts.
        case splice(String, position: Int, deleted: Int, inserted: FieldValue)
        case parent(Reference?)
    }

    /// The record type of a share's record, as `CKRecord.SystemType.share`: the engine gives these like any
    /// other record (title, public permission, participants, `rootRecordName`).
    public static let shareRecordType = "cloudkit.share"

    public let recordID: ID
    public let recordType: String
    /// The state the engine last gave (its system fields), nil for a record made on this device.
    let stored: StoredState?
    /// The base decoded (once, when first read).
    var base: Record? { stored?.record }
    /// The state the edits were made over, when the record was rebased since (`replaying(editsOf:)`): a
    /// removal from a list removes only the adds that state had seen, so an element another device added
    /// meanwhile stays, as if the edit had been sent before the fetch. Nil: the edits were made over `stored`.
    var editBase: EditBase?

    struct EditBase: Sendable {
        let state: StoredState?
    }

    /// The server's change tag of `base` when known (the strict save policy compares it).
    public internal(set) var recordChangeTag: String?
    /// The share of a hierarchy share rooted at this record, as `CKRecord.share`: set on the records the
    /// engine fetches (each page of `deltas/pull` names the shares of its roots), kept on a record it saves,
    /// and kept in the system fields. Sharing a record or deleting its share changes the root on the server,
    /// so the next fetch gives the root again with its new `share`. Nil for a record under the root and for
    /// records of a zone-wide share (its share record is `cloudkit.zoneshare` in the zone). Shares are made
    /// with the HTTP API or `lattice share`.
    public internal(set) var share: Reference?
    /// The edits, each with the moment it was made (`EditMoment`): the engine stamps each with the time
    /// of the first `State.add(pendingRecordZoneChanges:)` after it.
    var edits: [(edit: Edit, moment: EditMoment)] = []
    /// The values as the app sees them: the base's with the edits applied.
    private var overlay: [String: FieldValue?] = [:]
    private var parentOverlay: Reference??

    /// A new record, as `CKRecord(recordType:recordID:)`.
    public init(recordType: String, recordID: ID) {
        self.recordType = recordType
        self.recordID = recordID
        stored = nil
    }

    /// A record the engine gives (fetched or saved), from its validated frame; decoded when first read.
    init(frame: RecordFrame, recordID: ID, changeTag: String? = nil) {
        self.recordType = frame.recordType
        self.recordID = recordID
        stored = StoredState(frame)
        recordChangeTag = changeTag
    }

    /// The base's frame (the system fields' CRDT state), nil for a record made on this device.
    var baseFrame: RecordFrame? { stored?.frame }

    // MARK: Fields

    /// A field's value, as `CKRecord`'s subscript; nil when absent, cleared or of another type. Setting
    /// nil clears the field. Setting an array makes the field an ordered list holding exactly those elements
    /// (sent as the fewest splices, so elements another device inserted meanwhile elsewhere stay); reading an
    /// array reads a list in order, or a set in ascending order.
    public subscript<Value: LatticeRecordValue>(key: String) -> Value? {
        get { fieldValue(key).flatMap(Value.init(latticeFieldValue:)) }
        set { setFieldValue(newValue?.latticeFieldValue, forKey: key) }
    }

    /// A field's value as Lattice stores it.
    public func fieldValue(_ key: String) -> FieldValue? {
        if let edited = overlay[key] { return edited }
        return base?[key]
    }

    /// Sets (or with nil, clears) a field.
    public mutating func setFieldValue(_ value: FieldValue?, forKey key: String) {
        apply(.set(key, value), at: .now())
    }

    /// Appends to a list field the elements it does not hold yet, in the order given (`CKRecord` has no such
    /// operation: in CloudKit an app rewrites the list; here an append is kept even when another device
    /// edits the list at the same time). On a set field (`*_SET`) this adds to the set.
    public mutating func append<Element: LatticeScalarValue>(contentsOf elements: [Element], toListForKey key: String) {
        apply(.add(key, elements.map(\.latticeScalar), set: false), at: .now(), listType: [Element].elementType)
    }

    /// Adds elements to an add-wins set field (`*_SET`, created when missing): an element stays while any
    /// add of it is one a removal has not seen, and the set reads in ascending order without repeats. On a
    /// list field this appends the elements it does not hold yet.
    public mutating func insert<Element: LatticeScalarValue>(_ elements: [Element], intoSetForKey key: String) {
        apply(.add(key, elements.map(\.latticeScalar), set: true), at: .now(), listType: [Element].elementType)
    }

    /// Removes elements: from a list every occurrence; from a set the adds this record has seen (one made
    /// elsewhere meanwhile stays).
    public mutating func remove<Element: LatticeScalarValue>(_ elements: [Element], fromListForKey key: String) {
        apply(.remove(key, elements.map(\.latticeScalar)), at: .now(), listType: [Element].elementType)
    }

    /// Edits a text field (`TEXT`, created when missing) in place: at `position` (in Unicode scalars)
    /// deletes `deleting` characters and inserts `inserting`, as a text view reports an edit. The splice is
    /// sent as it is, so another device's concurrent edits elsewhere in the text stay.
    /// - Throws: `LatticeSyncError` (`.invalidArguments`) when the range is past the end of the text.
    public mutating func spliceText(forKey key: String, at position: Int, deleting: Int, inserting: String) throws {
        let count = textValue(key).unicodeScalars.count
        guard position >= 0, deleting >= 0, position <= count, deleting <= count - position else {
            throw LatticeSyncError(.invalidArguments, "\(deleting) characters from \(position) go past the end of \(key) "
                                   + "(\(count) characters)")
        }
        apply(.splice(key, position: position, deleted: deleting, inserted: .text(inserting)), at: .now())
    }

    /// Edits a list field (created when missing) in place: at `position` deletes `deleting` elements and
    /// inserts `inserting`. The splice is sent as it is, so another device's concurrent edits elsewhere in the
    /// list stay. - Throws: `LatticeSyncError` (`.invalidArguments`) when the range is past the end.
    public mutating func splice<Element: LatticeScalarValue>(listForKey key: String, at position: Int, deleting: Int,
                                                              inserting: [Element]) throws {
        let count = listElements(key).count
        guard position >= 0, deleting >= 0, position <= count, deleting <= count - position else {
            throw LatticeSyncError(.invalidArguments, "\(deleting) elements from \(position) go past the end of \(key) "
                                   + "(\(count) elements)")
        }
        let values = inserting.map(\.latticeScalar)
        apply(.splice(key, position: position, deleted: deleting, inserted: .list(values.first?.type ?? [Element].elementType, values)),
              at: .now())
    }

    /// A splice's range within `count` elements.
    private static func clamped(_ position: Int, _ deleted: Int, _ count: Int) -> (Int, Int) {
        let start = min(max(position, 0), count)
        return (start, start + min(max(deleted, 0), count - start))
    }

    private func textValue(_ key: String) -> String {
        switch fieldValue(key) {
        case .text(let text)?: return text
        default: return ""
        }
    }

    /// Sets a text field (`TEXT`, merged character by character) to `text`: sent as the fewest splices
    /// from the text this record holds, so another device's concurrent edits elsewhere in it stay.
    public mutating func setText(_ text: String, forKey key: String) {
        apply(.set(key, .text(text)), at: .now())
    }

    /// Records an edit and shows it in the values.
    private mutating func apply(_ edit: Edit, at moment: EditMoment, listType: ValueType = .string) {
        edits.append((edit, moment))
        switch edit {
        case let .set(key, value):
            overlay[key] = .some(value)
        case let .add(key, added, asSet):
            // As the send will: a set takes the elements in ascending order; a list appends those it does
            // not hold yet, in the order given.
            var current = listElements(key)
            let type = added.first?.type ?? listType
            if isSet(key) ?? asSet {
                overlay[key] = .some(.set(type, ScalarValue.sortedUnique(current + added)))
            } else {
                for element in added where !current.contains(element) { current.append(element) }
                overlay[key] = .some(.list(type, current))
            }
        case let .remove(key, removed):
            let kept = listElements(key).filter { !removed.contains($0) }
            let type = removed.first?.type ?? listType
            overlay[key] = .some(isSet(key) == true ? .set(type, kept) : .list(type, kept))
        case let .splice(key, position, deleted, .text(inserted)):
            // Positions count in the value the edit was made on; over a newer base (`replaying(editsOf:)`)
            // the shown value clamps them, while the send applies them to the state they were made over.
            var scalars = Array(textValue(key).unicodeScalars)
            let (start, end) = Self.clamped(position, deleted, scalars.count)
            scalars.replaceSubrange(start ..< end, with: inserted.unicodeScalars)
            var view = String.UnicodeScalarView()
            view.append(contentsOf: scalars)
            overlay[key] = .some(.text(String(view)))
        case let .splice(key, position, deleted, inserted):
            var elements = listElements(key)
            let values: [ScalarValue]
            if case .list(_, let list) = inserted { values = list } else { values = [] }
            let (start, end) = Self.clamped(position, deleted, elements.count)
            elements.replaceSubrange(start ..< end, with: values)
            overlay[key] = .some(.list(values.first?.type ?? elements.first?.type ?? listType, elements))
        case let .parent(reference):
            parentOverlay = .some(reference)
        }
    }

    /// True for a set field, false for another field, nil when absent.
    private func isSet(_ key: String) -> Bool? {
        guard let value = fieldValue(key) else { return nil }
        if case .set = value { return true }
        return false
    }

    private func listElements(_ key: String) -> [ScalarValue] {
        switch fieldValue(key) {
        case .list(_, let elements)?, .set(_, let elements)?: return elements
        default: return []
        }
    }

    /// The keys with a value, in name order.
    public func allKeys() -> [String] {
        var keys = Set(base?.values.map(\.name) ?? [])
        for (key, value) in overlay { if value == nil { keys.remove(key) } else { keys.insert(key) } }
        return keys.sorted()
    }

    /// The keys edited since the engine gave the record (every key of a new one), in name order.
    public func changedKeys() -> [String] {
        var keys = Set<String>()
        for (edit, _) in edits {
            switch edit {
            case .set(let key, _), .add(let key, _, _), .remove(let key, _), .splice(let key, _, _, _): keys.insert(key)
            case .parent: break
            }
        }
        return keys.sorted()
    }

    /// Whether anything was edited (fields or the parent).
    public var hasChanges: Bool { !edits.isEmpty }

    /// The parent record, as `CKRecord.parent` (sharing follows it: a shared root shares its children).
    public var parent: Reference? {
        get {
            if let edited = parentOverlay { return edited }
            guard let parent = base?.parent else { return nil }
            return Reference(recordID: ID(recordName: parent.recordName, zoneID: recordID.zoneID),
                             action: parent.action == .deleteSelf ? .deleteSelf : .none)
        }
        set { apply(.parent(newValue), at: .now()) }
    }

    /// This record (as fetched or saved) with the edits `local` holds replayed on it: what the app shows
    /// while those edits wait to be sent. A fetched record has no edits, so an app that keeps its unsent
    /// edits in a `LatticeRecord` calls `fetched.replaying(editsOf: local)` when a fetch brings a record it
    /// has pending changes for.
    public func replaying(editsOf local: LatticeRecord) -> LatticeRecord {
        var result = self
        for (edit, moment) in local.edits { result.apply(edit, at: moment) }
        // The edits still count from the state they were made over (see `editBase`).
        if !local.edits.isEmpty { result.editBase = local.editBase ?? EditBase(state: local.stored) }
        return result
    }

    /// The frame the edits were made over.
    var editBaseFrame: RecordFrame? { editBase.map { $0.state?.frame } ?? baseFrame }

    /// The stamp of the write that won each field (or of each list element's adds), as `lattice explain`
    /// shows: which device (replica id) and when. Nil for a field this device has not received.
    public func provenance(ofKey key: String) -> FieldProvenance? { base?.provenance(of: key) }

    // MARK: System fields

    /// The record's system fields, to archive beside the app's own copy of its values, as
    /// `CKRecord.encodeSystemFields(with:)`. Restore with `init(systemFields:)`. In Lattice they hold the
    /// whole CRDT state the engine last gave (each field's value with its stamps), so that an edit made
    /// later is sent as an edit of that state; unsent edits are not part of them.
    public func encodeSystemFields() throws -> Data {
        var archive = SystemFieldsArchive(recordName: recordID.recordName, zoneName: recordID.zoneID.zoneName,
                                          ownerName: recordID.zoneID.ownerName, recordType: recordType,
                                          recordChangeTag: recordChangeTag, frame: nil,
                                          shareRecordName: share?.recordID.recordName)
        if let stored { archive.frame = Data(stored.frame.bytes) }
        return try JSONEncoder().encode(archive)
    }

    /// A record restored from archived system fields, with no edits.
    /// - Throws: `LatticeSyncError` (`.invalidArguments`) for bytes that are not such an archive.
    public init(systemFields: Data) throws {
        let archive: SystemFieldsArchive
        do { archive = try JSONDecoder().decode(SystemFieldsArchive.self, from: systemFields) } catch {
            throw LatticeSyncError(.invalidArguments, "these bytes are not a record's archived system fields")
        }
        recordID = ID(recordName: archive.recordName, zoneID: LatticeRecordZone.ID(zoneName: archive.zoneName,
                                                                                    ownerName: archive.ownerName))
        recordType = archive.recordType
        recordChangeTag = archive.recordChangeTag
        let zoneID = recordID.zoneID
        share = archive.shareRecordName.map { Reference(recordID: ID(recordName: $0, zoneID: zoneID)) }
        if let frame = archive.frame {
            do {
                let validated = try RecordFrame(validating: [UInt8](frame))
                _ = try validated.decoded()
                stored = StoredState(validated)
            } catch {
                throw LatticeSyncError(.invalidArguments, "the archived record state is damaged: \(error)")
            }
        } else {
            stored = nil
        }
    }

    // MARK: Archive with unsent edits

    /// The record with its unsent edits, to keep across launches (a program that queues changes in one run
    /// and sends them in another: each edit keeps the moment it was made, so it is stamped as precisely as
    /// if it had been sent from this run). `init(archive:)` reads it back. The system fields alone are
    /// `encodeSystemFields()`.
    public func encodeWithEdits() throws -> Data {
        let edits: [JSON] = self.edits.map { edit, moment in
            var item: [String: JSON] = ["process": .string(String(moment.process)), "sequence": .string(String(moment.sequence))]
            switch edit {
            case let .set(key, value):
                item["op"] = .string("set")
                item["key"] = .string(key)
                item["value"] = value?.cloudKitJSON ?? .null
            case let .add(key, elements, _), let .remove(key, elements):
                if case let .add(_, _, asSet) = edit {
                    item["op"] = .string("add")
                    if asSet { item["set"] = .bool(true) }
                } else {
                    item["op"] = .string("remove")
                }
                item["key"] = .string(key)
                item["value"] = FieldValue.list(elements.first?.type ?? .string, elements).cloudKitJSON
            case let .splice(key, position, deleted, inserted):
                item["op"] = .string("splice")
                item["key"] = .string(key)
                item["position"] = .int(Int64(position))
                item["deleted"] = .int(Int64(deleted))
                item["value"] = inserted.cloudKitJSON
            case let .parent(reference):
                item["op"] = .string("parent")
                item["value"] = reference.map { .object(["recordName": .string($0.recordID.recordName),
                                                         "action": .string($0.action == .deleteSelf ? "DELETE_SELF" : "NONE")]) }
                    ?? .null
            }
            return .object(item)
        }
        var members: [String: JSON] = ["systemFields": .string(try encodeSystemFields().base64EncodedString()),
                                       "edits": .array(edits)]
        if let editBase, !edits.isEmpty {
            members["editBase"] = editBase.state.map { .string(Data($0.frame.bytes).base64EncodedString()) } ?? .null
        }
        let archive = JSON.object(members)
        return Data(archive.serializedBytes())
    }

    /// A record read back from `encodeWithEdits()`.
    /// - Throws: `LatticeSyncError` (`.invalidArguments`) for bytes that are not such an archive.
    public init(archive: Data) throws {
        let invalid = LatticeSyncError(.invalidArguments, "these bytes are not an archived record")
        guard let json = try? JSON.parse([UInt8](archive)), let fields = json["systemFields"]?.stringValue,
              let systemFields = Data(base64Encoded: fields), let edits = json["edits"]?.arrayValue else { throw invalid }
        try self.init(systemFields: systemFields)
        if let base = json["editBase"] {
            if base == .null {
                editBase = EditBase(state: nil)
            } else {
                guard let text = base.stringValue, let bytes = Data(base64Encoded: text),
                      let frame = try? RecordFrame(validating: [UInt8](bytes)), (try? frame.decoded()) != nil else { throw invalid }
                editBase = EditBase(state: StoredState(frame))
            }
        }
        for item in edits {
            guard let op = item["op"]?.stringValue, let process = item["process"]?.stringValue.flatMap(UInt64.init),
                  let sequence = item["sequence"]?.stringValue.flatMap(UInt64.init) else { throw invalid }
            let moment = EditMoment(process: process, sequence: sequence)
            let key = item["key"]?.stringValue
            let value = item["value"] ?? .null
            func field() throws -> FieldValue? {
                value == .null ? nil : try FieldValue(cloudKitJSON: value, path: "edits")
            }
            switch (op, key) {
            case ("set", let key?):
                apply(.set(key, try field()), at: moment)
            case ("add", let key?), ("remove", let key?):
                let elements: [ScalarValue]
                switch try field() {
                case .list(_, let values)?, .set(_, let values)?: elements = values
                default: throw invalid
                }
                apply(op == "add" ? .add(key, elements, set: item["set"] == .bool(true)) : .remove(key, elements), at: moment)
            case ("splice", let key?):
                guard let position = item["position"]?.intValue, let deleted = item["deleted"]?.intValue, position >= 0, deleted >= 0,
                      let inserted = try field() else { throw invalid }
                switch inserted {
                case .text, .list: apply(.splice(key, position: Int(position), deleted: Int(deleted), inserted: inserted), at: moment)
                default: throw invalid
                }
            case ("parent", _):
                let reference = value["recordName"]?.stringValue.map {
                    Reference(recordID: ID(recordName: $0, zoneID: recordID.zoneID),
                              action: value["action"]?.stringValue == "DELETE_SELF" ? .deleteSelf : .none)
                }
                apply(.parent(reference), at: moment)
            default:
                throw invalid
            }
        }
    }

    public var description: String {
        let values = allKeys().map { "\($0): \(fieldValue($0).map { "\($0)" } ?? "nil")" }.joined(separator: ", ")
        return "\(recordType) \(recordID.recordName) {\(values)}"
    }
}

/// A record's state as the engine gave it: the frame, decoded once when first read (a pull hands the app
/// thousands of records it may never read all of).
final class StoredState: Sendable {
    let frame: RecordFrame
    /// The decoded record, once read.
    private let decoded = Mutex<Record??>(nil)

    init(_ frame: RecordFrame) { self.frame = frame }

    /// The record; nil only for a frame that does not decode, which a validated frame always does.
    var record: Record? {
        decoded.withLock { cache in
            if let cache { return cache }
            let record = try? frame.decoded()
            cache = .some(record)
            return record
        }
    }
}

/// When an edit was made, in the order of this process's edits and queued changes: a number from one
/// counter of the process, and the process's own random id (numbers of another run do not compare).
struct EditMoment: Codable, Hashable, Sendable {
    var process: UInt64
    var sequence: UInt64

    /// This process's id.
    static let process = UInt64.random(in: 1...UInt64.max)
    private static let counter = Atomic<UInt64>(0)

    /// The next moment.
    static func now() -> EditMoment {
        EditMoment(process: process, sequence: counter.add(1, ordering: .relaxed).newValue)
    }
}

/// What `encodeSystemFields()` writes.
struct SystemFieldsArchive: Codable {
    var recordName: String
    var zoneName: String
    var ownerName: String
    var recordType: String
    var recordChangeTag: String?
    /// The CRDT state as a record frame (`RecordFrame` bytes).
    var frame: Data?
    /// `share`'s record name, in the record's zone.
    var shareRecordName: String?
}
