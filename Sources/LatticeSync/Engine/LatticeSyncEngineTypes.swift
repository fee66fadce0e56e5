import Foundation
import LatticeCore

/// A database of a container, as `CKDatabase`: the signed-in user's private database or the shared one
/// (the zones others share with them).
public struct LatticeDatabase: Hashable, Sendable, Codable {
    public enum Scope: String, Hashable, Sendable, Codable { case `private`, shared }

    public var scope: Scope
    public var container: String
    public var environment: String

    public init(scope: Scope, container: String = "lattice", environment: String = "production") {
        self.scope = scope
        self.container = container
        self.environment = environment
    }

    /// The private database of the default container (`lattice`, `production`).
    public static let `private` = LatticeDatabase(scope: .private)
    /// The shared database of the default container.
    public static let shared = LatticeDatabase(scope: .shared)
}

/// An error of the engine, in one taxonomy as `CKError`: what went wrong (`code`), the server's words
/// (`reason`) and its code as sent (`serverErrorCode`), and when to try again when the server said so.
public struct LatticeSyncError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, Hashable, Sendable {
        /// The server could not be reached (offline, or no answer in time). Pending changes stay.
        case networkUnavailable
        /// No account is configured, or the server no longer accepts its token.
        case notAuthenticated
        /// The strict save policy found another change tag on the server (CloudKit's `serverRecordChanged`).
        case serverRecordChanged
        /// The account may not do this (a read-only participant saving, say).
        case permissionFailure
        /// The zone does not exist (deleted, or a share that ended).
        case zoneNotFound
        /// The record does not exist.
        case unknownItem
        case quotaExceeded
        /// Too large or too many (the engine splits a batch the server finds too large).
        case limitExceeded
        /// The request or an argument is not valid.
        case invalidArguments
        /// The server asked to slow down (`THROTTLED`); `retryAfter` says when to try again.
        case requestRateLimited
        /// The server is busy (`TRY_AGAIN_LATER`); `retryAfter` says when to try again.
        case serviceUnavailable
        /// The operation was cancelled (`cancelOperations()`, or the calling task).
        case operationCancelled
        /// Part of an atomic batch that failed because another part did.
        case batchRequestFailed
        /// Anything else the server answered, or an answer the engine did not understand.
        case serverRejectedRequest
    }

    public let code: Code
    public let reason: String
    /// The server's code as it sent it (`PERMISSION_FAILURE`, …), nil for errors of the device.
    public let serverErrorCode: String?
    /// Seconds the server asked to wait before trying again, when it said.
    public let retryAfter: Double?

    public init(_ code: Code, _ reason: String, serverErrorCode: String? = nil, retryAfter: Double? = nil) {
        self.code = code
        self.reason = reason
        self.serverErrorCode = serverErrorCode
        self.retryAfter = retryAfter
    }

    /// The error for a server's answer.
    init(server code: String, reason: String, retryAfter: Double? = nil) {
        let mapped: Code
        switch ServerErrorCode(rawValue: code) {
        case .authenticationFailed?, .authenticationRequired?, .expiredToken?: mapped = .notAuthenticated
        case .conflict?: mapped = .serverRecordChanged
        case .permissionFailure?, .accessDenied?: mapped = .permissionFailure
        case .zoneNotFound?: mapped = .zoneNotFound
        case .notFound?: mapped = .unknownItem
        case .quotaExceeded?: mapped = .quotaExceeded
        case .limitExceeded?: mapped = .limitExceeded
        case .badRequest?: mapped = .invalidArguments
        case .throttled?: mapped = .requestRateLimited
        case .tryAgainLater?: mapped = .serviceUnavailable
        case .atomicError?: mapped = .batchRequestFailed
        default: mapped = .serverRejectedRequest
        }
        self.init(mapped, reason, serverErrorCode: code, retryAfter: retryAfter)
    }

    init(_ error: any Error) {
        switch error {
        case let error as LatticeSyncError: self = error
        case let error as ServerError: self.init(server: error.code, reason: error.reason, retryAfter: error.retryAfter)
        case let error as TransportError: self.init(.networkUnavailable, error.description)
        case is CancellationError: self.init(.operationCancelled, "cancelled")
        case let error as SyncError:
            switch error {
            case .notSignedIn: self.init(.notAuthenticated, error.description)
            default: self.init(.serverRejectedRequest, error.description)
            }
        default: self.init(.serverRejectedRequest, "\(error)")
        }
    }

    /// Whether trying again later may succeed (offline, busy, throttled, cancelled).
    public var isTransient: Bool {
        [.networkUnavailable, .requestRateLimited, .serviceUnavailable, .operationCancelled].contains(code)
    }

    /// Whether the server said "not now" (throttled or busy): the same request may succeed later.
    public var isNotNow: Bool { code == .requestRateLimited || code == .serviceUnavailable }

    /// When to try again, for people ("try again in 14 minutes"), from `retryAfter`; nil without one.
    public var retryAdvice: String? {
        guard let retryAfter, retryAfter > 0 else { return nil }
        return "try again in " + ServerError.duration(retryAfter)
    }

    public var description: String {
        "\(code.rawValue): \(reason)" + (retryAfter.map { " (try again in \(Int($0.rounded(.up))) s)" } ?? "")
    }
}

extension LatticeSyncEngine {
    /// A change to a record the app wants sent, as `CKSyncEngine.PendingRecordZoneChange`.
    public enum PendingRecordZoneChange: Hashable, Sendable, Codable {
        case saveRecord(LatticeRecord.ID)
        case deleteRecord(LatticeRecord.ID)

        public var recordID: LatticeRecord.ID {
            switch self {
            case .saveRecord(let id), .deleteRecord(let id): return id
            }
        }
    }

    /// A change to a zone the app wants sent, as `CKSyncEngine.PendingDatabaseChange`.
    public enum PendingDatabaseChange: Hashable, Sendable, Codable {
        case saveZone(LatticeRecordZone)
        case deleteZone(LatticeRecordZone.ID)

        public var zoneID: LatticeRecordZone.ID {
            switch self {
            case .saveZone(let zone): return zone.zoneID
            case .deleteZone(let id): return id
            }
        }
    }

    /// How the server should treat a batch's saves, as `CKModifyRecordsOperation.RecordSavePolicy`.
    public enum SavePolicy: Sendable, Hashable {
        /// Lattice's merge (the default): the edited keys, stamped, joined with what others wrote.
        case changedKeys
        /// Strict: the save fails with `serverRecordChanged` when the record's change tag on the server is
        /// not the one the record was given with (a new record: when it already exists).
        case ifServerRecordUnchanged
    }

    /// One batch of record changes to send, as `CKSyncEngine.RecordZoneChangeBatch`.
    public struct RecordZoneChangeBatch: Sendable {
        /// Names the batch in `Event.SentRecordZoneChanges.batchID`.
        public let batchID = UUID()
        public var recordsToSave: [LatticeRecord]
        public var recordIDsToDelete: [LatticeRecord.ID]
        /// Each zone's changes succeed or fail together (its saves together, then its deletions together).
        public var atomicByZone: Bool
        public var savePolicy: SavePolicy = .changedKeys

        /// The most records one batch takes (the server's limit per request).
        public static let maximumRecords = 400

        public init(recordsToSave: [LatticeRecord] = [], recordIDsToDelete: [LatticeRecord.ID] = [],
                    atomicByZone: Bool = false) {
            self.recordsToSave = recordsToSave
            self.recordIDsToDelete = recordIDsToDelete
            self.atomicByZone = atomicByZone
        }

        /// A batch of the first pending changes, with each record to save asked of `recordProvider`, as
        /// CKSyncEngine's: a save whose provider answers nil is left out (the app has no such record any
        /// more, and the engine drops that pending change when the batch is sent). Nil when there is
        /// nothing to send. At most `maximumRecords` changes.
        public init?(pendingChanges: [PendingRecordZoneChange],
                     recordProvider: @Sendable (LatticeRecord.ID) async -> LatticeRecord?) async {
            var saves: [LatticeRecord] = []
            var deletes: [LatticeRecord.ID] = []
            var skipped: [LatticeRecord.ID] = []
            for change in pendingChanges.prefix(Self.maximumRecords) {
                switch change {
                case .saveRecord(let id):
                    if let record = await recordProvider(id) { saves.append(record) } else { skipped.append(id) }
                case .deleteRecord(let id):
                    deletes.append(id)
                }
            }
            guard !saves.isEmpty || !deletes.isEmpty || !skipped.isEmpty else { return nil }
            self.init(recordsToSave: saves, recordIDsToDelete: deletes)
            withoutRecord = skipped
        }

        /// Saves the provider had no record for: their pending changes are dropped.
        var withoutRecord: [LatticeRecord.ID] = []
    }

    /// Why the engine is sending, as `CKSyncEngine.SyncReason`.
    public enum SyncReason: Sendable, Hashable { case scheduled, manual }

    /// Options of `sendChanges(_:)`, as `CKSyncEngine.SendChangesOptions`: which zones (nil: all).
    public struct SendChangesOptions: Sendable {
        public var zoneIDs: [LatticeRecordZone.ID]?
        public init(zoneIDs: [LatticeRecordZone.ID]? = nil) { self.zoneIDs = zoneIDs }
    }

    /// Options of `fetchChanges(_:)`, as `CKSyncEngine.FetchChangesOptions`: which zones (nil: every
    /// changed zone).
    public struct FetchChangesOptions: Sendable {
        public var zoneIDs: [LatticeRecordZone.ID]?
        public init(zoneIDs: [LatticeRecordZone.ID]? = nil) { self.zoneIDs = zoneIDs }
    }

    /// What `nextRecordZoneChangeBatch` is asked for, as `CKSyncEngine.SendChangesContext`.
    public struct SendChangesContext: Sendable {
        public var reason: SyncReason
        public var options: SendChangesOptions
    }

    /// What a fetch is for, as `CKSyncEngine.FetchChangesContext`.
    public struct FetchChangesContext: Sendable {
        public var reason: SyncReason
        public var options: FetchChangesOptions
    }
}

/// The app's side of the engine, as `CKSyncEngineDelegate`. Both methods are called from inside an
/// operation of the engine: they may change `syncEngine.state` (add or remove pending changes), but must
/// not await `fetchChanges()`, `sendChanges()` or `setAccount(_:)`, which wait for that operation to end.
public protocol LatticeSyncEngineDelegate: AnyObject, Sendable {
    /// Every event, one at a time, in the order of `LatticeSyncEngine.Event`'s documentation.
    func handleEvent(_ event: LatticeSyncEngine.Event, syncEngine: LatticeSyncEngine) async
    /// The next batch to send, or nil when there is nothing more.
    func nextRecordZoneChangeBatch(_ context: LatticeSyncEngine.SendChangesContext,
                                   syncEngine: LatticeSyncEngine) async -> LatticeSyncEngine.RecordZoneChangeBatch?
}
