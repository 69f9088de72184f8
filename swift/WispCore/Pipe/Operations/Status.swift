/// `status`: the backend's state and a page of threads: with `query`, those whose prompts and replies hold
/// its words, best match first; else most recently used first. `cursor` is a `next_cursor`.
public struct Status: AnsweredOperation, Codable {
    public typealias Result = StatusResult
    public static let op = "status"
    public var id: Int
    public var query: String?
    public var limit: Int?
    public var cursor: String?

    public static let fields = PipeFields<Self>([
        .constant("op", op),
        .field("id", \.id),
        .field("query", \.query),
        .field("limit", \.limit),
        .field("cursor", \.cursor),
    ])
    public static let blank = Status(id: 0)

    /// Aside: asking a backend about itself can take seconds (an endpoint that does not
    /// answer), and the dispatcher must keep taking calls and cancels meanwhile.
    public static var runsAside: Bool { true }

    public func run(on server: PipeServer) async throws(WispError) -> StatusResult {
        let registry = server.registry, backend = server.backend
        let page = try await registry.list(query: query, limit: limit, cursor: cursor)
        let availability = await backend.availability()
        return StatusResult(
            backend: backend.name, model: backend.model, available: availability.available,
            reason: availability.reason, context_size: await backend.contextSize(),
            max_threads: registry.capacity, max_queue: registry.maxQueue, threads: page.threads,
            tools: registry.toolNames, store_location: registry.store.durable ? registry.store.location : nil,
            store_about: registry.store.about.text, store_error: registry.storeError,
            next_cursor: page.next, usage: await registry.usage.map { UsageBody(totals: $0) },
            context_note: await backend.contextNote(), endpoints: await backend.endpoints())
    }
}

public struct StatusResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Status.op
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
    /// Where threads are stored (the store's location: a state dir), when durable.
    public var store_location: String?
    /// The store's engine and versions, or why they are not known (`StoreAbout`); `memory` without one.
    public var store_about: String?
    /// Why the store that was asked for is not in use.
    public var store_error: String?
    /// For the next page of `threads`, when there is one.
    public var next_cursor: String?
    /// What this core's committed calls cost since it started, summed.
    public var usage: UsageBody?
    /// Set when the server was found to read less of a prompt than wisp sent (it cut it
    /// silently): the window wisp learnt, and from what.
    public var context_note: String?
    /// Each model server, where the backend has several.
    public var endpoints: [EndpointInfo]?

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
        .field("store_location", \.store_location),
        .field("store_about", \.store_about),
        .field("store_error", \.store_error),
        .field("next_cursor", \.next_cursor),
        .field("usage", \.usage),
        .field("context_note", \.context_note),
        .field("endpoints", \.endpoints),
    ])
    public static let blank = StatusResult(backend: "", model: "", available: false, context_size: 0, max_threads: 0,
                                           max_queue: 0, threads: [], tools: [])
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

/// One model server of several, as `--check` lists it (host:port only: never credentials).
public struct EndpointInfo: PipeMessage, Codable, Sendable, Equatable {
    public var endpoint: String
    public var up: Bool
    /// Why it is down or left out.
    public var reason: String?
    public var model: String?
    public var context_size: Int?
    public var slots: Int?
    /// Live threads pinned to it.
    public var pinned: Int

    public static let fields = PipeFields<Self>([
        .field("endpoint", \.endpoint),
        .field("up", \.up),
        .field("reason", \.reason),
        .field("model", \.model),
        .field("context_size", \.context_size),
        .field("slots", \.slots),
        .field("pinned", \.pinned),
    ])
    public static let blank = EndpointInfo(endpoint: "", up: false, pinned: 0)
}
