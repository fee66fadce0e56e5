import CHTTPShims
import CMicroHTTPD
import Synchronization

/// One request on one connection, from its request line to libmicrohttpd's completion callback.
///
/// libmicrohttpd calls the access handler for it several times: once the headers are in, once per piece
/// of body, once more when the body is complete, and once again after a suspended connection is resumed.
/// Those calls come one at a time on the connection's worker thread; `deliver(_:)` may come from any
/// thread at any moment, so everything sits behind one lock.
final class HTTPExchange: Sendable {
    private enum Phase {
        /// The access handler has not been called yet.
        case awaitingHeaders
        case receivingBody
        /// Inside `HTTPHandler.handle`.
        case handling
        /// Parked with `MHD_suspend_connection`; `deliver` resumes it.
        case suspended
        /// `deliver` resumed the connection; the next access-handler call queues the answer.
        case resumed
        /// The answer is queued with the library; nothing is left to do.
        case answered
    }

    private struct State {
        var phase = Phase.awaitingHeaders
        /// The first answer wins: the handler's, the oversized-body one, or the server's shutdown answer.
        var response: HTTPResponse?
        var method = ""
        var headers: [String: String] = [:]
        var remoteAddress = ""
        var body: [UInt8] = []
        var receivedBodyBytes = 0
        var bodyIsOversized = false
    }

    /// Valid until the completion callback; only used for suspend and resume, which the phase guards.
    nonisolated(unsafe) private let connection: OpaquePointer
    private let path: String
    private let query: String
    private let state = Mutex(State())

    /// `target` is the request target exactly as sent: the path, then `?` and the raw query, if any.
    init(connection: OpaquePointer, target: String) {
        self.connection = connection
        if let mark = target.firstIndex(of: "?") {
            path = String(target[..<mark])
            query = String(target[target.index(after: mark)...])
        } else {
            path = target
            query = ""
        }
    }

    /// Answers the request, once. Safe from any thread; later calls are ignored.
    func deliver(_ response: HTTPResponse) {
        let mustResume = state.withLock { state -> Bool in
            guard state.response == nil else { return false }
            state.response = response
            guard state.phase == .suspended else { return false }
            state.phase = .resumed
            return true
        }
        // The connection stays suspended until this call, so it cannot have been freed.
        if mustResume { MHD_resume_connection(connection) }
    }

    /// One access-handler call. Returns `false` when the connection must be closed.
    func advance(in context: HTTPDaemonContext, method: UnsafePointer<CChar>?, uploadData: UnsafePointer<CChar>?,
                 uploadSize: UnsafeMutablePointer<Int>) -> Bool {
        switch state.withLock({ $0.phase }) {
        case .awaitingHeaders:
            if let early = receiveHeaders(in: context, method: method) {
                return queue(early, in: context)
            }
            if uploadSize.pointee > 0 { receiveBody(uploadData, count: uploadSize, in: context) }
            return true
        case .receivingBody:
            if uploadSize.pointee > 0 {
                receiveBody(uploadData, count: uploadSize, in: context)
                return true
            }
            return finishRequest(in: context)
        case .resumed:
            let response = state.withLock { state in
                state.phase = .answered
                return state.response
            }
            guard let response else { return false }
            return queue(response, in: context)
        case .handling, .suspended, .answered:
            // Not expected: the library does not call back for a parked or answered request.
            return true
        }
    }

    /// Records method, headers and client address. Returns an answer to send right away, without reading
    /// the body: the oversized-body answer when Content-Length is over the cap, or an answer set earlier.
    private func receiveHeaders(in context: HTTPDaemonContext, method: UnsafePointer<CChar>?) -> HTTPResponse? {
        let headers = requestHeaders(of: connection)
        let remoteAddress = clientAddress(of: connection)
        let maximum = context.handler.maximumBodySize
        let declaredLength = headers["content-length"].flatMap { Int($0.trimmingSpaces) }
        let methodName = method.map { String(cString: $0) } ?? ""

        let (isOversized, earlier) = state.withLock { state in
            state.method = methodName
            state.headers = headers
            state.remoteAddress = remoteAddress
            state.phase = .receivingBody
            if let declaredLength {
                if declaredLength > maximum {
                    state.bodyIsOversized = true
                } else {
                    state.body.reserveCapacity(min(declaredLength, 1 << 20))
                }
            }
            return (state.bodyIsOversized, state.response)
        }
        if isOversized { return answer(with: context.handler.responseForOversizedBody()) }
        if earlier != nil { return answer(with: nil) }
        return nil
    }

    /// Keeps body bytes up to the cap and counts (but drops) the rest. Consumes the whole piece.
    private func receiveBody(_ data: UnsafePointer<CChar>?, count: UnsafeMutablePointer<Int>,
                             in context: HTTPDaemonContext) {
        let size = count.pointee
        count.pointee = 0
        guard let data, size > 0 else { return }
        let maximum = context.handler.maximumBodySize
        state.withLock { state in
            state.receivedBodyBytes += size
            guard !state.bodyIsOversized else { return }
            guard state.receivedBodyBytes <= maximum else {
                state.bodyIsOversized = true
                state.body = []
                return
            }
            state.body.append(contentsOf: UnsafeRawBufferPointer(start: data, count: size))
        }
    }

    /// The body is complete: answer an oversized body, or hand the request to the handler and either queue
    /// its answer now or park the connection until `deliver` brings one.
    private func finishRequest(in context: HTTPDaemonContext) -> Bool {
        enum Next {
            case oversized
            case answered(HTTPResponse)
            case handle(HTTPRequest)
        }
        let next = state.withLock { state -> Next in
            if state.bodyIsOversized { return .oversized }
            if let response = state.response {
                state.phase = .answered
                return .answered(response)
            }
            state.phase = .handling
            let body = state.body
            state.body = []
            return .handle(HTTPRequest(method: state.method, path: path, query: query, headers: state.headers,
                                       body: body, remoteAddress: state.remoteAddress))
        }
        switch next {
        case .oversized:
            return queue(answer(with: context.handler.responseForOversizedBody()), in: context)
        case .answered(let response):
            return queue(response, in: context)
        case .handle(let request):
            context.handler.handle(request) { [self] response in deliver(response) }
            let ready = state.withLock { state -> HTTPResponse? in
                if let response = state.response {
                    state.phase = .answered
                    return response
                }
                // Suspend under the lock so `deliver` cannot resume before the suspension happened.
                state.phase = .suspended
                MHD_suspend_connection(connection)
                return nil
            }
            guard let ready else { return true }
            return queue(ready, in: context)
        }
    }

    /// Marks the request answered with `response` unless an answer is already set; returns the winner.
    private func answer(with response: HTTPResponse?) -> HTTPResponse {
        state.withLock { state in
            state.phase = .answered
            if state.response == nil { state.response = response }
            return state.response ?? HTTPResponse(status: 500)
        }
    }

    private func queue(_ response: HTTPResponse, in context: HTTPDaemonContext) -> Bool {
        queueResponse(response, on: connection, closeAfterwards: context.isDraining)
    }
}

// MARK: - libmicrohttpd calls

/// Sends `response` on `connection`. The library computes Content-Length itself, so a handler's own
/// Content-Length header is left out. While the server drains, the connection closes after the answer.
private func queueResponse(_ response: HTTPResponse, on connection: OpaquePointer, closeAfterwards: Bool) -> Bool {
    let created = response.body.withUnsafeBytes { bytes in
        MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                        .RESPMEM_MUST_COPY)
    }
    guard let created else { return false }
    defer { MHD_destroy_response(created) }

    var hasConnectionHeader = false
    for header in response.headers {
        let name = header.name.lowercased()
        if name == "content-length" { continue }
        if name == "connection" { hasConnectionHeader = true }
        // A header the library refuses (say, one with a line break) is a handler bug; it is dropped.
        _ = MHD_add_response_header(created, header.name, header.value)
    }
    if closeAfterwards && !hasConnectionHeader {
        _ = MHD_add_response_header(created, "Connection", "close")
    }
    let status = (100...999).contains(response.status) ? UInt32(response.status) : 500
    return MHD_queue_response(connection, status, created) == .YES
}

/// All request headers, names lowercased; repeated headers are joined with ", ".
private func requestHeaders(of connection: OpaquePointer) -> [String: String] {
    var headers: [String: String] = [:]
    withUnsafeMutablePointer(to: &headers) { pointer in
        _ = MHD_get_connection_values(connection, .HEADER_KIND, collectHeader, pointer)
    }
    return headers
}

/// `MHD_KeyValueIterator` for `requestHeaders(of:)`: a plain C function, context is the dictionary.
private func collectHeader(_ context: UnsafeMutableRawPointer?, _ kind: MHD_ValueKind, _ key: UnsafePointer<CChar>?,
                           _ value: UnsafePointer<CChar>?) -> MHD_Result {
    guard let context, let key else { return .YES }
    let headers = context.assumingMemoryBound(to: [String: String].self)
    let name = String(cString: key).lowercased()
    let text = value.map { String(cString: $0) } ?? ""
    if let existing = headers.pointee[name] {
        headers.pointee[name] = existing + ", " + text
    } else {
        headers.pointee[name] = text
    }
    return .YES
}

private func clientAddress(of connection: OpaquePointer) -> String {
    var buffer = [CChar](repeating: 0, count: 64)
    guard lattice_mhd_client_address(connection, &buffer, buffer.count) == 1 else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

extension String {
    fileprivate var trimmingSpaces: Substring {
        let isSpace: (Character) -> Bool = { $0 == " " || $0 == "\t" }
        guard let first = firstIndex(where: { !isSpace($0) }) else { return "" }
        let last = lastIndex(where: { !isSpace($0) })!
        return self[first...last]
    }
}
