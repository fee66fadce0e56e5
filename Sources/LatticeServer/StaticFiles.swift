import Foundation
#if canImport(Glibc)
import Glibc
import LatticeAPI
import LatticeOperations
#endif

/// Serves the regular files under one directory for GET and HEAD: a responder of its own, which the route
/// table mounts (`GET /web/{path...}`, behind `ServiceConfiguration.webRoot`).
///
/// - Paths are percent-decoded once; a segment `.` or `..` (encoded or not), an empty segment, NUL, a
///   backslash or another control character is BAD_REQUEST. Dot files are not served, nor files of a type
///   outside `contentTypes`, nor anything a symlink leads to outside the root: NOT_FOUND, like a missing file.
/// - A path ending in `/` (or empty) serves that directory's `index.html`; there are no listings.
/// - `ETag` is strong: the file's inode, size and modification time in nanoseconds; `If-None-Match`
///   answers 304. Every file is `Cache-Control: no-cache`: the names carry no version, so a browser
///   revalidates each (a cheap 304) and sees an update at once, with no mix of old and new files.
/// - `X-Content-Type-Options: nosniff` on every answer; files over `maximumFileBytes` are not served.
///
/// It reads with blocking calls: run it on the worker pool, never on the HTTP threads (`Route.Lane.pool`).
public struct StaticFiles: Sendable {
    public let root: String
    public let maximumFileBytes: Int

    public init(root: String, maximumFileBytes: Int = 4 * 1024 * 1024) {
        self.root = root
        self.maximumFileBytes = maximumFileBytes
    }

    /// The types served, by lowercased extension; other files are not served.
    static let contentTypes: [String: String] = [
        "html": "text/html; charset=utf-8",
        "css": "text/css; charset=utf-8",
        "js": "text/javascript; charset=utf-8",
        "mjs": "text/javascript; charset=utf-8",
        "json": "application/json; charset=utf-8",
        "webmanifest": "application/manifest+json",
        "svg": "image/svg+xml",
        "png": "image/png",
        "ico": "image/vnd.microsoft.icon",
        "txt": "text/plain; charset=utf-8",
    ]

    /// The answer for `path` (below the mount point, percent-encoded as sent, without the query). HEAD gets
    /// the same answer: the HTTP adapter sends its headers, Content-Length included, without the body.
    func response(path: String, headers: [String: String]) throws -> HTTPResponse {
        var relative = try Self.decodedRelativePath(path)
        if relative.isEmpty || relative.hasSuffix("/") { relative += "index.html" }
        let name = relative.split(separator: "/").last.map(String.init) ?? relative
        guard let dot = name.lastIndex(of: "."),
              let contentType = Self.contentTypes[name[name.index(after: dot)...].lowercased()] else {
            throw notFound
        }
        guard let rootPath = Self.realPath(root), let filePath = Self.realPath(rootPath + "/" + relative),
              filePath.hasPrefix(rootPath == "/" ? "/" : rootPath + "/") else {
            throw notFound
        }
        let file = try File(opening: filePath)
        defer { file.close() }
        let before = try file.status()
        guard before.isRegularFile else { throw notFound }
        guard before.size <= maximumFileBytes else {
            throw ServiceError(.notFound, "\(relative.prefix(200)) is over the \(maximumFileBytes)-byte limit for web files")
        }
        var answer = HTTPResponse(status: 200, headers: [
            (name: "Content-Type", value: contentType),
            (name: "ETag", value: before.entityTag),
            (name: "Cache-Control", value: "no-cache"),
            (name: "X-Content-Type-Options", value: "nosniff"),
        ])
        if let condition = headers["if-none-match"], Self.matches(condition, before.entityTag) {
            answer.status = 304
            answer.headers.removeAll { $0.name == "Content-Type" }
            return answer
        }
        answer.body = try file.read(count: before.size)
        // The ETag names these bytes: a file replaced in place while read is not answered half old, half new.
        let after = try file.status()
        guard answer.body.count == before.size, after.entityTag == before.entityTag else {
            throw ServiceError(.tryAgainLater, "\(relative.prefix(200)) changed while it was read; retry")
        }
        return answer
    }

    private var notFound: ServiceError { ServiceError(.notFound, "no such file") }

    /// `If-None-Match`: `*`, or a list of entity tags compared weakly (RFC 9110 §13.1.2).
    static func matches(_ condition: String, _ tag: String) -> Bool {
        let wanted = condition.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }
        return wanted.contains { $0 == "*" || ($0.hasPrefix("W/") ? String($0.dropFirst(2)) : $0) == tag }
    }

    /// The path below the root, percent-decoded once, or BAD_REQUEST for one that could leave the root or
    /// is malformed. A trailing `/` is kept (it asks for `index.html`).
    static func decodedRelativePath(_ encoded: String) throws -> String {
        var bytes: [UInt8] = []
        var input = Array(encoded.utf8)[...]
        while let byte = input.popFirst() {
            guard byte == UInt8(ascii: "%") else {
                bytes.append(byte)
                continue
            }
            guard input.count >= 2, let high = hexValue(input.removeFirst()), let low = hexValue(input.removeFirst()) else {
                throw ServiceError.badRequest("the path has a malformed percent escape")
            }
            bytes.append(high << 4 | low)
        }
        guard let text = String(validating: bytes, as: UTF8.self) else {
            throw ServiceError.badRequest("the path is not UTF-8")
        }
        guard !bytes.contains(where: { $0 < 0x20 || $0 == 0x7F || $0 == UInt8(ascii: "\\") }) else {
            throw ServiceError.badRequest("the path holds a control character or a backslash")
        }
        let segments = text.split(separator: "/", omittingEmptySubsequences: false)
        for (index, segment) in segments.enumerated() {
            if segment == "." || segment == ".." {
                throw ServiceError.badRequest("the path has a . or .. segment")
            }
            // An empty segment: `a//b`, or a leading `/`. The last may be empty (`dir/` asks for its index).
            if segment.isEmpty && !(index == segments.count - 1) {
                throw ServiceError.badRequest("the path has an empty segment")
            }
            if segment.hasPrefix(".") { throw ServiceError(.notFound, "no such file") }
        }
        return text
    }

    private static func hexValue(_ byte: UInt8) -> UInt8? {
        switch byte {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): byte - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): byte - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): byte - UInt8(ascii: "A") + 10
        default: nil
        }
    }

    /// The path with every symlink resolved, or nil if it does not exist.
    static func realPath(_ path: String) -> String? {
        guard let resolved = Glibc.realpath(path, nil) else { return nil }
        defer { free(resolved) }
        return String(cString: resolved)
    }

    /// One open file descriptor, read-only.
    private struct File {
        let descriptor: Int32

        struct Status {
            let isRegularFile: Bool
            let size: Int
            /// Strong: a file rewritten, replaced or touched gets another.
            let entityTag: String
        }

        /// Opens without following a final symlink (the path is already resolved) and without blocking on
        /// a FIFO.
        init(opening path: String) throws {
            let descriptor = retryingInterrupted { Glibc.open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK) }
            guard descriptor >= 0 else {
                if errno == ENOENT || errno == ELOOP || errno == EACCES || errno == ENOTDIR {
                    throw ServiceError(.notFound, "no such file")
                }
                throw StaticFileError(operation: "open", errno: errno)
            }
            self.descriptor = descriptor
        }

        func status() throws -> Status {
            var info = stat()
            guard fstat(descriptor, &info) == 0 else { throw StaticFileError(operation: "fstat", errno: errno) }
            let modified = Int64(info.st_mtim.tv_sec) * 1_000_000_000 + Int64(info.st_mtim.tv_nsec)
            let tag = "\"\(String(UInt64(info.st_ino), radix: 16))-\(String(Int64(info.st_size), radix: 16))-"
                + "\(String(UInt64(bitPattern: modified), radix: 16))\""
            return Status(isRegularFile: (info.st_mode & S_IFMT) == S_IFREG, size: Int(info.st_size), entityTag: tag)
        }

        /// Up to `count` bytes from the start (fewer if the file shrank).
        func read(count: Int) throws -> [UInt8] {
            var bytes = [UInt8](repeating: 0, count: count)
            var filled = 0
            while filled < count {
                let got = bytes.withUnsafeMutableBytes { buffer in
                    retryingInterrupted { pread(descriptor, buffer.baseAddress! + filled, count - filled, off_t(filled)) }
                }
                guard got >= 0 else { throw StaticFileError(operation: "read", errno: errno) }
                if got == 0 { break }
                filled += got
            }
            return Array(bytes[..<filled])
        }

        func close() { _ = Glibc.close(descriptor) }
    }

    /// Repeats a call interrupted by a signal (`EINTR`).
    private static func retryingInterrupted<T: BinaryInteger>(_ call: () -> T) -> T {
        while true {
            let result = call()
            if result >= 0 || errno != EINTR { return result }
        }
    }
}

/// A failed system call while serving a file: logged by the service as an internal error, never shown.
struct StaticFileError: Error, CustomStringConvertible {
    let operation: String
    let errno: Int32
    var description: String { "web file \(operation) failed: errno \(errno) (\(String(cString: strerror(errno))))" }
}

extension StaticFiles {
    /// Where the `lattice` binary at `executablePath` finds its web files, without flags:
    /// 1. an installed copy: `<prefix>/bin/lattice` uses `<prefix>/share/lattice/web`;
    /// 2. a build-directory run (`<package>/.build/<triple>/debug/lattice`): the package's `Web/`, found by
    ///    walking up from the executable (through symlinks) to the folder that holds `Package.swift`.
    /// Nil when neither exists.
    public static func webRoot(executablePath: String) -> String? {
        let executable = realPath(executablePath) ?? executablePath
        let folder = URL(fileURLWithPath: executable).deletingLastPathComponent()
        func isDirectory(_ url: URL) -> Bool {
            var directory: ObjCBool = false
            return FileManager.default.fileExists(atPath: url.path, isDirectory: &directory) && directory.boolValue
        }
        let installed = folder.deletingLastPathComponent().appendingPathComponent("share/lattice/web")
        if isDirectory(installed) { return installed.standardizedFileURL.path }
        var candidate = folder
        for _ in 0..<6 where candidate.path != "/" {
            if FileManager.default.fileExists(atPath: candidate.appendingPathComponent("Package.swift").path) {
                let web = candidate.appendingPathComponent("Web")
                return isDirectory(web) ? web.standardizedFileURL.path : nil
            }
            candidate = candidate.deletingLastPathComponent()
        }
        return nil
    }

    /// The running executable's path (Linux: `/proc/self/exe`).
    public static var currentExecutablePath: String? { realPath("/proc/self/exe") }
}
