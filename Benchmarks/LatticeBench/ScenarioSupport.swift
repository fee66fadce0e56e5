// The contract between the harness and `runScenario` (Scenario.swift): the scenario names, what a
// scenario reports, and `measureMerge`, which times the export/import step the same way for
// every implementation.

/// The timed step of the benchmark.
enum Scenario: String, CaseIterable, Sendable {
    /// B encodes what it changed since the common base; A decodes and merges it.
    case delta
    /// B encodes its whole state; A decodes and merges it.
    case full
}

/// The outcome of the post-merge check (the JSON `verify` value).
enum VerifyResult: Equatable, Sendable {
    /// Both checks passed.
    case ok
    /// A check failed; the text says which record or what differed.
    case failed(String)
    /// The check itself could not run (e.g. a thrown error).
    case error(String)

    /// As written in the run line: `ok`, `fail: ...` or `error: ...` (the reference's wording).
    var text: String {
        switch self {
        case .ok: return "ok"
        case .failed(let reason): return "fail: " + reason
        case .error(let reason): return "error: " + reason
        }
    }
}

/// The timed export/import step, as measured by `measureMerge`.
struct MergeTiming: Sendable {
    /// Seconds B spent encoding (monotonic clock).
    var exportSeconds: Double
    /// Seconds A spent decoding and merging.
    var importSeconds: Double
    /// Size of the encoded update.
    var updateBytes: Int
    /// VmRSS right before the export, KiB.
    var rssBeforeMergeKiB: Int
    /// VmRSS right after the import, KiB.
    var rssAfterMergeKiB: Int
    /// VmHWM right after the import, KiB (before verification allocates anything).
    var peakRSSKiB: Int
}

/// Everything one scenario run reports; the harness derives the counts and rates from it and the
/// workload (see `Workload.mergeCounts(for:)`).
struct ScenarioMeasurement: Sendable {
    /// Seconds to build the common base in A and give B a copy (`build_base_s`), if measured.
    var buildBaseSeconds: Double?
    /// Seconds to apply both replicas' plans (`apply_edits_s`), if measured.
    var applyEditsSeconds: Double?
    /// The timed step.
    var merge: MergeTiming
    /// The post-merge check; nil when verification was not requested.
    var verify: VerifyResult?
    /// Extra peer-specific keys for the run line (e.g. `commit_per_record`); keys the harness
    /// writes itself take precedence.
    var extra: [String: JSONValue] = [:]

    init(buildBaseSeconds: Double? = nil, applyEditsSeconds: Double? = nil, merge: MergeTiming,
         verify: VerifyResult? = nil, extra: [String: JSONValue] = [:]) {
        self.buildBaseSeconds = buildBaseSeconds
        self.applyEditsSeconds = applyEditsSeconds
        self.merge = merge
        self.verify = verify
        self.extra = extra
    }
}

/// Times the merge step: samples VmRSS, runs `export` (B encodes) and then `importing` (A decodes
/// and merges those bytes) with the monotonic clock around each, then samples VmRSS and VmHWM.
/// The encoded bytes cross a real byte boundary, as they do for every peer.
func measureMerge<Payload: Collection>(
    export: () throws -> Payload,
    importing: (Payload) throws -> Void
) rethrows -> MergeTiming where Payload.Element == UInt8 {
    let rssBefore = ProcStatus.rssKiB
    let t0 = monotonicNanoseconds()
    let payload = try export()
    let t1 = monotonicNanoseconds()
    try importing(payload)
    let t2 = monotonicNanoseconds()
    let rssAfter = ProcStatus.rssKiB
    let peak = ProcStatus.peakRSSKiB
    return MergeTiming(exportSeconds: Double(t1 &- t0) / 1e9, importSeconds: Double(t2 &- t1) / 1e9,
                       updateBytes: payload.count, rssBeforeMergeKiB: rssBefore,
                       rssAfterMergeKiB: rssAfter, peakRSSKiB: peak)
}

/// The work a scenario merges, by the README's definitions.
struct MergeCounts: Hashable, Sendable {
    /// Records B edited (delta) or N (full).
    let recordsMerged: Int
    /// Records B edited x (K + 1) (delta) or N x (F + 1) (full): scalar fields plus the tag set.
    let fieldMerges: Int
    /// Records B edited x (K + 2): scalar sets, one tag add, one tag remove (both scenarios).
    let opsMerged: Int
}

extension Workload {
    /// The merge counts of `scenario` (K here is `min(K, F)`).
    func mergeCounts(for scenario: Scenario) -> MergeCounts {
        let editedByB = stats.editedByB, k = parameters.effectiveFieldsPerEdit
        switch scenario {
        case .delta:
            return MergeCounts(recordsMerged: editedByB, fieldMerges: editedByB * (k + 1),
                               opsMerged: editedByB * (k + 2))
        case .full:
            return MergeCounts(recordsMerged: parameters.records,
                               fieldMerges: parameters.records * (parameters.fields + 1),
                               opsMerged: editedByB * (k + 2))
        }
    }
}
