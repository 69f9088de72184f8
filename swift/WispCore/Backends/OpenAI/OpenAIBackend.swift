#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

/// `openai`: any OpenAI-compatible chat server (llama.cpp's `llama-server`, Ollama, vLLM,
/// LM Studio, OpenAI itself) over `POST {endpoint}/chat/completions` with streaming (SSE).
///
/// The endpoint is the API's base URL, the same value an OpenAI SDK takes as `base_url`:
/// `http://127.0.0.1:8080/v1`. A bare `http://host:port` gets `/v1` appended (every server
/// above serves the API there); a trailing `/chat/completions` is ignored.
///
/// Beyond the OpenAI API it reads what a server says about itself, once, and caches it:
/// - context size: llama.cpp `GET /props` (`default_generation_settings.n_ctx`), vLLM
///   `GET /v1/models` (`max_model_len`), Ollama `POST /api/show` (`num_ctx` in `parameters`);
///   else `--context-size`, else 4096.
/// - token counts: a whole request with llama.cpp's `POST /v1/chat/completions/input_tokens`
///   (the chat template and tools applied: the request's `prompt_tokens`); a text with llama.cpp's
///   (and vLLM's) `POST /tokenize`; else nil (the core estimates).
/// - usage: the stream's `usage` (asked for with `stream_options.include_usage`), each request's
///   added up; `reasoning_effort` for `reasoning`; reasoning deltas kept apart from the reply.
/// - slots: llama.cpp's `total_slots` in `/props`, or `--slots`: each thread's requests name
///   its slot (`id_slot`, `cache_prompt`; `OpenAISlots.swift`), so that its earlier turns stay
///   in llama-server's KV cache. Sent to llama.cpp's server only: others may refuse unknown fields.
/// - overflow: llama.cpp's `exceed_context_size_error`, llama-cpp-python's and OpenAI's
///   `context_length_exceeded`, vLLM's "maximum context length" message → `contextOverflow`.
///
/// Here the facade; the conversation and its tool loop are `OpenAISession`, what the server says
/// about itself `OpenAIServer`, the chat request and its stream `OpenAIChat.swift`, the servers'
/// error dialects `OpenAIErrors.swift`, and the HTTP underneath WispInfrastructure's `HTTP/`.
///
/// Several endpoints make a fleet (`Fleet.swift`, `FleetSession.swift`): each thread pinned to
/// one, moved when it fails, every endpoint checked from the start (`FleetChecks.swift`). What
/// the backend says of the model (its window, counts, condensing) is the first endpoint's that
/// is up: the fleet serves one model, and no turn waits on an endpoint that is not answering.
public struct OpenAIBackend: ModelBackend {
    public let name = "openai"
    let fleet: FleetChecks
    var servers: [OpenAIServer] { fleet.servers }
    /// The endpoint named for the model: the first one up, else the first not left out.
    var server: OpenAIServer {
        servers.first { $0.health.withLock { $0.usable } }
            ?? servers.first { $0.health.withLock { $0.leftOut == nil } } ?? servers[0]
    }

    /// The endpoint asked about the model: the only one, or the first one up (once one is); nil
    /// while none is, so that nothing waits on a server that is not answering.
    func asked() async -> OpenAIServer? {
        guard servers.count > 1 else { return servers[0] }
        await fleet.settle()
        return servers.first { $0.health.withLock { $0.usable } }
    }

    /// Throws when an endpoint is not an http(s) URL.
    public init(endpoints: [String], model: String?, apiKey: String?, contextSize: Int?, slots: Int? = nil,
                keepAlive: String? = CoreConfig.defaultKeepAlive,
                condenseTo: Double = CoreConfig.defaultCondenseTo,
                sessionHeader: String? = CoreConfig.defaultSessionHeader) throws(WispError) {
        guard !endpoints.isEmpty else {
            throw WispError(.modelUnavailable,
                    "the openai backend needs --endpoint (an OpenAI-compatible " +
                    "base URL such as http://127.0.0.1:8080/v1)")
        }
        var made: [OpenAIServer] = []
        for endpoint in endpoints {
            made.append(try OpenAIServer(endpoint: endpoint, model: model, apiKey: apiKey, contextSize: contextSize,
                                         slots: slots, keepAlive: keepAlive.flatMap(OllamaKeepAlive.init),
                                         lowWater: condenseTo, sessionHeader: sessionHeader))
        }
        fleet = FleetChecks(servers: made)
        // In the background: the core's start is not delayed, and the first call finds them judged.
        if made.count > 1 { fleet.scheduleChecks() }
    }

    public init(endpoint: String, model: String?, apiKey: String?, contextSize: Int?, slots: Int? = nil,
                keepAlive: String? = CoreConfig.defaultKeepAlive,
                condenseTo: Double = CoreConfig.defaultCondenseTo) throws(WispError) {
        try self.init(endpoints: [endpoint], model: model, apiKey: apiKey, contextSize: contextSize, slots: slots,
                      keepAlive: keepAlive, condenseTo: condenseTo)
    }

    public init(_ config: CoreConfig) throws(WispError) {
        try self.init(endpoints: config.endpoints, model: config.model, apiKey: config.apiKey,
                      contextSize: config.contextSize, slots: config.slots, keepAlive: config.keepAlive,
                      condenseTo: config.condenseTo, sessionHeader: config.sessionHeader)
    }

    public var model: String { server.modelName }

    /// In a fleet: ready while an endpoint is up, as its checks judged it (`FleetChecks`).
    public func availability() async -> Availability {
        guard let server = await asked() else {
            return .unavailable("no model server can answer: " + servers.map { s in
                let h = s.health.withLock { $0 }
                return "\(s.hostPort): \(h.leftOut ?? h.down?.reason ?? "not judged yet")"
            }.joined(separator: "; "))
        }
        return servers.count > 1 ? .ready : await server.availability()
    }

    /// Each endpoint as `--check` shows it; in a fleet, as its checks last found it (its first
    /// check waited for), so that an endpoint that does not answer slows no `status`.
    public func endpoints() async -> [EndpointInfo]? {
        guard servers.count > 1 else { return [await servers[0].state(pinned: 0, judge: false)] }
        return await fleet.report()
    }

    public func stop() { fleet.stop() }

    public func contextSize() async -> Int {
        await asked()?.contextSize() ?? servers[0].configuredContextSize ?? OpenAIServer.fallbackContextSize
    }

    public func contextNote() async -> String? { server.contextNote }

    public func condensing() async -> Condensing {
        guard let server = await asked() else { return .justEnough }
        let slots = await server.slotPool() != nil
        let dialect = server.facts.withLock { $0.dialect } ?? .generic
        return dialect.shiftsCache(slots: slots) ? .justEnough : .steps(lowWater: server.lowWater)
    }

    public func tokenCount(_ text: String) async throws -> Int? { try await asked()?.tokenCount(text) ?? nil }

    /// The request the session would send for `prompt` (its first round), counted by the server.
    public func promptTokens(instructions: String?, tools: [ModelTool], history: ArraySlice<Turn>, prompt: String,
                             settings: GenerationSettings) async throws -> Int? {
        let messages = OpenAISession.messages(instructions: instructions, history: history) + [.text("user", prompt)]
        // Sampling and output settings do not change the prompt; the template's inputs do.
        let counted = GenerationSettings(reasoning: settings.reasoning)
        guard let server = await asked() else { return nil }
        let body = try OpenAIServer.chatBody(model: await server.requestModel(), messages: messages,
                                             tools: OpenAISession.offered(tools, settings), toolChoice: nil,
                                             settings: counted)
        return try await server.inputTokens(body: body)
    }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        guard servers.count > 1 else {
            return OpenAISession(server: servers[0], instructions: instructions, tools: tools, history: history)
        }
        return makeSession(instructions: instructions, tools: tools, history: history,
                           affinity: SessionAffinity(key: nil))
    }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn],
                            affinity: SessionAffinity) -> any ModelSession {
        guard servers.count > 1 else {
            return OpenAISession(server: servers[0], instructions: instructions, tools: tools, history: history,
                                 affinity: affinity)
        }
        return FleetSession(fleet: fleet, instructions: instructions, tools: tools, history: history,
                            affinity: affinity)
    }
}
