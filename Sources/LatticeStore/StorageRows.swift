/// The backend-neutral half of reading rows: the column lists of the tables every backend has (the same
/// names and order on SQLite and PostgreSQL) and the one mapping from a row of them to the stored types.
/// The SQL around the column lists stays in each backend.

import Foundation

/// A column value as a backend reads it (SQLite's and PostgreSQL's value types).
protocol StorageColumn {
    /// The integer, 0 for NULL or another type.
    var integer: Int64 { get }
    /// The text, nil for NULL or another type.
    var text: String? { get }
    /// The bytes, empty for NULL or another type.
    var bytes: [UInt8] { get }
}

/// A backend's transaction that maps rows of its `Column` type with the shared mappings below.
protocol StorageRowMapping {
    associatedtype Column: StorageColumn
}

extension StorageRowMapping {
    static var databaseColumns: String { "id, kind, environment, owner_id, last_seq, purged_seq, bytes_used" }

    /// A row of `databaseColumns`.
    /// - Throws: `StorageError.failure` for a kind this build does not know.
    func database(_ row: [Column]) throws -> StoredDatabase {
        guard let kind = DatabaseKind(rawValue: row[1].text ?? "") else {
            throw StorageError.failure("database \(row[0].integer) has an unknown kind")
        }
        return StoredDatabase(
            id: row[0].integer, key: DatabaseKey(kind: kind, environment: row[2].text ?? "", ownerID: row[3].integer),
            lastSeq: row[4].integer, purgedSeq: row[5].integer, bytesUsed: row[6].integer)
    }

    static var zoneColumns: String {
        "id, database_id, name, owner_record_name, deleted, last_seq, purged_seq, db_seq, created_ms, modified_ms"
    }

    /// A row of `zoneColumns`.
    func zone(_ row: [Column]) -> StoredZone {
        StoredZone(rowID: row[0].integer, databaseID: row[1].integer, name: row[2].text ?? "",
                   ownerRecordName: row[3].text ?? "", deleted: row[4].integer != 0, lastSeq: row[5].integer,
                   purgedSeq: row[6].integer, databaseSeq: row[7].integer, createdMs: row[8].integer,
                   modifiedMs: row[9].integer)
    }

    static var recordColumns: String {
        "name, record_type, frame, deleted, seq, created_ms, created_by, modified_ms, modified_by, parent_name"
    }

    /// A row of `recordColumns` of the zone `zoneRowID` (its change tag comes from the two).
    func record(_ row: [Column], zoneRowID: Int64) -> StoredRecord {
        let seq = row[4].integer
        return StoredRecord(recordName: row[0].text ?? "", recordType: row[1].text ?? "", frame: row[2].bytes,
                            deleted: row[3].integer != 0, seq: seq,
                            changeTag: StorageRules.changeTag(zoneRowID: zoneRowID, seq: seq),
                            createdMs: row[5].integer, createdBy: row[6].text ?? "", modifiedMs: row[7].integer,
                            modifiedBy: row[8].text ?? "", parentName: row[9].text)
    }

    static var shareColumns: String {
        "id, public_id, zone_id, record_name, root_record_name, owner_id, title, public_permission, url_epoch, deleted, last_seq"
    }

    /// A row of `shareColumns`.
    func share(_ row: [Column]) -> StoredShare {
        StoredShare(id: row[0].integer, publicID: row[1].text ?? "", zoneRowID: row[2].integer, recordName: row[3].text ?? "",
                    rootRecordName: row[4].text, ownerID: row[5].integer, title: row[6].text ?? "",
                    publicPermission: row[7].text ?? "", urlEpoch: row[8].integer, deleted: row[9].integer != 0,
                    lastSeq: row[10].integer)
    }

    /// A row of `share_id, user_id, role, permission, status, modified_ms` of `share_participants`.
    func participant(_ row: [Column]) -> StoredParticipant {
        StoredParticipant(shareID: row[0].integer, userID: row[1].integer, role: row[2].text ?? "",
                          permission: row[3].text ?? "", status: row[4].text ?? "", modifiedMs: row[5].integer)
    }

    /// `columns` with each name prefixed by a table alias (`s.id, s.public_id, ...`), for joins.
    static func qualified(_ columns: String, by alias: String) -> String {
        columns.split(separator: ",").map { alias + "." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", ")
    }
}
