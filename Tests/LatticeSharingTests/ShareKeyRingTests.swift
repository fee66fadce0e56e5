import Foundation
import LatticeCore
@testable import LatticeSharing
import Testing

@Suite struct ShareKeyRingTests {
    @Test func firstOpenCreatesAPrivateFileWithOneActiveKey() throws {
        let directory = try ShareTemporaryDirectory()
        defer { directory.remove() }
        let ring = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 1_000)
        #expect(ring.path == directory.path + "/share-keys.json")
        #expect(ShareFixtures.fileMode(ring.path) == 0o600)
        let keys = ring.keys
        #expect(keys.count == 1)
        #expect(keys[0].keyID == ring.activeKeyID && keys[0].createdMilliseconds == 1_000)
        #expect(keys[0].active && !keys[0].retired)
        // Nothing but the key file is left in the directory (no temporary files).
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["share-keys.json"])
        let file = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: ring.path))))
        #expect(file["format"] == .string("lattice-share-keys") && file["version"] == .int(1))
        #expect(file["keys"]?.arrayValue?.first?["d"]?.stringValue.flatMap(Base64URL.decode)?.count == 32)
    }

    @Test func keyFilePersistsAcrossReopen() throws {
        let directory = try ShareTemporaryDirectory()
        defer { directory.remove() }
        let first = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 1_000)
        let token = try first.sign(try ShareFixtures.claims())
        let contents = try Data(contentsOf: URL(fileURLWithPath: first.path))

        let second = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 99_000)
        #expect(second.activeKeyID == first.activeKeyID)
        #expect(second.keys.map(\.keyID) == first.keys.map(\.keyID))
        #expect(second.keys.map(\.createdMilliseconds) == [1_000])
        #expect(second.jwks() == first.jwks())
        #expect(try second.verify(token, nowSeconds: ShareFixtures.now)
            == first.verify(token, nowSeconds: ShareFixtures.now))
        // Ed25519 is deterministic: the reopened key signs the same claims to the same token.
        let claims = try ShareFixtures.claims()
        #expect(try second.sign(claims) == first.sign(claims))
        // Opening does not rewrite the file.
        #expect(try Data(contentsOf: URL(fileURLWithPath: first.path)) == contents)
        #expect(ShareFixtures.fileMode(second.path) == 0o600)
    }

    @Test func rotationKeepsOldTokensUntilRetirement() throws {
        let directory = try ShareTemporaryDirectory()
        defer { directory.remove() }
        let ring = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 1_000)
        let firstKey = ring.activeKeyID
        let claims = try ShareFixtures.claims()
        let oldToken = try ring.sign(claims)

        let secondKey = try ring.rotate(nowMilliseconds: 2_000)
        #expect(secondKey != firstKey && ring.activeKeyID == secondKey)
        let newToken = try ring.sign(claims)
        #expect(ShareFixtures.decodeJSON(ShareFixtures.parts(newToken)[0])["kid"] == .string(secondKey))
        #expect(try ring.verify(oldToken, nowSeconds: ShareFixtures.now) == claims)
        #expect(try ring.verify(newToken, nowSeconds: ShareFixtures.now) == claims)
        #expect(ring.jwks()["keys"]?.arrayValue?.compactMap { $0["kid"]?.stringValue } == [firstKey, secondKey])
        #expect(ring.keys.map(\.active) == [false, true])
        #expect(ShareFixtures.fileMode(ring.path) == 0o600)

        // Only the active key's private half is kept.
        let file = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: ring.path))))
        #expect(file["keys"]?.arrayValue?.map { $0["d"] != nil } == [false, true])

        try ring.retire(keyID: firstKey)
        #expect(ShareFixtures.rejection(ring, oldToken) == .unknownKey)
        #expect(try ring.verify(newToken, nowSeconds: ShareFixtures.now) == claims)
        #expect(ring.jwks()["keys"]?.arrayValue?.compactMap { $0["kid"]?.stringValue } == [secondKey])
        let listing = ring.keys
        #expect(listing.map(\.keyID) == [firstKey, secondKey])
        #expect(listing.map(\.retired) == [true, false] && listing.map(\.createdMilliseconds) == [1_000, 2_000])
        try ring.retire(keyID: firstKey)  // again: nothing changes

        // All of it survives a restart.
        let reopened = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 3_000)
        #expect(reopened.activeKeyID == secondKey)
        #expect(reopened.keys.map(\.retired) == [true, false])
        #expect(ShareFixtures.rejection(reopened, oldToken) == .unknownKey)
        #expect(try reopened.verify(newToken, nowSeconds: ShareFixtures.now) == claims)
        #expect(reopened.jwks() == ring.jwks())
        #expect(ShareFixtures.fileMode(reopened.path) == 0o600)
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.path) == ["share-keys.json"])
    }

    @Test func theActiveKeyAndUnknownKeysCannotBeRetired() throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        #expect(throws: ShareKeyRingError.self) { try ring.retire(keyID: ring.activeKeyID) }
        #expect(throws: ShareKeyRingError.self) { try ring.retire(keyID: "no-such-key") }
        #expect(ring.keys.map(\.retired) == [false])
    }

    @Test func looseFileModeIsTightenedOnOpen() throws {
        let directory = try ShareTemporaryDirectory()
        defer { directory.remove() }
        let ring = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 1_000)
        #expect(chmod(ring.path, 0o644) == 0)
        _ = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 2_000)
        #expect(ShareFixtures.fileMode(ring.path) == 0o600)
    }

    @Test func missingDirectoryIsCreatedPrivate() throws {
        let parent = try ShareTemporaryDirectory()
        defer { parent.remove() }
        let ring = try ShareKeyRing.open(directory: parent.path + "/data", nowMilliseconds: 1_000)
        #expect(ShareFixtures.fileMode(parent.path + "/data") == 0o700)
        #expect(ShareFixtures.fileMode(ring.path) == 0o600)
    }

    @Test func corruptFilesAreRefusedAndKept() throws {
        let directory = try ShareTemporaryDirectory()
        defer { directory.remove() }
        let ring = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 1_000)
        _ = try ring.rotate(nowMilliseconds: 2_000)
        let original = try JSON.parse(Array(try Data(contentsOf: URL(fileURLWithPath: ring.path))))
        guard case .object(let file) = original, case .array(let keys)? = file["keys"],
              case .object(let oldKey) = keys[0], case .object(let activeKey) = keys[1] else {
            Issue.record("unexpected file shape")
            return
        }
        let otherSeed = Base64URL.encode(try Ed25519Key.generate().privateKeyBytes())

        func withKeys(_ first: [String: JSON], _ second: [String: JSON]) -> [UInt8] {
            var changed = file
            changed["keys"] = .array([.object(first), .object(second)])
            return JSON.object(changed).serializedBytes()
        }
        func edited(_ key: [String: JSON], _ edit: (inout [String: JSON]) -> Void) -> [String: JSON] {
            var key = key
            edit(&key)
            return key
        }
        func top(_ edit: (inout [String: JSON]) -> Void) -> [UInt8] {
            var changed = file
            edit(&changed)
            return JSON.object(changed).serializedBytes()
        }
        let corruptions: [(String, [UInt8])] = [
            ("empty", []),
            ("not JSON", Array("share keys".utf8)),
            ("truncated", Array(original.serializedBytes().dropLast(10))),
            ("wrong format", top { $0["format"] = .string("jwks") }),
            ("future version", top { $0["version"] = .int(2) }),
            ("no active", top { $0["active"] = nil }),
            ("unknown active", top { $0["active"] = .string("nope") }),
            ("retired active", withKeys(oldKey, edited(activeKey) { $0["retired"] = .bool(true) })),
            ("active without d", withKeys(oldKey, edited(activeKey) { $0["d"] = nil })),
            ("d of another key", withKeys(oldKey, edited(activeKey) { $0["d"] = .string(otherSeed) })),
            ("short x", withKeys(edited(oldKey) { $0["x"] = .string("AAAA") }, activeKey)),
            ("kid not the thumbprint", withKeys(edited(oldKey) { $0["kid"] = .string("renamed") }, activeKey)),
            ("created as text", withKeys(edited(oldKey) { $0["created"] = .string("1000") }, activeKey)),
            ("duplicate key", withKeys(activeKey, activeKey)),
        ]
        for (label, bytes) in corruptions {
            try Data(bytes).write(to: URL(fileURLWithPath: ring.path))
            do {
                _ = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 3_000)
                Issue.record("opened a corrupt key file: \(label)")
            } catch let error as ShareKeyRingError {
                #expect("\(error)".contains("is corrupt"), "\(label): \(error)")
                #expect(!"\(error)".contains(otherSeed))
            }
            // The corrupt file is left for the operator, never replaced with a fresh key.
            #expect(try Data(contentsOf: URL(fileURLWithPath: ring.path)) == Data(bytes), "\(label)")
        }
    }

    @Test func concurrentVerificationDuringRotation() async throws {
        let (ring, directory) = try ShareFixtures.ring()
        defer { directory.remove() }
        let claims = try ShareFixtures.claims()
        let token = try ring.sign(claims)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<4 {
                group.addTask { () async throws -> Void in
                    for _ in 0..<200 {
                        let old = try ring.verify(token, nowSeconds: ShareFixtures.now)
                        let new = try ring.verify(try ring.sign(claims), nowSeconds: ShareFixtures.now)
                        #expect(old == claims && new == claims)
                    }
                }
            }
            group.addTask { () async throws -> Void in
                for step in 0..<5 { _ = try ring.rotate(nowMilliseconds: Int64(10_000 + step)) }
            }
            try await group.waitForAll()
        }
        #expect(ring.keys.count == 6 && ring.jwks()["keys"]?.arrayValue?.count == 6)
    }
}
