// Small Linux helpers for the harness: /proc memory counters, a monotonic clock, machine info,
// whole-file I/O and running a child process with captured output.

#if canImport(Glibc)
import Glibc
#endif

/// A failed system call, with context.
enum SystemError: Error, CustomStringConvertible {
    case posix(String, Int32)
    case message(String)

    var description: String {
        switch self {
        case .posix(let what, let code):
            guard let text = strerror(code) else { return "\(what): errno \(code)" }
            return "\(what): \(String(cString: text))"
        case .message(let text): return text
        }
    }
}

/// Writes all of `bytes` to `fd`, retrying short writes and EINTR.
func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, what: String) throws {
    var offset = 0
    while offset < bytes.count {
        let written = write(fd, bytes.baseAddress! + offset, bytes.count - offset)
        if written < 0 {
            if errno == EINTR { continue }
            throw SystemError.posix("cannot write \(what)", errno)
        }
        offset += written
    }
}

/// Writes `text` to `fd` (errors ignored: for stderr and best-effort output).
func writeText(_ fd: Int32, _ text: String) {
    var text = text
    text.withUTF8 { try? writeAll(fd, UnsafeRawBufferPointer($0), what: "fd \(fd)") }
}

/// The whole content of a (small) file, such as one under /proc.
func readWholeFile(_ path: String) throws -> [UInt8] {
    let fd = open(path, O_RDONLY | O_CLOEXEC)
    guard fd >= 0 else { throw SystemError.posix("cannot open \(path)", errno) }
    defer { close(fd) }
    var out = [UInt8]()
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let count = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        if count < 0 {
            if errno == EINTR { continue }
            throw SystemError.posix("cannot read \(path)", errno)
        }
        if count == 0 { return out }
        out.append(contentsOf: chunk[0..<count])
    }
}

/// Lines of a text file under /proc; empty if it cannot be read.
private func procLines(_ path: String) -> [Substring] {
    guard let bytes = try? readWholeFile(path) else { return [] }
    return String(decoding: bytes, as: UTF8.self).split(separator: "\n")
}

/// Counters of /proc/self/status.
enum ProcStatus {
    /// The value in KiB of a `/proc/self/status` field such as `VmRSS` or `VmHWM`; -1 if missing.
    static func kib(_ field: String) -> Int { kib(field, path: "/proc/self/status") }

    /// The same field of another process (`/proc/PID/status`); -1 if missing.
    static func kib(_ field: String, pid: Int32) -> Int { kib(field, path: "/proc/\(pid)/status") }

    private static func kib(_ field: String, path: String) -> Int {
        let prefix = field + ":"
        for line in procLines(path) where line.hasPrefix(prefix) {
            let parts = line.dropFirst(prefix.count).split(whereSeparator: { $0 == " " || $0 == "\t" })
            if let first = parts.first, let value = Int(first) { return value }
        }
        return -1
    }

    /// Resident set size now, in KiB.
    static var rssKiB: Int { kib("VmRSS") }
    /// Peak resident set size of the process so far (VmHWM), in KiB.
    static var peakRSSKiB: Int { kib("VmHWM") }
}

extension Substring {
    fileprivate func trimmingSpaces() -> Substring {
        var text = self
        while let first = text.first, first == " " || first == "\t" { text.removeFirst() }
        while let last = text.last, last == " " || last == "\t" { text.removeLast() }
        return text
    }
}

/// CLOCK_MONOTONIC in nanoseconds (the analogue of Python's `time.perf_counter_ns`).
@inline(__always)
func monotonicNanoseconds() -> UInt64 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    return UInt64(now.tv_sec) &* 1_000_000_000 &+ UInt64(now.tv_nsec)
}

/// Seconds taken by `body`, with its result.
func measureSeconds<T>(_ body: () throws -> T) rethrows -> (seconds: Double, result: T) {
    let start = monotonicNanoseconds()
    let result = try body()
    let end = monotonicNanoseconds()
    return (Double(end &- start) / 1e9, result)
}

/// Machine description for the header line, with the same keys as the reference's
/// `machine_info()` except `swift` (compiler) in place of `python`, plus `build`.
enum MachineInfo {
    static func collect() -> [String: JSONValue] {
        var info: [String: JSONValue] = [
            "platform": .string(platform()),
            "swift": .string(compilerVersion),
            "build": .string(buildConfiguration),
            "nproc": .int(Int64(sysconf(Int32(_SC_NPROCESSORS_ONLN)))),
            "affinity_cpus": affinityCPUs().map { .int(Int64($0)) } ?? .null,
        ]
        for line in procLines("/proc/cpuinfo") where line.hasPrefix("model name") {
            if let colon = line.firstIndex(of: ":") {
                info["cpu"] = .string(String(line[line.index(after: colon)...].trimmingSpaces()))
            }
            break
        }
        for line in procLines("/proc/meminfo") where line.hasPrefix("MemTotal:") {
            let parts = line.split(separator: " ", omittingEmptySubsequences: true)
            if parts.count >= 2, let kib = Int(parts[1]) {
                info["mem_total_gib"] = .double(roundedToTenths(Double(kib) / 1024 / 1024))
            }
            break
        }
        return info
    }

    /// `Linux-<release>-<machine>-with-glibc<version>`, the shape of Python's `platform.platform()`.
    static func platform() -> String {
        var names = utsname()
        guard uname(&names) == 0 else { return "unknown" }
        let system = cString(&names.sysname), release = cString(&names.release), machine = cString(&names.machine)
        var text = "\(system)-\(release)-\(machine)"
        var buffer = [CChar](repeating: 0, count: 128)
        if confstr(Int32(_CS_GNU_LIBC_VERSION), &buffer, buffer.count) > 0 {
            let libc = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
            text += "-with-" + libc.split(separator: " ").joined()
        }
        return text
    }

    /// Number of CPUs this process may run on (Cpus_allowed_list), like `os.sched_getaffinity`.
    static func affinityCPUs() -> Int? {
        for line in procLines("/proc/self/status") where line.hasPrefix("Cpus_allowed_list:") {
            var count = 0
            for range in line.dropFirst("Cpus_allowed_list:".count).trimmingSpaces().split(separator: ",") {
                let ends = range.split(separator: "-")
                guard let low = ends.first.flatMap({ Int($0) }), let high = ends.last.flatMap({ Int($0) }),
                      high >= low else { return nil }
                count += high - low + 1
            }
            return count
        }
        return nil
    }

    static var compilerVersion: String {
        #if compiler(>=7.0)
        return ">=7.0"
        #elseif compiler(>=6.4)
        return "6.4"
        #elseif compiler(>=6.3)
        return "6.3"
        #elseif compiler(>=6.2)
        return "6.2"
        #elseif compiler(>=6.1)
        return "6.1"
        #else
        return "6.0"
        #endif
    }

    static var buildConfiguration: String {
        #if DEBUG
        return "debug"
        #else
        return "release"
        #endif
    }

    /// Rounds to one decimal the way Python's `round(x, 1)` does (correctly rounded, via printf).
    private static func roundedToTenths(_ value: Double) -> Double {
        var buffer = [CChar](repeating: 0, count: 64)
        _ = withVaList([value]) { vsnprintf(&buffer, buffer.count, "%.1f", $0) }
        let text = String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        return Double(text) ?? value
    }

    private static func cString<T>(_ field: inout T) -> String {
        withUnsafeBytes(of: &field) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ`.
func utcTimestamp() -> String {
    var now = time(nil)
    var parts = tm()
    gmtime_r(&now, &parts)
    var buffer = [CChar](repeating: 0, count: 32)
    let count = strftime(&buffer, buffer.count, "%Y-%m-%dT%H:%M:%SZ", &parts)
    return String(decoding: buffer.prefix(count).map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// What a finished child process left behind.
struct ChildResult {
    enum Termination: Equatable {
        case exited(Int32)
        case signaled(Int32)
    }

    var stdout: [UInt8] = []
    var stderr: [UInt8] = []
    var termination: Termination = .exited(0)
    var timedOut = false
}

/// Runs this same executable (`/proc/self/exe`) with `arguments`, capturing stdout and stderr.
/// The child is killed (SIGKILL, by its pid) if it runs longer than `timeoutSeconds`.
func runSelfAsChild(arguments: [String], argv0: String, timeoutSeconds: Double) throws -> ChildResult {
    // pipe2 is not exported to Swift; this process starts no threads, so pipe + FD_CLOEXEC is safe.
    func closeOnExecPipe() throws -> [Int32] {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { throw SystemError.posix("pipe", errno) }
        for end in ends { _ = fcntl(end, F_SETFD, FD_CLOEXEC) }
        return ends
    }
    let outPipe = try closeOnExecPipe()
    let errPipe: [Int32]
    do { errPipe = try closeOnExecPipe() } catch {
        close(outPipe[0]); close(outPipe[1])
        throw error
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_adddup2(&actions, outPipe[1], 1)
    posix_spawn_file_actions_adddup2(&actions, errPipe[1], 2)

    let cArguments: [UnsafeMutablePointer<CChar>?] = ([argv0] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in cArguments { free(pointer) } }
    var pid: pid_t = 0
    let spawnStatus = cArguments.withUnsafeBufferPointer { argv in
        posix_spawn(&pid, "/proc/self/exe", &actions, nil, argv.baseAddress!, environ)
    }
    close(outPipe[1])
    close(errPipe[1])
    guard spawnStatus == 0 else {
        close(outPipe[0]); close(errPipe[0])
        throw SystemError.posix("cannot start a worker process (posix_spawn /proc/self/exe)", spawnStatus)
    }

    var result = ChildResult()
    var fds = [pollfd(fd: outPipe[0], events: Int16(POLLIN), revents: 0),
               pollfd(fd: errPipe[0], events: Int16(POLLIN), revents: 0)]
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    let deadline = monotonicNanoseconds() &+ UInt64(max(timeoutSeconds, 0) * 1e9)
    while fds.contains(where: { $0.fd >= 0 }) {
        let now = monotonicNanoseconds()
        if now >= deadline {
            result.timedOut = true
            kill(pid, SIGKILL)
            break
        }
        let waitMilliseconds = Int32(min((deadline - now) / 1_000_000 + 1, 60_000))
        let ready = poll(&fds, nfds_t(fds.count), waitMilliseconds)
        if ready < 0 {
            if errno == EINTR { continue }
            kill(pid, SIGKILL)
            throw SystemError.posix("poll", errno)
        }
        for index in fds.indices where fds[index].fd >= 0 && fds[index].revents != 0 {
            let count = chunk.withUnsafeMutableBytes { read(fds[index].fd, $0.baseAddress, $0.count) }
            if count < 0 && errno == EINTR { continue }
            if count <= 0 {
                close(fds[index].fd)
                fds[index].fd = -1
                continue
            }
            if index == 0 { result.stdout.append(contentsOf: chunk[0..<count]) }
            else { result.stderr.append(contentsOf: chunk[0..<count]) }
        }
    }
    for entry in fds where entry.fd >= 0 { close(entry.fd) }

    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 {
        if errno != EINTR { throw SystemError.posix("waitpid", errno) }
    }
    if status & 0x7F == 0 {
        result.termination = .exited((status >> 8) & 0xFF)
    } else {
        result.termination = .signaled(status & 0x7F)
    }
    return result
}

/// Runs a one-line benchmark command: prints `measure`'s JSON object as one line on stdout (exit 0), or
/// `lattice-bench NAME: error: ...` on stderr (exit 1).
func printOneLine(_ name: String, _ measure: () throws -> [String: JSONValue]) -> Int32 {
    do {
        writeText(1, JSONValue.object(try measure()).serialized + "\n")
        return 0
    } catch {
        writeText(2, "lattice-bench \(name): error: \(error)\n")
        return 1
    }
}
