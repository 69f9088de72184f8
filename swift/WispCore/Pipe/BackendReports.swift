/// The pipe's form of what a backend reports (ModelBackend.swift): what a call waits for, and
/// what it cost. Apart from the messages, which the fuzz target builds without the backends.

extension Stage {
    public init(id: Int, _ waiting: Waiting) {
        switch waiting {
        case .queue(let ahead): self.init(id: id, stage: "queue", count: ahead)
        case .slot: self.init(id: id, stage: "slot")
        case .prompt(let tokens): self.init(id: id, stage: "prompt", count: tokens)
        }
    }
}

extension UsageBody {
    /// One call's usage, with its timing.
    public init(_ u: Usage) {
        self.init(input_tokens: u.inputTokens, output_tokens: u.outputTokens, reasoning_tokens: u.reasoningTokens,
                  cached_tokens: u.cachedTokens,
                  first_token_ms: u.firstTokenSeconds.map { Int(min(max(0, $0), 1e9) * 1000) },
                  output_tokens_per_s: u.outputTokensPerSecond.map { ($0 * 10).rounded() / 10 },
                  endpoint: u.endpoint)
    }

    /// Counts summed over calls.
    public init(totals u: Usage) {
        self.init(input_tokens: u.inputTokens, output_tokens: u.outputTokens, reasoning_tokens: u.reasoningTokens,
                  cached_tokens: u.cachedTokens)
    }
}
