import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeStore

/// The HTTP side of assets (LatticeOperations' `Assets`): the upload URL's bytes (`POST`, tus's `HEAD` and
/// `PATCH`), streamed to the content store as they arrive, and the download URL (`GET`/`HEAD`, `Range`,
/// `ETag`/`If-None-Match`), served from the content store without holding the asset in memory.
extension LatticeService {
    static let assetRoutes: [Route] = [
        .database("assets/upload", growth: .always) { service, context in
            .json(try Assets(service.core).requestUploads(context.caller, context.body))
        },
        .database("assets/rereference") { service, context in
            .json(try Assets(service.core).rereference(context.caller, context.body))
        },
        // The upload URL: its secret is its credential (hidden in the access log). Throttled per address in
        // `admitUpload`, before the body.
        Route(method: "POST", pattern: RoutePattern(Assets.uploadPath + "{secret}"), authentication: .none, lane: .stream,
              throttle: .none, hidesPath: true, handler: .plain { service, request, _ in try service.finishUpload(request) }),
        Route(method: "PATCH", pattern: RoutePattern(Assets.uploadPath + "{secret}"), authentication: .none, lane: .stream,
              throttle: .none, hidesPath: true, handler: .plain { service, request, _ in try service.finishUpload(request) }),
        Route(method: "HEAD", pattern: RoutePattern(Assets.uploadPath + "{secret}"), authentication: .none, lane: .pool,
              throttle: .perAddress, hidesPath: true, handler: .plain { service, request, parameters in
                  try service.uploadStatus(request, secret: parameters["secret"] ?? "")
              }),
        // The download URL: its signed token is its credential; the last segment is the file name wanted.
        Route(method: "GET", pattern: RoutePattern(Assets.downloadPath + "{token}/{name}"), authentication: .none, lane: .pool,
              throttle: .perAddress, hidesPath: true, handler: .plain { service, request, parameters in
                  try service.download(request, token: parameters["token"] ?? "", name: parameters["name"] ?? "")
              }),
    ]

    /// tus's protocol version, on every answer of an upload URL.
    static let tusHeaders: [(name: String, value: String)] = [
        (name: "Tus-Resumable", value: "1.0.0"), (name: "Cache-Control", value: "no-store"),
    ]

    /// Admits a request that sends an upload's bytes, from its head: `Assets.beginUpload` judges it (with
    /// the admission's short deadline: this runs on the HTTP thread) and takes the upload's lease; the body
    /// then streams into the receiver. A complete upload answers its receipt without reading the body.
    func admitUpload(_ head: HTTPRequestHead, _ parameters: RouteParameters, client: String) -> HTTPAdmission {
        do {
            try throttle(key: client)
            let method: AssetUploadMethod
            if head.method == "PATCH" {
                guard let text = head.header("upload-offset"), let offset = Int64(text), offset >= 0 else {
                    throw ServiceError.badRequest("PATCH needs Upload-Offset: the bytes the server holds (HEAD answers it)")
                }
                method = .append(offset: offset)
            } else {
                method = .create
            }
            var uploadLength: Int64?
            if let text = head.header("upload-length") {
                guard let value = Int64(text), value >= 0 else { throw ServiceError.badRequest("Upload-Length must be a byte count") }
                uploadLength = value
            }
            let bodyLength = RequestFraming.declaredLength(head.header("content-length")).map(Int64.init)
            // PATCH's type is tus's application/offset+octet-stream, not the asset's: only a POST names it.
            let contentType = head.method == "PATCH" ? nil : head.header("content-type").flatMap(AssetMedia.uploadedType)
            let deadline = RequestDeadline.after(milliseconds: min(Self.admissionDeadlineMilliseconds,
                                                                   configuration.requestDeadlineMilliseconds))
            let start = try Assets(core).beginUpload(
                secret: parameters["secret"] ?? "",
                AssetUploadHead(method: method, bodyLength: bodyLength, uploadLength: uploadLength, contentType: contentType),
                deadline: deadline)
            switch start {
            case .complete(let receipt):
                return .answer(Self.receiptResponse(receipt))
            case .receive(let receiver):
                return .stream(client: client, sink: AssetUploadSink(receiver: receiver),
                               maximumBytes: Int(clamping: configuration.assets.maximumAssetBytes))
            }
        } catch {
            return .answer(Self.uploadErrorResponse(internalError(error)))
        }
    }

    /// The body of an upload request is in: the receiver makes it durable and, at the last byte, a blob.
    func finishUpload(_ request: HTTPRequest) throws -> HTTPResponse {
        guard let sink = request.principal as? AssetUploadSink else {
            throw ServiceError(.internalError, "an upload's body arrived without its receiver")
        }
        do {
            switch try sink.receiver.finish() {
            case .complete(let receipt):
                return Self.receiptResponse(receipt)
            case .partial(let offset, let length):
                return HTTPResponse(status: 204, headers: Self.tusHeaders + [
                    (name: "Upload-Offset", value: String(offset)), (name: "Upload-Length", value: String(length)),
                ])
            }
        } catch {
            return Self.uploadErrorResponse(internalError(error))
        }
    }

    /// `HEAD` of an upload URL: `Upload-Offset` (the bytes held) and `Upload-Length`, as tus answers them.
    func uploadStatus(_ request: HTTPRequest, secret: String) throws -> HTTPResponse {
        let status = try Assets(core).uploadStatus(secret: secret, deadline: .after(milliseconds: configuration.requestDeadlineMilliseconds))
        var headers = Self.tusHeaders + [(name: "Upload-Offset", value: String(status.offset))]
        if let length = status.length { headers.append((name: "Upload-Length", value: String(length))) }
        return HTTPResponse(status: 200, headers: headers)
    }

    static func receiptResponse(_ receipt: AssetReceipt) -> HTTPResponse {
        HTTPResponse.json(receipt.json).adding(missing: tusHeaders + [(name: "Upload-Offset", value: String(receipt.asset.size))])
    }

    static func uploadErrorResponse(_ error: ServiceError) -> HTTPResponse {
        error.response.adding(missing: tusHeaders)
    }

    /// `GET`/`HEAD` of a download URL: the bytes with their type (passive types only, else
    /// `application/octet-stream`), a safe `Content-Disposition`, `nosniff` and a sandboxing CSP, so nothing
    /// uploaded runs as active content on this origin; `ETag` (the SHA-256) with `If-None-Match`, one
    /// `Range` (with `If-Range`), and `Cache-Control: private, no-cache` (a cached copy is revalidated, so
    /// access that went is noticed).
    func download(_ request: HTTPRequest, token: String, name: String) throws -> HTTPResponse {
        let asset = try Assets(core).openDownload(token: token,
                                                  deadline: .after(milliseconds: configuration.requestDeadlineMilliseconds))
        let type = AssetMedia.servedType(asset.contentType)
        var headers: [(name: String, value: String)] = [
            (name: "ETag", value: asset.etag),
            (name: "Cache-Control", value: "private, no-cache"),
            (name: "Accept-Ranges", value: "bytes"),
            (name: "X-Content-Type-Options", value: "nosniff"),
            (name: "Content-Security-Policy", value: "default-src 'none'; sandbox"),
            (name: "Cross-Origin-Resource-Policy", value: "cross-origin"),
        ]
        if let match = request.header("if-none-match"), AssetMedia.etagMatches(match, asset.etag) {
            return HTTPResponse(status: 304, headers: headers)
        }
        headers += [
            (name: "Content-Type", value: type),
            (name: "Content-Disposition", value: AssetMedia.contentDisposition(name: name, type: type)),
        ]
        var range: ClosedRange<Int64>?
        if let rangeHeader = request.header("range"),
           request.header("if-range").map({ AssetMedia.etagMatches($0, asset.etag) }) ?? true {
            switch AssetMedia.byteRange(rangeHeader, size: asset.size) {
            case .whole: break
            case .range(let bytes): range = bytes
            case .unsatisfiable:
                var refusal = ServiceError(.badRequest, "the range \(rangeHeader) is outside the asset's \(asset.size) bytes").response
                refusal.status = 416
                refusal.headers += [(name: "Content-Range", value: "bytes */\(asset.size)")]
                return refusal
            }
        }
        let start = range?.lowerBound ?? 0
        let length = range.map { $0.upperBound - $0.lowerBound + 1 } ?? asset.size
        if let range { headers.append((name: "Content-Range", value: "bytes \(range.lowerBound)-\(range.upperBound)/\(asset.size)")) }
        let contents = storage.assetContents
        let body: HTTPFileBody
        if let descriptor = try contents.openFile(asset.content) {
            body = HTTPFileBody(descriptor: descriptor, offset: start, length: length)
        } else {
            let content = asset.content
            body = HTTPFileBody(start: start, length: length) { offset, buffer in try contents.read(content, at: offset, into: buffer) }
        }
        return HTTPResponse(status: range == nil ? 200 : 206, headers: headers, file: body)
    }
}

/// A streamed upload body's sink: each piece to the asset receiver; a refusal is the API's error answer.
final class AssetUploadSink: HTTPBodySink {
    let receiver: AssetReceiver

    init(receiver: AssetReceiver) { self.receiver = receiver }

    func receive(_ bytes: UnsafeRawBufferPointer) -> HTTPResponse? {
        do {
            try receiver.receive(bytes)
            return nil
        } catch let error as ServiceError {
            return LatticeService.uploadErrorResponse(error)
        } catch {
            return LatticeService.uploadErrorResponse(ServiceError(.internalError, "the upload failed"))
        }
    }

    func interrupted() { receiver.interrupted() }
}

/// The media rules of assets: which types are kept and served, the file name of `Content-Disposition`,
/// byte ranges and ETags.
enum AssetMedia {
    /// Types served as themselves: passive media only (no HTML, SVG, XML or script: anything a browser could
    /// run as this origin's content). Anything else is served as `application/octet-stream`.
    static let passiveTypes: Set<String> = [
        "image/jpeg", "image/png", "image/gif", "image/webp", "image/avif", "image/heic", "image/heif", "image/bmp",
        "audio/mpeg", "audio/mp4", "audio/ogg", "audio/wav", "audio/webm", "audio/aac", "audio/flac",
        "video/mp4", "video/webm", "video/ogg", "video/quicktime",
        "application/pdf", "text/plain", "application/zip", "application/json",
    ]

    /// Shown in place (an `<img>`, a photo opened from a link); the rest download as attachments.
    static func isInline(_ type: String) -> Bool {
        type.hasPrefix("image/") || type.hasPrefix("audio/") || type.hasPrefix("video/")
    }

    /// An upload's `Content-Type` as kept: its media type, lowercased, without parameters; nil when empty or
    /// not shaped as `type/subtype`.
    static func uploadedType(_ header: String) -> String? {
        let type = header.split(separator: ";").first.map { $0.trimmingCharacters(in: .whitespaces).lowercased() } ?? ""
        let parts = type.split(separator: "/")
        guard parts.count == 2, type.utf8.count <= 100,
              type.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F && $0 != UInt8(ascii: "\"") }) else { return nil }
        return type
    }

    static func servedType(_ stored: String?) -> String {
        guard let stored, passiveTypes.contains(stored) else { return "application/octet-stream" }
        return stored == "text/plain" ? "text/plain; charset=utf-8" : stored
    }

    /// The file name a download URL's last segment asks for, made safe: percent-decoded, only its last path
    /// component, without control characters, quotes or separators, at most 150 bytes; `asset` when nothing
    /// is left (or CloudKit's `${f}` placeholder was not filled in).
    static func safeFileName(_ segment: String) -> String {
        let decoded = segment.removingPercentEncoding ?? segment
        let last = decoded.split(whereSeparator: { $0 == "/" || $0 == "\\" }).last.map(String.init) ?? ""
        var name = ""
        for scalar in last.unicodeScalars {
            if scalar.value < 0x20 || scalar.value == 0x7F || (0x80...0x9F).contains(scalar.value) { continue }
            if "\"';:*?<>|%".unicodeScalars.contains(scalar) { name.unicodeScalars.append("_"); continue }
            if scalar.properties.generalCategory == .format || scalar.properties.generalCategory == .lineSeparator
                || scalar.properties.generalCategory == .paragraphSeparator { continue }
            name.unicodeScalars.append(scalar)
        }
        name = name.trimmingCharacters(in: .whitespaces)
        while name.hasPrefix(".") { name.removeFirst() }
        while name.utf8.count > 150 { name.removeLast() }
        if name.isEmpty || name == "${f}" || name == "$_f_" { return "asset" }
        return name
    }

    /// `attachment` (or `inline` for media) with an ASCII `filename` and the UTF-8 `filename*` (RFC 6266).
    static func contentDisposition(name segment: String, type: String) -> String {
        let name = safeFileName(segment)
        let ascii = String(name.unicodeScalars.map { $0.isASCII ? Character($0) : "_" })
        var encoded = ""
        for byte in name.utf8 {
            let unreserved = (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || "-._~".utf8.contains(byte)
            encoded += unreserved ? String(UnicodeScalar(byte)) : String(format: "%%%02X", byte)
        }
        return "\(isInline(type) ? "inline" : "attachment"); filename=\"\(ascii)\"; filename*=UTF-8''\(encoded)"
    }

    static func etagMatches(_ header: String, _ etag: String) -> Bool {
        header.split(separator: ",").contains { part in
            let tag = part.trimmingCharacters(in: .whitespaces)
            return tag == "*" || tag == etag || tag == "W/" + etag
        }
    }

    enum RangeAnswer: Equatable {
        case whole
        case range(ClosedRange<Int64>)
        case unsatisfiable
    }

    /// One `bytes=` range of RFC 9110 (`a-b`, `a-`, `-n`); several ranges or another unit are answered whole.
    static func byteRange(_ header: String, size: Int64) -> RangeAnswer {
        let text = header.trimmingCharacters(in: .whitespaces)
        guard text.lowercased().hasPrefix("bytes=") else { return .whole }
        let spec = text.dropFirst(6).trimmingCharacters(in: .whitespaces)
        guard !spec.contains(","), let dash = spec.firstIndex(of: "-") else { return .whole }
        let first = spec[..<dash].trimmingCharacters(in: .whitespaces), last = spec[spec.index(after: dash)...].trimmingCharacters(in: .whitespaces)
        if first.isEmpty {
            guard let suffix = Int64(last), suffix >= 0 else { return .whole }
            guard suffix > 0, size > 0 else { return .unsatisfiable }
            return .range(max(0, size - suffix)...(size - 1))
        }
        guard let start = Int64(first), start >= 0 else { return .whole }
        guard start < size else { return .unsatisfiable }
        if last.isEmpty { return .range(start...(size - 1)) }
        guard let end = Int64(last), end >= start else { return .whole }
        return .range(start...min(end, size - 1))
    }
}
