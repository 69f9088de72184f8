import WispInfrastructure

/// Leases within one process: which ids are held, and the wait for one (shared by the stores).
final class LeaseTable: Sendable {
    /// How long a call waits for another holder of its thread's lease before `busy`.
    static let wait = Duration.seconds(2)
    private let held = Locked<Set<String>>([])

    /// Takes `id` once no one here holds it and `alsoTake` (another process's share) succeeds,
    /// polling; after `wait`, `busy(id)`.
    func take(_ id: String, busy: (String) -> WispError,
              alsoTake: () throws(WispError) -> Bool = { true }) async throws(WispError) {
        let deadline = ContinuousClock.now + Self.wait
        while true {
            if held.withLock({ $0.insert(id).inserted }) {
                do throws(WispError) {
                    if try alsoTake() { return }
                } catch {
                    release(id)
                    throw error
                }
                release(id)
            }
            if Task.isCancelled { throw WispError.cancelledWhileWaiting }
            guard ContinuousClock.now < deadline else { throw busy(id) }
            try? await Task.sleep(for: .milliseconds(5))
        }
    }

    func tryTake(_ id: String) -> Bool { held.withLock { $0.insert(id).inserted } }
    func release(_ id: String) { _ = held.withLock { $0.remove(id) } }
}

/// Threads kept in this process's memory behind the store seam: the tests' store, and where
/// their faults are injected (a failing, slow or hung store).
public final class MemoryThreadStore: ThreadStore {
    /// A fault the tests turn on and off.
    public struct Faults: Sendable {
        /// Runs before each lease is taken (a slow or hung store, simulated).
        public var beforeLease: @Sendable (_ id: String) async -> Void = { _ in }
        /// Runs inside each commit, before it is decided (a write that waits on a lock, simulated).
        public var duringCommit: @Sendable (_ id: String) async -> Void = { _ in }
        public init(beforeLease: @escaping @Sendable (_ id: String) async -> Void = { _ in },
                    duringCommit: @escaping @Sendable (_ id: String) async -> Void = { _ in }) {
            self.beforeLease = beforeLease
            self.duringCommit = duringCommit
        }
    }

    private struct Row {
        var thread: StoredThread
        var version: Int64
        var createdAt: Double, updatedAt: Double
        var usage: Usage
    }

    public let location: String
    public let maxStored: Int
    public var about: StoreAbout { .memory }
    private let faults: Faults
    private let rows = Locked<[String: Row]>([:])
    private let leases = LeaseTable()
    private let clock = Locked<Int64>(0)
    /// While set, every write fails with this reason (a read-only or full disk, simulated).
    private let failing = Locked<String?>(nil)
    private let health = StoreHealth { _ in }

    public init(location: String = "memory", maxStored: Int = CoreConfig.defaultMaxStoredThreads,
                faults: Faults = Faults()) {
        self.location = location
        self.maxStored = max(1, maxStored)
        self.faults = faults
    }

    /// Makes writes fail with `why` from now on (nil: they work again).
    public func failWrites(_ why: String?) { failing.withLock { $0 = why } }

    public var trouble: String? { health.trouble }

    /// What is stored under `id` now.
    public func stored(_ id: String) -> StoredThread? { rows.withLock { $0[id]?.thread } }

    public func lease(_ id: String) async throws(WispError) -> any ThreadLease {
        await faults.beforeLease(id)
        try await leases.take(id, busy: { WispError(.busy, "thread '\($0)' is in use by another call") })
        return Lease(id: id, store: self)
    }

    public func read(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded {
        guard let row = rows.withLock({ $0[id] }) else { return .none }
        return seen?.value == row.version ? .unchanged : .loaded(row.thread, StoreVersion(row.version))
    }

    public func contains(_ id: String) async throws(WispError) -> Bool { rows.withLock { $0[id] != nil } }

    public func close() {}

    public func summaries(matching query: ThreadQuery?, limit: Int) async -> [ThreadSummary] {
        rows.withLock { rows in
            rows.filter { _, row in query?.matches(row.thread.history) ?? true }.sorted { $0.value.updatedAt > $1.value.updatedAt }.prefix(max(0, limit)).map { id, row in
                ThreadSummary(id: id, turns: row.thread.history.count, createdAt: row.createdAt,
                              updatedAt: row.updatedAt, firstPrompt: row.thread.history.first?.prompt ?? "",
                              lastReply: row.thread.history.last?.response ?? "", usage: row.usage,
                              instructions: row.thread.instructions, version: StoreVersion(row.version))
            }
        }
    }

    private func write() throws(WispError) {
        if let why = failing.withLock({ $0 }) {
            health.failed(why)
            throw WispError(.internal, inMemoryNote(why))
        }
        health.worked()
    }

    private final class Lease: ThreadLease {
        let id: String
        let store: MemoryThreadStore
        init(id: String, store: MemoryThreadStore) { self.id = id; self.store = store }

        func load(unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded {
            try await store.read(id, unlessAt: seen)
        }

        func commit(_ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                    usage: Usage, by deadline: Double?) async throws(WispError) -> StoreVersion {
            await store.faults.duringCommit(id)
            if let deadline, monotonicSeconds() >= deadline { throw .commitPastDeadline }
            try store.write()
            let version = store.clock.withLock { $0 += 1; return $0 }
            let now = Double(version)
            let over: [String] = store.rows.withLock { rows in
                let old = rows[id]
                rows[id] = Row(thread: thread, version: version, createdAt: old?.createdAt ?? now, updatedAt: now,
                               usage: old.map { $0.usage + usage } ?? usage)
                guard rows.count > store.maxStored else { return [] }
                return rows.filter { $0.key != id }.sorted { $0.value.updatedAt < $1.value.updatedAt }.map(\.key)
            }
            // Least recently updated first; one a call holds is skipped for the next.
            var excess = store.rows.withLock { $0.count } - store.maxStored
            for victim in over where excess > 0 && store.leases.tryTake(victim) {
                // One closed meanwhile frees no room.
                if store.rows.withLock({ $0.removeValue(forKey: victim) }) != nil { excess -= 1 }
                store.leases.release(victim)
            }
            return StoreVersion(version)
        }

        func delete() async throws(WispError) -> Bool {
            try store.write()
            return store.rows.withLock { $0.removeValue(forKey: id) } != nil
        }

        func setAside(_ why: String) async -> WispError {
            _ = store.rows.withLock { $0.removeValue(forKey: id) }
            return WispError(.internal, "stored thread '\(id)' could not be read: \(why); it was set aside")
        }

        func release() async { store.leases.release(id) }
    }
}
