import Dispatch
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Webhooks: a subscription of the private database with `webhook: {"url"}` gets, for every committed change
/// that fires it, one delivery in the outbox (`webhook_deliveries`), written in the change's own transaction
/// (`Subscriptions.fire`): a crash loses none, a rolled-back write queues none. Each node's dispatcher
/// (`WebhookDispatcher`) claims due deliveries (one at a time per subscription, in sequence order; several
/// nodes never take one delivery together) and POSTs them, signed (`WebhookSignature`), bounded in time and in
/// the answer it reads, never following a redirect; failures are retried with exponential backoff and
/// jitter, and dead-lettered after the last attempt (`subscriptions/deliveries` lists them,
/// `subscriptions/replay` sends them again).
public enum Webhooks {
    /// The most records one zone of a payload names (`moreRecords` says when there were more).
    public static let maximumRecordsPerZone = 100
    /// The most bytes of an answer a receiver's body is read to (the rest is dropped; the status counts).
    public static let maximumAnswerBytes = 64 * 1024

    /// The delivery's idempotency id: stable across retries, nodes and replays.
    public static func deliveryID(subscriptionRowID: Int64, seq: Int64) -> String { "whd_\(subscriptionRowID)_\(seq)" }

    /// The body of one delivery.
    static func payload(_ subscription: StoredSubscription, seq: Int64, firings: [Subscriptions.Firing],
                        effects: CommitEffects, container: String, nowMs: Int64) -> [UInt8] {
        let type = switch subscription.kind {
        case .query: "query"
        case .zone: "recordZone"
        case .database: "database"
        }
        var zones: [String: (zoneID: JSON, records: [JSON], more: Bool)] = [:]
        var order: [String] = []
        for firing in firings {
            for change in firing.records {
                let key = change.zone.ownerRecordName + "/" + change.zone.name
                if zones[key] == nil {
                    order.append(key)
                    zones[key] = (.object(["zoneName": .string(change.zone.name),
                                           "ownerRecordName": .string(change.zone.ownerRecordName)]), [], false)
                }
                guard zones[key]!.records.count < maximumRecordsPerZone else {
                    zones[key]!.more = true
                    continue
                }
                zones[key]!.records.append(.object([
                    "recordName": .string(change.recordName), "recordType": .string(change.recordType),
                    "reason": .string(change.event.rawValue),
                ]))
            }
            if let zone = firing.zone, firing.records.isEmpty {
                let key = zone.ownerRecordName + "/" + zone.zoneName
                if zones[key] == nil {
                    order.append(key)
                    zones[key] = (.object(["zoneName": .string(zone.zoneName), "ownerRecordName": .string(zone.ownerRecordName)]),
                                  [], false)
                }
            }
        }
        let body: JSON = .object([
            "id": .string(deliveryID(subscriptionRowID: subscription.rowID, seq: seq)),
            "subscriptionID": .string(subscription.name),
            "sequence": .int(seq),
            "notificationType": .string(type),
            "containerIdentifier": .string(container),
            "databaseScope": .string("private"),
            "createdAt": .int(nowMs),
            "zones": .array(order.compactMap { key in
                guard let zone = zones[key] else { return nil }
                var object: [String: JSON] = ["zoneID": zone.zoneID, "records": .array(zone.records)]
                if zone.more { object["moreRecords"] = .bool(true) }
                return .object(object)
            }),
        ])
        return body.serializedBytes()
    }

    // MARK: Targets

    /// Checks a webhook URL's form: http or https, a host, no user or password, at most 2,048 bytes.
    /// - Throws: BAD_REQUEST naming what is wrong.
    static func checkForm(_ text: String) throws -> URL {
        guard let url = URL(string: text), let scheme = url.scheme?.lowercased(), scheme == "http" || scheme == "https",
              let host = url.host, !host.isEmpty, url.user == nil, url.password == nil else {
            throw ServiceError.badRequest("webhook.url must be an http:// or https:// URL with a host and no user or password")
        }
        if let port = url.port, !(1...65_535).contains(port) { throw ServiceError.badRequest("webhook.url has no valid port") }
        return url
    }

    /// Whether a host resolves only to public addresses (none loopback, private, link-local, shared, multicast
    /// or reserved): nil when it does, else why not.
    static func refusal(host: String) -> String? {
        var hints = addrinfo()
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var found: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, nil, &hints, &found) == 0, let first = found else {
            return "the host \(host.prefix(100)) does not resolve"
        }
        defer { freeaddrinfo(first) }
        var entry: UnsafeMutablePointer<addrinfo>? = first
        var any = false
        while let current = entry {
            defer { entry = current.pointee.ai_next }
            guard let address = current.pointee.ai_addr else { continue }
            any = true
            if address.pointee.sa_family == sa_family_t(AF_INET) {
                let raw = address.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt32(bigEndian: $0.pointee.sin_addr.s_addr) }
                if !isPublic(ipv4: raw) { return "\(host.prefix(100)) resolves to a private or reserved address" }
            } else if address.pointee.sa_family == sa_family_t(AF_INET6) {
                let bytes = address.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { pointer in
                    withUnsafeBytes(of: pointer.pointee.sin6_addr) { Array($0) }
                }
                if !isPublic(ipv6: bytes) { return "\(host.prefix(100)) resolves to a private or reserved address" }
            }
        }
        return any ? nil : "the host \(host.prefix(100)) does not resolve"
    }

    static func isPublic(ipv4 address: UInt32) -> Bool {
        let blocked: [(UInt32, Int)] = [
            (0x0000_0000, 8), (0x0A00_0000, 8), (0x6440_0000, 10), (0x7F00_0000, 8), (0xA9FE_0000, 16),
            (0xAC10_0000, 12), (0xC000_0000, 24), (0xC000_0200, 24), (0xC0A8_0000, 16), (0xC612_0000, 15),
            (0xC633_6400, 24), (0xCB00_7100, 24), (0xE000_0000, 4), (0xF000_0000, 4),
        ]
        return !blocked.contains { network, bits in address >> UInt32(32 - bits) == network >> UInt32(32 - bits) }
    }

    static func isPublic(ipv6 bytes: [UInt8]) -> Bool {
        guard bytes.count == 16 else { return false }
        if bytes[0..<10].allSatisfy({ $0 == 0 }) && bytes[10] == 0xFF && bytes[11] == 0xFF { // ::ffff:a.b.c.d
            return isPublic(ipv4: bytes[12..<16].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        }
        if bytes[0..<12].allSatisfy({ $0 == 0 }) { return false } // ::, ::1 and IPv4-compatible ::a.b.c.d
        if bytes[0..<12] == [0x00, 0x64, 0xFF, 0x9B, 0, 0, 0, 0, 0, 0, 0, 0] { // NAT64 64:ff9b::/96
            return isPublic(ipv4: bytes[12..<16].reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
        }
        if bytes[0] & 0xFE == 0xFC { return false } // fc00::/7, unique local
        if bytes[0] == 0xFE && bytes[1] & 0xC0 == 0x80 { return false } // fe80::/10, link local
        if bytes[0] == 0xFF { return false } // multicast
        if bytes[0] == 0x20 && bytes[1] == 0x01 && bytes[2] == 0x0D && bytes[3] == 0xB8 { return false } // documentation
        return true
    }
}

/// One node's webhook sender: a thread that claims due deliveries from the outbox and sends each on a
/// bounded set of concurrent slots. Woken after a local commit queued a delivery (`nudge`), and otherwise at
/// the next due time or every 5 s at most (another node's deliveries, whose node may be gone).
public final class WebhookDispatcher: Sendable {
    public struct Settings: Sendable {
        /// Deliveries sent at once by this node.
        public var concurrency = 4
        /// Seconds one attempt may take, answer included.
        public var timeoutSeconds = 10
        /// Attempts before a delivery is dead-lettered.
        public var maximumAttempts = 12
        /// The first retry's delay; each later one doubles, up to `retryMaximumMilliseconds`, and a random
        /// part of it (up to half) is taken off so retries of many receivers spread out.
        public var retryBaseMilliseconds: Int64 = 2_000
        public var retryMaximumMilliseconds: Int64 = 3_600_000
        /// Receivers on loopback, private or reserved addresses are refused unless this is set.
        public var allowsPrivateAddresses = false

        public init() {}
    }

    private struct State {
        var stopped = false
        var inFlight = 0
        var started = false
    }

    let core: OperationsCore
    let settings: Settings
    private let state = Mutex(State())
    private let wake = DispatchSemaphore(value: 0)
    private let senders = DispatchQueue(label: "lattice-webhooks-send", attributes: .concurrent)
    /// How long a claim lasts: one attempt's time-out with room to spare.
    private var leaseMilliseconds: Int64 { Int64(settings.timeoutSeconds) * 1_000 * 3 }

    public init(core: OperationsCore, settings: Settings) {
        self.core = core
        self.settings = settings
    }

    /// Starts the node's sending thread; claims a previous run of this node left are dropped first.
    public func start() {
        let first = state.withLock { state -> Bool in
            defer { state.started = true }
            return !state.started
        }
        guard first else { return }
        do {
            _ = try core.storage.write(deadline: core.freshDeadline()) { tx in
                try tx.releaseDeliveryClaims(node: core.configuration.nodeName)
            }
        } catch {
            core.log("webhooks: could not release this node's old claims (\(error)); they lapse by themselves")
        }
        let thread = Thread { [self] in run() }
        thread.name = "lattice-webhooks"
        thread.start()
    }

    /// Stops claiming; deliveries under way finish (or their claims lapse).
    public func stop() {
        state.withLock { $0.stopped = true }
        wake.signal()
    }

    /// A local commit queued a delivery.
    public func nudge() { wake.signal() }

    private func run() {
        while !state.withLock({ $0.stopped }) {
            var waitMilliseconds: Int64 = 5_000
            do {
                waitMilliseconds = try round()
            } catch {
                core.log("webhooks: the outbox cannot be read now (\(error)); trying again in 5 s")
            }
            _ = wake.wait(timeout: .now() + .milliseconds(Int(max(10, min(waitMilliseconds, 5_000)))))
        }
    }

    /// Claims what is due and free slots allow; answers how long to wait before looking again.
    private func round() throws -> Int64 {
        let free = state.withLock { settings.concurrency - $0.inFlight }
        let now = core.configuration.now()
        let due = try core.storage.read(deadline: core.freshDeadline()) { tx in try tx.nextDeliveryDueMs() }
        guard let due else { return 5_000 }
        guard due <= now else { return due - now }
        guard free > 0 else { return 5_000 } // a finishing send wakes the loop
        let claimed = try core.storage.write(deadline: core.freshDeadline()) { tx in
            try tx.claimDeliveries(node: core.configuration.nodeName, nowMs: now, leaseMs: leaseMilliseconds, limit: free)
        }
        for delivery in claimed {
            state.withLock { $0.inFlight += 1 }
            senders.async { [self] in
                send(delivery)
                state.withLock { $0.inFlight -= 1 }
                wake.signal()
            }
        }
        return claimed.isEmpty ? 1_000 : 0
    }

    /// One attempt, and its outcome recorded.
    private func send(_ delivery: StoredDelivery) {
        let outcome = attempt(delivery)
        do {
            _ = try core.storage.write(deadline: core.freshDeadline()) { tx in
                try tx.finishDelivery(id: delivery.id, node: core.configuration.nodeName, outcome: outcome,
                                      nowMs: core.configuration.now())
            }
        } catch {
            core.log("webhooks: delivery \(delivery.id)'s outcome was not recorded (\(error)); its claim lapses and it is sent again")
        }
    }

    private func attempt(_ delivery: StoredDelivery) -> DeliveryOutcome {
        func failure(_ status: Int64?, _ error: String) -> DeliveryOutcome {
            guard delivery.attempts < Int64(settings.maximumAttempts) else { return .failed(status: status, error: error) }
            let exponent = min(max(0, delivery.attempts - 1), 30)
            let full = min(settings.retryBaseMilliseconds << exponent, settings.retryMaximumMilliseconds)
            let delay = full - Int64.random(in: 0...(full / 2))
            return .retry(status: status, error: error, nextAttemptMs: core.configuration.now() + delay)
        }
        let subscription: StoredSubscription?
        do {
            subscription = try core.storage.read(deadline: core.freshDeadline()) { tx in
                try tx.subscription(rowID: delivery.subscriptionRowID)
            }
        } catch {
            return failure(nil, "the subscription could not be read: \(error)")
        }
        guard let subscription, let secret = subscription.webhookSecret else {
            return .failed(status: nil, error: "the subscription or its webhook was deleted")
        }
        guard let url = try? Webhooks.checkForm(delivery.url) else { return .failed(status: nil, error: "the URL is malformed") }
        if !settings.allowsPrivateAddresses, let refusal = Webhooks.refusal(host: url.host ?? "") {
            return failure(nil, refusal)
        }
        var request = URLRequest(url: url)
        request.httpMethod = "POST"
        request.httpBody = Data(delivery.payload)
        let id = Webhooks.deliveryID(subscriptionRowID: delivery.subscriptionRowID, seq: delivery.seq)
        request.setValue("application/json", forHTTPHeaderField: "Content-Type")
        request.setValue("Lattice-Webhook/1", forHTTPHeaderField: "User-Agent")
        request.setValue(id, forHTTPHeaderField: "Lattice-Delivery")
        request.setValue(subscription.name, forHTTPHeaderField: "Lattice-Subscription")
        request.setValue(String(delivery.seq), forHTTPHeaderField: "Lattice-Sequence")
        request.setValue(WebhookSignature.header(secret: secret, timestamp: core.configuration.now() / 1_000, body: delivery.payload),
                         forHTTPHeaderField: WebhookSignature.headerName)
        let seconds = Double(settings.timeoutSeconds)
        switch OutboundHTTP.send(request, limit: Webhooks.maximumAnswerBytes, requestTimeout: seconds, totalTimeout: seconds,
                                 followsRedirects: false) {
        case .answered(let status, _, _):
            if (200..<300).contains(status) { return .delivered(status: Int64(status)) }
            let what = (300..<400).contains(status) ? "a redirect (not followed)" : "status \(status)"
            return failure(Int64(status), "the receiver answered \(what)")
        case .timedOut:
            return failure(nil, "no answer within \(settings.timeoutSeconds) s")
        case .failed(let error):
            return failure(nil, error)
        }
    }
}
