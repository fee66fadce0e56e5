import LatticeCore

/// `shares/invitations {}` (shared database): no members.
public struct ShareInvitationsRequest: Sendable, Hashable {
    public init() {}
    /// Any members are ignored, as `zones/list` ignores them.
    public init(json: JSON) throws(ServiceError) {
        guard json.objectValue != nil else { throw ServiceError.badRequest("expected a JSON object") }
    }
    public var json: JSON { .object([:]) }
}

/// One pending invitation of the caller: a share someone invited them to by name that they have not
/// accepted or declined yet.
public struct ShareInvitation: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var shareRecordName: String
    public var title: String
    public var ownerName: String
    /// What accepting gives (`readOnly` or `readWrite`).
    public var permission: SharePermission
    /// A signed share link for `records/accept` (which makes a pending invitee accepted) or `records/resolve`.
    public var url: String

    public init(zoneID: WireZoneID, shareRecordName: String, title: String, ownerName: String, permission: SharePermission,
                url: String) {
        self.zoneID = zoneID
        self.shareRecordName = shareRecordName
        self.title = title
        self.ownerName = ownerName
        self.permission = permission
        self.url = url
    }

    public init?(json: JSON) {
        guard let zoneName = json["zoneID"]?["zoneName"]?.stringValue, let shareRecordName = json["shareRecordName"]?.stringValue,
              let permission = json["permission"]?.stringValue.flatMap(SharePermission.init(rawValue:)),
              let url = json["url"]?.stringValue else { return nil }
        self.init(zoneID: WireZoneID(zoneName: zoneName, ownerRecordName: json["zoneID"]?["ownerRecordName"]?.stringValue),
                  shareRecordName: shareRecordName, title: json["title"]?.stringValue ?? "",
                  ownerName: json["ownerName"]?.stringValue ?? "", permission: permission, url: url)
    }

    public var json: JSON {
        .object(["zoneID": zoneID.json, "shareRecordName": .string(shareRecordName), "title": .string(title),
                 "ownerName": .string(ownerName), "permission": .string(permission.rawValue), "url": .string(url)])
    }

    /// `shares/decline` (or `shares/leave`) for this invitation.
    public var target: ShareTarget { ShareTarget(zoneID: zoneID, shareRecordName: shareRecordName) }
}

/// The answer to `shares/invitations`: newest first, at most `maximumCount`.
public struct ShareInvitationsResponse: Sendable, Hashable {
    public static let maximumCount = 100
    public var invitations: [ShareInvitation]

    public init(invitations: [ShareInvitation]) { self.invitations = invitations }

    public init?(json: JSON) {
        guard let items = json["invitations"]?.arrayValue else { return nil }
        invitations = items.compactMap(ShareInvitation.init(json:))
    }

    public var json: JSON { .object(["invitations": .array(invitations.map(\.json))]) }
}

/// `shares/decline {"zoneID", "shareRecordName"?}` (shared database).
public typealias ShareDeclineRequest = ShareTarget
