import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore

/// The pages a browser gets: `GET /share/{token}` as HTML, `GET /` (the web client, or its sign-in page)
/// and the security headers every answer carries. See Docs/Web.md.
extension LatticeService {
    /// The Content-Security-Policy of every answer: scripts, styles, images, requests, the web client's
    /// service worker and its manifest from this origin only, no inline script or style, no eval, no
    /// framing, forms post here only.
    static let contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
        + "connect-src 'self'; worker-src 'self'; manifest-src 'self'; form-action 'self'; base-uri 'none'; "
        + "frame-ancestors 'none'"

    /// The security headers of every answer, pages, web files, JSON and errors alike (404s included), whatever
    /// made it: the HTTP adapter adds them to each answer it sends (`HTTPHandler.headersOnEveryAnswer`).
    static let securityHeaders: [(name: String, value: String)] = [
        (name: "Content-Security-Policy", value: contentSecurityPolicy),
        (name: "X-Content-Type-Options", value: "nosniff"),
        // Share pages hold a secret in their URL; the other answers gain nothing from a Referer either.
        (name: "Referrer-Policy", value: "no-referrer"),
        (name: "X-Frame-Options", value: "DENY"),
        (name: "Cross-Origin-Opener-Policy", value: "same-origin"),
    ]

    public var headersOnEveryAnswer: [(name: String, value: String)] { Self.securityHeaders }

    /// A web file under `webRoot` (the security headers come with every answer).
    func webFile(_ path: String, _ request: HTTPRequest) throws -> HTTPResponse {
        guard let root = configuration.webRoot else { throw ServiceError(.notFound, "no web files here") }
        var response = try StaticFiles(root: root).response(path: path, headers: request.headers)
        // The web client's service worker lives under /web/ but serves `/` too (its offline start page).
        if path == Self.serviceWorkerPath { response.headers.append((name: "Service-Worker-Allowed", value: "/")) }
        return response
    }

    /// The web client's service worker, below `/web/` (Web/sw.js): the one file that may control `/`.
    static let serviceWorkerPath = "sw.js"

    /// `GET /`: the web client for a signed-in browser, else the sign-in and sign-up page.
    func webHome(_ request: HTTPRequest) throws -> HTTPResponse {
        let signedIn = (try? browserSession(request.head)) != nil
        var response = try webFile(signedIn ? "index.html" : "signin.html", request)
        response.headers.append((name: "Vary", value: "Cookie"))
        return response
    }

    /// Whether the request asks for HTML (a browser opening a link) rather than JSON.
    static func wantsHTML(_ request: HTTPRequest) -> Bool {
        guard let accept = request.header("accept")?.lowercased() else { return false }
        return accept.contains("text/html") || accept.contains("application/xhtml+xml")
    }

    /// `GET /share/{token}`: an HTML page for a browser, else the JSON note for API clients.
    func shareLink(_ request: HTTPRequest, token: String) throws -> HTTPResponse {
        guard Self.wantsHTML(request) else { return shareLinkResponse() }
        // A link pasted with the sentence around it ("…/share/eyJ….", or in brackets or quotes): the token
        // itself never ends so (a JWS ends in base64url), so the page moves to the link without them.
        let trimmed = Self.withoutTrailingPunctuation(token)
        if trimmed != token, !trimmed.isEmpty {
            return HTTPResponse(status: 301, headers: [(name: "Location", value: "/share/" + trimmed),
                                                      (name: "Cache-Control", value: "no-store")])
        }
        return try sharePage(request, token: token)
    }

    /// `token` without the punctuation a sentence or a messaging app leaves after a link (`ShareLinkText`).
    static func withoutTrailingPunctuation(_ token: String) -> String { ShareLinkText.withoutTrailingPunctuation(token) }

    /// `GET /s/{code}`: a short link. A browser is sent on to the share page of the signed link it points at
    /// (`?via={code}` lets that page show the short link again); an API client gets `ShortLinkResolution`. A
    /// code that is unknown, or points at a revoked link or a share no longer shared, answers as an invalid
    /// signed link does: the same page, or ACCESS_DENIED.
    func shortLink(_ request: HTTPRequest, code: String) throws -> HTTPResponse {
        let wantsPage = Self.wantsHTML(request)
        let resolution: ShortLinkResolution
        do {
            resolution = try shares.resolveShortLink(code, deadline: freshDeadline())
        } catch let error as ServiceError where error.code == .accessDenied && wantsPage {
            return invalidLinkPage()
        }
        guard wantsPage else { return .json(resolution.json) }
        let token = ShareLinksRequest.token(fromLink: resolution.url)
        let shortCode = resolution.shortURL.split(separator: "/").last.map(String.init) ?? ""
        var response = HTTPResponse.json(resolution.json, status: 303)
        response.headers.append((name: "Location", value: "/share/\(token)?via=\(shortCode)"))
        return response
    }

    /// The short link a share page was reached by (`?via={code}`), when that code points at this very token.
    func shortURLShown(_ request: HTTPRequest, token: String) -> String? {
        guard let via = Self.queryValue(request.query, "via"), let code = ShortLinkCode.normalized(via) else { return nil }
        let link = try? storage.read(deadline: freshDeadline()) { tx in try tx.shortLink(code: code) }
        guard let link = link ?? nil, link.token == token else { return nil }
        return Shares.shortURL(publicURL: publicURL, code: code)
    }

    /// What a share page shows, decided from the link, the share and the viewer.
    enum SharePageState {
        case invalid
        case notForYou(signedIn: Bool)
        case valid(title: String, owner: String, linkPermission: SharePermission, items: Int, rootRecordName: String?,
                   viewer: Viewer)

        enum Viewer { case signedOut, canJoin, joined, owner }
    }

    func sharePageState(_ request: HTTPRequest, token: String) throws -> SharePageState {
        let viewer = try? browserSession(request.head)
        return try storage.read(deadline: freshDeadline()) { tx in
            guard let (claims, share) = try? shares.verifiedLink(token, tx), let zone = try tx.zone(rowID: share.zoneRowID) else {
                return .invalid
            }
            let roster = try shares.roster(share, tx)
            let access = viewer.map { roster.access(of: $0.user.id) } ?? SharePermission.none
            let isOwner = viewer?.user.id == share.ownerID
            if let maximum = claims.maximumUses, !isOwner, access == .none, try tx.linkUses(tokenID: claims.tokenID) >= maximum {
                return .invalid
            }
            let participant = viewer.flatMap { roster.participant($0.user.id) }
            let invited = participant.map { $0.status != .removed } ?? false
            if roster.publicPermission == .none, !isOwner, !invited {
                return .notForYou(signedIn: viewer != nil)
            }
            // Counted by the database: this page needs no token, so it must never read the records themselves
            // (a zone of large records would be loaded whole for one number).
            let items: Int
            if let root = share.rootRecordName {
                items = try tx.childCount(zoneRowID: zone.rowID, parentName: root)
            } else {
                items = try tx.recordCount(zoneRowID: zone.rowID, recordType: "Item")
            }
            let owner = try tx.user(recordName: zone.ownerRecordName)?.name ?? "someone"
            let state: SharePageState.Viewer = viewer == nil ? .signedOut : isOwner ? .owner
                : participant?.status == .accepted ? .joined : .canJoin
            let permission = SharePermission(rawValue: claims.permission) ?? .readOnly
            let granted = invited ? (participant?.permission ?? permission) : permission
            return .valid(title: share.title, owner: owner, linkPermission: granted,
                          items: items, rootRecordName: share.rootRecordName, viewer: state)
        }
    }

    func sharePage(_ request: HTTPRequest, token: String) throws -> HTTPResponse {
        let url = shortURLShown(request, token: token) ?? Shares.shareURL(publicURL: publicURL, token: token)
        let next = "/share/" + token
        // Folded: a phone's screen is for the page; a terminal user opens it.
        let terminal = "<details class=\"terminal\"><summary>Join from a terminal</summary>"
            + "<p>Run <code>lattice accept \(html(url))</code></p></details>"
        let signIn = "<p class=\"actions\" id=\"signin-actions\"><a class=\"button\" href=\"/#signup&amp;next=\(html(next))\">Sign up to join</a> "
            + "<a class=\"button secondary\" href=\"/#next=\(html(next))\">Sign in</a></p>"
        switch try sharePageState(request, token: token) {
        case .invalid:
            return invalidLinkPage()
        case .notForYou(let signedIn):
            return page(status: 403, title: "This link is not for you", body: """
                <h1>This link is not for you</h1>
                <p>Only people the owner invited can open it\(signedIn ? "" : ". If you were invited, sign in first").</p>
                \(signedIn ? "" : signIn)
                """)
        case .valid(let title, let owner, let permission, let items, let root, let viewer):
            let access = permission == .readWrite ? "You can view and edit this list." : "You can view this list."
            let action: String
            switch viewer {
            case .signedOut: action = signIn
            case .canJoin:
                action = "<p class=\"actions\"><button type=\"button\" id=\"join\" class=\"button\">Join</button></p>"
                    + "<p id=\"status\" role=\"status\"></p>"
            case .joined:
                action = "<p>You have joined this list. <a class=\"button\" href=\"/#list=\(html(root ?? ""))\">Open it</a></p>"
            case .owner:
                action = "<p>This is your list. <a class=\"button\" href=\"/#list=\(html(root ?? ""))\">Open it</a></p>"
            }
            return page(status: 200, title: title.isEmpty ? "A shared list" : title, body: """
                <h1 id="title">\(html(title.isEmpty ? "A shared list" : title))</h1>
                <p id="owner">Shared by <strong>\(html(owner))</strong></p>
                <p id="access">\(html(access))</p>
                <p id="count">\(items) \(items == 1 ? "item" : "items")</p>
                \(action)
                \(terminal)
                """)
        }
    }

    /// The page of a share link (signed or short) that does not work, whatever the cause.
    func invalidLinkPage() -> HTTPResponse {
        let cause = ShareTokenError.invalid.description
        return page(status: 404, title: "This link does not work", body: """
            <h1>This link does not work</h1>
            <p class="cause">\(html(cause.prefix(1).uppercased() + cause.dropFirst())).</p>
            <p>Ask the person who sent it for a new link.</p>
            """)
    }

    /// An HTML page of this server, `extraHead` added to its head (a refresh, say).
    func page(status: Int, title: String, body: String, extraHead: String = "") -> HTTPResponse {
        let text = """
            <!doctype html>
            <html lang="en">
            <head>
            <meta charset="utf-8">
            <meta name="viewport" content="width=device-width, initial-scale=1">
            <title>\(html(title)) · Lattice</title>
            <link rel="icon" href="/web/favicon.svg" type="image/svg+xml">
            <link rel="stylesheet" href="/web/style.css">
            <script type="module" src="/web/share.js"></script>
            \(extraHead)
            </head>
            <body>
            <main class="page share">
            \(body)
            </main>
            </body>
            </html>

            """
        return HTTPResponse(status: status, headers: [(name: "Content-Type", value: "text/html; charset=utf-8"),
                                                      (name: "Cache-Control", value: "no-store"),
                                                      (name: "Vary", value: "Accept, Cookie")],
                            body: Array(text.utf8))
    }

    /// Text escaped for HTML element content and quoted attribute values.
    func html<S: StringProtocol>(_ text: S) -> String {
        var out = ""
        out.reserveCapacity(text.utf8.count)
        for character in text {
            switch character {
            case "&": out += "&amp;"
            case "<": out += "&lt;"
            case ">": out += "&gt;"
            case "\"": out += "&quot;"
            case "'": out += "&#39;"
            default: out.append(character)
            }
        }
        return out
    }
}
