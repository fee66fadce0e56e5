// lattice-bench: Lattice's benchmarks. `merge` (merge throughput of LatticeCore on workload lww-orset-v1),
// `serve` (the server's request rate in-process), `sync` (the whole service end to end).
// Usage: lattice-bench COMMAND --help

#if canImport(Glibc)
import Glibc
#endif

exit(Harness.main(arguments: Array(CommandLine.arguments.dropFirst())))
