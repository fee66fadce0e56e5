import Testing
@testable import LatticeCore

@Suite("A frame's record dictionary without fields, written from its header")
struct FrameJSONTests {
    @Test("equals the decoded record's dictionary with no fields and the server's members, serialized")
    func noFieldsAnswerBytes() throws {
        let seed: UInt64 = 0xB17E_5A11
        print("[frame json] seed \(seed)")
        var rng = SplitMix64(seed: seed)
        var deleted = 0, parented = 0
        for index in 0 ..< 3_000 {
            let record = RandomRecord.make(&rng)
            let frame = try RecordFrame(encoding: record)
            let server = RecordFrame.ServerFields(changeTag: "\(index)-x\"y", createdMs: Int64(index), createdBy: "_c\(index)",
                                                  modifiedMs: Int64(index) * 7, modifiedBy: "_m\\é")
            guard case .object(var object) = record.cloudKitJSON(fields: []) else { Issue.record("not an object"); return }
            object["recordChangeTag"] = .string(server.changeTag)
            object["created"] = .object(["timestamp": .int(server.createdMs), "userRecordName": .string(server.createdBy)])
            object["modified"] = .object(["timestamp": .int(server.modifiedMs), "userRecordName": .string(server.modifiedBy)])
            var bytes: [UInt8] = []
            frame.appendCloudKitJSONWithoutFields(server, into: &bytes)
            #expect(bytes == JSON.object(object).serializedBytes(), "\(String(decoding: bytes, as: UTF8.self))")
            if record.isDeleted { deleted += 1 }
            if record.parentRegister != nil { parented += 1 }
        }
        // The cases the header distinguishes all occurred.
        #expect(deleted > 50 && parented > 50, "deleted \(deleted), with parent \(parented)")
    }
}

extension FrameJSONTests {
    @Test("a record written straight as bytes equals its dictionary serialized, all fields or some")
    func recordBytes() throws {
        let seed: UInt64 = 0xB17E_5A12
        print("[frame json] record bytes seed \(seed)")
        var rng = SplitMix64(seed: seed)
        for _ in 0 ..< 3_000 {
            let record = RandomRecord.make(&rng)
            let wanted: Set<String>? = rng.chance(30) ? Set(RandomRecord.registerNames.filter { _ in rng.bool() }) : nil
            var bytes: [UInt8] = []
            record.appendCloudKitJSON(fields: wanted, into: &bytes)
            #expect(bytes == record.cloudKitJSON(fields: wanted).serializedBytes(), "\(String(decoding: bytes, as: UTF8.self))")
        }
    }
}
