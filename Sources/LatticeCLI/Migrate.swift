import Foundation
import LatticeCore
import LatticeSharing
import LatticeStore

// `lattice admin migrate --data DIR --to URL`: a whole SQLite deployment copied into an empty PostgreSQL
// database, through the storage's neutral copy (`StorageTables.all`, `exportRows`, `insertRows`).

let migrateUsage = """
    migrate           copies the whole deployment in DIR (every table: accounts, tokens, zones, records with
                      their frames and positions, change logs, shares, participants, link uses, sign-ups,
                      client operations, nodes, assets' rows) with the assets' bytes (DIR/assets, as
                      chunk rows) and its share-link keys into the EMPTY PostgreSQL database
                      at URL, then checks every table's row count. Ids and log positions are kept, so
                      sync tokens and share links issued before the move keep working (serve the target
                      with the same --public-url). The source is read as one snapshot and the target written
                      in one transaction: a target with any row in any table is refused, and a failure
                      writes nothing. Writes made after the snapshot are not copied: stop the server first.
                      The URL's password is never printed.
    """

/// The moving of one deployment from a SQLite data directory into a PostgreSQL database.
struct DeploymentMigration {
    /// What was copied, per table in `StorageTables.all` order.
    struct Report {
        var rows: [(table: String, count: Int)] = []
        /// Keys of the share-link key ring copied from share-keys.json (0: the directory had none).
        var shareKeys = 0
        /// Asset contents (files) copied as chunk rows, and their bytes.
        var assetContents = 0
        var assetBytes: Int64 = 0
        var totalRows: Int { rows.reduce(0) { $0 + $1.count } }
    }

    struct Failure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    /// The metadata key under which a database-backed deployment keeps its share-link key ring: the same
    /// JSON as a data directory's share-keys.json.
    static let shareKeysMetadataKey = "share_keys"

    let dataDirectory: String
    let targetURL: String

    /// Copies everything, or nothing. - Throws: `Failure` (a non-empty target, a count that does not match,
    /// a directory that is not a deployment) or the storage's error; the target's transaction then rolls back.
    func run() throws -> Report {
        let databasePath = dataDirectory + "/" + SQLiteStorage.fileName
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: dataDirectory, isDirectory: &isDirectory), isDirectory.boolValue else {
            throw Failure("\(dataDirectory) is not a directory")
        }
        guard FileManager.default.fileExists(atPath: databasePath) else {
            throw Failure("\(dataDirectory) holds no Lattice deployment (no \(SQLiteStorage.fileName))")
        }
        let shareKeys = try readShareKeys()

        let source = try SQLiteStorage(path: databasePath)
        defer { source.close() }
        let target = try PostgresStorage(url: targetURL, poolSize: 1)
        defer { target.close() }

        // One snapshot of the source for the whole copy; the target's write nests inside it.
        return try source.read { from in
            var expected: [String: Int] = [:]
            for table in StorageTables.all { expected[table.name] = try from.rowCount(table: table.name) }
            return try target.write { to in
                // The body may run again (a conflict or a lost connection before commit): start over each time.
                var report = Report()
                let occupied = try StorageTables.all.compactMap { table -> String? in
                    let count = try to.rowCount(table: table.name)
                    return count > 0 ? "\(table.name) (\(count))" : nil
                }
                guard occupied.isEmpty else {
                    throw Failure("the target database is not empty: it has rows in " + occupied.joined(separator: ", ")
                                  + "; migrate copies only into an empty database, so nothing was written")
                }
                for table in StorageTables.all {
                    var copied = 0
                    try from.exportRows(table: table.name) { batch in
                        try to.insertRows(table: table.name, batch)
                        copied += batch.count
                    }
                    report.rows.append((table.name, copied))
                }
                try to.finishImport()
                (report.assetContents, report.assetBytes) = try copyAssetBytes(from: source.assetContents, to)
                for table in StorageTables.all where table.name != "asset_chunks" {
                    let want = expected[table.name] ?? 0
                    let copied = report.rows.first { $0.table == table.name }?.count ?? 0
                    let have = try to.rowCount(table: table.name)
                    guard copied == want, have == want else {
                        throw Failure("\(table.name): the source has \(want) rows, \(copied) were copied and the target "
                                      + "counts \(have); nothing was written")
                    }
                }
                if let shareKeys {
                    guard try to.metadata(Self.shareKeysMetadataKey) == nil else {
                        throw Failure("the source's metadata already holds \(Self.shareKeysMetadataKey) and the data "
                                      + "directory has \(ShareKeyRing.fileName) too; nothing was written")
                    }
                    try to.setMetadata(Self.shareKeysMetadataKey, shareKeys.json)
                    report.shareKeys = shareKeys.count
                }
                return report
            }
        }
    }

    /// The bytes of every content a blob or upload row names, read from the data directory's files in 1 MiB
    /// pieces and written as chunk rows in the target's transaction (all or nothing with the rest).
    private func copyAssetBytes(from files: any AssetContentStore, _ to: any StorageTransaction) throws -> (Int, Int64) {
        var contents = 0
        var bytes: Int64 = 0
        var after = ""
        var buffer = [UInt8](repeating: 0, count: AssetChunkStore.chunkSize)
        while true {
            let batch = try to.assetContentIDs(after: after, limit: 500)
            guard let last = batch.last else { break }
            after = last
            for content in batch {
                let length = try files.length(of: content)
                var position: Int64 = 0
                while position < length {
                    let count = try buffer.withUnsafeMutableBytes { try files.read(content, at: position, into: $0) }
                    guard count > 0 else { throw Failure("asset content \(content) ends at \(position) of \(length) bytes") }
                    try to.insertAssetChunk(content: content, position: position, bytes: Array(buffer[0..<count]))
                    position += Int64(count)
                }
                guard try to.assetChunkLength(content: content) == length else {
                    throw Failure("asset content \(content): \(length) bytes in the data directory, not all copied; nothing was written")
                }
                contents += 1
                bytes += length
            }
        }
        return (contents, bytes)
    }

    /// share-keys.json of the data directory, checked (it must load as a key ring), as text; nil when the
    /// directory has none (no server ever signed a link there: the nodes make a new ring).
    private func readShareKeys() throws -> (json: String, count: Int)? {
        let path = dataDirectory + "/" + ShareKeyRing.fileName
        guard FileManager.default.fileExists(atPath: path) else { return nil }
        // Opening an existing file only reads and checks it (a corrupt one is an error, never replaced).
        let ring = try ShareKeyRing.open(directory: dataDirectory, nowMilliseconds: 0)
        guard let data = FileManager.default.contents(atPath: path) else {
            throw Failure("cannot read \(path)")
        }
        guard let text = String(data: data, encoding: .utf8) else { throw Failure("\(path) is not UTF-8") }
        return (text, ring.keys.count)
    }
}

/// `lattice admin migrate`: runs the migration and prints what it copied.
func runMigrate(_ parsed: ParsedArguments) throws {
    guard parsed.positionals.count == 1 else { throw UsageError("migrate takes no arguments besides --data and --to") }
    guard let data = try parsed.value("data") else { throw UsageError("--data DIR is required") }
    guard let url = try parsed.value("to") else { throw UsageError("--to URL (the PostgreSQL database) is required") }
    guard PostgresStorage.isPostgresURL(url) else {
        throw UsageError("--to must be a postgres:// or postgresql:// URL, got \(PostgresStorage.redacted(url))")
    }
    let migration = DeploymentMigration(dataDirectory: data, targetURL: url)
    let began = Date()
    let report = try migration.run()
    let seconds = Date().timeIntervalSince(began)
    let target = PostgresStorage.redacted(url)
    if parsed.flag("json") {
        print(JSON.object([
            "source": .string(data), "target": .string(target),
            "tables": .object(Dictionary(uniqueKeysWithValues: report.rows.map { ($0.table, JSON.int(Int64($0.count))) })),
            "rows": .int(Int64(report.totalRows)), "shareKeys": .int(Int64(report.shareKeys)),
            "assetContents": .int(Int64(report.assetContents)), "assetBytes": .int(report.assetBytes),
            "checked": .bool(true),
        ]).serialized())
        return
    }
    print("copied \(data) into \(target) in \(String(format: "%.1f", seconds)) s:")
    let width = report.rows.map(\.table.count).max() ?? 0
    for (table, count) in report.rows {
        print("  " + table.padding(toLength: width, withPad: " ", startingAt: 0) + "  \(count)")
    }
    print("  " + "share-link keys".padding(toLength: width, withPad: " ", startingAt: 0) + "  \(report.shareKeys)"
          + (report.shareKeys == 0 ? " (the data directory had no \(ShareKeyRing.fileName))" : ""))
    print("  " + "asset files".padding(toLength: width, withPad: " ", startingAt: 0)
          + "  \(report.assetContents) (\(report.assetBytes) bytes, now chunk rows)")
    print("every table's row count matches the source (\(report.totalRows) rows).")
    print("next: lattice serve --database URL --node-name NAME --public-url URL (the URL clients used before)")
}
