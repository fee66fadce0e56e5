import LatticeCore
import Testing

@testable import LatticeServer

/// Client addresses without sockets: trusted-proxy entries (IPv4 and IPv6 addresses and CIDR blocks),
/// block matching, the key per-address limits count a client under (an IPv6 client by its /64), and the
/// right-most-untrusted reading of `X-Forwarded-For`, malformed headers included.
@Suite struct ClientAddressTests {
    // MARK: Parsing

    @Test func addressesParseAsInetPtonReadsThemAndNothingElse() {
        for good in ["127.0.0.1", "0.0.0.0", "255.255.255.255", "::", "::1", "2001:db8::1", "::ffff:192.0.2.1",
                     "2001:0db8:0000:0000:0000:ff00:0042:8329", "fe80::1:2:3:4",
                     "ffff:ffff:ffff:ffff:ffff:ffff:255.255.255.255"] {
            #expect(IPAddress(good) != nil, "\(good)")
        }
        for bad in ["", " ", "1.2.3", "1.2.3.4.5", "256.1.1.1", "01.2.3.4", "1.2.3.4 ", " 1.2.3.4", "1.2.3.4:80",
                    "[2001:db8::1]", "[2001:db8::1]:443", "2001:db8::1%eth0", "2001:db8:::1", "1::2::3",
                    "g::1", "unknown", "localhost", "1.2.3.4/32", "١.٢.٣.٤", "1.2.3.4\u{0}", "1.2.3.4\u{0}junk",
                    String(repeating: "1", count: 46), String(repeating: "0:", count: 30) + "1"] {
            #expect(IPAddress(bad) == nil, "\(bad)")
        }
        // An IPv4-mapped IPv6 address is the IPv4 address.
        #expect(IPAddress("::ffff:192.0.2.1") == IPAddress("192.0.2.1"))
        #expect(IPAddress("::ffff:c000:201") == IPAddress("192.0.2.1"))
        #expect(IPAddress("::ffff:192.0.2.1")?.isIPv4 == true)
        #expect(IPAddress("::192.0.2.1")?.isIPv4 == false) // IPv4-compatible, not mapped: an IPv6 address
        #expect(IPAddress("::ffff:192.0.2.1")?.text == "192.0.2.1")
        #expect(IPAddress("2001:0DB8:0:0:0:0:0:0001")?.text == "2001:db8::1")
    }

    @Test func blocksAcceptAddressesAndPrefixesOfTheirFamilyOnly() {
        for good in ["10.0.0.0/8", "10.0.0.1", "10.0.0.1/32", "0.0.0.0/0", "192.168.1.77/24", "2001:db8::/32",
                     "2001:db8::1", "2001:db8::1/128", "::/0", "::ffff:10.0.0.0/104", "fe80::/10", "10.0.0.0/08"] {
            #expect(AddressBlock(good) != nil, "\(good)")
            #expect(HTTPServerConfiguration.isAddressOrBlock(good), "\(good)")
        }
        for bad in ["", "/8", "10.0.0.0/", "10.0.0.0/33", "10.0.0.0/-1", "10.0.0.0/+8", "10.0.0.0/8/8",
                    "10.0.0.0/ 8", "10.0.0.0 /8", "10.0.0/8", "2001:db8::/129", "2001:db8::/0128",
                    "2001:db8::/1e2", "10.0.0.0/٨", "[2001:db8::]/32", "2001:db8::%eth0/64", "example.com",
                    "10.0.0.0/8,10.0.0.1", "10.0.0.0/" + String(repeating: "9", count: 40)] {
            #expect(AddressBlock(bad) == nil, "\(bad)")
            #expect(!HTTPServerConfiguration.isAddressOrBlock(bad), "\(bad)")
        }
    }

    @Test func configurationValidationNamesTheBadProxy() {
        var configuration = HTTPServerConfiguration(host: "127.0.0.1", port: 0)
        configuration.trustedProxies = ["2001:db8::/32", "10.0.0.0/8", "10.0.0.0/40"]
        #expect(throws: HTTPServerError.invalidSetting(
            "trustedProxies", "must be IPv4 or IPv6 addresses or CIDR blocks, not 10.0.0.0/40")) {
            try configuration.validatedBindAddress()
        }
        configuration.trustedProxies = ["2001:db8::/32", "10.0.0.0/8"]
        #expect(throws: Never.self) { try configuration.validatedBindAddress() }
    }

    // MARK: Prefix matching

    @Test func blocksMatchTheirPrefixAndFamily() throws {
        func matches(_ block: String, _ address: String) throws -> Bool {
            try #require(AddressBlock(block)).contains(try #require(IPAddress(address)))
        }
        #expect(try matches("10.0.0.0/8", "10.255.1.2"))
        #expect(try !matches("10.0.0.0/8", "11.0.0.0"))
        #expect(try matches("10.1.2.3/8", "10.9.9.9"), "bits past the prefix are ignored")
        #expect(try matches("192.168.1.0/25", "192.168.1.127"))
        #expect(try !matches("192.168.1.0/25", "192.168.1.128"))
        #expect(try matches("127.0.0.1", "127.0.0.1"))
        #expect(try !matches("127.0.0.1", "127.0.0.2"))
        #expect(try matches("0.0.0.0/0", "203.0.113.9"))
        #expect(try !matches("0.0.0.0/0", "2001:db8::1"), "an IPv4 block holds no IPv6 address")
        // An IPv4 block holds the IPv4-mapped form of its addresses, and a mapped block is the IPv4 block.
        #expect(try matches("10.0.0.0/8", "::ffff:10.1.2.3"))
        #expect(try matches("::ffff:10.0.0.0/104", "10.1.2.3"))
        #expect(try !matches("::ffff:10.0.0.0/104", "11.1.2.3"))
        // IPv6.
        #expect(try matches("2001:db8::/32", "2001:db8:ffff::1"))
        #expect(try !matches("2001:db8::/32", "2001:db9::1"))
        #expect(try matches("2001:db8:0:8000::/49", "2001:db8:0:ffff::1"))
        #expect(try !matches("2001:db8:0:8000::/49", "2001:db8:0:7fff::1"))
        #expect(try matches("2001:db8::1/127", "2001:db8::"))
        #expect(try !matches("2001:db8::1/127", "2001:db8::2"))
        #expect(try matches("2001:db8::1", "2001:db8:0:0::1"))
        #expect(try !matches("2001:db8::1", "2001:db8::2"))
        #expect(try matches("::/0", "fe80::1"))
        #expect(try !matches("::/0", "10.0.0.1"), "an IPv6 block holds no IPv4 address")
        #expect(try !matches("::/0", "::ffff:10.0.0.1"))
    }

    // MARK: The limit key

    @Test func ipv6ClientsAreCountedByTheirSlash64AndIPv4ByAddress() {
        #expect(ClientAddress.limitKey("192.0.2.1") == "192.0.2.1")
        #expect(ClientAddress.limitKey("::ffff:192.0.2.1") == "192.0.2.1")
        #expect(ClientAddress.limitKey("::FFFF:c000:0201") == "192.0.2.1")
        #expect(ClientAddress.limitKey("2001:db8:1:2::a") == "2001:db8:1:2::/64")
        #expect(ClientAddress.limitKey("2001:db8:1:2:ffff:ffff:ffff:ffff") == "2001:db8:1:2::/64")
        #expect(ClientAddress.limitKey("2001:0DB8:0001:0002:0:0:0:1") == "2001:db8:1:2::/64")
        #expect(ClientAddress.limitKey("2001:db8:1:3::a") == "2001:db8:1:3::/64")
        #expect(ClientAddress.limitKey("::1") == "::/64")
        #expect(ClientAddress.limitKey("fe80::1") == "fe80::/64")
        // Not an address (requests made in-process have none): unchanged.
        #expect(ClientAddress.limitKey("") == "")
        #expect(ClientAddress.limitKey("unix") == "unix")

        let head = HTTPRequestHead(method: "GET", path: "/", remoteAddress: "2001:db8:1:2::77")
        #expect(head.addressLimitKey == "2001:db8:1:2::/64")
        #expect(head.remoteAddress == "2001:db8:1:2::77", "the full address is kept for logs")
        let request = HTTPRequest(method: "GET", path: "/", remoteAddress: "::ffff:198.51.100.7")
        #expect(request.addressLimitKey == "198.51.100.7")
    }

    // MARK: X-Forwarded-For

    private let resolver = ClientAddressResolver(trustedProxies: ["127.0.0.1", "10.0.0.0/8", "2001:db8:ffff::/48"])

    private func client(_ header: String?, peer: String = "127.0.0.1") -> (address: String, forwarded: Bool) {
        resolver.client(peer: peer, headers: header.map { ["x-forwarded-for": $0] } ?? [:])
    }

    @Test func theRightMostUntrustedHopIsTheClient() {
        #expect(client("203.0.113.5") == ("203.0.113.5", true))
        // Whatever the client put left of the hop the proxy appended is ignored.
        #expect(client("1.1.1.1, 203.0.113.5") == ("203.0.113.5", true))
        // Trusted proxies on the right are skipped, IPv4 and IPv6 alike.
        #expect(client("1.1.1.1, 203.0.113.5, 10.1.2.3") == ("203.0.113.5", true))
        #expect(client("1.1.1.1,203.0.113.5 ,\t10.1.2.3 , 2001:db8:ffff:1::9") == ("203.0.113.5", true))
        #expect(client("2001:db8:1:2::a, 2001:db8:ffff::1") == ("2001:db8:1:2::a", true))
        // A trusted address left of an untrusted one is not skipped to: the first untrusted one wins.
        #expect(client("10.9.9.9, 203.0.113.5, 10.1.2.3") == ("203.0.113.5", true))
        // Every hop trusted: the left-most.
        #expect(client("10.0.0.7, 10.0.0.8, 127.0.0.1") == ("10.0.0.7", true))
        // Empty entries are skipped.
        #expect(client("203.0.113.5,, ,") == ("203.0.113.5", true))
        // The address is kept as written, the key groups it.
        #expect(client("::ffff:203.0.113.5") == ("::ffff:203.0.113.5", true))
    }

    @Test func theHeaderIsBelievedFromTrustedProxiesOnly() {
        #expect(client("203.0.113.5", peer: "192.0.2.1") == ("192.0.2.1", false))
        #expect(client("203.0.113.5", peer: "11.0.0.1") == ("11.0.0.1", false))
        #expect(client("203.0.113.5", peer: "10.20.30.40") == ("203.0.113.5", true))
        #expect(client("203.0.113.5", peer: "::ffff:10.20.30.40") == ("203.0.113.5", true))
        #expect(client("203.0.113.5", peer: "2001:db8:ffff:abcd::1") == ("203.0.113.5", true))
        #expect(client("203.0.113.5", peer: "2001:db8:fffe::1") == ("2001:db8:fffe::1", false))
        #expect(client("203.0.113.5", peer: "") == ("", false))
        #expect(client(nil) == ("127.0.0.1", false))
        let nobody = ClientAddressResolver(trustedProxies: [])
        #expect(nobody.client(peer: "127.0.0.1", headers: ["x-forwarded-for": "203.0.113.5"]) == ("127.0.0.1", false))
    }

    @Test func aMalformedHeaderIsNotBelieved() {
        for header in ["", " ", ",", " , ,", "garbage", "203.0.113.5, garbage", "203.0.113.5:8080",
                       "[2001:db8::1]", "2001:db8::1%eth0", "unknown", "203.0.113.5 198.51.100.1", "\u{0}",
                       "203.0.113.5\u{0}junk",
                       "203.0.113.5, " + String(repeating: "9", count: 100_000)] {
            #expect(client(header) == ("127.0.0.1", false), "\(header.prefix(40))")
        }
        // A malformed entry behind the first untrusted hop is never read.
        #expect(client("garbage, 203.0.113.5") == ("203.0.113.5", true))
    }

    @Test func theWalkIsBoundedWhateverTheHeaderLength() {
        let hops = ClientAddressResolver.maximumHops
        // The client just within the bound, behind maximumHops - 1 trusted hops: found.
        let within = (["203.0.113.5"] + Array(repeating: "10.0.0.1", count: hops - 1)).joined(separator: ", ")
        #expect(client(within) == ("203.0.113.5", true))
        // One more trusted hop, or as many empty entries: the header is not believed.
        let beyond = (["203.0.113.5"] + Array(repeating: "10.0.0.1", count: hops)).joined(separator: ", ")
        #expect(client(beyond) == ("127.0.0.1", false))
        #expect(client("203.0.113.5" + String(repeating: ",", count: hops)) == ("127.0.0.1", false))
        // A huge header with a good last hop costs one hop: the rest is never looked at.
        let huge = String(repeating: "garbage, ", count: 200_000) + "203.0.113.5"
        #expect(client(huge) == ("203.0.113.5", true))
        // A huge header of trusted hops stops at the bound.
        let trustedFlood = Array(repeating: "10.0.0.1", count: 100_000).joined(separator: ",")
        #expect(client(trustedFlood) == ("127.0.0.1", false))
    }

    // MARK: The service's per-address limits

    @Test func signUpsBadTokensAndDeviceSignInsCountAnIPv6Slash64AsOneAddress() throws {
        let h = try ServiceHarness { configuration in
            configuration.signUpsPerAddress = 1
            configuration.signUpsGlobal = nil
            configuration.failedAuthenticationLimit = .init(requestsPerSecond: 0.001, burst: 1)
            configuration.deviceAuthorizationsPerAddress = 1
        }
        let service = h.service
        let home = "2001:db8:1:2::10", sameHome = "2001:db8:1:2:abcd::99", neighbour = "2001:db8:1:3::10"
        #expect(AbuseLimitTests.signUp(service, "first", from: home).status == 200)
        let again = AbuseLimitTests.signUp(service, "second", from: sameHome)
        #expect(again.code == "THROTTLED", "\(again.json.serialized())")
        #expect(again["reason"]?.stringValue?.contains("from this address") == true)
        #expect(AbuseLimitTests.signUp(service, "third", from: neighbour).status == 200)
        // IPv4, written plainly or IPv4-mapped, is one address.
        #expect(AbuseLimitTests.signUp(service, "fourth", from: "192.0.2.1").status == 200)
        #expect(AbuseLimitTests.signUp(service, "fifth", from: "::ffff:192.0.2.1").code == "THROTTLED")

        // One bad token from the /64 uses its bucket; the next, from another address of it, is throttled.
        let bad = "lt_" + String(repeating: "0", count: 64)
        #expect(AbuseLimitTests.send(service, AbuseLimitTests.currentUser, token: bad, from: home).status == 401)
        #expect(AbuseLimitTests.send(service, AbuseLimitTests.currentUser, token: bad, from: sameHome).code == "THROTTLED")
        #expect(AbuseLimitTests.send(service, AbuseLimitTests.currentUser, token: bad, from: neighbour).status == 401)

        // Device sign-ins waiting per address.
        #expect(AbuseLimitTests.send(service, "/auth/device/start", from: home).status == 200)
        #expect(AbuseLimitTests.send(service, "/auth/device/start", from: sameHome).code == "THROTTLED")
        #expect(AbuseLimitTests.send(service, "/auth/device/start", from: neighbour).status == 200)
    }
}
