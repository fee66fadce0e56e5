import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore

/// Subscriptions (CKSubscription): `subscriptions/modify`, `subscriptions/list`, `subscriptions/lookup`; what
/// fires them (`fire`, inside the write that commits a change); push tokens (`tokens/create`,
/// `tokens/register`) and what a device's push stream reads (`PushSession`, `notifications`).
///
/// Query subscriptions live in the private database only, as in CloudKit; zone and database subscriptions in
/// the private and the shared database. A subscription of the shared database fires only through a share the
/// user has accepted, as the change reaches their shared database (`Shares.fanOut`), so a participant
/// removed from a share stops hearing of it with the commit that removes them.
public struct Subscriptions: Sendable, OperationArea {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// The text form of a push token: `lp_` and 64 lowercase hex digits.
    static let pushTokenPrefix = "lp_"

    private func requireSubscribable(_ caller: Caller, _ operation: String) throws {
        guard caller.database != .public else {
            throw ServiceError.badRequest("\(operation): subscriptions live in the private and the shared database")
        }
    }

    // MARK: subscriptions/*

    /// `subscriptions/modify`: each operation in its own savepoint, answered per item (an error item names the
    /// `subscriptionID`). `create` of an id that exists with the same definition answers it again (a retry);
    /// with another one it is EXISTS (use `update`).
    public func modify(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        try requireSubscribable(caller, "subscriptions/modify")
        let request = try SubscriptionsModifyRequest(json: .object(body), limits: requestLimits)
        // Webhook URLs are checked (their names resolved) before the write, so no lookup holds the writer.
        var refusedURLs: [String: ServiceError] = [:]
        for hook in Set(request.operations.compactMap(\.subscription.webhookURL)) {
            do {
                let url = try Webhooks.checkForm(hook)
                if !configuration.webhooks.allowsPrivateAddresses, let refusal = Webhooks.refusal(host: url.host ?? "") {
                    throw ServiceError.badRequest("webhook.url: \(refusal); this server sends webhooks to public addresses only")
                }
            } catch let error as ServiceError {
                refusedURLs[hook] = error
            }
        }
        let results: [JSON] = try core.write(deadline: caller.deadline) { tx, _ in
            let database = try tx.database(caller.databaseKey)
            var results: [JSON] = []
            for operation in request.operations {
                let name = operation.subscription.subscriptionID
                do {
                    if operation.operationType != .delete, let hook = operation.subscription.webhookURL,
                       let refusal = refusedURLs[hook] { throw refusal }
                    results.append(try tx.savepoint { try apply(operation, database: database, caller: caller, tx) })
                } catch let error as ServiceError {
                    results.append(error.json(item: (key: "subscriptionID", value: name)))
                }
            }
            return results
        }
        return .object(["subscriptions": .array(results)])
    }

    private func apply(_ operation: SubscriptionsModifyRequest.Operation, database: StoredDatabase, caller: Caller,
                       _ tx: any StorageTransaction) throws -> JSON {
        let wire = operation.subscription
        let existing = try tx.subscription(databaseID: database.id, name: wire.subscriptionID)
        let now = configuration.now()
        switch operation.operationType {
        case .delete:
            guard let existing else { throw ServiceError(.notFound, "no subscription \(wire.subscriptionID)") }
            _ = try tx.deleteSubscription(rowID: existing.rowID, keepingNotifications: false)
            return .object(["subscriptionID": .string(wire.subscriptionID), "deleted": .bool(true)])
        case .create:
            var made = try stored(wire, database: database, caller: caller, nowMs: now, tx)
            if let existing {
                guard existing.definition == made.definition else {
                    throw ServiceError(.exists, "subscription \(wire.subscriptionID) exists with another definition; "
                                       + "change it with update")
                }
                return try render(existing)
            }
            let limit = configuration.maximumSubscriptionsPerDatabase
            guard try tx.subscriptionCount(databaseID: database.id) < limit else {
                throw ServiceError(.quotaExceeded, "this database has \(limit) subscriptions, the most it may have")
            }
            // A webhook's signing key, shown in this answer only.
            let secret = try made.webhookURL.map { _ in try WebhookSignature.newSecret() }
            made.webhookSecret = secret.map { Array($0.utf8) }
            made = try tx.insertSubscription(made)
            return try render(made, secret: secret)
        case .update:
            guard let existing else { throw ServiceError(.notFound, "no subscription \(wire.subscriptionID)") }
            var made = try stored(wire, database: database, caller: caller, nowMs: now, tx)
            made.rowID = existing.rowID
            made.createdMs = existing.createdMs
            // The signing key stays; a subscription given its first webhook gets one (shown in this answer only).
            var secret: String?
            if made.webhookURL != nil {
                if let kept = existing.webhookSecret {
                    made.webhookSecret = kept
                } else {
                    secret = try WebhookSignature.newSecret()
                    made.webhookSecret = secret.map { Array($0.utf8) }
                }
            }
            _ = try tx.updateSubscription(made)
            return try render(made, secret: secret)
        }
    }

    /// A subscription as it would be stored: its zone checked (it must exist and, in the shared database, be
    /// shared with the caller), its definition in the answer's form.
    private func stored(_ wire: WireSubscription, database: StoredDatabase, caller: Caller, nowMs: Int64,
                        _ tx: any StorageTransaction) throws -> StoredSubscription {
        if wire.subscriptionType == .query && caller.database == .shared {
            throw ServiceError.badRequest("query subscriptions are not supported in the shared database (as in CloudKit); "
                                          + "use a zone or database subscription")
        }
        if wire.webhookURL != nil {
            guard caller.database == .private else {
                throw ServiceError.badRequest("webhooks belong to subscriptions of the private database")
            }
        }
        var zoneName: String?, zoneOwner: String?
        var wireOut = wire
        if let zoneID = wire.zoneID {
            let resolved = try zones.resolveZone(zoneID.json, caller, tx, path: "zoneID")
            try zones.requireZone(resolved)
            zoneName = resolved.zoneID.zoneName
            zoneOwner = resolved.zoneID.ownerRecordName
            wireOut.zoneID = WireZoneID(zoneName: resolved.zoneID.zoneName, ownerRecordName: resolved.zoneID.ownerRecordName)
        }
        let kind: SubscriptionKind = switch wire.subscriptionType {
        case .query: .query
        case .zone: .zone
        case .database: .database
        }
        let firesOn = wire.firesOn.reduce(Int64(0)) { $0 | $1.bit }
        return StoredSubscription(databaseID: database.id, userID: caller.user.id, name: wire.subscriptionID, kind: kind,
                                  zoneName: zoneName, zoneOwner: zoneOwner, recordType: wire.recordType, firesOn: firesOn,
                                  firesOnce: wire.firesOnce,
                                  definition: String(decoding: wireOut.json.serializedBytes(), as: UTF8.self),
                                  webhookURL: wire.webhookURL, createdMs: nowMs, modifiedMs: nowMs)
    }

    /// `subscriptions/list`: every subscription of the database, in name order.
    public func list(_ caller: Caller) throws -> JSON {
        try requireSubscribable(caller, "subscriptions/list")
        let stored = try storage.read(deadline: caller.deadline) { tx in
            let database = try tx.database(caller.databaseKey)
            return try tx.subscriptions(databaseID: database.id, limit: configuration.maximumSubscriptionsPerDatabase)
        }
        return .object(["subscriptions": .array(try stored.map { try render($0) })])
    }

    /// `subscriptions/lookup {"subscriptions": [{"subscriptionID"}]}`: each, or a NOT_FOUND item.
    public func lookup(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        try requireSubscribable(caller, "subscriptions/lookup")
        let request = try SubscriptionsLookupRequest(json: .object(body), limits: requestLimits)
        return try storage.read(deadline: caller.deadline) { tx in
            let database = try tx.database(caller.databaseKey)
            return .object(["subscriptions": .array(try request.subscriptionIDs.map { name in
                guard let found = try tx.subscription(databaseID: database.id, name: name) else {
                    return ServiceError(.notFound, "no subscription \(name)").json(item: (key: "subscriptionID", value: name))
                }
                return try render(found)
            })])
        }
    }

    /// The subscription as stored; with `secret`, its webhook's signing key (the answer that made it).
    private func render(_ stored: StoredSubscription, secret: String? = nil) throws -> JSON {
        guard let json = try? JSON.parse(Array(stored.definition.utf8)), case .object(var object) = json else {
            throw StorageError.failure("subscription \(stored.rowID) has a damaged definition")
        }
        if let secret, let url = stored.webhookURL {
            object["webhook"] = .object(["url": .string(url), "secret": .string(secret)])
        }
        return .object(object)
    }

    // MARK: Webhook deliveries

    /// `subscriptions/deliveries {"subscriptionID", "state"?: "pending" | "delivered" | "failed",
    /// "afterSequence"?, "resultsLimit"?}`: the subscription's webhook deliveries in sequence order.
    public func deliveries(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let (name, state) = try deliveryTarget(caller, body, "subscriptions/deliveries")
        let after = body["afterSequence"].map { $0.intValue } ?? 0
        guard let after, after >= 0 else { throw ServiceError.badRequest("afterSequence must be a non-negative integer") }
        let limit = min(try RequestReader(body).resultsLimit() ?? configuration.maximumResultsLimit, configuration.maximumResultsLimit)
        let found = try storage.read(deadline: caller.deadline) { tx -> [StoredDelivery]? in
            let database = try tx.database(caller.databaseKey)
            guard let subscription = try tx.subscription(databaseID: database.id, name: name) else { return nil }
            return try tx.deliveries(subscriptionRowID: subscription.rowID, state: state, afterSeq: after, limit: limit)
        }
        guard let found else { throw ServiceError(.notFound, "no subscription \(name)") }
        return .object(["deliveries": .array(found.map { delivery in
            var object: [String: JSON] = [
                "id": .string(Webhooks.deliveryID(subscriptionRowID: delivery.subscriptionRowID, seq: delivery.seq)),
                "sequence": .int(delivery.seq), "state": .string(delivery.state.rawValue), "attempts": .int(delivery.attempts),
                "created": .object(["timestamp": .int(delivery.createdMs)]),
            ]
            if delivery.state == .pending { object["nextAttempt"] = .object(["timestamp": .int(delivery.nextAttemptMs)]) }
            if let status = delivery.lastStatus { object["lastStatus"] = .int(status) }
            if let error = delivery.lastError { object["lastError"] = .string(error) }
            if let finished = delivery.finishedMs { object["finished"] = .object(["timestamp": .int(finished)]) }
            return .object(object)
        })])
    }

    /// `subscriptions/replay {"subscriptionID", "sequences"?: [n]}`: failed deliveries (those named, or all) are
    /// pending again, due now, with their attempts reset.
    public func replay(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let (name, _) = try deliveryTarget(caller, body, "subscriptions/replay")
        var sequences: [Int64]?
        if let list = body["sequences"] {
            guard let items = list.arrayValue, items.count <= configuration.maximumOperations,
                  let numbers = Optional(items.compactMap(\.intValue)), numbers.count == items.count else {
                throw ServiceError.badRequest("sequences must be a list of at most \(configuration.maximumOperations) integers")
            }
            sequences = numbers
        }
        let replayed = try core.write(deadline: caller.deadline) { tx, _ -> Int? in
            let database = try tx.database(caller.databaseKey)
            guard let subscription = try tx.subscription(databaseID: database.id, name: name) else { return nil }
            return try tx.replayDeliveries(subscriptionRowID: subscription.rowID, seqs: sequences, nowMs: configuration.now())
        }
        guard let replayed else { throw ServiceError(.notFound, "no subscription \(name)") }
        if replayed > 0 { core.deliveriesQueued.withLock { $0 }?() }
        return .object(["replayed": .int(Int64(replayed))])
    }

    private func deliveryTarget(_ caller: Caller, _ body: [String: JSON], _ operation: String) throws
        -> (String, DeliveryState?) {
        guard caller.database == .private else { throw ServiceError.badRequest("\(operation): webhooks live in the private database") }
        guard let name = body["subscriptionID"]?.stringValue, !name.isEmpty else {
            throw ServiceError.badRequest("subscriptionID is missing")
        }
        var state: DeliveryState?
        if let text = body["state"] {
            guard let value = text.stringValue.flatMap(DeliveryState.init(rawValue:)) else {
                throw ServiceError.badRequest("state must be pending, delivered or failed")
            }
            state = value
        }
        return (name, state)
    }

    // MARK: Firing

    /// One subscription firing for one zone (row 0 and no zone for a database subscription), with the records
    /// behind it (a webhook's payload names them).
    struct Firing {
        var zoneRowID: Int64
        var zone: CommitEffects.ZoneChange?
        var records: [CommitEffects.RecordChange]
    }

    /// Raises the notifications `effects` fire, inside the write that made them (`OperationsCore.write`): one
    /// read of the touched databases' subscriptions, then, for those that fire, one coalesced row per
    /// subscription and zone, and for a subscription with a webhook one delivery in the outbox. A `firesOnce`
    /// subscription that fired is deleted (its notification stays). Answers whether a delivery was queued.
    @discardableResult
    package func fire(_ effects: CommitEffects, _ tx: any StorageTransaction) throws -> Bool {
        guard !effects.isEmpty else { return false }
        let subscriptions = try tx.subscriptions(databaseIDs: effects.sorted())
        guard !subscriptions.isEmpty else { return false }
        var triggers: [NotificationTrigger] = []
        var spent: [Int64] = []
        var queued = false
        for subscription in subscriptions {
            let fired = try firings(of: subscription, effects)
            guard !fired.isEmpty else { continue }
            for firing in fired {
                triggers.append(NotificationTrigger(
                    userID: subscription.userID, subscriptionRowID: subscription.rowID, zoneRowID: firing.zoneRowID,
                    databaseID: subscription.databaseID, subscriptionName: subscription.name, kind: subscription.kind,
                    zoneName: firing.zone?.zoneName, zoneOwner: firing.zone?.ownerRecordName))
            }
            if let url = subscription.webhookURL {
                let now = configuration.now()
                _ = try tx.enqueueDelivery(subscriptionRowID: subscription.rowID, userID: subscription.userID, url: url,
                                           nowMs: now) { seq in
                    Webhooks.payload(subscription, seq: seq, firings: fired, effects: effects, container: configuration.container,
                                     nowMs: now)
                }
                queued = true
            }
            if subscription.firesOnce { spent.append(subscription.rowID) }
        }
        guard !triggers.isEmpty else { return queued }
        _ = try tx.raiseNotifications(triggers, origin: effects.origin)
        for rowID in spent { _ = try tx.deleteSubscription(rowID: rowID, keepingNotifications: true) }
        return queued
    }

    /// Where `subscription` fires in `effects`: per zone, with the records behind it.
    private func firings(of subscription: StoredSubscription, _ effects: CommitEffects) throws -> [Firing] {
        switch subscription.kind {
        case .database:
            guard effects.databaseIDs.contains(subscription.databaseID) else { return [] }
            let zones = Set(effects.zones.filter { $0.databaseID == subscription.databaseID }.map(\.zoneRowID))
            return [Firing(zoneRowID: 0, zone: nil, records: effects.records.filter { zones.contains($0.zone.rowID) })]
        case .zone:
            return effects.zones.filter {
                $0.databaseID == subscription.databaseID && $0.zoneName == subscription.zoneName
                    && $0.ownerRecordName == subscription.zoneOwner
            }.sorted { $0.zoneRowID < $1.zoneRowID }.map { zone in
                Firing(zoneRowID: zone.zoneRowID, zone: zone, records: effects.records.filter { $0.zone.rowID == zone.zoneRowID })
            }
        case .query:
            var fired: [Int64: Firing] = [:]
            var filters: [QueryFilter]?
            for change in effects.records where change.databaseID == subscription.databaseID
                && change.recordType == subscription.recordType
                && (subscription.zoneName == nil || subscription.zoneName == change.zone.name)
                && subscription.firesOn & change.event.bit != 0 {
                if filters == nil { filters = try queryFilters(subscription) }
                guard try matches(change, filters ?? []) else { continue }
                fired[change.zone.rowID, default: Firing(
                    zoneRowID: change.zone.rowID,
                    zone: CommitEffects.ZoneChange(databaseID: change.databaseID, zoneRowID: change.zone.rowID,
                                                   zoneName: change.zone.name, ownerRecordName: change.zone.ownerRecordName),
                    records: [])].records.append(change)
            }
            return fired.keys.sorted().compactMap { fired[$0] }
        }
    }

    private func queryFilters(_ subscription: StoredSubscription) throws -> [QueryFilter] {
        let wire = try WireSubscription(json: try render(subscription), path: "subscription", limits: requestLimits)
        return wire.filters.map(QueryFilter.init)
    }

    /// A created record matches as written, a deleted one as it was, an updated one either way (it entered,
    /// stayed in or left the query).
    private func matches(_ change: CommitEffects.RecordChange, _ filters: [QueryFilter]) throws -> Bool {
        guard !filters.isEmpty else { return true }
        func test(_ record: Record) -> Bool { filters.allSatisfy { $0.matches(record) } }
        switch change.event {
        case .create: return test(try decode(change.after))
        case .delete: return try change.before.map { test(try decode($0)) } ?? false
        case .update:
            if test(try decode(change.after)) { return true }
            return try change.before.map { test(try decode($0)) } ?? false
        }
    }

    // MARK: Push tokens

    /// `tokens/create {"apnsEnvironment"}`: a push token for the device the request came from (its bearer
    /// token or browser session), and the URL of its push stream (`webcourierURL`, as CloudKit names it).
    public func createPushToken(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try PushTokenRequest(json: .object(body), requireToken: false)
        guard let device = caller.tokenID else {
            throw ServiceError.badRequest("tokens/create needs a bearer token or a browser session")
        }
        let token = Self.pushTokenPrefix + Secrets.hex(try Secrets.randomBytes(32))
        try core.write(deadline: caller.deadline) { tx, _ in
            // A device keeps its newest push tokens: one more replaces its oldest (a device that lost its token, or
            // a program that makes one a run, is never locked out).
            _ = try tx.prunePushTokens(deviceTokenID: device, keeping: configuration.maximumPushTokensPerDevice - 1)
            try tx.insertPushToken(StoredPushToken(hash: Secrets.sha256(Array(token.utf8)), userID: caller.user.id,
                                                   deviceTokenID: device, environment: caller.environment,
                                                   apnsEnvironment: request.apnsEnvironment, registered: false,
                                                   createdMs: configuration.now()))
        }
        return .object([
            "apnsEnvironment": .string(request.apnsEnvironment),
            "apnsToken": .string(token),
            "webcourierURL": .string(core.publicURL + "/push/" + token),
        ])
    }

    /// `tokens/register {"apnsEnvironment", "apnsToken"}`: the caller's push token now receives the
    /// notifications of their subscriptions.
    public func registerPushToken(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try PushTokenRequest(json: .object(body), requireToken: true)
        let token = request.apnsToken ?? ""
        let registered = try core.write(deadline: caller.deadline) { tx, _ in
            try tx.registerPushToken(hash: Secrets.sha256(Array(token.utf8)), userID: caller.user.id)
        }
        guard registered else { throw ServiceError(.notFound, "no such push token of yours; make one with tokens/create") }
        return request.json
    }

    // MARK: Push streams

    /// Whether `text` is shaped like a push token (checked before any storage work).
    package static func isPushToken(_ text: String) -> Bool {
        text.hasPrefix(pushTokenPrefix) && text.utf8.count == pushTokenPrefix.utf8.count + 64
            && text.utf8.dropFirst(pushTokenPrefix.utf8.count).allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// The device and databases a push token opens a stream for; nil for an unknown or revoked token. The
    /// private and shared databases are made if missing (reading inside a write makes them), so the stream
    /// watches ids that stay.
    /// - Throws: BAD_REQUEST for a token not registered yet.
    public func openSession(pushToken text: String, deadline: RequestDeadline?) throws -> PushSession? {
        guard Self.isPushToken(text) else { return nil }
        let hash = Secrets.sha256(Array(text.utf8))
        return try core.write(deadline: deadline) { tx, _ in try session(hash: hash, tx) }
    }

    /// Whether a stream's push token still holds, as the stream checks it at every heartbeat: false once the
    /// token or its device token is gone (revoked, expired), which ends the stream. One point read: the
    /// session's databases never change.
    public func isLive(_ session: PushSession, deadline: RequestDeadline?) throws -> Bool {
        try storage.read(deadline: deadline, lane: .authentication) { tx in
            try tx.pushToken(hash: session.tokenHash, nowMs: configuration.now()) != nil
        }
    }

    private func session(hash: [UInt8], _ tx: any StorageTransaction) throws -> PushSession? {
        guard let token = try tx.pushToken(hash: hash, nowMs: configuration.now()) else { return nil }
        guard token.registered else {
            throw ServiceError.badRequest("this push token is not registered; register it with tokens/register")
        }
        var databases: [Int64: DatabaseKind] = [:]
        for kind in [DatabaseKind.private, .shared] {
            let database = try tx.database(DatabaseKey(kind: kind, environment: token.environment, ownerID: token.userID))
            if database.id != 0 { databases[database.id] = kind }
        }
        return PushSession(userID: token.userID, deviceTokenID: token.deviceTokenID, environment: token.environment,
                           databases: databases, tokenHash: hash)
    }

    /// The user's latest notification position: where a stream opened without `Last-Event-ID` starts.
    public func latestPosition(_ session: PushSession, deadline: RequestDeadline?) throws -> Int64 {
        try storage.read(deadline: deadline) { tx in try tx.lastNotificationSeq(userID: session.userID) }
    }

    /// The notifications after `cursor` that concern the stream's device, as (position, JSON) pairs, and the
    /// position to resume from (past rows it skipped: its own changes, other environments).
    public func notifications(_ session: PushSession, after cursor: Int64, limit: Int,
                              deadline: RequestDeadline?) throws -> (events: [(Int64, JSON)], cursor: Int64) {
        let rows = try storage.read(deadline: deadline) { tx in
            try tx.notifications(userID: session.userID, after: cursor, limit: limit)
        }
        var events: [(Int64, JSON)] = []
        var position = cursor
        for row in rows {
            position = max(position, row.seq)
            guard let kind = session.databases[row.trigger.databaseID],
                  row.concerns(device: session.deviceTokenID, after: cursor) else { continue }
            events.append((row.seq, notificationJSON(row, database: kind)))
        }
        return (events, position)
    }

    /// A notification as a device reads it: what to fetch, never the data (CKNotification's fields).
    private func notificationJSON(_ row: StoredNotification, database: DatabaseKind) -> JSON {
        let type = switch row.trigger.kind {
        case .query: "query"
        case .zone: "recordZone"
        case .database: "database"
        }
        var object: [String: JSON] = [
            "notificationID": .string(String(row.seq)),
            "notificationType": .string(type),
            "subscriptionID": .string(row.trigger.subscriptionName),
            "containerIdentifier": .string(configuration.container),
            "databaseScope": .string(database.rawValue),
        ]
        if let name = row.trigger.zoneName, let owner = row.trigger.zoneOwner {
            object["zoneID"] = .object(["zoneName": .string(name), "ownerRecordName": .string(owner)])
        }
        return .object(object)
    }
}

/// What a push stream serves: one device of one user, and the databases (private and shared, of the
/// token's environment) whose notifications it carries.
public struct PushSession: Sendable, Hashable {
    public let userID: Int64
    /// The bearer token (or session) id of the device: changes it made are not announced to it.
    public let deviceTokenID: String
    public let environment: String
    public let databases: [Int64: DatabaseKind]
    let tokenHash: [UInt8]
}
