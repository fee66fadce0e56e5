import Foundation

/// Up to `capacity` connections to one database, lent one at a time: a transaction holds its connection
/// alone until it gives it back. Connections are opened on first need; one found lost is dropped, and the
/// next use opens a new one.
///
/// `@unchecked Sendable` is sound because `condition` guards `idle`, `open` and `closed` (the other members
/// are immutable `let`s), and a lent connection is reachable only by the one caller that holds it until it is
/// given back.
final class PostgresPool: @unchecked Sendable {
    private let condition = NSCondition()
    private var idle: [PostgresConnection] = []
    /// Connections that exist: idle, lent, or being opened.
    private var open = 0
    private var closed = false
    let capacity: Int
    private let conninfo: String
    private let connectTimeoutSeconds: Int

    init(conninfo: String, capacity: Int, connectTimeoutSeconds: Int) {
        self.conninfo = conninfo
        self.capacity = max(1, capacity)
        self.connectTimeoutSeconds = connectTimeoutSeconds
    }

    /// Why a connection could not be lent.
    enum TakeFailure: Error {
        case closed
        case deadline
        case connect(PostgresError)
    }

    /// A connection of the pool: an idle one, a new one while there is room, or the first given back,
    /// waiting no longer than `deadline`.
    func take(before deadline: RequestDeadline?) throws(TakeFailure) -> PostgresConnection {
        condition.lock()
        while true {
            if closed {
                condition.unlock()
                throw .closed
            }
            if let connection = idle.popLast() {
                condition.unlock()
                return connection
            }
            if open < capacity {
                open += 1
                condition.unlock()
                do {
                    return try PostgresConnection(conninfo, connectTimeoutSeconds: connectTimeout(deadline))
                } catch {
                    condition.lock()
                    open -= 1
                    condition.broadcast()
                    condition.unlock()
                    throw .connect(error)
                }
            }
            if let deadline {
                let seconds = Double(deadline.remainingMilliseconds) / 1000
                if seconds <= 0 || !condition.wait(until: Date(timeIntervalSinceNow: seconds)) {
                    if !closed, let connection = idle.popLast() {
                        condition.unlock()
                        return connection
                    }
                    condition.unlock()
                    throw .deadline
                }
            } else {
                condition.wait()
            }
        }
    }

    /// An idle connection, without waiting or connecting; nil when none is idle (or the pool is closed).
    func takeIdle() -> PostgresConnection? {
        condition.lock()
        defer { condition.unlock() }
        return closed ? nil : idle.popLast()
    }

    /// The connect timeout: the configured one, shortened to the deadline (libpq counts whole seconds).
    private func connectTimeout(_ deadline: RequestDeadline?) -> Int {
        guard let deadline else { return connectTimeoutSeconds }
        return max(1, min(connectTimeoutSeconds, Int((deadline.remainingMilliseconds + 999) / 1000)))
    }

    /// Gives a connection back: kept if it is still usable and outside a transaction, dropped otherwise.
    func giveBack(_ connection: PostgresConnection) {
        condition.lock()
        defer { condition.unlock() }
        if !closed, connection.isUsable, !connection.isInTransaction {
            idle.append(connection)
        } else {
            open -= 1
        }
        condition.broadcast()
    }

    /// Drops every idle connection (after one was found lost: the server probably restarted, and the others
    /// are lost too); the next uses open new ones.
    func dropIdle() {
        condition.lock()
        defer { condition.unlock() }
        open -= idle.count
        idle.removeAll()
        condition.broadcast()
    }

    /// Waits until every lent connection is back, then closes them all; later uses fail with `.closed`.
    func close() {
        condition.lock()
        defer { condition.unlock() }
        closed = true
        open -= idle.count
        idle.removeAll()
        condition.broadcast()
        while open > 0 { condition.wait() }
    }
}
