import CHTTPShims
import CLibCrypto
import CMicroHTTPD
import CSQLite
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

    @Test func microhttpdShimQuiescesThenStops() {
        var config = lattice_mhd_config(
            bind_address_be: UInt32(0x7F00_0001).bigEndian, port: 0, thread_pool_size: 2,
            connection_timeout_s: 30, per_ip_connection_limit: 16, connection_limit: 64,
            connection_memory_limit: 64 * 1024)
        let daemon = lattice_mhd_start(&config, refuseEverything, nil, nil, nil, nil, nil)
        #expect(daemon != nil)
        let listening = lattice_mhd_quiesce(daemon)
        #expect(listening >= 0)
        MHD_stop_daemon(daemon)
        if listening >= 0 { close(listening) }
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
