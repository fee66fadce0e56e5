// The `lattice serve` process that `lattice-bench sync` measures: the `lattice` binary next to
// `lattice-bench`, on 127.0.0.1 with a fresh data directory, stopped at the end, on failure, on
// SIGINT/SIGTERM/SIGHUP, and even when the benchmark dies without cleaning up.
//
// The server is started through a guard process (this executable, hidden command `sync-server-guard`)
// whose stdin is a pipe from the benchmark: when that pipe closes, because the benchmark stopped the
// server or because it died, whatever way, the guard stops the server (SIGTERM, then SIGKILL).

import Foundation
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// A running `lattice serve` (behind its guard).
final class BenchServer: Sendable {
    /// The server's pid (for /proc counters); it is the guard's child.
    let pid: pid_t
    let guardPID: pid_t
    let port: UInt16
    let binary: String
    /// Where the server's stderr goes (shown when something fails).
    let logPath: String
    /// The benchmark's temporary directory, removed when a signal ends the run.
    let scratchDirectory: String
    /// The write end of the guard's stdin; closing it stops the server.
    private let lifeline: Int32
    private let stopped = Atomic<Bool>(false)

    var url: String { "http://127.0.0.1:\(port)" }

    static let guardCommand = "sync-server-guard"

    /// The `lattice` executable in the directory of this process's executable.
    static func binaryNextToSelf() throws -> String {
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let path = executable.deletingLastPathComponent().appendingPathComponent("lattice").path
        guard access(path, X_OK) == 0 else {
            throw SystemError.message("no lattice executable next to lattice-bench (\(path)); build both: "
                                      + "swift build -c release")
        }
        return path
    }

    /// Starts the guard, which starts `lattice serve --data DATA --host 127.0.0.1 --port 0`, and waits (at most
    /// `timeoutSeconds`) for the server's "listening on http://127.0.0.1:PORT" line.
    convenience init(binary: String, data: String, logPath: String, scratchDirectory: String,
                     timeoutSeconds: Double = 30) throws {
        try self.init(binary: binary, storage: ["--data", data], logPath: logPath, scratchDirectory: scratchDirectory,
                      timeoutSeconds: timeoutSeconds)
    }

    /// Starts the guard, which starts `lattice serve STORAGE... --host 127.0.0.1 --port 0` (STORAGE: `--data DIR`,
    /// or `--database URL --node-name N ...`; a `--port` among them replaces port 0), and waits (at most
    /// `timeoutSeconds`) for the server's "listening on http://127.0.0.1:PORT" line.
    init(binary: String, storage: [String], logPath: String, scratchDirectory: String, timeoutSeconds: Double = 30) throws {
        self.binary = binary
        self.logPath = logPath
        self.scratchDirectory = scratchDirectory
        let stdinPipe = try closeOnExecPipe()
        let stdoutPipe: [Int32]
        do { stdoutPipe = try closeOnExecPipe() } catch {
            close(stdinPipe[0]); close(stdinPipe[1])
            throw error
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, stdinPipe[0], 0)
        posix_spawn_file_actions_adddup2(&actions, stdoutPipe[1], 1)
        posix_spawn_file_actions_addopen(&actions, 2, logPath, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let arguments = ["lattice-bench", Self.guardCommand, binary, scratchDirectory] + storage
        let cArguments: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for pointer in cArguments { free(pointer) } }
        var child: pid_t = 0
        let status = cArguments.withUnsafeBufferPointer { argv in
            posix_spawn(&child, "/proc/self/exe", &actions, nil, argv.baseAddress!, environ)
        }
        close(stdinPipe[0])
        close(stdoutPipe[1])
        guard status == 0 else {
            close(stdinPipe[1]); close(stdoutPipe[0])
            throw SystemError.posix("cannot start the server guard (posix_spawn /proc/self/exe)", status)
        }
        guardPID = child
        lifeline = stdinPipe[1]

        // The guard prints "server-pid N", then relays the server's first line.
        let deadline = monotonicNanoseconds() &+ UInt64(timeoutSeconds * 1e9)
        var failure: String?
        var serverPID: pid_t = 0
        var serverPort: UInt16 = 0
        do {
            let first = try readLine(stdoutPipe[0], deadline: deadline)
            guard first.hasPrefix("server-pid "), let parsed = pid_t(first.dropFirst("server-pid ".count)) else {
                throw SystemError.message("the server guard said: \(first)")
            }
            serverPID = parsed
            let second = try readLine(stdoutPipe[0], deadline: deadline)
            let prefix = "listening on http://127.0.0.1:"
            guard second.hasPrefix(prefix), let port = UInt16(second.dropFirst(prefix.count)) else {
                throw SystemError.message("unexpected first line from lattice serve: \(second)")
            }
            serverPort = port
        } catch {
            failure = "\(error)"
        }
        close(stdoutPipe[0])
        pid = serverPID
        port = serverPort
        if let failure {
            stop()
            throw SystemError.message(failure + BenchServer.logTail(logPath))
        }
        BenchServer.registerForSignals(self)
    }

    /// Closes the lifeline (the guard sends SIGTERM, then SIGKILL after 10 s) and reaps the guard; if the guard
    /// has not ended after `graceSeconds`, kills both. Idempotent.
    func stop(graceSeconds: Double = 15) {
        guard !stopped.exchange(true, ordering: .acquiringAndReleasing) else { return }
        close(lifeline)
        if pid > 0 { kill(pid, SIGTERM) } // at once, rather than when the guard wakes up
        let deadline = monotonicNanoseconds() &+ UInt64(graceSeconds * 1e9)
        var status: Int32 = 0
        while true {
            let reaped = waitpid(guardPID, &status, WNOHANG)
            if reaped == guardPID || (reaped < 0 && errno != EINTR) { break }
            if monotonicNanoseconds() >= deadline {
                if pid > 0 { kill(pid, SIGKILL) }
                kill(guardPID, SIGKILL)
                while waitpid(guardPID, &status, 0) < 0 && errno == EINTR {}
                break
            }
            usleep(20_000)
        }
    }

    // MARK: Memory counters of the server process

    /// A `/proc/PID/status` field of the server in KiB (`VmRSS`, `VmHWM`); -1 if unreadable.
    func statusKiB(_ field: String) -> Int { ProcStatus.kib(field, pid: pid) }

    /// Resets the server's peak RSS (VmHWM) to its current RSS, so the next reading is the peak of one
    /// measurement. Returns false where the kernel does not allow it (the peak is then the process's).
    func resetPeakRSS() -> Bool {
        let fd = open("/proc/\(pid)/clear_refs", O_WRONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        return write(fd, "5", 1) == 1
    }

    /// The last lines of the server's log, for error messages.
    static func logTail(_ path: String) -> String {
        guard let bytes = try? readWholeFile(path), !bytes.isEmpty else { return "" }
        return "\nlattice serve's stderr (end):\n" + String(decoding: bytes.suffix(2000), as: UTF8.self)
    }

    // MARK: Signals

    private static let signalTarget = Mutex<BenchServer?>(nil)
    private static let signalSources = Mutex<[any DispatchSourceSignal]>([])

    /// While a server runs, SIGINT, SIGTERM and SIGHUP stop it and end the benchmark with status 130.
    private static func registerForSignals(_ server: BenchServer) {
        signalTarget.withLock { $0 = server }
        signalSources.withLock { sources in
            guard sources.isEmpty else { return }
            for number in [SIGINT, SIGTERM, SIGHUP] {
                signal(number, SIG_IGN)
                let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
                source.setEventHandler {
                    if let server = BenchServer.signalTarget.withLock({ $0 }) {
                        server.stop()
                        try? FileManager.default.removeItem(atPath: server.scratchDirectory)
                    }
                    writeText(2, "lattice-bench sync: interrupted; the server was stopped\n")
                    exit(130)
                }
                source.resume()
                sources.append(source)
            }
        }
    }

    // MARK: The guard process

    /// `lattice-bench sync-server-guard BINARY SCRATCH STORAGE...`: starts the server (`BINARY serve STORAGE...`),
    /// prints `server-pid N` and the server's first line, then waits until its stdin closes (or the server
    /// ends), stops the server and removes the benchmark's scratch directory SCRATCH (the benchmark may have
    /// died without doing so).
    static func runGuard(_ arguments: [String]) -> Int32 {
        guard arguments.count >= 4 else {
            writeText(2, "lattice-bench \(guardCommand): expects BINARY SCRATCH STORAGE-OPTIONS...\n")
            return 2
        }
        defer { try? FileManager.default.removeItem(atPath: arguments[1]) }
        // Only the lifeline stops this process: a terminal's Ctrl-C reaches the benchmark, which closes it.
        for number in [SIGINT, SIGTERM, SIGHUP, SIGPIPE] { signal(number, SIG_IGN) }
        let output: [Int32]
        do { output = try closeOnExecPipe() } catch {
            writeText(2, "lattice-bench \(guardCommand): \(error)\n")
            return 1
        }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, output[1], 1)
        // The server must not keep the signals ignored: reset them to the default in the child.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for number in [SIGINT, SIGTERM, SIGHUP, SIGPIPE] { sigaddset(&defaults, number) }
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGDEF))
        // Benchmark accounts all sign up from 127.0.0.1, and an access line per request would cost the run.
        let storage = Array(arguments.dropFirst(2))
        let command = [arguments[0], "serve"] + storage + ["--host", "127.0.0.1"]
            + (storage.contains("--port") ? [] : ["--port", "0"])
            + ["--signup-per-address", "0", "--signup-global", "0", "--access-log", "off"]
        let cArguments: [UnsafeMutablePointer<CChar>?] = command.map { strdup($0) } + [nil]
        defer { for pointer in cArguments { free(pointer) } }
        var server: pid_t = 0
        let spawned = cArguments.withUnsafeBufferPointer { argv in
            posix_spawn(&server, arguments[0], &actions, &attributes, argv.baseAddress!, environ)
        }
        close(output[1])
        guard spawned == 0 else {
            writeText(1, "cannot start \(arguments[0]): \(String(cString: strerror(spawned)))\n")
            return 1
        }
        writeText(1, "server-pid \(server)\n")

        // Relay the server's first line; afterwards drain its stdout (so it never blocks on a full pipe).
        var fds = [pollfd(fd: 0, events: Int16(POLLIN), revents: 0),
                   pollfd(fd: output[0], events: Int16(POLLIN), revents: 0)]
        var line = [UInt8]()
        var relayed = false
        var chunk = [UInt8](repeating: 0, count: 4096)
        var serverRunning = true
        loop: while true {
            let ready = poll(&fds, nfds_t(fds.count), 1000)
            if ready < 0 && errno != EINTR { break }
            var status: Int32 = 0
            if serverRunning && waitpid(server, &status, WNOHANG) == server {
                // The server ended on its own: say so (EOF) and wait for the lifeline before cleaning up.
                serverRunning = false
                if !relayed { close(1) }
            }
            if fds[0].revents != 0 {
                let count = chunk.withUnsafeMutableBytes { read(0, $0.baseAddress, $0.count) }
                if count == 0 || (count < 0 && errno != EINTR && errno != EAGAIN) { break loop } // lifeline closed
            }
            if fds[1].fd >= 0 && fds[1].revents != 0 {
                let count = chunk.withUnsafeMutableBytes { read(fds[1].fd, $0.baseAddress, $0.count) }
                if count <= 0 && !(count < 0 && errno == EINTR) {
                    close(fds[1].fd)
                    fds[1].fd = -1
                } else if count > 0 && !relayed {
                    line += chunk[0..<count]
                    if let end = line.firstIndex(of: UInt8(ascii: "\n")) {
                        writeText(1, String(decoding: line[...end], as: UTF8.self))
                        relayed = true
                        close(1)
                    }
                }
            }
        }
        guard serverRunning else { return 1 }
        kill(server, SIGTERM)
        let deadline = monotonicNanoseconds() &+ 10_000_000_000
        var status: Int32 = 0
        while true {
            let reaped = waitpid(server, &status, WNOHANG)
            if reaped == server || (reaped < 0 && errno != EINTR) { return 0 }
            if monotonicNanoseconds() >= deadline {
                kill(server, SIGKILL)
                while waitpid(server, &status, 0) < 0 && errno == EINTR {}
                return 0
            }
            usleep(20_000)
        }
    }
}

/// A pipe whose two ends are closed on exec (the spawn actions dup what a child should have).
private func closeOnExecPipe() throws -> [Int32] {
    var ends: [Int32] = [-1, -1]
    guard pipe(&ends) == 0 else { throw SystemError.posix("pipe", errno) }
    for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
    return ends
}

/// One line (without its newline) from `fd`, read byte by byte until `deadline`.
private func readLine(_ fd: Int32, deadline: UInt64) throws -> String {
    var line = [UInt8]()
    while true {
        let now = monotonicNanoseconds()
        guard now < deadline else { throw SystemError.message("lattice serve did not start listening in time") }
        var entry = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        let ready = poll(&entry, 1, Int32(min((deadline - now) / 1_000_000 + 1, 1000)))
        if ready < 0 && errno != EINTR { throw SystemError.posix("poll", errno) }
        if ready <= 0 { continue }
        var byte: UInt8 = 0
        let count = read(fd, &byte, 1)
        if count < 0 && errno == EINTR { continue }
        if count <= 0 {
            if line.isEmpty { throw SystemError.message("lattice serve exited before listening") }
            return String(decoding: line, as: UTF8.self)
        }
        if byte == UInt8(ascii: "\n") { return String(decoding: line, as: UTF8.self) }
        line.append(byte)
        guard line.count <= 4096 else { throw SystemError.message("an overlong line from the server guard") }
    }
}

extension BenchServer {
    /// For a command that measures one `lattice serve` on SQLite: a fresh private scratch directory `root`, the
    /// server on `root/server` with `extra` options, and a watchdog that stops it (and removes `root`) after
    /// `timeout` seconds. Nil, with the error written on stderr, when the server did not start (`root` is gone
    /// then); the caller stops the server and removes `root` when it is done.
    static func startScratch(command: String, root: String, extra: [String], timeout: Double) -> BenchServer? {
        let server: BenchServer
        do {
            try? FileManager.default.removeItem(atPath: root)
            try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
            server = try BenchServer(binary: try BenchServer.binaryNextToSelf(), storage: ["--data", root + "/server"] + extra,
                                     logPath: root + "/server.log", scratchDirectory: root)
        } catch {
            writeText(2, "lattice-bench \(command): error: \(error)\n")
            try? FileManager.default.removeItem(atPath: root)
            return nil
        }
        DispatchQueue.global().asyncAfter(deadline: .now() + timeout) {
            writeText(2, "lattice-bench \(command): error: the run exceeded --timeout \(timeout) s; stopping the server\n")
            server.stop(graceSeconds: 2)
            try? FileManager.default.removeItem(atPath: root)
            exit(1)
        }
        return server
    }

    /// The header line of a run against this server on SQLite: the command, its arguments and parameters, the
    /// machine, the build and the server.
    func headerLine(bench: String, argv: [String], parameters: JSONValue) -> [String: JSONValue] {
        ["kind": .string("header"), "bench": .string(bench), "started": .string(utcTimestamp()),
         "argv": .array(argv.map { .string($0) }), "machine": .object(MachineInfo.collect()),
         "build": .string(MachineInfo.buildConfiguration), "parameters": parameters,
         "server": .object(["binary": .string(binary), "url": .string(url), "pid": .int(Int64(pid)),
                            "storage": .string("SQLite, WAL, synchronous=FULL (lattice serve's default)")])]
    }
}
