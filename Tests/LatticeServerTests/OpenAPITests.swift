import Foundation
import LatticeCore
@testable import LatticeServer
import Testing

/// Docs/openapi.json and Docs/API.md against the code: the documented routes are exactly the router's,
/// every operation documents its answers as JSON, and every error code is explained.
@Suite struct OpenAPITests {
    /// The package root: the nearest folder above this file that holds Package.swift.
    static let packageRoot: URL = {
        var folder = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
        while folder.path != "/" {
            if FileManager.default.fileExists(atPath: folder.appendingPathComponent("Package.swift").path) { return folder }
            folder = folder.deletingLastPathComponent()
        }
        return URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
    }()

    static let httpMethods = ["get", "put", "post", "delete", "options", "head", "patch", "trace"]

    private func openAPI() throws -> JSON {
        let url = Self.packageRoot.appendingPathComponent("Docs/openapi.json")
        return try JSON.parse([UInt8](try Data(contentsOf: url)))
    }

    private func apiGuide() throws -> String {
        try String(contentsOf: Self.packageRoot.appendingPathComponent("Docs/API.md"), encoding: .utf8)
    }

    /// `METHOD /path` for every operation in the document.
    private func documentedRoutes(_ document: JSON) throws -> Set<String> {
        let paths = try #require(document["paths"]?.objectValue)
        var routes = Set<String>()
        for (path, item) in paths {
            for method in Self.httpMethods where item[method] != nil {
                routes.insert(method.uppercased() + " " + path)
            }
        }
        return routes
    }

    /// Follows a local `$ref` such as `#/components/responses/Throttled`.
    private func resolve(_ value: JSON, in document: JSON) throws -> JSON {
        guard let reference = value["$ref"]?.stringValue else { return value }
        #expect(reference.hasPrefix("#/"), "only local references: \(reference)")
        var target = document
        for key in reference.dropFirst(2).split(separator: "/") {
            target = try #require(target[String(key)], "dangling reference \(reference)")
        }
        return try resolve(target, in: document)
    }

    @Test func everyRouteIsDocumentedAndEveryDocumentedRouteExists() throws {
        let documented = try documentedRoutes(try openAPI())
        let routed = Set(LatticeService.routes)
        #expect(routed.count == LatticeService.routes.count, "the router lists a route twice")
        let undocumented = routed.subtracting(documented).sorted()
        let unrouted = documented.subtracting(routed).sorted()
        #expect(undocumented.isEmpty, "routes missing from Docs/openapi.json: \(undocumented)")
        #expect(unrouted.isEmpty, "Docs/openapi.json documents routes the router does not have: \(unrouted)")
    }

    @Test func documentIsOpenAPI303WithBearerAuthAndPathParameters() throws {
        let document = try openAPI()
        #expect(document["openapi"]?.stringValue == "3.0.3")
        #expect(document["components"]?["securitySchemes"]?["bearerAuth"]?["scheme"]?.stringValue == "bearer")
        #expect(document["security"] == .array([.object(["bearerAuth": .array([])]), .object(["sessionCookie": .array([])])]))
        #expect(document["components"]?["securitySchemes"]?["sessionCookie"]?["in"]?.stringValue == "cookie")

        let paths = try #require(document["paths"]?.objectValue)
        for (path, item) in paths {
            let isDatabase = path.hasPrefix("/database/1/")
            for method in Self.httpMethods {
                guard let operation = item[method] else { continue }
                // As the route table says: database operations take a bearer token or a browser session (the
                // document's default), some a bearer token only; the others need no token (the session
                // routes document the cookie they read).
                let route = LatticeService.apiRoutes.first { $0.signature == method.uppercased() + " " + path }
                switch route?.authentication {
                case .bearerOrSession?:
                    #expect(operation["security"] == nil, "\(method) \(path) must use the default security")
                case .bearer?:
                    #expect(operation["security"] == .array([.object(["bearerAuth": .array([])])]), "\(method) \(path) is bearer only")
                case .none?, nil:
                    #expect(!isDatabase, "\(method) \(path)")
                    #expect(operation["security"] == .array([]) || operation["security"] == .array([.object(["sessionCookie": .array([])])]),
                            "\(method) \(path) needs no token")
                }
            }
            guard isDatabase else { continue }
            let parameters = try (item["parameters"]?.arrayValue ?? []).map { try resolve($0, in: document) }
            func parameter(_ name: String) -> JSON? { parameters.first { $0["name"]?.stringValue == name } }
            for name in ["container", "environment", "database"] {
                #expect(parameter(name)?["in"]?.stringValue == "path", "\(path): path parameter \(name)")
                #expect(parameter(name)?["required"] == .bool(true), "\(path): \(name) is required")
            }
            #expect(parameter("environment")?["schema"]?["enum"] == .array([.string("development"), .string("production")]))
            #expect(parameter("database")?["schema"]?["enum"] == .array([.string("private"), .string("public"),
                                                                         .string("shared")]))
        }
    }

    @Test func everyOperationDeclaresJSONSuccessAndErrorResponses() throws {
        let document = try openAPI()
        let errorStatuses = Set(ServerErrorCode.allCases.map(\.httpStatus))
        let paths = try #require(document["paths"]?.objectValue)
        var operations = 0
        for (path, item) in paths {
            for method in Self.httpMethods {
                guard let operation = item[method] else { continue }
                operations += 1
                let name = "\(method.uppercased()) \(path)"
                let responses = try #require(operation["responses"]?.objectValue, "\(name) has no responses")
                #expect(responses["200"] != nil, "\(name) declares no 200 response")
                var errors = 0
                for (status, declared) in responses {
                    let response = try resolve(declared, in: document)
                    // Errors are always JSON; a success is JSON or, on the binary sync path, a delta, or, on the
                    // push stream, server-sent events.
                    // Answers without a body: 204 (an upload's part kept), 304 (a download not modified) and every
                    // success of a HEAD (an upload's offset).
                    if status == "204" || status == "304" || (method == "head" && status == "200") {
                        #expect(response["content"] == nil, "\(name) \(status) has no body")
                        continue
                    }
                    // A download's bytes, of the asset's own (passive) type.
                    let isDownload = path == "/assets/download/{token}/{name}"
                    if isDownload && (status == "200" || status == "206") {
                        #expect(response["content"]?["*/*"] != nil, "\(name) \(status) is the asset's bytes, of any type")
                        continue
                    }
                    let schema = response["content"]?["application/json"]?["schema"]
                        ?? (status == "200" ? response["content"]?["application/vnd.lattice.delta"]?["schema"] : nil)
                        ?? (status == "200" && path == "/push/{token}" ? response["content"]?["text/event-stream"]?["schema"] : nil)
                    #expect(schema != nil, "\(name) \(status) is not application/json")
                    guard let code = Int(status), code >= 400 else { continue }
                    errors += 1
                    // 416: a download's range outside the asset (a BAD_REQUEST error body, with the status Range asks for).
                    #expect(errorStatuses.contains(code) || (isDownload && code == 416),
                            "\(name) declares \(status), which no error code uses")
                    #expect(schema?["$ref"]?.stringValue == "#/components/schemas/Error",
                            "\(name) \(status) must answer the Error schema")
                    if code == 429 || code == 503 {
                        #expect(response["headers"]?["Retry-After"] != nil, "\(name) \(status) carries Retry-After")
                    }
                }
                #expect(errors > 0, "\(name) declares no error responses")
            }
        }
        #expect(operations == LatticeService.routes.count)
    }

    @Test func errorCodesInTheDocumentMatchTheTaxonomy() throws {
        let document = try openAPI()
        let documented = try #require(document["components"]?["schemas"]?["ServerErrorCode"]?["enum"]?.arrayValue)
        #expect(Set(documented.compactMap(\.stringValue)) == Set(ServerErrorCode.allCases.map(\.rawValue)))
        #expect(documented.count == ServerErrorCode.allCases.count)
    }

    @Test func everyErrorCodeIsExplainedInTheGuideWithItsStatus() throws {
        let guide = try apiGuide()
        let lines = guide.split(separator: "\n").map(String.init)
        for code in ServerErrorCode.allCases {
            #expect(guide.contains(code.rawValue), "Docs/API.md never mentions \(code.rawValue)")
            // The taxonomy table has a row `| `CODE` | status | ...`.
            let row = lines.first { $0.hasPrefix("| `\(code.rawValue)` |") }
            #expect(row != nil, "Docs/API.md has no table row for \(code.rawValue)")
            if let row {
                let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
                #expect(cells.count > 1 && cells[1] == String(code.httpStatus),
                        "Docs/API.md gives \(code.rawValue) the wrong HTTP status: \(row)")
            }
        }
    }

    /// Each route has a section: `### GET /healthz`, `### POST /auth/signup`, `### records/modify`, ...
    @Test func everyRouteHasASectionInTheGuide() throws {
        let headings = Set(try apiGuide().split(separator: "\n").filter { $0.hasPrefix("### ") }.map { String($0.dropFirst(4)) })
        let prefix = "POST /database/1/{container}/{environment}/{database}/"
        for route in LatticeService.routes {
            let heading = route.hasPrefix(prefix) ? String(route.dropFirst(prefix.count)) : route
            #expect(headings.contains(heading), "Docs/API.md has no section ### \(heading)")
        }
    }
}
