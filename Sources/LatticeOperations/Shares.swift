import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore

/// One accepted share that gives the caller access to a zone in the shared database.
package struct ShareGrant: Sendable {
    package let share: StoredShare
    package let roster: ShareRoster
    /// The caller's permission through this share.
    package let permission: SharePermission
    package let role: ShareRole
}

/// Shares (CKShare): rosters and their participants, membership of a hierarchy, the shared database's view
/// of a zone, share links (signed, verified), and `shares/*`, `records/resolve`, `records/accept`.
public struct Shares: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    var zones: Zones { Zones(core) }

    /// The name of a zone-wide share's record, as in CloudKit.
    package static let zoneShareRecordName = "cloudkit.zoneshare"
    package static let shareRecordType = "cloudkit.share"

    // MARK: Rosters

    package func roster(_ share: StoredShare, _ tx: any StorageTransaction) throws -> ShareRoster {
        let participants = try tx.participants(shareID: share.id).map { row in
            ShareParticipant(userID: row.userID, role: row.role, permission: row.permission, status: row.status)
        }
        return ShareRoster(publicPermission: share.publicPermission, participants: participants)
    }

    /// Writes the roster's participants and public permission back, and moves the shared-database logs of
    /// everyone whose access changed (so their feeds and long polls see it at once).
    package func saveRoster(_ roster: ShareRoster, of share: inout StoredShare, before: ShareRoster, caller: Caller,
                    _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws {
        let now = core.configuration.now()
        for participant in roster.participants where before.participant(participant.userID) != participant {
            try tx.saveParticipant(StoredParticipant(shareID: share.id, userID: participant.userID,
                                                     role: participant.role, permission: participant.permission,
                                                     status: participant.status, modifiedMs: now))
            guard participant.role != .owner else { continue }
            let wasIn = before.access(of: participant.userID) != .none
            let isIn = roster.access(of: participant.userID) != .none
            if wasIn || isIn {
                try markShared(share, for: participant.userID, deleted: !isIn, caller: caller, tx, &touched)
            }
        }
        share.publicPermission = roster.publicPermission
        try tx.updateShare(share)
    }

    private func markShared(_ share: StoredShare, for userID: Int64, deleted: Bool, caller: Caller,
                            _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws {
        let database = try tx.database(DatabaseKey(kind: .shared, environment: caller.environment, ownerID: userID))
        try tx.markSharedZone(databaseID: database.id, shareID: share.id, deleted: deleted)
        if let zone = try tx.zone(rowID: share.zoneRowID) {
            touched.zoneChanged(zone, in: database.id, caller: caller)
        } else {
            touched.insert(database.id)
        }
    }

    /// Tells every accepted participant's shared database that the share's zone changed.
    package func fanOut(_ share: StoredShare, caller: Caller, _ tx: any StorageTransaction,
                _ touched: inout CommitEffects) throws {
        for participant in try tx.participants(shareID: share.id)
        where participant.status == .accepted && participant.role != .owner {
            try markShared(share, for: participant.userID, deleted: false, caller: caller, tx, &touched)
        }
    }

    // MARK: Access in the shared database

    /// Resolves a zone of the shared database: another user's zone in which the caller has accepted at
    /// least one live share. Anything else is ZONE_NOT_FOUND, so nothing leaks about zones one cannot see.
    package func resolveSharedZone(_ zoneID: ZoneID, _ caller: Caller, _ tx: any StorageTransaction) throws -> ResolvedZone {
        let notFound = ServiceError(.zoneNotFound, "no accepted share has zone \(zoneID.zoneName) of \(zoneID.ownerRecordName)")
        guard zoneID.ownerRecordName != caller.user.recordName, let owner = try tx.user(recordName: zoneID.ownerRecordName)
        else { throw notFound }
        let database = try tx.database(DatabaseKey(kind: .private, environment: caller.environment, ownerID: owner.id))
        guard let zone = try tx.zone(databaseID: database.id, name: zoneID.zoneName) else { throw notFound }
        var grants: [ShareGrant] = []
        for share in try tx.shares(zoneRowID: zone.rowID) {
            let roster = try roster(share, tx)
            let permission = roster.access(of: caller.user.id)
            guard permission != .none, let participant = roster.participant(caller.user.id) else { continue }
            grants.append(ShareGrant(share: share, roster: roster, permission: permission, role: participant.role))
        }
        guard !grants.isEmpty else { throw notFound }
        return ResolvedZone(database: database, zone: zone, zoneID: zoneID, grants: grants)
    }

    /// The grant under which a participant sees a record, or nil when the record is outside every share
    /// they accepted.
    package func grant(for recordName: String, _ resolved: ResolvedZone, _ tx: any StorageTransaction) throws -> ShareGrant? {
        guard let zone = resolved.zone else { return nil }
        for grant in resolved.grants where try isMember(recordName, of: grant.share, zone: zone, tx) {
            return grant
        }
        return nil
    }

    /// Whether a record is in a share: every record for a zone-wide share; for a hierarchy share the
    /// share's record, the root, and every record whose parent chain reaches the root.
    package func isMember(_ recordName: String, of share: StoredShare, zone: StoredZone, _ tx: any StorageTransaction) throws -> Bool {
        guard let root = share.rootRecordName else { return true }
        if recordName == share.recordName { return true }
        var name = recordName
        var seen: Set<String> = []
        while seen.count < 1_000 {
            if name == root { return true }
            guard seen.insert(name).inserted, let record = try tx.record(zoneRowID: zone.rowID, name: name),
                  let parent = record.parentName else { return false }
            name = parent
        }
        return false
    }

    /// The shared database's zones: one per zone holding a share the caller accepted.
    package func sharedZones(_ caller: Caller, _ tx: any StorageTransaction) throws -> [JSON] {
        var seen: Set<Int64> = []
        var zones: [JSON] = []
        for (share, _) in try tx.participations(userID: caller.user.id, status: .accepted)
        where share.ownerID != caller.user.id && seen.insert(share.zoneRowID).inserted {
            guard let zone = try tx.zone(rowID: share.zoneRowID), !zone.deleted else { continue }
            zones.append(self.zones.zoneJSON(zone, withToken: false))
        }
        return zones
    }

    // MARK: Record writes in zones with shares

    /// Checks a participant's write to a shared zone. `requestedParent` is the parent the write sets:
    /// nil when it does not touch the parent, `.some(nil)` when it clears it. `live` is false for a record
    /// outside every share the caller accepted (`plan` judges it as a missing one): a write that needs the
    /// record answers NOT_FOUND, one that would make it needs a parent inside a share and write access.
    package func checkParticipantWrite(_ recordName: String, isDelete: Bool, live: Bool, createsMissing: Bool,
                               requestedParent: String??, _ resolved: ResolvedZone, _ tx: any StorageTransaction) throws {
        guard let zone = resolved.zone else { throw ServiceError(.zoneNotFound, "the zone does not exist") }
        let target: ShareGrant
        if live {
            guard let found = try grant(for: recordName, resolved, tx) else {
                throw ServiceError(.notFound, "record \(recordName) does not exist")
            }
            target = found
        } else if !createsMissing {
            throw ServiceError(.notFound, "record \(recordName) does not exist")
        } else if let grant = resolved.grants.first(where: { $0.share.rootRecordName == nil }) {
            target = grant // zone-wide: anything in the zone
        } else {
            guard case .some(.some(let parent)) = requestedParent, let found = try grant(for: parent, resolved, tx) else {
                throw ServiceError(.permissionFailure, "a record created in a shared hierarchy needs a parent inside the share")
            }
            target = found
        }
        guard target.permission == .readWrite else {
            throw ServiceError(.permissionFailure, "you have read-only access to this share")
        }
        if isDelete, recordName == target.share.rootRecordName {
            throw ServiceError(.permissionFailure, "only the owner deletes the root record of a share")
        }
        if target.share.rootRecordName != nil, case .some(let parent) = requestedParent, live {
            guard let parent, try isMember(parent, of: target.share, zone: zone, tx) else {
                throw ServiceError(.permissionFailure, "a participant cannot move a record out of the shared hierarchy")
            }
        }
    }

    /// Checks where a participant's write puts a record: a record stays inside the share it is in (its new
    /// parent must be in that share), and the root's place is the owner's to change. This looks at the
    /// record as it will be stored, so a replace that drops the parent or a CRDT state with a newer parent
    /// stamp is held to the same rule as an explicit `parent`.
    package func checkParticipantPlacement(_ record: RecordFrame, before: RecordFrame?, live: Bool, _ resolved: ResolvedZone,
                                   _ tx: any StorageTransaction) throws {
        guard resolved.isShared, !record.isDeleted, !resolved.grants.contains(where: { $0.share.rootRecordName == nil })
        else { return }
        let name = record.recordName
        let oldParent = live ? before?.parentName : nil
        let newParent = record.parentName
        guard !live || oldParent != newParent else { return }
        let current = live ? try grant(for: name, resolved, tx) : nil
        if let current, current.share.rootRecordName == name {
            throw ServiceError(.permissionFailure, "only the owner moves the root record of a share")
        }
        guard let newParent, let target = try grant(for: newParent, resolved, tx),
              current == nil || target.share.id == current!.share.id else {
            throw ServiceError(.permissionFailure, "a participant cannot move a record out of the shared hierarchy")
        }
    }

    /// After records of a zone changed: updates each hierarchy share's log (records that entered, left or
    /// changed inside it, descendants included) and tells the participants' shared databases.
    package func recordsChanged(_ names: [String], in zone: StoredZone, caller: Caller, _ tx: any StorageTransaction,
                        _ touched: inout CommitEffects) throws {
        guard !names.isEmpty else { return }
        for share in try tx.shares(zoneRowID: zone.rowID) {
            guard share.rootRecordName != nil else {
                try fanOut(share, caller: caller, tx, &touched)
                continue
            }
            var logged = false
            for name in names {
                guard let stored = try tx.record(zoneRowID: zone.rowID, name: name) else { continue }
                let old = try tx.shareMembership(shareID: share.id, recordName: name)
                let member = stored.deleted ? (old ?? false) : try isMember(name, of: share, zone: zone, tx)
                guard member || old == true else { continue }
                try tx.setShareMembership(shareID: share.id, recordName: name, member: member)
                logged = true
                if (old ?? false) != member && !stored.deleted {
                    try cascadeMembership(from: name, member: member, share: share, zone: zone, tx)
                }
            }
            if logged { try fanOut(share, caller: caller, tx, &touched) }
        }
    }

    /// A record belongs to at most one share: a move that puts one share's root under another share's
    /// hierarchy is refused (ALREADY_SHARED), and the whole request with it.
    package func checkSharesStayDisjoint(_ zone: StoredZone, _ tx: any StorageTransaction) throws {
        let hierarchies = try tx.shares(zoneRowID: zone.rowID).filter { $0.rootRecordName != nil }
        guard hierarchies.count > 1 else { return }
        for inner in hierarchies {
            for outer in hierarchies where outer.id != inner.id {
                if try isMember(inner.rootRecordName!, of: outer, zone: zone, tx) {
                    throw ServiceError(.alreadyShared, "record \(inner.rootRecordName!) is the root of a share and cannot be "
                                   + "placed under \(outer.rootRecordName!), which is in another share")
                }
            }
        }
    }

    /// Moves a record's descendants into or out of a share with it.
    private func cascadeMembership(from name: String, member: Bool, share: StoredShare, zone: StoredZone,
                                   _ tx: any StorageTransaction) throws {
        var queue = [name]
        var seen: Set<String> = [name]
        while let next = queue.popLast() {
            for child in try tx.children(zoneRowID: zone.rowID, parentName: next) where seen.insert(child).inserted {
                if (try tx.shareMembership(shareID: share.id, recordName: child) ?? false) != member {
                    try tx.setShareMembership(shareID: share.id, recordName: child, member: member)
                }
                queue.append(child)
            }
        }
    }

    // MARK: shares/*

    /// A request's zone id with the caller filled in for a missing owner.
    private func zoneID(_ wire: WireZoneID, _ caller: Caller) throws -> ZoneID {
        try wire.resolved(defaultOwner: caller.database == .public ? Zones.publicOwner : caller.user.recordName)
    }

    /// Finds the share a `shares/*` request is about, with the caller's standing in it.
    private func targetShare(_ caller: Caller, _ target: ShareTarget, _ tx: any StorageTransaction) throws
        -> (resolved: ResolvedZone, share: StoredShare, roster: ShareRoster) {
        let resolved = try zones.resolveZone(zoneID(target.zoneID, caller), caller, tx)
        guard let zone = resolved.zone else { throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist") }
        let wanted = target.shareRecordName
        let candidates = caller.database == .shared ? resolved.grants.map(\.share) : try tx.shares(zoneRowID: zone.rowID)
        let matches = candidates.filter { wanted == nil || $0.recordName == wanted }
        guard let share = matches.first else { throw ServiceError(.notFound, "no such share in zone \(zone.name)") }
        guard matches.count == 1 else { throw ServiceError.badRequest("the zone has several shares; name one with shareRecordName") }
        // The share's own row, read again before its roster: in a write on a multi-writer backend this locks
        // it, so an invitation here and an accept through a link (which locks the row first) cannot both
        // pass the participant cap.
        guard let locked = try tx.share(id: share.id), !locked.deleted else {
            throw ServiceError(.notFound, "no such share in zone \(zone.name)")
        }
        return (resolved, locked, try roster(locked, tx))
    }

    /// `shares/create {"zoneID", "rootRecordName"?, "title"?, "publicPermission"?}` (private database, by the
    /// owner): a hierarchy share rooted at a record, or a zone-wide share when no root is given.
    package func createShare(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws
        -> JSON {
        guard caller.database == .private else { throw ServiceError.badRequest("shares are created in the owner's private database") }
        let request = try ShareCreateRequest(json: .object(body))
        let resolved = try zones.resolveZone(zoneID(request.zoneID, caller), caller, tx)
        guard resolved.zoneID.zoneName != Names.systemZoneName else {
            throw ServiceError.badRequest("the default zone cannot be shared (as in CloudKit); use a custom zone")
        }
        guard let zone = resolved.zone else {
            throw ServiceError(.zoneNotFound, "zone \(resolved.zoneID.zoneName) does not exist")
        }
        let root = request.rootRecordName
        if let root {
            guard let stored = try tx.record(zoneRowID: zone.rowID, name: root), !stored.deleted else {
                throw ServiceError(.notFound, "record \(root) does not exist")
            }
        }
        let title = request.title ?? ""
        let publicPermission = request.publicPermission ?? .none
        let existing = try tx.shares(zoneRowID: zone.rowID)
        if let root {
            if existing.contains(where: { $0.rootRecordName == nil }) {
                throw ServiceError(.alreadyShared, "zone \(zone.name) has a zone-wide share")
            }
            for other in existing {
                guard let otherRoot = other.rootRecordName else { continue }
                if try isMember(root, of: other, zone: zone, tx) || isMember(otherRoot, of: sharePlaceholder(root, zone), zone: zone, tx) {
                    throw ServiceError(.alreadyShared, "record \(root) or a record under it already belongs to a share")
                }
            }
        } else if !existing.isEmpty {
            throw ServiceError(.alreadyShared, "zone \(zone.name) already holds shares; a zone-wide share needs a zone without them")
        }
        let publicID = "sh_" + Secrets.hex(try Secrets.randomBytes(12))
        let recordName = root == nil ? Self.zoneShareRecordName : "Share-" + publicID.dropFirst(3)
        var share: StoredShare
        do {
            share = try tx.insertShare(NewShare(publicID: publicID, zoneRowID: zone.rowID, recordName: recordName,
                                                rootRecordName: root, ownerID: caller.user.id, title: title,
                                                publicPermission: publicPermission, nowMs: core.configuration.now()))
        } catch StorageError.duplicate {
            throw ServiceError(.alreadyShared, "zone \(zone.name) already has that share")
        }
        let roster = ShareRoster(publicPermission: publicPermission, participants: [
            ShareParticipant(userID: caller.user.id, role: .owner, permission: .readWrite, status: .accepted),
        ])
        try saveRoster(roster, of: &share, before: ShareRoster(publicPermission: publicPermission, participants: []),
                       caller: caller, tx, &touched)
        if let root {
            // Everything under the root enters the share's log.
            try tx.setShareMembership(shareID: share.id, recordName: root, member: true)
            try cascadeMembership(from: root, member: true, share: share, zone: zone, tx)
        }
        try writeShareRecord(share, roster, zone: zone, zoneID: resolved.zoneID, caller: caller, tx, &touched)
        try touchRoot(of: share, zone: zone, caller: caller, tx, &touched)
        return try shareJSON(share, roster, zone: zone, tx)
    }

    /// Saving or deleting a hierarchy share changes its root record, as in CloudKit (its `share` reference):
    /// the root gets a new position and change tag, after the share record's, so every feed delivers the
    /// root again once the share record is in (`share` is rendered from the zone's live shares).
    private func touchRoot(of share: StoredShare, zone: StoredZone, caller: Caller, _ tx: any StorageTransaction,
                           _ touched: inout CommitEffects) throws {
        guard let root = share.rootRecordName, let stored = try tx.record(zoneRowID: zone.rowID, name: root),
              !stored.deleted else { return }
        let saved = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(
            recordName: root, recordType: stored.recordType, frame: stored.frame, deleted: false,
            parentName: stored.parentName, userRecordName: caller.user.recordName, nowMs: core.configuration.now()))
        touched.recordWritten(zone, before: stored, after: saved, frame: try core.frame(saved), caller: caller)
        try recordsChanged([root], in: zone, caller: caller, tx, &touched)
    }

    /// The zone's hierarchy shares by root record name (the share record's name), for the `share`
    /// reference of root records in answers.
    package func shareRecordNamesByRoot(zoneRowID: Int64, _ tx: any StorageTransaction) throws -> [String: String] {
        var names: [String: String] = [:]
        for share in try tx.shares(zoneRowID: zoneRowID) {
            if let root = share.rootRecordName { names[root] = share.recordName }
        }
        return names
    }

    /// The same for a zone named as the caller names it (none for a zone that does not exist).
    package func shareRecordNamesByRoot(in zoneID: ZoneID, _ caller: Caller, _ tx: any StorageTransaction) throws
        -> [String: String] {
        try zones.resolveZone(zoneID, caller, tx).zone.map { try shareRecordNamesByRoot(zoneRowID: $0.rowID, tx) } ?? [:]
    }

    /// A stand-in share rooted at `root`, to ask whether another share's root lies under it.
    private func sharePlaceholder(_ root: String, _ zone: StoredZone) -> StoredShare {
        StoredShare(id: 0, publicID: "", zoneRowID: zone.rowID, recordName: "", rootRecordName: root, ownerID: 0,
                    title: "", publicPermission: .none, urlEpoch: 0, deleted: false, lastSeq: 0)
    }

    /// `shares/lookup {"zoneID", "shareRecordName"?}`: the share and its participants, for the owner and
    /// accepted participants.
    package func lookupShare(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let request = try ShareLookupRequest(json: .object(body))
        return try core.storage.read(deadline: caller.deadline) { tx in
            let (resolved, share, roster) = try targetShare(caller, request, tx)
            return try shareJSON(share, roster, zone: try resolved.existingZone(), tx)
        }
    }

    /// `shares/modify {"zoneID", "shareRecordName"?, "title"?, "publicPermission"?, "participants"?: [...]}`,
    /// by the owner (private database) or an administrator (shared database). Participant operations:
    /// `{"operation": "invite", "userName" | "userRecordName", "permission", "role"?}`,
    /// `{"operation": "setPermission", ..., "permission"}`, `{"operation": "remove", ...}`.
    package func modifyShare(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws
        -> JSON {
        let request = try ShareModifyRequest(json: .object(body))
        var (resolved, share, roster) = try targetShare(caller, request.target, tx)
        let before = roster
        let actor = caller.user.id
        guard roster.canManage(actor) else {
            throw ServiceError(.permissionFailure, "only the owner or an administrator changes a share")
        }
        if let title = request.title { share.title = title }
        do {
            if let permission = request.publicPermission {
                try roster.setPublicPermission(permission, by: actor)
            }
            for item in request.participants {
                let change = try item.get()
                let user = try participantUser(change.user, tx)
                switch change.operation {
                case .invite(let permission, let role):
                    if role == .administrator, roster.participant(actor)?.role != .owner {
                        throw ServiceError(.permissionFailure, "only the owner makes administrators")
                    }
                    try roster.invite(user.id, permission: permission, role: role, by: actor)
                case .setPermission(let permission):
                    try roster.setPermission(of: user.id, to: permission, by: actor)
                case .remove:
                    try roster.remove(user.id, by: actor)
                }
            }
        } catch let error as ShareRuleError {
            throw apiError(error)
        }
        try saveRoster(roster, of: &share, before: before, caller: caller, tx, &touched)
        // Only a change that takes access away (removals, publicPermission none) passes a full quota.
        let onlyTakesAway = request.title == nil && (request.publicPermission ?? SharePermission.none) == SharePermission.none
            && request.participants.allSatisfy { if case .success(let change) = $0, case .remove = change.operation { true } else { false } }
        try writeShareRecord(share, roster, zone: try resolved.existingZone(), zoneID: resolved.zoneID, caller: caller,
                             checksQuota: !onlyTakesAway, tx, &touched)
        return try shareJSON(share, roster, zone: try resolved.existingZone(), tx)
    }

    // MARK: Invitations

    /// How long the link an invitation carries works (any valid link lets a pending invitee accept).
    static let invitationLinkSeconds: Int64 = 7 * 86_400

    /// `shares/invitations {}` (shared database): the caller's pending invitations, newest first, at most
    /// 100, each with a signed link that `records/accept` takes (it makes a pending invitee accepted).
    package func invitations(_ caller: Caller, _ body: [String: JSON] = [:]) throws -> JSON {
        _ = try ShareInvitationsRequest(json: .object(body))
        guard caller.database == .shared else { throw ServiceError.badRequest("invitations are listed in the shared database") }
        guard let keyRing = core.keyRing else { throw ServiceError(.internalError, "share links are not configured on this server") }
        return try core.storage.read(deadline: caller.deadline) { tx in
            let pending = try tx.participations(userID: caller.user.id, status: .pending).filter { !$0.share.deleted }
                .sorted { $0.participant.modifiedMs > $1.participant.modifiedMs }.prefix(ShareInvitationsResponse.maximumCount)
            var items: [ShareInvitation] = []
            let now = core.configuration.now() / 1000
            for (share, participant) in pending {
                guard let zone = try tx.zone(rowID: share.zoneRowID), !zone.deleted else { continue }
                let claims = ShareClaims(issuer: core.publicURL, shareID: share.publicID, zoneName: zone.name,
                                         ownerRecordName: zone.ownerRecordName, issuedAt: now, expiresAt: now + Self.invitationLinkSeconds,
                                         maximumUses: nil, tokenID: try ShareClaims.newTokenID(),
                                         permission: participant.permission.rawValue, epoch: share.urlEpoch)
                items.append(ShareInvitation(
                    zoneID: WireZoneID(zoneName: zone.name, ownerRecordName: zone.ownerRecordName),
                    shareRecordName: share.recordName, title: share.title,
                    ownerName: try tx.user(id: share.ownerID)?.name ?? "", permission: participant.permission,
                    url: Self.shareURL(publicURL: core.publicURL, token: try keyRing.sign(claims))))
            }
            return ShareInvitationsResponse(invitations: items).json
        }
    }

    /// `shares/decline {"zoneID", "shareRecordName"?}` (shared database): the caller turns a pending
    /// invitation down and becomes `removed` (only a new invitation lets them in); the owner sees it in the
    /// roster. NOT_FOUND when they have no pending invitation to such a share.
    package func declineInvitation(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction,
                                   _ touched: inout CommitEffects) throws -> JSON {
        guard caller.database == .shared else { throw ServiceError.badRequest("invitations are declined in the shared database") }
        let target = try ShareTarget(json: .object(body))
        var matches: [StoredShare] = []
        for (share, _) in try tx.participations(userID: caller.user.id, status: .pending) where !share.deleted {
            guard target.shareRecordName == nil || share.recordName == target.shareRecordName,
                  let zone = try tx.zone(rowID: share.zoneRowID), !zone.deleted, zone.name == target.zoneID.zoneName,
                  target.zoneID.ownerRecordName == nil || zone.ownerRecordName == target.zoneID.ownerRecordName else { continue }
            matches.append(share)
        }
        guard let found = matches.first else { throw ServiceError(.notFound, "you have no pending invitation to that share") }
        guard matches.count == 1 else { throw ServiceError.badRequest("several invitations match; name one with shareRecordName") }
        guard var share = try tx.share(id: found.id), !share.deleted, let zone = try tx.zone(rowID: share.zoneRowID) else {
            throw ServiceError(.notFound, "you have no pending invitation to that share")
        }
        var roster = try roster(share, tx)
        let before = roster
        guard roster.participant(caller.user.id)?.status == .pending else {
            throw ServiceError(.notFound, "you have no pending invitation to that share")
        }
        do throws(ShareRuleError) {
            try roster.remove(caller.user.id, by: caller.user.id)
        } catch {
            throw apiError(error)
        }
        try saveRoster(roster, of: &share, before: before, caller: caller, tx, &touched)
        let zoneID = try ZoneID(zoneName: zone.name, ownerRecordName: zone.ownerRecordName)
        try writeShareRecord(share, roster, zone: zone, zoneID: zoneID, caller: caller, checksQuota: false, tx, &touched)
        return .object(["zoneID": .object(["zoneName": .string(zone.name), "ownerRecordName": .string(zone.ownerRecordName)]),
                        "shareRecordName": .string(share.recordName), "declined": .bool(true)])
    }

    /// `shares/leave {"zoneID", "shareRecordName"?}` (shared database): the caller leaves the share.
    package func leaveShare(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws
        -> JSON {
        guard caller.database == .shared else { throw ServiceError.badRequest("leave a share through the shared database") }
        let target = try ShareLeaveRequest(json: .object(body))
        var (resolved, share, roster): (ResolvedZone, StoredShare, ShareRoster)
        do {
            (resolved, share, roster) = try targetShare(caller, target, tx)
        } catch let error as ServiceError where error.code == .notFound || error.code == .zoneNotFound {
            // A pending invitee has no access yet, so the zone is not in their shared database: leaving an
            // invitation is declining it (they become removed, as a participant who leaves does).
            let declined: JSON
            do {
                declined = try tx.savepoint { try declineInvitation(caller, body, tx, &touched) }
            } catch let declineError as ServiceError where declineError.code == .notFound {
                throw error
            }
            return ShareLeaveResponse(zoneID: WireZoneID(
                zoneName: declined["zoneID"]?["zoneName"]?.stringValue ?? target.zoneID.zoneName,
                ownerRecordName: declined["zoneID"]?["ownerRecordName"]?.stringValue)).json
        }
        let before = roster
        do throws(ShareRuleError) {
            try roster.remove(caller.user.id, by: caller.user.id)
        } catch {
            throw apiError(error)
        }
        try saveRoster(roster, of: &share, before: before, caller: caller, tx, &touched)
        try writeShareRecord(share, roster, zone: try resolved.existingZone(), zoneID: resolved.zoneID, caller: caller,
                             checksQuota: false, tx, &touched)
        let zoneID = resolved.zoneID
        return ShareLeaveResponse(zoneID: WireZoneID(zoneName: zoneID.zoneName, ownerRecordName: zoneID.ownerRecordName)).json
    }

    /// `shares/delete {"zoneID", "shareRecordName"?}` (private database, owner only): stops sharing. Every
    /// participant loses access on their next request and sees the zone deleted in their shared database.
    package func deleteShare(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws
        -> JSON {
        let (resolved, share, roster) = try targetShare(caller, try ShareDeleteRequest(json: .object(body)), tx)
        guard caller.database == .private else {
            throw ServiceError(.permissionFailure, "only the owner deletes a share; participants leave with shares/leave")
        }
        let zone = try resolved.existingZone()
        try removeShare(share, roster, zone: zone, caller: caller, tx, &touched)
        try touchRoot(of: share, zone: zone, caller: caller, tx, &touched)
        return ShareDeleteResponse(shareRecordName: share.recordName).json
    }

    /// Deletes a share: marks it deleted, revokes every participant and deletes its record.
    package func removeShare(_ share: StoredShare, _ roster: ShareRoster, zone: StoredZone, caller: Caller,
                     _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws {
        var share = share
        for participant in roster.participants where participant.role != .owner && participant.status == .accepted {
            try markShared(share, for: participant.userID, deleted: true, caller: caller, tx, &touched)
        }
        share.deleted = true
        try tx.updateShare(share)
        _ = try tx.pruneShortLinks(shareID: share.id, keeping: 0)
        if let stored = try tx.record(zoneRowID: zone.rowID, name: share.recordName), !stored.deleted {
            var edit = try RecordEdit(editing: try core.frame(stored))
            edit.delete(at: core.tick())
            if let deleted = try edit.applied() {
                _ = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(
                    recordName: share.recordName, recordType: deleted.recordType, frame: deleted.bytes,
                    deleted: true, userRecordName: caller.user.recordName, nowMs: core.configuration.now()))
                touched.zoneChanged(zone, caller: caller)
            }
        }
    }

    /// `shares/url {"zoneID", "shareRecordName"?, "permission"?, "expiresInSeconds"?, "maxUses"?, "rotate"?}`:
    /// a signed share URL. `rotate` moves the share's URL epoch first, so every older URL stops working.
    package func shareURL(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws -> JSON {
        guard let keyRing = core.keyRing else { throw ServiceError(.internalError, "share links are not configured on this server") }
        let request = try ShareURLRequest(json: .object(body))
        var (resolved, share, roster) = try targetShare(caller, request.target, tx)
        guard roster.canManage(caller.user.id) else {
            throw ServiceError(.permissionFailure, "only the owner or an administrator makes share URLs")
        }
        if request.rotate == true {
            share.urlEpoch += 1
            try tx.updateShare(share)
            // The old links' short codes would answer as invalid anyway; they go so they cost nothing.
            _ = try tx.pruneShortLinks(shareID: share.id, keeping: 0)
        }
        let permission = request.permission ?? (roster.publicPermission == .none ? .readOnly : roster.publicPermission)
        let now = core.configuration.now() / 1000
        let expires = request.expiresInSeconds.map { now + $0 }
        let maximumUses = request.maxUses
        let owner = resolved.zoneID
        let claims = ShareClaims(issuer: core.publicURL, shareID: share.publicID, zoneName: owner.zoneName,
                                 ownerRecordName: owner.ownerRecordName, issuedAt: now, expiresAt: expires,
                                 maximumUses: maximumUses, tokenID: try ShareClaims.newTokenID(),
                                 permission: permission.rawValue, epoch: share.urlEpoch)
        let token = try keyRing.sign(claims)
        let shortURL = try makeShortLink(token: token, share: share, tx)
        return ShareURLResponse(url: Self.shareURL(publicURL: core.publicURL, token: token), shortURL: shortURL, token: token,
                                permission: permission, epoch: share.urlEpoch, expiresAt: expires, maxUses: maximumUses).json
    }

    package static func shareURL(publicURL: String, token: String) -> String {
        (publicURL.hasSuffix("/") ? String(publicURL.dropLast()) : publicURL) + "/share/" + token
    }

    // MARK: records/resolve and records/accept

    /// Verifies a link and finds its live share. Every failure is the same error.
    package func verifiedLink(_ token: String, _ tx: any StorageTransaction) throws -> (ShareClaims, StoredShare) {
        let invalid = ServiceError(.accessDenied, ShareTokenError.invalid.description)
        guard let keyRing = core.keyRing, let claims = try? keyRing.verify(token, nowSeconds: core.configuration.now() / 1000) else {
            throw invalid
        }
        guard claims.issuer == core.publicURL, let share = try tx.share(publicID: claims.shareID), !share.deleted,
              share.urlEpoch == claims.epoch, let zone = try tx.zone(rowID: share.zoneRowID), !zone.deleted,
              zone.name == claims.zoneName, zone.ownerRecordName == claims.ownerRecordName,
              SharePermission(rawValue: claims.permission) != nil else { throw invalid }
        return (claims, share)
    }

    /// Takes the rows a link's accept changes in the order every other write takes them (the owner's
    /// database, then the zone, then the share: Architecture.md, "Several nodes"), so on a multi-writer
    /// backend an accept and a write in the owner's zone never wait for each other in a cycle. The link's
    /// rows are found first in a short read of the authentication lane (point reads, never queued behind
    /// writes); a link that does not verify or resolve locks nothing here and `verifiedLink` refuses it.
    private func lockLinkTarget(_ token: String, _ tx: any StorageTransaction) throws {
        guard let keyRing = core.keyRing, let claims = try? keyRing.verify(token, nowSeconds: core.configuration.now() / 1000) else { return }
        let target = try? core.storage.read(deadline: .after(milliseconds: 2_000), lane: .authentication) { read -> (Int64, Int64)? in
            guard let share = try read.share(publicID: claims.shareID), let zone = try read.zone(rowID: share.zoneRowID) else {
                return nil
            }
            return (zone.databaseID, zone.rowID)
        }
        guard let (databaseID, zoneRowID) = target ?? nil else { return }
        _ = try tx.database(id: databaseID)
        _ = try tx.zone(rowID: zoneRowID)
    }

    /// `records/resolve {"shortGUIDs": [{"value": token or URL}]}`: what accepting would give, granting nothing.
    package func resolveShares(_ caller: Caller, _ body: [String: JSON]) throws -> JSON {
        let links = try ShareLinksRequest(json: .object(body)).links
        return try core.storage.read(deadline: caller.deadline) { tx in
            ShareLinksResponse(results: try links.map { link -> Result<ShareMetadata, ServiceError> in
                do {
                    let token = try linkToken(try link.get(), tx)
                    let (claims, share) = try verifiedLink(token, tx)
                    if let maximum = claims.maximumUses, try tx.linkUses(tokenID: claims.tokenID) >= maximum,
                       try roster(share, tx).access(of: caller.user.id) == .none {
                        throw ServiceError(.accessDenied, ShareTokenError.invalid.description)
                    }
                    let roster = try roster(share, tx)
                    let linkPermission = SharePermission(rawValue: claims.permission) ?? .readOnly
                    return .success(try shareMetadata(share, roster, claims: claims, user: caller.user.id,
                                                      wouldBe: roster.wouldAccept(caller.user.id, linkPermission: linkPermission), tx))
                } catch let error as ServiceError {
                    return .failure(error)
                }
            }).json
        }
    }

    /// `records/accept {"shortGUIDs": [{"value": token or URL}]}`: joins the shares. Accepting again is a no-op;
    /// a link's `max_uses` counts distinct joins and cannot be exceeded, even by concurrent accepts.
    package func acceptShares(_ caller: Caller, _ body: [String: JSON], _ tx: any StorageTransaction, _ touched: inout CommitEffects) throws
        -> JSON {
        let links = try ShareLinksRequest(json: .object(body)).links
        var results: [Result<ShareMetadata, ServiceError>] = []
        for link in links {
            do {
                let result = try tx.savepoint { () throws -> ShareMetadata in
                    let token = try linkToken(try link.get(), tx)
                    try lockLinkTarget(token, tx)
                    var (claims, share) = try verifiedLink(token, tx)
                    var roster = try roster(share, tx)
                    let before = roster
                    guard share.ownerID != caller.user.id else {
                        throw ServiceError.badRequest("this is your own share; it is in your private database")
                    }
                    let alreadyIn = roster.access(of: caller.user.id) != .none
                    if !alreadyIn, let maximum = claims.maximumUses, try tx.linkUses(tokenID: claims.tokenID) >= maximum {
                        throw ServiceError(.accessDenied, ShareTokenError.invalid.description)
                    }
                    let linkPermission = SharePermission(rawValue: claims.permission) ?? .readOnly
                    let participant: ShareParticipant
                    do throws(ShareRuleError) {
                        participant = try roster.accept(caller.user.id, linkPermission: linkPermission)
                    } catch {
                        throw apiError(error)
                    }
                    if !alreadyIn {
                        try tx.recordLinkUse(tokenID: claims.tokenID, shareID: share.id)
                        try saveRoster(roster, of: &share, before: before, caller: caller, tx, &touched)
                        let zone = try tx.zone(rowID: share.zoneRowID)!
                        let zoneID = try ZoneID(zoneName: zone.name, ownerRecordName: zone.ownerRecordName)
                        try writeShareRecord(share, roster, zone: zone, zoneID: zoneID, caller: caller, tx, &touched)
                    }
                    claims.maximumUses = nil
                    return try shareMetadata(share, roster, claims: claims, user: caller.user.id, wouldBe: participant, tx)
                }
                results.append(.success(result))
            } catch let error as ServiceError {
                results.append(.failure(error))
            }
        }
        return ShareLinksResponse(results: results).json
    }

    // MARK: Rendering

    private func shareMetadata(_ share: StoredShare, _ roster: ShareRoster, claims: ShareClaims, user: Int64,
                               wouldBe: ShareParticipant?, _ tx: any StorageTransaction) throws -> ShareMetadata {
        guard let zone = try tx.zone(rowID: share.zoneRowID) else { throw ServiceError(.accessDenied, ShareTokenError.invalid.description) }
        let owner = try tx.user(recordName: zone.ownerRecordName)
        let current = roster.participant(user)?.status
        return ShareMetadata(
            shareRecordName: share.recordName, title: share.title,
            zoneID: WireZoneID(zoneName: zone.name, ownerRecordName: zone.ownerRecordName),
            ownerRecordName: zone.ownerRecordName, ownerName: owner?.name ?? "",
            linkPermission: SharePermission(rawValue: claims.permission) ?? .readOnly, // verifiedLink checked it
            publicPermission: roster.publicPermission, rootRecordName: share.rootRecordName, currentStatus: current,
            participantRole: wouldBe?.role, participantPermission: wouldBe?.permission ?? .none,
            participantStatus: wouldBe.map(\.status) ?? current)
    }

    package func shareJSON(_ share: StoredShare, _ roster: ShareRoster, zone: StoredZone, _ tx: any StorageTransaction) throws -> JSON {
        var participants: [ShareParticipantDescription] = []
        for participant in roster.participants {
            guard let user = try tx.user(id: participant.userID) else { continue }
            participants.append(ShareParticipantDescription(
                userRecordName: user.recordName, name: user.name, role: participant.role,
                permission: participant.permission, acceptanceStatus: participant.status))
        }
        return ShareDescription(shareRecordName: share.recordName,
                                zoneID: WireZoneID(zoneName: zone.name, ownerRecordName: zone.ownerRecordName),
                                title: share.title, publicPermission: roster.publicPermission, participants: participants,
                                urlEpoch: share.urlEpoch, rootRecordName: share.rootRecordName).json
    }

    /// Keeps the share's `cloudkit.share` record in the owner's zone in step with the share, so it travels
    /// in the zone's feeds (and reappears there on every participant change, as in CloudKit).
    ///
    /// The record counts against the owner's database quota like any other: when `checksQuota` is true
    /// (the change adds data: a share made, a title, an invitation, a link accepted) and the record grows
    /// past `quotaBytesPerDatabase`, it throws QUOTA_EXCEEDED and the caller's transaction writes nothing.
    /// Changes that only take access away (a removal, a leave) pass unchecked, so a full database can
    /// always shed participants.
    package func writeShareRecord(_ share: StoredShare, _ roster: ShareRoster, zone: StoredZone, zoneID: ZoneID,
                          caller: Caller, checksQuota: Bool = true, _ tx: any StorageTransaction,
                          _ touched: inout CommitEffects) throws {
        let stored = try tx.record(zoneRowID: zone.rowID, name: share.recordName).map(core.frame)
        var edit: RecordEdit
        if let stored, !stored.isDeleted {
            edit = try RecordEdit(editing: stored)
        } else {
            edit = try RecordEdit(creating: RecordID(recordName: share.recordName, zoneID: zoneID),
                                  recordType: Self.shareRecordType, over: stored, at: core.tick())
        }
        try edit.set("title", to: .string(share.title), at: core.tick())
        try edit.set("publicPermission", to: .string(roster.publicPermission.rawValue), at: core.tick())
        if let root = share.rootRecordName { try edit.set("rootRecordName", to: .string(root), at: core.tick()) }
        var summaries: [ScalarValue] = []
        for participant in roster.participants {
            guard let user = try tx.user(id: participant.userID) else { continue }
            summaries.append(.string("\(user.recordName) \(participant.role.rawValue) \(participant.permission.rawValue) "
                                     + participant.status.rawValue))
        }
        try edit.setList("participants", to: summaries, at: core.tick())
        guard let record = try edit.applied() else { return }
        let growth = Int64(record.bytes.count) - Int64(stored?.bytes.count ?? 0)
        if checksQuota, growth > 0 {
            let used = try tx.database(id: zone.databaseID)?.bytesUsed ?? 0
            let quota = core.configuration.quotaBytesPerDatabase
            guard used + growth <= quota else {
                throw ServiceError(.quotaExceeded, "the share record would bring the database to \(used + growth) bytes; "
                                   + "its quota is \(quota)")
            }
        }
        let ownerName = try tx.user(id: share.ownerID)?.recordName ?? caller.user.recordName
        _ = try tx.saveRecord(zoneRowID: zone.rowID, RecordWrite(
            recordName: share.recordName, recordType: Self.shareRecordType, frame: record.bytes,
            deleted: false, userRecordName: ownerName, nowMs: core.configuration.now()))
        touched.zoneChanged(zone, caller: caller)
        try recordsChanged([share.recordName], in: zone, caller: caller, tx, &touched)
    }

        private func participantUser(_ identity: ParticipantIdentity, _ tx: any StorageTransaction) throws -> UserAccount {
        switch identity {
        case .userName(let name):
            guard let user = try tx.user(named: name) else { throw ServiceError(.notFound, "no user named \(name)") }
            return user
        case .userRecordName(let recordName):
            guard let user = try tx.user(recordName: recordName) else { throw ServiceError(.notFound, "no user \(recordName)") }
            return user
        }
    }

    package func apiError(_ error: ShareRuleError) -> ServiceError {
        switch error.code {
        case .tooManyParticipants: return ServiceError(.tooManyParticipants, error.description)
        case .permissionFailure: return ServiceError(.permissionFailure, error.description)
        case .badRequest: return ServiceError.badRequest(error.description)
        case .notFound: return ServiceError(.notFound, error.description)
        }
    }
}

// MARK: Lost shares in a participant's hierarchy feed

/// A share a participant lost, as its drain sees it: `lossMs` is when they lost it (their removal, leave,
/// or `publicPermission` none), nil when they held it until the share itself was deleted.
package struct ShareLoss {
    package let share: StoredShare
    package let lossMs: Int64?
}

extension Shares {
    /// The hierarchy share `id` of `zone` when the caller once had access to it (an accepted participant at
    /// some point: their shared database's log holds it) and has it no longer. Nil for anything else, so a
    /// token naming a share the caller never had gets nothing.
    package func lostShare(_ id: Int64, zone: StoredZone, caller: Caller, _ tx: any StorageTransaction) throws
        -> StoredShare? {
        guard let share = try tx.share(id: id), share.zoneRowID == zone.rowID, share.rootRecordName != nil,
              try share.deleted || roster(share, tx).access(of: caller.user.id) == .none else { return nil }
        let database = try tx.database(DatabaseKey(kind: .shared, environment: caller.environment,
                                                   ownerID: caller.user.id))
        guard database.id != 0 else { return nil }
        let page = 500
        var cursor: Int64 = 0
        for _ in 0..<10_000 {
            let entries = try tx.sharedZoneChanges(databaseID: database.id, after: cursor, limit: page)
            if entries.contains(where: { $0.shareID == share.id }) { return share }
            guard entries.count == page, let last = entries.last else { return nil }
            cursor = last.databaseSeq
        }
        return nil
    }

    /// How to drain a lost share for the caller, or nil when there is nothing to drain: a removed
    /// participant lost it when their row changed to `removed`; an accepted one when the share was deleted
    /// (its log stops there). A pending invitation (removed, then invited again) drains nothing.
    package func lostShareDrain(_ share: StoredShare, caller: Caller, _ tx: any StorageTransaction) throws
        -> ShareLoss? {
        guard let row = try tx.participants(shareID: share.id).first(where: { $0.userID == caller.user.id }) else {
            return nil
        }
        switch row.status {
        case .removed: return ShareLoss(share: share, lossMs: row.modifiedMs)
        case .accepted where share.deleted: return ShareLoss(share: share, lossMs: nil)
        default: return nil
        }
    }

    /// Whether the caller had `recordName` from the lost share: it is the root or the share record, or (when
    /// the share lived on after the loss) neither it nor any record on its parent chain up to the root
    /// changed since the loss, so it was in the share then and nothing newer is named. `known` keeps the
    /// answers of one page, so records sharing ancestors cost one lookup each per page.
    package func hadRecord(_ recordName: String, _ lost: ShareLoss, _ tx: any StorageTransaction,
                   known: inout [String: Bool]) throws -> Bool {
        guard let lossMs = lost.lossMs else { return true }
        var name = recordName
        var path: [String] = []
        var seen: Set<String> = []
        var answer = false
        while seen.insert(name).inserted && seen.count <= 1_000 {
            if let earlier = known[name] { answer = earlier; break }
            path.append(name)
            if name == lost.share.rootRecordName || name == lost.share.recordName { answer = true; break }
            guard let stored = try tx.record(zoneRowID: lost.share.zoneRowID, name: name), stored.modifiedMs < lossMs
            else { break }
            if stored.deleted { answer = true; break }
            guard let parent = stored.parentName else { break }
            name = parent
        }
        // A record is had exactly when its parent chain is: every record on the walked path shares the answer.
        for walked in path { known[walked] = answer }
        return answer
    }
}
