/// The seam between wisp's thread layer and a model. It is wisp's own protocol, so the actor
/// layer runs on Linux exactly as on a Mac; each backend lives in its own folder beside this file.

/// Per-call generation settings, as the caller passed them.
public struct GenerationSettings: Sendable, Equatable {
    public var temperature: Double?
    public var maxOutputTokens: Int?
    /// Structured output for this call: the reply must be JSON matching it (OutputSchema.swift).
    public var schema: OutputSchema?

    public init(temperature: Double? = nil, maxOutputTokens: Int? = nil, schema: OutputSchema? = nil) {
        self.temperature = temperature
        self.maxOutputTokens = maxOutputTokens
        self.schema = schema
    }
}

/// A partial reply while it is generated: `text` is cumulative, `tokens` counts generated tokens so far.
public struct PartialReply: Sendable, Equatable {
    public var text: String
    public var tokens: Int

    public init(text: String, tokens: Int) {
        self.text = text
        self.tokens = tokens
    }
}

/// A finished reply, with any tool calls the model made on the way (they join the turn).
public struct Generation: Sendable, Equatable {
    public var text: String
    public var toolExchanges: [ToolExchange]
    public var promptTokens: Int?
    public var outputTokens: Int?

    public init(text: String, toolExchanges: [ToolExchange] = [], promptTokens: Int? = nil, outputTokens: Int? = nil) {
        self.text = text
        self.toolExchanges = toolExchanges
        self.promptTokens = promptTokens
        self.outputTokens = outputTokens
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

    /// A fresh session that already holds `history` after `instructions`, with `tools`
    /// bound. Sessions are not Sendable: each one lives inside one thread's actor.
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession

    /// The same, for the thread `affinity` names: a backend that keeps a conversation's state on
    /// the model's side (llama-server's slots) keeps it for the thread across the sessions the
    /// thread rebuilds. Default: `affinity` is not needed.
    func makeSession(instructions: String?, tools: [ModelTool], history: [Turn], affinity: SessionAffinity) -> any ModelSession
}

extension ModelBackend {
    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn], affinity: SessionAffinity) -> any ModelSession {
        makeSession(instructions: instructions, tools: tools, history: history)
    }
}

/// One thread, as a backend sees it across the sessions the thread rebuilds (after condensing,
/// a failed call, a resume from the store). Alive as long as the thread: a backend holds it
/// weakly, so a closed or evicted thread gives up what the backend kept for it. `key` (the
/// thread id; nil for a conversation of no thread) lets a thread that comes back under the same id
/// (resumed from the store) find what it left.
public final class SessionAffinity: Sendable {
    public let key: String?

    public init(key: String?) { self.key = key }
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
    func respond(to prompt: ModelPrompt, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation

    /// Warm the model after a rebuild, where the backend can. Default: nothing.
    nonisolated(nonsending)
    func prewarm() async
}

extension ModelSession {
    public nonisolated(nonsending) func prewarm() async {}

    public nonisolated(nonsending)
    func respond(to prompt: ModelPrompt, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        try await respond(to: prompt.rendered, settings: settings, onPartial: onPartial)
    }
}
