import Foundation
import LatticeAPI
import LatticeCore
@testable import LatticeServer
import LatticeSync
import Testing

/// The client reads the server's error answers with the same `ServerErrorCode` the server writes them with.
@Suite struct ServerClientTests {
    /// Answers every request with one fixed response.
    final class Fixed: BlockingSyncTransport, Sendable {
        let response: TransportResponse
        init(_ response: TransportResponse) { self.response = response }
        func sendBlocking(_ request: TransportRequest, timeout: TimeInterval) throws -> TransportResponse { response }
    }

    private func failure(_ response: TransportResponse) async throws -> ServerError {
        var client = ServerClient(transport: Fixed(response))
        client.maximumAttempts = 1
        client.sleep = { _ in }
        do {
            _ = try await client.call("private", "zones/list", .object([:]), token: "t")
        } catch let error as ServerError {
            return error
        }
        throw HarnessFailure("the call succeeded")
    }

    struct HarnessFailure: Error, CustomStringConvertible {
        let description: String
        init(_ description: String) { self.description = description }
    }

    @Test(arguments: ServerErrorCode.allCases)
    func everyServerAnswerParsesToItsCode(_ code: ServerErrorCode) async throws {
        let answer = ServiceError(code, "reason for \(code.rawValue)").response
        let headers = Dictionary(answer.headers.map { ($0.name.lowercased(), $0.value) }, uniquingKeysWith: { $1 })
        let error = try await failure(TransportResponse(status: answer.status, headers: headers, body: answer.body))
        #expect(error.serverErrorCode == code)
        #expect(error.code == code.rawValue)
        #expect(error.status == code.httpStatus)
        #expect(error.reason == "reason for \(code.rawValue)")
    }

    @Test func unknownCodesAndBodiesWithoutOneHaveNoTaxonomyCode() async throws {
        let unknown = try await failure(TransportResponse(status: 418, headers: [:],
                                                    body: Array(#"{"serverErrorCode":"TEAPOT","reason":"short"}"#.utf8)))
        #expect(unknown.code == "TEAPOT" && unknown.serverErrorCode == nil)
        let bare = try await failure(TransportResponse(status: 502, headers: [:], body: Array("Bad Gateway".utf8)))
        #expect(bare.code == "HTTP_502" && bare.serverErrorCode == nil)
    }
}
