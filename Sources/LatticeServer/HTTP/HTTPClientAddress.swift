import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// An IPv4 address or CIDR block (`127.0.0.1`, `10.0.0.0/8`), for `HTTPServerConfiguration.trustedProxies`.
struct AddressBlock: Sendable, Equatable {
    /// Host byte order.
    let network: UInt32
    let mask: UInt32

    init?(_ text: String) {
        let parts = text.split(separator: "/", omittingEmptySubsequences: false)
        guard (1...2).contains(parts.count), let address = Self.ipv4(String(parts[0])) else { return nil }
        var bits = 32
        if parts.count == 2 {
            guard let prefix = Int(parts[1]), (0...32).contains(prefix), parts[1].allSatisfy(\.isNumber) else { return nil }
            bits = prefix
        }
        mask = bits == 0 ? 0 : UInt32.max << UInt32(32 - bits)
        network = address & mask
    }

    func contains(_ address: UInt32) -> Bool { address & mask == network }

    /// A dotted IPv4 address in host byte order, or nil.
    static func ipv4(_ text: String) -> UInt32? {
        var address = in_addr()
        guard inet_pton(AF_INET, text, &address) == 1 else { return nil }
        return UInt32(bigEndian: address.s_addr)
    }
}

/// Who the client of a request is: the TCP peer, or, when the peer is a trusted proxy, the last address
/// of `X-Forwarded-For` (the one the proxy itself appended; earlier ones are whatever the client sent).
struct ClientAddressResolver: Sendable {
    let trusted: [AddressBlock]

    init(trustedProxies: [String]) {
        trusted = trustedProxies.compactMap(AddressBlock.init)
    }

    func isTrustedProxy(_ peer: String) -> Bool {
        guard !trusted.isEmpty, let address = AddressBlock.ipv4(peer) else { return false }
        return trusted.contains { $0.contains(address) }
    }

    /// The client's address for a request from `peer` with these (lowercased) headers, and whether it
    /// came from the forwarded header.
    func client(peer: String, headers: [String: String]) -> (address: String, forwarded: Bool) {
        guard isTrustedProxy(peer), let header = headers["x-forwarded-for"] else { return (peer, false) }
        guard let last = header.split(separator: ",").last?.trimmingCharacters(in: .whitespaces),
              Self.isIPAddress(last) else { return (peer, false) }
        return (last, true)
    }

    static func isIPAddress(_ text: String) -> Bool {
        guard text.utf8.count <= 45 else { return false }
        var v4 = in_addr()
        var v6 = in6_addr()
        return inet_pton(AF_INET, text, &v4) == 1 || inet_pton(AF_INET6, text, &v6) == 1
    }
}
