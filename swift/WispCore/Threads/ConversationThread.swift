/// One conversation thread: an actor that owns its `Agent` and runs calls one at a time,
/// in the order they were accepted.
///
/// Swift actors are re-entrant: while one call awaits the model, another call's code may
/// run on the actor. Isolation alone therefore does not serialise calls across an `await`,
/// and a FoundationModels session throws if asked twice at once. The gate below does:
/// each accepted call holds a ticket, and only the ticket being served runs.
public actor ConversationThread {
    /// A place in this thread's line, handed out in arrival order by `enqueue()`.
    public struct Ticket: Sendable, Hashable {
        fileprivate let number: UInt64
    }

    public nonisolated let id: String
    private let agent: Agent
    private let maxQueue: Int

    /// The ticket of a new thread's first call, issued with the thread so that creating a
    /// thread and accepting its first call is one step.
    public static let firstTicket = Ticket(number: 0)

    private var issued: UInt64 = 1
    private var serving: UInt64 = 0
    private var parked: [UInt64: CheckedContinuation<Void, Never>] = [:]
    /// Tickets whose caller gave up (cancelled) while waiting; skipped when their turn comes.
    private var abandoned: Set<UInt64> = []

    public init(id: String, backend: any ModelBackend, instructions: String?, tools: [ModelTool], maxQueue: Int) {
        self.id = id
        self.agent = Agent(backend: backend, instructions: instructions, tools: tools)
        self.maxQueue = maxQueue
    }

    public var turnCount: Int { agent.history.count }
    public var history: [Turn] { agent.history }
    public var instructions: String? { agent.instructions }
    public var toolNames: [String] { agent.tools.map(\.name) }

    /// Calls holding a ticket that have not finished: the running one and those waiting.
    public var pending: Int { Int(issued - serving) - abandoned.count }

    /// Takes a place in line, or fails with `busy` when `maxQueue` calls already wait.
    public func enqueue() throws(WispError) -> Ticket {
        let waiting = pending - (pending > 0 ? 1 : 0)
        guard pending == 0 || waiting < maxQueue else {
            throw WispError(.busy, "thread '\(id)' already has \(waiting) calls waiting (limit \(maxQueue)); wait for one to finish, or use another thread")
        }
        defer { issued += 1 }
        return Ticket(number: issued)
    }

    /// Waits for `ticket`'s turn, then answers. A call cancelled while waiting leaves the line
    /// without running; a call cancelled while running leaves the history unchanged.
    public func respond(_ ticket: Ticket, prompt: String, files: FileRequest? = nil, settings: GenerationSettings,
                        onPartial: PartialHandler?) async throws -> Agent.Outcome {
        try await waitForTurn(ticket.number)
        defer { advance() }
        return try await agent.respond(to: prompt, files: files, settings: settings, onPartial: onPartial)
    }

    private func waitForTurn(_ number: UInt64) async throws(WispError) {
        if number == serving { return }
        if Task.isCancelled {
            abandoned.insert(number)
            throw WispError(.cancelled, "The call was cancelled while waiting for its thread.")
        }
        await withTaskCancellationHandler {
            await withCheckedContinuation { parked[number] = $0 }
        } onCancel: {
            Task { await self.abandon(number) }
        }
        if abandoned.contains(number) {
            throw WispError(.cancelled, "The call was cancelled while waiting for its thread.")
        }
    }

    private func abandon(_ number: UInt64) {
        guard let waiter = parked.removeValue(forKey: number) else { return }
        abandoned.insert(number)
        waiter.resume()
    }

    private func advance() {
        serving += 1
        while abandoned.remove(serving) != nil { serving += 1 }
        parked.removeValue(forKey: serving)?.resume()
    }
}
