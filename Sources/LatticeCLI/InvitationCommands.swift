import Foundation
import LatticeAPI
import LatticeCore

// lattice invitations: the shares someone invited this account to, and accepting or declining one.

let invitationsUsage = """
    usage: lattice invitations [--home DIR] [--json]
           lattice invitations accept N|TITLE [--no-sync]
           lattice invitations decline N|TITLE

    Lists someone invited you to by name and you have not answered yet (newest first), with who shared
    each and the access accepting gives. accept joins it (as lattice accept does with its link, without
    asking) and syncs; decline turns it down (only a new invitation lets you in). N is the number the
    listing shows; TITLE a list's title. Needs the server.
    --json: [{"title","owner","permission","zone","url"}], the url a share link for lattice accept.

    \(clientOptionsHelp)
    """

func runInvitations(_ arguments: [String]) throws {
    let options = try ClientOptions(arguments)
    if options.help { return print(invitationsUsage) }
    let (engine, _) = try options.openLists()
    let reply = try callServer(engine, "shared", "shares/invitations", ShareInvitationsRequest().json)
    guard let invitations = ShareInvitationsResponse(json: reply)?.invitations else {
        throw CommandFailure("the server's answer was not understood")
    }
    guard let subcommand = options.positionals.first else {
        if options.json {
            return printJSON(.array(invitations.map { invitation in
                .object(["title": .string(invitation.title), "owner": .string(invitation.ownerName),
                         "permission": .string(invitation.permission.rawValue),
                         "zone": .string(invitation.zoneID.zoneName), "url": .string(invitation.url)])
            }))
        }
        guard !invitations.isEmpty else { return print("no pending invitations") }
        var rows = [["#", "TITLE", "OWNER", "ACCESS"]]
        for (index, invitation) in invitations.enumerated() {
            rows.append(["\(index + 1)", invitation.title.isEmpty ? "(zone \(invitation.zoneID.zoneName))" : invitation.title,
                         invitation.ownerName, permissionWord(invitation.permission.rawValue)])
        }
        alignedRows(rows).forEach { print($0) }
        print("accept with: lattice invitations accept N; decline with: lattice invitations decline N")
        return
    }
    guard subcommand == "accept" || subcommand == "decline" else {
        throw UsageError("unknown subcommand invitations \(subcommand) (accept or decline)")
    }
    let chosen = try chooseInvitation(try options.operands(Array(options.positionals.dropFirst()), "N|TITLE")[0], invitations)
    if subcommand == "accept" {
        // The invitation's link, through lattice accept: the same checks, sync and report.
        var forwarded = [chosen.url, "--yes", "--home", options.home]
        if options.json { forwarded.append("--json") }
        if options.noSync { forwarded.append("--no-sync") }
        return try runAccept(forwarded)
    }
    _ = try callServer(engine, "shared", "shares/decline", chosen.target.json)
    let label = chosen.title.isEmpty ? "zone \(chosen.zoneID.zoneName)" : "\"\(chosen.title)\""
    if options.json {
        printJSON(.object(["declined": .bool(true), "title": .string(chosen.title), "owner": .string(chosen.ownerName)]))
    } else {
        print("declined \(label) of \(chosen.ownerName)")
    }
}

/// The invitation a person named: its number in the listing, or its title (any case).
private func chooseInvitation(_ query: String, _ invitations: [ShareInvitation]) throws -> ShareInvitation {
    if let number = Int(query) {
        guard number >= 1, number <= invitations.count else {
            throw CommandFailure(invitations.isEmpty ? "no pending invitations"
                                                     : "no invitation \(number): lattice invitations lists 1 to \(invitations.count)")
        }
        return invitations[number - 1]
    }
    let matches = invitations.filter { $0.title.lowercased() == query.lowercased() }
    guard let first = matches.first else { throw CommandFailure("no pending invitation to \"\(query)\": lattice invitations lists them") }
    guard matches.count == 1 else {
        throw CommandFailure("several invitations are called \"\(query)\": name one by its number (lattice invitations)")
    }
    return first
}
