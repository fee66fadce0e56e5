/// The backend-neutral half of reading rows: the column lists of the tables every backend has (the same
/// names and order on SQLite and PostgreSQL) and the one mapping from a row of them to the stored types.
/// The SQL around the column lists stays in each backend.

import Foundation
import LatticeCore

/// A column value as a backend reads it (SQLite's and PostgreSQL's value types).
protocol StorageColumn {
    /// The integer, 0 for NULL or another type.
    var integer: Int64 { get }
    /// The text, nil for NULL or another type.
    var text: String? { get }
    /// The bytes, empty for NULL or another type.
    var bytes: [UInt8] { get }
    /// Whether the value is NULL.
    var isNull: Bool { get }
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
    /// - Throws: `StorageError.damagedRow` for a public permission no `SharePermission` spells.
    func share(_ row: [Column]) throws -> StoredShare {
        let id = row[0].integer
        let publicPermission = try Self.parse(SharePermission.self, row[7], table: "shares", column: "public_permission",
                                              row: "id \(id)")
        return StoredShare(id: id, publicID: row[1].text ?? "", zoneRowID: row[2].integer, recordName: row[3].text ?? "",
                           rootRecordName: row[4].text, ownerID: row[5].integer, title: row[6].text ?? "",
                           publicPermission: publicPermission, urlEpoch: row[8].integer, deleted: row[9].integer != 0,
                           lastSeq: row[10].integer)
    }

    /// A row of `share_id, user_id, role, permission, status, modified_ms` of `share_participants`.
    /// - Throws: `StorageError.damagedRow` for a role, permission or status no case spells.
    func participant(_ row: [Column]) throws -> StoredParticipant {
        let key = "share \(row[0].integer), user \(row[1].integer)"
        return StoredParticipant(
            shareID: row[0].integer, userID: row[1].integer,
            role: try Self.parse(ShareRole.self, row[2], table: "share_participants", column: "role", row: key),
            permission: try Self.parse(SharePermission.self, row[3], table: "share_participants", column: "permission",
                                       row: key),
            status: try Self.parse(AcceptanceStatus.self, row[4], table: "share_participants", column: "status", row: key),
            modifiedMs: row[5].integer)
    }

    static var deviceColumns: String {
        "device_code_hash, user_code_hash, address, device_name, status, user_id, interval_seconds, last_poll_ms, "
            + "created_ms, expires_ms"
    }

    /// A row of `deviceColumns` of `device_authorizations`.
    /// - Throws: `StorageError.damagedRow` for a status no `DeviceAuthorizationStatus` spells.
    func deviceAuthorization(_ row: [Column]) throws -> StoredDeviceAuthorization {
        StoredDeviceAuthorization(
            deviceCodeHash: row[0].bytes, userCodeHash: row[1].bytes, address: row[2].text ?? "",
            deviceName: row[3].text ?? "",
            status: try Self.parse(DeviceAuthorizationStatus.self, row[4], table: "device_authorizations", column: "status",
                                   row: "created_ms \(row[8].integer)"),
            userID: row[5].isNull ? nil : row[5].integer, intervalSeconds: row[6].integer, lastPollMs: row[7].integer,
            createdMs: row[8].integer, expiresMs: row[9].integer)
    }

    /// The case a stored spelling names.
    /// - Throws: `StorageError.damagedRow` when none does (or the column is NULL).
    static func parse<Value: RawRepresentable>(_ type: Value.Type, _ column: Column, table: String, column name: String,
                                               row: String) throws -> Value where Value.RawValue == String {
        guard let text = column.text, let value = Value(rawValue: text) else {
            throw StorageError.damagedRow(table: table, column: name, row: row, value: column.text)
        }
        return value
    }

    /// `columns` with each name prefixed by a table alias (`s.id, s.public_id, ...`), for joins.
    static func qualified(_ columns: String, by alias: String) -> String {
        columns.split(separator: ",").map { alias + "." + $0.trimmingCharacters(in: .whitespaces) }.joined(separator: ", ")
    }
}
