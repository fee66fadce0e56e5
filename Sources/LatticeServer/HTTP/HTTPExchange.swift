import CHTTPShims
import CMicroHTTPD
import Foundation
import Synchronization

/// One request on one connection, from its request line to libmicrohttpd's completion callback.
///
/// libmicrohttpd calls the access handler for it several times: once the headers are in, once per piece
/// of body, once more when the body is complete, and once again after a suspended connection is resumed.
/// Those calls come one at a time on the connection's HTTP thread; `deliver(_:)` may come from any
/// thread at any moment, so everything sits behind one lock.
///
/// Once the headers are in, the handler's `admit` decides (before any body is read) whether to refuse
/// the request, run it inline, or on the worker pool; a pooled request's connection is suspended while it
/// waits and runs, so the HTTP threads stay free.
final class HTTPExchange: Sendable {
    private enum Phase {
        /// The access handler has not been called yet.
        case awaitingHeaders
        case receivingBody
        /// Inside `HTTPHandler.handle`, on the HTTP thread.
        case handling
        /// Parked with `MHD_suspend_connection` (waiting for a worker, on one, or a late answer);
        /// `deliver` resumes it.
        case suspended
        /// `deliver` resumed the connection; the next access-handler call queues the answer.
        case resumed
        /// The answer is queued with the library; nothing is left to do.
        case answered
    }

    private struct State {
        var phase = Phase.awaitingHeaders
        /// The first answer wins: the handler's, an early refusal, or the server's shutdown answer.
        var response: HTTPResponse?
        var method = ""
        var headers: [String: String] = [:]
        var remoteAddress = ""
        var peerAddress = ""
        var body: [UInt8] = []
        var receivedBodyBytes = 0
        var bodyIsOversized = false
        /// The body would pass the server-wide budget: answered with 503 once it is in.
        var bodyOverBudget = false
        /// Bytes of the server-wide body budget this request holds.
        var reservedBodyBytes = 0
        /// Whose share of the body budget `reservedBodyBytes` counts against (`admit`'s client).
        var budgetClient = ""
        var admission = HTTPAdmission.inline
        /// The answer is a refusal of the request's framing: sent before the body, and the connection closes.
        var closesConnection = false
        /// A forwarded client's in-flight slot this request holds.
        var forwardedSlot: String?
        /// Where a streamed body goes (`HTTPAdmission.stream`), and its cap.
        var sink: (any HTTPBodySink)?
        var sinkMaximum = 0
        /// The sink refused the body: the answer, sent once the body is in (or at once, when it can be).
        var sinkRefusal: HTTPResponse?
        /// The request reached `handle`: the sink is the handler's from then on.
        var sinkHandedOver = false
        /// What went out, for the access log.
        var sentStatus: Int?
        var sentBytes = 0
    }

    /// Valid until the completion callback; only used for suspend and resume, which the phase guards.
    nonisolated(unsafe) private let connection: OpaquePointer
    private let path: String
    private let query: String
    private let started = ContinuousClock.now
    private let startedAt = Date()
    let abandonment = HTTPAbandonment()
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

    /// The client went away while the request was parked: tell the handler, and resume the connection
    /// (its socket is already shut down) so libmicrohttpd closes it.
    func abandon() {
        abandonment.abandon()
        deliver(HTTPResponse(status: 400, headers: [("Connection", "close")]))
    }

    var isAnswered: Bool { state.withLock { $0.response != nil } }

    /// One access-handler call. Returns `false` when the connection must be closed.
    func advance(in context: HTTPDaemonContext, method: UnsafePointer<CChar>?, version: UnsafePointer<CChar>?,
                 uploadData: UnsafePointer<CChar>?, uploadSize: UnsafeMutablePointer<Int>) -> Bool {
        switch state.withLock({ $0.phase }) {
        case .awaitingHeaders:
            if let early = receiveHeaders(in: context, method: method, version: version) {
                // Queued now, before the body, libmicrohttpd closes the connection (it will not read a
                // body it was not asked for). A request without a body gets its answer on the next call
                // instead, when the request is complete, so a kept-alive connection stays open; a refused
                // framing never waits (where its body ends is the very question).
                if carriesNoBody && !state.withLock({ $0.closesConnection }) {
                    state.withLock { $0.phase = .receivingBody }
                    context.connections.move(connection, to: .receivingBody(bytes: 0), resetClock: true)
                    return true
                }
                return queue(early, in: context)
            }
            context.connections.move(connection, to: .receivingBody(bytes: 0), resetClock: true)
            if uploadSize.pointee > 0 { receiveBody(uploadData, count: uploadSize, in: context) }
            return true
        case .receivingBody:
            if uploadSize.pointee > 0 {
                receiveBody(uploadData, count: uploadSize, in: context)
                return true
            }
            context.connections.move(connection, to: .busy)
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

    /// Whether the request declares no body: no Transfer-Encoding, and no Content-Length or one of 0.
    private var carriesNoBody: Bool {
        state.withLock { state in
            guard state.headers["transfer-encoding"] == nil else { return false }
            guard let length = state.headers["content-length"] else { return true }
            return RequestFraming.declaredLength(length) == 0
        }
    }

    /// Records method, headers and client address, and asks the handler to admit the request. Returns an
    /// answer to send right away, without reading the body: an ambiguous or unsupported framing (400 or 501,
    /// and the connection closes: `RequestFraming`), a missing Host, the handler's refusal, the
    /// oversized-body answer when Content-Length is over the cap, the body budget being spent, or an
    /// answer set earlier (shutdown).
    private func receiveHeaders(in context: HTTPDaemonContext, method: UnsafePointer<CChar>?,
                                version: UnsafePointer<CChar>?) -> HTTPResponse? {
        let headers = requestHeaders(of: connection)
        let peer = peerAddress(of: connection)
        let (remoteAddress, forwarded) = context.resolver.client(peer: peer, headers: headers)
        let declaredLength = RequestFraming.declaredLength(headers["content-length"])
        let methodName = method.map { String(cString: $0) } ?? ""
        let versionName = version.map { String(cString: $0) } ?? ""

        let earlier = state.withLock { state -> HTTPResponse? in
            state.method = methodName
            state.headers = headers
            state.remoteAddress = remoteAddress
            state.peerAddress = peer
            state.phase = .receivingBody
            return state.response
        }
        if earlier != nil { return answer(with: nil) }
        if let refusal = RequestFraming.refusal(headers) {
            var response = context.handler.response(for: refusal)
            response.headers.removeAll { $0.name.lowercased() == "connection" }
            response.headers.append((name: "Connection", value: "close"))
            state.withLock { $0.closesConnection = true }
            return answer(with: response)
        }
        if versionName == "HTTP/1.1" && headers["host"] == nil {
            return answer(with: context.handler.response(for: .missingHost))
        }
        let head = HTTPRequestHead(method: methodName, path: path, query: query, headers: headers,
                                   remoteAddress: remoteAddress)
        let admission = context.handler.admit(head)
        if case .answer(let response) = admission { return answer(with: response) }
        if case .stream(_, let sink, let maximum) = admission {
            // A streamed body is checked against its own cap, and takes none of the body budget.
            if let declaredLength, declaredLength > maximum {
                sink.interruptedOffThread()
                state.withLock { $0.bodyIsOversized = true }
                return answer(with: context.handler.responseForOversizedBody())
            }
            state.withLock { state in
                state.sink = sink
                state.sinkMaximum = maximum
                state.admission = admission
            }
            context.connections.markStreamed(connection)
            return nil
        }
        if let declaredLength, declaredLength > context.handler.maximumBodySize {
            state.withLock { $0.bodyIsOversized = true }
            return answer(with: context.handler.responseForOversizedBody())
        }
        if forwarded {
            let slot = ClientAddress.limitKey(remoteAddress)
            guard context.admitForwarded(slot) else {
                return answer(with: context.handler.response(for: .clientBusy(retryAfter: 1)))
            }
            state.withLock { $0.forwardedSlot = slot }
        }
        var budgetClient = "ip:" + ClientAddress.limitKey(remoteAddress)
        if case .pool(let client, _) = admission { budgetClient = client }
        state.withLock { $0.budgetClient = budgetClient }
        if let declaredLength, declaredLength > 0 {
            guard context.reserveBody(declaredLength, client: budgetClient) else {
                return answer(with: context.handler.response(for: .bodyBudgetExhausted(retryAfter: 1)))
            }
            state.withLock { state in
                state.reservedBodyBytes = declaredLength
                state.body.reserveCapacity(min(declaredLength, 1 << 20))
            }
        }
        state.withLock { $0.admission = admission }
        return nil
    }

    /// Keeps body bytes up to the cap and the budget, and counts (but drops) the rest. Consumes the piece.
    private func receiveBody(_ data: UnsafePointer<CChar>?, count: UnsafeMutablePointer<Int>,
                             in context: HTTPDaemonContext) {
        let size = count.pointee
        count.pointee = 0
        guard let data, size > 0 else { return }
        context.connections.bodyReceived(connection, bytes: size)
        if let sink = state.withLock({ $0.sink }) {
            receiveStreamed(UnsafeRawBufferPointer(start: data, count: size), sink: sink)
            return
        }
        let maximum = context.handler.maximumBodySize
        state.withLock { state in
            state.receivedBodyBytes += size
            guard !state.bodyIsOversized, !state.bodyOverBudget else { return }
            guard state.receivedBodyBytes <= maximum else {
                state.bodyIsOversized = true
                state.body = []
                return
            }
            // A chunked body (or one longer than declared) reserves its budget as it arrives.
            let missing = state.receivedBodyBytes - state.reservedBodyBytes
            if missing > 0 {
                guard context.reserveBody(missing, client: state.budgetClient) else {
                    state.bodyOverBudget = true
                    state.body = []
                    return
                }
                state.reservedBodyBytes += missing
            }
            state.body.append(contentsOf: UnsafeRawBufferPointer(start: data, count: size))
        }
    }

    /// A piece of a streamed body: to the sink, unless the body is over its cap or the sink refused it
    /// (then the rest is counted and dropped, and the refusal is the answer).
    private func receiveStreamed(_ bytes: UnsafeRawBufferPointer, sink: any HTTPBodySink) {
        let proceed = state.withLock { state -> Bool in
            state.receivedBodyBytes += bytes.count
            guard state.sinkRefusal == nil, !state.bodyIsOversized else { return false }
            guard state.receivedBodyBytes <= state.sinkMaximum else {
                state.bodyIsOversized = true
                return false
            }
            return true
        }
        guard proceed else { return }
        if let refusal = sink.receive(bytes) {
            state.withLock { $0.sinkRefusal = refusal }
        }
    }

    /// The body is complete: answer an oversized body, or hand the request to the handler, inline or on
    /// the worker pool, and either queue its answer now or park the connection until `deliver` brings one.
    private func finishRequest(in context: HTTPDaemonContext) -> Bool {
        enum Next {
            case refuse(HTTPResponse)
            case answered(HTTPResponse)
            case handle(HTTPRequest, HTTPAdmission)
        }
        let next = state.withLock { state -> Next in
            if let refusal = state.sinkRefusal { return .refuse(refusal) }
            if state.bodyIsOversized { return .refuse(context.handler.responseForOversizedBody()) }
            if state.bodyOverBudget {
                return .refuse(context.handler.response(for: .bodyBudgetExhausted(retryAfter: 1)))
            }
            if let response = state.response {
                state.phase = .answered
                return .answered(response)
            }
            state.phase = .handling
            let body = state.body
            state.body = []
            var principal: (any Sendable)?
            if case .pool(_, let admitted) = state.admission { principal = admitted }
            if case .stream(_, let sink, _) = state.admission {
                principal = sink
                state.sinkHandedOver = true
            }
            return .handle(HTTPRequest(method: state.method, path: path, query: query, headers: state.headers,
                                       body: body, remoteAddress: state.remoteAddress, principal: principal,
                                       abandonment: abandonment),
                           state.admission)
        }
        switch next {
        case .refuse(let response):
            return queue(answer(with: response), in: context)
        case .answered(let response):
            return queue(response, in: context)
        case .handle(let request, .pool(let client, _)), .handle(let request, .stream(let client, _, _)):
            // Park first, so the worker's answer always finds the connection suspended (or a refusal is
            // delivered like an answer).
            park(in: context)
            let handler = context.handler
            let submitted = context.workers.submit(client: client, expire: { [self] in
                refuseUnhandled(handler.response(for: .queueFull(retryAfter: 1)))
            }) { [self] in
                guard !isAnswered else { return }
                handler.handle(request) { [self] response in deliver(response) }
            }
            switch submitted {
            case .accepted: break
            case .clientBusy: refuseUnhandled(handler.response(for: .clientBusy(retryAfter: 1)))
            case .queueFull: refuseUnhandled(handler.response(for: .queueFull(retryAfter: 1)))
            case .stopped: refuseUnhandled(HTTPServer.shuttingDownResponse)
            }
            return true
        case .handle(let request, _):
            context.handler.handle(request) { [self] response in deliver(response) }
            let ready = state.withLock { state -> HTTPResponse? in
                if let response = state.response {
                    state.phase = .answered
                    return response
                }
                return nil
            }
            if let ready { return queue(ready, in: context) }
            park(in: context)
            return true
        }
    }

    /// Answers a request the handler never got (refused or expired in the worker pool's line): a streamed
    /// body's sink goes back to the exchange, which interrupts it at completion (it keeps what arrived).
    private func refuseUnhandled(_ response: HTTPResponse) {
        state.withLock { $0.sinkHandedOver = false }
        deliver(response)
    }

    /// Suspends the connection until `deliver`, unless an answer came first (then the next access-handler
    /// call, right after a resume, sends it).
    private func park(in context: HTTPDaemonContext) {
        context.connections.move(connection, to: .parked(self))
        state.withLock { state in
            // Suspend under the lock so `deliver` cannot resume before the suspension happened.
            state.phase = .suspended
            MHD_suspend_connection(connection)
            if state.response != nil {
                state.phase = .resumed
                MHD_resume_connection(connection)
            }
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

    /// Sends `response`, with the handler's `headersOnEveryAnswer` it lacks: every answer leaves through here.
    private func queue(_ response: HTTPResponse, in context: HTTPDaemonContext) -> Bool {
        let response = response.adding(missing: context.handler.headersOnEveryAnswer)
        context.connections.move(connection, to: .busy)
        state.withLock { state in
            state.sentStatus = response.status
            state.sentBytes = response.file.map { Int($0.length) } ?? response.body.count
        }
        releaseBudget(in: context)
        let closes = context.isDraining || state.withLock { $0.closesConnection }
        return queueResponse(response, on: connection, closeAfterwards: closes)
    }

    private func releaseBudget(in context: HTTPDaemonContext) {
        let (bytes, client, slot) = state.withLock { state -> (Int, String, String?) in
            defer {
                state.reservedBodyBytes = 0
                state.forwardedSlot = nil
            }
            return (state.reservedBodyBytes, state.budgetClient, state.forwardedSlot)
        }
        context.releaseBody(bytes, client: client)
        if let slot { context.finishForwarded(slot) }
    }

    /// libmicrohttpd is done with the request: release what it holds, tell the handler if its client left
    /// before an answer, and write the access-log line.
    func complete(in context: HTTPDaemonContext, completedNormally: Bool) {
        releaseBudget(in: context)
        // A streamed body the handler never got (cut, timed out, refused): the sink keeps what arrived.
        if let sink = state.withLock({ $0.sinkHandedOver ? nil : $0.sink }) { sink.interruptedOffThread() }
        let (answered, status, bytes, method, address, peer) = state.withLock { state in
            (state.response != nil, state.sentStatus, state.sentBytes, state.method, state.remoteAddress,
             state.peerAddress)
        }
        if answered && completedNormally { abandonment.settle() } else { abandonment.abandon() }
        guard let log = context.accessLog else { return }
        let elapsed = ContinuousClock.now - started
        let milliseconds = Double(elapsed.components.seconds) * 1000 + Double(elapsed.components.attoseconds) / 1e15
        var line = "\(accessLogTime(startedAt)) \(address.isEmpty ? "-" : address) \(logSafe(method.isEmpty ? "-" : method)) "
        line += "\(logSafe(context.handler.pathForLog(path))) \(status.map(String.init) ?? "-") "
        line += String(format: "%.1fms", milliseconds) + " \(bytes)"
        if address != peer { line += " via=\(peer)" }
        if !completedNormally { line += " incomplete" }
        log(line)
    }
}

/// `2026-12-01T21:49:11.123Z`.
private func accessLogTime(_ date: Date) -> String {
    var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
    let milliseconds = Int((date.timeIntervalSince1970 - Double(seconds)) * 1000)
    var parts = tm()
    gmtime_r(&seconds, &parts)
    return String(format: "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", Int(parts.tm_year) + 1900, Int(parts.tm_mon) + 1,
                  Int(parts.tm_mday), Int(parts.tm_hour), Int(parts.tm_min), Int(parts.tm_sec), milliseconds)
}

/// At most 200 bytes, with spaces, controls and non-ASCII bytes percent-encoded, so one request is one
/// line of space-separated fields whatever its path.
private func logSafe(_ text: String) -> String {
    var out = ""
    for byte in text.utf8.prefix(200) {
        if byte > 0x20 && byte < 0x7F && byte != UInt8(ascii: "%") {
            out.unicodeScalars.append(UnicodeScalar(byte))
        } else {
            out += String(format: "%%%02X", byte)
        }
    }
    return out
}

// MARK: - libmicrohttpd calls

/// Sends `response` on `connection`. The library computes Content-Length itself, so a handler's own
/// Content-Length header is left out. While the server drains, the connection closes after the answer.
private func queueResponse(_ response: HTTPResponse, on connection: OpaquePointer, closeAfterwards: Bool) -> Bool {
    let created: OpaquePointer?
    if let file = response.file {
        created = file.makeResponse()
    } else if let stream = response.stream {
        // The library holds the retain until it frees the answer (`streamBodyFree`).
        stream.attach(connection)
        let context = Unmanaged.passRetained(stream).toOpaque()
        created = MHD_create_response_from_callback(UInt64.max, 4_096, streamBodyRead, context, streamBodyFree)
        if created == nil {
            Unmanaged<HTTPStreamBody>.fromOpaque(context).release()
            stream.release()
        }
    } else {
        created = response.body.withUnsafeBytes { bytes in
            MHD_create_response_from_buffer(bytes.count, UnsafeMutableRawPointer(mutating: bytes.baseAddress),
                                            .RESPMEM_MUST_COPY)
        }
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

/// The TCP peer's address as text, or empty.
func peerAddress(of connection: OpaquePointer) -> String {
    var buffer = [CChar](repeating: 0, count: 64)
    guard lattice_mhd_client_address(connection, &buffer, buffer.count) == 1 else { return "" }
    return String(decoding: buffer.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
