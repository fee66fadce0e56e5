/// Signing a second device in without copying a token (in the spirit of RFC 8628, the OAuth device
/// authorization grant): the new device asks for an authorization and shows its short user code; a
/// signed-in device approves that code; the new device, polling with its long device code, then gets a
/// bearer token of its own, once.
///
/// The store keeps the facts, one row per authorization, with only SHA-256 hashes of both codes. The
/// rules (code shapes, lifetimes, poll intervals, the limits against guessing and growth) are the
/// server's. Every change of state is a conditional update (`pending` to `approved` or `denied`, then
/// `approved` to `issued`), so of two nodes that act on one row at once exactly one changes it.
public enum DeviceAuthorizationStatus: String, Sendable, Hashable, CaseIterable {
    /// Waiting for a signed-in device to approve or deny the user code.
    case pending
    /// Approved by an account; the next poll gets the token.
    case approved
    /// Refused by the account it was shown to.
    case denied
    /// The token was handed out; the row stays (answering repeated polls) until it expires.
    case issued
}

/// A device authorization to store.
public struct NewDeviceAuthorization: Sendable, Hashable {
    /// SHA-256 of the device code (the long secret the new device polls with).
    public var deviceCodeHash: [UInt8]
    /// SHA-256 of the user code in its normal form (what a person types on the signed-in device).
    public var userCodeHash: [UInt8]
    /// The client address that asked for it, for the per-address bound.
    public var address: String
    /// The name the new device gave itself (shown when approving, kept on its token).
    public var deviceName: String
    /// Seconds the device waits between polls.
    public var intervalSeconds: Int64
    public var createdMs: Int64
    public var expiresMs: Int64

    public init(deviceCodeHash: [UInt8], userCodeHash: [UInt8], address: String, deviceName: String,
                intervalSeconds: Int64, createdMs: Int64, expiresMs: Int64) {
        self.deviceCodeHash = deviceCodeHash
        self.userCodeHash = userCodeHash
        self.address = address
        self.deviceName = deviceName
        self.intervalSeconds = intervalSeconds
        self.createdMs = createdMs
        self.expiresMs = expiresMs
    }
}

/// A device authorization as stored.
public struct StoredDeviceAuthorization: Sendable, Hashable {
    public let deviceCodeHash: [UInt8]
    public let userCodeHash: [UInt8]
    public let address: String
    /// The device's own name, or the one the approving account gave it.
    public let deviceName: String
    public let status: DeviceAuthorizationStatus
    /// The account that approved or denied it; nil while pending.
    public let userID: Int64?
    public let intervalSeconds: Int64
    /// When the device last polled (0: never).
    public let lastPollMs: Int64
    public let createdMs: Int64
    public let expiresMs: Int64

    public init(deviceCodeHash: [UInt8], userCodeHash: [UInt8], address: String, deviceName: String,
                status: DeviceAuthorizationStatus, userID: Int64?, intervalSeconds: Int64, lastPollMs: Int64,
                createdMs: Int64, expiresMs: Int64) {
        self.deviceCodeHash = deviceCodeHash
        self.userCodeHash = userCodeHash
        self.address = address
        self.deviceName = deviceName
        self.status = status
        self.userID = userID
        self.intervalSeconds = intervalSeconds
        self.lastPollMs = lastPollMs
        self.createdMs = createdMs
        self.expiresMs = expiresMs
    }

    /// Whether it still works at `nowMs` (it expires at `expiresMs` exactly).
    public func isLive(atMs nowMs: Int64) -> Bool { nowMs < expiresMs }
}
