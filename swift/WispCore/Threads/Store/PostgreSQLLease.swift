#if os(Linux)
import WispInfrastructure

/// A thread's lease in the PostgreSQL store: a session advisory lock held on the connection of the
/// wisp serving the thread, so the server frees it when that connection ends, a SIGKILLed
/// replica's included, with no lease row to expire. The wait is the server's (`lock_timeout`),
/// not a polling loop: up to `wait`, then `busy` naming the cause.
///
/// The key is the two-integer form (`leaseSpace`, hashtext(id)), apart from the single-key lock
/// the schema's preparation takes. Two ids with one 32-bit hash share a lease: at worst one waits
/// for the other's turn, never sees its data.
enum PostgreSQLLease {
    static let leaseSpace = 0x7769_7370  // "wisp"
    static let wait: Duration = .seconds(2)

    enum Outcome: Equatable { case held, busy(String) }

    /// The statement that takes the lease on the thread `literal` names (`PostgreSQLConnection.literal`)
    /// if it is free, answering `t`; for a batch that goes on to read the thread under it.
    static func tryTake(literal: String) -> String { "SELECT pg_try_advisory_lock(\(leaseSpace), hashtext(\(literal)))" }

    /// Takes `id`'s lease on `db` (re-entrant on one connection, as PostgreSQL's advisory locks are).
    static func take(_ id: String, on db: PostgreSQLConnection) throws(PostgreSQLError) -> Outcome {
        let key = [String(leaseSpace), id]
        // Most leases are free: one round trip; only a held one waits, with the server's timeout.
        if try db.query("SELECT pg_try_advisory_lock($1, hashtext($2))", key).first?.first == "t" { return .held }
        let ms = wait.components.seconds * 1000
        try db.query("SET lock_timeout = \(ms)")
        defer { _ = try? db.query("SET lock_timeout = 0") }
        do {
            try db.query("SELECT pg_advisory_lock($1, hashtext($2))", key)
            return .held
        } catch where error.sqlState == "55P03" {
            return .busy("thread \(id) is in use by another call, in this wisp or another wisp on this database (waited \(ms) ms for its lease)")
        }
    }

    /// Gives `id`'s lease back; false when this connection did not hold it.
    @discardableResult
    static func release(_ id: String, on db: PostgreSQLConnection) throws(PostgreSQLError) -> Bool {
        try db.query("SELECT pg_advisory_unlock($1, hashtext($2))", [String(leaseSpace), id]).first?.first == "t"
    }
}
#endif
