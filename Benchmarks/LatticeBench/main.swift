// lattice-bench: Lattice's benchmarks. `merge` (merge throughput of LatticeCore on workload lww-orset-v1),
// `serve` (the server's request rate in-process), `sync` (the whole service end to end), `soak` (mixed
// traffic for minutes: latency, memory, open files and connections over time).
// Usage: lattice-bench COMMAND --help

#if canImport(Glibc)
import Glibc
#endif

exit(Harness.main(arguments: Array(CommandLine.arguments.dropFirst())))
