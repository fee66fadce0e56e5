import Foundation
import LatticeCore
import LatticeOperations
import LatticeServer
import LatticeSharing

let adminUsage = """
    usage: lattice admin add-user NAME --data DIR [--lifetime SECONDS] [--json]
           lattice admin tokens NAME --data DIR [--json]
           lattice admin revoke-token TOKEN_ID --data DIR [--json]
           lattice admin revoke-token --user NAME --data DIR [--json]
           lattice admin share-keys --data DIR [--json]
           lattice admin rotate-share-key --data DIR [--json]
           lattice admin retire-share-key KID --data DIR
           lattice admin migrate --data DIR --to URL [--json]

    Every command but migrate takes --database URL (default $LATTICE_DATABASE_URL when --data is not given) in place
    of --data DIR, for a PostgreSQL deployment: it works beside running nodes, and what it changes
    (tokens, share keys) every node uses from its next request.

    add-user          creates an account on the server whose data directory is DIR (it may be running)
                      and prints its user record name and bearer token. The token is shown only now; the
                      server keeps only its hash. This is how accounts are made with --registration closed.
                      --lifetime SECONDS makes the token expire (the server's --token-lifetime caps it).
    tokens            lists a user's bearer tokens by id, with created and expiry times (never secrets).
    revoke-token      revokes one token by its id, or with --user every token of a user. It takes effect
                      at once, also on a running server: the next request with the token gets
                      AUTHENTICATION_FAILED.
    share-keys        lists the share-link signing keys: kid, created, active or verifying or retired.
    rotate-share-key  makes a new active signing key; links signed by older keys keep verifying until
                      their key is retired. A running server picks the change up on its next request.
    retire-share-key  stops a key verifying: every share URL it signed stops working at once.
    """ + "\n" + migrateUsage

func runAdmin(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data", "database", "database-pool", "user", "lifetime", "to"],
                                     flagOptions: ["json"])
    if parsed.flag("help") {
        print(adminUsage)
        return
    }
    guard let subcommand = parsed.positionals.first else { throw UsageError("missing subcommand") }
    if subcommand == "migrate" { return try runMigrate(parsed) }
    let location = try storageLocation(parsed)
    umask(0o077)
    switch subcommand {
    case "add-user":
        guard parsed.positionals.count == 2 else { throw UsageError("add-user takes exactly one NAME") }
        let lifetime = try parsed.integer("lifetime", in: 60...315_360_000).map(Int64.init)
        let deployment = try openForAdministration(location, mustExist: false)
        defer { deployment.close() }
        let service = deployment.service
        let account = try service.createAccount(name: parsed.positionals[1], lifetimeSeconds: lifetime)
        if parsed.flag("json") {
            var object: [String: JSON] = ["name": .string(account.user.name), "userRecordName": .string(account.user.recordName),
                                          "token": .string(account.token.text), "tokenID": .string(account.tokenInfo.id)]
            if let expires = account.tokenInfo.expiresMs { object["expiresMs"] = .int(expires) }
            print(JSON.object(object).serialized())
        } else {
            print("created user \(account.user.name) (\(account.user.recordName))")
            print("token: \(account.token.text)")
            if let expires = account.tokenInfo.expiresMs { print("expires: \(adminDate(expires))") }
            print("keep the token: it is not stored and cannot be shown again")
        }
    case "tokens":
        guard parsed.positionals.count == 2 else { throw UsageError("tokens takes exactly one user NAME") }
        let deployment = try openForAdministration(location, mustExist: true)
        defer { deployment.close() }
        let service = deployment.service
        let tokens = try service.tokens(userName: parsed.positionals[1])
        if parsed.flag("json") {
            print(JSON.array(tokens.map { token in
                var object: [String: JSON] = ["tokenID": .string(token.id), "createdMs": .int(token.createdMs)]
                if let expires = token.expiresMs { object["expiresMs"] = .int(expires) }
                if let name = token.name { object["deviceName"] = .string(name) }
                return .object(object)
            }).serialized())
        } else if tokens.isEmpty {
            print("\(parsed.positionals[1]) has no tokens")
        } else {
            for token in tokens {
                print("\(token.id)  created \(adminDate(token.createdMs))  "
                      + (token.expiresMs.map { "expires \(adminDate($0))" } ?? "never expires")
                      + (token.name.map { "  device \($0)" } ?? ""))
            }
        }
    case "revoke-token":
        let user = try parsed.value("user")
        guard (user == nil && parsed.positionals.count == 2) || (user != nil && parsed.positionals.count == 1) else {
            throw UsageError("revoke-token takes one TOKEN_ID, or --user NAME")
        }
        let deployment = try openForAdministration(location, mustExist: true)
        defer { deployment.close() }
        let service = deployment.service
        let revoked = try service.revokeTokens(tokenID: user == nil ? parsed.positionals[1] : nil, userName: user)
        if parsed.flag("json") {
            print(JSON.object(["revoked": .array(revoked.map { .string($0) })]).serialized())
        } else if let user {
            print("revoked \(revoked.count) \(revoked.count == 1 ? "token" : "tokens") of \(user)")
        } else {
            print("revoked token \(revoked[0])")
        }
    case "share-keys", "rotate-share-key", "retire-share-key":
        let deployment = try openForAdministration(location, mustExist: true)
        defer { deployment.close() }
        let ring = deployment.keyRing
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

/// Opens the deployment of `--data` or `--database` for an admin command, beside any running server. On a
/// database the command runs as node "admin", never as a serving node's name.
private func openForAdministration(_ location: StorageLocation, mustExist: Bool) throws -> OpenedDeployment {
    if mustExist, case .dataDirectory(let path) = location, !FileManager.default.fileExists(atPath: path) {
        throw UsageError("\(path) does not exist")
    }
    var configuration = ServiceConfiguration()
    if location.isShared { configuration.nodeName = "admin" }
    return try OpenedDeployment.open(location, configuration: configuration, purpose: .administration)
}

private func adminDate(_ milliseconds: Int64) -> String {
    ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(milliseconds) / 1000))
}
