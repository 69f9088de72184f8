/// The pipe protocol, version 2 (ARCHITECTURE.md): one type per message, each with its field
/// table (`fields`, PipeJSON.swift), from which the core both reads and writes it: a new field is
/// its property and one line in the table. The Python side (`python/wisp_shim/protocol.py`)
/// declares the same types under the same names.
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

public struct RespondOptions: PipeMessage, Codable, Sendable, Equatable {
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

    public static let fields = PipeFields<Self>([
        .field("temperature", \.temperature),
        .field("max_output_tokens", \.max_output_tokens),
        .field("timeout_s", \.timeout_s),
        .field("deadline", \.deadline),
        .field("reasoning", \.reasoning),
    ])
    public static let blank = RespondOptions()
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

public struct Respond: PipeMessage, Codable, Sendable, Equatable {
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

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.respond),
        .field("id", \.id),
        .field("prompt", \.prompt),
        .field("thread_id", \.thread_id),
        .field("instructions", \.instructions),
        .field("tools", \.tools),
        .field("options", \.options),
        .field("progress", \.progress),
        .field("roots", \.roots),
        .field("files", \.files),
        .field("schema", \.schema),
        .field("fork_from", \.fork_from),
        .field("rewind", \.rewind),
    ])
    public static let blank = Respond(id: 0, prompt: "")
}

public struct CloseThread: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var thread_id: String

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.close_thread),
        .field("id", \.id),
        .field("thread_id", \.thread_id),
    ])
    public static let blank = CloseThread(id: 0, thread_id: "")
}

public struct Cancel: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    /// The id of the in-flight request to cancel.
    public var request: Int

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.cancel),
        .field("id", \.id),
        .field("request", \.request),
    ])
    public static let blank = Cancel(id: 0, request: 0)
}

/// The backend's state and a page of threads: with `query`, those whose prompts and replies hold
/// its words, best match first; else most recently used first. `cursor` is a `next_cursor`.
public struct Status: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var query: String?
    public var limit: Int?
    public var cursor: String?

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.status),
        .field("id", \.id),
        .field("query", \.query),
        .field("limit", \.limit),
        .field("cursor", \.cursor),
    ])
    public static let blank = Status(id: 0)
}

/// A thread's binding and its last turns, at most `max_bytes` of their text.
public struct ReadThread: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var thread_id: String
    /// At most this many of the newest turns; nil: as many as fit.
    public var last: Int?
    public var max_bytes: Int?

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.read_thread),
        .field("id", \.id),
        .field("thread_id", \.thread_id),
        .field("last", \.last),
        .field("max_bytes", \.max_bytes),
    ])
    public static let blank = ReadThread(id: 0, thread_id: "")
}

/// A liveness check: answered at once by the dispatcher (`PingResult`), without touching the
/// registry or a backend, so a reply proves the core still reads and runs its dispatcher.
public struct Ping: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.ping),
        .field("id", \.id),
    ])
    public static let blank = Ping(id: 0)
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
    public enum Op: String, Codable, Sendable, CaseIterable {
        case respond, close_thread, cancel, status, read_thread, ping
    }
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
public struct Ready: PipeMessage, Codable, Sendable, Equatable {
    public var id = 0
    public var event = "ready"
    public var `protocol` = protocolVersion
    public var backend: String
    public var model: String
    public var pid: Int32
    /// Threads are stored (`--state-dir`): a crash of this core loses none of their committed turns.
    public var durable = false

    public static let fields = PipeFields<Self>([
        .field("id", \.id),
        .field("event", \.event),
        .field("protocol", \.`protocol`),
        .field("backend", \.backend),
        .field("model", \.model),
        .field("pid", \.pid),
        .field("durable", \.durable),
    ])
    public static let blank = Ready(backend: "", model: "", pid: 0)
}

/// A partial reply for request `id`: `text` is cumulative, `tokens` strictly increasing.
public struct Progress: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var event = "progress"
    public var text: String
    public var tokens: Int

    public static let fields = PipeFields<Self>([
        .field("id", \.id),
        .field("event", \.event),
        .field("text", \.text),
        .field("tokens", \.tokens),
    ])
    public static let blank = Progress(id: 0, text: "", tokens: 0)
}

/// What request `id` waits for before its first token (`Waiting`), sent when that changes:
/// `stage` is `queue` (`count`: calls of its thread ahead of it), `slot` (every model slot is
/// busy with other threads) or `prompt` (the model reads it; `count`: its tokens, where known).
public struct Stage: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var event = "stage"
    public var stage: String
    public var count: Int?

    public static let fields = PipeFields<Self>([
        .field("id", \.id),
        .field("event", \.event),
        .field("stage", \.stage),
        .field("count", \.count),
    ])
    public static let blank = Stage(id: 0, stage: "")
}

extension Stage {
    public init(id: Int, _ waiting: Waiting) {
        switch waiting {
        case .queue(let ahead): self.init(id: id, stage: "queue", count: ahead)
        case .slot: self.init(id: id, stage: "slot")
        case .prompt(let tokens): self.init(id: id, stage: "prompt", count: tokens)
        }
    }
}

/// Thread `thread_id` was evicted (least recently used) to make room for a new one. Sent before
/// the reply of the call whose new thread caused it, so the shim's view of live threads stays exact.
public struct Evicted: PipeMessage, Codable, Sendable, Equatable {
    public var id = 0
    public var event = "evicted"
    public var thread_id: String


    public static let fields = PipeFields<Self>([
        .field("id", \.id),
        .field("event", \.event),
        .field("thread_id", \.thread_id),
    ])
    public static let blank = Evicted(thread_id: "")
}

public struct ErrorBody: PipeMessage, Codable, Sendable, Equatable {
    public var code: String
    public var message: String

    public static let fields = PipeFields<Self>([
        .field("code", \.code),
        .field("message", \.message),
    ])
    public static let blank = ErrorBody(code: "", message: "")
}

/// Tokens model requests cost, as the backend reported them (`Usage`): a count it did not
/// report is absent. The time to the first token and the generation speed are a call's own
/// (wisp's measure), so totals over calls leave them out.
public struct UsageBody: PipeMessage, Codable, Sendable, Equatable {
    public var input_tokens: Int?
    public var output_tokens: Int?
    public var reasoning_tokens: Int?
    public var cached_tokens: Int?
    public var first_token_ms: Int?
    public var output_tokens_per_s: Double?

    public static let fields = PipeFields<Self>([
        .field("input_tokens", \.input_tokens),
        .field("output_tokens", \.output_tokens),
        .field("reasoning_tokens", \.reasoning_tokens),
        .field("cached_tokens", \.cached_tokens),
        .field("first_token_ms", \.first_token_ms),
        .field("output_tokens_per_s", \.output_tokens_per_s),
    ])
    public static let blank = UsageBody()
}

extension UsageBody {
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
public struct RespondResult: PipeMessage, Codable, Sendable, Equatable {
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

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("thread_id", \.thread_id),
        .field("created", \.created),
        .field("text", \.text),
        .field("condensed", \.condensed),
        .field("turns", \.turns),
        .field("dropped", \.dropped),
        .field("prompt_tokens", \.prompt_tokens),
        .field("output_tokens", \.output_tokens),
        .field("store_error", \.store_error),
        .field("usage", \.usage),
    ])
    public static let blank = RespondResult(thread_id: "", created: false, text: "", condensed: false, turns: 0,
                                            dropped: 0)
}

public struct CloseThreadResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Request.Op.close_thread
    public var thread_id: String
    public var closed: Bool

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("thread_id", \.thread_id),
        .field("closed", \.closed),
    ])
    public static let blank = CloseThreadResult(thread_id: "", closed: false)
}

public struct CancelResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Request.Op.cancel
    /// False when the request had already finished or was never seen.
    public var cancelled: Bool

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("cancelled", \.cancelled),
    ])
    public static let blank = CancelResult(cancelled: false)
}

public struct PingResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Request.Op.ping

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
    ])
    public static let blank = PingResult()
}

public struct ThreadInfo: PipeMessage, Codable, Sendable, Equatable {
    public var thread_id: String
    public var turns: Int
    /// Calls accepted for this thread and not yet finished (running or waiting).
    public var pending: Int
    /// In the core's memory now.
    public var live = true
    /// In the state dir (`--state-dir`).
    public var stored = false
    /// Live threads: what their committed calls cost so far (since created or resumed); nil before any.
    public var usage: UsageBody?
    /// Unix seconds: the thread's first and latest committed turn, where known.
    public var created_at: Double?
    public var updated_at: Double?
    /// The start of its first prompt and of its last reply, and its instructions, each clipped (`ThreadPreview`).
    public var first_prompt: String?
    public var last_reply: String?
    public var instructions: String?

    public static let fields = PipeFields<Self>([
        .field("thread_id", \.thread_id),
        .field("turns", \.turns),
        .field("pending", \.pending),
        .field("live", \.live),
        .field("stored", \.stored),
        .field("usage", \.usage),
        .field("created_at", \.created_at),
        .field("updated_at", \.updated_at),
        .field("first_prompt", \.first_prompt),
        .field("last_reply", \.last_reply),
        .field("instructions", \.instructions),
    ])
    public static let blank = ThreadInfo(thread_id: "", turns: 0, pending: 0)
}

public struct StatusResult: PipeMessage, Codable, Sendable, Equatable {
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
    /// The model-tool catalogue, by name.
    public var tools: [String]
    /// The state dir threads are stored in, when durable.
    public var state_dir: String?
    /// Why a `--state-dir` that was given is not in use.
    public var state_error: String?
    /// For the next page of `threads`, when there is one.
    public var next_cursor: String?
    /// What this core's committed calls cost since it started, summed.
    public var usage: UsageBody?
    /// Set when the server was found to read less of a prompt than wisp sent (it cut it
    /// silently): the window wisp learnt, and from what.
    public var context_note: String?

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("backend", \.backend),
        .field("model", \.model),
        .field("available", \.available),
        .field("reason", \.reason),
        .field("context_size", \.context_size),
        .field("max_threads", \.max_threads),
        .field("max_queue", \.max_queue),
        .field("threads", \.threads),
        .field("tools", \.tools),
        .field("state_dir", \.state_dir),
        .field("state_error", \.state_error),
        .field("next_cursor", \.next_cursor),
        .field("usage", \.usage),
        .field("context_note", \.context_note),
    ])
    public static let blank = StatusResult(backend: "", model: "", available: false, context_size: 0, max_threads: 0,
                                           max_queue: 0, threads: [], tools: [])
}

/// One turn as `read_thread` returns it; `cut`: its prompt or reply was clipped to fit.
public struct TurnItem: PipeMessage, Codable, Sendable, Equatable {
    public var prompt: String
    public var reply: String
    /// The turn answered a `schema` and `reply` is its JSON value as text, whole (not `cut`).
    public var structured = false
    public var cut = false

    public static let fields = PipeFields<Self>([
        .field("prompt", \.prompt),
        .field("reply", \.reply),
        .field("structured", \.structured),
        .field("cut", \.cut),
    ])
    public static let blank = TurnItem(prompt: "", reply: "")
}

public struct ReadThreadResult: PipeMessage, Codable, Sendable, Equatable {
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

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("thread_id", \.thread_id),
        .field("instructions", \.instructions),
        .field("tools", \.tools),
        .field("turns", \.turns),
        .field("omitted", \.omitted),
        .field("condensed", \.condensed),
        .field("items", \.items),
    ])
    public static let blank = ReadThreadResult(thread_id: "", tools: [], turns: 0, omitted: 0, condensed: 0, items: [])
}

/// Exactly one per request: `ok` with the op's result, or not ok with an error.
public struct Reply<Result: PipeMessage & Codable & Sendable>: PipeMessage, Codable, Sendable {
    public var id: Int
    public var event = "reply"
    public var ok: Bool
    public var result: Result?
    public var error: ErrorBody?

    /// Computed: a generic type holds no static stored property.
    public static var fields: PipeFields<Self> {
        PipeFields([.field("id", \.id), .field("event", \.event), .field("ok", \.ok), .field("result", \.result),
                    .field("error", \.error)])
    }
    public static var blank: Self { Reply(id: 0, ok: false) }

    public static func success(_ id: Int, _ result: Result) -> Reply {
        Reply(id: id, ok: true, result: result, error: nil)
    }
}

/// The failure form of `Reply`, which carries no result.
public typealias ErrorReply = Reply<Empty>
public struct Empty: PipeMessage, Codable, Sendable {
    public static let fields = PipeFields<Self>([])
    public static let blank = Empty()
}

extension Reply where Result == Empty {
    public static func failure(_ id: Int, _ error: WispError) -> Reply {
        Reply(id: id, ok: false, result: nil, error: ErrorBody(code: error.code.rawValue, message: error.message))
    }
}
