import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore
import Synchronization

/// Dispatch from the route table (`Routes.swift`) and admission before the body: which handler answers,
/// whether a token is needed, where the work runs and which limiter it takes from.
extension LatticeService {
    // MARK: Routing

    /// Dispatch from the route table (`apiRoutes`, Routes.swift): the table says which handler answers,
    /// whether it needs a token, where it runs and which limiter it takes from.
    public func handle(_ request: HTTPRequest, respond plainly: @escaping HTTPResponder) {
        // Database answers and the web files go gzip-compressed to clients that accept it. Not the /auth/
        // answers and the pages made per request (sign-in, share pages), which hold secrets beside what a
        // request sends (BREACH).
        let respond: HTTPResponder
        var request = request
        if request.path.hasPrefix("/database/") || request.path.hasPrefix("/web/") {
            let accepting = request.headers["accept-encoding"]
            // A web file's compressed form has its own entity tag (`"…-gzip"`); the file's handler knows
            // only the plain one, so a revalidation of the compressed form asks it about that.
            if let condition = request.headers["if-none-match"] {
                request.headers["if-none-match"] = HTTPResponse.plainEntityTags(condition)
            }
            respond = { response in plainly(response.compressed(accepting: accepting)) }
        } else {
            respond = plainly
        }
        do {
            try route(request, respond: respond)
        } catch let error as ServiceError {
            respond(error.response)
        } catch let error as MethodNotAllowed {
            respond(error.response)
        } catch {
            respond(internalError(error).response)
        }
    }

    /// The route of a request, or the NOT_FOUND or METHOD_NOT_ALLOWED error it gets.
    func resolveRoute(method: String, path: String) throws -> (Route, RouteParameters) {
        switch Self.apiRoutes.resolve(method: method, path: path, configuration: configuration) {
        case .found(let route, let parameters):
            return (route, parameters)
        case .methodNotAllowed(let allowed, let route):
            let shown = route.hidesPath ? route.pattern.description : String(path.prefix(200))
            throw MethodNotAllowed(error: ServiceError(.methodNotAllowed, "\(shown) answers \(allowed.joined(separator: ", ")), "
                                                       + "not \(method.prefix(20))"), allowed: allowed)
        case .notFound:
            let parts = path.split(separator: "/", omittingEmptySubsequences: false)
            if parts.count >= 7, parts[0].isEmpty, parts[1] == "database", parts[2] == "1" {
                throw ServiceError(.notFound, "no such operation: \(parts[6...].joined(separator: "/").prefix(100))")
            }
            throw ServiceError(.notFound, "no such endpoint: \(method.prefix(20)) \(path.prefix(200))")
        }
    }

    func route(_ request: HTTPRequest, respond: @escaping HTTPResponder) throws {
        if shuttingDown.load(ordering: .sequentiallyConsistent) {
            throw ServiceError(.tryAgainLater, "the server is shutting down")
        }
        let (route, parameters) = try resolveRoute(method: request.method, path: request.path)
        let perform: @Sendable (LatticeService, RequestContext, HTTPAbandonment, @escaping HTTPResponder) throws -> Void
        switch route.handler {
        case .plain(let answer):
            if route.throttle == .perAddress { try throttle(key: "ip:" + request.addressLimitKey) }
            return respond(try answer(self, request, parameters))
        case .account(let answer):
            let caller: AuthenticatedCaller
            if let admitted = request.principal as? AuthenticatedCaller {
                caller = admitted
            } else {
                let (user, tokenID) = try authenticate(request.head, allowSession: route.authentication == .bearerOrSession)
                if route.throttle == .perAccount { try throttle(key: "user:\(user.id)") }
                caller = AuthenticatedCaller(user: user, tokenID: tokenID)
            }
            return respond(try answer(self, request, caller))
        case .database(let answer):
            perform = { service, context, _, respond in respond(try answer(service, context)) }
        case .databaseLater(let answer):
            perform = answer
        }
        let (kind, environment) = try databaseTarget(parameters)
        // The request's work ends at its deadline (storage is interrupted, CPU loops check it); a parked
        // long poll is not working, and its reads before and after parking take fresh ones.
        let deadline = RequestDeadline.after(milliseconds: configuration.requestDeadlineMilliseconds)
        // Admitted from the headers (`admit`): authenticated and throttled there already.
        let user: UserAccount, tokenID: String
        if let admitted = request.principal as? AuthenticatedCaller {
            (user, tokenID) = (admitted.user, admitted.tokenID)
        } else {
            (user, tokenID) = try authenticate(request.head, deadline: deadline,
                                               allowSession: route.authentication == .bearerOrSession)
            if route.throttle == .perAccount { try throttle(key: "user:\(user.id)") }
        }
        // deltas/push has a binary body: its envelope carries what a JSON body would (clientOperationID, atomic).
        var push: SyncMessage.Push? = nil
        var states: RecordStatesRequest? = nil
        var body: [String: JSON]
        switch route.body {
        case .deltaPush:
            let envelope = try Self.pushEnvelope(request)
            body = ["atomic": .bool(envelope.atomic)]
            if let id = envelope.clientOperationID { body["clientOperationID"] = .string(id) }
            push = envelope
        case .recordStates:
            // CRDT states (what a syncing client sends) are read in one pass; any other body as JSON.
            if configuration.readsRecordStatesInOnePass {
                let caps = RecordStateCaps(maximumFields: configuration.maximumFieldsPerRecord,
                                           maximumListElements: configuration.maximumListElements)
                states = RecordStatesRequest.read(request.body, maximumOperations: configuration.maximumOperations, caps: caps)
            }
            body = states == nil ? try parseBody(request) : [:]
        case .json:
            body = try parseBody(request)
        }
        let context = RequestContext(user: user, kind: kind, environment: environment, body: body,
                                     rawBody: request.body, path: request.path, push: push, states: states,
                                     deadline: deadline, tokenID: tokenID,
                                     viaBearer: request.header("authorization") != nil)
        // States never delete: they always add data.
        if states != nil || route.growth.adds(body) { try checkDiskBudget(route.operationName) }
        try perform(self, context, request.abandonment, respond)
    }

    /// The database a `/database/1/{container}/{environment}/{database}/...` route names, checked in that
    /// order.
    func databaseTarget(_ parameters: RouteParameters) throws -> (DatabaseKind, String) {
        let container = parameters["container"] ?? "", environment = parameters["environment"] ?? ""
        guard container == configuration.container else {
            throw ServiceError(.notFound, "unknown container \(container.prefix(100)); this server serves \(configuration.container)")
        }
        guard environment == "development" || environment == "production" else {
            throw ServiceError.badRequest("environment must be development or production")
        }
        guard let kind = DatabaseKind(rawValue: parameters["database"] ?? "") else {
            throw ServiceError.badRequest("database must be private, public or shared")
        }
        return (kind, environment)
    }

    // MARK: Admission (before the body)

    /// From the headers alone, as the route table says: an unknown `/database/` path or a wrong method is
    /// answered at once; inline routes run on the HTTP thread; a bearer route has its database checked and
    /// its token authenticated and throttled before its body is read (a bad or missing token gets its
    /// 401/421 without the body being buffered), then runs on the worker pool in its account's share; other
    /// pool routes (sign-up, and unknown paths outside /database/, which `route` answers 404) in their
    /// address's share.
    /// The deadline of the token lookup `admit` runs on the HTTP thread, in milliseconds.
    static let admissionDeadlineMilliseconds: Int64 = 2_000

    public func admit(_ head: HTTPRequestHead) -> HTTPAdmission {
        if shuttingDown.load(ordering: .sequentiallyConsistent) { return .inline }
        let addressShare = HTTPAdmission.pool(client: "ip:" + head.addressLimitKey, principal: nil)
        let route: Route, parameters: RouteParameters
        do {
            (route, parameters) = try resolveRoute(method: head.method, path: head.path)
        } catch let error as ServiceError where error.code == .notFound && !head.path.hasPrefix("/database/") {
            return addressShare
        } catch let error as MethodNotAllowed {
            return .answer(error.response)
        } catch {
            return .answer(internalError(error).response)
        }
        switch (route.lane, route.authentication) {
        case (.inline, _): return .inline
        case (.stream, _): return admitUpload(head, parameters, client: "ip:" + head.addressLimitKey)
        case (.pool, .none): return addressShare
        case (.pool, .bearer), (.pool, .bearerOrSession):
            do {
                if case .account = route.handler {} else { _ = try databaseTarget(parameters) }
                // On the HTTP thread: the token lookup gets a short deadline of its own, so a database that
                // stalls (PostgreSQL unreachable) holds an HTTP thread for at most that long.
                let deadline = RequestDeadline.after(milliseconds: min(Self.admissionDeadlineMilliseconds,
                                                                       configuration.requestDeadlineMilliseconds))
                let (user, tokenID) = try authenticate(head, deadline: deadline,
                                                       allowSession: route.authentication == .bearerOrSession)
                if route.throttle == .perAccount { try throttle(key: "user:\(user.id)") }
                return .pool(client: "user:\(user.id)", principal: AuthenticatedCaller(user: user, tokenID: tokenID))
            } catch {
                return .answer(internalError(error).response)
            }
        }
    }

    /// Paths that hold a secret (a share token in `/share/{token}`): the access log shows the route's
    /// pattern only.
    public func pathForLog(_ path: String) -> String {
        guard let components = RoutePattern.components(of: path) else { return path }
        for route in Self.apiRoutes where route.hidesPath && route.pattern.match(components) != nil {
            return route.pattern.description
        }
        return path
    }

    // MARK: Binary bodies

    /// The push envelope of a request, read before the body is treated as JSON.
    static func pushEnvelope(_ request: HTTPRequest) throws -> SyncMessage.Push {
        let type = request.header("content-type") ?? ""
        guard Self.isDeltaMediaType(type) else {
            throw ServiceError.badRequest("deltas/push takes Content-Type: \(SyncMessage.contentType)")
        }
        do {
            return try SyncMessage.Push(decoding: request.body)
        } catch {
            throw ServiceError.badRequest("the body is not a delta push: \(error.description)")
        }
    }

    /// `application/vnd.lattice.delta` with `version=1` (or no version, which means 1).
    static func isDeltaMediaType(_ value: String) -> Bool {
        // What Lattice's clients send, spelled as they spell it: no parse (this ran on every push, and
        // Foundation's trimming was 2 % of the server's CPU in a one-record-per-request run).
        if value == SyncMessage.contentType { return true }
        let parts = value.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces).lowercased() }
        guard parts.first == "application/vnd.lattice.delta" else { return false }
        return parts.dropFirst().allSatisfy { !$0.hasPrefix("version=") || $0 == "version=1" }
    }
}
