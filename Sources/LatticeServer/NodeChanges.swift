import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations
import LatticeSharing
import LatticeStore
import Synchronization

/// Other nodes' commits (announced through the storage) wake this node's long polls; `/healthz` reports
/// whether the storage can be reached.
extension LatticeService {
    // MARK: Other nodes' commits

    /// Merges `change` into the pending batch and, if none was queued, queues one on `remoteChanges`.
    func enqueueObservedChange(_ change: StorageChange) {
        let schedule: Bool = pendingChanges.withLock { pending in
            switch (pending, change) {
            case (nil, _):
                pending = change
                return true
            case (.resynchronize?, _), (_, .resynchronize):
                pending = .resynchronize
            case (.databases(let queued)?, .databases(let more)):
                pending = .databases(Array(Set(queued).union(more)))
            }
            return false
        }
        guard schedule else { return }
        remoteChanges.async { [weak self] in
            guard let self, let batch = self.pendingChanges.withLock({ pending -> StorageChange? in
                defer { pending = nil }
                return pending
            }) else { return }
            self.observedChange(batch)
        }
    }

    /// What another node's commit changed (`Storage.observeChanges`): wakes the parked long polls it
    /// concerns. Only databases with a parked waiter are read; after `.resynchronize` (announcements may
    /// have been lost) every parked waiter's databases are. Runs on `remoteChanges`, off the backend's thread.
    func observedChange(_ change: StorageChange) {
        // Push streams read their notifications from the storage themselves: they only need waking.
        let streamed = pushStreams.watchedDatabaseIDs
        switch change {
        case .databases(let ids): pushStreams.wake(databaseIDs: ids.filter(streamed.contains))
        case .resynchronize: pushStreams.wake(databaseIDs: streamed.sorted())
        }
        let watched = notifier.watchedDatabaseIDs
        let wanted: [Int64]
        switch change {
        case .databases(let ids): wanted = ids.filter(watched.contains)
        case .resynchronize: wanted = watched.sorted()
        }
        guard !wanted.isEmpty else { return }
        do {
            let positions = try storage.read(deadline: .after(milliseconds: configuration.requestDeadlineMilliseconds)) { tx in
                try wanted.compactMap { id in try tx.database(id: id).map { (id, $0.lastSeq) } }
            }
            for (id, position) in positions { notifier.notify(databaseID: id, position: position) }
        } catch {
            // The database is away: look again shortly, and every waiter then, since more may be missed.
            log("could not read the positions other nodes announced (\(error)); retrying in 1 s")
            remoteChanges.asyncAfter(deadline: .now() + 1) { [weak self] in self?.enqueueObservedChange(.resynchronize) }
        }
    }

    // MARK: Health

    /// Whether the last probe of the storage (`probeStorage`) found it reachable and this node's claim
    /// held; `/healthz` answers 503 while not.
    public var storageReachable: Bool { storageProblem.withLock { $0 == nil } }

    /// One cheap point read with a short deadline, for `/healthz` (`ServerProcess` runs it every second on a
    /// shared database): a node that cannot reach its database reports it, so a load balancer stops sending
    /// it requests until it can again.
    public func probeStorage(deadlineMilliseconds: Int64) {
        let problem: String?
        do {
            _ = try storage.read(deadline: .after(milliseconds: deadlineMilliseconds), lane: .authentication) { tx in
                try tx.metadata(OpenedDeployment.publicURLKey)
            }
            try storage.checkNodeClaims()
            problem = nil
        } catch StorageError.failure(let message) {
            problem = message // a node name another process took: writes are refused until a restart
        } catch {
            problem = "the database cannot be reached"
        }
        let was = storageProblem.withLock { last in
            defer { last = problem }
            return last
        }
        if was != problem {
            log(problem.map { "\($0): /healthz answers 503" } ?? "the database is reachable again")
        }
    }

    /// `GET /healthz`: `{"status": "ok"}`, or, while the storage cannot be reached or this node's name was
    /// taken by another process, 503 TRY_AGAIN_LATER (with Retry-After) saying which, as while the server
    /// shuts down.
    func healthResponse() -> HTTPResponse {
        if let problem = storageProblem.withLock({ $0 }) {
            return ServiceError(.tryAgainLater, problem, retryAfter: 1).response
        }
        return .json(.object(["status": .string("ok")]))
    }
}
