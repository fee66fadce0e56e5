import LatticeCore
import LatticeSharing
import LatticeStore

/// A new account and the one copy of its bearer token.
public struct NewAccount: Sendable {
    public let user: UserAccount
    public let token: BearerToken
}

extension LatticeService {
    /// `POST /auth/signup {"name": ...}`.
    func signUp(_ body: [String: JSON]) throws -> HTTPResponse {
        guard configuration.registrationOpen else {
            throw APIError(.accessDenied, "registration is closed on this server; the administrator adds users "
                           + "with lattice admin add-user")
        }
        guard let name = body["name"]?.stringValue else { throw APIError.badRequest("expected {\"name\": \"...\"}") }
        let account = try createAccount(name: name)
        return .json(.object(["userRecordName": .string(account.user.recordName), "name": .string(account.user.name),
                              "token": .string(account.token.text)]))
    }

    /// Creates a user with a fresh token (for sign-up and `lattice admin add-user`).
    /// - Throws: `APIError` BAD_REQUEST for an illegal name, EXISTS for a taken one.
    public func createAccount(name: String) throws -> NewAccount {
        try Self.validateUserName(name)
        let token = try BearerToken.generate()
        let recordName = "_" + Secrets.hex(try Secrets.randomBytes(16))
        let now = configuration.now()
        do {
            let user = try storage.write { tx in
                let user = try tx.insertUser(name: name, recordName: recordName, nowMs: now)
                try tx.insertToken(hash: token.storedHash, userID: user.id, nowMs: now)
                return user
            }
            return NewAccount(user: user, token: token)
        } catch StorageError.duplicate {
            throw APIError(.exists, "the user name \(name) is taken")
        }
    }

    /// User names: 1 to 64 ASCII letters, digits, `.`, `_` or `-`, starting with a letter or digit.
    static func validateUserName(_ name: String) throws(APIError) {
        let bytes = Array(name.utf8)
        func isAlphanumeric(_ c: UInt8) -> Bool { (c | 0x20) >= 97 && (c | 0x20) <= 122 || (c >= 48 && c <= 57) }
        guard (1...64).contains(bytes.count), isAlphanumeric(bytes[0]),
              bytes.allSatisfy({ isAlphanumeric($0) || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "-") })
        else {
            throw APIError.badRequest("a user name is 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or digit")
        }
    }
}
