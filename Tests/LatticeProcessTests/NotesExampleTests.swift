import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// Issue 31: the example app (Examples/Notes, `lattice-notes`) on LatticeSyncEngine's public API syncs two
/// devices through a real `lattice serve`, signed in with a Lattice token or an OpenID Connect ID token, and
/// Docs/AppGuide.md's walk-through runs as written.
@Suite(.serialized) struct NotesExampleTests {
    static var binary: String { URL(fileURLWithPath: latticeBinary).deletingLastPathComponent().appendingPathComponent("lattice-notes").path }

    /// Runs `lattice-notes --home HOME ARGUMENTS`.
    @discardableResult
    static func notes(_ home: String, _ arguments: String..., expect status: Int32 = 0) throws -> String {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["--home", home] + arguments
        let output = Pipe(), errors = Pipe()
        process.standardOutput = output
        process.standardError = errors
        try process.run()
        let out = LatticeCLI.PipeReader(output.fileHandleForReading)
        let err = LatticeCLI.PipeReader(errors.fileHandleForReading)
        process.waitUntilExit()
        let text = out.finish(), problems = err.finish()
        guard process.terminationStatus == status else {
            throw HarnessError("lattice-notes \(arguments.joined(separator: " ")): exit \(process.terminationStatus)\n\(text)\n\(problems)")
        }
        return text.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static func list(_ home: String) throws -> [String: JSON] {
        let json = try JSON.parse(try notes(home, "list", "--json"))
        var byID: [String: JSON] = [:]
        for note in json["notes"]?.arrayValue ?? [] { if let id = note["id"]?.stringValue { byID[id] = note } }
        return byID
    }

    @Test func twoDevicesOfOneAccountConvergeWithEditsMadeOfflineOnBoth() throws {
        let server = try ServerUnderTest(data: temporaryDirectory("notes-example"))
        defer { server.kill(SIGTERM) }
        let url = "http://127.0.0.1:\(server.port)"
        let root = temporaryDirectory("notes-homes")
        let laptop = root + "/laptop", phone = root + "/phone"
        try Self.notes(laptop, "signup", "nora", "--server", url)
        let token = try String(contentsOfFile: laptop + "/token", encoding: .utf8)
        try Self.notes(phone, "login", "--server", url, "--token", token)
        let groceries = try Self.notes(laptop, "add", "Groceries", "--body", "milk", "--tag", "food")
        let trip = try Self.notes(laptop, "add", "Trip", "--tag", "travel")
        try Self.notes(phone, "sync")
        #expect(try Self.list(phone)[groceries]?["title"]?.stringValue == "Groceries")
        // Both offline (their changes stay queued), then both sync.
        try Self.notes(phone, "edit", groceries, "--title", "Weekly groceries", "--tag", "errand", "--no-sync")
        try Self.notes(laptop, "edit", groceries, "--body", "oat milk", "--untag", "food", "--pin", "--no-sync")
        try Self.notes(phone, "delete", trip, "--no-sync")
        try Self.notes(laptop, "edit", trip, "--title", "Trip to Lyon", "--no-sync")
        try Self.notes(laptop, "sync")
        try Self.notes(phone, "sync")
        try Self.notes(laptop, "sync")
        let onLaptop = try Self.list(laptop), onPhone = try Self.list(phone)
        #expect(onLaptop == onPhone, "laptop \(onLaptop), phone \(onPhone)")
        let note = try #require(onPhone[groceries])
        #expect(note["title"]?.stringValue == "Weekly groceries")
        #expect(note["body"]?.stringValue == "oat milk")
        #expect(note["pinned"] == .bool(true))
        #expect(note["tags"]?.arrayValue?.compactMap(\.stringValue) == ["errand"], "food removed on one, errand added on the other")
        #expect(onPhone[trip] == nil, "the deletion wins over the laptop's concurrent edit")
        // Signing out leaves nothing of the account's notes on the device.
        try Self.notes(phone, "logout")
        #expect(try Self.list(phone).isEmpty)
        #expect(!FileManager.default.fileExists(atPath: phone + "/token"))
    }

    @Test func signedInWithAnOpenIDConnectIDTokenOnBothDevices() throws {
        let provider = try OIDCProviderProcess(clientIDs: ["notes-app"])
        defer { provider.stop() }
        let server = try ServerUnderTest(data: temporaryDirectory("notes-oidc"),
                                         extra: ["--oidc-issuer", provider.issuer, "--oidc-client-id", "notes-app"])
        defer { server.kill(SIGTERM) }
        let url = "http://127.0.0.1:\(server.port)"
        let root = temporaryDirectory("notes-oidc-homes")
        for device in ["laptop", "phone"] {
            let idToken = try provider.mint("good", audience: "notes-app", subject: "nora-at-provider")
            try Self.notes(root + "/" + device, "login", "--server", url, "--issuer", provider.issuer, "--id-token", idToken)
        }
        let id = try Self.notes(root + "/laptop", "add", "From the laptop")
        try Self.notes(root + "/phone", "sync")
        #expect(try Self.list(root + "/phone")[id]?["title"]?.stringValue == "From the laptop", "one account on both devices")
        // A forged token signs no one in.
        let forged = try provider.mint("forged-signature", audience: "notes-app", subject: "nora-at-provider")
        let refused = try Self.notes(root + "/intruder", "login", "--server", url, "--issuer", provider.issuer, "--id-token", forged,
                                     expect: 1)
        #expect(refused.isEmpty)
    }

    /// The walk-through in Docs/AppGuide.md ("Run the example"), as written, from the package's root.
    @Test func theAppGuidesWalkThroughRunsAsWritten() throws {
        let guide = try String(contentsOfFile: Self.packageRoot + "/Docs/AppGuide.md", encoding: .utf8)
        guard let start = guide.range(of: "<!-- walk-through: begin -->"), let end = guide.range(of: "<!-- walk-through: end -->") else {
            throw HarnessError("Docs/AppGuide.md has no walk-through markers")
        }
        let block = String(guide[start.upperBound..<end.lowerBound])
        let commands = block.split(separator: "\n").filter { $0.hasPrefix("$ ") }.map { String($0.dropFirst(2)) }
        #expect(commands.count >= 8, "\(commands)")
        let script = "set -e\ncd \(Self.packageRoot)\n" + commands.joined(separator: "\n") + "\n"
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = ["-c", script]
        // The guide's binaries are the ones `swift build` made next to this test bundle.
        var environment = ProcessInfo.processInfo.environment
        environment["PATH"] = URL(fileURLWithPath: latticeBinary).deletingLastPathComponent().path + ":" + (environment["PATH"] ?? "")
        process.environment = environment
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let reader = LatticeCLI.PipeReader(output.fileHandleForReading)
        process.waitUntilExit()
        let text = reader.finish()
        #expect(process.terminationStatus == 0, "\(text)")
        // What the guide shows the last command printing (its note id is random: compared without it).
        let expected = try #require(block.split(separator: "\n").last { !$0.hasPrefix("$ ") && !$0.hasPrefix("```") && !$0.isEmpty })
        let withoutID = { (line: Substring) in line.replacing(/[0-9a-f]{8}/, with: "ID") }
        #expect(text.split(separator: "\n").map(withoutID).contains(withoutID(expected)), "expected \(expected) in\n\(text)")
    }

    static var packageRoot: String {
        var url = URL(fileURLWithPath: #filePath)
        while url.path != "/" {
            url.deleteLastPathComponent()
            if FileManager.default.fileExists(atPath: url.appendingPathComponent("Package.swift").path) { return url.path }
        }
        return FileManager.default.currentDirectoryPath
    }
}
