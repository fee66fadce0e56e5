// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "Lattice",
    products: [
        .library(name: "LatticeCore", targets: ["LatticeCore"]),
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
            name: "CMicroHTTPD",
            pkgConfig: "libmicrohttpd",
            providers: [.apt(["libmicrohttpd-dev"])]
        ),
        // Our own C: non-variadic wrappers for variadic or macro-only C APIs.
        .target(name: "CHTTPShims", dependencies: ["CMicroHTTPD"]),

        // The CRDT record model. Foundation only, no I/O.
        .target(name: "LatticeCore"),

        // Storage: the only module that speaks SQL.
        .target(name: "LatticeStore", dependencies: ["LatticeCore", "CSQLite"]),

        .executableTarget(name: "LatticeCLI", dependencies: ["LatticeCore"]),
        .executableTarget(name: "LatticeBench", dependencies: ["LatticeCore", "CLibCrypto"], path: "Benchmarks/LatticeBench"),

        .testTarget(name: "LatticeCoreTests", dependencies: ["LatticeCore"]),
        .testTarget(name: "LatticeStoreTests", dependencies: ["LatticeStore"]),
        .testTarget(
            name: "SystemLibraryTests",
            dependencies: ["CSQLite", "CLibCrypto", "CMicroHTTPD", "CHTTPShims"]
        ),
    ],
    swiftLanguageModes: [.v6]
)
