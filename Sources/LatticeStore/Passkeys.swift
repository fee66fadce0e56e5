/// Passkeys (WebAuthn credentials), the ceremonies that make and use them, and one-time recovery codes:
/// the ways a person gets back into an account from a browser. The store keeps the facts; the checks of
/// a ceremony are LatticeSharing's (`WebAuthn`), the rules LatticeOperations' (`Passkeys`). Secrets are
/// stored only as SHA-256 hashes (a ceremony's challenge, a recovery code); a passkey's public key is
/// not secret.

/// A passkey to store.
public struct NewPasskey: Sendable, Hashable {
    public var credentialID: [UInt8]
    public var userID: Int64
    /// The COSE public key the authenticator sent at registration.
    public var publicKey: [UInt8]
    /// The COSE algorithm number (-7 ES256, -257 RS256).
    public var algorithm: Int64
    public var signCount: Int64
    /// The person's name for it ("Phone", "Laptop").
    public var name: String
    public var createdMs: Int64

    public init(credentialID: [UInt8], userID: Int64, publicKey: [UInt8], algorithm: Int64, signCount: Int64, name: String,
                createdMs: Int64) {
        self.credentialID = credentialID
        self.userID = userID
        self.publicKey = publicKey
        self.algorithm = algorithm
        self.signCount = signCount
        self.name = name
        self.createdMs = createdMs
    }
}

/// A stored passkey.
public struct StoredPasskey: Sendable, Hashable {
    public var passkey: NewPasskey
    /// When it last signed in, nil before its first sign-in.
    public var lastUsedMs: Int64?

    public init(passkey: NewPasskey, lastUsedMs: Int64?) {
        self.passkey = passkey
        self.lastUsedMs = lastUsedMs
    }
}

/// What a ceremony's challenge was issued for.
public enum PasskeyCeremonyPurpose: String, Sendable, Hashable, CaseIterable {
    /// A new account made with a passkey (the name it will have is in the ceremony).
    case signUp = "sign-up"
    /// Another passkey for a signed-in account.
    case register
    /// Signing in with any passkey of any account.
    case signIn = "sign-in"
}

/// A challenge issued for one ceremony: used once, before it expires.
public struct PasskeyCeremony: Sendable, Hashable {
    /// SHA-256 of the challenge.
    public var challengeHash: [UInt8]
    public var purpose: PasskeyCeremonyPurpose
    /// The signed-in account a registration is for; nil for sign-up and sign-in.
    public var userID: Int64?
    /// The client address it was issued to, for the per-address bound.
    public var address: String
    /// The user name a sign-up will take; nil otherwise.
    public var name: String?
    public var createdMs: Int64
    public var expiresMs: Int64

    public init(challengeHash: [UInt8], purpose: PasskeyCeremonyPurpose, userID: Int64?, address: String, name: String?,
                createdMs: Int64, expiresMs: Int64) {
        self.challengeHash = challengeHash
        self.purpose = purpose
        self.userID = userID
        self.address = address
        self.name = name
        self.createdMs = createdMs
        self.expiresMs = expiresMs
    }
}

/// Passkeys, their ceremonies and recovery codes (Passkeys.swift).
public protocol PasskeyStorage {
    /// - Throws: `StorageError.duplicate` when the credential id is taken (by any account).
    func insertPasskey(_ passkey: NewPasskey) throws
    func passkey(credentialID: [UInt8]) throws -> StoredPasskey?
    /// A user's passkeys, oldest first.
    func passkeys(userID: Int64) throws -> [StoredPasskey]
    /// Records a sign-in: the new counter and the time, in one conditional update that keeps the counter
    /// growing (it changes only when `signCount` is 0 or above the stored one); false when it did not.
    func recordPasskeySignIn(credentialID: [UInt8], signCount: Int64, nowMs: Int64) throws -> Bool
    /// Renames one of `userID`'s passkeys; false when they have none with this id.
    func renamePasskey(credentialID: [UInt8], userID: Int64, name: String) throws -> Bool
    /// Deletes one of `userID`'s passkeys; false when they have none with this id.
    func deletePasskey(credentialID: [UInt8], userID: Int64) throws -> Bool

    /// - Throws: `StorageError.duplicate` when the challenge's hash is taken.
    func insertPasskeyCeremony(_ ceremony: PasskeyCeremony) throws
    /// Deletes and returns the ceremony of this challenge if it is live at `nowMs`: of two uses exactly one
    /// gets it. Nil for an unknown, used or expired challenge.
    func takePasskeyCeremony(challengeHash: [UInt8], nowMs: Int64) throws -> PasskeyCeremony?
    /// How many ceremonies are live at `nowMs` from `address` (from every address when nil).
    func livePasskeyCeremonies(address: String?, nowMs: Int64) throws -> Int
    /// Deletes the ceremonies expired at `nowMs`; returns how many.
    func forgetPasskeyCeremonies(expiredAt nowMs: Int64) throws -> Int

    /// Replaces every recovery code of `userID` (used or not) by these hashes.
    func replaceRecoveryCodes(userID: Int64, hashes: [[UInt8]], nowMs: Int64) throws
    /// Marks the unused code of this hash used, in one conditional update, and returns its account; nil for
    /// an unknown or used code, so of two uses exactly one signs in.
    func useRecoveryCode(hash: [UInt8], nowMs: Int64) throws -> Int64?
    /// How many of `userID`'s recovery codes are unused.
    func unusedRecoveryCodes(userID: Int64) throws -> Int
}

extension StorageRowMapping {
    static var passkeyColumns: String { "credential_id, user_id, public_key, algorithm, sign_count, name, created_ms, last_used_ms" }

    func passkey(_ row: [Column]) -> StoredPasskey {
        StoredPasskey(passkey: NewPasskey(credentialID: row[0].bytes, userID: row[1].integer, publicKey: row[2].bytes,
                                          algorithm: row[3].integer, signCount: row[4].integer, name: row[5].text ?? "",
                                          createdMs: row[6].integer),
                      lastUsedMs: row[7].isNull ? nil : row[7].integer)
    }

    static var ceremonyColumns: String { "challenge_hash, purpose, user_id, address, name, created_ms, expires_ms" }

    func ceremony(_ row: [Column]) throws -> PasskeyCeremony {
        PasskeyCeremony(challengeHash: row[0].bytes,
                        purpose: try Self.parse(PasskeyCeremonyPurpose.self, row[1], table: "passkey_ceremonies",
                                                column: "purpose", row: "created_ms \(row[5].integer)"),
                        userID: row[2].isNull ? nil : row[2].integer, address: row[3].text ?? "", name: row[4].text,
                        createdMs: row[5].integer, expiresMs: row[6].integer)
    }
}

/// The tables, the same on both backends but for the types (`BLOB`/`BYTEA`, `INTEGER`/`BIGINT`).
enum PasskeyTables {
    static func migration(blob: String, integer: String) -> String {
        """
        CREATE TABLE passkeys(
            credential_id \(blob) PRIMARY KEY,
            user_id \(integer) NOT NULL,
            public_key \(blob) NOT NULL,
            algorithm \(integer) NOT NULL,
            sign_count \(integer) NOT NULL,
            name TEXT NOT NULL,
            created_ms \(integer) NOT NULL,
            last_used_ms \(integer));
        CREATE INDEX passkeys_user ON passkeys(user_id, created_ms);
        CREATE TABLE passkey_ceremonies(
            challenge_hash \(blob) PRIMARY KEY,
            purpose TEXT NOT NULL,
            user_id \(integer),
            address TEXT NOT NULL,
            name TEXT,
            created_ms \(integer) NOT NULL,
            expires_ms \(integer) NOT NULL);
        CREATE INDEX passkey_ceremonies_address ON passkey_ceremonies(address, expires_ms);
        CREATE INDEX passkey_ceremonies_expiry ON passkey_ceremonies(expires_ms);
        CREATE TABLE recovery_codes(
            code_hash \(blob) PRIMARY KEY,
            user_id \(integer) NOT NULL,
            created_ms \(integer) NOT NULL,
            used_ms \(integer));
        CREATE INDEX recovery_codes_user ON recovery_codes(user_id);
        """
    }
}
