import Foundation
import LatticeCore

// Passkeys and recovery codes: `POST /auth/passkey/*`, `/auth/passkeys/*`, `/auth/recovery*`
// (LatticeOperations' Passkeys.swift has the rules, LatticeSharing's WebAuthn the checks).

/// A name a person gives a passkey: 1 to 64 characters without control characters, trimmed; nil when absent.
private func passkeyName(_ json: JSON?) throws(ServiceError) -> String? {
    guard let json else { return nil }
    guard let text = json.stringValue?.trimmingCharacters(in: .whitespaces), (1...64).contains(text.unicodeScalars.count),
          !text.unicodeScalars.contains(where: { $0.properties.generalCategory == .control }) else {
        throw ServiceError.badRequest("name must be 1 to 64 characters without control characters")
    }
    return text
}

/// Bytes sent as base64url (WebAuthn's `toJSON()` form), at most `limit` of them.
private func base64URL(_ json: JSON?, _ key: String, limit: Int = 16_384) throws(ServiceError) -> [UInt8] {
    guard let text = json?.stringValue, text.utf8.count <= limit * 4 / 3 + 4, let bytes = Base64URL.decode(text),
          !bytes.isEmpty, bytes.count <= limit else {
        throw ServiceError.badRequest("credential.\(key) must be base64url of 1 to \(limit) bytes")
    }
    return bytes
}

/// `POST /auth/passkey/signup/options {"name"}`: the user name a sign-up with a passkey will take.
public struct PasskeySignUpOptionsRequest: Sendable, Hashable {
    public var name: String

    public init(name: String) { self.name = name }

    public init(json: JSON) throws(ServiceError) {
        guard let name = json["name"]?.stringValue else { throw ServiceError.badRequest("expected {\"name\": \"...\"}") }
        self.name = name
    }
}

/// What a browser's `PublicKeyCredential.toJSON()` holds, as a finish request sends it under `credential`,
/// with an optional `name` for a new passkey.
public struct PasskeyCredentialRequest: Sendable, Hashable {
    public var credentialID: [UInt8]
    public var clientDataJSON: [UInt8]
    /// Registration only.
    public var attestationObject: [UInt8]?
    /// Sign-in only.
    public var authenticatorData: [UInt8]?
    public var signature: [UInt8]?
    public var userHandle: [UInt8]?
    public var name: String?

    public init(json: JSON, registration: Bool) throws(ServiceError) {
        guard let credential = json["credential"], credential.objectValue != nil else {
            throw ServiceError.badRequest("expected {\"credential\": {...}} as PublicKeyCredential.toJSON() gives it")
        }
        guard credential["type"]?.stringValue == "public-key" else { throw ServiceError.badRequest("credential.type must be public-key") }
        credentialID = try base64URL(credential["rawId"] ?? credential["id"], "rawId", limit: 1_023)
        let response = credential["response"]
        clientDataJSON = try base64URL(response?["clientDataJSON"], "response.clientDataJSON")
        if registration {
            attestationObject = try base64URL(response?["attestationObject"], "response.attestationObject")
        } else {
            authenticatorData = try base64URL(response?["authenticatorData"], "response.authenticatorData")
            signature = try base64URL(response?["signature"], "response.signature", limit: 1_024)
            if let handle = response?["userHandle"], handle != .null {
                userHandle = try base64URL(handle, "response.userHandle", limit: 64)
            }
        }
        name = try passkeyName(json["name"])
    }
}

/// `POST /auth/passkeys/rename {"passkeyID", "name"}` and `/auth/passkeys/delete {"passkeyID"}`.
public struct PasskeyChangeRequest: Sendable, Hashable {
    public var credentialID: [UInt8]
    public var name: String?

    public init(json: JSON, renaming: Bool) throws(ServiceError) {
        guard let text = json["passkeyID"]?.stringValue, let id = Base64URL.decode(text), !id.isEmpty, id.count <= 1_023 else {
            throw ServiceError.badRequest("passkeyID must be a passkey's id as passkeys/list gives it")
        }
        credentialID = id
        name = try passkeyName(json["name"])
        if renaming, name == nil { throw ServiceError.badRequest("expected {\"passkeyID\": \"...\", \"name\": \"...\"}") }
    }
}

/// `POST /auth/recovery {"code"}`: a one-time recovery code, in any case, dashes and spaces ignored.
public struct RecoverySignInRequest: Sendable, Hashable {
    public var code: String

    public init(json: JSON) throws(ServiceError) {
        guard let typed = json["code"]?.stringValue, typed.utf8.count <= 64, let code = RecoveryCode.normalized(typed) else {
            throw ServiceError.badRequest("code must be a recovery code: \(RecoveryCode.groups) groups of \(RecoveryCode.groupLength) letters and digits")
        }
        self.code = code
    }
}

/// A recovery code: 12 characters of `alphabet` (about 59 bits), shown as `ABCD-EFGH-JKMN`.
public enum RecoveryCode {
    /// Digits 2-9 and capitals without the look-alikes I, L, O and U: 30 characters.
    public static let alphabet = Array("23456789ABCDEFGHJKMNPQRSTVWXYZ")
    public static let groups = 3
    public static let groupLength = 4

    /// The normal form of a typed code (any case, dashes and spaces ignored), or nil when it cannot be one.
    public static func normalized(_ typed: String) -> String? {
        let characters = typed.uppercased().filter { $0 != "-" && $0 != " " }
        guard characters.count == groups * groupLength, characters.allSatisfy(alphabet.contains) else { return nil }
        return characters
    }

    /// `ABCDEFGHJKMN` as people read it: `ABCD-EFGH-JKMN`.
    public static func displayed(_ code: String) -> String {
        stride(from: 0, to: code.count, by: groupLength).map { start in
            String(code.dropFirst(start).prefix(groupLength))
        }.joined(separator: "-")
    }
}
