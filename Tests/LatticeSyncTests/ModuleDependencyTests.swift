import Foundation
import LatticeCore
import Testing

/// The modules' one-way dependencies, read from the package itself (`swift package describe --type json`),
/// so a new dependency in Package.swift fails here:
/// - the client library links only what a device needs: `LatticeSync` (and the lists model on it) depends,
///   directly or through another target, on nothing of the server, its storage, libpq, libmicrohttpd or the
///   secrets module;
/// - the operations (`LatticeOperations`) depend on no HTTP module, so HTTP cannot leak into the rules.
@Suite struct ModuleDependencyTests {
    static let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().path

    /// Each target's direct target dependencies, as SwiftPM describes the package.
    static func targetGraph() throws -> [String: [String]] {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        // A scratch path of its own: the test runs while the package's own build directory is in use.
        let scratch = NSTemporaryDirectory() + "lattice-describe-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: scratch) }
        process.arguments = ["swift", "package", "--package-path", packageRoot, "--scratch-path", scratch,
                             "describe", "--type", "json"]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        let bytes = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        try #require(process.terminationStatus == 0, "swift package describe failed")
        let description = try JSON.parse([UInt8](bytes))
        var graph: [String: [String]] = [:]
        for target in description["targets"]?.arrayValue ?? [] {
            guard let name = target["name"]?.stringValue else { continue }
            graph[name] = (target["target_dependencies"]?.arrayValue ?? []).compactMap(\.stringValue)
        }
        return graph
    }

    /// Every target `root` depends on, directly or not.
    static func closure(of root: String, in graph: [String: [String]]) -> Set<String> {
        var seen: Set<String> = []
        var pending = graph[root] ?? []
        while let next = pending.popLast() {
            if seen.insert(next).inserted { pending += graph[next] ?? [] }
        }
        return seen
    }

    static let serverSide: Set<String> = ["LatticeServer", "LatticeStore", "LatticeSharing", "CPostgres", "CMicroHTTPD",
                                          "CHTTPShims", "CLibCrypto"]

    @Test func theClientLibraryDependsOnNothingOfTheServer() throws {
        let graph = try Self.targetGraph()
        for library in ["LatticeSync", "LatticeLists"] {
            let dependencies = Self.closure(of: library, in: graph)
            print("\(library) depends on: \(dependencies.sorted().joined(separator: ", "))")
            #expect(graph[library] != nil, "\(library) is not a target of the package")
            #expect(dependencies.isDisjoint(with: Self.serverSide),
                    "\(library) depends on \(dependencies.intersection(Self.serverSide).sorted())")
            #expect(dependencies.isSubset(of: ["LatticeCore", "LatticeAPI", "CMemoryHints", "LatticeSQLite", "CSQLite", "LatticeSync"]),
                    "\(library) has a dependency beyond the client's: \(dependencies.sorted())")
        }
    }

    @Test func theOperationsDependOnNoHTTPModule() throws {
        let graph = try Self.targetGraph()
        let dependencies = Self.closure(of: "LatticeOperations", in: graph)
        print("LatticeOperations depends on: \(dependencies.sorted().joined(separator: ", "))")
        #expect(graph["LatticeOperations"] != nil, "LatticeOperations is not a target of the package")
        #expect(dependencies.isDisjoint(with: ["LatticeServer", "CMicroHTTPD", "CHTTPShims"]),
                "LatticeOperations depends on \(dependencies.intersection(["LatticeServer", "CMicroHTTPD", "CHTTPShims"]).sorted())")
        #expect(dependencies.contains("LatticeStore") && dependencies.contains("LatticeAPI"))
    }

    /// The check itself sees a dependency two steps away.
    @Test func theClosureFollowsIndirectDependencies() {
        let graph = ["LatticeSync": ["LatticeCore", "Middle"], "Middle": ["CPostgres"], "LatticeCore": []]
        #expect(Self.closure(of: "LatticeSync", in: graph) == ["LatticeCore", "Middle", "CPostgres"])
        #expect(!Self.closure(of: "LatticeSync", in: graph).isDisjoint(with: Self.serverSide))
    }
}
