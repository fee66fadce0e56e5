import Foundation
import LatticeTestSupport

// The suite's calls (`Self.ok`, `CLITests.lattice`, `World`) go to the shared harness in LatticeTestSupport.
extension CLITests {
    typealias PipeReader = LatticeCLI.PipeReader
    typealias Outcome = LatticeCLI.Outcome
    typealias World = LatticeCLI.World

    static func start(_ arguments: [String], home: String?, latticeHome: String? = nil) throws
        -> (Process, PipeReader, PipeReader) {
        try LatticeCLI.start(arguments, home: home, latticeHome: latticeHome)
    }

    @discardableResult
    static func lattice(_ arguments: String..., home: String? = nil) throws -> Outcome {
        try LatticeCLI.lattice(arguments: arguments, home: home)
    }

    /// Runs a command that must succeed.
    @discardableResult
    static func ok(_ arguments: String..., home: String? = nil) throws -> Outcome {
        try LatticeCLI.ok(arguments: arguments, home: home)
    }
}
