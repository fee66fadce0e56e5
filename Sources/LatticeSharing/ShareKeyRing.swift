import Glibc
import LatticeCore
import Synchronization

/// The server's share-link signing keys: one active key that signs, older keys that still verify until
/// retired, persisted in a `ShareKeyStore`: `share-keys.json` (mode 0600) in the data directory on SQLite,
/// the database's metadata on PostgreSQL (every node shares one ring).
///
/// Key IDs are RFC 7638 thumbprints of the public keys. Only the active key's private seed is kept, in the
/// store and in memory: a key that no longer signs needs only its public half to verify.
///
/// Every sign and verify first asks the store for its version (cheap) and loads the keys again when it
/// changed, so a rotation or retirement made by another process (`lattice admin`, another node) takes
/// effect from the next use. Rotation and retirement are read-modify-writes of the store, so two
/// processes changing the ring at once never lose each other's change.
///
/// ```swift
/// let ring = try ShareKeyRing.open(directory: dataDirectory, nowMilliseconds: now)
/// let token = try ring.sign(claims)                           // {public-url}/share/{token}
/// let claims = try ring.verify(token, nowSeconds: now / 1000)  // throws ShareTokenError.invalid
/// ```
public final class ShareKeyRing: Sendable {
    public static let fileName = "share-keys.json"

    /// Where the keys are kept (the key file's path for a data directory).
    public let path: String
    private let store: any ShareKeyStore
    private let state: Mutex<State>

    private struct Entry {
        var keyID: String
        var createdMilliseconds: Int64
        var key: Ed25519Key
        var retired: Bool
    }

    private struct State {
        var entries: [Entry]
        var activeKeyID: String
        /// The store's version this state was read from or written as, so a change made by another
        /// process is noticed and loaded.
        var version: String? = nil

        var active: Entry { entries.first { $0.keyID == activeKeyID }! }
    }

    private init(store: any ShareKeyStore, state: State) {
        self.store = store
        self.path = store.location
        self.state = Mutex(state)
    }

    /// Loads `directory/share-keys.json`, creating it with one fresh key on first start.
    ///
    /// The file is written atomically (temporary file, fsync, rename, fsync of the directory) with mode 0600.
    /// A file found with looser permissions is set back to 0600. A corrupt file is an error, never replaced:
    /// replacing it would silently invalidate every share link.
    public static func open(directory: String, nowMilliseconds: Int64) throws -> ShareKeyRing {
        try open(store: FileShareKeyStore(directory: directory), nowMilliseconds: nowMilliseconds)
    }

    /// Loads the ring from `store`, creating it with one fresh key when the store holds none (if another
    /// process creates it first, that one is kept). Corrupt contents are an error, never replaced.
    public static func open(store: any ShareKeyStore, nowMilliseconds: Int64) throws -> ShareKeyRing {
        let location = store.location
        if let (contents, version) = try store.load() {
            var state = try decode(contents, path: location)
            state.version = version
            return ShareKeyRing(store: store, state: state)
        }
        let key = try Ed25519Key.generate()
        let fresh = State(
            entries: [Entry(keyID: key.thumbprint, createdMilliseconds: nowMilliseconds, key: key, retired: false)],
            activeKeyID: key.thumbprint
        )
        var stored: [UInt8] = []
        let version = try store.update { current in
            stored = try current ?? encode(fresh)
            return stored
        }
        var state = try decode(stored, path: location)
        state.version = version
        return ShareKeyRing(store: store, state: state)
    }

    /// Loads the keys again if the store's version changed since they were read. A store that cannot be
    /// read, or contents that do not decode, leave the keys in memory as they were.
    public func refresh() {
        guard let current = try? store.version() else { return }
        guard state.withLock({ $0.version != current }) else { return }
        guard let (contents, version) = try? store.load(), var next = try? Self.decode(contents, path: path) else {
            return
        }
        next.version = version
        state.withLock { $0 = next }
    }

    /// The key that signs new share links.
    public var activeKeyID: String {
        refresh()
        return state.withLock { $0.activeKeyID }
    }

    /// The stored state to change: the store's current contents (another process may have changed them),
    /// or this ring's when the store is empty.
    private func current(_ contents: [UInt8]?) throws -> State {
        guard let contents else { return state.withLock { $0 } }
        return try Self.decode(contents, path: path)
    }

    /// Makes a new active signing key and returns its ID. Older keys keep verifying until retired; the old
    /// active key's private half is dropped. Persists before it takes effect.
    public func rotate(nowMilliseconds: Int64) throws -> String {
        let key = try Ed25519Key.generate()
        var next: State? = nil
        let version = try store.update { contents in
            var changed = try current(contents)
            let previous = changed.entries.firstIndex { $0.keyID == changed.activeKeyID }!
            changed.entries[previous].key = try Ed25519Key(publicKey: changed.entries[previous].key.publicKeyBytes)
            changed.entries.append(Entry(
                keyID: key.thumbprint, createdMilliseconds: nowMilliseconds, key: key, retired: false
            ))
            changed.activeKeyID = key.thumbprint
            next = changed
            return try Self.encode(changed)
        }
        next!.version = version
        state.withLock { $0 = next! }
        return key.thumbprint
    }

    /// Stops a key verifying: every link it signed stops working. The active key cannot be retired (rotate
    /// first). Retiring a retired key does nothing. Persists before it takes effect.
    public func retire(keyID: String) throws {
        var next: State? = nil
        let version = try store.update { contents in
            var changed = try current(contents)
            guard let index = changed.entries.firstIndex(where: { $0.keyID == keyID }) else {
                throw ShareKeyRingError(.unknownKey(keyID))
            }
            guard keyID != changed.activeKeyID else { throw ShareKeyRingError(.retireActive(keyID)) }
            changed.entries[index].retired = true
            next = changed
            return try Self.encode(changed)
        }
        next!.version = version
        state.withLock { $0 = next! }
    }

    /// Every key, oldest first, for `lattice admin` listings.
    public var keys: [(keyID: String, createdMilliseconds: Int64, active: Bool, retired: Bool)] {
        refresh()
        return state.withLock { state in
            state.entries.map { ($0.keyID, $0.createdMilliseconds, $0.keyID == state.activeKeyID, $0.retired) }
        }
    }

    /// The RFC 7517 JWK Set of the keys that verify (not retired), oldest first:
    /// `{"keys":[{"alg":"EdDSA","crv":"Ed25519","kid":...,"kty":"OKP","use":"sig","x":...}]}`.
    public func jwks() -> JSON {
        refresh()
        let entries = state.withLock { $0.entries.filter { !$0.retired } }
        let keys = entries.map { entry -> JSON in
            let x = Base64URL.encode(entry.key.publicKeyBytes)
            return .object([
                "kty": .string("OKP"), "crv": .string("Ed25519"), "x": .string(x),
                "kid": .string(entry.keyID), "use": .string("sig"), "alg": .string("EdDSA"),
            ])
        }
        return .object(["keys": .array(keys)])
    }

    /// A compact JWS of `claims` signed by the active key, with header `{"alg":"EdDSA","kid":...,"typ":"JWT"}`.
    ///
    /// Throws ``ShareKeyRingError`` for claims that ``verify(_:nowSeconds:leewaySeconds:)`` would refuse (an
    /// empty identifier, an unknown permission, `max_uses` below 1, a token over 4 KiB).
    public func sign(_ claims: ShareClaims) throws -> String {
        if let problem = claims.problem { throw ShareKeyRingError(.invalidClaims(problem)) }
        refresh()
        let (keyID, key) = state.withLock { ($0.activeKeyID, $0.active.key) }
        let token = try Self.sign(
            header: CompactJWS.header(keyID: keyID).serializedBytes(), payload: claims.json.serializedBytes(), key: key
        )
        guard token.utf8.count <= CompactJWS.maximumLength else {
            throw ShareKeyRingError(.invalidClaims("the token would be longer than \(CompactJWS.maximumLength) bytes"))
        }
        return token
    }

    /// Checks a share token and returns its claims.
    ///
    /// The token must be three unpadded base64url parts of at most 4 KiB. The header may hold only `alg`,
    /// `kid` and `typ`; `alg` must be exactly "EdDSA", the one algorithm every key here has (never taken from
    /// the token: "none", "HS256" and a missing `alg` all fail); `kid` must name a key that is not retired;
    /// `typ`, when present, must be "JWT". The Ed25519 signature must cover the first two parts as sent. The
    /// claims must have exactly the expected names and JSON types. `exp` passes while
    /// `nowSeconds < exp + leewaySeconds`; an `iat` more than `leewaySeconds` ahead of `nowSeconds` fails.
    ///
    /// Every failure is the same ``ShareTokenError/invalid``. The share's existence, its epoch and its use
    /// count are the caller's to check.
    public func verify(_ token: String, nowSeconds: Int64, leewaySeconds: Int64 = 60) throws(ShareTokenError)
        -> ShareClaims
    {
        refresh()
        do {
            return try check(token, nowSeconds: nowSeconds, leewaySeconds: leewaySeconds)
        } catch {
            throw .invalid
        }
    }

    /// ``verify(_:nowSeconds:leewaySeconds:)`` with the reason for a refusal, for tests.
    func check(_ token: String, nowSeconds: Int64, leewaySeconds: Int64 = 60) throws(CompactJWS.Rejection)
        -> ShareClaims
    {
        let parts = try CompactJWS.parse(token)
        let key = state.withLock { state in state.entries.first { $0.keyID == parts.keyID && !$0.retired }?.key }
        guard let key else { throw .unknownKey }
        guard key.verify(signature: parts.signature, message: Array(parts.signingInput)) else { throw .badSignature }
        return try CompactJWS.claims(payload: parts.payload, nowSeconds: nowSeconds, leewaySeconds: leewaySeconds)
    }

    /// Signs arbitrary header and payload bytes with the active key, for tests that need a validly signed token
    /// with a malformed header or claims.
    func signUnchecked(header: [UInt8], payload: [UInt8]) throws -> String {
        try Self.sign(header: header, payload: payload, key: state.withLock { $0.active.key })
    }

    private static func sign(header: [UInt8], payload: [UInt8], key: Ed25519Key) throws -> String {
        let input = CompactJWS.signingInput(header: header, payload: payload)
        return input + "." + Base64URL.encode(try key.sign(Array(input.utf8)))
    }

    // MARK: The key file

    // {"format":"lattice-share-keys","version":1,"active":KID,
    //  "keys":[{"kid":KID,"created":MS,"x":B64URL,"d":B64URL (active key only),"retired":false}, ...]}

    private static let format = "lattice-share-keys"
    private static let version: Int64 = 1

    private static func encode(_ state: State) throws -> [UInt8] {
        var keys = [JSON]()
        for entry in state.entries {
            var object: [String: JSON] = [
                "kid": .string(entry.keyID), "created": .int(entry.createdMilliseconds),
                "x": .string(Base64URL.encode(entry.key.publicKeyBytes)), "retired": .bool(entry.retired),
            ]
            if entry.keyID == state.activeKeyID {
                object["d"] = .string(Base64URL.encode(try entry.key.privateKeyBytes()))
            }
            keys.append(.object(object))
        }
        let file = JSON.object([
            "format": .string(format), "version": .int(version), "active": .string(state.activeKeyID),
            "keys": .array(keys),
        ])
        return file.serializedBytes() + [0x0A]
    }

    private static func decode(_ contents: [UInt8], path: String) throws -> State {
        func corrupt(_ reason: String) -> ShareKeyRingError { ShareKeyRingError(.corrupt(path: path, reason: reason)) }
        let file: JSON
        do { file = try JSON.parse(contents) } catch { throw corrupt("\(error)") }
        guard file["format"] == .string(format) else { throw corrupt("not a Lattice share key file") }
        guard file["version"] == .int(version) else { throw corrupt("unsupported version") }
        guard case .string(let activeKeyID)? = file["active"], case .array(let items)? = file["keys"] else {
            throw corrupt("missing \"active\" or \"keys\"")
        }
        var entries = [Entry]()
        for (index, item) in items.enumerated() {
            guard case .string(let keyID)? = item["kid"], case .int(let created)? = item["created"],
                  case .string(let x)? = item["x"], case .bool(let retired)? = item["retired"],
                  let publicKey = Base64URL.decode(x), publicKey.count == Ed25519Key.keyLength
            else { throw corrupt("key \(index) is malformed") }
            let key: Ed25519Key
            if let d = item["d"] {
                guard case .string(let text) = d, let seed = Base64URL.decode(text), seed.count == Ed25519Key.keyLength,
                      let pair = try? Ed25519Key(privateKey: seed), pair.publicKeyBytes == publicKey
                else { throw corrupt("key \(index) has a private key that does not match its public key") }
                key = pair
            } else {
                guard let verifier = try? Ed25519Key(publicKey: publicKey) else {
                    throw corrupt("key \(index) has an invalid public key")
                }
                key = verifier
            }
            guard key.thumbprint == keyID else { throw corrupt("key \(index): kid is not the key's thumbprint") }
            guard !entries.contains(where: { $0.keyID == keyID }) else { throw corrupt("key \(keyID) appears twice") }
            entries.append(Entry(keyID: keyID, createdMilliseconds: created, key: key, retired: retired))
        }
        guard let active = entries.first(where: { $0.keyID == activeKeyID }) else {
            throw corrupt("the active key is not in the file")
        }
        guard !active.retired, active.key.canSign else {
            throw corrupt("the active key is retired or has no private key")
        }
        return State(entries: entries, activeKeyID: activeKeyID)
    }
}

/// Why the share key ring could not load, change or sign. Never carries key material.
public struct ShareKeyRingError: Error, Hashable, Sendable, CustomStringConvertible {
    enum Kind: Hashable, Sendable {
        case corrupt(path: String, reason: String)
        case io(operation: String, path: String, errno: Int32)
        case unknownKey(String)
        case retireActive(String)
        case invalidClaims(String)
    }

    let kind: Kind

    init(_ kind: Kind) { self.kind = kind }

    public var description: String {
        switch kind {
        case .corrupt(let path, let reason): "share key file \(path) is corrupt: \(reason)"
        case .io(let operation, let path, let code): "\(operation) \(path) failed: \(String(cString: strerror(code)))"
        case .unknownKey(let keyID): "no share key with ID \(keyID)"
        case .retireActive(let keyID): "share key \(keyID) is the active key; rotate before retiring it"
        case .invalidClaims(let reason): "cannot sign share claims: \(reason)"
        }
    }
}

/// Reading and atomically replacing the key file with POSIX calls, every one checked.
enum KeyFile {
    static let maximumSize = 1 << 20

    /// What tells two versions of the file apart: inode, size and modification time.
    struct Identity: Hashable, Sendable {
        let inode: UInt64
        let size: Int64
        let modifiedSeconds: Int
        let modifiedNanoseconds: Int
    }

    static func identity(path: String) -> Identity? {
        var info = stat()
        guard stat(path, &info) == 0 else { return nil }
        return Identity(inode: UInt64(info.st_ino), size: Int64(info.st_size), modifiedSeconds: info.st_mtim.tv_sec,
                        modifiedNanoseconds: info.st_mtim.tv_nsec)
    }

    /// The file's bytes, or nil when it does not exist. Tightens a mode looser than 0600.
    static func read(path: String) throws -> [UInt8]? {
        let fd = retrying { Glibc.open(path, O_RDONLY | O_CLOEXEC) }
        guard fd >= 0 else {
            if errno == ENOENT { return nil }
            throw ShareKeyRingError(.io(operation: "open", path: path, errno: errno))
        }
        defer { close(fd) }
        var info = stat()
        guard fstat(fd, &info) == 0 else { throw ShareKeyRingError(.io(operation: "fstat", path: path, errno: errno)) }
        guard info.st_mode & S_IFMT == S_IFREG else {
            throw ShareKeyRingError(.corrupt(path: path, reason: "not a regular file"))
        }
        if info.st_mode & 0o077 != 0 {
            guard fchmod(fd, 0o600) == 0 else {
                throw ShareKeyRingError(.io(operation: "fchmod 0600", path: path, errno: errno))
            }
        }
        guard info.st_size <= maximumSize else {
            throw ShareKeyRingError(.corrupt(path: path, reason: "larger than \(maximumSize) bytes"))
        }
        var contents = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let count = retrying { Glibc.read(fd, &buffer, buffer.count) }
            guard count >= 0 else { throw ShareKeyRingError(.io(operation: "read", path: path, errno: errno)) }
            if count == 0 { break }
            contents.append(contentsOf: buffer[..<count])
            guard contents.count <= maximumSize else {
                throw ShareKeyRingError(.corrupt(path: path, reason: "larger than \(maximumSize) bytes"))
            }
        }
        return contents
    }

    /// Replaces `path` with `contents`: a new 0600 file beside it, fsync, rename over, fsync of the directory.
    /// A crash leaves either the old file or the new one, never a mix.
    static func write(_ contents: [UInt8], directory: String, path: String) throws {
        if mkdir(directory, 0o700) != 0 && errno != EEXIST {
            throw ShareKeyRingError(.io(operation: "mkdir", path: directory, errno: errno))
        }
        let temporary = path + ".tmp-" + Secrets.hex(try Secrets.randomBytes(8))
        let fd = retrying { Glibc.open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o600) }
        guard fd >= 0 else { throw ShareKeyRingError(.io(operation: "open", path: temporary, errno: errno)) }
        var renamed = false
        defer { if !renamed { unlink(temporary) } }
        do {
            defer { close(fd) }
            // The umask can only narrow 0600, but make the mode exact regardless.
            guard fchmod(fd, 0o600) == 0 else {
                throw ShareKeyRingError(.io(operation: "fchmod 0600", path: temporary, errno: errno))
            }
            var offset = 0
            while offset < contents.count {
                let count = contents.withUnsafeBytes { bytes in
                    retrying { Glibc.write(fd, bytes.baseAddress! + offset, bytes.count - offset) }
                }
                guard count > 0 else { throw ShareKeyRingError(.io(operation: "write", path: temporary, errno: errno)) }
                offset += count
            }
            guard fsync(fd) == 0 else {
                throw ShareKeyRingError(.io(operation: "fsync", path: temporary, errno: errno))
            }
        }
        guard rename(temporary, path) == 0 else {
            throw ShareKeyRingError(.io(operation: "rename", path: path, errno: errno))
        }
        renamed = true
        let directoryFD = retrying { Glibc.open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC) }
        guard directoryFD >= 0 else { throw ShareKeyRingError(.io(operation: "open", path: directory, errno: errno)) }
        defer { close(directoryFD) }
        guard fsync(directoryFD) == 0 else {
            throw ShareKeyRingError(.io(operation: "fsync", path: directory, errno: errno))
        }
    }

    /// Repeats a call interrupted by a signal (`EINTR`).
    private static func retrying<T: BinaryInteger>(_ call: () -> T) -> T {
        while true {
            let result = call()
            if result >= 0 || errno != EINTR { return result }
        }
    }
}
