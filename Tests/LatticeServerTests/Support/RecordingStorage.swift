import LatticeCore
import LatticeStore
import Synchronization

/// A `Storage` that forwards everything to another and notes which transaction operations were called, so
/// a test can say what a request read (say, that a page never loaded records). Every call is forwarded
/// unchanged, the backends' own streaming reads and batch writes included.
final class RecordingStorage: Storage {
    let base: any Storage
    private let calls = Mutex<[String]>([])

    init(_ base: any Storage) {
        self.base = base
    }

    /// The names of the transaction operations called since the last `reset`, in order (`records`,
    /// `children`, `recordCount`, ...; overloads share a name).
    var operations: [String] { calls.withLock { $0 } }

    func reset() { calls.withLock { $0 = [] } }

    fileprivate func note(_ operation: String) { calls.withLock { $0.append(operation) } }

    func read<T>(deadline: RequestDeadline?, lane: ReadLane, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try base.read(deadline: deadline, lane: lane) { try body(RecordingTransaction(base: $0, storage: self)) }
    }

    func write<T>(deadline: RequestDeadline?, _ body: (any StorageTransaction) throws -> T) throws -> T {
        try base.write(deadline: deadline) { try body(RecordingTransaction(base: $0, storage: self)) }
    }

    func close() { base.close() }
    func sizeOnDisk() throws -> Int64 { try base.sizeOnDisk() }
    func sizeOnDisk(deadline: RequestDeadline?) throws -> Int64 { try base.sizeOnDisk(deadline: deadline) }
    func observeChanges(_ handler: @escaping @Sendable (StorageChange) -> Void) throws {
        try base.observeChanges(handler)
    }
    func claimNode(_ name: String) throws { try base.claimNode(name) }
    func checkNodeClaims() throws { try base.checkNodeClaims() }
    var assetContents: any AssetContentStore { base.assetContents }
}

/// One transaction of a `RecordingStorage`: notes each operation's name, then forwards it.
private struct RecordingTransaction: StorageTransaction {
    let base: any StorageTransaction
    let storage: RecordingStorage

    private func note(_ operation: String) { storage.note(operation) }

    func metadata(_ key: String) throws -> String? {
        note("metadata")
        return try base.metadata(key)
    }

    func setMetadata(_ key: String, _ value: String) throws {
        note("setMetadata")
        return try base.setMetadata(key, value)
    }

    func insertUser(name: String, recordName: String, nowMs: Int64) throws -> UserAccount {
        note("insertUser")
        return try base.insertUser(name: name, recordName: recordName, nowMs: nowMs)
    }

    func user(named name: String) throws -> UserAccount? {
        note("user")
        return try base.user(named: name)
    }

    func user(recordName: String) throws -> UserAccount? {
        note("user")
        return try base.user(recordName: recordName)
    }

    func user(id: Int64) throws -> UserAccount? {
        note("user")
        return try base.user(id: id)
    }

    func user(tokenHash: [UInt8]) throws -> UserAccount? {
        note("user")
        return try base.user(tokenHash: tokenHash)
    }

    func insertToken(_ token: NewToken) throws {
        note("insertToken")
        return try base.insertToken(token)
    }

    func tokenOwner(hash: [UInt8]) throws -> (token: StoredToken, user: UserAccount)? {
        note("tokenOwner")
        return try base.tokenOwner(hash: hash)
    }

    func tokens(userID: Int64) throws -> [StoredToken] {
        note("tokens")
        return try base.tokens(userID: userID)
    }

    func token(id: String) throws -> StoredToken? {
        note("token")
        return try base.token(id: id)
    }

    func deleteToken(id: String) throws -> Bool {
        note("deleteToken")
        return try base.deleteToken(id: id)
    }

    func extendToken(id: String, expiresMs: Int64) throws -> Bool {
        note("extendToken")
        return try base.extendToken(id: id, expiresMs: expiresMs)
    }

    func deleteTokens(userID: Int64) throws -> Int {
        note("deleteTokens")
        return try base.deleteTokens(userID: userID)
    }

    func recordSignUp(address: String, nowMs: Int64) throws {
        note("recordSignUp")
        return try base.recordSignUp(address: address, nowMs: nowMs)
    }

    func signUps(address: String?, sinceMs: Int64) throws -> SignUpWindow {
        note("signUps")
        return try base.signUps(address: address, sinceMs: sinceMs)
    }

    func forgetSignUps(before beforeMs: Int64) throws {
        note("forgetSignUps")
        return try base.forgetSignUps(before: beforeMs)
    }

    // MARK: External identities

    func linkIdentity(issuer: String, subject: String, userID: Int64, nowMs: Int64) throws {
        note("linkIdentity")
        return try base.linkIdentity(issuer: issuer, subject: subject, userID: userID, nowMs: nowMs)
    }

    func useIdentity(issuer: String, subject: String, nowMs: Int64) throws -> Int64? {
        note("useIdentity")
        return try base.useIdentity(issuer: issuer, subject: subject, nowMs: nowMs)
    }

    func identities(userID: Int64) throws -> Int {
        note("identities")
        return try base.identities(userID: userID)
    }

    func insertOIDCLogin(_ login: OIDCLogin) throws {
        note("insertOIDCLogin")
        return try base.insertOIDCLogin(login)
    }

    func takeOIDCLogin(stateHash: [UInt8], nowMs: Int64) throws -> OIDCLogin? {
        note("takeOIDCLogin")
        return try base.takeOIDCLogin(stateHash: stateHash, nowMs: nowMs)
    }

    func liveOIDCLogins(address: String?, nowMs: Int64) throws -> Int {
        note("liveOIDCLogins")
        return try base.liveOIDCLogins(address: address, nowMs: nowMs)
    }

    func forgetOIDCLogins(expiredAt nowMs: Int64) throws -> Int {
        note("forgetOIDCLogins")
        return try base.forgetOIDCLogins(expiredAt: nowMs)
    }

    // MARK: Passkeys

    func insertPasskey(_ passkey: NewPasskey) throws {
        note("insertPasskey")
        return try base.insertPasskey(passkey)
    }

    func passkey(credentialID: [UInt8]) throws -> StoredPasskey? {
        note("passkey")
        return try base.passkey(credentialID: credentialID)
    }

    func passkeys(userID: Int64) throws -> [StoredPasskey] {
        note("passkeys")
        return try base.passkeys(userID: userID)
    }

    func recordPasskeySignIn(credentialID: [UInt8], signCount: Int64, nowMs: Int64) throws -> Bool {
        note("recordPasskeySignIn")
        return try base.recordPasskeySignIn(credentialID: credentialID, signCount: signCount, nowMs: nowMs)
    }

    func renamePasskey(credentialID: [UInt8], userID: Int64, name: String) throws -> Bool {
        note("renamePasskey")
        return try base.renamePasskey(credentialID: credentialID, userID: userID, name: name)
    }

    func deletePasskey(credentialID: [UInt8], userID: Int64) throws -> Bool {
        note("deletePasskey")
        return try base.deletePasskey(credentialID: credentialID, userID: userID)
    }

    func insertPasskeyCeremony(_ ceremony: PasskeyCeremony) throws {
        note("insertPasskeyCeremony")
        return try base.insertPasskeyCeremony(ceremony)
    }

    func takePasskeyCeremony(challengeHash: [UInt8], nowMs: Int64) throws -> PasskeyCeremony? {
        note("takePasskeyCeremony")
        return try base.takePasskeyCeremony(challengeHash: challengeHash, nowMs: nowMs)
    }

    func livePasskeyCeremonies(address: String?, nowMs: Int64) throws -> Int {
        note("livePasskeyCeremonies")
        return try base.livePasskeyCeremonies(address: address, nowMs: nowMs)
    }

    func forgetPasskeyCeremonies(expiredAt nowMs: Int64) throws -> Int {
        note("forgetPasskeyCeremonies")
        return try base.forgetPasskeyCeremonies(expiredAt: nowMs)
    }

    func replaceRecoveryCodes(userID: Int64, hashes: [[UInt8]], nowMs: Int64) throws {
        note("replaceRecoveryCodes")
        return try base.replaceRecoveryCodes(userID: userID, hashes: hashes, nowMs: nowMs)
    }

    func useRecoveryCode(hash: [UInt8], nowMs: Int64) throws -> Int64? {
        note("useRecoveryCode")
        return try base.useRecoveryCode(hash: hash, nowMs: nowMs)
    }

    func unusedRecoveryCodes(userID: Int64) throws -> Int {
        note("unusedRecoveryCodes")
        return try base.unusedRecoveryCodes(userID: userID)
    }

    func insertDeviceAuthorization(_ authorization: NewDeviceAuthorization) throws {
        note("insertDeviceAuthorization")
        return try base.insertDeviceAuthorization(authorization)
    }

    func deviceAuthorization(deviceCodeHash: [UInt8]) throws -> StoredDeviceAuthorization? {
        note("deviceAuthorization")
        return try base.deviceAuthorization(deviceCodeHash: deviceCodeHash)
    }

    func deviceAuthorization(userCodeHash: [UInt8]) throws -> StoredDeviceAuthorization? {
        note("deviceAuthorization")
        return try base.deviceAuthorization(userCodeHash: userCodeHash)
    }

    func liveDeviceAuthorizations(address: String?, nowMs: Int64) throws -> Int {
        note("liveDeviceAuthorizations")
        return try base.liveDeviceAuthorizations(address: address, nowMs: nowMs)
    }

    func decideDeviceAuthorization(userCodeHash: [UInt8], approve: Bool, userID: Int64, deviceName: String?,
                                   nowMs: Int64) throws -> Bool {
        note("decideDeviceAuthorization")
        return try base.decideDeviceAuthorization(userCodeHash: userCodeHash, approve: approve, userID: userID,
                                                  deviceName: deviceName, nowMs: nowMs)
    }

    func recordDevicePoll(deviceCodeHash: [UInt8], nowMs: Int64, intervalSeconds: Int64) throws {
        note("recordDevicePoll")
        return try base.recordDevicePoll(deviceCodeHash: deviceCodeHash, nowMs: nowMs, intervalSeconds: intervalSeconds)
    }

    func claimDeviceAuthorization(deviceCodeHash: [UInt8], nowMs: Int64) throws -> StoredDeviceAuthorization? {
        note("claimDeviceAuthorization")
        return try base.claimDeviceAuthorization(deviceCodeHash: deviceCodeHash, nowMs: nowMs)
    }

    func forgetDeviceAuthorizations(expiredAt nowMs: Int64) throws -> Int {
        note("forgetDeviceAuthorizations")
        return try base.forgetDeviceAuthorizations(expiredAt: nowMs)
    }

    func recordDeviceApprovalFailure(key: String, nowMs: Int64) throws {
        note("recordDeviceApprovalFailure")
        return try base.recordDeviceApprovalFailure(key: key, nowMs: nowMs)
    }

    func deviceApprovalFailures(key: String, sinceMs: Int64) throws -> SignUpWindow {
        note("deviceApprovalFailures")
        return try base.deviceApprovalFailures(key: key, sinceMs: sinceMs)
    }

    func forgetDeviceApprovalFailures(before beforeMs: Int64) throws {
        note("forgetDeviceApprovalFailures")
        return try base.forgetDeviceApprovalFailures(before: beforeMs)
    }

    func database(_ key: DatabaseKey) throws -> StoredDatabase {
        note("database")
        return try base.database(key)
    }

    func database(id: Int64) throws -> StoredDatabase? {
        note("database")
        return try base.database(id: id)
    }

    func zone(databaseID: Int64, name: String) throws -> StoredZone? {
        note("zone")
        return try base.zone(databaseID: databaseID, name: name)
    }

    func zone(rowID: Int64) throws -> StoredZone? {
        note("zone")
        return try base.zone(rowID: rowID)
    }

    func liveZones(databaseID: Int64) throws -> [StoredZone] {
        note("liveZones")
        return try base.liveZones(databaseID: databaseID)
    }

    func createZone(databaseID: Int64, name: String, ownerRecordName: String, nowMs: Int64) throws -> StoredZone {
        note("createZone")
        return try base.createZone(databaseID: databaseID, name: name, ownerRecordName: ownerRecordName, nowMs: nowMs)
    }

    func deleteZone(rowID: Int64, nowMs: Int64) throws {
        note("deleteZone")
        return try base.deleteZone(rowID: rowID, nowMs: nowMs)
    }

    func zoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [StoredZone] {
        note("zoneChanges")
        return try base.zoneChanges(databaseID: databaseID, after: cursor, limit: limit)
    }

    func record(zoneRowID: Int64, name: String) throws -> StoredRecord? {
        note("record")
        return try base.record(zoneRowID: zoneRowID, name: name)
    }

    func records(zoneRowID: Int64, recordType: String?) throws -> [StoredRecord] {
        note("records")
        return try base.records(zoneRowID: zoneRowID, recordType: recordType)
    }

    func forEachRecord(zoneRowID: Int64, recordType: String?, _ body: (StoredRecord) throws -> Bool) throws {
        note("forEachRecord")
        return try base.forEachRecord(zoneRowID: zoneRowID, recordType: recordType, body)
    }

    func saveRecord(zoneRowID: Int64, _ write: RecordWrite) throws -> StoredRecord {
        note("saveRecord")
        return try base.saveRecord(zoneRowID: zoneRowID, write)
    }

    func saveRecords(zoneRowID: Int64, _ writes: [RecordWrite], previous: [StoredRecord?]) throws -> [StoredRecord] {
        note("saveRecords")
        return try base.saveRecords(zoneRowID: zoneRowID, writes, previous: previous)
    }

    func prefetchRecords(zoneRowID: Int64, names: [String]) throws {
        note("prefetchRecords")
        return try base.prefetchRecords(zoneRowID: zoneRowID, names: names)
    }

    func recordChanges(zoneRowID: Int64, after cursor: Int64, limit: Int) throws -> [StoredRecord] {
        note("recordChanges")
        return try base.recordChanges(zoneRowID: zoneRowID, after: cursor, limit: limit)
    }

    func forEachRecordChange(zoneRowID: Int64, after cursor: Int64, limit: Int,
                             _ body: (StoredRecord) throws -> Bool) throws {
        note("forEachRecordChange")
        return try base.forEachRecordChange(zoneRowID: zoneRowID, after: cursor, limit: limit, body)
    }

    func children(zoneRowID: Int64, parentName: String) throws -> [String] {
        note("children")
        return try base.children(zoneRowID: zoneRowID, parentName: parentName)
    }

    func recordCount(zoneRowID: Int64, recordType: String?) throws -> Int {
        note("recordCount")
        return try base.recordCount(zoneRowID: zoneRowID, recordType: recordType)
    }

    func childCount(zoneRowID: Int64, parentName: String) throws -> Int {
        note("childCount")
        return try base.childCount(zoneRowID: zoneRowID, parentName: parentName)
    }

    func insertShare(_ share: NewShare) throws -> StoredShare {
        note("insertShare")
        return try base.insertShare(share)
    }

    func share(publicID: String) throws -> StoredShare? {
        note("share")
        return try base.share(publicID: publicID)
    }

    func share(id: Int64) throws -> StoredShare? {
        note("share")
        return try base.share(id: id)
    }

    func shares(zoneRowID: Int64) throws -> [StoredShare] {
        note("shares")
        return try base.shares(zoneRowID: zoneRowID)
    }

    func updateShare(_ share: StoredShare) throws {
        note("updateShare")
        return try base.updateShare(share)
    }

    func participants(shareID: Int64) throws -> [StoredParticipant] {
        note("participants")
        return try base.participants(shareID: shareID)
    }

    func saveParticipant(_ participant: StoredParticipant) throws {
        note("saveParticipant")
        return try base.saveParticipant(participant)
    }

    func participations(userID: Int64, status: AcceptanceStatus) throws
        -> [(share: StoredShare, participant: StoredParticipant)] {
        note("participations")
        return try base.participations(userID: userID, status: status)
    }

    func linkUses(tokenID: String) throws -> Int {
        note("linkUses")
        return try base.linkUses(tokenID: tokenID)
    }

    func recordLinkUse(tokenID: String, shareID: Int64) throws {
        note("recordLinkUse")
        return try base.recordLinkUse(tokenID: tokenID, shareID: shareID)
    }

    func insertSubscription(_ subscription: StoredSubscription) throws -> StoredSubscription {
        note("insertSubscription")
        return try base.insertSubscription(subscription)
    }

    func updateSubscription(_ subscription: StoredSubscription) throws -> Bool {
        note("updateSubscription")
        return try base.updateSubscription(subscription)
    }

    func deleteSubscription(rowID: Int64, keepingNotifications: Bool) throws -> Bool {
        note("deleteSubscription")
        return try base.deleteSubscription(rowID: rowID, keepingNotifications: keepingNotifications)
    }

    func subscription(databaseID: Int64, name: String) throws -> StoredSubscription? {
        note("subscription")
        return try base.subscription(databaseID: databaseID, name: name)
    }

    func subscription(rowID: Int64) throws -> StoredSubscription? {
        note("subscription")
        return try base.subscription(rowID: rowID)
    }

    func subscriptions(databaseID: Int64, limit: Int) throws -> [StoredSubscription] {
        note("subscriptions")
        return try base.subscriptions(databaseID: databaseID, limit: limit)
    }

    func subscriptionCount(databaseID: Int64) throws -> Int {
        note("subscriptionCount")
        return try base.subscriptionCount(databaseID: databaseID)
    }

    func subscriptions(databaseIDs: [Int64]) throws -> [StoredSubscription] {
        note("subscriptions")
        return try base.subscriptions(databaseIDs: databaseIDs)
    }

    func raiseNotifications(_ triggers: [NotificationTrigger], origin: String?) throws -> [Int64: Int64] {
        note("raiseNotifications")
        return try base.raiseNotifications(triggers, origin: origin)
    }

    func notifications(userID: Int64, after cursor: Int64, limit: Int) throws -> [StoredNotification] {
        note("notifications")
        return try base.notifications(userID: userID, after: cursor, limit: limit)
    }

    func lastNotificationSeq(userID: Int64) throws -> Int64 {
        note("lastNotificationSeq")
        return try base.lastNotificationSeq(userID: userID)
    }

    func insertPushToken(_ token: StoredPushToken) throws {
        note("insertPushToken")
        try base.insertPushToken(token)
    }

    func pushToken(hash: [UInt8], nowMs: Int64) throws -> StoredPushToken? {
        note("pushToken")
        return try base.pushToken(hash: hash, nowMs: nowMs)
    }

    func registerPushToken(hash: [UInt8], userID: Int64) throws -> Bool {
        note("registerPushToken")
        return try base.registerPushToken(hash: hash, userID: userID)
    }

    func prunePushTokens(deviceTokenID: String, keeping: Int) throws -> Int {
        note("prunePushTokens")
        return try base.prunePushTokens(deviceTokenID: deviceTokenID, keeping: keeping)
    }

    func forgetOrphanPushTokens(nowMs: Int64, limit: Int) throws -> Int {
        note("forgetOrphanPushTokens")
        return try base.forgetOrphanPushTokens(nowMs: nowMs, limit: limit)
    }

    func forgetOrphanNotifications(limit: Int) throws -> Int {
        note("forgetOrphanNotifications")
        return try base.forgetOrphanNotifications(limit: limit)
    }

    func enqueueDelivery(subscriptionRowID: Int64, userID: Int64, url: String, nowMs: Int64,
                         payload: (_ seq: Int64) throws -> [UInt8]) throws -> StoredDelivery {
        note("enqueueDelivery")
        return try base.enqueueDelivery(subscriptionRowID: subscriptionRowID, userID: userID, url: url, nowMs: nowMs,
                                        payload: payload)
    }

    func nextDeliveryDueMs() throws -> Int64? {
        note("nextDeliveryDueMs")
        return try base.nextDeliveryDueMs()
    }

    func claimDeliveries(node: String, nowMs: Int64, leaseMs: Int64, limit: Int) throws -> [StoredDelivery] {
        note("claimDeliveries")
        return try base.claimDeliveries(node: node, nowMs: nowMs, leaseMs: leaseMs, limit: limit)
    }

    func finishDelivery(id: Int64, node: String, outcome: DeliveryOutcome, nowMs: Int64) throws -> Bool {
        note("finishDelivery")
        return try base.finishDelivery(id: id, node: node, outcome: outcome, nowMs: nowMs)
    }

    func releaseDeliveryClaims(node: String) throws -> Int {
        note("releaseDeliveryClaims")
        return try base.releaseDeliveryClaims(node: node)
    }

    func deliveries(subscriptionRowID: Int64, state: DeliveryState?, afterSeq: Int64, limit: Int) throws -> [StoredDelivery] {
        note("deliveries")
        return try base.deliveries(subscriptionRowID: subscriptionRowID, state: state, afterSeq: afterSeq, limit: limit)
    }

    func replayDeliveries(subscriptionRowID: Int64, seqs: [Int64]?, nowMs: Int64) throws -> Int {
        note("replayDeliveries")
        return try base.replayDeliveries(subscriptionRowID: subscriptionRowID, seqs: seqs, nowMs: nowMs)
    }

    func purgeDeliveries(finishedBefore beforeMs: Int64, limit: Int) throws -> Int {
        note("purgeDeliveries")
        return try base.purgeDeliveries(finishedBefore: beforeMs, limit: limit)
    }

    func insertShortLink(code: String, shareID: Int64, token: String, nowMs: Int64) throws {
        note("insertShortLink")
        try base.insertShortLink(code: code, shareID: shareID, token: token, nowMs: nowMs)
    }

    func shortLink(code: String) throws -> (shareID: Int64, token: String)? {
        note("shortLink")
        return try base.shortLink(code: code)
    }

    func pruneShortLinks(shareID: Int64, keeping: Int) throws -> Int {
        note("pruneShortLinks")
        return try base.pruneShortLinks(shareID: shareID, keeping: keeping)
    }

    func setShareMembership(shareID: Int64, recordName: String, member: Bool) throws {
        note("setShareMembership")
        return try base.setShareMembership(shareID: shareID, recordName: recordName, member: member)
    }

    func shareMembership(shareID: Int64, recordName: String) throws -> Bool? {
        note("shareMembership")
        return try base.shareMembership(shareID: shareID, recordName: recordName)
    }

    func shareChanges(shareID: Int64, after cursor: Int64, limit: Int) throws -> [ShareLogEntry] {
        note("shareChanges")
        return try base.shareChanges(shareID: shareID, after: cursor, limit: limit)
    }

    func markSharedZone(databaseID: Int64, shareID: Int64, deleted: Bool) throws {
        note("markSharedZone")
        return try base.markSharedZone(databaseID: databaseID, shareID: shareID, deleted: deleted)
    }

    func sharedZoneChanges(databaseID: Int64, after cursor: Int64, limit: Int) throws -> [SharedZoneEntry] {
        note("sharedZoneChanges")
        return try base.sharedZoneChanges(databaseID: databaseID, after: cursor, limit: limit)
    }

    func clientOperation(userID: Int64, operationID: String) throws -> ClientOperation? {
        note("clientOperation")
        return try base.clientOperation(userID: userID, operationID: operationID)
    }

    func saveClientOperation(userID: Int64, operationID: String, _ operation: ClientOperation,
                             chargedTo databaseID: Int64, nowMs: Int64) throws {
        note("saveClientOperation")
        return try base.saveClientOperation(userID: userID, operationID: operationID, operation,
                                            chargedTo: databaseID, nowMs: nowMs)
    }

    func clientOperationCount(userID: Int64) throws -> Int {
        note("clientOperationCount")
        return try base.clientOperationCount(userID: userID)
    }

    func forgetOldestClientOperations(userID: Int64, count: Int) throws -> Int {
        note("forgetOldestClientOperations")
        return try base.forgetOldestClientOperations(userID: userID, count: count)
    }

    func savepoint<T>(_ body: () throws -> T) throws -> T {
        note("savepoint")
        return try base.savepoint(body)
    }

    func node(named name: String) throws -> StoredNode? {
        note("node")
        return try base.node(named: name)
    }

    func insertNode(_ node: StoredNode) throws {
        note("insertNode")
        return try base.insertNode(node)
    }

    func raiseNodeClock(name: String, to latest: Int64) throws {
        note("raiseNodeClock")
        return try base.raiseNodeClock(name: name, to: latest)
    }

    func announceChanges(databaseIDs: [Int64]) throws {
        note("announceChanges")
        return try base.announceChanges(databaseIDs: databaseIDs)
    }

    func tryExclusiveLock(_ name: String) throws -> Bool {
        note("tryExclusiveLock")
        return try base.tryExclusiveLock(name)
    }

    func exportRows(table: String, _ body: ([[StorageValue]]) throws -> Void) throws {
        note("exportRows")
        return try base.exportRows(table: table, body)
    }

    func insertRows(table: String, _ rows: [[StorageValue]]) throws {
        note("insertRows")
        return try base.insertRows(table: table, rows)
    }

    func finishImport() throws {
        note("finishImport")
        return try base.finishImport()
    }

    func rowCount(table: String) throws -> Int {
        note("rowCount")
        return try base.rowCount(table: table)
    }

    func purge(before horizonMs: Int64, operationsBeforeMs: Int64, limit: Int) throws -> PurgeReport {
        note("purge")
        return try base.purge(before: horizonMs, operationsBeforeMs: operationsBeforeMs, limit: limit)
    }
}

/// The asset rows, forwarded.
extension RecordingTransaction {
    func insertAssetUpload(_ upload: StoredAssetUpload) throws -> StoredAssetUpload {
        note("insertAssetUpload")
        return try base.insertAssetUpload(upload)
    }

    func assetUpload(secretHash: [UInt8]) throws -> StoredAssetUpload? {
        note("assetUpload")
        return try base.assetUpload(secretHash: secretHash)
    }

    func openAssetUploadCount(userID: Int64, nowMs: Int64) throws -> Int {
        note("openAssetUploadCount")
        return try base.openAssetUploadCount(userID: userID, nowMs: nowMs)
    }

    func leaseAssetUpload(rowID: Int64, holder: String, untilMs: Int64, nowMs: Int64, nodePrefix: String,
                          processPrefix: String) throws -> Bool {
        note("leaseAssetUpload")
        return try base.leaseAssetUpload(rowID: rowID, holder: holder, untilMs: untilMs, nowMs: nowMs, nodePrefix: nodePrefix,
                                         processPrefix: processPrefix)
    }

    func releaseAssetUpload(rowID: Int64, holder: String) throws {
        note("releaseAssetUpload")
        return try base.releaseAssetUpload(rowID: rowID, holder: holder)
    }

    func declareAssetUpload(rowID: Int64, length: Int64, contentType: String?) throws {
        note("declareAssetUpload")
        return try base.declareAssetUpload(rowID: rowID, length: length, contentType: contentType)
    }

    func completeAssetUpload(rowID: Int64, checksum: [UInt8]) throws {
        note("completeAssetUpload")
        return try base.completeAssetUpload(rowID: rowID, checksum: checksum)
    }

    func expiredAssetUploads(nowMs: Int64, limit: Int) throws -> [StoredAssetUpload] {
        note("expiredAssetUploads")
        return try base.expiredAssetUploads(nowMs: nowMs, limit: limit)
    }

    func deleteAssetUpload(rowID: Int64) throws {
        note("deleteAssetUpload")
        return try base.deleteAssetUpload(rowID: rowID)
    }

    func assetBlob(databaseID: Int64, checksum: [UInt8]) throws -> StoredAssetBlob? {
        note("assetBlob")
        return try base.assetBlob(databaseID: databaseID, checksum: checksum)
    }

    func insertAssetBlob(_ blob: StoredAssetBlob) throws {
        note("insertAssetBlob")
        return try base.insertAssetBlob(blob)
    }

    func touchAssetBlob(databaseID: Int64, checksum: [UInt8], nowMs: Int64) throws {
        note("touchAssetBlob")
        return try base.touchAssetBlob(databaseID: databaseID, checksum: checksum, nowMs: nowMs)
    }

    func collectableAssetBlobs(before beforeMs: Int64, limit: Int) throws -> [StoredAssetBlob] {
        note("collectableAssetBlobs")
        return try base.collectableAssetBlobs(before: beforeMs, limit: limit)
    }

    func deleteAssetBlob(_ blob: StoredAssetBlob, before beforeMs: Int64) throws -> Bool {
        note("deleteAssetBlob")
        return try base.deleteAssetBlob(blob, before: beforeMs)
    }

    func assetContentIsKnown(_ content: String) throws -> Bool {
        note("assetContentIsKnown")
        return try base.assetContentIsKnown(content)
    }

    func claimAsset(databaseID: Int64, checksum: [UInt8], userID: Int64, nowMs: Int64) throws {
        note("claimAsset")
        return try base.claimAsset(databaseID: databaseID, checksum: checksum, userID: userID, nowMs: nowMs)
    }

    func hasAssetClaim(databaseID: Int64, checksum: [UInt8], userID: Int64, sinceMs: Int64) throws -> Bool {
        note("hasAssetClaim")
        return try base.hasAssetClaim(databaseID: databaseID, checksum: checksum, userID: userID, sinceMs: sinceMs)
    }

    func forgetAssetClaims(before beforeMs: Int64, limit: Int) throws -> Int {
        note("forgetAssetClaims")
        return try base.forgetAssetClaims(before: beforeMs, limit: limit)
    }

    func addAssetReferences(databaseID: Int64, zoneRowID: Int64, recordName: String, checksums: [[UInt8]]) throws {
        note("addAssetReferences")
        return try base.addAssetReferences(databaseID: databaseID, zoneRowID: zoneRowID, recordName: recordName, checksums: checksums)
    }

    func removeAssetReferences(zoneRowID: Int64, nowMs: Int64) throws {
        note("removeAssetReferences")
        return try base.removeAssetReferences(zoneRowID: zoneRowID, nowMs: nowMs)
    }

    func assetIsReferenced(databaseID: Int64, checksum: [UInt8], zoneRowID: Int64, recordName: String) throws -> Bool {
        note("assetIsReferenced")
        return try base.assetIsReferenced(databaseID: databaseID, checksum: checksum, zoneRowID: zoneRowID, recordName: recordName)
    }

    func insertAssetChunk(content: String, position: Int64, bytes: [UInt8]) throws {
        note("insertAssetChunk")
        return try base.insertAssetChunk(content: content, position: position, bytes: bytes)
    }

    func assetChunk(content: String, containing position: Int64) throws -> (position: Int64, bytes: [UInt8])? {
        note("assetChunk")
        return try base.assetChunk(content: content, containing: position)
    }

    func assetChunkLength(content: String) throws -> Int64 {
        note("assetChunkLength")
        return try base.assetChunkLength(content: content)
    }

    func deleteAssetChunks(content: String) throws {
        note("deleteAssetChunks")
        return try base.deleteAssetChunks(content: content)
    }

    func assetChunkContents(after: String, limit: Int) throws -> [String] {
        note("assetChunkContents")
        return try base.assetChunkContents(after: after, limit: limit)
    }

    func removeAssetReferences(databaseID: Int64, zoneRowID: Int64, recordName: String, checksums: [[UInt8]],
                               nowMs: Int64) throws {
        note("removeAssetReferences")
        return try base.removeAssetReferences(databaseID: databaseID, zoneRowID: zoneRowID, recordName: recordName,
                                              checksums: checksums, nowMs: nowMs)
    }

    func assetContentIDs(after: String, limit: Int) throws -> [String] {
        note("assetContentIDs")
        return try base.assetContentIDs(after: after, limit: limit)
    }
}
