// Shared test harness: calls through the registry, probing and gated backends, the pipe
// server's wire.
import Dispatch
import Foundation
import Synchronization
import Testing
@testable import WispCore
import WispInfrastructure

extension ConversationThread {
    /// Waits for `ticket`'s turn, then answers and commits the turn (`keep` always says yes, so
    /// there is always an outcome).
    func respond(_ ticket: Ticket, prompt: String, files: FileRequest? = nil, settings: GenerationSettings,
                 onPartial: PartialHandler?, rewind: Int = 0) async throws -> Conversation.Outcome {
        try await respond(ticket, prompt: prompt, files: files, settings: settings, onPartial: onPartial, rewind: rewind,
                          keep: { true })!
    }
}

/// Suites whose tests hold workers of the shared blocking pool until a call that needs one is
/// answered: one at a time (`.serialized` reaches the suites nested in it), or each could hold the
/// worker the other's call waits for. The other suites' pool jobs end by themselves.
@Suite(.serialized) enum WholePool {}

extension Frame {
    /// A message as Foundation's `JSONEncoder` writes it: the tests frame shim → core messages so.
    static func encodeWithJSONEncoder<T: Encodable>(_ message: T) throws -> [UInt8] {
        encode(payload: try JSONEncoder().encode(message))
    }

    static func encodeWithJSONEncoder(_ request: Request) throws -> [UInt8] {
        encode(payload: try JSONEncoder().encode(request))
    }
}

/// One call through the registry, as the pipe server makes it.
@discardableResult
func call(_ registry: ThreadRegistry, _ threadID: String?, _ prompt: String,
          instructions: String? = nil, tools: [String]? = nil,
          onPartial: PartialHandler? = nil) async throws -> (id: String, outcome: Conversation.Outcome, created: Bool) {
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
    -> Task<(id: String, outcome: Conversation.Outcome, created: Bool), any Error> {
    let a = try await registry.accept(threadID: threadID, instructions: nil, tools: nil)
    return Task {
        let o = try await a.thread.respond(a.ticket, prompt: prompt, settings: GenerationSettings(), onPartial: nil)
        await registry.finished(a, committed: true)
        return (a.thread.id, o, o.created)
    }
}

/// What a probe session saw: each call's entry and exit in the order they happened (a recorded
/// sequence, not clock readings), and how each session was built. With a `barrier`, every call
/// first meets the others there; what each meeting returned is in `met`.
final class Probe: Sendable {
    enum Event: Sendable, Equatable { case enter(String), exit(String) }
    struct Build: Sendable { var instructions: String?; var historyCount: Int }
    let events = Locked<[Event]>([])
    let builds = Locked<[Build]>([])
    let barrier: Barrier?
    let met = Locked<[Bool]>([])

    init(barrier: Barrier? = nil) { self.barrier = barrier }

    /// The prompts of the calls that finished, in the order they finished.
    var prompts: [String] {
        events.withLock { $0.compactMap { if case .exit(let p) = $0 { p } else { nil } } }
    }
}

/// The echo backend, watched: records call entries and exits and session builds; can pretend
/// to count tokens.
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
        let inner = echo.makeSession(instructions: instructions, tools: tools, history: history)
        return ProbeSession(inner: inner, probe: probe)
    }
}

final class ProbeSession: ModelSession {
    let inner: any ModelSession
    let probe: Probe
    init(inner: any ModelSession, probe: Probe) { self.inner = inner; self.probe = probe }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        probe.events.withLock { $0.append(.enter(prompt)) }
        if let barrier = probe.barrier {
            let met = await barrier.arrive()
            probe.met.withLock { $0.append(met) }
        }
        defer { probe.events.withLock { $0.append(.exit(prompt)) } }
        return try await inner.respond(to: prompt, settings: settings, onPartial: onPartial)
    }
}

/// A meeting point for `parties` calls: each `arrive` waits until all have arrived, so a call
/// that returns `true` was inside at the same time as every other. Overlap is proven by the
/// meeting itself; `within` only bounds how long a failing test (calls that never overlap)
/// waits before it says so.
final class Barrier: Sendable {
    private struct State {
        var arrived = 0
        var next = 0
        var waiting: [Int: CheckedContinuation<Bool, Never>] = [:]
    }
    private let parties: Int
    private let within: Duration
    private let state = Locked(State())

    init(parties: Int, within: Duration = .seconds(60)) {
        self.parties = parties
        self.within = within
    }

    var arrived: Int { state.withLock { $0.arrived } }

    func arrive() async -> Bool {
        let ticket = state.withLock { s -> Int in
            s.next += 1
            return s.next
        }
        let timer = Task { [within] in
            try? await Task.sleep(for: within)
            state.withLock { $0.waiting.removeValue(forKey: ticket) }?.resume(returning: false)
        }
        defer { timer.cancel() }
        return await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            let all = state.withLock { s -> [CheckedContinuation<Bool, Never>]? in
                s.arrived += 1
                s.waiting[ticket] = c
                guard s.arrived >= parties else { return nil }
                defer { s.waiting = [:] }
                return Array(s.waiting.values)
            }
            for w in all ?? [] { w.resume(returning: true) }
        }
    }
}

func seconds(_ d: Duration) -> Double {
    Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18
}

/// What a pipe server wrote, frame by frame, for a test to read back.
final class Wire: Sendable {
    private struct State {
        var frames: [String] = []
        /// Where the reply to each request id sits in `frames`.
        var replies: [Int: Int] = [:]
        /// A test waiting for the reply to an id (woken, not polling: the race tests must not
        /// take the cooperative pool from the timing tests that run beside them).
        /// Each with the wait it belongs to: a finished wait's timer must not end a later one.
        var waiters: [Int: (wait: Int, continuation: CheckedContinuation<Void, Never>)] = [:]
        var waits = 0
    }
    /// `Locked`, not `Mutex`: ThreadSanitizer cannot see a `Mutex` on Linux.
    private let state = Locked(State())

    func send(_ bytes: [UInt8]) {
        let text = String(decoding: bytes.dropFirst(4), as: UTF8.self)
        let o = Wire.object(text)
        let reply = o["event"] as? String == "reply" ? o["id"] as? Int : nil
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            defer { s.frames.append(text) }
            guard let reply, s.replies[reply] == nil else { return nil }
            s.replies[reply] = s.frames.count
            return s.waiters.removeValue(forKey: reply)?.continuation
        }
        waiter?.resume()
    }

    var all: [String] { state.withLock { $0.frames } }

    static func object(_ frame: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(frame.utf8))) as? [String: Any] ?? [:]
    }

    /// Where the reply to request `id` sits in `all`, waiting for it up to `within` (a bound for a
    /// failing test only: the wait ends when the reply comes).
    func replyIndex(_ id: Int, within: Duration = .seconds(60)) async -> Int? {
        if let found = state.withLock({ $0.replies[id] }) { return found }
        let clock = ContinuousClock()
        let deadline = clock.now + within
        let wait = state.withLock { s in
            s.waits += 1
            return s.waits
        }
        let timer = Task {
            try? await Task.sleep(until: deadline, clock: clock)
            state.withLock { s -> CheckedContinuation<Void, Never>? in
                guard s.waiters[id]?.wait == wait else { return nil }
                return s.waiters.removeValue(forKey: id)?.continuation
            }?.resume()
        }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            // A timer that fired before this wait was registered found nothing to end: the
            // deadline, checked here, ends it instead.
            let there = state.withLock { s -> Bool in
                if s.replies[id] != nil || clock.now >= deadline { return true }
                s.waiters[id] = (wait, c)
                return false
            }
            if there { c.resume() }
        }
        timer.cancel()
        return state.withLock { $0.replies[id] }
    }

    /// The reply to request `id`: its `result` when ok, else its `error`, with `ok` alongside.
    func reply(_ id: Int, within: Duration = .seconds(60)) async -> (ok: Bool, body: [String: Any]) {
        guard let i = await replyIndex(id, within: within) else {
            Issue.record("no reply to request \(id)")
            return (false, [:])
        }
        let o = Wire.object(all[i])
        let ok = o["ok"] as? Bool ?? false
        return (ok, (ok ? o["result"] : o["error"]) as? [String: Any] ?? [:])
    }
}

func pipeServer(_ backend: any ModelBackend, capacity: Int = 32) -> (PipeServer, Wire) {
    let wire = Wire()
    let server = PipeServer(registry: ThreadRegistry(backend: backend, capacity: capacity), backend: backend,
                            log: Log(level: .error)) { wire.send($0) }
    return (server, wire)
}

/// Released by the test, not by cancellation: a model that goes on answering after it was told to stop.
final class Gate: Sendable {
    private let state = Locked<(open: Bool, entered: Int, waiters: [CheckedContinuation<Void, Never>])>((false, 0, []))

    var entered: Int { state.withLock { $0.entered } }

    func pass() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let go = state.withLock { s -> Bool in
                s.entered += 1
                if s.open { return true }
                s.waiters.append(c)
                return false
            }
            if go { c.resume() }
        }
    }

    func open() {
        let waiters = state.withLock { s in
            s.open = true
            defer { s.waiters = [] }
            return s.waiters
        }
        for w in waiters { w.resume() }
    }

    func waitUntilEntered(_ n: Int = 1) async {
        while entered < n { try? await Task.sleep(for: .milliseconds(2)) }
    }
}

/// Echo-like replies (`echo N: prompt`), never checking for cancellation; a prompt starting
/// with `gate` first waits for the gate, one starting `nap MS` takes MS milliseconds.
struct GateBackend: ModelBackend {
    let name = "gate"
    let model = "gate"
    let gate: Gate
    func availability() async -> Availability { .ready }
    func contextSize() async -> Int { 4096 }
    func tokenCount(_ text: String) async throws -> Int? { nil }
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        GateSession(gate: gate, turns: history.count)
    }
}

final class GateSession: ModelSession {
    let gate: Gate
    var turns: Int
    init(gate: Gate, turns: Int) { self.gate = gate; self.turns = turns }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        if prompt.hasPrefix("gate") { await gate.pass() }
        if prompt.hasPrefix("nap "), let ms = Int(prompt.split(separator: " ")[1]) {
            // In a task of its own, which the call's cancellation does not reach.
            await Task { try? await Task.sleep(for: .milliseconds(ms)) }.value
        }
        turns += 1
        return Generation(text: "echo \(turns): \(prompt)")
    }
}

/// A model that overflows at a small window like echo, and cannot take a rebuilt transcript
/// (as Apple's model may answer `unsupportedTranscriptContent`).
struct RebuildFailsBackend: ModelBackend {
    let name = "rebuild-fails"
    let model = "rebuild-fails"
    let echo = EchoBackend(contextSize: 60)
    func availability() async -> Availability { .ready }
    func contextSize() async -> Int { 60 }
    func tokenCount(_ text: String) async throws -> Int? { nil }
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        history.isEmpty ? echo.makeSession(instructions: instructions, tools: tools, history: history) : RefusingSession()
    }
}

final class RefusingSession: ModelSession {
    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        throw WispError(.internal, "unsupported transcript content")
    }
}

/// A backend that says whether it is available only once its gate opens (an endpoint that does
/// not answer).
struct SlowToAnswerBackend: ModelBackend {
    let name = "slow"
    let model = "slow"
    let gate: Gate
    let echo = EchoBackend()
    func availability() async -> Availability {
        await gate.pass()
        return .ready
    }
    func contextSize() async -> Int { 4096 }
    func tokenCount(_ text: String) async throws -> Int? { nil }
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        echo.makeSession(instructions: instructions, tools: tools, history: history)
    }
}

/// Whether this test process runs under a sanitizer, which slows code many times over: a time
/// bound then says nothing about the code under test, so the timed tests do not check theirs.
let underSanitizer: Bool = {
    guard let me = dlopen(nil, RTLD_NOW) else { return false }
    defer { dlclose(me) }
    return dlsym(me, "__tsan_init") != nil || dlsym(me, "__asan_init") != nil
}()

/// Runs a blocking call on an OS thread of its own, so it takes no thread from the cooperative pool.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { c in Thread.detachNewThread { c.resume(returning: body()) } }
}

/// The random tests' generator: seeded (WISP_TEST_SEED replays a run: a failure that does not
/// show its input shows the generator, whose description is its seed) and with state of its
/// own. ThreadSanitizer's inout-access check faults on the zero-sized
/// SystemRandomNumberGenerator when a closure captures it.
struct SeededGenerator: RandomNumberGenerator, CustomStringConvertible {
    let seed: UInt64
    private var state: UInt64

    init() {
        let given = ProcessInfo.processInfo.environment["WISP_TEST_SEED"].flatMap { UInt64($0) }
        seed = given ?? UInt64.random(in: 0...UInt64.max)
        state = seed
    }

    /// SplitMix64: one add and three mixes per draw, every 64-bit output reachable.
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    var description: String { "WISP_TEST_SEED=\(seed)" }
}
