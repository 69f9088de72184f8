// The request reader (Pipe/RequestReader.swift): stdin's bytes to requests, rejections that
// name the field at fault, and the protocol errors that end the core.
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

@Suite struct RequestReaderTests {
    func frame(_ json: String) -> [UInt8] { Frame.encode(payload: Array(json.utf8)) }

    @Test func requestsComeOutWhateverTheSplit() throws {
        let requests: [Request] = [Request(Respond(id: 1, prompt: "héllo 🙂", thread_id: "t")), Request(Ping(id: 2)),
                                   Request(Cancel(id: 3, request: 1))]
        let bytes = try requests.flatMap { try Frame.encodeWithJSONEncoder($0) }
        for size in [1, 2, 3, 7, bytes.count] {
            var reader = RequestReader()
            var items: [RequestReader.Item] = []
            var i = 0
            while i < bytes.count {
                items += try reader.feed(bytes[i..<min(bytes.count, i + size)])
                i += size
            }
            try reader.finish()
            #expect(items == requests.map { .request($0) }, "chunks of \(size) bytes")
        }
    }

    @Test(arguments: [
        (#"{"op":"respond","id":3,"prompt":5}"#, 3, "field 'prompt': expected a string, found a number"),
        (#"{"op":"respond","id":4}"#, 4, "field 'prompt' is missing"),
        (#"{"op":"respond","id":5,"prompt":"x","options":{"temperature":"hot"}}"#, 5, "field 'options.temperature': expected a number, found a string"),
        (#"{"op":"cancel","id":6,"request":null}"#, 6, "field 'request': expected a number, found null"),
    ])
    func aFrameWithAnIdThatFitsNoOpIsRejectedNamingTheField(_ json: String, _ id: Int, _ message: String) throws {
        var reader = RequestReader()
        #expect(try reader.feed(frame(json)) == [.rejected(id: id, message: message)])
    }

    @Test func anUnknownOpIsRejectedAtItsField() throws {
        var reader = RequestReader()
        let items = try reader.feed(frame(#"{"op":"dance","id":7}"#))
        guard case .rejected(7, let message)? = items.first, items.count == 1 else {
            Issue.record("expected one rejection of request 7, got \(items)")
            return
        }
        #expect(message.hasPrefix("field 'op': "))
    }

    @Test(arguments: ["not json", #"{"op":"respond","prompt":"x"}"#, #"{"op":"respond","id":0}"#, #"{"op":"respond","id":-2}"#,
                      #"{"op":"ping","id":"one"}"#, "[1, 2, 3]", ""])
    func aFrameThatIsNoRequestAndHasNoPositiveIntegerIdIsAProtocolError(_ json: String) {
        var reader = RequestReader()
        #expect(throws: PipeProtocolError("a frame of \(json.utf8.count) bytes is not a JSON request with an integer id")) {
            _ = try reader.feed(frame(json))
        }
    }

    @Test func aFrameOverTheLimitIsAProtocolErrorBeforeItsPayloadArrives() {
        var reader = RequestReader(maxFrameBytes: 16)
        #expect(throws: PipeProtocolError(FrameError.tooLarge(length: 17, limit: 16).description)) {
            _ = try reader.feed([0, 0, 0, 17])
        }
    }

    @Test func theInputEndingInsideAFrameIsAProtocolError() throws {
        var reader = RequestReader()
        let bytes = frame(#"{"op":"ping","id":1}"#)
        #expect(try reader.feed(bytes.dropLast(2)).isEmpty)
        #expect(throws: PipeProtocolError(FrameError.truncated(have: bytes.count - 2, need: bytes.count).description)) {
            try reader.finish()
        }
        #expect(try reader.feed(bytes.suffix(2)) == [.request(Request(Ping(id: 1)))])
        try reader.finish()
    }
}
