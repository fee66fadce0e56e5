import Foundation
import LatticeCore

/// One asset field of a record, as `assets/upload` and `assets/rereference` name it (CloudKit's Asset Field
/// Dictionary): the record, its type (upload only) and the field.
public struct AssetFieldToken: Sendable, Hashable {
    public var recordName: String
    public var recordType: String?
    public var fieldName: String

    public init(recordName: String, recordType: String? = nil, fieldName: String) {
        self.recordName = recordName
        self.recordType = recordType
        self.fieldName = fieldName
    }

    init(json: JSON, path: String) throws(ServiceError) {
        let object = json.objectValue ?? [:]
        guard let recordName = object["recordName"]?.stringValue else {
            throw ServiceError.badRequest("\(path).recordName must be a string")
        }
        do throws(NameError) {
            try Names.validate(recordName, kind: .recordName)
        } catch {
            throw ServiceError.badRequest("\(path).recordName: \(error.description)")
        }
        guard let fieldName = object["fieldName"]?.stringValue, !fieldName.isEmpty, fieldName.utf8.count <= 255 else {
            throw ServiceError.badRequest("\(path).fieldName must be a field name (1 to 255 bytes)")
        }
        var recordType: String?
        if let value = object["recordType"], value != .null {
            guard let type = value.stringValue, !type.isEmpty, type.utf8.count <= 255 else {
                throw ServiceError.badRequest("\(path).recordType must be a record type (1 to 255 bytes)")
            }
            recordType = type
        }
        self.init(recordName: recordName, recordType: recordType, fieldName: fieldName)
    }

    /// The body's `zoneID` (the default zone when left out) and its fields under `key`.
    static func read(_ json: JSON, key: String, limits: RequestLimits) throws(ServiceError) -> (WireZoneID, [AssetFieldToken]) {
        let reader = RequestReader(json)
        let zoneID = reader["zoneID"] == nil ? WireZoneID(zoneName: Names.systemZoneName) : try reader.zoneID()
        var fields: [AssetFieldToken] = []
        for (index, item) in try reader.items(key, limit: limits.maximumResultsLimit).enumerated() {
            fields.append(try AssetFieldToken(json: item, path: "\(key)[\(index)]"))
        }
        return (zoneID, fields)
    }

    var json: JSON {
        var writer = RequestWriter()
        writer.set("recordName", recordName)
        writer.set("recordType", recordType)
        writer.set("fieldName", fieldName)
        return writer.json
    }
}

/// `assets/upload {"zoneID", "tokens": [{"recordType", "recordName", "fieldName"}]}`: one upload URL per token.
public struct AssetsUploadRequest: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var tokens: [AssetFieldToken]

    public init(zoneID: WireZoneID, tokens: [AssetFieldToken]) {
        self.zoneID = zoneID
        self.tokens = tokens
    }

    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        (zoneID, tokens) = try AssetFieldToken.read(json, key: "tokens", limits: limits)
    }

    public var json: JSON {
        .object(["zoneID": zoneID.json, "tokens": .array(tokens.map(\.json))])
    }
}

/// `assets/rereference {"zoneID", "assets": [{"recordName", "fieldName"}]}`: receipts for the assets that
/// records the caller can read already hold, so the caller may save them into other records.
public struct AssetsRereferenceRequest: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var assets: [AssetFieldToken]

    public init(zoneID: WireZoneID, assets: [AssetFieldToken]) {
        self.zoneID = zoneID
        self.assets = assets
    }

    public init(json: JSON, limits: RequestLimits) throws(ServiceError) {
        (zoneID, assets) = try AssetFieldToken.read(json, key: "assets", limits: limits)
    }

    public var json: JSON {
        .object(["zoneID": zoneID.json, "assets": .array(assets.map(\.json))])
    }
}

/// What an upload's last byte answers (CloudKit's `{"singleFile": {...}}`), and what `records/modify` takes
/// as an ASSETID value: the SHA-256 (`fileChecksum`, base64), the size and the upload's receipt.
public struct AssetReceipt: Sendable, Hashable {
    public var asset: AssetValue
    public var receipt: String

    public init(asset: AssetValue, receipt: String) {
        self.asset = asset
        self.receipt = receipt
    }

    /// The asset dictionary: `{"fileChecksum", "size", "receipt"}`.
    public var value: JSON {
        .object(["fileChecksum": .string(asset.fileChecksum), "size": .int(asset.size), "receipt": .string(receipt)])
    }

    /// The upload's answer.
    public var json: JSON { .object(["singleFile": value]) }

    /// Reads an upload's answer (`{"singleFile": {...}}`) or a bare asset dictionary.
    public init(json: JSON) throws(ServiceError) {
        let value = json.objectValue?["singleFile"] ?? json
        guard let receipt = value.objectValue?["receipt"]?.stringValue else {
            throw ServiceError.badRequest("an upload receipt has singleFile.receipt")
        }
        let parsed: ScalarValue
        do throws(RecordJSONError) {
            parsed = try ScalarValue(cloudKitJSON: value, type: .asset, path: "singleFile")
        } catch {
            throw ServiceError.badRequest(error.description)
        }
        guard case .asset(let asset) = parsed else { throw ServiceError.badRequest("singleFile is not an asset") }
        self.init(asset: asset, receipt: receipt)
    }
}
