import Foundation
import LatticeAPI
import LatticeCore
import LatticeLists
import LatticeSync

// lattice signup, login, whoami and sync.

/// A home keeps one account's lists: switching to another account drops them, so unsent changes must go
/// first. `newUser` is the account being signed in to, when known (nil: a new account).
func checkSwitch(_ engine: ListsReplica, server: String, newUser: (String) throws -> String?) throws {
    guard let current = engine.account else { return }
    let pending = try engine.pendingCount()
    guard pending > 0 else { return }
    if current.serverURL == server, let user = try newUser(server), user == current.userRecordName { return }
    throw CommandFailure("this home holds \(pending) unsent \(plural(pending, "change")) of \(current.name); "
                         + "run lattice sync first, or use another --home")
}

private func serverOption(_ options: ClientOptions) throws(UsageError) -> String {
    guard let server = try options.parsed.value("server") else { throw UsageError("--server URL is required") }
    guard let url = URL(string: server), url.scheme == "http" || url.scheme == "https", url.host != nil else {
        throw UsageError("--server must be a URL such as http://127.0.0.1:8080")
    }
    return server
}

func runSignUp(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, valueOptions: ["server"])
    if options.help { return print(signupUsage) }
    let name = try options.operands(options.positionals, "NAME")[0]
    let server = try serverOption(options)
    let engine = try options.openEngine(creating: true)
    try checkSwitch(engine, server: server) { _ in nil }
    let account: Account
    do {
        account = try waitForAsyncWork { try await AccountClient(serverURL: server).signUp(name: name) }
    } catch let error as ServerError {
        // Said at once, with why (a taken name, closed registration, the sign-up limit) and, for a limit,
        // when to try again: the client does not wait out a long Retry-After.
        throw CommandFailure("sign-up refused: \(error.reason) (\(error.code))"
                             + (error.retryAdvice.map { "; " + $0 } ?? ""))
    }
    try waitForAsyncWork { try await engine.signIn(account) }
    if options.json {
        printJSON(.object(["name": .string(account.name), "userRecordName": .string(account.userRecordName),
                           "server": .string(account.serverURL), "token": .string(account.token)]))
    } else {
        print("signed up as \(account.name) (\(account.userRecordName)) on \(account.serverURL)")
        print("home: \(engine.home)")
        print("token: \(account.token)")
        print("another device signs in with lattice login --server \(account.serverURL) there and "
              + "lattice devices approve CODE here (or --token TOKEN)")
    }
}

func runLogIn(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, valueOptions: ["server", "token", "name"], flagOptions: ["web"])
    if options.help { return print(loginUsage) }
    _ = try options.operands(options.positionals)
    if options.parsed.flag("web") { return try runWebLogIn(options) }
    let server = try serverOption(options)
    guard let token = try options.parsed.value("token") else {
        // No token: another device of the account approves a one-time code (DeviceCommands.swift).
        return try runDeviceLogIn(options, server: server)
    }
    if try options.parsed.value("name") != nil { throw UsageError("--name names a device signed in with a code: omit --token") }
    guard !token.isEmpty else { throw UsageError("--token needs a token") }
    let engine = try options.openEngine(creating: true)
    try checkSwitch(engine, server: server) { server in
        let client = ServerClient(transport: try HTTPTransport(serverURL: server)).blocking
        return CurrentUserResponse(json: try client.call("private", "users/current", CurrentUserRequest().json, token: token))?
            .userRecordName
    }
    let account = try waitForAsyncWork { try await AccountClient(serverURL: server).signIn(token: token) }
    try waitForAsyncWork { try await engine.signIn(account) }
    let outcome = options.noSync ? SyncOutcome() : try syncAfterChange(engine, Lists(replica: engine), options)
    if options.json {
        printJSON(.object(["name": .string(account.name), "userRecordName": .string(account.userRecordName),
                           "server": .string(account.serverURL)]))
    } else {
        print("signed in as \(account.name) (\(account.userRecordName)) on \(account.serverURL)")
        if outcome.synced { print("\(try Lists(replica: engine).all().count) lists on this device") }
    }
    try outcome.finish()
}

func runLogOut(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, flagOptions: ["force", "local"])
    if options.help { return print(logoutUsage) }
    _ = try options.operands(options.positionals)
    let engine = try options.openEngine()
    guard let account = engine.account else { throw CommandFailure(SyncError.notSignedIn.description) }
    let pending = try engine.pendingCount()
    if pending > 0, !options.parsed.flag("force") {
        throw CommandFailure("this home holds \(pending) unsent \(plural(pending, "change")) of \(account.name); "
                             + "run lattice sync first, or lattice logout --force to drop them")
    }
    let local = options.parsed.flag("local")
    // Revoked on the server first: when the server cannot be reached, nothing is forgotten here.
    let revoked: Bool
    do {
        revoked = local ? false : try waitForAsyncWork {
            try await AccountClient(serverURL: account.serverURL).revokeToken(of: account)
        }
    } catch let error as TransportError {
        throw CommandFailure("cannot reach \(account.serverURL) (\(error.description)): the token was not revoked and "
                             + "this home stays signed in; run lattice logout again when the server is reachable, or "
                             + "lattice logout --local to forget the token here only (it then stays valid until "
                             + "revoked, for example with lattice admin revoke-token)")
    }
    try waitForAsyncWork { try await engine.signOut() }
    let state = local ? "kept on the server (not revoked)" : revoked ? "revoked" : "already revoked or expired"
    if options.json {
        printJSON(.object(["name": .string(account.name), "server": .string(account.serverURL),
                           "token": .string(local ? "kept" : revoked ? "revoked" : "invalid")]))
    } else {
        print("signed out of \(account.name) on \(account.serverURL); the token is \(state)")
    }
}

func runWhoAmI(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments)
    if options.help { return print(whoamiUsage) }
    _ = try options.operands(options.positionals)
    let engine = try options.openEngine()
    guard let account = engine.account else { throw CommandFailure(SyncError.notSignedIn.description) }
    let pending = try engine.pendingCount()
    if options.json {
        printJSON(.object(["name": .string(account.name), "userRecordName": .string(account.userRecordName),
                           "server": .string(account.serverURL), "home": .string(engine.home),
                           "pending": .int(Int64(pending))]))
    } else {
        for line in alignedRows([["user", "\(account.name) (\(account.userRecordName))"],
                                 ["server", account.serverURL],
                                 ["home", engine.home],
                                 ["pending", "\(pending) \(plural(pending, "change"))"]]) {
            print(line)
        }
    }
}

func runSync(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments)
    if options.help { return print(syncUsage) }
    _ = try options.operands(options.positionals)
    if options.noSync { throw UsageError("--no-sync and lattice sync contradict each other") }
    let (engine, lists) = try options.openLists()
    let labels = try RecordLabels(lists)
    let report = try waitForAsyncWork { try await engine.sync() }
    let refusals = labels.refusals(report)
    if options.json {
        printJSON(.object([
            "online": .bool(report.online), "sent": .int(Int64(report.sent)), "fetched": .int(Int64(report.fetched)),
            "pending": .int(Int64(report.queued)),
            "rejected": .array(report.rejected.map { rejected in
                .object(["id": .string(rejected.recordName), "zone": .string(rejected.zone),
                         "code": .string(rejected.code), "reason": .string(rejected.reason)])
            }),
            "removedZones": .array(report.removedZones.map { removed in
                .object(["database": .string(removed.database), "zone": .string(removed.zone),
                         "owner": .string(removed.owner)])
            }),
            "noLongerShared": .array(labels.noLongerShared(report)),
            "droppedEdits": .array(labels.droppedEdits(report)),
            "notNow": report.notNow.map { error in
                .object(["code": .string(error.serverErrorCode ?? error.code.rawValue), "reason": .string(error.reason),
                         "retryAfter": error.retryAfter.map { .int(Int64($0.rounded(.up))) } ?? .null])
            } ?? .null,
        ]))
    } else if report.online && report.notNow == nil {
        var line = "synced: sent \(report.sent) \(plural(report.sent, "change")), fetched \(report.fetched) "
            + plural(report.fetched, "record")
        if report.queued > 0 { line += "; \(report.queued) still pending" }
        print(line)
    }
    for line in labels.removals(report) { writeStandardError(line + "\n") }
    if !report.online {
        let server = engine.account?.serverURL ?? "the server"
        throw CommandFailure("cannot reach \(server): \(report.queued) \(plural(report.queued, "change")) stay queued")
    }
    if let notNow = report.notNow { throw CommandFailure(notNowLine(notNow, queued: report.queued)) }
    try SyncOutcome(synced: true, pending: report.queued, refusals: refusals).finish()
}

/// `lattice login --web`: asks the server, with this home's token, for a one-time link that signs a
/// browser in to the same account (`tokens/signinLink`), and prints it. The link works once, for ten
/// minutes; it is never a bearer token.
private func runWebLogIn(_ options: ClientOptions) throws {
    if try options.parsed.value("server") != nil || options.parsed.value("token") != nil || options.parsed.value("name") != nil {
        throw UsageError("--web signs a browser in to this home's account: give neither --server, --token nor --name")
    }
    let engine = try options.openEngine()
    guard let account = engine.account else { throw CommandFailure(SyncError.notSignedIn.description) }
    let reply = try callServer(engine, "private", "tokens/signinLink", SignInLinkRequest().json)
    guard let link = SignInLinkResponse(json: reply) else { throw CommandFailure("the server sent no sign-in link") }
    if options.json {
        var object: [String: JSON] = ["url": .string(link.url), "name": .string(account.name)]
        if let expires = link.info.expiresMs { object["expires"] = .int(expires) }
        return printJSON(.object(object))
    }
    print(link.url)
    writeStandardError("open this link in a browser to sign in as \(account.name); it works once, within 10 minutes\n")
}
