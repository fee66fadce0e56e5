/// CKShare's vocabulary of access: what a participant (or the public) may do, in which role, and where its
/// acceptance stands. Pure values, here in LatticeCore so that both the store (which keeps them, by their
/// raw values, in `shares.public_permission` and `share_participants.role/permission/status`) and
/// LatticeSharing (which holds the rules about them) speak the same types. The raw values are the stored and
/// the API spellings: renaming a case is a data migration.

/// What a participant (or the public) may do.
public enum SharePermission: String, Sendable, CaseIterable, Comparable {
    case none
    case readOnly
    case readWrite

    private var rank: Int {
        switch self {
        case .none: return 0
        case .readOnly: return 1
        case .readWrite: return 2
        }
    }

    public static func < (a: SharePermission, b: SharePermission) -> Bool { a.rank < b.rank }
}

/// A participant's place in a share.
public enum ShareRole: String, Sendable, CaseIterable {
    case owner
    /// Manages participants and permissions; cannot remove the owner.
    case administrator
    /// Invited by user name.
    case privateUser
    /// Joined through the share URL while the public permission allowed it.
    case publicUser
}

/// Where a participant's acceptance of a share stands.
public enum AcceptanceStatus: String, Sendable, CaseIterable {
    case pending
    case accepted
    case removed
}

/// The kind of a database, as in CloudKit: the caller's private one, the public one, or the shared one
/// (zones others shared with the caller). A wire concept as much as a storage one.
public enum DatabaseKind: String, Sendable, Hashable, CaseIterable {
    case `private`
    case `public`
    case shared
}
