import Foundation
import LatticeCore
@testable import LatticeServer
import LatticeTestSupport
import Testing

/// The route table (Routes.swift): patterns, 405 with `Allow`, HEAD, admission per route, and the log's
/// view of secret paths. In-process.
@Suite struct RouteTableTests {
    /// A concrete path for a route's pattern: the server's container, production, private, a token.
    static func samplePath(_ route: Route) -> String {
        let values = ["container": "lattice", "environment": "production", "database": "private", "token": "abc.def",
                      "path": "index.html"]
        return "/" + route.pattern.segments.map { segment -> String in
            switch segment {
            case .literal(let text): text
            case .parameter(let name), .rest(let name): values[name] ?? "x"
            }
        }.joined(separator: "/")
    }

    @Test func patternsMatchWholeSegmentsAndTheRestParameterTakesSlashes() throws {
        let share = RoutePattern("/share/{token...}")
        #expect(share.description == "/share/{token}")
        #expect(share.match(try #require(RoutePattern.components(of: "/share/a.b")))?["token"] == "a.b")
        #expect(share.match(try #require(RoutePattern.components(of: "/share/a/b")))?["token"] == "a/b")
        #expect(share.match(try #require(RoutePattern.components(of: "/share/")))?["token"] == "")
        #expect(share.match(try #require(RoutePattern.components(of: "/share"))) == nil)
        #expect(share.match(try #require(RoutePattern.components(of: "/shares/a"))) == nil)
        let database = RoutePattern(Route.databasePrefix + "zones/list")
        let found = database.match(try #require(RoutePattern.components(of: "/database/1/lattice/production/private/zones/list")))
        #expect(found == ["container": "lattice", "environment": "production", "database": "private"])
        #expect(database.match(try #require(RoutePattern.components(of: "/database/1/lattice/production/private/zones/list/"))) == nil)
        #expect(database.match(try #require(RoutePattern.components(of: "/database/1/lattice/production/zones/list"))) == nil)
        // A parameter matches an empty segment; the container check then refuses it (as before the table).
        #expect(database.match(try #require(RoutePattern.components(of: "/database/1//production/private/zones/list")))?["container"] == "")
        #expect(RoutePattern.components(of: "healthz") == nil)
    }

    /// What the table promises admission and the OpenAPI test: bearer routes are database routes on the pool
    /// in the account's share; inline routes neither authenticate nor throttle; signatures are unique; the
    /// documented list is derived from the table.
    @Test func theTableIsConsistent() {
        var signatures = Set<String>()
        for route in LatticeService.apiRoutes {
            #expect(signatures.insert(route.signature).inserted, "\(route.signature) twice")
            switch route.handler {
            case .database, .databaseLater:
                #expect(route.authentication != .none && route.lane == .pool && route.throttle == .perAccount,
                        "\(route.signature)")
                #expect(route.pattern.description.hasPrefix(Route.databasePrefix))
            case .plain:
                // Plain handlers are dispatched without a caller: no token, no per-account bucket.
                #expect(route.authentication == .none && route.throttle != .perAccount, "\(route.signature)")
            case .account:
                // Signed-in routes outside /database/ (device approval): a token or session, the account's bucket.
                #expect(route.authentication != .none && route.lane == .pool && route.throttle == .perAccount,
                        "\(route.signature)")
                #expect(!route.pattern.description.hasPrefix("/database/"))
            }
            if route.lane == .inline { #expect(route.throttle == .none, "\(route.signature) is inline and throttled") }
            if route.body == .deltaPush { #expect(route.operationName == "deltas/push") }
        }
        #expect(LatticeService.routes == LatticeService.apiRoutes.filter(\.documented).map(\.signature))
        #expect(LatticeService.routes.contains("GET /share/{token}"))
        #expect(LatticeService.routes.contains("POST /database/1/{container}/{environment}/{database}/changes/wait"))
        #expect(!LatticeService.routes.contains { $0.hasPrefix("GET /web/") }, "the web mount is not part of the JSON API")
    }

    /// Every route answers a method it does not take with 405 METHOD_NOT_ALLOWED and `Allow`, in JSON,
    /// before any token is looked at; GET routes list HEAD too.
    @Test func wrongMethodsAre405WithAllow() throws {
        let h = try ServiceHarness { $0.webRoot = temporaryDirectory("lattice-web") }
        for route in LatticeService.apiRoutes {
            let path = Self.samplePath(route)
            // Every method of the routes on this path (an upload URL takes POST, PATCH and HEAD), in table order.
            var allowed: [String] = []
            for other in LatticeService.apiRoutes where other.pattern.description == route.pattern.description {
                allowed += other.methods.filter { !allowed.contains($0) }
            }
            for method in ["PUT", "DELETE", "PATCH", "GET", "POST"] where !allowed.contains(method) {
                let reply = h.raw(method, path)
                #expect(reply.status == 405 && reply.code == "METHOD_NOT_ALLOWED", "\(method) \(path): \(reply.status)")
                #expect(reply.response.header("Allow") == allowed.joined(separator: ", "), "\(method) \(path)")
                #expect(reply.response.header("Content-Type")?.hasPrefix("application/json") == true)
                #expect(reply["reason"]?.stringValue?.hasSuffix("not \(method)") == true)
                // Admission answers it from the head, before the body is read.
                guard case .answer(let early) = h.service.admit(HTTPRequestHead(method: method, path: path)) else {
                    Issue.record("admit did not answer \(method) \(path)")
                    continue
                }
                #expect(early.status == 405 && early.header("Allow") == reply.response.header("Allow"))
            }
        }
        #expect(h.raw("HEAD", "/auth/signup").response.header("Allow") == "POST")
        #expect(h.raw("POST", "/healthz").response.header("Allow") == "GET, HEAD")
    }

    @Test func headAnswersLikeGetAndUnknownPathsStay404() throws {
        let h = try ServiceHarness()
        let get = h.raw("GET", "/healthz"), head = h.raw("HEAD", "/healthz")
        #expect(head.status == 200 && head.response.headers.map(\.name) == get.response.headers.map(\.name))
        #expect(h.raw("HEAD", "/.well-known/jwks.json").status == 200)
        #expect(h.raw("HEAD", "/share/abc").status == 200)
        for path in ["/nope", "/healthz/", "/share", "/database/1/lattice/production/private/zones", "//healthz"] {
            let reply = h.raw("GET", path)
            #expect(reply.status == 404 && reply.code == "NOT_FOUND", "\(path): \(reply.status)")
            #expect(reply.response.header("Allow") == nil)
        }
        #expect(h.raw("GET", "/database/1/lattice/production/private/records/explode")["reason"]?.stringValue
                == "no such operation: records/explode")
        #expect(h.raw("DELETE", "/nope")["reason"]?.stringValue == "no such endpoint: DELETE /nope")
    }

    /// A share token is a secret: not in the access log, nor in a 405's reason.
    @Test func secretPathsAreLoggedAsTheirPattern() throws {
        let h = try ServiceHarness()
        #expect(h.service.pathForLog("/share/eyJhbGciOi.secret") == "/share/{token}")
        #expect(h.service.pathForLog("/share/a/b") == "/share/{token}")
        #expect(h.service.pathForLog("/shares/x") == "/shares/x")
        #expect(h.service.pathForLog("/healthz") == "/healthz")
        let refused = h.raw("POST", "/share/eyJhbGciOi.secret")
        #expect(refused.status == 405)
        #expect(refused["reason"]?.stringValue?.contains("secret") == false)
    }

    /// Each route's admission, from the table.
    @Test func admissionFollowsTheTable() throws {
        let h = try ServiceHarness()
        func admit(_ method: String, _ path: String, token: String? = nil) -> HTTPAdmission {
            var headers: [String: String] = [:]
            if let token { headers["authorization"] = "Bearer " + token }
            return h.service.admit(HTTPRequestHead(method: method, path: path, headers: headers, remoteAddress: "10.0.0.9"))
        }
        if case .inline = admit("GET", "/healthz") {} else { Issue.record("healthz is inline") }
        // Share links read storage for their HTML page (WebPages.swift): on the pool, in the address's share.
        if case .pool(let client, nil) = admit("HEAD", "/share/abc") { #expect(client == "ip:10.0.0.9") } else {
            Issue.record("share pages run on the pool in the address's share")
        }
        if case .pool(let client, nil) = admit("POST", "/auth/signup") { #expect(client == "ip:10.0.0.9") } else {
            Issue.record("sign-up runs on the pool in the address's share")
        }
        // Unknown paths outside /database/ go on in the address's share (route() answers 404).
        if case .pool(let client, nil) = admit("GET", "/nope") { #expect(client == "ip:10.0.0.9") } else {
            Issue.record("an unknown path runs on the pool")
        }
        guard case .answer(let unknown) = admit("POST", "/database/1/lattice/production/private/nope") else {
            Issue.record("an unknown database path is answered from the head")
            return
        }
        #expect(unknown.status == 404)
        guard case .answer(let anonymous) = admit("POST", "/database/1/lattice/production/private/zones/list") else {
            Issue.record("a database route without a token is answered from the head")
            return
        }
        #expect(anonymous.status == 421)
        let (token, _) = try h.signUp("ada")
        guard case .pool(let client, let principal) = admit("POST", "/database/1/lattice/production/private/zones/list",
                                                             token: token) else {
            Issue.record("a database route with a good token runs on the pool")
            return
        }
        #expect(client.hasPrefix("user:") && principal is AuthenticatedCaller)
    }

    /// The web mount exists only with a web root: without one, `/web/...` is an unknown path (404 for every
    /// method, not 405).
    @Test func theWebMountIsOffByDefault() throws {
        let off = try ServiceHarness()
        #expect(off.service.configuration.webRoot == nil)
        #expect(off.raw("GET", "/web/index.html").status == 404)
        #expect(off.raw("POST", "/web/index.html").status == 404)

        let root = temporaryDirectory("lattice-web")
        defer { try? FileManager.default.removeItem(atPath: root) }
        try Data("<!doctype html><title>Lattice</title>".utf8).write(to: URL(fileURLWithPath: root + "/index.html"))
        let on = try ServiceHarness { $0.webRoot = root }
        let page = on.raw("GET", "/web/")
        #expect(page.status == 200 && page.response.header("Content-Type") == "text/html; charset=utf-8")
        #expect(String(decoding: page.response.body, as: UTF8.self) == "<!doctype html><title>Lattice</title>")
        #expect(on.raw("HEAD", "/web/index.html").status == 200)
        #expect(on.raw("GET", "/web/missing.html").code == "NOT_FOUND")
        if case .pool(let client, nil) = on.service.admit(HTTPRequestHead(method: "GET", path: "/web/index.html",
                                                                          remoteAddress: "10.0.0.9")) {
            #expect(client == "ip:10.0.0.9")
        } else {
            Issue.record("web files are read on the worker pool")
        }
    }

    /// Web files take from the address's rate-limit bucket, like sign-up.
    @Test func webFilesAreThrottledPerAddress() throws {
        let root = temporaryDirectory("lattice-web")
        defer { try? FileManager.default.removeItem(atPath: root) }
        try Data("body{}".utf8).write(to: URL(fileURLWithPath: root + "/site.css"))
        let h = try ServiceHarness {
            $0.webRoot = root
            $0.rateLimit = .init(requestsPerSecond: 0.001, burst: 2)
        }
        #expect(h.raw("GET", "/web/site.css").status == 200)
        #expect(h.raw("GET", "/web/site.css").status == 200)
        let third = h.raw("GET", "/web/site.css")
        #expect(third.status == 429 && third.code == "THROTTLED" && third.response.header("Retry-After") != nil)
    }
}
