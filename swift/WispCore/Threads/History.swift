/// A thread's canonical history: wisp's own values, never a backend's. A backend session is
/// disposable and is always rebuilt from these.

/// One call the model made to a model tool inside a turn, with what the tool returned.
public struct ToolExchange: Sendable, Codable, Equatable {
    public var name: String
    /// The arguments as the model produced them: a JSON object, as text.
    public var arguments: String
    public var output: String
    /// True when the tool refused or failed; `output` then holds the message the model saw.
    public var failed: Bool

    public init(name: String, arguments: String, output: String, failed: Bool = false) {
        self.name = name
        self.arguments = arguments
        self.output = output
        self.failed = failed
    }

    /// What the exchange takes in a context when the backend cannot count: the estimate of its
    /// name, arguments and output.
    public var estimatedTokens: Int {
        WispCore.estimatedTokens(name) + WispCore.estimatedTokens(arguments) + WispCore.estimatedTokens(output)
    }
}

/// One whole exchange: the caller's prompt, any tool calls the model made, and its reply.
/// Condensing drops whole turns only, so a tool output never loses its call.
public struct Turn: Sendable, Codable, Equatable {
    public var prompt: String
    public var toolExchanges: [ToolExchange]
    public var response: String
    /// The model's reasoning before its reply, where the backend returned it (never part of
    /// `response`). It goes with its turn: condensing drops both.
    public var reasoning: String?
    /// Tokens this turn occupies in the context, counted once when the turn was committed.
    public var tokens: Int
    /// The call had a `schema`: `response` is the JSON text of its value.
    public var structured: Bool

    public init(prompt: String, toolExchanges: [ToolExchange] = [], response: String, reasoning: String? = nil,
                tokens: Int? = nil,
                structured: Bool = false) {
        self.structured = structured
        self.prompt = prompt
        self.toolExchanges = toolExchanges
        self.response = response
        self.reasoning = reasoning
        self.tokens = tokens ?? Turn.estimateTokens(prompt: prompt, toolExchanges: toolExchanges, response: response,
                                                    reasoning: reasoning)
    }

    static func estimateTokens(prompt: String, toolExchanges: [ToolExchange], response: String,
                               reasoning: String? = nil) -> Int {
        var n = estimatedTokens(prompt) + estimatedTokens(response) + estimatedTokens(reasoning ?? "")
        for t in toolExchanges { n += t.estimatedTokens }
        return n
    }
}

/// The fallback token estimate when a backend cannot count: ceil(UTF-8 bytes / 4).
/// It is also the echo backend's exact rule (docs/echo.md).
@inlinable
public func estimatedTokens(_ text: String) -> Int {
    (text.utf8.count + 3) / 4
}
