// The workload's digest lines and their SHA-256 (libcrypto), streamed in chunks so that even
// millions of records never hold the whole text in memory.

import CLibCrypto
#if canImport(Glibc)
import Glibc
#endif

extension Workload {
    /// Renders the digest lines, joined by "\n" with no trailing newline, and hands them to `body`
    /// in chunks of roughly `chunkSize` bytes (a chunk ends anywhere, not on a line boundary).
    ///
    /// Lines: `B|<key>|f0=<v>|...|tags=<t1>,<t2>,...` per base record (tags in pick order), then
    /// `E|<A or B>|<key>|<f>=<v>|...|+<tag>|-<tag>` per edit of A's plan, then of B's.
    func forEachLineChunk(chunkSize: Int = 1 << 16,
                          _ body: (UnsafeRawBufferPointer) throws -> Void) rethrows {
        var out = [UInt8]()
        out.reserveCapacity(chunkSize + 4096)
        let fieldBytes = fieldNames.map { Array($0.utf8) }
        let tagBytes = tagNames.map { Array($0.utf8) }
        let tagsPrefix = Array("|tags=".utf8)
        var firstLine = true

        func flushIfFull() throws {
            if out.count >= chunkSize {
                try out.withUnsafeBytes(body)
                out.removeAll(keepingCapacity: true)
            }
        }
        func startLine() {
            if firstLine { firstLine = false } else { out.append(UInt8(ascii: "\n")) }
        }

        let f = base.fieldCount, t = base.tagCount
        var nextString = 0, nextInt = 0, nextTag = 0
        for i in 0..<base.recordCount {
            startLine()
            out.append(UInt8(ascii: "B"))
            out.append(UInt8(ascii: "|"))
            Self.appendKey(i, to: &out)
            for j in 0..<f {
                out.append(UInt8(ascii: "|"))
                out.append(contentsOf: fieldBytes[j])
                out.append(UInt8(ascii: "="))
                if j & 1 == 0 {
                    Self.append(base.strings[nextString], to: &out)
                    nextString += 1
                } else {
                    Self.appendDecimal(base.ints[nextInt], to: &out)
                    nextInt += 1
                }
            }
            out.append(contentsOf: tagsPrefix)
            for position in 0..<t {
                if position > 0 { out.append(UInt8(ascii: ",")) }
                out.append(contentsOf: tagBytes[Int(base.tags[nextTag])])
                nextTag += 1
            }
            try flushIfFull()
        }
        for plan in [editsA, editsB] {
            let replicaByte = plan.replica == .a ? UInt8(ascii: "A") : UInt8(ascii: "B")
            let k = plan.fieldsPerEdit
            for e in 0..<plan.records.count {
                startLine()
                out.append(UInt8(ascii: "E"))
                out.append(UInt8(ascii: "|"))
                out.append(replicaByte)
                out.append(UInt8(ascii: "|"))
                Self.appendKey(plan.records[e], to: &out)
                for slot in e * k ..< (e + 1) * k {
                    out.append(UInt8(ascii: "|"))
                    out.append(contentsOf: fieldBytes[Int(plan.fieldIndices[slot])])
                    out.append(UInt8(ascii: "="))
                    Self.append(plan.values[slot], to: &out)
                }
                out.append(UInt8(ascii: "|"))
                out.append(UInt8(ascii: "+"))
                out.append(contentsOf: tagBytes[Int(plan.addTags[e])])
                if plan.removeTags[e] >= 0 {
                    out.append(UInt8(ascii: "|"))
                    out.append(UInt8(ascii: "-"))
                    out.append(contentsOf: tagBytes[Int(plan.removeTags[e])])
                }
                try flushIfFull()
            }
        }
        if !out.isEmpty { try out.withUnsafeBytes(body) }
    }

    /// The workload digest: lowercase hex SHA-256 of the digest lines.
    func digest() -> String {
        let hasher = SHA256Hasher()
        forEachLineChunk { hasher.update($0) }
        return hasher.finalizeHex()
    }

    /// Writes the digest lines (no trailing newline) to `path`, replacing the file.
    func writeLines(toFile path: String) throws {
        let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o644)
        guard fd >= 0 else { throw SystemError.posix("cannot open \(path) for writing", errno) }
        defer { close(fd) }
        try forEachLineChunk { chunk in try writeAll(fd, chunk, what: path) }
    }

    @inline(__always)
    private static func append(_ text: String, to out: inout [UInt8]) {
        var text = text
        text.withUTF8 { out.append(contentsOf: $0) }
    }

    /// Appends `r%07d`.
    @inline(__always)
    private static func appendKey(_ record: Int, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "r"))
        var digits = 1, rest = record / 10
        while rest > 0 { digits += 1; rest /= 10 }
        for _ in digits..<max(digits, 7) { out.append(UInt8(ascii: "0")) }
        appendDecimal(Int64(record), to: &out)
    }

    @inline(__always)
    private static func append(_ value: WorkloadValue, to out: inout [UInt8]) {
        switch value {
        case .string(let text): append(text, to: &out)
        case .int(let number): appendDecimal(number, to: &out)
        }
    }

    /// Appends `number` in decimal.
    static func appendDecimal(_ number: Int64, to out: inout [UInt8]) {
        if number < 0 { out.append(UInt8(ascii: "-")) }
        var magnitude = number.magnitude
        var digits: (UInt64, UInt64, UInt64) = (0, 0, 0)   // 24 bytes, enough for 20 digits
        var count = 0
        withUnsafeMutableBytes(of: &digits) { buffer in
            repeat {
                buffer[count] = UInt8(truncatingIfNeeded: 48 + magnitude % 10)
                magnitude /= 10
                count += 1
            } while magnitude > 0
            for position in stride(from: count - 1, through: 0, by: -1) { out.append(buffer[position]) }
        }
    }
}

/// Incremental SHA-256 through libcrypto's EVP interface.
final class SHA256Hasher {
    private let context: OpaquePointer

    init() {
        guard let context = EVP_MD_CTX_new() else { fatalError("EVP_MD_CTX_new failed (out of memory)") }
        self.context = context
        guard EVP_DigestInit_ex(context, EVP_sha256(), nil) == 1 else { fatalError("EVP_DigestInit_ex(sha256) failed") }
    }

    deinit { EVP_MD_CTX_free(context) }

    /// Feeds `bytes` to the hash.
    func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress, bytes.count > 0 else { return }
        guard EVP_DigestUpdate(context, base, bytes.count) == 1 else { fatalError("EVP_DigestUpdate failed") }
    }

    /// Finishes the hash and returns it as 64 lowercase hex digits.
    func finalizeHex() -> String {
        var digest = [UInt8](repeating: 0, count: Int(EVP_MAX_MD_SIZE))
        var length: UInt32 = 0
        guard EVP_DigestFinal_ex(context, &digest, &length) == 1 else { fatalError("EVP_DigestFinal_ex failed") }
        let hex = Array("0123456789abcdef".utf8)
        var out = [UInt8]()
        out.reserveCapacity(Int(length) * 2)
        for byte in digest.prefix(Int(length)) {
            out.append(hex[Int(byte >> 4)])
            out.append(hex[Int(byte & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// SHA-256 of `bytes` in one call, as lowercase hex.
    static func hex(of bytes: [UInt8]) -> String {
        let hasher = SHA256Hasher()
        bytes.withUnsafeBytes { hasher.update($0) }
        return hasher.finalizeHex()
    }
}
