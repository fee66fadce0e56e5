import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
@testable import LatticeServer
import LatticeStore
import LatticeTestSupport
import Testing

/// The static-file responder (StaticFiles.swift) on a temporary directory: types, ETags and 304, caching
/// headers, and every way out of the root refused.
@Suite struct StaticFilesTests {
    /// A web root with one file of each type, a sub-folder, a dot file, an unknown type, and beside it a
    /// folder with a secret that symlinks point at.
    final class Fixture {
        let base = temporaryDirectory("lattice-static")
        var root: String { base + "/web" }

        init() throws {
            let files: [String: String] = [
                "index.html": "<!doctype html><title>home</title>", "app.js": "export const a = 1;\n",
                "site.css": "body { color: black }", "logo.svg": "<svg xmlns=\"http://www.w3.org/2000/svg\"/>",
                "icon.png": "\u{89}PNG", "data.json": "{\"a\":1}", "favicon.ico": "ico", "robots.txt": "User-agent: *",
                "site.webmanifest": "{\"name\":\"Lattice\"}", "module.mjs": "export {}", "notes.md": "# notes",
                ".hidden.html": "hidden", "sub/index.html": "sub home", "sub/page.html": "sub page",
                "UPPER.HTML": "upper", "big.txt": String(repeating: "x", count: 5000),
            ]
            for (name, text) in files { try write(root + "/" + name, text) }
            try write(base + "/outside/secret.html", "secret")
            try FileManager.default.createSymbolicLink(atPath: root + "/escape.html", withDestinationPath: base + "/outside/secret.html")
            try FileManager.default.createSymbolicLink(atPath: root + "/outlink", withDestinationPath: base + "/outside")
            try FileManager.default.createSymbolicLink(atPath: root + "/alias.html", withDestinationPath: root + "/sub/page.html")
            try FileManager.default.createDirectory(atPath: root + "/folder.html", withIntermediateDirectories: true)
            #expect(mkfifo(root + "/pipe.txt", 0o600) == 0)
        }

        deinit { try? FileManager.default.removeItem(atPath: base) }

        func write(_ path: String, _ text: String) throws {
            let url = URL(fileURLWithPath: path)
            try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
            try Data(text.utf8).write(to: url)
        }

        /// The responder's answer, or the error it throws rendered as the service would.
        func get(_ path: String, headers: [String: String] = [:], limit: Int = 4096) -> HTTPResponse {
            do {
                return try StaticFiles(root: root, maximumFileBytes: limit).response(path: path, headers: headers)
            } catch let error as ServiceError {
                return error.response
            } catch {
                return HTTPResponse(status: 599, body: Array("\(error)".utf8))
            }
        }
    }

    static func code(_ response: HTTPResponse) -> String? {
        (try? JSON.parse(response.body))?["serverErrorCode"]?.stringValue
    }

    @Test func eachTypeIsServedWithItsContentTypeAndTheSecurityAndCacheHeaders() throws {
        let fixture = try Fixture()
        let expected = [
            "index.html": "text/html; charset=utf-8", "app.js": "text/javascript; charset=utf-8",
            "module.mjs": "text/javascript; charset=utf-8", "site.css": "text/css; charset=utf-8",
            "logo.svg": "image/svg+xml", "icon.png": "image/png", "data.json": "application/json; charset=utf-8",
            "favicon.ico": "image/vnd.microsoft.icon", "robots.txt": "text/plain; charset=utf-8",
            "site.webmanifest": "application/manifest+json", "UPPER.HTML": "text/html; charset=utf-8",
        ]
        for (name, type) in expected {
            let response = fixture.get(name)
            #expect(response.status == 200, "\(name)")
            #expect(response.header("Content-Type") == type, "\(name)")
            #expect(response.header("X-Content-Type-Options") == "nosniff", "\(name)")
            #expect(response.header("Cache-Control") == "no-cache", "\(name)")
            let onDisk = try Data(contentsOf: URL(fileURLWithPath: fixture.root + "/" + name))
            #expect(response.body == [UInt8](onDisk), "\(name)")
        }
        #expect(String(decoding: fixture.get("").body, as: UTF8.self) == "<!doctype html><title>home</title>")
        #expect(String(decoding: fixture.get("sub/").body, as: UTF8.self) == "sub home")
        #expect(String(decoding: fixture.get("sub/page.html").body, as: UTF8.self) == "sub page")
        // A symlink that stays inside the root is followed.
        #expect(String(decoding: fixture.get("alias.html").body, as: UTF8.self) == "sub page")
        // Percent-encoded names are decoded once.
        try fixture.write(fixture.root + "/two words.txt", "spaced")
        #expect(String(decoding: fixture.get("two%20words.txt").body, as: UTF8.self) == "spaced")
    }

    @Test func strongETagsAnswerIfNoneMatchWith304AndChangeWithTheFile() throws {
        let fixture = try Fixture()
        let first = fixture.get("app.js")
        let tag = try #require(first.header("ETag"))
        #expect(tag.hasPrefix("\"") && tag.hasSuffix("\"") && !tag.hasPrefix("W/"), "a strong entity tag: \(tag)")
        #expect(fixture.get("app.js").header("ETag") == tag, "the same file keeps its tag")
        #expect(fixture.get("site.css").header("ETag") != tag)
        for condition in [tag, "W/" + tag, "\"other\", " + tag, "*"] {
            let cached = fixture.get("app.js", headers: ["if-none-match": condition])
            #expect(cached.status == 304, "If-None-Match: \(condition)")
            #expect(cached.body.isEmpty && cached.header("ETag") == tag && cached.header("Cache-Control") == "no-cache")
            #expect(cached.header("X-Content-Type-Options") == "nosniff")
        }
        #expect(fixture.get("app.js", headers: ["if-none-match": "\"stale\""]).status == 200)
        // Rewritten (same size, new modification time): a new tag, and the old one no longer matches.
        Thread.sleep(forTimeInterval: 0.01)
        try fixture.write(fixture.root + "/app.js", "export const b = 2;\n")
        let changed = fixture.get("app.js", headers: ["if-none-match": tag])
        #expect(changed.status == 200 && changed.header("ETag") != tag)
        #expect(String(decoding: changed.body, as: UTF8.self) == "export const b = 2;\n")
    }

    /// Ways out of the root and malformed paths: BAD_REQUEST; what is outside, hidden, not a regular file,
    /// of an unserved type or over the size bound: NOT_FOUND, like a missing file. Nothing serves "secret".
    @Test func traversalAndEverythingNotServedIsRefused() throws {
        let fixture = try Fixture()
        let badRequests = ["../outside/secret.html", "%2e%2e/outside/secret.html", "%2E%2E%2Foutside%2Fsecret.html",
                           "sub/..%2f..%2foutside/secret.html", "sub/%2e%2e/../outside/secret.html", "./index.html",
                           "sub/./page.html", "index.html%00.txt", "sub%5cpage.html", "sub\\page.html", "sub//page.html",
                           "/index.html", "%zzindex.html", "index.html%", "%ff.html", "a\u{7}.html", "..", "%2e"]
        for path in badRequests {
            let response = fixture.get(path)
            #expect(response.status == 400 && Self.code(response) == "BAD_REQUEST", "\(path): \(response.status)")
        }
        let notFound = ["escape.html", "outlink/secret.html", ".hidden.html", "%2ehidden.html", "notes.md", "missing.html",
                        "sub", "folder.html", "pipe.txt", "big.txt", "index.html/", "sub/missing/", "noextension"]
        for path in notFound {
            let response = fixture.get(path)
            #expect(response.status == 404 && Self.code(response) == "NOT_FOUND", "\(path): \(response.status)")
            #expect(response.body != Array("secret".utf8), "\(path)")
        }
        #expect(fixture.get("big.txt", limit: 5000).status == 200, "the size bound is inclusive")
        #expect(throws: ServiceError.self) { try StaticFiles(root: fixture.base + "/none").response(path: "index.html", headers: [:]) }
    }

    @Test func theBinaryFindsItsWebFilesInstalledOrInItsPackage() throws {
        let base = temporaryDirectory("lattice-webroot")
        defer { try? FileManager.default.removeItem(atPath: base) }
        let manager = FileManager.default
        func touch(_ path: String) throws {
            try manager.createDirectory(atPath: (path as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
            #expect(manager.createFile(atPath: path, contents: Data()))
        }
        let real = StaticFiles.realPath(base)!
        // Installed: <prefix>/bin/lattice and <prefix>/share/lattice/web.
        try touch(base + "/usr/local/bin/lattice")
        #expect(StaticFiles.webRoot(executablePath: base + "/usr/local/bin/lattice") == nil)
        try manager.createDirectory(atPath: base + "/usr/local/share/lattice/web", withIntermediateDirectories: true)
        #expect(StaticFiles.webRoot(executablePath: base + "/usr/local/bin/lattice") == real + "/usr/local/share/lattice/web")
        // A build directory: the package's Web/, through the .build/debug symlink too.
        try touch(base + "/pkg/Package.swift")
        try touch(base + "/pkg/.build/x86_64-unknown-linux-gnu/debug/lattice")
        try manager.createSymbolicLink(atPath: base + "/pkg/.build/debug", withDestinationPath: "x86_64-unknown-linux-gnu/debug")
        #expect(StaticFiles.webRoot(executablePath: base + "/pkg/.build/debug/lattice") == nil, "no Web/ yet")
        try manager.createDirectory(atPath: base + "/pkg/Web", withIntermediateDirectories: true)
        #expect(StaticFiles.webRoot(executablePath: base + "/pkg/.build/debug/lattice") == real + "/pkg/Web")
        #expect(StaticFiles.webRoot(executablePath: base + "/pkg/.build/x86_64-unknown-linux-gnu/debug/lattice") == real + "/pkg/Web")
        // A symlink to the binary (say, ~/bin/lattice) resolves to where the binary really is.
        try manager.createDirectory(atPath: base + "/home/bin", withIntermediateDirectories: true)
        try manager.createSymbolicLink(atPath: base + "/home/bin/lattice", withDestinationPath: base + "/pkg/.build/debug/lattice")
        #expect(StaticFiles.webRoot(executablePath: base + "/home/bin/lattice") == real + "/pkg/Web")
        #expect(StaticFiles.currentExecutablePath != nil)
    }

    /// Through the real adapter on 127.0.0.1: HEAD sends the GET's headers (its Content-Length included) and
    /// no body, so the next answer on the same connection is intact; 304 has no body; `..` sent raw or
    /// encoded is refused; the query string is ignored.
    @Test func overARealSocket() throws {
        let fixture = try Fixture()
        let storage = try SQLiteStorage(path: fixture.base + "/" + SQLiteStorage.fileName)
        defer { storage.close() }
        var configuration = ServiceConfiguration()
        configuration.webRoot = fixture.root
        let service = try LatticeService(storage: storage, configuration: configuration, log: { _ in })
        let server = try HTTPServer(handler: service, configuration: HTTPServerConfiguration(port: 0))
        defer { server.shutdown() }
        let client = try RawHTTPClient(port: server.port)
        let head = try client.send(method: "HEAD", path: "/web/app.js")
        #expect(head.status == 200 && head.body.isEmpty)
        #expect(head.headers["content-length"] == "20" && head.headers["content-type"] == "text/javascript; charset=utf-8")
        let get = try client.send(method: "GET", path: "/web/app.js?v=1")
        #expect(get.status == 200 && String(decoding: get.body, as: UTF8.self) == "export const a = 1;\n")
        #expect(get.headers["etag"] == head.headers["etag"] && get.headers["x-content-type-options"] == "nosniff")
        let cached = try client.send(method: "GET", path: "/web/app.js", headers: ["If-None-Match": get.headers["etag"] ?? "-"])
        #expect(cached.status == 304 && cached.headers["etag"] == get.headers["etag"])
        for path in ["/web/../outside/secret.html", "/web/%2e%2e/outside/secret.html", "/web/sub/..%2F..%2Foutside/secret.html"] {
            let refused = try RawHTTPClient(port: server.port).send(method: "GET", path: path)
            #expect(refused.status == 400 || refused.status == 404, "\(path): \(refused.status)")
            #expect(!String(decoding: refused.body, as: UTF8.self).contains("secret\n") && refused.body != Array("secret".utf8))
        }
        #expect(try client.send(method: "POST", path: "/web/app.js").headers["allow"] == "GET, HEAD")
    }

    /// Hole 6: the security headers (Docs/Web.md, "Security headers") are on every answer, not only on pages
    /// and files found: a missing web file (404), a refused path (400), a wrong method (405), an unknown path,
    /// an answer from the route table's admission, JSON answers. On the old code only found files and share
    /// pages had them (`withPageHeaders` around those two handlers), so the 404 of a missing web file had
    /// no Content-Security-Policy, and this test fails there.
    static func expectSecurityHeaders(_ headers: [String: String], _ what: String,
                                      sourceLocation: SourceLocation = #_sourceLocation) {
        for (name, value) in LatticeService.securityHeaders {
            let found = headers[name.lowercased()]
            #expect(found == value, "\(what): \(name) is \(found ?? "missing")", sourceLocation: sourceLocation)
        }
    }

    static let answersThatMustCarryTheHeaders: [(method: String, path: String, status: Int)] = [
        ("GET", "/web/missing.js", 404),
        ("GET", "/web/notes.md", 404),
        ("GET", "/web/.hidden.html", 404),
        ("GET", "/web/%2e%2e/outside/secret.html", 400),
        ("POST", "/web/app.js", 405),
        ("GET", "/web/app.js", 200),
        ("GET", "/nope", 404),
        ("DELETE", "/nope", 404),
        ("POST", "/healthz", 405),
        ("GET", "/healthz", 200),
        ("GET", "/database/1/lattice/production/private/zones/list", 405),
        ("POST", "/database/1/lattice/production/private/records/explode", 404),
        ("POST", "/database/1/lattice/production/private/zones/list", 421),
        ("GET", "/share/not-a-token", 200),
    ]

    @Test func everyAnswerCarriesTheSecurityHeadersInProcess() throws {
        let fixture = try Fixture()
        let h = try ServiceHarness { $0.webRoot = fixture.root }
        for (method, path, status) in Self.answersThatMustCarryTheHeaders {
            let reply = h.raw(method, path)
            #expect(reply.status == status, "\(method) \(path)")
            Self.expectSecurityHeaders(Dictionary(reply.response.headers.map { ($0.name.lowercased(), $0.value) },
                                                  uniquingKeysWith: { first, _ in first }), "\(method) \(path)")
        }
        // A share page for a browser, valid or not.
        let page = h.raw("GET", "/share/not-a-token", headers: ["Accept": "text/html"])
        #expect(page.status == 404)
        Self.expectSecurityHeaders(Dictionary(page.response.headers.map { ($0.name.lowercased(), $0.value) },
                                              uniquingKeysWith: { first, _ in first }), "share page")
    }

    /// The same through the real adapter, which adds them to every answer it sends: the adapter's own
    /// refusals (a missing Host, an ambiguous framing) included, each header once.
    @Test func everyAnswerCarriesTheSecurityHeadersOverARealSocket() throws {
        let fixture = try Fixture()
        let h = try ServiceHarness { $0.webRoot = fixture.root }
        let server = try HTTPServer(handler: h.service, configuration: HTTPServerConfiguration(port: 0))
        defer { server.shutdown() }
        for (method, path, status) in Self.answersThatMustCarryTheHeaders {
            let reply = try RawHTTPClient(port: server.port).send(method: method, path: path)
            #expect(reply.status == status, "\(method) \(path)")
            Self.expectSecurityHeaders(reply.headers, "\(method) \(path)")
        }
        let etag = try RawHTTPClient(port: server.port).send(method: "GET", path: "/web/app.js").headers["etag"] ?? "-"
        let notModified = try RawHTTPClient(port: server.port).send(method: "GET", path: "/web/app.js",
                                                                    headers: ["If-None-Match": etag])
        #expect(notModified.status == 304)
        Self.expectSecurityHeaders(notModified.headers, "304")
        for (name, request) in [("no Host", "GET /healthz HTTP/1.1\r\n\r\n"),
                                ("ambiguous framing", "POST /auth/signup HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n"
                                    + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")] {
            let client = try RawHTTPClient(port: server.port, timeoutSeconds: 5)
            try client.write(Array(request.utf8))
            let reply = try client.readResponse()
            #expect(reply.status == 400, "\(name)")
            Self.expectSecurityHeaders(reply.headers, name)
        }
    }
}
