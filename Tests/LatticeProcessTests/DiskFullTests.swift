import Foundation
import LatticeCore
import LatticeStore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// A real `lattice serve` whose disk fills up during writes, two ways: a small tmpfs filled with a ballast
/// file (ENOSPC; needs root to mount), and a file-size limit set on the running process (`RLIMIT_FSIZE`,
/// EFBIG; works for anyone). Either way, without a restart: writes are refused with TRY_AGAIN_LATER and a
/// reason naming the full disk (never INTERNAL_ERROR), a refused batch writes nothing, nothing acknowledged
/// is lost, reads go on, and writes succeed again once space returns; `integrity_check` is ok afterwards.
@Suite(.serialized) struct DiskFullTests {
    static let base = CrashSuite.base

    @Test(.enabled(if: geteuid() == 0, "mounting a tmpfs needs root"))
    func aFullFilesystemRefusesWritesClearlyAndRecoversWhenSpaceReturns() throws {
        let mountPoint = temporaryDirectory("lattice-tmpfs")
        defer { try? FileManager.default.removeItem(atPath: mountPoint) }
        let mounted = try Self.command("/usr/bin/mount", ["-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", mountPoint])
        guard mounted.status == 0 else {
            // A root without CAP_SYS_ADMIN (some containers): the file-size-limit test covers the same path.
            print(#"{"disk_full_test":"tmpfs","skipped":"mount failed: \#(mounted.output.prefix(200))"}"#)
            return
        }
        defer { _ = try? Self.command("/usr/bin/umount", [mountPoint]) }
        let ballast = mountPoint + "/ballast"
        try Self.exercise(data: mountPoint + "/data", label: "tmpfs",
                          fill: { _ in
                              // Fill it, then leave 1 MiB: the disk fills up during the writes that follow.
                              let written = try Self.fillDisk(ballast)
                              guard truncate(ballast, off_t(max(0, written - (1 << 20)))) == 0 else {
                                  throw HarnessError("truncate ballast: errno \(errno)")
                              }
                              return "ballast of \(written) bytes less 1 MiB"
                          },
                          free: { _ in try FileManager.default.removeItem(atPath: ballast) })
    }

    @Test func aFileSizeLimitRefusesWritesClearlyAndRecoversWhenItIsRaised() throws {
        let data = temporaryDirectory("lattice-fsize")
        defer { try? FileManager.default.removeItem(atPath: data) }
        try Self.exercise(data: data, label: "rlimit_fsize",
                          fill: { pid in
                              // Room for 1 MiB more than the largest file now: growth soon fails with EFBIG.
                              let sizes = [SQLiteStorage.fileName, SQLiteStorage.fileName + "-wal"].map {
                                  ((try? FileManager.default.attributesOfItem(atPath: data + "/" + $0)[.size]) as? Int) ?? 0
                              }
                              let limit = sizes.max()! + (1 << 20)
                              try Self.setFileSizeLimit(pid: pid, limit)
                              return "RLIMIT_FSIZE \(limit) bytes"
                          },
                          free: { pid in try Self.setFileSizeLimit(pid: pid, nil) })
    }

    // MARK: The scenario

    /// Writes acknowledged batches, fills the disk, writes until refused, checks reads and that nothing
    /// acknowledged is lost or half-written, gives the space back and checks that writes (the refused ones,
    /// retried with their operation ids) succeed again, all on one server process.
    static func exercise(data: String, label: String, fill: (pid_t) throws -> String, free: (pid_t) throws -> Void) throws {
        try FileManager.default.createDirectory(atPath: data, withIntermediateDirectories: true,
                                                attributes: [.posixPermissions: 0o700])
        let token = try CrashSuite.addUser("disk", data: data)
        let server = try ServerUnderTest(data: data)
        var stopped = false
        defer { if !stopped { server.kill(SIGKILL) } }
        let pid = server.process.processIdentifier
        let client = try RawHTTPClient(port: server.port, timeoutSeconds: 10)
        let headers = ["Authorization": "Bearer " + token]
        func post(_ operation: String, _ body: JSON) throws -> RawHTTPClient.Response {
            try client.send(method: "POST", path: base + operation, headers: headers, body: body.serializedBytes())
        }
        _ = try CrashSuite.setUpZone("Disk", port: server.port, token: token)

        var acknowledged: [CrashSuite.Batch] = []
        var acknowledgedWhileFilling = 0
        func send(_ batch: CrashSuite.Batch) throws -> RawHTTPClient.Response {
            try client.send(method: "POST", path: base + "records/modify", headers: headers, body: batch.body)
        }
        for index in 0..<10 {
            let batch = CrashSuite.batch("before\(index)", zone: "Disk", size: 5)
            let reply = try send(batch)
            try #require(reply.status == 200)
            acknowledged.append(batch)
        }

        let filled = try fill(pid)

        // Write 40 KB batches until the disk refuses several (bounded in count and time).
        var refused: [CrashSuite.Batch] = []
        var refusals: [JSON] = []
        var otherAnswers: [String] = []
        let started = Date()
        for index in 0..<2_000 where refused.count < 5 && Date().timeIntervalSince(started) < 60 {
            let batch = Self.bigBatch("full\(index)", zone: "Disk")
            let reply = try send(batch)
            if reply.status == 200 {
                acknowledged.append(batch)
                acknowledgedWhileFilling += 1
            } else if reply.status == 503, let error = try? JSON.parse(reply.body),
                      error["serverErrorCode"]?.stringValue == "TRY_AGAIN_LATER" {
                refused.append(batch)
                refusals.append(error)
                #expect(error["reason"]?.stringValue?.contains("disk is full") == true, "\(error)")
                #expect(reply.headers["retry-after"] != nil)
            } else {
                otherAnswers.append("\(reply.status): \(String(decoding: reply.body.prefix(300), as: UTF8.self))")
                if otherAnswers.count >= 3 { break }
            }
        }
        if !otherAnswers.isEmpty {
            server.kill(SIGTERM)
            stopped = true
            Issue.record("answers other than 200 and TRY_AGAIN_LATER: \(otherAnswers); the server logged: \(server.standardError)")
            return
        }
        try #require(!refused.isEmpty, "the disk never filled (\(filled))")
        #expect(server.process.isRunning)

        // Reads go on while the disk is full, and show every acknowledged batch whole and no refused one.
        #expect(try client.send(method: "GET", path: "/healthz").status == 200)
        #expect(try post("users/current", .object([:])).status == 200)
        let lookup = try post("records/lookup", .object([
            "zoneID": .object(["zoneName": .string("Disk")]),
            "records": .array(acknowledged.prefix(10).map { .object(["recordName": .string($0.id + "-0")]) }),
        ]))
        #expect(lookup.status == 200)
        let found = (try? JSON.parse(lookup.body)["records"]?.arrayValue) ?? []
        #expect(found.count == min(10, acknowledged.count) && found.allSatisfy { $0["serverErrorCode"] == nil })
        let whileFull = try CrashSuite.readZone("Disk", port: server.port, token: token)
        try checkZone(whileFull, acknowledged: acknowledged, absent: refused, when: "while the disk is full")

        // Space returns: the refused batches, retried with their operation ids, apply now (once), and so
        // does a new one, on the same process.
        try free(pid)
        for batch in refused + [Self.bigBatch("after", zone: "Disk")] {
            let reply = try send(batch)
            #expect(reply.status == 200, "\(batch.id) after space returned: \(String(decoding: reply.body.prefix(300), as: UTF8.self))")
            #expect(reply.headers["lattice-replayed"] == nil, "a refused batch had been applied")
            if reply.status == 200 { acknowledged.append(batch) }
        }
        let after = try CrashSuite.readZone("Disk", port: server.port, token: token)
        try checkZone(after, acknowledged: acknowledged, absent: [], when: "after space returned")
        let integrity = try SQLiteStorage.integrityCheck(path: data + "/" + SQLiteStorage.fileName)
        #expect(integrity == ["ok"])
        #expect(server.process.isRunning)
        print(#"{"disk_full_test":"\#(label)","filled_with":"\#(filled)","acknowledged_batches":\#(acknowledged.count),"#
              + #""acknowledged_while_filling":\#(acknowledgedWhileFilling),"#
              + #""refused_batches":\#(refused.count),"other_answers":\#(otherAnswers.count),"#
              + #""integrity":"\#(integrity.joined(separator: ";"))","reason":\#(refusals.first?["reason"]?.serialized() ?? "null")}"#)

        server.kill(SIGTERM)
        stopped = true
        #expect(server.process.terminationStatus == 0)
        #expect(server.standardError.contains("disk holding the data directory is full"))
    }

    /// 20 records of 2 KB each and the tally entry: about 40 KB.
    static func bigBatch(_ id: String, zone: String) -> CrashSuite.Batch {
        var operations: [JSON] = (0..<20).map { item in
            operation("forceReplace", "\(id)-\(item)", fields: [
                "batch": value(.string(id)), "payload": value(.string(String(repeating: "d", count: 2_000))),
            ])
        }
        operations.append(.object(["operationType": .string("forceUpdate"), "record": .object([
            "recordName": .string("tally"),
            "fields": .object(["applied": .object(["add": .array([.string(id)]), "type": .string("STRING_LIST")])]),
        ])]))
        let body = JSON.object(["zoneID": .object(["zoneName": .string(zone)]), "atomic": .bool(true),
                                "clientOperationID": .string("op-" + id), "operations": .array(operations)])
        return CrashSuite.Batch(id: id, size: 20, body: body.serializedBytes())
    }

    static func checkZone(_ state: CrashSuite.ZoneState, acknowledged: [CrashSuite.Batch], absent: [CrashSuite.Batch],
                          when: String) throws {
        for batch in acknowledged {
            #expect(state.recordsPerBatch[batch.id] == batch.size && state.tally.contains(batch.id),
                    "\(when): acknowledged batch \(batch.id) holds \(state.recordsPerBatch[batch.id] ?? 0) of \(batch.size)")
        }
        for batch in absent {
            #expect(state.recordsPerBatch[batch.id] == nil && !state.tally.contains(batch.id),
                    "\(when): refused batch \(batch.id) was written in part")
        }
        let known = Set(acknowledged.map(\.id))
        #expect(Set(state.recordsPerBatch.keys).union(state.tally).isSubset(of: known), "\(when): an unknown batch")
    }

    // MARK: Filling the disk

    /// Writes zeros to `path` until the filesystem has no room left; returns the bytes written.
    static func fillDisk(_ path: String) throws -> Int {
        let descriptor = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        guard descriptor >= 0 else { throw HarnessError("open \(path): errno \(errno)") }
        defer { close(descriptor) }
        var total = 0
        for chunkSize in [1 << 20, 4_096, 512] {
            let chunk = [UInt8](repeating: 0, count: chunkSize)
            for _ in 0..<100_000 {  // bounded: 16 MiB needs far fewer
                let written = chunk.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
                if written <= 0 {
                    guard errno == ENOSPC || written == 0 else { throw HarnessError("write \(path): errno \(errno)") }
                    break
                }
                total += written
            }
        }
        return total
    }

    /// Sets the soft `RLIMIT_FSIZE` of a running process (nil: unlimited), with util-linux `prlimit`
    /// (Glibc's `prlimit(2)` wrapper is not visible to Swift); the hard limit stays.
    static func setFileSizeLimit(pid: pid_t, _ bytes: Int?) throws {
        let soft = bytes.map(String.init) ?? "unlimited"
        let result = try command("/usr/bin/prlimit", ["--pid", String(pid), "--fsize=\(soft):"])
        guard result.status == 0 else { throw HarnessError("prlimit --fsize=\(soft): \(result.output)") }
    }

    static func command(_ path: String, _ arguments: [String]) throws -> (status: Int32, output: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let bytes = output.fileHandleForReading.readDataToEndOfFile()
        process.waitUntilExit()
        return (process.terminationStatus, String(decoding: bytes, as: UTF8.self))
    }
}
