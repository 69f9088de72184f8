// One thread's calls: one at a time, in arrival order; different threads in parallel.
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
