import Foundation
import Testing
@testable import WispCore

@Suite struct AttachedFiles {
    @Test func filesJoinTheTurnOnceEvenAfterCondensing() async throws {
        let base = NSTemporaryDirectory() + "wisp-files-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: base) }
        try ("header\n" + String(repeating: "l", count: 500) + "\n").write(toFile: base + "/log.txt", atomically: true, encoding: .utf8)
        let conversation = Conversation(backend: EchoBackend(contextSize: 512), instructions: nil, tools: [])
        for _ in 0..<3 { _ = conversation.commit(try await conversation.respond(to: String(repeating: "p", count: 400), settings: .init(), onPartial: nil)) }
        let files = FileRequest(paths: ["log.txt"], roots: Roots([base]))
        let o = conversation.commit(try await conversation.respond(to: "summarise", files: files, settings: .init(), onPartial: nil))
        #expect(o.condensed)
        #expect(o.text == "echo \(o.turns): summarise\nfile log.txt: header")
        let turn = try #require(conversation.history.last)
        let rendered = "summarise\n\n<file path=\"log.txt\">\nheader\n" + String(repeating: "l", count: 500) + "\n</file>"
        // The turn keeps what the model was given, and counts it once.
        #expect(turn.prompt == rendered)
        #expect(turn.tokens == estimatedTokens(rendered) + estimatedTokens(o.text))
    }

    @Test func aRefusedFileLeavesTheHistoryAsItWas() async throws {
        let conversation = Conversation(backend: EchoBackend(), instructions: nil, tools: [])
        _ = conversation.commit(try await conversation.respond(to: "hi", settings: .init(), onPartial: nil))
        let files = FileRequest(paths: ["../nope"], roots: Roots([NSTemporaryDirectory()]))
        await #expect(throws: WispError.self) { try await conversation.respond(to: "x", files: files, settings: .init(), onPartial: nil) }
        #expect(conversation.history.count == 1)
    }
}
