import LatticeCore
import LatticeSharing

/// A software authenticator: it makes the bytes a browser's authenticator would, with a libcrypto key.
public struct TestAuthenticator: Sendable {
    public let key: TestSigningKey
    public let credentialID: [UInt8]
    public var signCount: UInt32 = 0
    public var rpID = "localhost"
    public var origin = "http://localhost:8080"

    public init(_ algorithm: SignatureAlgorithm = .es256, signCount: UInt32 = 0) {
        key = TestSigningKey(algorithm)
        credentialID = (0..<16).map { _ in UInt8.random(in: 0...255) }
        self.signCount = signCount
    }

    public var coseKey: CBOR {
        switch key.algorithm {
        case .es256:
            .map([.init(key: .int(1), value: .int(2)), .init(key: .int(3), value: .int(-7)), .init(key: .int(-1), value: .int(1)),
                  .init(key: .int(-2), value: .bytes(key.x)), .init(key: .int(-3), value: .bytes(key.y))])
        case .rs256:
            .map([.init(key: .int(1), value: .int(3)), .init(key: .int(3), value: .int(-257)),
                  .init(key: .int(-1), value: .bytes(key.modulus)), .init(key: .int(-2), value: .bytes(key.exponent))])
        }
    }

    public func clientData(_ type: String, _ challenge: [UInt8], origin: String? = nil) -> [UInt8] {
        JSON.object(["type": .string(type), "challenge": .string(Base64URL.encode(challenge)),
                     "origin": .string(origin ?? self.origin), "crossOrigin": .bool(false)]).serializedBytes()
    }

    public func authenticatorData(flags: UInt8, attested: Bool, rpID: String? = nil, cose: CBOR? = nil) -> [UInt8] {
        var bytes = Secrets.sha256(Array((rpID ?? self.rpID).utf8))
        bytes.append(flags | (attested ? 0x40 : 0))
        bytes += [UInt8(signCount >> 24), UInt8((signCount >> 16) & 0xFF), UInt8((signCount >> 8) & 0xFF), UInt8(signCount & 0xFF)]
        if attested {
            bytes += [UInt8](repeating: 0, count: 16)
            bytes += [UInt8(credentialID.count >> 8), UInt8(credentialID.count & 0xFF)] + credentialID
            bytes += (cose ?? coseKey).encoded
        }
        return bytes
    }

    public func attestationObject(_ authData: [UInt8]) -> [UInt8] {
        CBOR.map([.init(key: .text("fmt"), value: .text("none")), .init(key: .text("attStmt"), value: .map([])),
                  .init(key: .text("authData"), value: .bytes(authData))]).encoded
    }

    /// Bumps the counter (when it keeps one) and signs an assertion.
    public mutating func assert(_ challenge: [UInt8], flags: UInt8 = 0x05, origin: String? = nil, rpID: String? = nil)
        -> (clientData: [UInt8], authenticatorData: [UInt8], signature: [UInt8]) {
        if signCount != 0 { signCount += 1 }
        let client = clientData("webauthn.get", challenge, origin: origin)
        let data = authenticatorData(flags: flags, attested: false, rpID: rpID)
        return (client, data, key.sign(data + Secrets.sha256(client)))
    }
}

