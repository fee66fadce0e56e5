import Dispatch
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

/// The server's own outbound requests (identity providers, webhooks), bounded in time and in the size of
/// the answer it keeps: an answer longer than the limit is cut off (its status still counts), and the
/// whole exchange ends by `totalTimeout` whatever the other side does.
enum OutboundHTTP {
    enum Answer: Sendable {
        /// `tooLarge`: the body passed the limit and was dropped (the status came).
        case answered(status: Int, body: [UInt8], tooLarge: Bool)
        case timedOut
        case failed(String)
    }

    /// One answer as it arrives, cut off past `limit` bytes. Every field is behind `state`'s lock; the
    /// semaphore is signalled once, when the task completes (cancelled ones too).
    final class Collector: NSObject, URLSessionDataDelegate, Sendable {
        struct State {
            var body: [UInt8] = []
            var tooLarge = false
            var error: String?
            var status: Int?
        }

        let limit: Int
        let followsRedirects: Bool
        let state = Mutex(State())
        let done = DispatchSemaphore(value: 0)

        init(limit: Int, followsRedirects: Bool) {
            self.limit = limit
            self.followsRedirects = followsRedirects
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                        completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
            state.withLock { $0.status = (response as? HTTPURLResponse)?.statusCode }
            completionHandler(.allow)
        }

        func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
            let declared = dataTask.response?.expectedContentLength ?? -1
            let over = state.withLock { state -> Bool in
                if state.status == nil { state.status = (dataTask.response as? HTTPURLResponse)?.statusCode }
                guard !state.tooLarge else { return true }
                if declared > Int64(limit) || state.body.count + data.count > limit {
                    state.tooLarge = true
                    state.body = []
                    return true
                }
                state.body.append(contentsOf: data)
                return false
            }
            if over { dataTask.cancel() }
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, willPerformHTTPRedirection response: HTTPURLResponse,
                        newRequest request: URLRequest, completionHandler: @escaping @Sendable (URLRequest?) -> Void) {
            // Not followed: the redirect itself is the answer.
            completionHandler(followsRedirects ? request : nil)
        }

        func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
            state.withLock { state in
                if state.status == nil { state.status = (task.response as? HTTPURLResponse)?.statusCode }
                if let error, !state.tooLarge { state.error = String(error.localizedDescription.prefix(200)) }
            }
            done.signal()
        }
    }

    /// Sends `request` and waits at most `totalTimeout` seconds for the answer.
    static func send(_ request: URLRequest, limit: Int, requestTimeout: Double, totalTimeout: Double,
                     followsRedirects: Bool) -> Answer {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = requestTimeout
        configuration.timeoutIntervalForResource = totalTimeout
        let collector = Collector(limit: limit, followsRedirects: followsRedirects)
        let session = URLSession(configuration: configuration, delegate: collector, delegateQueue: nil)
        // Cancels whatever is still under way (after a time-out) and releases the delegate.
        defer { session.invalidateAndCancel() }
        let task = session.dataTask(with: request)
        task.resume()
        guard collector.done.wait(timeout: .now() + totalTimeout + 2) == .success else { return .timedOut }
        let outcome = collector.state.withLock { $0 }
        if let status = outcome.status, outcome.error == nil || outcome.tooLarge {
            return .answered(status: status, body: outcome.body, tooLarge: outcome.tooLarge)
        }
        if let error = outcome.error { return .failed(error) }
        return .failed("no answer")
    }
}
