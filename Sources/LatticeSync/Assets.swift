import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LatticeAPI
import LatticeCore

/// A device's asset files: a directory of files named by their SHA-256 (hex), bounded in size.
///
/// - `importFile` hashes a file as it copies it in (never whole in memory) and gives the ASSETID value to put
///   in a record; the file stays until it is uploaded (`markUploaded`), whatever the bound.
/// - Downloaded assets land here too (`store`), checked against their checksum; the least recently used
///   uploaded or downloaded files go when the directory passes `maximumBytes`.
public struct AssetStore: Sendable {
    public let directory: URL
    public let maximumBytes: Int64
    static let pendingSuffix = ".pending"

    public init(directory: URL, maximumBytes: Int64 = 256 << 20) throws {
        self.directory = directory
        self.maximumBytes = maximumBytes
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
    }

    func url(_ asset: AssetValue) -> URL { directory.appendingPathComponent(asset.checksumHex) }

    /// The local file of an asset, if this device has it (touched, for the cache's order).
    public func file(for asset: AssetValue) -> URL? {
        let file = url(asset)
        guard FileManager.default.fileExists(atPath: file.path) else { return nil }
        try? FileManager.default.setAttributes([.modificationDate: Date()], ofItemAtPath: file.path)
        return file
    }

    /// Whether the asset was imported here and not uploaded yet.
    public func isPendingUpload(_ asset: AssetValue) -> Bool {
        FileManager.default.fileExists(atPath: url(asset).path + Self.pendingSuffix)
    }

    /// Copies `source` in, hashing it in 256 KiB pieces, and marks it waiting for upload.
    public func importFile(_ source: URL) throws -> AssetValue {
        guard let input = FileHandle(forReadingAtPath: source.path) else {
            throw LatticeSyncError(.invalidArguments, "cannot read \(source.path)")
        }
        defer { try? input.close() }
        let temporary = directory.appendingPathComponent(".import-\(UUID().uuidString)")
        guard FileManager.default.createFile(atPath: temporary.path, contents: nil, attributes: [.posixPermissions: 0o600]),
              let output = FileHandle(forWritingAtPath: temporary.path) else {
            throw LatticeSyncError(.invalidArguments, "cannot write in \(directory.path)")
        }
        var hasher = SHA256()
        var size: Int64 = 0
        do {
            defer { try? output.close() }
            while true {
                let piece = input.readData(ofLength: 256 * 1024)
                if piece.isEmpty { break }
                piece.withUnsafeBytes { hasher.update($0) }
                try output.write(contentsOf: piece)
                size += Int64(piece.count)
            }
        } catch {
            try? FileManager.default.removeItem(at: temporary)
            throw LatticeSyncError(.invalidArguments, "cannot copy \(source.path): \(error.localizedDescription)")
        }
        guard let asset = AssetValue(checksum: hasher.finish(), size: size) else {
            throw LatticeSyncError(.invalidArguments, "\(source.path) cannot be an asset")
        }
        try place(temporary, as: asset)
        guard FileManager.default.createFile(atPath: url(asset).path + Self.pendingSuffix, contents: nil) else {
            throw LatticeSyncError(.invalidArguments, "cannot mark \(asset.checksumHex) for upload in \(directory.path)")
        }
        return asset
    }

    /// The upload of an imported asset is done: the file may now be evicted like a downloaded one.
    public func markUploaded(_ asset: AssetValue) {
        try? FileManager.default.removeItem(atPath: url(asset).path + Self.pendingSuffix)
        evict()
    }

    /// Moves a downloaded file in after checking its checksum; the cached file.
    func store(_ downloaded: URL, as asset: AssetValue) throws -> URL {
        guard let input = FileHandle(forReadingAtPath: downloaded.path) else {
            throw LatticeSyncError(.serverRejectedRequest, "the downloaded asset is missing")
        }
        var hasher = SHA256()
        var size: Int64 = 0
        while true {
            let piece = input.readData(ofLength: 256 * 1024)
            if piece.isEmpty { break }
            piece.withUnsafeBytes { hasher.update($0) }
            size += Int64(piece.count)
        }
        try? input.close()
        guard hasher.finish() == asset.checksum, size == asset.size else {
            try? FileManager.default.removeItem(at: downloaded)
            throw LatticeSyncError(.serverRejectedRequest, "the downloaded bytes do not match asset \(asset.fileChecksum)")
        }
        try place(downloaded, as: asset)
        evict()
        return url(asset)
    }

    private func place(_ file: URL, as asset: AssetValue) throws {
        let target = url(asset)
        if FileManager.default.fileExists(atPath: target.path) {
            try? FileManager.default.removeItem(at: file)
            return
        }
        do {
            try FileManager.default.moveItem(at: file, to: target)
        } catch {
            throw LatticeSyncError(.invalidArguments, "cannot keep the asset in \(directory.path): \(error.localizedDescription)")
        }
    }

    /// Removes the least recently used files (never one waiting for upload) until the directory fits.
    func evict() {
        let manager = FileManager.default
        guard let names = try? manager.contentsOfDirectory(atPath: directory.path) else { return }
        var files: [(path: String, size: Int64, used: Date)] = []
        var total: Int64 = 0
        for name in names where name.count == 64 {
            let path = directory.appendingPathComponent(name).path
            guard let attributes = try? manager.attributesOfItem(atPath: path) else { continue }
            let size = (attributes[.size] as? NSNumber)?.int64Value ?? 0
            total += size
            if manager.fileExists(atPath: path + Self.pendingSuffix) { continue }
            files.append((path, size, attributes[.modificationDate] as? Date ?? .distantPast))
        }
        for file in files.sorted(by: { $0.used < $1.used }) where total > maximumBytes {
            try? manager.removeItem(atPath: file.path)
            total -= file.size
        }
    }
}

/// Moving asset bytes: `assets/upload` and the upload URL (streamed from the file, resumed after a cut with
/// tus's `HEAD` and `PATCH`), and download URLs (streamed to a file). JSON calls go through `ServerClient`;
/// the bytes through URLSession, which streams a body from a file stream and a download into a file.
public struct AssetTransfer: Sendable {
    let client: ServerClient
    /// Attempts of one upload (a cut connection resumes from what the server holds).
    public var maximumAttempts = 4

    public init(client: ServerClient) { self.client = client }

    /// Uploads `file` (the asset `asset`) for a field of a record; the receipt's dictionary to save.
    public func upload(_ file: URL, asset: AssetValue, database: String, zone: ZoneID, recordName: String, recordType: String,
                       fieldName: String, token: String) async throws -> AssetReceipt {
        let request = AssetsUploadRequest(zoneID: WireZoneID(zoneName: zone.zoneName, ownerRecordName: zone.ownerRecordName),
                                          tokens: [AssetFieldToken(recordName: recordName, recordType: recordType, fieldName: fieldName)])
        let answer = try await client.call(database, "assets/upload", request.json, token: token)
        guard let text = answer["tokens"]?.arrayValue?.first?["url"]?.stringValue, let url = URL(string: text) else {
            throw LatticeSyncError(.serverRejectedRequest, "assets/upload gave no upload URL")
        }
        var offset: Int64 = 0
        var lastError: (any Error)?
        for attempt in 0..<maximumAttempts {
            do {
                if attempt > 0 { offset = try await heldOffset(url) }
                let (status, body) = try await send(file, from: offset, size: asset.size, to: url, resuming: attempt > 0)
                if status == 200 {
                    let receipt = try AssetReceipt(json: try JSON.parse([UInt8](body)))
                    guard receipt.asset == asset else {
                        throw LatticeSyncError(.serverRejectedRequest, "the server hashed the upload to another checksum")
                    }
                    return receipt
                }
                let json = (try? JSON.parse([UInt8](body))) ?? .null
                let error = LatticeSyncError(server: json["serverErrorCode"]?.stringValue ?? "INTERNAL_ERROR",
                                             reason: json["reason"]?.stringValue ?? "upload answered \(status)")
                guard status == 503 || status == 409 else { throw error }
                lastError = error
            } catch let error as LatticeSyncError where !error.isTransient && error.code != .networkUnavailable {
                throw error
            } catch {
                lastError = error
            }
            try await Task.sleep(nanoseconds: UInt64(200_000_000 * (attempt + 1)))
        }
        throw lastError.map(LatticeSyncError.init) ?? LatticeSyncError(.networkUnavailable, "the upload did not finish")
    }

    private func heldOffset(_ url: URL) async throws -> Int64 {
        var request = URLRequest(url: url, timeoutInterval: 30)
        request.httpMethod = "HEAD"
        let (_, response) = try await data(request)
        return Int64(response.value(forHTTPHeaderField: "Upload-Offset") ?? "") ?? 0
    }

    private func send(_ file: URL, from offset: Int64, size: Int64, to url: URL, resuming: Bool) async throws -> (Int, Data) {
        guard let stream = InputStream(fileAtPath: file.path) else {
            throw LatticeSyncError(.invalidArguments, "cannot read \(file.path)")
        }
        if offset > 0 {
            guard stream.setProperty(NSNumber(value: offset), forKey: .fileCurrentOffsetKey) else {
                throw LatticeSyncError(.invalidArguments, "cannot resume reading \(file.path) at byte \(offset)")
            }
        }
        var request = URLRequest(url: url, timeoutInterval: 600)
        request.httpMethod = resuming ? "PATCH" : "POST"
        // A streamed body goes out chunked (URLSession sets Transfer-Encoding itself; a Content-Length beside it
        // would be refused as ambiguous framing): the asset's length travels as tus's Upload-Length.
        request.httpBodyStream = stream
        request.setValue(String(size), forHTTPHeaderField: "Upload-Length")
        request.setValue(resuming ? "application/offset+octet-stream" : "application/octet-stream", forHTTPHeaderField: "Content-Type")
        if resuming { request.setValue(String(offset), forHTTPHeaderField: "Upload-Offset") }
        let (body, response) = try await data(request)
        return (response.statusCode, body)
    }

    private func data(_ request: URLRequest) async throws -> (Data, HTTPURLResponse) {
        try await withCheckedThrowingContinuation { continuation in
            URLSession.shared.dataTask(with: request) { data, response, error in
                if let error {
                    continuation.resume(throwing: LatticeSyncError(.networkUnavailable, error.localizedDescription))
                } else if let response = response as? HTTPURLResponse {
                    continuation.resume(returning: (data ?? Data(), response))
                } else {
                    continuation.resume(throwing: LatticeSyncError(.networkUnavailable, "no HTTP answer"))
                }
            }.resume()
        }
    }

    /// The download URL of a record's asset field (a fresh one: `records/lookup` of that field).
    public func downloadURL(database: String, zone: ZoneID, recordName: String, fieldName: String, asset: AssetValue,
                            token: String) async throws -> URL {
        let body: JSON = .object([
            "zoneID": .object(["zoneName": .string(zone.zoneName), "ownerRecordName": .string(zone.ownerRecordName)]),
            "records": .array([.object(["recordName": .string(recordName)])]), "desiredKeys": .array([.string(fieldName)]),
        ])
        let answer = try await client.call(database, "records/lookup", body, token: token)
        let value = answer["records"]?.arrayValue?.first?["fields"]?[fieldName]?["value"]
        let candidates = value?.arrayValue ?? value.map { [$0] } ?? []
        guard let found = candidates.first(where: { $0["fileChecksum"]?.stringValue == asset.fileChecksum }),
              let text = found["downloadURL"]?.stringValue?.replacingOccurrences(of: "${f}", with: "asset"),
              let url = URL(string: text) else {
            throw LatticeSyncError(.unknownItem, "record \(recordName) no longer holds asset \(asset.fileChecksum) in \(fieldName)")
        }
        return url
    }

    /// Streams `url` into a file (URLSession's download task); the file, not yet checked.
    public func download(_ url: URL) async throws -> URL {
        try await withCheckedThrowingContinuation { continuation in
            URLSession.shared.downloadTask(with: URLRequest(url: url, timeoutInterval: 600)) { location, response, error in
                let status = (response as? HTTPURLResponse)?.statusCode ?? 0
                if let error {
                    continuation.resume(throwing: LatticeSyncError(.networkUnavailable, error.localizedDescription))
                } else if status != 200 {
                    continuation.resume(throwing: LatticeSyncError(.serverRejectedRequest, "the download answered \(status)"))
                } else if let location {
                    // The task's file goes when this returns: keep it under a name of ours.
                    let kept = FileManager.default.temporaryDirectory.appendingPathComponent("lattice-asset-\(UUID().uuidString)")
                    do {
                        try FileManager.default.moveItem(at: location, to: kept)
                        continuation.resume(returning: kept)
                    } catch {
                        continuation.resume(throwing: LatticeSyncError(.networkUnavailable, error.localizedDescription))
                    }
                } else {
                    continuation.resume(throwing: LatticeSyncError(.networkUnavailable, "no file downloaded"))
                }
            }.resume()
        }
    }
}
