import LatticeCore
import Testing

/// LatticeCore's Base64URL, used by share tokens and sync tokens.
@Suite struct Base64URLTests {
    @Test func knownVectorsWithoutPadding() {
        // RFC 4648 §10, in the URL alphabet and without "=".
        let vectors = ["": "", "f": "Zg", "fo": "Zm8", "foo": "Zm9v", "foob": "Zm9vYg", "fooba": "Zm9vYmE",
                       "foobar": "Zm9vYmFy"]
        for (plain, encoded) in vectors {
            #expect(Base64URL.encode(Array(plain.utf8)) == encoded)
            #expect(Base64URL.decode(encoded) == Array(plain.utf8))
        }
        #expect(Base64URL.encode([0xFB, 0xFF, 0xBF]) == "-_-_")
        #expect(Base64URL.decode("-_-_") == [0xFB, 0xFF, 0xBF])
    }

    @Test func strictDecoding() {
        for bad in ["Zg==", "Zm8=", "+/+/", "Zm9v Yg", "Z", "Zm9vY", "Zh", "Zm9", "Zm9w\n", "Zé", "Zm9v="] {
            #expect(Base64URL.decode(bad) == nil, "\(bad) should not decode")
        }
        // "Zh" and "Zm9" carry non-zero unused bits: accepting them would give one byte string two encodings.
        #expect(Base64URL.decode("Zg") == [0x66])
    }

    @Test(arguments: [UInt64(0x5EED), 42, UInt64.random(in: 0...UInt64.max)])
    func randomRoundTrips(seed: UInt64) {
        print("Base64URL round trips, seed \(seed)")
        var random = SplitMix64(seed: seed)
        for _ in 0..<500 {
            let count = Int.random(in: 0...70, using: &random)
            let bytes = (0..<count).map { _ in UInt8.random(in: 0...255, using: &random) }
            let text = Base64URL.encode(bytes)
            #expect(!text.contains("=") && !text.contains("+") && !text.contains("/"))
            #expect(Base64URL.decode(text) == bytes, "seed \(seed)")
        }
    }
}
