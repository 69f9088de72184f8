// Condensing: what an overflowing thread drops and keeps (Threads/Conversation.swift).
import Foundation
import Testing
@testable import WispCore

@Suite struct Condensing {
    @Test func overflowDropsOldestTurnsKeepsInstructionsAndSetsCondensed() async throws {
        let probe = Probe()
        // 60 tokens: instructions (5) + a few turns of ~10 tokens each.
        let registry = ThreadRegistry(backend: ProbeBackend(contextSize: 60, probe: probe))
        var last: Conversation.Outcome?
        var sawCondensed = false
        for i in 1...10 {
            let r = try await call(registry, "t", "turn number \(i) padding", instructions: i == 1 ? "be brief, friend" : nil)
            last = r.outcome
            if r.outcome.condensed {
                sawCondensed = true
                #expect(r.outcome.dropped >= 1)
                // N counts only the turns kept, this one included.
                #expect(r.outcome.text.hasPrefix("echo \(r.outcome.turns): "))
                #expect(r.outcome.turns < i)
            } else {
                #expect(r.outcome.text.hasPrefix("echo \(i): ") || sawCondensed)
            }
        }
        #expect(sawCondensed)
        #expect(last!.turns < 10)
        // Every rebuild kept the instructions first.
        let builds = probe.builds.withLock { $0 }
        #expect(builds.count > 1)
        #expect(builds.allSatisfy { $0.instructions == "be brief, friend" })
        // Kept the most turns that fit: one more would overflow (60 tokens).
        let thread = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let history = await thread.thread.history
        let used = estimatedTokens("be brief, friend") + history.reduce(0) { $0 + $1.tokens }
        #expect(used <= 60)
        _ = try await thread.thread.respond(thread.ticket, prompt: "x", settings: .init(), onPartial: nil)
    }

    @Test func instructionsCountTowardsTheContext() async throws {
        let plain = ThreadRegistry(backend: EchoBackend(contextSize: 80))
        let heavy = ThreadRegistry(backend: EchoBackend(contextSize: 80))
        var plainFirst = 0, heavyFirst = 0
        for i in 1...12 {
            let p = try await call(plain, "t", "turn \(i) with some padding")
            let h = try await call(heavy, "t", "turn \(i) with some padding", instructions: i == 1 ? String(repeating: "i", count: 120) : nil)
            if p.outcome.condensed && plainFirst == 0 { plainFirst = i }
            if h.outcome.condensed && heavyFirst == 0 { heavyFirst = i }
        }
        #expect(heavyFirst > 0 && plainFirst > 0)
        #expect(heavyFirst < plainFirst)
    }

    @Test func preflightCountsTheWholeRequestWhereTheBackendCan() async throws {
        // The same echo model, once counted whole with a template's markup around every message:
        // the pre-flight drops turns before the model would have to report an overflow.
        let plain = ThreadRegistry(backend: EchoBackend(contextSize: 200))
        let templated = ThreadRegistry(backend: TemplateBackend(echo: EchoBackend(contextSize: 200), markup: 8))
        var plainFirst = 0, templatedFirst = 0
        for i in 1...14 {
            let p = try await call(plain, "t", "turn \(i) with some padding here")
            let t = try await call(templated, "t", "turn \(i) with some padding here")
            if p.outcome.condensed && plainFirst == 0 { plainFirst = i }
            if t.outcome.condensed && templatedFirst == 0 { templatedFirst = i }
        }
        #expect(templatedFirst > 0 && plainFirst > 0)
        #expect(templatedFirst < plainFirst)
        // What the last call kept fit, counted whole, beside the reply reserve (a quarter of 200).
        let last = try await templated.accept(threadID: "t", instructions: nil, tools: nil)
        let history = await last.thread.history
        _ = try await last.thread.respond(last.ticket, prompt: "x", settings: .init(), onPartial: nil)
        let whole = history.dropLast().reduce(0) { $0 + $1.tokens + 16 } + estimatedTokens(history.last!.prompt) + 8
        #expect(whole + 50 <= 200)
    }

    @Test func promptThatCannotFitIsAnUnrecoverableOverflowAndHistoryIsUnchanged() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(contextSize: 50))
        try await call(registry, "t", "small")
        do {
            try await call(registry, "t", String(repeating: "y", count: 400))
            Issue.record("must overflow")
        } catch let e as WispError {
            #expect(e.code == .contextOverflow)
            // The ADR's advice first; a shorter prompt or instructions only after it.
            #expect(e.message.hasPrefix("Close this thread (close_thread) and start another"), "\(e.message)")
            #expect(e.message.contains("Shorten the prompt (or the new thread's instructions)"))
        }
        #expect(try await call(registry, "t", "still here").outcome.text == "echo 2: still here")
    }

    /// On a brand-new thread there is nothing to close: the advice is to shorten the prompt.
    @Test func aPromptTooBigForANewThreadDoesNotAdviseClosingIt() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(contextSize: 50))
        do {
            try await call(registry, "new", String(repeating: "y", count: 400))
            Issue.record("must overflow")
        } catch let e as WispError {
            #expect(e.code == .contextOverflow)
            #expect(!e.message.contains("close_thread") && !e.message.contains("Close this thread"), "\(e.message)")
            #expect(e.message.hasPrefix("the prompt does not fit in the model's 50-token context"), "\(e.message)")
            #expect(e.message.contains("Shorten the prompt"))
        }
        #expect(await registry.snapshot().isEmpty)
    }

    /// A prompt that fits with a reply that does not (echo's reply repeats the prompt) is not
    /// reported as a prompt that does not fit, on a new thread or an old one.
    @Test func aReplyTooLongForTheContextIsNotCalledAPromptThatDoesNotFit() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(contextSize: 100))
        try await call(registry, "old", "small")
        for id in ["new", "old"] {
            do {
                try await call(registry, id, String(repeating: "y", count: 300))  // 75 of 100 tokens, its echo 77 more
                Issue.record("must overflow")
            } catch let e as WispError {
                #expect(e.code == .contextOverflow)
                #expect(e.message.hasPrefix("the reply did not fit in the model's 100-token context: the prompt and instructions take 75 tokens of it"), "\(e.message)")
                #expect(!e.message.contains("prompt does not fit") && !e.message.contains("close_thread"), "\(e.message)")
                #expect(e.message.contains("max_output_tokens"))
                #expect(e.message.contains("every earlier turn of this thread dropped") == (id == "old"), "\(e.message)")
            }
        }
        #expect(try await call(registry, "old", "still here").outcome.text == "echo 2: still here")
    }

    @Test func preflightTrimsWhereTheBackendCounts() async throws {
        let probe = Probe()
        // With counting, the reserve (a quarter of the context) makes room before the model is asked.
        let registry = ThreadRegistry(backend: ProbeBackend(contextSize: 100, counts: true, probe: probe))
        var condensedAt = 0
        for i in 1...12 {
            let r = try await call(registry, "t", "turn \(i) with padding here")
            if r.outcome.condensed && condensedAt == 0 { condensedAt = i }
        }
        #expect(condensedAt > 0)
        // Pre-flight dropping means the model never had to report an overflow: every session
        // build after the first came from a pre-flight trim, one per condensed call at most.
        #expect(probe.prompts.count == 12)
    }
}

/// Echo, counted as a chat template would count it: `markup` tokens around every message.
struct TemplateBackend: ModelBackend {
    let echo: EchoBackend
    let markup: Int
    var name: String { "template" }
    var model: String { "template" }
    func availability() async -> Availability { .ready }
    func contextSize() async -> Int { await echo.contextSize() }
    func tokenCount(_ text: String) async throws -> Int? { estimatedTokens(text) }
    func promptTokens(instructions: String?, tools: [ModelTool], history: ArraySlice<Turn>, prompt: String,
                      settings: GenerationSettings) async throws -> Int? {
        history.reduce(0) { $0 + $1.tokens + 2 * markup } + estimatedTokens(prompt) + markup
            + (instructions.map { estimatedTokens($0) + markup } ?? 0)
    }
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        echo.makeSession(instructions: instructions, tools: tools, history: history)
    }
}

/// A turn's `tokens` that came from outside the core (a stored thread, a server's count) at the
/// top of `Int`'s range: the sums over the history saturate, so the turn is dropped to make
/// room rather than the core trapping, in the counted pre-flight and in echo's own sum.
@Suite struct HugeTurnCounts {
    @Test(arguments: [Int.max, Int(Int32.max), -Int.max])
    func aHistoryWithAnAbsurdCountIsCondensedNotTrapped(_ tokens: Int) async throws {
        let history = [Turn(prompt: "old", response: "old reply", tokens: tokens), Turn(prompt: "recent", response: "ok")]
        for counts in [false, true] {
            let backend = ProbeBackend(contextSize: 4096, counts: counts)
            let conversation = Conversation(backend: backend, instructions: nil, tools: [], history: history)
            let outcome = conversation.commit(try await conversation.respond(to: "next", settings: .init(), onPartial: nil))
            #expect(outcome.text.hasPrefix("echo "), "counts \(counts)")
            if tokens > 4096 {
                #expect(outcome.condensed && conversation.history.first?.prompt == "recent", "counts \(counts), tokens \(tokens)")
            }
        }
    }
}
