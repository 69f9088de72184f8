// What a call's Progress frames carry (Pipe/ProgressFrames.swift): the answer's tail in code
// points and its length, never the whole answer; the first partial is always sent, and a
// stage passes through whatever the interval.
import Testing
@testable import WispCore
import WispInfrastructure

@Suite struct ProgressFramesTests {
    @Test func aFrameCarriesTheTailInCodePointsAndTheLength() {
        // Two- and four-byte scalars, and a combining mark that a cut by code points may split.
        let answer = String(repeating: "aé🙂e\u{301} ", count: 1000)
        let p = ProgressFrames.frame(id: 3, PartialReply(text: answer, tokens: 9))
        let scalars = Array(answer.unicodeScalars)
        #expect(p.chars == scalars.count)
        #expect(Array(p.text.unicodeScalars) == Array(scalars.suffix(ProgressFrames.previewCodePoints)))
        #expect(p.tokens == 9 && p.id == 3)
        let short = ProgressFrames.frame(id: 3, PartialReply(text: "hé", tokens: 1))
        #expect(short.text == "hé" && short.chars == 2)
    }

    @Test func theFirstPartialIsSentAndAStageAlways() {
        let sent = Locked<[[UInt8]]>([])
        let handler = ProgressFrames(id: 1) { frame in sent.withLock { $0.append(frame) } }.handler
        handler(PartialReply(waiting: .prompt(tokens: 5)))
        handler(PartialReply(text: "x", tokens: 1))
        handler(PartialReply(waiting: .slot))
        let frames = sent.withLock { $0 }
        #expect(frames.count == 3)
        #expect(frames[1] == Frame.encode(Progress(id: 1, text: "x", tokens: 1, chars: 1)))
    }
}

extension ProgressFramesTests {
    @Test func flushSendsOnlyAPartialTheIntervalHeldBack() {
        let sent = Locked<[[UInt8]]>([])
        let frames = ProgressFrames(id: 2) { frame in sent.withLock { $0.append(frame) } }
        frames.flush(answer: "z")  // nothing held: nothing sent
        frames.handler(PartialReply(text: "a", tokens: 1))
        #expect(sent.withLock { $0.count } == 1)
        frames.flush(answer: "a")  // still nothing held: the one partial went at once
        // A second partial is either sent at once (the interval passed) or held until the flush:
        // either way the last frame is the newest partial, sent once.
        frames.handler(PartialReply(text: "ab", tokens: 2))
        frames.flush(answer: "ab")
        frames.flush(answer: "ab")
        let all = sent.withLock { $0 }
        #expect(all.count == 2)
        #expect(all.last == Frame.encode(Progress(id: 2, text: "ab", tokens: 2, chars: 2)))
    }
}
