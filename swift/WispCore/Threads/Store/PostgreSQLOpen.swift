import WispInfrastructure

/// Whether this build serves `--store`: Linux, where libpq is loaded at run time.
public let postgreSQLInThisBuild: Bool = {
    #if os(Linux)
    return true
    #else
    return false
    #endif
}()

/// What `--store` is refused with by a build without PostgreSQL support.
public func postgreSQLUnsupported(_ url: StoreURL) -> WispError {
    WispError(.invalidArgument, "--store \(url.shown): PostgreSQL is supported on Linux only for now; "
              + "use --state-dir on this system")
}

/// The PostgreSQL store for `--store`, where this system has it (Linux: libpq loaded at run time).
/// A database that cannot be reached now is not an error here: the store starts and its calls
/// fail closed until it can be (`PostgreSQLThreadStore`).
public func openPostgreSQLStore(_ url: StoreURL, maxStored: Int, log: Log) throws(WispError) -> any ThreadStore {
    #if os(Linux)
    return PostgreSQLThreadStore(url: url, maxStored: maxStored, log: log)
    #else
    throw postgreSQLUnsupported(url)
    #endif
}
