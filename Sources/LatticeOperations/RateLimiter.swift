import Synchronization

/// Token buckets per caller: `burst` requests at once, refilled at `requestsPerSecond`.
package final class RateLimiter: Sendable {
    private struct Bucket {
        var tokens: Double
        var updatedMs: Int64
    }

    private let limit: ServiceConfiguration.RateLimit
    private let buckets = Mutex<[String: Bucket]>([:])

    package init(_ limit: ServiceConfiguration.RateLimit) {
        self.limit = limit
    }

    /// Whether `key` has a token left, without taking it: nil when it has, or the whole seconds to wait.
    package func wait(_ key: String, nowMs: Int64) -> Int? {
        buckets.withLock { buckets in
            guard let bucket = buckets[key] else { return nil }
            let elapsed = Double(max(0, nowMs - bucket.updatedMs)) / 1000
            let tokens = min(limit.burst, bucket.tokens + elapsed * limit.requestsPerSecond)
            guard tokens < 1 else { return nil }
            return max(1, Int(((1 - tokens) / max(limit.requestsPerSecond, 0.001)).rounded(.up)))
        }
    }

    /// Takes one token for `key`; returns nil when allowed, or the whole seconds to wait.
    package func take(_ key: String, nowMs: Int64) -> Int? {
        buckets.withLock { buckets in
            var bucket = buckets[key] ?? Bucket(tokens: limit.burst, updatedMs: nowMs)
            let elapsed = Double(max(0, nowMs - bucket.updatedMs)) / 1000
            bucket.tokens = min(limit.burst, bucket.tokens + elapsed * limit.requestsPerSecond)
            bucket.updatedMs = nowMs
            if buckets.count > 100_000 { buckets.removeAll(keepingCapacity: true) } // bound memory under abuse
            guard bucket.tokens >= 1 else {
                buckets[key] = bucket
                let wait = (1 - bucket.tokens) / max(limit.requestsPerSecond, 0.001)
                return max(1, Int(wait.rounded(.up)))
            }
            bucket.tokens -= 1
            buckets[key] = bucket
            return nil
        }
    }
}
