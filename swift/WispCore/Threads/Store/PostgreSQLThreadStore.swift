#if os(Linux)
import FoundationEssentials
import WispInfrastructure

/// Durable threads in PostgreSQL (`--store URL`), shared by every wisp on the database: the
/// SQLite store's semantics (`ThreadStore`) across machines.
///
/// - A lease is a session advisory lock (`PostgreSQLLease`) on a connection of the lease's own,
///   held from `lease` to `release`: the server frees it when that connection ends, however the
///   holder ends (a SIGKILLed replica's threads are free once its backend notices, well within 5 s
///   over a socket). A lease waits up to 2 s (`lock_timeout`), then `busy` naming the cause.
/// - A commit is one transaction on the lease's connection with `synchronous_commit = on`, its
///   `statement_timeout` what is left of the call's deadline; one that cannot end by then is
///   rolled back (`WispError.commitPastDeadline`).
/// - `--max-stored-threads` holds fleet-wide and exactly: a thread new to the database is
///   inserted under a transaction-scoped advisory lock (`capKey`), so two replicas adding threads
///   at once count each other's, and the least recently updated threads no one leases are deleted
///   in the same transaction.
/// - Reads (`read`, `contains`, `summaries`) take a pooled connection and a snapshot of their own
///   (REPEATABLE READ, read only): no read waits for a write.
/// - The database unreachable: every call needing it fails naming the database as `location`
///   shows it (never the password); connections are opened again on the next call.
public final class PostgreSQLThreadStore: ThreadStore {
    /// The transaction-scoped advisory lock new threads are inserted under (the cap's count).
    static let capKey = 0x7769_7370_0000_0002  // "wisp", 2
    /// What a commit keeps for its COMMIT before its call's deadline.
    static let commitTime = 0.1
    /// Idle connections kept for the next lease or read.
    static let poolSize = 8

    public var location: String { "database \(url.shown)" }
    public let maxStored: Int
    let url: StoreURL
    private let log: Log
    private let health: StoreHealth
    private let idle = Locked<[Exclusive<PostgreSQLConnection>]>([])
    /// Why this database is refused for good (a newer wisp's), or nil.
    private let refused = Locked<String?>(nil)
    private let prepared = Locked(false)
    /// The server's version (`PQserverVersion`), from the last connection opened, and the schema's
    /// that the database was found at.
    private let serverVersion = Locked<Int?>(nil)
    private let schemaVersion = Locked<Int?>(nil)

    /// Reaches the database and prepares its schema; a database that cannot be reached now is
    /// tried again by the next call (`trouble` says why meanwhile); a newer wisp's is refused by
    /// every call (`store_unavailable`, saying so).
    public init(url: StoreURL, maxStored: Int, log: Log) {
        self.url = url
        self.maxStored = max(1, maxStored)
        self.log = log
        let shown = url.shown
        health = StoreHealth { why in
            log(.error, "database \(shown) failed: \(why); calls that need it fail until it works again")
        }
        do {
            let db = try connect()
            log(.info, "database \(shown) reached: \(about.text)")
            put(db)
            health.worked()
        } catch {
            // A newer wisp's database fails closed as an unreachable one does, for good: served in
            // memory, this replica's threads would be turns the database lacks.
            if let why = refused.withLock({ $0 }) { log(.error, why) } else { health.failed(error.message) }
        }
    }

    public var whileFailing: String { "calls that need it fail (store_unavailable) until it is reachable again" }

    public var trouble: String? { refused.withLock { $0 } ?? health.trouble }

    public var about: StoreAbout {
        guard let server = serverVersion.withLock({ $0 }) else {
            let why = PostgreSQLConnection.unavailable != nil ? "libpq is not installed" : "the server was not reached"
            return StoreAbout(engine: "postgresql", note: why)
        }
        let schema = schemaVersion.withLock { $0 }
        let newer = schema.map { $0 > PostgreSQLSchema.version } == true
            ? "a newer wisp's schema: this wisp reads up to \(PostgreSQLSchema.version)" : nil
        return StoreAbout(engine: "postgresql", version: PostgreSQLConnection.versionText(server), schema: schema,
                          note: newer)
    }

    /// What the calls that need the database fail with while it cannot be used.
    func unavailable(_ why: String) -> WispError {
        WispError(.storeUnavailable, "\(location) cannot be used now (\(why)); the thread is as it was "
                  + "and this call kept nothing: try again once the database is reachable")
    }

    /// A connection with the schema ready (prepared once per store; a newer wisp's is refused).
    private func connect() throws(PostgreSQLError) -> Exclusive<PostgreSQLConnection> {
        let db = try PostgreSQLConnection(url.url)
        serverVersion.withLock { $0 = db.serverVersion }
        if !prepared.withLock({ $0 }) {
            if case .newer(let found) = try PostgreSQLSchema.prepare(db) {
                schemaVersion.withLock { $0 = found }
                let why = PostgreSQLSchema.newerRefusal(url.shown, found)
                refused.withLock { $0 = why }
                throw PostgreSQLError(why)
            }
            schemaVersion.withLock { $0 = PostgreSQLSchema.version }
            prepared.withLock { $0 = true }
        }
        return Exclusive(db)
    }

    /// `body` with a connection (it gives it back or keeps it), tried once more on a new one when
    /// a pooled connection turns out lost: the database went away since it was used, so every idle
    /// one is dropped, and a database back again is used at once.
    private func withTaken<T>(_ body: (Exclusive<PostgreSQLConnection>) throws(PostgreSQLError) -> T)
        throws(PostgreSQLError) -> T {
        if let why = refused.withLock({ $0 }) { throw PostgreSQLError(why) }
        if let db = idle.withLock({ $0.popLast() }) {
            do throws(PostgreSQLError) {
                return try body(db)
            } catch where error.connectionLost {
                idle.withLock { $0 = [] }
            }
        }
        return try body(try connect())
    }

    /// Back to the pool, unless it is down or the pool full.
    private func put(_ db: Exclusive<PostgreSQLConnection>) {
        guard db.withLock({ $0.isUp }) else { return }
        let kept = idle.withLock { pool -> Bool in
            guard pool.count < Self.poolSize else { return false }
            pool.append(db)
            return true
        }
        if !kept { db.withLock { $0.close() } }
    }

    /// `body` on a pooled connection, off the pipe loop; a lost connection is dropped and the
    /// call fails as `unavailable`.
    func withConnection<T: Sendable>(_ body: @escaping @Sendable (PostgreSQLConnection) throws(PostgreSQLError) -> T)
        async throws(WispError) -> T {
        try await offPipeLoop { () throws(WispError) -> T in
            do throws(PostgreSQLError) {
                let value = try self.withTaken { db throws(PostgreSQLError) -> T in
                    defer { self.put(db) }
                    return try db.withLock { (c: inout sending PostgreSQLConnection) throws(PostgreSQLError) -> T in
                        try body(c)
                    }
                }
                if self.health.worked() { self.log(.info, "\(self.location) is usable again") }
                return value
            } catch {
                throw self.failed(error)
            }
        }
    }

    /// A failure as the call's error: the database's loss marks the store failed.
    func failed(_ error: PostgreSQLError) -> WispError {
        if error.connectionLost || refused.withLock({ $0 }) != nil {
            health.failed(error.message)
            return unavailable(error.message.preview)
        }
        return WispError(.internal, "\(location): \(error.message.preview)")
    }

    /// `body` in a read-only snapshot of its own.
    static func snapshot<T>(_ db: PostgreSQLConnection,
                            _ body: () throws(PostgreSQLError) -> T) throws(PostgreSQLError) -> T {
        try db.transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY") { _ throws(PostgreSQLError) in try body() }
    }

    // MARK: the seam

    public func lease(_ id: String) async throws(WispError) -> any ThreadLease {
        try await offPipeLoop { () throws(WispError) -> any ThreadLease in
            let taken: (Exclusive<PostgreSQLConnection>, PostgreSQLLease.Outcome)
            do throws(PostgreSQLError) {
                taken = try self.withTaken { db throws(PostgreSQLError) in
                    do throws(PostgreSQLError) {
                        return (db, try db.withLock { (c: inout sending PostgreSQLConnection) throws(PostgreSQLError) in
                            try PostgreSQLLease.take(id, on: c)
                        })
                    } catch {
                        self.put(db)
                        throw error
                    }
                }
            } catch {
                throw self.failed(error)
            }
            if self.health.worked() { self.log(.info, "\(self.location) is usable again") }
            guard case .busy(let why) = taken.1 else { return Lease(id: id, store: self, db: taken.0) }
            self.put(taken.0)
            throw WispError(.busy, "\(why); try again when that call has finished, or use another thread")
        }
    }

    /// A free lease and the thread under it in one round trip (`PostgreSQLRows.leaseAndRead`); a
    /// lease held elsewhere is waited for as `lease` waits, then the thread loaded.
    public func leaseLoading(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError)
        -> (any ThreadLease, Loaded) {
        guard let literal = PostgreSQLConnection.literal(id) else { return try await leaseThenLoad(id, unlessAt: seen) }
        let sql = PostgreSQLRows.leaseAndRead(PostgreSQLLease.tryTake(literal: literal), literal, unlessAt: seen)
        let taken = try await offPipeLoop { () throws(WispError) -> (Lease, Result<Loaded, PostgreSQLRows.Unreadable>)? in
            let (db, results): (Exclusive<PostgreSQLConnection>, [[[String?]]])
            do throws(PostgreSQLError) {
                (db, results) = try self.withTaken { db throws(PostgreSQLError) in
                    do throws(PostgreSQLError) {
                        return (db, try db.withLock { (c: inout sending PostgreSQLConnection) throws(PostgreSQLError) in
                            try c.batch(sql)
                        })
                    } catch {
                        // The lease may have been taken before a later statement failed: closing frees it.
                        db.withLock { $0.close() }
                        throw error
                    }
                }
            } catch {
                throw self.failed(error)
            }
            if self.health.worked() { self.log(.info, "\(self.location) is usable again") }
            let held = results.first?.first?.first == "t"
            guard held, results.count == 3 else {
                if held { db.withLock { $0.close() } } else { self.put(db) }
                return nil
            }
            let head = results[1]
            return (Lease(id: id, store: self, db: db),
                    PostgreSQLRows.unlessAt(head, seen).map { .success($0) } ?? PostgreSQLRows.loaded(head, results[2]))
        }
        guard let (lease, found) = taken else { return try await leaseThenLoad(id, unlessAt: seen) }
        switch found {
        case .success(let loaded): return (lease, loaded)
        case .failure(let e):
            let error = await lease.setAside(e.why)
            await lease.release()
            throw error
        }
    }

    public func read(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded {
        let found = try await withConnection { db throws(PostgreSQLError) in
            try Self.snapshot(db) { () throws(PostgreSQLError) in try PostgreSQLRows.read(db, id, unlessAt: seen) }
        }
        switch found {
        case .success(let loaded): return loaded
        case .failure(let e):
            throw WispError(.internal, "stored thread '\(id)' could not be read: \(e.why); the next call on it "
                            + "sets it aside and starts the thread afresh")
        }
    }

    public func contains(_ id: String) async throws(WispError) -> Bool {
        try await withConnection { db throws(PostgreSQLError) -> Bool in
            !(try db.query("SELECT 1 FROM threads WHERE id = $1", [id])).isEmpty
        }
    }

    public func summaries(matching query: ThreadQuery?, limit: Int) async -> [ThreadSummary] {
        (try? await withConnection { db throws(PostgreSQLError) in
            try Self.snapshot(db) { () throws(PostgreSQLError) in
                try PostgreSQLRows.summaries(db, query: query, limit: limit)
            }
        }) ?? []
    }

    public func close() {
        for db in idle.withLock({ p in defer { p = [] }; return p }) { db.withLock { $0.close() } }
    }

    // MARK: under a lease

    /// One thread's commit on its lease's connection, in time or rolled back.
    func commit(_ db: PostgreSQLConnection, _ id: String, _ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                usage: Usage, by deadline: Double?) throws(PostgreSQLError) -> Int64 {
        let lastStart = deadline.map { $0 - Self.commitTime }
        if let lastStart, lastStart <= monotonicSeconds() { throw PostgreSQLError("past", sqlState: "57014") }
        // A turn's commit is on every call's path: its transaction's settings and its first read go
        // in one round trip, the write in a second, COMMIT in a third.
        // The deadline came through the pipe: no value of it (NaN, huge) may trap the conversion.
        let limit = lastStart.map { last -> Int in
            let ms = (last - monotonicSeconds()) * 1000
            return ms > 1 ? (ms < 86_400_000 ? Int(ms) : 86_400_000) : 1
        }
        guard let literal = PostgreSQLConnection.literal(id) else { throw PostgreSQLError("a thread id holds NUL") }
        let begin = "BEGIN; SET LOCAL synchronous_commit = on"
            + (limit.map { "; SET LOCAL statement_timeout = \($0)" } ?? "") + "; " + PostgreSQLRows.commitHead(literal)
        return try db.transaction(begin) { opened throws(PostgreSQLError) -> Int64 in
            let head = opened.last?.first ?? []
            let written = try PostgreSQLRows.write(db, id, thread, head: head, kept: kept, after: seen, usage: usage,
                                                   at: Date().timeIntervalSince1970) { () throws(PostgreSQLError) in
                try db.query("SELECT pg_advisory_xact_lock($1)", [String(Self.capKey)])
            }
            if written.new { try enforceCap(db, keeping: id) }
            if let lastStart, monotonicSeconds() >= lastStart { throw PostgreSQLError("past", sqlState: "57014") }
            return written.version
        }
    }

    /// Deletes the least recently updated threads over `maxStored` that no one leases (a
    /// victim's lease is tried, not waited for), inside the caller's transaction and cap lock.
    private func enforceCap(_ db: PostgreSQLConnection, keeping id: String) throws(PostgreSQLError) {
        let count = try PostgreSQLRows.scalar(db.query("SELECT count(*) FROM threads WHERE id NOT LIKE '!%'"))
            .flatMap { Int($0) } ?? 0
        guard count > maxStored else { return }
        var excess = count - maxStored
        let victims = try db.query("SELECT id FROM threads WHERE id NOT LIKE '!%' AND id <> $1 "
                                   + "ORDER BY updated_at LIMIT $2", [id, String(excess + 16)]).compactMap { $0.first ?? nil }
        for victim in victims where excess > 0 {
            let space = String(PostgreSQLLease.leaseSpace)
            guard try db.query("SELECT pg_try_advisory_xact_lock($1, hashtext($2))", [space, victim])
                .first?.first == "t" else { continue }
            try db.query("DELETE FROM threads WHERE id = $1", [victim])
            log(.info, "stored thread '\(victim)' deleted: over --max-stored-threads \(maxStored), least recently used")
            excess -= 1
        }
    }

    /// A stored thread that does not read, renamed aside in the database, kept for a person.
    func setAside(_ db: PostgreSQLConnection, _ id: String, _ why: String) -> WispError {
        let aside = "!corrupt-\(Int(Date().timeIntervalSince1970))-\(UInt32.random(in: 0...UInt32.max)):\(id)"
        let moved = (try? db.query("UPDATE threads SET id = $1 WHERE id = $2", [aside, id])) != nil
        let fate = moved ? "it was moved aside in \(location) as '\(aside)'" : "moving it aside failed"
        log(.error, "stored thread '\(id)' is unreadable: \(why); \(fate)")
        return WispError(.internal, "stored thread '\(id)' could not be read: \(why); \(fate). "
                         + "Call respond again to start thread '\(id)' afresh.")
    }

    fileprivate func giveBack(_ db: Exclusive<PostgreSQLConnection>, _ id: String) {
        let released = (try? db.withLock { (c: inout sending PostgreSQLConnection) throws(PostgreSQLError) -> Bool in
            try PostgreSQLLease.release(id, on: c)
        }) != nil
        // A connection whose lock could not be given back is not reused: closing it frees the lock.
        if released { put(db) } else { db.withLock { $0.close() } }
    }

    private final class Lease: ThreadLease {
        let id: String
        let store: PostgreSQLThreadStore
        let db: Exclusive<PostgreSQLConnection>
        init(id: String, store: PostgreSQLThreadStore, db: Exclusive<PostgreSQLConnection>) {
            self.id = id
            self.store = store
            self.db = db
        }

        /// `body` on this lease's connection, off the pipe loop.
        private func on<T: Sendable>(_ body: @escaping @Sendable (PostgreSQLConnection) throws(PostgreSQLError) -> T)
            async throws(PostgreSQLError) -> T {
            let db = self.db
            return try await offPipeLoop { () throws(PostgreSQLError) -> T in
                try db.withLock { (c: inout sending PostgreSQLConnection) throws(PostgreSQLError) -> T in try body(c) }
            }
        }

        func load(unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded {
            let id = self.id
            let found: Result<Loaded, PostgreSQLRows.Unreadable>
            do {
                found = try await on { db throws(PostgreSQLError) in try PostgreSQLRows.read(db, id, unlessAt: seen) }
            } catch {
                throw store.failed(error)
            }
            switch found {
            case .success(let loaded): return loaded
            case .failure(let e): throw await setAside(e.why)
            }
        }

        func commit(_ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                    usage: Usage, by deadline: Double?) async throws(WispError) -> StoreVersion {
            let (id, store) = (self.id, self.store)
            do {
                return StoreVersion(try await on { db throws(PostgreSQLError) in
                    try store.commit(db, id, thread, kept: kept, after: seen, usage: usage, by: deadline)
                })
            } catch where error.isTimeout && !error.connectionLost {
                throw .commitPastDeadline
            } catch where !error.connectionLost {
                // Whatever stopped it, the turn is not stored, so it is kept nowhere (a replica
                // must not hold turns the database lacks): the code that reverts it.
                throw WispError(.storeUnavailable, "\(store.location) could not store this turn "
                                + "(\(error.message.preview)); the thread is as it was and the turn was not kept")
            } catch {
                throw store.failed(error)
            }
        }

        func delete() async throws(WispError) -> Bool {
            let id = self.id
            do {
                return try await on { db throws(PostgreSQLError) -> Bool in
                    !(try db.query("DELETE FROM threads WHERE id = $1 RETURNING 1", [id])).isEmpty
                }
            } catch {
                throw store.failed(error)
            }
        }

        func setAside(_ why: String) async -> WispError {
            let (id, store) = (self.id, self.store)
            return (try? await on { db throws(PostgreSQLError) -> WispError in store.setAside(db, id, why) })
                ?? store.unavailable("the connection was lost while thread '\(id)' was set aside")
        }

        func release() async {
            let (id, store, db) = (self.id, self.store, self.db)
            await offPipeLoop { store.giveBack(db, id) }
        }
    }
}
#endif
