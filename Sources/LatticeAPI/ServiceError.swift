import Foundation
import LatticeCore

/// An error the service reports: a code of the taxonomy (LatticeCore's `ServerErrorCode`) and a human
/// reason, with what some codes carry: seconds to wait (THROTTLED, TRY_AGAIN_LATER), the server's record
/// (CONFLICT), and further members of the answer. Transport-free: no status, no headers; the HTTP layer
/// decides those (LatticeServer's `ServiceError.response`). It never carries SQL, stack traces or secrets:
/// internal failures are logged on the server and reported as INTERNAL_ERROR.
///
/// ```swift
/// throw ServiceError(.zoneNotFound, "zone \(name) does not exist")
/// ```
public struct ServiceError: Error, Sendable, CustomStringConvertible {
    public let code: ServerErrorCode
    public let reason: String
    /// Seconds to wait, for THROTTLED and TRY_AGAIN_LATER (1 when not given).
    public let retryAfter: Int?
    /// For CONFLICT: the server's current record.
    public let serverRecord: JSON?
    /// Further members of the error's JSON object (`POST /auth/link`'s CONFLICT names the two accounts).
    public let fields: [String: JSON]

    public init(_ code: ServerErrorCode, _ reason: String, retryAfter: Int? = nil, serverRecord: JSON? = nil,
                fields: [String: JSON] = [:]) {
        self.code = code
        self.reason = reason
        self.retryAfter = retryAfter ?? ((code == .throttled || code == .tryAgainLater) ? 1 : nil)
        self.serverRecord = serverRecord
        self.fields = fields
    }

    public var description: String { "\(code.rawValue): \(reason)" }

    public static func badRequest(_ reason: String) -> ServiceError { ServiceError(.badRequest, reason) }

    /// The error's JSON, as a whole-request body (with a fresh `uuid`) or, with `item`, as one item of a
    /// batch answer (`{"recordName": ..., "serverErrorCode": ..., "reason": ...}`).
    public func json(item: (key: String, value: String)? = nil) -> JSON {
        var object = fields
        object["serverErrorCode"] = .string(code.rawValue)
        object["reason"] = .string(reason)
        if let item { object[item.key] = .string(item.value) } else { object["uuid"] = .string(UUID().uuidString.lowercased()) }
        if let retryAfter { object["retryAfter"] = .int(Int64(retryAfter)) }
        if let serverRecord { object["serverRecord"] = serverRecord }
        return .object(object)
    }
}
