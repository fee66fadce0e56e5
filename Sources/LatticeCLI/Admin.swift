import Foundation
import LatticeCore
import LatticeServer
import LatticeSharing

let adminUsage = """
    usage: lattice admin add-user NAME --data DIR [--json]
           lattice admin share-keys --data DIR [--json]
           lattice admin rotate-share-key --data DIR [--json]
           lattice admin retire-share-key KID --data DIR

    add-user          creates an account on the server whose data directory is DIR (it may be running)
                      and prints its user record name and bearer token. The token is shown only now; the
                      server keeps only its hash. This is how accounts are made with --registration closed.
    share-keys        lists the share-link signing keys: kid, created, active or verifying or retired.
    rotate-share-key  makes a new active signing key; links signed by older keys keep verifying until
                      their key is retired. A running server picks the change up on its next request.
    retire-share-key  stops a key verifying: every share URL it signed stops working at once.
    """

func runAdmin(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data"], flagOptions: ["json"])
    if parsed.flag("help") {
        print(adminUsage)
        return
    }
    guard let subcommand = parsed.positionals.first else { throw UsageError("missing subcommand") }
    guard let data = try parsed.value("data") else { throw UsageError("--data DIR is required") }
    umask(0o077)
    switch subcommand {
    case "add-user":
        guard parsed.positionals.count == 2 else { throw UsageError("add-user takes exactly one NAME") }
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
    case "share-keys", "rotate-share-key", "retire-share-key":
        guard FileManager.default.fileExists(atPath: data) else { throw UsageError("\(data) does not exist") }
        let ring = try ShareKeyRing.open(directory: data, nowMilliseconds: Int64(Date().timeIntervalSince1970 * 1000))
        if subcommand == "rotate-share-key" {
            guard parsed.positionals.count == 1 else { throw UsageError("rotate-share-key takes no arguments") }
            let kid = try ring.rotate(nowMilliseconds: Int64(Date().timeIntervalSince1970 * 1000))
            if !parsed.flag("json") { print("new active share-signing key: \(kid)") }
        } else if subcommand == "retire-share-key" {
            guard parsed.positionals.count == 2 else { throw UsageError("retire-share-key takes exactly one KID") }
            try ring.retire(keyID: parsed.positionals[1])
            if !parsed.flag("json") { print("retired \(parsed.positionals[1]): links it signed no longer verify") }
        }
        if parsed.flag("json") || subcommand == "share-keys" {
            let keys = ring.keys
            if parsed.flag("json") {
                print(JSON.array(keys.map { key in
                    .object(["kid": .string(key.keyID), "createdMs": .int(key.createdMilliseconds),
                             "state": .string(key.active ? "active" : key.retired ? "retired" : "verifying")])
                }).serialized())
            } else {
                for key in keys {
                    let state = key.active ? "active" : key.retired ? "retired" : "verifying"
                    let created = Date(timeIntervalSince1970: Double(key.createdMilliseconds) / 1000)
                    print("\(key.keyID)  \(state)  created \(created)")
                }
            }
        }
    default:
        throw UsageError("unknown subcommand \(subcommand)")
    }
}
