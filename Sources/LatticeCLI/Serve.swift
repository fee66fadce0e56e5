import Dispatch
import Foundation
import LatticeServer

let serveUsage = """
    usage: lattice serve --data DIR [--host 127.0.0.1] [--port 8080] [--public-url URL]
                         [--container NAME] [--registration open|closed] [--tombstone-horizon-days N]
                         [--signup-per-address N] [--signup-global N] [--auth-failures-per-minute N]
                         [--token-lifetime SECONDS] [--disk-budget BYTES] [--client-operations-per-user N]

    Runs the Lattice sync service on embedded SQLite, with everything under DIR (created if missing).
    Prints "listening on http://HOST:PORT" once it accepts requests. SIGINT or SIGTERM stop it
    gracefully: open long polls are answered, in-flight requests finish, the database closes cleanly.

      --data DIR                 the data directory (required)
      --host ADDRESS             IPv4 address to bind (default 127.0.0.1)
      --port PORT                TCP port, 0 for any free one (default 8080)
      --public-url URL           the URL clients reach this server at (default http://HOST:PORT)
      --container NAME           the container served at /database/1/NAME/... (default lattice)
      --registration MODE        open: POST /auth/signup creates accounts (default);
                                 closed: only `lattice admin add-user` does
      --tombstone-horizon-days N deleted records are purged after N days (default 30); older sync
                                 tokens then get CHANGE_TOKEN_EXPIRED
      --signup-per-address N     accounts POST /auth/signup makes per client address per hour
                                 (default 5; 0: no limit); counted in the database
      --signup-global N          accounts POST /auth/signup makes per hour in all (default 100; 0: no limit)
      --auth-failures-per-minute N
                                 bad or expired tokens one address may send per minute, in a burst of N,
                                 before its bad tokens get THROTTLED instead of 401 (default 20; 0: off)
      --token-lifetime SECONDS   the longest a bearer token lives; tokens asking for more or for no
                                 expiry get this one (default: tokens live until revoked)
      --disk-budget BYTES        server-wide budget for the database file plus WAL (suffix K, M, G or T
                                 allowed); over it, writes that add data get QUOTA_EXCEEDED while reads
                                 and deletions work (default: none)
      --client-operations-per-user N
                                 clientOperationIDs remembered per user for retries; the oldest is
                                 forgotten first (default 1000)
    """

func runServe(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data", "host", "port", "public-url", "container",
                                                               "registration", "tombstone-horizon-days",
                                                               "signup-per-address", "signup-global",
                                                               "auth-failures-per-minute", "token-lifetime",
                                                               "disk-budget", "client-operations-per-user"],
                                     flagOptions: [])
    if parsed.flag("help") {
        print(serveUsage)
        return
    }
    guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument \(parsed.positionals[0])") }
    guard let data = try parsed.value("data") else { throw UsageError("--data DIR is required") }
    var options = ServerProcess.Options(dataDirectory: data)
    options.http.host = try parsed.value("host") ?? "127.0.0.1"
    options.http.port = UInt16(try parsed.integer("port", in: 0...65535) ?? 8080)
    if let container = try parsed.value("container") {
        guard !container.isEmpty, !container.contains("/") else { throw UsageError("--container must be a name without /") }
        options.service.container = container
    }
    switch try parsed.value("registration") ?? "open" {
    case "open": options.service.registrationOpen = true
    case "closed": options.service.registrationOpen = false
    default: throw UsageError("--registration must be open or closed")
    }
    if let days = try parsed.integer("tombstone-horizon-days", in: 1...36500) {
        options.service.tombstoneHorizonMilliseconds = Int64(days) * 24 * 3_600_000
    }
    try applyAccountOptions(parsed, to: &options.service)
    let publicURL = try parsed.value("public-url")
    if let publicURL, URL(string: publicURL)?.scheme == nil {
        throw UsageError("--public-url must be an absolute URL such as https://lattice.example.com")
    }

    umask(0o077) // the database holds token hashes: owner-only files

    // Signals are taken by dispatch sources, not handlers: nothing runs in signal context.
    signal(SIGINT, SIG_IGN)
    signal(SIGTERM, SIG_IGN)
    let stopRequested = DispatchSemaphore(value: 0)
    let sources = [SIGINT, SIGTERM].map { number in
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { stopRequested.signal() }
        source.resume()
        return source
    }

    options.publicURL = publicURL
    let server = try ServerProcess(options)
    print("listening on \(server.url)")
    fflush(nil) // flush stdout: a supervisor reading the pipe sees the line now
    stopRequested.wait()
    FileHandle.standardError.write(Data("lattice: shutting down\n".utf8))
    server.stop()
    sources.forEach { $0.cancel() }
}

/// The sign-up, authentication, token, disk-budget and replay-cache flags of `lattice serve`.
private func applyAccountOptions(_ parsed: ParsedArguments, to service: inout ServiceConfiguration) throws {
    if let count = try parsed.integer("signup-per-address", in: 0...1_000_000) {
        service.signUpsPerAddress = count == 0 ? nil : count
    }
    if let count = try parsed.integer("signup-global", in: 0...100_000_000) {
        service.signUpsGlobal = count == 0 ? nil : count
    }
    if let count = try parsed.integer("auth-failures-per-minute", in: 0...1_000_000) {
        service.failedAuthenticationLimit = count == 0
            ? nil : ServiceConfiguration.RateLimit(requestsPerSecond: Double(count) / 60, burst: Double(count))
    }
    if let seconds = try parsed.integer("token-lifetime", in: 60...315_360_000) {
        service.maximumTokenLifetimeSeconds = Int64(seconds)
    }
    if let text = try parsed.value("disk-budget") {
        service.diskBudgetBytes = try byteCount(text, option: "--disk-budget")
    }
    if let count = try parsed.integer("client-operations-per-user", in: 1...1_000_000) {
        service.maximumClientOperationsPerUser = count
    }
}

/// `123`, `64K`, `512M`, `2G`, `1T` (powers of 1024).
private func byteCount(_ text: String, option: String) throws -> Int64 {
    let multipliers: [Character: Int64] = ["K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40]
    var digits = text.uppercased()
    var multiplier: Int64 = 1
    if let last = digits.last, let found = multipliers[last] {
        multiplier = found
        digits.removeLast()
    }
    guard let value = Int64(digits), value > 0, value <= Int64.max / multiplier else {
        throw UsageError("\(option) must be a positive number of bytes, optionally with K, M, G or T")
    }
    return value * multiplier
}
