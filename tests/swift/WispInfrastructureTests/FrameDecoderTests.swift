// Framing on its own (Pipe/Frame.swift): a short header or a frame over the limit is an error
// at its place. Frames of the pipe's messages, any split: WispCoreTests/FrameTests.swift.
import Testing
@testable import WispInfrastructure

@Suite struct FrameDecoderTests {
    @Test func shortHeaderAtEndOfStream() throws {
        var d = FrameDecoder()
        #expect(try d.feed([0, 0]).isEmpty)
        #expect(d.buffered == 2)
        #expect(throws: FrameError.truncated(have: 2, need: 4)) { try d.finish() }
    }

    @Test func lengthOverTheLimit() {
        var d = FrameDecoder(maxBytes: 1024)
        #expect(throws: FrameError.tooLarge(length: 1025, limit: 1024)) { _ = try d.feed([0, 0, 4, 1]) }
        var big = FrameDecoder()
        #expect(throws: FrameError.self) { _ = try big.feed([0xFF, 0xFF, 0xFF, 0xFF]) }
    }
}
