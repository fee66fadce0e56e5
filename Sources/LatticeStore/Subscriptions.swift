/// Subscriptions (CKSubscription), the notifications they raise, and push tokens.
///
/// A subscription belongs to one database of one user. What fires it is decided above the store, in the
/// write that commits a change (LatticeOperations' `Subscriptions`); the store keeps what fired:
///
/// - **Notifications** are coalesced in storage: one row per (subscription, zone), moved to the user's next
///   notification position each time it fires again. A device that resumes after position `n` reads the
///   rows after `n`: at most one per subscription and zone, however many changes came meanwhile. The
///   positions come from a per-user counter row updated inside the writing transaction, so, as with the
///   change logs, they become visible in the order they were allocated.
/// - **Origins.** Each row keeps the device (token id) that made its latest change and `runAfter`, the
///   position of the row's latest change by anyone else (0 when none), so a device is not told of a change
///   it made: it skips a row whose origin it is when every change of the row after its cursor was its own
///   (`runAfter <= cursor`).
/// - **Push tokens** (`tokens/create`) name a device's push stream. A token is stored as its SHA-256 only and
///   belongs to the bearer token (or browser session) that made it: revoking that ends the push token too.

/// What a subscription watches.
public enum SubscriptionKind: String, Sendable, Hashable, CaseIterable {
    /// Records of one type (optionally filtered) in one zone, or every zone (`zoneWide`).
    case query
    /// Every change in one zone.
    case zone
    /// Every change in the database.
    case database
}

/// A subscription as stored.
public struct StoredSubscription: Sendable, Hashable {
    /// 0 before it is inserted.
    public var rowID: Int64
    public var databaseID: Int64
    public var userID: Int64
    /// The client's `subscriptionID`, unique in its database.
    public var name: String
    public var kind: SubscriptionKind
    /// The zone watched, by name (a zone deleted and made again under its name is watched again); nil for a
    /// database subscription and a zone-wide query subscription.
    public var zoneName: String?
    /// The owner of the zone watched (its `ownerRecordName`): the user's own in the private database, the
    /// sharer's in the shared one.
    public var zoneOwner: String?
    /// A query subscription's record type.
    public var recordType: String?
    /// Bit 1: create, 2: update, 4: delete (query subscriptions; the others fire on everything).
    public var firesOn: Int64
    public var firesOnce: Bool
    /// The subscription as the API answers it, JSON text (its query, notification info, ...).
    public var definition: String
    /// Where its webhook deliveries go, if it has one.
    public var webhookURL: String?
    /// The webhook's signing key.
    public var webhookSecret: [UInt8]?
    public var createdMs: Int64
    public var modifiedMs: Int64

    public init(rowID: Int64 = 0, databaseID: Int64, userID: Int64, name: String, kind: SubscriptionKind,
                zoneName: String?, zoneOwner: String?, recordType: String?, firesOn: Int64, firesOnce: Bool, definition: String,
                webhookURL: String? = nil, webhookSecret: [UInt8]? = nil, createdMs: Int64, modifiedMs: Int64) {
        self.rowID = rowID
        self.databaseID = databaseID
        self.userID = userID
        self.name = name
        self.kind = kind
        self.zoneName = zoneName
        self.zoneOwner = zoneOwner
        self.recordType = recordType
        self.firesOn = firesOn
        self.firesOnce = firesOnce
        self.definition = definition
        self.webhookURL = webhookURL
        self.webhookSecret = webhookSecret
        self.createdMs = createdMs
        self.modifiedMs = modifiedMs
    }
}

/// One subscription firing for one zone (`zoneRowID` 0 when no zone applies), with what a notification
/// names, so a notification is answered without reading its subscription (which `firesOnce` deletes).
public struct NotificationTrigger: Sendable, Hashable {
    public var userID: Int64
    public var subscriptionRowID: Int64
    public var zoneRowID: Int64
    public var databaseID: Int64
    public var subscriptionName: String
    public var kind: SubscriptionKind
    public var zoneName: String?
    public var zoneOwner: String?

    public init(userID: Int64, subscriptionRowID: Int64, zoneRowID: Int64, databaseID: Int64, subscriptionName: String,
                kind: SubscriptionKind, zoneName: String?, zoneOwner: String?) {
        self.userID = userID
        self.subscriptionRowID = subscriptionRowID
        self.zoneRowID = zoneRowID
        self.databaseID = databaseID
        self.subscriptionName = subscriptionName
        self.kind = kind
        self.zoneName = zoneName
        self.zoneOwner = zoneOwner
    }
}

/// A coalesced notification: the latest firing of a subscription for a zone.
public struct StoredNotification: Sendable, Hashable {
    public var trigger: NotificationTrigger
    /// The user's notification position of the latest firing.
    public var seq: Int64
    /// The device (token id) that made the latest change; nil when no device did.
    public var origin: String?
    /// The position of the row's latest change not made by `origin` (0: none).
    public var runAfter: Int64

    public init(trigger: NotificationTrigger, seq: Int64, origin: String?, runAfter: Int64) {
        self.trigger = trigger
        self.seq = seq
        self.origin = origin
        self.runAfter = runAfter
    }

    /// Whether a device (`tokenID`) that has seen everything up to `cursor` is to hear of this: not when
    /// every change of the row after its cursor was its own.
    public func concerns(device tokenID: String?, after cursor: Int64) -> Bool {
        guard seq > cursor else { return false }
        guard let tokenID, let origin, origin == tokenID else { return true }
        return runAfter > cursor
    }
}

/// Where a webhook delivery stands.
public enum DeliveryState: String, Sendable, Hashable, CaseIterable {
    /// Waiting for its first attempt or its next retry (or under way, while claimed).
    case pending
    case delivered
    /// Dead-lettered after the last attempt; `replayDeliveries` makes it pending again.
    case failed
}

/// One webhook delivery in the outbox: written in the transaction of the change it reports.
public struct StoredDelivery: Sendable, Hashable {
    public var id: Int64
    public var subscriptionRowID: Int64
    public var userID: Int64
    /// The subscription's delivery sequence: its deliveries are sent in this order.
    public var seq: Int64
    public var url: String
    /// The JSON body, as sent.
    public var payload: [UInt8]
    public var state: DeliveryState
    public var attempts: Int64
    public var nextAttemptMs: Int64
    /// The node sending it now, until `claimedUntilMs`.
    public var claimedBy: String?
    public var claimedUntilMs: Int64
    public var lastStatus: Int64?
    public var lastError: String?
    public var createdMs: Int64
    public var finishedMs: Int64?

    public init(id: Int64, subscriptionRowID: Int64, userID: Int64, seq: Int64, url: String, payload: [UInt8],
                state: DeliveryState, attempts: Int64, nextAttemptMs: Int64, claimedBy: String?, claimedUntilMs: Int64,
                lastStatus: Int64?, lastError: String?, createdMs: Int64, finishedMs: Int64?) {
        self.id = id
        self.subscriptionRowID = subscriptionRowID
        self.userID = userID
        self.seq = seq
        self.url = url
        self.payload = payload
        self.state = state
        self.attempts = attempts
        self.nextAttemptMs = nextAttemptMs
        self.claimedBy = claimedBy
        self.claimedUntilMs = claimedUntilMs
        self.lastStatus = lastStatus
        self.lastError = lastError
        self.createdMs = createdMs
        self.finishedMs = finishedMs
    }
}

/// How a delivery attempt ended (`finishDelivery`).
public enum DeliveryOutcome: Sendable, Hashable {
    case delivered(status: Int64)
    /// Try again at `nextAttemptMs`.
    case retry(status: Int64?, error: String, nextAttemptMs: Int64)
    /// No attempt left: dead-lettered.
    case failed(status: Int64?, error: String)
}

/// A push token (`tokens/create`).
public struct StoredPushToken: Sendable, Hashable {
    /// SHA-256 of the token.
    public var hash: [UInt8]
    public var userID: Int64
    /// The bearer token (or browser session) that made it: the device.
    public var deviceTokenID: String
    public var environment: String
    /// CloudKit's `apnsEnvironment` as the client named it.
    public var apnsEnvironment: String
    /// Registered for the user's subscriptions (`tokens/register`).
    public var registered: Bool
    public var createdMs: Int64

    public init(hash: [UInt8], userID: Int64, deviceTokenID: String, environment: String, apnsEnvironment: String,
                registered: Bool, createdMs: Int64) {
        self.hash = hash
        self.userID = userID
        self.deviceTokenID = deviceTokenID
        self.environment = environment
        self.apnsEnvironment = apnsEnvironment
        self.registered = registered
        self.createdMs = createdMs
    }
}

/// Subscriptions, notifications and push tokens (Subscriptions.swift).
public protocol SubscriptionStorage {
    /// Inserts and returns it with its row id.
    /// - Throws: `StorageError.duplicate` when its database has a subscription of this name.
    func insertSubscription(_ subscription: StoredSubscription) throws -> StoredSubscription
    /// Replaces the definition of the subscription with this row id; false when it is gone.
    func updateSubscription(_ subscription: StoredSubscription) throws -> Bool
    /// Deletes a subscription, and its notifications unless `keepingNotifications` (a `firesOnce` one that
    /// just fired: its devices are still to hear of it); false when it is gone.
    func deleteSubscription(rowID: Int64, keepingNotifications: Bool) throws -> Bool
    /// In a write transaction the row stays locked until the transaction ends.
    func subscription(databaseID: Int64, name: String) throws -> StoredSubscription?
    /// A subscription by row id.
    func subscription(rowID: Int64) throws -> StoredSubscription?
    /// A database's subscriptions in name order, at most `limit`.
    func subscriptions(databaseID: Int64, limit: Int) throws -> [StoredSubscription]
    func subscriptionCount(databaseID: Int64) throws -> Int
    /// Every subscription of these databases (those a commit touched), in row order.
    func subscriptions(databaseIDs: [Int64]) throws -> [StoredSubscription]

    /// Raises each trigger at its user's next notification positions (one per trigger, in the order given)
    /// as made by `origin`; returns the last position per user.
    func raiseNotifications(_ triggers: [NotificationTrigger], origin: String?) throws -> [Int64: Int64]
    /// A user's notifications after `cursor` in position order, at most `limit`.
    func notifications(userID: Int64, after cursor: Int64, limit: Int) throws -> [StoredNotification]
    /// The user's latest notification position (0 before the first).
    func lastNotificationSeq(userID: Int64) throws -> Int64

    /// - Throws: `StorageError.duplicate` when the hash is taken.
    func insertPushToken(_ token: StoredPushToken) throws
    /// A push token whose device token (or session) still exists and has not expired at `nowMs`.
    func pushToken(hash: [UInt8], nowMs: Int64) throws -> StoredPushToken?
    /// Marks the user's push token registered; false when it is not theirs or gone.
    func registerPushToken(hash: [UInt8], userID: Int64) throws -> Bool
    /// Keeps the `keeping` newest push tokens a device token made and deletes the rest; returns how many went.
    func prunePushTokens(deviceTokenID: String, keeping: Int) throws -> Int
    /// Deletes the push tokens whose device token is gone or expired at `nowMs`; returns how many.
    func forgetOrphanPushTokens(nowMs: Int64, limit: Int) throws -> Int
    /// Deletes notifications whose subscription is gone (a spent `firesOnce` one's); returns how many.
    func forgetOrphanNotifications(limit: Int) throws -> Int

    /// Puts a delivery for the subscription in the outbox at its next sequence number, due now; `payload`
    /// makes the body from that number.
    func enqueueDelivery(subscriptionRowID: Int64, userID: Int64, url: String, nowMs: Int64,
                         payload: (_ seq: Int64) throws -> [UInt8]) throws -> StoredDelivery
    /// When the next delivery can be claimed (the retry time, or the end of the claim, of the first pending
    /// delivery of each subscription), if any is pending.
    func nextDeliveryDueMs() throws -> Int64?
    /// Claims up to `limit` due deliveries for `node` until `nowMs + leaseMs`: pending ones whose time has come,
    /// each the first pending one of its subscription (so a subscription's deliveries go one at a time, in
    /// order), none claimed by another node's live lease. Several nodes claim at once without taking one
    /// delivery twice (PostgreSQL: `FOR UPDATE SKIP LOCKED`).
    func claimDeliveries(node: String, nowMs: Int64, leaseMs: Int64, limit: Int) throws -> [StoredDelivery]
    /// Records an attempt's outcome, if `node` still holds the claim; false when it does not.
    func finishDelivery(id: Int64, node: String, outcome: DeliveryOutcome, nowMs: Int64) throws -> Bool
    /// Drops `node`'s claims (its sends died with a previous run of it); returns how many.
    func releaseDeliveryClaims(node: String) throws -> Int
    /// A subscription's deliveries in sequence order after `afterSeq`, in one state or all, at most `limit`.
    func deliveries(subscriptionRowID: Int64, state: DeliveryState?, afterSeq: Int64, limit: Int) throws -> [StoredDelivery]
    /// Makes failed deliveries of the subscription pending again, due now (those of `seqs`, or all); returns
    /// how many.
    func replayDeliveries(subscriptionRowID: Int64, seqs: [Int64]?, nowMs: Int64) throws -> Int
    /// Deletes deliveries finished (delivered, or failed) before `beforeMs`, at most `limit`; returns how many.
    func purgeDeliveries(finishedBefore beforeMs: Int64, limit: Int) throws -> Int
}

extension StorageRowMapping {
    static var subscriptionColumns: String {
        "id, database_id, user_id, name, kind, zone_name, zone_owner, record_type, fires_on, fires_once, definition, "
            + "webhook_url, webhook_secret, created_ms, modified_ms"
    }

    /// A row of `subscriptionColumns`.
    /// - Throws: `StorageError.damagedRow` for a kind no case spells.
    func subscription(_ row: [Column]) throws -> StoredSubscription {
        StoredSubscription(
            rowID: row[0].integer, databaseID: row[1].integer, userID: row[2].integer, name: row[3].text ?? "",
            kind: try Self.parse(SubscriptionKind.self, row[4], table: "subscriptions", column: "kind",
                                 row: "id \(row[0].integer)"),
            zoneName: row[5].text, zoneOwner: row[6].text, recordType: row[7].text, firesOn: row[8].integer,
            firesOnce: row[9].integer != 0, definition: row[10].text ?? "{}", webhookURL: row[11].text,
            webhookSecret: row[12].isNull ? nil : row[12].bytes, createdMs: row[13].integer, modifiedMs: row[14].integer)
    }

    static var notificationColumns: String {
        "subscription_id, zone_id, user_id, database_id, subscription_name, kind, zone_name, zone_owner, seq, origin, run_after"
    }

    /// - Throws: `StorageError.damagedRow` for a kind no case spells.
    func notification(_ row: [Column]) throws -> StoredNotification {
        let trigger = NotificationTrigger(
            userID: row[2].integer, subscriptionRowID: row[0].integer, zoneRowID: row[1].integer, databaseID: row[3].integer,
            subscriptionName: row[4].text ?? "",
            kind: try Self.parse(SubscriptionKind.self, row[5], table: "notifications", column: "kind",
                                 row: "subscription \(row[0].integer), zone \(row[1].integer)"),
            zoneName: row[6].text, zoneOwner: row[7].text)
        return StoredNotification(trigger: trigger, seq: row[8].integer, origin: row[9].text, runAfter: row[10].integer)
    }

    /// Values of a trigger's columns, in `notificationColumns` order up to `seq`.
    func triggerValues(_ trigger: NotificationTrigger, integer: (Int64) -> Column, text: (String) -> Column,
                       null: Column) -> [Column] {
        [integer(trigger.subscriptionRowID), integer(trigger.zoneRowID), integer(trigger.userID), integer(trigger.databaseID),
         text(trigger.subscriptionName), text(trigger.kind.rawValue), trigger.zoneName.map(text) ?? null,
         trigger.zoneOwner.map(text) ?? null]
    }

    static var deliveryColumns: String {
        "id, subscription_id, user_id, seq, url, payload, state, attempts, next_attempt_ms, claimed_by, claimed_until_ms, "
            + "last_status, last_error, created_ms, finished_ms"
    }

    /// - Throws: `StorageError.damagedRow` for a state no case spells.
    func delivery(_ row: [Column]) throws -> StoredDelivery {
        StoredDelivery(
            id: row[0].integer, subscriptionRowID: row[1].integer, userID: row[2].integer, seq: row[3].integer,
            url: row[4].text ?? "", payload: row[5].bytes,
            state: try Self.parse(DeliveryState.self, row[6], table: "webhook_deliveries", column: "state",
                                  row: "id \(row[0].integer)"),
            attempts: row[7].integer, nextAttemptMs: row[8].integer, claimedBy: row[9].text, claimedUntilMs: row[10].integer,
            lastStatus: row[11].isNull ? nil : row[11].integer, lastError: row[12].text, createdMs: row[13].integer,
            finishedMs: row[14].isNull ? nil : row[14].integer)
    }

    /// The columns an outcome sets: state, last status, last error, next attempt, finished (nil: unchanged).
    static func outcomeValues(_ outcome: DeliveryOutcome, nowMs: Int64)
        -> (state: DeliveryState, status: Int64?, error: String?, nextAttemptMs: Int64?, finishedMs: Int64?) {
        switch outcome {
        case .delivered(let status): (.delivered, status, nil, nil, nowMs)
        case .retry(let status, let error, let next): (.pending, status, String(error.prefix(500)), next, nil)
        case .failed(let status, let error): (.failed, status, String(error.prefix(500)), nil, nowMs)
        }
    }

    static var pushTokenColumns: String {
        "p.hash, p.user_id, p.device_token_id, p.environment, p.apns_environment, p.registered, p.created_ms"
    }

    func pushToken(_ row: [Column]) -> StoredPushToken {
        StoredPushToken(hash: row[0].bytes, userID: row[1].integer, deviceTokenID: row[2].text ?? "",
                        environment: row[3].text ?? "", apnsEnvironment: row[4].text ?? "",
                        registered: row[5].integer != 0, createdMs: row[6].integer)
    }

    /// Values of a subscription's columns after `id`, in `subscriptionColumns` order.
    func subscriptionValues(_ subscription: StoredSubscription, integer: (Int64) -> Column, text: (String) -> Column,
                            bytes: ([UInt8]) -> Column, null: Column) -> [Column] {
        [integer(subscription.databaseID), integer(subscription.userID), text(subscription.name),
         text(subscription.kind.rawValue), subscription.zoneName.map(text) ?? null, subscription.zoneOwner.map(text) ?? null,
         subscription.recordType.map(text) ?? null, integer(subscription.firesOn), integer(subscription.firesOnce ? 1 : 0),
         text(subscription.definition), subscription.webhookURL.map(text) ?? null,
         subscription.webhookSecret.map(bytes) ?? null, integer(subscription.createdMs), integer(subscription.modifiedMs)]
    }
}

/// The tables, the same on both backends but for the types.
enum SubscriptionTables {
    static func migration(integer: String, text: String, blob: String, key: String) -> String {
        """
        CREATE TABLE subscriptions(
            id \(key),
            database_id \(integer) NOT NULL,
            user_id \(integer) NOT NULL,
            name \(text) NOT NULL,
            kind \(text) NOT NULL,
            zone_name \(text),
            zone_owner \(text),
            record_type \(text),
            fires_on \(integer) NOT NULL,
            fires_once \(integer) NOT NULL,
            definition \(text) NOT NULL,
            webhook_url \(text),
            webhook_secret \(blob),
            created_ms \(integer) NOT NULL,
            modified_ms \(integer) NOT NULL,
            webhook_seq \(integer) NOT NULL DEFAULT 0,
            UNIQUE(database_id, name));
        CREATE TABLE notification_counters(
            user_id \(integer) PRIMARY KEY,
            last_seq \(integer) NOT NULL);
        CREATE TABLE notifications(
            subscription_id \(integer) NOT NULL,
            zone_id \(integer) NOT NULL,
            user_id \(integer) NOT NULL,
            database_id \(integer) NOT NULL,
            subscription_name \(text) NOT NULL,
            kind \(text) NOT NULL,
            zone_name \(text),
            zone_owner \(text),
            seq \(integer) NOT NULL,
            origin \(text),
            run_after \(integer) NOT NULL,
            PRIMARY KEY(subscription_id, zone_id));
        CREATE INDEX notifications_user ON notifications(user_id, seq);
        CREATE TABLE push_tokens(
            hash \(blob) PRIMARY KEY,
            user_id \(integer) NOT NULL,
            device_token_id \(text) NOT NULL,
            environment \(text) NOT NULL,
            apns_environment \(text) NOT NULL,
            registered \(integer) NOT NULL,
            created_ms \(integer) NOT NULL);
        CREATE INDEX push_tokens_device ON push_tokens(device_token_id);
        CREATE TABLE webhook_deliveries(
            id \(key),
            subscription_id \(integer) NOT NULL,
            user_id \(integer) NOT NULL,
            seq \(integer) NOT NULL,
            url \(text) NOT NULL,
            payload \(blob) NOT NULL,
            state \(text) NOT NULL,
            attempts \(integer) NOT NULL,
            next_attempt_ms \(integer) NOT NULL,
            claimed_by \(text),
            claimed_until_ms \(integer) NOT NULL,
            last_status \(integer),
            last_error \(text),
            created_ms \(integer) NOT NULL,
            finished_ms \(integer),
            UNIQUE(subscription_id, seq));
        CREATE INDEX webhook_deliveries_due ON webhook_deliveries(state, next_attempt_ms);
        CREATE INDEX webhook_deliveries_finished ON webhook_deliveries(finished_ms);
        """
    }
}
