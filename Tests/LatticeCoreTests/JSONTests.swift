import Testing
import LatticeCore

@Suite("JSON parser and serializer")
struct JSONTests {
    @Test("valid documents parse to the expected values")
    func valid() throws {
        #expect(try JSON.parse(#" {"a": [1, -2.5, true, false, null, "s"], "b": {}} "#)
            == .object(["a": .array([.int(1), .double(-2.5), .bool(true), .bool(false), .null, .string("s")]), "b": .object([:])]))
        #expect(try JSON.parse("[]") == .array([]))
        #expect(try JSON.parse("0") == .int(0))
        #expect(try JSON.parse("-0") == .int(0))
        #expect(try JSON.parse("1e2") == .double(100))
        #expect(try JSON.parse("1E-2") == .double(0.01))
        #expect(try JSON.parse("\"\"") == .string(""))
        #expect(try JSON.parse(" \t\r\n[1]\n") == .array([.int(1)]))
    }

    @Test("64-bit integers are exact, not rounded through Double")
    func bigIntegers() throws {
        #expect(try JSON.parse("9223372036854775807") == .int(.max))
        #expect(try JSON.parse("-9223372036854775808") == .int(.min))
        #expect(try JSON.parse("9007199254740993") == .int(9_007_199_254_740_993)) // 2^53 + 1: a Double would round it
        #expect(JSON.int(.max).serialized() == "9223372036854775807")
        #expect(JSON.int(.min).serialized() == "-9223372036854775808")
        // One past Int64 is no longer an integer; it is a (rounded) double, not an error or a wrapped value.
        #expect(try JSON.parse("9223372036854775808") == .double(9_223_372_036_854_775_808))
        #expect(throws: JSONError.self) { try JSON.parse("1e400") }
    }

    @Test("integers of every length parse and print exactly (the short ones take a path without a String)")
    func integersOfEveryLength() throws {
        var values: [Int64] = [0, -1, 1, 9, -9, 10, .max, .min, .max - 1, .min + 1]
        var power: Int64 = 1
        for _ in 0..<18 {
            power *= 10
            values += [power, power - 1, -power, -(power - 1), power + 7]
        }
        for value in values {
            #expect(JSON.int(value).serialized() == String(value))
            #expect(try JSON.parse(String(value)) == .int(value))
        }
        #expect(try JSON.parse("-0") == .int(0))
        #expect(throws: JSONError.self) { try JSON.parse("01") }
        #expect(throws: JSONError.self) { try JSON.parse("-") }
    }

    @Test("unicode escapes, surrogate pairs and raw UTF-8")
    func unicode() throws {
        #expect(try JSON.parse(#""caf\u00e9""#) == .string("café"))
        #expect(try JSON.parse(#""\u00E9""#) == .string("\u{E9}"))
        #expect(try JSON.parse(#""\ud83d\ude00""#) == .string("😀"))
        #expect(try JSON.parse(#""\u0000""#) == .string("\u{0}"))
        #expect(try JSON.parse(#""\"\\\/\b\f\n\r\t""#) == .string("\"\\/\u{8}\u{C}\n\r\t"))
        #expect(try JSON.parse("\"日本語 e\u{301}\"") == .string("日本語 e\u{301}"))
        // Strings are kept byte for byte: "é" and "e\u{301}" stay different.
        #expect(try JSON.parse(#""e\u0301""#).stringValue.map { Array($0.utf8) } == [0x65, 0xCC, 0x81])
        for bad in [#""\ud83d""#, #""\ude00""#, #""\ud83d\u0041""#, #""\ud83dx""#, #""\u12""#, #""\u12g4""#, #""\x""#] {
            #expect(throws: JSONError.self, "\(bad)") { try JSON.parse(bad) }
        }
        #expect(throws: JSONError.self) { try JSON.parse([0x22, 0xC3, 0x28, 0x22]) } // invalid UTF-8
        #expect(throws: JSONError.self) { try JSON.parse("\"a\nb\"") } // raw control character
    }

    @Test("invalid documents are rejected with an offset", arguments: [
        "", " ", "[1,]", "{\"a\":1,}", "[1 2]", "{\"a\" 1}", "{a:1}", "{\"a\":1", "[", "]", "01", "1.", ".5", "+1",
        "-", "1e", "tru", "nul", "truex", "[1]]", "{\"a\":1}x", "'a'", "[1,,2]", "{,}", "NaN", "Infinity", "/* */1",
    ])
    func invalid(text: String) {
        let error = #expect(throws: JSONError.self) { try JSON.parse(text) }
        #expect(error.map { $0.offset >= 0 && $0.offset <= text.utf8.count } == true)
        #expect(error?.description.hasPrefix("invalid JSON at byte ") == true)
    }

    @Test("duplicate keys are rejected")
    func duplicateKeys() {
        let error = #expect(throws: JSONError.self) { try JSON.parse(#"{"a": 1, "b": 2, "a": 3}"#) }
        #expect(error?.message == "duplicate key \"a\"")
        #expect(error?.offset == 17)
        #expect(throws: JSONError.self) { try JSON.parse(#"{"x": {"k": 1, "k": 1}}"#) }
    }

    @Test("nesting deeper than 64 levels is rejected")
    func depth() throws {
        func nested(_ depth: Int, _ inner: String = "") -> String {
            String(repeating: "[", count: depth) + inner + String(repeating: "]", count: depth)
        }
        _ = try JSON.parse(nested(32, "1"))
        _ = try JSON.parse(nested(63, "1"))
        _ = try JSON.parse(nested(64))
        let error = #expect(throws: JSONError.self) { try JSON.parse(nested(65)) }
        #expect(error?.message.contains("deeper than 64") == true)
        #expect(throws: JSONError.self) { try JSON.parse(nested(10_000)) } // no stack overflow
        #expect(throws: JSONError.self) { try JSON.parse(String(repeating: "{\"a\":", count: 100) + "1" + String(repeating: "}", count: 100)) }
    }

    @Test("every ASCII byte, in a short (inline) and a long (heap) string, is escaped exactly when it must be")
    func stringEscapes() throws {
        for byte in UInt8(0)..<0x80 {
            let needsEscape = byte < 0x20 || byte == 0x7F || byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\")
            for padding in [0, 3, 40] {
                let text = String(repeating: "a", count: padding) + String(UnicodeScalar(byte)) + "é"
                let written = Array(JSON.string(text).serialized().utf8)
                #expect(try JSON.parse(written) == .string(text), "byte \(byte), padding \(padding)")
                // Unescaped, the text is copied as it is between the quotes; escaped, it grows.
                #expect((written == [0x22] + Array(text.utf8) + [0x22]) == !needsEscape, "byte \(byte), padding \(padding)")
            }
        }
    }

    @Test("serialization is compact, sorted by key bytes, and parses back")
    func serialization() throws {
        let value = JSON.object(["b": .array([.int(1), .double(2.5), .null]), "a": .string("q\"\\\n\u{1}\u{7F}é"),
                                 "Z": .bool(true), "é": .object([:])])
        let text = value.serialized()
        #expect(text == #"{"Z":true,"a":"q\"\\\n\u0001\u007fé","b":[1,2.5,null],"é":{}}"#)
        #expect(try JSON.parse(text) == value)
        #expect(value.serializedBytes() == Array(text.utf8))
        // Integral doubles print as integers; others with Swift's shortest round-trip form.
        #expect(JSON.double(3).serialized() == "3")
        #expect(try JSON.parse(JSON.double(1e-7).serialized()).doubleValue == 1e-7)
        #expect(try JSON.parse(JSON.double(1e300).serialized()).doubleValue == 1e300)
    }
}
