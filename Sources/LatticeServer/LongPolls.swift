import LatticeAPI
import LatticeCore
import LatticeOperations

/// `changes/wait`, the push path in place of CloudKit's database subscriptions: the operation says what to
/// watch (`Feeds.planWait`); the server parks the request on this node's `ChangeNotifier` and answers
/// `{"changed": true}` as soon as a watched database's change log moves past its position, or
/// `{"changed": false}` after the timeout.
extension LatticeService {
    /// At most `maximumParkedWaitsPerUser` per account are parked at once (more get THROTTLED); one whose
    /// client goes away (`abandonment`) is released at once.
    func waitForChanges(_ context: RequestContext, abandonment: HTTPAbandonment = HTTPAbandonment(),
                        respond: @escaping HTTPResponder) throws {
        let feeds = Feeds(core)
        let plan = try feeds.planWait(context.caller, context.body)
        let answer: @Sendable (ChangeNotifier.WaitOutcome) -> Void = { outcome in
            switch outcome {
            case .changed: respond(.json(.object(["changed": .bool(true)])))
            case .timedOut: respond(.json(.object(["changed": .bool(false)])))
            case .shuttingDown: respond(ServiceError(.tryAgainLater, "the server is shutting down").response)
            case .abandoned: respond(.json(.object(["changed": .bool(false)])))
            }
        }
        // Already behind: answer at once, whatever the timeout.
        if plan.behind { return answer(.changed) }
        if plan.timeoutSeconds == 0 { return answer(.timedOut) }
        let waiter: ChangeNotifier.Waiter
        let limit = configuration.maximumParkedWaitsPerUser
        switch notifier.register(cursors: plan.cursors, timeoutSeconds: plan.timeoutSeconds, owner: context.user.id,
                                 limit: limit, fire: answer) {
        case .registered(let registered): waiter = registered
        case .overLimit:
            throw ServiceError(.throttled, "this account already has \(limit) changes/wait requests parked; one "
                           + "request can watch both the private and the shared database", retryAfter: 1)
        case .shuttingDown: throw ServiceError(.tryAgainLater, "the server is shutting down")
        }
        abandonment.onAbandon { [notifier] in notifier.finish(waiter, .abandoned) }
        // Registered first, then re-read: a commit that landed before the registration is seen here.
        if try feeds.moved(plan, deadline: context.deadline) { notifier.finish(waiter, .changed) }
    }
}
