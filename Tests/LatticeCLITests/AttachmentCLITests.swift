import Foundation
import LatticeCore
import LatticeTestSupport
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `lattice list attach` and `lattice list get`: a file attached on one device is uploaded before the item's
/// change, downloaded lazily on another (checked against its SHA-256) and kept in that home's asset cache; a
/// read-only participant cannot attach.
@Suite(.serialized) struct AttachmentCLITests {
    typealias World = LatticeCLI.World

    @Test func aFileAttachedOnOneDeviceIsSavedWholeOnAnother() throws {
        let world = try World()
        _ = try world.sharedGroceries()
        let seed = RandomSeed.current
        print("AttachmentCLITests: LATTICE_SEED=\(seed)")
        var generator = SplitMix64(seed: seed)
        let bytes = (0..<1_500_000).map { _ in UInt8(truncatingIfNeeded: generator.next()) }
        let photo = world.directory + "/milk photo.jpg"
        #expect(FileManager.default.createFile(atPath: photo, contents: Data(bytes)))

        let attached = try LatticeCLI.ok("list", "attach", "Groceries", "Milk", photo, "--json", home: world.alice).json
        #expect(attached["name"]?.stringValue == "milk photo.jpg")
        #expect(attached["synced"] == .bool(true))
        #expect(attached["fileChecksum"]?.stringValue == Data(SHA256.hash(bytes)).base64EncodedString())

        try LatticeCLI.ok("sync", home: world.bob)
        let shown = try LatticeCLI.ok("list", "show", "Groceries", "--json", home: world.bob).json
        let milk = try #require(shown["items"]?.arrayValue?.first { $0["text"]?.stringValue == "Milk" })
        #expect(milk["attachments"]?.arrayValue?.first?["name"]?.stringValue == "milk photo.jpg")
        #expect(milk["attachments"]?.arrayValue?.first?["size"] == .int(1_500_000))
        let text = try LatticeCLI.ok("list", "show", "Groceries", home: world.bob).stdout
        #expect(text.contains("attached: milk photo.jpg"))

        let out = world.directory + "/out"
        try FileManager.default.createDirectory(atPath: out, withIntermediateDirectories: true)
        let saved = try LatticeCLI.ok("list", "get", "Groceries", "Milk", "--out", out, "--json", home: world.bob).json
        #expect(saved["saved"]?.arrayValue?.first?.stringValue == out + "/milk photo.jpg")
        let copy = try #require(FileManager.default.contents(atPath: out + "/milk photo.jpg"))
        #expect(SHA256.hash([UInt8](copy)) == SHA256.hash(bytes))
        // The download is cached in bob's home; asking again does not overwrite a file that exists.
        #expect(FileManager.default.fileExists(atPath: world.bob + "/assets/" + Secrets.hexOf(SHA256.hash(bytes))))
        let again = try LatticeCLI.lattice("list", "get", "Groceries", "Milk", "--out", out, home: world.bob)
        #expect(again.status == 1 && again.stderr.contains("exists"))
        let missing = try LatticeCLI.lattice("list", "get", "Groceries", "Eggs", "--out", out, home: world.bob)
        #expect(missing.status == 1 && missing.stderr.contains("has no attachments"))
    }

    @Test func aReadOnlyParticipantCannotAttach() throws {
        let world = try World()
        _ = try world.sharedGroceries(permission: "read-only")
        let file = world.directory + "/note.txt"
        #expect(FileManager.default.createFile(atPath: file, contents: Data("hello".utf8)))
        let refused = try LatticeCLI.lattice("list", "attach", "Groceries", "Milk", file, home: world.bob)
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("read-only"), "\(refused.stderr)")
        let notAFile = try LatticeCLI.lattice("list", "attach", "Groceries", "Milk", world.directory, home: world.alice)
        #expect(notAFile.status != 0 && notAFile.stderr.contains("is not a file"))
    }
}

enum Secrets {
    static func hexOf(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }
}
