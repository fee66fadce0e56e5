import Foundation
#if canImport(Glibc)
import Glibc
#endif
import LatticeCore

/// The tests' OpenID Connect provider (Tests/OIDCProvider/provider.py on joserfc), run by
/// Scripts/oidc-provider.sh, which installs joserfc into .build/oidc-venv when missing. It listens on
/// 127.0.0.1 only; `issuer` is its URL.
public final class OIDCProviderProcess: @unchecked Sendable {
    // @unchecked: no lock; every member is set once in init and only read (Process is used from the
    // test's thread only).
    public let process = Process()
    public let issuer: String
    public let port: UInt16

    static let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()

    /// `clientSecrets`: confidential clients (client id to secret), whose secret the token endpoint checks.
    public init(clientIDs: [String], clientSecrets: [String: String] = [:]) throws {
        let urlFile = temporaryDirectory("lattice-oidc") + "/issuer"
        process.executableURL = URL(fileURLWithPath: "/bin/bash")
        process.arguments = [Self.root.appendingPathComponent("Scripts/oidc-provider.sh").path, "--url-file", urlFile]
            + clientIDs.flatMap { ["--client-id", $0] }
            + clientSecrets.sorted { $0.key < $1.key }.flatMap { ["--client-secret", $0.key + "=" + $0.value] }
        process.currentDirectoryURL = Self.root
        process.standardOutput = FileHandle.nullDevice
        try process.run()
        // The provider writes its URL to the file once it listens (after installing joserfc, the first time).
        var text = ""
        let deadline = Date().addingTimeInterval(300)
        while Date() < deadline, process.isRunning {
            if let written = try? String(contentsOfFile: urlFile, encoding: .utf8), !written.isEmpty { text = written; break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        guard let url = URL(string: text), text.hasPrefix("http://127.0.0.1:"), let port = url.port else {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            throw HarnessError("the OpenID Connect provider did not start (see Scripts/oidc-provider.sh)")
        }
        issuer = url.absoluteString
        self.port = UInt16(port)
    }

    deinit { stop() }

    /// Kills the provider (SIGKILL: a child of the test process may inherit SIGTERM blocked) and waits.
    public func stop() {
        if process.isRunning {
            Glibc.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
    }

    /// GET a path of the provider; the body as text.
    public func get(_ path: String) throws -> (status: Int, text: String) {
        let reply = try RawHTTPClient(port: port).send(method: "GET", path: path)
        return (reply.status, String(decoding: reply.body, as: UTF8.self))
    }

    /// An ID token the provider makes for a test: `good`, `es256`, `expired`, `wrong-audience`, `wrong-issuer`,
    /// `future`, `forged-signature`, `alg-none`, `hs256-public-key`, `unknown-kid`, `rotated`. `shiftSeconds`
    /// moves its `iat` and `exp` (for a server whose clock the test moved on).
    public func mint(_ variant: String, audience: String, subject: String = "app-user-1", shiftSeconds: Int64 = 0) throws -> String {
        let reply = try get("/test/mint?variant=\(variant)&aud=\(audience)&sub=\(subject)&shift=\(shiftSeconds)")
        guard reply.status == 200 else { throw HarnessError("mint \(variant): \(reply.status) \(reply.text)") }
        return reply.text
    }

    /// How many requests each path of the provider got.
    public func counts() throws -> [String: Int] {
        let json = try JSON.parse(try get("/test/count").text)
        return (json.objectValue ?? [:]).compactMapValues { $0.intValue.map(Int.init) }
    }
}
