import Foundation
import LatticeCore

extension LatticeSyncEngine {
    /// What the engine tells its delegate, as `CKSyncEngine.Event`, one at a time and in this order:
    ///
    /// - On start, and whenever `setAccount(_:)` changes the account: `accountChange`, then `stateUpdate`.
    /// - Soon after the app adds or removes pending changes: `stateUpdate` (asynchronously, one for
    ///   each, carrying the whole state as it is when the event is sent).
    /// - A fetch: `willFetchChanges`; `fetchedDatabaseChanges` (when zones changed or went away) and
    ///   `stateUpdate`; for each changed zone `willFetchRecordZoneChanges`, then per page of changes
    ///   `fetchedRecordZoneChanges` and `stateUpdate`, then `didFetchRecordZoneChanges`; then
    ///   `stateUpdate` (the database's token) and `didFetchChanges`.
    /// - A send: `willSendChanges`; `sentDatabaseChanges` and `stateUpdate` when zones were queued; per
    ///   batch `sentRecordZoneChanges` and `stateUpdate`; then `didSendChanges`.
    ///
    /// A failed fetch or send still ends with its `did` event, then throws.
    public enum Event: Sendable, CustomStringConvertible {
        case stateUpdate(StateUpdate)
        case accountChange(AccountChange)
        case fetchedDatabaseChanges(FetchedDatabaseChanges)
        case fetchedRecordZoneChanges(FetchedRecordZoneChanges)
        case sentDatabaseChanges(SentDatabaseChanges)
        case sentRecordZoneChanges(SentRecordZoneChanges)
        case willFetchChanges(WillFetchChanges)
        case willFetchRecordZoneChanges(WillFetchRecordZoneChanges)
        case didFetchRecordZoneChanges(DidFetchRecordZoneChanges)
        case didFetchChanges(DidFetchChanges)
        case willSendChanges(WillSendChanges)
        case didSendChanges(DidSendChanges)

        /// The event's name, as CKSyncEngine's (`stateUpdate`, `fetchedRecordZoneChanges`, …).
        public var name: String {
            switch self {
            case .stateUpdate: return "stateUpdate"
            case .accountChange: return "accountChange"
            case .fetchedDatabaseChanges: return "fetchedDatabaseChanges"
            case .fetchedRecordZoneChanges: return "fetchedRecordZoneChanges"
            case .sentDatabaseChanges: return "sentDatabaseChanges"
            case .sentRecordZoneChanges: return "sentRecordZoneChanges"
            case .willFetchChanges: return "willFetchChanges"
            case .willFetchRecordZoneChanges: return "willFetchRecordZoneChanges"
            case .didFetchRecordZoneChanges: return "didFetchRecordZoneChanges"
            case .didFetchChanges: return "didFetchChanges"
            case .willSendChanges: return "willSendChanges"
            case .didSendChanges: return "didSendChanges"
            }
        }

        public var description: String { name }

        /// Save it: give it back as `Configuration.stateSerialization` at the next launch.
        public struct StateUpdate: Sendable {
            public let stateSerialization: State.Serialization
        }

        public struct AccountChange: Sendable {
            public enum ChangeType: Sendable {
                /// An account is configured where the saved state had none.
                case signIn(currentUser: String)
                /// The account went away: the state's pending changes and tokens were dropped
                /// (`droppedPendingChanges` lists the record changes that were never sent).
                case signOut(previousUser: String)
                /// Another account (another user, or another server) replaced the saved one: the state's
                /// pending changes and tokens were dropped.
                case switchAccounts(previousUser: String, currentUser: String)
            }

            public let changeType: ChangeType
            /// Record changes queued for the previous account that will not be sent.
            public let droppedPendingChanges: [PendingRecordZoneChange]
        }

        public struct FetchedDatabaseChanges: Sendable {
            public struct Modification: Sendable { public let zoneID: LatticeRecordZone.ID }
            public struct Deletion: Sendable {
                public enum Reason: Sendable { case deleted }
                public let zoneID: LatticeRecordZone.ID
                /// `.deleted`: the owner deleted the zone, or (in the shared database) the share of the
                /// whole zone ended for this user.
                public let reason: Reason
            }

            public let modifications: [Modification]
            public let deletions: [Deletion]
        }

        public struct FetchedRecordZoneChanges: Sendable {
            /// A record as the server merged it.
            public struct Modification: Sendable {
                public let record: LatticeRecord
                /// Which device and time won each field, when the configuration asks
                /// (`includesFieldProvenance`); empty otherwise.
                public let provenance: [String: FieldProvenance]
            }

            public struct Deletion: Sendable {
                public enum Reason: Sendable, Hashable {
                    /// The record was deleted.
                    case deleted
                    /// The record left what this user may see (its share ended or it moved out of it).
                    case leftShare
                }

                public let recordID: LatticeRecord.ID
                /// The record's type, nil when it left a share (the server does not say).
                public let recordType: String?
                public let reason: Reason
            }

            /// A share of part of a zone that this user lost: its root and the share record. The records
            /// under it come as deletions with reason `leftShare` in the same event.
            public struct LostShare: Sendable, Hashable {
                public let rootRecordID: LatticeRecord.ID
                public let shareRecordID: LatticeRecord.ID
            }

            public let zoneID: LatticeRecordZone.ID
            public let modifications: [Modification]
            public let deletions: [Deletion]
            public let lostShares: [LostShare]
        }

        public struct SentDatabaseChanges: Sendable {
            public struct FailedZoneSave: Sendable {
                public let zone: LatticeRecordZone
                public let error: LatticeSyncError
            }

            public let savedZones: [LatticeRecordZone]
            public let failedZoneSaves: [FailedZoneSave]
            public let deletedZoneIDs: [LatticeRecordZone.ID]
            public let failedZoneDeletes: [LatticeRecordZone.ID: LatticeSyncError]
        }

        public struct SentRecordZoneChanges: Sendable {
            public struct FailedRecordSave: Sendable {
                public let record: LatticeRecord
                public let error: LatticeSyncError
            }

            /// The batch this answers (`RecordZoneChangeBatch.batchID`).
            public let batchID: UUID
            /// The saved records: the state sent joined with the state the device had (what the server
            /// joined in from other devices comes with the next fetch), with the server's change tag.
            public let savedRecords: [LatticeRecord]
            public let failedRecordSaves: [FailedRecordSave]
            public let deletedRecordIDs: [LatticeRecord.ID]
            public let failedRecordDeletes: [LatticeRecord.ID: LatticeSyncError]
            /// For each record saved or deleted, the number of the latest edit the batch covered
            /// (`State.editNumber(of:)`): an edit queued after the batch was asked for has a larger number,
            /// and stays pending.
            public let coveredEdits: [LatticeRecord.ID: UInt64]
        }

        public struct WillFetchChanges: Sendable { public let context: FetchChangesContext }
        public struct WillFetchRecordZoneChanges: Sendable { public let zoneID: LatticeRecordZone.ID }
        public struct DidFetchRecordZoneChanges: Sendable {
            public let zoneID: LatticeRecordZone.ID
            /// Why the zone's fetch stopped, nil when it completed.
            public let error: LatticeSyncError?
            /// The fetch started from no change token (the zone's first fetch, or its token had expired), so
            /// every record of the zone came in this fetch's `fetchedRecordZoneChanges`: a record the app
            /// holds that did not come is gone from the server (deleted while its deletion could not be
            /// told), unless the app has a change of it waiting. CKSyncEngine keeps this to itself.
            public let deliveredWholeZone: Bool

            init(zoneID: LatticeRecordZone.ID, error: LatticeSyncError?, deliveredWholeZone: Bool = false) {
                self.zoneID = zoneID
                self.error = error
                self.deliveredWholeZone = deliveredWholeZone
            }
        }
        public struct DidFetchChanges: Sendable { public let context: FetchChangesContext }
        public struct WillSendChanges: Sendable { public let context: SendChangesContext }
        public struct DidSendChanges: Sendable { public let context: SendChangesContext }
    }
}
