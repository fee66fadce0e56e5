// lattice-bench: merge-throughput benchmark of LatticeCore on workload lww-orset-v1.
// Usage: lattice-bench merge --help

#if canImport(Glibc)
import Glibc
#endif

exit(Harness.main(arguments: Array(CommandLine.arguments.dropFirst())))
