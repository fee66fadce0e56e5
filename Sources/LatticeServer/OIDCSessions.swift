import Foundation
import LatticeAPI
import LatticeCore
import LatticeOperations

/// The HTTP side of OpenID Connect sign-in (LatticeOperations' `OpenIDConnect` has the flow): the
/// redirect to the provider, the browser binding cookie, the callback page, and an app's token exchange.
extension LatticeService {
    /// The cookie that binds a sign-in to the browser that started it (its nonce): `SameSite=Lax`, since
    /// the provider sends the browser back with a cross-site navigation, and only on /auth/oidc/.
    static let oidcCookie = "lattice_oidc"

    /// The value of a query parameter (percent-decoded), nil when absent.
    static func queryValue(_ query: String, _ name: String) -> String? {
        for pair in query.split(separator: "&") {
            let parts = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            guard parts.count == 2, parts[0] == name else { continue }
            return String(parts[1]).replacingOccurrences(of: "+", with: " ").removingPercentEncoding
        }
        return nil
    }

    /// A path on this server to go to after signing in: `/` or a share page, never another origin.
    static func safeNextPath(_ value: String?) -> String {
        guard let value, value.hasPrefix("/share/") || value == "/",
              value.utf8.count <= 2_048, !value.contains("//"), !value.contains("\\"), !value.contains("..") else { return "/" }
        return value
    }

    /// `GET /auth/oidc/providers`: the providers a sign-in page offers.
    func oidcProviders() -> HTTPResponse {
        .json(.object(["providers": .array(openIDConnect.providers.enumerated().map { index, provider in
            .object(["provider": .int(Int64(index)), "issuer": .string(provider.issuer), "name": .string(provider.name),
                     "start": .string("/auth/oidc/start?provider=\(index)")])
        })]))
    }

    /// `GET /auth/oidc/start?provider=N&next=PATH`: to the provider, with the binding cookie (a browser gets
    /// a 303; a program, `Accept` without text/html, `{"location"}`). A signed-in browser links the
    /// provider's identity to its account.
    func oidcStart(_ request: HTTPRequest) throws -> HTTPResponse {
        guard let index = Self.queryValue(request.query, "provider").flatMap(Int.init) else {
            throw ServiceError.badRequest("expected ?provider=N (GET /auth/oidc/providers lists them)")
        }
        let current = try? browserSession(request.head)
        let (url, nonce) = try openIDConnect.start(provider: index, next: Self.safeNextPath(Self.queryValue(request.query, "next")),
                                                   linkUserID: current?.user.id, from: request.origin)
        let secure = publicURL.lowercased().hasPrefix("https:") ? "; Secure" : ""
        let cookie = (name: "Set-Cookie", value: "\(Self.oidcCookie)=\(nonce); Path=/auth/oidc/; Max-Age=600; HttpOnly; SameSite=Lax\(secure)")
        guard Self.wantsHTML(request) else {
            var response = HTTPResponse.json(.object(["location": .string(url)]))
            response.headers.append(cookie)
            return response
        }
        var response = HTTPResponse.json(.object(["location": .string(url)]), status: 303)
        response.headers += [(name: "Location", value: url), cookie]
        return response
    }

    /// `GET /auth/oidc/callback?code&state`: the provider's answer. Signed in, the page goes on (a refresh
    /// from this origin, so the new `SameSite=Strict` session cookie is sent); refused, it says why. A
    /// program (`Accept` without text/html) gets the session's JSON, or the error.
    func oidcCallback(_ request: HTTPRequest) throws -> HTTPResponse {
        let clear = (name: "Set-Cookie", value: "\(Self.oidcCookie)=; Path=/auth/oidc/; Max-Age=0; HttpOnly; SameSite=Lax")
        let browser = Self.wantsHTML(request)
        func failure(_ status: Int, _ reason: String) throws -> HTTPResponse {
            guard browser else {
                let code = ServerErrorCode.allCases.first { $0.httpStatus == status } ?? .badRequest
                throw ServiceError(code, reason)
            }
            var response = page(status: status, title: "Sign-in failed", body: """
                <h1>Sign-in failed</h1>
                <p id="reason">\(html(reason))</p>
                <p><a class="button" href="/">Back to sign-in</a></p>
                """)
            response.headers.append(clear)
            return response
        }
        if let error = Self.queryValue(request.query, "error") {
            return try failure(401, "The identity provider did not sign you in (\(error.prefix(100))).")
        }
        guard let code = Self.queryValue(request.query, "code"), let state = Self.queryValue(request.query, "state"),
              code.utf8.count <= 2_048, state.utf8.count <= 256 else {
            return try failure(400, "The identity provider's answer lacks its code or state.")
        }
        let nonce = request.header("cookie")?.split(separator: ";").map { $0.trimmingCharacters(in: .whitespaces) }
            .first { $0.hasPrefix(Self.oidcCookie + "=") }.map { String($0.dropFirst(Self.oidcCookie.count + 1)) }
        do {
            let (user, next) = try openIDConnect.finish(code: code, state: state, browserNonce: nonce)
            let session = try startSession(for: user, replacing: request, extra: ["next": .string(next)])
            guard browser else {
                var response = session
                response.headers.append(clear)
                return response
            }
            var response = page(status: 200, title: "Signed in", body: """
                <h1>Signed in as \(html(user.name))</h1>
                <p><a class="button" href="\(html(next))" id="continue">Continue</a></p>
                """, extraHead: "<meta http-equiv=\"refresh\" content=\"0; url=\(html(next))\">")
            response.headers += session.headers.filter { $0.name == "Set-Cookie" }
            response.headers.append(clear)
            log("OpenID Connect sign-in: user \(user.name)")
            return response
        } catch let error as ServiceError {
            if !browser { throw error }
            if error.code == .authenticationFailed { _ = failedSignIn(error, address: request.remoteAddress) }
            return try failure(error.code.httpStatus, error.reason)
        } catch {
            return try failure(500, internalError(error).reason)
        }
    }
}
