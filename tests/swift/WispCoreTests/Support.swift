import Foundation
import Synchronization
@testable import WispCore

/// One call through the registry, as the pipe server makes it.
@discardableResult
func call(_ registry: ThreadRegistry, _ threadID: String?, _ prompt: String,
          instructions: String? = nil, tools: [String]? = nil,
          onPartial: PartialHandler? = nil) async throws -> (id: String, outcome: Agent.Outcome, created: Bool) {
    let a = try await registry.accept(threadID: threadID, instructions: instructions, tools: tools)
    do {
        let o = try await a.thread.respond(a.ticket, prompt: prompt, settings: GenerationSettings(), onPartial: onPartial)
        await registry.finished(a, committed: true)
        return (a.thread.id, o, o.created)
    } catch {
        await registry.finished(a, committed: false)
        throw error
    }
}

/// A call accepted now (so its thread is in flight before anything else happens, however slow
/// the machine) and run in the background.
func startCall(_ registry: ThreadRegistry, _ threadID: String, _ prompt: String) async throws
    -> Task<(id: String, outcome: Agent.Outcome, created: Bool), any Error> {
    let a = try await registry.accept(threadID: threadID, instructions: nil, tools: nil)
    return Task {
        let o = try await a.thread.respond(a.ticket, prompt: prompt, settings: GenerationSettings(), onPartial: nil)
        await registry.finished(a, committed: true)
        return (a.thread.id, o, o.created)
    }
}

/// What a probe session saw: when each call ran, and how each session was built.
final class Probe: Sendable {
    struct Span: Sendable { var prompt: String; var start: ContinuousClock.Instant; var end: ContinuousClock.Instant }
    struct Build: Sendable { var instructions: String?; var historyCount: Int }
    let spans = Mutex<[Span]>([])
    let builds = Mutex<[Build]>([])
}

/// The echo backend, watched: records call spans and session builds; can pretend to count tokens.
struct ProbeBackend: ModelBackend {
    let name = "probe"
    let model = "probe"
    let echo: EchoBackend
    let probe: Probe
    let counts: Bool

    init(contextSize: Int = 4096, counts: Bool = false, probe: Probe = Probe()) {
        self.echo = EchoBackend(contextSize: contextSize)
        self.probe = probe
        self.counts = counts
    }

    func availability() async -> Availability { .ready }
    func contextSize() async -> Int { await echo.contextSize() }
    func tokenCount(_ text: String) async throws -> Int? { counts ? estimatedTokens(text) : nil }
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        probe.builds.withLock { $0.append(.init(instructions: instructions, historyCount: history.count)) }
        return ProbeSession(inner: echo.makeSession(instructions: instructions, tools: tools, history: history), probe: probe)
    }
}

final class ProbeSession: ModelSession {
    let inner: any ModelSession
    let probe: Probe
    init(inner: any ModelSession, probe: Probe) { self.inner = inner; self.probe = probe }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        let start = ContinuousClock.now
        defer { let end = ContinuousClock.now; probe.spans.withLock { $0.append(.init(prompt: prompt, start: start, end: end)) } }
        return try await inner.respond(to: prompt, settings: settings, onPartial: onPartial)
    }
}

func seconds(_ d: Duration) -> Double {
    Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}
