#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// What an OpenAI-compatible server answers, decoded. The server is a neighbour, not a part of
/// wisp: every number it reports is range-checked here, where it enters (`OutsideNumber`), and
/// one out of range counts as not said (an `n_ctx` of 1e300, a `prompt_tokens` of 2^63-1), so no
/// later arithmetic can trap on it. Pure functions of the bytes: `make fuzz` feeds each one
/// arbitrary input (fuzz/OpenAIFuzz.swift).
enum OpenAIReplies {
    /// llama-server's parallel slots as wisp takes them (`total_slots`, `--slots`): a slot is a
    /// KV cache in the server's memory, and no server runs more than a few hundred.
    static let slotCounts = 0...1024
    /// A tool call's `index` within one model turn.
    static let toolCallIndexes = 0...1023

    /// llama.cpp's `GET /props`: the context window (`default_generation_settings.n_ctx`, older
    /// builds `n_ctx`; 0 while a model loads) and its parallel slots (`total_slots`).
    static func props(_ data: Data) -> (contextSize: Int?, slots: Int?) {
        guard let object = self.object(data) else { return (nil, nil) }
        let settings = object["default_generation_settings"] as? [String: Any]
        let n = OutsideNumber.int(settings?["n_ctx"], in: TokenCount.range)
            ?? OutsideNumber.int(object["n_ctx"], in: TokenCount.range)
        return (n, OutsideNumber.int(object["total_slots"], in: slotCounts))
    }

    /// `GET /v1/models`: each listed model's id, with the window vLLM says for it (`max_model_len`).
    static func models(_ data: Data) -> [(id: String?, contextSize: Int?)] {
        guard let list = object(data)?["data"] as? [[String: Any]] else { return [] }
        return list.map { ($0["id"] as? String, OutsideNumber.int($0["max_model_len"], in: TokenCount.range)) }
    }

    /// Ollama's `POST /api/show`: `num_ctx` in its `parameters` text, the window it runs with.
    static func ollamaContext(_ data: Data) -> Int? {
        guard let parameters = object(data)?["parameters"] as? String else { return nil }
        var found: Int?
        for line in parameters.split(separator: "\n") {
            let parts = line.split(whereSeparator: { $0 == " " || $0 == "\t" })
            if parts.count >= 2, parts[0] == "num_ctx" { found = OutsideNumber.int(parts[1], in: TokenCount.range) }
        }
        return found
    }

    /// `POST /tokenize`: llama.cpp lists the tokens, vLLM counts them (`count`).
    static func tokenCount(_ data: Data) -> Int? {
        guard let object = object(data) else { return nil }
        if let tokens = object["tokens"] as? [Any] { return tokens.count }
        return OutsideNumber.int(object["count"], in: TokenCount.range)
    }

    /// llama.cpp's `POST /v1/chat/completions/input_tokens`.
    static func inputTokens(_ data: Data) -> Int? {
        OutsideNumber.int(object(data)?["input_tokens"], in: TokenCount.range)
    }

    /// One event of a streamed chat answer (or a whole answer from a server that ignored `stream`).
    struct Chunk {
        /// The event was an error report (llama.cpp's `error:` line, or an `error` object): its JSON text.
        var error: String?
        var promptTokens: Int?
        var outputTokens: Int?
        var reasoningTokens: Int?
        /// Prompt tokens taken from the server's cache (llama.cpp's `timings.cache_n`, else
        /// `usage.prompt_tokens_details.cached_tokens`), and evaluated (`timings.prompt_n`).
        var cachedTokens: Int?
        var evaluatedTokens: Int?
        var finishReason: String?
        /// Pieces of tool calls, each to be joined to the call its index names (no index: a new call).
        var toolCalls: [(index: Int?, id: String?, name: String?, arguments: String?)] = []
        var reasoning: String?
        var content: String?
    }

    /// Decodes one SSE line; nil for what carries nothing (comments, event names, blank lines,
    /// `[DONE]`, text that is not a JSON object).
    static func chunk(_ line: String) -> Chunk? {
        let payload: Substring
        if line.hasPrefix("data:") {
            payload = line.dropFirst(5)
        } else if line.hasPrefix("error:") { // llama.cpp reports an error inside an open stream this way
            payload = line.dropFirst(6)
        } else if line.hasPrefix("{") { // a server that ignored `stream` and answered with one JSON body
            payload = Substring(line)
        } else {
            return nil
        }
        let text = payload.trimmingSpaces()
        if text == "[DONE]" || text.isEmpty { return nil }
        guard let object = object(Data(text.utf8)) else { return nil }
        var chunk = Chunk()
        if object["error"] != nil {
            chunk.error = text
            return chunk
        }
        if let usage = object["usage"] as? [String: Any] {
            chunk.promptTokens = OutsideNumber.int(usage["prompt_tokens"], in: TokenCount.range)
            chunk.outputTokens = OutsideNumber.int(usage["completion_tokens"], in: TokenCount.range)
            let details = usage["completion_tokens_details"] as? [String: Any]
            chunk.reasoningTokens = OutsideNumber.int(details?["reasoning_tokens"], in: TokenCount.range)
            let prompt = usage["prompt_tokens_details"] as? [String: Any]
            chunk.cachedTokens = OutsideNumber.int(prompt?["cached_tokens"], in: TokenCount.range)
        }
        if let timings = object["timings"] as? [String: Any] {
            // llama.cpp's own count, beside which its usage copy of it says nothing more.
            chunk.cachedTokens = OutsideNumber.int(timings["cache_n"], in: TokenCount.range)
            chunk.evaluatedTokens = OutsideNumber.int(timings["prompt_n"], in: TokenCount.range)
        }
        guard let choice = (object["choices"] as? [[String: Any]])?.first else { return chunk }
        chunk.finishReason = choice["finish_reason"] as? String
        guard let delta = (choice["delta"] as? [String: Any]) ?? (choice["message"] as? [String: Any]) else {
            return chunk
        }
        for raw in delta["tool_calls"] as? [[String: Any]] ?? [] {
            // An index out of range names no call wisp could keep: the piece is dropped.
            let index = OutsideNumber.int(raw["index"], in: toolCallIndexes)
            if raw["index"] != nil && index == nil { continue }
            let function = raw["function"] as? [String: Any]
            chunk.toolCalls.append((index, raw["id"] as? String, function?["name"] as? String,
                                    function?["arguments"] as? String))
        }
        chunk.reasoning = (delta["reasoning_content"] as? String) ?? (delta["reasoning"] as? String)
        chunk.content = delta["content"] as? String
        return chunk
    }

    private static func object(_ data: Data) -> [String: Any]? {
        JSONObjects.object(data) as? [String: Any]
    }
}
