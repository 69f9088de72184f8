#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// The model servers wisp knows by name, each in one place: what it says about itself (its
/// window, its slots), which request fields beyond the OpenAI API it gets, and how it fits a
/// prompt that is too long. `OpenAIServer.contextSize()` asks them in this file's order; the
/// first that answers as itself names the server. Their overflow errors: `OpenAIErrors.swift`.
enum ServerDialect: String, Sendable {
    /// llama.cpp's `llama-server`: `GET /props` (`default_generation_settings.n_ctx`, a slot's
    /// window; `total_slots`). Gets `id_slot`, `cache_prompt` and `n_cache_reuse` (OpenAISlots.swift),
    /// so condensing drops just enough: the turns that remain are shifted in the slot's KV cache.
    /// Never cuts a prompt silently: too long is `exceed_context_size_error`.
    case llamaCpp = "llama.cpp"
    /// LM Studio: `GET /api/v0/models` lists each model's `state` and, once loaded, its
    /// `loaded_context_length` (the window it really runs with, often far below its
    /// `max_context_length`). Unknown paths answer 200 with `{"error": …}`. With its context
    /// overflow policy it may cut a prompt (keeping its start); else the error says
    /// "Trying to keep the first N tokens when context the overflows".
    case lmStudio = "LM Studio"
    /// vLLM: `max_model_len` in `GET /v1/models`; an overflow is a 400 "This model's maximum
    /// context length is N tokens. However, your request has P input tokens". Its prefix cache
    /// works by hashed blocks of an unchanged prefix.
    case vllm = "vLLM"
    /// Ollama: its `/v1` route reads no `num_ctx`, `options` or `keep_alive`. The loaded model's
    /// window is `context_length` in `GET /api/ps` (from 0.10); before it is loaded, `num_ctx`
    /// in `POST /api/show`'s `parameters`, else its default (4096, or `OLLAMA_CONTEXT_LENGTH`,
    /// which nothing reports). A conversation longer than the window is fitted to it silently
    /// (oldest messages dropped, then the prompt cut by tokens): `usage.prompt_tokens` then falls
    /// short of what was sent, which `ReadCheck` catches. wisp never sends `num_ctx` (a different
    /// one reloads the model) and keeps the model loaded with `keep_alive` (below).
    case ollama = "Ollama"
    /// Any other OpenAI-compatible server: the OpenAI API and nothing more.
    case generic = "the server"

    /// Whether the server keeps a thread's earlier turns cached after condensing dropped the
    /// oldest (llama.cpp's KV shifting, sent only with slots): if not, condensing goes in steps.
    func shiftsCache(slots: Bool) -> Bool { self == .llamaCpp && slots }
}

/// Ollama's `keep_alive`: how long a model stays loaded after its last request (Ollama's own
/// default is 5 minutes). It is read on the native `/api/generate` and `/api/chat` only, and
/// it stays with the loaded model (`server/sched.go`: a request without it leaves the value as
/// it was), so wisp sets it with a load request (`/api/generate` with no prompt) rather than
/// moving its chats to the native route, whose stream, tool calls and usage differ from every
/// other server's: before a thread's first request, and again after the server has been idle
/// for `refreshAfter` (shorter than Ollama's default, so a model that something else reloaded
/// with the default gets the setting back before it would unload).
struct OllamaKeepAlive: Sendable, Equatable {
    /// An Ollama duration: "30m", "2h", "90s", a number of seconds, or "-1" (stay loaded).
    let value: String
    static let refreshAfter: Duration = .seconds(240)

    /// Accepts what Ollama's `api.Duration` does in a string, by the few forms above.
    init?(_ text: String) {
        let t = text.trimmingSpaces()
        var digits = Substring(t)
        if digits.hasPrefix("-") { digits = digits.dropFirst() }
        if let unit = digits.last, "smh".contains(unit) { digits = digits.dropLast() }
        guard !digits.isEmpty, digits.count <= 9, digits.allSatisfy(\.isASCII), Int(digits) != nil else { return nil }
        value = t
    }
}

extension OpenAIServer {
    // MARK: llama.cpp

    /// `GET /props`: a slot's window and the slot count; nil when the server is not llama.cpp's.
    func probeLlamaCpp() async -> (window: Int?, slots: Int?)? {
        guard let object = await probeJSON("GET", root.appendingPathComponent("props")),
              let settings = object["default_generation_settings"] as? [String: Any] else { return nil }
        return (Self.positive(settings["n_ctx"]) ?? Self.positive(object["n_ctx"]),
                OutsideNumber.int(object["total_slots"], in: OpenAIReplies.slotCounts))
    }

    // MARK: LM Studio

    /// `GET /api/v0/models`: the loaded window of the model (nil until it is loaded); nil when
    /// the server is not LM Studio.
    func probeLMStudio(model: String) async -> Int?? {
        guard let object = await probeJSON("GET", root.appendingPathComponent("api/v0/models")),
              let list = object["data"] as? [[String: Any]],
              list.contains(where: { $0["max_context_length"] != nil || $0["state"] != nil }) else { return nil }
        let mine = list.first { ($0["id"] as? String) == model && ($0["state"] as? String) == "loaded" }
            ?? list.first { ($0["state"] as? String) == "loaded" }
        return .some(mine.flatMap { Self.positive($0["loaded_context_length"]) })
    }

    // MARK: vLLM: its window comes with the model list (`OpenAIReplies.models`, `learnModels`).

    // MARK: Ollama

    /// `GET /api/ps`: the running model's window (nil when it is not running); nil when the
    /// server is not Ollama.
    func probeOllama(model: String) async -> Int?? {
        guard let object = await probeJSON("GET", root.appendingPathComponent("api/ps")),
              let running = object["models"] as? [[String: Any]] else { return nil }
        func named(_ m: [String: Any]) -> Bool {
            [m["name"], m["model"]].contains { n in
                (n as? String).map { $0 == model || $0 == model + ":latest" } ?? false
            }
        }
        return .some(running.first(where: named).flatMap { Self.positive($0["context_length"]) })
    }

    /// `num_ctx` in `POST /api/show`'s `parameters`, when the Modelfile sets it.
    func ollamaShownWindow(model: String) async -> Int? {
        guard let (status, data) = try? await fetch("POST", root.appendingPathComponent("api/show"),
                                                    json: ["model": model], timeout: Self.probeTimeout),
              status == 200 else { return nil }
        return OpenAIReplies.ollamaContext(data).flatMap { $0 > 0 ? $0 : nil }
    }

    /// Sets `keep_alive` on Ollama's loaded model (loading it if it is not), when due: see
    /// `OllamaKeepAlive`. A failure changes nothing: the chat request says what is wrong.
    func keepModelLoaded() async {
        guard let keepAlive, facts.withLock({ $0.dialect }) == .ollama else { return }
        let due = facts.withLock { f -> Bool in
            guard f.keptAliveAt.map({ ContinuousClock.now - $0 >= OllamaKeepAlive.refreshAfter }) ?? true else {
                return false
            }
            f.keptAliveAt = .now
            return true
        }
        guard due else { return }
        let body: [String: Any] = ["model": await requestModel(), "keep_alive": keepAlive.value]
        // Loading a model can take a while; the chat would wait for it anyway.
        _ = try? await fetch("POST", root.appendingPathComponent("api/generate"), json: body,
                             timeout: Self.chatIdleTimeout, deadline: .seconds(Self.chatIdleTimeout))
    }

    // MARK: shared

    /// A JSON object answered with 200 that is not an error (LM Studio answers unknown paths so).
    func probeJSON(_ method: String, _ url: URL, json: [String: Any]? = nil) async -> [String: Any]? {
        guard let (status, data) = try? await fetch(method, url, json: json, timeout: Self.probeTimeout), status == 200,
              let object = JSONObjects.object(data) as? [String: Any], object["error"] == nil
        else { return nil }
        return object
    }

    /// A window from a server's JSON: a token count above 0, else nil (0: a model still loading).
    static func positive(_ value: Any?) -> Int? { OutsideNumber.int(value, in: 1...TokenCount.range.upperBound) }
}
