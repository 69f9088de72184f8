import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

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
/// - token counts: llama.cpp's (and vLLM's) `POST /tokenize`; else nil (the core estimates).
/// - overflow: llama.cpp's `exceed_context_size_error`, llama-cpp-python's and OpenAI's
///   `context_length_exceeded`, vLLM's "maximum context length" message → `contextOverflow`.
///
/// Swift-corelibs-foundation on Linux has no `URLSession.bytes(for:)`, so a response is read
/// through a `URLSessionDataDelegate` that feeds an `AsyncThrowingStream`; ending the stream
/// (Task cancellation included) cancels the HTTP request, which closes the connection.
public struct OpenAIBackend: ModelBackend {
    public let name = "openai"
    let server: OpenAIServer

    /// Throws when `endpoint` is not an http(s) URL.
    public init(endpoint: String, model: String?, apiKey: String?, contextSize: Int?) throws(WispError) {
        server = try OpenAIServer(endpoint: endpoint, model: model, apiKey: apiKey, contextSize: contextSize)
    }

    public init(_ config: CoreConfig) throws(WispError) {
        guard let endpoint = config.endpoint else {
            throw WispError(.modelUnavailable, "the openai backend needs --endpoint (an OpenAI-compatible base URL such as http://127.0.0.1:8080/v1)")
        }
        try self.init(endpoint: endpoint, model: config.model, apiKey: config.apiKey, contextSize: config.contextSize)
    }

    public var model: String { server.modelName }

    public func availability() async -> Availability { await server.availability() }

    public func contextSize() async -> Int { await server.contextSize() }

    public func tokenCount(_ text: String) async throws -> Int? { try await server.tokenCount(text) }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        OpenAISession(server: server, instructions: instructions, tools: tools, history: history)
    }
}

// MARK: - Session

/// One conversation: the OpenAI `messages` array (system = instructions, then per turn the
/// user prompt, any tool calls with their results, and the reply). Lives inside one thread's actor.
final class OpenAISession: ModelSession {
    /// Model↔tool round trips allowed in one call; the last round forbids tools so the model must answer.
    static let maxToolRounds = 8

    private let server: OpenAIServer
    private let tools: [ModelTool]
    private(set) var messages: [ChatMessage]

    init(server: OpenAIServer, instructions: String?, tools: [ModelTool], history: [Turn]) {
        self.server = server
        self.tools = tools
        var m: [ChatMessage] = []
        if let instructions, !instructions.isEmpty { m.append(.text("system", instructions)) }
        for (t, turn) in history.enumerated() {
            m.append(.text("user", turn.prompt))
            for (k, e) in turn.toolExchanges.enumerated() {
                let id = "call_\(t)_\(k)"
                m.append(.toolCalls([ToolCall(id: id, name: e.name, arguments: e.arguments)]))
                m.append(.toolResult(id: id, output: e.output))
            }
            m.append(.text("assistant", turn.response))
        }
        messages = m
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        var added: [ChatMessage] = [.text("user", prompt)]
        var exchanges: [ToolExchange] = []
        var promptTokens: Int?
        var outputTokens = 0
        var round = 0
        while true {
            // llama-server cannot constrain a reply to a schema and offer tools in one request
            // ("Cannot use custom grammar constraints with tools"), so a call with a schema offers none.
            let offerTools = !tools.isEmpty && settings.schema == nil
            let mustAnswer = round >= Self.maxToolRounds
            let body = try OpenAIServer.chatBody(model: await server.requestModel(), messages: messages + added,
                                                 tools: offerTools ? tools : [], toolChoice: mustAnswer ? "none" : nil,
                                                 settings: settings)
            let tokensBefore = outputTokens
            let reply = try await server.streamChat(body: body) { partial in
                onPartial?(PartialReply(text: partial.text, tokens: tokensBefore + partial.tokens))
            }
            if promptTokens == nil { promptTokens = reply.promptTokens }
            outputTokens += reply.outputTokens ?? reply.chunks
            // Cut-off JSON can still parse (a number, say), so the server's word decides.
            if settings.schema != nil, reply.finishReason == "length" {
                throw OutputSchema.cutOff(maxOutputTokens: settings.maxOutputTokens)
            }

            guard offerTools, !mustAnswer, !reply.toolCalls.isEmpty else {
                added.append(.text("assistant", reply.text))
                messages += added
                return Generation(text: reply.text, toolExchanges: exchanges,
                                  promptTokens: promptTokens, outputTokens: outputTokens)
            }
            added.append(.toolCalls(reply.toolCalls))
            for call in reply.toolCalls {
                try Task.checkCancellation()
                let exchange = await run(call)
                exchanges.append(exchange)
                added.append(.toolResult(id: call.id, output: exchange.output))
            }
            round += 1
        }
    }

    nonisolated(nonsending)
    private func run(_ call: ToolCall) async -> ToolExchange {
        let arguments = call.arguments.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty ? "{}" : call.arguments
        guard let tool = tools.first(where: { $0.name == call.name }) else {
            let names = tools.map(\.name).joined(separator: ", ")
            return ToolExchange(name: call.name, arguments: arguments,
                                output: "There is no tool named '\(call.name)'. Available tools: \(names).", failed: true)
        }
        do {
            return ToolExchange(name: call.name, arguments: arguments, output: try await tool.call(arguments))
        } catch let e as WispError {
            return ToolExchange(name: call.name, arguments: arguments, output: e.message, failed: true)
        } catch {
            return ToolExchange(name: call.name, arguments: arguments, output: String(describing: error), failed: true)
        }
    }
}

/// A tool call as the model made it.
struct ToolCall: Sendable, Equatable {
    var id: String
    var name: String
    var arguments: String
}

/// One entry of the OpenAI `messages` array.
enum ChatMessage: Sendable, Equatable {
    case text(String, String)              // role, content
    case toolCalls([ToolCall])             // assistant message that calls tools
    case toolResult(id: String, output: String)

    var json: [String: Any] {
        switch self {
        case let .text(role, content):
            return ["role": role, "content": content]
        case let .toolCalls(calls):
            // content "" rather than null: llama-cpp-python answers null with HTTP 500.
            return ["role": "assistant", "content": "", "tool_calls": calls.map {
                ["id": $0.id, "type": "function", "function": ["name": $0.name, "arguments": $0.arguments]] as [String: Any]
            }]
        case let .toolResult(id, output):
            return ["role": "tool", "tool_call_id": id, "content": output]
        }
    }
}

// MARK: - Server

/// What one streamed completion produced.
struct ChatReply: Sendable {
    var text = ""
    var toolCalls: [ToolCall] = []
    var finishReason: String?
    var promptTokens: Int?
    var outputTokens: Int?
    /// Content chunks received: a token count when the server does not report usage.
    var chunks = 0
}

/// The HTTP side, shared by every session of a backend. Facts learnt from the server are cached.
final class OpenAIServer: Sendable {
    /// The base the OpenAI paths hang off, e.g. http://127.0.0.1:8080/v1 (no trailing slash).
    let base: URL
    /// The server's root (base without a trailing /v1): llama.cpp's /props and /tokenize, Ollama's /api/show.
    let root: URL
    let configuredModel: String?
    let configuredContextSize: Int?
    private let apiKey: String?

    /// Idle time-out for a chat request: a long prompt on a small CPU can take minutes before
    /// the first byte. The shim's own time limit and cancellation bound a call anyway.
    static let chatIdleTimeout: TimeInterval = 600
    static let probeTimeout: TimeInterval = 5
    static let fallbackContextSize = 4096

    private struct Facts: Sendable {
        var model: String?
        var contextSize: Int?
        var contextProbed = false
        var tokenize: Bool?
        var lastReachable: ContinuousClock.Instant?
    }
    private let facts = Mutex(Facts())
    private let chatClient = HTTPClient(idleTimeout: OpenAIServer.chatIdleTimeout)
    private let probeClient = HTTPClient(idleTimeout: OpenAIServer.probeTimeout)

    init(endpoint: String, model: String?, apiKey: String?, contextSize: Int?) throws(WispError) {
        var text = endpoint.trimmingCharacters(in: .whitespaces)
        while text.hasSuffix("/") { text.removeLast() }
        if text.hasSuffix("/chat/completions") { text.removeLast("/chat/completions".count) }
        guard var components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              scheme == "http" || scheme == "https", components.host?.isEmpty == false else {
            throw WispError(.invalidArgument, "--endpoint must be an http(s) URL such as http://127.0.0.1:8080/v1, got '\(endpoint)'")
        }
        if components.path.isEmpty || components.path == "/" { components.path = "/v1" }
        guard let base = components.url else {
            throw WispError(.invalidArgument, "--endpoint is not a valid URL: '\(endpoint)'")
        }
        var rootComponents = components
        if rootComponents.path.hasSuffix("/v1") { rootComponents.path.removeLast(3) }
        self.base = base
        self.root = rootComponents.url ?? base
        self.configuredModel = model
        self.configuredContextSize = contextSize.flatMap { $0 > 0 ? $0 : nil }
        self.apiKey = apiKey
    }

    /// For messages: the base URL, never with credentials.
    var endpointDescription: String { base.absoluteString }

    var modelName: String { configuredModel ?? facts.withLock { $0.model } ?? "default" }

    // MARK: availability, model, context, tokens

    func availability() async -> Availability {
        if let last = facts.withLock({ $0.lastReachable }), ContinuousClock.now - last < .seconds(10) { return .ready }
        do {
            let (status, data) = try await fetch("GET", base.appendingPathComponent("models"), timeout: Self.probeTimeout)
            switch status {
            case 200..<300, 404, 405:
                learnModels(data)
                facts.withLock { $0.lastReachable = .now }
                return .ready
            case 401, 403:
                return .unavailable("the model server at \(endpointDescription) refused the credentials (HTTP \(status)): check WISP_API_KEY")
            case 503:
                return .unavailable("the model server at \(endpointDescription) is not ready yet (HTTP 503, e.g. still loading the model): \(Self.errorMessage(data) ?? "")")
            default:
                return .unavailable("the model server at \(endpointDescription) answered HTTP \(status): \(Self.errorMessage(data) ?? "")")
            }
        } catch {
            return .unavailable(mapTransport(error, what: "reach").message)
        }
    }

    /// The model name a request carries: --model, else the server's first listed model.
    func requestModel() async -> String {
        if let configuredModel { return configuredModel }
        if let known = facts.withLock({ $0.model }) { return known }
        if let (status, data) = try? await fetch("GET", base.appendingPathComponent("models"), timeout: Self.probeTimeout),
           (200..<300).contains(status) {
            learnModels(data)
        }
        return facts.withLock { $0.model } ?? "default"
    }

    private func learnModels(_ data: Data) {
        guard let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
              let list = object["data"] as? [[String: Any]], !list.isEmpty else { return }
        let mine = list.first { ($0["id"] as? String) == configuredModel } ?? list[0]
        facts.withLock { f in
            if f.model == nil { f.model = mine["id"] as? String }
            // vLLM says its window in the model list.
            if f.contextSize == nil, let n = Self.int(mine["max_model_len"]), n > 0 { f.contextSize = n }
        }
    }

    func contextSize() async -> Int {
        let known = facts.withLock { f -> Int? in f.contextSize ?? (f.contextProbed ? (configuredContextSize ?? Self.fallbackContextSize) : nil) }
        if let known { return known }
        var reached = false
        var found: Int?
        // llama.cpp
        if let (status, data) = try? await fetch("GET", root.appendingPathComponent("props"), timeout: Self.probeTimeout) {
            reached = true
            if status == 200, let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] {
                let settings = object["default_generation_settings"] as? [String: Any]
                found = Self.int(settings?["n_ctx"]) ?? Self.int(object["n_ctx"])
            }
        }
        // vLLM (max_model_len in /v1/models)
        if found == nil, let (status, data) = try? await fetch("GET", base.appendingPathComponent("models"), timeout: Self.probeTimeout) {
            reached = true
            if status == 200 { learnModels(data) }
            found = facts.withLock { $0.contextSize }
        }
        // Ollama: the window it really runs with is num_ctx; its model_info context_length is only
        // the trained maximum (Ollama truncates silently past num_ctx, so do not overstate it).
        if found == nil, let (status, data) = try? await fetch("POST", root.appendingPathComponent("api/show"),
                                                              json: ["model": await requestModel()], timeout: Self.probeTimeout) {
            reached = true
            if status == 200, let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
               let parameters = object["parameters"] as? String {
                for line in parameters.split(separator: "\n") {
                    let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
                    if parts.count >= 2, parts[0] == "num_ctx", let n = Int(parts[1]) { found = n }
                }
            }
        }
        if let found, found <= 0 { return configuredContextSize ?? Self.fallbackContextSize } // loading: ask again later
        if reached {
            facts.withLock { f in
                if let found { f.contextSize = found }
                f.contextProbed = true
            }
        }
        return found ?? configuredContextSize ?? Self.fallbackContextSize
    }

    func tokenCount(_ text: String) async throws -> Int? {
        if facts.withLock({ $0.tokenize }) == false { return nil }
        do {
            // llama.cpp reads `content`, vLLM `prompt` (+ `model`); each ignores the other's keys.
            let body: [String: Any] = ["content": text, "add_special": false,
                                       "prompt": text, "add_special_tokens": false, "model": await requestModel()]
            let (status, data) = try await fetch("POST", root.appendingPathComponent("tokenize"), json: body,
                                                 timeout: Self.probeTimeout)
            let object = status == 200 ? (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] : nil
            guard let n = (object?["tokens"] as? [Any])?.count ?? Self.int(object?["count"]) else {
                if status != 503 { facts.withLock { $0.tokenize = false } }
                return nil
            }
            facts.withLock { $0.tokenize = true }
            return n
        } catch {
            try Task.checkCancellation()
            return nil // unreachable now: the chat request will say so clearly
        }
    }

    // MARK: chat

    static func chatBody(model: String, messages: [ChatMessage], tools: [ModelTool], toolChoice: String?,
                         settings: GenerationSettings) throws -> Data {
        var body: [String: Any] = [
            "model": model,
            "messages": messages.map(\.json),
            "stream": true,
            "stream_options": ["include_usage": true],
        ]
        if let t = settings.temperature { body["temperature"] = t }
        if let n = settings.maxOutputTokens { body["max_tokens"] = n }
        if !tools.isEmpty {
            body["tools"] = tools.map { tool -> [String: Any] in
                let schema = (try? JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8))) ?? ["type": "object"]
                return ["type": "function",
                        "function": ["name": tool.name, "description": tool.description, "parameters": schema] as [String: Any]]
            }
            if let toolChoice { body["tool_choice"] = toolChoice }
        }
        let data = try JSONSerialization.data(withJSONObject: body)
        guard let schema = settings.schema, data.last == UInt8(ascii: "}") else { return data }
        // Spliced in as text: JSONSerialization would lose the schema's property order, which is
        // the order llama-server's grammar generates them in. `strict` is what OpenAI itself needs.
        let format = #","response_format":{"type":"json_schema","json_schema":{"name":"output","strict":true,"schema":"#
            + schema.text + "}}}"
        return data.dropLast() + Data(format.utf8)
    }

    /// Sends one streamed chat request and folds its SSE events; `onDelta` sees the cumulative text.
    nonisolated(nonsending)
    func streamChat(body: Data, onDelta: (_ partial: (text: String, tokens: Int)) -> Void) async throws -> ChatReply {
        let url = base.appendingPathComponent("chat/completions")
        let request = makeRequest("POST", url, body: body, timeout: Self.chatIdleTimeout, streaming: true)
        var reply = ChatReply()
        var status = 0
        var errorBody = Data()
        var lines = SSELineSplitter()
        var calls: [Int: ToolCall] = [:]
        do {
            for try await event in chatClient.open(request) {
                switch event {
                case .response(let s):
                    status = s
                case .data(let chunk):
                    guard (200..<300).contains(status) else {
                        if errorBody.count < 65_536 { errorBody.append(chunk) }
                        continue
                    }
                    for line in lines.push(chunk) {
                        if try fold(line, into: &reply, calls: &calls) { onDelta((reply.text, reply.chunks)) }
                    }
                }
            }
            for line in lines.finish() where (200..<300).contains(status) {
                if try fold(line, into: &reply, calls: &calls) { onDelta((reply.text, reply.chunks)) }
            }
        } catch let error as WispError {
            throw error
        } catch {
            try Task.checkCancellation()
            throw mapTransport(error, what: "get an answer from")
        }
        try Task.checkCancellation() // a cancelled stream ends quietly
        guard (200..<300).contains(status) else { throw httpError(status, errorBody) }
        facts.withLock { $0.lastReachable = .now }
        reply.toolCalls = calls.sorted { $0.key < $1.key }.map { index, call in
            var c = call
            if c.id.isEmpty { c.id = "call_\(index)" }
            return c
        }.filter { !$0.name.isEmpty }
        return reply
    }

    /// Folds one SSE line into the reply. Returns true when the text changed.
    private func fold(_ line: String, into reply: inout ChatReply, calls: inout [Int: ToolCall]) throws -> Bool {
        let payload: Substring
        if line.hasPrefix("data:") {
            payload = line.dropFirst(5)
        } else if line.hasPrefix("error:") { // llama.cpp reports an error inside an open stream this way
            payload = line.dropFirst(6)
        } else if line.hasPrefix("{") { // a server that ignored `stream` and answered with one JSON body
            payload = Substring(line)
        } else {
            return false // comments, event names, blank separators
        }
        let text = payload.trimmingCharacters(in: .whitespaces)
        if text == "[DONE]" || text.isEmpty { return false }
        guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8)) as? [String: Any] else { return false }
        if object["error"] != nil { throw httpError(200, Data(text.utf8)) }
        if let usage = object["usage"] as? [String: Any] {
            reply.promptTokens = Self.int(usage["prompt_tokens"]) ?? reply.promptTokens
            reply.outputTokens = Self.int(usage["completion_tokens"]) ?? reply.outputTokens
        }
        guard let choice = (object["choices"] as? [[String: Any]])?.first else { return false }
        if let reason = choice["finish_reason"] as? String { reply.finishReason = reason }
        guard let delta = (choice["delta"] as? [String: Any]) ?? (choice["message"] as? [String: Any]) else { return false }
        for raw in delta["tool_calls"] as? [[String: Any]] ?? [] {
            let index = Self.int(raw["index"]) ?? calls.count
            var call = calls[index] ?? ToolCall(id: "", name: "", arguments: "")
            if let id = raw["id"] as? String, !id.isEmpty { call.id = id }
            if let function = raw["function"] as? [String: Any] {
                if let name = function["name"] as? String { call.name += name }
                if let arguments = function["arguments"] as? String { call.arguments += arguments }
            }
            calls[index] = call
        }
        if let content = delta["content"] as? String, !content.isEmpty {
            reply.text += content
            reply.chunks += 1
            return true
        }
        return false
    }

    // MARK: errors

    /// An HTTP error answer, as a WispError naming the endpoint. Overflow is recognised in all its known forms.
    func httpError(_ status: Int, _ body: Data) -> WispError {
        let message = Self.errorMessage(body) ?? String(decoding: body.prefix(500), as: UTF8.self)
        if Self.isOverflow(body) {
            return WispError(.contextOverflow, "the conversation does not fit in the model's context (\(message))")
        }
        let at = "the model server at \(endpointDescription)"
        switch status {
        case 401, 403:
            return WispError(.modelUnavailable, "\(at) refused the credentials (HTTP \(status)): check WISP_API_KEY. \(message)")
        case 404:
            return WispError(.modelUnavailable, "\(at) has no such model or path (HTTP 404): check --model, and that --endpoint is the API base (usually ending in /v1). \(message)")
        case 429:
            return WispError(.busy, "\(at) is rate-limiting requests (HTTP 429): \(message)")
        case 503:
            return WispError(.modelUnavailable, "\(at) is not ready (HTTP 503, e.g. still loading the model): \(message)")
        case 500...:
            return WispError(.generationFailed, "\(at) failed (HTTP \(status)): \(message)")
        case 200..<300:
            return WispError(.generationFailed, "\(at) reported an error while generating: \(message)")
        default:
            return WispError(.generationFailed, "\(at) rejected the request (HTTP \(status)): \(message)")
        }
    }

    /// llama.cpp `exceed_context_size_error`; llama-cpp-python and OpenAI `context_length_exceeded`;
    /// vLLM and others: "maximum context length" in the message.
    static func isOverflow(_ body: Data) -> Bool {
        if let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any] {
            let error = object["error"] as? [String: Any] ?? object
            if (error["type"] as? String) == "exceed_context_size_error" { return true }
            if (error["code"] as? String) == "context_length_exceeded" { return true }
            let message = ((error["message"] as? String) ?? (object["error"] as? String) ?? "").lowercased()
            return message.contains("maximum context length") || message.contains("exceeds the available context size")
                || message.contains("context length exceeded") || message.contains("context_length_exceeded")
        }
        let text = String(decoding: body.prefix(2000), as: UTF8.self).lowercased()
        return text.contains("context_length_exceeded") || text.contains("exceed_context_size_error")
    }

    static func errorMessage(_ body: Data) -> String? {
        guard let object = try? JSONSerialization.jsonObject(with: body) as? [String: Any] else {
            let text = String(decoding: body.prefix(300), as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
            return text.isEmpty ? nil : text
        }
        if let error = object["error"] as? [String: Any], let m = error["message"] as? String { return m }
        if let m = object["error"] as? String { return m }
        if let m = object["message"] as? String { return m }
        if let m = object["detail"] as? String { return m }
        return nil
    }

    /// A transport failure (no HTTP answer), as a WispError naming the endpoint.
    func mapTransport(_ error: any Error, what: String) -> WispError {
        if let e = error as? WispError { return e }
        if error is CancellationError { return WispError(.cancelled, "The call was cancelled.") }
        let at = "the model server at \(endpointDescription)"
        let detail = (error as NSError).localizedDescription
        guard let code = (error as? URLError)?.code else {
            return WispError(.modelUnavailable, "could not \(what) \(at): \(detail)")
        }
        switch code {
        case .cannotConnectToHost, .cannotFindHost, .dnsLookupFailed, .notConnectedToInternet:
            return WispError(.modelUnavailable, "could not \(what) \(at): connection refused or host not found (\(detail)); is the server running?")
        case .timedOut:
            return WispError(.generationFailed, "\(at) stopped sending for too long (timed out): \(detail)")
        case .networkConnectionLost:
            return WispError(.generationFailed, "\(at) closed the connection mid-answer (did it crash?): \(detail)")
        case .cancelled:
            return WispError(.cancelled, "The call was cancelled.")
        default:
            return WispError(.modelUnavailable, "could not \(what) \(at): \(detail)")
        }
    }

    // MARK: HTTP

    private func makeRequest(_ method: String, _ url: URL, body: Data?, timeout: TimeInterval, streaming: Bool = false) -> URLRequest {
        var r = URLRequest(url: url)
        r.httpMethod = method
        r.timeoutInterval = timeout
        if let body {
            r.httpBody = body
            r.setValue("application/json", forHTTPHeaderField: "Content-Type")
        }
        r.setValue(streaming ? "text/event-stream" : "application/json", forHTTPHeaderField: "Accept")
        if let apiKey { r.setValue("Bearer \(apiKey)", forHTTPHeaderField: "Authorization") }
        return r
    }

    /// One short request, whole answer collected. Throws only on transport failure.
    nonisolated(nonsending)
    func fetch(_ method: String, _ url: URL, json: [String: Any]? = nil, timeout: TimeInterval) async throws -> (Int, Data) {
        let body = try json.map { try JSONSerialization.data(withJSONObject: $0) }
        var status = 0
        var data = Data()
        for try await event in probeClient.open(makeRequest(method, url, body: body, timeout: timeout)) {
            switch event {
            case .response(let s): status = s
            case .data(let d): data.append(d)
            }
        }
        try Task.checkCancellation()
        return (status, data)
    }

    static func int(_ value: Any?) -> Int? {
        switch value {
        case let n as Int: n
        case let n as Double: Int(n)
        case let n as NSNumber: n.intValue
        default: nil
        }
    }
}

// MARK: - Streaming HTTP over URLSession

/// A response as events: the status first, then body bytes as they arrive.
enum HTTPEvent: Sendable {
    case response(Int)
    case data(Data)
}

/// One long-lived `URLSession` whose delegate feeds each task's events into that task's
/// `AsyncThrowingStream` (Linux has no `bytes(for:)`). Ending a stream early (Task
/// cancellation, or the consumer leaving) cancels its request, which closes the connection.
/// Long-lived on purpose: short-lived sessions are a known crash on Linux after https
/// requests (swift-corelibs-foundation #5203), and a session per backend keeps connections alive.
final class HTTPClient: Sendable {
    private let router = HTTPRouter()
    private let session: URLSession

    /// `idleTimeout`: how long a request may go without receiving anything.
    init(idleTimeout: TimeInterval) {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.timeoutIntervalForRequest = idleTimeout
        configuration.urlCache = nil
        // Every live thread may stream at once (default --max-threads 32); the default 6 would queue them.
        configuration.httpMaximumConnectionsPerHost = 64
        session = URLSession(configuration: configuration, delegate: router, delegateQueue: nil)
    }

    deinit { session.invalidateAndCancel() }

    func open(_ request: URLRequest) -> AsyncThrowingStream<HTTPEvent, any Error> {
        #if os(Linux)
        // Plain http:// (a local model server) skips URLSession on Linux, which spins while it
        // waits for a streamed answer: see PlainHTTP.swift.
        if request.url?.scheme?.lowercased() == "http" { return PlainHTTP.open(request) }
        #endif
        let (stream, continuation) = AsyncThrowingStream<HTTPEvent, any Error>.makeStream()
        let task = session.dataTask(with: request)
        let id = task.taskIdentifier
        router.add(id, continuation)
        continuation.onTermination = { [router] _ in
            router.remove(id)
            task.cancel()
        }
        task.resume()
        return stream
    }
}

/// The session's delegate: routes events to the stream of the task they belong to.
final class HTTPRouter: NSObject, URLSessionDataDelegate, Sendable {
    private let streams = Mutex<[Int: AsyncThrowingStream<HTTPEvent, any Error>.Continuation]>([:])

    func add(_ id: Int, _ continuation: AsyncThrowingStream<HTTPEvent, any Error>.Continuation) {
        streams.withLock { $0[id] = continuation }
    }

    func remove(_ id: Int) {
        _ = streams.withLock { $0.removeValue(forKey: id) }
    }

    private func stream(_ id: Int) -> AsyncThrowingStream<HTTPEvent, any Error>.Continuation? {
        streams.withLock { $0[id] }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
        stream(dataTask.taskIdentifier)?.yield(.response((response as? HTTPURLResponse)?.statusCode ?? 0))
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        stream(dataTask.taskIdentifier)?.yield(.data(data))
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let continuation = streams.withLock({ $0.removeValue(forKey: task.taskIdentifier) }) else { return }
        if let error { continuation.finish(throwing: error) } else { continuation.finish() }
    }
}

/// Splits a byte stream into lines (LF or CRLF), decoding each complete line as UTF-8,
/// so a multi-byte character split across chunks is never broken.
struct SSELineSplitter {
    private var buffer = Data()

    mutating func push(_ chunk: Data) -> [String] {
        buffer.append(chunk)
        var lines: [String] = []
        while let newline = buffer.firstIndex(of: 0x0A) {
            var line = buffer[buffer.startIndex..<newline]
            if line.last == 0x0D { line = line.dropLast() }
            lines.append(String(decoding: line, as: UTF8.self))
            buffer = Data(buffer[buffer.index(after: newline)...])
        }
        return lines
    }

    mutating func finish() -> [String] {
        defer { buffer = Data() }
        return buffer.isEmpty ? [] : [String(decoding: buffer, as: UTF8.self)]
    }
}
