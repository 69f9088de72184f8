/// The pipe protocol, version 2 (ARCHITECTURE.md): one type per message, each with its field
/// table (`fields`, PipeJSON.swift), from which the core both reads and writes it: a new field is
/// its property and one line in the table. The Python side (`python/wisp_shim/protocol.py`)
/// declares the same types under the same names.
///
/// Shim → core: the operations (Operations/, listed in `PipeOperations.all`), each request
/// tagged by `op`; each operation's file holds its request and its result.
/// Core → shim (here): `Ready` (first frame), `Progress`, `Stage` and `Evicted` (events), `Reply`
/// (one per request, ok or not), each tagged by `event`; an ok reply's result is tagged by `op`,
/// the op of the request it answers, so the shim decodes any core message in one pass.

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
    /// The model server that answered the call (host:port), where the backend has several.
    public var endpoint: String?

    public static let fields = PipeFields<Self>([
        .field("input_tokens", \.input_tokens),
        .field("output_tokens", \.output_tokens),
        .field("reasoning_tokens", \.reasoning_tokens),
        .field("cached_tokens", \.cached_tokens),
        .field("first_token_ms", \.first_token_ms),
        .field("output_tokens_per_s", \.output_tokens_per_s),
        .field("endpoint", \.endpoint),
    ])
    public static let blank = UsageBody()
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
