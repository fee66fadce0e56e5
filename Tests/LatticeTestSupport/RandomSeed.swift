import Foundation

/// The seed of a randomized test: `LATTICE_SEED` to replay, otherwise fresh.
public enum RandomSeed {
    public static var current: UInt64 {
        if let text = ProcessInfo.processInfo.environment["LATTICE_SEED"], let seed = UInt64(text) { return seed }
        return UInt64.random(in: 1...UInt64.max)
    }
}
