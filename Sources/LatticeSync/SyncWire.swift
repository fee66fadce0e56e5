/// Which of the server's sync paths a `SyncEngine` uses.
public enum SyncWire: String, Sendable, CaseIterable {
    /// `deltas/push` and `deltas/pull`: record states as canonical binary frames (the default).
    case binary
    /// `records/modify` with CRDT states in JSON and `changes/zone`, as any CloudKit-shaped client.
    case json
}
