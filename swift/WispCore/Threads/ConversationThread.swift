import WispInfrastructure

/// One conversation thread: an actor that owns its `Conversation` and runs calls one at a time,
/// in the order they were accepted.
///
/// Swift actors are re-entrant: while one call awaits the model, another call's code may
/// run on the actor. Isolation alone therefore does not serialise calls across an `await`,
/// and a FoundationModels session throws if asked twice at once. The gate below does:
/// each accepted call holds a ticket, and only the ticket being served runs.
public actor ConversationThread {
    /// What a thread is started with: its instructions and model tools.
    public struct Binding: Sendable {
        public let instructions: String?
        public let tools: [ModelTool]
        /// The client roots the tools were confined with: stored, so a resumed thread gets the same.
        public let roots: [String]
        public init(instructions: String?, tools: [ModelTool], roots: [String] = []) {
            self.instructions = instructions
            self.tools = tools
            self.roots = roots
        }
    }

    /// A durable thread's store, and how to turn stored tool names and roots back into tools.
    public struct Durability: Sendable {
        public let store: ThreadStore
        public let resolve: @Sendable (_ tools: [String], _ roots: [String]) throws(WispError) -> [ModelTool]
        public init(store: ThreadStore, resolve: @escaping @Sendable (_ tools: [String], _ roots: [String]) throws(WispError) -> [ModelTool]) {
            self.store = store
            self.resolve = resolve
        }
    }

    /// A place in this thread's line, handed out in arrival order by `enqueue()`.
    public struct Ticket: Sendable {
        fileprivate let number: UInt64
        /// The binding this call starts the thread with if, when its turn comes, the thread has
        /// no committed turn (every call before it failed or was cancelled); nil keeps the thread's own.
        fileprivate let start: Binding?
        /// The binding arguments this call passed (`instructions`, `tools`): an error if the thread
        /// has a committed turn when its turn comes.
        fileprivate let binds: [String]
    }

    public nonisolated let id: String
    private let backend: any ModelBackend
    /// The thread to the backend, shared by every conversation it makes (ModelBackend.swift).
    private let affinity: SessionAffinity
    private var conversation: Conversation
    private let maxQueue: Int
    private var roots: [String]
    private let durability: Durability?
    /// The identity of the stored file as this thread last wrote or read it (nil: none seen).
    private var stamp: ThreadStore.Stamp?
    /// The store's lock, held by the call being served.
    private var held: ThreadStore.Lock?
    /// Closed: calls still running on it must not store it again.
    private var closed = false
    /// The call being served is writing the thread's file (off the pipe loop, so `close`
    /// may run meanwhile): that call deletes it afterwards if the thread was closed by then.
    private var saving = false
    /// A turn was committed that the store does not have (the directory failed): the memory is
    /// newer than any file, so the next call that can store stores it rather than reloading.
    private var unstored = false

    /// The ticket of a new thread's first call, issued with the thread so that creating a
    /// thread and accepting its first call is one step.
    public static let firstTicket = Ticket(number: 0, start: nil, binds: [])

    /// The first ticket of a thread that may turn out to be stored: the binding arguments are
    /// checked once its history is loaded.
    public static func firstTicket(binds: [String]) -> Ticket { Ticket(number: 0, start: nil, binds: binds) }

    private var issued: UInt64 = 1
    private var serving: UInt64 = 0
    private var parked: [UInt64: CheckedContinuation<Void, Never>] = [:]
    /// Tickets whose caller gave up (cancelled) while waiting; skipped when their turn comes.
    private var abandoned: Set<UInt64> = []

    public init(id: String, backend: any ModelBackend, instructions: String?, tools: [ModelTool], maxQueue: Int,
                roots: [String] = [], durability: Durability? = nil) {
        self.id = id
        self.backend = backend
        self.affinity = SessionAffinity(key: id)
        self.conversation = Conversation(backend: backend, instructions: instructions, tools: tools, affinity: affinity)
        self.maxQueue = maxQueue
        self.roots = roots
        self.durability = durability
    }

    public var turnCount: Int { conversation.history.count }
    /// What the committed calls cost so far, in this process (a resumed thread counts from its
    /// resume); nil before any.
    public private(set) var usage: Usage?
    public var history: [Turn] { conversation.history }
    public var instructions: String? { conversation.instructions }

    /// Calls holding a ticket that have not finished: the running one and those waiting.
    public var pending: Int { Int(issued - serving) - abandoned.count }

    /// Takes a place in line, or fails with `busy` when `maxQueue` calls already wait.
    /// `start` and `binds`: see `Ticket`.
    public func enqueue(start: Binding? = nil, binds: [String] = []) throws(WispError) -> Ticket {
        let waiting = pending - (pending > 0 ? 1 : 0)
        guard pending == 0 || waiting < maxQueue else {
            throw WispError(.busy, "thread '\(id)' already has \(waiting) calls waiting (limit \(maxQueue)); wait for one to finish, or use another thread")
        }
        defer { issued += 1 }
        return Ticket(number: issued, start: start, binds: binds)
    }

    /// Waits for `ticket`'s turn, then answers; the turn is committed only if `keep()`, asked once
    /// the model has answered and before anything else runs on this thread, says so. Nil when it
    /// did not (the call was stopped): the history is then exactly as it was. A call cancelled
    /// while waiting leaves the line without running; one that fails leaves the history unchanged.
    public func respond(_ ticket: Ticket, prompt: String, files: FileRequest? = nil, settings: GenerationSettings,
                        onPartial: PartialHandler?, keep: @Sendable () -> Bool) async throws -> Conversation.Outcome? {
        try await waitForTurn(ticket.number)
        defer { advance() }
        do {
            return try await serve(ticket, prompt: prompt, files: files, settings: settings, onPartial: onPartial, keep: keep)
        } catch {
            await release()
            throw error
        }
    }

    private func serve(_ ticket: Ticket, prompt: String, files: FileRequest?, settings: GenerationSettings,
                       onPartial: PartialHandler?, keep: @Sendable () -> Bool) async throws -> Conversation.Outcome? {
        if let durability, !closed {
            // No lock while the state dir is not usable: the call is served in memory. What is
            // stored is still read where it can be (a read-only directory holds its threads).
            // Turns the store missed (`unstored`) make this memory the thread, whatever file is there.
            // Taken as one job that is dropped if the call ends while it waits for a worker (the
            // store's own trips off the pipe loop run inside it).
            let store = durability.store, id = self.id, seen = stamp, load = !unstored
            let (lock, found) = try await offPipeLoop(ifDropped: WispError.callCancelled) { () async throws(WispError) in
                try await store.lockAndLoad(id, seen: seen, load: load)
            }
            held = lock
            try await reload(found, durability)
        }
        if conversation.history.isEmpty {
            // As if the calls before it never happened: the thread starts with this call's binding.
            if let start = ticket.start {
                conversation = Conversation(backend: backend, instructions: start.instructions, tools: start.tools, affinity: affinity)
                roots = start.roots
            }
        } else if !ticket.binds.isEmpty {
            throw bindingError(passed: ticket.binds)
        }
        let staged = try await conversation.respond(to: prompt, files: files, settings: settings, onPartial: onPartial)
        guard keep() else {
            conversation.discard(staged)
            await release()
            return nil
        }
        let outcome = await commit(staged)
        await release()
        return outcome
    }

    /// Lets go of the store's lock, removing the lock file if the thread is not stored (off the
    /// pipe loop: it looks at the disk). A thread whose file this call saw or wrote keeps its
    /// lock file: that file goes only with the thread's (a delete, here or in another process).
    private func release() async {
        guard let durability, let lock = held else { return }
        held = nil
        guard stamp == nil else { return }
        let store = durability.store
        await offPipeLoop { store.release(lock) }
    }

    /// Makes the staged turn part of the history and, on a durable thread, stores it before the
    /// caller hears of it (the store's lock is still held: `advance` releases it).
    private func commit(_ staged: Conversation.Staged) async -> Conversation.Outcome {
        var outcome = conversation.commit(staged)
        usage = usage.map { $0 + outcome.usage } ?? outcome.usage
        guard let durability, !closed else { return outcome }
        guard held != nil else {
            unstored = true
            outcome.storeError = durability.store.trouble.map(durability.store.inMemoryNote) ?? "the state dir was not usable"
            return outcome
        }
        let state = ThreadStore.State(instructions: conversation.instructions, tools: conversation.tools.map(\.name), roots: roots, history: conversation.history)
        let store = durability.store, id = self.id, held = self.held
        // The file holds the history but this turn unless turns were dropped or kept in memory only.
        let appendingTo = outcome.dropped > 0 || unstored ? nil : stamp
        // Off the pipe loop: the write and its sync.
        saving = true
        let saved: Result<ThreadStore.Stamp, WispError> = await offPipeLoop {
            do throws(WispError) { return .success(try store.save(id, state, appendingTo: appendingTo)) } catch { return .failure(error) }
        }
        saving = false
        if closed {
            // Closed while the file was written (close left the deleting to this call, which
            // still holds the lock): the new file must not bring the thread back.
            if let held { _ = await offPipeLoop { store.delete(id, holding: held) } }
            stamp = nil
            return outcome
        }
        let failure: WispError?
        switch saved {
        case .success(let written): stamp = written; failure = nil; unstored = false
        case .failure(let error): failure = error
        }
        if let failure {
            // Kept in memory and answered: the caller is told, and a stale file must not
            // resume later as if it were this thread.
            outcome.storeError = failure.message
            unstored = true
            let gone = if let held { await offPipeLoop { store.delete(id, holding: held) } } else { false }
            // Still there (a read-only directory): it is what this thread last saw, so it is
            // not reloaded over the newer memory; the next stored turn replaces it.
            if gone { stamp = nil }
        }
        return outcome
    }

    /// Brings a durable thread up to its stored state when the store `found` the file is not the
    /// one this thread last saw: stored by another process, resumed after a restart, or deleted
    /// (closed elsewhere, or over the cap), which leaves the thread empty with its binding.
    private func reload(_ found: ThreadStore.Found, _ durability: Durability) async throws(WispError) {
        let store = durability.store, id = self.id
        guard case .loaded(let state, let loaded) = found else {
            if case .none = found {
                conversation = Conversation(backend: backend, instructions: conversation.instructions, tools: conversation.tools, affinity: affinity)
                stamp = nil
            }
            return
        }
        let tools: [ModelTool]
        do {
            tools = try durability.resolve(state.tools, state.roots)
        } catch {
            let why = "it is bound to tools this wisp cannot give it (\(error.message))"
            throw await offPipeLoop { store.corrupt(id, why) }
        }
        conversation = Conversation(backend: backend, instructions: state.instructions, tools: tools, history: state.history, affinity: affinity)
        roots = state.roots
        stamp = loaded
    }

    /// Who deletes a closed thread's stored file.
    public enum Closing: Sendable, Equatable {
        /// Deleted by `close`, under the lock the call being served holds.
        case deleted
        /// The call being served is writing the file: it deletes it once written, under its lock.
        case deletedByTheWritingCall
        /// No call holds the store's lock (or the thread is not durable): the caller deletes the
        /// file, after taking the lock.
        case leftToTheCaller
    }

    /// Closes the thread for good: calls still running on it will not store it.
    public func close() async -> Closing {
        closed = true
        guard let durability, let held else { return .leftToTheCaller }
        if saving { return .deletedByTheWritingCall }
        let store = durability.store, id = self.id
        // The lock stays held (this closure keeps it) until the file is gone, even if the call ends meanwhile.
        _ = await offPipeLoop { store.delete(id, holding: held) }
        return .deleted
    }

    /// The refusal of `instructions`/`tools` for this thread, which has committed turns: it says
    /// what the thread is bound to, so the caller sees why its arguments do not apply.
    public func bindingError(passed: [String]) -> WispError {
        let what = passed.joined(separator: " and ")
        let instructions = conversation.instructions.map(\.preview)
        let tools = conversation.tools.map(\.name)
        let binding = (instructions.map { "instructions \($0.debugDescription)" } ?? "no instructions") + " and "
            + (tools.isEmpty ? "no tools" : "tools [\(tools.joined(separator: ", "))]")
        return WispError(.invalidArgument, "thread '\(id)' already exists and is bound to \(binding); instructions and tools bind only when a thread is created. Omit \(what) (even an empty value) to continue it, or close_thread it (or use a new thread_id) to start over with new ones.")
    }

    private func waitForTurn(_ number: UInt64) async throws(WispError) {
        if number == serving { return }
        if Task.isCancelled {
            abandoned.insert(number)
            throw WispError.cancelledWhileWaiting
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { parked[number] = $0 }
        } onCancel: {
            Task { await self.abandon(number) }
        }
        if abandoned.contains(number) {
            throw WispError.cancelledWhileWaiting
        }
    }

    private func abandon(_ number: UInt64) {
        guard let waiter = parked.removeValue(forKey: number) else { return }
        abandoned.insert(number)
        waiter.resume()
    }

    private func advance() {
        held = nil
        serving += 1
        while abandoned.remove(serving) != nil { serving += 1 }
        parked.removeValue(forKey: serving)?.resume()
    }
}
