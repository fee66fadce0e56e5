import LatticeSharing
import LatticeStore

/// The share-link key ring kept in the storage's metadata, for deployments where several nodes share one
/// database (PostgreSQL): every node signs with the one active key, and a rotation made through any node
/// or `lattice admin --database` is used by every node from its next request.
///
/// Two metadata keys: `share_keys` holds the ring's JSON exactly as `share-keys.json` holds it (the ring
/// owns the format and the secrets; the store keeps the text), and `share_keys_version` a random marker
/// rewritten with every change. Each sign and verify reads the marker only (one point read on the
/// authentication lane) and loads the ring again when it moved. A deployment copied from SQLite has
/// `share_keys` without a marker: it reads as `unversioned` until the first rotation.
public struct DatabaseShareKeyStore: ShareKeyStore {
    public static let contentsKey = "share_keys"
    public static let versionKey = "share_keys_version"
    static let unversioned = "unversioned"

    let storage: any Storage
    /// How long one read of the marker may take before the ring keeps the keys it has.
    let readDeadlineMilliseconds: Int64

    public init(storage: any Storage, readDeadlineMilliseconds: Int64 = 2_000) {
        self.storage = storage
        self.readDeadlineMilliseconds = readDeadlineMilliseconds
    }

    public var location: String { "the database (metadata \(Self.contentsKey))" }

    public func version() throws -> String {
        try storage.read(deadline: .after(milliseconds: readDeadlineMilliseconds), lane: .authentication) { tx in
            try tx.metadata(Self.versionKey) ?? Self.unversioned
        }
    }

    public func load() throws -> (contents: [UInt8], version: String)? {
        try storage.read(deadline: .after(milliseconds: readDeadlineMilliseconds)) { tx in
            guard let text = try tx.metadata(Self.contentsKey) else { return nil }
            return (Array(text.utf8), try tx.metadata(Self.versionKey) ?? Self.unversioned)
        }
    }

    /// One write transaction: the marker is written first, so that a concurrent change (or a first start
    /// on another node) waits on its row lock and then reads this change's contents.
    public func update(_ change: ([UInt8]?) throws -> [UInt8]) throws -> String {
        try storage.write { tx in
            let version = Secrets.hex(try Secrets.randomBytes(8))
            try tx.setMetadata(Self.versionKey, version)
            let next = try change(try tx.metadata(Self.contentsKey).map { Array($0.utf8) })
            guard let text = String(validating: next, as: UTF8.self) else {
                throw StorageError.failure("the share key ring is not UTF-8 text")
            }
            try tx.setMetadata(Self.contentsKey, text)
            return version
        }
    }
}
