import Dispatch
import Synchronization

/// Wakes long polls (`changes/wait`) when a database's change log moves past what they have seen.
///
/// A waiter is registered before the caller re-reads the log position, so a commit that lands between
/// the read and the registration still wakes it: `notify` runs after every commit.
final class ChangeNotifier: Sendable {
    /// One waiting request. It fires once: on a change, on its timeout, or at shutdown.
    final class Waiter: Sendable {
        let id: Int
        let databaseIDs: Set<Int64>
        /// Fires when a database's position exceeds its cursor here.
        let cursors: [Int64: Int64]
        private let fire: Mutex<(@Sendable (WaitOutcome) -> Void)?>

        init(id: Int, cursors: [Int64: Int64], fire: @escaping @Sendable (WaitOutcome) -> Void) {
            self.id = id
            self.cursors = cursors
            self.databaseIDs = Set(cursors.keys)
            self.fire = Mutex(fire)
        }

        /// Runs the callback the first time only.
        func complete(_ outcome: WaitOutcome) {
            let callback = fire.withLock { slot -> (@Sendable (WaitOutcome) -> Void)? in
                defer { slot = nil }
                return slot
            }
            callback?(outcome)
        }
    }

    enum WaitOutcome: Sendable {
        case changed
        case timedOut
        case shuttingDown
    }

    private struct State {
        var nextID = 0
        var waiters: [Int: Waiter] = [:]
        var shuttingDown = false
    }

    private let state = Mutex(State())

    /// Registers a waiter over databases with their cursors; returns nil when shutting down.
    func register(cursors: [Int64: Int64], timeoutSeconds: Int,
                  fire: @escaping @Sendable (WaitOutcome) -> Void) -> Waiter? {
        let waiter: Waiter? = state.withLock { state in
            guard !state.shuttingDown else { return nil }
            state.nextID += 1
            let waiter = Waiter(id: state.nextID, cursors: cursors, fire: fire)
            state.waiters[waiter.id] = waiter
            return waiter
        }
        guard let waiter else { return nil }
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(timeoutSeconds)) { [weak self] in
            self?.finish(waiter, .timedOut)
        }
        return waiter
    }

    /// Completes and forgets a waiter.
    func finish(_ waiter: Waiter, _ outcome: WaitOutcome) {
        _ = state.withLock { $0.waiters.removeValue(forKey: waiter.id) }
        waiter.complete(outcome)
    }

    /// A database's log reached `position`; wakes the waiters behind it.
    func notify(databaseID: Int64, position: Int64) {
        let woken: [Waiter] = state.withLock { state in
            let ready = state.waiters.values.filter { ($0.cursors[databaseID] ?? .max) < position }
            for waiter in ready { state.waiters.removeValue(forKey: waiter.id) }
            return ready
        }
        for waiter in woken { waiter.complete(.changed) }
    }

    /// Wakes a user's waiters regardless of position (their access changed).
    func wakeAll(where predicate: (Waiter) -> Bool) {
        let woken: [Waiter] = state.withLock { state in
            let ready = state.waiters.values.filter(predicate)
            for waiter in ready { state.waiters.removeValue(forKey: waiter.id) }
            return ready
        }
        for waiter in woken { waiter.complete(.changed) }
    }

    /// Answers every waiter and refuses new ones.
    func shutDown() {
        let all: [Waiter] = state.withLock { state in
            state.shuttingDown = true
            defer { state.waiters.removeAll() }
            return Array(state.waiters.values)
        }
        for waiter in all { waiter.complete(.shuttingDown) }
    }

    var waiterCount: Int { state.withLock { $0.waiters.count } }
}
