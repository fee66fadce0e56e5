/// Local edits to one record, turned into one stamped frame that the join applies to the stored state.
///
/// Plain values (a server stamping a curl request, a device editing a list) never rewrite a record by
/// hand: an edit reads only the fields it touches from the stored frame, computes their new CRDT states,
/// and `frame()` encodes just those (with the record's header) as a partial record state. The stored
/// frame and that state are then joined by `RecordFrame.merged(with:)`, the same join every incoming
/// state takes (`applied()` does both).
///
/// - Setting a scalar to the value it already has, clearing what is already clear, removing elements
///   that are not there and setting the parent it already has change nothing: no stamp, no write.
/// - Set edits work in bulk: adding or removing n elements of a set of m costs O((n + m) log(n + m)).
/// - List and text edits are splices; a whole new value becomes the fewest splices (`SequenceDiff`).
///
/// ```swift
/// var edit = try RecordEdit(editing: stored)
/// try edit.set("text", to: .string("Oat milk"), at: clock.now())
/// try edit.addToSet([.string("vegan")], to: "tags", at: clock.now())
/// if let joined = try edit.applied() { save(joined) }
/// ```
public struct RecordEdit: Sendable {
    public let id: RecordID
    /// The stored state the edit starts from (nil for a new record).
    public let base: RecordFrame?
    private var recordType: String
    private var generation: UInt32
    private var created: Stamp
    private var deletion: Stamp?
    private var parent: LWWRegister?
    /// New states of the fields this edit touched.
    private var fields: [String: FieldState] = [:]
    /// False for a new record or a new generation: the base's fields are not this record's any more.
    private var readsBase: Bool
    private var changed = false

    /// Starts editing a live record. - Throws: `RecordError(.deleted)` for a tombstone.
    public init(editing frame: RecordFrame) throws(RecordError) {
        guard !frame.isDeleted else {
            throw RecordError(code: .deleted, message: "record \(frame.recordName) is deleted; recreate it to write")
        }
        id = RecordID(validatedRecordName: frame.recordName, zoneID: frame.zoneID)
        base = frame
        recordType = frame.recordType
        generation = frame.generation
        created = frame.created
        readsBase = true
    }

    /// Starts a new record, or a new generation of a deleted one (`tombstone`).
    /// - Throws: `RecordError(.notDeleted)` if `tombstone` is live, `NameError` for an illegal type.
    public init(creating id: RecordID, recordType: String, over tombstone: RecordFrame? = nil, at stamp: Stamp) throws {
        try Names.validate(recordType, kind: .recordType)
        if let tombstone, !tombstone.isDeleted {
            throw RecordError(code: .notDeleted, message: "record \(id.recordName) is live; only a deleted record is recreated")
        }
        self.id = id
        base = tombstone
        self.recordType = recordType
        generation = (tombstone?.generation ?? 0) &+ 1
        created = stamp
        readsBase = false
        changed = true
    }

    /// The record's type.
    public var type: String { recordType }

    /// True when the edit changes nothing.
    public var isEmpty: Bool { !changed }

    // MARK: Edits

    /// Sets (or, with `nil`, clears) a scalar field; the value it already has changes nothing.
    public mutating func set(_ name: String, to value: ScalarValue?, at stamp: Stamp) throws(RecordError) {
        try checkWritable(name)
        switch current(name) {
        case .set?, .list?, .text?:
            throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a scalar field")
        case .register(let register)?:
            if register.value == value { return }
        case nil:
            if value == nil { return }
        }
        fields[name] = .register(LWWRegister(value: value, stamp: stamp))
        changed = true
    }

    // MARK: Sets (add-wins, `*_SET`)

    /// Adds elements to a set field (creating it), each with the dot `stamp`, replacing the dots seen.
    public mutating func addToSet(_ elements: [ScalarValue], to name: String, at stamp: Stamp) throws(RecordError) {
        try editSet(name, removing: [], adding: elements, at: stamp)
    }

    /// Removes elements from a set field as observed here; elements not in it are ignored.
    public mutating func removeFromSet(_ elements: [ScalarValue], from name: String, at stamp: Stamp) throws(RecordError) {
        try editSet(name, removing: elements, adding: [], at: stamp)
    }

    /// Makes a set field hold exactly `elements`: the missing ones are added, the others removed.
    public mutating func setSet(_ name: String, to elements: [ScalarValue], at stamp: Stamp) throws(RecordError) {
        try checkWritable(name)
        guard case .set(let set)? = current(name) else {
            if current(name) != nil {
                throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a set field")
            }
            try editSet(name, removing: [], adding: elements, at: stamp)
            return
        }
        // Both sides sorted and without repeats: one walk finds what to remove and what to add.
        let wanted = ScalarValue.sortedUnique(elements), present = set.elements
        var removing: [ScalarValue] = [], adding: [ScalarValue] = []
        var i = 0, j = 0
        while i < present.count || j < wanted.count {
            let order = i == present.count ? 1 : j == wanted.count ? -1 : ScalarValue.compare(present[i], wanted[j])
            if order < 0 { removing.append(present[i]); i += 1 }
            else if order > 0 { adding.append(wanted[j]); j += 1 }
            else { i += 1; j += 1 }
        }
        try editSet(name, removing: removing, adding: adding, at: stamp)
    }

    // MARK: Lists (ordered, duplicates kept: CloudKit's `*_LIST`)

    /// At visible `position` of a list field (created when missing), deletes `deleting` elements and
    /// inserts `inserting`. - Throws: `RecordError(.outOfRange)` past the end.
    public mutating func splice(_ name: String, at position: Int, deleting: Int, inserting: [ScalarValue],
                                at stamp: Stamp) throws(RecordError) {
        var list = try currentList(name, at: stamp)
        try Self.splice(&list, name, position, deleting, inserting, stamp)
        if deleting == 0 && inserting.isEmpty && current(name) != nil { return }
        fields[name] = .list(list)
        changed = true
    }

    /// Makes a list field hold exactly `elements`, in that order, by the fewest splices
    /// (`SequenceDiff`), so elements others inserted concurrently elsewhere stay. A field written before
    /// lists kept their order (a set) is replaced by the list.
    public mutating func setList(_ name: String, to elements: [ScalarValue], at stamp: Stamp) throws(RecordError) {
        var list = try currentList(name, at: stamp)
        let splices = SequenceDiff.splices(from: list.elements, to: elements)
        if splices.isEmpty, case .list? = current(name) { return }
        for splice in splices { try Self.splice(&list, name, splice.position, splice.deleted, splice.inserted, stamp) }
        list.noteEdit(stamp)
        fields[name] = .list(list)
        changed = true
    }

    /// Appends to a list field the elements it does not hold yet (in the order given, once each).
    public mutating func add(_ elements: [ScalarValue], to name: String, at stamp: Stamp) throws(RecordError) {
        var list = try currentList(name, at: stamp)
        var present = Set(list.elements)
        var appended: [ScalarValue] = []
        for element in elements where !present.contains(element) {
            present.insert(element)
            appended.append(element)
        }
        guard !appended.isEmpty else { return }
        try Self.splice(&list, name, list.count, 0, appended, stamp)
        fields[name] = .list(list)
        changed = true
    }

    /// Adds to a collection field as its kind means: a set adds the elements (add-wins), a list appends
    /// those it does not hold yet. A missing field becomes a set when `creatingSet`, else a list.
    public mutating func addElements(_ elements: [ScalarValue], to name: String, creatingSet: Bool,
                                     at stamp: Stamp) throws(RecordError) {
        switch current(name) {
        case .set?: try addToSet(elements, to: name, at: stamp)
        case nil where creatingSet: try addToSet(elements, to: name, at: stamp)
        default: try add(elements, to: name, at: stamp)
        }
    }

    /// Removes from a collection field as its kind means: from a set the adds seen here, from a list every
    /// occurrence.
    public mutating func removeElements(_ elements: [ScalarValue], from name: String, at stamp: Stamp) throws(RecordError) {
        if case .set? = current(name) { return try removeFromSet(elements, from: name, at: stamp) }
        try remove(elements, from: name, at: stamp)
    }

    /// Deletes every occurrence of `elements` from a list field; elements not in it are ignored.
    public mutating func remove(_ elements: [ScalarValue], from name: String, at stamp: Stamp) throws(RecordError) {
        var list = try currentList(name, at: stamp)
        let removed = Set(elements)
        let values = list.elements
        var deletedAny = false
        // From the end, so earlier positions stay put.
        var index = values.count - 1
        while index >= 0 {
            guard removed.contains(values[index]) else { index -= 1; continue }
            var start = index
            while start > 0 && removed.contains(values[start - 1]) { start -= 1 }
            try Self.splice(&list, name, start, index - start + 1, [], stamp)
            deletedAny = true
            index = start - 1
        }
        guard deletedAny else { return }
        fields[name] = .list(list)
        changed = true
    }

    // MARK: Texts (merged character by character, `TEXT`)

    /// At `position` (Unicode scalars) of a text field (created when missing), deletes `deleting`
    /// characters and inserts `inserting`. - Throws: `RecordError(.outOfRange)` past the end.
    public mutating func spliceText(_ name: String, at position: Int, deleting: Int, inserting: String,
                                    at stamp: Stamp) throws(RecordError) {
        var text = try currentText(name)
        let scalars = Array(inserting.unicodeScalars)
        try Self.splice(&text, name, position, deleting, scalars, stamp)
        if deleting == 0 && scalars.isEmpty && current(name) != nil { return }
        fields[name] = .text(text)
        changed = true
    }

    /// Makes a text field read `value` by the fewest splices (`SequenceDiff` on Unicode scalars), so
    /// concurrent edits elsewhere in the text stay.
    public mutating func setText(_ name: String, to value: String, at stamp: Stamp) throws(RecordError) {
        var text = try currentText(name)
        let splices = SequenceDiff.splices(from: text.elements, to: Array(value.unicodeScalars))
        guard !splices.isEmpty || current(name) == nil else { return }
        for splice in splices { try Self.splice(&text, name, splice.position, splice.deleted, splice.inserted, stamp) }
        text.noteEdit(stamp)
        fields[name] = .text(text)
        changed = true
    }

    /// Clears a field: a scalar becomes nil, a set, list or text loses every element.
    public mutating func clear(_ name: String, at stamp: Stamp) throws(RecordError) {
        try checkWritable(name)
        switch current(name) {
        case .register?: try set(name, to: nil, at: stamp)
        case .set(let set)?: try editSet(name, removing: set.elements, adding: [], at: stamp)
        case .list(let list)?: if list.count > 0 { try splice(name, at: 0, deleting: list.count, inserting: [], at: stamp) }
        case .text(let text)?: if text.count > 0 { try spliceText(name, at: 0, deleting: text.count, inserting: "", at: stamp) }
        case nil: break
        }
    }

    /// Clears every field not named in `kept` (a replace).
    public mutating func clearFields(except kept: Set<String>, at stamp: Stamp) throws(RecordError) {
        try checkWritable(nil)
        var names = Set(fields.keys)
        if readsBase, let base { names.formUnion(base.fieldKinds().map(\.name)) }
        for name in names.sorted() where !kept.contains(name) { try clear(name, at: stamp) }
    }

    /// The parent reference, as the edit leaves it.
    public var parentName: String? {
        if let parent { if case .reference(let reference)? = parent.value { return reference.recordName } else { return nil } }
        return readsBase ? base?.parentName : nil
    }

    /// Sets or clears the parent (a same-zone reference with action NONE to another record).
    public mutating func setParent(_ parent: Reference?, at stamp: Stamp) throws(RecordError) {
        try checkWritable(nil)
        if let parent {
            guard parent.action == .none, parent.zoneID == nil || parent.zoneID == id.zoneID else {
                throw RecordError(code: .invalidParent, message: "a parent must be a reference with action NONE in the same zone")
            }
            guard parent.recordName != id.recordName else {
                throw RecordError(code: .invalidParent, message: "a record cannot be its own parent")
            }
        }
        if parentName == parent?.recordName { return }
        let canonical = parent.map { Reference(validatedRecordName: $0.recordName, zoneID: nil, action: .none) }
        self.parent = LWWRegister(value: canonical.map(ScalarValue.reference), stamp: stamp)
        changed = true
    }

    /// Deletes the record (delete wins over concurrent edits of this generation).
    public mutating func delete(at stamp: Stamp) {
        deletion = max(deletion ?? stamp, stamp)
        fields = [:]
        parent = nil
        changed = true
    }

    // MARK: Result

    /// The edit as a record state: the header and the touched fields only. Nil when nothing changed.
    /// - Throws: `RecordError.tooLarge` when the edit alone exceeds the 1 MiB write limit.
    public func frame() throws(RecordError) -> RecordFrame? {
        guard changed else { return nil }
        let sorted = fields.map { Field(name: $0.key, state: $0.value) }.sorted { compareBytes($0.name, $1.name) < 0 }
        let record = Record(id: id, recordType: recordType, generation: generation, created: created, deletion: deletion,
                            parent: parent, fields: sorted)
        return try RecordFrame(encoding: record)
    }

    /// The stored state joined with this edit, or nil when it changes nothing.
    /// - Throws: `RecordError.tooLarge` when the result would exceed the 1 MiB write limit.
    public func applied() throws(RecordError) -> RecordFrame? {
        guard let edit = try frame(), let result = RecordFrame.join(base, edit) else { return nil }
        if result.exceedsWriteLimit {
            throw RecordError(code: .tooLarge, message: "record \(id.recordName) would encode to \(result.encodedSize) "
                              + "bytes; the limit is \(Record.maximumEncodedSize) bytes")
        }
        return result
    }

    // MARK: Helpers

    private func current(_ name: String) -> FieldState? {
        if let state = fields[name] { return state }
        return readsBase ? base?.fieldState(name) : nil
    }

    /// The list a list edit starts from: the field's, a new one, or one converted from a set. - Throws: `.fieldKindMismatch` for a scalar or text field.
    private func currentList(_ name: String, at stamp: Stamp) throws(RecordError) -> ListState {
        try checkWritable(name)
        switch current(name) {
        case .list(let list)?: return list
        case nil: return ListState()
        case .set(let set)?:
            // A set (such as a list written before lists kept their order) becomes a list of its elements in
            // ascending order, inserted at this stamp; the list wins over the set on every replica.
            var list = ListState()
            try Self.splice(&list, name, 0, 0, set.elements, stamp)
            return list
        case .register?, .text?:
            throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a list field")
        }
    }

    private func currentText(_ name: String) throws(RecordError) -> TextState {
        try checkWritable(name)
        switch current(name) {
        case .text(let text)?: return text
        case nil: return TextState()
        case .register?, .set?, .list?:
            throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a text field")
        }
    }

    private static func splice<Element: Hashable & Sendable>(_ sequence: inout SequenceState<Element>, _ name: String,
                                                             _ position: Int, _ deleting: Int, _ inserting: [Element],
                                                             _ stamp: Stamp) throws(RecordError) {
        do {
            try sequence.delete(from: position, length: deleting, stamp: stamp)
            try sequence.insert(inserting, at: position, stamp: stamp)
            sequence.noteEdit(stamp)
        } catch {
            throw RecordError(code: .outOfRange, message: "field \(name): \(error.message)")
        }
    }

    private mutating func editSet(_ name: String, removing removed: [ScalarValue], adding added: [ScalarValue],
                                  at stamp: Stamp) throws(RecordError) {
        try checkWritable(name)
        var set = ORSet()
        switch current(name) {
        case .register?, .list?, .text?:
            throw RecordError(code: .fieldKindMismatch, message: "field \(name) is not a set field")
        case .set(let existing)?:
            set = existing
        case nil:
            break
        }
        guard set.apply(removing: removed, adding: added, at: stamp) else { return }
        fields[name] = .set(set)
        changed = true
    }

    private func checkWritable(_ name: String?) throws(RecordError) {
        try Record.checkWritable(id.recordName, deleted: deletion != nil, field: name)
    }
}

