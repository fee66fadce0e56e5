import LatticeCore
import LatticeSync

// Test shorthands over `AccountClient`: a device's account operations go over the device's own transport
// (the engine's, with its online switch), as the engine's own calls do.
extension SyncEngine {
    /// An account client over this device's transport; for `serverURL` nil, the installed account's server.
    public func accountClient(_ serverURL: String? = nil) throws -> AccountClient {
        guard let url = serverURL ?? account?.serverURL else { throw SyncError.notSignedIn }
        return try AccountClient(serverURL: url, transport: transportOverride)
    }

    /// Creates an account on the server and installs it in this home.
    @discardableResult
    public func signUpAndSignIn(name: String, serverURL: String) throws -> Account {
        let account = try accountClient(serverURL).signUp(name: name)
        try signIn(account)
        return account
    }

    /// Checks `token` on the server and installs its account in this home.
    @discardableResult
    public func signIn(serverURL: String, token: String) throws -> Account {
        let account = try accountClient(serverURL).signIn(token: token)
        try signIn(account)
        return account
    }

    /// An online-only call (sharing, tokens) with this home's account.
    public func callServer(_ database: String, _ operation: String, _ body: JSON) throws -> JSON {
        guard let account else { throw SyncError.notSignedIn }
        return try accountClient().call(database, operation, body, as: account)
    }
}
