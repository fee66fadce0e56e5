import Foundation
import Synchronization

/// A connection of its own that `LISTEN`s on one channel and hands every notification to a handler, on a
/// thread of its own. When the connection is lost it is opened again (every half second until it works),
/// and `resynchronize` is called after each (re)connection: notifications sent while no connection listened
/// are lost, so whoever relies on them must re-check everything.
///
/// Sendable as it stands: every member is an immutable `let` of a Sendable type (`stopped` is atomic), and
/// the connection is a local of the listener's thread.
final class PostgresListener: Sendable {
    private let conninfo: String
    private let channel: String
    private let notify: @Sendable (String) -> Void
    private let resynchronize: @Sendable () -> Void
    private let stopped = Atomic<Bool>(false)
    private let finished = DispatchSemaphore(value: 0)

    /// - Parameters:
    ///   - channel: a channel name of ours (letters, digits and `_`; it is quoted into `LISTEN`).
    ///   - notify: called with each notification's payload, in order, on the listener's thread.
    ///   - resynchronize: called once the channel is listened to, first and after every reconnection.
    init(conninfo: String, channel: String, notify: @escaping @Sendable (String) -> Void,
         resynchronize: @escaping @Sendable () -> Void) {
        precondition(channel.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }, "a plain channel name")
        self.conninfo = conninfo
        self.channel = channel
        self.notify = notify
        self.resynchronize = resynchronize
    }

    func start() {
        Thread.detachNewThread { [self] in
            run()
            finished.signal()
        }
    }

    /// Stops listening; returns once the thread has ended (it notices within a quarter of a second).
    func stop() {
        guard !stopped.exchange(true, ordering: .sequentiallyConsistent) else { return }
        _ = finished.wait(timeout: .now() + 5)
    }

    private var isStopped: Bool { stopped.load(ordering: .sequentiallyConsistent) }

    private func run() {
        while !isStopped {
            guard let connection = try? PostgresConnection(conninfo, connectTimeoutSeconds: 2) else {
                pause(milliseconds: 500)
                continue
            }
            do {
                try connection.execute("LISTEN \"\(channel)\"", context: "listen")
                resynchronize()
                while !isStopped {
                    _ = connection.waitForInput(milliseconds: 250)
                    for notification in try connection.notifications() where notification.channel == channel {
                        notify(notification.payload)
                    }
                }
            } catch {
                // Lost: open a new connection (after a pause, so a database that is down is not hammered).
                pause(milliseconds: 500)
            }
        }
    }

    private func pause(milliseconds: Int) {
        var left = milliseconds
        while left > 0, !isStopped {
            usleep(50_000)
            left -= 50
        }
    }
}
