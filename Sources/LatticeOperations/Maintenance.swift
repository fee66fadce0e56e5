import Foundation
import LatticeStore

/// Maintenance of the stored data: the purge of what has expired (tombstones and deleted zones past the
/// tombstone horizon, remembered client operations, expired device sign-ins and old failed approvals), then
/// the collection of assets (`Assets.collect`).
/// `ServerProcess` runs it on a timer; `lattice admin` and tests call it directly.
public struct Maintenance: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// Removes tombstones, deleted zones and remembered operation ids past their horizons (and expired
    /// device sign-ins and old failed approvals); an empty report when another node is purging now
    /// (`purgeUnlessRunningElsewhere`).
    @discardableResult
    public func purgeExpired() throws -> PurgeReport {
        let report = try purgeUnlessRunningElsewhere() ?? PurgeReport()
        // Then the assets: expired uploads, blobs past their grace period, stray bytes (Assets.collect).
        do {
            try Assets(core).collect()
        } catch {
            core.log("asset collection failed: \(error) (it runs again with the next purge)")
        }
        return report
    }

    /// How long finished webhook deliveries (delivered or failed) stay listable before the purge removes them.
    public static let deliveryHorizonMilliseconds: Int64 = 7 * 24 * 3_600_000
    /// Rows one batch of the purge removes at most: each batch is a write transaction of its own.
    public static let purgeBatchRows = 1_000
    /// The deadline of one batch's write transaction (its wait for the writer included).
    public static let purgeBatchDeadlineMilliseconds: Int64 = 2_000
    /// How long one purge run goes on starting batches; what is left then waits for the next run.
    public static let purgeRunBudgetMilliseconds: Int64 = 20_000
    /// The pause between two batches, so that requests waiting for the writer get it in between.
    static let purgePauseMilliseconds = 5
    /// Batches in a row that may remove nothing (all that is left is under rows requests held, on
    /// PostgreSQL) before the run stops; after such a batch the pause is `purgeIdlePauseMilliseconds`.
    static let purgeIdleBatches = 10
    static let purgeIdlePauseMilliseconds = 100

    /// The purge, in batches (`purgeBatchRows` rows each, `StorageTransaction.purge`), each one write with a
    /// deadline (`purgeBatchDeadlineMilliseconds`), so that a large backlog never holds SQLite's one writer
    /// for long: requests' writes get in between two batches. The run ends when a batch finds nothing more,
    /// or, with rows left (the report's `complete` is false, and the log says why), once it has run for
    /// `budgetMilliseconds`, a batch failed, or another node took the lock. The horizons are fixed when the
    /// run starts.
    ///
    /// One node at a time: every batch first takes the exclusive lock "purge" without waiting
    /// (`tryExclusiveLock`: SQLite's one writer; on PostgreSQL a transaction advisory lock, held until that
    /// batch commits). Nil (nothing done) when another node holds it at the first batch; a node that loses it
    /// at a later batch stops and leaves the rest to the node that holds it. So no two batches of the purge
    /// ever run at once, and two nodes' runs may at most take turns between batches (harmless: a batch
    /// removes only rows that are still expired).
    public func purgeUnlessRunningElsewhere(batchRows: Int = Maintenance.purgeBatchRows,
                                            budgetMilliseconds: Int64 = Maintenance.purgeRunBudgetMilliseconds)
        throws -> PurgeReport? {
        let configuration = core.configuration, storage = core.storage, log = core.log
        let now = configuration.now()
        let horizon = now - configuration.tombstoneHorizonMilliseconds
        let operationsBefore = now - configuration.clientOperationHorizonMilliseconds
        let approvalFailuresBefore = now - configuration.deviceApprovalFailureWindowMilliseconds + 1
        let limit = max(1, batchRows)
        let budget = RequestDeadline.after(milliseconds: budgetMilliseconds)
        var total = PurgeReport(complete: false)
        var idle = 0
        func stop(_ reason: String) -> PurgeReport {
            log("purge: \(reason) after \(total.batches) batches (\(total.tombstones) tombstones, \(total.zones) zones, "
                + "\(total.clientOperations) remembered operations removed); the rest waits for the next run")
            return total
        }
        while true {
            let first = total.batches == 0
            let batch: PurgeReport?
            do {
                batch = try storage.write(deadline: .after(milliseconds: Self.purgeBatchDeadlineMilliseconds)) { tx in
                    guard try tx.tryExclusiveLock("purge") else { return nil }
                    if first {
                        // Device sign-ins past their lifetime, and failed approvals past their window (Devices.swift):
                        // few (their creation is rate-limited), so they go with the first batch.
                        _ = try tx.forgetDeviceAuthorizations(expiredAt: now)
                        try tx.forgetDeviceApprovalFailures(before: approvalFailuresBefore)
                        // Webhook deliveries finished a week ago, push tokens whose device token is gone or
                        // expired, and the notifications of spent firesOnce subscriptions: a bounded number a run
                        // (the rest go with the next runs).
                        _ = try tx.purgeDeliveries(finishedBefore: now - Self.deliveryHorizonMilliseconds, limit: limit)
                        _ = try tx.forgetOrphanPushTokens(nowMs: now, limit: limit)
                        _ = try tx.forgetOrphanNotifications(limit: limit)
                    }
                    return try tx.purge(before: horizon, operationsBeforeMs: operationsBefore, limit: limit)
                }
            } catch {
                if first { throw error }
                return stop("batch \(total.batches + 1) failed (\(error)), stopped")
            }
            guard let batch else {
                return first ? nil : stop("another node took the purge lock, stopped")
            }
            total.tombstones += batch.tombstones
            total.zones += batch.zones
            total.clientOperations += batch.clientOperations
            total.batches += 1
            if batch.complete {
                total.complete = true
                return total
            }
            idle = batch.removed == 0 ? idle + 1 : 0
            if idle >= Self.purgeIdleBatches {
                return stop("\(idle) batches in a row found only rows held by requests, stopped")
            }
            if budget.hasPassed { return stop("the run's budget of \(budgetMilliseconds) ms passed") }
            usleep(UInt32((idle > 0 ? Self.purgeIdlePauseMilliseconds : Self.purgePauseMilliseconds) * 1_000))
        }
    }
}
