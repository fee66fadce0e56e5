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
    /// The code as an answer spelled it, when this side does not know it (`code` is then INTERNAL_ERROR).
    private let unknownCode: String?

    public init(_ code: ServerErrorCode, _ reason: String, retryAfter: Int? = nil, serverRecord: JSON? = nil,
                fields: [String: JSON] = [:]) {
        self.code = code
        self.reason = reason
        self.retryAfter = retryAfter ?? ((code == .throttled || code == .tryAgainLater) ? 1 : nil)
        self.serverRecord = serverRecord
        self.fields = fields
        unknownCode = nil
    }

    /// The code's text: `code.rawValue`, or the code as received when this side does not know it.
    public var codeName: String { unknownCode ?? code.rawValue }

    public var description: String { "\(codeName): \(reason)" }

    /// Members of an error object that are not `fields`.
    private static let knownMembers: Set<String> = ["serverErrorCode", "reason", "retryAfter", "serverRecord", "uuid"]

    /// Decodes an error object: a whole-request error or, with `itemKey`, one item of a batch answer (that
    /// member, such as `recordName`, is then left out of `fields`). A code this side does not know (a newer
    /// server's) is INTERNAL_ERROR, keeping its text in `codeName`; a missing reason is empty; a fractional
    /// `retryAfter` is rounded up. Nil when `json` is not an object with a string `serverErrorCode`.
    public init?(json: JSON, itemKey: String? = nil) {
        guard var object = json.objectValue, let text = object["serverErrorCode"]?.stringValue else { return nil }
        let known = ServerErrorCode(rawValue: text)
        code = known ?? .internalError
        unknownCode = known == nil ? text : nil
        reason = object["reason"]?.stringValue ?? ""
        let seconds = object["retryAfter"]?.doubleValue.flatMap { value in
            value.isFinite ? Int(min(max(value.rounded(.up), 0), Double(Int32.max))) : nil
        }
        retryAfter = seconds ?? ((code == .throttled || code == .tryAgainLater) ? 1 : nil)
        serverRecord = object["serverRecord"]
        for key in Self.knownMembers { object[key] = nil }
        if let itemKey { object[itemKey] = nil }
        fields = object
    }

    public static func badRequest(_ reason: String) -> ServiceError { ServiceError(.badRequest, reason) }

    /// The error's JSON, as a whole-request body (with a fresh `uuid`) or, with `item`, as one item of a
    /// batch answer (`{"recordName": ..., "serverErrorCode": ..., "reason": ...}`).
    public func json(item: (key: String, value: String)? = nil) -> JSON {
        var object = fields
        object["serverErrorCode"] = .string(codeName)
        object["reason"] = .string(reason)
        if let item { object[item.key] = .string(item.value) } else { object["uuid"] = .string(UUID().uuidString.lowercased()) }
        if let retryAfter { object["retryAfter"] = .int(Int64(retryAfter)) }
        if let serverRecord { object["serverRecord"] = serverRecord }
        return .object(object)
    }
}
