import WispInfrastructure

/// The seam between wisp's thread layer and a model. It is wisp's own protocol, so the actor
/// layer runs on Linux exactly as on a Mac; each backend lives in its own folder beside this file.

/// How hard a reasoning model thinks for one call (`respond`'s `reasoning`): each backend maps
/// it to its own setting, and one that has none refuses it rather than ignore it.
public enum ReasoningLevel: String, Sendable, Equatable, CaseIterable {
    case light, moderate, deep
}

/// Per-call generation settings, as the caller passed them.
public struct GenerationSettings: Sendable, Equatable {
    public var temperature: Double?
    public var maxOutputTokens: Int?
    /// Structured output for this call: the reply must be JSON matching it (OutputSchema.swift).
    public var schema: OutputSchema?
    /// Nil: the backend's default, and nothing about reasoning is sent.
    public var reasoning: ReasoningLevel?

    public init(temperature: Double? = nil, maxOutputTokens: Int? = nil, schema: OutputSchema? = nil,
                reasoning: ReasoningLevel? = nil) {
        self.temperature = temperature
        self.maxOutputTokens = maxOutputTokens
        self.schema = schema
        self.reasoning = reasoning
    }
}

/// What model requests cost, as the backend reported it: a count it did not report is nil,
/// never guessed. Summed over a call's requests (tool rounds) and over a thread's calls.
public struct Usage: Sendable, Equatable {
    public var inputTokens: Int?
    public var outputTokens: Int?
    /// Of `outputTokens`, those spent reasoning.
    public var reasoningTokens: Int?
    /// Of `inputTokens`, those the server took from its prompt cache rather than reading them again.
    public var cachedTokens: Int?
    /// Seconds from sending the first request to its first generated token, as wisp measured it.
    public var firstTokenSeconds: Double?
    /// Seconds spent generating, from each request's first token to its last, as wisp measured it.
    public var generationSeconds: Double?
    /// The model server that answered (host:port), where a backend has several; a sum keeps the later one.
    public var endpoint: String?

    public init(inputTokens: Int? = nil, outputTokens: Int? = nil, reasoningTokens: Int? = nil,
                cachedTokens: Int? = nil,
                firstTokenSeconds: Double? = nil, generationSeconds: Double? = nil) {
        self.inputTokens = inputTokens
        self.outputTokens = outputTokens
        self.reasoningTokens = reasoningTokens
        self.cachedTokens = cachedTokens
        self.firstTokenSeconds = firstTokenSeconds
        self.generationSeconds = generationSeconds
    }

    /// A count is known for the sum only where both parts report it: a sum over a request that
    /// reported nothing would pass an undercount for the real figure. The counts are a server's,
    /// so the sum saturates (a thread's total over many calls grows without bound). The first
    /// token is the earlier part's: the time a caller waited before anything came.
    public static func + (a: Usage, b: Usage) -> Usage {
        func add(_ x: Int?, _ y: Int?) -> Int? { if let x, let y { x.addingClamped(y) } else { nil } }
        func add(_ x: Double?, _ y: Double?) -> Double? { if let x, let y { x + y } else { nil } }
        var sum = Usage(inputTokens: add(a.inputTokens, b.inputTokens), outputTokens: add(a.outputTokens, b.outputTokens),
                        reasoningTokens: add(a.reasoningTokens, b.reasoningTokens),
                        cachedTokens: add(a.cachedTokens, b.cachedTokens),
                        firstTokenSeconds: a.firstTokenSeconds ?? b.firstTokenSeconds,
                        generationSeconds: add(a.generationSeconds, b.generationSeconds))
        sum.endpoint = b.endpoint ?? a.endpoint
        return sum
    }

    /// Output tokens a second while generating; nil where either part is unknown.
    public var outputTokensPerSecond: Double? {
        guard let outputTokens, let generationSeconds, generationSeconds > 0 else { return nil }
        return Double(outputTokens) / generationSeconds
    }
}

/// A partial reply while it is generated: `text` is cumulative, `tokens` counts generated tokens so far.
/// Before the first token, `waiting` says what the call waits for (text and tokens are then empty).
public struct PartialReply: Sendable, Equatable {
    public var text: String
    public var tokens: Int
    public var waiting: Waiting?

    public init(text: String, tokens: Int) {
        self.text = text
        self.tokens = tokens
    }

    public init(waiting: Waiting) {
        self.init(text: "", tokens: 0)
        self.waiting = waiting
    }
}

/// What a call waits for before its first token, for a person watching it.
public enum Waiting: Sendable, Equatable {
    /// Its turn on the thread: `ahead` calls of the same thread come first.
    case queue(ahead: Int)
    /// A model slot: every one is busy with another thread's request.
    case slot
    /// The model reading the prompt, of `tokens` tokens where known.
    case prompt(tokens: Int?)
}

/// A finished reply, with any tool calls the model made on the way (they join the turn).
public struct Generation: Sendable, Equatable {
    public var text: String
    public var toolExchanges: [ToolExchange]
    public var promptTokens: Int?
    public var outputTokens: Int?
    /// What the call's model requests cost, added up (tool rounds included).
    public var usage: Usage
    /// The model's reasoning, where the backend returns it apart from the reply: never part of `text`.
    public var reasoning: String?
    /// "length" when the model server stopped the reply at its output cap (the reply is cut
    /// short); nil when it ended on its own or the backend cannot tell.
    public var finishReason: String?

    public init(text: String, toolExchanges: [ToolExchange] = [], promptTokens: Int? = nil, outputTokens: Int? = nil,
                usage: Usage = Usage(), reasoning: String? = nil, finishReason: String? = nil) {
        self.text = text
        self.toolExchanges = toolExchanges
        self.promptTokens = promptTokens
        self.outputTokens = outputTokens
        self.usage = usage
        self.reasoning = reasoning
        self.finishReason = finishReason
    }
}

/// Whether the backend's model can answer now, and if not, why and what the user can do.
public struct Availability: Sendable, Equatable {
    public var available: Bool
    public var reason: String?

    public static let ready = Availability(available: true, reason: nil)
    public static func unavailable(_ reason: String) -> Availability { Availability(available: false, reason: reason) }

    public init(available: Bool, reason: String?) {
        self.available = available
        self.reason = reason
    }
}

/// Called with each partial reply. It runs inside the generating call, so it must be quick.
public typealias PartialHandler = @Sendable (PartialReply) -> Void

/// A model backend, shared by every thread.
public protocol ModelBackend: Sendable {
    /// `echo`, `openai` or `apple`.
    var name: String { get }
    /// The model's name as the backend knows it.
    var model: String { get }

    /// Whether the model can answer now. Cheap; called by `status` and before a call.
    func availability() async -> Availability

    /// The context window in tokens, read at run time. Never hard-coded by callers.
    func contextSize() async -> Int

    /// The model's own token count for `text`, or nil when this backend cannot count
    /// (the core then relies on the model's overflow report and `estimatedTokens`).
    func tokenCount(_ text: String) async throws -> Int?

    /// The tokens the model would read for `prompt` after `history`, counted by the model's own
    /// template (instructions, tools and the chat markup included), or nil when the backend cannot
    /// count a whole request (the core then adds up `tokenCount`s). Default: nil.
    func promptTokens(instructions: String?, tools: [ModelTool], history: ArraySlice<Turn>, prompt: String,
                      settings: GenerationSettings) async throws -> Int?

    /// A fresh session that already holds `history` after `instructions`, with `tools`
    /// bound. Sessions are not Sendable: each one lives inside one thread's actor.
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession

    /// How condensing drops turns on this backend's model (`Condensing`). Default: just enough.
    func condensing() async -> Condensing

    /// Why the context size is not what the model server first said (it was found to cut
    /// prompts silently), for `list_threads`; nil when nothing was learnt. Default: nil.
    func contextNote() async -> String?

    /// The same, for the thread `affinity` names: a backend that keeps a conversation's state on
    /// the model's side (llama-server's slots) keeps it for the thread across the sessions the
    /// thread rebuilds. Default: `affinity` is not needed.
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn],
                     affinity: SessionAffinity) -> any ModelSession

    /// Each model server of a backend that has several, for `--check`; nil for one. Default: nil.
    func endpoints() async -> [EndpointInfo]?

    /// Ends what the backend runs in the background (a fleet's rechecks), before the process
    /// exits. Default: nothing.
    func stop()
}

extension ModelBackend {
    public func condensing() async -> Condensing { .justEnough }

    public func endpoints() async -> [EndpointInfo]? { nil }

    public func stop() {}

    public func contextNote() async -> String? { nil }

    public func promptTokens(instructions: String?, tools: [ModelTool], history: ArraySlice<Turn>, prompt: String,
                             settings: GenerationSettings) async throws -> Int? { nil }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn],
                            affinity: SessionAffinity) -> any ModelSession {
        makeSession(instructions: instructions, tools: tools, history: history)
    }
}

/// How condensing drops a thread's turns when they no longer fit.
public enum Condensing: Sendable, Equatable {
    /// The oldest turns, just enough for the new one to fit: for a model that keeps what
    /// remains cached (llama.cpp's KV shifting, a model in this process).
    case justEnough
    /// Down to `lowWater` of the context, the instructions and first turn kept: for a server
    /// that caches only an unchanged prefix, so that the turns which follow extend one cached
    /// prefix until the next step, rather than the whole context being read again every turn.
    case steps(lowWater: Double)

    /// What a thread is condensed down to, in tokens of a `context`-token window.
    func target(_ context: Int) -> Int {
        switch self {
        case .justEnough: context
        case .steps(let lowWater): max(1, Int(Double(context) * min(max(lowWater, 0), 1)))
        }
    }
}

/// One thread, as a backend sees it across the sessions the thread rebuilds (after condensing,
/// a failed call, a resume from the store). Alive as long as the thread: a backend holds it
/// weakly, so a closed or evicted thread gives up what the backend kept for it. `key` (the
/// thread id; nil for a conversation of no thread) lets a thread that comes back under the same id
/// (resumed from the store) find what it left.
public final class SessionAffinity: Sendable {
    private struct Weak: Sendable { weak var affinity: SessionAffinity? }

    public let key: String?
    /// A fork's source, weakly: a backend with several endpoints starts the fork where its source
    /// is pinned, whose server already holds the context the two share.
    private let source: Locked<Weak>

    public init(key: String?, source: SessionAffinity? = nil) {
        self.key = key
        self.source = Locked(Weak(affinity: source))
    }

    /// The source, once: asked at the fork's first placement, forgotten after it.
    func takeSource() -> SessionAffinity? {
        source.withLock { s in defer { s.affinity = nil }; return s.affinity }
    }
}

/// One live conversation with the model. It runs on the owning thread's actor
/// (`nonisolated(nonsending)`), so it may keep mutable state without locks.
///
/// Contract: on success the session has appended the turn to its own transcript; on any
/// throw the caller discards the session and rebuilds one from its canonical history, so
/// a session need not undo a failed call. A context overflow must be thrown as
/// `WispError(.contextOverflow, …)`: that is what starts the core's condensing.
/// Cancellation arrives as Task cancellation and must end the call promptly.
public protocol ModelSession: AnyObject {
    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation

    /// A prompt with attached files. Default: the rendered text, as any other prompt (the echo
    /// backend answers from its parts, as its contract says).
    nonisolated(nonsending)
    func respond(to prompt: ModelPrompt, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation

    /// Warm the model after a rebuild, where the backend can. Default: nothing.
    nonisolated(nonsending)
    func prewarm() async
}

extension ModelSession {
    public nonisolated(nonsending) func prewarm() async {}

    public nonisolated(nonsending)
    func respond(to prompt: ModelPrompt, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        try await respond(to: prompt.rendered, settings: settings, onPartial: onPartial)
    }
}
