import LatticeCore

// Shares: `shares/create`, `shares/lookup`, `shares/modify`, `shares/url`, `shares/leave`, `shares/delete`,
// and the share links of `records/resolve` and `records/accept`.

extension RequestReader {
    /// A permission member, nil when left out.
    /// - Throws: `path must be none, readOnly or readWrite` (or `readOnly or readWrite` without `allowNone`).
    public func permission(_ key: String, path: String? = nil, allowNone: Bool) throws(ServiceError) -> SharePermission? {
        guard let json = object[key] else { return nil }
        guard let text = json.stringValue, let permission = SharePermission(rawValue: text), allowNone || permission != .none
        else {
            throw ServiceError.badRequest("\(path ?? key) must be " + (allowNone ? "none, readOnly or readWrite" : "readOnly or readWrite"))
        }
        return permission
    }

    /// A share's `title`, nil when left out. - Throws: `title must be a string of at most 1024 bytes`.
    public func shareTitle() throws(ServiceError) -> String? {
        guard let json = object["title"] else { return nil }
        guard let text = json.stringValue, text.utf8.count <= 1024 else {
            throw ServiceError.badRequest("title must be a string of at most 1024 bytes")
        }
        return text
    }
}

/// The share a `shares/*` request is about: its zone, and its record name when the zone has several.
/// `shares/lookup`, `shares/leave` and `shares/delete` have no other members.
public struct ShareTarget: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var shareRecordName: String?

    public init(zoneID: WireZoneID, shareRecordName: String? = nil) {
        self.zoneID = zoneID
        self.shareRecordName = shareRecordName
    }

    /// Reads `zoneID`, then `shareRecordName`.
    public init(json: JSON) throws(ServiceError) {
        let reader = RequestReader(json)
        zoneID = try WireZoneID(json: reader["zoneID"], path: "zoneID")
        shareRecordName = try reader.optionalString("shareRecordName")
    }

    public var json: JSON { .object(members) }

    var members: [String: JSON] {
        var writer = RequestWriter()
        writer.set("zoneID", zoneID.json)
        writer.set("shareRecordName", shareRecordName)
        return writer.object
    }
}

/// `shares/lookup {"zoneID", "shareRecordName"?}`.
public typealias ShareLookupRequest = ShareTarget
/// `shares/leave {"zoneID", "shareRecordName"?}` (shared database).
public typealias ShareLeaveRequest = ShareTarget
/// `shares/delete {"zoneID", "shareRecordName"?}` (private database).
public typealias ShareDeleteRequest = ShareTarget

/// `shares/create {"zoneID", "rootRecordName"?, "title"?, "publicPermission"?}`: a hierarchy share rooted at
/// a record, or a zone-wide share without a root.
public struct ShareCreateRequest: Sendable, Hashable {
    public var zoneID: WireZoneID
    public var rootRecordName: String?
    /// Nil: no title (empty).
    public var title: String?
    /// Nil: `none`.
    public var publicPermission: SharePermission?

    public init(zoneID: WireZoneID, rootRecordName: String? = nil, title: String? = nil,
                publicPermission: SharePermission? = nil) {
        self.zoneID = zoneID
        self.rootRecordName = rootRecordName
        self.title = title
        self.publicPermission = publicPermission
    }

    /// The server's order: `zoneID`, `rootRecordName`, `title`, `publicPermission`.
    public init(json: JSON) throws(ServiceError) {
        let reader = RequestReader(json)
        zoneID = try WireZoneID(json: reader["zoneID"], path: "zoneID")
        if let json = reader["rootRecordName"] {
            guard let name = json.stringValue else { throw ServiceError.badRequest("rootRecordName must be a string") }
            rootRecordName = name
        }
        title = try reader.shareTitle()
        publicPermission = try reader.permission("publicPermission", allowNone: true)
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("zoneID", zoneID.json)
        writer.set("rootRecordName", rootRecordName)
        writer.set("title", title)
        writer.set("publicPermission", publicPermission?.rawValue)
        return writer.json
    }
}

/// Who a participant operation is about: a user by name, or by record name.
public enum ParticipantIdentity: Sendable, Hashable {
    case userName(String)
    case userRecordName(String)
}

/// What a `shares/modify` participant operation does.
public enum ParticipantOperation: Sendable, Hashable {
    /// Invites with a permission (readOnly or readWrite), as a private user or an administrator.
    case invite(SharePermission, role: ShareRole)
    case setPermission(SharePermission)
    case remove
}

/// One item of `shares/modify`'s `participants`: `{"operation", "userName" | "userRecordName",
/// "permission"?, "role"?}`.
public struct ShareParticipantChange: Sendable, Hashable {
    public var user: ParticipantIdentity
    public var operation: ParticipantOperation

    public init(_ operation: ParticipantOperation, _ user: ParticipantIdentity) {
        self.user = user
        self.operation = operation
    }

    /// The user first, then the operation and its members. A `role` that is not a string is ignored (a
    /// private user), as the server has always read it.
    public init(json: JSON, path: String) throws(ServiceError) {
        if let name = json["userName"]?.stringValue {
            user = .userName(name)
        } else if let recordName = json["userRecordName"]?.stringValue {
            user = .userRecordName(recordName)
        } else {
            throw ServiceError.badRequest("\(path) needs userName or userRecordName")
        }
        let reader = RequestReader(json)
        func permission() throws(ServiceError) -> SharePermission {
            guard let permission = try reader.permission("permission", path: path + ".permission", allowNone: false) else {
                throw ServiceError.badRequest("\(path).permission is required")
            }
            return permission
        }
        switch json["operation"]?.stringValue {
        case "invite":
            let granted = try permission()
            var role = ShareRole.privateUser
            if let roleName = json["role"]?.stringValue {
                guard let parsed = ShareRole(rawValue: roleName), parsed == .privateUser || parsed == .administrator else {
                    throw ServiceError.badRequest("\(path).role must be privateUser or administrator")
                }
                role = parsed
            }
            operation = .invite(granted, role: role)
        case "setPermission":
            operation = .setPermission(try permission())
        case "remove":
            operation = .remove
        default:
            throw ServiceError.badRequest("\(path).operation must be invite, setPermission or remove")
        }
    }

    public var json: JSON {
        var object: [String: JSON] = [:]
        switch user {
        case .userName(let name): object["userName"] = .string(name)
        case .userRecordName(let recordName): object["userRecordName"] = .string(recordName)
        }
        switch operation {
        case .invite(let permission, let role):
            object["operation"] = .string("invite")
            object["permission"] = .string(permission.rawValue)
            if role != .privateUser { object["role"] = .string(role.rawValue) }
        case .setPermission(let permission):
            object["operation"] = .string("setPermission")
            object["permission"] = .string(permission.rawValue)
        case .remove:
            object["operation"] = .string("remove")
        }
        return .object(object)
    }
}

/// `shares/modify {"zoneID", "shareRecordName"?, "title"?, "publicPermission"?, "participants"?: [...]}`.
/// A malformed participant fails the whole request, but only when its turn comes: the ones before it are
/// judged by the share's rules first, so each is a `Result` taken in order.
public struct ShareModifyRequest: Sendable {
    /// At most this many participant operations per request.
    public static let maximumParticipants = 200

    public var target: ShareTarget
    public var title: String?
    public var publicPermission: SharePermission?
    public var participants: [Result<ShareParticipantChange, ServiceError>]

    public init(target: ShareTarget, title: String? = nil, publicPermission: SharePermission? = nil,
                participants: [ShareParticipantChange] = []) {
        self.target = target
        self.title = title
        self.publicPermission = publicPermission
        self.participants = participants.map { .success($0) }
    }

    /// The server's order: the target, `title`, `publicPermission`, then the list (objects, at most
    /// `maximumParticipants`); each participant is read alone.
    public init(json: JSON) throws(ServiceError) {
        let reader = RequestReader(json)
        target = try ShareTarget(json: json)
        title = try reader.shareTitle()
        publicPermission = try reader.permission("publicPermission", allowNone: true)
        let items = try reader.items("participants", limit: Self.maximumParticipants, optional: true)
        participants = items.enumerated().map { index, item in
            do throws(ServiceError) { return .success(try ShareParticipantChange(json: item, path: "participants[\(index)]")) }
            catch { return .failure(error) }
        }
    }

    /// Participants that failed to decode are left out.
    public var json: JSON {
        var object = target.members
        if let title { object["title"] = .string(title) }
        if let publicPermission { object["publicPermission"] = .string(publicPermission.rawValue) }
        let changes = participants.compactMap { try? $0.get() }
        if !changes.isEmpty { object["participants"] = .array(changes.map(\.json)) }
        return .object(object)
    }
}

/// `shares/url {"zoneID", "shareRecordName"?, "rotate"?, "permission"?, "expiresInSeconds"?, "maxUses"?}`:
/// a signed share URL; `rotate` first stops every older one.
public struct ShareURLRequest: Sendable, Hashable {
    public static let maximumLifetimeSeconds: Int64 = 10 * 365 * 86_400
    public static let maximumUses = 1_000_000

    public var target: ShareTarget
    public var rotate: Bool?
    /// readOnly or readWrite; nil: the share's public permission, or readOnly.
    public var permission: SharePermission?
    public var expiresInSeconds: Int64?
    public var maxUses: Int?

    public init(target: ShareTarget, permission: SharePermission? = nil, expiresInSeconds: Int64? = nil,
                maxUses: Int? = nil, rotate: Bool? = nil) {
        self.target = target
        self.permission = permission
        self.expiresInSeconds = expiresInSeconds
        self.maxUses = maxUses
        self.rotate = rotate
    }

    /// The server's order: the target, `rotate`, `permission`, `expiresInSeconds`, `maxUses`.
    public init(json: JSON) throws(ServiceError) {
        let reader = RequestReader(json)
        target = try ShareTarget(json: json)
        rotate = try reader.optionalBool("rotate")
        permission = try reader.permission("permission", allowNone: false)
        if let json = reader["expiresInSeconds"] {
            guard let seconds = json.intValue, seconds >= 1, seconds <= Self.maximumLifetimeSeconds else {
                throw ServiceError.badRequest("expiresInSeconds must be from 1 to 10 years in seconds")
            }
            expiresInSeconds = seconds
        }
        if let json = reader["maxUses"] {
            guard let uses = json.intValue, uses >= 1, uses <= Self.maximumUses else {
                throw ServiceError.badRequest("maxUses must be a positive integer")
            }
            maxUses = Int(uses)
        }
    }

    public var json: JSON {
        var object = target.members
        if let rotate { object["rotate"] = .bool(rotate) }
        if let permission { object["permission"] = .string(permission.rawValue) }
        if let expiresInSeconds { object["expiresInSeconds"] = .int(expiresInSeconds) }
        if let maxUses { object["maxUses"] = .int(Int64(maxUses)) }
        return .object(object)
    }
}

/// `records/resolve` and `records/accept`: `{"shortGUIDs": [{"value": token or URL}]}` (a bare string is
/// read as a value too). A link that is no string fails alone (its error item), so each is a `Result`.
public struct ShareLinksRequest: Sendable {
    /// At most this many links per request.
    public static let maximumLinks = 20

    /// Each link's token: a URL is cut after `/share/`.
    public var links: [Result<String, ServiceError>]

    /// `links` are tokens or whole share URLs.
    public init(links: [String]) { self.links = links.map { .success(Self.token(fromLink: $0)) } }

    public init(json: JSON) throws(ServiceError) {
        let items = try RequestReader(json).items("shortGUIDs", limit: Self.maximumLinks, allowStrings: true)
        links = items.map { item in
            guard let text = item["value"]?.stringValue ?? item.stringValue else {
                return .failure(ServiceError.badRequest("expected {\"value\": token}"))
            }
            return .success(Self.token(fromLink: text))
        }
    }

    /// The token of a share link given as the token itself or the whole URL, without the punctuation a
    /// sentence left after it (`ShareLinkText`). A short link (`…/s/{code}`) stays as it is: the server looks
    /// its code up.
    public static func token(fromLink text: String) -> String {
        let trimmed = ShareLinkText.withoutTrailingPunctuation(text)
        guard let range = trimmed.firstRange(of: "/share/") else { return trimmed }
        return String(trimmed[range.upperBound...])
    }

    public var json: JSON {
        .object(["shortGUIDs": .array(links.compactMap { try? $0.get() }.map { .object(["value": .string($0)]) })])
    }
}

// MARK: Answers

/// A participant of a share as `shares/create|lookup|modify` show it.
public struct ShareParticipantDescription: Sendable, Hashable {
    public var userRecordName: String
    public var name: String
    public var role: ShareRole
    public var permission: SharePermission
    public var acceptanceStatus: AcceptanceStatus

    public init(userRecordName: String, name: String, role: ShareRole, permission: SharePermission,
                acceptanceStatus: AcceptanceStatus) {
        self.userRecordName = userRecordName
        self.name = name
        self.role = role
        self.permission = permission
        self.acceptanceStatus = acceptanceStatus
    }

    public init?(json: JSON) {
        guard let record = json["userRecordName"]?.stringValue,
              let role = json["role"]?.stringValue.flatMap(ShareRole.init(rawValue:)),
              let permission = json["permission"]?.stringValue.flatMap(SharePermission.init(rawValue:)),
              let status = json["acceptanceStatus"]?.stringValue.flatMap(AcceptanceStatus.init(rawValue:)) else { return nil }
        self.init(userRecordName: record, name: json["name"]?.stringValue ?? "", role: role, permission: permission,
                  acceptanceStatus: status)
    }

    public var json: JSON {
        .object(["userRecordName": .string(userRecordName), "name": .string(name), "role": .string(role.rawValue),
                 "permission": .string(permission.rawValue), "acceptanceStatus": .string(acceptanceStatus.rawValue)])
    }
}

/// A share with its participants: the answer to `shares/create`, `shares/lookup` and `shares/modify`.
public struct ShareDescription: Sendable, Hashable {
    /// The share record's type, as in CloudKit.
    public static let recordType = "cloudkit.share"

    public var shareRecordName: String
    /// With its owner.
    public var zoneID: WireZoneID
    public var title: String
    public var publicPermission: SharePermission
    public var participants: [ShareParticipantDescription]
    /// Moves on each `rotate`; a URL of an older epoch no longer works.
    public var urlEpoch: Int64
    /// Nil for a zone-wide share.
    public var rootRecordName: String?

    public init(shareRecordName: String, zoneID: WireZoneID, title: String, publicPermission: SharePermission,
                participants: [ShareParticipantDescription], urlEpoch: Int64, rootRecordName: String? = nil) {
        self.shareRecordName = shareRecordName
        self.zoneID = zoneID
        self.title = title
        self.publicPermission = publicPermission
        self.participants = participants
        self.urlEpoch = urlEpoch
        self.rootRecordName = rootRecordName
    }

    public init?(json: JSON) {
        guard let name = json["shareRecordName"]?.stringValue, let zoneName = json["zoneID"]?["zoneName"]?.stringValue,
              let permission = json["publicPermission"]?.stringValue.flatMap(SharePermission.init(rawValue:)) else {
            return nil
        }
        self.init(shareRecordName: name,
                  zoneID: WireZoneID(zoneName: zoneName, ownerRecordName: json["zoneID"]?["ownerRecordName"]?.stringValue),
                  title: json["title"]?.stringValue ?? "", publicPermission: permission,
                  participants: (json["participants"]?.arrayValue ?? []).compactMap(ShareParticipantDescription.init(json:)),
                  urlEpoch: json["urlEpoch"]?.intValue ?? 0, rootRecordName: json["rootRecordName"]?.stringValue)
    }

    public var json: JSON {
        var object: [String: JSON] = [
            "shareRecordName": .string(shareRecordName), "recordType": .string(Self.recordType), "zoneID": zoneID.json,
            "title": .string(title), "publicPermission": .string(publicPermission.rawValue),
            "participants": .array(participants.map(\.json)), "urlEpoch": .int(urlEpoch),
        ]
        if let rootRecordName { object["rootRecordName"] = .string(rootRecordName) }
        return .object(object)
    }
}

public typealias ShareCreateResponse = ShareDescription
public typealias ShareLookupResponse = ShareDescription
public typealias ShareModifyResponse = ShareDescription

/// The answer to `shares/leave`.
public struct ShareLeaveResponse: Sendable, Hashable {
    public var zoneID: WireZoneID

    public init(zoneID: WireZoneID) { self.zoneID = zoneID }

    public init?(json: JSON) {
        guard json["left"] == .bool(true), let zoneName = json["zoneID"]?["zoneName"]?.stringValue else { return nil }
        zoneID = WireZoneID(zoneName: zoneName, ownerRecordName: json["zoneID"]?["ownerRecordName"]?.stringValue)
    }

    public var json: JSON { .object(["left": .bool(true), "zoneID": zoneID.json]) }
}

/// The answer to `shares/delete`.
public struct ShareDeleteResponse: Sendable, Hashable {
    public var shareRecordName: String

    public init(shareRecordName: String) { self.shareRecordName = shareRecordName }

    public init?(json: JSON) {
        guard json["deleted"] == .bool(true), let name = json["shareRecordName"]?.stringValue else { return nil }
        shareRecordName = name
    }

    public var json: JSON { .object(["deleted": .bool(true), "shareRecordName": .string(shareRecordName)]) }
}

/// The answer to `shares/url`: a signed URL and its token, what it grants, and its limits.
public struct ShareURLResponse: Sendable, Hashable {
    public var url: String
    /// `{public URL}/s/{code}`: a short link that points at `url` (`GET /s/{code}`), nil from a server without
    /// short links.
    public var shortURL: String?
    public var token: String
    public var permission: SharePermission
    public var epoch: Int64
    /// Seconds since 1970; nil: never expires.
    public var expiresAt: Int64?
    public var maxUses: Int?

    public init(url: String, shortURL: String? = nil, token: String, permission: SharePermission, epoch: Int64,
                expiresAt: Int64? = nil, maxUses: Int? = nil) {
        self.url = url
        self.shortURL = shortURL
        self.token = token
        self.permission = permission
        self.epoch = epoch
        self.expiresAt = expiresAt
        self.maxUses = maxUses
    }

    public init?(json: JSON) {
        guard let url = json["url"]?.stringValue,
              let permission = json["permission"]?.stringValue.flatMap(SharePermission.init(rawValue:)) else { return nil }
        self.init(url: url, shortURL: json["shortURL"]?.stringValue, token: json["token"]?.stringValue ?? "", permission: permission,
                  epoch: json["epoch"]?.intValue ?? 0, expiresAt: json["expiresAt"]?.intValue,
                  maxUses: json["maxUses"]?.intValue.map { Int(clamping: $0) })
    }

    public var json: JSON {
        var object: [String: JSON] = ["url": .string(url), "token": .string(token), "permission": .string(permission.rawValue),
                                      "epoch": .int(epoch)]
        if let shortURL { object["shortURL"] = .string(shortURL) }
        if let expiresAt { object["expiresAt"] = .int(expiresAt) }
        if let maxUses { object["maxUses"] = .int(Int64(maxUses)) }
        return .object(object)
    }
}

/// What a share link is and what it gives the caller: an item of `records/resolve` (what accepting would
/// give) and `records/accept` (what it gave).
public struct ShareMetadata: Sendable, Hashable {
    public var shareRecordName: String
    public var title: String
    /// With its owner.
    public var zoneID: WireZoneID
    public var ownerRecordName: String
    public var ownerName: String
    /// What the link grants.
    public var linkPermission: SharePermission
    public var publicPermission: SharePermission
    public var rootRecordName: String?
    /// The caller's standing in the share now; nil: not a participant.
    public var currentStatus: AcceptanceStatus?
    /// The caller's role through the link; nil when the link would give nothing.
    public var participantRole: ShareRole?
    /// `none` when the link would give nothing.
    public var participantPermission: SharePermission
    /// Nil: `none`.
    public var participantStatus: AcceptanceStatus?

    public init(shareRecordName: String, title: String, zoneID: WireZoneID, ownerRecordName: String, ownerName: String,
                linkPermission: SharePermission, publicPermission: SharePermission, rootRecordName: String? = nil,
                currentStatus: AcceptanceStatus? = nil, participantRole: ShareRole? = nil,
                participantPermission: SharePermission = .none, participantStatus: AcceptanceStatus? = nil) {
        self.shareRecordName = shareRecordName
        self.title = title
        self.zoneID = zoneID
        self.ownerRecordName = ownerRecordName
        self.ownerName = ownerName
        self.linkPermission = linkPermission
        self.publicPermission = publicPermission
        self.rootRecordName = rootRecordName
        self.currentStatus = currentStatus
        self.participantRole = participantRole
        self.participantPermission = participantPermission
        self.participantStatus = participantStatus
    }

    public init?(json: JSON) {
        guard let name = json["shareRecordName"]?.stringValue, let zoneName = json["zoneID"]?["zoneName"]?.stringValue
        else { return nil }
        func permission(_ key: String) -> SharePermission {
            json[key]?.stringValue.flatMap(SharePermission.init(rawValue:)) ?? .none
        }
        let zoneOwner = json["zoneID"]?["ownerRecordName"]?.stringValue
        self.init(shareRecordName: name, title: json["title"]?.stringValue ?? "",
                  zoneID: WireZoneID(zoneName: zoneName, ownerRecordName: zoneOwner),
                  ownerRecordName: json["ownerIdentity"]?["userRecordName"]?.stringValue ?? zoneOwner ?? "",
                  ownerName: json["ownerIdentity"]?["name"]?.stringValue ?? "",
                  linkPermission: permission("linkPermission"), publicPermission: permission("publicPermission"),
                  rootRecordName: json["rootRecordName"]?.stringValue,
                  currentStatus: json["currentStatus"]?.stringValue.flatMap(AcceptanceStatus.init(rawValue:)),
                  participantRole: json["participantRole"]?.stringValue.flatMap(ShareRole.init(rawValue:)),
                  participantPermission: permission("participantPermission"),
                  participantStatus: json["participantStatus"]?.stringValue.flatMap(AcceptanceStatus.init(rawValue:)))
    }

    public var json: JSON {
        var object: [String: JSON] = [
            "shareRecordName": .string(shareRecordName), "title": .string(title), "zoneID": zoneID.json,
            "ownerIdentity": .object(["userRecordName": .string(ownerRecordName), "name": .string(ownerName)]),
            "linkPermission": .string(linkPermission.rawValue), "publicPermission": .string(publicPermission.rawValue),
            "currentStatus": .string(currentStatus?.rawValue ?? "none"),
            "participantPermission": .string(participantPermission.rawValue),
            "participantStatus": .string(participantStatus?.rawValue ?? "none"),
        ]
        if let rootRecordName { object["rootRecordName"] = .string(rootRecordName) }
        if let participantRole { object["participantRole"] = .string(participantRole.rawValue) }
        return .object(object)
    }
}

/// The answer to `records/resolve` and `records/accept`: an item per link, in the request's order. A
/// failed link's item never repeats the token (a secret): its `value` is empty.
public struct ShareLinksResponse: Sendable {
    public var results: [Result<ShareMetadata, ServiceError>]

    public init(results: [Result<ShareMetadata, ServiceError>]) { self.results = results }

    public init?(json: JSON) {
        guard let items = json["results"]?.arrayValue else { return nil }
        results = items.map { item in
            if let error = ServiceError(json: item) { return .failure(error) }
            guard let metadata = ShareMetadata(json: item) else {
                return .failure(ServiceError(.internalError, "an answer item that is neither a share nor an error"))
            }
            return .success(metadata)
        }
    }

    public var json: JSON {
        .object(["results": .array(results.map { result in
            switch result {
            case .success(let metadata): return metadata.json
            case .failure(let error): return error.json(item: (key: "value", value: ""))
            }
        })])
    }
}
