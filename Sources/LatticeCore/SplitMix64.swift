/// SplitMix64 (Steele, Lea & Flood 2014): a tiny, fast, fully deterministic 64-bit generator.
///
/// The one definition of the generator for the tests (a printed seed replays a run exactly) and for the
/// benchmark, whose `lww-orset-v1` workload spec defines its values through this exact sequence. Not for
/// secrets: LatticeSharing draws those from the system's generator.
///
/// ```swift
/// var rng = SplitMix64(seed: 7)
/// let first = rng.next()       // the same on every machine and toolchain
/// let die = Int.random(in: 1...6, using: &rng)
/// ```
public struct SplitMix64: RandomNumberGenerator, Sendable {
    /// The current state; `next()` advances it before mixing.
    @usableFromInline var state: UInt64

    public init(seed: UInt64) { state = seed }

    /// The next 64-bit output.
    @inlinable
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
