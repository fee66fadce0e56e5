import Foundation
import CZlib

/// gzip (RFC 1952) through zlib, for answers a client says it accepts compressed.
enum Gzip {
    /// Answers smaller than this are sent as they are: the gzip header and trailer would eat the gain.
    static let minimumLength = 1_024
    /// zlib's level: 3 keeps most of the gain of 6 on JSON at about half its CPU.
    static let level: Int32 = 3

    /// `bytes` gzip-compressed, or nil when zlib fails (the caller then sends them as they are). The work is
    /// linear in `bytes.count`, which the answer's own limits bound.
    static func compress(_ bytes: [UInt8]) -> [UInt8]? {
        var stream = z_stream()
        // windowBits 15 + 16 asks zlib for the gzip wrapper; memLevel 8 is zlib's default.
        guard deflateInit2_(&stream, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY, zlibVersion(),
                            Int32(MemoryLayout<z_stream>.size)) == Z_OK else { return nil }
        defer { deflateEnd(&stream) }
        var output = [UInt8](repeating: 0, count: Int(deflateBound(&stream, uLong(bytes.count))))
        let status: Int32 = bytes.withUnsafeBufferPointer { input in
            output.withUnsafeMutableBufferPointer { out in
                stream.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
                stream.avail_in = uInt(input.count)
                stream.next_out = out.baseAddress
                stream.avail_out = uInt(out.count)
                return deflate(&stream, Z_FINISH)
            }
        }
        guard status == Z_STREAM_END else { return nil }
        return Array(output.prefix(Int(stream.total_out)))
    }

    /// Whether an `Accept-Encoding` value accepts gzip: `gzip` (or `x-gzip`, or `*`) listed with a
    /// q-value above 0, and gzip not refused by name with `q=0`.
    static func isAccepted(_ acceptEncoding: String?) -> Bool {
        guard let acceptEncoding, acceptEncoding.utf8.count <= 1_000 else { return false }
        var named: Bool? = nil, wildcard = false
        for entry in acceptEncoding.split(separator: ",") {
            let parts = entry.split(separator: ";")
            guard let coding = parts.first?.trimmingCharacters(in: .whitespaces).lowercased() else { continue }
            var quality = 1.0
            for parameter in parts.dropFirst() {
                let pair = parameter.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
                if pair.count == 2, pair[0].lowercased() == "q" { quality = Double(pair[1]) ?? 0 }
            }
            if coding == "gzip" || coding == "x-gzip" { named = (named ?? false) || quality > 0 }
            else if coding == "*" { wildcard = quality > 0 }
        }
        return named ?? wildcard
    }
}

extension HTTPResponse {
    /// Content types worth compressing: text the API and the pages send.
    private static let compressibleTypes = ["application/json", "text/", "application/javascript", "image/svg+xml",
                                            "application/manifest+json"]

    /// This answer gzip-compressed when the request accepts gzip and the answer is compressible text of at
    /// least `Gzip.minimumLength` bytes without an encoding of its own; with `Vary: Accept-Encoding` on
    /// every answer it could have compressed, so a cache keeps the two forms apart.
    ///
    /// A compressed answer's `ETag` becomes `"…-gzip"`, so the two forms never share a strong tag; a 304
    /// to a client that accepts gzip carries that tag too (the form it would have been sent).
    func compressed(accepting acceptEncoding: String?) -> HTTPResponse {
        if status == 304 {
            guard Gzip.isAccepted(acceptEncoding), let tag = header("ETag") else { return self }
            var response = self
            response.setHeader("ETag", Self.gzipEntityTag(tag))
            response.headers.append((name: "Vary", value: "Accept-Encoding"))
            return response
        }
        guard let type = header("Content-Type")?.lowercased(),
              Self.compressibleTypes.contains(where: { type.hasPrefix($0) }),
              header("Content-Encoding") == nil, status != 204 else { return self }
        var response = self
        response.headers.append((name: "Vary", value: "Accept-Encoding"))
        guard body.count >= Gzip.minimumLength, Gzip.isAccepted(acceptEncoding),
              let gzipped = Gzip.compress(body), gzipped.count < body.count else { return response }
        response.body = gzipped
        response.headers.append((name: "Content-Encoding", value: "gzip"))
        if let tag = header("ETag") { response.setHeader("ETag", Self.gzipEntityTag(tag)) }
        return response
    }

    /// `"abc"` as `"abc-gzip"` (a weak `W/"abc"` as `W/"abc-gzip"`).
    static func gzipEntityTag(_ tag: String) -> String {
        tag.hasSuffix("\"") ? String(tag.dropLast()) + "-gzip\"" : tag
    }

    /// An `If-None-Match` value with every `-gzip` tag named as its plain form.
    static func plainEntityTags(_ condition: String) -> String {
        condition.replacingOccurrences(of: "-gzip\"", with: "\"")
    }

    private mutating func setHeader(_ name: String, _ value: String) {
        headers.removeAll { $0.name.lowercased() == name.lowercased() }
        headers.append((name: name, value: value))
    }
}
