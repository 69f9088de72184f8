import WispInfrastructure

/// One conversation thread: an actor that owns its `Conversation` and runs calls one at a time,
/// in the order they were accepted.
///
/// Swift actors are re-entrant: while one call awaits the model, another call's code may
/// run on the actor. Isolation alone therefore does not serialise calls across an `await`,
/// and a FoundationModels session throws if asked twice at once. Its `TicketGate` does:
/// each accepted call holds a ticket, and only the ticket holding the turn runs.
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

    /// What a fork starts from: another thread's binding and committed history.
    public struct Copy: Sendable {
        public let binding: Binding
        public let history: [Turn]
        public let condensed: Int
        /// The live source's affinity (nil for a stored one): a fleet starts the fork beside it.
        public let source: SessionAffinity?
        public init(binding: Binding, history: [Turn], condensed: Int = 0, source: SessionAffinity? = nil) {
            self.binding = binding
            self.history = history
            self.condensed = condensed
            self.source = source
        }
    }

    /// A durable thread's store, and how to turn stored tool names and roots back into tools.
    public struct Durability: Sendable {
        public let store: any ThreadStore
        public let resolve: @Sendable (_ tools: [String], _ roots: [String]) throws(WispError) -> [ModelTool]
        public init(store: any ThreadStore,
                resolve: @escaping @Sendable (_ tools: [String], _ roots: [String]) throws(WispError) -> [ModelTool]) {
            self.store = store
            self.resolve = resolve
        }

        /// A stored thread as a live one starts from, its tools resolved again: the one way from
        /// stored to live (a fork of a stored thread, a resume, a reload).
        func live(_ stored: StoredThread, source: SessionAffinity? = nil) throws(WispError) -> Copy {
            Copy(binding: Binding(instructions: stored.instructions, tools: try resolve(stored.tools, stored.roots),
                                  roots: stored.roots),
                 history: stored.history, source: source)
        }
    }

    /// A place in this thread's line, handed out in arrival order by `enqueue()`.
    public struct Ticket: Sendable {
        fileprivate let place: TicketGate.Ticket
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
    /// The store's lease on this thread, held by the call being served.
    private var lease: (any ThreadLease)?
    /// Locked: the registry asks `holdsUnstoredTurns` without a hop onto this actor.
    private let storeState: Locked<StoreState>
    private var state: StoreState {
        get { storeState.withLock { $0 } }
        set { storeState.withLock { $0 = newValue } }
    }
    /// Unix seconds of the first and latest committed turn, where known.
    public private(set) var createdAt: Double?
    public private(set) var updatedAt: Double?

    /// The ticket of a new thread's first call, issued with the thread so that creating a
    /// thread and accepting its first call is one step.
    public static let firstTicket = Ticket(place: TicketGate.first, start: nil, binds: [])

    /// The first ticket of a thread that may turn out to be stored: the binding arguments are
    /// checked once its history is loaded.
    public static func firstTicket(binds: [String]) -> Ticket {
        Ticket(place: TicketGate.first, start: nil, binds: binds)
    }

    private let gate = TicketGate()

    /// `copy`: the thread is a fork of it (its binding then comes from there).
    public init(id: String, backend: any ModelBackend, instructions: String?, tools: [ModelTool], maxQueue: Int,
                roots: [String] = [], durability: Durability? = nil, copy: Copy? = nil) {
        self.id = id
        self.backend = backend
        self.affinity = SessionAffinity(key: id, source: copy?.source)
        if let copy {
            self.conversation = Conversation(backend: backend, instructions: copy.binding.instructions,
                                             tools: copy.binding.tools,
                                             history: copy.history, affinity: affinity, condensedAway: copy.condensed)
        } else {
            self.conversation = Conversation(backend: backend, instructions: instructions, tools: tools,
                                             affinity: affinity)
        }
        self.storeState = Locked(copy != nil ? .fork : .inStep(nil))
        self.maxQueue = maxQueue
        self.roots = copy?.binding.roots ?? roots
        self.durability = durability
    }

    public var turnCount: Int { conversation.history.count }
    /// Answered turns that only this memory holds: evicting the thread now would lose them.
    public nonisolated var holdsUnstoredTurns: Bool { storeState.withLock { $0.holdsUnstoredTurns } }
    /// What the committed calls cost so far, in this process (a resumed thread counts from its
    /// resume); nil before any.
    public private(set) var usage: Usage?
    public var history: [Turn] { conversation.history }
    public var instructions: String? { conversation.instructions }

    /// The binding and committed history, as a fork copies them: a call running meanwhile is not
    /// in them (its turn is staged, not committed). A durable thread another process stored since
    /// this one last looked is read from the store.
    public func copy() async throws(WispError) -> Copy {
        if let durability, case .loaded(let stored, _) = try await newerStored() {
            return try durability.live(stored, source: affinity)
        }
        return Copy(binding: Binding(instructions: conversation.instructions, tools: conversation.tools, roots: roots),
                    history: conversation.history, condensed: conversation.condensedAway, source: affinity)
    }

    /// This thread in a listing, or nil when it does not match `query`.
    public func listed(query: ThreadQuery?, pending: Int, stored: Bool) -> (ThreadInfo, ListPlace)? {
        var score = 0
        if let query {
            guard let s = query.score(conversation.history) else { return nil }
            score = s
        }
        let info = ThreadViews.info(id: id, instructions: conversation.instructions, history: conversation.history,
                                    pending: pending, live: true, stored: stored,
                                    usage: usage.map { UsageBody(totals: $0) }, created: createdAt, updated: updatedAt)
        return (info, ListPlace(score: score, updated: updatedAt ?? .infinity, id: id))
    }

    /// The thread's last turns as `read_thread` gives them: what the store holds when another
    /// process wrote it since (nil when it closed it).
    public func read(last: Int?, maxBytes: Int) async throws(WispError) -> ReadThreadResult? {
        switch try await newerStored() {
        case .none: return nil
        case .loaded(let stored, _):
            return ThreadViews.read(id: id, instructions: stored.instructions, tools: stored.tools,
                                    history: stored.history, condensed: 0, last: last, maxBytes: maxBytes)
        case .unchanged, .unavailable:
            return ThreadViews.read(id: id, instructions: conversation.instructions,
                                    tools: conversation.tools.map(\.name), history: conversation.history,
                                    condensed: conversation.condensedAway, last: last, maxBytes: maxBytes)
        }
    }

    /// Whether another process closed this stored thread since this memory last saw it: the store's
    /// listing lacks it, and only the store can tell that from the store being unreachable.
    public func isClosedElsewhere() async -> Bool {
        guard state.version != nil, case .some(Loaded.none) = try? await newerStored() else { return false }
        return true
    }

    /// Whether the store holds another version than this memory last saw (another process wrote it
    /// since) while no call runs here: a listing then shows what is stored.
    public func isBehind(_ stored: StoreVersion?) -> Bool {
        guard durability != nil, state.isInStep, lease == nil, pending == 0 else { return false }
        return stored != state.version
    }

    /// What the store holds of this thread when it is not what this memory last saw of it (another
    /// process wrote or closed it): read without the lease. Only an idle thread's store is read: a
    /// running call holds the lease, and this memory is then what the store last had from it.
    private func newerStored() async throws(WispError) -> Loaded {
        let version = state.version
        guard let durability, state.isInStep, lease == nil, pending == 0,
              version != nil || !conversation.history.isEmpty else { return .unchanged }
        return try await durability.store.read(id, unlessAt: version)
    }

    /// Calls holding a ticket that have not finished: the running one and those waiting.
    public var pending: Int { gate.pending }

    /// Takes a place in line, or fails with `busy` when `maxQueue` calls already wait.
    /// `start` and `binds`: see `Ticket`.
    public func enqueue(start: Binding? = nil, binds: [String] = []) throws(WispError) -> Ticket {
        do {
            return Ticket(place: try gate.take(maxWaiting: maxQueue), start: start, binds: binds)
        } catch {
            throw WispError(.busy,
                    "thread '\(id)' already has \(error.waiting) calls waiting (limit \(maxQueue)); wait for one " +
                    "to finish, or use another thread")
        }
    }

    /// Waits for `ticket`'s turn, then answers; the turn is committed only if `keep()`, asked once
    /// the model has answered and before anything else runs on this thread, says so. Nil when it
    /// did not (the call was stopped): the history is then exactly as it was. A call cancelled
    /// or out of time (`deadline`) while waiting leaves the line without running; one that fails
    /// leaves the history unchanged.
    /// `rewind`: the last turns the call takes back, in the same commit (none if it is not kept).
    /// `deadline` (`monotonicSeconds()`): the call's time limit, which the store's commit keeps too:
    /// a turn it cannot store by then is taken back (`WispError.commitPastDeadline`).
    public func respond(_ ticket: Ticket, prompt: String, files: FileRequest? = nil, settings: GenerationSettings,
                        onPartial: PartialHandler?, rewind: Int = 0, deadline: Double? = nil,
                        keep: @Sendable () -> Bool) async throws -> Conversation.Outcome? {
        try await waitForTurn(ticket, deadline: deadline, watcher: onPartial)
        defer { gate.release(ticket.place) }
        do {
            return try await serve(ticket, prompt: prompt, files: files, settings: settings, onPartial: onPartial,
                                   rewind: rewind, deadline: deadline, keep: keep)
        } catch {
            await release()
            throw error
        }
    }

    private func serve(_ ticket: Ticket, prompt: String, files: FileRequest?, settings: GenerationSettings,
                       onPartial: PartialHandler?, rewind: Int, deadline: Double?,
                       keep: @Sendable () -> Bool) async throws -> Conversation.Outcome? {
        // Its commit creates the thread for its caller, even if the thread is closed meanwhile.
        let firstOfFork = state == .fork
        if let durability, state != .closed {
            // Turns the store missed (`ahead`), or a fork not stored yet, make this memory the
            // thread, whatever is stored; a store that cannot be read now serves the call from memory (its commit says
            // why).
            // Taken as one job that is dropped if the call ends while it waits for a worker (the
            // store's own trips off the pipe loop run inside it).
            let store = durability.store, id = self.id, seen = state.version, load = state.isInStep
            let (lease, found) = try await offPipeLoop(ifDropped: WispError.callCancelled) {
                () async throws(WispError) -> (any ThreadLease, Loaded) in
                guard load else { return (try await store.lease(id), .unchanged) }
                return try await store.leaseLoading(id, unlessAt: seen)
            }
            self.lease = lease
            try await reload(found, durability)
        }
        if conversation.history.isEmpty {
            // As if the calls before it never happened: the thread starts with this call's binding.
            if let start = ticket.start {
                conversation = Conversation(backend: backend, instructions: start.instructions, tools: start.tools,
                                            affinity: affinity)
                roots = start.roots
            }
        } else if !ticket.binds.isEmpty {
            throw bindingError(passed: ticket.binds)
        }
        guard rewind <= conversation.history.count else {
            let has = conversation.history.count
            throw WispError(.invalidArgument,
                            "rewind \(rewind) is more than thread '\(id)' holds (\(has) turn\(has == 1 ? "" : "s")); "
                            + "nothing was dropped. Rewind at most \(has).")
        }
        let staged = try await conversation.respond(to: prompt, files: files, settings: settings, onPartial: onPartial,
                                                    rewind: rewind)
        guard keep() else {
            conversation.discard(staged)
            await release()
            return nil
        }
        let outcome = try await commit(staged, by: deadline, firstOfFork: firstOfFork)
        await release()
        return outcome
    }

    /// Lets go of the store's lease; a thread closed meanwhile is deleted from the store first,
    /// under it, so that nothing brings it back.
    private func release() async {
        guard let lease else { return }
        self.lease = nil
        if state == .closed { _ = try? await lease.delete() }
        await lease.release()
    }

    /// Makes the staged turn part of the history and, on a durable thread, stores it before the
    /// caller hears of it (under the lease: `release` lets it go).
    private func commit(_ staged: Conversation.Staged, by deadline: Double?,
                        firstOfFork: Bool) async throws(WispError) -> Conversation.Outcome {
        let before = (undo: conversation.undo(of: staged), usage: usage, createdAt: createdAt, updatedAt: updatedAt,
                      state: state)
        var outcome = conversation.commit(staged)
        usage = usage.map { $0 + outcome.usage } ?? outcome.usage
        let now = ThreadViews.now()
        if outcome.created || firstOfFork { createdAt = now }
        updatedAt = now
        if firstOfFork {
            outcome.created = true
            state.settle(.inStep(nil))
        }
        guard durability != nil, let lease, state != .closed else { return outcome }
        let thread = asStored
        // The store holds the history but this turn (a rewind's kept turns are a prefix of it)
        // unless turns were dropped, kept in memory only, or the thread is a new fork.
        let kept = outcome.dropped > 0 || before.state.holdsUnstoredTurns || firstOfFork ? 0 : thread.history.count - 1
        do {
            let written = try await lease.commit(thread, kept: kept, after: before.state.version,
                                                 usage: outcome.usage, by: deadline)
            state.settle(.inStep(written))
        } catch where error == .commitPastDeadline || error.code == .storeUnavailable {
            // Nothing was stored, so nothing is kept: the call reports its time limit, or a shared
            // store that failed (replicas must not hold turns the database lacks).
            conversation.revert(before.undo)
            (usage, createdAt, updatedAt) = (before.usage, before.createdAt, before.updatedAt)
            state.settle(before.state)
            throw error
        } catch {
            // Kept in memory and answered: the caller is told.
            outcome.storeError = error.message
            state.settle(.ahead(of: before.state.version))
        }
        return outcome
    }

    /// This thread as the store keeps it: the one way from live to stored.
    private var asStored: StoredThread {
        StoredThread(instructions: conversation.instructions, tools: conversation.tools.map(\.name), roots: roots,
                     history: conversation.history)
    }

    /// Stores a thread that holds turns the store missed, whole, when no call is running on it
    /// (the store works again). True when it is stored now.
    public func storeUnstored() async -> Bool {
        guard holdsUnstoredTurns, let durability, let ticket = try? enqueue() else { return !holdsUnstoredTurns }
        guard (try? await waitForTurn(ticket)) != nil else { return false }
        defer { gate.release(ticket.place) }
        guard case .ahead(let version) = state, let lease = try? await durability.store.lease(id) else {
            return !holdsUnstoredTurns
        }
        let thread = asStored
        if let written = try? await lease.commit(thread, kept: 0, after: version, usage: Usage()) {
            state.settle(.inStep(written))
        }
        await lease.release()
        return !holdsUnstoredTurns
    }

    /// Brings a durable thread up to its stored state when the store `found` it is not the version
    /// this thread last saw: stored by another process, resumed after a restart, or deleted
    /// (closed elsewhere, or over the cap), which leaves the thread empty with its binding.
    private func reload(_ found: Loaded, _ durability: Durability) async throws(WispError) {
        switch found {
        case .unchanged, .unavailable: return
        case .none:
            conversation = Conversation(backend: backend, instructions: conversation.instructions,
                                        tools: conversation.tools, affinity: affinity)
            state.settle(.inStep(nil))
        case .loaded(let stored, let loaded):
            let live: Copy
            do {
                live = try durability.live(stored)
            } catch {
                throw await lease?.setAside("it is bound to tools this wisp cannot give it (\(error.message))") ?? error
            }
            conversation = Conversation(backend: backend, instructions: live.binding.instructions,
                                        tools: live.binding.tools, history: live.history, affinity: affinity)
            roots = live.binding.roots
            state.settle(.inStep(loaded))
        }
    }

    /// Who deletes a closed thread's stored copy.
    public enum Closing: Sendable, Equatable {
        /// The call being served, under the lease it holds, before it lets it go.
        case deletedByTheRunningCall
        /// No call holds the lease (or the thread is not durable): the caller deletes it, under a lease of its own.
        case leftToTheCaller
    }

    /// Closes the thread for good: calls still running on it will not store it.
    public func close() async -> Closing {
        state = .closed
        return durability != nil && lease != nil ? .deletedByTheRunningCall : .leftToTheCaller
    }

    /// The refusal of `instructions`/`tools` for this thread, which has committed turns: it says
    /// what the thread is bound to, so the caller sees why its arguments do not apply.
    public func bindingError(passed: [String]) -> WispError {
        let what = passed.joined(separator: " and ")
        let instructions = conversation.instructions.map(\.preview)
        let tools = conversation.tools.map(\.name)
        let binding = (instructions.map { "instructions \($0.debugDescription)" } ?? "no instructions") + " and "
            + (tools.isEmpty ? "no tools" : "tools [\(tools.joined(separator: ", "))]")
        return WispError(.invalidArgument,
                "thread '\(id)' already exists and is bound to \(binding); instructions and tools bind only when a " +
                "thread is created. Omit \(what) (even an empty value) to continue it, or close_thread it (or use a " +
                "new thread_id) to start over with new ones.")
    }

    /// `watcher` hears how many calls are ahead, now and whenever that changes.
    private func waitForTurn(_ ticket: Ticket, deadline: Double? = nil,
                             watcher: PartialHandler? = nil) async throws(WispError) {
        let onPlace = watcher.map { watcher in
            { @Sendable ahead in watcher(PartialReply(waiting: .queue(ahead: ahead))) }
        }
        do {
            try await gate.wait(for: ticket.place, deadline: deadline, onPlace: onPlace)
        } catch {
            throw error == .cancelled ? WispError.cancelledWhileWaiting : WispError.timedOutWhileWaiting
        }
    }
}
