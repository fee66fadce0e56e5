/// CKShare's model: roles, permissions, acceptance, and the rules that govern changes to a share.
/// Pure values; the server applies the outcome to storage. `SharePermission`, `ShareRole` and `AcceptanceStatus`
/// are LatticeCore's (ShareAccess.swift), shared with the store.

import LatticeCore

/// One participant of a share.
public struct ShareParticipant: Sendable, Hashable {
    public var userID: Int64
    public var role: ShareRole
    public var permission: SharePermission
    public var status: AcceptanceStatus

    public init(userID: Int64, role: ShareRole, permission: SharePermission, status: AcceptanceStatus) {
        self.userID = userID
        self.role = role
        self.permission = permission
        self.status = status
    }
}

/// Why a change to a share was refused. `code` names the API error it maps to.
public struct ShareRuleError: Error, Hashable, Sendable, CustomStringConvertible {
    public enum Code: String, Sendable {
        case tooManyParticipants
        case permissionFailure
        case badRequest
        case notFound
    }

    public let code: Code
    public let description: String

    init(_ code: Code, _ description: String) {
        self.code = code
        self.description = description
    }
}

/// A share's participants and public permission, with CloudKit's rules for changing them.
///
/// - At most `maximumParticipants` (100) participants that are not removed, the owner included.
/// - The owner and administrators manage participants; an administrator cannot remove or change the owner
///   or make another owner.
/// - The administrator rule: only the owner removes an administrator, changes an administrator's
///   permission or role (a re-invitation that would demote one), or makes one. An administrator may leave.
/// - Invited (private) participants and public participants do not mix: invitations need the public
///   permission to be `none`.
/// - Changing the public permission drops pending invitations; setting it to `none` removes every public
///   participant.
public struct ShareRoster: Sendable, Hashable {
    public static let maximumParticipants = 100

    public var publicPermission: SharePermission
    public private(set) var participants: [ShareParticipant]

    public init(publicPermission: SharePermission, participants: [ShareParticipant]) {
        self.publicPermission = publicPermission
        self.participants = participants
    }

    /// Participants that count against the limit (pending or accepted).
    public var activeCount: Int { participants.filter { $0.status != .removed }.count }

    public func participant(_ userID: Int64) -> ShareParticipant? { participants.first { $0.userID == userID } }

    /// Whether `actor` may manage participants and permissions.
    public func canManage(_ actor: Int64) -> Bool {
        guard let p = participant(actor), p.status == .accepted else { return false }
        return p.role == .owner || p.role == .administrator
    }

    /// What `userID` may do with the shared records: nothing unless accepted.
    public func access(of userID: Int64) -> SharePermission {
        guard let p = participant(userID), p.status == .accepted else { return .none }
        return p.role == .owner ? .readWrite : p.permission
    }

    /// Invites a user by name as a private user (or administrator), pending until they accept.
    public mutating func invite(_ userID: Int64, permission: SharePermission, role: ShareRole = .privateUser,
                                by actor: Int64) throws(ShareRuleError) {
        guard canManage(actor) else { throw ShareRuleError(.permissionFailure, "only the owner or an administrator invites") }
        guard role == .privateUser || role == .administrator else {
            throw ShareRuleError(.badRequest, "an invitation makes a privateUser or an administrator")
        }
        guard permission != .none else { throw ShareRuleError(.badRequest, "an invitation grants readOnly or readWrite") }
        guard publicPermission == .none else {
            throw ShareRuleError(.badRequest, "a public share cannot invite participants; set publicPermission to none first")
        }
        if let index = participants.firstIndex(where: { $0.userID == userID }) {
            let existing = participants[index]
            guard existing.role != .owner else { throw ShareRuleError(.badRequest, "the owner is already in the share") }
            if existing.role == .administrator, existing.status != .removed, participant(actor)?.role != .owner {
                throw ShareRuleError(.permissionFailure, "only the owner changes an administrator")
            }
            if userID == actor {
                throw ShareRuleError(.permissionFailure, "you cannot invite yourself")
            }
            if existing.status == .removed {
                guard activeCount < Self.maximumParticipants else { throw tooMany() }
                participants[index] = ShareParticipant(userID: userID, role: role, permission: permission, status: .pending)
            } else {
                participants[index].role = role
                participants[index].permission = permission
            }
            return
        }
        guard activeCount < Self.maximumParticipants else { throw tooMany() }
        participants.append(ShareParticipant(userID: userID, role: role, permission: permission, status: .pending))
    }

    /// Changes a participant's permission.
    public mutating func setPermission(of userID: Int64, to permission: SharePermission, by actor: Int64)
        throws(ShareRuleError) {
        guard canManage(actor) else { throw ShareRuleError(.permissionFailure, "only the owner or an administrator changes permissions") }
        guard permission != .none else { throw ShareRuleError(.badRequest, "use remove to take access away") }
        guard let index = participants.firstIndex(where: { $0.userID == userID && $0.status != .removed }) else {
            throw ShareRuleError(.notFound, "that user is not a participant")
        }
        guard participants[index].role != .owner else { throw ShareRuleError(.permissionFailure, "the owner always has readWrite") }
        let actorRole = participant(actor)?.role
        guard userID != actor || actorRole == .owner else {
            throw ShareRuleError(.permissionFailure, "you cannot change your own permission")
        }
        guard participants[index].role != .administrator || actorRole == .owner else {
            throw ShareRuleError(.permissionFailure, "only the owner changes an administrator")
        }
        participants[index].permission = permission
    }

    /// Removes a participant (by the owner or an administrator), or lets one leave (`actor == userID`).
    public mutating func remove(_ userID: Int64, by actor: Int64) throws(ShareRuleError) {
        guard let index = participants.firstIndex(where: { $0.userID == userID && $0.status != .removed }) else {
            throw ShareRuleError(.notFound, "that user is not a participant")
        }
        guard participants[index].role != .owner else {
            throw ShareRuleError(.permissionFailure, "the owner cannot be removed; the owner deletes the share instead")
        }
        guard actor == userID || canManage(actor) else {
            throw ShareRuleError(.permissionFailure, "only the owner or an administrator removes participants")
        }
        // The administrator rule: only the owner removes an administrator (an administrator may leave).
        guard participants[index].role != .administrator || actor == userID || participant(actor)?.role == .owner else {
            throw ShareRuleError(.permissionFailure, "only the owner removes an administrator")
        }
        participants[index].status = .removed
    }

    /// Sets the public permission. Any change drops pending invitations; `none` removes public participants.
    public mutating func setPublicPermission(_ permission: SharePermission, by actor: Int64) throws(ShareRuleError) {
        guard canManage(actor) else { throw ShareRuleError(.permissionFailure, "only the owner or an administrator changes publicPermission") }
        guard permission != publicPermission else { return }
        if permission != .none, participants.contains(where: {
            ($0.role == .privateUser || $0.role == .administrator) && $0.status == .accepted }) {
            throw ShareRuleError(.badRequest, "a share with invited participants cannot be made public; remove them first")
        }
        for index in participants.indices where participants[index].status == .pending {
            participants[index].status = .removed
        }
        if permission == .none {
            for index in participants.indices where participants[index].role == .publicUser {
                participants[index].status = .removed
            }
        } else {
            // Public users never hold more than the public permission.
            for index in participants.indices where participants[index].role == .publicUser {
                participants[index].permission = min(participants[index].permission, permission)
            }
        }
        publicPermission = permission
    }

    /// Accepts the share for `userID` through a link granting `linkPermission`. Returns the participant.
    ///
    /// A pending invitee is accepted with their invitation. Otherwise, while the public permission is not
    /// `none`, the user joins as a public user with the lesser of the public and link permissions. An
    /// accepted participant accepting again changes nothing. A removed participant cannot come back this way.
    public mutating func accept(_ userID: Int64, linkPermission: SharePermission) throws(ShareRuleError) -> ShareParticipant {
        if let index = participants.firstIndex(where: { $0.userID == userID }) {
            switch participants[index].status {
            case .accepted:
                return participants[index]
            case .pending:
                participants[index].status = .accepted
                return participants[index]
            case .removed:
                throw ShareRuleError(.permissionFailure, "you were removed from this share; ask to be invited again")
            }
        }
        guard publicPermission != .none else {
            throw ShareRuleError(.permissionFailure, "this share is not public and you are not invited")
        }
        guard activeCount < Self.maximumParticipants else { throw tooMany() }
        let participant = ShareParticipant(userID: userID, role: .publicUser,
                                           permission: min(publicPermission, linkPermission), status: .accepted)
        participants.append(participant)
        return participant
    }

    /// What accepting would give `userID`, without changing anything (for `records/resolve`).
    public func wouldAccept(_ userID: Int64, linkPermission: SharePermission) -> ShareParticipant? {
        var copy = self
        return try? copy.accept(userID, linkPermission: linkPermission)
    }

    private func tooMany() -> ShareRuleError {
        ShareRuleError(.tooManyParticipants, "a share has at most \(Self.maximumParticipants) participants, the owner included")
    }
}
