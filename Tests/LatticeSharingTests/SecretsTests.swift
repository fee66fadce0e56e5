import LatticeSharing
import Testing

@Suite struct SecretsTests {
    @Test func bearerTokensAre256RandomBitsAndHashOnly() throws {
        let a = try BearerToken.generate()
        let b = try BearerToken.generate()
        #expect(a != b)
        #expect(a.text.hasPrefix("lt_") && a.text.utf8.count == 67)
        #expect(BearerToken(text: a.text) == a)
        #expect(BearerToken(text: "lt_" + String(repeating: "g", count: 64)) == nil)
        #expect(BearerToken(text: a.text.uppercased()) == nil)
        #expect(a.storedHash.count == 32 && a.storedHash != b.storedHash)
        #expect(a.storedHash == BearerToken(text: a.text)!.storedHash)
    }

    @Test func sha256AndConstantTimeEquality() {
        #expect(Secrets.hex(Secrets.sha256(Array("abc".utf8)))
            == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(Secrets.constantTimeEqual([1, 2, 3], [1, 2, 3]))
        #expect(!Secrets.constantTimeEqual([1, 2, 3], [1, 2, 4]))
        #expect(!Secrets.constantTimeEqual([1, 2], [1, 2, 3]))
    }
}
