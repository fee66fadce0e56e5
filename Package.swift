// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Lattice",
    // Mutex and Atomic (Synchronization) need these on Apple platforms; the server and the CLI run on Linux.
    platforms: [.macOS(.v15), .iOS(.v18), .tvOS(.v18), .watchOS(.v11), .visionOS(.v2)],
    products: [
        .library(name: "LatticeCore", targets: ["LatticeCore"]),
        .library(name: "LatticeServer", targets: ["LatticeServer"]),
        .library(name: "LatticeSync", targets: ["LatticeSync"]),
        .executable(name: "lattice", targets: ["LatticeCLI"]),
        .executable(name: "lattice-bench", targets: ["LatticeBench"]),
        .executable(name: "lattice-notes", targets: ["LatticeNotes"]),
    ],
    targets: [
        // C libraries from Debian, one system-library target each.
        .systemLibrary(
            name: "CSQLite",
            pkgConfig: "sqlite3",
            providers: [.apt(["libsqlite3-dev"])]
        ),
        .systemLibrary(
            name: "CLibCrypto",
            pkgConfig: "libcrypto",
            providers: [.apt(["libssl-dev"])]
        ),
        .systemLibrary(
            name: "CPostgres",
            pkgConfig: "libpq",
            providers: [.apt(["libpq-dev"])]
        ),
        .systemLibrary(
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        .systemLibrary(
            name: "CZlib",
            pkgConfig: "zlib",
            providers: [.apt(["zlib1g-dev"])]
        ),
        // Our own C: non-variadic wrappers for variadic or macro-only C APIs.
        .target(name: "CHTTPShims", dependencies: ["CMicroHTTPD"]),

        // Memory hints Swift lacks: a cache prefetch for the zone's frame walks, page population for fresh
        // export buffers (madvise).
        .target(name: "CMemoryHints"),

        // The CRDT record model. Foundation only (and the memory hints), no I/O.
        .target(name: "LatticeCore", dependencies: ["CMemoryHints"]),

        // SQLite connections, statements, migrations and their errors: the one wrapper of the C library, used
        // by the server's storage and by the client's local replica.
        .target(name: "LatticeSQLite", dependencies: ["CSQLite"]),

        // The wire contract: what client and server say to each other, with no transport (the service's
        // errors now; typed requests and responses per operation next).
        .target(name: "LatticeAPI", dependencies: ["LatticeCore"]),

        // Typed operations between HTTP and storage: the rules of each area, with no HTTP module beneath it.
        .target(name: "LatticeOperations", dependencies: ["LatticeCore", "LatticeAPI", "LatticeStore", "LatticeSharing"]),

        // Storage: the only server module that speaks SQL (SQLite embedded, PostgreSQL through libpq).
        .target(name: "LatticeStore", dependencies: ["LatticeCore", "LatticeSQLite", "CSQLite", "CPostgres"]),

        // Secrets: bearer tokens now, share-signing keys next. The only module that touches secrets.
        .target(name: "LatticeSharing", dependencies: ["LatticeCore", "CLibCrypto"]),

        // The service: Request -> Response core (routing, auth, endpoints, errors). Only its HTTP/ folder
        // imports CMicroHTTPD.
        .target(
            name: "LatticeServer",
            dependencies: ["LatticeCore", "LatticeAPI", "LatticeOperations", "LatticeStore", "LatticeSharing", "CMicroHTTPD",
                           "CHTTPShims", "CZlib"]
        ),

        // The client library (CKSyncEngine-like): local replica (its own SQLite file), pending changes, sync
        // state, transport. Links SQLite and Foundation only: never the server, libpq or libmicrohttpd
        // (ModuleDependencyTests fails if it does).
        .target(name: "LatticeSync", dependencies: ["LatticeCore", "LatticeAPI", "LatticeSQLite"]),

        // Shared lists (the CLI's and the web client's model) on top of the client library.
        .target(name: "LatticeLists", dependencies: ["LatticeCore", "LatticeSync"]),

        // `lattice admin` opens the share-signing key ring (LatticeSharing) and the storage (LatticeStore) directly.
        .executableTarget(
            name: "LatticeCLI",
            dependencies: ["LatticeCore", "LatticeAPI", "LatticeOperations", "LatticeServer", "LatticeSharing", "LatticeStore",
                           "LatticeSync", "LatticeLists"]
        ),
        // The example app of Docs/AppGuide.md: a notes app on LatticeSync's public API only.
        .executableTarget(name: "LatticeNotes", dependencies: ["LatticeCore", "LatticeSync"], path: "Examples/Notes"),
        .executableTarget(
            name: "LatticeBench",
            dependencies: [
                "LatticeCore", "LatticeOperations", "LatticeServer", "LatticeStore", "LatticeSync", "CLibCrypto", "CSQLite",
                "CPostgres", "CZlib",
            ],
            path: "Benchmarks/LatticeBench"
        ),

        // Test support shared by the test targets: the backend switch (LATTICE_TEST_BACKEND), throwaway
        // PostgreSQL databases and clusters, a raw HTTP/1.1 client and a real `lattice serve` process. In no
        // product: the shipped libraries and executables do not contain it.
        .target(
            name: "LatticeTestSupport", dependencies: ["LatticeCore", "LatticeStore", "LatticeSync", "LatticeLists", "LatticeSharing", "CPostgres",
                                                       "CLibCrypto"],
            path: "Tests/LatticeTestSupport"
        ),

        .testTarget(name: "LatticeCoreTests", dependencies: ["LatticeCore"]),
        .testTarget(name: "LatticeAPITests", dependencies: ["LatticeAPI", "LatticeCore"]),
        .testTarget(name: "LatticeStoreTests", dependencies: ["LatticeStore", "LatticeSQLite", "LatticeCore", "LatticeTestSupport"]),
        .testTarget(
            name: "LatticeServerTests",
            dependencies: ["LatticeServer", "LatticeAPI", "LatticeOperations", "LatticeStore", "LatticeSQLite", "LatticeSharing",
                           "LatticeSync", "LatticeLists", "LatticeCore", "LatticeTestSupport"]
        ),
        // Tests of real processes, apart from the server's in-process API tests above: `lattice serve` as a
        // process (crash recovery, disk full, migration, several nodes on PostgreSQL, the attack suite), the
        // `lattice` CLI against a real server, nginx and haproxy in front of it, and the `lattice-bench` commands.
        .testTarget(
            name: "LatticeProcessTests",
            dependencies: ["LatticeCore", "LatticeServer", "LatticeStore", "LatticeSync", "LatticeLists", "LatticeTestSupport"]
        ),
        .testTarget(name: "LatticeCLITests", dependencies: ["LatticeCore", "LatticeSync", "LatticeTestSupport"]),
        .testTarget(name: "LatticeProxyTests", dependencies: ["LatticeCore", "LatticeTestSupport"]),
        .testTarget(name: "LatticeBenchCommandTests", dependencies: ["LatticeCore", "LatticeStore", "LatticeTestSupport"]),
        .testTarget(
            name: "LatticeSyncTests",
            dependencies: ["LatticeSync", "LatticeLists", "LatticeAPI", "LatticeOperations", "LatticeServer", "LatticeSharing",
                           "LatticeStore", "LatticeCore", "LatticeTestSupport"]
        ),
        .testTarget(name: "LatticeSharingTests", dependencies: ["LatticeSharing", "LatticeCore", "CLibCrypto", "LatticeTestSupport"]),
        .testTarget(
            name: "SystemLibraryTests",
            dependencies: ["CSQLite", "CLibCrypto", "CMicroHTTPD", "CHTTPShims", "CZlib"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
