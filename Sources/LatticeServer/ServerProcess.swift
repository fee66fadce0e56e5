import Dispatch
import Foundation
import LatticeSharing
import LatticeStore
#if canImport(Glibc)
import Glibc
#endif

/// Everything `lattice serve` runs: the SQLite storage under a data directory, the service, the HTTP
/// server and the hourly purge of expired tombstones.
/// `@unchecked Sendable`: every stored property is immutable, and a dispatch timer may be cancelled from any thread.
public final class ServerProcess: @unchecked Sendable {
    public struct Options: Sendable {
        public var dataDirectory: String
        public var http = HTTPServerConfiguration()
        public var service = ServiceConfiguration()
        /// The URL clients use; nil means the listening address, learned after binding.
        public var publicURL: String?
        /// Seconds between purges of expired tombstones and operation ids.
        public var purgeIntervalSeconds = 3600

        public init(dataDirectory: String) {
            self.dataDirectory = dataDirectory
        }
    }

    public let url: String
    private let storage: SQLiteStorage
    private let server: HTTPServer
    private let purgeTimer: any DispatchSourceTimer
    private let lockDescriptor: Int32

    /// Opens the data directory (creating it, mode 0700; an existing one open to group or others is made
    /// 0700, or refused), takes its lock so a second server cannot use it, migrates the database (its
    /// files 0600) and starts listening.
    public init(_ options: Options, log: @escaping @Sendable (String) -> Void = ServerProcess.logToStandardError) throws {
        let data = try DataDirectory.open(options.dataDirectory, log: log)
        lockDescriptor = data.lockDescriptor
        do {
            storage = try SQLiteStorage(path: data.databasePath, readerConnections: options.service.storageReaderConnections)
            try data.restrictDatabaseFiles(log: log)
            let keyRing = try ShareKeyRing.open(directory: data.path, nowMilliseconds: options.service.now())
            var serviceConfiguration = options.service
            if let publicURL = options.publicURL { serviceConfiguration.publicURL = publicURL }
            let service = try LatticeService(storage: storage, configuration: serviceConfiguration, keyRing: keyRing)
            try service.purgeExpired()
            server = try HTTPServer(handler: service, configuration: options.http)
            url = "http://\(options.http.host):\(server.port)"
            if options.publicURL == nil { service.setPublicURL(url) }
            let timer = DispatchSource.makeTimerSource(queue: .global(qos: .utility))
            let interval = DispatchTimeInterval.seconds(options.purgeIntervalSeconds)
            timer.schedule(deadline: .now() + interval, repeating: interval)
            timer.setEventHandler {
                do { try service.purgeExpired() } catch {
                    FileHandle.standardError.write(Data("lattice: purge failed: \(error)\n".utf8))
                }
            }
            timer.resume()
            purgeTimer = timer
        } catch {
            close(data.lockDescriptor)
            throw error
        }
    }

    /// Writes `lattice: message` to stderr.
    public static let logToStandardError: @Sendable (String) -> Void = { message in
        FileHandle.standardError.write(Data("lattice: \(message)\n".utf8))
    }

    /// Graceful stop: no new connections, open long polls answered, in-flight requests finished, then the
    /// database is checkpointed and closed and the lock released.
    public func stop() {
        purgeTimer.cancel()
        server.shutdown()
        storage.close()
        close(lockDescriptor)
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
        -> (storage: SQLiteStorage, service: LatticeService) {
        if !FileManager.default.fileExists(atPath: path) {
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true,
                                                    attributes: [.posixPermissions: 0o700])
        }
        let storage = try SQLiteStorage(path: path + "/" + SQLiteStorage.fileName)
        let keyRing = try ShareKeyRing.open(directory: path, nowMilliseconds: configuration.now())
        return (storage, try LatticeService(storage: storage, configuration: configuration, keyRing: keyRing))
    }
}
