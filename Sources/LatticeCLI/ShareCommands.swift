import Foundation
import LatticeAPI
import LatticeCore
import LatticeLists
import LatticeSync
#if canImport(Glibc)
import Glibc
#endif

// lattice share <subcommand> and lattice accept: online calls to the server's shares/* and
// records/resolve|accept, then a sync so this device's copy of the share record (who has access) follows.

/// The share a command is about: where to send the call and which share record it names.
private struct ShareSelection {
    /// `private` for your own zones, `shared` for a zone someone shared with you (administrators).
    let database: String
    let zoneName: String
    let ownerRecordName: String
    /// The share's record name, when this device knows it (nil lets the server pick the zone's only share).
    let shareRecordName: String?
    /// The list, when the command named one.
    let list: ListSummary?

    var label: String { list.map { "\"\($0.title)\"" } ?? "zone \(zoneName)" }

    /// The request's `zoneID` (the owner named only in the shared database) and `shareRecordName`.
    var request: ShareTarget {
        ShareTarget(zoneID: WireZoneID(zoneName: zoneName, ownerRecordName: database == "shared" ? ownerRecordName : nil),
                    shareRecordName: shareRecordName)
    }

    /// `shares/modify` with one participant operation.
    func modify(_ operation: ParticipantOperation, userName: String) -> JSON {
        ShareModifyRequest(target: request, participants: [ShareParticipantChange(operation, .userName(userName))]).json
    }

    var idJSON: [String: JSON] {
        var object: [String: JSON] = [:]
        if let shareRecordName { object["id"] = .string(shareRecordName) }
        if let list { object["list"] = .string(list.id) } else { object["zone"] = .string(zoneName) }
        return object
    }
}

/// Among a zone's records on this device, the share of a list: the share rooted at it, else the zone-wide share.
private func shareRecordName(for list: ListSummary?, among records: [LatticeRecord]) -> String? {
    let shares = records.filter { $0.recordType == "cloudkit.share" }
    if let list, let rooted = shares.first(where: { $0["rootRecordName"] == list.id }) {
        return rooted.recordID.recordName
    }
    return shares.first { $0.recordID.recordName == "cloudkit.zoneshare" }?.recordID.recordName
}

private func syncOrFail(_ engine: ListsReplica) throws {
    let report = try waitForAsyncWork { try await engine.sync() }
    guard report.online else {
        throw CommandFailure("cannot reach \(engine.account?.serverURL ?? "the server"): sharing needs a connection")
    }
}

/// Finds the share of LIST (or of --zone ZONE). A share this device has not fetched yet is fetched once.
private func shareTarget(_ operands: [String], _ options: ClientOptions, _ engine: ListsReplica, _ lists: Lists) throws
    -> ShareSelection {
    if let zoneName = try options.parsed.value("zone") {
        guard operands.isEmpty else { throw UsageError("give LIST or --zone ZONE, not both") }
        guard let zone = try engine.zones().first(where: { $0.database == "private" && $0.zoneName == zoneName }) else {
            throw CommandFailure("you have no zone \(zoneName)")
        }
        var name = shareRecordName(for: nil, among: try engine.records(in: zone))
        if name == nil {
            try syncOrFail(engine)
            if let fetched = try engine.zones().first(where: { $0.database == "private" && $0.zoneName == zoneName }) {
                name = shareRecordName(for: nil, among: try engine.records(in: fetched))
            }
        }
        return ShareSelection(database: "private", zoneName: zoneName, ownerRecordName: zone.ownerRecordName,
                           shareRecordName: name, list: nil)
    }
    guard let query = operands.first else { throw UsageError("missing LIST (or --zone ZONE)") }
    var list = try lists.resolve(query)
    var name = shareRecordName(for: list, among: try engine.records(in: list.zone))
    if name == nil {
        try syncOrFail(engine)
        list = try lists.resolve(list.id)
        name = shareRecordName(for: list, among: try engine.records(in: list.zone))
    }
    guard let name else {
        throw CommandFailure("\"\(list.title)\" is not shared; lattice share create \(list.id) shares it")
    }
    return ShareSelection(database: list.zone.database, zoneName: list.zone.zoneName,
                       ownerRecordName: list.ownerRecordName, shareRecordName: name, list: list)
}

/// `--expires` as seconds: a number with s, m, h, d or w.
func durationSeconds(_ text: String) throws(UsageError) -> Int64 {
    let units: [Character: Int64] = ["s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800]
    guard let unit = text.last, let multiplier = units[unit], let number = Int64(text.dropLast()), number > 0,
          number <= 10 * 365 * 86_400 / multiplier else {
        throw UsageError("--expires must be a duration such as 90s, 30m, 12h, 7d or 2w (at most 10 years)")
    }
    return number * multiplier
}

/// Refreshes this device's copy after a share change (who has access); offline or --no-sync skip it.
private func refresh(_ engine: ListsReplica, _ lists: Lists, _ options: ClientOptions) throws -> SyncOutcome {
    if options.noSync { return SyncOutcome(synced: false, pending: try engine.pendingCount()) }
    return try syncAfterChange(engine, lists, options)
}

func runShare(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, valueOptions: ["public-permission", "zone", "permission", "role",
                                                              "expires", "max-uses"],
                                    flagOptions: ["rotate"])
    if options.help { return print(shareUsage) }
    guard let subcommand = options.positionals.first else {
        throw UsageError("missing subcommand: create, invite, set-permission, remove, participants, url, delete "
                         + "or leave")
    }
    let operands = Array(options.positionals.dropFirst())
    let allowed: [String: Set<String>] = [
        "create": ["public-permission", "zone"], "invite": ["permission", "role", "zone"], "set-permission": ["zone"],
        "remove": ["zone"], "participants": ["zone"], "url": ["permission", "expires", "max-uses", "zone"],
        "delete": ["zone"], "leave": [],
    ]
    guard let values = allowed[subcommand] else { throw UsageError("unknown subcommand share \(subcommand)") }
    try options.allowOnly(values, in: "share \(subcommand)")
    try options.allowFlags(subcommand == "url" ? ["rotate"] : [], in: "share \(subcommand)")
    let viaZone = try options.parsed.value("zone") != nil
    // The LIST operand counts only without --zone.
    func take(_ names: String...) throws(UsageError) -> [String] {
        let wanted = viaZone ? Array(names.dropFirst()) : names
        guard operands.count == wanted.count else {
            if operands.count > wanted.count {
                throw UsageError("unexpected argument \(operands[wanted.count]) "
                                 + "(expected \(wanted.joined(separator: " ")))")
            }
            throw UsageError("missing \(wanted[operands.count...].joined(separator: " "))")
        }
        if let empty = zip(operands, wanted).first(where: { $0.0.isEmpty }) {
            throw UsageError("\(empty.1) cannot be empty")
        }
        return viaZone ? [""] + operands : operands
    }

    switch subcommand {
    case "create":
        let publicPermission = try options.parsed.value("public-permission").map { word throws(UsageError) -> String in
            guard let permission = apiPermission(word, allowNone: true) else {
                throw UsageError("--public-permission must be none, read-only or read-write")
            }
            return permission
        } ?? "none"
        let (engine, lists) = try options.openLists()
        let zoneName: String
        let title: String
        var rootRecordName: String?
        var list: ListSummary?
        if let name = try options.parsed.value("zone") {
            guard operands.isEmpty else { throw UsageError("give LIST or --zone ZONE, not both") }
            guard try engine.zones().contains(where: { $0.database == "private" && $0.zoneName == name }) else {
                throw CommandFailure("you have no zone \(name)")
            }
            zoneName = name
            title = name
        } else {
            let query = try options.operands(operands, "LIST")[0]
            let found = try lists.resolve(query)
            guard found.zone.database == "private" else {
                throw CommandFailure("\"\(found.title)\" belongs to \(ownerLabel(found)); only the owner shares it")
            }
            zoneName = found.zone.zoneName
            rootRecordName = found.id
            title = found.title
            list = found
        }
        let body = ShareCreateRequest(zoneID: WireZoneID(zoneName: zoneName), rootRecordName: rootRecordName, title: title,
                                      publicPermission: SharePermission(rawValue: publicPermission))
        try syncOrFail(engine) // the list (and a zone made offline) must be on the server first
        let share = ShareDescription(json: try callServer(engine, "private", "shares/create", body.json))
        let outcome = try refresh(engine, lists, options)
        let recordName = share?.shareRecordName ?? ""
        var ids: [String: JSON] = ["id": .string(recordName), "publicPermission": .string(publicPermission)]
        if let list { ids["list"] = .string(list.id) } else { ids["zone"] = .string(zoneName) }
        let what = list.map { "\"\($0.title)\"" } ?? "every list of zone \(zoneName)"
        let access = publicPermission == "none" ? "only people you invite (lattice share invite)"
                                                : "anyone with the link, \(permissionWord(publicPermission))"
        let next = list.map { "lattice share url \($0.id)" } ?? "lattice share url --zone \(zoneName)"
        try report(options, outcome, ids, "shared \(what) with \(access); get a link with: \(next)")

    case "invite":
        let values = try take("LIST", "USER")
        let permission = try options.parsed.value("permission").map { word throws(UsageError) -> String in
            guard let permission = apiPermission(word) else {
                throw UsageError("--permission must be read-only or read-write")
            }
            return permission
        } ?? "readOnly"
        var role = ShareRole.privateUser
        if let word = try options.parsed.value("role") {
            guard word == "administrator" else { throw UsageError("--role must be administrator") }
            role = .administrator
        }
        let (engine, lists) = try options.openLists()
        let target = try shareTarget(viaZone ? [] : [values[0]], options, engine, lists)
        _ = try callServer(engine, target.database, "shares/modify",
                           target.modify(.invite(SharePermission(rawValue: permission) ?? .readOnly, role: role), userName: values[1]))
        let outcome = try refresh(engine, lists, options)
        let link = target.list.map { "lattice share url \($0.id)" } ?? "lattice share url --zone \(target.zoneName)"
        try report(options, outcome, target.idJSON.merging(["user": .string(values[1])]) { first, _ in first },
                   "invited \(values[1]) to \(target.label) with \(permissionWord(permission)) access"
                       + (role == .administrator ? " as an administrator" : "")
                       + "; they join with the share's link (\(link))")

    case "set-permission":
        let values = try take("LIST", "USER", "PERMISSION")
        guard let permission = apiPermission(values[2]) else {
            throw UsageError("PERMISSION must be read-only or read-write")
        }
        let (engine, lists) = try options.openLists()
        let target = try shareTarget(viaZone ? [] : [values[0]], options, engine, lists)
        _ = try callServer(engine, target.database, "shares/modify",
                           target.modify(.setPermission(SharePermission(rawValue: permission) ?? .readOnly), userName: values[1]))
        let outcome = try refresh(engine, lists, options)
        try report(options, outcome, target.idJSON.merging(["user": .string(values[1])]) { first, _ in first },
                   "\(values[1]) now has \(permissionWord(permission)) access to \(target.label)")

    case "remove":
        let values = try take("LIST", "USER")
        let (engine, lists) = try options.openLists()
        let target = try shareTarget(viaZone ? [] : [values[0]], options, engine, lists)
        _ = try callServer(engine, target.database, "shares/modify", target.modify(.remove, userName: values[1]))
        let outcome = try refresh(engine, lists, options)
        try report(options, outcome, target.idJSON.merging(["user": .string(values[1])]) { first, _ in first },
                   "removed \(values[1]) from \(target.label)")

    case "participants":
        let values = try take("LIST")
        let (engine, lists) = try options.openLists()
        let target = try shareTarget(viaZone ? [] : [values[0]], options, engine, lists)
        guard let share = ShareDescription(json: try callServer(engine, target.database, "shares/lookup", target.request.json))
        else { throw CommandFailure("the server's answer was not understood") }
        let participants = share.participants
        if options.json {
            return printJSON(.object([
                "id": .string(share.shareRecordName), "publicPermission": .string(share.publicPermission.rawValue),
                "participants": .array(participants.map { participant in
                    .object(["name": .string(participant.name), "userRecordName": .string(participant.userRecordName),
                             "role": .string(participant.role.rawValue), "permission": .string(participant.permission.rawValue),
                             "status": .string(participant.acceptanceStatus.rawValue)])
                }),
            ]))
        }
        let publicPermission = share.publicPermission.rawValue
        let access = publicPermission == "none" ? "invited users only"
                                                : "anyone with the link, \(permissionWord(publicPermission))"
        print("\(target.label): " + access)
        var rows = [["NAME", "ROLE", "ACCESS", "STATUS"]]
        for participant in participants {
            rows.append([participant.name, permissionWord(participant.role.rawValue),
                         participant.role == .owner ? "owner" : permissionWord(participant.permission.rawValue),
                         participant.acceptanceStatus.rawValue])
        }
        alignedRows(rows, indent: "  ").forEach { print($0) }

    case "url":
        let values = try take("LIST")
        var permission: SharePermission?
        if let word = try options.parsed.value("permission") {
            guard let chosen = apiPermission(word).flatMap(SharePermission.init(rawValue:)) else {
                throw UsageError("--permission must be read-only or read-write")
            }
            permission = chosen
        }
        let expiresInSeconds = try options.parsed.value("expires").map(durationSeconds)
        let maxUses = try options.parsed.integer("max-uses", in: 1...1_000_000)
        let rotate: Bool? = options.parsed.flag("rotate") ? true : nil
        let (engine, lists) = try options.openLists()
        let target = try shareTarget(viaZone ? [] : [values[0]], options, engine, lists)
        let request = ShareURLRequest(target: target.request, permission: permission, expiresInSeconds: expiresInSeconds,
                                      maxUses: maxUses, rotate: rotate)
        let reply = try callServer(engine, target.database, "shares/url", request.json)
        guard let answer = ShareURLResponse(json: reply) else { throw CommandFailure("the server sent no URL") }
        let url = answer.url
        if options.json {
            var object: [String: JSON] = ["url": .string(url)]
            if let short = answer.shortURL { object["shortURL"] = .string(short) }
            return printJSON(.object(object))
        }
        print(url)
        var details = ["grants \(permissionWord(answer.permission.rawValue)) access"]
        if let short = answer.shortURL { details.insert("short link (easier to send): \(short)", at: 0) }
        if let expires = answer.expiresAt {
            let date = Date(timeIntervalSince1970: Double(expires))
            details.append("expires \(ISO8601DateFormatter().string(from: date))")
        }
        if let uses = answer.maxUses {
            details.append("usable by at most \(uses) \(uses == 1 ? "person" : "people")")
        }
        if options.parsed.flag("rotate") { details.append("older links of this share no longer work") }
        writeStandardError(details.joined(separator: "; ") + "; join with: lattice accept URL\n")

    case "delete":
        let values = try take("LIST")
        let (engine, lists) = try options.openLists()
        let target = try shareTarget(viaZone ? [] : [values[0]], options, engine, lists)
        guard target.database == "private" else {
            throw CommandFailure("only the owner deletes the share of \(target.label); lattice share leave leaves it")
        }
        _ = try callServer(engine, "private", "shares/delete", target.request.json)
        let outcome = try refresh(engine, lists, options)
        try report(options, outcome, target.idJSON, "\(target.label) is no longer shared")

    default: // leave
        let query = try take("LIST")[0]
        let (engine, lists) = try options.openLists()
        let list = try lists.resolve(query)
        guard list.zone.database == "shared" else {
            throw CommandFailure("\"\(list.title)\" is yours; lattice share delete stops sharing it")
        }
        let target = try shareTarget([list.id], options, engine, lists)
        _ = try callServer(engine, "shared", "shares/leave", target.request.json)
        let outcome = try refresh(engine, lists, options)
        try report(options, outcome, ["id": .string(list.id)], "left \"\(list.title)\" of \(ownerLabel(list))")
    }
}

// MARK: accept

func runAccept(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments, flagOptions: ["yes"])
    if options.help { return print(acceptUsage) }
    let url = try options.operands(options.positionals, "URL")[0]
    let confirmed = options.parsed.flag("yes")
    if !confirmed && isatty(STDIN_FILENO) != 1 {
        throw UsageError("stdin is not a terminal, so nobody can answer Join? [y/N]: pass --yes to join")
    }
    let (engine, lists) = try options.openLists()
    let account = engine.account!
    let link = ShareLinksRequest(links: [url]).json
    let metadata = try shareMetadata(callServer(engine, "shared", "records/resolve", link), url: url, account: account)

    let title = metadata.title
    let ownerName = metadata.ownerName
    let ownerRecordName = metadata.ownerRecordName
    let zoneName = metadata.zoneID.zoneName
    let root = metadata.rootRecordName
    let permission = metadata.participantPermission.rawValue
    if ownerRecordName == account.userRecordName {
        throw CommandFailure("this is your own share: its lists are already yours")
    }
    if permission == "none" {
        let removed = metadata.participantStatus == .removed || metadata.currentStatus == .removed
        throw CommandFailure(removed
                             ? "you were removed from this share; ask \(ownerName) to invite you again"
                             : "this share is not public and you are not invited")
    }
    let what = root == nil ? "every list of \(ownerName)'s zone \(zoneName)" : "the list \"\(title)\""
    let already = metadata.currentStatus == .accepted
    let summary = "\(what), shared by \(ownerName): you would get \(permissionWord(permission)) access"
        + (already ? " (you have already joined)" : "")
    notice(summary, options)
    if !confirmed {
        writeStandardError("Join? [y/N] ")
        let answer = readLine()?.trimmingCharacters(in: .whitespaces).lowercased() ?? ""
        guard answer == "y" || answer == "yes" else { throw CommandFailure("not joined") }
    }
    let accepted = try shareMetadata(callServer(engine, "shared", "records/accept", link), url: url, account: account)
    let granted = accepted.participantPermission.rawValue
    try engine.rememberUserName(ownerRecordName, ownerName)

    let outcome = options.noSync ? SyncOutcome(pending: try engine.pendingCount())
                                 : try syncAfterChange(engine, lists, options)
    let joined = try lists.all().filter {
        $0.zone.database == "shared" && $0.zone.zoneName == zoneName && $0.ownerRecordName == ownerRecordName
            && (root == nil || $0.id == root)
    }
    if options.json {
        if root == nil {
            printJSON(.array(joined.map(acceptedJSON)))
        } else if let list = joined.first {
            printJSON(acceptedJSON(list))
        } else { // not fetched yet (offline or --no-sync): what the share said
            printJSON(.object(["id": .string(root ?? ""), "title": .string(title), "owner": .string(ownerName),
                               "permission": .string(granted)]))
        }
    } else if joined.isEmpty {
        print("joined \(what) of \(ownerName) with \(permissionWord(granted)) access; lattice sync fetches it")
    } else {
        for list in joined {
            let count = try lists.items(of: list).count
            print("joined \"\(list.title)\" of \(ownerLabel(list)) with \(permissionWord(list.permission)) access "
                  + "(\(count) \(plural(count, "item"))): lattice list show \(list.id)")
        }
    }
    try outcome.finish()
}

private func acceptedJSON(_ list: ListSummary) -> JSON {
    .object(["id": .string(list.id), "title": .string(list.title), "owner": .string(ownerLabel(list)),
             "permission": .string(list.permission)])
}

/// The one result of records/resolve or records/accept; a link the server does not honour is one clear error.
private func shareMetadata(_ reply: JSON, url: String, account: Account) throws -> ShareMetadata {
    guard let result = ShareLinksResponse(json: reply)?.results.first else {
        throw CommandFailure("the server's answer was not understood")
    }
    let error: ServiceError
    switch result {
    case .success(let metadata): return metadata
    case .failure(let failure): error = failure
    }
    switch error.code {
    case .accessDenied, .notFound, .badRequest:
        var message = "this share link is invalid, expired or revoked"
        if let host = URL(string: url)?.host, let server = URL(string: account.serverURL)?.host, host != server {
            message += " (it does not come from your server \(account.serverURL))"
        }
        throw CommandFailure(message)
    case .permissionFailure:
        throw CommandFailure(error.reason.isEmpty ? "you cannot join this share" : error.reason)
    default:
        throw CommandFailure("the server refused the link: \(error.reason) (\(error.code.rawValue))")
    }
}
