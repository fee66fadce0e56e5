import Foundation
import LatticeAPI
import LatticeCore
import LatticeLists
import LatticeSync
#if canImport(Glibc)
import Glibc
#endif

// lattice login --server URL (without --token): this device signs in with a one-time code another device
// approves; lattice devices: the account's devices and tokens, approving a code, revoking one.

let devicesUsage = """
    usage: lattice devices [--home DIR] [--json]
           lattice devices approve CODE [--name NAME] [--home DIR] [--json]
           lattice devices deny CODE [--home DIR] [--json]
           lattice devices revoke ID [--home DIR] [--json]

    lattice devices: the account's devices and tokens (bearer tokens, devices signed in with a code,
      browser sessions, unused sign-in links): id, kind, name, created, expiry; "this device" marks the
      token of this home. --json: [{"id","kind","name","created","expires","expired","thisDevice"}]
    approve CODE: lets the device showing CODE (from lattice login --server URL on it) into this account;
      it then gets a token of its own. --name names it in this list (default: the name it sent).
      --json: {"userCode","deviceName","approved","expires"}
    deny CODE: refuses it; the other device stops waiting.
    revoke ID: revokes that token at once (the device using it is signed out; an id prefix works when it
      names one token). --json: {"id","revoked"}

    \(clientOptionsHelp)
    """

/// `lattice login --server URL [--name NAME]`: RFC 8628's device flow. Asks the server for a device
/// authorization, shows its user code and how to approve it, polls at the server's interval (slower after
/// SLOW_DOWN) until it is approved, denied or expired, then keeps the device's own token in this home as
/// `lattice login --token` does.
func runDeviceLogIn(_ options: ClientOptions, server: String) throws {
    let engine = try options.openEngine(creating: true)
    let client = ServerClient(transport: try HTTPTransport(serverURL: server))
    let name = try options.parsed.value("name") ?? defaultDeviceName()
    // Over the waiting sign-ins of this address the wait is minutes: say so at once rather than retry.
    var once = client
    once.maximumAttempts = 1
    let reply = try once.blocking.post("/auth/device/start", DeviceStartRequest(deviceName: name).json, token: nil)
    guard let started = DeviceStartResponse(json: reply), reply["expiresIn"]?.intValue != nil else {
        throw CommandFailure("the server sent no device sign-in code (is \(server) a Lattice server?)")
    }
    let (deviceCode, userCode, expiresIn) = (started.deviceCode, started.userCode, started.expiresIn)
    var interval = max(1, reply["interval"] == nil ? 5 : started.interval)
    notice("to sign this device (\(name)) in, run this on a device already signed in to the account:", options)
    notice("", options)
    notice("    lattice devices approve \(userCode)", options)
    notice("", options)
    if started.verificationURI.hasSuffix("/web/devices.html") {
        notice("or open \(started.verificationURI) in a browser signed in to the account and type the code there", options)
    }
    notice("the code works once, within \(max(1, expiresIn / 60)) minutes; waiting for the approval (Ctrl-C stops)", options)
    fflush(nil) // flush stdout: the code must show now, also when stdout is a pipe
    let deadline = Date().addingTimeInterval(Double(expiresIn) + 30)
    var token: String?
    // Bounded by the code's lifetime: the server answers EXPIRED_TOKEN after it.
    while token == nil {
        guard Date() < deadline else { throw CommandFailure("the code \(userCode) expired before it was approved") }
        Thread.sleep(forTimeInterval: Double(interval))
        do {
            token = DeviceTokenResponse(json: try client.blocking.post("/auth/device/token",
                                                              DeviceTokenRequest(deviceCode: deviceCode).json, token: nil))?.token
            if token == nil { throw CommandFailure("the server answered the approved sign-in without a token") }
        } catch let error as ServerError {
            switch error.serverErrorCode {
            case .authorizationPending?:
                continue
            case .slowDown?:
                interval = max(interval + 5, Int64(error.retryAfter ?? 0))
            case .accessDenied?:
                throw CommandFailure("the sign-in was denied on the other device")
            case .expiredToken?:
                throw CommandFailure("the code \(userCode) expired or was used; run lattice login --server \(server) again")
            default:
                throw error
            }
        }
    }
    guard let token else { return }
    do {
        try checkSwitch(engine, server: server) { server in
            let client = ServerClient(transport: try HTTPTransport(serverURL: server)).blocking
            return CurrentUserResponse(json: try client.call("private", "users/current", CurrentUserRequest().json, token: token))?
                .userRecordName
        }
    } catch {
        // This home keeps its account: the new token is not left behind unused.
        try? client.blocking.revokeToken(token)
        throw error
    }
    let account = try waitForAsyncWork { try await AccountClient(serverURL: server).signIn(token: token) }
    try waitForAsyncWork { try await engine.signIn(account) }
    let outcome = options.noSync ? SyncOutcome() : try syncAfterChange(engine, Lists(replica: engine), options)
    if options.json {
        printJSON(.object(["name": .string(account.name), "userRecordName": .string(account.userRecordName),
                           "server": .string(account.serverURL), "deviceName": .string(name)]))
    } else {
        print("signed in as \(account.name) (\(account.userRecordName)) on \(account.serverURL) as device \(name)")
        if outcome.synced { print("\(try Lists(replica: engine).all().count) lists on this device") }
    }
    try outcome.finish()
}

/// The host's name, as the device names itself unless `--name` says otherwise.
private func defaultDeviceName() -> String {
    var buffer = [CChar](repeating: 0, count: 256)
    guard gethostname(&buffer, buffer.count - 1) == 0 else { return "device" }
    let name = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    return name.isEmpty ? "device" : String(name.prefix(64))
}

func runDevices(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, valueOptions: ["name"])
    if options.help { return print(devicesUsage) }
    let subcommand = options.positionals.first
    if subcommand != "approve" { try options.allowOnly([], in: "devices \(subcommand ?? "")") }
    // Usage first, then the home: a mistake is a usage error even where no one is signed in.
    let operand: String?
    switch subcommand {
    case nil: operand = try options.operands(options.positionals).first
    case "approve", "deny": operand = try options.operands(Array(options.positionals.dropFirst()), "CODE")[0]
    case "revoke": operand = try options.operands(Array(options.positionals.dropFirst()), "ID")[0]
    case let other?: throw UsageError("unknown subcommand devices \(other)")
    }
    let (engine, _) = try options.openLists()
    switch subcommand {
    case nil:
        try listDevices(engine, options)
    case "approve", "deny":
        let code = operand ?? ""
        let request = DeviceApproveRequest(userCode: code, deny: subcommand == "deny",
                                           deviceName: try options.parsed.value("name"))
        guard let account = engine.account else { throw CommandFailure(SyncError.notSignedIn.description) }
        var client = ServerClient(transport: try HTTPTransport(serverURL: account.serverURL))
        client.maximumAttempts = 1 // too many wrong codes is a wait of up to an hour: said at once, not retried
        let reply = try client.blocking.post("/auth/device/approve", request.json, token: account.token)
        if options.json { return printJSON(reply) }
        let answer = DeviceApproveResponse(json: reply)
        let device = answer?.deviceName ?? "the device"
        if answer?.approved == true {
            print("approved \(device) (\(answer?.userCode ?? code)): it signs in within a few seconds")
        } else {
            print("denied \(device) (\(answer?.userCode ?? code))")
        }
    case "revoke":
        let wanted = operand ?? ""
        let tokens = try listTokens(engine)
        let ids = tokens.map(\.info.tokenID)
        let matches = ids.contains(wanted) ? [wanted] : ids.filter { $0.hasPrefix(wanted) }
        guard matches.count == 1, let id = matches.first else {
            throw CommandFailure(matches.isEmpty ? "no device or token \(wanted) in this account (lattice devices lists them)"
                                 : "\(wanted) names \(matches.count) tokens: \(matches.joined(separator: ", "))")
        }
        let isThisDevice = tokens.first { $0.info.tokenID == id }?.current == true
        let reply = try callServer(engine, "private", "tokens/revoke", TokensRevokeRequest(tokenIDs: [id]).json)
        let first = TokensRevokeResponse(json: reply)?.tokens.first
        guard let first, first.revoked else {
            throw CommandFailure("the server did not revoke \(id): " + (first?.error?.reason ?? "no reason given"))
        }
        if options.json { return printJSON(.object(["id": .string(id), "revoked": .bool(true)])) }
        print("revoked \(id): the device using it is signed out")
        if isThisDevice { writeStandardError("that was this device's own token: sign in again with lattice login\n") }
    default:
        break // refused above
    }
}

private func listDevices(_ engine: ListsReplica, _ options: ClientOptions) throws {
    let tokens = try listTokens(engine)
    func time(_ ms: Int64?) -> String {
        guard let ms else { return "never" }
        let formatter = ISO8601DateFormatter()
        formatter.formatOptions = [.withFullDate, .withTime, .withColonSeparatorInTime, .withDashSeparatorInDate]
        return formatter.string(from: Date(timeIntervalSince1970: Double(ms) / 1000)) + "Z"
    }
    if options.json {
        return printJSON(.array(tokens.map { token in
            .object(["id": .string(token.info.tokenID), "kind": .string(token.kind), "created": .int(token.info.createdMs),
                     "expired": .bool(token.expired), "thisDevice": .bool(token.current),
                     "name": token.info.deviceName.map(JSON.string) ?? .null,
                     "expires": token.info.expiresMs.map(JSON.int) ?? .null])
        }))
    }
    var rows = [["ID", "KIND", "NAME", "CREATED", "EXPIRES", ""]]
    for token in tokens {
        let expires = token.expired ? "expired" : time(token.info.expiresMs)
        rows.append([token.info.tokenID, token.kind, token.info.deviceName ?? "-", time(token.info.createdMs), expires,
                     token.current ? "this device" : ""])
    }
    alignedRows(rows).forEach { print($0) }
}

/// The account's tokens (`tokens/list`), oldest first.
private func listTokens(_ engine: ListsReplica) throws -> [TokenListing] {
    TokensListResponse(json: try callServer(engine, "private", "tokens/list", TokensListRequest().json))?.tokens ?? []
}
