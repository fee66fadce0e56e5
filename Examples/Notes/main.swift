// lattice-notes: a small notes app on LatticeSync's public API (LatticeSyncEngine), the example of
// Docs/AppGuide.md. Each run is one command; the notes, the engine's saved state and the account live in a
// home directory (--home, else $LATTICE_NOTES_HOME, else ~/.lattice-notes).
import Foundation
import LatticeCore
import LatticeSync

let usage = """
    usage: lattice-notes [--home DIR] COMMAND
      signup NAME --server URL                      make an account and sign in
      login --server URL --token TOKEN              sign in with a Lattice token
      login --server URL --issuer URL --id-token T  sign in with an OpenID Connect ID token
      logout                                        forget the account and its notes here
      add TITLE [--body TEXT] [--tag TAG]... [--pin] [--no-sync]
      edit ID [--title T] [--body B] [--tag T]... [--untag T]... [--pin|--unpin] [--no-sync]
      delete ID [--no-sync]
      list [--json]
      sync                                          send what waits, then fetch
    """

struct UsageError: Error { let message: String }

/// The command line, read left to right.
struct Arguments {
    var words: [String]
    var options: [String: [String]] = [:]
    var flags: Set<String> = []

    init(_ all: [String], valued: Set<String>) throws {
        var words: [String] = []
        var index = 0
        while index < all.count {
            let word = all[index]
            if word.hasPrefix("--") {
                let name = String(word.dropFirst(2))
                if valued.contains(name) {
                    guard index + 1 < all.count else { throw UsageError(message: "\(word) needs a value") }
                    options[name, default: []].append(all[index + 1])
                    index += 2
                    continue
                }
                flags.insert(name)
            } else {
                words.append(word)
            }
            index += 1
        }
        self.words = words
    }

    func value(_ name: String) -> String? { options[name]?.last }
    func values(_ name: String) -> [String] { options[name] ?? [] }
}

func fail(_ message: String, status: Int32 = 1) -> Never {
    FileHandle.standardError.write(Data("lattice-notes: \(message)\n".utf8))
    exit(status)
}

let valued: Set<String> = ["home", "server", "token", "issuer", "id-token", "body", "tag", "untag", "title"]
let arguments: Arguments
do { arguments = try Arguments(Array(CommandLine.arguments.dropFirst()), valued: valued) } catch let error as UsageError {
    fail(error.message + "\n" + usage, status: 2)
}
guard let command = arguments.words.first else { fail(usage, status: 2) }
let home = arguments.value("home") ?? ProcessInfo.processInfo.environment["LATTICE_NOTES_HOME"]
    ?? (NSHomeDirectory() + "/.lattice-notes")

let store: NotesStore
do { store = try NotesStore(home: home) } catch { fail("cannot open \(home): \(error)") }

/// The engine for the private database, from the saved state; the app calls fetch and send itself.
func makeEngine(_ account: Account?) -> LatticeSyncEngine {
    var configuration = LatticeSyncEngine.Configuration(database: .private, account: account,
                                                        stateSerialization: store.saved.withLock { $0.state },
                                                        delegate: store)
    configuration.automaticallySync = false
    return LatticeSyncEngine(configuration)
}

/// Sends what waits and fetches; offline, says how much waits and succeeds (it is sent next time).
func sync(_ engine: LatticeSyncEngine) async {
    do {
        try await engine.sendChanges()
        try await engine.fetchChanges()
    } catch let error as LatticeSyncError where error.code == .networkUnavailable {
        print("offline: \(engine.state.pendingRecordZoneChanges.count) changes wait to be sent")
    } catch {
        finish(engine)
        fail("\(error)")
    }
}

/// Saves the notes and the engine's state as it is now, for the next run.
func finish(_ engine: LatticeSyncEngine) {
    store.saved.withLock { $0.state = engine.state.currentSerialization }
    do { try store.save() } catch { fail("cannot save \(home): \(error)") }
}

func signIn(_ account: Account) async {
    do { try store.install(account) } catch { fail("cannot save \(home): \(error)") }
    let engine = makeEngine(account)
    engine.state.add(pendingDatabaseChanges: [.saveZone(LatticeRecordZone(zoneID: NotesStore.zone))])
    await sync(engine)
    finish(engine)
    print("signed in as \(account.name)")
}

func requireAccount() -> Account {
    guard let account = store.account() else { fail("not signed in: run lattice-notes signup NAME --server URL, or login") }
    return account
}

func note(_ query: String) -> Note {
    let notes = store.saved.withLock { Array($0.notes.values) }
    if let exact = notes.first(where: { $0.id == query }) { return exact }
    let matches = notes.filter { $0.id.hasPrefix(query) || $0.title == query }
    guard matches.count == 1 else {
        fail(matches.isEmpty ? "no note \(query)" : "\(query) matches several notes: \(matches.map(\.id).joined(separator: ", "))")
    }
    return matches[0]
}

switch command {
case "signup":
    guard arguments.words.count == 2, let server = arguments.value("server") else { fail(usage, status: 2) }
    do { await signIn(try await AccountClient(serverURL: server).signUp(name: arguments.words[1])) } catch { fail("\(error)") }

case "login":
    guard let server = arguments.value("server") else { fail(usage, status: 2) }
    do {
        let client = try AccountClient(serverURL: server)
        if let token = arguments.value("token") {
            await signIn(try await client.signIn(token: token))
        } else if let idToken = arguments.value("id-token"), let issuer = arguments.value("issuer") {
            await signIn(try await client.signIn(idToken: idToken, issuer: issuer, deviceName: "lattice-notes"))
        } else {
            fail(usage, status: 2)
        }
    } catch {
        fail("\(error)")
    }

case "logout":
    let engine = makeEngine(store.account())
    do { try await engine.setAccount(nil) } catch { fail("\(error)") }
    finish(engine)
    do { try store.install(nil) } catch { fail("\(error)") }
    print("signed out; the notes of this account left this device")

case "add", "edit", "delete":
    let engine = makeEngine(requireAccount())
    var changed: Note
    switch command {
    case "add":
        guard arguments.words.count == 2 else { fail(usage, status: 2) }
        changed = Note(id: String(UUID().uuidString.prefix(8)).lowercased(), title: arguments.words[1],
                       body: arguments.value("body") ?? "", tags: Array(Set(arguments.values("tag"))).sorted(),
                       pinned: arguments.flags.contains("pin"))
    case "edit":
        guard arguments.words.count == 2 else { fail(usage, status: 2) }
        changed = note(arguments.words[1])
        if let title = arguments.value("title") { changed.title = title }
        if let body = arguments.value("body") { changed.body = body }
        changed.tags = Set(changed.tags).union(arguments.values("tag")).subtracting(arguments.values("untag")).sorted()
        if arguments.flags.contains("pin") { changed.pinned = true }
        if arguments.flags.contains("unpin") { changed.pinned = false }
    default:
        guard arguments.words.count == 2 else { fail(usage, status: 2) }
        changed = note(arguments.words[1])
    }
    let id = NotesStore.recordID(changed.id)
    if command == "delete" {
        store.saved.withLock { _ = $0.notes.removeValue(forKey: changed.id) }
        engine.state.add(pendingRecordZoneChanges: [.deleteRecord(id)])
    } else {
        store.saved.withLock { $0.notes[changed.id] = changed }
        engine.state.add(pendingRecordZoneChanges: [.saveRecord(id)])
    }
    if !arguments.flags.contains("no-sync") { await sync(engine) }
    finish(engine)
    if command == "add" { print(changed.id) }

case "list":
    let notes = store.saved.withLock { $0.notes.values.sorted { ($0.pinned ? 0 : 1, $0.title, $0.id) < ($1.pinned ? 0 : 1, $1.title, $1.id) } }
    if arguments.flags.contains("json") {
        let rows = notes.map { note -> [String: Any] in
            ["id": note.id, "title": note.title, "body": note.body, "tags": note.tags, "pinned": note.pinned]
        }
        let data = try JSONSerialization.data(withJSONObject: ["notes": rows], options: [.sortedKeys])
        print(String(decoding: data, as: UTF8.self))
    } else {
        for note in notes {
            let tags = note.tags.isEmpty ? "" : "  " + note.tags.map { "#" + $0 }.joined(separator: " ")
            print("\(note.pinned ? "*" : " ") \(note.id)  \(note.title)\(tags)")
            if !note.body.isEmpty { print("            \(note.body)") }
        }
    }

case "sync":
    let engine = makeEngine(requireAccount())
    await sync(engine)
    finish(engine)
    print("synced: \(store.saved.withLock { $0.notes.count }) notes, \(engine.state.pendingRecordZoneChanges.count) waiting")

default:
    fail("unknown command \(command)\n" + usage, status: 2)
}
