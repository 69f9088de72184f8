import Dispatch
import Foundation
import Synchronization

/// Serves the pipe protocol: takes decoded requests in arrival order, runs each `respond` in
/// its own task, and hands every reply and event to `send` (a single writer, so frames never
/// interleave). Requests come from a `RequestReader`; the process loop around both lives in
/// `swift/wisp-core/main.swift`.
public final class PipeServer: Sendable {
    public let registry: ThreadRegistry
    public let backend: any ModelBackend
    private let send: @Sendable ([UInt8]) -> Void
    private let log: Log
    /// Where calls run: the pipe loop in the core (nil: the global pool, as in unit tests).
    private let executor: (any TaskExecutor)?
    private let inFlight = Locked<[Int: Call]>([:])

    private struct Call {
        var task: Task<Void, Never>?
        /// Why the call was stopped, when it was: `cancelled` or `timeout`.
        var stop: WispError.Code?
        /// When the call's time limit runs out, in `monotonicSeconds()` (the shim's `options.deadline`,
        /// else `timeout_s` from when the request was read), if it has one.
        var deadline: Double?
        /// The call's turn is being committed: too late to stop it. Decided under the lock
        /// together with `stop`, so a cancel either stops the call or is answered `false`.
        var committed = false
    }

    /// Set (under `inFlight`'s lock) once `stopAll` has run: a call accepted after it starts stopped.
    private let stopping = Atomic<Bool>(false)

    /// The one task that enforces every call's time limit (see `watch`); nil while no call has one.
    private let watchdog = Locked<Task<Void, Never>?>(nil)
    /// Replies up to this many bytes of text are encoded on the pipe's thread: less than a hop to the pool costs.
    private static let encodeInPlace = 64 * 1024
    /// How often the watchdog looks: a time limit fires at most this late.
    private static let watchInterval = Duration.milliseconds(50)

    public init(registry: ThreadRegistry, backend: any ModelBackend, log: Log, executor: (any TaskExecutor)? = nil,
                send: @escaping @Sendable ([UInt8]) -> Void) {
        self.registry = registry
        self.backend = backend
        self.log = log
        self.executor = executor
        self.send = send
    }

    /// The first frame, before any model loads.
    public func ready() {
        write(Ready(backend: backend.name, model: backend.model, pid: ProcessInfo.processInfo.processIdentifier,
                    durable: registry.store != nil))
    }

    /// Handles one request. Call in arrival order and await each: that is what keeps calls on
    /// one thread in arrival order. It returns as soon as a `respond` has its place in line.
    public func handle(_ request: Request) async {
        switch request {
        case .respond(let r):
            await accept(r)
        case .closeThread(let c):
            do {
                let closed = try await registry.close(c.thread_id)
                write(Reply.success(c.id, CloseThreadResult(thread_id: c.thread_id, closed: closed)))
            } catch {
                fail(c.id, WispError.from(error))
            }
        case .cancel(let c):
            write(Reply.success(c.id, CancelResult(cancelled: stop(c.request, because: .cancelled))))
        case .ping(let m):
            write(Reply.success(m.id, PingResult()))
        case .status(let s):
            // In its own task: asking a backend about itself can take seconds (an endpoint that
            // does not answer), and the dispatcher must keep taking calls and cancels meanwhile.
            Task {
                let availability = await backend.availability()
                write(Reply.success(s.id, StatusResult(
                    backend: backend.name, model: backend.model, available: availability.available,
                    reason: availability.reason, context_size: await backend.contextSize(),
                    max_threads: registry.capacity, max_queue: registry.maxQueue, threads: await registry.snapshot(),
                    tools: registry.toolNames, state_dir: registry.store?.directory, state_error: registry.storeError)))
            }
        }
    }

    /// Replies `invalid_argument` to a request that framed and parsed but did not fit its op.
    public func reject(id: Int, _ message: String) {
        log(.warning, "protocol: request \(id): \(message)")
        fail(id, WispError(.invalidArgument, "protocol error: \(message)"))
    }

    /// Stops every call in flight and any accepted later (at stdin EOF), and waits at most
    /// `grace` for them to end. True when they all did. It blocks the calling thread: call it
    /// from a thread of its own, neither the pipe loop (the calls may need it to end) nor the
    /// pool, since a call that ignores cancellation (a backend or tool burning a CPU) may hold
    /// every thread of the cooperative pool, and the wait must still end.
    public func stopAll(grace: Duration) -> Bool {
        let tasks = inFlight.withLock { calls in
            stopping.store(true, ordering: .relaxed)
            for id in calls.keys where calls[id]?.committed == false { calls[id]?.stop = .cancelled }
            return calls.values.compactMap(\.task)
        }
        for t in tasks { t.cancel() }
        let ended = DispatchSemaphore(value: 0)
        Task.detached { [self] in
            // Again until none is left: a request still in the dispatcher's queue may be accepted meanwhile.
            while callsInFlight > 0 {
                let running = inFlight.withLock { $0.values.compactMap(\.task) }
                for t in running { await t.value }
                if running.isEmpty { try? await Task.sleep(for: .milliseconds(1)) }
            }
            ended.signal()
        }
        let ns = grace.components.seconds * 1_000_000_000 + grace.components.attoseconds / 1_000_000_000
        return ended.wait(timeout: .now() + .nanoseconds(Int(ns))) == .success
    }

    public var callsInFlight: Int { inFlight.withLock { $0.count } }

    // MARK: respond

    private func accept(_ r: Respond) async {
        guard !r.prompt.isEmpty else {
            return fail(r.id, WispError(.invalidArgument, "prompt must not be empty"))
        }
        if let level = r.options?.reasoning, ReasoningLevel(rawValue: level) == nil {
            let levels = ReasoningLevel.allCases.map(\.rawValue).joined(separator: ", ")
            return fail(r.id, WispError(.invalidArgument, "reasoning must be one of \(levels), got '\(level.prefix(40))'"))
        }
        let deadline = Self.deadline(r.options)
        // Read after its limit ran out (the core was stopped, or busy, while it queued): the shim
        // has told the caller it timed out, so it must change nothing, not even create its thread.
        if let deadline, deadline <= monotonicSeconds() {
            return fail(r.id, stoppedError(.timeout, r, r.thread_id))
        }
        let known = inFlight.withLock { calls in
            if calls[r.id] != nil { return true }
            calls[r.id] = Call(stop: stopping.load(ordering: .relaxed) ? .cancelled : nil, deadline: deadline)
            return false
        }
        if known { return fail(r.id, WispError(.invalidArgument, "protocol error: request id \(r.id) is already in flight")) }
        if deadline != nil { startWatchdog() }

        // Before the thread is accepted, so a bad schema neither creates a thread nor reaches a
        // model; off the pipe's thread (its patterns are compiled).
        let schema: OutputSchema?
        do {
            if let text = r.schema {
                schema = try await offPipe { () throws(WispError) in try OutputSchema(text: text) }
            } else {
                schema = nil
            }
        } catch {
            _ = inFlight.withLock { $0.removeValue(forKey: r.id) }
            return fail(r.id, error)
        }

        let acceptance: ThreadRegistry.Acceptance
        do {
            acceptance = try await registry.accept(threadID: r.thread_id, instructions: r.instructions, tools: r.tools, roots: r.roots)
        } catch {
            _ = inFlight.withLock { $0.removeValue(forKey: r.id) }
            return fail(r.id, WispError.from(error))
        }
        // Before this call's reply, so the shim never takes the evicted thread for alive.
        if let evicted = acceptance.evicted { write(Evicted(thread_id: evicted)) }

        let task = Task(executorPreference: executor) { await self.run(r, acceptance, schema: schema) }
        let stoppedEarly = inFlight.withLock { calls -> Bool in
            calls[r.id]?.task = task
            return calls[r.id]?.stop != nil
        }
        if stoppedEarly { task.cancel() }
    }

    /// The call's deadline: the shim's, else its limit counted from now (a shim or test that
    /// sends only `timeout_s`); none for no positive limit.
    private static func deadline(_ options: RespondOptions?) -> Double? {
        if let deadline = options?.deadline { return deadline }
        guard let seconds = options?.timeout_s, seconds > 0 else { return nil }
        return monotonicSeconds() + seconds
    }

    private func run(_ r: Respond, _ acceptance: ThreadRegistry.Acceptance, schema: OutputSchema?) async {
        let settings = GenerationSettings(temperature: r.options?.temperature, maxOutputTokens: r.options?.max_output_tokens,
                                          schema: schema, reasoning: r.options?.reasoning.flatMap(ReasoningLevel.init(rawValue:)))
        var onPartial: PartialHandler?
        if r.progress == true {
            let id = r.id
            onPartial = { @Sendable p in
                // Over the frame limit, a partial text is skipped: the final reply says what happened.
                let frame = Frame.encode(Progress(id: id, text: p.text, tokens: p.tokens))
                if Frame.fits(frame) { self.send(frame) }
            }
        }

        let thread = acceptance.thread
        let reply: [UInt8]
        var committed = false
        do {
            // Always called, even when already cancelled: the ticket must be served for the line to
            // move. The turn is kept, or not, in one step with `stop`: a cancel or time limit that
            // came first wins, even when the model answered anyway (a backend that ignored
            // cancellation, a core stopped past the deadline that resumed before the watchdog looked).
            let id = r.id
            var files: FileRequest?
            if let paths = r.files, !paths.isEmpty {
                // Off the pipe's thread: each root is resolved (realpath) again.
                let base = registry.fileRoots, extra = r.roots ?? []
                files = FileRequest(paths: paths, roots: await offPipe { base.adding(extra) })
            }
            let outcome = try await thread.respond(acceptance.ticket, prompt: r.prompt, files: files, settings: settings, onPartial: onPartial) {
                self.inFlight.withLock { calls in
                    guard var call = calls[id] else { return false }
                    if call.stop == nil, let deadline = call.deadline, deadline <= monotonicSeconds() { call.stop = .timeout }
                    call.committed = call.stop == nil
                    calls[id] = call
                    return call.committed
                }
            }
            if let o = outcome {
                committed = true
                let result = RespondResult(
                    thread_id: thread.id, created: o.created, text: o.text, condensed: o.condensed,
                    turns: o.turns, dropped: o.dropped, prompt_tokens: o.promptTokens, output_tokens: o.outputTokens,
                    store_error: o.storeError, usage: UsageBody(o.usage))
                // A long reply is encoded off the pipe's thread (milliseconds per megabyte).
                reply = o.text.utf8.count < Self.encodeInPlace
                    ? Frame.encode(Reply.success(r.id, result))
                    : await offPipe { Frame.encode(Reply.success(r.id, result)) }
            } else {
                let stop = inFlight.withLock { $0[r.id]?.stop } ?? .cancelled
                reply = Frame.encode(Failure.failure(r.id, stoppedError(stop, r, thread.id)))
            }
        } catch {
            var e = WispError.from(error)
            // Only a call that ended because it was stopped is reported as stopped; one that had
            // already failed for another reason keeps that reason.
            if e.code == .cancelled, let stop = inFlight.withLock({ $0[r.id]?.stop }) { e = stoppedError(stop, r, thread.id) }
            reply = Frame.encode(Failure.failure(r.id, e))
        }
        await registry.finished(acceptance, committed: committed)
        _ = inFlight.withLock { $0.removeValue(forKey: r.id) }
        send(fitting(reply, id: r.id))
    }

    private func stoppedError(_ code: WispError.Code, _ r: Respond, _ threadID: String?) -> WispError {
        let left = threadID.map { "thread '\($0)' is unchanged" } ?? "no thread was created"
        return code == .timeout
            ? WispError(.timeout, "no reply within \(r.options?.timeout_s ?? 0) s; the call was stopped and \(left)")
            : WispError(.cancelled, "the call was cancelled; \(left)")
    }

    /// Time limits are enforced by one watchdog task for all calls, not a sleeping task per call:
    /// starting and cancelling a task per call cost two thread wake-ups on every round trip
    /// (~20 us of ~80 us on 2 cores). It runs only while some call has a limit.
    private func startWatchdog() {
        watchdog.withLock { task in
            if task == nil { task = Task(executorPreference: executor) { await self.watch() } }
        }
    }

    private func watch() async {
        while true {
            try? await Task.sleep(for: Self.watchInterval)
            let now = monotonicSeconds()
            let expired = inFlight.withLock { calls in
                calls.compactMap { id, call in call.stop == nil && !call.committed && call.deadline.map { $0 <= now } == true ? id : nil }
            }
            for id in expired { _ = stop(id, because: .timeout) }
            // Ends when no running call has a limit; checked under the watchdog's lock, so a
            // call that sets its deadline meanwhile either is seen here or starts a new watchdog.
            let done = watchdog.withLock { task in
                let waiting = inFlight.withLock { $0.values.contains { $0.stop == nil && !$0.committed && $0.deadline != nil } }
                if !waiting { task = nil }
                return !waiting
            }
            if done { return }
        }
    }

    /// Stops an in-flight call. False when no such call is in flight, or its turn is already
    /// being committed (it ends as if the stop had come after its reply).
    private func stop(_ id: Int, because code: WispError.Code) -> Bool {
        let task: Task<Void, Never>?? = inFlight.withLock { calls in
            guard let call = calls[id], !call.committed else { return .none }
            if calls[id]?.stop == nil { calls[id]?.stop = code }
            return .some(calls[id]?.task)
        }
        guard case .some(let t) = task else { return false }
        t?.cancel()
        return true
    }

    // MARK: writing

    private func fail(_ id: Int, _ error: WispError) {
        write(Failure.failure(id, error))
    }

    private func write(_ message: some JSONWritable) {
        send(Frame.encode(message))
    }

    /// A reply over the frame limit would make the shim treat the whole pipe as broken and lose
    /// every thread, so it becomes an error for this call alone. `OutputSchema.checkReply`
    /// refuses such a reply before its turn is committed; this is the last guard.
    private func fitting(_ frame: [UInt8], id: Int) -> [UInt8] {
        guard !Frame.fits(frame) else { return frame }
        log(.warning, "request \(id): a reply of \(frame.count - 4) bytes is over the \(maxFrameBytes)-byte frame limit; sent an error instead")
        return Frame.encode(Failure.failure(id, WispError(.internal, "the reply came to \(frame.count - 4) bytes once encoded, over the pipe's \(maxFrameBytes / (1024 * 1024)) MiB limit, so it could not be delivered; ask for a shorter reply (max_output_tokens), or use a new thread")))
    }
}
