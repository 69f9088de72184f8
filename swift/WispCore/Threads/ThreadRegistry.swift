#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// Thread semantics, in one place (docs/threads.md says them to users):
///
/// - `respond` without a thread id creates a thread under a generated id; with an unknown id
///   it creates a thread under that id; with a known id it continues that conversation.
/// - Ids match `[A-Za-z0-9._-]{1,64}`. Generated ids carry 128 random bits.
/// - `instructions` and `tools` bind at creation (where an empty string or list means none);
///   passing either for an existing thread is an `invalid_argument` error, empty or not, that
///   states the thread's binding.
/// - A turn is committed only when its call ends un-stopped (`PipeServer` decides). A thread
///   none of whose calls committed a turn is forgotten when its last call ends; a call that
///   runs on it before then starts it afresh, with its own binding (`created: true`).
/// - `fork_from` creates the call's thread (a generated id, or `thread_id`, which must not be
///   live or stored) as a copy of another thread's binding and committed history, live or
///   stored, busy or idle; the source is not touched. Binding arguments with it are refused.
/// - `rewind` takes back a thread's last turns in the call's own commit (`ConversationThread`).
/// - `close_thread` frees a thread; closing an unknown id is not an error (`closed: false`).
/// - At most `capacity` live threads. Creating one more evicts the least recently used,
///   preferring one with no call in flight (and says which, in `Acceptance.evicted`). Calls already accepted for an
///   evicted or closed
///   thread still finish: they hold the thread itself, not its id.
/// - Calls on one thread run one at a time in arrival order (the gate in `ConversationThread`);
///   calls on different threads run concurrently.
/// - Threads live in memory for the life of the process, and with a `ThreadStore` (`--state-dir`)
///   on disk too (see its header): a call on an id that is not live but stored resumes it, an
///   evicted thread stays stored, `close` deletes the stored file, and `snapshot` lists stored
///   threads after the live ones.
public actor ThreadRegistry {
    public struct Acceptance: Sendable {
        public let thread: ConversationThread
        public let ticket: ConversationThread.Ticket
        /// The thread evicted to make room for this call's new one, if any.
        public let evicted: String?
    }

    /// Client roots one call may pass: each costs a `realpath` and widens every path check.
    public static let maxRoots = 256

    private struct Entry {
        let thread: ConversationThread
        var lastUsed: UInt64
        var inFlight: Int
        /// Some call committed a turn: the thread exists for its caller, binding and all.
        var committed = false
    }

    public nonisolated let capacity: Int
    public nonisolated let maxQueue: Int
    private let backend: any ModelBackend
    private let tools: ToolBinder
    /// Where `respond`'s `files` may come from (with the calling client's roots added).
    public nonisolated let fileRoots: Roots
    private var entries: [String: Entry] = [:]
    private var clock: UInt64 = 0
    /// Where threads are kept: `NoThreadStore` unless `--state-dir` or `--store` is given and usable.
    public nonisolated let store: any ThreadStore
    /// Why `--state-dir` was given but could not be used from the start.
    private nonisolated let startError: String?
    /// Why `--state-dir` was given but is not in use: from the start, or since it failed (for now).
    public nonisolated var storeError: String? {
        startError ?? store.trouble.map { "\(store.location): \($0); \(store.whileFailing)" }
    }
    /// A task storing threads that hold turns the store missed, while one runs.
    private var storing: Task<Void, Never>?

    public init(backend: any ModelBackend, capacity: Int = CoreConfig.defaultMaxThreads,
                maxQueue: Int = CoreConfig.defaultMaxQueue, tools: [ModelTool] = [],
                toolsWithRoots: (@Sendable ([String]) -> [ModelTool])? = nil, fileRoots: Roots = Roots([]),
                store: any ThreadStore = NoThreadStore(), storeError: String? = nil) {
        self.store = store
        self.startError = storeError
        self.fileRoots = fileRoots
        self.backend = backend
        self.capacity = max(1, capacity)
        self.maxQueue = max(0, maxQueue)
        self.tools = ToolBinder(tools, withRoots: toolsWithRoots)
    }

    // MARK: ids

    /// The thread-id rule (the shim checks the same): 1 to `maxIDLength` characters from A-Z a-z 0-9 . _ -
    public static let maxIDLength = 64

    /// The bytes an id is made of: A-Z a-z 0-9 . _ -
    public static let idBytes: [ClosedRange<UInt8>] = [
        UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "a")...UInt8(ascii: "z"),
        UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: ".")...UInt8(ascii: "."),
        UInt8(ascii: "_")...UInt8(ascii: "_"), UInt8(ascii: "-")...UInt8(ascii: "-"),
    ]

    /// The rule as a sentence says it: "1 to 64 characters from A-Z a-z 0-9 . _ -".
    public static let idRule = "1 to \(maxIDLength) characters from " + idBytes.map { r in
        let (a, b) = (String(UnicodeScalar(r.lowerBound)), String(UnicodeScalar(r.upperBound)))
        return r.count == 1 ? a : a + "-" + b
    }.joined(separator: " ")

    public static func isValidID(_ id: String) -> Bool {
        let bytes = id.utf8
        guard (1...maxIDLength).contains(bytes.count) else { return false }
        return bytes.allSatisfy { b in idBytes.contains { $0.contains(b) } }
    }

    /// `field`: the argument that named the id, so the error says which one was wrong.
    public static func validate(_ id: String, as field: String = "thread_id") throws(WispError) {
        guard isValidID(id) else {
            let shown = id.preview
            throw WispError(.invalidArgument,
                    "\(field) \(shown.debugDescription) is not valid: " +
                    "use \(idRule) "
                    + (field == "thread_id" ? "(or omit it to start a new thread)" : "(a thread's id)"))
        }
    }

    private static func hex16(_ n: UInt64) -> String {
        let digits = String(n, radix: 16)
        return String(repeating: "0", count: 16 - digits.count) + digits
    }

    /// 128 random bits as 32 hex characters: well inside the id alphabet.
    public static func generateID() -> String {
        var g = SystemRandomNumberGenerator()
        return hex16(g.next()) + hex16(g.next())
    }

    // MARK: calls

    /// Accepts a `respond` call: finds or creates its thread and takes its place in that
    /// thread's line. The caller must call `finished(_:committed:)` when the call ends.
    /// `instructions` and `tools` are as the caller passed them: nil when absent.
    /// `forkFrom`: the thread to copy (see the rules above); `rewinding`: the call takes back
    /// turns, so the thread must exist.
    public func accept(threadID: String?, instructions: String?, tools toolNames: [String]?,
                       roots: [String]? = nil, forkFrom: String? = nil,
                       rewinding: Bool = false) async throws(WispError) -> Acceptance {
        if let threadID { try Self.validate(threadID) }
        if let roots { try Self.validate(roots: roots) }
        let binds = [instructions != nil ? "instructions" : nil, toolNames != nil ? "tools" : nil].compactMap { $0 }
        if let forkFrom { return try await fork(forkFrom, into: threadID, binds: binds) }
        if rewinding, let threadID, entries[threadID] == nil, try await !isStored(threadID) {
            throw WispError(.invalidArgument,
                    "rewind: no thread '\(threadID)' (\(notFound)); nothing to take back")
        }

        clock += 1
        if let threadID, var entry = entries[threadID] {
            let thread = entry.thread
            if entry.committed && !binds.isEmpty { throw await thread.bindingError(passed: binds) }
            // Until a turn is committed the thread may yet start afresh with this call's binding.
            let start = entry.committed ? nil : try binding(instructions: instructions, tools: toolNames, roots: roots)
            // Counted before the await below, so that a `finished` running meanwhile never takes
            // this thread for idle and empty and forgets it under the call being accepted.
            entry.lastUsed = clock
            entry.inFlight += 1
            entries[threadID] = entry
            do {
                return Acceptance(thread: thread, ticket: try await thread.enqueue(start: start, binds: binds),
                                  evicted: nil)
            } catch {
                // The registry may have changed during that await (a close, say): undo only on the same thread.
                if var now = entries[threadID], now.thread === thread {
                    now.inFlight -= 1
                    entries[threadID] = now
                }
                throw error
            }
        }

        let start = try binding(instructions: instructions, tools: toolNames, roots: roots)
        storeUnstored()
        var id = threadID ?? Self.generateID()
        while threadID == nil && entries[id] != nil { id = Self.generateID() }
        let evicted = entries.count >= capacity ? evictOne() : nil
        // No await between the lookup above and the insert below, so creation is atomic.
        let thread = ConversationThread(id: id, backend: backend, instructions: start.instructions, tools: start.tools,
                                        maxQueue: maxQueue, roots: start.roots, durability: durability)
        entries[id] = Entry(thread: thread, lastUsed: clock, inFlight: 1)
        // A stored thread is loaded when its call's turn comes (under its lock), and only then
        // can binding arguments be told apart from a new thread's.
        let ticket = durability != nil && threadID != nil
            ? ConversationThread.firstTicket(binds: binds) : ConversationThread.firstTicket
        return Acceptance(thread: thread, ticket: ticket, evicted: evicted)
    }

    private func fork(_ source: String, into threadID: String?, binds: [String]) async throws(WispError) -> Acceptance {
        try Self.validate(source, as: "fork_from")
        guard binds.isEmpty else {
            throw WispError(.invalidArgument,
                    "fork_from copies thread '\(source)''s instructions and tools; omit " +
                    "\(binds.joined(separator: " and ")) (a fork's binding is its source's)")
        }
        func taken(_ id: String) -> WispError {
            WispError(.invalidArgument,
                    "thread '\(id)' already exists; a fork creates its thread: " +
                    "name a new thread_id, or omit it for a generated one")
        }
        if let threadID {
            if entries[threadID] != nil { throw taken(threadID) }
            if try await isStored(threadID) { throw taken(threadID) }
        }
        let copy: ConversationThread.Copy
        do {
            copy = try await self.copy(of: source)
        } catch {
            // Whatever went wrong (a store that cannot be read, tools gone), the caller learns which source it was.
            throw error.message.contains("'\(source)'") ? error
                : WispError(error.code, "fork_from '\(source)': \(error.message)")
        }
        // The registry may have changed during those awaits.
        var id = threadID ?? Self.generateID()
        while threadID == nil && entries[id] != nil { id = Self.generateID() }
        if entries[id] != nil { throw taken(id) }
        clock += 1
        let evicted = entries.count >= capacity ? evictOne() : nil
        let thread = ConversationThread(id: id, backend: backend, instructions: nil, tools: [], maxQueue: maxQueue,
                                        durability: durability, copy: copy)
        entries[id] = Entry(thread: thread, lastUsed: clock, inFlight: 1)
        return Acceptance(thread: thread, ticket: ConversationThread.firstTicket, evicted: evicted)
    }

    /// A thread's binding and committed history: live (even with a call running), else stored.
    private func copy(of id: String) async throws(WispError) -> ConversationThread.Copy {
        if let entry = entries[id] {
            let copy = try await entry.thread.copy()
            // A thread whose first call is still running has nothing to copy yet, unless it is stored.
            if !copy.history.isEmpty { return copy }
        }
        if let durability, let thread = try await stored(id) { return try durability.live(thread) }
        throw WispError(.invalidArgument,
                "fork_from: no thread '\(id)' (\(notFound)); " +
                "list_threads shows the threads there are")
    }

    /// The stored thread `id` as committed, if there is one, read without its lease (the store
    /// reads off the pipe loop, beside any writer).
    private func stored(_ id: String) async throws(WispError) -> StoredThread? {
        switch try await store.read(id) {
        case .loaded(let thread, _): return thread
        case .unavailable(let why): throw WispError(.internal, "the store could not be read: \(why)")
        case .none, .unchanged: return nil
        }
    }

    private func isStored(_ id: String) async throws(WispError) -> Bool {
        try await store.contains(id)
    }

    /// What the committed calls cost since this core started, summed; nil before any.
    public private(set) var usage: Usage?

    /// Marks an accepted call as ended, so its thread counts as idle for eviction again.
    /// `committed`: the call's turn joined the history; `cost`: what it cost. A thread none of whose calls committed
    /// is forgotten when its last call ends: the caller never got a thread (or may retry with
    /// the same instructions and tools).
    public func finished(_ acceptance: Acceptance, committed: Bool, usage cost: Usage? = nil) {
        if committed, let cost { usage = usage.map { $0 + cost } ?? cost }
        let id = acceptance.thread.id
        guard var entry = entries[id], entry.thread === acceptance.thread else { return }
        entry.inFlight -= 1
        if committed { entry.committed = true }
        if entry.inFlight == 0 && !entry.committed {
            entries.removeValue(forKey: id)
        } else {
            entries[id] = entry
        }
    }

    /// What a thread created by this call is bound to; empty means none.
    private func binding(instructions: String?, tools toolNames: [String]?,
                         roots: [String]?) throws(WispError) -> ConversationThread.Binding {
        let tools = try self.tools.tools(toolNames ?? [], roots: roots ?? [])
        return ConversationThread.Binding(instructions: instructions.flatMap { $0.isEmpty ? nil : $0 }, tools: tools,
                                          roots: !tools.isEmpty ? roots ?? [] : [])
    }

    private var durability: ConversationThread.Durability? {
        guard store.durable else { return nil }
        return ConversationThread.Durability(store: store, resolve: tools.tools)
    }

    /// Client roots must be local paths a model tool can be confined to, and not too many:
    /// judged here alone, before anything is bound (the shim only turns file:// URIs into paths).
    static func validate(roots: [String]) throws(WispError) {
        guard roots.count <= maxRoots else {
            throw WispError(.invalidArgument,
                    "the client offered more than \(maxRoots) roots; wisp takes at most \(maxRoots) per call. Offer " +
                    "fewer roots (a common parent directory covers its subdirectories), or start wisp with --root.")
        }
        for root in roots { try Roots.check(clientRoot: root) }
    }

    /// Frees a thread, and deletes it from the store. True when it existed (live or stored).
    public func close(_ threadID: String) async throws(WispError) -> Bool {
        try Self.validate(threadID)
        let live = entries.removeValue(forKey: threadID)
        guard store.durable else { return live != nil }
        if let live, await live.thread.close() != .leftToTheCaller { return true }
        // The dispatcher's own job (close is answered in order): it waits behind no call's work.
        let stored = try await offPipeLoop(as: .dispatcher) { () async throws(WispError) -> Bool in
            try await store.delete(threadID)
        }
        return live != nil || stored
    }

    public func contains(_ threadID: String) -> Bool { entries[threadID] != nil }

    public nonisolated var toolNames: [String] { tools.names }

    public var count: Int { entries.count }

    /// A page of threads, live and stored alike: with `query`, those that hold its words, best
    /// match first; else all, most recently used first. `cursor`: where the last page ended.
    /// `limit` nil: every thread (up to `ThreadViews.maxPage`).
    public func list(query: String? = nil, limit: Int? = nil, cursor: String? = nil) async throws(WispError)
        -> (threads: [ThreadInfo], next: String?) {
        let query = try query.map { text throws(WispError) in try ThreadQuery(text) }
        let after = try cursor.map { text throws(WispError) in try ListPlace(cursor: text) }
        let size = min(max(1, limit ?? ThreadViews.maxPage), ThreadViews.maxPage)
        let all = await store.summaries(matching: nil, limit: store.maxStored)
        let storedVersions = Dictionary(all.map { ($0.id, $0.version) }, uniquingKeysWith: { a, _ in a })
        var rows: [(place: ListPlace, info: ThreadInfo)] = []
        // Live threads another process stored since are listed (and searched) as stored.
        var liveIDs = Set<String>()
        for (id, entry) in entries {
            if let version = storedVersions[id] {
                if await entry.thread.isBehind(version) { continue }
            } else if store.durable, await entry.thread.isClosedElsewhere() { continue }
            liveIDs.insert(id)
            if let (info, place) = await entry.thread.listed(query: query, pending: entry.inFlight,
                                                             stored: storedVersions[id] != nil) {
                rows.append((place, info))
            }
        }
        if let query, store.durable {
            // The store finds the threads that hold every word (its index of each turn's words); each
            // found is read to rank it as a live thread is ranked.
            let found = await store.summaries(matching: query, limit: store.maxStored)
            for s in found where !liveIDs.contains(s.id) {
                guard let thread = try? await stored(s.id), let score = query.score(thread.history) else { continue }
                rows.append((ListPlace(score: score, updated: s.updatedAt, id: s.id), info(s)))
            }
        } else if query == nil {
            rows += all.filter { !liveIDs.contains($0.id) }.map {
                (ListPlace(score: 0, updated: $0.updatedAt, id: $0.id), info($0))
            }
        }
        rows.sort { $0.place < $1.place }
        let start = after.map { a in rows.firstIndex { a < $0.place } ?? rows.count } ?? 0
        let page = rows[start...].prefix(size)
        let next = start + page.count < rows.count ? page.last?.place.cursor : nil
        return (page.map(\.info), next)
    }

    private func info(_ s: ThreadSummary) -> ThreadInfo {
        ThreadInfo(thread_id: s.id, turns: s.turns, pending: entries[s.id]?.inFlight ?? 0, live: entries[s.id] != nil,
                   stored: true,
                   usage: UsageBody(totals: s.usage),
                   created_at: s.createdAt, updated_at: s.updatedAt,
                   first_prompt: s.turns > 0
                       ? ThreadViews.clip(s.firstPrompt, bytes: ThreadViews.previewBytes).text : nil,
                   last_reply: s.turns > 0 ? ThreadViews.clip(s.lastReply, bytes: ThreadViews.previewBytes).text : nil,
                   instructions: s.instructions.map { ThreadViews.clip($0, bytes: ThreadViews.instructionsBytes).text })
    }

    /// Every thread, as `list` with no query or limit gives them.
    public func snapshot() async -> [ThreadInfo] {
        (try? await list())?.threads ?? []
    }

    /// Thread `id`'s last turns and binding, live or stored.
    public func read(_ id: String, last: Int?, maxBytes: Int) async throws(WispError) -> ReadThreadResult {
        try Self.validate(id)
        // A live thread whose first call is still running has no turns yet: it may be stored.
        if let entry = entries[id] {
            // Nil: another process closed it; it starts afresh here too.
            guard let result = try await entry.thread.read(last: last, maxBytes: maxBytes) else { throw noThread(id) }
            if result.turns > 0 { return result }
        }
        if let thread = try await stored(id) {
            return ThreadViews.read(id: id, instructions: thread.instructions, tools: thread.tools,
                                    history: thread.history,
                                    condensed: 0, last: last, maxBytes: maxBytes)
        }
        throw noThread(id)
    }

    private func noThread(_ id: String) -> WispError {
        WispError(.invalidArgument,
                "no thread '\(id)' (\(notFound)); list_threads shows the threads there are")
    }

    /// Where a thread that is not found was looked for.
    private var notFound: String { store.durable ? "not live or stored" : "not live" }

    /// Stores, in the background, the threads holding turns the store missed (one task at a time;
    /// the store says at once while it is not to be tried yet).
    private func storeUnstored() {
        guard storing == nil else { return }
        let waiting = entries.values.map(\.thread).filter(\.holdsUnstoredTurns)
        guard !waiting.isEmpty else { return }
        storing = Task {
            for thread in waiting { _ = await thread.storeUnstored() }
            self.storingDone()
        }
    }

    private func storingDone() { storing = nil }

    /// Evicts the least recently used thread, preferring an idle one; returns its id. A thread
    /// holding answered turns the store could not take is never evicted (they would be lost):
    /// with no other, none is, and the registry holds more than `capacity` until they are stored.
    private func evictOne() -> String? {
        let safe = entries.filter { !$0.value.thread.holdsUnstoredTurns }
        let idle = safe.filter { $0.value.inFlight == 0 }
        let pool = idle.isEmpty ? safe : idle
        guard let victim = pool.min(by: { $0.value.lastUsed < $1.value.lastUsed })?.key else { return nil }
        entries.removeValue(forKey: victim)
        return victim
    }
}
