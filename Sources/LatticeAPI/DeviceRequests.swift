import Foundation
import LatticeCore

// Signing a second device in with a short user code: `POST /auth/device/start`, `/auth/device/token`,
// `/auth/device/approve` (LatticeOperations' Devices.swift has the flow).

/// A device user code: 8 letters of `alphabet`, shown as `BCDF-GHJK`.
public enum DeviceUserCode {
    /// 20 consonants, no vowels (no words) and none of the look-alikes: RFC 8628, section 6.1.
    public static let alphabet = Array("BCDFGHJKLMNPQRSTVWXZ")
    public static let length = 8

    /// The normal form of a typed code (any case, dashes and spaces ignored), or nil when it cannot be one.
    public static func normalized(_ typed: String) -> String? {
        let letters = typed.uppercased().filter { $0 != "-" && $0 != " " }
        guard letters.count == length, letters.allSatisfy(alphabet.contains) else { return nil }
        return letters
    }

    /// `BCDFGHJK` as people read it: `BCDF-GHJK`.
    public static func displayed(_ code: String) -> String {
        String(code.prefix(length / 2)) + "-" + String(code.dropFirst(length / 2))
    }
}

/// A device's name as a request gives it: 1 to 64 characters (Unicode scalars, as JSON Schema counts them),
/// none a control character; spaces at either end dropped. Nil when `json` is nil.
/// - Throws: `deviceName must be 1 to 64 characters without control characters`.
private func deviceName(_ json: JSON?) throws(ServiceError) -> String? {
    guard let json else { return nil }
    guard let text = json.stringValue?.trimmingCharacters(in: .whitespaces), (1...64).contains(text.unicodeScalars.count),
          !text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
        throw ServiceError.badRequest("deviceName must be 1 to 64 characters without control characters")
    }
    return text
}

/// `POST /auth/device/start {"deviceName"?}` (no token): a new device asks for a code pair.
public struct DeviceStartRequest: Sendable, Hashable {
    /// Trimmed; nil means the server's default (`device`).
    public var deviceName: String?

    public init(deviceName: String? = nil) { self.deviceName = deviceName }

    public init(json: JSON) throws(ServiceError) {
        deviceName = try LatticeAPI.deviceName(json["deviceName"])
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("deviceName", deviceName)
        return writer.json
    }
}

/// The answer to `POST /auth/device/start`: the secret device code to poll with, the user code to show,
/// how long they work and how often to poll.
public struct DeviceStartResponse: Sendable, Hashable {
    public var deviceCode: String
    /// As shown: `BCDF-GHJK`.
    public var userCode: String
    public var verificationURI: String
    public var message: String
    public var expiresIn: Int64
    public var interval: Int64
    public var deviceName: String

    public init(deviceCode: String, userCode: String, verificationURI: String, message: String, expiresIn: Int64,
                interval: Int64, deviceName: String) {
        self.deviceCode = deviceCode
        self.userCode = userCode
        self.verificationURI = verificationURI
        self.message = message
        self.expiresIn = expiresIn
        self.interval = interval
        self.deviceName = deviceName
    }

    public init?(json: JSON) {
        guard let deviceCode = json["deviceCode"]?.stringValue, let userCode = json["userCode"]?.stringValue else { return nil }
        self.init(deviceCode: deviceCode, userCode: userCode, verificationURI: json["verificationURI"]?.stringValue ?? "",
                  message: json["message"]?.stringValue ?? "", expiresIn: json["expiresIn"]?.intValue ?? 0,
                  interval: json["interval"]?.intValue ?? 0, deviceName: json["deviceName"]?.stringValue ?? "")
    }

    public var json: JSON {
        .object([
            "deviceCode": .string(deviceCode), "userCode": .string(userCode), "verificationURI": .string(verificationURI),
            "message": .string(message), "expiresIn": .int(expiresIn), "interval": .int(interval),
            "deviceName": .string(deviceName),
        ])
    }
}

/// `POST /auth/device/token {"deviceCode"}` (no token): the new device's poll. Whether the code is shaped
/// like one is the server's to judge (an unknown code and a malformed one get the same answer).
public struct DeviceTokenRequest: Sendable, Hashable {
    public var deviceCode: String

    public init(deviceCode: String) { self.deviceCode = deviceCode }

    public init(json: JSON) throws(ServiceError) {
        guard let code = json["deviceCode"]?.stringValue else {
            throw ServiceError.badRequest("expected {\"deviceCode\": \"ld_...\"} from POST /auth/device/start")
        }
        deviceCode = code
    }

    public var json: JSON { .object(["deviceCode": .string(deviceCode)]) }
}

/// The approved device's token (once), with the account it belongs to.
public struct DeviceTokenResponse: Sendable, Hashable {
    public var info: TokenInfo
    public var token: String
    /// The account's name.
    public var name: String
    public var userRecordName: String
    public var deviceName: String

    public init(info: TokenInfo, token: String, name: String, userRecordName: String, deviceName: String) {
        self.info = info
        self.token = token
        self.name = name
        self.userRecordName = userRecordName
        self.deviceName = deviceName
    }

    public init?(json: JSON) {
        guard let info = TokenInfo(json: json), let token = json["token"]?.stringValue,
              let record = json["userRecordName"]?.stringValue else { return nil }
        self.init(info: info, token: token, name: json["name"]?.stringValue ?? "", userRecordName: record,
                  deviceName: json["deviceName"]?.stringValue ?? "")
    }

    public var json: JSON {
        var object = info.members
        object["token"] = .string(token)
        object["name"] = .string(name)
        object["userRecordName"] = .string(userRecordName)
        object["deviceName"] = .string(deviceName)
        return .object(object)
    }
}

/// `POST /auth/device/approve {"userCode", "deviceName"?, "deny"?: true}` (signed in): approves, or denies,
/// the waiting device of a user code, optionally renaming it.
public struct DeviceApproveRequest: Sendable, Hashable {
    /// Normalized: 8 letters, no dash.
    public var userCode: String
    public var deny: Bool
    public var deviceName: String?

    /// `userCode` as typed; it is normalized when the request is encoded and decoded.
    public init(userCode: String, deny: Bool = false, deviceName: String? = nil) {
        self.userCode = DeviceUserCode.normalized(userCode) ?? userCode
        self.deny = deny
        self.deviceName = deviceName
    }

    /// The server's order: the code is there, it is a code, `deny`, then `deviceName`.
    public init(json: JSON) throws(ServiceError) {
        guard let typed = json["userCode"]?.stringValue else {
            throw ServiceError.badRequest("expected {\"userCode\": \"XXXX-XXXX\"}, the code the new device shows")
        }
        guard let code = DeviceUserCode.normalized(typed) else {
            throw ServiceError.badRequest("a user code is 8 letters (such as BCDF-GHJK) of BCDFGHJKLMNPQRSTVWXZ")
        }
        userCode = code
        switch json["deny"] {
        case nil: deny = false
        case .bool(let value)?: deny = value
        default: throw ServiceError.badRequest("deny must be true or false")
        }
        deviceName = try LatticeAPI.deviceName(json["deviceName"])
    }

    public var json: JSON {
        var writer = RequestWriter()
        writer.set("userCode", userCode)
        if deny { writer.set("deny", true) }
        writer.set("deviceName", deviceName)
        return writer.json
    }
}

/// The answer to `POST /auth/device/approve`.
public struct DeviceApproveResponse: Sendable, Hashable {
    /// As shown: `BCDF-GHJK`.
    public var userCode: String
    public var deviceName: String
    public var approved: Bool
    /// Until when the new device may collect its token.
    public var expiresMs: Int64

    public init(userCode: String, deviceName: String, approved: Bool, expiresMs: Int64) {
        self.userCode = userCode
        self.deviceName = deviceName
        self.approved = approved
        self.expiresMs = expiresMs
    }

    public init?(json: JSON) {
        guard let code = json["userCode"]?.stringValue, let approved = json["approved"]?.boolValue else { return nil }
        self.init(userCode: code, deviceName: json["deviceName"]?.stringValue ?? "", approved: approved,
                  expiresMs: json["expires"]?["timestamp"]?.intValue ?? 0)
    }

    public var json: JSON {
        .object(["userCode": .string(userCode), "deviceName": .string(deviceName), "approved": .bool(approved),
                 "expires": .object(["timestamp": .int(expiresMs)])])
    }
}
