import Testing
import LatticeCore

@Suite("Name validation")
struct NameTests {
    struct IllegalName: Sendable, CustomTestStringConvertible {
        let name: String, rule: NameError.Rule, message: String
        var testDescription: String { "\(rule): \(name.debugDescription.prefix(40))" }
    }

    static let illegalRecordNames: [IllegalName] = [
        IllegalName(name: "", rule: .empty, message: "record name must not be empty"),
        IllegalName(name: "../x", rule: .pathSeparator, message: "record name must not contain '/' or '\\'"),
        IllegalName(name: "a/b", rule: .pathSeparator, message: "must not contain '/'"),
        IllegalName(name: "a\\b", rule: .pathSeparator, message: "must not contain '/'"),
        IllegalName(name: ".", rule: .dotSegment, message: "record name must not be '.' or '..'"),
        IllegalName(name: "..", rule: .dotSegment, message: "must not be '.' or '..'"),
        IllegalName(name: "a\u{0}b", rule: .controlCharacter, message: "record name must not contain control characters such as NUL"),
        IllegalName(name: "\u{0}", rule: .controlCharacter, message: "NUL"),
        IllegalName(name: "tab\there", rule: .controlCharacter, message: "control characters"),
        IllegalName(name: "del\u{7F}", rule: .controlCharacter, message: "control characters"),
        IllegalName(name: String(repeating: "a", count: 256), rule: .tooLong, message: "record name is longer than 255 characters"),
        IllegalName(name: "_private", rule: .reservedPrefix, message: "record name must not start with '_' (reserved)"),
        IllegalName(name: "café", rule: .notASCII, message: "record name must be ASCII"),
        IllegalName(name: "e\u{301}", rule: .notASCII, message: "must be ASCII"),
        IllegalName(name: "😀", rule: .notASCII, message: "must be ASCII"),
    ]

    @Test("illegal record names throw NameError with a clear description", arguments: illegalRecordNames)
    func illegalRecordName(_ illegal: IllegalName) {
        let (name, rule, message) = (illegal.name, illegal.rule, illegal.message)
        let error = #expect(throws: NameError.self) { try RecordID(recordName: name, zoneID: Fixtures.zone) }
        #expect(error?.rule == rule)
        #expect(error?.kind == .recordName)
        #expect(error?.description.contains(message) == true, "\(error?.description ?? "no error")")
        #expect(!Names.isValid(name, kind: .recordName))
        // The same names are refused wherever a record name is accepted.
        #expect(throws: NameError.self) { try Reference(recordName: name) }
    }

    @Test("legal record names, up to 255 ASCII characters", arguments: [
        "milk", "a", "Z", "...", ".hidden", "a.b", "with space", "x_y-z", "a_", "~!@#$%^&*()", "0123",
        String(repeating: "a", count: 255), String(repeating: ".", count: 255),
    ])
    func legalRecordName(name: String) throws {
        let id = try RecordID(recordName: name, zoneID: Fixtures.zone)
        #expect(id.recordName == name)
        #expect(Names.isValid(name, kind: .recordName))
    }

    @Test("zone and owner names")
    func zoneNames() throws {
        _ = try ZoneID(zoneName: "Groceries", ownerRecordName: "_9a1c") // owners may start with '_'
        _ = try ZoneID(zoneName: "_defaultZone", ownerRecordName: "_owner") // the one system zone name
        expectNameError(.zoneName, .reservedPrefix) {
            try ZoneID(zoneName: "_other", ownerRecordName: "_owner")
        }
        expectNameError(.zoneName, .empty) { try ZoneID(zoneName: "", ownerRecordName: "o") }
        expectNameError(.ownerRecordName, .pathSeparator) {
            try ZoneID(zoneName: "Z", ownerRecordName: "../etc")
        }
        expectNameError(.ownerRecordName, .tooLong) {
            try ZoneID(zoneName: "Z", ownerRecordName: String(repeating: "o", count: 256))
        }
        expectNameError(.zoneName, .notASCII) { try ZoneID(zoneName: "Zöne", ownerRecordName: "o") }
        #expect((try? ZoneID(zoneName: "Zöne", ownerRecordName: "o")) == nil)
        // `_defaultZone` is a zone name only.
        expectNameError(.recordName, .reservedPrefix) {
            try RecordID(recordName: "_defaultZone", zoneID: Fixtures.zone)
        }
    }

    @Test("field names and record types are identifiers")
    func identifiers() throws {
        for name in ["title", "a", "A1", "a_b", "a.b", "x9_.", String(repeating: "f", count: 255)] {
            #expect(Names.isValid(name, kind: .fieldName), "\(name)")
            #expect(Names.isValid(name, kind: .recordType), "\(name)")
        }
        let cases: [(String, NameError.Rule)] = [
            ("1abc", .notIdentifier), ("a-b", .notIdentifier), ("a b", .notIdentifier), (".a", .notIdentifier),
            ("_x", .reservedPrefix), ("", .empty), ("é", .notASCII), (String(repeating: "f", count: 256), .tooLong),
        ]
        for (name, rule) in cases {
            expectNameError(.fieldName, rule, "\(name)") { try Names.validate(name, kind: .fieldName) }
        }
        let notIdentifier = #expect(throws: NameError.self) { try Names.validate("a-b", kind: .fieldName) }
        #expect(notIdentifier?.description == "field name must start with a letter and hold only letters, digits, '_' and '.'")

        // Where they are used: record types and field names.
        expectNameError(.recordType, .notIdentifier) {
            try Record(id: Fixtures.recordID(), recordType: "my-type", createdAt: Fixtures.stamp(1, replica: 1))
        }
        var record = try Record(id: Fixtures.recordID(), recordType: "Item", createdAt: Fixtures.stamp(1, replica: 1))
        let error = #expect(throws: RecordError.self) { try record.set("bad name", to: .int64(1), at: Fixtures.stamp(2, replica: 1)) }
        #expect(error?.code == .invalidFieldName)
        #expect(error?.description == "field name must start with a letter and hold only letters, digits, '_' and '.'")
        #expect(record.fields.isEmpty)
    }

    @Test("replica ids print and parse as 16 hex digits")
    func replicaIDs() {
        #expect(ReplicaID(42).description == "000000000000002a")
        #expect(ReplicaID(hex: "000000000000002a") == ReplicaID(42))
        #expect(ReplicaID(hex: "ffffffffffffffff") == ReplicaID(.max))
        #expect(ReplicaID(hex: "") == nil && ReplicaID(hex: "12345678901234567") == nil && ReplicaID(hex: "xyz") == nil)
    }
}

/// Expects `body` to throw a `NameError` for `kind` breaking `rule`.
func expectNameError(_ kind: Names.Kind, _ rule: NameError.Rule, _ comment: Comment? = nil,
                     sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Any) {
    let error = #expect(throws: NameError.self, comment, sourceLocation: sourceLocation) { _ = try body() }
    #expect(error?.kind == kind, comment, sourceLocation: sourceLocation)
    #expect(error?.rule == rule, comment, sourceLocation: sourceLocation)
}
