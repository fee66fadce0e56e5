// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Lattice",
    products: [
        .library(name: "LatticeCore", targets: ["LatticeCore"]),
        .library(name: "LatticeServer", targets: ["LatticeServer"]),
        .library(name: "LatticeSync", targets: ["LatticeSync"]),
        .executable(name: "lattice", targets: ["LatticeCLI"]),
        .executable(name: "lattice-bench", targets: ["LatticeBench"]),
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
        // Our own C: non-variadic wrappers for variadic or macro-only C APIs.
        .target(name: "CHTTPShims", dependencies: ["CMicroHTTPD"]),

        // Memory hints Swift lacks: a cache prefetch for the zone's frame walks, page population for fresh
        // export buffers (madvise).
        .target(name: "CMemoryHints"),

        // The CRDT record model. Foundation only (and the memory hints), no I/O.
        .target(name: "LatticeCore", dependencies: ["CMemoryHints"]),

        // Storage: the only module that speaks SQL (SQLite embedded, PostgreSQL through libpq).
        .target(name: "LatticeStore", dependencies: ["LatticeCore", "CSQLite", "CPostgres"]),

        // Secrets: bearer tokens now, share-signing keys next. The only module that touches secrets.
        .target(name: "LatticeSharing", dependencies: ["LatticeCore", "CLibCrypto"]),

        // The service: Request -> Response core (routing, auth, endpoints, errors). Only its HTTP/ folder
        // imports CMicroHTTPD.
        .target(
            name: "LatticeServer",
            dependencies: ["LatticeCore", "LatticeStore", "LatticeSharing", "CMicroHTTPD", "CHTTPShims"]
        ),

        // The client engine (CKSyncEngine-like): local replica, pending changes, sync state, transport.
        .target(name: "LatticeSync", dependencies: ["LatticeCore", "LatticeStore"]),

        // `lattice admin` opens the share-signing key ring (LatticeSharing) and the storage (LatticeStore) directly.
        .executableTarget(
            name: "LatticeCLI",
            dependencies: ["LatticeCore", "LatticeServer", "LatticeSharing", "LatticeStore", "LatticeSync"]
        ),
        .executableTarget(
            name: "LatticeBench",
            dependencies: [
                "LatticeCore", "LatticeServer", "LatticeStore", "LatticeSync", "CLibCrypto", "CSQLite", "CPostgres",
            ],
            path: "Benchmarks/LatticeBench"
        ),

        // Test support shared by the test targets: the backend switch (LATTICE_TEST_BACKEND) and throwaway
        // PostgreSQL databases and clusters. In no product: the shipped libraries and executables do not contain it.
        .target(
            name: "LatticeTestSupport", dependencies: ["LatticeStore", "CPostgres"], path: "Tests/LatticeTestSupport"
        ),

        .testTarget(name: "LatticeCoreTests", dependencies: ["LatticeCore"]),
        .testTarget(name: "LatticeStoreTests", dependencies: ["LatticeStore", "LatticeCore", "LatticeTestSupport"]),
        .testTarget(
            name: "LatticeServerTests",
            dependencies: ["LatticeServer", "LatticeStore", "LatticeSharing", "LatticeSync", "LatticeCore",
                           "LatticeTestSupport"]
        ),
        .testTarget(
            name: "LatticeSyncTests",
            dependencies: ["LatticeSync", "LatticeServer", "LatticeSharing", "LatticeStore", "LatticeCore",
                           "LatticeTestSupport"]
        ),
        .testTarget(name: "LatticeSharingTests", dependencies: ["LatticeSharing", "LatticeCore", "CLibCrypto"]),
        .testTarget(
            name: "SystemLibraryTests",
            dependencies: ["CSQLite", "CLibCrypto", "CMicroHTTPD", "CHTTPShims"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
