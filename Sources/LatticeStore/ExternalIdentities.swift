/// Accounts signed in through an OpenID Connect provider: one account per (issuer, subject), and the
/// browser sign-ins under way (the authorization-code flow's state, nonce and PKCE verifier, kept by the
/// hash of the state so any node finishes it). The checks are LatticeSharing's (`IDTokenVerifier`), the
/// rules LatticeOperations' (`OpenIDConnect`).

/// A browser's sign-in through a provider, between its start and its callback.
public struct OIDCLogin: Sendable, Hashable {
    /// SHA-256 of the `state` sent to the provider.
    public var stateHash: [UInt8]
    public var issuer: String
    public var nonce: String
    /// The PKCE code verifier (RFC 7636): sent only to the provider's token endpoint.
    public var verifier: String
    /// The same-origin path to go to afterwards.
    public var nextPath: String
    /// The signed-in account to link the identity to, nil to sign in (or up).
    public var linkUserID: Int64?
    public var address: String
    public var createdMs: Int64
    public var expiresMs: Int64

    public init(stateHash: [UInt8], issuer: String, nonce: String, verifier: String, nextPath: String, linkUserID: Int64?,
                address: String, createdMs: Int64, expiresMs: Int64) {
        self.stateHash = stateHash
        self.issuer = issuer
        self.nonce = nonce
        self.verifier = verifier
        self.nextPath = nextPath
        self.linkUserID = linkUserID
        self.address = address
        self.createdMs = createdMs
        self.expiresMs = expiresMs
    }
}

/// External identities and the sign-ins under way (ExternalIdentities.swift).
public protocol IdentityStorage {
    /// Links (issuer, subject) to `userID`. - Throws: `StorageError.duplicate` when it is linked already.
    func linkIdentity(issuer: String, subject: String, userID: Int64, nowMs: Int64) throws
    /// The account (issuer, subject) is linked to, and records the use; nil when it is linked to none.
    func useIdentity(issuer: String, subject: String, nowMs: Int64) throws -> Int64?
    /// How many identities `userID` has linked.
    func identities(userID: Int64) throws -> Int

    /// - Throws: `StorageError.duplicate` when the state's hash is taken.
    func insertOIDCLogin(_ login: OIDCLogin) throws
    /// Deletes and returns the sign-in of this state if it is live at `nowMs`: exactly one callback gets it.
    func takeOIDCLogin(stateHash: [UInt8], nowMs: Int64) throws -> OIDCLogin?
    /// How many sign-ins are live at `nowMs` from `address` (from every address when nil).
    func liveOIDCLogins(address: String?, nowMs: Int64) throws -> Int
    /// Deletes the sign-ins expired at `nowMs`; returns how many.
    func forgetOIDCLogins(expiredAt nowMs: Int64) throws -> Int
}

extension StorageRowMapping {
    static var oidcLoginColumns: String {
        "state_hash, issuer, nonce, verifier, next_path, link_user_id, address, created_ms, expires_ms"
    }

    func oidcLogin(_ row: [Column]) -> OIDCLogin {
        OIDCLogin(stateHash: row[0].bytes, issuer: row[1].text ?? "", nonce: row[2].text ?? "", verifier: row[3].text ?? "",
                  nextPath: row[4].text ?? "/", linkUserID: row[5].isNull ? nil : row[5].integer, address: row[6].text ?? "",
                  createdMs: row[7].integer, expiresMs: row[8].integer)
    }
}

enum IdentityTables {
    static func migration(blob: String, integer: String) -> String {
        """
        CREATE TABLE external_identities(
            issuer TEXT NOT NULL,
            subject TEXT NOT NULL,
            user_id \(integer) NOT NULL,
            created_ms \(integer) NOT NULL,
            last_used_ms \(integer) NOT NULL,
            PRIMARY KEY (issuer, subject));
        CREATE INDEX external_identities_user ON external_identities(user_id);
        CREATE TABLE oidc_logins(
            state_hash \(blob) PRIMARY KEY,
            issuer TEXT NOT NULL,
            nonce TEXT NOT NULL,
            verifier TEXT NOT NULL,
            next_path TEXT NOT NULL,
            link_user_id \(integer),
            address TEXT NOT NULL,
            created_ms \(integer) NOT NULL,
            expires_ms \(integer) NOT NULL);
        CREATE INDEX oidc_logins_address ON oidc_logins(address, expires_ms);
        CREATE INDEX oidc_logins_expiry ON oidc_logins(expires_ms);
        """
    }
}
