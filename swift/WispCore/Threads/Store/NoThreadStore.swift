import WispInfrastructure

/// The store of a wisp started without `--state-dir` or `--store`: it keeps nothing, so the
/// registry asks one store the same questions whether threads are durable or not ("is it
/// stored?", "what is stored?") instead of branching on a missing one. Threads it serves are
/// memory only (`ThreadRegistry` hands them no `Durability`), so nothing ever leases from it.
public final class NoThreadStore: ThreadStore {
    public init() {}
    public var durable: Bool { false }
    public var location: String { "memory (no --state-dir or --store)" }
    public var trouble: String? { nil }
    public var maxStored: Int { 0 }
    public var about: StoreAbout { .memory }
    public func lease(_ id: String) async throws(WispError) -> any ThreadLease {
        throw WispError(.internal, "thread \(id): this wisp keeps threads in memory only; nothing is stored")
    }
    public func read(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded { .none }
    public func contains(_ id: String) async throws(WispError) -> Bool { false }
    public func summaries(matching query: ThreadQuery?, limit: Int) async -> [ThreadSummary] { [] }
    public func close() {}
}
