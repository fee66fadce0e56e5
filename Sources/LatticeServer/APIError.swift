import Foundation
import LatticeCore

/// The HTTP status of each code in the taxonomy (the codes themselves are LatticeCore's, shared with the
/// client).
extension ServerErrorCode {
    /// The HTTP status of a whole-request error with this code.
    public var httpStatus: Int {
        switch self {
        case .accessDenied, .permissionFailure: return 403
        case .alreadyShared, .tooManyParticipants: return 409
        case .atomicError, .badRequest: return 400
        case .authenticationFailed: return 401
        case .authenticationRequired: return 421
        case .conflict, .exists: return 409
        case .internalError: return 500
        case .limitExceeded, .quotaExceeded: return 413
        case .notFound, .zoneNotFound: return 404
        case .throttled: return 429
        case .tryAgainLater: return 503
        case .changeTokenExpired: return 410
        case .methodNotAllowed: return 405
        case .authorizationPending: return 400
        case .slowDown: return 429
        case .expiredToken: return 410
        case .notImplemented: return 501
        }
    }
}

/// An error the API reports: a code from the taxonomy and a human reason. It never carries SQL, stack
/// traces or secrets: internal failures are logged on the server and reported as INTERNAL_ERROR.
public struct APIError: Error, Sendable, CustomStringConvertible {
    public let code: ServerErrorCode
    public let reason: String
    /// Seconds to wait, for THROTTLED and TRY_AGAIN_LATER.
    public let retryAfter: Int?
    /// For CONFLICT: the server's current record.
    public let serverRecord: JSON?
    /// Further members of the error's JSON object (`POST /auth/link`'s CONFLICT names the two accounts).
    let fields: [String: JSON]
    /// Headers the whole-request response carries besides Content-Type, Cache-Control and Retry-After
    /// (`Allow` for METHOD_NOT_ALLOWED).
    let headers: [(name: String, value: String)]

    public init(_ code: ServerErrorCode, _ reason: String, retryAfter: Int? = nil, serverRecord: JSON? = nil) {
        self.init(code, reason, retryAfter: retryAfter, serverRecord: serverRecord, headers: [])
    }

    init(_ code: ServerErrorCode, _ reason: String, retryAfter: Int? = nil, serverRecord: JSON? = nil,
         headers: [(name: String, value: String)], fields: [String: JSON] = [:]) {
        self.code = code
        self.reason = reason
        self.retryAfter = retryAfter ?? ((code == .throttled || code == .tryAgainLater) ? 1 : nil)
        self.serverRecord = serverRecord
        self.headers = headers
        self.fields = fields
    }

    public var description: String { "\(code.rawValue): \(reason)" }

    static func badRequest(_ reason: String) -> APIError { APIError(.badRequest, reason) }

    /// The error's JSON, as a whole-request body or, with `itemKey`, as one item of a batch answer.
    func json(item: (key: String, value: String)? = nil) -> JSON {
        var object = fields
        object["serverErrorCode"] = .string(code.rawValue)
        object["reason"] = .string(reason)
        if let item { object[item.key] = .string(item.value) } else { object["uuid"] = .string(UUID().uuidString.lowercased()) }
        if let retryAfter { object["retryAfter"] = .int(Int64(retryAfter)) }
        if let serverRecord { object["serverRecord"] = serverRecord }
        return .object(object)
    }

    /// The whole-request response.
    var response: HTTPResponse {
        var response = HTTPResponse.json(json(), status: code.httpStatus)
        if let retryAfter { response.headers.append((name: "Retry-After", value: String(retryAfter))) }
        response.headers += headers
        return response
    }
}

extension HTTPResponse {
    /// A JSON response; the body is always JSON.
    static func json(_ value: JSON, status: Int = 200) -> HTTPResponse {
        json(bytes: value.serializedBytes(), status: status)
    }

    /// A JSON response whose body is already serialized (as `JSON.serializedBytes` writes it).
    static func json(bytes: [UInt8], status: Int = 200) -> HTTPResponse {
        HTTPResponse(status: status, headers: [(name: "Content-Type", value: "application/json; charset=utf-8"),
                                               (name: "Cache-Control", value: "no-store")],
                     body: bytes)
    }
}
