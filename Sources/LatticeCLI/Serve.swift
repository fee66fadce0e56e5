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
    """

func runServe(_ arguments: [String]) throws {
    let parsed = try ParsedArguments(arguments, valueOptions: ["data", "host", "port", "public-url", "container",
                                                               "registration", "tombstone-horizon-days"],
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
