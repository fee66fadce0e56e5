/// A last-writer-wins register: the write with the greatest `Stamp` (hlc, then replica id) wins.
///
/// A `nil` value is a write that cleared the field; it wins and loses like any other write.
/// Equal stamps only arise from a replica reusing a stamp (a bug or a forged input); to stay
/// commutative even then, the greater value (by `ScalarValue` order, `nil` lowest) wins the tie.
public struct LWWRegister: Hashable, Sendable {
    public private(set) var value: ScalarValue?
    public private(set) var stamp: Stamp

    public init(value: ScalarValue?, stamp: Stamp) {
        self.value = value
        self.stamp = stamp
    }

    /// A local write: applied only if it is newer than the current one (a well-behaved clock ensures it is).
    public mutating func set(_ value: ScalarValue?, at stamp: Stamp) {
        merge(LWWRegister(value: value, stamp: stamp))
    }

    /// The join: keeps whichever write wins.
    @inline(__always)
    public mutating func merge(_ other: LWWRegister) {
        if other.stamp.hlc.rawValue != stamp.hlc.rawValue || other.stamp.replica != stamp.replica {
            if stamp < other.stamp { self = other }
        } else if LWWRegister.valueOrder(value, other.value) < 0 {
            self = other
        }
    }

    public func merging(_ other: LWWRegister) -> LWWRegister {
        var copy = self
        copy.merge(other)
        return copy
    }

    static func valueOrder(_ a: ScalarValue?, _ b: ScalarValue?) -> Int {
        switch (a, b) {
        case (nil, nil): return 0
        case (nil, _): return -1
        case (_, nil): return 1
        case let (x?, y?): return ScalarValue.compare(x, y)
        }
    }
}
