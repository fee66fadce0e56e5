import Foundation
import LatticeCore
import LatticeServer

// The `lattice` command: thin argument handling over the library targets.

let usage = """
    usage: lattice <command> [options]

    commands:
      serve --data DIR ...         run the sync service (lattice serve --help)
      admin add-user NAME --data DIR
                                   create an account on a server's data directory
      demo [--json]                two replicas edit one list offline, exchange binary deltas and converge
      version                      print the version
      help                         show this help

    Exit codes: 0 success, 1 error, 2 usage error.
    """

let commandUsages = ["serve": serveUsage, "admin": adminUsage, "demo": demoUsage]

var arguments = Array(CommandLine.arguments.dropFirst())
guard let command = arguments.first else { fail("missing command\n\(usage)", code: 2) }
arguments.removeFirst()

do {
    switch command {
    case "help", "--help", "-h":
        print(usage)
    case "version", "--version":
        print("lattice 0.1.0 (binary format \(BinaryCodec.formatVersion))")
    case "serve":
        try runServe(arguments)
    case "admin":
        try runAdmin(arguments)
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
} catch let error as APIError {
    fail("\(command): \(error.reason)", code: 1)
} catch {
    fail("\(command): \(error)", code: 1)
}
