/// The merge state of one field: a last-writer-wins register for scalars, an add-wins set, an ordered list
/// that keeps duplicates (CloudKit's `*_LIST`), or a text merged character by character.
public enum FieldState: Hashable, Sendable {
    case register(LWWRegister)
    case set(ORSet)
    case list(ListState)
    case text(TextState)

    /// The kind byte of the binary form: 0 register, 1 set, 2 list, 3 text.
    public var kind: UInt8 {
        switch self {
        case .register: return 0
        case .set: return 1
        case .list: return 2
        case .text: return 3
        }
    }

    /// The visible value; `nil` for a cleared register. A list's or set's element type is taken from its
    /// first element (`STRING` when empty).
    public var value: FieldValue? {
        switch self {
        case .register(let register):
            return register.value.map(FieldValue.scalar)
        case .set(let set):
            let elements = set.elements
            return .set(elements.first?.type ?? .string, elements)
        case .list(let list):
            let elements = list.elements
            return .list(elements.first?.type ?? .string, elements)
        case .text(let text):
            return .text(text.text)
        }
    }

    /// The join. Two states of different kinds under one name can only meet if two replicas created the
    /// field with different kinds concurrently (or a list met a set written before lists kept their
    /// order): the greater kind wins, deterministically.
    @inline(__always)
    public mutating func merge(_ other: FieldState) {
        switch (self, other) {
        case (.register(var mine), .register(let theirs)):
            mine.merge(theirs)
            self = .register(mine)
        case (.set(var mine), .set(let theirs)):
            self = .register(LWWRegister(value: nil, stamp: Stamp(hlc: .zero, replica: ReplicaID(0))))
            mine.merge(theirs)
            self = .set(mine)
        case (.list(var mine), .list(let theirs)):
            self = .register(LWWRegister(value: nil, stamp: Stamp(hlc: .zero, replica: ReplicaID(0))))
            mine.merge(theirs)
            self = .list(mine)
        case (.text(var mine), .text(let theirs)):
            self = .register(LWWRegister(value: nil, stamp: Stamp(hlc: .zero, replica: ReplicaID(0))))
            mine.merge(theirs)
            self = .text(mine)
        default:
            if other.kind > kind { self = other }
        }
    }

    /// True when the state reflects an operation `version` does not cover.
    @inline(__always)
    func isNewer(than version: VersionVector) -> Bool {
        switch self {
        case .register(let register): return !version.covers(register.stamp)
        case .set(let set): return set.context.exceeds(version)
        case .list(let list): return list.context.exceeds(version)
        case .text(let text): return text.context.exceeds(version)
        }
    }

    var maximumHLC: HLC {
        switch self {
        case .register(let register): return register.stamp.hlc
        case .set(let set): return set.context.maximumHLC
        case .list(let list): return list.context.maximumHLC
        case .text(let text): return text.context.maximumHLC
        }
    }
}

/// One named field of a record.
public struct Field: Hashable, Sendable {
    public var name: String
    public var state: FieldState

    public init(name: String, state: FieldState) {
        self.name = name
        self.state = state
    }
}

/// Who won a field, for `lattice explain`.
public enum FieldProvenance: Hashable, Sendable {
    /// The winning write of a scalar field.
    case register(Stamp)
    /// For a set field: each visible element with the add(s) that keep it, and the newest operation seen.
    case set(elements: [(ScalarValue, [Stamp])], latestOperation: HLC)
    /// For a list or text field: its visible runs in order, each with the replica that inserted it (in
    /// the run's id) and its values (a text's as one string), and the newest edit seen.
    case runs([(run: SequenceRun, values: [ScalarValue])], latestOperation: HLC)

    public static func == (a: FieldProvenance, b: FieldProvenance) -> Bool {
        switch (a, b) {
        case let (.register(x), .register(y)): return x == y
        case let (.set(x, lx), .set(y, ly)):
            return lx == ly && x.count == y.count && zip(x, y).allSatisfy { $0.0 == $1.0 && $0.1 == $1.1 }
        case let (.runs(x, lx), .runs(y, ly)):
            return lx == ly && x.count == y.count && zip(x, y).allSatisfy { $0.run == $1.run && $0.values == $1.values }
        default: return false
        }
    }

    public func hash(into hasher: inout Hasher) {
        switch self {
        case .register(let stamp): hasher.combine(stamp)
        case let .set(elements, latest):
            hasher.combine(latest)
            for (value, dots) in elements { hasher.combine(value); hasher.combine(dots) }
        case let .runs(runs, latest):
            hasher.combine(latest)
            for (run, values) in runs { hasher.combine(run); hasher.combine(values) }
        }
    }
}

/// A record's operation was refused.
public struct RecordError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        /// The record is deleted; recreate it to write again.
        case deleted
        /// A list operation on a scalar field or the other way round.
        case fieldKindMismatch
        /// The encoded record would exceed `Record.maximumEncodedSize`.
        case tooLarge
        /// A field name that is not an identifier (see `Names`).
        case invalidFieldName
        /// A parent that is not a same-zone reference with action NONE.
        case invalidParent
        /// A record placed in a delta of another zone.
        case wrongZone
        /// `recreate` on a record that is not deleted.
        case notDeleted
        /// A list or text splice past the end.
        case outOfRange
    }
    public let code: Code
    public let message: String

    public var description: String { message }
}

/// A record: its type, identity, parent and fields, plus its lifecycle (generation and deletion).
///
/// Merge rules (Docs/Merge.md has worked examples):
/// - Each field merges as its CRDT (register or OR-set); `parent` is a register holding a reference.
/// - **Delete wins over concurrent edits.** A delete marks the current generation deleted and drops its
///   fields; edits stamped for that generation, whenever they arrive, change nothing.
/// - Writing a deleted record needs an explicit `recreate`, which starts a new generation; a higher
///   generation replaces a lower one wholesale (so a recreate is only possible after seeing the delete).
/// - Within a generation the record type follows the latest creation stamp.
public struct Record: Hashable, Sendable {
    /// CloudKit's limit on one record's size, enforced on the binary encoding of every local write: 1 MiB.
    public static let maximumEncodedSize = 1 << 20

    /// The largest frame a decoder accepts: 16 MiB. A join of legal records can exceed the write limit
    /// (replicas concurrently adding different fields), and refusing a join would break convergence, so
    /// receivers accept merged states up to this sanity bound; only writes are held to 1 MiB.
    public static let maximumMergedSize = 16 << 20

    public let id: RecordID
    public private(set) var recordType: String
    /// 1 for a new record, +1 on every recreate after a delete.
    public private(set) var generation: UInt32
    /// The stamp of the create (or recreate) that began this generation.
    public private(set) var created: Stamp
    /// The delete of this generation, if any.
    public private(set) var deletion: Stamp?
    /// The parent register; its value is a `.reference` or `nil`.
    public private(set) var parentRegister: LWWRegister?
    /// Fields sorted by name (byte order).
    public private(set) var fields: [Field]

    /// A new record, created at `stamp`.
    public init(id: RecordID, recordType: String, createdAt stamp: Stamp) throws(NameError) {
        try Names.validate(recordType, kind: .recordType)
        self.init(id: id, recordType: recordType, generation: 1, created: stamp, deletion: nil,
                  parent: nil, fields: [])
    }

    /// Reassembles a record from its parts (decoders); fields must be sorted by name without repeats.
    init(id: RecordID, recordType: String, generation: UInt32, created: Stamp, deletion: Stamp?,
         parent: LWWRegister?, fields: [Field]) {
        self.id = id
        self.recordType = recordType
        self.generation = generation
        self.created = created
        self.deletion = deletion
        self.parentRegister = deletion == nil ? parent : nil
        self.fields = deletion == nil ? fields : []
    }

    public var isDeleted: Bool { deletion != nil }

    /// The parent reference (sharing hierarchies follow it).
    public var parent: Reference? {
        if case .reference(let reference)? = parentRegister?.value { return reference }
        return nil
    }

    /// The visible value of a field, or `nil` when absent or cleared.
    public subscript(name: String) -> FieldValue? {
        fieldIndex(name).flatMap { fields[$0].state.value }
    }

    /// Visible fields by name, in name order; cleared registers are left out.
    public var values: [(name: String, value: FieldValue)] {
        fields.compactMap { field in field.state.value.map { (field.name, $0) } }
    }

    // MARK: Local operations (each takes a fresh stamp from the replica's clock)

    /// Sets (or, with `nil`, clears) a scalar field.
    public mutating func set(_ name: String, to value: ScalarValue?, at stamp: Stamp) throws(RecordError) {
        try checkWritable(name)
        let write = LWWRegister(value: value, stamp: stamp)
        try update(name, kind: "scalar") { state in
            guard var state else { return .register(write) }
            guard case .register = state else { return nil }
            state.merge(.register(write))
            return state
        }
    }

    /// At visible `position` of a list field, deletes `deleting` elements and inserts `inserting` (creating
    /// the field if needed, or converting a set). - Throws: `RecordError(.fieldKindMismatch)` for a scalar or text field,
    /// `SequenceError` for a position past the end.
    public mutating func splice(_ name: String, at position: Int, deleting: Int, inserting: [ScalarValue],
                                stamp: Stamp) throws {
        try checkWritable(name)
        var list = ListState()
        if let index = fieldIndex(name) {
            switch fields[index].state {
            case .list(let existing): list = existing
            case .set(let set): // a set becomes a list of its elements in ascending order, inserted at this stamp
                try list.insert(set.elements, at: 0, stamp: stamp)
            case .register, .text: throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a list field")
            }
        }
        try list.delete(from: position, length: deleting, stamp: stamp)
        try list.insert(inserting, at: position, stamp: stamp)
        list.noteEdit(stamp)
        setState(.list(list), of: name)
    }

    /// At `position` (in Unicode scalars) of a text field, deletes `deleting` characters and inserts
    /// `inserting` (creating the field if needed).
    public mutating func spliceText(_ name: String, at position: Int, deleting: Int, inserting: String,
                                    stamp: Stamp) throws {
        try checkWritable(name)
        var text = TextState()
        if let index = fieldIndex(name) {
            guard case .text(let existing) = fields[index].state else {
                throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a text field")
            }
            text = existing
        }
        try text.delete(from: position, length: deleting, stamp: stamp)
        try text.insert(Array(inserting.unicodeScalars), at: position, stamp: stamp)
        text.noteEdit(stamp)
        setState(.text(text), of: name)
    }

    private mutating func setState(_ state: FieldState, of name: String) {
        if let index = fieldIndex(name) {
            fields[index].state = state
        } else {
            let index = fields.firstIndex { compareBytes($0.name, name) > 0 } ?? fields.endIndex
            fields.insert(Field(name: name, state: state), at: index)
        }
    }

    /// Adds an element to a set field (creating the field if needed).
    public mutating func add(_ element: ScalarValue, to name: String, at stamp: Stamp) throws(RecordError) {
        try updateSet(name) { $0.add(element, at: stamp) }
    }

    /// Removes an element from a set field; removing what was never seen changes only the causal context.
    public mutating func remove(_ element: ScalarValue, from name: String, at stamp: Stamp) throws(RecordError) {
        try updateSet(name) { $0.remove(element, at: stamp) }
    }

    /// Applies an OR-set operation to a set field, creating the field if needed.
    private mutating func updateSet(_ name: String, _ operation: (inout ORSet) -> Void) throws(RecordError) {
        try checkWritable(name)
        try update(name, kind: "set") { state in
            var set = ORSet()
            if let state {
                guard case .set(let existing) = state else { return nil }
                set = existing
            }
            operation(&set)
            return .set(set)
        }
    }

    /// Sets or clears the parent reference.
    /// - Throws: `RecordError.invalidParent` unless the reference has action NONE and stays in this zone
    ///   (CloudKit's rule: sharing follows `parent`, which never crosses zones).
    public mutating func setParent(_ parent: Reference?, at stamp: Stamp) throws(RecordError) {
        try checkWritable(nil)
        if let parent {
            guard parent.action == .none, parent.zoneID == nil || parent.zoneID == id.zoneID else {
                throw RecordError(code: .invalidParent,
                                  message: "a parent must be a reference with action NONE in the same zone")
            }
            guard parent.recordName != id.recordName else {
                throw RecordError(code: .invalidParent, message: "a record cannot be its own parent")
            }
        }
        // Stored canonically: same zone, so no zone.
        let parent = parent.map { Reference(validatedRecordName: $0.recordName, zoneID: nil, action: .none) }
        let write = LWWRegister(value: parent.map(ScalarValue.reference), stamp: stamp)
        if parentRegister == nil { parentRegister = write } else { parentRegister!.merge(write) }
    }

    /// Deletes the record (this generation). Deleting twice keeps the later delete.
    public mutating func delete(at stamp: Stamp) {
        deletion = max(deletion ?? stamp, stamp)
        fields = []
        parentRegister = nil
    }

    /// Starts a new, empty generation of a deleted record.
    /// - Throws: `RecordError.notDeleted` for a live record (a recreate would wipe concurrent edits),
    ///   `NameError` for an illegal record type.
    public mutating func recreate(recordType: String, at stamp: Stamp) throws {
        guard isDeleted else {
            throw RecordError(code: .notDeleted, message: "record \(id.recordName) is live; only a deleted record is recreated")
        }
        try Names.validate(recordType, kind: .recordType)
        self = Record(id: id, recordType: recordType, generation: generation &+ 1, created: stamp, deletion: nil,
                      parent: nil, fields: [])
    }

    // MARK: Merge

    /// The join of two states of the same record. Commutative, associative and idempotent.
    public mutating func merge(_ other: Record) {
        precondition(id == other.id, "merging different records")
        if other.generation != generation {
            if other.generation > generation { self = other }
            return
        }
        if created < other.created {
            created = other.created
            recordType = other.recordType
        } else if created == other.created && compareBytes(recordType, other.recordType) < 0 {
            recordType = other.recordType
        }
        if let theirs = other.deletion {
            delete(at: theirs)
            return
        }
        if deletion != nil { return }
        if let theirs = other.parentRegister {
            if parentRegister == nil { parentRegister = theirs } else { parentRegister!.merge(theirs) }
        }
        mergeFields(other.fields)
    }

    public func merging(_ other: Record) -> Record {
        var copy = self
        copy.merge(other)
        return copy
    }

    /// Merges sorted field lists in one pass.
    @inline(__always)
    private mutating func mergeFields(_ theirs: [Field]) {
        if theirs.isEmpty { return }
        if fields.isEmpty { fields = theirs; return }
        // Fast path: the other side's names are a subsequence of ours (the usual case for deltas).
        var merged: [Field]? = nil
        var i = 0
        fields.withUnsafeMutableBufferPointer { mine in
            for field in theirs {
                var order = -1
                while i < mine.count {
                    order = compareBytes(mine[i].name, field.name)
                    if order >= 0 { break }
                    i += 1
                }
                if order == 0 {
                    mine[i].state.merge(field.state)
                    i += 1
                } else {
                    merged = []
                    return
                }
            }
        }
        if merged == nil { return }
        var result: [Field] = []
        result.reserveCapacity(fields.count + theirs.count)
        var a = 0, b = 0
        while a < fields.count || b < theirs.count {
            let order = a == fields.count ? 1 : (b == theirs.count ? -1 : compareBytes(fields[a].name, theirs[b].name))
            if order < 0 {
                result.append(fields[a]); a += 1
            } else if order > 0 {
                result.append(theirs[b]); b += 1
            } else {
                var field = fields[a]
                field.state.merge(theirs[b].state)
                result.append(field)
                a += 1
                b += 1
            }
        }
        fields = result
    }

    // MARK: Deltas and provenance

    /// The part of this record that `version` does not reflect, or `nil` when there is nothing to send.
    /// The header (type, generation, creation, deletion) always travels with the changed fields.
    public func changes(since version: VersionVector) -> Record? {
        if !version.covers(created) {
            return self
        }
        if let deletion {
            return version.covers(deletion) ? nil : self
        }
        var changed: [Field] = []
        for field in fields where field.state.isNewer(than: version) { changed.append(field) }
        let parentChanged = parentRegister.map { !version.covers($0.stamp) } ?? false
        if changed.isEmpty && !parentChanged { return nil }
        if changed.count == fields.count && (parentChanged || parentRegister == nil) { return self }
        return Record(id: id, recordType: recordType, generation: generation, created: created, deletion: nil,
                      parent: parentChanged ? parentRegister : nil, fields: changed)
    }

    /// Which write won a field (for a scalar) or which adds keep each element (for a list).
    public func provenance(of name: String) -> FieldProvenance? {
        guard let index = fieldIndex(name) else { return nil }
        switch fields[index].state {
        case .register(let register):
            return .register(register.stamp)
        case .set(let set):
            let elements = set.elements.map { ($0, set.dots(of: $0)) }
            return .set(elements: elements, latestOperation: set.latestOperation)
        case .list(let list):
            return .runs(list.visibleRuns.map { ($0.run, Array($0.values)) }, latestOperation: list.latestOperation)
        case .text(let text):
            return .runs(text.visibleRuns.map { run in
                var characters = String.UnicodeScalarView()
                characters.append(contentsOf: run.values)
                return (run.run, [ScalarValue.string(String(characters))])
            }, latestOperation: text.latestOperation)
        }
    }

    /// The newest clock value anywhere in the record (checked against the clock's drift bound on receipt).
    public var maximumHLC: HLC {
        var result = max(created.hlc, deletion?.hlc ?? .zero, parentRegister?.stamp.hlc ?? .zero)
        for field in fields { result = max(result, field.state.maximumHLC) }
        return result
    }

    // MARK: Helpers

    func fieldIndex(_ name: String) -> Int? {
        var low = 0, high = fields.count
        while low < high {
            let mid = (low + high) / 2
            let order = compareBytes(fields[mid].name, name)
            if order == 0 { return mid }
            if order < 0 { low = mid + 1 } else { high = mid }
        }
        return nil
    }

    private func checkWritable(_ name: String?) throws(RecordError) {
        try Self.checkWritable(id.recordName, deleted: isDeleted, field: name)
    }

    /// A write to a record (to field `field`, when given) is refused on a tombstone and for a field name
    /// that is not an identifier. Shared with `RecordEdit`.
    static func checkWritable(_ recordName: String, deleted: Bool, field: String?) throws(RecordError) {
        if deleted {
            throw RecordError(code: .deleted, message: "record \(recordName) is deleted; recreate it to write")
        }
        if let field {
            do throws(NameError) {
                try Names.validate(field, kind: .fieldName)
            } catch {
                throw RecordError(code: .invalidFieldName, message: error.description)
            }
        }
    }

    private mutating func update(_ name: String, kind: String,
                                 _ body: (FieldState?) -> FieldState?) throws(RecordError) {
        if let index = fieldIndex(name) {
            guard let state = body(fields[index].state) else {
                throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a \(kind) field")
            }
            fields[index].state = state
        } else {
            guard let state = body(nil) else { return }
            setState(state, of: name)
        }
    }
}
