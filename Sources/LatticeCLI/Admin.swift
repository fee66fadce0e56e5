import Foundation
import LatticeCore
import LatticeServer

let adminUsage = """
    usage: lattice admin add-user NAME --data DIR [--json]

    Creates an account on the server whose data directory is DIR (it may be running) and prints its
    user record name and bearer token. The token is shown only now; the server keeps only its hash.
    This is how accounts are made when the server runs with --registration closed.
    """

func runAdmin(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data"], flagOptions: ["json"])
    if parsed.flag("help") {
        print(adminUsage)
        return
    }
    guard parsed.positionals.first == "add-user" else {
        throw UsageError(parsed.positionals.isEmpty ? "missing subcommand (add-user)" : "unknown subcommand \(parsed.positionals[0])")
    }
    guard parsed.positionals.count == 2 else { throw UsageError("add-user takes exactly one NAME") }
    guard let data = try parsed.value("data") else { throw UsageError("--data DIR is required") }
    umask(0o077)
    let (storage, service) = try DataDirectory.openService(data)
    defer { storage.close() }
    let account = try service.createAccount(name: parsed.positionals[1])
    if parsed.flag("json") {
        print(JSON.object(["name": .string(account.user.name), "userRecordName": .string(account.user.recordName),
                           "token": .string(account.token.text)]).serialized())
    } else {
        print("created user \(account.user.name) (\(account.user.recordName))")
        print("token: \(account.token.text)")
        print("keep the token: it is not stored and cannot be shown again")
    }
}
