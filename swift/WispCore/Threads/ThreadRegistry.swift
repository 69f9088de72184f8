import Foundation

/// Thread semantics, in one place (DESIGN §4, ADR 0007):
///
/// - `respond` without a thread id creates a thread under a generated id; with an unknown id
///   it creates a thread under that id; with a known id it continues that conversation.
/// - Ids match `[A-Za-z0-9._-]{1,64}`. Generated ids carry 128 random bits.
/// - `instructions` and `tools` bind at creation; passing either for an existing thread is an
///   `invalid_argument` error. (An empty string or empty list counts as not passing them.)
/// - `close_thread` frees a thread; closing an unknown id is not an error (`closed: false`).
/// - At most `capacity` live threads. Creating one more evicts the least recently used,
///   preferring one with no call in flight. Calls already accepted for an evicted or closed
///   thread still finish: they hold the thread itself, not its id.
/// - Calls on one thread run one at a time in arrival order (the gate in `ConversationThread`);
///   calls on different threads run concurrently.
/// - Threads live in memory for the life of the process.
public actor ThreadRegistry {
    public struct Acceptance: Sendable {
        public let thread: ConversationThread
        public let ticket: ConversationThread.Ticket
        public let created: Bool
    }

    private struct Entry {
        let thread: ConversationThread
        var lastUsed: UInt64
        var inFlight: Int
    }

    public nonisolated let capacity: Int
    public nonisolated let maxQueue: Int
    private let backend: any ModelBackend
    private let catalogue: [String: ModelTool]
    /// The catalogue again, confined to the default roots plus the given ones (a client's roots).
    private let catalogueWithRoots: (@Sendable ([String]) -> [ModelTool])?
    /// Where `respond`'s `files` may come from (with the calling client's roots added).
    public nonisolated let fileRoots: Roots
    private var entries: [String: Entry] = [:]
    private var clock: UInt64 = 0

    public init(backend: any ModelBackend, capacity: Int = 32, maxQueue: Int = 16, tools: [ModelTool] = [],
                toolsWithRoots: (@Sendable ([String]) -> [ModelTool])? = nil, fileRoots: Roots = Roots([])) {
        self.catalogueWithRoots = toolsWithRoots
        self.fileRoots = fileRoots
        self.backend = backend
        self.capacity = max(1, capacity)
        self.maxQueue = max(0, maxQueue)
        self.catalogue = Dictionary(tools.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
    }

    // MARK: ids

    public static func isValidID(_ id: String) -> Bool {
        let bytes = id.utf8
        guard (1...64).contains(bytes.count) else { return false }
        return bytes.allSatisfy { b in
            (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2E || b == 0x5F || b == 0x2D
        }
    }

    public static func validate(_ id: String) throws(WispError) {
        guard isValidID(id) else {
            let shown = id.count > 80 ? String(id.prefix(80)) + "…" : id
            throw WispError(.invalidArgument, "thread_id \(shown.debugDescription) is not valid: use 1 to 64 characters from A-Z a-z 0-9 . _ - (or omit it to start a new thread)")
        }
    }

    /// 128 random bits as 32 hex characters: well inside the id alphabet.
    public static func generateID() -> String {
        var g = SystemRandomNumberGenerator()
        return String(format: "%016llx%016llx", g.next() as UInt64, g.next() as UInt64)
    }

    // MARK: calls

    /// Accepts a `respond` call: finds or creates its thread and takes its place in that
    /// thread's line. The caller must call `finished(_:)` when the call ends.
    public func accept(threadID: String?, instructions: String?, tools toolNames: [String]?,
                       roots: [String]? = nil) async throws(WispError) -> Acceptance {
        let instructions = instructions.flatMap { $0.isEmpty ? nil : $0 }
        let toolNames = toolNames.flatMap { $0.isEmpty ? nil : $0 }
        if let threadID { try Self.validate(threadID) }

        clock += 1
        if let threadID, var entry = entries[threadID] {
            if instructions != nil || toolNames != nil {
                let what = [instructions != nil ? "instructions" : nil, toolNames != nil ? "tools" : nil].compactMap { $0 }.joined(separator: " and ")
                throw WispError(.invalidArgument, "thread '\(threadID)' already exists, and \(what) bind only when a thread is created. Omit \(what) to continue it, or close_thread it (or use a new thread_id) to start over with new ones.")
            }
            let thread = entry.thread
            // Counted before the await below, so that a `finished` running meanwhile never takes
            // this thread for idle and empty and forgets it under the call being accepted.
            entry.lastUsed = clock
            entry.inFlight += 1
            entries[threadID] = entry
            do {
                return Acceptance(thread: thread, ticket: try await thread.enqueue(), created: false)
            } catch {
                // The registry may have changed during that await (a close, say): undo only on the same thread.
                if var now = entries[threadID], now.thread === thread {
                    now.inFlight -= 1
                    entries[threadID] = now
                }
                throw error
            }
        }

        var tools = try resolve(toolNames ?? [])
        if !tools.isEmpty, let roots, !roots.isEmpty, let catalogueWithRoots {
            let names = Set(tools.map(\.name))
            tools = catalogueWithRoots(roots).filter { names.contains($0.name) }
        }
        var id = threadID ?? Self.generateID()
        while threadID == nil && entries[id] != nil { id = Self.generateID() }
        if entries.count >= capacity { evictOne() }
        // No await between the lookup above and the insert below, so creation is atomic.
        let thread = ConversationThread(id: id, backend: backend, instructions: instructions, tools: tools, maxQueue: maxQueue)
        entries[id] = Entry(thread: thread, lastUsed: clock, inFlight: 1)
        return Acceptance(thread: thread, ticket: ConversationThread.firstTicket, created: true)
    }

    /// Marks an accepted call as ended, so its thread counts as idle for eviction again.
    /// A thread whose creating call failed, and that holds nothing, is forgotten again: the
    /// caller never got its id (or may retry with the same instructions and tools).
    public func finished(_ acceptance: Acceptance, failed: Bool = false) async {
        let id = acceptance.thread.id
        guard var entry = entries[id], entry.thread === acceptance.thread else { return }
        entry.inFlight -= 1
        entries[id] = entry
        guard failed, acceptance.created, entry.inFlight == 0 else { return }
        let empty = await acceptance.thread.turnCount == 0
        if empty, let now = entries[id], now.thread === acceptance.thread, now.inFlight == 0 {
            entries.removeValue(forKey: id)
        }
    }

    /// Frees a thread. True when it existed.
    public func close(_ threadID: String) throws(WispError) -> Bool {
        try Self.validate(threadID)
        return entries.removeValue(forKey: threadID) != nil
    }

    public func contains(_ threadID: String) -> Bool { entries[threadID] != nil }

    public nonisolated var toolNames: [String] { catalogue.keys.sorted() }

    public var count: Int { entries.count }

    /// Live threads, most recently used first.
    public func snapshot() async -> [ThreadInfo] {
        var infos: [(UInt64, ThreadInfo)] = []
        for (id, entry) in entries {
            infos.append((entry.lastUsed, ThreadInfo(thread_id: id, turns: await entry.thread.turnCount, pending: entry.inFlight)))
        }
        return infos.sorted { $0.0 > $1.0 }.map(\.1)
    }

    private func resolve(_ names: [String]) throws(WispError) -> [ModelTool] {
        var tools: [ModelTool] = []
        for name in names {
            guard let tool = catalogue[name] else {
                let valid = catalogue.keys.sorted()
                let listed = valid.isEmpty ? "this wisp has no model tools" : "valid tools: \(valid.joined(separator: ", "))"
                let shown = name.count > 80 ? String(name.prefix(80)) + "…" : name
                throw WispError(.invalidArgument, "unknown tool \(shown.debugDescription); \(listed)")
            }
            if !tools.contains(where: { $0.name == name }) { tools.append(tool) }
        }
        return tools
    }

    private func evictOne() {
        let idle = entries.filter { $0.value.inFlight == 0 }
        let pool = idle.isEmpty ? entries : idle
        if let victim = pool.min(by: { $0.value.lastUsed < $1.value.lastUsed })?.key {
            entries.removeValue(forKey: victim)
        }
    }
}
