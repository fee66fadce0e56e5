import CHTTPShims
import CLibCrypto
import CMicroHTTPD
import CSQLite
#if canImport(Glibc)
import Glibc
#endif
import Testing

/// The system-library targets link against Debian's libraries and the C shim starts a real daemon.
@Suite struct SystemLibraryTests {
    @Test func sqliteLinksAndOpensAnInMemoryDatabase() throws {
        #expect(sqlite3_libversion_number() >= 3_035_000)
        var db: OpaquePointer?
        #expect(sqlite3_open(":memory:", &db) == SQLITE_OK)
        defer { sqlite3_close(db) }
        #expect(sqlite3_exec(db, "CREATE TABLE t(x); INSERT INTO t VALUES (1);", nil, nil, nil) == SQLITE_OK)
    }

    @Test func libcryptoComputesSHA256() {
        let input = Array("abc".utf8)
        var digest = [UInt8](repeating: 0, count: Int(SHA256_DIGEST_LENGTH))
        var length: UInt32 = 0
        let ok = EVP_Digest(input, input.count, &digest, &length, EVP_sha256(), nil)
        #expect(ok == 1)
        let hex = digest.prefix(Int(length)).map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined()
        #expect(hex == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }

    @Test func microhttpdShimStartsOnLoopbackAndStops() {
        var config = lattice_mhd_config(
            bind_address_be: UInt32(0x7F00_0001).bigEndian, port: 0, thread_pool_size: 2,
            connection_timeout_s: 30, per_ip_connection_limit: 16, connection_limit: 64,
            connection_memory_limit: 64 * 1024)
        let daemon = lattice_mhd_start(&config, refuseEverything, nil, nil, nil, nil, nil)
        #expect(daemon != nil)
        #expect(lattice_mhd_bound_port(daemon) != 0)
        MHD_stop_daemon(daemon)
    }

    @Test func microhttpdShimClosesConnectionsItsAcceptPolicyRefuses() throws {
        var config = lattice_mhd_config(
            bind_address_be: UInt32(0x7F00_0001).bigEndian, port: 0, thread_pool_size: 2,
            connection_timeout_s: 30, per_ip_connection_limit: 16, connection_limit: 64,
            connection_memory_limit: 64 * 1024)
        let daemon = lattice_mhd_start_tracked(&config, refuseEverything, nil, nil, nil, nil, nil, nil, nil,
                                               { _, _, _ in MHD_Result(rawValue: 0)! }, nil)
        #expect(daemon != nil)
        defer { MHD_stop_daemon(daemon) }
        // A connection is accepted and closed at once: the first read sees the end.
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = lattice_mhd_bound_port(daemon).bigEndian
        address.sin_addr.s_addr = UInt32(0x7F00_0001).bigEndian
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        #expect(connected == 0)
        var timeout = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        _ = "GET / HTTP/1.1\r\nHost: x\r\n\r\n".withCString { send(fd, $0, strlen($0), 0) }
        var byte: UInt8 = 0
        #expect(recv(fd, &byte, 1, 0) <= 0, "the refused connection is closed without an answer")
    }

    @Test func microhttpdShimRejectsAZeroSizedThreadPool() {
        var config = lattice_mhd_config(
            bind_address_be: UInt32(0x7F00_0001).bigEndian, port: 0, thread_pool_size: 0,
            connection_timeout_s: 30, per_ip_connection_limit: 16, connection_limit: 64,
            connection_memory_limit: 64 * 1024)
        #expect(lattice_mhd_start(&config, refuseEverything, nil, nil, nil, nil, nil) == nil)
    }
}

private func refuseEverything(
    _ context: UnsafeMutableRawPointer?, _ connection: OpaquePointer?, _ url: UnsafePointer<CChar>?,
    _ method: UnsafePointer<CChar>?, _ version: UnsafePointer<CChar>?, _ uploadData: UnsafePointer<CChar>?,
    _ uploadSize: UnsafeMutablePointer<Int>?, _ connectionContext: UnsafeMutablePointer<UnsafeMutableRawPointer?>?
) -> MHD_Result {
    MHD_Result(rawValue: 0)!
}
