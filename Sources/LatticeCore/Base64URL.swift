/// Base64url without padding (RFC 4648 §5, as JWS uses it: RFC 7515 §2).
///
/// Decoding is strict: only `A-Z a-z 0-9 - _`, no `=`, no whitespace, no length of the form 4n+1, and the
/// unused low bits of the last character must be zero, so every byte string has exactly one text form.
/// Share tokens (LatticeSharing) and the service's sync tokens (LatticeServer) both use it.
public enum Base64URL {
    private static let alphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// `alphabet` inverted; 0xFF marks a byte outside it.
    private static let values: [UInt8] = {
        var table = [UInt8](repeating: 0xFF, count: 256)
        for (index, character) in alphabet.enumerated() { table[Int(character)] = UInt8(index) }
        return table
    }()

    public static func encode(_ bytes: [UInt8]) -> String {
        var out = [UInt8]()
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index + 3 <= bytes.count {
            let group = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8 | UInt32(bytes[index + 2])
            out.append(alphabet[Int(group >> 18)])
            out.append(alphabet[Int(group >> 12 & 0x3F)])
            out.append(alphabet[Int(group >> 6 & 0x3F)])
            out.append(alphabet[Int(group & 0x3F)])
            index += 3
        }
        switch bytes.count - index {
        case 1:
            let group = UInt32(bytes[index]) << 16
            out.append(alphabet[Int(group >> 18)])
            out.append(alphabet[Int(group >> 12 & 0x3F)])
        case 2:
            let group = UInt32(bytes[index]) << 16 | UInt32(bytes[index + 1]) << 8
            out.append(alphabet[Int(group >> 18)])
            out.append(alphabet[Int(group >> 12 & 0x3F)])
            out.append(alphabet[Int(group >> 6 & 0x3F)])
        default:
            break
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes `text` encodes, or nil when it is not canonical unpadded base64url.
    public static func decode(_ text: String) -> [UInt8]? {
        decode(utf8: Array(text.utf8))
    }

    /// ``decode(_:)`` for text given as its UTF-8 bytes.
    public static func decode(utf8 text: some Collection<UInt8>) -> [UInt8]? {
        let remainder = text.count % 4
        guard remainder != 1 else { return nil }
        var out = [UInt8]()
        out.reserveCapacity(text.count * 3 / 4)
        var group: UInt32 = 0
        var count = 0
        for character in text {
            let value = values[Int(character)]
            guard value != 0xFF else { return nil }
            group = group << 6 | UInt32(value)
            count += 1
            if count == 4 {
                out.append(UInt8(group >> 16 & 0xFF))
                out.append(UInt8(group >> 8 & 0xFF))
                out.append(UInt8(group & 0xFF))
                group = 0
                count = 0
            }
        }
        switch count {
        case 2:  // 12 bits: one byte and 4 unused bits
            guard group & 0x0F == 0 else { return nil }
            out.append(UInt8(group >> 4))
        case 3:  // 18 bits: two bytes and 2 unused bits
            guard group & 0x03 == 0 else { return nil }
            out.append(UInt8(group >> 10 & 0xFF))
            out.append(UInt8(group >> 2 & 0xFF))
        default:
            break
        }
        return out
    }
}
