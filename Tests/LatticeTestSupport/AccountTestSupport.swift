import Foundation
import LatticeCore
import LatticeLists
import LatticeSync

/// A device's home in tests: the CLI's (`ListsReplica`) or the engine it used before (`SyncEngine`).
public protocol TestDeviceHome {
    var account: Account? { get }
    /// The transport the device's calls go over (with its online switch); nil: HTTP.
    var testTransport: (any SyncTransport)? { get }
    func signIn(_ account: Account) async throws
}

extension SyncEngine: TestDeviceHome {
    public var testTransport: (any SyncTransport)? { transportOverride }
}

extension ListsReplica: TestDeviceHome {
    public var testTransport: (any SyncTransport)? { transportOverride }
}

// Test shorthands over `AccountClient`: a device's account operations go over the device's own transport
// (the engine's, with its online switch), as the engine's own calls do.
extension TestDeviceHome {
    /// An account client over this device's transport; for `serverURL` nil, the installed account's server.
    public func accountClient(_ serverURL: String? = nil) throws -> AccountClient {
        guard let url = serverURL ?? account?.serverURL else { throw SyncError.notSignedIn }
        return try AccountClient(serverURL: url, transport: testTransport)
    }

    /// Creates an account on the server and installs it in this home.
    @discardableResult
    public func signUpAndSignIn(name: String, serverURL: String) async throws -> Account {
        let account = try await accountClient(serverURL).signUp(name: name)
        try await signIn(account)
        return account
    }

    /// Checks `token` on the server and installs its account in this home.
    @discardableResult
    public func signIn(serverURL: String, token: String) async throws -> Account {
        let account = try await accountClient(serverURL).signIn(token: token)
        try await signIn(account)
        return account
    }

    /// An online-only call (sharing, tokens) with this home's account.
    public func callServer(_ database: String, _ operation: String, _ body: JSON) async throws -> JSON {
        guard let account else { throw SyncError.notSignedIn }
        return try await accountClient().call(database, operation, body, as: account)
    }
}

