import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations

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

extension ServiceError {
    /// The whole-request response: the code's status, the error's JSON, and `Retry-After` when it has one.
    var response: HTTPResponse {
        var response = HTTPResponse.json(json(), status: code.httpStatus)
        if let retryAfter { response.headers.append((name: "Retry-After", value: String(retryAfter))) }
        return response
    }
}

/// METHOD_NOT_ALLOWED with the methods the path answers: the one refusal whose answer carries a header
/// of its own (`Allow`), so it is an HTTP error of the server's, not a `ServiceError`.
struct MethodNotAllowed: Error {
    let error: ServiceError
    let allowed: [String]

    var response: HTTPResponse {
        var response = error.response
        response.headers.append((name: "Allow", value: allowed.joined(separator: ", ")))
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

    /// An operation's answer: its JSON bytes, and `Lattice-Replayed: true` when it replays an earlier one.
    static func answer(_ answer: Answer) -> HTTPResponse {
        var response = HTTPResponse.json(bytes: answer.body)
        if answer.replayed { response.headers.append((name: "Lattice-Replayed", value: "true")) }
        return response
    }
}
