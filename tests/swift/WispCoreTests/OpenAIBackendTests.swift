import Foundation
import Testing
@testable import WispCore

/// The openai backend's pure parts: endpoint handling, the transcript, the request body,
/// SSE splitting and the overflow dialects. Its HTTP behaviour (streaming, cancellation,
/// errors, the real model) is tested end to end in tests/python/test_openai_backend.py and
/// test_real_model.py.
@Suite struct OpenAIBackendTests {
    @Test func endpointIsTheAPIBase() throws {
        let plain = try OpenAIServer(endpoint: "http://127.0.0.1:8080/v1", model: nil, apiKey: nil, contextSize: nil)
        #expect(plain.base.absoluteString == "http://127.0.0.1:8080/v1")
        #expect(plain.root.absoluteString == "http://127.0.0.1:8080")
        let bare = try OpenAIServer(endpoint: "http://localhost:11434/", model: "llama3.2", apiKey: nil, contextSize: nil)
        #expect(bare.base.absoluteString == "http://localhost:11434/v1")
        #expect(bare.modelName == "llama3.2")
        let full = try OpenAIServer(endpoint: "https://api.example.com/v1/chat/completions", model: nil, apiKey: "k", contextSize: nil)
        #expect(full.base.absoluteString == "https://api.example.com/v1")
        let vllm = try OpenAIServer(endpoint: "http://gpu-cluster:8000/openai/v1", model: nil, apiKey: nil, contextSize: nil)
        #expect(vllm.root.absoluteString == "http://gpu-cluster:8000/openai")
        for bad in ["", "127.0.0.1:8080", "ftp://x/v1", "http://"] {
            #expect(throws: WispError.self) { try OpenAIServer(endpoint: bad, model: nil, apiKey: nil, contextSize: nil) }
        }
    }

    @Test func sessionRebuildsTheTranscriptFromHistory() throws {
        let server = try OpenAIServer(endpoint: "http://127.0.0.1:1/v1", model: nil, apiKey: nil, contextSize: nil)
        let history = [
            Turn(prompt: "read a", toolExchanges: [ToolExchange(name: "read_file", arguments: #"{"path":"a"}"#, output: "A")], response: "it says A"),
            Turn(prompt: "thanks", response: "you're welcome"),
        ]
        let session = OpenAISession(server: server, instructions: "Be brief.", tools: [], history: history)
        #expect(session.messages == [
            .text("system", "Be brief."),
            .text("user", "read a"),
            .toolCalls([ToolCall(id: "call_0_0", name: "read_file", arguments: #"{"path":"a"}"#)]),
            .toolResult(id: "call_0_0", output: "A"),
            .text("assistant", "it says A"),
            .text("user", "thanks"),
            .text("assistant", "you're welcome"),
        ])
        #expect(OpenAISession(server: server, instructions: nil, tools: [], history: []).messages.isEmpty)
    }

    @Test func requestBodyCarriesSettingsAndTools() throws {
        let tool = ModelTool(name: "read_file", description: "Read a file.",
                             parametersSchema: #"{"type":"object","properties":{"path":{"type":"string"}}}"#) { _ in "" }
        let data = try OpenAIServer.chatBody(model: "m", messages: [.text("user", "hi")], tools: [tool], toolChoice: "none",
                                             settings: GenerationSettings(temperature: 0, maxOutputTokens: 32))
        let body = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(body["model"] as? String == "m")
        #expect(body["stream"] as? Bool == true)
        #expect(body["temperature"] as? Double == 0)
        #expect(body["max_tokens"] as? Int == 32)
        #expect(body["tool_choice"] as? String == "none")
        let tools = try #require(body["tools"] as? [[String: Any]])
        let function = try #require(tools.first?["function"] as? [String: Any])
        #expect(function["name"] as? String == "read_file")
        #expect((function["parameters"] as? [String: Any])?["type"] as? String == "object")
        let bare = try JSONSerialization.jsonObject(with: OpenAIServer.chatBody(
            model: "m", messages: [], tools: [], toolChoice: nil, settings: GenerationSettings())) as? [String: Any]
        #expect(bare?["temperature"] == nil && bare?["max_tokens"] == nil && bare?["tools"] == nil)
    }

    @Test func reasoningIsSentAsReasoningEffortAndOnlyWhenAsked() throws {
        for (level, effort) in [(ReasoningLevel.light, "low"), (.moderate, "medium"), (.deep, "high")] {
            let data = try OpenAIServer.chatBody(model: "m", messages: [], tools: [], toolChoice: nil, settings: GenerationSettings(reasoning: level))
            #expect((try JSONSerialization.jsonObject(with: data) as? [String: Any])?["reasoning_effort"] as? String == effort)
        }
        let plain = try OpenAIServer.chatBody(model: "m", messages: [], tools: [], toolChoice: nil, settings: GenerationSettings())
        #expect((try JSONSerialization.jsonObject(with: plain) as? [String: Any])?["reasoning_effort"] == nil)
    }

    @Test func aRefusedReasoningEffortIsNamedWithTheServersWords() throws {
        let server = try OpenAIServer(endpoint: "http://127.0.0.1:9/v1", model: nil, apiKey: nil, contextSize: nil)
        let body = Data(#"{"error":{"message":"Unsupported parameter: 'reasoning_effort' is not supported with this model.","type":"invalid_request_error"}}"#.utf8)
        let e = server.httpError(400, body, reasoning: .moderate)
        #expect(e.code == .invalidArgument)
        #expect(e.message.hasPrefix("reasoning:") && e.message.contains("`reasoning_effort` (\"medium\"")
                && e.message.contains("Unsupported parameter: 'reasoning_effort' is not supported with this model."))
        // Without reasoning_effort in the request, the same answer is the server's plain refusal.
        #expect(server.httpError(400, body).code == .generationFailed)
    }

    @Test func usageAddsUpOnlyWhatEveryPartReported() {
        let a = Usage(inputTokens: 10, outputTokens: 3, reasoningTokens: nil)
        #expect(a + Usage(inputTokens: 7, outputTokens: 2, reasoningTokens: 1) == Usage(inputTokens: 17, outputTokens: 5))
        #expect(a + Usage() == Usage())
    }

    @Test(arguments: [
        // llama.cpp llama-server
        #"{"error":{"code":400,"message":"request (5560 tokens) exceeds the available context size (2048 tokens), try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5560,"n_ctx":2048}}"#,
        // llama-cpp-python
        #"{"error":{"message":"This model's maximum context length is 2048 tokens. However, you requested 5576 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
        // OpenAI
        #"{"error":{"message":"Your input exceeds the context window of this model.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
        // vLLM
        #"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}"#,
    ])
    func overflowDialects(body: String) throws {
        let server = try OpenAIServer(endpoint: "http://127.0.0.1:1/v1", model: nil, apiKey: nil, contextSize: nil)
        #expect(server.httpError(400, Data(body.utf8)).code == .contextOverflow)
    }

    @Test func otherErrorsNameTheEndpoint() throws {
        let server = try OpenAIServer(endpoint: "http://127.0.0.1:9/v1", model: nil, apiKey: "secret-key", contextSize: nil)
        let cases: [(Int, WispError.Code)] = [(400, .generationFailed), (401, .modelUnavailable), (404, .modelUnavailable),
                                              (429, .busy), (500, .generationFailed), (503, .modelUnavailable)]
        for (status, code) in cases {
            let e = server.httpError(status, Data(#"{"error":{"message":"nope","type":"x"}}"#.utf8))
            #expect(e.code == code, "HTTP \(status)")
            #expect(e.message.contains("http://127.0.0.1:9/v1") && e.message.contains("nope"))
            #expect(!e.message.contains("secret-key"))
        }
    }

    @Test func slotPoolKeepsEachThreadOnItsSlotAndTakesTheLeastRecentlyUsed() {
        let pool = SlotPool(count: 2)
        let a = SessionAffinity(key: "a"), b = SessionAffinity(key: "b"), c = SessionAffinity(key: "c")
        func use(_ x: SessionAffinity) -> Int? {
            let slot = pool.acquire(x)
            if let slot { pool.release(slot) }
            return slot
        }
        let sa = use(a), sb = use(b)
        #expect(sa != nil && sb != nil && sa != sb)
        #expect(use(a) == sa && use(b) == sb && use(a) == sa)
        #expect(use(c) == sb) // b was used least recently
        #expect(use(b) == sa) // now a is
        #expect(pool.owners == (sa == 0 ? ["b", "c"] : ["c", "b"]))
    }

    @Test func slotPoolNeverSharesABusySlotAndFreesADeadThreadsSlot() {
        let pool = SlotPool(count: 2)
        let a = SessionAffinity(key: "a"), b = SessionAffinity(key: "b")
        let sa = pool.acquire(a), sb = pool.acquire(b)
        #expect(sa != nil && sb != nil && sa != sb)
        let c = SessionAffinity(key: "c")
        #expect(pool.acquire(c) == nil) // both busy: the server picks
        pool.release(sb!)
        var d: SessionAffinity? = SessionAffinity(key: "d")
        let sd = pool.acquire(d!)
        #expect(sd == sb)
        pool.release(sa!)
        pool.release(sd!) // d's slot is now the most recently used
        d = nil // but its thread is gone: the slot is free, and taken before a live thread's
        #expect(pool.acquire(c) == sb)
    }

    @Test func slotPoolGivesAReturningThreadIdItsOldSlot() {
        let pool = SlotPool(count: 3)
        var first: SessionAffinity? = SessionAffinity(key: "t")
        let s = pool.acquire(first!)!
        pool.release(s)
        first = nil
        let other = SessionAffinity(key: "u")
        let su = pool.acquire(other)!
        pool.release(su)
        #expect(su != s) // a never-used slot before the one "t" may still fill
        #expect(pool.acquire(SessionAffinity(key: "t")) == s)
        #expect(pool.acquire(SessionAffinity(key: nil)) != s)
    }

    @Test func llamaCppFieldsOnlyWithAPromptCache() throws {
        func body(_ cache: PromptCache?) throws -> [String: Any] {
            try #require(try JSONSerialization.jsonObject(with: OpenAIServer.chatBody(
                model: "m", messages: [.text("user", "hi")], tools: [], toolChoice: nil,
                settings: GenerationSettings(), cache: cache)) as? [String: Any])
        }
        let pinned = try body(PromptCache(slot: 3))
        #expect(pinned["id_slot"] as? Int == 3 && pinned["cache_prompt"] as? Bool == true)
        #expect((pinned["n_cache_reuse"] as? Int ?? 0) > 0)
        let unpinned = try body(PromptCache(slot: nil))
        #expect(unpinned["id_slot"] == nil && unpinned["cache_prompt"] as? Bool == true)
        let other = try body(nil)
        #expect(other["id_slot"] == nil && other["cache_prompt"] == nil && other["n_cache_reuse"] == nil)
    }

    @Test func readCheckFloorFollowsWhatTheServerReadLastTime() {
        var check = ReadCheck()
        let first: [ChatMessage] = [.text("user", String(repeating: "a", count: 800))]
        // No count yet: 8 bytes a token at least, 4 about.
        #expect(check.floor(first).tokens == 100 && check.floor(first).count == 200)
        check.record(read: 200, messages: 1, bytes: 800)
        let next = first + [.text("assistant", String(repeating: "b", count: 400)), .text("user", String(repeating: "c", count: 400))]
        let floor = check.floor(next)
        // 200 read, less 1% and 8, plus 800 new bytes at 3/4 of 0.25 a byte.
        #expect(floor.tokens == Int(200 * 0.99 - 8 + 0.75 * 0.25 * 800))
        #expect(floor.count == 400)
        // A server's count past any window is not believed: back to the bound alone.
        check.record(read: Int.max, messages: 3, bytes: 1600)
        #expect(check.floor(next).tokens == 200)
        check.record(read: nil, messages: 3, bytes: 1600)
        #expect(check.floor(next).tokens == 200)
    }

    @Test func aServerCountingCachedTokensApartIsReadWhole() {
        var reply = ChatReply()
        reply.promptTokens = 30
        reply.cachedTokens = 900
        #expect(reply.readTokens == 930)
        reply.cachedTokens = 20  // within prompt_tokens, as OpenAI counts
        #expect(reply.readTokens == 30)
        reply.promptTokens = 0  // not counted at all
        #expect(reply.readTokens == nil)
    }

    @Test func keepAliveAndCondensingSettings() throws {
        for good in ["30m", "90s", "2h", "-1", "600"] { #expect(OllamaKeepAlive(good)?.value == good) }
        for bad in ["", "soon", "30 m", "1d", "m", "9999999999h"] { #expect(OllamaKeepAlive(bad) == nil) }
        let c = try CoreConfig.parse(arguments: ["--condense-to", "0.75"], environment: ["WISP_KEEP_ALIVE": "2h"])
        #expect(c.keepAlive == "2h" && c.condenseTo == 0.75)
        #expect(throws: WispError.self) { try CoreConfig.parse(arguments: ["--condense-to", "1"], environment: [:]) }
        #expect(throws: WispError.self) { try CoreConfig.parse(arguments: [], environment: ["WISP_KEEP_ALIVE": "forever"]) }
        #expect(WispCore.Condensing.justEnough.target(4096) == 4096)
        #expect(WispCore.Condensing.steps(lowWater: 0.5).target(4096) == 2048)
    }

    @Test func lmStudiosOverflowWordsAreAnOverflow() {
        let body = #"{"error":"Trying to keep the first 5000 tokens when context the overflows. However, the model is loaded with context length of only 4096 tokens"}"#
        #expect(OpenAIServer.isOverflow(Data(body.utf8)))
    }
}
