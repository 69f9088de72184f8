// A call's lifecycle through the pipe server: eviction notices, transactional commit (a
// cancelled or timed-out call never keeps its turn), recovery failures, shutdown with a call
// that ignores cancellation, and the client-roots limits.
import Dispatch
import Foundation
import Testing
@testable import WispCore

/// What a pipe server wrote, frame by frame, for a test to read back.
final class Wire: Sendable {
    private struct State {
        var frames: [String] = []
        /// Where the reply to each request id sits in `frames`.
        var replies: [Int: Int] = [:]
        /// A test waiting for the reply to an id (woken, not polling: the race tests must not
        /// take the cooperative pool from the timing tests that run beside them).
        var waiters: [Int: CheckedContinuation<Void, Never>] = [:]
    }
    /// `Locked`, not `Mutex`: ThreadSanitizer cannot see a `Mutex` on Linux.
    private let state = Locked(State())

    func send(_ bytes: [UInt8]) {
        let text = String(decoding: bytes.dropFirst(4), as: UTF8.self)
        let o = Wire.object(text)
        let reply = o["event"] == nil ? o["id"] as? Int : nil
        let waiter = state.withLock { s -> CheckedContinuation<Void, Never>? in
            defer { s.frames.append(text) }
            guard let reply, s.replies[reply] == nil else { return nil }
            s.replies[reply] = s.frames.count
            return s.waiters.removeValue(forKey: reply)
        }
        waiter?.resume()
    }

    var all: [String] { state.withLock { $0.frames } }

    static func object(_ frame: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(frame.utf8))) as? [String: Any] ?? [:]
    }

    /// Where the reply to request `id` sits in `all`, waiting for it up to `within`.
    func replyIndex(_ id: Int, within: Duration = .seconds(10)) async -> Int? {
        if let found = state.withLock({ $0.replies[id] }) { return found }
        let timer = Task {
            try? await Task.sleep(for: within)
            state.withLock { $0.waiters.removeValue(forKey: id) }?.resume()
        }
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let there = state.withLock { s -> Bool in
                if s.replies[id] != nil { return true }
                s.waiters[id] = c
                return false
            }
            if there { c.resume() }
        }
        timer.cancel()
        return state.withLock { $0.replies[id] }
    }

    /// The reply to request `id`: its `result` when ok, else its `error`, with `ok` alongside.
    func reply(_ id: Int, within: Duration = .seconds(10)) async -> (ok: Bool, body: [String: Any]) {
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

/// Runs a blocking call on a thread of its own, so it takes no thread from the cooperative pool.
func onOwnThread<T: Sendable>(_ body: @escaping @Sendable () -> T) async -> T {
    await withCheckedContinuation { c in Thread.detachNewThread { c.resume(returning: body()) } }
}

@Suite struct Eviction {
    @Test func theNoticeComesBeforeTheReplyOfTheCallThatCausedIt() async throws {
        let (server, wire) = pipeServer(EchoBackend(), capacity: 2)
        for (id, thread) in [(1, "a"), (2, "b"), (3, "c")] {
            await server.handle(.respond(Respond(id: id, prompt: "hi", thread_id: thread)))
            _ = await wire.reply(id)
        }
        let frames = wire.all.map(Wire.object)
        let notices = frames.enumerated().filter { $0.element["event"] as? String == "evicted" }
        #expect(notices.map { $0.element["thread_id"] as? String } == ["a"])
        #expect(notices.first.map { $0.element["id"] as? Int } == 0)
        let reply3 = try #require(await wire.replyIndex(3))
        #expect(notices.first.map { $0.offset < reply3 } == true)
        #expect(await !server.registry.contains("a"))
    }
}

@Suite struct Recovery {
    @Test func aRebuildThatFailsAdvisesClosingTheThreadNotABareInternalError() async throws {
        let registry = ThreadRegistry(backend: RebuildFailsBackend())
        var failure: WispError?
        for i in 1...12 {
            do {
                try await call(registry, "t", "turn \(i) with some padding")
            } catch let e as WispError {
                failure = e
                break
            }
        }
        let e = try #require(failure, "the thread never had to be rebuilt")
        #expect(e.code == .contextOverflow)
        #expect(e.message.hasPrefix("Close this thread (close_thread) and start another"), "\(e.message)")
        #expect(e.message.contains("unsupported transcript content"))
        // A failure that is not part of recovery keeps its own code.
        let fresh = ThreadRegistry(backend: RebuildFailsBackend())
        await #expect(throws: WispError(.generationFailed, "echo backend: failed on purpose (!fail generation_failed)")) {
            try await call(fresh, "u", "!fail generation_failed")
        }
    }
}

// Serialized: run side by side, these races took enough of 2 cores to upset the timing tests beside them.
@Suite(.serialized) struct TransactionalCalls {
    /// A creating call cancelled while the next call on its id arrives: the next call must
    /// behave as if the cancelled one never happened.
    @Test func aCancelledCreatingCallLeavesNothingForTheNextCallOnItsID() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        var cancelledCount = 0
        for k in 0..<120 {
            let (a, c, b) = (3 * k + 1, 3 * k + 2, 3 * k + 3)
            let thread = "x\(k)"
            await server.handle(.respond(Respond(id: a, prompt: "!sleep \(k % 3) a", thread_id: thread, instructions: "A's")))
            if k % 4 == 1 { try await Task.sleep(for: .microseconds(Int.random(in: 0...3000))) }
            await server.handle(.cancel(Cancel(id: c, request: a)))
            await server.handle(.respond(Respond(id: b, prompt: "hi", thread_id: thread)))
            let cancel = await wire.reply(c)
            let first = await wire.reply(a)
            let next = await wire.reply(b)
            #expect(next.ok)
            if cancel.body["cancelled"] as? Bool == true {
                cancelledCount += 1
                #expect(!first.ok && first.body["code"] as? String == "cancelled", "trial \(k): \(first.body)")
                #expect(next.body["created"] as? Bool == true, "trial \(k): \(next.body)")
                #expect(next.body["text"] as? String == "echo 1: hi", "trial \(k): \(next.body)")
            } else {
                #expect(first.ok, "trial \(k): a cancel answered false must leave the call's reply alone")
                #expect(next.body["created"] as? Bool == false && next.body["text"] as? String == "echo 2: hi", "trial \(k): \(next.body)")
            }
        }
        #expect(cancelledCount > 60, "the cancels mostly came too late to test anything")
    }

    /// Whenever a cancel lands, including right as the model finishes, the call either keeps its
    /// turn and the cancel says `false`, or is cancelled and keeps nothing: with the echo
    /// backend's cancellable `!sleep`, and with a model that finishes its answer whatever it is told.
    @Test(arguments: [false, true])
    func aCancelledCallOnAnExistingThreadNeverKeepsItsTurn(deaf: Bool) async throws {
        let (server, wire) = pipeServer(deaf ? GateBackend(gate: Gate()) : EchoBackend())
        await server.handle(.respond(Respond(id: 1, prompt: "first", thread_id: "t")))
        #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
        var turns = 1
        var outcomes = (kept: 0, cancelled: 0)
        for k in 0..<150 {
            let (r, c) = (2 * k + 2, 2 * k + 3)
            let ms = k % 4
            let prompt = "\(deaf ? "nap" : "!sleep") \(ms) k\(k)"
            await server.handle(.respond(Respond(id: r, prompt: prompt, thread_id: "t")))
            try await Task.sleep(for: .microseconds(Int.random(in: 0...(ms * 1000 + 1500))))
            await server.handle(.cancel(Cancel(id: c, request: r)))
            let cancel = await wire.reply(c)
            let call = await wire.reply(r)
            if call.ok {
                turns += 1
                outcomes.kept += 1
                #expect(cancel.body["cancelled"] as? Bool == false, "trial \(k): answered and kept, but the cancel said it stopped the call")
                #expect(call.body["text"] as? String == "echo \(turns): \(prompt)", "trial \(k): \(call.body)")
            } else {
                outcomes.cancelled += 1
                #expect(cancel.body["cancelled"] as? Bool == true && call.body["code"] as? String == "cancelled", "trial \(k): \(call.body)")
            }
        }
        await server.handle(.respond(Respond(id: 10_000, prompt: "probe", thread_id: "t")))
        #expect(await wire.reply(10_000).body["text"] as? String == "echo \(turns + 1): probe")
        #expect(outcomes.kept > 0 && outcomes.cancelled > 0, "\(outcomes): the cancels did not land on both sides of the end")
    }

    /// The model answers after the call's time limit (a backend that ignores cancellation, or a
    /// core stopped past the deadline): the turn is not kept.
    @Test func aCallPastItsTimeLimitNeverKeepsItsTurn() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(GateBackend(gate: gate))
        await server.handle(.respond(Respond(id: 1, prompt: "first", thread_id: "t")))
        #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
        await server.handle(.respond(Respond(id: 2, prompt: "gate", thread_id: "t", options: RespondOptions(timeout_s: 0.1))))
        await gate.waitUntilEntered()
        try await Task.sleep(for: .milliseconds(400))
        gate.open()
        let late = await wire.reply(2)
        #expect(!late.ok && late.body["code"] as? String == "timeout", "\(late.body)")
        await server.handle(.respond(Respond(id: 3, prompt: "probe", thread_id: "t")))
        #expect(await wire.reply(3).body["text"] as? String == "echo 2: probe")
    }

    /// The answer is ready after the deadline but before the watchdog (which looks every 50 ms)
    /// has stopped the call, as when a stopped core resumes: the deadline is checked at commit.
    @Test func theDeadlineIsCheckedAtCommitNotOnlyByTheWatchdog() async throws {
        for k in 0..<5 {
            let (server, wire) = pipeServer(EchoBackend())
            await server.handle(.respond(Respond(id: 1, prompt: "first", thread_id: "t")))
            #expect(await wire.reply(1).body["text"] as? String == "echo 1: first")
            await server.handle(.respond(Respond(id: 2, prompt: "!sleep 25 late", thread_id: "t", options: RespondOptions(timeout_s: 0.01))))
            let late = await wire.reply(2)
            #expect(!late.ok && late.body["code"] as? String == "timeout", "trial \(k): \(late.body)")
            await server.handle(.respond(Respond(id: 3, prompt: "probe", thread_id: "t")))
            #expect(await wire.reply(3).body["text"] as? String == "echo 2: probe", "trial \(k)")
        }
    }

    @Test func aCancelThatCameFirstWinsOverAnAnswerThatCameAnyway() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(GateBackend(gate: gate))
        await server.handle(.respond(Respond(id: 1, prompt: "gate", thread_id: "t")))
        await gate.waitUntilEntered()
        await server.handle(.cancel(Cancel(id: 2, request: 1)))
        #expect(await wire.reply(2).body["cancelled"] as? Bool == true)
        gate.open()
        let stopped = await wire.reply(1)
        #expect(!stopped.ok && stopped.body["code"] as? String == "cancelled")
        // The creating call was cancelled: no thread is left, and the id starts afresh.
        #expect(await !server.registry.contains("t"))
        await server.handle(.respond(Respond(id: 3, prompt: "again", thread_id: "t")))
        let again = await wire.reply(3)
        #expect(again.body["created"] as? Bool == true && again.body["text"] as? String == "echo 1: again")
    }
}

@Suite struct Shutdown {
    @Test func stopAllEndsWithinItsGraceEvenWhenACallIgnoresCancellation() async throws {
        let gate = Gate()
        let (server, wire) = pipeServer(GateBackend(gate: gate))
        await server.handle(.respond(Respond(id: 1, prompt: "gate", thread_id: "wedged")))
        await gate.waitUntilEntered()
        let clock = ContinuousClock()
        let start = clock.now
        let ended = await onOwnThread { server.stopAll(grace: .milliseconds(300)) }
        let took = seconds(clock.now - start)
        #expect(!ended)
        #expect(took >= 0.25 && took < 2, "took \(took) s")
        gate.open()
        #expect(await wire.reply(1).body["code"] as? String == "cancelled")
    }

    @Test func stopAllStopsCallsThatListenAndThoseAcceptedAfterIt() async throws {
        let (server, wire) = pipeServer(EchoBackend())
        await server.handle(.respond(Respond(id: 1, prompt: "!sleep 10000 long", thread_id: "t")))
        let clock = ContinuousClock()
        let start = clock.now
        let ended = await onOwnThread { server.stopAll(grace: .seconds(5)) }
        #expect(ended)
        #expect(seconds(clock.now - start) < 2)
        #expect(await wire.reply(1).body["code"] as? String == "cancelled")
        // A request the dispatcher takes after stdin closed starts stopped.
        await server.handle(.respond(Respond(id: 2, prompt: "!sleep 10000 late", thread_id: "u")))
        #expect(await wire.reply(2, within: .seconds(2)).body["code"] as? String == "cancelled")
    }
}

@Suite struct ClientRootLimits {
    @Test func tooManyRootsAreRefusedAtOnceWithTheCap() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let many = (0..<20_000).map { "/nonexistent/root\($0)" }
        let clock = ContinuousClock()
        let start = clock.now
        do {
            _ = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: many)
            Issue.record("20,000 roots must be refused")
        } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message.contains("20000 roots") && error.message.contains("at most \(ThreadRegistry.maxRoots)"), "\(error.message)")
        }
        #expect(seconds(clock.now - start) < 0.5)
        #expect(await !registry.contains("t"))
        // The cap itself is allowed.
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: Array(many.prefix(ThreadRegistry.maxRoots)))
        await registry.finished(a, committed: false)
    }

    @Test(arguments: ["relative/dir", "", "/tmp/x\u{0}y", "~/x"])
    func aRootThatIsNotAnAbsolutePathIsRefused(_ root: String) async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        do {
            _ = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: ["/tmp", root])
            Issue.record("\(root.debugDescription) must be refused")
        } catch {
            #expect(error.code == .invalidArgument && error.message.contains("must be an absolute path without NUL bytes"), "\(error.message)")
        }
    }
}
