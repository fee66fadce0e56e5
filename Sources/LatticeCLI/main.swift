import Foundation
import LatticeAPI
import LatticeCore
import LatticeServer

// The `lattice` command: thin argument handling over the library targets.

let usage = """
    usage: lattice <command> [options]

    Lists (this device's copy first; each change then syncs, or stays queued offline or with --no-sync):
      lists                                       your lists and lists shared with you
      list create TITLE [--zone ZONE]             a new list
      list show LIST                              its items: [x] done, [ ] not, #tags
      list add LIST TEXT [--tag T]...             a new item
      list check LIST ITEM | list uncheck LIST ITEM
      list edit LIST ITEM [--text T] [--add-tag T]... [--remove-tag T]...
      list remove LIST ITEM
      list rename LIST TITLE
      list delete LIST
      explain LIST ITEM FIELD                     which device and time won a field

    Sharing (online):
      share create LIST [--public-permission none|read-only|read-write]
      share create --zone ZONE [--public-permission none|read-only|read-write]
      share invite LIST USER [--permission read-only|read-write] [--role administrator]
      share set-permission LIST USER read-only|read-write
      share remove LIST USER
      share participants LIST
      share url LIST [--permission P] [--expires DURATION] [--max-uses N] [--rotate]
      share delete LIST
      share leave LIST                            leave a list shared with you
      accept URL [--yes]                          show a share link (long or short), join it and sync
      invitations [accept N | decline N]          lists you were invited to; answer one

    Account and sync:
      signup NAME --server URL                    create an account; the token stays in the home
      login --server URL                          sign this device in: shows a code to approve on a signed-in one
      login --server URL --token TOKEN            sign this home in with an existing account's token
      devices [approve CODE | revoke ID]          the account's devices and tokens; let a new device in
      logout [--force] [--local]                  revoke this home's token on the server and forget it
      whoami                                      the account, server, home and pending changes
      sync                                        send queued changes, fetch everyone else's
      watch [LIST]                                print changes made elsewhere as they arrive; Ctrl-C stops

    Server:
      serve --data DIR ...                        run the sync service (lattice serve --help);
                                                  --database URL: one node of several on PostgreSQL
      admin add-user NAME --data DIR              create an account on a server's data directory
      admin revoke-token TOKEN_ID --data DIR      revoke a token (or --user NAME: all of a user's)
                                                  (also tokens, share-keys, rotate-share-key, retire-share-key;
                                                  every admin command takes --database URL for --data DIR;
                                                  migrate --data DIR --to URL: SQLite into PostgreSQL)
      demo [--json]                               two replicas edit one list offline and converge
      version                                     print the version
      help [COMMAND]                              show this help, or a command's

    Options of the client commands (lists ... watch):
      --home DIR   this device's home (default $LATTICE_HOME, else ~/.lattice)
      --json       machine output
      --no-sync    change this device's copy only; lattice sync sends it later
      --help       the command's help (lattice list --help, lattice share --help, ...)

    LIST is a list's id, id prefix or title; ITEM an item's id, id prefix or text. An ambiguous one is an
    error that lists the candidates.

    Exit codes: 0 success, 1 error, 2 usage error.
    """

let commandUsages = clientCommandUsages.merging(["serve": serveUsage, "admin": adminUsage, "demo": demoUsage]) { $1 }

var arguments = hoistingGlobalOptions(Array(CommandLine.arguments.dropFirst()))
guard let command = arguments.first else { fail("missing command\n\(usage)", code: 2) }
arguments.removeFirst()

do {
    switch command {
    case "help", "--help", "-h":
        if let topic = arguments.first, let text = commandUsages[topic] {
            print(text)
        } else if let topic = arguments.first {
            throw UsageError("no command '\(topic)'")
        } else {
            print(usage)
        }
    case "version", "--version":
        print("lattice 0.1.0 (binary format \(BinaryCodec.formatVersion))")
    case "serve":
        try runServe(arguments)
    case "admin":
        try runAdmin(arguments)
    case "signup", "login", "logout", "whoami", "sync", "watch", "lists", "list", "share", "accept", "explain", "devices",
         "invitations":
        try runClientCommand(command, arguments)
    case "demo":
        let parsed = try ParsedArguments(arguments, valueOptions: [], flagOptions: ["json"])
        if parsed.flag("help") {
            print(demoUsage)
        } else {
            guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument \(parsed.positionals[0])") }
            try runDemo(json: parsed.flag("json"))
        }
    default:
        throw UsageError("unknown command '\(command)'")
    }
} catch let error as UsageError {
    fail("\(command): \(error.description)\n\(commandUsages[command] ?? usage)", code: 2)
} catch let error as ServiceError {
    fail("\(command): \(error.reason)", code: 1)
} catch {
    fail("\(command): \(error)", code: 1)
}
