import Foundation
import Testing
@testable import WispCore

@Suite struct Concurrency {
    @Test func oneThreadRunsCallsOneAtATimeInArrivalOrder() async throws {
        let probe = Probe()
        let registry = ThreadRegistry(backend: ProbeBackend(probe: probe))
        // Accept in a known order (as the pipe server does), then let the calls race.
        var accepted: [ThreadRegistry.Acceptance] = []
        for _ in 0..<5 { accepted.append(try await registry.accept(threadID: "t", instructions: nil, tools: nil)) }
        let texts = try await withThrowingTaskGroup(of: (Int, String).self) { group in
            for (i, a) in accepted.enumerated().reversed() {
                group.addTask {
                    let o = try await a.thread.respond(a.ticket, prompt: "!sleep 60 call\(i)", settings: .init(), onPartial: nil)
                    return (i, o.text)
                }
            }
            var out: [Int: String] = [:]
            for try await (i, t) in group { out[i] = t }
            return out
        }
        for i in 0..<5 { #expect(texts[i] == "echo \(i + 1): !sleep 60 call\(i)") }
        let spans = probe.spans.withLock { $0 }
        #expect(spans.map(\.prompt) == (0..<5).map { "!sleep 60 call\($0)" })
        for (a, b) in zip(spans, spans.dropFirst()) { #expect(a.end <= b.start, "calls on one thread overlapped") }
    }

    @Test func differentThreadsOverlap() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let clock = ContinuousClock()
        let elapsed = try await clock.measure {
            try await withThrowingTaskGroup(of: Void.self) { group in
                for i in 0..<8 { group.addTask { try await call(registry, "t\(i)", "!sleep 300 x") } }
                try await group.waitForAll()
            }
        }
        // Serialised would take 2.4 s; overlapped is about 0.3 s. The margin is generous on purpose.
        #expect(seconds(elapsed) < 1.2)
    }

    @Test func queueLimitGivesBusy() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(), maxQueue: 2)
        let running = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let w1 = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let w2 = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        do {
            _ = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
            Issue.record("a third waiting call must be refused")
        } catch {
            #expect(error.code == .busy)
        }
        // Another thread is not affected.
        #expect(try await call(registry, "other", "hi").outcome.text == "echo 1: hi")
        for a in [running, w1, w2] {
            _ = try await a.thread.respond(a.ticket, prompt: "x", settings: .init(), onPartial: nil)
            await registry.finished(a, committed: true)
        }
        #expect(try await call(registry, "t", "after").outcome.text == "echo 4: after")
    }

    @Test func cancelMidCallLeavesThreadUsableAndHistoryUnchanged() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        try await call(registry, "t", "first")
        let clock = ContinuousClock()
        let start = clock.now
        let slow = Task { try await call(registry, "t", "!sleep 5000 never") }
        try await Task.sleep(for: .milliseconds(100))
        slow.cancel()
        do {
            _ = try await slow.value
            Issue.record("a cancelled call must throw")
        } catch let e as WispError {
            #expect(e.code == .cancelled)
        }
        #expect(seconds(clock.now - start) < 2)
        let next = try await call(registry, "t", "second")
        #expect(next.outcome.text == "echo 2: second")
        #expect(next.outcome.turns == 2)
    }

    @Test func cancelWhileWaitingLeavesTheLineAndOthersKeepOrder() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let b = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let c = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let ta = Task { try await a.thread.respond(a.ticket, prompt: "!sleep 300 a", settings: .init(), onPartial: nil) }
        let tb = Task { try await b.thread.respond(b.ticket, prompt: "b", settings: .init(), onPartial: nil) }
        let tc = Task { try await c.thread.respond(c.ticket, prompt: "c", settings: .init(), onPartial: nil) }
        try await Task.sleep(for: .milliseconds(50))
        tb.cancel()
        await #expect(throws: WispError.self) { try await tb.value }
        #expect(try await ta.value.text == "echo 1: !sleep 300 a")
        #expect(try await tc.value.text == "echo 2: c")
        #expect(await a.thread.pending == 0)
    }
}

@Suite struct Condensing {
    @Test func overflowDropsOldestTurnsKeepsInstructionsAndSetsCondensed() async throws {
        let probe = Probe()
        // 60 tokens: instructions (5) + a few turns of ~10 tokens each.
        let registry = ThreadRegistry(backend: ProbeBackend(contextSize: 60, probe: probe))
        var last: Agent.Outcome?
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
        let spans = probe.spans.withLock { $0.count }
        #expect(spans == 12)
    }
}

/// A backend that takes its time to say whether it is available (an endpoint that does not answer).
struct SlowToAnswerBackend: ModelBackend {
    let name = "slow"
    let model = "slow"
    let echo = EchoBackend()
    func availability() async -> Availability {
        try? await Task.sleep(for: .seconds(2))
        return .ready
    }
    func contextSize() async -> Int { 4096 }
    func tokenCount(_ text: String) async throws -> Int? { nil }
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        echo.makeSession(instructions: instructions, tools: tools, history: history)
    }
}

@Suite struct Dispatcher {
    @Test func aSlowStatusDoesNotHoldUpOtherRequests() async throws {
        let backend = SlowToAnswerBackend()
        let frames = Probe()
        let server = PipeServer(registry: ThreadRegistry(backend: backend), backend: backend, log: Log(level: .error)) { bytes in
            frames.spans.withLock { $0.append(.init(prompt: String(decoding: bytes.dropFirst(4), as: UTF8.self), start: .now, end: .now)) }
        }
        let clock = ContinuousClock()
        let start = clock.now
        await server.handle(.status(Status(id: 1)))
        await server.handle(.closeThread(CloseThread(id: 2, thread_id: "t")))
        #expect(seconds(clock.now - start) < 1, "the dispatcher waited for status")
        try await Task.sleep(for: .seconds(3))
        let replies = frames.spans.withLock { $0.map(\.prompt) }
        #expect(replies.count == 2)
        #expect(replies.first?.contains("\"closed\":false") == true)
        #expect(replies.last?.contains("\"backend\":\"slow\"") == true)
    }
}
