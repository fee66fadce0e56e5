import Testing
@testable import LatticeServer

/// The server-wide body budget is shared fairly: one client cannot spend it for everyone, and small
/// bodies still get in when large ones have taken it.
@Suite struct BodyBudgetTests {
    let mib = 1024 * 1024

    @Test func oneClientHoldsAtMostAnEighthAndOthersStillGetIn() {
        let budget = BodyBudget(total: 64 * mib, largestBody: 2 * mib)
        var held = 0
        for _ in 0..<32 where budget.reserve(2 * mib, client: "user:1") { held += 1 }
        #expect(held == 4) // 8 MiB of 64
        #expect(!budget.reserve(2 * mib, client: "user:1"))
        #expect(budget.reserve(2 * mib, client: "user:2"))
        budget.release(2 * mib, client: "user:1")
        #expect(budget.reserve(2 * mib, client: "user:1"))
        #expect(budget.reservedInAll == 10 * mib)
    }

    @Test func smallBodiesGetInWhenLargeOnesHaveTakenTheBudget() {
        let budget = BodyBudget(total: 16 * mib, largestBody: 2 * mib)
        for client in 0..<8 { #expect(budget.reserve(2 * mib, client: "user:\(client)")) }
        #expect(!budget.reserve(2 * mib, client: "user:99"))
        #expect(budget.reserve(1_000, client: "user:99"))
        #expect(budget.reservedInAll == 16 * mib + 1_000)
        for client in 0..<8 { budget.release(2 * mib, client: "user:\(client)") }
        budget.release(1_000, client: "user:99")
        #expect(budget.reservedInAll == 0)
    }

    @Test func aSmallBudgetStillAdmitsOneLargestBody() {
        let budget = BodyBudget(total: 3 * mib, largestBody: 2 * mib)
        #expect(budget.reserve(2 * mib, client: "ip:127.0.0.2"))
        #expect(!budget.reserve(2 * mib, client: "ip:127.0.0.3"))
    }
}
