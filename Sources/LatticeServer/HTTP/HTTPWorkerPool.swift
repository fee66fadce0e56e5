import Foundation

/// The threads that run handlers, so libmicrohttpd's threads only accept, parse and write.
///
/// Fair between clients: each client (an account, or an address before sign-in) runs at most
/// `perClientRunning` jobs at once; its other jobs wait in its own line, and free threads take the next
/// job from the clients in turn (round-robin), so one client with many requests cannot hold every thread
/// nor make others wait behind its whole backlog. Lines are bounded per client and in total.
///
/// The last free thread is kept for a client with nothing running: a client already running a job waits
/// for it rather than take that thread. However many clients run their heaviest requests, a client that
/// arrives with one short request (a probe, another user's small write) finds a thread at once; the busy
/// clients share the other threads.
///
/// A job waits in line at most `Limits.maximumWait`: past it, a sweeper takes it out and runs its `expire`
/// instead (the exchange answers 503 with Retry-After), so a request behind others' heavy ones gets a
/// clear answer rather than none.
///
/// `@unchecked Sendable`: `condition` guards `state`, the only mutable member (`limits` is an immutable `let`).
final class HTTPWorkerPool: @unchecked Sendable {
    struct Limits: Sendable {
        var threads: Int
        var perClientRunning: Int
        var perClientQueued: Int
        var totalQueued: Int
        /// Longest a job waits in line before it is expired.
        var maximumWait: Duration = .seconds(5)
    }

    enum Submission: Equatable {
        case accepted
        /// The client's own line is full.
        case clientBusy
        /// The pool's line is full.
        case queueFull
        case stopped
    }

    typealias Job = @Sendable () -> Void

    private struct Queued {
        var job: Job
        var expire: Job
        var since: ContinuousClock.Instant
    }

    private struct State {
        var lines: [String: [Queued]] = [:]
        /// Clients with jobs waiting, in turn order.
        var turn: [String] = []
        var running: [String: Int] = [:]
        /// Threads running a job now (the sum of `running`).
        var busy = 0
        var queued = 0
        var stopped = false
    }

    private let limits: Limits
    private let condition = NSCondition()
    private var state = State()

    init(limits: Limits) {
        self.limits = limits
        for index in 0..<limits.threads {
            let thread = Thread { [self] in work() }
            thread.name = "lattice-worker-\(index)"
            thread.start()
        }
        let sweeper = Thread { [self] in sweep() }
        sweeper.name = "lattice-worker-sweeper"
        sweeper.start()
    }

    /// Queues `job` for `client`; if it waits in line longer than `maximumWait`, `expire` runs instead.
    func submit(client: String, expire: @escaping Job = {}, _ job: @escaping Job) -> Submission {
        condition.lock()
        defer { condition.unlock() }
        if state.stopped { return .stopped }
        if state.lines[client, default: []].count >= limits.perClientQueued { return .clientBusy }
        if state.queued >= limits.totalQueued { return .queueFull }
        if state.lines[client] == nil || state.lines[client]!.isEmpty { state.turn.append(client) }
        state.lines[client, default: []].append(Queued(job: job, expire: expire, since: .now))
        state.queued += 1
        condition.signal()
        return .accepted
    }

    /// Lets the threads finish what they run and exit; queued jobs are dropped (the server has answered
    /// their requests). Does not wait: a stuck handler keeps its thread.
    func stop() {
        condition.lock()
        state.stopped = true
        state.lines = [:]
        state.turn = []
        state.queued = 0
        condition.broadcast()
        condition.unlock()
    }

    var queuedCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return state.queued
    }

    var runningCount: Int {
        condition.lock()
        defer { condition.unlock() }
        return state.running.values.reduce(0, +)
    }

    /// Every quarter of `maximumWait` (at most every 0.25 s), takes the jobs that waited past it out of line
    /// and expires them.
    private func sweep() {
        let wait = limits.maximumWait.components
        let tick = min(0.25, max(0.01, (Double(wait.seconds) + Double(wait.attoseconds) / 1e18) / 4))
        while true {
            Thread.sleep(forTimeInterval: tick)
            condition.lock()
            if state.stopped {
                condition.unlock()
                return
            }
            let expired = takeExpired(now: .now)
            condition.unlock()
            for job in expired { job() }
        }
    }

    /// Removes the jobs older than `maximumWait` (each line is oldest first). Called with the lock held.
    private func takeExpired(now: ContinuousClock.Instant) -> [Job] {
        guard state.queued > 0 else { return [] }
        var expired: [Job] = []
        for (client, line) in state.lines {
            let stale = line.prefix { now - $0.since > limits.maximumWait }
            guard !stale.isEmpty else { continue }
            expired += stale.map(\.expire)
            state.queued -= stale.count
            if stale.count == line.count {
                state.lines[client] = nil
                state.turn.removeAll { $0 == client }
            } else {
                state.lines[client] = Array(line.dropFirst(stale.count))
            }
        }
        return expired
    }

    private func work() {
        condition.lock()
        while true {
            if state.stopped {
                condition.unlock()
                return
            }
            guard let (client, job) = nextJob() else {
                condition.wait()
                continue
            }
            condition.unlock()
            job()
            condition.lock()
            state.running[client, default: 1] -= 1
            if state.running[client] == 0 { state.running[client] = nil }
            state.busy -= 1
            // That client, or one held back from the last free thread, may take a thread now.
            if state.queued > 0 { condition.signal() }
        }
    }

    /// The first client in turn below its running cap gives up its oldest job and goes to the back of
    /// the turn; the last free thread only to a client with nothing running. Called with the lock held.
    private func nextJob() -> (String, Job)? {
        let lastFree = limits.threads > 1 && limits.threads - state.busy <= 1
        guard let index = state.turn.firstIndex(where: { client in
            let running = state.running[client, default: 0]
            return running < limits.perClientRunning && (!lastFree || running == 0)
        }) else { return nil }
        let client = state.turn.remove(at: index)
        let job = state.lines[client]!.removeFirst().job
        if state.lines[client]!.isEmpty {
            state.lines[client] = nil
        } else {
            state.turn.append(client)
        }
        state.queued -= 1
        state.running[client, default: 0] += 1
        state.busy += 1
        return (client, job)
    }
}
