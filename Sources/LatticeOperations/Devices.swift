import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore

/// Signing a second device in without copying a token, in the spirit of RFC 8628 (the device
/// authorization grant):
///
/// 1. the new device, with no token, calls `POST /auth/device/start` and gets a long secret device code,
///    a short user code (`BCDF-GHJK`: 8 letters of `userCodeAlphabet`), how long they work and how often
///    to poll;
/// 2. a person shows the user code to a device already signed in to their account, which calls
///    `POST /auth/device/approve` with it (bearer token, or browser session with CSRF), or denies it;
/// 3. the new device polls `POST /auth/device/token` with its device code: AUTHORIZATION_PENDING until
///    then, SLOW_DOWN when it polls too fast, ACCESS_DENIED when denied, EXPIRED_TOKEN once expired or
///    used; after the approval, once, a bearer token of its own (kind `device`, with the device's name).
///
/// The state is in the database (`StoredDeviceAuthorization`), so any node may answer any step; the
/// store keeps only SHA-256 hashes of both codes. Guessing is bounded: a user code is one of 20^8, works
/// for 10 minutes, and failed approvals are counted in the database per account and per address. The
/// table is bounded: live authorizations per address and in total are capped, and expired ones are
/// deleted whenever one is started.
public struct Devices: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// 20 consonants, no vowels (no words) and none of the look-alikes: RFC 8628, section 6.1.
    package static let userCodeAlphabet = DeviceUserCode.alphabet
    static let userCodeLength = DeviceUserCode.length
    static let deviceCodePrefix = "ld_"
    /// How much sooner than its interval a poll may come (the nodes' clocks differ a little).
    static let pollToleranceMilliseconds: Int64 = 1_000
    /// What SLOW_DOWN adds to the interval, and the most it grows to.
    static let slowDownStepSeconds: Int64 = 5
    static let maximumPollIntervalSeconds: Int64 = 60

    // MARK: Codes

    /// A fresh user code, 8 letters of `userCodeAlphabet` drawn without bias.
    static func newUserCode() throws -> String {
        var letters: [Character] = []
        let alphabetSize = userCodeAlphabet.count
        let ceiling = 256 - 256 % alphabetSize // bytes at or above it would favour the first letters
        while letters.count < userCodeLength {
            for byte in try Secrets.randomBytes(16) where Int(byte) < ceiling && letters.count < userCodeLength {
                letters.append(userCodeAlphabet[Int(byte) % alphabetSize])
            }
        }
        return String(letters)
    }

    /// `BCDFGHJK` as people read it: `BCDF-GHJK`.
    static func displayedUserCode(_ code: String) -> String { DeviceUserCode.displayed(code) }

    static func userCodeHash(_ normalized: String) -> [UInt8] {
        Secrets.sha256(Array(("lattice device user code v1 " + normalized).utf8))
    }

    static func deviceCodeHash(_ deviceCode: String) -> [UInt8] { Secrets.sha256(Array(deviceCode.utf8)) }

    /// A device code as a client sent it, if it is shaped like one (`ld_` and 64 lowercase hex digits).
    static func validDeviceCode(_ text: String) -> String? {
        guard text.hasPrefix(deviceCodePrefix), text.utf8.count == deviceCodePrefix.utf8.count + 64,
              text.utf8.dropFirst(deviceCodePrefix.utf8.count).allSatisfy({ ($0 >= 48 && $0 <= 57) || ($0 >= 97 && $0 <= 102) })
        else { return nil }
        return text
    }

    // MARK: Routes

    /// `POST /auth/device/start {"deviceName"?}` (no token; throttled per address): a new device
    /// authorization. Refused over the live authorizations of the address or of the server.
    public func startDeviceAuthorization(_ body: [String: JSON], from origin: ClientOrigin) throws -> JSON {
        let name = try DeviceStartRequest(json: .object(body)).deviceName ?? "device"
        try core.checkDiskBudget("device sign-in")
        let now = core.configuration.now()
        let lifetime = core.configuration.deviceCodeLifetimeSeconds
        let interval = core.configuration.devicePollIntervalSeconds
        let address = origin.limitKey
        let deviceCode = Self.deviceCodePrefix + Secrets.hex(try Secrets.randomBytes(32))
        let userCode: String = try core.storage.write(deadline: core.freshDeadline()) { tx in
            // Starts on every node wait for each other here, so two cannot both pass a count of limit - 1.
            try core.serialize("device-authorizations", tx)
            _ = try tx.forgetDeviceAuthorizations(expiredAt: now)
            if let limit = core.configuration.deviceAuthorizationsPerAddress,
               try tx.liveDeviceAuthorizations(address: address, nowMs: now) >= limit {
                core.logRefusal("device start " + address, "device sign-in refused: \(address.isEmpty ? "-" : address) has "
                           + "\(limit) waiting already")
                throw ServiceError(.throttled, "this address has \(limit) device sign-ins waiting already (each works for "
                               + "\(lifetime / 60) minutes); finish or let them expire, then retry", retryAfter: 60)
            }
            if let limit = core.configuration.deviceAuthorizationsGlobal,
               try tx.liveDeviceAuthorizations(address: nil, nowMs: now) >= limit {
                core.logRefusal("device start *", "device sign-in refused: \(limit) are waiting on this server")
                throw ServiceError(.throttled, "too many device sign-ins are waiting on this server; retry later", retryAfter: 60)
            }
            // A taken user code (one of 20^8 among at most a few thousand live ones) is drawn again.
            for _ in 0..<4 {
                let code = try Self.newUserCode()
                do {
                    try tx.savepoint {
                        try tx.insertDeviceAuthorization(NewDeviceAuthorization(
                            deviceCodeHash: Self.deviceCodeHash(deviceCode), userCodeHash: Self.userCodeHash(code),
                            address: address, deviceName: name, intervalSeconds: interval, createdMs: now,
                            expiresMs: now + lifetime * 1000))
                    }
                    return code
                } catch StorageError.duplicate {
                    continue
                }
            }
            throw StorageError.failure("no free device user code in 4 draws")
        }
        let shown = Self.displayedUserCode(userCode)
        // RFC 8628's verification URI is where the person types the code: the devices page when this server
        // serves the web pages, else the server itself (approve from the CLI).
        let base = core.publicURL.hasSuffix("/") ? String(core.publicURL.dropLast()) : core.publicURL
        let page = core.configuration.webRoot == nil ? nil : base + "/web/devices.html"
        let message = "On a device signed in to your account, run: lattice devices approve \(shown)"
            + (page.map { ", or open \($0) in a browser signed in to it and type the code" } ?? "")
        return DeviceStartResponse(deviceCode: deviceCode, userCode: shown, verificationURI: page ?? core.publicURL,
                                   message: message,
                                   expiresIn: lifetime, interval: interval, deviceName: name).json
    }

    /// `POST /auth/device/token {"deviceCode"}` (no token; throttled per address): the new device's poll.
    /// The poll's time (and a grown interval) is kept even when the answer is an error, so the transaction
    /// returns the outcome and the error is thrown after the commit.
    public func pollDeviceAuthorization(_ body: [String: JSON]) throws -> JSON {
        let gone = ServiceError(.expiredToken, "this device code is unknown or expired; run lattice login --server again "
                            + "for a new code")
        guard let deviceCode = Self.validDeviceCode(try DeviceTokenRequest(json: .object(body)).deviceCode) else { throw gone }
        let hash = Self.deviceCodeHash(deviceCode)
        let now = core.configuration.now()
        let outcome: Result<JSON, ServiceError> = try core.storage.write(deadline: core.freshDeadline()) { tx in
            guard let found = try tx.deviceAuthorization(deviceCodeHash: hash), found.isLive(atMs: now) else {
                return .failure(gone)
            }
            if found.status == .issued {
                return .failure(ServiceError(.expiredToken, "this device code was exchanged for a token already; it works once"))
            }
            if found.lastPollMs > 0, now - found.lastPollMs < found.intervalSeconds * 1000 - Self.pollToleranceMilliseconds {
                let slower = min(found.intervalSeconds + Self.slowDownStepSeconds, Self.maximumPollIntervalSeconds)
                try tx.recordDevicePoll(deviceCodeHash: hash, nowMs: now, intervalSeconds: slower)
                return .failure(ServiceError(.slowDown, "polled sooner than every \(found.intervalSeconds) s; wait \(slower) s "
                                         + "between polls from now on", retryAfter: Int(slower)))
            }
            try tx.recordDevicePoll(deviceCodeHash: hash, nowMs: now, intervalSeconds: found.intervalSeconds)
            switch found.status {
            case .pending:
                return .failure(ServiceError(.authorizationPending, "waiting for a signed-in device to approve the code; "
                                         + "poll again in \(found.intervalSeconds) s", retryAfter: Int(found.intervalSeconds)))
            case .denied:
                return .failure(ServiceError(.accessDenied, "the sign-in was denied on the signed-in device"))
            case .issued:
                return .failure(gone)
            case .approved:
                // The conditional update: of racing polls (on any nodes) exactly one gets the row.
                guard let claimed = try tx.claimDeviceAuthorization(deviceCodeHash: hash, nowMs: now),
                      let userID = claimed.userID, let user = try tx.user(id: userID) else {
                    return .failure(ServiceError(.expiredToken, "this device code was exchanged for a token already; it works once"))
                }
                let (token, info) = try issueDeviceToken(userID: userID, name: claimed.deviceName, nowMs: now, tx)
                return .success(DeviceTokenResponse(info: Accounts(core).tokenInfo(info), token: token.text, name: user.name,
                                                    userRecordName: user.recordName, deviceName: claimed.deviceName).json)
            }
        }
        let response = try outcome.get()
        core.log("device sign-in completed: a token was issued")
        return response
    }

    /// A device token (kind `device`, named) for `userID`, in the poll's transaction. The per-user cap is
    /// checked under the same lock `issueToken` takes.
    package func issueDeviceToken(userID: Int64, name: String, nowMs: Int64, _ tx: any StorageTransaction) throws
        -> (BearerToken, StoredToken) {
        try core.serialize("tokens", tx)
        guard try tx.tokens(userID: userID).count < core.configuration.maximumTokensPerUser else {
            throw ServiceError(.limitExceeded, "the account has \(core.configuration.maximumTokensPerUser) tokens already; "
                           + "revoke some with lattice devices revoke ID, then sign this device in again")
        }
        let token = try BearerToken.generate()
        let id = try TokenKind.device.newID()
        let expires = Accounts(core).tokenExpiry(nil, nowMs: nowMs)
        try tx.insertToken(NewToken(hash: token.storedHash, id: id, userID: userID, createdMs: nowMs, expiresMs: expires,
                                    name: name))
        return (token, StoredToken(id: id, userID: userID, createdMs: nowMs, expiresMs: expires, name: name))
    }

    /// `POST /auth/device/approve {"userCode", "deviceName"?, "deny"?: true}` (bearer token, or browser
    /// session with CSRF): approves the waiting device of that user code for the caller's account (or
    /// denies it). A wrong, expired or used code is NOT_FOUND and counts as a failed approval against the
    /// account and the address; past either limit, THROTTLED until the window moves on.
    public func decideDeviceAuthorization(_ body: [String: JSON], user: UserAccount, from origin: ClientOrigin) throws
        -> JSON {
        let request = try DeviceApproveRequest(json: .object(body))
        let code = request.userCode
        let deny = request.deny
        let rename = request.deviceName
        let address = origin.limitKey
        let now = core.configuration.now()
        let window = core.configuration.deviceApprovalFailureWindowMilliseconds
        let hash = Self.userCodeHash(code)
        let shown = Self.displayedUserCode(code)
        let outcome: Result<(String, Int64), ServiceError> = try core.storage.write(deadline: core.freshDeadline()) { tx in
            // Approvals on every node wait for each other here, so the failure counts cannot be overrun.
            try core.serialize("device-approvals", tx)
            try tx.forgetDeviceApprovalFailures(before: now - window + 1)
            let keys = [("user:\(user.id)", core.configuration.deviceApprovalFailuresPerAccount, "for this account"),
                        ("ip:" + address, core.configuration.deviceApprovalFailuresPerAddress, "from this address")]
            for (key, limit, what) in keys {
                let failures = try tx.deviceApprovalFailures(key: key, sinceMs: now - window + 1)
                guard failures.count >= limit else { continue }
                let wait = max(1, Int((Double((failures.oldestMs ?? now) + window - now) / 1000).rounded(.up)))
                core.logRefusal("device approve " + key, "device approval refused: \(limit) failed approvals \(what) "
                           + "(\(key)) in \(window / 1000) s")
                return .failure(ServiceError(.throttled, "too many wrong device codes \(what) (at most \(limit) per "
                                         + "\(window / 1000) s); retry after \(wait) s", retryAfter: wait))
            }
            guard let found = try tx.deviceAuthorization(userCodeHash: hash), found.status == .pending,
                  found.isLive(atMs: now) else {
                for (key, _, _) in keys { try tx.recordDeviceApprovalFailure(key: key, nowMs: now) }
                return .failure(ServiceError(.notFound, "no device is waiting for the code \(shown) (it may be mistyped, "
                                         + "expired or used); start again on the new device if needed"))
            }
            if !deny {
                guard try tx.tokens(userID: user.id).count < core.configuration.maximumTokensPerUser else {
                    return .failure(ServiceError(.limitExceeded, "the account has \(core.configuration.maximumTokensPerUser) tokens "
                                             + "already; revoke some with lattice devices revoke ID first"))
                }
            }
            guard try tx.decideDeviceAuthorization(userCodeHash: hash, approve: !deny, userID: user.id,
                                                   deviceName: rename, nowMs: now) else {
                return .failure(ServiceError(.notFound, "no device is waiting for the code \(shown) any more"))
            }
            return .success((rename ?? found.deviceName, found.expiresMs))
        }
        let (name, expires) = try outcome.get()
        core.log("device sign-in \(deny ? "denied" : "approved"): user \(user.name), device \(name)")
        return DeviceApproveResponse(userCode: shown, deviceName: name, approved: !deny, expiresMs: expires).json
    }
}
