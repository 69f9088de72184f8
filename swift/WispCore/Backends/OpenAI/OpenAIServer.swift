#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Synchronization
import WispInfrastructure

/// The HTTP side, shared by every session of a backend. Facts learnt from the server are cached.
final class OpenAIServer: Sendable {
    /// The base the OpenAI paths hang off, e.g. http://127.0.0.1:8080/v1 (no trailing slash).
    let base: URL
    /// The server's root (base without a trailing /v1): llama.cpp's /props and /tokenize, Ollama's /api/show.
    let root: URL
    let configuredModel: String?
    let configuredContextSize: Int?
    /// `--slots`: llama-server's parallel slots (0: do not pin threads to slots); nil: what
    /// `/props` says (`total_slots`, which only llama.cpp's server reports).
    let configuredSlots: Int?
    private let apiKey: String?
    /// Ollama's `keep_alive` for the model (`OllamaKeepAlive`); nil: never sent.
    let keepAlive: OllamaKeepAlive?
    /// Condensing's low-water mark on servers that do not shift their cache (`Condensing`).
    let lowWater: Double
    /// The header a chat request names its thread in, for a router to pin by; nil: none.
    let sessionHeader: String?
    /// Up or down, and why (`Fleet.swift`); only a fleet of several endpoints acts on it.
    let health = Locked(EndpointHealth())

    /// Idle time-out for a chat request: a long prompt on a small CPU can take minutes before
    /// the first byte. The shim's own time limit and cancellation bound a call anyway.
    static let chatIdleTimeout: TimeInterval = 600
    static let probeTimeout: TimeInterval = 5
    /// The most one probe may take, whole: a server that trickles its answer a byte at a time
    /// never goes idle for `probeTimeout`, and every call that needs the probe would wait on it.
    static let probeDeadline = Duration.seconds(10)
    /// After a probe overran its deadline, how long probes are not sent at all: the server is
    /// taken as not saying (its window: `--context-size`, else 4096), so no call waits again.
    static let stallPause = Duration.seconds(60)
    static let fallbackContextSize = 4096
    /// The most a probe's answer may hold: `/tokenize` lists every token of a prompt (up to the
    /// pipe's frame limit), a few bytes each.
    static let maxProbeBytes = 1 << 28

    struct Facts: Sendable {
        var model: String?
        var contextSize: Int?
        var contextProbed = false
        var tokenize: Bool?
        /// llama.cpp's `POST /v1/chat/completions/input_tokens` answers (nil: not tried yet).
        var inputTokens: Bool?
        var lastReachable: ContinuousClock.Instant?
        /// llama.cpp's server, with this many slots: its own request fields may be sent.
        var slots: SlotPool?
        /// Which server this is, once one of `OpenAIDialects.swift`'s probes said so.
        var dialect: ServerDialect?
        /// Ollama: when `keep_alive` was last set (nil: never).
        var keptAliveAt: ContinuousClock.Instant?
        /// The window the server was found to read, below what it said, and how it was found.
        var learned: (window: Int, note: String)?
        /// When a probe last overran `probeDeadline`, and the error that said so.
        var stalled: (at: ContinuousClock.Instant, error: WispError)?
        /// The model ids `/v1/models` listed (nil: not asked, or it did not say).
        var served: [String]?
    }
    let facts = Mutex(Facts())
    /// Chat requests and probes alike; each request carries its own idle timeout.
    let http = HTTPClient()

    init(endpoint: String, model: String?, apiKey: String?, contextSize: Int?, slots: Int? = nil,
         keepAlive: OllamaKeepAlive? = OllamaKeepAlive(CoreConfig.defaultKeepAlive),
         lowWater: Double = CoreConfig.defaultCondenseTo,
         sessionHeader: String? = CoreConfig.defaultSessionHeader) throws(WispError) {
        var text = endpoint.trimmingSpaces()
        while text.hasSuffix("/") { text.removeLast() }
        if text.hasSuffix("/chat/completions") { text.removeLast("/chat/completions".count) }
        guard var components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              scheme == "http" || scheme == "https", components.host?.isEmpty == false else {
            throw WispError(.invalidArgument,
                            "--endpoint must be an http(s) URL such as http://127.0.0.1:8080/v1, got '\(endpoint)'")
        }
        if scheme == "https", let problem = HTTPClient.tlsProblem {
            // The host alone: an endpoint may carry credentials.
            throw WispError(.modelUnavailable, "the https endpoint at \(components.host ?? "") cannot be used: \(problem)")
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
        self.configuredSlots = slots.map { max(0, $0) }
        self.apiKey = apiKey
        self.keepAlive = keepAlive
        self.lowWater = lowWater
        self.sessionHeader = sessionHeader
        if let slots, slots > 0 { facts.withLock { $0.slots = SlotPool(count: slots) } }
    }

    /// For messages: the base URL, never with credentials.
    var endpointDescription: String {
        guard var shown = URLComponents(url: base, resolvingAgainstBaseURL: false) else { return hostPort }
        (shown.user, shown.password) = (nil, nil)
        return shown.url?.absoluteString ?? hostPort
    }

    /// For a result's `usage`: the host and port, never credentials.
    var hostPort: String {
        let port = base.port ?? (base.scheme?.lowercased() == "https" ? 443 : 80)
        let host = base.host ?? ""
        return host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }

    var modelName: String { configuredModel ?? facts.withLock { $0.model } ?? "default" }

    // MARK: availability, model, context, tokens

    /// `fresh`: asked now, not taken from an answer in the last 10 s.
    func availability(fresh: Bool = false) async -> Availability {
        if !fresh, let last = facts.withLock({ $0.lastReachable }), ContinuousClock.now - last < .seconds(10) {
            return .ready
        }
        do {
            let (status, data) = try await fetch("GET", base.appendingPathComponent("models"),
                                                 timeout: Self.probeTimeout)
            switch status {
            case 200..<300, 404, 405:
                learnModels(data)
                facts.withLock { $0.lastReachable = .now }
                return .ready
            case 401, 403:
                return .unavailable("the model server at \(endpointDescription) refused the credentials (HTTP " +
                                    "\(status)): check WISP_API_KEY")
            case 503:
                return .unavailable("the model server at \(endpointDescription) is not ready yet (HTTP 503, e.g. " +
                                    "still loading the model): \(Self.errorMessage(data) ?? "")")
            default:
                return .unavailable("the model server at \(endpointDescription) answered HTTP \(status): " +
                                    "\(Self.errorMessage(data) ?? "")")
            }
        } catch {
            return .unavailable(mapTransport(error, what: "reach").message)
        }
    }

    /// The model name a request carries: --model, else the server's first listed model.
    func requestModel() async -> String {
        if let configuredModel { return configuredModel }
        if let known = facts.withLock({ $0.model }) { return known }
        if let (status, data) = try? await fetch("GET", base.appendingPathComponent("models"),
                                                 timeout: Self.probeTimeout),
           (200..<300).contains(status) {
            learnModels(data)
        }
        return facts.withLock { $0.model } ?? "default"
    }

    private func learnModels(_ data: Data) {
        let list = OpenAIReplies.models(data)
        if !list.isEmpty { facts.withLock { $0.served = list.compactMap(\.id) } }
        guard let mine = list.first(where: { $0.id == configuredModel }) ?? list.first else { return }
        facts.withLock { f in
            if f.model == nil { f.model = mine.id }
            if f.contextSize == nil, let n = mine.contextSize, n > 0 {
                f.contextSize = n
                if f.dialect == nil || f.dialect == .generic { f.dialect = .vllm }
            }
        }
    }

    /// The window a request may fill: what the server says (in `OpenAIDialects.swift`'s order),
    /// else `--context-size`, else 4096; lowered to what the server was found to read
    /// (`learnWindow`). Asked again on every call while the server's model is not loaded yet
    /// (Ollama, LM Studio: it may load with another window than any setting says).
    func contextSize() async -> Int {
        if let known = facts.withLock({ knownContextSize(in: $0) }) { return known }
        let model = await requestModel()
        var dialect = facts.withLock { $0.dialect }
        var found: Int?
        var loaded = true
        if dialect == nil || dialect == .llamaCpp, let props = await probeLlamaCpp() {
            dialect = .llamaCpp
            found = props.window
            loaded = props.window != nil  // 0 while the model loads: ask again later
            learnSlots(props.slots)
        }
        if dialect == nil || dialect == .lmStudio, let window = await probeLMStudio(model: model) {
            dialect = .lmStudio
            found = window
            loaded = window != nil
        }
        if dialect == nil || dialect == .vllm,
           let (status, data) = try? await fetch("GET", base.appendingPathComponent("models"),
                                                 timeout: Self.probeTimeout),
           status == 200 {
            learnModels(data)
            let d = facts.withLock { $0.dialect }
            if d == .vllm {
                dialect = .vllm
                found = facts.withLock { $0.contextSize }
            } else if dialect == nil {
                dialect = .generic
            }
        }
        if dialect == nil || dialect == .generic || dialect == .ollama, let window = await probeOllama(model: model) {
            dialect = .ollama
            found = window
            if window == nil {
                loaded = false
                found = await ollamaShownWindow(model: model)
            }
        }
        let final = loaded
        facts.withLock { f in
            f.dialect = dialect ?? f.dialect
            if final, dialect != nil {
                if let found { f.contextSize = found }
                f.contextProbed = true
            }
        }
        return found ?? configuredContextSize ?? Self.fallbackContextSize
    }

    /// The window as far as it is known without asking the server; nil until it was asked.
    func knownContextSize(in f: Facts) -> Int? {
        f.learned?.window ?? f.contextSize ?? (f.contextProbed ? (configuredContextSize ?? Self.fallbackContextSize) : nil)
    }

    /// The server read `read` tokens of a request of at least `sent` (about `estimate`). True
    /// when that was a cut: unless the server's loaded model has a window the estimate fits in
    /// well (then the server counts otherwise, as Ollama 0.30 did, counting only what it
    /// evaluated). Learns the window (the loaded model's where the server says it, else what it
    /// read) and says so once in the log; `contextNote` keeps it.
    func learnWindow(read: Int, sent: Int, estimate: Int) async -> Bool {
        let believed = await contextSize()
        let model = await requestModel()
        let dialect = facts.withLock { $0.dialect } ?? .generic
        var said: Int?
        switch dialect {
        case .ollama: said = await probeOllama(model: model) ?? nil
        case .lmStudio: said = await probeLMStudio(model: model) ?? nil
        default: break
        }
        if let said, estimate < said - said / 10 { return false }
        let window = max(1, min(said ?? read, believed))
        let how = said != nil ? "its loaded model's window" : "what it read"
        let note = """
            \(dialect.rawValue) at \(endpointDescription) read \(read) tokens of a request of at least \(sent) \
            (it cut the prompt silently): wisp now takes the model's window as \(window) tokens (\(how)), \
            not \(believed), and condenses threads to fit it
            """
        let first = facts.withLock { f -> Bool in
            defer { f.learned = (window, note) }
            return f.learned?.window != window
        }
        if first { LogSink.shared.post("wisp-core warning: \(note)") }
        return true
    }

    var contextNote: String? { facts.withLock { $0.learned?.note } }

    /// The slots of a llama.cpp server, which threads are pinned to; nil for any other server
    /// (which must not get llama.cpp's own request fields) or with `--slots 0`.
    func slotPool() async -> SlotPool? {
        if configuredSlots != nil { return facts.withLock { $0.slots } }
        if facts.withLock({ !$0.contextProbed }) { _ = await contextSize() }
        return facts.withLock { $0.slots }
    }

    private func learnSlots(_ total: Int?) {
        guard configuredSlots == nil, let total, total > 0 else { return }
        facts.withLock { f in
            if f.slots?.count != total { f.slots = SlotPool(count: total) }
        }
    }

    func tokenCount(_ text: String) async throws -> Int? {
        if facts.withLock({ $0.tokenize }) == false { return nil } // before the model name is looked up
        // llama.cpp reads `content`, vLLM `prompt` (+ `model`); each ignores the other's keys.
        let body: [String: Any] = ["content": text, "add_special": false,
                                   "prompt": text, "add_special_tokens": false, "model": await requestModel()]
        return try await count(root.appendingPathComponent("tokenize"),
                               body: try JSONObjects.data(body),
                               offered: \.tokenize, read: OpenAIReplies.tokenCount)
    }

    /// The prompt tokens of a chat request `body` as the server itself would read it: llama.cpp's
    /// `POST {base}/chat/completions/input_tokens` applies the chat template and the tools, so
    /// it is the `prompt_tokens` the request will report. Nil from a server without it.
    func inputTokens(body: Data) async throws -> Int? {
        try await count(base.appendingPathComponent("chat/completions/input_tokens"), body: body,
                        offered: \.inputTokens, read: OpenAIReplies.inputTokens)
    }

    /// A count from one of the server's counting endpoints, which `offered` remembers it has:
    /// asked once of a server without it (any answer but a count, other than 503 while it loads),
    /// nil while the server is unreachable (the chat request will say so clearly).
    nonisolated(nonsending)
    private func count(_ url: URL, body: Data, offered: WritableKeyPath<Facts, Bool?> & Sendable,
                       read: (Data) -> Int?) async throws -> Int? {
        if facts.withLock({ $0[keyPath: offered] }) == false { return nil }
        do {
            let (status, data) = try await fetch("POST", url, body: body, timeout: Self.probeTimeout)
            guard let n = status == 200 ? read(data) : nil else {
                if status != 503 { facts.withLock { $0[keyPath: offered] = false } }
                return nil
            }
            facts.withLock { $0[keyPath: offered] = true }
            return n
        } catch {
            try Task.checkCancellation()
            return nil
        }
    }

    // MARK: HTTP

    /// `session`: the thread the request is for, named in `sessionHeader` (probes carry none).
    func makeRequest(_ method: String, _ url: URL, body: Data?, timeout: TimeInterval,
                     streaming: Bool = false, session: String? = nil) -> HTTPRequest {
        var r = HTTPRequest(method: method, url: url, body: body, idleTimeout: timeout)
        if body != nil { r.headers.append(("Content-Type", "application/json")) }
        if let sessionHeader, let session { r.headers.append((sessionHeader, session)) }
        r.headers.append(("Accept", streaming ? "text/event-stream" : "application/json"))
        if let apiKey { r.headers.append(("Authorization", "Bearer \(apiKey)")) }
        return r
    }

    /// One short request, whole answer collected. Throws only on transport failure.
    nonisolated(nonsending)
    func fetch(_ method: String, _ url: URL, json: [String: Any]? = nil,
               timeout: TimeInterval, deadline: Duration = probeDeadline) async throws -> (Int, Data) {
        try await fetch(method, url, body: try json.map { try JSONObjects.data($0) },
                        timeout: timeout, deadline: deadline)
    }

    /// `deadline`: for the whole exchange (a probe's by default); `timeout`: for each wait for a byte.
    nonisolated(nonsending)
    func fetch(_ method: String, _ url: URL, body: Data?, timeout: TimeInterval,
               deadline: Duration = probeDeadline) async throws -> (Int, Data) {
        if let stalled = facts.withLock({ f in f.stalled.flatMap { .now - $0.at < Self.stallPause ? $0.error : nil } }) {
            throw stalled
        }
        let request = makeRequest(method, url, body: body, timeout: timeout)
        let answer = try await withThrowingTaskGroup(of: (Int, Data)?.self) { group in
            group.addTask { try await self.collect(request) }
            group.addTask {
                try? await Task.sleep(for: deadline)
                return nil
            }
            defer { group.cancelAll() }
            return try await group.next() ?? nil
        }
        try Task.checkCancellation()
        if let answer { return answer }
        let error = WispError(.modelUnavailable, """
            the model server at \(endpointDescription) did not answer \(method) \(url.path) whole within \
            \(deadline.components.seconds) s (it sends too slowly, or not at all)
            """)
        facts.withLock { $0.stalled = (.now, error) }
        LogSink.shared.post("wisp-core warning: \(error.message); wisp goes on without it and sends no probe for "
                            + "\(Self.stallPause.components.seconds) s")
        throw error
    }

    /// One request's whole answer, however long it takes (`fetch` bounds it).
    private func collect(_ request: HTTPRequest) async throws -> (Int, Data) {
        var status = 0
        var data = Data()
        for try await event in http.open(request) {
            switch event {
            case .head(let head): status = head.status
            case .data(let d):
                data.append(d)
                // The length is the server's to choose: past what any answer about itself needs, it is refused.
                if data.count > Self.maxProbeBytes {
                    throw HTTPError(.tooLarge, "its answer about itself was longer than \(Self.maxProbeBytes) bytes")
                }
            }
        }
        try Task.checkCancellation()
        return (status, data)
    }
}
