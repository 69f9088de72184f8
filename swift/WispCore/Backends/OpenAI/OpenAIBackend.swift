#if canImport(FoundationEssentials)
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
public struct OpenAIBackend: ModelBackend {
    public let name = "openai"
    let server: OpenAIServer

    /// Throws when `endpoint` is not an http(s) URL.
    public init(endpoint: String, model: String?, apiKey: String?, contextSize: Int?, slots: Int? = nil,
                keepAlive: String? = CoreConfig.defaultKeepAlive,
                condenseTo: Double = CoreConfig.defaultCondenseTo) throws(WispError) {
        server = try OpenAIServer(endpoint: endpoint, model: model, apiKey: apiKey, contextSize: contextSize,
                                  slots: slots,
                                  keepAlive: keepAlive.flatMap(OllamaKeepAlive.init), lowWater: condenseTo)
    }

    public init(_ config: CoreConfig) throws(WispError) {
        guard let endpoint = config.endpoint else {
            throw WispError(.modelUnavailable,
                    "the openai backend needs --endpoint (an OpenAI-compatible " +
                    "base URL such as http://127.0.0.1:8080/v1)")
        }
        try self.init(endpoint: endpoint, model: config.model, apiKey: config.apiKey, contextSize: config.contextSize,
                      slots: config.slots,
                      keepAlive: config.keepAlive, condenseTo: config.condenseTo)
    }

    public var model: String { server.modelName }

    public func availability() async -> Availability { await server.availability() }

    public func contextSize() async -> Int { await server.contextSize() }

    public func contextNote() async -> String? { server.contextNote }

    public func condensing() async -> Condensing {
        let slots = await server.slotPool() != nil
        let dialect = server.facts.withLock { $0.dialect } ?? .generic
        return dialect.shiftsCache(slots: slots) ? .justEnough : .steps(lowWater: server.lowWater)
    }

    public func tokenCount(_ text: String) async throws -> Int? { try await server.tokenCount(text) }

    /// The request the session would send for `prompt` (its first round), counted by the server.
    public func promptTokens(instructions: String?, tools: [ModelTool], history: ArraySlice<Turn>, prompt: String,
                             settings: GenerationSettings) async throws -> Int? {
        let messages = OpenAISession.messages(instructions: instructions, history: history) + [.text("user", prompt)]
        // Sampling and output settings do not change the prompt; the template's inputs do.
        let counted = GenerationSettings(reasoning: settings.reasoning)
        let body = try OpenAIServer.chatBody(model: await server.requestModel(), messages: messages,
                                             tools: OpenAISession.offered(tools, settings), toolChoice: nil,
                                             settings: counted)
        return try await server.inputTokens(body: body)
    }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        OpenAISession(server: server, instructions: instructions, tools: tools, history: history, affinity: nil)
    }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn],
                            affinity: SessionAffinity) -> any ModelSession {
        OpenAISession(server: server, instructions: instructions, tools: tools, history: history, affinity: affinity)
    }
}
