/// How the sync engine's requests travel: the canonical binary codec, or the CloudKit-shaped JSON API.
public enum SyncWire: String, Sendable, CaseIterable {
    case binary
    case json
}
