import Dispatch
import Foundation
import LatticeOperations
import LatticeServer

let serveUsage = """
    usage: lattice serve --data DIR [--host 127.0.0.1] [--port 8080] [--public-url URL]
           lattice serve --database URL --public-url URL [--node-name NAME] [--database-pool N] ...
                         [--container NAME] [--registration open|closed] [--tombstone-horizon-days N]
                         [--trusted-proxy ADDRESS|CIDR]... [--access-log PATH|off]
                         [--oidc-issuer URL --oidc-client-id ID [--oidc-client-secret-file PATH]]...
                         [--connections N] [--per-address-connections N] [--workers N]
                         [--workers-per-client N] [--queue-wait S] [--header-timeout S] [--body-timeout S]
                         [--body-budget-mib N] [--parked-waits-per-user N] [--shutdown-grace S]
                         [--push-streams-per-user N] [--push-streams-per-address N] [--push-heartbeat S]
                         [--connection-memory-kib N]
                         [--webhook-private-addresses allow|refuse] [--webhook-attempts N]
                         [--webhook-retry-ms N] [--webhook-timeout S] [--webhook-concurrency N]
                         [--asset-max-mib N] [--upload-timeout S] [--asset-upload-hours N]
                         [--asset-grace-hours N] [--asset-url-seconds N] [--open-uploads-per-user N]
                         [--signup-per-address N] [--signup-global N] [--auth-failures-per-minute N]
                         [--token-lifetime SECONDS] [--disk-budget BYTES] [--client-operations-per-user N]
                         [--quota-per-database BYTES] [--requests-per-second-per-account N]
                         [--device-sign-ins-per-address N] [--device-sign-ins-global N]
                         [--device-approval-failures-per-account N] [--device-approval-failures-per-address N]

    Runs the Lattice sync service on embedded SQLite, with everything under DIR (created if missing),
    or as one node of several on a PostgreSQL database. Prints "listening on http://HOST:PORT" once it
    accepts requests. SIGINT or SIGTERM stop it gracefully: open long polls are answered, in-flight
    requests finish, the database closes cleanly.

      --data DIR                 the data directory (SQLite; locked: one server per directory)
      --database URL             a PostgreSQL database instead (default $LATTICE_DATABASE_URL when
                                 --data is not given): postgresql://USER@HOST:PORT/DBNAME?sslmode=...
                                 or libpq key=value pairs (host=/run/postgresql dbname=lattice); a
                                 password comes from the URL, PGPASSWORD or ~/.pgpass and is never
                                 printed. Any number of nodes may serve one database at once
      --node-name NAME           this node's name (default main): each node has its own replica id
                                 and clock in the database; a second live process with the same name
                                 is refused
      --database-pool N          connections to the database (default 2 x cores), besides one kept
                                 for authentication
      --host ADDRESS             IPv4 address to bind (default 127.0.0.1)
      --port PORT                TCP port, 0 for any free one (default 8080)
      --public-url URL           the URL clients reach this server at (default http://HOST:PORT).
                                 Required with --database: share links are checked against it, so
                                 every node must be given the same one; the first node stores it in
                                 the database and a node started with another is refused
      --container NAME           the container served at /database/1/NAME/... (default lattice)
      --registration MODE        open: POST /auth/signup creates accounts (default);
                                 closed: only `lattice admin add-user` does
      --oidc-issuer URL          an OpenID Connect provider people may sign in with (its issuer, as
                                 its discovery document names it); repeatable, each followed by its
      --oidc-client-id ID        client id at that provider (this server's redirect URI there is
                                 PUBLIC-URL/auth/oidc/callback), and, for a confidential client,
      --oidc-client-secret-file PATH  a file holding its client secret (one line), after its
                                 --oidc-issuer; a public client has none
      --tombstone-horizon-days N deleted records are purged after N days (default 30); older sync
                                 tokens then get CHANGE_TOKEN_EXPIRED
      --signup-per-address N     accounts POST /auth/signup makes per client address per hour
                                 (default 5; 0: no limit); counted in the database
      --signup-global N          accounts POST /auth/signup makes per hour in all (default 100; 0: no limit)
      --auth-failures-per-minute N
                                 failed sign-ins (bad or expired tokens, sign-in links, session cookies,
                                 device codes) one address may make per minute, in a burst of N, before
                                 they get THROTTLED instead of 401 (default 20; 0: off)
      --token-lifetime SECONDS   the longest a bearer token lives; tokens asking for more or for no
                                 expiry get this one (default: tokens live until revoked)
      --disk-budget BYTES        server-wide budget for the data on disk (suffix K, M, G or T allowed):
                                 SQLite's database file plus WAL, or PostgreSQL's pg_database_size (no
                                 WAL, no other database), measured at most once a second per node; over
                                 it, writes that add data get QUOTA_EXCEEDED while reads and deletions
                                 work (default: none)
      --client-operations-per-user N
                                 clientOperationIDs remembered per user for retries; the oldest is
                                 forgotten first (default 1000)
      --quota-per-database BYTES stored records and assets per database (a user's private one, or the public
                                 one; suffix K, M, G or T allowed); a write past it gets QUOTA_EXCEEDED
                                 (default 1G)
      --requests-per-second-per-account N
                                 requests one account (before sign-in: one client address) may make per
                                 second, in a burst of 2N, before getting 429 THROTTLED (default 200;
                                 0: off); in memory, per process
      --device-sign-ins-per-address N
                                 device sign-ins (lattice login --server URL) waiting at once from one
                                 client address (default 10; 0: no limit); counted in the database
      --device-sign-ins-global N device sign-ins waiting at once on the server, every node together
                                 (default 1000; 0: no limit)
      --device-approval-failures-per-account N
                                 wrong device codes one account may try to approve per hour (default 10)
      --device-approval-failures-per-address N
                                 wrong device codes per client address per hour (default 20)

    Bounds on each request (over a cap: LIMIT_EXCEEDED, checked before any work):
      --request-deadline SECONDS how long one request may work (default 10); past it storage work is
                                 interrupted and rolled back, and the client gets TRY_AGAIN_LATER
                                 (a parked changes/wait is not working)
      --reader-connections N     SQLite reader connections for requests (default 4), besides one kept
                                 for authentication (with --database: --database-pool)
      --max-response-bytes N     bytes of records per answer of a query, lookup or feed (default
                                 8388608); feeds and queries stop there with moreComing
      --max-query-filters N      filters per records/query (default 64)
      --max-query-sort-keys N    sort keys per records/query (default 8)
      --max-filter-values N      values per IN or NOT_IN filter (default 10000)
      --max-list-elements N      elements per list field of a write (default 50000)
      --max-fields-per-record N  fields per record of a write (default 1000)

    Connections and limits:
      --trusted-proxy ADDRESS    a reverse proxy (IPv4 or IPv6 address or CIDR such as 10.0.0.0/8 or
                                 2001:db8::/32; repeatable) whose X-Forwarded-For is believed: its
                                 right-most address that is not itself a trusted proxy is the client's
                                 for limits, throttles and the access log. Ignored from anyone else.
                                 The proxy's own connections are exempt from the per-address limit.
                                 Per-address limits count an IPv6 client by its /64
      --access-log PATH          one line per request (time, client, method, path, status, duration,
                                 bytes) appended to PATH; default stderr; off for none
      --connections N            simultaneous connections in total (default 4096, lowered to fit the
                                 open-file limit, which serve raises to its hard limit)
      --per-address-connections N  connections from one address (default 64); through a trusted
                                 proxy, requests in flight per forwarded client
      --workers N                threads running requests (default 2 x cores, at least 4)
      --workers-per-client N     requests of one account (or address before sign-in) running at once
                                 (default workers / 4, at least 2, fewer than all); the rest wait in
                                 line, served fairly
      --queue-wait S             seconds a request may wait in line for a worker (default 5); past it
                                 it gets 503 TRY_AGAIN_LATER with Retry-After
      --header-timeout S         seconds to send complete request headers, from connecting or from
                                 the previous answer (default 10): slow senders are dropped
      --body-timeout S           seconds to send a request body (default 60); a body must also average
                                 4 KiB/s after its first 5 s
      --body-budget-mib N        MiB of request bodies buffered at once, server-wide (default 64);
                                 past it new requests get 503 TRY_AGAIN_LATER with Retry-After
      --parked-waits-per-user N  changes/wait requests one account may have parked (default 8);
                                 more get 429 THROTTLED
      --connection-memory-kib N  KiB libmicrohttpd may use per connection for headers and buffers
                                 (default 128); what an idle push stream holds at most
      --push-streams-per-user N  push streams (GET /push/{token}) one account may hold open (default
                                 32; one per device); more get 429 THROTTLED
      --push-streams-per-address N  push streams one client address may hold open (default 256)
      --push-heartbeat S         seconds between keep-alive comments on push streams, and checks of
                                 their push tokens (default 30)
      --webhook-private-addresses allow|refuse  whether webhooks may go to loopback, private or
                                 reserved addresses (default refuse)
      --webhook-attempts N       attempts before a webhook delivery is dead-lettered (default 12)
      --webhook-retry-ms N       the first retry's delay; each later one doubles, up to an hour
                                 (default 2000)
      --webhook-timeout S        seconds one webhook attempt may take (default 10)
      --webhook-concurrency N    webhook deliveries this node sends at once (default 4)
      --asset-max-mib N          the largest asset, in MiB (default 50); a larger declared upload is
                                 refused (413 LIMIT_EXCEEDED) before its body is read
      --upload-timeout S         seconds one request may take to send an asset's bytes (default 1800);
                                 it must also average 4 KiB/s; an upload cut by it resumes
      --asset-upload-hours N     hours an upload URL stays usable (default 24); an incomplete upload is
                                 then removed with its bytes
      --asset-grace-hours N      hours an asset no record references is kept before it is collected
                                 (default 24), and how long an upload's right to save it lasts
      --asset-url-seconds N      seconds a download URL works (default 3600)
      --open-uploads-per-user N  incomplete uploads one account may have (default 200)
      --shutdown-grace S         seconds in-flight requests get to finish on SIGTERM (default 10); if
                                 the process is still stopping 5 s later, it exits anyway (status 1)
    """

func runServe(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data", "database", "node-name", "database-pool", "host", "port", "public-url", "container",
                                                               "registration", "tombstone-horizon-days",
                                                               "request-deadline", "reader-connections",
                                                               "max-response-bytes", "max-query-filters",
                                                               "max-query-sort-keys", "max-filter-values",
                                                               "max-list-elements", "max-fields-per-record",
                                                               "trusted-proxy", "access-log", "connections",
                                                               "oidc-issuer", "oidc-client-id", "oidc-client-secret-file",
                                                               "per-address-connections", "workers",
                                                               "workers-per-client", "queue-wait", "header-timeout", "body-timeout",
                                                               "body-budget-mib", "parked-waits-per-user",
                                                               "shutdown-grace", "push-streams-per-user",
                                                               "connection-memory-kib",
                                                               "push-streams-per-address", "push-heartbeat",
                                                               "webhook-private-addresses", "webhook-attempts",
                                                               "webhook-retry-ms", "webhook-timeout", "webhook-concurrency",
                                                               "asset-max-mib", "upload-timeout", "asset-upload-hours",
                                                               "asset-grace-hours", "asset-url-seconds", "open-uploads-per-user",
                                                               "signup-per-address", "signup-global",
                                                               "auth-failures-per-minute", "token-lifetime",
                                                               "disk-budget", "client-operations-per-user",
                                                               "quota-per-database", "requests-per-second-per-account",
                                                               "device-sign-ins-per-address", "device-sign-ins-global",
                                                               "device-approval-failures-per-account",
                                                               "device-approval-failures-per-address"],
                                     flagOptions: [])
    if parsed.flag("help") {
        print(serveUsage)
        return
    }
    guard parsed.positionals.isEmpty else { throw UsageError("unexpected argument \(parsed.positionals[0])") }
    var options = ServerProcess.Options(storage: try storageLocation(parsed))
    if let name = try parsed.value("node-name") {
        if let problem = StorageLocation.nodeNameProblem(name) { throw UsageError(problem) }
        options.service.nodeName = name
    }
    options.http.host = try parsed.value("host") ?? "127.0.0.1"
    options.http.port = UInt16(try parsed.integer("port", in: 0...65535) ?? 8080)
    if let container = try parsed.value("container") {
        guard !container.isEmpty, !container.contains("/") else { throw UsageError("--container must be a name without /") }
        options.service.container = container
    }
    options.service.oidcProviders = try oidcProviders(parsed, arguments)
    switch try parsed.value("registration") ?? "open" {
    case "open": options.service.registrationOpen = true
    case "closed": options.service.registrationOpen = false
    default: throw UsageError("--registration must be open or closed")
    }
    if let days = try parsed.integer("tombstone-horizon-days", in: 1...36500) {
        options.service.tombstoneHorizonMilliseconds = Int64(days) * 24 * 3_600_000
    }
    try applyBoundsOptions(parsed, to: &options.service)
    try applyAccountOptions(parsed, to: &options.service)
    let publicURL = try parsed.value("public-url")
    if let publicURL, URL(string: publicURL)?.scheme == nil {
        throw UsageError("--public-url must be an absolute URL such as https://lattice.example.com")
    }
    if options.storage.isShared && publicURL == nil {
        throw UsageError("--public-url is required with --database: every node must serve one configured URL "
                         + "(share links are checked against it)")
    }

    try applyConnectionOptions(parsed, to: &options)

    umask(0o077) // the database holds token hashes: owner-only files

    // Signals are taken by dispatch sources, not handlers: nothing runs in signal context.
    signal(SIGINT, SIG_IGN)
    signal(SIGTERM, SIG_IGN)
    // Past a file-size limit (RLIMIT_FSIZE) a write fails with EFBIG instead of killing the process:
    // the write is refused as "disk full" and the server goes on serving.
    signal(SIGXFSZ, SIG_IGN)
    let stopRequested = DispatchSemaphore(value: 0)
    let sources = [SIGINT, SIGTERM].map { number in
        let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
        source.setEventHandler { stopRequested.signal() }
        source.resume()
        return source
    }

    options.publicURL = publicURL
    // The web client's files: $LATTICE_WEB_ROOT, else found from this binary (Docs/Web.md).
    options.service.webRoot = options.service.webRoot
        ?? StaticFiles.currentExecutablePath.flatMap(StaticFiles.webRoot(executablePath:))
    let server = try ServerProcess(options)
    print("listening on \(server.url)")
    fflush(nil) // flush stdout: a supervisor reading the pipe sees the line now
    stopRequested.wait()
    FileHandle.standardError.write(Data("lattice: shutting down\n".utf8))
    startShutdownWatchdog(after: options.http.shutdownGracePeriodSeconds + shutdownMarginSeconds)
    server.stop()
    sources.forEach { $0.cancel() }
}

/// The request bounds of `lattice serve` (see the usage text).
private func applyBoundsOptions(_ parsed: ParsedArguments, to service: inout ServiceConfiguration) throws {
    if let text = try parsed.value("request-deadline") {
        guard let seconds = Double(text), seconds >= 0.01, seconds <= 3600 else {
            throw UsageError("--request-deadline must be a number of seconds from 0.01 to 3600")
        }
        service.requestDeadlineMilliseconds = Int64((seconds * 1000).rounded())
    }
    if let count = try parsed.integer("reader-connections", in: 1...64) { service.storageReaderConnections = count }
    if let bytes = try parsed.integer("max-response-bytes", in: 65_536...(1 << 30)) { service.maximumResponseBytes = bytes }
    if let count = try parsed.integer("max-query-filters", in: 1...10_000) { service.maximumQueryFilters = count }
    if let count = try parsed.integer("max-query-sort-keys", in: 1...100) { service.maximumQuerySortKeys = count }
    if let count = try parsed.integer("max-filter-values", in: 1...1_000_000) { service.maximumFilterValues = count }
    if let count = try parsed.integer("max-list-elements", in: 1...1_000_000) { service.maximumListElements = count }
    if let count = try parsed.integer("max-fields-per-record", in: 1...100_000) { service.maximumFieldsPerRecord = count }
}

/// Seconds past the grace period after which a stop that is still stuck (a handler that does not return
/// holds the database) ends the process anyway.
let shutdownMarginSeconds = 5

/// Exits with status 1 if the process is still running `seconds` from now.
private func startShutdownWatchdog(after seconds: Int) {
    let thread = Thread {
        Thread.sleep(forTimeInterval: Double(seconds))
        let message = "lattice: still stopping \(seconds) s after the signal (a request is stuck); exiting without "
            + "a clean database close (SQLite recovers on the next start)\n"
        _ = message.withCString { write(2, $0, strlen($0)) }
        _exit(1)
    }
    thread.start()
}

/// The connection flags, the open-file limit raised to fit them, and the access log.
private func applyConnectionOptions(_ parsed: ParsedArguments, to options: inout ServerProcess.Options) throws {
    options.http.trustedProxies = parsed.values["trusted-proxy"] ?? []
    for proxy in options.http.trustedProxies where !HTTPServerConfiguration.isAddressOrBlock(proxy) {
        throw UsageError("--trusted-proxy must be an IPv4 or IPv6 address or CIDR block such as 10.0.0.0/8 or "
                         + "2001:db8::/32, not \(proxy)")
    }
    if let perAddress = try parsed.integer("per-address-connections", in: 1...1_000_000) {
        options.http.perIPConnectionLimit = perAddress
    }
    if let workers = try parsed.integer("workers", in: 1...4096) {
        options.http.workerThreads = workers
        options.http.workersPerClient = HTTPServerConfiguration.defaultWorkersPerClient(workerThreads: workers)
    }
    if let perClient = try parsed.integer("workers-per-client", in: 1...4096) {
        options.http.workersPerClient = perClient
    }
    if let seconds = try parsed.integer("queue-wait", in: 1...3600) { options.http.maximumQueueWaitMilliseconds = seconds * 1000 }
    if let seconds = try parsed.integer("header-timeout", in: 1...3600) { options.http.headerTimeoutSeconds = seconds }
    if let seconds = try parsed.integer("body-timeout", in: 1...3600) { options.http.bodyTimeoutSeconds = seconds }
    if let mebibytes = try parsed.integer("body-budget-mib", in: 1...1_048_576) {
        options.http.bodyBufferBudgetBytes = mebibytes * 1024 * 1024
    }
    if let waits = try parsed.integer("parked-waits-per-user", in: 1...10_000) {
        options.service.maximumParkedWaitsPerUser = waits
    }
    if let seconds = try parsed.integer("shutdown-grace", in: 0...3600) { options.http.shutdownGracePeriodSeconds = seconds }
    if let kibibytes = try parsed.integer("connection-memory-kib", in: 8...4_096) {
        options.http.connectionMemoryLimit = kibibytes * 1024
    }
    if let streams = try parsed.integer("push-streams-per-user", in: 1...100_000) {
        options.service.maximumPushStreamsPerUser = streams
    }
    if let streams = try parsed.integer("push-streams-per-address", in: 1...1_000_000) {
        options.service.maximumPushStreamsPerAddress = streams
    }
    if let seconds = try parsed.integer("push-heartbeat", in: 1...3600) { options.service.pushHeartbeatSeconds = seconds }
    if let choice = try parsed.value("webhook-private-addresses") {
        guard choice == "allow" || choice == "refuse" else {
            throw UsageError("--webhook-private-addresses takes allow or refuse")
        }
        options.service.webhooks.allowsPrivateAddresses = choice == "allow"
    }
    if let attempts = try parsed.integer("webhook-attempts", in: 1...100) { options.service.webhooks.maximumAttempts = attempts }
    if let milliseconds = try parsed.integer("webhook-retry-ms", in: 10...3_600_000) {
        options.service.webhooks.retryBaseMilliseconds = Int64(milliseconds)
    }
    if let seconds = try parsed.integer("webhook-timeout", in: 1...300) { options.service.webhooks.timeoutSeconds = seconds }
    if let slots = try parsed.integer("webhook-concurrency", in: 1...256) { options.service.webhooks.concurrency = slots }
    if let mebibytes = try parsed.integer("asset-max-mib", in: 1...65_536) {
        options.service.assets.maximumAssetBytes = Int64(mebibytes) * 1024 * 1024
    }
    if let seconds = try parsed.integer("upload-timeout", in: 10...86_400) {
        options.http.streamedBodyTimeoutSeconds = seconds
        options.service.assets.leaseMilliseconds = Int64(seconds + 60) * 1000 // outlasts the longest request
    }
    if let hours = try parsed.integer("asset-upload-hours", in: 1...720) {
        options.service.assets.uploadLifetimeMilliseconds = Int64(hours) * 3_600_000
    }
    if let hours = try parsed.integer("asset-grace-hours", in: 1...720) {
        options.service.assets.graceMilliseconds = Int64(hours) * 3_600_000
    }
    if let seconds = try parsed.integer("asset-url-seconds", in: 10...604_800) {
        options.service.assets.downloadURLLifetimeSeconds = Int64(seconds)
    }
    if let uploads = try parsed.integer("open-uploads-per-user", in: 1...100_000) { options.service.assets.openUploadsPerUser = uploads }

    // Every connection is a file descriptor; so are the database, the log and each HTTP thread's poller.
    let reserve = 64 + 4 * options.http.threadPoolSize
    let available = raiseOpenFileLimit() - reserve
    if let connections = try parsed.integer("connections", in: 1...10_000_000) {
        guard connections <= available else {
            throw UsageError("--connections \(connections) does not fit the open-file limit (RLIMIT_NOFILE hard limit "
                             + "\(available + reserve), \(reserve) kept for the server): raise it (ulimit -Hn, "
                             + "LimitNOFILE= in systemd) or ask for at most \(max(available, 0))")
        }
        options.http.connectionLimit = connections
    } else if options.http.connectionLimit > available {
        guard available >= 16 else {
            throw UsageError("the open-file limit (RLIMIT_NOFILE) of \(available + reserve) is too low to serve; raise it")
        }
        FileHandle.standardError.write(Data("lattice: the open-file limit allows \(available) connections, not \(options.http.connectionLimit); serving at most \(available)\n".utf8))
        options.http.connectionLimit = available
    }
    guard options.http.perIPConnectionLimit <= options.http.connectionLimit else {
        throw UsageError("--per-address-connections \(options.http.perIPConnectionLimit) is over the total of "
                         + "\(options.http.connectionLimit) connections")
    }

    switch try parsed.value("access-log") {
    case "off"?:
        options.http.accessLog = nil
    case let path?:
        let descriptor = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw UsageError("cannot open the access log \(path): \(String(cString: strerror(errno)))")
        }
        let writer = AccessLogWriter(descriptor: descriptor)
        options.http.accessLog = { line in writer.append(line) }
    case nil:
        let writer = AccessLogWriter(descriptor: 2)
        options.http.accessLog = { line in writer.append(line) }
    }
}

/// Writes access-log lines from a thread of its own, so a log nobody reads fast enough (a full pipe)
/// never blocks a request: past 10,000 waiting lines new ones are dropped, and the count is written once
/// the writer catches up.
/// `@unchecked Sendable`: `condition` guards `waiting` and `dropped`; `descriptor` is immutable.
private final class AccessLogWriter: @unchecked Sendable {
    private let condition = NSCondition()
    private var waiting: [String] = []
    private var dropped = 0
    private let descriptor: Int32

    init(descriptor: Int32) {
        self.descriptor = descriptor
        let thread = Thread { [self] in run() }
        thread.name = "lattice-access-log"
        thread.start()
    }

    func append(_ line: String) {
        condition.lock()
        if waiting.count >= 10_000 {
            dropped += 1
        } else {
            waiting.append(line)
            condition.signal()
        }
        condition.unlock()
    }

    private func run() {
        while true {
            condition.lock()
            while waiting.isEmpty && dropped == 0 { condition.wait() }
            let lines = waiting
            let lost = dropped
            waiting = []
            dropped = 0
            condition.unlock()
            var text = lines.map { $0 + "\n" }.joined()
            if lost > 0 { text += "lattice: access log: \(lost) lines dropped (the log was not read fast enough)\n" }
            var bytes = Array(text.utf8)[...]
            while !bytes.isEmpty {
                let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
                if written < 0 && errno == EINTR { continue }
                if written <= 0 { break }
                bytes = bytes.dropFirst(written)
            }
        }
    }
}

/// Raises the soft open-file limit to the hard one; returns the soft limit now in force.
private func raiseOpenFileLimit() -> Int {
    var limit = rlimit()
    guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1024 }
    if limit.rlim_cur < limit.rlim_max {
        var raised = limit
        raised.rlim_cur = limit.rlim_max
        if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
    }
    return limit.rlim_cur == rlim_t.max ? 1 << 20 : Int(min(limit.rlim_cur, 1 << 30))
}

/// The sign-up, device sign-in, authentication, token, disk-budget, replay-cache, quota and request-rate
/// flags of `lattice serve`.
private func applyAccountOptions(_ parsed: ParsedArguments, to service: inout ServiceConfiguration) throws {
    if let count = try parsed.integer("signup-per-address", in: 0...1_000_000) {
        service.signUpsPerAddress = count == 0 ? nil : count
    }
    if let count = try parsed.integer("signup-global", in: 0...100_000_000) {
        service.signUpsGlobal = count == 0 ? nil : count
    }
    if let count = try parsed.integer("device-sign-ins-per-address", in: 0...1_000_000) {
        service.deviceAuthorizationsPerAddress = count == 0 ? nil : count
    }
    if let count = try parsed.integer("device-sign-ins-global", in: 0...100_000_000) {
        service.deviceAuthorizationsGlobal = count == 0 ? nil : count
    }
    if let count = try parsed.integer("device-approval-failures-per-account", in: 1...1_000_000) {
        service.deviceApprovalFailuresPerAccount = count
    }
    if let count = try parsed.integer("device-approval-failures-per-address", in: 1...1_000_000) {
        service.deviceApprovalFailuresPerAddress = count
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
    if let text = try parsed.value("quota-per-database") {
        service.quotaBytesPerDatabase = try byteCount(text, option: "--quota-per-database")
    }
    if let rate = try parsed.integer("requests-per-second-per-account", in: 0...1_000_000) {
        service.rateLimit = rate == 0
            ? nil : ServiceConfiguration.RateLimit(requestsPerSecond: Double(rate), burst: Double(2 * rate))
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

/// `--data DIR`, or `--database URL` (`$LATTICE_DATABASE_URL`) with `--database-pool N`: the storage of
/// `lattice serve` and every `lattice admin` command.
func storageLocation(_ parsed: ParsedArguments) throws -> StorageLocation {
    do {
        return try StorageLocation.fromOptions(data: try parsed.value("data"), database: try parsed.value("database"),
                                               poolSize: try parsed.integer("database-pool", in: 1...1024))
    } catch let problem as StorageLocation.OptionProblem {
        throw UsageError(problem.description)
    }
}

/// The `--oidc-issuer URL --oidc-client-id ID [--oidc-client-secret-file PATH]` groups, in order: as many
/// client ids as issuers; a secret file belongs to the issuer given before it (a confidential client), and
/// an issuer without one is a public client.
private func oidcProviders(_ parsed: ParsedArguments, _ arguments: [String]) throws -> [OIDCProviderConfiguration] {
    let issuers = parsed.values["oidc-issuer"] ?? [], clients = parsed.values["oidc-client-id"] ?? []
    let files = parsed.values["oidc-client-secret-file"] ?? []
    guard issuers.count == clients.count else {
        throw UsageError("give each --oidc-issuer its --oidc-client-id (\(issuers.count) issuers, \(clients.count) client ids)")
    }
    // Which issuer each secret file follows, from the order of the arguments.
    var issuerIndex = -1
    var secretFiles: [Int: String] = [:]
    for argument in arguments.prefix(while: { $0 != "--" }) {
        let name = argument.hasPrefix("--") ? String(argument.dropFirst(2).prefix { $0 != "=" }) : ""
        if name == "oidc-issuer" { issuerIndex += 1 }
        guard name == "oidc-client-secret-file" else { continue }
        guard issuerIndex >= 0, secretFiles[issuerIndex] == nil, secretFiles.count < files.count else {
            throw UsageError("give each --oidc-client-secret-file after its --oidc-issuer, at most one per issuer")
        }
        secretFiles[issuerIndex] = files[secretFiles.count]
    }
    guard issuerIndex + 1 == issuers.count, secretFiles.count == files.count else {
        throw UsageError("give each --oidc-issuer URL, --oidc-client-id ID and --oidc-client-secret-file PATH as separate options")
    }
    guard Set(issuers).count == issuers.count else { throw UsageError("an --oidc-issuer is given twice") }
    return try issuers.indices.map { index in
        let issuer = issuers[index]
        guard let url = URL(string: issuer), ["https", "http"].contains(url.scheme ?? ""), url.host != nil, url.query == nil,
              url.fragment == nil else {
            throw UsageError("--oidc-issuer must be an http(s) URL without query or fragment, not \(issuer)")
        }
        guard !clients[index].isEmpty, clients[index].utf8.count <= 255 else { throw UsageError("--oidc-client-id must be 1 to 255 bytes") }
        var secret: String? = nil
        if let file = secretFiles[index] {
            guard let text = try? String(contentsOfFile: file, encoding: .utf8) else {
                throw UsageError("cannot read --oidc-client-secret-file \(file)")
            }
            secret = text.trimmingCharacters(in: .whitespacesAndNewlines)
            guard secret?.isEmpty == false else { throw UsageError("--oidc-client-secret-file \(file) is empty") }
        }
        return OIDCProviderConfiguration(issuer: issuer, clientID: clients[index], clientSecret: secret)
    }
}
