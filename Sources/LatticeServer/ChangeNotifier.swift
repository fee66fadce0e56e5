import Dispatch
import Synchronization

/// Wakes long polls (`changes/wait`) when a database's change log moves past what they have seen.
///
/// A waiter is registered before the caller re-reads the log position, so a commit that lands between
/// the read and the registration still wakes it: `notify` runs after every commit of this process, and
/// after every commit another node announces (`LatticeService.observedChange`, which reads the positions
/// of `watchedDatabaseIDs` only).
final class ChangeNotifier: Sendable {
    /// One waiting request. It fires once: on a change, on its timeout, or at shutdown.
    final class Waiter: Sendable {
        let id: Int
        /// The account the wait counts against (`register`'s `limit`).
        let owner: Int64
        let databaseIDs: Set<Int64>
        /// Fires when a database's position exceeds its cursor here.
        let cursors: [Int64: Int64]
        private let fire: Mutex<(@Sendable (WaitOutcome) -> Void)?>

        init(id: Int, owner: Int64, cursors: [Int64: Int64], fire: @escaping @Sendable (WaitOutcome) -> Void) {
            self.id = id
            self.owner = owner
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
        /// The client went away; the answer goes nowhere.
        case abandoned
    }

    enum Registration {
        case registered(Waiter)
        /// The owner already has `limit` waiters.
        case overLimit
        case shuttingDown
    }

    private struct State {
        var nextID = 0
        var waiters: [Int: Waiter] = [:]
        /// Waiters per owner, for the per-account cap.
        var perOwner: [Int64: Int] = [:]
        /// Waiters per watched database, so an announcement is filtered without a walk over every waiter.
        var perDatabase: [Int64: Int] = [:]
        var shuttingDown = false

        mutating func add(_ waiter: Waiter) {
            waiters[waiter.id] = waiter
            perOwner[waiter.owner, default: 0] += 1
            for id in waiter.databaseIDs { perDatabase[id, default: 0] += 1 }
        }

        mutating func remove(_ waiter: Waiter) {
            guard waiters.removeValue(forKey: waiter.id) != nil else { return }
            let count = perOwner[waiter.owner, default: 1] - 1
            perOwner[waiter.owner] = count > 0 ? count : nil
            for id in waiter.databaseIDs {
                let left = perDatabase[id, default: 1] - 1
                perDatabase[id] = left > 0 ? left : nil
            }
        }
    }

    private let state = Mutex(State())

    /// Registers a waiter over databases with their cursors, counted against `owner`, who may have at most
    /// `limit` at once.
    func register(cursors: [Int64: Int64], timeoutSeconds: Int, owner: Int64 = 0, limit: Int = .max,
                  fire: @escaping @Sendable (WaitOutcome) -> Void) -> Registration {
        let registration: Registration = state.withLock { state in
            guard !state.shuttingDown else { return .shuttingDown }
            guard state.perOwner[owner, default: 0] < limit else { return .overLimit }
            state.nextID += 1
            let waiter = Waiter(id: state.nextID, owner: owner, cursors: cursors, fire: fire)
            state.add(waiter)
            return .registered(waiter)
        }
        guard case .registered(let waiter) = registration else { return registration }
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(timeoutSeconds)) { [weak self] in
            self?.finish(waiter, .timedOut)
        }
        return registration
    }

    /// Completes and forgets a waiter.
    func finish(_ waiter: Waiter, _ outcome: WaitOutcome) {
        state.withLock { $0.remove(waiter) }
        waiter.complete(outcome)
    }

    /// A database's log reached `position`; wakes the waiters behind it.
    func notify(databaseID: Int64, position: Int64) {
        let woken: [Waiter] = state.withLock { state in
            let ready = state.waiters.values.filter { ($0.cursors[databaseID] ?? .max) < position }
            for waiter in ready { state.remove(waiter) }
            return ready
        }
        for waiter in woken { waiter.complete(.changed) }
    }

    /// Wakes a user's waiters regardless of position (their access changed).
    func wakeAll(where predicate: (Waiter) -> Bool) {
        let woken: [Waiter] = state.withLock { state in
            let ready = state.waiters.values.filter(predicate)
            for waiter in ready { state.remove(waiter) }
            return ready
        }
        for waiter in woken { waiter.complete(.changed) }
    }

    /// Answers every waiter and refuses new ones.
    func shutDown() {
        let all: [Waiter] = state.withLock { state in
            state.shuttingDown = true
            defer {
                state.waiters.removeAll()
                state.perOwner.removeAll()
                state.perDatabase.removeAll()
            }
            return Array(state.waiters.values)
        }
        for waiter in all { waiter.complete(.shuttingDown) }
    }

    var waiterCount: Int { state.withLock { $0.waiters.count } }

    /// The databases some parked waiter watches now.
    var watchedDatabaseIDs: Set<Int64> {
        state.withLock { Set($0.perDatabase.keys) }
    }

    /// Waiters `owner` holds now.
    func waiterCount(owner: Int64) -> Int { state.withLock { $0.perOwner[owner, default: 0] } }
}
