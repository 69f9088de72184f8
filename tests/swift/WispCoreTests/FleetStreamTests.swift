#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Testing
import WispInfrastructure
@testable import WispCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// A model server on 127.0.0.1 whose chat streams `deltas` content deltas and then, when `cut`,
/// closes the connection cleanly (no finish_reason, no `[DONE]`); otherwise it ends the stream
/// whole. `/v1/models` lists "m"; every other path is 404. One request per connection.
final class CutServer: Sendable {
    let port: Int
    private let listener: Int32
    private let script: Locked<(deltas: Int, cut: Bool)>
    private let seen = Locked([String]())

    init(deltas: Int, cut: Bool) throws {
        script = Locked((deltas, cut))
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var size = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { a in
                bind(fd, a, size) == 0 && listen(fd, 16) == 0 && getsockname(fd, a, &size) == 0
            }
        }
        listener = fd
        guard bound else { throw WispError(.internal, "the test server could not listen") }
        port = Int(UInt16(bigEndian: address.sin_port))
        OSThread.detach { [self] in serve() }
    }

    var endpoint: String { "http://127.0.0.1:\(port)/v1" }
    var hostPort: String { "127.0.0.1:\(port)" }
    var chats: Int { seen.withLock { $0.filter { $0 == "/v1/chat/completions" }.count } }

    func play(deltas: Int, cut: Bool) { script.withLock { $0 = (deltas, cut) } }

    private func serve() {
        while true {
            let conn = accept(listener, nil, nil)
            guard conn >= 0 else { return }
            OSThread.detach { [self] in answer(conn) }
        }
    }

    private func answer(_ conn: Int32) {
        defer { close(conn) }
        var request = [UInt8]()
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let n = recv(conn, &buffer, buffer.count, 0)
            guard n > 0 else { return }
            request += buffer[..<n]
            let text = String(decoding: request, as: UTF8.self)
            guard let head = text.range(of: "\r\n\r\n") else { continue }
            let length = text[..<head.lowerBound].split(separator: "\r\n").compactMap { line -> Int? in
                let parts = line.split(separator: ":", maxSplits: 1)
                return parts.count == 2 && parts[0].lowercased() == "content-length"
                    ? Int(parts[1].filter { $0 != " " }) : nil
            }.first ?? 0
            if text.utf8.count - text.utf8.distance(from: text.startIndex, to: head.upperBound) >= length { break }
        }
        let path = String(String(decoding: request, as: UTF8.self).split(separator: " ")[1])
        seen.withLock { $0.append(path) }
        let reply: String
        if path == "/v1/models" {
            let body = #"{"object":"list","data":[{"id":"m","object":"model"}]}"#
            reply = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
                + "Connection: close\r\n\r\n" + body
        } else if path == "/v1/chat/completions" {
            let (deltas, cut) = script.withLock { $0 }
            var events = (0..<deltas).map { #"data: {"choices":[{"index":0,"delta":{"content":"w\#($0) "}}]}"# + "\n\n" }
            if !cut {
                events += [#"data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"# + "\n\n",
                           "data: [DONE]\n\n"]
            }
            reply = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
                + events.joined()
        } else {
            reply = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        }
        let bytes = Array(reply.utf8)
        _ = bytes.withUnsafeBytes { send(conn, $0.baseAddress, $0.count, 0) }
    }

    deinit { close(listener) }
}

/// A stream closed cleanly mid-answer (EOF, no finish_reason, no `[DONE]`) is a failure, as a
/// reset is: the endpoint is down, and the turn goes to the next endpoint when the caller saw
/// none of it; else the call fails naming the cut. With one endpoint the call fails.
@Suite struct FleetStreamTests {
    /// A thread id the hash sends to `first` of the two.
    static func key(for first: CutServer, _ second: CutServer) -> String {
        let names = [first.hostPort, second.hostPort]
        return (0..<64).map { "t\($0)" }.first {
            Rendezvous.order(key: $0, candidates: [0, 1], names: names).first == 0
        }!
    }

    @Test func aCutBeforeAnyTextMovesTheTurnToTheNextEndpoint() async throws {
        let cut = try CutServer(deltas: 0, cut: true), whole = try CutServer(deltas: 3, cut: false)
        let backend = try OpenAIBackend(endpoints: [cut.endpoint, whole.endpoint], model: "m", apiKey: nil,
                                        contextSize: 4096)
        let affinity = SessionAffinity(key: Self.key(for: cut, whole))
        let session = backend.makeSession(instructions: nil, tools: [], history: [], affinity: affinity)
        let answer = try await session.respond(to: "hi", settings: GenerationSettings(), onPartial: nil)
        #expect(answer.text == "w0 w1 w2 " && answer.usage.endpoint == whole.hostPort)
        #expect(cut.chats == 1 && whole.chats == 1)
        let reason = backend.servers[0].health.withLock { $0.down?.reason } ?? ""
        #expect(reason.contains("ended its answer unfinished (no finish_reason after 0 bytes"), "\(reason)")
    }

    @Test func aCutAfterTextTheCallerSawFailsNamingTheCut() async throws {
        let cut = try CutServer(deltas: 2, cut: true), whole = try CutServer(deltas: 3, cut: false)
        let backend = try OpenAIBackend(endpoints: [cut.endpoint, whole.endpoint], model: "m", apiKey: nil,
                                        contextSize: 4096)
        let affinity = SessionAffinity(key: Self.key(for: cut, whole))
        let session = backend.makeSession(instructions: nil, tools: [], history: [], affinity: affinity)
        let seen = Locked("")
        do {
            _ = try await session.respond(to: "hi", settings: GenerationSettings()) { p in seen.withLock { $0 = p.text } }
            Issue.record("a cut answer was taken whole")
        } catch let error as WispError {
            #expect(error.code == .generationFailed && error.message.contains("ended its answer unfinished"))
        }
        #expect(seen.withLock { $0 } == "w0 w1 " && whole.chats == 0)  // never run twice
        #expect(!backend.servers[0].health.withLock { $0.usable })
    }

    @Test func oneEndpointCutFailsTheCall() async throws {
        let cut = try CutServer(deltas: 1, cut: true)
        let backend = try OpenAIBackend(endpoints: [cut.endpoint], model: "m", apiKey: nil, contextSize: 4096)
        let session = backend.makeSession(instructions: nil, tools: [], history: [],
                                          affinity: SessionAffinity(key: "t"))
        await #expect(throws: WispError.self) {
            _ = try await session.respond(to: "hi", settings: GenerationSettings(), onPartial: nil)
        }
        cut.play(deltas: 1, cut: false)
        let again = backend.makeSession(instructions: nil, tools: [], history: [], affinity: SessionAffinity(key: "t"))
        let answer = try await again.respond(to: "hi", settings: GenerationSettings(), onPartial: nil)
        #expect(answer.text == "w0 " && cut.chats == 2)
    }

    /// A turn moves once: failed on its endpoint and on the next, it fails naming those two, not
    /// "every endpoint down" while a third is up (and the third is not tried).
    @Test func aTurnThatFailsTwiceSaysSoWhileAnotherEndpointIsUp() async throws {
        let a = try CutServer(deltas: 0, cut: true), b = try CutServer(deltas: 0, cut: true)
        let c = try CutServer(deltas: 1, cut: false)
        let names = [a.hostPort, b.hostPort, c.hostPort]
        let key = (0..<256).map { "t\($0)" }.first {
            Rendezvous.order(key: $0, candidates: [0, 1, 2], names: names) == [0, 1, 2]
        }!
        let backend = try OpenAIBackend(endpoints: [a.endpoint, b.endpoint, c.endpoint], model: "m", apiKey: nil,
                                        contextSize: 4096)
        let session = backend.makeSession(instructions: nil, tools: [], history: [], affinity: SessionAffinity(key: key))
        do {
            _ = try await session.respond(to: "hi", settings: GenerationSettings(), onPartial: nil)
            Issue.record("the turn was answered")
        } catch let error as WispError {
            #expect(error.code == .modelUnavailable)
            #expect(error.message.contains("on the one it moved to") && error.message.contains(a.hostPort)
                    && error.message.contains(b.hostPort) && !error.message.contains(c.hostPort), "\(error.message)")
        }
        #expect(a.chats == 1 && b.chats == 1 && c.chats == 0)
        let next = backend.makeSession(instructions: nil, tools: [], history: [], affinity: SessionAffinity(key: key))
        let answer = try await next.respond(to: "hi", settings: GenerationSettings(), onPartial: nil)
        #expect(answer.text == "w0 " && answer.usage.endpoint == c.hostPort)
    }
}
