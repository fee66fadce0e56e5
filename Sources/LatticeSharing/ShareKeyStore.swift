import Glibc

/// Where a `ShareKeyRing` keeps its keys. The ring owns the secrets and the format (the JSON of
/// `share-keys.json`); a store keeps those bytes as they are, plus a cheap version marker that changes
/// whenever they do, so that every ring over one store sees another's rotation from its next use.
///
/// Two stores exist: `FileShareKeyStore` (the data directory's `share-keys.json`, for SQLite) and one the
/// server provides over the database's metadata (for PostgreSQL, where every node shares one ring).
public protocol ShareKeyStore: Sendable {
    /// Where the keys are, for messages (a path, or a place in a database). Never a secret.
    var location: String { get }
    /// A marker that differs whenever the stored bytes differ. Called on every sign and verify, so it must
    /// be cheap (a `stat`, or one point read).
    func version() throws -> String
    /// The stored bytes and their version; nil when nothing is stored yet.
    func load() throws -> (contents: [UInt8], version: String)?
    /// Read-modify-write: replaces the stored bytes with `change(current)` (current nil when nothing is
    /// stored), atomically against every other writer of the store, and returns the new version. If
    /// `change` throws, nothing is written. `change` may be run more than once (a retried transaction).
    func update(_ change: ([UInt8]?) throws -> [UInt8]) throws -> String
}

/// `share-keys.json` in a data directory: written atomically (temporary file, fsync, rename, fsync of the
/// directory) with mode 0600; its version is the file's inode, size and modification time (a new file is
/// only ever renamed into place). One server owns the directory (its lock); `lattice admin` rotates
/// beside it, and the server sees the new file on its next request.
public struct FileShareKeyStore: ShareKeyStore {
    public let directory: String
    public let path: String

    public init(directory: String) {
        self.directory = directory
        path = directory.hasSuffix("/") ? directory + ShareKeyRing.fileName : directory + "/" + ShareKeyRing.fileName
    }

    public var location: String { path }

    public func version() throws -> String {
        guard let identity = KeyFile.identity(path: path) else { return "missing" }
        return "\(identity.inode):\(identity.size):\(identity.modifiedSeconds).\(identity.modifiedNanoseconds)"
    }

    public func load() throws -> (contents: [UInt8], version: String)? {
        guard let contents = try KeyFile.read(path: path) else { return nil }
        return (contents, try version())
    }

    public func update(_ change: ([UInt8]?) throws -> [UInt8]) throws -> String {
        let next = try change(try KeyFile.read(path: path))
        try KeyFile.write(next, directory: directory, path: path)
        return try version()
    }
}
