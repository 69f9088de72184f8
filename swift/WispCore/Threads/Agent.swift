/// One thread's conversation with the model: its canonical history, the live backend
/// session, and context condensing (DESIGN §5).
///
/// Not Sendable on purpose: it lives inside one `ConversationThread` actor and its async
/// method is `nonisolated(nonsending)`, so it runs on that actor and is never sent anywhere.
public final class Agent {
    public struct Outcome: Sendable, Equatable {
        public var text: String
        /// True when turns were dropped during this call to make room.
        public var condensed: Bool
        /// Turns the history holds after this call, this one included.
        public var turns: Int
        /// Turns dropped during this call.
        public var dropped: Int
        public var promptTokens: Int?
        public var outputTokens: Int?
    }

    private let backend: any ModelBackend
    public let instructions: String?
    public let tools: [ModelTool]
    public private(set) var history: [Turn] = []
    /// Disposable: rebuilt from `history` after condensing or any failed call.
    private var session: (any ModelSession)?
    private var instructionTokens: Int?

    public init(backend: any ModelBackend, instructions: String?, tools: [ModelTool]) {
        self.backend = backend
        self.instructions = instructions
        self.tools = tools
    }

    /// Answers `prompt` in this conversation. On success the turn joins the history (after
    /// any condensing); on any failure, cancellation included, the history is left exactly as it was.
    nonisolated(nonsending)
    public func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Outcome {
        if Task.isCancelled { throw WispError(.cancelled, "The call was cancelled.") }
        let context = max(1, await backend.contextSize())
        var kept = history[...]
        var dropped = 0

        // Pre-flight: where the model can count, drop what cannot fit beside the prompt and a reply reserve.
        let promptTokens = try await backend.tokenCount(prompt)
        if let promptTokens {
            let reserve = min(settings.maxOutputTokens ?? 512, context / 4)
            var total = try await countInstructions() + promptTokens + reserve + kept.reduce(0) { $0 + $1.tokens }
            while total > context, let oldest = kept.first {
                total -= oldest.tokens
                kept.removeFirst()
                dropped += 1
            }
        }
        if dropped > 0 { session = nil }

        var overflows = 0
        while true {
            let active: any ModelSession
            if let session {
                active = session
            } else {
                active = backend.makeSession(instructions: instructions, tools: tools, history: Array(kept))
                if !kept.isEmpty { await active.prewarm() }
                session = active
            }
            do {
                let g = try await active.respond(to: prompt, settings: settings, onPartial: onPartial)
                // Before the turn is committed: a reply that misses the schema never joins the history.
                try settings.schema?.check(g.text, maxOutputTokens: settings.maxOutputTokens)
                let turn = Turn(prompt: prompt, toolExchanges: g.toolExchanges, response: g.text,
                                tokens: turnTokens(prompt: prompt, promptTokens: promptTokens, generation: g))
                if dropped == 0 {
                    // The usual case: append in place. Releasing `kept` (a slice of `history`'s
                    // buffer) first leaves the buffer uniquely referenced, so nothing is copied;
                    // rebuilding the array cost O(turns) per call on a long thread.
                    kept = []
                    history.append(turn)
                } else {
                    history = Array(kept) + [turn]
                }
                return Outcome(text: g.text, condensed: dropped > 0, turns: history.count, dropped: dropped,
                               promptTokens: g.promptTokens, outputTokens: g.outputTokens)
            } catch let error as WispError where error.code == .contextOverflow {
                session = nil
                guard !kept.isEmpty else {
                    throw WispError(.contextOverflow, """
                        The prompt does not fit in the model's \(context)-token context even with every earlier turn \
                        of this thread dropped (\(error.message)). Shorten the prompt; if the thread's instructions \
                        take the room, close this thread (close_thread) and start another with shorter instructions.
                        """)
                }
                overflows += 1
                let n = dropCount(kept: kept, prompt: prompt, context: context, overflows: overflows)
                kept.removeFirst(n)
                dropped += n
            } catch {
                session = nil
                if Task.isCancelled { throw WispError(.cancelled, "The call was cancelled.") }
                throw WispError.from(error)
            }
        }
    }

    /// How many of the oldest turns to drop after the model reported an overflow: the first
    /// time, enough for the estimate of what remains to fit; after that, a quarter (at least
    /// one), so a model whose tokens run larger than the estimate converges in few retries.
    private func dropCount(kept: ArraySlice<Turn>, prompt: String, context: Int, overflows: Int) -> Int {
        guard overflows == 1 else { return max(1, kept.count / 4) }
        var total = estimatedTokens(instructions ?? "") + estimatedTokens(prompt) + kept.reduce(0) { $0 + $1.tokens }
        var n = 0
        for turn in kept where total > context {
            total -= turn.tokens
            n += 1
        }
        return max(1, n)
    }

    nonisolated(nonsending)
    private func countInstructions() async throws -> Int {
        if let instructionTokens { return instructionTokens }
        guard let instructions else { return 0 }
        let n = try await backend.tokenCount(instructions) ?? estimatedTokens(instructions)
        instructionTokens = n
        return n
    }

    private func turnTokens(prompt: String, promptTokens: Int?, generation g: Generation) -> Int {
        var n = (promptTokens ?? estimatedTokens(prompt)) + (g.outputTokens ?? estimatedTokens(g.text))
        for e in g.toolExchanges { n += estimatedTokens(e.name) + estimatedTokens(e.arguments) + estimatedTokens(e.output) }
        return n
    }
}
