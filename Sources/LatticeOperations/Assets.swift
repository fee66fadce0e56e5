import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore
import Synchronization

/// Assets (CKAsset): CloudKit's three steps, the bytes' rules, and their collection.
///
/// 1. `assets/upload` names record fields and answers one upload URL per field. The URL is a capability
///    (256 random bits, stored as their SHA-256) that expires with the upload (`AssetSettings.uploadLifetime`).
/// 2. The client sends the bytes to the URL (`POST`, the whole body), or in pieces that resume after a cut
///    connection (`HEAD` answers `Upload-Offset`, `PATCH` with `Upload-Offset` appends: tus 1.0's core
///    protocol). The bytes stream into the backend's content store (`AssetContentStore`) as they arrive; the
///    last one answers CloudKit's receipt (`{"singleFile": {"fileChecksum", "size", "receipt"}}`) once the
///    bytes are durable, checksummed (SHA-256) and visible as a blob: the database's only copy of those bytes.
/// 3. `records/modify` saves an ASSETID field with the receipt's dictionary. A record write that adds an
///    asset needs the blob in the record's database and a claim of the writer's on it (they uploaded the
///    bytes, or `assets/rereference` gave them a receipt from a record they can read). Fetched records carry a
///    `downloadURL` per asset: signed, short-lived, with no bearer token, checked again at each use.
public struct Assets: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    var settings: AssetSettings { core.configuration.assets }
}

extension Assets: OperationArea {}

/// Asset limits and times (`lattice serve --asset-*`).
public struct AssetSettings: Sendable, Hashable {
    /// The largest asset (CloudKit Web Services': 50 MB), checked against a request's declared length before
    /// its body is read.
    public var maximumAssetBytes: Int64 = 50 * 1024 * 1024
    /// How long an upload URL stays usable; an upload still incomplete then is removed with its bytes.
    public var uploadLifetimeMilliseconds: Int64 = 24 * 3_600_000
    /// How long a blob no record references (and no claim names) is kept before it is collected, counted
    /// from its last upload, claim or reference; and how long a claim lasts.
    public var graceMilliseconds: Int64 = 24 * 3_600_000
    /// How long a download URL works.
    public var downloadURLLifetimeSeconds: Int64 = 3_600
    /// Incomplete uploads one user may have at once.
    public var openUploadsPerUser = 200
    /// How long a request that sends bytes may hold its upload before another may take it over: longer than
    /// the longest such request may last (`HTTPServerConfiguration.streamedBodyTimeoutSeconds`, 30 minutes,
    /// plus a minute). A request that ends gives it back at once.
    public var leaseMilliseconds: Int64 = 31 * 60_000

    public init() {}
}

// MARK: - Step 1: upload URLs

extension Assets {
    /// `assets/upload`: one upload URL per token, `{"tokens": [{"recordName", "recordType", "fieldName", "url"}]}`.
    public func requestUploads(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try AssetsUploadRequest(json: .object(body), limits: requestLimits)
        let now = configuration.now()
        let made: [(AssetFieldToken, String)] = try core.write(deadline: caller.deadline) { tx, _ in
            let zoneID = try zones.zoneID(request.zoneID, caller)
            let resolved = try zones.resolveZone(zoneID, caller, tx, creatingDefault: true)
            let zone = try resolved.existingZone()
            let open = try tx.openAssetUploadCount(userID: caller.user.id, nowMs: now)
            guard open + request.tokens.count <= settings.openUploadsPerUser else {
                throw ServiceError(.limitExceeded, "you have \(open) uploads open; the limit is \(settings.openUploadsPerUser) "
                                   + "(finish them, or wait \(settings.uploadLifetimeMilliseconds / 3_600_000) hours for them to expire)")
            }
            var made: [(AssetFieldToken, String)] = []
            for (index, token) in request.tokens.enumerated() {
                if resolved.isShared {
                    do {
                        try checkParticipantUpload(token.recordName, resolved, zone: zone, tx)
                    } catch let error as ServiceError {
                        throw ServiceError(error.code, "tokens[\(index)]: \(error.reason)")
                    }
                }
                let secret = try Secrets.randomBytes(32)
                _ = try tx.insertAssetUpload(StoredAssetUpload(
                    secretHash: Secrets.sha256(secret), receipt: Secrets.hex(try Secrets.randomBytes(16)),
                    databaseID: zone.databaseID, zoneRowID: zone.rowID, recordType: token.recordType ?? "",
                    recordName: token.recordName, fieldName: token.fieldName, userID: caller.user.id,
                    content: newAssetContentID(nowMs: now), createdMs: now,
                    expiresMs: now + settings.uploadLifetimeMilliseconds))
                made.append((token, Base64URL.encode(secret)))
            }
            return made
        }
        return .object(["tokens": .array(made.map { token, secret in
            var object: [String: JSON] = ["recordName": .string(token.recordName), "fieldName": .string(token.fieldName),
                                          "url": .string(core.publicURL + Self.uploadPath + secret)]
            if let type = token.recordType { object["recordType"] = .string(type) }
            return .object(object)
        })])
    }

    /// Where upload URLs point, before their secret.
    public static let uploadPath = "/assets/upload/"
    /// Where download URLs point, before their token.
    public static let downloadPath = "/assets/download/"

    /// A participant uploads into a shared zone only with write access: to the record's share when the
    /// record exists, else through some share of the zone they may write in (the save that follows is
    /// judged by the record rules: a new record must land inside a share they can write).
    func checkParticipantUpload(_ recordName: String, _ resolved: ResolvedZone, zone: StoredZone,
                                _ tx: any StorageTransaction) throws {
        let live = try tx.record(zoneRowID: zone.rowID, name: recordName).map { !$0.deleted } ?? false
        if live, let grant = try shares.grant(for: recordName, resolved, tx) {
            guard grant.permission == .readWrite else {
                throw ServiceError(.permissionFailure, "you have read-only access to record \(recordName)")
            }
            return
        }
        guard resolved.grants.contains(where: { $0.permission == .readWrite }) else {
            throw ServiceError(.permissionFailure, "you have read-only access to this share")
        }
    }

    /// Whether `userID` may still write into the zone: its owner (or anyone, in the public database), or a
    /// participant with write access through one of its shares.
    func mayWrite(userID: Int64, databaseID: Int64, zoneRowID: Int64, _ tx: any StorageTransaction) throws -> Bool {
        guard let database = try tx.database(id: databaseID) else { return false }
        if database.key.kind == .public || database.key.ownerID == userID { return true }
        for share in try tx.shares(zoneRowID: zoneRowID) where try shares.roster(share, tx).access(of: userID) == .readWrite {
            return true
        }
        return false
    }

    /// Whether `userID` may read the record: the database's owner (or anyone, in the public database), or a
    /// participant of a share it is in.
    func mayRead(userID: Int64, databaseID: Int64, zoneRowID: Int64, recordName: String, _ tx: any StorageTransaction) throws -> Bool {
        guard let database = try tx.database(id: databaseID) else { return false }
        if database.key.kind == .public || database.key.ownerID == userID { return true }
        guard let zone = try tx.zone(rowID: zoneRowID), !zone.deleted else { return false }
        for share in try tx.shares(zoneRowID: zoneRowID) where try shares.roster(share, tx).access(of: userID) != .none {
            if try shares.isMember(recordName, of: share, zone: zone, tx) { return true }
        }
        return false
    }
}

// MARK: - Step 2: the bytes

/// How a request sends an upload's bytes.
public enum AssetUploadMethod: Sendable {
    /// CloudKit's: the body is the asset from its first byte (a `POST` to the upload URL). It may stop short
    /// when `Upload-Length` says more follows; a `POST` always starts the upload over.
    case create
    /// tus's `PATCH`: the body continues the upload at `offset`, which must be what the server holds.
    case append(offset: Int64)
}

/// What a request that sends bytes declares in its head.
public struct AssetUploadHead: Sendable {
    public var method: AssetUploadMethod
    /// `Content-Length`; nil for a chunked body.
    public var bodyLength: Int64?
    /// `Upload-Length`: the whole asset's length, when the body is not all of it.
    public var uploadLength: Int64?
    public var contentType: String?

    public init(method: AssetUploadMethod, bodyLength: Int64?, uploadLength: Int64?, contentType: String?) {
        self.method = method
        self.bodyLength = bodyLength
        self.uploadLength = uploadLength
        self.contentType = contentType
    }
}

/// Where an upload stands after a request.
public enum AssetUploadOutcome: Sendable {
    /// Complete: the receipt (`AssetReceipt.json`).
    case complete(AssetReceipt)
    /// Bytes kept so far, of the asset's length.
    case partial(offset: Int64, length: Int64)
}

/// What `beginUpload` decided: receive the body, or answer the receipt of an upload already complete.
public enum AssetUploadStart: Sendable {
    case receive(AssetReceiver)
    case complete(AssetReceipt)
}

/// An upload's state for `HEAD`.
public struct AssetUploadStatus: Sendable {
    public var offset: Int64
    /// Nil until a request declared it.
    public var length: Int64?
    public var receipt: AssetReceipt?
}

extension Assets {
    /// The upload a URL's secret names, not expired. - Throws: NOT_FOUND.
    func upload(secret: String, _ tx: any StorageTransaction) throws -> StoredAssetUpload {
        guard let bytes = Base64URL.decode(secret), bytes.count == 32,
              let upload = try tx.assetUpload(secretHash: Secrets.sha256(bytes)),
              upload.expiresMs > configuration.now() else {
            throw ServiceError(.notFound, "this upload URL is unknown or expired; ask assets/upload for a new one")
        }
        return upload
    }

    func receipt(_ upload: StoredAssetUpload) -> AssetReceipt? {
        guard let checksum = upload.checksum, upload.length >= 0,
              let asset = AssetValue(checksum: checksum, size: upload.length) else { return nil }
        return AssetReceipt(asset: asset, receipt: upload.receipt)
    }

    /// `HEAD` of an upload URL: the bytes kept so far (tus's `Upload-Offset`), the declared length, and the
    /// receipt once complete.
    public func uploadStatus(secret: String, deadline: RequestDeadline?) throws -> AssetUploadStatus {
        let upload = try storage.read(deadline: deadline) { tx in try self.upload(secret: secret, tx) }
        if let receipt = receipt(upload) { return AssetUploadStatus(offset: upload.length, length: upload.length, receipt: receipt) }
        let offset = try storage.assetContents.length(of: upload.content)
        return AssetUploadStatus(offset: offset, length: upload.length >= 0 ? upload.length : nil, receipt: nil)
    }

    /// Everything judged before a request's body is read (its head only): the upload exists and is open; the
    /// lengths are known and within the per-asset limit and the database's quota; a `PATCH`'s offset is what
    /// the server holds; the uploader may still write the zone; no other request holds the upload. Then the
    /// request takes the upload's lease and gets a receiver for the body. A complete upload answers its
    /// receipt again instead (a retried last request).
    public func beginUpload(secret: String, _ head: AssetUploadHead, deadline: RequestDeadline?) throws -> AssetUploadStart {
        let now = configuration.now()
        let contents = storage.assetContents
        let upload = try storage.read(deadline: deadline) { tx in try self.upload(secret: secret, tx) }
        if let receipt = receipt(upload) { return .complete(receipt) }
        // Another request sending this upload's bytes now (the lease is taken for good below).
        if let lease = upload.lease, upload.leaseUntilMs >= now,
           !lease.hasPrefix(configuration.nodeName + ":") || lease.hasPrefix(core.assetLeaseHolder + ":") {
            throw Self.uploadBusy
        }
        let known: Int64? = upload.length >= 0 ? upload.length : nil
        let offset: Int64
        switch head.method {
        case .create: offset = 0
        case .append(let given):
            let held = try contents.length(of: upload.content)
            guard given == held else {
                throw ServiceError(.conflict, "Upload-Offset is \(given), but the server holds \(held) bytes of this upload; "
                                   + "continue from \(held)")
            }
            offset = given
        }
        guard let length = head.uploadLength ?? known ?? (offset == 0 ? head.bodyLength : nil) else {
            throw ServiceError.badRequest("an upload needs its length: send Content-Length (or Upload-Length)")
        }
        if let known, known != length {
            throw ServiceError(.conflict, "this upload is \(known) bytes long, not \(length)")
        }
        guard length <= settings.maximumAssetBytes else {
            throw ServiceError(.limitExceeded, "the asset is \(length) bytes; the limit is \(settings.maximumAssetBytes) bytes per asset")
        }
        if let body = head.bodyLength, offset + body > length {
            throw ServiceError.badRequest("the body (\(body) bytes from offset \(offset)) runs past the asset's \(length) bytes")
        }
        // This request's own lease: this process's prefix (a restarted node takes its earlier process's
        // leases over), then an id of the request, so two requests of one process never share one.
        // A server over its disk budget takes no new bytes (as it takes no record that adds data).
        try core.checkDiskBudget("an asset upload")
        let holder = core.assetLeaseHolder + ":" + Secrets.hex(try Secrets.randomBytes(8))
        try core.write(deadline: deadline) { tx, _ in
            guard let database = try tx.database(id: upload.databaseID) else {
                throw ServiceError(.notFound, "the upload's database is gone")
            }
            guard database.bytesUsed + length <= configuration.quotaBytesPerDatabase else {
                throw ServiceError(.quotaExceeded, "the asset (\(length) bytes) would put the database over its quota of "
                                   + "\(configuration.quotaBytesPerDatabase) bytes (\(database.bytesUsed) used)")
            }
            guard try mayWrite(userID: upload.userID, databaseID: upload.databaseID, zoneRowID: upload.zoneRowID, tx) else {
                throw ServiceError(.permissionFailure, "the uploader can no longer write in this zone")
            }
            guard try tx.leaseAssetUpload(rowID: upload.rowID, holder: holder, untilMs: now + settings.leaseMilliseconds,
                                          nowMs: now, nodePrefix: configuration.nodeName + ":",
                                          processPrefix: core.assetLeaseHolder + ":") else {
                throw Self.uploadBusy
            }
            if known == nil { try tx.declareAssetUpload(rowID: upload.rowID, length: length, contentType: head.contentType) }
        }
        do {
            if case .create = head.method { try contents.remove(upload.content) }
            let appender = try contents.appender(for: upload.content, at: offset)
            return .receive(AssetReceiver(assets: self, upload: upload, holder: holder, length: length, offset: offset,
                                          appender: appender, contentType: upload.contentType ?? head.contentType))
        } catch {
            releaseLease(upload, holder: holder)
            throw internalError(error)
        }
    }

    static let uploadBusy = ServiceError(.tryAgainLater, "another request is sending this upload's bytes", retryAfter: 5)

    func releaseLease(_ upload: StoredAssetUpload, holder: String) {
        do {
            try core.storage.write(deadline: core.freshDeadline()) { tx in try tx.releaseAssetUpload(rowID: upload.rowID, holder: holder) }
        } catch {
            core.log("assets: could not release the lease of upload \(upload.rowID): \(error) (it lapses by itself)")
        }
    }

    /// Makes a complete upload's bytes a blob: checksums them (from the receiver's running hash, or by
    /// reading them back after a resumed upload), then in one transaction either finds the database's blob of
    /// those bytes (and drops this copy after the commit) or makes this content the blob (charged to the
    /// quota), claims it for the uploader and marks the upload complete.
    func complete(_ upload: StoredAssetUpload, length: Int64, checksum known: [UInt8]?, contentType: String?) throws -> AssetReceipt {
        let contents = storage.assetContents
        let checksum = try known ?? Self.checksum(of: upload.content, length: length, contents)
        let now = configuration.now()
        let duplicate: Bool = try core.write { tx, _ in
            guard let database = try tx.database(id: upload.databaseID) else {
                throw ServiceError(.notFound, "the upload's database is gone")
            }
            var duplicate = false
            if try tx.assetBlob(databaseID: upload.databaseID, checksum: checksum) != nil {
                try tx.touchAssetBlob(databaseID: upload.databaseID, checksum: checksum, nowMs: now)
                duplicate = true
            } else {
                guard database.bytesUsed + length <= configuration.quotaBytesPerDatabase else {
                    throw ServiceError(.quotaExceeded, "the asset (\(length) bytes) would put the database over its quota of "
                                       + "\(configuration.quotaBytesPerDatabase) bytes (\(database.bytesUsed) used)")
                }
                try tx.insertAssetBlob(StoredAssetBlob(databaseID: upload.databaseID, checksum: checksum, size: length,
                                                       content: upload.content, contentType: contentType,
                                                       createdMs: now, touchedMs: now))
            }
            try tx.claimAsset(databaseID: upload.databaseID, checksum: checksum, userID: upload.userID, nowMs: now)
            try tx.completeAssetUpload(rowID: upload.rowID, checksum: checksum)
            return duplicate
        }
        // The same bytes were stored already: this copy goes (the upload row keeps its id only).
        if duplicate {
            do { try contents.remove(upload.content) } catch { core.log("assets: could not remove a duplicate upload: \(error)") }
        }
        guard let asset = AssetValue(checksum: checksum, size: length) else {
            throw ServiceError(.internalError, "an upload produced no asset")
        }
        return AssetReceipt(asset: asset, receipt: upload.receipt)
    }

    /// SHA-256 of the first `length` bytes of a content, read back in 256 KiB pieces.
    static func checksum(of content: String, length: Int64, _ contents: any AssetContentStore) throws -> [UInt8] {
        let hasher = SHA256Stream()
        var buffer = [UInt8](repeating: 0, count: 256 * 1024)
        var offset: Int64 = 0
        while offset < length {
            let want = Int(min(Int64(buffer.count), length - offset))
            let got = try buffer.withUnsafeMutableBytes { raw in
                try contents.read(content, at: offset, into: UnsafeMutableRawBufferPointer(rebasing: raw[..<want]))
            }
            guard got > 0 else { throw StorageError.failure("asset content \(content) ends at \(offset) of \(length) bytes") }
            buffer.withUnsafeBytes { raw in hasher.update(UnsafeRawBufferPointer(rebasing: raw[..<got])) }
            offset += Int64(got)
        }
        return hasher.finish()
    }
}

/// The body of one request that sends an upload's bytes. `receive` runs on the HTTP thread as the pieces
/// arrive (each is appended to the content store, and hashed when the request started at the first byte);
/// `finish` runs once the body is complete; `interrupted` when the connection ended before.
///
/// `@unchecked Sendable`: `lock` guards every `var` (the appender and the hasher are not Sendable); `finish`
/// and `interrupted` take the appender out under the lock and mark the receiver ended, after which no other
/// path reaches it.
public final class AssetReceiver: @unchecked Sendable {
    private let lock = NSLock()
    private var appender: (any AssetAppender)?
    private var hasher: SHA256Stream?
    private var received: Int64 = 0
    private var failure: ServiceError?
    private var ended = false

    private let assets: Assets
    private let upload: StoredAssetUpload
    /// The lease this request holds.
    private let holder: String
    private let length: Int64
    private let offset: Int64
    private let contentType: String?

    init(assets: Assets, upload: StoredAssetUpload, holder: String, length: Int64, offset: Int64, appender: any AssetAppender,
         contentType: String?) {
        self.assets = assets
        self.upload = upload
        self.holder = holder
        self.length = length
        self.offset = offset
        self.contentType = contentType
        self.appender = appender
        hasher = offset == 0 ? SHA256Stream() : nil
    }

    /// Appends one piece. - Throws: LIMIT_EXCEEDED past the asset's length, or the store's failure; the
    /// request then ends with it (what was appended before stays, for a resume).
    public func receive(_ bytes: UnsafeRawBufferPointer) throws {
        lock.lock()
        defer { lock.unlock() }
        if let failure { throw failure }
        guard !ended, let appender else { return }
        guard offset + received + Int64(bytes.count) <= length else {
            let failure = ServiceError(.limitExceeded, "the body runs past the asset's \(length) bytes")
            self.failure = failure
            throw failure
        }
        do {
            try appender.append(bytes)
        } catch {
            let failure = assets.internalError(error)
            self.failure = failure
            throw failure
        }
        hasher?.update(bytes)
        received += Int64(bytes.count)
    }

    /// Takes the appender out (once): the receiver has ended.
    private func end() -> (appender: (any AssetAppender)?, hasher: SHA256Stream?, received: Int64, failure: ServiceError?) {
        lock.lock()
        defer { lock.unlock() }
        guard !ended else { return (nil, nil, received, failure) }
        ended = true
        let taken = (appender, hasher, received, failure)
        appender = nil
        hasher = nil
        return taken
    }

    /// The body is complete: makes what arrived durable, and, at the asset's last byte, makes it a blob.
    public func finish() throws -> AssetUploadOutcome {
        let (appender, hasher, received, failure) = end()
        guard let appender else { throw failure ?? ServiceError(.internalError, "the upload ended twice") }
        // The lease goes back when this request ends, with the completion's own transaction when it completes.
        var completed = false
        defer { if !completed { assets.releaseLease(upload, holder: holder) } }
        defer { appender.close() }
        do { try appender.commit() } catch { throw assets.internalError(error) }
        if let failure { throw failure }
        let end = offset + received
        guard end == length else { return .partial(offset: end, length: length) }
        do {
            let receipt = try assets.complete(upload, length: length, checksum: hasher?.finish(), contentType: contentType)
            completed = true
            return .complete(receipt)
        } catch let error as ServiceError {
            throw error
        } catch {
            throw assets.internalError(error)
        }
    }

    /// The connection ended before the body did (or the request was refused mid-body): keeps what arrived,
    /// durable, for a resume, and gives the upload back. Does nothing after `finish`.
    public func interrupted() {
        guard let appender = end().appender else { return }
        do { try appender.commit() } catch { assets.core.log("assets: could not keep an interrupted upload's bytes: \(error)") }
        appender.close()
        assets.releaseLease(upload, holder: holder)
    }
}

// MARK: - Step 3: records

/// What one record write changes in the assets the record holds: the ones it adds, the checksums it lets go.
struct AssetChanges {
    var added: [AssetValue] = []
    var removed: [[UInt8]] = []
}

extension Assets {
    /// Checks the assets a write adds to a record (those `after` holds and `before` did not): each must be a
    /// blob of the record's database, of the size the value says, claimed by the writer.
    /// Answers what the write changes in the record's assets, which `updateReferences` applies once it is saved.
    func checkAddedAssets(_ after: RecordFrame, before: RecordFrame?, zone: StoredZone, caller: Caller,
                          _ tx: any StorageTransaction) throws -> AssetChanges {
        let now = after.assetValues
        let earlier = before?.assetValues ?? []
        guard !now.isEmpty || !earlier.isEmpty else { return AssetChanges() }
        let held = Set(earlier.map(\.checksum)), kept = Set(now.map(\.checksum))
        let changes = AssetChanges(added: now.filter { !held.contains($0.checksum) },
                                   removed: earlier.map(\.checksum).filter { !kept.contains($0) })
        for asset in changes.added {
            let name = "asset \(asset.fileChecksum)"
            guard let blob = try tx.assetBlob(databaseID: zone.databaseID, checksum: asset.checksum) else {
                throw ServiceError.badRequest("\(name) was not uploaded to this database: upload it (assets/upload) or "
                                              + "rereference it (assets/rereference) first")
            }
            guard blob.size == asset.size else {
                throw ServiceError.badRequest("\(name) is \(blob.size) bytes, not \(asset.size)")
            }
            guard try tx.hasAssetClaim(databaseID: zone.databaseID, checksum: asset.checksum, userID: caller.user.id, sinceMs: 0) else {
                throw ServiceError(.permissionFailure, "\(name) was not uploaded by you: rereference it (assets/rereference) "
                                   + "from a record you can read, or upload it")
            }
            // Touched (the row is locked by the read above on PostgreSQL, and now updated): a collection that
            // waited for this write finds the blob touched and leaves it.
            try tx.touchAssetBlob(databaseID: zone.databaseID, checksum: asset.checksum, nowMs: configuration.now())
        }
        return changes
    }

    /// Keeps `asset_references` in step with a record written (`changes` from `checkAddedAssets`).
    func updateReferences(zone: StoredZone, recordName: String, _ changes: AssetChanges, _ tx: any StorageTransaction) throws {
        if !changes.added.isEmpty {
            try tx.addAssetReferences(databaseID: zone.databaseID, zoneRowID: zone.rowID, recordName: recordName,
                                      checksums: changes.added.map(\.checksum))
        }
        if !changes.removed.isEmpty {
            try tx.removeAssetReferences(databaseID: zone.databaseID, zoneRowID: zone.rowID, recordName: recordName,
                                         checksums: changes.removed, nowMs: configuration.now())
        }
    }

    /// `assets/rereference`: for each named field of a record the caller can read, the receipt of each
    /// asset it holds, and a claim on it, so the caller may save it into another record of the database:
    /// `{"assets": [{"recordName", "fieldName", "value": {...} | [{...}, ...]}]}`, an item's error in its place.
    public func rereference(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try AssetsRereferenceRequest(json: .object(body), limits: requestLimits)
        let now = configuration.now()
        let items: [JSON] = try core.write(deadline: caller.deadline) { tx, _ in
            let zoneID = try zones.zoneID(request.zoneID, caller)
            let resolved = try zones.resolveZone(zoneID, caller, tx)
            try zones.requireZone(resolved)
            return try request.assets.map { token -> JSON in
                var item: [String: JSON] = ["recordName": .string(token.recordName), "fieldName": .string(token.fieldName)]
                let missing = ServiceError(.notFound, "record \(token.recordName) does not exist")
                guard let zone = resolved.zone, let stored = try tx.record(zoneRowID: zone.rowID, name: token.recordName),
                      !stored.deleted else {
                    return missing.json(item: (key: "recordName", value: token.recordName))
                }
                if resolved.isShared, try shares.grant(for: token.recordName, resolved, tx) == nil {
                    return missing.json(item: (key: "recordName", value: token.recordName))
                }
                let record = try decode(stored)
                guard let value = record.values.first(where: { $0.name == token.fieldName })?.value else {
                    return ServiceError(.notFound, "record \(token.recordName) has no field \(token.fieldName)")
                        .json(item: (key: "recordName", value: token.recordName))
                }
                var receipts: [JSON] = []
                let assets: [AssetValue]
                switch value {
                case .scalar(.asset(let asset)): assets = [asset]
                case .list(_, let elements), .set(_, let elements):
                    assets = elements.compactMap { if case .asset(let a) = $0 { a } else { nil } }
                default: assets = []
                }
                guard !assets.isEmpty else {
                    return ServiceError.badRequest("field \(token.fieldName) of record \(token.recordName) holds no asset")
                        .json(item: (key: "recordName", value: token.recordName))
                }
                for asset in assets {
                    try tx.claimAsset(databaseID: zone.databaseID, checksum: asset.checksum, userID: caller.user.id, nowMs: now)
                    try tx.touchAssetBlob(databaseID: zone.databaseID, checksum: asset.checksum, nowMs: now)
                    receipts.append(AssetReceipt(asset: asset, receipt: "rereference").value)
                }
                if case .scalar = value { item["value"] = receipts.first ?? .null } else { item["value"] = .array(receipts) }
                return .object(item)
            }
        }
        return .object(["assets": .array(items)])
    }
}

// MARK: - Downloads

/// Who reads a record answer, and its zone, for the answer's download URLs (`recordJSON`). The zone's row is
/// looked up only when a record holds an asset.
struct AssetLinks {
    let reader: UserAccount
    let zoneRowID: () throws -> Int64

    init(reader: UserAccount, zoneRowID: @escaping () throws -> Int64) {
        self.reader = reader
        self.zoneRowID = zoneRowID
    }

    init(reader: UserAccount, zoneRowID: Int64) {
        self.init(reader: reader, zoneRowID: { zoneRowID })
    }
}

/// An asset a download URL grants, ready to serve.
public struct AssetDownload: Sendable {
    public var content: String
    public var size: Int64
    public var checksum: [UInt8]
    public var contentType: String?
    /// The download's ETag: the checksum, quoted.
    public var etag: String { "\"" + Secrets.hex(checksum) + "\"" }
}

extension Assets {
    /// The download URL of `asset` as `reader` sees it in a record: `…/assets/download/{token}/${f}` (CloudKit's
    /// file-name placeholder: a client puts the file name it wants there, which the answer's
    /// Content-Disposition carries back).
    func downloadURL(_ asset: AssetValue, zoneRowID: Int64, recordName: String, reader: UserAccount) throws -> String {
        let grant = AssetGrant(zoneRowID: zoneRowID, recordName: recordName, checksum: asset.checksum,
                               size: asset.size, readerID: reader.id,
                               expiresAt: configuration.now() / 1000 + settings.downloadURLLifetimeSeconds)
        return core.publicURL + Self.downloadPath + AssetURLToken.sign(grant, key: try core.assetURLKey()) + "/${f}"
    }

    /// The record's JSON with a `downloadURL` in each asset value (of registers and of lists).
    func addDownloadURLs(_ json: JSON, _ record: Record, links: AssetLinks) throws -> JSON {
        let values = record.values
        guard values.contains(where: { _, value in
            switch value {
            case .scalar(.asset), .list(.asset, _): return true
            default: return false
            }
        }) else { return json }
        guard case .object(var object) = json, case .object(var fields)? = object["fields"] else { return json }
        let zoneRowID = try links.zoneRowID()
        var changed = false
        for (name, value) in values {
            guard case .object(var field)? = fields[name] else { continue }
            switch value {
            case .scalar(.asset(let asset)):
                guard case .object(var rendered)? = field["value"] else { continue }
                rendered["downloadURL"] = .string(try downloadURL(asset, zoneRowID: zoneRowID, recordName: record.id.recordName, reader: links.reader))
                field["value"] = .object(rendered)
            case .list(.asset, let elements), .set(.asset, let elements):
                field["value"] = .array(try elements.map { element in
                    guard case .asset(let asset) = element else { return element.cloudKitJSON }
                    var rendered: [String: JSON] = ["fileChecksum": .string(asset.fileChecksum), "size": .int(asset.size)]
                    rendered["downloadURL"] = .string(try downloadURL(asset, zoneRowID: zoneRowID, recordName: record.id.recordName, reader: links.reader))
                    return .object(rendered)
                })
            default:
                continue
            }
            fields[name] = .object(field)
            changed = true
        }
        guard changed else { return json }
        object["fields"] = .object(fields)
        return .object(object)
    }

    /// Checks a download URL's token and the access it grants, now: not tampered with, not expired, the
    /// reader may still read the record, and the record still holds the asset.
    /// - Throws: ACCESS_DENIED for a tampered or expired URL or access that went; NOT_FOUND when the asset is gone.
    public func openDownload(token: String, deadline: RequestDeadline?) throws -> AssetDownload {
        let grant: AssetGrant
        do {
            grant = try AssetURLToken.verify(token, key: try core.assetURLKey(), nowSeconds: configuration.now() / 1000)
        } catch AssetURLToken.Rejection.expired {
            throw ServiceError(.accessDenied, "this download URL has expired; fetch the record again for a fresh one")
        } catch AssetURLToken.Rejection.invalid {
            throw ServiceError(.accessDenied, "this is not a valid download URL")
        }
        return try storage.read(deadline: deadline) { tx in
            guard let zone = try tx.zone(rowID: grant.zoneRowID),
                  try mayRead(userID: grant.readerID, databaseID: zone.databaseID, zoneRowID: grant.zoneRowID,
                              recordName: grant.recordName, tx) else {
                throw ServiceError(.accessDenied, "you no longer have access to this record")
            }
            guard try tx.assetIsReferenced(databaseID: zone.databaseID, checksum: grant.checksum, zoneRowID: grant.zoneRowID,
                                           recordName: grant.recordName),
                  let blob = try tx.assetBlob(databaseID: zone.databaseID, checksum: grant.checksum) else {
                throw ServiceError(.notFound, "the record no longer holds this asset")
            }
            return AssetDownload(content: blob.content, size: blob.size, checksum: blob.checksum, contentType: blob.contentType)
        }
    }
}

// MARK: - Collection

/// What one collection run removed.
public struct AssetCollection: Sendable, Hashable {
    public var uploads = 0
    public var blobs = 0
    public var claims = 0
    public var strays = 0

    public init() {}
}

extension Assets {
    /// Rows one step of the collection handles at most.
    static let collectionBatch = 100

    /// Removes expired uploads (and the bytes of incomplete ones), claims past the grace period, blobs no
    /// record references and no claim names that were untouched for the grace period (row first, then its
    /// bytes), and bytes no row names that are older than the grace period (left by a crash between writing
    /// bytes and their row). One node at a time (the exclusive lock "assets"), each step a short transaction of
    /// its own; a blob a write is saving into a record is locked by that write, and touched by it, so the
    /// collection's conditional delete leaves it.
    @discardableResult
    public func collect(batches: Int = 10) throws -> AssetCollection {
        let now = configuration.now()
        let graceBefore = now - settings.graceMilliseconds
        let contents = storage.assetContents
        var report = AssetCollection()
        let limit = Self.collectionBatch
        for _ in 0..<max(1, batches) {
            let step: (uploads: [StoredAssetUpload], blobs: [StoredAssetBlob], claims: Int)? = try storage.write(
                deadline: core.freshDeadline()) { tx in
                guard try tx.tryExclusiveLock("assets") else { return nil }
                var uploads: [StoredAssetUpload] = []
                for upload in try tx.expiredAssetUploads(nowMs: now, limit: limit) {
                    if upload.lease != nil && upload.leaseUntilMs > now && !upload.isComplete { continue } // still receiving
                    try tx.deleteAssetUpload(rowID: upload.rowID)
                    uploads.append(upload)
                }
                let claims = try tx.forgetAssetClaims(before: graceBefore, limit: limit)
                var blobs: [StoredAssetBlob] = []
                for blob in try tx.collectableAssetBlobs(before: graceBefore, limit: limit)
                where try tx.deleteAssetBlob(blob, before: graceBefore) {
                    blobs.append(blob)
                }
                return (uploads, blobs, claims)
            }
            guard let step else { return report }
            // The rows are gone: their bytes go unless another row still names them (a complete upload's
            // content is its blob's).
            for content in step.uploads.map(\.content) + step.blobs.map(\.content)
            where !(try storage.read({ tx in try tx.assetContentIsKnown(content) })) {
                try contents.remove(content)
            }
            report.uploads += step.uploads.count
            report.blobs += step.blobs.count
            report.claims += step.claims
            if step.uploads.count < limit && step.blobs.count < limit && step.claims < limit { break }
        }
        let strays = try contents.strays(before: graceBefore, limit: limit) { content in
            try storage.read { tx in try tx.assetContentIsKnown(content) }
        }
        for content in strays { try contents.remove(content) }
        report.strays = strays.count
        return report
    }
}
