import LatticeSharing
import LatticeTestSupport
import Testing

@Suite struct VerifyingKeyTests {
    static let message = Array("a passkey or a provider signed this".utf8)

    @Test(arguments: [SignatureAlgorithm.es256, .rs256])
    func aSignatureByTheKeyVerifiesAndNothingElseDoes(_ algorithm: SignatureAlgorithm) throws {
        let signer = TestSigningKey(algorithm)
        let key = try signer.verifyingKey()
        let signature = signer.sign(Self.message)
        #expect(key.verify(algorithm, signature: signature, message: Self.message))
        #expect(!key.verify(algorithm, signature: signature, message: Self.message + [0]), "another message")
        var flipped = signature
        flipped[flipped.count / 2] ^= 0x01
        #expect(!key.verify(algorithm, signature: flipped, message: Self.message), "a changed signature")
        let other = algorithm == .es256 ? SignatureAlgorithm.rs256 : .es256
        #expect(!key.verify(other, signature: signature, message: Self.message), "the other algorithm")
        let stranger = try TestSigningKey(algorithm).verifyingKey()
        #expect(!stranger.verify(algorithm, signature: signature, message: Self.message), "another key")
        #expect(!key.verify(algorithm, signature: [], message: Self.message))
    }

    @Test func joseSignaturesConvertToDER() throws {
        let signer = TestSigningKey(.es256)
        let raw = signer.signJOSE(Self.message)
        #expect(raw.count == 64)
        let der = try #require(VerifyingKey.derSignature(fromJOSE: raw))
        #expect(try signer.verifyingKey().verify(.es256, signature: der, message: Self.message))
        #expect(VerifyingKey.derSignature(fromJOSE: Array(raw.prefix(63))) == nil)
    }

    @Test func keysThatAreNotSoundAreRefusedWhenMade() throws {
        let signer = TestSigningKey(.es256)
        var offCurve = signer.y
        offCurve[31] ^= 0x01
        #expect(throws: KeyError.self) { try VerifyingKey.p256(x: signer.x, y: offCurve) }
        #expect(throws: KeyError.self) { try VerifyingKey.p256(x: Array(signer.x.prefix(31)), y: signer.y) }
        let small = TestSigningKey(.rs256, rsaBits: 1_024)
        #expect(throws: KeyError.self) { try VerifyingKey.rsa(modulus: small.modulus, exponent: small.exponent) }
        let rsa = TestSigningKey(.rs256)
        #expect(throws: KeyError.self) { try VerifyingKey.rsa(modulus: rsa.modulus, exponent: [0x01, 0x00, 0x00]) }
        #expect(throws: KeyError.self) { try VerifyingKey.rsa(modulus: rsa.modulus, exponent: [1]) }
    }

    @Test func algorithmsAreOnlyES256AndRS256() {
        #expect(SignatureAlgorithm(rawValue: "none") == nil)
        #expect(SignatureAlgorithm(rawValue: "HS256") == nil)
        #expect(SignatureAlgorithm(coseIdentifier: -7) == .es256)
        #expect(SignatureAlgorithm(coseIdentifier: -257) == .rs256)
        #expect(SignatureAlgorithm(coseIdentifier: -8) == nil, "EdDSA is not offered")
    }
}
