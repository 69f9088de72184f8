// Framing and message encoding: the pipe's bytes (WispInfrastructure's Pipe/Frame.swift, Pipe/Messages.swift).
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

@Suite struct Frames {
    let requests: [Request] = [
        Request(Respond(id: 1, prompt: "héllo 🙂", thread_id: "t", instructions: "i", tools: ["read_file"],
                         options: RespondOptions(temperature: 0.5, max_output_tokens: 10, timeout_s: 2.5), progress: true)),
        Request(Respond(id: 2, prompt: "bare")),
        Request(CloseThread(id: 3, thread_id: "t")),
        Request(Cancel(id: 4, request: 1)),
        Request(Status(id: 5)),
    ]

    func stream() throws -> [UInt8] {
        try requests.flatMap { try Frame.encodeWithJSONEncoder($0) }
    }

    func decodeAll(_ chunks: [ArraySlice<UInt8>]) throws -> [Request] {
        var decoder = FrameDecoder()
        var out: [Request] = []
        for chunk in chunks {
            for payload in try decoder.feed(chunk) { out.append(try JSONDecoder().request(from: Data(payload))) }
        }
        try decoder.finish()
        return out
    }

    @Test func roundTrip() throws {
        #expect(try decodeAll([stream()[...]]) == requests)
    }

    @Test func anySplitDecodesTheSame() throws {
        let bytes = try stream()
        var rng = SeededGenerator()
        for _ in 0..<300 {
            var chunks: [ArraySlice<UInt8>] = []
            var i = 0
            while i < bytes.count {
                let n = Int.random(in: 1...9, using: &rng)
                chunks.append(bytes[i..<min(bytes.count, i + n)])
                i += n
            }
            #expect(try decodeAll(chunks) == requests, "\(rng)")  // the chunks are not shown: the seed replays them
        }
        // Byte by byte, too.
        #expect(try decodeAll(bytes.indices.map { bytes[$0...$0] }) == requests)
    }

    @Test func truncatedPayload() throws {
        var d = FrameDecoder()
        #expect(try d.feed(Array(try Frame.encodeWithJSONEncoder(Status(id: 1)).dropLast(3))).isEmpty)
        #expect(throws: FrameError.self) { try d.finish() }
    }

    @Test(arguments: [
        "not json",
        "{\"op\": \"respond\", \"id\": 1",
        "{\"op\": \"dance\", \"id\": 1}",
        "{\"op\": \"respond\", \"id\": 1}",
        "{\"op\": \"respond\", \"id\": \"one\", \"prompt\": \"x\"}",
        "{\"op\": \"respond\", \"id\": 1, \"prompt\": 5}",
        "{\"op\": \"respond\", \"id\": 1, \"prompt\": \"x\", \"tools\": \"read_file\"}",
        "{\"op\": \"respond\", \"id\": 1, \"prompt\": \"x\", \"options\": {\"temperature\": \"hot\"}}",
        "{\"op\": \"cancel\", \"id\": 1, \"request\": null}",
        "[1, 2, 3]",
        "\"respond\"",
        "",
    ])
    func malformedPayloadsAreErrorsNotCrashes(_ payload: String) throws {
        var d = FrameDecoder()
        let frames = try d.feed(Frame.encode(payload: Array(payload.utf8)))
        #expect(frames.count == 1)
        let frame = try #require(frames.first)
        #expect(throws: (any Error).self) { try JSONDecoder().request(from: Data(frame)) }
    }

    @Test func repliesEncodeAsTheProtocolSays() throws {
        let ok = try JSONSerialization.jsonObject(with: JSONEncoder().encode(Reply.success(7, CloseThreadResult(thread_id: "t", closed: true)))) as! [String: Any]
        #expect(ok["id"] as? Int == 7 && ok["ok"] as? Bool == true && (ok["result"] as? [String: Any])?["closed"] as? Bool == true)
        #expect(ok["event"] as? String == "reply" && (ok["result"] as? [String: Any])?["op"] as? String == "close_thread")
        #expect(ok["error"] == nil)
        let bad = try JSONSerialization.jsonObject(with: JSONEncoder().encode(ErrorReply.failure(8, WispError(.busy, "full")))) as! [String: Any]
        #expect(bad["ok"] as? Bool == false && (bad["error"] as? [String: Any])?["code"] as? String == "busy")
        #expect(bad["event"] as? String == "reply" && bad["result"] == nil)
        let ready = try JSONSerialization.jsonObject(with: JSONEncoder().encode(Ready(backend: "echo", model: "echo", pid: 1, version: "1.2.3"))) as! [String: Any]
        #expect(ready["id"] as? Int == 0 && ready["event"] as? String == "ready" && ready["protocol"] as? Int == 2)
        #expect(ready["version"] as? String == "1.2.3")
    }
}
