/// Chooses the backend for a configuration. Each backend lives in its own folder beside this
/// file. `echoCrash` is what the echo backend's `!crash` does (see `EchoBackend`).
public func makeBackend(_ config: CoreConfig,
                        echoCrash: @escaping @Sendable () -> Never) throws(WispError) -> any ModelBackend {
    switch config.backend {
    case .echo:
        return EchoBackend(contextSize: config.contextSize, delayMs: config.echoDelayMs, crash: echoCrash)
    case .openai:
        return try OpenAIBackend(config)
    case .apple:
        #if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
        if #available(macOS 26.0, *) { return AppleBackend() }
        #endif
        throw WispError(.modelUnavailable,
                        "the apple backend needs macOS 26+ with FoundationModels; it is not available on this system")
    case .auto:
        #if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
        // With no endpoint to fall back to, apple still: its availability() says why it cannot answer.
        if #available(macOS 26.0, *), AppleBackend.isAvailable || config.endpoints.isEmpty { return AppleBackend() }
        #endif
        if !config.endpoints.isEmpty {
            var c = config
            c.backend = .openai
            return try makeBackend(c, echoCrash: echoCrash)
        }
        throw WispError(.modelUnavailable,
                "no model backend is available: set --endpoint (an OpenAI-compatible server), or use --backend echo " +
                "to try wisp without a model")
    }
}

/// Stands in when the configured backend cannot start, so the core still comes up, reports
/// the reason in `status`, and fails each call with it instead of dying.
public struct UnavailableBackend: ModelBackend {
    public let name: String
    public let model = "none"
    let reason: String

    public init(name: String, reason: String) {
        self.name = name
        self.reason = reason
    }

    public func availability() async -> Availability { .unavailable(reason) }
    public func contextSize() async -> Int { 0 }
    public func tokenCount(_ text: String) async throws -> Int? { nil }
    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        UnavailableSession(reason: reason)
    }
}

final class UnavailableSession: ModelSession {
    let reason: String
    init(reason: String) { self.reason = reason }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        throw WispError(.modelUnavailable, reason)
    }
}
