import Foundation
import LatticeCore

/// Assets (CKAsset): files kept beside the records that name them.
///
/// - **Contents** are byte strings named by a content id, kept by the backend's `AssetContentStore`: files
///   under the data directory on SQLite, chunk rows in the database on PostgreSQL (so every node serves every
///   asset with no shared file system). An upload appends to its content; once complete, the content becomes
///   a blob's, or is removed when the database already holds the same bytes.
/// - **Uploads** (`asset_uploads`): one row per upload URL, open until its bytes are complete, then kept (as the
///   receipt's proof) until it expires.
/// - **Blobs** (`asset_blobs`): one row per (database, SHA-256): the same bytes are stored once per database
///   (its owner's), however many records and uploads name them. Their sizes count toward the database's
///   `bytesUsed` (its quota).
/// - **Claims** (`asset_claims`): who may save a blob into a record: the user who uploaded the bytes, or who
///   rereferenced them from a record they can read. A record write that adds an asset is refused unless its
///   writer holds a claim (or the record already held the asset).
/// - **References** (`asset_references`): which records hold which blobs, kept by every record write. A blob
///   with no reference and no claim, untouched for the grace period, is collected.

/// An upload as stored.
public struct StoredAssetUpload: Sendable, Hashable {
    public static let unknownLength: Int64 = -1

    public var rowID: Int64
    /// SHA-256 of the upload URL's secret.
    public var secretHash: [UInt8]
    /// The receipt's id (public: it names the upload, it grants nothing).
    public var receipt: String
    /// The database whose blob the bytes become (the zone owner's).
    public var databaseID: Int64
    public var zoneRowID: Int64
    public var recordType: String
    public var recordName: String
    public var fieldName: String
    /// The user who asked for the upload URL (the uploader).
    public var userID: Int64
    /// Where the bytes go (`AssetContentStore`).
    public var content: String
    /// The asset's length once a request declared it, else `unknownLength`.
    public var length: Int64
    public var contentType: String?
    /// The bytes' SHA-256 once complete.
    public var checksum: [UInt8]?
    /// Who is receiving bytes for it now (a node and its process), and until when.
    public var lease: String?
    public var leaseUntilMs: Int64
    public var createdMs: Int64
    public var expiresMs: Int64

    public var isComplete: Bool { checksum != nil }

    public init(rowID: Int64 = 0, secretHash: [UInt8], receipt: String, databaseID: Int64, zoneRowID: Int64,
                recordType: String, recordName: String, fieldName: String, userID: Int64, content: String,
                length: Int64 = StoredAssetUpload.unknownLength, contentType: String? = nil, checksum: [UInt8]? = nil,
                lease: String? = nil, leaseUntilMs: Int64 = 0, createdMs: Int64, expiresMs: Int64) {
        self.rowID = rowID
        self.secretHash = secretHash
        self.receipt = receipt
        self.databaseID = databaseID
        self.zoneRowID = zoneRowID
        self.recordType = recordType
        self.recordName = recordName
        self.fieldName = fieldName
        self.userID = userID
        self.content = content
        self.length = length
        self.contentType = contentType
        self.checksum = checksum
        self.lease = lease
        self.leaseUntilMs = leaseUntilMs
        self.createdMs = createdMs
        self.expiresMs = expiresMs
    }
}

/// A blob: the bytes of one checksum in one database.
public struct StoredAssetBlob: Sendable, Hashable {
    public var databaseID: Int64
    public var checksum: [UInt8]
    public var size: Int64
    public var content: String
    public var contentType: String?
    public var createdMs: Int64
    /// When it was last uploaded, claimed or unreferenced: the grace period of collection counts from here.
    public var touchedMs: Int64

    public init(databaseID: Int64, checksum: [UInt8], size: Int64, content: String, contentType: String?,
                createdMs: Int64, touchedMs: Int64) {
        self.databaseID = databaseID
        self.checksum = checksum
        self.size = size
        self.content = content
        self.contentType = contentType
        self.createdMs = createdMs
        self.touchedMs = touchedMs
    }
}

/// The asset rows (Assets.swift).
public protocol AssetStorage {
    // MARK: Uploads

    func insertAssetUpload(_ upload: StoredAssetUpload) throws -> StoredAssetUpload
    /// The upload whose URL secret hashes to `secretHash` (locked in a write transaction on a multi-writer backend).
    func assetUpload(secretHash: [UInt8]) throws -> StoredAssetUpload?
    /// Open (incomplete) uploads of a user that have not expired.
    func openAssetUploadCount(userID: Int64, nowMs: Int64) throws -> Int
    /// Takes the upload's lease for `holder` until `untilMs` if no one holds it (or their lease ended, or it is
    /// an earlier process's of this node: it starts with `nodePrefix` but not with `processPrefix`); false otherwise.
    func leaseAssetUpload(rowID: Int64, holder: String, untilMs: Int64, nowMs: Int64, nodePrefix: String,
                          processPrefix: String) throws -> Bool
    /// Gives the lease back if `holder` has it.
    func releaseAssetUpload(rowID: Int64, holder: String) throws
    /// Sets the declared length (and content type) of an upload that had none.
    func declareAssetUpload(rowID: Int64, length: Int64, contentType: String?) throws
    /// Marks the upload complete with its checksum and releases its lease.
    func completeAssetUpload(rowID: Int64, checksum: [UInt8]) throws
    /// At most `limit` uploads expired at `nowMs` (open ones past their time, complete ones past theirs).
    func expiredAssetUploads(nowMs: Int64, limit: Int) throws -> [StoredAssetUpload]
    func deleteAssetUpload(rowID: Int64) throws

    // MARK: Blobs

    /// The blob (locked in a write transaction on a multi-writer backend, so collection waits for it).
    func assetBlob(databaseID: Int64, checksum: [UInt8]) throws -> StoredAssetBlob?
    /// Inserts a blob and charges its size to the database. - Throws: `StorageError.duplicate` if it exists.
    func insertAssetBlob(_ blob: StoredAssetBlob) throws
    /// Restarts the blob's grace period.
    func touchAssetBlob(databaseID: Int64, checksum: [UInt8], nowMs: Int64) throws
    /// At most `limit` blobs with no reference and no claim, untouched since `beforeMs`.
    func collectableAssetBlobs(before beforeMs: Int64, limit: Int) throws -> [StoredAssetBlob]
    /// Deletes the blob if it still has no reference and no claim and is untouched since `beforeMs`, giving
    /// back its bytes; false when it stays.
    func deleteAssetBlob(_ blob: StoredAssetBlob, before beforeMs: Int64) throws -> Bool
    /// Whether any blob or upload row names `content`.
    func assetContentIsKnown(_ content: String) throws -> Bool
    /// The content ids blob and upload rows name, after `after`, at most `limit`, in order.
    func assetContentIDs(after: String, limit: Int) throws -> [String]

    // MARK: Claims

    /// Lets `userID` save the blob into records (refreshing an existing claim's time).
    func claimAsset(databaseID: Int64, checksum: [UInt8], userID: Int64, nowMs: Int64) throws
    /// Whether `userID` holds a claim on the blob made at or after `sinceMs`.
    func hasAssetClaim(databaseID: Int64, checksum: [UInt8], userID: Int64, sinceMs: Int64) throws -> Bool
    /// Forgets claims made before `beforeMs`; returns how many went.
    func forgetAssetClaims(before beforeMs: Int64, limit: Int) throws -> Int

    // MARK: References

    /// Records that the record holds these blobs.
    func addAssetReferences(databaseID: Int64, zoneRowID: Int64, recordName: String, checksums: [[UInt8]]) throws
    /// Records that the record no longer holds these blobs; each blob's grace period restarts at `nowMs`.
    func removeAssetReferences(databaseID: Int64, zoneRowID: Int64, recordName: String, checksums: [[UInt8]],
                               nowMs: Int64) throws
    /// Removes every reference of a zone's records (the zone was deleted); the blobs' grace periods restart.
    func removeAssetReferences(zoneRowID: Int64, nowMs: Int64) throws
    /// Whether the record holds the blob.
    func assetIsReferenced(databaseID: Int64, checksum: [UInt8], zoneRowID: Int64, recordName: String) throws -> Bool

    // MARK: Chunks (the database-backed content store)

    /// Stores `bytes` at `position` of `content`.
    func insertAssetChunk(content: String, position: Int64, bytes: [UInt8]) throws
    /// The chunk of `content` that holds `position` (its start and bytes), nil past the end.
    func assetChunk(content: String, containing position: Int64) throws -> (position: Int64, bytes: [UInt8])?
    /// The bytes of `content` stored so far.
    func assetChunkLength(content: String) throws -> Int64
    /// Deletes the chunks of `content`.
    func deleteAssetChunks(content: String) throws
    /// Content ids with chunks, after `after`, at most `limit`, in order.
    func assetChunkContents(after: String, limit: Int) throws -> [String]
}

/// Where asset bytes live, by content id. Implementations are safe from any thread.
public protocol AssetContentStore: Sendable {
    /// The bytes of `content` kept so far (0 when none).
    func length(of content: String) throws -> Int64
    /// A writer that appends to `content`, whose length must be `offset`.
    func appender(for content: String, at offset: Int64) throws -> any AssetAppender
    /// Reads up to `buffer.count` bytes of `content` from `offset` into `buffer`; returns how many (0 at the
    /// end; fewer than asked is not the end: ask again from there).
    func read(_ content: String, at offset: Int64, into buffer: UnsafeMutableRawBufferPointer) throws -> Int
    /// An open file descriptor of the content for serving it without copies (the caller closes it), or nil
    /// when the store keeps no files.
    func openFile(_ content: String) throws -> Int32?
    /// Removes the content (nothing when it is not there).
    func remove(_ content: String) throws
    /// Content ids the store holds that `isKnown` does not claim and that are older than `beforeMs` (leaks of
    /// a crash between writing bytes and their row), at most `limit`.
    func strays(before beforeMs: Int64, limit: Int, isKnown: (String) throws -> Bool) throws -> [String]
}

/// Appends to one content; not shared between threads.
public protocol AssetAppender: AnyObject {
    func append(_ bytes: UnsafeRawBufferPointer) throws
    /// Makes what was appended durable (`fsync`, or the chunk rows committed): `length(of:)` counts it.
    func commit() throws
    /// Ends the writer (after `commit`, or to drop what was not committed).
    func close()
}

enum AssetTables {
    static func migration(integer: String, text: String, blob: String, key: String) -> String {
        """
        CREATE TABLE asset_uploads(
            id \(key),
            secret_hash \(blob) NOT NULL UNIQUE,
            receipt \(text) NOT NULL UNIQUE,
            database_id \(integer) NOT NULL,
            zone_id \(integer) NOT NULL,
            record_type \(text) NOT NULL,
            record_name \(text) NOT NULL,
            field_name \(text) NOT NULL,
            user_id \(integer) NOT NULL,
            content \(text) NOT NULL,
            length \(integer) NOT NULL,
            content_type \(text),
            checksum \(blob),
            lease \(text),
            lease_until_ms \(integer) NOT NULL,
            created_ms \(integer) NOT NULL,
            expires_ms \(integer) NOT NULL);
        CREATE INDEX asset_uploads_user ON asset_uploads(user_id, expires_ms);
        CREATE INDEX asset_uploads_expiry ON asset_uploads(expires_ms);
        CREATE TABLE asset_blobs(
            database_id \(integer) NOT NULL,
            checksum \(blob) NOT NULL,
            size \(integer) NOT NULL,
            content \(text) NOT NULL,
            content_type \(text),
            created_ms \(integer) NOT NULL,
            touched_ms \(integer) NOT NULL,
            PRIMARY KEY (database_id, checksum));
        CREATE INDEX asset_blobs_touched ON asset_blobs(touched_ms);
        CREATE INDEX asset_blobs_content ON asset_blobs(content);
        CREATE TABLE asset_claims(
            database_id \(integer) NOT NULL,
            checksum \(blob) NOT NULL,
            user_id \(integer) NOT NULL,
            created_ms \(integer) NOT NULL,
            PRIMARY KEY (database_id, checksum, user_id));
        CREATE INDEX asset_claims_created ON asset_claims(created_ms);
        CREATE TABLE asset_references(
            database_id \(integer) NOT NULL,
            checksum \(blob) NOT NULL,
            zone_id \(integer) NOT NULL,
            record_name \(text) NOT NULL,
            PRIMARY KEY (database_id, checksum, zone_id, record_name));
        CREATE INDEX asset_references_record ON asset_references(zone_id, record_name);
        CREATE TABLE asset_chunks(
            content \(text) NOT NULL,
            position \(integer) NOT NULL,
            data \(blob) NOT NULL,
            PRIMARY KEY (content, position));
        CREATE INDEX asset_uploads_content ON asset_uploads(content);
        """
    }

    static let all: [StorageTables.Table] = [
        ("asset_uploads", ["id", "secret_hash", "receipt", "database_id", "zone_id", "record_type", "record_name",
                           "field_name", "user_id", "content", "length", "content_type", "checksum", "lease",
                           "lease_until_ms", "created_ms", "expires_ms"], "id"),
        ("asset_blobs", ["database_id", "checksum", "size", "content", "content_type", "created_ms", "touched_ms"],
         "database_id, checksum"),
        ("asset_claims", ["database_id", "checksum", "user_id", "created_ms"], "database_id, checksum, user_id"),
        ("asset_references", ["database_id", "checksum", "zone_id", "record_name"],
         "database_id, checksum, zone_id, record_name"),
        ("asset_chunks", ["content", "position", "data"], "content, position"),
    ]
}

/// The asset SQL, written once: each backend runs it through `assetRows`/`assetRun` (`?` placeholders, which
/// PostgreSQL's backend numbers), with `assetLock` after single-row reads of a write transaction.
protocol PortableAssetSQL: AssetStorage, StorageRowMapping {
    func assetRows(_ sql: String, _ values: [StorageValue]) throws -> [[Column]]
    @discardableResult func assetRun(_ sql: String, _ values: [StorageValue]) throws -> Int
    /// A row lock clause for reads that decide a write (empty on a one-writer backend).
    var assetLock: String { get }
    /// Moves `bytes` onto (negative: off) the database's `bytesUsed`.
    func releaseBytes(_ bytes: Int64, databaseID: Int64) throws
}

extension PortableAssetSQL {
    private static var uploadColumns: String {
        "id, secret_hash, receipt, database_id, zone_id, record_type, record_name, field_name, user_id, content, length, "
            + "content_type, checksum, lease, lease_until_ms, created_ms, expires_ms"
    }

    private func upload(_ row: [Column]) -> StoredAssetUpload {
        StoredAssetUpload(rowID: row[0].integer, secretHash: row[1].bytes, receipt: row[2].text ?? "",
                          databaseID: row[3].integer, zoneRowID: row[4].integer, recordType: row[5].text ?? "",
                          recordName: row[6].text ?? "", fieldName: row[7].text ?? "", userID: row[8].integer,
                          content: row[9].text ?? "", length: row[10].integer, contentType: row[11].text,
                          checksum: row[12].isNull ? nil : row[12].bytes, lease: row[13].text,
                          leaseUntilMs: row[14].integer, createdMs: row[15].integer, expiresMs: row[16].integer)
    }

    private static var blobColumns: String { "database_id, checksum, size, content, content_type, created_ms, touched_ms" }

    private func blob(_ row: [Column]) -> StoredAssetBlob {
        StoredAssetBlob(databaseID: row[0].integer, checksum: row[1].bytes, size: row[2].integer, content: row[3].text ?? "",
                        contentType: row[4].text, createdMs: row[5].integer, touchedMs: row[6].integer)
    }

    private func optional(_ text: String?) -> StorageValue { text.map(StorageValue.text) ?? .null }

    func insertAssetUpload(_ upload: StoredAssetUpload) throws -> StoredAssetUpload {
        let rows = try assetRows("INSERT INTO asset_uploads(secret_hash, receipt, database_id, zone_id, record_type, record_name, "
                                 + "field_name, user_id, content, length, content_type, checksum, lease, lease_until_ms, created_ms, "
                                 + "expires_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id", [
            .blob(upload.secretHash), .text(upload.receipt), .integer(upload.databaseID), .integer(upload.zoneRowID),
            .text(upload.recordType), .text(upload.recordName), .text(upload.fieldName), .integer(upload.userID),
            .text(upload.content), .integer(upload.length), optional(upload.contentType),
            upload.checksum.map(StorageValue.blob) ?? .null, optional(upload.lease), .integer(upload.leaseUntilMs),
            .integer(upload.createdMs), .integer(upload.expiresMs)])
        var stored = upload
        stored.rowID = rows.first?[0].integer ?? 0
        return stored
    }

    func assetUpload(secretHash: [UInt8]) throws -> StoredAssetUpload? {
        try assetRows("SELECT \(Self.uploadColumns) FROM asset_uploads WHERE secret_hash = ?\(assetLock)",
                      [.blob(secretHash)]).first.map(upload)
    }

    func openAssetUploadCount(userID: Int64, nowMs: Int64) throws -> Int {
        Int(try assetRows("SELECT count(*) FROM asset_uploads WHERE user_id = ? AND expires_ms > ? AND checksum IS NULL",
                          [.integer(userID), .integer(nowMs)]).first?[0].integer ?? 0)
    }

    func leaseAssetUpload(rowID: Int64, holder: String, untilMs: Int64, nowMs: Int64, nodePrefix: String,
                          processPrefix: String) throws -> Bool {
        try assetRun("UPDATE asset_uploads SET lease = ?, lease_until_ms = ? WHERE id = ? AND checksum IS NULL AND "
                     + "(lease IS NULL OR lease_until_ms < ? OR (substr(lease, 1, CAST(? AS INTEGER)) = ? AND substr(lease, 1, CAST(? AS INTEGER)) <> ?))", [
            .text(holder), .integer(untilMs), .integer(rowID), .integer(nowMs),
            .integer(Int64(nodePrefix.utf8.count)), .text(nodePrefix),
            .integer(Int64(processPrefix.utf8.count)), .text(processPrefix)]) > 0
    }

    func releaseAssetUpload(rowID: Int64, holder: String) throws {
        try assetRun("UPDATE asset_uploads SET lease = NULL, lease_until_ms = 0 WHERE id = ? AND lease = ?",
                     [.integer(rowID), .text(holder)])
    }

    func declareAssetUpload(rowID: Int64, length: Int64, contentType: String?) throws {
        try assetRun("UPDATE asset_uploads SET length = ?, content_type = ? WHERE id = ? AND length < 0",
                     [.integer(length), optional(contentType), .integer(rowID)])
    }

    func completeAssetUpload(rowID: Int64, checksum: [UInt8]) throws {
        try assetRun("UPDATE asset_uploads SET checksum = ?, lease = NULL, lease_until_ms = 0 WHERE id = ?",
                     [.blob(checksum), .integer(rowID)])
    }

    func expiredAssetUploads(nowMs: Int64, limit: Int) throws -> [StoredAssetUpload] {
        try assetRows("SELECT \(Self.uploadColumns) FROM asset_uploads WHERE expires_ms <= ? ORDER BY expires_ms LIMIT ?",
                      [.integer(nowMs), .integer(Int64(max(0, limit)))]).map(upload)
    }

    func deleteAssetUpload(rowID: Int64) throws {
        try assetRun("DELETE FROM asset_uploads WHERE id = ?", [.integer(rowID)])
    }

    func assetBlob(databaseID: Int64, checksum: [UInt8]) throws -> StoredAssetBlob? {
        try assetRows("SELECT \(Self.blobColumns) FROM asset_blobs WHERE database_id = ? AND checksum = ?\(assetLock)",
                      [.integer(databaseID), .blob(checksum)]).first.map(blob)
    }

    func insertAssetBlob(_ blob: StoredAssetBlob) throws {
        let inserted = try assetRun("INSERT INTO asset_blobs(\(Self.blobColumns)) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING", [
            .integer(blob.databaseID), .blob(blob.checksum), .integer(blob.size), .text(blob.content), optional(blob.contentType),
            .integer(blob.createdMs), .integer(blob.touchedMs)])
        guard inserted > 0 else { throw StorageError.duplicate("an asset with this checksum") }
        try releaseBytes(-blob.size, databaseID: blob.databaseID)
    }

    func touchAssetBlob(databaseID: Int64, checksum: [UInt8], nowMs: Int64) throws {
        try assetRun("UPDATE asset_blobs SET touched_ms = ? WHERE database_id = ? AND checksum = ? AND touched_ms < ?",
                     [.integer(nowMs), .integer(databaseID), .blob(checksum), .integer(nowMs)])
    }

    private static var unreferenced: String {
        "NOT EXISTS (SELECT 1 FROM asset_references r WHERE r.database_id = b.database_id AND r.checksum = b.checksum) "
            + "AND NOT EXISTS (SELECT 1 FROM asset_claims c WHERE c.database_id = b.database_id AND c.checksum = b.checksum)"
    }

    func collectableAssetBlobs(before beforeMs: Int64, limit: Int) throws -> [StoredAssetBlob] {
        try assetRows("SELECT \(Self.blobColumns) FROM asset_blobs b WHERE touched_ms < ? AND \(Self.unreferenced) "
                      + "ORDER BY touched_ms LIMIT ?", [.integer(beforeMs), .integer(Int64(max(0, limit)))]).map(blob)
    }

    func deleteAssetBlob(_ blob: StoredAssetBlob, before beforeMs: Int64) throws -> Bool {
        let deleted = try assetRun("DELETE FROM asset_blobs WHERE database_id = ? AND checksum = ? AND touched_ms < ? AND "
                                   + "database_id IN (SELECT b.database_id FROM asset_blobs b WHERE b.database_id = ? AND "
                                   + "b.checksum = ? AND \(Self.unreferenced))", [
            .integer(blob.databaseID), .blob(blob.checksum), .integer(beforeMs), .integer(blob.databaseID), .blob(blob.checksum)])
        guard deleted > 0 else { return false }
        try releaseBytes(blob.size, databaseID: blob.databaseID)
        return true
    }

    func assetContentIsKnown(_ content: String) throws -> Bool {
        try !assetRows("SELECT 1 FROM asset_blobs WHERE content = ? UNION ALL SELECT 1 FROM asset_uploads WHERE content = ? LIMIT 1",
                       [.text(content), .text(content)]).isEmpty
    }

    func assetContentIDs(after: String, limit: Int) throws -> [String] {
        try assetRows("SELECT content FROM (SELECT content FROM asset_blobs UNION SELECT content FROM asset_uploads) c "
                      + "WHERE content > ? ORDER BY content LIMIT ?", [.text(after), .integer(Int64(max(0, limit)))])
            .compactMap { $0[0].text }
    }

    func claimAsset(databaseID: Int64, checksum: [UInt8], userID: Int64, nowMs: Int64) throws {
        try assetRun("INSERT INTO asset_claims(database_id, checksum, user_id, created_ms) VALUES (?, ?, ?, ?) "
                     + "ON CONFLICT (database_id, checksum, user_id) DO UPDATE SET created_ms = excluded.created_ms",
                     [.integer(databaseID), .blob(checksum), .integer(userID), .integer(nowMs)])
    }

    func hasAssetClaim(databaseID: Int64, checksum: [UInt8], userID: Int64, sinceMs: Int64) throws -> Bool {
        try !assetRows("SELECT 1 FROM asset_claims WHERE database_id = ? AND checksum = ? AND user_id = ? AND created_ms >= ?",
                       [.integer(databaseID), .blob(checksum), .integer(userID), .integer(sinceMs)]).isEmpty
    }

    func forgetAssetClaims(before beforeMs: Int64, limit: Int) throws -> Int {
        let rows = try assetRows("SELECT database_id, checksum, user_id FROM asset_claims WHERE created_ms < ? ORDER BY created_ms LIMIT ?",
                                 [.integer(beforeMs), .integer(Int64(max(0, limit)))])
        for row in rows {
            // A claim lasts the grace period, and its upload (or rereference) touched the blob when it was made:
            // a blob whose last claim goes now has had no claim and no reference for the grace period at least.
            try assetRun("DELETE FROM asset_claims WHERE database_id = ? AND checksum = ? AND user_id = ? AND created_ms < ?",
                         [.integer(row[0].integer), .blob(row[1].bytes), .integer(row[2].integer), .integer(beforeMs)])
        }
        return rows.count
    }

    func addAssetReferences(databaseID: Int64, zoneRowID: Int64, recordName: String, checksums: [[UInt8]]) throws {
        for checksum in checksums {
            try assetRun("INSERT INTO asset_references(database_id, checksum, zone_id, record_name) VALUES (?, ?, ?, ?) "
                         + "ON CONFLICT DO NOTHING", [.integer(databaseID), .blob(checksum), .integer(zoneRowID), .text(recordName)])
        }
    }

    func removeAssetReferences(databaseID: Int64, zoneRowID: Int64, recordName: String, checksums: [[UInt8]], nowMs: Int64) throws {
        for checksum in checksums {
            try assetRun("DELETE FROM asset_references WHERE database_id = ? AND checksum = ? AND zone_id = ? AND record_name = ?",
                         [.integer(databaseID), .blob(checksum), .integer(zoneRowID), .text(recordName)])
            try touchAssetBlob(databaseID: databaseID, checksum: checksum, nowMs: nowMs)
        }
    }

    func removeAssetReferences(zoneRowID: Int64, nowMs: Int64) throws {
        try assetRun("UPDATE asset_blobs SET touched_ms = ? WHERE touched_ms < ? AND EXISTS (SELECT 1 FROM asset_references r "
                     + "WHERE r.zone_id = ? AND r.database_id = asset_blobs.database_id AND r.checksum = asset_blobs.checksum)",
                     [.integer(nowMs), .integer(nowMs), .integer(zoneRowID)])
        try assetRun("DELETE FROM asset_references WHERE zone_id = ?", [.integer(zoneRowID)])
    }

    func assetIsReferenced(databaseID: Int64, checksum: [UInt8], zoneRowID: Int64, recordName: String) throws -> Bool {
        try !assetRows("SELECT 1 FROM asset_references WHERE database_id = ? AND checksum = ? AND zone_id = ? AND record_name = ?",
                       [.integer(databaseID), .blob(checksum), .integer(zoneRowID), .text(recordName)]).isEmpty
    }

    func insertAssetChunk(content: String, position: Int64, bytes: [UInt8]) throws {
        try assetRun("INSERT INTO asset_chunks(content, position, data) VALUES (?, ?, ?)",
                     [.text(content), .integer(position), .blob(bytes)])
    }

    func assetChunk(content: String, containing position: Int64) throws -> (position: Int64, bytes: [UInt8])? {
        guard let row = try assetRows("SELECT position, data FROM asset_chunks WHERE content = ? AND position <= ? "
                                      + "ORDER BY position DESC LIMIT 1", [.text(content), .integer(position)]).first else {
            return nil
        }
        let bytes = row[1].bytes
        guard position < row[0].integer + Int64(bytes.count) else { return nil }
        return (row[0].integer, bytes)
    }

    func assetChunkLength(content: String) throws -> Int64 {
        guard let row = try assetRows("SELECT position, length(data) FROM asset_chunks WHERE content = ? "
                                      + "ORDER BY position DESC LIMIT 1", [.text(content)]).first else { return 0 }
        return row[0].integer + row[1].integer
    }

    func deleteAssetChunks(content: String) throws {
        try assetRun("DELETE FROM asset_chunks WHERE content = ?", [.text(content)])
    }

    func assetChunkContents(after: String, limit: Int) throws -> [String] {
        try assetRows("SELECT DISTINCT content FROM asset_chunks WHERE content > ? ORDER BY content LIMIT ?",
                      [.text(after), .integer(Int64(max(0, limit)))]).compactMap { $0[0].text }
    }
}

// MARK: - Files

/// The SQLite backend's content store: one file per content under a directory of the data directory
/// (`assets/`), written with `pwrite` and made durable with `fsync` (the file, and the directory the first
/// time a file appears in it) before its length counts.
public final class AssetFileStore: AssetContentStore {
    public let directory: String

    public init(directory: String) throws {
        self.directory = directory
        do {
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        } catch {
            throw StorageError.failure("cannot create the asset directory \(directory): \(error.localizedDescription)")
        }
    }

    /// A content id is the store's own name (letters, digits, `-`), never a path.
    static func isContentID(_ content: String) -> Bool {
        !content.isEmpty && content.utf8.count <= 64
            && content.utf8.allSatisfy { ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x7A) || $0 == 0x2D }
    }

    func path(_ content: String) throws -> String {
        guard Self.isContentID(content) else { throw StorageError.failure("\(content) is not a content id") }
        return directory + "/" + content
    }

    public func length(of content: String) throws -> Int64 {
        var info = stat()
        guard stat(try path(content), &info) == 0 else {
            if errno == ENOENT { return 0 }
            throw StorageError.failure("cannot stat asset content \(content): \(String(cString: strerror(errno)))")
        }
        return Int64(info.st_size)
    }

    public func appender(for content: String, at offset: Int64) throws -> any AssetAppender {
        let filePath = try path(content)
        let existed = access(filePath, F_OK) == 0
        let fd = open(filePath, O_WRONLY | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StorageError.failure("cannot open asset content \(content): \(String(cString: strerror(errno)))") }
        // Whatever lies past the kept length (a write cut by a crash) is dropped before appending.
        guard ftruncate(fd, off_t(offset)) == 0 else {
            let reason = String(cString: strerror(errno))
            close(fd)
            throw StorageError.failure("cannot size asset content \(content): \(reason)")
        }
        if !existed { try syncDirectory() }
        return FileAppender(fd: fd, offset: offset, name: content)
    }

    public func read(_ content: String, at offset: Int64, into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        let fd = open(try path(content), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw StorageError.failure("cannot open asset content \(content): \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        var done = 0
        while done < buffer.count {
            let count = pread(fd, buffer.baseAddress! + done, buffer.count - done, off_t(offset) + off_t(done))
            if count < 0 && errno == EINTR { continue }
            guard count >= 0 else { throw StorageError.failure("cannot read asset content \(content): \(String(cString: strerror(errno)))") }
            if count == 0 { break }
            done += count
        }
        return done
    }

    public func openFile(_ content: String) throws -> Int32? {
        let fd = open(try path(content), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { throw StorageError.failure("cannot open asset content \(content): \(String(cString: strerror(errno)))") }
        return fd
    }

    public func remove(_ content: String) throws {
        guard unlink(try path(content)) == 0 || errno == ENOENT else {
            throw StorageError.failure("cannot remove asset content \(content): \(String(cString: strerror(errno)))")
        }
    }

    public func strays(before beforeMs: Int64, limit: Int, isKnown: (String) throws -> Bool) throws -> [String] {
        guard let names = try? FileManager.default.contentsOfDirectory(atPath: directory) else { return [] }
        var found: [String] = []
        for name in names.sorted() where Self.isContentID(name) {
            var info = stat()
            guard stat(directory + "/" + name, &info) == 0 else { continue }
            let modifiedMs = Int64(info.st_mtim.tv_sec) * 1000 + Int64(info.st_mtim.tv_nsec) / 1_000_000
            guard modifiedMs < beforeMs, try !isKnown(name) else { continue }
            found.append(name)
            if found.count >= limit { break }
        }
        return found
    }

    private func syncDirectory() throws {
        let fd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard fd >= 0 else { throw StorageError.failure("cannot open the asset directory: \(String(cString: strerror(errno)))") }
        defer { close(fd) }
        guard fsync(fd) == 0 else { throw StorageError.failure("cannot sync the asset directory: \(String(cString: strerror(errno)))") }
    }

    private final class FileAppender: AssetAppender {
        private var fd: Int32
        private var offset: Int64
        private let name: String

        init(fd: Int32, offset: Int64, name: String) {
            self.fd = fd
            self.offset = offset
            self.name = name
        }

        deinit { close() }

        func append(_ bytes: UnsafeRawBufferPointer) throws {
            guard fd >= 0 else { throw StorageError.failure("asset content \(name) is closed") }
            var done = 0
            while done < bytes.count {
                let count = pwrite(fd, bytes.baseAddress! + done, bytes.count - done, off_t(offset))
                if count < 0 && errno == EINTR { continue }
                guard count > 0 else {
                    if errno == ENOSPC || errno == EDQUOT { throw StorageError.diskFull }
                    throw StorageError.failure("cannot write asset content \(name): \(String(cString: strerror(errno)))")
                }
                done += count
                offset += Int64(count)
            }
        }

        func commit() throws {
            guard fd >= 0 else { return }
            guard fsync(fd) == 0 else {
                if errno == ENOSPC || errno == EDQUOT { throw StorageError.diskFull }
                throw StorageError.failure("cannot sync asset content \(name): \(String(cString: strerror(errno)))")
            }
        }

        func close() {
            if fd >= 0 { _ = Glibc.close(fd) }
            fd = -1
        }
    }
}

/// A fresh content id: the time (so strays sort by age in listings) and 96 random bits, in hex.
public func newAssetContentID(nowMs: Int64) -> String {
    var generator = SystemRandomNumberGenerator()
    let random = (0..<3).map { _ in String(format: "%08x", UInt32.random(in: .min ... .max, using: &generator)) }.joined()
    return String(format: "%012llx", UInt64(max(0, nowMs))) + "-" + random
}

// MARK: - Chunk rows

/// The content store of a database backend (PostgreSQL): each content is rows of `asset_chunks` of at most
/// `chunkSize` bytes, keyed by their position, so every node reads and resumes every content. An appender
/// keeps at most one chunk in memory and writes each chunk in a transaction of its own once it is full, and
/// the last partial one at `commit`: what a crash loses is the chunk being filled, and an upload resumes
/// from the last chunk written.
public struct AssetChunkStore: AssetContentStore {
    public static let chunkSize = 1 << 20
    let storage: any Storage

    public init(storage: any Storage) { self.storage = storage }

    public func length(of content: String) throws -> Int64 {
        try storage.read { tx in try tx.assetChunkLength(content: content) }
    }

    public func appender(for content: String, at offset: Int64) throws -> any AssetAppender {
        let length = try length(of: content)
        guard length == offset else {
            throw StorageError.failure("asset content \(content) holds \(length) bytes, not \(offset)")
        }
        return ChunkAppender(storage: storage, content: content, position: offset)
    }

    /// Reads from the one chunk that holds `offset` (a short read at its end: the caller asks again), so a
    /// reader with a chunk-sized buffer fetches each row once.
    public func read(_ content: String, at offset: Int64, into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        guard buffer.count > 0,
              let chunk = try storage.read({ tx in try tx.assetChunk(content: content, containing: offset) }) else { return 0 }
        let start = Int(offset - chunk.position)
        let count = min(chunk.bytes.count - start, buffer.count)
        chunk.bytes.withUnsafeBytes { bytes in buffer.baseAddress!.copyMemory(from: bytes.baseAddress! + start, byteCount: count) }
        return count
    }

    public func openFile(_ content: String) throws -> Int32? { nil }

    public func remove(_ content: String) throws {
        try storage.write { tx in try tx.deleteAssetChunks(content: content) }
    }

    public func strays(before beforeMs: Int64, limit: Int, isKnown: (String) throws -> Bool) throws -> [String] {
        var found: [String] = []
        var after = ""
        while found.count < limit {
            let contents = try storage.read { tx in try tx.assetChunkContents(after: after, limit: 200) }
            guard let last = contents.last else { break }
            after = last
            for content in contents where assetContentCreatedMs(content).map({ $0 < beforeMs }) ?? true {
                if try !isKnown(content) { found.append(content) }
                if found.count >= limit { break }
            }
        }
        return found
    }

    private final class ChunkAppender: AssetAppender {
        private let storage: any Storage
        private let content: String
        private var position: Int64
        private var pending: [UInt8] = []

        init(storage: any Storage, content: String, position: Int64) {
            self.storage = storage
            self.content = content
            self.position = position
            pending.reserveCapacity(AssetChunkStore.chunkSize)
        }

        func append(_ bytes: UnsafeRawBufferPointer) throws {
            var rest = bytes
            while !rest.isEmpty {
                let take = min(rest.count, AssetChunkStore.chunkSize - pending.count)
                pending.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest[..<take]))
                rest = UnsafeRawBufferPointer(rebasing: rest[take...])
                if pending.count == AssetChunkStore.chunkSize { try flush() }
            }
        }

        private func flush() throws {
            guard !pending.isEmpty else { return }
            let bytes = pending, at = position
            try storage.write { tx in try tx.insertAssetChunk(content: content, position: at, bytes: bytes) }
            position += Int64(bytes.count)
            pending.removeAll(keepingCapacity: true)
        }

        func commit() throws { try flush() }

        func close() { pending = [] }
    }
}

/// When a content id (`newAssetContentID`) was made, nil for a name not made by it.
public func assetContentCreatedMs(_ content: String) -> Int64? {
    guard let dash = content.firstIndex(of: "-") else { return nil }
    return Int64(content[..<dash], radix: 16)
}
