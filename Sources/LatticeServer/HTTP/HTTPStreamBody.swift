import CMicroHTTPD
import Synchronization

/// The body of an answer sent while it is being made (server-sent events): the producer queues bytes with
/// `send`, and libmicrohttpd takes them as the connection can send them.
///
/// An idle stream holds no thread: when nothing is queued, the content-reader callback suspends the
/// connection, and the next `send` resumes it (both under this body's lock, so neither can miss the other).
/// What is queued is bounded by `limit`: a reader too slow to take it is cut off (the connection ends with
/// an error), never buffered without bound. libmicrohttpd frees the answer when the connection is done with
/// it, whatever the reason (the stream finished, the client left, the connection failed); then `onClose`
/// callbacks run, once.
public final class HTTPStreamBody: Sendable {
    private struct State {
        var pending: [UInt8] = []
        /// Bytes of `pending` already handed to libmicrohttpd.
        var taken = 0
        var finished = false
        var cutOff = false
        /// The connection, as a bit pattern, once the answer is queued on it.
        var connection: UInt = 0
        var suspended = false
        /// libmicrohttpd freed the answer: the connection may be gone.
        var released = false
        var onClose: [@Sendable () -> Void] = []
    }

    /// The most bytes queued and not yet taken before the reader is cut off.
    public let limit: Int
    private let state = Mutex(State())

    public init(limit: Int) { self.limit = limit }

    /// Queues `bytes`. False when the stream is over (closed, finished or cut off), or when the bytes would
    /// pass `limit`: the reader is then cut off.
    @discardableResult
    public func send(_ bytes: [UInt8]) -> Bool {
        state.withLock { state -> Bool in
            guard !state.released, !state.finished, !state.cutOff else { return false }
            if state.pending.count - state.taken + bytes.count > limit {
                state.cutOff = true
            } else {
                if state.taken > 0 && state.taken == state.pending.count {
                    state.pending.removeAll(keepingCapacity: true)
                    state.taken = 0
                }
                state.pending.append(contentsOf: bytes)
            }
            wake(&state)
            return !state.cutOff
        }
    }

    /// Ends the stream once what is queued has gone out.
    public func finish() {
        state.withLock { state in
            guard !state.released else { return }
            state.finished = true
            wake(&state)
        }
    }

    /// Runs `callback` once the connection is done with the stream (right away if it is already).
    public func onClose(_ callback: @escaping @Sendable () -> Void) {
        let runNow = state.withLock { state -> Bool in
            if state.released { return true }
            state.onClose.append(callback)
            return false
        }
        if runNow { callback() }
    }

    public var isClosed: Bool { state.withLock { $0.released } }

    /// Bytes queued and not yet taken.
    public var backlog: Int { state.withLock { $0.pending.count - $0.taken } }

    /// Resumes the connection if `read` suspended it, under the lock (as `read` suspends under it, so neither
    /// misses the other). A suspended connection, and its answer, stay until resumed, so it cannot be gone.
    private func wake(_ state: inout State) {
        guard state.suspended, !state.released, state.connection != 0 else { return }
        state.suspended = false
        MHD_resume_connection(OpaquePointer(bitPattern: state.connection))
    }

    // MARK: The adapter's side

    /// The answer is queued on `connection`.
    func attach(_ connection: OpaquePointer) {
        state.withLock { $0.connection = UInt(bitPattern: Int(bitPattern: UnsafeRawPointer(connection))) }
    }

    /// libmicrohttpd's content reader: copies up to `capacity` queued bytes; with nothing queued, suspends the
    /// connection and answers 0 (called again once resumed); -1 at the end, -2 once cut off.
    func read(into buffer: UnsafeMutablePointer<CChar>, capacity: Int) -> Int {
        state.withLock { state in
            if state.cutOff { return Int(MHD_CONTENT_READER_END_WITH_ERROR) }
            let available = state.pending.count - state.taken
            if available > 0 {
                let count = min(available, capacity)
                state.pending.withUnsafeBytes { bytes in
                    UnsafeMutableRawPointer(buffer).copyMemory(from: bytes.baseAddress! + state.taken, byteCount: count)
                }
                state.taken += count
                if state.taken == state.pending.count {
                    state.pending.removeAll(keepingCapacity: state.pending.capacity <= 4_096)
                    state.taken = 0
                }
                return count
            }
            if state.finished { return Int(MHD_CONTENT_READER_END_OF_STREAM) }
            if state.connection != 0 && !state.suspended {
                state.suspended = true
                MHD_suspend_connection(OpaquePointer(bitPattern: state.connection))
            }
            return 0
        }
    }

    /// libmicrohttpd freed the answer: the stream is over.
    func release() {
        let callbacks = state.withLock { state -> [@Sendable () -> Void] in
            state.released = true
            state.suspended = false
            state.pending = []
            state.taken = 0
            defer { state.onClose = [] }
            return state.onClose
        }
        for callback in callbacks { callback() }
    }
}

/// `MHD_ContentReaderCallback` of a streamed answer; the context is a retained `HTTPStreamBody`.
func streamBodyRead(_ context: UnsafeMutableRawPointer?, _ position: UInt64, _ buffer: UnsafeMutablePointer<CChar>?,
                    _ capacity: Int) -> Int {
    guard let context, let buffer else { return Int(MHD_CONTENT_READER_END_WITH_ERROR) }
    return Unmanaged<HTTPStreamBody>.fromOpaque(context).takeUnretainedValue().read(into: buffer, capacity: capacity)
}

/// `MHD_ContentReaderFreeCallback`: releases the retain `streamBodyRead`'s context holds.
func streamBodyFree(_ context: UnsafeMutableRawPointer?) {
    guard let context else { return }
    Unmanaged<HTTPStreamBody>.fromOpaque(context).takeRetainedValue().release()
}
