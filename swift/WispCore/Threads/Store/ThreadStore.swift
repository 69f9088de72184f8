import WispInfrastructure

/// Durable threads' one seam: what a thread needs from wherever threads are kept. The thread
/// actor sees only this; `SQLiteThreadStore` keeps threads in `--state-dir`,
/// `PostgreSQLThreadStore` in a database several wisps share (`--store`), `MemoryThreadStore`
/// serves the tests (and injects their faults).
///
/// - A live thread holds a **lease** on its id while a call runs on it (`lease`): no other holder,
///   in this process or another sharing the store, gets one meanwhile, so two processes never
///   interleave half turns. Under the lease the thread loads what is stored (the whole thread)
///   when it is not the version it last saw, and commits its turn after that version.
/// - **Versions** are opaque to the thread: it keeps the last one it saw or wrote and hands it back.
/// - A commit says how many leading turns the store holds already (`kept`) so that a store may
///   write only the new ones; a commit with `kept` 0 writes the thread whole (a thread whose
///   turns were dropped by condensing or kept in memory only, or a new thread created with a
///   history: a fork).
/// - `summaries` lists stored threads, most recently updated first, optionally only those whose
///   prompts and replies hold every word of a query (words as `SearchWords` judges them, the
///   judgement live threads are searched by); each with what a listing previews.
public protocol ThreadStore: AnyObject, Sendable {
    /// Whether threads outlive this process here (false for `NoThreadStore` alone).
    var durable: Bool { get }
    /// Where threads are kept, as a person would name it (the state dir).
    var location: String { get }
    /// Why the store cannot be written now (it failed under this running wisp); nil while it can.
    var trouble: String? { get }
    /// What serving is like while `trouble` lasts, for `status` and `--check`.
    var whileFailing: String { get }
    /// The store's engine and its versions, or why they are not known, for `status` and `--check`.
    var about: StoreAbout { get }
    /// At most this many threads are kept; storing one more deletes the least recently updated.
    var maxStored: Int { get }
    /// Takes the lease on thread `id`, waiting a while for another holder (then `busy`).
    func lease(_ id: String) async throws(WispError) -> any ThreadLease
    /// `lease`, then under it `ThreadLease.load(unlessAt: seen)` (a thread that does not read is set
    /// aside and its error thrown, the lease let go): in one trip where the store can make it one.
    func leaseLoading(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError) -> (any ThreadLease, Loaded)
    /// Thread `id` as committed now, unless at version `seen`, read without its lease and beside
    /// any write (a fork's source, a listing's or a reading's thread): a reader never waits for a
    /// writer. A stored thread that does not read is an error saying so (it is set aside by the
    /// next call that leases it).
    func read(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded
    /// Whether a thread is stored under `id` now, read as `read` reads (a thread that does not
    /// read is stored); throws when the store cannot be read.
    func contains(_ id: String) async throws(WispError) -> Bool
    /// Stored threads, most recently updated first; with `matching`, exactly those whose prompts or
    /// replies hold each of its words (`ThreadQuery.matches` says which). At most `limit`.
    func summaries(matching query: ThreadQuery?, limit: Int) async -> [ThreadSummary]
    /// The process ends: everything committed goes into the store's durable form (for SQLite, the
    /// database file alone), and the store lets its resources go. Waits a bounded time; nothing
    /// is stored after it.
    func close()
}

extension ThreadStore {
    public var durable: Bool { true }
    public var whileFailing: String { "threads are served in memory until it works again" }

    /// Thread `id` as committed now.
    public func read(_ id: String) async throws(WispError) -> Loaded { try await read(id, unlessAt: nil) }

    public func leaseLoading(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError)
        -> (any ThreadLease, Loaded) {
        try await leaseThenLoad(id, unlessAt: seen)
    }

    /// `leaseLoading` as two steps, for any store.
    public func leaseThenLoad(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError)
        -> (any ThreadLease, Loaded) {
        let lease = try await self.lease(id)
        do throws(WispError) {
            return (lease, try await lease.load(unlessAt: seen))
        } catch {
            await lease.release()
            throw error
        }
    }

    /// Deletes a stored thread, under a lease of its own; true when one was stored.
    public func delete(_ id: String) async throws(WispError) -> Bool {
        let lease = try await self.lease(id)
        let deleted = try? await lease.delete()
        await lease.release()
        return deleted ?? false
    }

    /// What a call served in memory because of `trouble` says in its reply.
    public func inMemoryNote(_ trouble: String) -> String {
        "state dir \(location) is not usable now (\(trouble)); this turn is kept in memory only, "
            + "and wisp tries the store again every \(StoreHealth.retryInterval.components.seconds) s"
    }
}

/// A thread's lease, held by the call running on it. Every method may block on the store: the
/// store runs that work off the pipe loop itself.
public protocol ThreadLease: AnyObject, Sendable {
    var id: String { get }
    /// The stored thread unless its version is `seen`. Throws only for a stored thread that does
    /// not read (the call's error); a store that cannot be read now is `.unavailable`.
    func load(unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded
    /// Stores `thread`, whose first `kept` turns are those stored at version `seen` (when the
    /// store is not at `seen`, it writes the thread whole); `usage` is what this turn cost, added
    /// to the thread's totals. Returns the new version. A store that cannot take it throws an
    /// error whose message says so for the reply (`store_error`): the turn is kept in memory.
    /// `deadline` (`monotonicSeconds()`): the call's time limit, which covers the commit: one that
    /// cannot be done by then (another process holds the store's write lock, say) is rolled back
    /// and throws `WispError.commitPastDeadline`; nothing of it is stored.
    func commit(_ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                usage: Usage, by deadline: Double?) async throws(WispError) -> StoreVersion
    /// Deletes the stored thread; true when one was stored.
    @discardableResult
    func delete() async throws(WispError) -> Bool
    /// Moves the stored thread aside, kept for a person to look at: it does not read, or cannot be
    /// served (`why`). The id starts afresh. Returns the error for the call that found it.
    func setAside(_ why: String) async -> WispError
    /// Lets the lease go. Called once, by its holder.
    func release() async
}

extension WispError {
    /// A turn whose commit could not end within its call's time limit: not kept anywhere.
    public static let commitPastDeadline = WispError(
        .timeout, "the call's time limit ran out while its turn was being stored; the turn was not kept")
}

extension ThreadLease {
    /// A commit with no time limit (an import, a thread stored again once the store works).
    public func commit(_ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                       usage: Usage) async throws(WispError) -> StoreVersion {
        try await commit(thread, kept: kept, after: seen, usage: usage, by: nil)
    }
}

/// What a store says of itself (`status`'s `store_about`, `--check`'s store line), the same
/// question for every store: its engine, that engine's version (the server's, or the library's)
/// and the version of wisp's schema the data is at; where those are not known, why.
public struct StoreAbout: Sendable, Equatable {
    public let engine: String
    public let version: String?
    public let schema: Int?
    /// A word on the schema (a newer wisp's), or why the versions are not known.
    public let note: String?

    public init(engine: String, version: String? = nil, schema: Int? = nil, note: String? = nil) {
        self.engine = engine
        self.version = version
        self.schema = schema
        self.note = note
    }

    /// Threads in this process's memory: no store (no `--state-dir` or `--store`, or one that could
    /// not be used from the start), or the tests' `MemoryThreadStore`.
    public static let memory = StoreAbout(engine: "memory", note: "threads end with this process")

    /// As `status` and `--check` show it: "postgresql 15.4, wisp schema 1".
    public var text: String {
        let versions = [version.map { "\(engine) \($0)" } ?? engine] + (schema.map { ["wisp schema \($0)"] } ?? [])
        return versions.joined(separator: ", ") + (note.map { " (\($0))" } ?? "")
    }
}

/// A stored thread: its binding and its whole history.
public struct StoredThread: Sendable, Equatable {
    public var instructions: String?
    public var tools: [String]
    /// The client roots its tools were confined to.
    public var roots: [String]
    public var history: [Turn]
    public init(instructions: String?, tools: [String], roots: [String], history: [Turn]) {
        self.instructions = instructions
        self.tools = tools
        self.roots = roots
        self.history = history
    }
}

/// Which write of a stored thread this is. Only the store that made it reads it.
public struct StoreVersion: Sendable, Hashable {
    let value: Int64
    init(_ value: Int64) { self.value = value }
}

/// What `load` found.
public enum Loaded: Sendable, Equatable {
    /// The stored thread is at the version the holder saw.
    case unchanged
    /// Nothing is stored under the id (closed, deleted over the cap, or never stored).
    case none
    case loaded(StoredThread, StoreVersion)
    /// The store cannot be read now (why): the call goes on from the thread's memory.
    case unavailable(String)
}

/// A stored thread as a listing shows it.
public struct ThreadSummary: Sendable, Equatable {
    public let id: String
    public let turns: Int
    /// Unix seconds.
    public let createdAt: Double
    public let updatedAt: Double
    /// The first prompt and the last reply, cut to `ThreadSummary.previewLength` bytes.
    public let firstPrompt: String
    public let lastReply: String
    /// What the thread's stored turns cost, added up (nil where some turn's backend did not say).
    public let usage: Usage
    /// Its instructions, whole (a listing shortens them).
    public let instructions: String?
    /// The version stored (a live thread behind it is listed from the store).
    public let version: StoreVersion?
    /// How much of a prompt or reply a summary carries, in bytes of UTF-8.
    public static let previewLength = 200

    public init(id: String, turns: Int, createdAt: Double, updatedAt: Double, firstPrompt: String, lastReply: String,
                usage: Usage, instructions: String? = nil, version: StoreVersion? = nil) {
        self.instructions = instructions
        self.version = version
        self.id = id
        self.turns = turns
        self.createdAt = createdAt
        self.updatedAt = updatedAt
        self.firstPrompt = Self.preview(firstPrompt)
        self.lastReply = Self.preview(lastReply)
        self.usage = usage
    }

    static func preview(_ text: String) -> String {
        text.bounded(toBytes: previewLength)
    }
}

extension Turn {
    /// Most tokens one turn may say it occupies: a turn comes through the pipe, whose frame limit
    /// keeps it far below this, so a stored count above it is not a count (and summing it could trap).
    static let maxTokens = 1 << 40

    /// A stored turn with its token count checked: one out of range is estimated again.
    static func stored(prompt: String, toolExchanges: [ToolExchange], response: String, reasoning: String?,
                       tokens: Int64, structured: Bool = false) -> Turn {
        let counted = (0...Int64(maxTokens)).contains(tokens) ? Int(tokens) : nil
        return Turn(prompt: prompt, toolExchanges: toolExchanges, response: response, reasoning: reasoning,
                    tokens: counted, structured: structured)
    }
}

/// A store's state when it fails under a running wisp: why, and when to try it again. Shared by
/// the stores so that every one says and retries the same way.
public final class StoreHealth: Sendable {
    /// How long a failed store is left alone before it is tried again.
    public static let retryInterval = Duration.seconds(5)
    private let state = Locked<(trouble: String, retryAt: ContinuousClock.Instant)?>(nil)
    private let onFailure: @Sendable (String) -> Void

    /// `onFailure`: said once when the store first fails (a log line).
    public init(onFailure: @escaping @Sendable (String) -> Void) { self.onFailure = onFailure }

    public var trouble: String? { state.withLock { $0?.trouble } }

    /// True while the store is not known to fail, and when a retry is due.
    public var mayTry: Bool { state.withLock { $0.map { ContinuousClock.now >= $0.retryAt } ?? true } }

    /// The store failed: tried again after `retryInterval`.
    public func failed(_ why: String) {
        let first = state.withLock { h -> Bool in
            defer { h = (why, ContinuousClock.now + Self.retryInterval) }
            return h == nil
        }
        if first { onFailure(why) }
    }

    /// The store worked: true when it had failed before.
    @discardableResult
    public func worked() -> Bool { state.withLock { h in defer { h = nil }; return h != nil } }
}
