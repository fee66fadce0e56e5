import LatticeTestSupport

/// The `lattice` binary's harness (LatticeTestSupport) under the name the tests call it by.
typealias CLITests = LatticeCLI
