#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// What one streamed completion produced.
struct ChatReply: Sendable {
    var text = ""
    var toolCalls: [ToolCall] = []
    var finishReason: String?
    var promptTokens: Int?
    var outputTokens: Int?
    /// `completion_tokens_details.reasoning_tokens` (OpenAI; llama-server reports none).
    var reasoningTokens: Int?
    /// The reasoning the server streamed apart from the content (`reasoning_content`: llama.cpp,
    /// vLLM, DeepSeek; `reasoning`: Ollama, newer vLLM, OpenRouter).
    var reasoning = ""
    /// Content chunks received: a token count when the server does not report usage.
    var chunks = 0
    /// llama.cpp's `timings`: prompt tokens taken from the slot's cache, and evaluated.
    var cachedTokens: Int?
    var evaluatedTokens: Int?
    /// Seconds from sending the request to its first generated token (text, reasoning or a tool
    /// call), and from then to the stream's end.
    var firstTokenSeconds: Double?
    var generationSeconds: Double?

    /// Sets the two timings from when the request was sent and its first token came (nil: none came).
    mutating func time(sent: ContinuousClock.Instant, first: ContinuousClock.Instant?) {
        func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }
        guard let first else { return }
        firstTokenSeconds = seconds(first - sent)
        generationSeconds = seconds(ContinuousClock.now - first)
    }

    /// The prompt tokens the server read: `prompt_tokens`, plus the cached ones where a server
    /// reports them apart (more cached than counted: older Ollama counts only what it evaluated).
    var readTokens: Int? {
        // None read of a prompt that has messages is a server that did not count (older Ollama, cached).
        guard let promptTokens, promptTokens > 0 else { return nil }
        if let cachedTokens, cachedTokens > promptTokens { return promptTokens.addingClamped(cachedTokens) }
        return promptTokens
    }
}

/// llama.cpp's prompt cache fields for one request: sent to llama.cpp's server only.
struct PromptCache: Sendable, Equatable {
    /// `id_slot`: the thread's slot; nil lets the server choose.
    var slot: Int?

    /// `n_cache_reuse`: the shortest run of tokens llama-server moves in its slot's KV cache
    /// (shifting their positions) rather than evaluating them again, when a prompt matches the
    /// cache only after a gap. After condensing dropped a thread's oldest turns, the turns that
    /// remain are such a run (and so only the new turn is evaluated); a chat template's few
    /// tokens between messages are not, and must not pass for a match.
    static let reuseTokens = 64
}

/// The chat request: its body, and the SSE stream folded into one `ChatReply`.
extension OpenAIServer {
    /// The most one streamed answer may bring: several times what the pipe can carry as a reply
    /// (a stream spends bytes on its framing and on reasoning kept apart from the reply).
    static let maxStreamBytes = 8 * maxFrameBytes

    static func chatBody(model: String, messages: [ChatMessage], tools: [ModelTool], toolChoice: String?,
                         settings: GenerationSettings, cache: PromptCache? = nil) throws -> Data {
        var body: [String: Any] = [
            "model": model,
            "messages": messages.map(\.json),
            "stream": true,
            "stream_options": ["include_usage": true],
        ]
        if let t = settings.temperature { body["temperature"] = t }
        if let level = settings.reasoning { body["reasoning_effort"] = Self.reasoningEffort(level) }
        if let n = settings.maxOutputTokens { body["max_tokens"] = n }
        if let cache {
            body["cache_prompt"] = true
            body["n_cache_reuse"] = PromptCache.reuseTokens
            if let slot = cache.slot { body["id_slot"] = slot }
        }
        if !tools.isEmpty {
            body["tools"] = tools.map { tool -> [String: Any] in
                let parsed = JSONObjects.object(Data(tool.parametersSchema.utf8))
                let schema = parsed ?? ["type": "object"]
                return ["type": "function",
                        "function": ["name": tool.name, "description": tool.description,
                                     "parameters": schema] as [String: Any]]
            }
            if let toolChoice { body["tool_choice"] = toolChoice }
        }
        let data = try JSONObjects.data(body)
        guard let schema = settings.schema, data.last == UInt8(ascii: "}") else { return data }
        // Spliced in as text: JSONSerialization would lose the schema's property order, which is
        // the order llama-server's grammar generates them in. `strict` is what OpenAI itself needs.
        let format = #","response_format":{"type":"json_schema","json_schema":{"name":"output","strict":true,"schema":"#
            + schema.text + "}}}"
        return data.dropLast() + Data(format.utf8)
    }

    /// OpenAI's `reasoning_effort` for a level: the three values every server that takes it knows.
    static func reasoningEffort(_ level: ReasoningLevel) -> String {
        switch level {
        case .light: "low"
        case .moderate: "medium"
        case .deep: "high"
        }
    }

    /// Sends one streamed chat request and folds its SSE events; `onDelta` sees the cumulative text.
    nonisolated(nonsending)
    /// `reasoning`: the level the body asks for, so that a server's refusal of the field is named.
    /// `session`: the thread id, for a router in front (`sessionHeader`).
    func streamChat(body: Data, reasoning: ReasoningLevel? = nil, session: String? = nil,
                    onDelta: (_ partial: (text: String, tokens: Int)) -> Void) async throws -> ChatReply {
        let url = base.appendingPathComponent("chat/completions")
        let request = makeRequest("POST", url, body: body, timeout: Self.chatIdleTimeout, streaming: true,
                                  session: session)
        var reply = ChatReply()
        var status = 0
        var errorBody = Data()
        var lines = SSELineSplitter()
        var calls: [Int: ToolCall] = [:]
        let sentAt = ContinuousClock.now
        var firstAt: ContinuousClock.Instant?
        var end = StreamEnd()
        func folded(_ line: String) throws -> Bool {
            end.see(line)
            let before = (reply.text.utf8.count, reply.reasoning.utf8.count, calls.count)
            let changed = try fold(line, into: &reply, calls: &calls)
            if firstAt == nil, before != (reply.text.utf8.count, reply.reasoning.utf8.count, calls.count) {
                firstAt = .now
            }
            return changed
        }
        var received = 0
        do {
            for try await event in http.open(request) {
                switch event {
                case .head(let head):
                    status = head.status
                case .data(let chunk):
                    guard (200..<300).contains(status) else {
                        if errorBody.count < 65_536 { errorBody.append(chunk) }
                        continue
                    }
                    // How much a server streams is its own choice: past what a reply could be, the call fails.
                    received = received.addingClamped(chunk.count)
                    if received > Self.maxStreamBytes {
                        throw WispError(.generationFailed, "the model server at \(endpointDescription) streamed "
                                        + "more than \(Self.maxStreamBytes) bytes for one answer; the call was stopped")
                    }
                    for line in lines.push(chunk) {
                        if try folded(line) { onDelta((reply.text, reply.chunks)) }
                    }
                }
            }
            for line in lines.finish() where (200..<300).contains(status) {
                if try folded(line) { onDelta((reply.text, reply.chunks)) }
            }
        } catch let error as WispError {
            throw error
        } catch {
            try Task.checkCancellation()
            let mapped = mapTransport(error, what: "get an answer from")
            if let failure = error as? HTTPError, [.cannotConnect, .timedOut, .connectionLost].contains(failure.kind) {
                health.withLock { $0.failed(mapped.message, at: .now) }
            }
            throw mapped
        }
        try Task.checkCancellation() // a cancelled stream ends quietly
        guard (200..<300).contains(status) else {
            let error = httpError(status, errorBody, reasoning: reasoning)
            if status >= 500 { health.withLock { $0.failed(error.message, at: .now) } }
            throw error
        }
        do {
            try end.check(reply.finishReason, received: received, from: endpointDescription)
        } catch {
            // Cut as a reset would cut it, only cleanly: the endpoint is down as it would be then.
            health.withLock { $0.failed(error.message, at: .now) }
            throw error
        }
        facts.withLock { $0.lastReachable = .now }
        health.withLock { $0.answered() }
        reply.time(sent: sentAt, first: firstAt)
        reply.toolCalls = Self.toolCalls(calls)
        return reply
    }

    /// The calls a stream assembled, in index order, each with an id (a server may leave it out).
    private static func toolCalls(_ calls: [Int: ToolCall]) -> [ToolCall] {
        calls.sorted { $0.key < $1.key }.map { index, call in
            var c = call
            if c.id.isEmpty { c.id = "call_\(index)" }
            return c
        }.filter { !$0.name.isEmpty }
    }

    /// Folds one SSE line into the reply. Returns true when the text changed.
    private func fold(_ line: String, into reply: inout ChatReply, calls: inout [Int: ToolCall]) throws -> Bool {
        guard let chunk = OpenAIReplies.chunk(line) else { return false }
        if let error = chunk.error { throw httpError(200, Data(error.utf8)) }
        reply.promptTokens = chunk.promptTokens ?? reply.promptTokens
        reply.outputTokens = chunk.outputTokens ?? reply.outputTokens
        reply.reasoningTokens = chunk.reasoningTokens ?? reply.reasoningTokens
        reply.cachedTokens = chunk.cachedTokens ?? reply.cachedTokens
        reply.evaluatedTokens = chunk.evaluatedTokens ?? reply.evaluatedTokens
        if let reason = chunk.finishReason { reply.finishReason = reason }
        for piece in chunk.toolCalls {
            let index = piece.index ?? calls.count
            var call = calls[index] ?? ToolCall(id: "", name: "", arguments: "")
            if let id = piece.id, !id.isEmpty { call.id = id }
            if let name = piece.name { call.name += name }
            if let arguments = piece.arguments { call.arguments += arguments }
            calls[index] = call
        }
        if let thought = chunk.reasoning { reply.reasoning += thought }
        if let content = chunk.content, !content.isEmpty {
            reply.text += content
            reply.chunks += 1
            return true
        }
        return false
    }
}

/// Whether a 2xx answer ended as one: the server's `finish_reason` and, on an SSE stream, its
/// `data: [DONE]`. A stream that stops short of them (the server closed it, a proxy cut it) may
/// still have parsed to plausible text, so only its end says it is whole.
struct StreamEnd {
    private var sse = false
    private var done = false

    mutating func see(_ line: String) {
        guard line.hasPrefix("data:") else { return }
        sse = true
        if line.dropFirst(5).trimmingSpaces() == "[DONE]" { done = true }
    }

    /// Throws unless the answer ended whole; `received`: the bytes it brought.
    func check(_ finishReason: String?, received: Int, from endpoint: String) throws(WispError) {
        let missing: String
        switch (finishReason == nil, sse && !done) {
        case (false, false): return
        case (true, true): missing = "no finish_reason and no [DONE]"
        case (true, false): missing = "no finish_reason"
        case (false, true): missing = "no [DONE]"
        }
        throw WispError(.generationFailed, """
            the model server at \(endpoint) ended its answer unfinished (\(missing) after \(received) bytes: the \
            stream stopped mid-answer); the turn was not kept
            """)
    }
}
