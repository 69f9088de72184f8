import WispInfrastructure

/// The store the core starts with, as `config` asks: none (threads in memory), the SQLite store of
/// `--state-dir`, or the PostgreSQL store of `--store`.
///
/// An unusable state dir is served in memory, said (`error`: the shim is told, `Ready.durable`
/// false): its threads are this machine's alone, so memory loses nothing another wisp holds. A
/// `--store` that this build cannot serve throws, and the core exits at start: served in memory,
/// a replica's threads would be turns the database lacks, beside other replicas that have it.
/// `postgreSQL`: whether this build has PostgreSQL support (the tests ask as another build).
public func openStore(_ config: CoreConfig, log: Log, postgreSQL: Bool = postgreSQLInThisBuild)
    throws(WispError) -> (store: (any ThreadStore)?, error: String?) {
    if let url = config.store {
        guard postgreSQL else { throw postgreSQLUnsupported(url) }
        return (try openPostgreSQLStore(url, maxStored: config.maxStoredThreads, log: log), nil)
    }
    guard let dir = config.stateDir else { return (nil, nil) }
    do {
        return (try SQLiteThreadStore(directory: dir, maxStored: config.maxStoredThreads, log: log), nil)
    } catch {
        log(.error, error.message)
        return (nil, error.message)
    }
}
