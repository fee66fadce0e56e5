import Foundation
import LatticeCore
import LatticeTestSupport
import Testing

/// Issue 30 in the CLI: `lattice invitations` tells an invited person and answers an invitation;
/// `lattice accept` takes a short link, with the punctuation a message left after it.
@Suite(.serialized) struct InvitationCLITests {
    @discardableResult
    static func ok(_ arguments: String..., home: String) throws -> LatticeCLI.Outcome {
        try LatticeCLI.ok(arguments: arguments, home: home)
    }

    @Test func anInvitedPersonListsAcceptsAndDeclinesInvitations() throws {
        let world = try LatticeCLI.World()
        let carol = world.directory + "/carol"
        try Self.ok("signup", "carol", "--server", world.url, home: carol)
        #expect(try Self.ok("invitations", home: world.bob).stdout.contains("no pending invitations"))

        try Self.ok("list", "create", "Groceries", home: world.alice)
        try Self.ok("list", "add", "Groceries", "Milk", home: world.alice)
        try Self.ok("share", "create", "Groceries", home: world.alice)
        try Self.ok("share", "invite", "Groceries", "bob", "--permission", "read-write", home: world.alice)
        try Self.ok("share", "invite", "Groceries", "carol", home: world.alice)

        let listed = try Self.ok("invitations", home: world.bob)
        #expect(listed.stdout.contains("Groceries") && listed.stdout.contains("alice") && listed.stdout.contains("read-write"),
                "\(listed)")
        #expect(listed.stdout.contains("lattice invitations accept N"), "says how to answer: \(listed)")
        let json = try Self.ok("invitations", "--json", home: world.bob).json
        #expect(json.arrayValue?.count == 1 && json.arrayValue?.first?["title"] == .string("Groceries") && json.arrayValue?.first?["owner"] == .string("alice"))

        let accepted = try Self.ok("invitations", "accept", "1", "--json", home: world.bob).json
        #expect(accepted["title"] == .string("Groceries") && accepted["permission"] == .string("readWrite"), "\(accepted)")
        #expect(try Self.ok("list", "show", "Groceries", home: world.bob).stdout.contains("Milk"))
        #expect(try Self.ok("invitations", "--json", home: world.bob).json == .array([]))

        let declined = try Self.ok("invitations", "decline", "groceries", home: carol)
        #expect(declined.stdout.contains("declined \"Groceries\" of alice"), "\(declined)")
        #expect(try Self.ok("invitations", "--json", home: carol).json == .array([]))
        let participants = try Self.ok("share", "participants", "Groceries", "--json", home: world.alice).json
        let carolRow = participants["participants"]?.arrayValue?.first { $0["name"] == .string("carol") }
        #expect(carolRow?["status"] == .string("removed"), "\(participants)")

        let none = try LatticeCLI.lattice(arguments: ["invitations", "accept", "3"], home: carol)
        #expect(none.status == 1 && none.stderr.contains("no pending invitations"), "\(none)")
    }

    @Test func acceptTakesAShortLinkWithTrailingPunctuation() throws {
        let world = try LatticeCLI.World()
        try Self.ok("list", "create", "Trip", home: world.alice)
        try Self.ok("share", "create", "Trip", "--public-permission", "read-only", home: world.alice)
        let link = try Self.ok("share", "url", "Trip", "--json", home: world.alice).json
        let short = try #require(link["shortURL"]?.stringValue, "\(link)")
        // The server's public URL (the listening address, or a fixed one on PostgreSQL), /s/, a 10-character code.
        let prefix = try #require(link["url"]?.stringValue?.components(separatedBy: "/share/").first)
        #expect(short.hasPrefix(prefix + "/s/") && short.count == prefix.count + 3 + 10, "\(short)")
        let people = try Self.ok("share", "url", "Trip", home: world.alice)
        #expect(people.stderr.contains("short link (easier to send): \(prefix)/s/"), "\(people)")
        let joined = try Self.ok("accept", short + ").", "--yes", "--json", home: world.bob).json
        #expect(joined["title"] == .string("Trip") && joined["permission"] == .string("readOnly"), "\(joined)")
    }
}
