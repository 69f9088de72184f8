/// The pipe protocol, version 2 (ARCHITECTURE.md): one type per message, each with its field
/// table (`fields`, PipeJSON.swift), from which the core both reads and writes it: a new field is
/// its property and one line in the table. The Python side (`python/wisp_shim/protocol.py`)
/// declares the same types under the same names.
///
/// Shim → core (Requests.swift): `Respond`, `CloseThread`, `Cancel`, `Status`, `ReadThread`, `Ping`,
/// each tagged by `op`.
/// Core → shim: `Ready` (first frame), `Progress`, `Stage` and `Evicted` (events), `Reply` (one per
/// request, ok or not), each tagged by `event`; an ok reply's result is tagged by `op`, the op
/// of the request it answers, so the shim decodes any core message in one pass.

/// The pipe protocol version `Ready` announces (the shim's `PROTOCOL_VERSION`).
public let protocolVersion = 2

// MARK: core → shim

/// The first frame, written before any model loads.
public struct Ready: PipeMessage, Codable, Sendable, Equatable {
    public var id = 0
    public var event = "ready"
    public var `protocol` = protocolVersion
    public var backend: String
    public var model: String
    public var pid: Int32
    /// wisp's version (pyproject.toml's, built into wisp-core): the shim refuses a core of another.
    public var version: String
    /// Threads are stored (`--state-dir`): a crash of this core loses none of their committed turns.
    public var durable = false

    public static let fields = PipeFields<Self>([
        .field("id", \.id),
        .field("event", \.event),
        .field("protocol", \.`protocol`),
        .field("backend", \.backend),
        .field("model", \.model),
        .field("pid", \.pid),
        .field("version", \.version),
        .field("durable", \.durable),
    ])
    public static let blank = Ready(backend: "", model: "", pid: 0, version: "")
}

/// A partial reply for request `id`: `text` is a preview, the tail of the answer so far, and
/// `chars` its length in code points (ProgressFrames.swift decides both); `tokens` strictly increasing.
public struct Progress: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var event = "progress"
    public var text: String
    public var tokens: Int
    public var chars = 0

    public static let fields = PipeFields<Self>([
        .field("id", \.id),
        .field("event", \.event),
        .field("text", \.text),
        .field("tokens", \.tokens),
        .field("chars", \.chars),
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
    /// "length" when the model server stopped the reply at its output cap; absent otherwise.
    public var finish_reason: String?

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
        .field("finish_reason", \.finish_reason),
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
