import Foundation
import LatticeCore
@testable import LatticeSharing
import Testing

/// A running server and `lattice admin` are two processes with two rings over one key file.
@Suite struct ShareKeyRingReloadTests {
    @Test func aRingPicksUpRotationAndRetirementMadeByAnotherRing() throws {
        let directory = try ShareTemporaryDirectory()
        defer { directory.remove() }
        let server = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 1_000)
        let admin = try ShareKeyRing.open(directory: directory.path, nowMilliseconds: 2_000)
        #expect(server.activeKeyID == admin.activeKeyID)
        let claims = ShareClaims(issuer: "http://127.0.0.1:8080", shareID: "sh_1", zoneName: "Lists",
                                 ownerRecordName: "_owner", issuedAt: 1, tokenID: try ShareClaims.newTokenID(),
                                 permission: "readOnly", epoch: 1)
        let old = try server.sign(claims)
        let oldKey = server.activeKeyID

        let rotated = try admin.rotate(nowMilliseconds: 3_000)
        let fresh = try server.sign(claims) // the server signs with the admin's new key
        #expect(server.activeKeyID == rotated)
        #expect(fresh != old)
        #expect((try? server.verify(old, nowSeconds: 2)) != nil)
        #expect((server.jwks()["keys"]?.arrayValue?.count) == 2)

        try admin.retire(keyID: oldKey)
        #expect((try? server.verify(old, nowSeconds: 2)) == nil)
        #expect((try? server.verify(fresh, nowSeconds: 2)) != nil)
        #expect((server.jwks()["keys"]?.arrayValue?.count) == 1)
    }
}
