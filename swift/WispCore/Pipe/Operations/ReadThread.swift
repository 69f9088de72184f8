/// `read_thread`: a thread's binding and its last turns, at most `max_bytes` of their text.
public struct ReadThread: AnsweredOperation, Codable {
    public typealias Result = ReadThreadResult
    public static let op = "read_thread"
    public var id: Int
    public var thread_id: String
    /// At most this many of the newest turns; nil: as many as fit.
    public var last: Int?
    public var max_bytes: Int?

    public static let fields = PipeFields<Self>([
        .constant("op", op),
        .field("id", \.id),
        .field("thread_id", \.thread_id),
        .field("last", \.last),
        .field("max_bytes", \.max_bytes),
    ])
    public static let blank = ReadThread(id: 0, thread_id: "")

    /// The bound on the turns' text when the request gives none.
    static let defaultMaxBytes = 64 * 1024

    /// Aside: a stored thread is read from the store.
    public static var runsAside: Bool { true }

    public func run(on server: PipeServer) async throws(WispError) -> ReadThreadResult {
        try await server.registry.read(thread_id, last: last, maxBytes: max_bytes ?? Self.defaultMaxBytes)
    }
}

public struct ReadThreadResult: PipeMessage, Codable, Sendable, Equatable {
    var op = ReadThread.op
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
