#if os(Linux)
import WispInfrastructure
#endif

/// What `--store` gives while the PostgreSQL store is not built (issue 47): the database tried
/// once, its answer logged under the URL as `StoreURL.shown` has it, and the reason threads are
/// served in memory. libpq's own messages name host, port and user, never the password.
public func postgreSQLStoreNotYet(_ url: StoreURL, log: Log) -> String {
    #if os(Linux)
    let reached: String
    do {
        let connection = try PostgreSQLConnection(url.url)
        defer { connection.close() }
        reached = "reached (server version \(connection.serverVersion))"
    } catch {
        reached = "not reachable: \(error.message.preview)"
    }
    #else
    let reached = "not tried: PostgreSQL is not supported on this system yet"
    #endif
    let why = "--store \(url.shown) is \(reached); wisp does not keep threads in PostgreSQL yet, "
        + "so they are kept in memory only"
    log(.error, why)
    return why
}
