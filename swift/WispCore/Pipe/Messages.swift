/// The pipe protocol, version 2 (ARCHITECTURE.md): one type per message. The Python side
/// (`python/wisp_shim/protocol.py`) declares the same types under the same names; keep them in step.
///
/// Shim → core: `Respond`, `CloseThread`, `Cancel`, `Status`, `ReadThread`, `Ping`, each tagged by `op`.
/// Core → shim: `Ready` (first frame), `Progress`, `Stage` and `Evicted` (events), `Reply` (one per
/// request, ok or not), each tagged by `event`; an ok reply's result is tagged by `op`, the op
/// of the request it answers, so the shim decodes any core message in one pass.

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The pipe protocol version `Ready` announces (the shim's `PROTOCOL_VERSION`).
public let protocolVersion = 2

// MARK: shim → core

public struct RespondOptions: Codable, Sendable, Equatable {
    public var temperature: Double?
    public var max_output_tokens: Int?
    /// The call's time limit as the caller set it (what a `timeout` error names).
    public var timeout_s: Double?
    /// When that limit runs out, in `monotonicSeconds()`, the clock both processes read: a call
    /// read after it (a core stopped or busy while requests queued) is neither run nor committed.
    /// Without it, the limit counts from when the core reads the request.
    public var deadline: Double?
    /// `light`, `moderate` or `deep` (`ReasoningLevel`); nil: the backend's default.
    public var reasoning: String?

    public init(temperature: Double? = nil, max_output_tokens: Int? = nil, timeout_s: Double? = nil, deadline: Double? = nil,
                reasoning: String? = nil) {
        self.temperature = temperature
        self.max_output_tokens = max_output_tokens
        self.timeout_s = timeout_s
        self.deadline = deadline
        self.reasoning = reasoning
    }
}

/// The pipe's clock for `RespondOptions.deadline`, in seconds: `clock_gettime(CLOCK_MONOTONIC)`,
/// read by the shim too (`protocol.monotonic_now`). Why this one: it is one clock for the whole
/// machine, so the shim's reading means the same instant here. On Linux every process of a
/// time namespace reads the same CLOCK_MONOTONIC (time namespaces may offset it, and the core,
/// the shim's child, inherits the shim's); on macOS it is the kernel's time since boot, the same
/// for every process. Not `ContinuousClock` (CLOCK_BOOTTIME on Linux, a different origin), and
/// not the wall clock, which may be stepped (NTP, the user) between the two readings.
public func monotonicSeconds() -> Double {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return Double(t.tv_sec) + Double(t.tv_nsec) / 1e9
}

public struct Respond: Codable, Sendable, Equatable {
    public var id: Int
    public var prompt: String
    public var thread_id: String?
    public var instructions: String?
    public var tools: [String]?
    public var options: RespondOptions?
    /// Send `Progress` events while generating.
    public var progress: Bool?
    /// Directories the MCP client offers (its roots): the model tools of a thread this call
    /// creates may read them as well as the core's own `--root`s.
    public var roots: [String]?
    /// Paths of text files the core reads (under its roots and `roots`) and gives the model with the prompt.
    public var files: [String]?
    /// Structured output for this call: a JSON Schema as compact JSON text (text, not a JSON
    /// value, so that the core keeps its key order; see OutputSchema.swift). The shim has
    /// checked that it stays inside wisp's supported subset.
    public var schema: String?
    /// The call creates its thread as a copy of this one's binding and committed history.
    public var fork_from: String?
    /// Drops the thread's last `rewind` turns as part of this call (all or nothing).
    public var rewind: Int?

    public init(id: Int, prompt: String, thread_id: String? = nil, instructions: String? = nil,
                tools: [String]? = nil, options: RespondOptions? = nil, progress: Bool? = nil, roots: [String]? = nil,
                files: [String]? = nil, schema: String? = nil, fork_from: String? = nil, rewind: Int? = nil) {
        self.fork_from = fork_from
        self.rewind = rewind
        self.id = id
        self.prompt = prompt
        self.thread_id = thread_id
        self.instructions = instructions
        self.tools = tools
        self.options = options
        self.progress = progress
        self.roots = roots
        self.files = files
        self.schema = schema
    }
}

public struct CloseThread: Codable, Sendable, Equatable {
    public var id: Int
    public var thread_id: String
    public init(id: Int, thread_id: String) { self.id = id; self.thread_id = thread_id }
}

public struct Cancel: Codable, Sendable, Equatable {
    public var id: Int
    /// The id of the in-flight request to cancel.
    public var request: Int
    public init(id: Int, request: Int) { self.id = id; self.request = request }
}

/// The backend's state and a page of threads: with `query`, those whose prompts and replies hold
/// its words, best match first; else most recently used first. `cursor` is a `next_cursor`.
public struct Status: Codable, Sendable, Equatable {
    public var id: Int
    public var query: String?
    public var limit: Int?
    public var cursor: String?
    public init(id: Int, query: String? = nil, limit: Int? = nil, cursor: String? = nil) {
        self.id = id
        self.query = query
        self.limit = limit
        self.cursor = cursor
    }
}

/// A thread's binding and its last turns, at most `max_bytes` of their text.
public struct ReadThread: Codable, Sendable, Equatable {
    public var id: Int
    public var thread_id: String
    /// At most this many of the newest turns; nil: as many as fit.
    public var last: Int?
    public var max_bytes: Int?
    public init(id: Int, thread_id: String, last: Int? = nil, max_bytes: Int? = nil) {
        self.id = id
        self.thread_id = thread_id
        self.last = last
        self.max_bytes = max_bytes
    }
}

/// A liveness check: answered at once by the dispatcher (`PingResult`), without touching the
/// registry or a backend, so a reply proves the core still reads and runs its dispatcher.
public struct Ping: Codable, Sendable, Equatable {
    public var id: Int
    public init(id: Int) { self.id = id }
}

/// Any shim → core message, decoded in one pass by its `op`.
public enum Request: Sendable, Equatable {
    case respond(Respond)
    case closeThread(CloseThread)
    case cancel(Cancel)
    case status(Status)
    case readThread(ReadThread)
    case ping(Ping)

    public var id: Int {
        switch self {
        case .respond(let m): m.id
        case .closeThread(let m): m.id
        case .cancel(let m): m.id
        case .status(let m): m.id
        case .readThread(let m): m.id
        case .ping(let m): m.id
        }
    }
}

extension Request: Codable {
    enum Op: String, Codable { case respond, close_thread, cancel, status, read_thread, ping }
    private enum Keys: String, CodingKey { case op }

    public init(from decoder: any Decoder) throws {
        let op = try decoder.container(keyedBy: Keys.self).decode(Op.self, forKey: .op)
        switch op {
        case .respond: self = .respond(try Respond(from: decoder))
        case .close_thread: self = .closeThread(try CloseThread(from: decoder))
        case .cancel: self = .cancel(try Cancel(from: decoder))
        case .status: self = .status(try Status(from: decoder))
        case .read_thread: self = .readThread(try ReadThread(from: decoder))
        case .ping: self = .ping(try Ping(from: decoder))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .respond(let m): try c.encode(Op.respond, forKey: .op); try m.encode(to: encoder)
        case .closeThread(let m): try c.encode(Op.close_thread, forKey: .op); try m.encode(to: encoder)
        case .cancel(let m): try c.encode(Op.cancel, forKey: .op); try m.encode(to: encoder)
        case .status(let m): try c.encode(Op.status, forKey: .op); try m.encode(to: encoder)
        case .readThread(let m): try c.encode(Op.read_thread, forKey: .op); try m.encode(to: encoder)
        case .ping(let m): try c.encode(Op.ping, forKey: .op); try m.encode(to: encoder)
        }
    }
}

// MARK: core → shim

/// The first frame, written before any model loads.
public struct Ready: Codable, Sendable, Equatable {
    public var id = 0
    public var event = "ready"
    public var `protocol` = protocolVersion
    public var backend: String
    public var model: String
    public var pid: Int32
    /// Threads are stored (`--state-dir`): a crash of this core loses none of their committed turns.
    public var durable = false

    public init(backend: String, model: String, pid: Int32, durable: Bool = false) {
        self.backend = backend
        self.model = model
        self.pid = pid
        self.durable = durable
    }
}

/// A partial reply for request `id`: `text` is cumulative, `tokens` strictly increasing.
public struct Progress: Codable, Sendable, Equatable {
    public var id: Int
    public var event = "progress"
    public var text: String
    public var tokens: Int

    public init(id: Int, text: String, tokens: Int) {
        self.id = id
        self.text = text
        self.tokens = tokens
    }
}

/// What request `id` waits for before its first token (`Waiting`), sent when that changes:
/// `stage` is `queue` (`count`: calls of its thread ahead of it), `slot` (every model slot is
/// busy with other threads) or `prompt` (the model reads it; `count`: its tokens, where known).
public struct Stage: Codable, Sendable, Equatable {
    public var id: Int
    public var event = "stage"
    public var stage: String
    public var count: Int?

    public init(id: Int, _ waiting: Waiting) {
        self.id = id
        switch waiting {
        case .queue(let ahead): stage = "queue"; count = ahead
        case .slot: stage = "slot"
        case .prompt(let tokens): stage = "prompt"; count = tokens
        }
    }
}

/// Thread `thread_id` was evicted (least recently used) to make room for a new one. Sent before
/// the reply of the call whose new thread caused it, so the shim's view of live threads stays exact.
public struct Evicted: Codable, Sendable, Equatable {
    public var id = 0
    public var event = "evicted"
    public var thread_id: String

    public init(thread_id: String) { self.thread_id = thread_id }
}

public struct ErrorBody: Codable, Sendable, Equatable {
    public var code: String
    public var message: String
    public init(code: String, message: String) { self.code = code; self.message = message }
}

/// Tokens model requests cost, as the backend reported them (`Usage`): a count it did not
/// report is absent. The time to the first token and the generation speed are a call's own
/// (wisp's measure), so totals over calls leave them out.
public struct UsageBody: Codable, Sendable, Equatable {
    public var input_tokens: Int?
    public var output_tokens: Int?
    public var reasoning_tokens: Int?
    public var cached_tokens: Int?
    public var first_token_ms: Int?
    public var output_tokens_per_s: Double?

    public init(input_tokens: Int? = nil, output_tokens: Int? = nil, reasoning_tokens: Int? = nil, cached_tokens: Int? = nil,
                first_token_ms: Int? = nil, output_tokens_per_s: Double? = nil) {
        self.input_tokens = input_tokens
        self.output_tokens = output_tokens
        self.reasoning_tokens = reasoning_tokens
        self.cached_tokens = cached_tokens
        self.first_token_ms = first_token_ms
        self.output_tokens_per_s = output_tokens_per_s
    }

    /// One call's usage, with its timing.
    public init(_ u: Usage) {
        self.init(input_tokens: u.inputTokens, output_tokens: u.outputTokens, reasoning_tokens: u.reasoningTokens,
                  cached_tokens: u.cachedTokens,
                  first_token_ms: u.firstTokenSeconds.map { Int(min(max(0, $0), 1e9) * 1000) },
                  output_tokens_per_s: u.outputTokensPerSecond.map { ($0 * 10).rounded() / 10 })
    }

    /// Counts summed over calls.
    public init(totals u: Usage) {
        self.init(input_tokens: u.inputTokens, output_tokens: u.outputTokens, reasoning_tokens: u.reasoningTokens,
                  cached_tokens: u.cachedTokens)
    }
}

/// The result of `respond`. `turns` counts the turns the thread holds after this call
/// (this one included); `dropped` counts the turns condensing removed during this call.
public struct RespondResult: Codable, Sendable, Equatable {
    var op = Request.Op.respond
    public var thread_id: String
    public var created: Bool
    public var text: String
    public var condensed: Bool
    public var turns: Int
    public var dropped: Int
    public var prompt_tokens: Int?
    public var output_tokens: Int?
    /// Durable threads only: why this turn could not be stored (it is kept in memory only, and
    /// a crash would lose the thread).
    public var store_error: String?
    /// What this call's model requests cost, added up (tool rounds included).
    public var usage: UsageBody?

    public init(thread_id: String, created: Bool, text: String, condensed: Bool, turns: Int, dropped: Int,
                prompt_tokens: Int? = nil, output_tokens: Int? = nil, store_error: String? = nil, usage: UsageBody? = nil) {
        self.usage = usage
        self.store_error = store_error
        self.thread_id = thread_id
        self.created = created
        self.text = text
        self.condensed = condensed
        self.turns = turns
        self.dropped = dropped
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
    }
}

public struct CloseThreadResult: Codable, Sendable, Equatable {
    var op = Request.Op.close_thread
    public var thread_id: String
    public var closed: Bool
    public init(thread_id: String, closed: Bool) { self.thread_id = thread_id; self.closed = closed }
}

public struct CancelResult: Codable, Sendable, Equatable {
    var op = Request.Op.cancel
    /// False when the request had already finished or was never seen.
    public var cancelled: Bool
    public init(cancelled: Bool) { self.cancelled = cancelled }
}

public struct PingResult: Codable, Sendable, Equatable {
    var op = Request.Op.ping
    public init() {}
}

public struct ThreadInfo: Codable, Sendable, Equatable {
    public var thread_id: String
    public var turns: Int
    /// Calls accepted for this thread and not yet finished (running or waiting).
    public var pending: Int
    /// In the core's memory now.
    public var live: Bool
    /// In the state dir (`--state-dir`).
    public var stored: Bool
    /// Live threads: what their committed calls cost so far (since created or resumed); nil before any.
    public var usage: UsageBody?
    /// Unix seconds: the thread's first and latest committed turn, where known.
    public var created_at: Double?
    public var updated_at: Double?
    /// The start of its first prompt and of its last reply, and its instructions, each clipped (`ThreadPreview`).
    public var first_prompt: String?
    public var last_reply: String?
    public var instructions: String?
    public init(thread_id: String, turns: Int, pending: Int, live: Bool = true, stored: Bool = false, usage: UsageBody? = nil,
                created_at: Double? = nil, updated_at: Double? = nil, first_prompt: String? = nil, last_reply: String? = nil,
                instructions: String? = nil) {
        self.created_at = created_at
        self.updated_at = updated_at
        self.first_prompt = first_prompt
        self.last_reply = last_reply
        self.instructions = instructions
        self.usage = usage
        self.thread_id = thread_id
        self.turns = turns
        self.pending = pending
        self.live = live
        self.stored = stored
    }
}

public struct StatusResult: Codable, Sendable, Equatable {
    var op = Request.Op.status
    public var backend: String
    public var model: String
    public var available: Bool
    public var reason: String?
    public var context_size: Int
    public var max_threads: Int
    public var max_queue: Int
    /// The page of threads the request asked for.
    public var threads: [ThreadInfo]
    /// For the next page, when there is one.
    public var next_cursor: String?
    /// The model-tool catalogue, by name.
    public var tools: [String]
    /// The state dir threads are stored in, when durable.
    public var state_dir: String?
    /// Why a `--state-dir` that was given is not in use.
    public var state_error: String?
    /// What this core's committed calls cost since it started, summed.
    public var usage: UsageBody?
    /// Set when the server was found to read less of a prompt than wisp sent (it cut it
    /// silently): the window wisp learnt, and from what.
    public var context_note: String?

    public init(backend: String, model: String, available: Bool, reason: String?, context_size: Int,
                max_threads: Int, max_queue: Int, threads: [ThreadInfo], tools: [String],
                state_dir: String? = nil, state_error: String? = nil, next_cursor: String? = nil,
                usage: UsageBody? = nil, context_note: String? = nil) {
        self.next_cursor = next_cursor
        self.usage = usage
        self.context_note = context_note
        self.state_dir = state_dir
        self.state_error = state_error
        self.backend = backend
        self.model = model
        self.available = available
        self.reason = reason
        self.context_size = context_size
        self.max_threads = max_threads
        self.max_queue = max_queue
        self.threads = threads
        self.tools = tools
    }
}

/// One turn as `read_thread` returns it; `cut`: its prompt or reply was clipped to fit.
public struct TurnItem: Codable, Sendable, Equatable {
    public var prompt: String
    public var reply: String
    /// The turn answered a `schema` and `reply` is its JSON value as text, whole (not `cut`).
    public var structured: Bool
    public var cut: Bool
    public init(prompt: String, reply: String, structured: Bool = false, cut: Bool = false) {
        self.prompt = prompt
        self.reply = reply
        self.structured = structured
        self.cut = cut
    }
}

public struct ReadThreadResult: Codable, Sendable, Equatable {
    var op = Request.Op.read_thread
    public var thread_id: String
    public var instructions: String?
    public var tools: [String]
    /// Turns the thread holds; `items` are its last ones, `omitted` the earlier ones left out.
    public var turns: Int
    public var omitted: Int
    /// Turns condensing dropped from this thread while this core held it.
    public var condensed: Int
    public var items: [TurnItem]
    public init(thread_id: String, instructions: String?, tools: [String], turns: Int, omitted: Int, condensed: Int,
                items: [TurnItem]) {
        self.thread_id = thread_id
        self.instructions = instructions
        self.tools = tools
        self.turns = turns
        self.omitted = omitted
        self.condensed = condensed
        self.items = items
    }
}

/// Exactly one per request: `ok` with the op's result, or not ok with an error.
public struct Reply<Result: Codable & Sendable>: Codable, Sendable {
    public var id: Int
    public var event = "reply"
    public var ok: Bool
    public var result: Result?
    public var error: ErrorBody?

    public static func success(_ id: Int, _ result: Result) -> Reply { Reply(id: id, ok: true, result: result, error: nil) }
}

/// The failure form of `Reply`, which carries no result.
public typealias ErrorReply = Reply<Empty>
public struct Empty: Codable, Sendable {}

extension Reply where Result == Empty {
    public static func failure(_ id: Int, _ error: WispError) -> Reply {
        Reply(id: id, ok: false, result: nil, error: ErrorBody(code: error.code.rawValue, message: error.message))
    }
}
