import Dispatch
import Foundation
import LatticeServer

let serveUsage = """
    usage: lattice serve --data DIR [--host 127.0.0.1] [--port 8080] [--public-url URL]
                         [--container NAME] [--registration open|closed] [--tombstone-horizon-days N]

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

    Bounds on each request (over a cap: LIMIT_EXCEEDED, checked before any work):
      --request-deadline SECONDS how long one request may work (default 10); past it storage work is
                                 interrupted and rolled back, and the client gets TRY_AGAIN_LATER
                                 (a parked changes/wait is not working)
      --reader-connections N     SQLite reader connections for requests (default 4), besides one kept
                                 for authentication
      --max-response-bytes N     bytes of records per answer of a query, lookup or feed (default
                                 8388608); feeds and queries stop there with moreComing
      --max-query-filters N      filters per records/query (default 64)
      --max-query-sort-keys N    sort keys per records/query (default 8)
      --max-filter-values N      values per IN or NOT_IN filter (default 10000)
      --max-list-elements N      elements per list field of a write (default 50000)
      --max-fields-per-record N  fields per record of a write (default 1000)
    """

func runServe(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data", "host", "port", "public-url", "container",
                                                               "registration", "tombstone-horizon-days",
                                                               "request-deadline", "reader-connections",
                                                               "max-response-bytes", "max-query-filters",
                                                               "max-query-sort-keys", "max-filter-values",
                                                               "max-list-elements", "max-fields-per-record"],
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
    try applyBoundsOptions(parsed, to: &options.service)
    let publicURL = try parsed.value("public-url")
    if let publicURL, URL(string: publicURL)?.scheme == nil {
        throw UsageError("--public-url must be an absolute URL such as https://lattice.example.com")
    }

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
    let server = try ServerProcess(options)
    print("listening on \(server.url)")
    fflush(nil) // flush stdout: a supervisor reading the pipe sees the line now
    stopRequested.wait()
    FileHandle.standardError.write(Data("lattice: shutting down\n".utf8))
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
