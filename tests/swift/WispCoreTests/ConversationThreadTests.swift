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
        let events = probe.events.withLock { $0 }
        let expected = (0..<5).flatMap { i -> [Probe.Event] in [.enter("!sleep 60 call\(i)"), .exit("!sleep 60 call\(i)")] }
        #expect(events == expected, "calls on one thread overlapped or ran out of order")
    }

    /// Eight calls on eight threads are all inside the backend at once: each meets the other seven.
    @Test func differentThreadsOverlap() async throws {
        let probe = Probe(barrier: Barrier(parties: 8))
        let registry = ThreadRegistry(backend: ProbeBackend(probe: probe))
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<8 { group.addTask { try await call(registry, "t\(i)", "x") } }
            try await group.waitForAll()
        }
        #expect(probe.met.withLock { $0 } == Array(repeating: true, count: 8), "the calls did not overlap")
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
        let probe = Probe()
        let registry = ThreadRegistry(backend: ProbeBackend(probe: probe))
        try await call(registry, "t", "first")
        // Far longer than any test run: a cancel that did not reach the model would be seen.
        let slow = Task { try await call(registry, "t", "!sleep 600000 never") }
        while !probe.events.withLock({ $0.contains(.enter("!sleep 600000 never")) }) { await Task.yield() }
        slow.cancel()
        do {
            _ = try await slow.value
            Issue.record("a cancelled call must throw")
        } catch let e as WispError {
            #expect(e.code == .cancelled)
        }
        let next = try await call(registry, "t", "second")
        #expect(next.outcome.text == "echo 2: second")
        #expect(next.outcome.turns == 2)
    }

    @Test func cancelWhileWaitingLeavesTheLineAndOthersKeepOrder() async throws {
        let gate = Gate()
        let registry = ThreadRegistry(backend: GateBackend(gate: gate))
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let b = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let c = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let ta = Task { try await a.thread.respond(a.ticket, prompt: "gate a", settings: .init(), onPartial: nil) }
        let tb = Task { try await b.thread.respond(b.ticket, prompt: "b", settings: .init(), onPartial: nil) }
        let tc = Task { try await c.thread.respond(c.ticket, prompt: "c", settings: .init(), onPartial: nil) }
        // a holds the thread until the gate opens, so b is still waiting for its turn when cancelled.
        await gate.waitUntilEntered()
        tb.cancel()
        await #expect(throws: WispError.self) { try await tb.value }
        gate.open()
        #expect(try await ta.value.text == "echo 1: gate a")
        #expect(try await tc.value.text == "echo 2: c")
        #expect(await a.thread.pending == 0)
    }

    /// The call's deadline ends its wait for its turn: it never runs, and the next call's turn comes.
    @Test func aCallOutOfTimeWhileWaitingLeavesTheLine() async throws {
        let gate = Gate()
        let registry = ThreadRegistry(backend: GateBackend(gate: gate))
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let b = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let c = try await registry.accept(threadID: "t", instructions: nil, tools: nil)
        let ta = Task { try await a.thread.respond(a.ticket, prompt: "gate a", settings: .init(), onPartial: nil) }
        await gate.waitUntilEntered()
        let tb = Task {
            try await b.thread.respond(b.ticket, prompt: "b", settings: .init(), onPartial: nil,
                                       deadline: monotonicSeconds() + 0.05) { true }
        }
        let tc = Task { try await c.thread.respond(c.ticket, prompt: "c", settings: .init(), onPartial: nil) }
        await #expect(throws: WispError.timedOutWhileWaiting) { try await tb.value }
        gate.open()
        #expect(try await ta.value.text == "echo 1: gate a")
        #expect(try await tc.value.text == "echo 2: c")
        #expect(await a.thread.pending == 0)
    }
}
