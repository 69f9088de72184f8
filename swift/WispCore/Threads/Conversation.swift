import WispInfrastructure

/// One thread's conversation with the model: its canonical history, the live backend
/// session, and context condensing (what a caller sees of it: docs/threads.md).
///
/// Not Sendable on purpose: it lives inside one `ConversationThread` actor and its async
/// method is `nonisolated(nonsending)`, so it runs on that actor and is never sent anywhere.
public final class Conversation {
    public struct Outcome: Sendable, Equatable {
        public var text: String
        /// True when this call's turn is the thread's first: the thread was new to the caller.
        public var created: Bool
        /// True when turns were dropped during this call to make room.
        public var condensed: Bool
        /// Turns the history holds after this call, this one included.
        public var turns: Int
        /// Turns dropped during this call.
        public var dropped: Int
        public var promptTokens: Int?
        public var outputTokens: Int?
        /// What this call's model requests cost, as the backend reported it.
        public var usage: Usage = Usage()
        /// Durable threads: why this turn could not be stored (it is kept in memory only).
        public var storeError: String? = nil
        /// Turns this call took back (`rewind`).
        public var rewound: Int = 0
        /// "length": the reply stopped at the output cap (`Generation.finishReason`).
        public var finishReason: String? = nil
    }

    /// A turn the model has answered but the history does not hold yet: a call's result until
    /// it is `commit`ted (the call ended un-stopped) or `discard`ed (cancelled, timed out).
    public struct Staged: Sendable {
        fileprivate let turn: Turn
        /// The newest turns of the history the call took back (`rewind`), dropped when committing.
        fileprivate let rewound: Int
        /// The turns of the history to drop when committing (condensing): `dropped` from `dropFrom`.
        fileprivate let dropFrom: Int
        fileprivate let dropped: Int
        fileprivate let promptTokens: Int?
        fileprivate let outputTokens: Int?
        fileprivate let usage: Usage
        fileprivate let finishReason: String?
        public var text: String { turn.response }
    }

    private let backend: any ModelBackend
    public let instructions: String?
    public let tools: [ModelTool]
    public private(set) var history: [Turn] = []
    /// Turns condensing dropped from this conversation (and the one it was forked from) in this process.
    public private(set) var condensedAway = 0
    /// Disposable: rebuilt from `history` after condensing or any failed call.
    private var session: (any ModelSession)?
    private var instructionTokens: Int?
    /// Which thread this is to the backend, across the sessions it rebuilds.
    private let affinity: SessionAffinity

    /// `history`: a stored thread's turns; its session is rebuilt from them on the first call,
    /// the same way as after condensing. `affinity`: the thread's (its conversations share it).
    public init(backend: any ModelBackend, instructions: String?, tools: [ModelTool], history: [Turn] = [],
                affinity: SessionAffinity? = nil, condensedAway: Int = 0) {
        self.condensedAway = condensedAway
        self.backend = backend
        self.instructions = instructions
        self.tools = tools
        self.history = history
        self.affinity = affinity ?? SessionAffinity(key: nil)
    }

    /// Answers `prompt` in this conversation, staging the turn: the history is left exactly as
    /// it was until `commit`, which must come before any other call (the thread's gate sees to it).
    /// `rewind`: the model answers as if the last `rewind` turns had never been (the caller has
    /// checked there are that many); they go at the commit.
    nonisolated(nonsending)
    public func respond(to callerPrompt: String, files: FileRequest? = nil, settings: GenerationSettings,
                        onPartial: PartialHandler?, rewind: Int = 0) async throws -> Staged {
        if Task.isCancelled { throw WispError.callCancelled }
        // The live session heard the turns being taken back.
        if rewind > 0 { session = nil }
        let context = max(1, await backend.contextSize())
        let message = ModelPrompt(text: callerPrompt, files: try await Self.attach(files, context: context))
        if !message.files.isEmpty { try await checkFilesFit(message, context: context, settings: settings) }
        let prompt = message.rendered
        let condensing = await backend.condensing()
        let ask = Ask(message: message, prompt: prompt, settings: settings, rewind: rewind, condensing: condensing,
                      promptTokens: try await backend.tokenCount(prompt))
        var window = Window(history.dropLast(rewind), condensing: condensing)
        try await trim(&window, for: ask, context: context)
        if window.dropped > 0 { session = nil }
        return try await answer(ask, window: window, context: context, onPartial: onPartial)
    }

    /// What one call asks, as the steps of `respond` share it.
    private struct Ask {
        let message: ModelPrompt
        /// `message` as the model reads it.
        let prompt: String
        let settings: GenerationSettings
        let rewind: Int
        let condensing: Condensing
        /// The prompt's tokens, where the backend counts them.
        let promptTokens: Int?
    }

    /// The history a call sends: the first turn fixed (`head`, when condensing goes in steps),
    /// then the turns condensing may drop, oldest first (`kept`).
    private struct Window {
        var head: ArraySlice<Turn>
        var kept: ArraySlice<Turn>
        /// Where in the history the dropped turns start, and how many.
        var dropFrom: Int
        var dropped = 0
        /// Overflows the model reported during this call.
        var overflows = 0

        /// Condensing in steps keeps the first turn with the instructions (a prefix the server
        /// has cached since the thread began); what it drops is the turns after it.
        init(_ view: ArraySlice<Turn>, condensing: Condensing) {
            if case .steps = condensing, view.count > 1 { dropFrom = 1 } else { dropFrom = 0 }
            head = view[view.startIndex..<view.startIndex + dropFrom]
            kept = view[(view.startIndex + dropFrom)...]
        }

        var sent: ArraySlice<Turn> { head.isEmpty ? kept : (head + kept)[...] }

        /// Drops the oldest kept turns, counting their tokens off `total`, until it is at most `target`.
        mutating func drop(from total: Int, downTo target: Int) {
            var total = total
            while total > target, let oldest = kept.first {
                total = total.subtractingClamped(oldest.tokens)
                kept.removeFirst()
                dropped += 1
            }
        }
    }

    /// Attached files become part of this turn's prompt: counted once, kept with the turn.
    nonisolated(nonsending)
    private static func attach(_ files: FileRequest?, context: Int) async throws -> [AttachedFile] {
        guard let files else { return [] }
        // Off the pipe loop: it reads the disk.
        return try await offPipeLoop(ifDropped: WispError.callCancelled) { () throws(WispError) in
            try FileAttachments.read(files, context: context)
        }
    }

    /// Pre-flight: where the model can count, drops what cannot fit beside the prompt and a reply
    /// reserve: the whole request as the model's template counts it, else the sum of its parts.
    /// Once something must go, condensing goes down to its target (`Condensing`).
    nonisolated(nonsending)
    private func trim(_ window: inout Window, for ask: Ask, context: Int) async throws {
        let reserve = Self.replyReserve(ask.settings, context: context)
        let target = ask.condensing.target(context)
        if var whole = try await backend.promptTokens(instructions: instructions, tools: tools, history: window.sent,
                                                      prompt: ask.prompt, settings: ask.settings) {
            // Turns' own counts choose what to drop; the request is counted again until it fits.
            while whole.addingClamped(reserve) > (window.dropped > 0 ? target : context), !window.kept.isEmpty {
                window.drop(from: whole.addingClamped(reserve), downTo: target)
                guard let recount = try await backend.promptTokens(instructions: instructions, tools: tools,
                                                                   history: window.sent, prompt: ask.prompt,
                                                                   settings: ask.settings) else { break }
                whole = recount
            }
        } else if let promptTokens = ask.promptTokens {
            let total = [try await countInstructions(), promptTokens, reserve,
                         window.sent.map(\.tokens).clampedSum()].clampedSum()
            if total > context { window.drop(from: total, downTo: target) }
        }
    }

    /// Asks the model, and recovers from an overflow it reports (or a prompt the server read
    /// short) by dropping the oldest whole turns and asking again, until the prompt fits or
    /// nothing is left to drop.
    nonisolated(nonsending)
    private func answer(_ ask: Ask, window: Window, context: Int, onPartial: PartialHandler?) async throws -> Staged {
        var window = window, context = context
        while true {
            let active = await liveSession(sending: window)
            do {
                let g = try await (ask.message.files.isEmpty
                    ? active.respond(to: ask.prompt, settings: ask.settings, onPartial: onPartial)
                    : active.respond(to: ask.message, settings: ask.settings, onPartial: onPartial))
                // Before the turn is committed: a reply that misses the schema, or could not be
                // delivered, never joins the history.
                try await OutputSchema.checkReply(g.text, settings: ask.settings)
                let turn = Turn(prompt: ask.prompt, toolExchanges: g.toolExchanges, response: g.text,
                                reasoning: g.reasoning,
                                tokens: turnTokens(prompt: ask.prompt, promptTokens: ask.promptTokens, generation: g),
                                structured: ask.settings.schema != nil)
                return Staged(turn: turn, rewound: ask.rewind, dropFrom: window.dropFrom, dropped: window.dropped,
                              promptTokens: g.promptTokens,
                              outputTokens: g.outputTokens, usage: g.usage, finishReason: g.finishReason)
            } catch let error as WispError where error.code == .contextOverflow {
                session = nil
                // The server may have taught the backend a smaller window (a prompt it cut).
                context = max(1, await backend.contextSize())
                try await makeRoom(&window, after: error, for: ask, context: context)
            } catch {
                session = nil
                throw Self.failure(error, dropped: window.dropped, context: context)
            }
        }
    }

    /// The live session, or one made from the turns `window` sends.
    nonisolated(nonsending)
    private func liveSession(sending window: Window) async -> any ModelSession {
        if let session { return session }
        let history = Array(window.sent)
        let active = backend.makeSession(instructions: instructions, tools: tools, history: history,
                                         affinity: affinity)
        if !history.isEmpty { await active.prewarm() }
        session = active
        return active
    }

    /// After an overflow: drops the oldest whole turns for the next try, the fixed first turn
    /// last; with nothing left to drop, the overflow is the call's error.
    nonisolated(nonsending)
    private func makeRoom(_ window: inout Window, after error: WispError, for ask: Ask, context: Int) async throws {
        if window.kept.isEmpty, !window.head.isEmpty {
            // The fixed first turn goes last, before the prompt is found not to fit alone.
            window.kept = window.head
            window.head = []
            window.dropFrom = 0
        }
        guard !window.kept.isEmpty else {
            throw try await unfit(error, prompt: ask.prompt, promptTokens: ask.promptTokens, context: context,
                                  settings: ask.settings, rewind: ask.rewind)
        }
        window.overflows += 1
        let n = dropCount(kept: window.kept, fixed: window.head.map(\.tokens).clampedSum(), prompt: ask.prompt,
                          context: ask.condensing.target(context), overflows: window.overflows)
        window.kept.removeFirst(n)
        window.dropped += n
    }

    /// A failure other than an overflow, as the call reports it.
    private static func failure(_ error: any Error, dropped: Int, context: Int) -> WispError {
        if Task.isCancelled { return WispError.callCancelled }
        let e = WispError.from(error)
        // A session rebuilt without the oldest turns that the model will not take (Apple's
        // unsupportedTranscriptContent, say) means condensing cannot save this thread.
        guard dropped > 0, e.code == .internal else { return e }
        return WispError(.contextOverflow, """
            Close this thread (close_thread) and start another: it outgrew the model's \(context)-token \
            context, and rebuilding it with its \(dropped) oldest turn(s) dropped failed (\(e.message)). \
            In the new thread, a shorter prompt or shorter instructions leave more room.
            """)
    }

    /// What an overflow with no earlier turn left to drop says: whether the prompt itself is too
    /// big or only the reply did not fit beside it, and closing the thread only where there is one.
    nonisolated(nonsending)
    private func unfit(_ error: WispError, prompt: String, promptTokens: Int?, context: Int,
                       settings: GenerationSettings, rewind: Int) async throws -> WispError {
        let alone = try await backend.promptTokens(instructions: instructions, tools: tools, history: [],
                                                   prompt: prompt, settings: settings)
        var own = alone ?? 0
        if alone == nil { own = try await countInstructions().addingClamped(promptTokens ?? estimatedTokens(prompt)) }
        let fresh = history.count == rewind
        if own < context {
            let dropped = fresh ? "" : ", with every earlier turn of this thread dropped"
            return WispError(.contextOverflow, """
                the reply did not fit in the model's \(context)-token context: the prompt and instructions take \
                \(own) tokens of it\(dropped), and the model's reply ran past the rest (\(error.message)). Ask for \
                a shorter reply (a smaller max_output_tokens, or a prompt that asks for less), or shorten the prompt.
                """)
        }
        if fresh {
            return WispError(.contextOverflow, """
                the prompt does not fit in the model's \(context)-token context: with the instructions it takes \
                \(own) tokens (\(error.message)). Shorten the prompt (or the instructions) to make it fit; no thread \
                was created, so the call can be sent again as it is once it fits.
                """)
        }
        return WispError(.contextOverflow, """
            Close this thread (close_thread) and start another: the prompt does not fit in the model's \
            \(context)-token context even with every earlier turn of this thread dropped (\(error.message)). \
            Shorten the prompt (or the new thread's instructions) to make it fit.
            """)
    }

    /// Makes a staged turn part of the history, dropping what condensing dropped for it.
    public func commit(_ staged: Staged) -> Outcome {
        let created = history.isEmpty
        // Appended in place: rebuilding the array cost O(turns) per call on a long thread.
        if staged.rewound > 0 { history.removeLast(staged.rewound) }
        if staged.dropped > 0 { history.removeSubrange(staged.dropFrom..<staged.dropFrom + staged.dropped) }
        condensedAway += staged.dropped
        history.append(staged.turn)
        return Outcome(text: staged.turn.response, created: created, condensed: staged.dropped > 0,
                       turns: history.count,
                       dropped: staged.dropped, promptTokens: staged.promptTokens, outputTokens: staged.outputTokens,
                       usage: staged.usage, rewound: staged.rewound, finishReason: staged.finishReason)
    }

    /// Forgets a staged turn. The live session heard it, so it goes too, rebuilt from the history next time.
    public func discard(_ staged: Staged) {
        session = nil
    }

    /// What `commit(staged)` takes out of the history (the turns rewound and dropped), captured
    /// before it so that a commit the store could not make in time can be taken back whole.
    public struct Undo: Sendable {
        fileprivate let rewoundTurns: [Turn]
        fileprivate let droppedTurns: [Turn]
        fileprivate let dropFrom: Int
    }

    public func undo(of staged: Staged) -> Undo {
        let kept = history.dropLast(staged.rewound)
        return Undo(rewoundTurns: Array(history.suffix(staged.rewound)),
                    droppedTurns: Array(kept.dropFirst(staged.dropFrom).prefix(staged.dropped)),
                    dropFrom: staged.dropFrom)
    }

    /// Takes back the turn just committed: the history is as before it (the session is rebuilt).
    public func revert(_ undo: Undo) {
        history.removeLast()
        history.insert(contentsOf: undo.droppedTurns, at: undo.dropFrom)
        history.append(contentsOf: undo.rewoundTurns)
        condensedAway -= undo.droppedTurns.count
        session = nil
    }

    /// The tokens kept free for the reply: what the call allows it, at most a quarter of the context.
    static func replyReserve(_ settings: GenerationSettings, context: Int) -> Int {
        min(settings.maxOutputTokens ?? 512, context / 4)
    }

    /// Refuses, before the model is called, files that cannot fit even with every earlier turn
    /// dropped, naming each with its size in tokens.
    nonisolated(nonsending)
    private func checkFilesFit(_ message: ModelPrompt, context: Int, settings: GenerationSettings) async throws {
        var sizes: [(String, Int)] = []
        for file in message.files {
            sizes.append((file.path, try await backend.tokenCount(file.block) ?? estimatedTokens(file.block)))
        }
        let text = try await backend.tokenCount(message.text) ?? estimatedTokens(message.text)
        let own = try await countInstructions().addingClamped(text)
        let reserve = Self.replyReserve(settings, context: context)
        let total = [own, reserve, sizes.map(\.1).clampedSum()].clampedSum()
        guard total > context else { return }
        let each = sizes.map { "\($0.0) (\($0.1) tokens)" }.joined(separator: ", ")
        throw WispError(.contextOverflow, """
            files: the attached files do not fit in the model's \(context)-token context even with every earlier \
            turn of this thread dropped: \(each), beside \(own) tokens of prompt and instructions and \(reserve) kept \
            for the reply. Attach fewer or smaller files.
            """)
    }

    /// How many of the oldest turns to drop after the model reported an overflow: the first
    /// time, enough for the estimate of what remains to fit `context` (condensing's target); after that, a quarter (at
    /// least
    /// one), so a model whose tokens run larger than the estimate converges in few retries.
    /// `fixed`: the tokens of the turns kept before `kept` (the first turn, condensing in steps).
    private func dropCount(kept: ArraySlice<Turn>, fixed: Int, prompt: String, context: Int, overflows: Int) -> Int {
        guard overflows == 1 else { return max(1, kept.count / 4) }
        var total = [estimatedTokens(instructions ?? ""), estimatedTokens(prompt), fixed,
                     kept.map(\.tokens).clampedSum()].clampedSum()
        var n = 0
        for turn in kept where total > context {
            total = total.subtractingClamped(turn.tokens)
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
        // A backend's output count includes its reasoning; an estimate adds the reasoning text.
        let output = g.outputTokens ?? (estimatedTokens(g.text) + estimatedTokens(g.reasoning ?? ""))
        return ([promptTokens ?? estimatedTokens(prompt), output] + g.toolExchanges.map(\.estimatedTokens)).clampedSum()
    }
}
