import Foundation
import LatticeAPI
import LatticeCore
import LatticeSharing
import LatticeStore

/// Passkeys (WebAuthn) and one-time recovery codes: how a person who joined from a link signs in again on
/// any device without a terminal.
///
/// A ceremony starts with a challenge (32 random bytes) the server keeps as its SHA-256 in the database
/// for five minutes, so any node can finish it, and takes exactly once. The browser's answer names its
/// challenge in the client data; the checks are `WebAuthn`'s. Ceremonies are bounded: expired ones are
/// deleted whenever one starts, and at most `passkeyCeremoniesPerAddress` live ones per client address
/// and `passkeyCeremoniesGlobal` in all are allowed.
///
/// Recovery codes: ten per account, 12 characters each (about 59 bits), stored as hashes, each signs in
/// once. A browser sign-up gets them once; the account page makes a new set (the old set stops working).
public struct Passkeys: Sendable {
    let core: OperationsCore

    public init(_ core: OperationsCore) { self.core = core }

    /// How long a ceremony's challenge works.
    public static let ceremonyLifetimeMilliseconds: Int64 = 5 * 60 * 1000
    public static let maximumPasskeysPerUser = 20
    public static let recoveryCodeCount = 10

    /// The relying party: the public URL's host and origin.
    public var relyingParty: RelyingParty {
        get throws {
            guard let party = RelyingParty(publicURL: core.publicURL) else {
                throw ServiceError(.internalError, "the public URL \(core.publicURL) names no host for passkeys")
            }
            return party
        }
    }

    // MARK: Starting a ceremony

    /// Issues a challenge for `purpose` and returns it (the caller writes the options around it).
    private func begin(_ purpose: PasskeyCeremonyPurpose, userID: Int64?, name: String?, from origin: ClientOrigin) throws -> [UInt8] {
        try core.checkDiskBudget("passkey")
        let challenge = try Secrets.randomBytes(32)
        let now = core.configuration.now()
        let address = origin.limitKey
        try core.storage.write(deadline: core.freshDeadline()) { tx in
            try core.serialize("passkey-ceremonies", tx)
            _ = try tx.forgetPasskeyCeremonies(expiredAt: now)
            let perAddress = core.configuration.passkeyCeremoniesPerAddress
            if try tx.livePasskeyCeremonies(address: address, nowMs: now) >= perAddress {
                core.logRefusal("passkey begin " + address, "passkey ceremony refused: \(address.isEmpty ? "-" : address) has "
                                + "\(perAddress) waiting")
                throw ServiceError(.throttled, "this address has \(perAddress) passkey requests waiting already (each works for "
                                   + "5 minutes); finish or let them expire, then retry", retryAfter: 60)
            }
            if try tx.livePasskeyCeremonies(address: nil, nowMs: now) >= core.configuration.passkeyCeremoniesGlobal {
                core.logRefusal("passkey begin *", "passkey ceremony refused: too many waiting on this server")
                throw ServiceError(.throttled, "too many passkey requests are waiting on this server; retry later", retryAfter: 60)
            }
            try tx.insertPasskeyCeremony(PasskeyCeremony(challengeHash: Secrets.sha256(challenge), purpose: purpose, userID: userID,
                                                         address: address, name: name, createdMs: now,
                                                         expiresMs: now + Self.ceremonyLifetimeMilliseconds))
        }
        return challenge
    }

    private static let algorithms: JSON = .array(SignatureAlgorithm.allCases.map {
        .object(["type": .string("public-key"), "alg": .int(Int64($0.coseIdentifier))])
    })

    /// `PublicKeyCredentialCreationOptions` in their JSON form (`PublicKeyCredential.parseCreationOptionsFromJSON`).
    private func creationOptions(challenge: [UInt8], userHandle: String, name: String, exclude: [[UInt8]]) throws -> JSON {
        let party = try relyingParty
        return .object([
            "challenge": .string(Base64URL.encode(challenge)),
            "rp": .object(["id": .string(party.id), "name": .string(party.name)]),
            "user": .object(["id": .string(Base64URL.encode(Array(userHandle.utf8))), "name": .string(name), "displayName": .string(name)]),
            "pubKeyCredParams": Self.algorithms,
            "timeout": .int(Self.ceremonyLifetimeMilliseconds),
            "attestation": .string("none"),
            "authenticatorSelection": .object(["residentKey": .string("required"), "requireResidentKey": .bool(true),
                                               "userVerification": .string("preferred")]),
            "excludeCredentials": .array(exclude.map { .object(["type": .string("public-key"), "id": .string(Base64URL.encode($0))]) }),
        ])
    }

    /// `POST /auth/passkey/signup/options {"name"}` (no session): a sign-up with a passkey. The name is
    /// checked now (its rules, and that it is free) and again when the account is made.
    public func signUpOptions(_ body: [String: JSON], from origin: ClientOrigin) throws -> JSON {
        let name = try PasskeySignUpOptionsRequest(json: .object(body)).name
        try Accounts.validateUserName(name)
        guard core.configuration.registrationOpen else {
            throw ServiceError(.accessDenied, "registration is closed on this server; the administrator adds users with lattice admin add-user")
        }
        if try core.storage.read(deadline: core.freshDeadline(), { try $0.user(named: name) }) != nil {
            throw ServiceError(.exists, "the user name \(name) is taken")
        }
        let challenge = try begin(.signUp, userID: nil, name: name, from: origin)
        // The handle is fixed now so the passkey names the account it will belong to.
        return try creationOptions(challenge: challenge, userHandle: "new:" + Secrets.hex(Secrets.sha256(challenge)).prefix(32),
                                   name: name, exclude: [])
    }

    /// `POST /auth/passkey/register/options {}` (signed in): another passkey for the caller's account.
    public func registrationOptions(user: UserAccount, from origin: ClientOrigin) throws -> JSON {
        let existing = try core.storage.read(deadline: core.freshDeadline()) { try $0.passkeys(userID: user.id) }
        guard existing.count < Self.maximumPasskeysPerUser else {
            throw ServiceError(.limitExceeded, "an account has at most \(Self.maximumPasskeysPerUser) passkeys; remove one first")
        }
        let challenge = try begin(.register, userID: user.id, name: nil, from: origin)
        return try creationOptions(challenge: challenge, userHandle: user.recordName, name: user.name,
                                   exclude: existing.map(\.passkey.credentialID))
    }

    /// `POST /auth/passkey/signin/options {}` (no session): a sign-in with whichever passkey the person picks.
    public func signInOptions(from origin: ClientOrigin) throws -> JSON {
        let challenge = try begin(.signIn, userID: nil, name: nil, from: origin)
        return .object([
            "challenge": .string(Base64URL.encode(challenge)),
            "rpId": .string(try relyingParty.id),
            "timeout": .int(Self.ceremonyLifetimeMilliseconds),
            "userVerification": .string("preferred"),
            "allowCredentials": .array([]),
        ])
    }

    // MARK: Finishing a ceremony

    /// The ceremony the client data names, taken (so it works once); refused when it is unknown, used,
    /// expired, or for another purpose.
    private func takeCeremony(_ clientDataJSON: [UInt8], _ purpose: PasskeyCeremonyPurpose, _ tx: any StorageTransaction)
        throws -> (PasskeyCeremony, [UInt8]) {
        guard let challenge = (try? JSON.parse(clientDataJSON))?["challenge"]?.stringValue.flatMap(Base64URL.decode),
              let ceremony = try tx.takePasskeyCeremony(challengeHash: Secrets.sha256(challenge), nowMs: core.configuration.now()),
              ceremony.purpose == purpose else {
            throw Self.expired
        }
        return (ceremony, challenge)
    }

    static let expired = ServiceError(.authenticationFailed, "the passkey request is unknown, used or expired; start again")

    private func refused(_ error: WebAuthnError) -> ServiceError {
        ServiceError(.authenticationFailed, "the passkey was refused: \(error.description)")
    }

    private func registered(_ request: PasskeyCredentialRequest, challenge: [UInt8]) throws -> RegisteredPasskey {
        let party = try relyingParty
        do throws(WebAuthnError) {
            let passkey = try WebAuthn.verifyRegistration(clientDataJSON: request.clientDataJSON,
                                                          attestationObject: request.attestationObject ?? [],
                                                          challenge: challenge, relyingParty: party,
                                                          requireUserVerification: false)
            guard passkey.credentialID == request.credentialID else {
                throw WebAuthnError("the credential's id is not the one its authenticator data holds")
            }
            return passkey
        } catch {
            throw refused(error)
        }
    }

    private func newPasskey(_ passkey: RegisteredPasskey, userID: Int64, name: String?) -> NewPasskey {
        NewPasskey(credentialID: passkey.credentialID, userID: userID, publicKey: passkey.publicKey,
                   algorithm: Int64(passkey.algorithm.coseIdentifier), signCount: Int64(passkey.signCount),
                   name: name ?? "Passkey", createdMs: core.configuration.now())
    }

    /// `POST /auth/passkey/signup {"credential", "name"?}`: makes the account of the sign-up ceremony with its
    /// first passkey, a browser session and ten recovery codes, in one transaction; returns the account and
    /// the codes (shown once).
    public func finishSignUp(_ body: [String: JSON], from origin: ClientOrigin, lifetimeSeconds: Int64)
        throws -> (NewAccount, [String]) {
        let request = try PasskeyCredentialRequest(json: .object(body), registration: true)
        // The ceremony is taken in its own transaction: a refused passkey still spends it.
        let (ceremony, challenge) = try core.storage.write(deadline: core.freshDeadline()) { try takeCeremony(request.clientDataJSON, .signUp, $0) }
        let passkey = try registered(request, challenge: challenge)
        let codes = try Self.newRecoveryCodes()
        let account = try Accounts(core).createAccount(name: ceremony.name ?? "", lifetimeSeconds: lifetimeSeconds,
                                                       signUpFrom: origin, kind: .session) { user, tx in
            guard try tx.passkey(credentialID: passkey.credentialID) == nil else {
                throw ServiceError(.exists, "this passkey is registered already")
            }
            try tx.insertPasskey(newPasskey(passkey, userID: user.id, name: request.name))
            try tx.replaceRecoveryCodes(userID: user.id, hashes: codes.map(Self.recoveryCodeHash), nowMs: core.configuration.now())
        }
        core.log("passkey sign-up: user \(account.user.name)")
        return (account, codes.map(RecoveryCode.displayed))
    }

    /// `POST /auth/passkey/register {"credential", "name"?}` (signed in): adds the passkey to the caller's account.
    public func finishRegistration(_ body: [String: JSON], user: UserAccount) throws -> JSON {
        let request = try PasskeyCredentialRequest(json: .object(body), registration: true)
        let (ceremony, challenge) = try core.storage.write(deadline: core.freshDeadline()) {
            try takeCeremony(request.clientDataJSON, .register, $0)
        }
        guard ceremony.userID == user.id else { throw Self.expired }
        let passkey = try registered(request, challenge: challenge)
        let stored: NewPasskey = try core.storage.write(deadline: core.freshDeadline()) { tx in
            guard try tx.passkeys(userID: user.id).count < Self.maximumPasskeysPerUser else {
                throw ServiceError(.limitExceeded, "an account has at most \(Self.maximumPasskeysPerUser) passkeys; remove one first")
            }
            guard try tx.passkey(credentialID: passkey.credentialID) == nil else {
                throw ServiceError(.exists, "this passkey is registered already")
            }
            let new = newPasskey(passkey, userID: user.id, name: request.name)
            try tx.insertPasskey(new)
            return new
        }
        core.log("passkey added: user \(user.name)")
        return Self.json(StoredPasskey(passkey: stored, lastUsedMs: nil))
    }

    /// `POST /auth/passkey/signin {"credential"}`: the account whose passkey signed the challenge. Every
    /// refusal is AUTHENTICATION_FAILED with the reason (none of them reveals another account).
    public func finishSignIn(_ body: [String: JSON]) throws -> UserAccount {
        let request = try PasskeyCredentialRequest(json: .object(body), registration: false)
        let (_, challenge) = try core.storage.write(deadline: core.freshDeadline()) { try takeCeremony(request.clientDataJSON, .signIn, $0) }
        let now = core.configuration.now()
        let user: UserAccount = try core.storage.write(deadline: core.freshDeadline()) { tx in
            guard let stored = try tx.passkey(credentialID: request.credentialID),
                  let owner = try tx.user(id: stored.passkey.userID) else {
                throw ServiceError(.authenticationFailed, "this passkey is not registered here (it may have been removed)")
            }
            if let handle = request.userHandle, handle != Array(owner.recordName.utf8), !handle.starts(with: Array("new:".utf8)) {
                throw ServiceError(.authenticationFailed, "the passkey names another account")
            }
            let verified: VerifiedAssertion
            let party = try relyingParty
            do throws(WebAuthnError) {
                verified = try WebAuthn.verifyAssertion(
                    clientDataJSON: request.clientDataJSON, authenticatorData: request.authenticatorData ?? [],
                    signature: request.signature ?? [], challenge: challenge, relyingParty: party,
                    publicKey: stored.passkey.publicKey, storedSignCount: UInt32(clamping: stored.passkey.signCount),
                    requireUserVerification: false)
            } catch {
                throw refused(error)
            }
            guard try tx.recordPasskeySignIn(credentialID: request.credentialID, signCount: Int64(verified.signCount), nowMs: now) else {
                throw ServiceError(.authenticationFailed, "the passkey was refused: its counter did not grow (another sign-in with it just happened)")
            }
            return owner
        }
        core.log("passkey sign-in: user \(user.name)")
        return user
    }

    // MARK: The account's passkeys

    static func json(_ stored: StoredPasskey) -> JSON {
        var object: [String: JSON] = [
            "passkeyID": .string(Base64URL.encode(stored.passkey.credentialID)), "name": .string(stored.passkey.name),
            "created": .object(["timestamp": .int(stored.passkey.createdMs)]),
            "algorithm": .string(SignatureAlgorithm(coseIdentifier: Int(stored.passkey.algorithm))?.rawValue ?? "unknown"),
        ]
        if let used = stored.lastUsedMs { object["lastUsed"] = .object(["timestamp": .int(used)]) }
        return .object(object)
    }

    /// `POST /auth/passkeys/list {}`: the caller's passkeys, oldest first, and how many recovery codes are unused.
    public func list(user: UserAccount) throws -> JSON {
        let (passkeys, codes) = try core.storage.read(deadline: core.freshDeadline()) { tx in
            (try tx.passkeys(userID: user.id), try tx.unusedRecoveryCodes(userID: user.id))
        }
        return .object(["passkeys": .array(passkeys.map(Self.json)), "recoveryCodesLeft": .int(Int64(codes))])
    }

    /// `POST /auth/passkeys/rename {"passkeyID", "name"}`.
    public func rename(_ body: [String: JSON], user: UserAccount) throws -> JSON {
        let request = try PasskeyChangeRequest(json: .object(body), renaming: true)
        guard try core.storage.write(deadline: core.freshDeadline(), {
            try $0.renamePasskey(credentialID: request.credentialID, userID: user.id, name: request.name ?? "")
        }) else { throw ServiceError(.notFound, "you have no passkey with this id") }
        return try list(user: user)
    }

    /// `POST /auth/passkeys/delete {"passkeyID"}`: the passkey stops working at once.
    public func delete(_ body: [String: JSON], user: UserAccount) throws -> JSON {
        let request = try PasskeyChangeRequest(json: .object(body), renaming: false)
        guard try core.storage.write(deadline: core.freshDeadline(), {
            try $0.deletePasskey(credentialID: request.credentialID, userID: user.id)
        }) else { throw ServiceError(.notFound, "you have no passkey with this id") }
        core.log("passkey removed: user \(user.name)")
        return try list(user: user)
    }

    // MARK: Recovery codes

    static func newRecoveryCodes() throws -> [String] {
        let alphabet = RecoveryCode.alphabet
        let ceiling = 256 - 256 % alphabet.count // bytes at or above it would favour the first characters
        let length = RecoveryCode.groups * RecoveryCode.groupLength
        return try (0..<recoveryCodeCount).map { _ in
            var characters: [Character] = []
            while characters.count < length {
                for byte in try Secrets.randomBytes(24) where Int(byte) < ceiling && characters.count < length {
                    characters.append(alphabet[Int(byte) % alphabet.count])
                }
            }
            return String(characters)
        }
    }

    static func recoveryCodeHash(_ normalized: String) -> [UInt8] {
        Secrets.sha256(Array(("lattice recovery code v1 " + normalized).utf8))
    }

    /// Makes a new set of recovery codes for `userID` in `tx` (the old set stops working); returns them as shown.
    public func replaceRecoveryCodes(userID: Int64, _ tx: any StorageTransaction) throws -> [String] {
        let codes = try Self.newRecoveryCodes()
        try tx.replaceRecoveryCodes(userID: userID, hashes: codes.map(Self.recoveryCodeHash), nowMs: core.configuration.now())
        return codes.map(RecoveryCode.displayed)
    }

    /// `POST /auth/recovery/codes {}` (signed in): a new set of ten codes, shown once.
    public func newRecoveryCodes(user: UserAccount) throws -> JSON {
        let codes = try core.storage.write(deadline: core.freshDeadline()) { try replaceRecoveryCodes(userID: user.id, $0) }
        core.log("recovery codes made: user \(user.name)")
        return .object(["recoveryCodes": .array(codes.map(JSON.string))])
    }

    /// `POST /auth/recovery {"code"}`: the account of an unused recovery code, which is used up now.
    public func signInWithRecoveryCode(_ body: [String: JSON]) throws -> (UserAccount, Int) {
        let code = try RecoverySignInRequest(json: .object(body)).code
        let now = core.configuration.now()
        return try core.storage.write(deadline: core.freshDeadline()) { tx in
            guard let userID = try tx.useRecoveryCode(hash: Self.recoveryCodeHash(code), nowMs: now),
                  let user = try tx.user(id: userID) else {
                throw ServiceError(.authenticationFailed, "this recovery code is unknown or was used already")
            }
            core.log("recovery code used: user \(user.name)")
            return (user, try tx.unusedRecoveryCodes(userID: userID))
        }
    }
}
