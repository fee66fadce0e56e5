import Foundation
import LatticeCore
import LatticeLists
import LatticeSync

// lattice lists, lattice list <subcommand> and lattice explain.

func runLists(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments)
    if options.help { return print(listsUsage) }
    _ = try options.operands(options.positionals)
    let (engine, lists) = try options.openLists()
    let all = try lists.all()
    if options.json { return printJSON(.array(all.map(listJSON))) }
    if all.isEmpty {
        print("no lists yet: lattice list create TITLE makes one, lattice accept URL joins one")
    } else {
        var rows = [["TITLE", "OWNER", "SHARED", "ACCESS", "ID"]]
        for list in all {
            rows.append([list.title, ownerLabel(list), list.shared ? "yes" : "no", permissionWord(list.permission),
                         list.id])
        }
        alignedRows(rows).forEach { print($0) }
    }
    try printPending(engine)
}

/// "(N changes pending ...)" under a listing when this device has unsent changes.
private func printPending(_ engine: ListsReplica) throws {
    let pending = try engine.pendingCount()
    if pending > 0 { print("(\(pending) \(plural(pending, "change")) pending: lattice sync sends them)") }
}

func runList(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, valueOptions: ["zone", "tag", "text", "add-tag", "remove-tag", "out", "file"])
    if options.help { return print(listUsage) }
    guard let subcommand = options.positionals.first else {
        throw UsageError("missing subcommand: create, show, add, check, uncheck, edit, note, move, attach, get, remove, rename or delete")
    }
    let operands = Array(options.positionals.dropFirst())
    let valueOptions: [String: Set<String>] = [
        "create": ["zone"], "add": ["tag"], "edit": ["text", "add-tag", "remove-tag"], "get": ["out"], "note": ["file"],
    ]
    let known = ["create", "show", "add", "check", "uncheck", "edit", "note", "move", "attach", "get", "remove", "rename",
                 "delete"]
    guard known.contains(subcommand) else { throw UsageError("unknown subcommand list \(subcommand)") }
    try options.allowOnly(valueOptions[subcommand] ?? [], in: "list \(subcommand)")
    try options.allowFlags([], in: "list \(subcommand)")

    switch subcommand {
    case "create":
        let title = try options.operands(operands, "TITLE")[0]
        let zone = try options.parsed.value("zone")
        if let zone, zone.isEmpty { throw UsageError("--zone needs a zone name") }
        let (engine, lists) = try options.openLists()
        let list = try lists.create(title: title, zone: zone)
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(list.id)],
               "created list \"\(list.title)\" (\(list.id)) in zone \(list.zone.zoneName)")
    case "show":
        let query = try options.operands(operands, "LIST")[0]
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(query)
        try show(list, lists.items(of: list), options)
        if !options.json { try printPending(engine) }
    case "add":
        let values = try options.operands(operands, "LIST", "TEXT")
        let tags = options.parsed.values["tag"] ?? []
        if tags.contains(where: \.isEmpty) { throw UsageError("--tag needs a tag") }
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        let item = try lists.add(values[1], tags: tags, to: list)
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(item.id), "list": .string(list.id)],
               "added \(checkbox(false)) \(item.text)\(tags.isEmpty ? "" : "  " + tagWords(item.tags)) "
                   + "to \"\(list.title)\"")
    case "check", "uncheck":
        let values = try options.operands(operands, "LIST", "ITEM")
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        let item = try lists.resolveItem(values[1], in: list)
        try lists.setDone(item, in: list, subcommand == "check")
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(item.id), "list": .string(list.id)],
               "\(checkbox(subcommand == "check")) \(item.text)")
    case "edit":
        let values = try options.operands(operands, "LIST", "ITEM")
        let text = try options.parsed.value("text")
        let addTags = options.parsed.values["add-tag"] ?? []
        let removeTags = options.parsed.values["remove-tag"] ?? []
        guard text != nil || !addTags.isEmpty || !removeTags.isEmpty else {
            throw UsageError("nothing to change: give --text, --add-tag or --remove-tag")
        }
        if text == "" { throw UsageError("--text cannot be empty") }
        if (addTags + removeTags).contains(where: \.isEmpty) { throw UsageError("a tag cannot be empty") }
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        let item = try lists.resolveItem(values[1], in: list)
        try lists.edit(item, in: list, text: text, addTags: addTags, removeTags: removeTags)
        let edited = try lists.items(of: list).first { $0.id == item.id }
        let outcome = try syncAfterChange(engine, lists, options)
        let line = edited.map { "\(checkbox($0.done)) \($0.text)\($0.tags.isEmpty ? "" : "  " + tagWords($0.tags))" }
            ?? "edited \(item.id)"
        try report(options, outcome, ["id": .string(item.id), "list": .string(list.id)], line)
    case "note":
        try noteCommand(operands, options)
    case "move":
        let values = try options.operands(operands, "LIST", "ITEM", "POSITION")
        guard let index = Int(values[2]), index >= 1 else {
            throw UsageError("POSITION must be a whole number from 1 (1 is the top of the list)")
        }
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        let item = try lists.resolveItem(values[1], in: list)
        let count = try lists.items(of: list).count
        guard index <= count else { throw UsageError("POSITION \(index) is past the end: \"\(list.title)\" has \(count) \(plural(count, "item"))") }
        try lists.move(item, in: list, to: index)
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(item.id), "list": .string(list.id), "position": .int(Int64(index))],
                   "moved \"\(item.text)\" to position \(index) of \"\(list.title)\"")
    case "attach":
        let values = try options.operands(operands, "LIST", "ITEM", "FILE")
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: values[2], isDirectory: &isDirectory), !isDirectory.boolValue else {
            throw UsageError("\(values[2]) is not a file")
        }
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        let item = try lists.resolveItem(values[1], in: list)
        let attachment = try lists.attach(URL(fileURLWithPath: values[2]), to: item, in: list)
        // The sync below sends the file before the item: say so, a large one takes a while.
        if !options.noSync {
            writeStandardError("lattice: uploading \(attachment.name) (\(byteCount(attachment.asset.size)))...\n")
        }
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(item.id), "list": .string(list.id), "name": .string(attachment.name),
                                      "fileChecksum": .string(attachment.asset.fileChecksum)],
                   "attached \(attachment.name) (\(byteCount(attachment.asset.size))) to \"\(item.text)\"")
    case "get":
        guard (2...3).contains(operands.count) else { throw UsageError("list get takes LIST ITEM [NAME]") }
        let directory = try options.parsed.value("out") ?? FileManager.default.currentDirectoryPath
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw UsageError("--out \(directory) is not a directory")
        }
        let (_, lists) = try options.openLists()
        let list = try lists.resolve(operands[0])
        let item = try lists.resolveItem(operands[1], in: list)
        let wanted = operands.count == 3 ? item.attachments.filter { $0.name == operands[2] } : item.attachments
        if wanted.isEmpty {
            throw CommandFailure(operands.count == 3 ? "\"\(item.text)\" has no attachment named \(operands[2])"
                                                     : "\"\(item.text)\" has no attachments")
        }
        var saved: [String] = []
        for attachment in wanted {
            // A file this device does not have is downloaded now: say so before the wait.
            if lists.replica.assets?.file(for: attachment.asset) == nil {
                writeStandardError("lattice: downloading \(attachment.name) (\(byteCount(attachment.asset.size)))...\n")
            }
            let file = try waitForAsyncWork { try await lists.file(of: attachment, of: item, in: list) }
            let target = URL(fileURLWithPath: directory).appendingPathComponent(attachment.name).path
            if FileManager.default.fileExists(atPath: target) {
                throw CommandFailure("\(target) exists; remove it or give another --out")
            }
            try FileManager.default.copyItem(atPath: file.path, toPath: target)
            saved.append(target)
            if !options.json { print("saved \(attachment.name) (\(byteCount(attachment.asset.size))) to \(target)") }
        }
        if options.json { printJSON(.object(["saved": .array(saved.map(JSON.string))])) }
    case "remove":
        let values = try options.operands(operands, "LIST", "ITEM")
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        let item = try lists.resolveItem(values[1], in: list)
        try lists.remove(item, in: list)
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(item.id), "list": .string(list.id)],
               "removed \"\(item.text)\" from \"\(list.title)\"")
    case "rename":
        let values = try options.operands(operands, "LIST", "TITLE")
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(values[0])
        try lists.rename(list, to: values[1])
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(list.id)], "renamed \"\(list.title)\" to \"\(values[1])\"")
    default: // delete
        let query = try options.operands(operands, "LIST")[0]
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(query)
        if list.zone.database == "shared" {
            throw CommandFailure("only the owner deletes \"\(list.title)\"; "
                                 + "to stop seeing it: lattice share leave \(list.id)")
        }
        let ids = [list.id] + (try lists.items(of: list).map(\.id))
        try lists.delete(list)
        let outcome = try syncAfterChange(engine, lists, options)
        try report(options, outcome, ["id": .string(list.id), "ids": .array(ids.map(JSON.string))],
               "deleted list \"\(list.title)\" and its \(ids.count - 1) \(plural(ids.count - 1, "item"))")
    }
}

/// `list note LIST ITEM [TEXT | --file PATH]`: shows the note, or sets it (as the fewest splices, so
/// someone else's concurrent edits elsewhere in it stay). `--file -` reads standard input.
private func noteCommand(_ operands: [String], _ options: ClientOptions) throws {
    guard (2...3).contains(operands.count) else { throw UsageError("list note takes LIST ITEM [TEXT] (or --file PATH)") }
    let file = try options.parsed.value("file")
    if file != nil && operands.count == 3 { throw UsageError("give the note as TEXT or with --file, not both") }
    var newNote: String? = operands.count == 3 ? operands[2] : nil
    if let file {
        let data: Data
        if file == "-" {
            data = FileHandle.standardInput.readDataToEndOfFile()
        } else {
            guard let read = FileManager.default.contents(atPath: file) else { throw UsageError("cannot read \(file)") }
            data = read
        }
        guard data.count <= 256 * 1024, let text = String(data: data, encoding: .utf8) else {
            throw UsageError("\(file == "-" ? "standard input" : file) is not UTF-8 text of at most 256 KiB")
        }
        newNote = text
    }
    let (engine, lists) = try options.openLists()
    let list = try lists.resolve(operands[0])
    let item = try lists.resolveItem(operands[1], in: list)
    guard let newNote else {
        if options.json {
            return printJSON(.object(["id": .string(item.id), "list": .string(list.id), "note": .string(item.note)]))
        }
        return print(item.note.isEmpty ? "(\"\(item.text)\" has no note: lattice list note LIST ITEM TEXT adds one)" : item.note)
    }
    try lists.setNote(item, in: list, newNote)
    let outcome = try syncAfterChange(engine, lists, options)
    let count = newNote.unicodeScalars.count
    try report(options, outcome, ["id": .string(item.id), "list": .string(list.id)],
               newNote.isEmpty ? "cleared the note of \"\(item.text)\""
                               : "note of \"\(item.text)\": \(count) \(plural(count, "character"))")
}

/// Prints a change's result (the affected ids under --json) and fails if the server refused it.
func report(_ options: ClientOptions, _ outcome: SyncOutcome, _ ids: [String: JSON], _ line: String) throws {
    if options.json {
        printJSON(.object(ids.merging(outcome.json) { first, _ in first }))
    } else {
        print(line)
    }
    try outcome.finish()
}

private func show(_ list: ListSummary, _ items: [ListItem], _ options: ClientOptions) throws {
    if options.json {
        return printJSON(.object(["id": .string(list.id), "title": .string(list.title),
                                  "owner": .string(ownerLabel(list)), "permission": .string(list.permission),
                                  "items": .array(items.map(itemJSON))]))
    }
    var header = "\(list.title)  (owner \(ownerLabel(list))"
    if list.permission != "owner" { header += ", you have \(permissionWord(list.permission)) access" }
    header += list.shared ? ", shared)" : ")"
    print(header)
    if items.isEmpty {
        print("  (no items: lattice list add \"\(list.title)\" TEXT)")
        return
    }
    let rows = items.map { item in
        [checkbox(item.done) + " " + item.text,
         tagWords(item.tags) + (item.attachments.isEmpty ? "" : (item.tags.isEmpty ? "" : "  ")
             + "attached: " + item.attachments.map(\.name).joined(separator: ", ")),
         item.id]
    }
    let lines = alignedRows(rows, indent: "  ")
    for (item, line) in zip(items, lines) {
        print(line)
        // The note under its item, indented.
        for noteLine in item.note.split(separator: "\n", omittingEmptySubsequences: false) where !item.note.isEmpty {
            print("      " + noteLine)
        }
    }
    let done = items.filter(\.done).count
    print("\(done) of \(items.count) done")
}

// MARK: explain

func runExplain(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments)
    if options.help { return print(explainUsage) }
    let values = options.positionals.count == 2 ? try options.operands(options.positionals, "LIST", "FIELD")
                                                : try options.operands(options.positionals, "LIST", "ITEM", "FIELD")
    let (engine, lists) = try options.openLists()
    let list = try lists.resolve(values[0])
    let item = values.count == 3 ? try lists.resolveItem(values[1], in: list) : nil
    let field = values[values.count - 1]
    let name = item?.id ?? list.id
    let subject = item.map { "\"\($0.text)\" in \"\(list.title)\"" } ?? "list \"\(list.title)\""
    guard let record = try engine.record(name, in: list.zone) else { throw CommandFailure("\(subject) has no field \(field)") }
    // A field changed here and not sent yet has no stamp until the engine sends it: say so.
    guard !record.changedKeys().contains(field), let provenance = record.provenance(ofKey: field) else {
        guard record.changedKeys().contains(field) else { throw CommandFailure("\(subject) has no field \(field)") }
        let value = record.fieldValue(field).map(fieldJSON) ?? .null
        if options.json {
            printJSON(.object(["record": .string(name), "field": .string(field), "kind": .string("unsent"), "value": value]))
        } else {
            print("\(field) of \(subject) = \(value == .null ? "(cleared)" : value.serialized())")
            print("  changed on this device and not sent yet: run lattice sync")
        }
        return
    }
    let mine = engine.replicaIDs
    func time(_ stamp: Stamp) -> String {
        ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(stamp.hlc.milliseconds) / 1000))
    }
    func writer(_ stamp: Stamp) -> JSON {
        .object(["replica": .string(stamp.replica.description), "thisDevice": .bool(mine.contains(stamp.replica)),
                 "time": .string(time(stamp)), "hlc": .string(stamp.hlc.description)])
    }
    func device(_ stamp: Stamp) -> String {
        (mine.contains(stamp.replica) ? "this device" : "device") + " \(stamp.replica) at \(time(stamp)) (hlc \(stamp.hlc))"
    }
    var object: [String: JSON] = ["record": .string(name), "field": .string(field)]
    switch provenance {
    case .register(let stamp):
        let value = record.fieldValue(field).map(fieldJSON) ?? .null
        guard options.json else {
            print("\(field) of \(subject) = \(value == .null ? "(cleared)" : value.serialized())")
            print("  last-writer-wins: the write of \(device(stamp)) won")
            return
        }
        object["kind"] = .string("register")
        object["value"] = value
        object["winner"] = writer(stamp)
    case .set(let elements, _):
        guard options.json else {
            print("\(field) of \(subject): an add-wins set" + (elements.isEmpty ? ", empty" : ""))
            let rows = elements.map { value, stamps in
                [scalarJSON(value).serialized(), "kept by the add of " + stamps.map(device).joined(separator: "; ")]
            }
            alignedRows(rows, indent: "  ").forEach { print($0) }
            return
        }
        object["kind"] = .string("set")
        object["elements"] = .array(elements.map { value, stamps in
            .object(["value": scalarJSON(value), "addedBy": .array(stamps.map(writer))])
        })
    case .runs(let runs, _):
        func inserter(_ replica: ReplicaID) -> String { (mine.contains(replica) ? "this device" : "device") + " \(replica)" }
        let isText: Bool
        if case .text? = record.fieldValue(field) { isText = true } else { isText = false }
        guard options.json else {
            print("\(field) of \(subject): " + (isText ? "a text merged character by character" : "a list merged element by element")
                  + (runs.isEmpty ? ", empty" : "; who wrote each run:"))
            let rows = runs.map { run, values in
                [values.map { scalarJSON($0).serialized() }.joined(separator: ", "), "inserted by " + inserter(run.id.replica)]
            }
            alignedRows(rows, indent: "  ").forEach { print($0) }
            return
        }
        object["kind"] = .string(isText ? "text" : "list")
        object["runs"] = .array(runs.map { run, values in
            .object(["values": .array(values.map(scalarJSON)), "replica": .string(run.id.replica.description),
                     "thisDevice": .bool(mine.contains(run.id.replica))])
        })
    }
    printJSON(.object(object))
}

private func fieldJSON(_ value: FieldValue) -> JSON {
    switch value {
    case .scalar(let scalar): return scalarJSON(scalar)
    case .list(_, let elements), .set(_, let elements): return .array(elements.map(scalarJSON))
    case .text(let text): return .string(text)
    }
}

private func scalarJSON(_ value: ScalarValue) -> JSON {
    switch value {
    case .string(let text): return .string(text)
    case .int64(let number): return .int(number)
    case .double(let number): return .double(number)
    case .timestamp(let milliseconds): return .int(milliseconds)
    case .bytes(let bytes): return .string(Data(bytes).base64EncodedString())
    default: return .string("\(value)")
    }
}
