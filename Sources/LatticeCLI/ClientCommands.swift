import Foundation
import LatticeLists
import LatticeSync

// The client commands' help texts and their dispatch.

let clientOptionsHelp = """
    options of every client command:
      --home DIR   this device's home (default $LATTICE_HOME, else ~/.lattice); one home is one device
      --json       machine output on stdout (messages for people go to stderr)
      --no-sync    change this device's copy only; the change stays queued until lattice sync
      --help       show the command's help
    """

let listHelpTail = """
    LIST is a list's id, id prefix or title; ITEM an item's id, id prefix or text (exact first, then
    ignoring case). An ambiguous one is an error that lists the candidates.
    """

let signupUsage = """
    usage: lattice signup NAME --server URL [--home DIR] [--json]

    Creates the account NAME on the server and keeps its token in the home. The token is printed once:
    use it with lattice login --token, or sign another device in with a code (lattice login --server URL
    there, lattice devices approve CODE here). A refusal is said at once with why (a taken name, closed
    registration, the sign-up limit for this address) and, for a limit, when to try again.
    --json: {"name","userRecordName","server","token"}

    \(clientOptionsHelp)
    """

let loginUsage = """
    usage: lattice login --server URL [--name NAME] [--home DIR] [--json]
           lattice login --server URL --token TOKEN [--home DIR] [--json]
           lattice login --web [--home DIR] [--json]

    --server URL alone: signs this device in without copying a token. It shows a one-time code
      (XXXX-XXXX, valid 10 minutes) to approve on a device already signed in to the account with
      lattice devices approve CODE, waits for that, and keeps this device's own token (named NAME,
      default the host name; lattice devices lists and revokes it). --json: {"name","userRecordName",
      "server","deviceName"}, the code and instructions on stderr.
    --token TOKEN: signs this home in with an existing account's token (from lattice signup or lattice
      admin add-user).
    A home that held another account's lists starts empty and fetches the new account's.
    --json: {"name","userRecordName","server"}
    --web: prints a one-time link that signs a browser in to this home's account (it works once, within
      10 minutes); --json: {"url","name","expires"}

    \(clientOptionsHelp)
    """

let logoutUsage = """
    usage: lattice logout [--force] [--local] [--home DIR] [--json]

    Signs this home out: revokes its token on the server (it stops working at once, on every device
    that uses it), then forgets the account and its lists here. If the server cannot be reached nothing
    changes; run it again later. A home with unsent changes refuses unless --force (they are dropped).
    --local: forget the token here without revoking it (it stays valid until revoked).
    --json: {"name","server","token": "revoked" | "invalid" | "kept"}

    \(clientOptionsHelp)
    """

let whoamiUsage = """
    usage: lattice whoami [--home DIR] [--json]

    Shows the signed-in account, its server, the home and how many changes wait to be sent.
    --json: {"name","userRecordName","server","home","pending"}

    \(clientOptionsHelp)
    """

let syncUsage = """
    usage: lattice sync [--home DIR] [--json]

    Sends this device's queued changes and fetches everyone else's. Exit status 1 when the server cannot
    be reached or asks to wait (THROTTLED, TRY_AGAIN_LATER: the changes stay queued, and it says when to
    try again) or refused a change (this device's copy is restored). A list
    that is no longer shared with you (you were removed or left, the share was deleted) leaves this
    device with your unsent changes to it, which are dropped, not sent; the sync names both on stderr.
    --json: {"online","sent","fetched","pending","rejected":[{"id","zone","code","reason"}],
             "removedZones":[{"database","zone","owner"}], "noLongerShared":[{"id","title","owner","zone"}],
             "droppedEdits":[{"id","zone","deletion","list"?}], "notNow": null or {"code","reason","retryAfter"}}

    \(clientOptionsHelp)
    """

let watchUsage = """
    usage: lattice watch [LIST] [--home DIR] [--json]

    Syncs, then waits on the server's push path (changes/wait) and prints every change made elsewhere
    as it arrives: items added (+), changed (~) and removed (-), lists added, renamed or removed.
    With LIST, only that list. Ctrl-C (SIGINT) or SIGTERM stops it with exit status 0.
    --json: one object per line, {"change","list",...}; change is itemAdded, itemChanged, itemRemoved,
    listAdded, listChanged or listRemoved; item changes carry "item" (and "before" when changed).

    \(clientOptionsHelp)
    """

let listsUsage = """
    usage: lattice lists [--home DIR] [--json]

    Your own lists and the lists shared with you, from this device's copy (lattice sync fetches):
    title, owner, whether it is shared, your access (owner, read-write or read-only) and id.
    --json: [{"id","title","owner","shared","permission"}], permission being owner, readWrite or readOnly

    \(clientOptionsHelp)
    """

let listUsage = """
    usage: lattice list <subcommand> ...

      list create TITLE [--zone ZONE]       a new list (in zone ZONE, default Lists)
      list show LIST                        the items: [x] done, [ ] not, #tags
      list add LIST TEXT [--tag T]...       a new item at the end
      list check LIST ITEM                  mark an item done
      list uncheck LIST ITEM                mark an item not done
      list edit LIST ITEM [--text T] [--add-tag T]... [--remove-tag T]...
                                            change an item's text and tags
      list note LIST ITEM [TEXT | --file PATH]
                                            show an item's note, or set it (--file - reads standard
                                            input; "" clears it); two people can edit one note at once:
                                            each keeps the parts they changed
      list move LIST ITEM POSITION          show an item at POSITION (1 is the top)
      list attach LIST ITEM FILE            attach a file (a photo, say) to an item; it uploads with the
                                            next sync, before the item's change
      list get LIST ITEM [NAME] [--out DIR] save an item's attachments (or the one named NAME) into DIR
                                            (default: the current directory), downloading them if this
                                            device does not have them
      list remove LIST ITEM                 delete an item
      list rename LIST TITLE                retitle a list
      list delete LIST                      delete a list and its items (owner only; others use
                                            lattice share leave)

    Each change applies to this device's copy first, then syncs; offline, or with --no-sync, it is
    queued for the next lattice sync. A change the server refuses (read-only access) is undone here and
    reported with exit status 1.
    --json: list show gives {"id","title","owner","permission","items":[{"id","text","done","tags",
    "position","note","attachments":[{"name","size","fileChecksum"}]}]}; list get gives {"saved":[paths]};
    list note LIST ITEM gives {"id","list","note"}; changes give the affected ids, {"id",...,"synced","pending"}
    (list delete also "ids": the list and its items).

    \(listHelpTail)

    \(clientOptionsHelp)
    """

let shareUsage = """
    usage: lattice share <subcommand> ...

      share create LIST [--public-permission none|read-only|read-write]
                                   share a list and its items (default none: only invited users)
      share create --zone ZONE [--public-permission none|read-only|read-write]
                                   share every list of a zone, including lists made later
      share invite LIST USER [--permission read-only|read-write] [--role administrator]
                                   invite a user by name (default read-only); they join with the
                                   share's URL; a public share cannot invite
      share set-permission LIST USER read-only|read-write
      share remove LIST USER       take a participant's access away
      share participants LIST      the owner, participants, their access and status
      share url LIST [--permission read-only|read-write] [--expires DURATION] [--max-uses N] [--rotate]
                                   a signed link to the share; DURATION like 30m, 12h or 7d;
                                   --rotate first revokes every older link
      share delete LIST            stop sharing (everyone else loses the list)
      share leave LIST             leave a list someone shared with you

    LIST may be replaced by --zone ZONE (one of your zones) in invite, set-permission, remove,
    participants, url and delete. The share of a list is the share rooted at it, else its zone's
    zone-wide share. Administrators of a list shared with them manage it the same way. Sharing needs
    the server.
    --json: share url gives {"url","shortURL"}; share participants {"id","publicPermission","participants":
    [{"name","userRecordName","role","permission","status"}]}; the others the affected ids, e.g.
    {"id": share record name, "list"|"zone", ...}.

    \(listHelpTail)

    \(clientOptionsHelp)
    """

let acceptUsage = """
    usage: lattice accept URL [--yes] [--home DIR] [--json]

    URL is a share link, long (.../share/...) or short (.../s/...); punctuation pasted after it is ignored.
    Shows a share link's title, owner and the access it grants, asks "Join? [y/N]" (on a terminal;
    otherwise --yes is required), joins, syncs and shows the joined list(s). A link that was rotated,
    deleted, used up or expired fails with exit status 1; declining exits with status 1.
    --json: the joined list, {"id","title","owner","permission"}; for a zone-wide share always an array
    of them, one per list of the zone.

    \(clientOptionsHelp)
    """

let explainUsage = """
    usage: lattice explain LIST ITEM FIELD [--home DIR] [--json]
           lattice explain LIST FIELD

    Which write won a field of an item (text, done, position, tags, note) or of the list (title): the
    device (replica) and hybrid-logical-clock time, and whether it was this device. For tags, the adds
    that keep each tag. For a note (a text) or a list field, who wrote each run of it, in order. A
    field changed on this device and not sent yet has no winner until it is sent: it says so.
    --json: {"record","field","kind":"register","value","winner":{"replica","thisDevice","time","hlc"}}
    or {"record","field","kind":"set","elements":[{"value","addedBy":[...]}]}
    or {"record","field","kind":"text"|"list","runs":[{"values","replica","thisDevice"}]}
    or {"record","field","kind":"unsent","value"}

    \(listHelpTail)

    \(clientOptionsHelp)
    """

let clientCommandUsages: [String: String] = [
    "signup": signupUsage, "login": loginUsage, "logout": logoutUsage, "whoami": whoamiUsage, "sync": syncUsage, "watch": watchUsage,
    "lists": listsUsage, "list": listUsage, "share": shareUsage, "accept": acceptUsage, "explain": explainUsage,
    "devices": devicesUsage, "invitations": invitationsUsage,
]

/// Runs a client command. Server and connection errors become messages for people.
func runClientCommand(_ command: String, _ arguments: [String]) throws {
    do {
        switch command {
        case "signup": try runSignUp(arguments)
        case "login": try runLogIn(arguments)
        case "whoami": try runWhoAmI(arguments)
        case "logout": try runLogOut(arguments)
        case "sync": try runSync(arguments)
        case "watch": try runWatch(arguments)
        case "lists": try runLists(arguments)
        case "list": try runList(arguments)
        case "share": try runShare(arguments)
        case "accept": try runAccept(arguments)
        case "explain": try runExplain(arguments)
        case "devices": try runDevices(arguments)
        case "invitations": try runInvitations(arguments)
        default: throw UsageError("unknown command '\(command)'")
        }
    } catch let error as ServerError {
        throw CommandFailure(describeClientError(error))
    } catch let error as TransportError {
        throw CommandFailure(describeClientError(error))
    } catch let error as LatticeSyncError {
        throw CommandFailure(describeClientError(error))
    }
}

/// Global client options given before the command (`lattice --home DIR lists`) move after it.
func hoistingGlobalOptions(_ arguments: [String]) -> [String] {
    var leading: [String] = []
    var index = 0
    while index < arguments.count {
        let argument = arguments[index]
        if argument == "--json" || argument == "--no-sync" || argument.hasPrefix("--home=") {
            leading.append(argument)
            index += 1
        } else if argument == "--home", index + 1 < arguments.count {
            leading += [argument, arguments[index + 1]]
            index += 2
        } else {
            break
        }
    }
    guard !leading.isEmpty, index < arguments.count else { return arguments }
    return [arguments[index]] + leading + arguments[(index + 1)...]
}
