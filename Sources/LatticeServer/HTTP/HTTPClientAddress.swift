import LatticeOperations
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An IPv4 or IPv6 address as 128 bits, IPv4 in its IPv4-mapped form (`::ffff:a.b.c.d`). An IPv6 address
/// written IPv4-mapped is the IPv4 address: both have `isIPv4` set and compare equal.
struct IPAddress: Sendable, Hashable {
    /// The first and last 64 bits, network byte order read as big-endian numbers.
    let high: UInt64
    let low: UInt64

    /// The longest text `init?(_:)` looks at: a full IPv6 address with an IPv4 tail is 45 characters.
    static let maximumTextLength = 45

    /// Bits 0...95 of an IPv4-mapped address: `::ffff:`.
    private static let mappedHigh: UInt64 = 0
    private static let mappedLowPrefix: UInt64 = 0x0000_ffff_0000_0000

    init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }

    init(ipv4: UInt32) {
        self.init(high: Self.mappedHigh, low: Self.mappedLowPrefix | UInt64(ipv4))
    }

    /// A dotted IPv4 address (`192.0.2.1`) or an IPv6 address (`2001:db8::1`, `::ffff:192.0.2.1`), as
    /// `inet_pton` reads them: no brackets, port, zone (`%eth0`), surrounding spaces or NUL (which would
    /// end the C string early). Nil otherwise.
    init?<Text: StringProtocol>(_ text: Text) {
        guard !text.isEmpty, text.utf8.count <= Self.maximumTextLength, !text.utf8.contains(0) else { return nil }
        let string = String(text)
        var v4 = in_addr()
        if inet_pton(AF_INET, string, &v4) == 1 {
            self.init(ipv4: UInt32(bigEndian: v4.s_addr))
            return
        }
        var v6 = in6_addr()
        guard inet_pton(AF_INET6, string, &v6) == 1 else { return nil }
        let bytes = withUnsafeBytes(of: &v6) { Array($0) }
        var high: UInt64 = 0
        var low: UInt64 = 0
        for index in 0..<8 { high = high << 8 | UInt64(bytes[index]) }
        for index in 8..<16 { low = low << 8 | UInt64(bytes[index]) }
        self.init(high: high, low: low)
    }

    /// Whether this is an IPv4 address (or one written IPv4-mapped).
    var isIPv4: Bool { high == Self.mappedHigh && low & 0xffff_ffff_0000_0000 == Self.mappedLowPrefix }

    /// The first `bits` (0...128) bits, the rest zero.
    func masked(toPrefix bits: Int) -> IPAddress {
        let highMask: UInt64 = bits <= 0 ? 0 : bits >= 64 ? .max : .max << UInt64(64 - bits)
        let lowMask: UInt64 = bits <= 64 ? 0 : bits >= 128 ? .max : .max << UInt64(128 - bits)
        return IPAddress(high: high & highMask, low: low & lowMask)
    }

    /// `192.0.2.1` for IPv4 (also when written IPv4-mapped), else the shortest IPv6 form (`2001:db8::1`).
    var text: String {
        if isIPv4 {
            let value = UInt32(truncatingIfNeeded: low)
            return "\(value >> 24).\(value >> 16 & 0xff).\(value >> 8 & 0xff).\(value & 0xff)"
        }
        var v6 = in6_addr()
        withUnsafeMutableBytes(of: &v6) { bytes in
            for index in 0..<8 { bytes[index] = UInt8(truncatingIfNeeded: high >> UInt64(56 - 8 * index)) }
            for index in 0..<8 { bytes[8 + index] = UInt8(truncatingIfNeeded: low >> UInt64(56 - 8 * index)) }
        }
        var buffer = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
        guard inet_ntop(AF_INET6, &v6, &buffer, socklen_t(buffer.count)) != nil else { return "" }
        return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
    }
}

/// What per-address limits count a client under.
enum ClientAddress {
    /// The prefix an IPv6 client is counted by: /64 is what one end user (a home, a phone) is given, so
    /// rotating addresses inside it gains nothing.
    static let ipv6LimitPrefix = 64

    /// The key of `address` for per-address limits (connections, throttles, sign-up and device sign-in
    /// limits, failed authentications): an IPv4 address (also written IPv4-mapped, `::ffff:192.0.2.1`) as
    /// itself, `192.0.2.1`; an IPv6 address as its /64, `2001:db8:1:2::/64`; anything else (an empty
    /// address, as requests built in-process have) unchanged. Logs keep the full address.
    static func limitKey(_ address: String) -> String {
        guard let parsed = IPAddress(address) else { return address }
        if parsed.isIPv4 { return parsed.text }
        return parsed.masked(toPrefix: ipv6LimitPrefix).text + "/\(ipv6LimitPrefix)"
    }
}

extension HTTPRequestHead {
    /// `remoteAddress` as per-address limits count it: `ClientAddress.limitKey(_:)`.
    var addressLimitKey: String { ClientAddress.limitKey(remoteAddress) }
}

extension HTTPRequest {
    /// Where the request came from, as operations see it: its address and the key per-address limits use.
    var origin: ClientOrigin { ClientOrigin(address: remoteAddress, limitKey: ClientAddress.limitKey(remoteAddress)) }

    /// `remoteAddress` as per-address limits count it: `ClientAddress.limitKey(_:)`.
    var addressLimitKey: String { ClientAddress.limitKey(remoteAddress) }
}

/// An IPv4 or IPv6 address or CIDR block (`127.0.0.1`, `10.0.0.0/8`, `2001:db8::1`, `2001:db8::/32`), for
/// `HTTPServerConfiguration.trustedProxies`. Bits past the prefix are ignored (`10.1.2.3/8` is
/// `10.0.0.0/8`). An IPv4 block matches IPv4 addresses (also written IPv4-mapped), an IPv6 block IPv6
/// ones; an IPv4-mapped block of /96 or longer (`::ffff:10.0.0.0/104`) is the IPv4 block (`10.0.0.0/8`).
struct AddressBlock: Sendable, Equatable {
    let network: IPAddress
    /// Of the 128 bits (an IPv4 /8 is 104).
    let prefixLength: Int
    let isIPv4: Bool

    init?(_ text: String) {
        guard text.utf8.count <= IPAddress.maximumTextLength + 4 else { return nil }
        let parts = text.split(separator: "/", maxSplits: 2, omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let address = IPAddress(parts[0]) else { return nil }
        let writtenAsIPv4 = !parts[0].contains(":")
        var bits = 128
        if parts.count == 2 {
            let digits = parts[1]
            guard (1...3).contains(digits.utf8.count), digits.utf8.allSatisfy({ (0x30...0x39).contains($0) }),
                  let prefix = Int(digits), prefix <= (writtenAsIPv4 ? 32 : 128) else { return nil }
            bits = writtenAsIPv4 ? 96 + prefix : prefix
        }
        if address.isIPv4 && !writtenAsIPv4 && bits < 96 {
            // ::ffff:0:0/80 and the like: an IPv6 block; it covers no real IPv6 client beyond mapped ones.
            isIPv4 = false
        } else {
            isIPv4 = address.isIPv4
        }
        prefixLength = bits
        network = address.masked(toPrefix: bits)
    }

    func contains(_ address: IPAddress) -> Bool {
        address.isIPv4 == isIPv4 && address.masked(toPrefix: prefixLength) == network
    }
}

/// Who the client of a request is: the TCP peer, or, when the peer is a trusted proxy, the right-most
/// address of `X-Forwarded-For` that is not itself a trusted proxy (each proxy appends the address it
/// was connected from, so addresses left of the first untrusted one are whatever the client sent).
struct ClientAddressResolver: Sendable {
    let trusted: [AddressBlock]

    /// Entries of `X-Forwarded-For` looked at, from the right (empty ones count too): past them (all
    /// trusted proxies or empty) the header is not believed.
    static let maximumHops = 32

    init(trustedProxies: [String]) {
        trusted = trustedProxies.compactMap(AddressBlock.init)
    }

    func isTrustedProxy(_ peer: String) -> Bool {
        guard !trusted.isEmpty, let address = IPAddress(peer) else { return false }
        return isTrusted(address)
    }

    private func isTrusted(_ address: IPAddress) -> Bool { trusted.contains { $0.contains(address) } }

    /// The client's address for a request from `peer` with these (lowercased) headers, and whether it
    /// came from the forwarded header. From a peer that is not a trusted proxy, or when the header is
    /// missing or malformed (an entry that is not a bare address, or no untrusted address within the
    /// right-most `maximumHops` entries), the peer. If every address in the header is a trusted proxy, the left-most one.
    func client(peer: String, headers: [String: String]) -> (address: String, forwarded: Bool) {
        guard isTrustedProxy(peer), let header = headers["x-forwarded-for"],
              let found = rightmostUntrusted(header) else { return (peer, false) }
        return (found, true)
    }

    /// Walks `header` from the right, one comma-separated entry at a time (empty entries skipped), and
    /// returns the first address that is not a trusted proxy; nil for an entry that is not an address.
    /// At most `maximumHops` entries are read, and only entries of at most `IPAddress.maximumTextLength`
    /// characters are parsed.
    private func rightmostUntrusted(_ header: String) -> String? {
        var rest = Substring(header)
        var leftmostTrusted: String?
        var hops = 0
        while true {
            let entry: Substring
            let comma = rest.utf8.lastIndex(of: UInt8(ascii: ","))
            if let comma {
                entry = rest[rest.utf8.index(after: comma)...]
                rest = rest[..<comma]
            } else {
                entry = rest
            }
            hops += 1
            guard hops <= Self.maximumHops else { return nil }
            let trimmed = entry.trimmingSpacesAndTabs
            if !trimmed.isEmpty {
                guard let address = IPAddress(trimmed) else { return nil }
                if !isTrusted(address) { return String(trimmed) }
                leftmostTrusted = String(trimmed)
            }
            if comma == nil { return leftmostTrusted }
        }
    }
}

extension Substring {
    /// Without leading and trailing spaces and tabs (on the UTF-8 view, so a long run costs no more
    /// than a scan).
    fileprivate var trimmingSpacesAndTabs: Substring {
        let isBlank: (UInt8) -> Bool = { $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\t") }
        guard let first = utf8.firstIndex(where: { !isBlank($0) }) else { return self[endIndex...] }
        let last = utf8.lastIndex(where: { !isBlank($0) })!
        return self[first...last]
    }
}

extension HTTPServerConfiguration {
    /// Whether `text` is a valid entry of `trustedProxies`: an IPv4 or IPv6 address or CIDR block
    /// (`10.0.0.0/8`, `2001:db8::/32`), as `lattice serve --trusted-proxy` takes it.
    public static func isAddressOrBlock(_ text: String) -> Bool { AddressBlock(text) != nil }
}
