import Foundation
import LatticeCore
import LatticeLists
@testable import LatticeSync
import Synchronization
import LatticeTestSupport
import Testing

/// The account's online operations (`AccountClient`) and the home's account state (`SyncEngine.signIn(_:)`,
/// `signOut()`): sign-up and sign-in keep nothing, installing another account drops the old one's data,
/// signing out needs no network, revoking goes to the server, and "not now" is handled as for every call.
@Suite struct AccountClientTests {
    static let server = "http://127.0.0.1:8080"

    @Test func signUpAndSignInAnswerTheAccountAndKeepNothing() async throws {
        let world = try SyncWorld()
        let (laptop, _, _) = try world.device("laptop")
        let accounts = try laptop.accountClient(Self.server)
        let alice = try await accounts.signUp(name: "alice")
        #expect(alice.name == "alice" && alice.serverURL == Self.server && !alice.token.isEmpty)
        #expect(laptop.account == nil)
        await #expect(try accounts.signIn(token: alice.token) == alice)
        #expect(laptop.account == nil)
        do {
            _ = try await accounts.signIn(token: "not-a-token")
            Issue.record("an unknown token signed in")
        } catch let error as ServerError {
            #expect(error.serverErrorCode == .authenticationFailed)
        }
    }

    @Test func installingAnotherAccountDropsTheOldOnesDataAndSaysSo() async throws {
        let world = try SyncWorld()
        let (engine, lists, _) = try world.device("laptop")
        let accounts = try engine.accountClient(Self.server)
        let alice = try await accounts.signUp(name: "alice")
        try await engine.signIn(alice)
        #expect(engine.account == alice)
        _ = try lists.create(title: "Groceries")
        #expect(try engine.pendingCount() > 0)

        // The same account with another token: a new token, the same data, no account change.
        let token = try await #require(try accounts.call("private", "tokens/create", .object([:]), as: alice)["token"]?.stringValue)
        let again = try await accounts.signIn(token: token)
        try await engine.signIn(again)
        #expect(engine.account?.token == token)
        #expect(try lists.all().map(\.title) == ["Groceries"] && engine.pendingCount() > 0)

        // Another account takes the home over: alice's lists and unsent edits leave it.
        let bob = try await accounts.signUp(name: "bob")
        try await engine.signIn(bob)
        #expect(engine.account == bob)
        #expect(try engine.zones().isEmpty && engine.pendingCount() == 0)
    }

    @Test func signingOutForgetsTheAccountAndItsDataWithoutTheNetwork() async throws {
        let world = try SyncWorld()
        let (engine, lists, online) = try world.device("laptop")
        let alice = try await engine.signUpAndSignIn(name: "alice", serverURL: Self.server)
        #expect(engine.account == alice)
        _ = try lists.create(title: "Groceries")
        #expect(try await engine.sync().online)
        _ = try lists.create(title: "Chores")
        online.set(false)
        try await engine.signOut()
        #expect(engine.account == nil)
        #expect(try engine.zones().isEmpty && engine.pendingCount() == 0)
        try await engine.signOut() // no one signed in: nothing to say
    }

    @Test func revokingTheTokenEndsItOnTheServer() async throws {
        let world = try SyncWorld()
        let (engine, _, _) = try world.device("laptop")
        let alice = try await engine.signUpAndSignIn(name: "alice", serverURL: Self.server)
        let accounts = try engine.accountClient()
        await #expect(try accounts.revokeToken(of: alice))
        do {
            _ = try await accounts.signIn(token: alice.token)
            Issue.record("a revoked token signed in")
        } catch let error as ServerError {
            #expect(error.serverErrorCode == .authenticationFailed)
        }
        await #expect(try accounts.revokeToken(of: alice) == false) // already revoked: nothing left to revoke
        #expect(engine.account == alice) // the home forgets it only when told to
    }

    @Test func revokingOfflineThrowsAndTheHomeKeepsItsAccount() async throws {
        let world = try SyncWorld()
        let (engine, _, online) = try world.device("laptop")
        let alice = try await engine.signUpAndSignIn(name: "alice", serverURL: Self.server)
        online.set(false)
        await #expect(throws: TransportError.self) { try await engine.accountClient().revokeToken(of: alice) }
        #expect(engine.account == alice)
        online.set(true)
        await #expect(try engine.accountClient().signIn(token: alice.token) == alice)
    }

    @Test func anAccountOfAnotherServerIsRefusedBeforeAnythingIsSent() async throws {
        let transport = NotNowTests.Scripted([NotNowTests.ok])
        let accounts = try AccountClient(serverURL: "http://a.example", transport: transport)
        let elsewhere = Account(serverURL: "http://b.example", token: "secret", userRecordName: "_u", name: "u")
        let attempts: [@Sendable () async throws -> Void] = [
            { _ = try await accounts.call("private", "tokens/list", .object([:]), as: elsewhere) },
            { _ = try await accounts.revokeToken(of: elsewhere) },
        ]
        for attempt in attempts {
            do {
                try await attempt()
                Issue.record("the call went to another server")
            } catch let error as SyncError {
                guard case .otherServer(let url) = error else {
                    Issue.record("\(error)")
                    continue
                }
                #expect(url == "http://b.example")
            }
        }
        #expect(transport.count == 0)
    }

    @Test func aLongRetryAfterOnSignUpIsThrownAtOnceWithWhenToTryAgain() async throws {
        let transport = NotNowTests.Scripted([NotNowTests.throttled(retryAfter: 840, reason: "too many sign-ups")])
        let log = NotNowTests.Log()
        var accounts = try AccountClient(serverURL: Self.server, transport: transport)
        accounts.server.sleep = { seconds in log.sleeps.withLock { $0.append(seconds) } }
        accounts.server.onWait = { wait in log.waits.withLock { $0.append(wait.description) } }
        do {
            _ = try await accounts.signUp(name: "bob")
            Issue.record("the sign-up succeeded")
        } catch let error as ServerError {
            #expect(error.isNotNow && error.retryAdvice == "try again in 14 minutes")
        }
        #expect(transport.count == 1)
        #expect(log.sleeps.withLock { $0 }.isEmpty && log.waits.withLock { $0 }.isEmpty)
    }

    @Test func pausesPastTwoSecondsOfASignInAreAnnounced() async throws {
        let user = TransportResponse(status: 200, headers: [:],
                                     body: JSON.object(["userRecordName": .string("_u1"), "name": .string("ann")])
                                         .serializedBytes())
        let transport = NotNowTests.Scripted(Array(repeating: NotNowTests.throttled(retryAfter: 2), count: 4) + [user])
        let log = NotNowTests.Log()
        var accounts = try AccountClient(serverURL: Self.server, transport: transport)
        accounts.server.sleep = { seconds in log.sleeps.withLock { $0.append(seconds) } }
        accounts.server.onWait = { wait in log.waits.withLock { $0.append(wait.description) } }
        let ann = try await accounts.signIn(token: "t")
        #expect(ann == Account(serverURL: Self.server, token: "t", userRecordName: "_u1", name: "ann"))
        #expect(log.sleeps.withLock { $0 }.count == 4)
        let waits = log.waits.withLock { $0 }
        #expect(waits.count == 3 && waits.allSatisfy { $0.contains("of users/current: the server answered THROTTLED") },
                "\(waits)")
    }
}
