import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations

/// The values a path's `{name}` segments matched, by name.
typealias RouteParameters = [String: String]

/// A route's path: literal segments, `{name}` (exactly one segment, possibly empty) and, last only,
/// `{name...}` (the rest of the path: one segment or more, slashes included).
struct RoutePattern: Sendable, CustomStringConvertible {
    enum Segment: Sendable, Equatable {
        case literal(String)
        case parameter(String)
        case rest(String)
    }

    let segments: [Segment]

    /// - Parameter text: `/database/1/{container}/...`; a `{name...}` segment may only come last.
    init(_ text: String) {
        precondition(text.hasPrefix("/"), "a route pattern starts with /: \(text)")
        var segments: [Segment] = []
        for part in text.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            if part.hasPrefix("{") && part.hasSuffix("...}") {
                segments.append(.rest(String(part.dropFirst().dropLast(4))))
            } else if part.hasPrefix("{") && part.hasSuffix("}") {
                segments.append(.parameter(String(part.dropFirst().dropLast())))
            } else {
                segments.append(.literal(String(part)))
            }
        }
        precondition(segments.dropLast().allSatisfy { if case .rest = $0 { false } else { true } },
                     "only the last segment of \(text) may take the rest of the path")
        self.segments = segments
    }

    /// As Docs/openapi.json writes the path: `{name}` for both kinds of parameter.
    var description: String {
        "/" + segments.map { segment in
            switch segment {
            case .literal(let text): text
            case .parameter(let name), .rest(let name): "{\(name)}"
            }
        }.joined(separator: "/")
    }

    /// The parameters, if `components` (the path after its leading `/`, split at every `/`) match.
    func match(_ components: [Substring]) -> RouteParameters? {
        // The shape and the literals first: most routes fail there, before any parameter is copied.
        let takesRest = if case .rest? = segments.last { true } else { false }
        guard takesRest ? components.count >= segments.count : components.count == segments.count else { return nil }
        for (index, segment) in segments.enumerated() {
            if case .literal(let text) = segment, components[index] != text { return nil }
        }
        var parameters: RouteParameters = [:]
        for (index, segment) in segments.enumerated() {
            switch segment {
            case .literal: continue
            case .parameter(let name): parameters[name] = String(components[index])
            case .rest(let name): parameters[name] = components[index...].joined(separator: "/")
            }
        }
        return parameters
    }

    /// A request path split as `match` takes it, or nil if it does not start with `/`.
    static func components(of path: String) -> [Substring]? {
        guard path.hasPrefix("/") else { return nil }
        return path.dropFirst().split(separator: "/", omittingEmptySubsequences: false)
    }
}

/// Whether a database operation adds data, and so is refused over the server-wide disk budget.
enum DataGrowth: Sendable {
    /// Reads, deletions and share management.
    case never
    case always
    /// Adds data unless its `operations` are all of these `operationType`s.
    case unlessOnlyDeletes(Set<String>)

    func adds(_ body: [String: JSON]) -> Bool {
        switch self {
        case .never: return false
        case .always: return true
        case .unlessOnlyDeletes(let types):
            guard let operations = body["operations"]?.arrayValue, !operations.isEmpty else { return true }
            return !operations.allSatisfy { types.contains($0["operationType"]?.stringValue ?? "") }
        }
    }
}

/// One route of the service: what it matches, how it is admitted, authenticated and throttled, and what
/// answers it. `LatticeService.apiRoutes` is the table; dispatch, `admit`, the 405 answers and the route
/// list the OpenAPI test reads all come from it.
struct Route: Sendable {
    enum Authentication: Sendable {
        case none
        /// `Authorization: Bearer <token>`, checked from the head in `admit`, before the body is read.
        case bearer
        /// A bearer token, or a browser session cookie (`Sessions.swift`) with its CSRF value: checked in
        /// `admit` as `bearer` is. A session or sign-in link never works as a bearer token.
        case bearerOrSession
    }

    /// Where the handler runs.
    enum Lane: Sendable {
        /// On the HTTP thread once the body is in: no storage work, nothing that blocks.
        case inline
        /// On the worker pool, in the account's share for a bearer route, else the client address's.
        case pool
        /// The body streams to a sink as it arrives (`LatticeService.admitUpload`: an asset upload), then the
        /// handler runs on the worker pool in the client address's share.
        case stream
    }

    /// Which token bucket of the rate limiter (`ServiceConfiguration.rateLimit`) a request takes from.
    enum Throttle: Sendable {
        case none
        /// `ip:<address>`, taken when the request is dispatched.
        case perAddress
        /// `user:<id>`, taken in `admit` right after the token is checked (or at dispatch in-process).
        case perAccount
    }

    /// How the body is read.
    enum Body: Sendable {
        /// A JSON object, or empty.
        case json
        /// A binary `SyncMessage.Push` (`deltas/push`); its envelope stands in for the JSON fields.
        case deltaPush
        /// `records/modify`: read in one pass when every operation carries a CRDT state
        /// (`RecordStatesRequest`), else as a JSON object.
        case recordStates
    }

    enum Handler: Sendable {
        /// Answers from the request itself.
        case plain(@Sendable (LatticeService, HTTPRequest, RouteParameters) throws -> HTTPResponse)
        /// Answers for a signed-in caller, outside `/database/`: authenticated (and throttled) as the route's
        /// `authentication` and `throttle` say, in `admit` or at dispatch.
        case account(@Sendable (LatticeService, HTTPRequest, AuthenticatedCaller) throws -> HTTPResponse)
        /// A database operation: `/database/1/{container}/{environment}/{database}/...`, answered at once.
        case database(@Sendable (LatticeService, RequestContext) throws -> HTTPResponse)
        /// A database operation that answers later, from any thread (a long poll).
        case databaseLater(@Sendable (LatticeService, RequestContext, HTTPAbandonment, @escaping HTTPResponder) throws -> Void)
    }

    let method: String
    let pattern: RoutePattern
    let authentication: Authentication
    let lane: Lane
    let throttle: Throttle
    var body: Body = .json
    var growth: DataGrowth = .never
    /// The path holds a secret (a share token): the access log and error reasons show the pattern instead.
    var hidesPath = false
    /// Part of the JSON API: in `LatticeService.routes`, so in Docs/openapi.json and Docs/API.md.
    var documented = true
    /// Whether this server has the route (say, only with a web root configured).
    var isEnabled: @Sendable (ServiceConfiguration) -> Bool = { _ in true }
    let handler: Handler

    /// `METHOD /path/{parameter}`, as the OpenAPI document lists it.
    var signature: String { "\(method) \(pattern)" }

    /// A database route's operation (`records/modify`), else its pattern.
    var operationName: String {
        let text = pattern.description
        return text.hasPrefix(Self.databasePrefix) ? String(text.dropFirst(Self.databasePrefix.count)) : text
    }

    /// Methods this route answers: GET routes answer HEAD too.
    var methods: [String] { method == "GET" ? ["GET", "HEAD"] : [method] }

    /// A `POST /database/1/{container}/{environment}/{database}/{operation}` route: bearer token (or a
    /// browser session, unless `authentication` says bearer only), the account's share of the pool,
    /// throttled per account.
    static func database(_ operation: String, authentication: Authentication = .bearerOrSession, body: Body = .json,
                         growth: DataGrowth = .never,
                         _ handler: @escaping @Sendable (LatticeService, RequestContext) throws -> HTTPResponse) -> Route {
        Route(method: "POST", pattern: RoutePattern(databasePrefix + operation), authentication: authentication, lane: .pool,
              throttle: .perAccount, body: body, growth: growth, handler: .database(handler))
    }

    static let databasePrefix = "/database/1/{container}/{environment}/{database}/"
}

/// Where a request goes, from its method and path alone.
enum RouteResolution {
    case found(Route, RouteParameters)
    /// The path is a route's, the method is not: 405 with these methods in `Allow`.
    case methodNotAllowed(allowed: [String], route: Route)
    case notFound
}

extension Array where Element == Route {
    func resolve(method: String, path: String, configuration: ServiceConfiguration) -> RouteResolution {
        guard let components = RoutePattern.components(of: path) else { return .notFound }
        var allowed: [String] = []
        var matched: Route?
        for route in self where route.isEnabled(configuration) {
            guard let parameters = route.pattern.match(components) else { continue }
            if route.methods.contains(method) { return .found(route, parameters) }
            allowed.append(contentsOf: route.methods.filter { !allowed.contains($0) })
            matched = matched ?? route
        }
        guard let matched else { return .notFound }
        return .methodNotAllowed(allowed: allowed, route: matched)
    }
}

extension LatticeService {
    /// The route table. Order matters only where two patterns could match one path (none do today).
    static let apiRoutes: [Route] = [
        Route(method: "GET", pattern: RoutePattern("/healthz"), authentication: .none, lane: .inline, throttle: .none,
              handler: .plain { service, _, _ in service.healthResponse() }),
        Route(method: "POST", pattern: RoutePattern("/auth/signup"), authentication: .none, lane: .pool,
              throttle: .perAddress,
              handler: .plain { service, request, _ in
                  let body = try service.parseBody(request)
                  if SignUpRequest.asksForSession(.object(body)) { return try service.signUpWithSession(request, body) }
                  return .json(try Accounts(service.core).signUp(body, from: request.origin))
              }),
        // Browser sessions (Sessions.swift).
        Route(method: "GET", pattern: RoutePattern("/auth/session"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.currentSession(request) }
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/signout"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.signOut(request) }
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/link"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.exchangeSignInLink(request) }
              }),
        // Signing a second device in with a short user code (LatticeOperations' Devices.swift).
        Route(method: "POST", pattern: RoutePattern("/auth/device/start"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  .json(try Devices(service.core).startDeviceAuthorization(try service.parseBody(request), from: request.origin))
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/device/token"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  // An unknown or expired device code counts as a failed sign-in (EXPIRED_TOKEN).
                  try service.countingFailedSignIns(from: request.remoteAddress, [.expiredToken]) {
                      .json(try Devices(service.core).pollDeviceAuthorization(try service.parseBody(request)))
                  }
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/device/approve"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, request, caller in
                  .json(try Devices(service.core).decideDeviceAuthorization(try service.parseBody(request), user: caller.user,
                                                                            from: request.origin))
              }),
        // Passkeys and recovery codes (PasskeySessions.swift, LatticeOperations' Passkeys.swift). The finishing
        // routes count a refusal as a failed sign-in of the address.
        Route(method: "POST", pattern: RoutePattern("/auth/passkey/signup/options"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in try service.passkeySignUpOptions(request) }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkey/signup"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.passkeySignUp(request) }
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkey/signin/options"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in try service.passkeySignInOptions(request) }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkey/signin"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.passkeySignIn(request) }
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkey/register/options"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, request, caller in
                  .json(try Passkeys(service.core).registrationOptions(user: caller.user, from: request.origin))
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkey/register"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, request, caller in
                  .json(try Passkeys(service.core).finishRegistration(try service.parseBody(request), user: caller.user))
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkeys/list"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, _, caller in .json(try Passkeys(service.core).list(user: caller.user)) }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkeys/rename"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, request, caller in
                  .json(try Passkeys(service.core).rename(try service.parseBody(request), user: caller.user))
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/passkeys/delete"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, request, caller in
                  .json(try Passkeys(service.core).delete(try service.parseBody(request), user: caller.user))
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/recovery/codes"), authentication: .bearerOrSession, lane: .pool,
              throttle: .perAccount, handler: .account { service, _, caller in
                  .json(try Passkeys(service.core).newRecoveryCodes(user: caller.user))
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/recovery"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.recoverySignIn(request) }
              }),
        // Sign-in through OpenID Connect providers (OIDCSessions.swift, LatticeOperations' OpenIDConnect.swift).
        Route(method: "GET", pattern: RoutePattern("/auth/oidc/providers"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, _, _ in service.oidcProviders() }),
        Route(method: "GET", pattern: RoutePattern("/auth/oidc/start"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in try service.oidcStart(request) }),
        Route(method: "GET", pattern: RoutePattern("/auth/oidc/callback"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) { try service.oidcCallback(request) }
              }),
        Route(method: "POST", pattern: RoutePattern("/auth/oidc/token"), authentication: .none, lane: .pool,
              throttle: .perAddress, handler: .plain { service, request, _ in
                  try service.countingFailedSignIns(from: request.remoteAddress) {
                      .json(try service.openIDConnect.exchange(try service.parseBody(request)))
                  }
              }),
        Route(method: "GET", pattern: RoutePattern("/.well-known/jwks.json"), authentication: .none, lane: .inline,
              throttle: .none, handler: .plain { service, _, _ in try service.jwksResponse() }),
        // JSON for API clients; an HTML page (WebPages.swift) for a browser (`Accept: text/html`).
        Route(method: "GET", pattern: RoutePattern("/share/{token...}"), authentication: .none, lane: .pool,
              throttle: .perAddress, hidesPath: true, handler: .plain { service, request, parameters in
                  try service.shareLink(request, token: parameters["token"] ?? "")
              }),
        // A short share link (WebPages.swift, LatticeOperations' ShortLinks.swift): a browser goes on to the share
        // page of the signed link it points at; an API client gets that link.
        Route(method: "GET", pattern: RoutePattern("/s/{code...}"), authentication: .none, lane: .pool,
              throttle: .perAddress, hidesPath: true, handler: .plain { service, request, parameters in
                  try service.shortLink(request, code: parameters["code"] ?? "")
              }),

        .database("users/current") { _, context in
            .json(CurrentUserResponse(userRecordName: context.user.recordName, name: context.user.name).json)
        },
        .database("zones/list") { service, context in .json(try service.zones.listZones(context.caller)) },
        .database("zones/lookup") { service, context in .json(try service.zones.lookupZones(context.caller, context.body)) },
        .database("zones/modify", growth: .unlessOnlyDeletes(["delete"])) { service, context in
            try service.idempotent(context) { try service.zones.modifyZones(context.caller, context.body, $0, &$1) }
        },
        .database("records/modify", body: .recordStates, growth: .unlessOnlyDeletes(["delete", "forceDelete"])) { service, context in
            if let states = context.states {
                let replay = try states.clientOperationID.flatMap { id in
                    try ReplayKey.of(["clientOperationID": id], operation: context.path, bytes: context.rawBody)
                }
                return .answer(try Records(service.core).modify(context.caller, states, replay: replay))
            }
            return .answer(try Records(service.core).modify(context.caller, context.body, replay: try service.replayKey(context)))
        },
        .database("records/lookup") { service, context in .json(try Records(service.core).lookup(context.caller, context.body)) },
        .database("records/query") { service, context in .json(try Records(service.core).query(context.caller, context.body)) },
        .database("changes/database") { service, context in .json(try Feeds(service.core).databaseChanges(context.caller, context.body)) },
        .database("changes/zone") { service, context in .json(try Feeds(service.core).zoneChanges(context.caller, context.body)) },
        Route(method: "POST", pattern: RoutePattern(Route.databasePrefix + "changes/wait"), authentication: .bearerOrSession,
              lane: .pool, throttle: .perAccount,
              handler: .databaseLater { service, context, abandonment, respond in
                  try service.waitForChanges(context, abandonment: abandonment, respond: respond)
              }),
        .database("shares/create", growth: .always) { service, context in
            try service.idempotent(context) { try service.shares.createShare(context.caller, context.body, $0, &$1) }
        },
        .database("shares/lookup") { service, context in .json(try service.shares.lookupShare(context.caller, context.body)) },
        .database("shares/modify") { service, context in
            try service.idempotent(context) { try service.shares.modifyShare(context.caller, context.body, $0, &$1) }
        },
        .database("shares/url") { service, context in
            .json(try service.write(deadline: context.deadline) { tx, touched in
                try service.shares.shareURL(context.caller, context.body, tx, &touched)
            })
        },
        .database("shares/leave") { service, context in
            try service.idempotent(context) { try service.shares.leaveShare(context.caller, context.body, $0, &$1) }
        },
        .database("shares/invitations") { service, context in .json(try service.shares.invitations(context.caller, context.body)) },
        .database("shares/decline") { service, context in
            try service.idempotent(context) { try service.shares.declineInvitation(context.caller, context.body, $0, &$1) }
        },
        .database("shares/delete") { service, context in
            try service.idempotent(context) { try service.shares.deleteShare(context.caller, context.body, $0, &$1) }
        },
        .database("records/resolve") { service, context in
            .json(try service.shares.resolveShares(context.caller, context.body))
        },
        .database("records/accept", growth: .always) { service, context in
            .json(try service.write(deadline: context.deadline) { tx, touched in
                try service.shares.acceptShares(context.caller, context.body, tx, &touched)
            })
        },
        .database("deltas/push", body: .deltaPush, growth: .always) { service, context in
            guard let push = context.push else { throw ServiceError.badRequest("deltas/push takes a binary delta push") }
            return .answer(try Deltas(service.core).push(context.caller, push, replay: try service.replayKey(context)))
        },
        .database("deltas/pull") { service, context in
            HTTPResponse(status: 200, headers: [(name: "Content-Type", value: SyncMessage.contentType)],
                         body: try Deltas(service.core).pull(context.caller, context.body))
        },
        .database("subscriptions/modify", growth: .unlessOnlyDeletes(["delete"])) { service, context in
            .json(try Subscriptions(service.core).modify(context.caller, context.body))
        },
        .database("subscriptions/list") { service, context in .json(try Subscriptions(service.core).list(context.caller)) },
        .database("subscriptions/lookup") { service, context in
            .json(try Subscriptions(service.core).lookup(context.caller, context.body))
        },
        .database("subscriptions/deliveries") { service, context in
            .json(try Subscriptions(service.core).deliveries(context.caller, context.body))
        },
        .database("subscriptions/replay") { service, context in
            .json(try Subscriptions(service.core).replay(context.caller, context.body))
        },
        // A device's push stream (PushStreams.swift): the push token in the path is its credential.
        Route(method: "GET", pattern: RoutePattern("/push/{token}"), authentication: .none, lane: .pool,
              throttle: .perAddress, hidesPath: true, handler: .plain { service, request, parameters in
                  try service.openPushStream(request, token: parameters["token"] ?? "")
              }),
        .database("tokens/list") { service, context in .json(try Accounts(service.core).listTokens(context.caller)) },
        // CloudKit's tokens/create makes a push token ({"apnsEnvironment"}); a body without apnsEnvironment is the
        // bearer-token request tokens/issue now takes, still answered here (with a Deprecation header).
        .database("tokens/create") { service, context in
            if PushTokenRequest.isPushTokenRequest(.object(context.body)) {
                return .json(try Subscriptions(service.core).createPushToken(context.caller, context.body))
            }
            guard context.viaBearer else {
                throw ServiceError(.authenticationRequired, "tokens/create without apnsEnvironment makes a bearer token "
                                   + "(tokens/issue), which takes Authorization: Bearer")
            }
            var response = HTTPResponse.json(try Accounts(service.core).createToken(context.caller, context.body))
            response.headers.append((name: "Deprecation", value: "true"))
            response.headers.append((name: "Link", value: "<tokens/issue>; rel=\"successor-version\""))
            return response
        },
        .database("tokens/issue", authentication: .bearer) { service, context in
            .json(try Accounts(service.core).createToken(context.caller, context.body))
        },
        .database("tokens/register") { service, context in
            .json(try Subscriptions(service.core).registerPushToken(context.caller, context.body))
        },
        .database("tokens/signinLink", authentication: .bearer) { service, context in
            .json(try service.createSignInLink(context))
        },
        .database("tokens/revoke") { service, context in
            .json(try Accounts(service.core).revokeTokens(context.caller, context.body))
        },

    ] + assetRoutes + [
        // Experimental, not part of the JSON API: the web files under `ServiceConfiguration.webRoot`.
        Route(method: "GET", pattern: RoutePattern("/web/{path...}"), authentication: .none, lane: .pool,
              throttle: .perAddress, documented: false, isEnabled: { $0.webRoot != nil },
              handler: .plain { service, request, parameters in try service.webFile(parameters["path"] ?? "", request) }),
        // The web client for a signed-in browser, else its sign-in page (WebPages.swift).
        Route(method: "GET", pattern: RoutePattern("/"), authentication: .none, lane: .pool,
              throttle: .perAddress, documented: false, isEnabled: { $0.webRoot != nil },
              handler: .plain { service, request, _ in try service.webHome(request) }),
    ]

    /// Every route of the JSON API, as `METHOD /path/{parameter}`; Docs/openapi.json must list each.
    /// Derived from the route table (`apiRoutes`).
    public static var routes: [String] { apiRoutes.filter(\.documented).map(\.signature) }

    /// `GET /.well-known/jwks.json`: the share-link verification keys, cacheable for five minutes.
    func jwksResponse() throws -> HTTPResponse {
        guard let keyRing else { throw ServiceError(.notFound, "this server does not sign share links") }
        var response = HTTPResponse.json(keyRing.jwks())
        response.headers.removeAll { $0.name == "Cache-Control" }
        response.headers.append((name: "Cache-Control", value: "public, max-age=300"))
        return response
    }

    /// `GET /share/{token}`: what a share link is and how to open it.
    func shareLinkResponse() -> HTTPResponse {
        .json(.object([
            "message": .string("This is a Lattice share link. Open it with: lattice accept <this URL>"),
            "resolve": .string("POST /database/1/\(configuration.container)/{environment}/shared/records/resolve "
                               + "with {\"shortGUIDs\": [{\"value\": \"<this URL>\"}]} and a bearer token"),
            "jwks": .string("/.well-known/jwks.json"),
        ]))
    }
}
