import LatticeAPI
import LatticeCore
import LatticeStore

/// One area of the operations (records, feeds, deltas, idempotency): a value over the shared core, with
/// what every area reaches through it, so an area reads as its rules and not as plumbing.
protocol OperationArea {
    var core: OperationsCore { get }
}

extension OperationArea {
    var configuration: ServiceConfiguration { core.configuration }
    var storage: any Storage { core.storage }
    var zones: Zones { Zones(core) }
    var shares: Shares { Shares(core) }
    var records: Records { Records(core) }

    /// A fresh stamp from the server's clock.
    func tick() -> Stamp { core.tick() }

    /// A stored row's frame, checked (a damaged row is an internal error, never an unchecked read).
    func frame(_ stored: StoredRecord) throws -> RecordFrame { try core.frame(stored) }

    /// The readable model of a frame, for JSON answers.
    func decode(_ frame: RecordFrame) throws -> Record {
        do {
            return try frame.decoded()
        } catch {
            throw StorageError.failure("record \(frame.recordName) does not decode: \(error)")
        }
    }

    func decode(_ stored: StoredRecord) throws -> Record { try decode(try frame(stored)) }

    /// A stored record as CloudKit's record dictionary plus the server's fields (change tag, created,
    /// modified), with only the fields named in `desiredKeys` (all when nil); the other keys are always there.
    /// `share` names the share record of a hierarchy share rooted at this record (CloudKit's `share`
    /// reference, in the record's zone).
    /// With `links`, each asset value carries a `downloadURL` for its reader.
    func recordJSON(_ stored: StoredRecord, _ record: Record, desiredKeys: Set<String>?, share: String? = nil,
                    links: AssetLinks? = nil) throws -> JSON {
        var rendered = record.cloudKitJSON(fields: desiredKeys)
        if let links { rendered = try Assets(core).addDownloadURLs(rendered, record, links: links) }
        guard case .object(var object) = rendered else { return rendered }
        if let share, !stored.deleted {
            object["share"] = .object(["recordName": .string(share), "zoneID": object["zoneID"] ?? .null])
        }
        object["recordChangeTag"] = .string(stored.changeTag)
        object["created"] = .object(["timestamp": .int(stored.createdMs), "userRecordName": .string(stored.createdBy)])
        object["modified"] = .object(["timestamp": .int(stored.modifiedMs), "userRecordName": .string(stored.modifiedBy)])
        return .object(object)
    }

    /// The caps typed requests are decoded against.
    var requestLimits: RequestLimits {
        RequestLimits(maximumOperations: configuration.maximumOperations, maximumResultsLimit: configuration.maximumResultsLimit,
                      maximumFieldsPerRecord: configuration.maximumFieldsPerRecord,
                      maximumListElements: configuration.maximumListElements,
                      maximumQueryFilters: configuration.maximumQueryFilters,
                      maximumQuerySortKeys: configuration.maximumQuerySortKeys,
                      maximumFilterValues: configuration.maximumFilterValues)
    }

    /// Maps a non-API error (`OperationsCore.serviceError(for:)`).
    func internalError(_ error: any Error) -> ServiceError { core.serviceError(for: error) }
}

extension Records: OperationArea {}
extension Zones: OperationArea {}
