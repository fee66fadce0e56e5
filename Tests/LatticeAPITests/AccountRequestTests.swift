import Testing
import LatticeAPI
import LatticeCore

/// The reason a decode throws, or nil.
private func reason(_ body: () throws -> Void) -> String? {
    do { try body(); return nil } catch { return (error as? ServiceError)?.reason ?? "not a ServiceError: \(error)" }
}

private func body(_ text: String) -> JSON { try! JSON.parse(text) }

@Suite("account, token and device requests")
struct AccountRequestTests {
    let limits = RequestLimits(maximumOperations: 3, maximumResultsLimit: 2)

    @Test("sign-up: the name, then the lifetime; session only when true")
    func signUpMessages() throws {
        #expect(reason { _ = try SignUpRequest(json: body(#"{"name": 1, "lifetimeSeconds": 1}"#)) } == "expected {\"name\": \"...\"}")
        for bad in ["59", "315360001", "\"600\"", "60.5"] {
            #expect(reason { _ = try SignUpRequest(json: body("{\"name\": \"a\", \"lifetimeSeconds\": \(bad)}")) }
                    == "lifetimeSeconds must be a whole number of seconds from 60 to 315360000 (ten years)")
        }
        #expect(try SignUpRequest(json: body(#"{"name": "a", "lifetimeSeconds": 60.0}"#)).lifetimeSeconds == 60)
        #expect(SignUpRequest.asksForSession(body(#"{"session": true}"#)))
        #expect(!SignUpRequest.asksForSession(body(#"{"session": "true"}"#)))
        let request = SignUpRequest(name: "alice", lifetimeSeconds: 3_600, session: true)
        #expect(try SignUpRequest(json: request.json) == request)
        #expect(SignUpRequest(name: "bob").json == .object(["name": .string("bob")]))
    }

    @Test("tokens/revoke: list, current, all, something named, then each tokenID unless all")
    func revokeMessages() throws {
        #expect(reason { _ = try TokensRevokeRequest(json: body(#"{"tokens": 1, "current": 1}"#), limits: limits) }
                == "expected \"tokens\": [...]")
        #expect(reason { _ = try TokensRevokeRequest(json: body(#"{"tokens": [{}], "current": 1, "all": 2}"#), limits: limits) }
                == "current must be true or false")
        #expect(reason { _ = try TokensRevokeRequest(json: body(#"{"all": 2}"#), limits: limits) } == "all must be true or false")
        #expect(reason { _ = try TokensRevokeRequest(json: body(#"{"current": false}"#), limits: limits) }
                == "name tokens to revoke: {\"tokens\": [{\"tokenID\": ...}]}, {\"current\": true} or {\"all\": true}")
        #expect(reason { _ = try TokensRevokeRequest(json: body(#"{"tokens": [{"tokenID": "a"}, {}]}"#), limits: limits) }
                == "tokens[1].tokenID is missing")
        let all = try TokensRevokeRequest(json: body(#"{"tokens": [{"tokenID": "a"}, {}], "all": true}"#), limits: limits)
        #expect(all == TokensRevokeRequest(tokenIDs: ["a"], all: true))
        do {
            _ = try TokensRevokeRequest(json: body(#"{"tokens": [{}, {}, {}]}"#), limits: limits)
            Issue.record("three tokens passed a limit of two")
        } catch {
            #expect(error.code == .limitExceeded)
            #expect(error.reason == "3 items in tokens; the limit is 2 per request")
        }
        #expect(TokensRevokeRequest(current: true).json == .object(["current": .bool(true)]))
    }

    @Test("tokens/create and POST /auth/link: their messages")
    func otherMessages() throws {
        #expect(reason { _ = try TokenCreateRequest(json: body(#"{"lifetimeSeconds": 0}"#)) }
                == "lifetimeSeconds must be a whole number of seconds from 60 to 315360000 (ten years)")
        #expect(reason { _ = try SignInLinkExchangeRequest(json: body(#"{"replaceSession": 1}"#)) }
                == SignInLinkExchangeRequest.invalidLink.reason)
        #expect(reason { _ = try SignInLinkExchangeRequest(json: body(#"{"secret": "lt_x", "replaceSession": 1}"#)) }
                == "replaceSession must be true or false")
        #expect(try SignInLinkExchangeRequest(json: body(#"{"secret": "lt_x", "replaceSession": null}"#))
                == SignInLinkExchangeRequest(secret: "lt_x"))
    }

    @Test("devices: the server's messages in its order")
    func deviceMessages() throws {
        #expect(reason { _ = try DeviceStartRequest(json: body(#"{"deviceName": " "}"#)) }
                == "deviceName must be 1 to 64 characters without control characters")
        #expect(reason { _ = try DeviceStartRequest(json: body(#"{"deviceName": "a\u0007"}"#)) }
                == "deviceName must be 1 to 64 characters without control characters")
        #expect(try DeviceStartRequest(json: body(#"{"deviceName": "  laptop "}"#)).deviceName == "laptop")
        #expect(reason { _ = try DeviceTokenRequest(json: body(#"{"deviceCode": 5}"#)) }
                == "expected {\"deviceCode\": \"ld_...\"} from POST /auth/device/start")
        #expect(reason { _ = try DeviceApproveRequest(json: body(#"{"deny": 1}"#)) }
                == "expected {\"userCode\": \"XXXX-XXXX\"}, the code the new device shows")
        #expect(reason { _ = try DeviceApproveRequest(json: body(#"{"userCode": "BCDF-GHJA", "deny": 1}"#)) }
                == "a user code is 8 letters (such as BCDF-GHJK) of BCDFGHJKLMNPQRSTVWXZ")
        #expect(reason { _ = try DeviceApproveRequest(json: body(#"{"userCode": "bcdf ghjk", "deny": 1, "deviceName": ""}"#)) }
                == "deny must be true or false")
        #expect(reason { _ = try DeviceApproveRequest(json: body(#"{"userCode": "bcdf ghjk", "deviceName": ""}"#)) }
                == "deviceName must be 1 to 64 characters without control characters")
        #expect(try DeviceApproveRequest(json: body(#"{"userCode": "bcdf-ghjk", "deny": true}"#))
                == DeviceApproveRequest(userCode: "BCDFGHJK", deny: true))
        #expect(DeviceUserCode.displayed("BCDFGHJK") == "BCDF-GHJK")
    }

    @Test("account answers survive encode then decode (random, seed printed)")
    func roundTrips() throws {
        let seed = UInt64.random(in: 0...UInt64.max)
        print("AccountRequestTests.roundTrips seed \(seed)")
        var random = SplitMix64(seed: seed)
        func name() -> String { "n" + String(Int.random(in: 0..<1_000_000, using: &random)) }
        func maybe<T>(_ value: @autoclosure () -> T) -> T? { Bool.random(using: &random) ? value() : nil }
        for _ in 0..<200 {
            let info = TokenInfo(tokenID: name(), createdMs: Int64.random(in: 0...1 << 42, using: &random),
                                 expiresMs: maybe(Int64.random(in: 0...1 << 42, using: &random)), deviceName: maybe(name()))
            #expect(TokenInfo(json: .object(info.members)) == info, "seed \(seed)")
            let signUp = SignUpResponse(userRecordName: "_" + name(), name: name(), token: name(), tokenInfo: info)
            #expect(SignUpResponse(json: signUp.json) == signUp, "seed \(seed)")
            let list = TokensListResponse(tokens: [TokenListing(info: info, kind: "bearer", current: Bool.random(using: &random),
                                                                expired: Bool.random(using: &random))])
            #expect(TokensListResponse(json: list.json) == list, "seed \(seed)")
            let issued = IssuedTokenResponse(info: info, token: name())
            #expect(IssuedTokenResponse(json: issued.json) == issued, "seed \(seed)")
            let link = SignInLinkResponse(info: info, url: name())
            #expect(SignInLinkResponse(json: link.json) == link, "seed \(seed)")
            let user = CurrentUserResponse(userRecordName: "_" + name(), name: name())
            #expect(CurrentUserResponse(json: user.json) == user, "seed \(seed)")
            let revoke = TokensRevokeRequest(tokenIDs: (0..<Int.random(in: 0...2, using: &random)).map { _ in name() },
                                             current: Bool.random(using: &random), all: true)
            #expect(try TokensRevokeRequest(json: revoke.json, limits: limits) == revoke, "seed \(seed)")
            let revoked = TokensRevokeResponse(tokens: [TokenRevocation(tokenID: name()),
                                                        TokenRevocation(tokenID: name(), error: ServiceError(.notFound, name()))])
            let back = try #require(TokensRevokeResponse(json: revoked.json))
            #expect(back.tokens.map(\.tokenID) == revoked.tokens.map(\.tokenID))
            #expect(back.tokens.map(\.error?.reason) == revoked.tokens.map(\.error?.reason))
            let session = SessionResponse(userRecordName: "_" + name(), name: name(), sessionID: name(), csrfToken: name(),
                                          container: name(), environment: "production", expiresMs: maybe(5))
            #expect(SessionResponse(json: session.json) == session, "seed \(seed)")

            let start = DeviceStartRequest(deviceName: maybe(name()))
            #expect(try DeviceStartRequest(json: start.json) == start, "seed \(seed)")
            let started = DeviceStartResponse(deviceCode: "ld_" + name(), userCode: "BCDF-GHJK", verificationURI: name(),
                                              message: name(), expiresIn: 600, interval: 5, deviceName: name())
            #expect(DeviceStartResponse(json: started.json) == started, "seed \(seed)")
            let poll = DeviceTokenRequest(deviceCode: "ld_" + name())
            #expect(try DeviceTokenRequest(json: poll.json) == poll, "seed \(seed)")
            let device = DeviceTokenResponse(info: TokenInfo(tokenID: name(), createdMs: 1, deviceName: "d"), token: name(),
                                             name: name(), userRecordName: "_" + name(), deviceName: "d")
            #expect(DeviceTokenResponse(json: device.json) == device, "seed \(seed)")
            let code = String((0..<8).map { _ in DeviceUserCode.alphabet.randomElement(using: &random)! })
            let approve = DeviceApproveRequest(userCode: DeviceUserCode.displayed(code), deny: Bool.random(using: &random),
                                               deviceName: maybe(name()))
            #expect(try DeviceApproveRequest(json: approve.json) == approve, "seed \(seed)")
            #expect(approve.userCode == code)
            let approved = DeviceApproveResponse(userCode: DeviceUserCode.displayed(code), deviceName: name(),
                                                 approved: Bool.random(using: &random), expiresMs: 7)
            #expect(DeviceApproveResponse(json: approved.json) == approved, "seed \(seed)")
        }
    }
}
