import Foundation
@testable import LatticeCore
import Testing

/// ASSETID values (CKAsset references) through the codec, the frame walks and JSON; and the client's SHA-256.
struct AssetValueTests {
    static func asset(_ seed: UInt8, size: Int64) -> AssetValue {
        AssetValue(checksum: (0..<32).map { UInt8(truncatingIfNeeded: Int($0) &* 7 &+ Int(seed)) }, size: size)!
    }

    @Test func assetsRoundTripThroughFramesAndAreFoundByTheWalk() throws {
        let id = Fixtures.recordID("item")
        func at(_ ms: UInt64) -> Stamp { Fixtures.stamp(Fixtures.epoch + ms, replica: 1) }
        let photo = Self.asset(1, size: 1_200_000), scan = Self.asset(2, size: 10), again = Self.asset(3, size: 0)
        var edit = try RecordEdit(creating: id, recordType: "Item", at: at(0))
        try edit.set("photo", to: .asset(photo), at: at(1))
        try edit.add([.asset(scan), .asset(again)], to: "files", at: at(2))
        try edit.set("title", to: .string("Milk"), at: at(3))
        let frame = try #require(try edit.applied())
        let checked = try RecordFrame(validating: frame.bytes)
        #expect(try checked.decoded()["photo"] == .scalar(.asset(photo)))
        #expect(try checked.decoded()["files"] == .list(.asset, [.asset(scan), .asset(again)]))
        #expect(Set(checked.assetValues) == [photo, scan, again])
        #expect(checked.domainViolation == nil)
        // The byte join keeps every asset of both sides (a concurrent add on another replica).
        var other = try RecordEdit(editing: frame)
        let extra = Self.asset(4, size: 5)
        try other.add([.asset(extra)], to: "files", at: Fixtures.stamp(Fixtures.epoch + 5, replica: 2))
        let theirs = try #require(try other.applied())
        let joined = frame.merged(with: theirs) ?? theirs
        #expect(Set(joined.assetValues) == [photo, scan, again, extra])
        #expect(try RecordFrame(encoding: try frame.decoded()).assetValues.count == 3)
    }

    @Test func assetJSONIsCloudKitsDictionaryAndBadOnesAreRefused() throws {
        let photo = Self.asset(9, size: 42)
        let json = ScalarValue.asset(photo).cloudKitJSON
        #expect(json == .object(["fileChecksum": .string(Data(photo.checksum).base64EncodedString()), "size": .int(42)]))
        // A receipt's extra keys (and a fetched downloadURL) are accepted and not kept.
        var receipt = json.objectValue!
        receipt["receipt"] = .string("r")
        receipt["downloadURL"] = .string("https://x/${f}")
        #expect(try ScalarValue(cloudKitJSON: .object(receipt), type: .asset, path: "f") == .asset(photo))
        for bad: JSON in [.string("x"), .object(["fileChecksum": .string("AAAA"), "size": .int(1)]),
                          .object(["fileChecksum": json["fileChecksum"]!, "size": .int(-1)]),
                          .object(["fileChecksum": json["fileChecksum"]!])] {
            #expect(throws: RecordJSONError.self) { try ScalarValue(cloudKitJSON: bad, type: .asset, path: "f") }
        }
        #expect(ValueType(cloudKitName: "ASSETID") == .asset)
    }

    @Test func sha256MatchesTheStandardVectorsInAnyPieces() {
        func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
        #expect(hex(SHA256.hash([])) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(hex(SHA256.hash(Array("abc".utf8))) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        let long = Array("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq".utf8)
        #expect(hex(SHA256.hash(long)) == "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1")
        let million = [UInt8](repeating: UInt8(ascii: "a"), count: 1_000_000)
        var pieces = SHA256()
        var offset = 0, step = 1
        while offset < million.count { // pieces of every length, across block boundaries
            let end = min(million.count, offset + step)
            million[offset..<end].withUnsafeBytes { pieces.update($0) }
            offset = end
            step = step % 200 + 1
        }
        #expect(hex(pieces.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0")
    }
}
