#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization
import WispInfrastructure

/// Serves the pipe protocol: takes decoded requests in arrival order, runs each `respond` in
/// its own task, and hands every reply and event to `send` (a single writer, so frames never
/// interleave). Requests come from a `RequestReader`; the process loop around both lives in
/// `swift/wisp-core/main.swift`, and the process's end (which runs the shutdown steps below) in
/// `Lifecycle`.
public final class PipeServer: Sendable {
    public let registry: ThreadRegistry
    public let backend: any ModelBackend
    private let send: @Sendable ([UInt8]) -> Void
    private let log: Log
    /// Where calls run: the pipe loop in the core (nil: the global pool, as in unit tests).
    private let executor: (any TaskExecutor)?
    private let calls = Locked(Calls())

    /// Every call in flight, by request id, and whether new ones are still taken.
    private struct Calls {
        var byID: [Int: CallState] = [:]
        /// `shuttingDown` once the shutdown began (`drain`): a call read after it starts stopped.
        var phase = Phase.serving
        /// What runs once no call is in flight (`whenIdle`).
        var whenIdle: [@Sendable () -> Void] = []
    }

    private enum Phase { case serving, shuttingDown }

    /// The one task that enforces every call's time limit (see `watch`); nil while no call has one.
    private let watchdog = Locked<Task<Void, Never>?>(nil)
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

    /// The first frame, before any model loads. `version` is the executable's (built from pyproject.toml).
    public func ready(version: String) {
        write(Ready(backend: backend.name, model: backend.model, pid: ProcessInfo.processInfo.processIdentifier,
                    version: version, durable: registry.store.durable))
    }

    /// Serves one request. Call in arrival order and await each: that is what keeps calls on
    /// one thread in arrival order. It returns as soon as a `respond` has its place in line.
    public func handle(_ operation: any PipeOperation) async {
        await operation.serve(on: self)
    }

    /// Replies to `operation` with what it runs to, or its error.
    func answer<Operation: AnsweredOperation>(_ operation: Operation) async {
        do throws(WispError) {
            write(Reply.success(operation.id, try await operation.run(on: self)))
        } catch {
            fail(operation.id, error)
        }
    }

    /// Replies `invalid_argument` to a request that framed and parsed but did not fit its op.
    public func reject(id: Int, _ message: String) {
        log(.warning, "protocol: request \(id): \(message)")
        fail(id, WispError(.invalidArgument, "protocol error: \(message)"))
    }

    // MARK: shutdown (the steps `Lifecycle` runs, in its order and with its times)

    /// Takes no new call: one read from now on starts stopped. Calls in flight run on.
    public func drain() {
        calls.withLock { $0.phase = .shuttingDown }
    }

    /// Stops every call in flight as cancelled (but those already committing, which end as if
    /// the stop had come after their reply), and any read later.
    public func cancelAll() {
        let tasks = calls.withLock { c -> [Task<Void, Never>] in
            c.phase = .shuttingDown
            return c.byID.keys.compactMap { id in
                guard case .stopped(let task)? = c.byID[id]?.stop(.cancelled) else { return nil }
                return task
            }
        }
        for t in tasks { t.cancel() }
    }

    /// Runs `action` (once) as soon as no call is in flight: now, if none is. It must not block.
    public func whenIdle(_ action: @escaping @Sendable () -> Void) {
        let now = calls.withLock { c -> Bool in
            if c.byID.isEmpty { return true }
            c.whenIdle.append(action)
            return false
        }
        if now { action() }
    }

    public var callsInFlight: Int { calls.withLock { $0.byID.count } }

    // MARK: respond

    /// Takes `r`'s id and its place in its thread's line, and starts its task (`run`).
    func accept(_ r: Respond) async {
        do throws(WispError) { try r.check() } catch { return fail(r.id, error) }
        let deadline = r.deadline
        // Read after its limit ran out (the core was stopped, or busy, while it queued): the shim
        // has told the caller it timed out, so it must change nothing, not even create its thread.
        if let deadline, deadline <= monotonicSeconds() {
            return fail(r.id, stoppedError(.timeout, r, r.thread_id))
        }
        let known = calls.withLock { c in
            if c.byID[r.id] != nil { return true }
            c.byID[r.id] = CallState(deadline: deadline, admitted: c.phase == .serving)
            return false
        }
        if known {
            return fail(r.id, WispError(.invalidArgument, "protocol error: request id \(r.id) is already in flight"))
        }
        if deadline != nil { startWatchdog() }

        let schema: OutputSchema?, acceptance: ThreadRegistry.Acceptance
        do throws(WispError) {
            schema = try await Self.schema(r)
            acceptance = try await registry.accept(threadID: r.thread_id, instructions: r.instructions, tools: r.tools,
                                                   roots: r.roots, forkFrom: r.fork_from, rewinding: r.rewind != nil)
        } catch {
            return ended(r.id, reply: Frame.encode(ErrorReply.failure(r.id, error)))
        }
        // Before this call's reply, so the shim never takes the evicted thread for alive.
        if let evicted = acceptance.evicted { write(Evicted(thread_id: evicted)) }

        // Its blocking work takes its turn in the pool as its thread's.
        let owner = BlockingOwner.thread(acceptance.thread.id)
        let task = Task(executorPreference: executor) {
            await BlockingPool.$owner.withValue(owner) { await self.run(r, acceptance, schema: schema) }
        }
        let stoppedEarly = calls.withLock { $0.byID[r.id]?.started(task) } ?? false
        if stoppedEarly { task.cancel() }
    }

    /// The call's schema, compiled before its thread is accepted, so a bad schema neither
    /// creates a thread nor reaches a model; off the pipe loop (its patterns are compiled), as
    /// the dispatcher's own job: the requests after this one (cancels too) wait for it.
    private static func schema(_ r: Respond) async throws(WispError) -> OutputSchema? {
        guard let text = r.schema else { return nil }
        return try await offPipeLoop(as: .dispatcher) { () throws(WispError) in try OutputSchema(text: text) }
    }

    private func run(_ r: Respond, _ acceptance: ThreadRegistry.Acceptance, schema: OutputSchema?) async {
        let settings = GenerationSettings(temperature: r.options?.temperature,
                                          maxOutputTokens: r.options?.max_output_tokens, schema: schema,
                                          reasoning: r.options?.reasoning.flatMap(ReasoningLevel.init(rawValue:)))
        let progress = r.progress == true ? ProgressFrames(id: r.id, send: send) : nil
        let thread = acceptance.thread
        let reply: [UInt8]
        var committed: Usage?
        do {
            // Always called, even when already cancelled: the ticket must be served for the line to
            // move. The turn is kept, or not, in one step with `stop`: a cancel or time limit that
            // came first wins, even when the model answered anyway (a backend that ignored
            // cancellation, a core stopped past the deadline that resumed before the watchdog looked).
            let id = r.id
            var files: FileRequest?
            if let paths = r.files, !paths.isEmpty {
                // Off the pipe loop: each root is resolved (realpath) again.
                let base = registry.fileRoots, extra = r.roots ?? []
                let roots = try await offPipeLoop(ifDropped: WispError.callCancelled) { () throws(WispError) in
                    base.adding(extra)
                }
                files = FileRequest(paths: paths, roots: roots)
            }
            let deadline = calls.withLock { $0.byID[id]?.deadline }
            let outcome = try await thread.respond(acceptance.ticket, prompt: r.prompt, files: files,
                                                   settings: settings, onPartial: progress?.handler,
                                                   rewind: r.rewind ?? 0, deadline: deadline) {
                self.calls.withLock { $0.byID[id]?.commit(at: monotonicSeconds()) } ?? false
            }
            if let o = outcome {
                progress?.flush(answer: o.text)
                committed = o.usage
                let result = RespondResult(
                    thread_id: thread.id, created: o.created, text: o.text, condensed: o.condensed,
                    turns: o.turns, dropped: o.dropped, prompt_tokens: o.promptTokens, output_tokens: o.outputTokens,
                    store_error: o.storeError, usage: UsageBody(o.usage), finish_reason: o.finishReason)
                // A long reply is encoded off the pipe loop (milliseconds per megabyte).
                reply = o.text.utf8.count < onPipeLoopBytes
                    ? Frame.encode(Reply.success(r.id, result))
                    : await offPipeLoop { Frame.encode(Reply.success(r.id, result)) }
            } else {
                let stop = calls.withLock { $0.byID[r.id]?.stopReason } ?? .cancelled
                reply = Frame.encode(ErrorReply.failure(r.id, stoppedError(stop, r, thread.id)))
            }
        } catch {
            reply = Frame.encode(ErrorReply.failure(r.id, failure(error, r, thread.id)))
        }
        await registry.finished(acceptance, committed: committed != nil, usage: committed)
        ended(r.id, reply: fitting(reply, id: r.id))
    }

    /// What a call that failed replies.
    private func failure(_ error: any Error, _ r: Respond, _ threadID: String) -> WispError {
        var e = WispError.from(error)
        // Only a call that ended because it was stopped is reported as stopped; one that had
        // already failed for another reason keeps that reason.
        if e.code == .cancelled, let stop = calls.withLock({ $0.byID[r.id]?.stopReason }) {
            e = stoppedError(stop, r, threadID)
        }
        // Its time ran out while it waited for its turn, or while its turn was stored (taken
        // back): it reads as any time limit.
        if e == .commitPastDeadline || e == .timedOutWhileWaiting { e = stoppedError(.timeout, r, threadID) }
        return e
    }

    private func stoppedError(_ code: WispError.Code, _ r: Respond, _ threadID: String?) -> WispError {
        let left = threadID.map { "thread '\($0)' is unchanged" } ?? "no thread was created"
        return code == .timeout
            ? WispError(.timeout, "no reply within \(r.options?.timeout_s ?? 0) s; the call was stopped and \(left)")
            : WispError(.cancelled, "the call was cancelled; \(left)")
    }

    /// Time limits are enforced by one watchdog task for all calls, not a sleeping task per call:
    /// starting and cancelling a task per call cost two OS-thread wake-ups on every round trip, a
    /// large share of a short call's time (bench/ has the figures). It runs only while some call
    /// has a limit.
    private func startWatchdog() {
        watchdog.withLock { task in
            if task == nil { task = Task(executorPreference: executor) { await self.watch() } }
        }
    }

    private func watch() async {
        while true {
            try? await Task.sleep(for: Self.watchInterval)
            let now = monotonicSeconds()
            let expired = calls.withLock { c in c.byID.compactMap { id, call in call.isOverdue(at: now) ? id : nil } }
            for id in expired { _ = stop(id, because: .timeout) }
            // Ends when no running call has a limit; checked under the watchdog's lock, so a
            // call that sets its deadline meanwhile either is seen here or starts a new watchdog.
            let done = watchdog.withLock { task in
                let waiting = calls.withLock { $0.byID.values.contains { $0.deadline != nil } }
                if !waiting { task = nil }
                return !waiting
            }
            if done { return }
        }
    }

    /// Stops an in-flight call. False when no such call is in flight, or its turn is already
    /// being committed (it ends as if the stop had come after its reply).
    func stop(_ id: Int, because code: WispError.Code) -> Bool {
        switch calls.withLock({ $0.byID[id]?.stop(code) }) {
        case .stopped(let task)?:
            task?.cancel()
            return true
        case .tooLate?, nil:
            return false
        }
    }

    /// The call is over: it leaves the table, then its reply is written, and then, if it was the
    /// last, what waits for no call to be in flight runs (so the shutdown never cuts a reply off).
    private func ended(_ id: Int, reply: [UInt8]) {
        let idle = calls.withLock { c -> [@Sendable () -> Void] in
            c.byID.removeValue(forKey: id)
            guard c.byID.isEmpty else { return [] }
            defer { c.whenIdle = [] }
            return c.whenIdle
        }
        send(reply)
        for action in idle { action() }
    }

    // MARK: writing

    private func fail(_ id: Int, _ error: WispError) {
        write(ErrorReply.failure(id, error))
    }

    private func write(_ message: some JSONWritable) {
        send(Frame.encode(message))
    }

    /// A reply over the frame limit would make the shim treat the whole pipe as broken and lose
    /// every thread, so it becomes an error for this call alone. `OutputSchema.checkReply`
    /// refuses such a reply before its turn is committed; this is the last guard.
    private func fitting(_ frame: [UInt8], id: Int) -> [UInt8] {
        guard !Frame.fits(frame) else { return frame }
        log(.warning,
            "request \(id): a reply of \(frame.count - 4) bytes is over " +
            "the \(maxFrameBytes)-byte frame limit; sent an error instead")
        return Frame.encode(ErrorReply.failure(id,
                WispError(.internal,
                        "the reply came to \(frame.count - 4) bytes once encoded, over the pipe's " +
                        "\(maxFrameBytes / (1024 * 1024)) MiB limit, so it could not be delivered; ask for a shorter " +
                        "reply (max_output_tokens), or use a new thread")))
    }
}
