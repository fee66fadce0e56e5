import Dispatch
import Foundation
import LatticeOperations
import LatticeSharing
import LatticeStore
#if canImport(Glibc)
import Glibc
#endif

/// Where a deployment keeps its data: a data directory with embedded SQLite (one process), or a PostgreSQL
/// database that any number of nodes share.
public enum StorageLocation: Sendable, Hashable, CustomStringConvertible {
    case dataDirectory(String)
    /// A libpq connection string (`postgresql://...` URL or `key=value` pairs) and the pool's size.
    case database(url: String, poolSize: Int)

    /// For messages: the directory, or the connection string with any password replaced by `***`.
    public var description: String {
        switch self {
        case .dataDirectory(let path): return path
        case .database(let url, _): return DatabaseBackend.redacted(url)
        }
    }

    /// Whether several nodes may share it (the rules of Docs/Architecture.md "Several nodes" apply).
    public var isShared: Bool {
        if case .database = self { return true }
        return false
    }
}

/// A deployment's storage, share-key ring and service, opened from a `StorageLocation`: the one way
/// `lattice serve` and every `lattice admin` command open them.
public final class OpenedDeployment: Sendable {
    public let location: StorageLocation
    public let storage: any Storage
    public let keyRing: ShareKeyRing
    public let service: LatticeService
    /// The data directory's lock (serving on SQLite), released by `close`.
    private let lockDescriptor: Int32?

    init(location: StorageLocation, storage: any Storage, keyRing: ShareKeyRing, service: LatticeService,
         lockDescriptor: Int32?) {
        self.location = location
        self.storage = storage
        self.keyRing = keyRing
        self.service = service
        self.lockDescriptor = lockDescriptor
    }

    /// What the deployment is for.
    public enum Purpose: Sendable {
        /// `lattice serve`: the data directory is locked (SQLite) or the node name claimed (PostgreSQL),
        /// and on PostgreSQL the configured public URL must be the deployment's.
        case serving
        /// `lattice admin`: beside a running server, nothing locked or claimed.
        case administration
    }

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
        public init(_ description: String) { self.description = description }
    }

    /// The metadata key holding the public URL every node of a shared database serves at.
    public static let publicURLKey = "public_url"

    /// Opens the storage at `location`, the share-key ring (the data directory's `share-keys.json`, or the
    /// database's metadata `share_keys`) and the service.
    ///
    /// - Serving on a data directory: creates it (0700) or makes it private, takes its lock (a second server
    ///   is refused), migrates the database (files 0600).
    /// - Serving on a database: claims `configuration.nodeName` (a second live process with that node name
    ///   is refused) and checks `publicURL`: required, stored in the database by the first node, and every
    ///   later node must be started with the same one.
    /// - Administration: opens without locking or claiming (SQLite coordinates with a running server;
    ///   PostgreSQL is made for many clients).
    public static func open(_ location: StorageLocation, configuration: ServiceConfiguration = ServiceConfiguration(),
                            purpose: Purpose, publicURL: String? = nil,
                            log: @escaping @Sendable (String) -> Void = ServerProcess.logToStandardError) throws
        -> OpenedDeployment {
        switch location {
        case .dataDirectory(let path):
            var lock: Int32? = nil
            let storage: SQLiteStorage
            switch purpose {
            case .serving:
                let data = try DataDirectory.open(path, log: log)
                lock = data.lockDescriptor
                do {
                    storage = try SQLiteStorage(path: data.databasePath,
                                                readerConnections: configuration.storageReaderConnections)
                    try data.restrictDatabaseFiles(log: log)
                } catch {
                    Glibc.close(data.lockDescriptor)
                    throw error
                }
            case .administration:
                if !FileManager.default.fileExists(atPath: path) {
                    try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true,
                                                            attributes: [.posixPermissions: 0o700])
                }
                storage = try SQLiteStorage(path: path + "/" + SQLiteStorage.fileName)
            }
            do {
                let keyRing = try ShareKeyRing.open(directory: path, nowMilliseconds: configuration.now())
                var serviceConfiguration = configuration
                if let publicURL { serviceConfiguration.publicURL = publicURL }
                let service = try LatticeService(storage: storage, configuration: serviceConfiguration, keyRing: keyRing,
                                                 log: log)
                return OpenedDeployment(location: location, storage: storage, keyRing: keyRing, service: service,
                                        lockDescriptor: lock)
            } catch {
                storage.close()
                if let lock { Glibc.close(lock) }
                throw error
            }
        case .database(let url, let poolSize):
            let storage: any Storage
            do {
                storage = try DatabaseBackend.open(url: url, poolSize: poolSize)
            } catch let error as StorageError {
                throw Failure("cannot open the database: \(error)")
            }
            do {
                var serviceConfiguration = configuration
                if case .serving = purpose {
                    guard let publicURL else {
                        throw Failure("--public-url is required with --database: share links are checked against it, "
                                      + "so every node must serve one configured URL")
                    }
                    do {
                        try storage.claimNode(configuration.nodeName)
                    } catch StorageError.duplicate {
                        throw Failure("another lattice server is running as node \(configuration.nodeName) on "
                                      + "\(location); give each node its own --node-name")
                    }
                    try checkPublicURL(publicURL, storage: storage)
                    serviceConfiguration.publicURL = publicURL
                } else if let publicURL {
                    serviceConfiguration.publicURL = publicURL
                } else if let stored = try storage.read({ tx in try tx.metadata(publicURLKey) }) {
                    serviceConfiguration.publicURL = stored
                }
                let keyRing = try ShareKeyRing.open(store: DatabaseShareKeyStore(storage: storage),
                                                    nowMilliseconds: configuration.now())
                let service = try LatticeService(storage: storage, configuration: serviceConfiguration, keyRing: keyRing,
                                                 log: log)
                return OpenedDeployment(location: location, storage: storage, keyRing: keyRing, service: service,
                                        lockDescriptor: nil)
            } catch {
                storage.close()
                throw error
            }
        }
    }

    /// Stores `publicURL` as the deployment's on the first start; refuses a node configured with another.
    /// The row is taken under a lock first (`public_url_claim`), so two first nodes starting at once agree.
    static func checkPublicURL(_ publicURL: String, storage: any Storage) throws {
        try storage.write { tx in
            try tx.setMetadata("public_url_claim", publicURL)
            if let stored = try tx.metadata(publicURLKey) {
                guard stored == publicURL else {
                    throw Failure("this node's --public-url \(publicURL) differs from the deployment's \(stored) (kept in "
                                  + "the database by the first node): every node must serve one URL, since share "
                                  + "links are checked against it; start this node with --public-url \(stored)")
                }
            } else {
                try tx.setMetadata(publicURLKey, publicURL)
            }
        }
    }

    /// Closes the storage and releases the data directory's lock (or, on a database, the node's claim).
    public func close() {
        storage.close()
        if let lockDescriptor { Glibc.close(lockDescriptor) }
    }
}

/// Everything `lattice serve` runs: the storage (a data directory's SQLite, or a PostgreSQL database shared
/// with other nodes), the service, the HTTP server, the hourly purge of expired tombstones and, on a
/// database, a probe of the database for `/healthz`.
///
/// `@unchecked Sendable` with no lock, as there is nothing to guard: every stored property is an immutable `let`.
/// `@unchecked` only because `timers` (`any DispatchSourceTimer`) is not Sendable to the compiler, while a
/// dispatch source may be cancelled from any thread.
public final class ServerProcess: @unchecked Sendable {
    public struct Options: Sendable {
        public var storage: StorageLocation
        public var http = HTTPServerConfiguration()
        public var service = ServiceConfiguration()
        /// The URL clients use; nil means the listening address, learned after binding (SQLite only: with a
        /// database every node must be given the one URL).
        public var publicURL: String?
        /// Seconds between purges of expired tombstones and operation ids (one node at a time purges).
        public var purgeIntervalSeconds = 3600
        /// Milliseconds between probes of a shared database for `/healthz`, and the deadline of each.
        public var healthProbeIntervalMilliseconds = 1_000

        public init(dataDirectory: String) {
            storage = .dataDirectory(dataDirectory)
        }

        public init(storage: StorageLocation) {
            self.storage = storage
        }
    }

    public let url: String
    public let deployment: OpenedDeployment
    private let server: HTTPServer
    private let timers: [any DispatchSourceTimer]

    /// Opens the deployment for serving (`OpenedDeployment.open`), purges once and starts listening.
    public init(_ options: Options, log: @escaping @Sendable (String) -> Void = ServerProcess.logToStandardError) throws {
        deployment = try OpenedDeployment.open(options.storage, configuration: options.service, purpose: .serving,
                                               publicURL: options.publicURL, log: log)
        let service = deployment.service
        do {
            do { try service.purgeExpired() } catch {
                // On a database another node may be purging or the database may be away: serving goes on.
                guard options.storage.isShared else { throw error }
                log("purge failed: \(error)")
            }
            server = try HTTPServer(handler: service, configuration: options.http)
        } catch {
            deployment.close()
            throw error
        }
        url = "http://\(options.http.host):\(server.port)"
        if options.publicURL == nil { service.setPublicURL(url) }
        var timers: [any DispatchSourceTimer] = []
        let purge = DispatchSource.makeTimerSource(queue: .global(qos: .utility))
        let interval = DispatchTimeInterval.seconds(options.purgeIntervalSeconds)
        purge.schedule(deadline: .now() + interval, repeating: interval)
        purge.setEventHandler {
            do { try service.purgeExpired() } catch { log("purge failed: \(error)") }
        }
        timers.append(purge)
        if options.storage.isShared {
            let probe = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "lattice-health-probe"))
            let every = max(50, options.healthProbeIntervalMilliseconds)
            probe.schedule(deadline: .now() + .milliseconds(every), repeating: .milliseconds(every))
            probe.setEventHandler { service.probeStorage(deadlineMilliseconds: Int64(every)) }
            timers.append(probe)
        }
        timers.forEach { $0.resume() }
        self.timers = timers
        service.webhooks.start()
    }

    /// Writes `lattice: message` to stderr.
    public static let logToStandardError: @Sendable (String) -> Void = { message in
        FileHandle.standardError.write(Data("lattice: \(message)\n".utf8))
    }

    /// Graceful stop: no new connections, open long polls answered, in-flight requests finished, then the
    /// storage is closed (SQLite checkpointed) and the lock or node claim released.
    public func stop() {
        timers.forEach { $0.cancel() }
        deployment.service.webhooks.stop()
        server.shutdown()
        deployment.close()
    }
}

/// The data directory of a server: `lattice.sqlite` (with its WAL) and `lattice.lock`.
public struct DataDirectory: Sendable {
    public let path: String
    public var databasePath: String { path + "/" + SQLiteStorage.fileName }
    let lockDescriptor: Int32

    public struct Failure: Error, CustomStringConvertible {
        public let description: String
    }

    /// Creates the directory if needed (mode 0700), makes an existing one private (0700: it holds token
    /// hashes and signing keys) or refuses it when that fails, and takes its exclusive lock (`lattice.lock`,
    /// 0600).
    static func open(_ path: String, log: @Sendable (String) -> Void) throws -> DataDirectory {
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) {
            guard isDirectory.boolValue else { throw Failure(description: "\(path) exists and is not a directory") }
            var status = stat()
            guard stat(path, &status) == 0 else {
                throw Failure(description: "cannot read the mode of the data directory \(path): \(String(cString: strerror(errno)))")
            }
            let mode = status.st_mode & 0o7777
            if mode & 0o077 != 0 {
                guard chmod(path, 0o700) == 0 else {
                    let reason = String(cString: strerror(errno))
                    throw Failure(description: "the data directory \(path) has mode \(String(mode, radix: 8)), open to "
                                  + "group or others, and it cannot be made 0700 (\(reason)); run chmod 700 \(path) as "
                                  + "its owner, or choose another --data directory")
                }
                log("the data directory \(path) had mode \(String(mode, radix: 8)); changed it to 700")
            }
        } else {
            do {
                try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true,
                                                        attributes: [.posixPermissions: 0o700])
            } catch {
                throw Failure(description: "cannot create the data directory \(path): \(error.localizedDescription)")
            }
        }
        let descriptor = Glibc.open(path + "/lattice.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else {
            throw Failure(description: "cannot open \(path)/lattice.lock: \(String(cString: strerror(errno)))")
        }
        guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else {
            close(descriptor)
            throw Failure(description: "another lattice server is using \(path)")
        }
        guard fchmod(descriptor, 0o600) == 0 else {
            let reason = String(cString: strerror(errno))
            close(descriptor)
            throw Failure(description: "cannot make \(path)/lattice.lock mode 600: \(reason)")
        }
        return DataDirectory(path: path, lockDescriptor: descriptor)
    }

    /// Makes the database and its WAL files owner-only (0600), logging any that were not.
    func restrictDatabaseFiles(log: @Sendable (String) -> Void) throws {
        for file in [databasePath, databasePath + "-wal", databasePath + "-shm"] {
            var status = stat()
            guard stat(file, &status) == 0 else { continue }
            let mode = status.st_mode & 0o7777
            guard mode & 0o177 != 0 else { continue }
            guard chmod(file, 0o600) == 0 else {
                throw Failure(description: "cannot make \(file) mode 600: \(String(cString: strerror(errno)))")
            }
            log("\(file) had mode \(String(mode, radix: 8)); changed it to 600")
        }
    }

    /// Opens (creating if needed) the storage and service of a data directory without serving it, for
    /// `lattice admin`. SQLite coordinates with a running server, so this is safe while one runs.
    public static func openService(_ path: String, configuration: ServiceConfiguration = ServiceConfiguration()) throws
        -> (storage: any Storage, service: LatticeService) {
        let opened = try OpenedDeployment.open(.dataDirectory(path), configuration: configuration, purpose: .administration)
        return (opened.storage, opened.service)
    }
}

extension StorageLocation {
    /// A mistake in the storage options, for the CLI's usage errors.
    public struct OptionProblem: Error, CustomStringConvertible {
        public let description: String
    }

    /// The environment variable `--database` defaults to.
    public static let databaseEnvironmentVariable = "LATTICE_DATABASE_URL"

    /// Pool connections unless told otherwise: twice the processor count.
    public static var defaultPoolSize: Int { 2 * max(1, ProcessInfo.processInfo.activeProcessorCount) }

    /// The location from `--data DIR`, `--database URL` (else `$LATTICE_DATABASE_URL`, unless `--data` is
    /// given) and `--database-pool N`. Both `--data` and `--database` is a mistake, and so is neither.
    public static func fromOptions(data: String?, database: String?, poolSize: Int?,
                                   environment: [String: String] = ProcessInfo.processInfo.environment) throws
        -> StorageLocation {
        if data != nil && database != nil {
            throw OptionProblem(description: "give --data DIR (SQLite) or --database URL (PostgreSQL), not both")
        }
        if let data {
            guard poolSize == nil else { throw OptionProblem(description: "--database-pool goes with --database") }
            guard !data.isEmpty else { throw OptionProblem(description: "--data needs a directory") }
            return .dataDirectory(data)
        }
        let fromEnvironment = environment[databaseEnvironmentVariable].flatMap { $0.isEmpty ? nil : $0 }
        guard let url = database ?? fromEnvironment else {
            throw OptionProblem(description: "--data DIR or --database URL (or $\(databaseEnvironmentVariable)) is required")
        }
        guard !url.trimmingCharacters(in: .whitespaces).isEmpty else {
            throw OptionProblem(description: "--database needs a PostgreSQL URL or libpq connection string")
        }
        if let poolSize, !(1...1024).contains(poolSize) {
            throw OptionProblem(description: "--database-pool must be an integer from 1 to 1024")
        }
        return .database(url: url, poolSize: poolSize ?? defaultPoolSize)
    }

    /// Why `name` cannot be a node name (`--node-name`), or nil: 1 to 64 letters, digits, `.`, `_` or `-`.
    public static func nodeNameProblem(_ name: String) -> String? {
        let allowed = name.utf8.allSatisfy { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
                || byte == 0x2E || byte == 0x5F || byte == 0x2D
        }
        guard (1...64).contains(name.utf8.count), allowed else {
            return "--node-name must be 1 to 64 letters, digits, '.', '_' or '-'"
        }
        return nil
    }
}
