#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Durable threads (`--state-dir`) in one SQLite database, `threads.db` (schema: `StoreSchema`).
///
/// - WAL journal, `synchronous = FULL`: a turn is one transaction, and in WAL mode FULL syncs the
///   log at every commit, so the turn is on disk (a power cut keeps it) before its reply is sent.
///   NORMAL would sync only at checkpoints: a kill -9 keeps every commit, a power cut may not.
/// - A lease (`ThreadStore`) is this process's `LeaseTable` entry plus a byte-range lock on one
///   byte of `threads.leases` (`StateDirectory`), which the kernel drops when a process dies, so
///   no lease outlives its holder. Writers of different threads wait for each other only inside
///   SQLite's write lock (one transaction, milliseconds; `busyTimeout` at most, and never past
///   the call's deadline: a commit that cannot end by then is rolled back).
/// - Reads (`read`, `summaries`, and a lease's `load`) have a connection of their own and take no
///   lease: in WAL mode a reader sees the last committed state beside a writer in this process or
///   another, so no read waits for a write.
/// - `close`, on every way the process ends, checkpoints the log into `threads.db` and empties
///   it: after a clean stop the database file alone holds every answered turn.
/// - The database is opened once, at start, through the directory `StateDirectory` checked; its
///   files are then reached only through SQLite's open descriptors (WAL kept on close, so that
///   closing removes nothing by path), and every write first checks the directory's path still
///   names it.
/// - A write that fails (a read-only or full disk, I/O errors, the directory replaced) sets the
///   store aside for `StoreHealth.retryInterval`: the thread keeps its turn in memory and its
///   reply says so (`store_error`); reads go on. A damaged database, or one a newer wisp wrote, is
///   moved aside (`threads.db.damaged-…`, `.newer-…`) and threads are served in memory.
/// - Values read are bounded: SQLite's length limit caps a string or row at `maxValueBytes`, a
///   turn's token count out of range is estimated again, counts and totals never overflow.
/// - Every call that touches the disk runs off the pipe loop, through `blocking` alone.
public final class SQLiteThreadStore: ThreadStore {
    public static let fileName = "threads.db"
    /// The most one stored string or row may hold: a turn comes through the pipe's frame limit.
    static let maxValueBytes: Int32 = 64 * 1024 * 1024
    /// How long a writer waits for another process's transaction.
    static let busyTimeoutMs: Int32 = 5000
    /// What a commit keeps for its COMMIT (the log's sync) before its call's deadline: one that
    /// has not begun it by then is rolled back rather than stored after the caller heard `timeout`.
    static let commitTime = 0.1

    public var location: String { directory.path }
    public var about: StoreAbout { StoreSchema.about }
    public let maxStored: Int
    let directory: StateDirectory
    /// Writes (and moving a thread aside); reads have `reader`, so that none queues behind a write.
    private let writer: Exclusive<SQLiteDatabase>
    private let reader: Exclusive<SQLiteDatabase>
    private let fullText: Bool
    private let log: Log
    private let health: StoreHealth
    private let leases = LeaseTable()
    /// Threads closed while the store could not be written: not read, and deleted once it can be.
    private let closedMeanwhile = Locked<Set<String>>([])
    /// Why the database cannot be trusted since it turned out damaged under this running wisp.
    private let broken = Locked<String?>(nil)

    /// Opens (creating if needed) the state dir and its database, and imports earlier wisps'
    /// thread files (once each). Throws, saying why, when neither can be used.
    public init(directory path: String, maxStored: Int, log: Log) throws(WispError) {
        let directory = try StateDirectory(path)
        self.directory = directory
        self.maxStored = max(1, maxStored)
        self.log = log
        let dir = directory.path
        health = StoreHealth { why in
            log(.error, "state dir \(dir) failed: \(why); threads are served in memory until it works again "
                + "(tried every \(StoreHealth.retryInterval))")
        }
        let opened: (SQLiteDatabase, Bool)
        let reading: SQLiteDatabase
        do {
            let end = ContinuousClock.now + .milliseconds(Int(Self.busyTimeoutMs))
            opened = try Self.untilNotBusy(end) { () throws(SQLiteError) in try Self.open(directory) }
            reading = try Self.untilNotBusy(end) { () throws(SQLiteError) in try Self.openReader(directory) }
        } catch {
            if error.message.hasPrefix(Self.newer) {
                throw Self.setAside(directory, tag: "newer", "was written by \(error.message)", log)
            }
            if error.isDamaged { throw Self.setAside(directory, tag: "damaged", "is damaged (\(error.message))", log) }
            throw StateDirectory.unusable(dir, "its database \(Self.fileName) cannot be opened: \(error.message)")
        }
        writer = Exclusive(opened.0)
        reader = Exclusive(reading)
        fullText = opened.1
        ThreadFiles.importAll(from: directory, into: self, log: log)
    }

    private static func open(_ directory: StateDirectory) throws(SQLiteError) -> (SQLiteDatabase, Bool) {
        directory.createPrivate(fileName)
        let db = try SQLiteDatabase(path: directory.path + "/" + fileName, create: true, maxLength: maxValueBytes,
                                    busyTimeoutMs: busyTimeoutMs)
        guard directory.agrees(fileName) else { throw .cannotOpen("the directory changed while it was opened") }
        db.persistWAL()
        try db.execute("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL")
        switch try StoreSchema.prepare(db) {
        case .ready(let fullText): return (db, fullText)
        case .newer(let version):
            throw .unusable("\(newer) (schema \(version); this wisp reads up to \(StoreSchema.version))")
        }
    }

    private static let newer = "a newer wisp"

    /// `body` tried again while busy until `end`: two wisps opening one new database at once meet
    /// where SQLite's busy handler does not wait (the switch to the write-ahead log, its first
    /// reading), so the opening is what waits.
    private static func untilNotBusy<T>(_ end: ContinuousClock.Instant,
                                        _ body: () throws(SQLiteError) -> sending T) throws(SQLiteError) -> sending T {
        while true {
            do {
                return try body()
            } catch where error.isBusy && ContinuousClock.now < end {
                usleep(20_000)
            }
        }
    }

    /// The readers' connection, opened once the schema is ready.
    private static func openReader(_ directory: StateDirectory) throws(SQLiteError) -> SQLiteDatabase {
        let db = try SQLiteDatabase(path: directory.path + "/" + fileName, create: false, maxLength: maxValueBytes,
                                    busyTimeoutMs: busyTimeoutMs)
        guard directory.agrees(fileName) else { throw .cannotOpen("the directory changed while it was opened") }
        db.persistWAL()
        return db
    }

    /// A database that cannot be trusted, moved aside with its WAL files; the error says so.
    private static func setAside(_ directory: StateDirectory, tag: String, _ why: String, _ log: Log) -> WispError {
        let moved = [fileName, fileName + "-wal", fileName + "-shm"].map { directory.moveAside($0, tag: tag) }
        let fate: String = switch moved[0] {
        case .success(let aside): "it was moved aside to \(aside)"
        case .failure(let e): e.message
        }
        log(.error, "state dir \(directory.path): \(fileName) \(why); \(fate)")
        return StateDirectory.unusable(directory.path, "its database \(fileName) \(why); \(fate)")
    }

    public var trouble: String? { broken.withLock { $0 } ?? health.trouble }

    /// The one place this store's blocking work leaves the pipe loop.
    private func blocking<T: Sendable>(_ work: @Sendable () async throws(WispError) -> T) async throws(WispError) -> T {
        try await offPipeLoop(work)
    }

    /// `body` on the writer's connection, or with `reading` the readers'. A damaged database is
    /// set aside for good: threads are served in memory from then on.
    private func withDB<T: Sendable>(reading: Bool = false,
                                     _ body: (SQLiteDatabase) throws(SQLiteError) -> T) throws(WispError) -> T {
        if let why = broken.withLock({ $0 }) { throw WispError(.internal, inMemoryNote(why)) }
        do {
            let connection = reading ? reader : writer
            return try connection.withLock { (db: inout sending SQLiteDatabase) throws(SQLiteError) -> T in
                try body(db)
            }
        } catch {
            if error.isPastDeadline { throw .commitPastDeadline }
            guard error.isDamaged else { throw WispError(.internal, error.message) }
            let first = broken.withLock { b -> Bool in defer { b = b ?? "its database is damaged" }; return b == nil }
            if first { _ = Self.setAside(directory, tag: "damaged", "is damaged (\(error.message))", log) }
            throw WispError(.internal, inMemoryNote("its database is damaged"))
        }
    }

    /// A write, unless the store is set aside; one that fails sets it aside.
    private func write<T: Sendable>(_ body: (SQLiteDatabase) throws(SQLiteError) -> T) throws(WispError) -> T {
        if let why = directory.replaced() {
            health.failed("\(why); nothing is read from or written to what the path names now, restart wisp to use it")
        }
        guard health.mayTry, directory.replaced() == nil else {
            throw WispError(.internal, inMemoryNote(trouble ?? "it failed"))
        }
        do {
            let value = try withDB(body)
            if health.worked() { recovered() }
            return value
        } catch {
            // A call out of time is no fault of the store's.
            if error == .commitPastDeadline { throw error }
            if broken.withLock({ $0 }) == nil { health.failed(error.message) }
            throw WispError(.internal, inMemoryNote(trouble ?? error.message))
        }
    }

    /// Writable again: threads closed meanwhile are deleted now.
    private func recovered() {
        log(.info, "state dir \(location) is usable again: threads are stored again from their next turn")
        for id in closedMeanwhile.withLock({ $0 }) where leases.tryTake(id) {
            defer { leases.release(id) }
            guard directory.lockShare(id) else { continue }
            defer { directory.unlockShare(id) }
            if (try? withDB({ db throws(SQLiteError) -> Bool in try ThreadRows.remove(id, db); return true })) == true {
                _ = closedMeanwhile.withLock { $0.remove(id) }
            }
        }
    }

    // MARK: the seam

    public func lease(_ id: String) async throws(WispError) -> any ThreadLease {
        try await blocking { () async throws(WispError) -> any ThreadLease in
            try await self.leases.take(id, busy: self.busy, alsoTake: { self.directory.lockShare(id) })
            return Lease(id: id, store: self)
        }
    }

    private func busy(_ id: String) -> WispError {
        WispError(.busy, "thread '\(id)' is in use by another call or another wisp process sharing state dir "
                  + "\(location) (its lease was held for \(LeaseTable.wait)); try again when that call has finished, "
                  + "or use another thread")
    }

    public func summaries(matching query: ThreadQuery?, limit: Int) async -> [ThreadSummary] {
        let hidden = closedMeanwhile.withLock { $0 }
        let found = try? await blocking { () throws(WispError) -> [ThreadSummary] in
            try self.withDB(reading: true) { db throws(SQLiteError) in
                try db.reading { () throws(SQLiteError) in
                    try StoreSchema.summaries(db, fullText: self.fullText, query: query, limit: limit)
                }
            }
        }
        return (found ?? []).filter { !hidden.contains($0.id) }
    }

    public func read(_ id: String, unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded {
        try await blocking { () throws(WispError) -> Loaded in
            switch try self.committed(id, unlessAt: seen) {
            case .success(let loaded): return loaded
            case .failure(let e):
                throw WispError(.internal, "stored thread '\(id)' could not be read: \(e.why); the next call on it "
                                + "sets it aside and starts the thread afresh")
            }
        }
    }

    public func contains(_ id: String) async throws(WispError) -> Bool {
        if closedMeanwhile.withLock({ $0.contains(id) }) { return false }
        return try await blocking { () throws(WispError) -> Bool in
            try self.withDB(reading: true) { db throws(SQLiteError) -> Bool in
                var found = false
                try db.query("SELECT 1 FROM threads WHERE id = ?", [.text(id)]) { _ in found = true }
                return found
            }
        }
    }

    public func close() {
        let first = broken.withLock { b -> Bool in defer { b = b ?? "wisp is stopping" }; return b == nil }
        guard first else { return }
        // The reader first: a checkpoint cannot pass a snapshot a reader of this process holds.
        reader.withLock { (db: inout sending SQLiteDatabase) in db.close() }
        let whole = writer.withLock { (db: inout sending SQLiteDatabase) -> Bool in
            defer { db.close() }
            return db.checkpoint(waitMs: Self.closeWaitMs)
        }
        if !whole {
            log(.warning, "state dir \(location): \(Self.fileName)'s log could not be folded in at exit (another "
                + "wisp reads it); the next wisp to stop does it, and no answered turn is lost meanwhile")
        }
    }

    /// How long the exit's checkpoint waits for another process's reader or writer.
    static let closeWaitMs: Int32 = 1000

    // MARK: reading and writing one thread (under its lease)

    fileprivate func load(_ id: String, unlessAt seen: StoreVersion?) throws(WispError) -> Loaded {
        let read: Result<Loaded, ThreadRows.Unreadable>
        do {
            read = try committed(id, unlessAt: seen)
        } catch {
            return .unavailable(error.message)
        }
        switch read {
        case .success(let loaded): return loaded
        case .failure(let e): throw corrupt(id, e.why)
        }
    }

    /// Thread `id` as last committed, on the readers' connection (one snapshot).
    private func committed(_ id: String,
                           unlessAt seen: StoreVersion?) throws(WispError) -> Result<Loaded, ThreadRows.Unreadable> {
        if closedMeanwhile.withLock({ $0.contains(id) }) { return .success(.none) }
        return try withDB(reading: true) { db throws(SQLiteError) in
            try db.reading { () throws(SQLiteError) in try ThreadRows.read(db, id, unlessAt: seen) }
        }
    }

    /// A stored thread that does not read (or cannot be given its tools), moved aside inside the
    /// database under an id no call can name (`!corrupt-<time>-<random>:<id>`), kept for a person
    /// to look at; the error of the call that found it says so, and the id starts afresh.
    func corrupt(_ id: String, _ why: String) -> WispError {
        let aside = "!corrupt-\(Int(Date().timeIntervalSince1970))-\(UInt32.random(in: 0...UInt32.max)):\(id)"
        let moved = (try? withDB { db throws(SQLiteError) -> Bool in
            try db.transaction { () throws(SQLiteError) -> Bool in
                try db.query("UPDATE turns SET thread_id = ? WHERE thread_id = ?", [.text(aside), .text(id)])
                try db.query("UPDATE threads SET id = ? WHERE id = ?", [.text(aside), .text(id)])
                return true
            }
        }) == true
        let fate = moved ? "it was moved aside in \(location)/\(Self.fileName) as '\(aside)'" : "moving it aside failed"
        log(.error, "stored thread '\(id)' is unreadable: \(why); \(fate)")
        return WispError(.internal, "stored thread '\(id)' could not be read: \(why); \(fate). "
                         + "Call respond again to start thread '\(id)' afresh.")
    }

    fileprivate func commit(_ id: String, _ thread: StoredThread, kept: Int, after seen: StoreVersion?, usage: Usage,
                            by deadline: Double?) throws(WispError) -> StoreVersion {
        let written = Date().timeIntervalSince1970
        let version = try write { db throws(SQLiteError) -> Int64 in
            try Self.inTime(db, by: deadline.map { $0 - Self.commitTime }) { () throws(SQLiteError) -> Int64 in
                try self.store(db, id, thread, kept: kept, after: seen, usage: usage, at: written)
            }
        }
        _ = closedMeanwhile.withLock { $0.remove(id) }
        return StoreVersion(version)
    }

    /// `body` in one transaction that is committed only if it can begin its COMMIT by `lastStart`
    /// (`monotonicSeconds()`): the wait for the write lock ends then, and a transaction that is
    /// not done by then is rolled back (`SQLiteError.pastDeadline`).
    private static func inTime<T>(_ db: SQLiteDatabase, by lastStart: Double?,
                                  _ body: () throws(SQLiteError) -> T) throws(SQLiteError) -> T {
        guard let lastStart else { return try db.transaction(body) }
        let left = (lastStart - monotonicSeconds()) * 1000
        guard left > 0 else { throw .pastDeadline }
        db.setBusyTimeout(ms: Int32(min(Double(busyTimeoutMs), left)))
        defer { db.setBusyTimeout(ms: busyTimeoutMs) }
        do {
            return try db.transaction { () throws(SQLiteError) -> T in
                let value = try body()
                if monotonicSeconds() >= lastStart { throw .pastDeadline }
                return value
            }
        } catch where error.isBusy && monotonicSeconds() >= lastStart {
            throw .pastDeadline
        }
    }

    /// One thread's write, inside the caller's transaction; a thread new to the store may put it
    /// over the cap.
    private func store(_ db: SQLiteDatabase, _ id: String, _ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                       usage: Usage, at now: Double) throws(SQLiteError) -> Int64 {
        let written = try ThreadRows.write(db, id, thread, kept: kept, after: seen, usage: usage, at: now)
        if written.new { try enforceCap(db, keeping: id) }
        return written.version
    }

    /// Deletes the least recently updated threads over `maxStored`, skipping any a call holds
    /// (here or in another process).
    private func enforceCap(_ db: SQLiteDatabase, keeping id: String) throws(SQLiteError) {
        var count: Int64 = 0
        try db.query("SELECT count(*) FROM threads WHERE id NOT LIKE '!%'") { r in count = r.int(0) ?? 0 }
        guard count > Int64(maxStored) else { return }
        var victims: [String] = []
        try db.query("SELECT id FROM threads WHERE id NOT LIKE '!%' AND id != ? ORDER BY updated_at LIMIT ?",
                     [.text(id), .int(count - Int64(maxStored) + 16)]) { r in
            if let v = r.text(0) { victims.append(v) }
        }
        var excess = count - Int64(maxStored)
        for victim in victims where excess > 0 && leases.tryTake(victim) {
            defer { leases.release(victim) }
            guard directory.lockShare(victim) else { continue }
            defer { directory.unlockShare(victim) }
            try ThreadRows.delete(victim, db)
            log(.info, "stored thread '\(victim)' deleted: over --max-stored-threads \(maxStored), least recently used")
            excess -= 1
        }
    }

    /// An earlier wisp's thread, stored whole once (its file is then marked imported).
    func importThread(_ id: String, _ thread: StoredThread, written: Double, file: String) throws(WispError) {
        _ = try withDB { db throws(SQLiteError) in
            try db.transaction { () throws(SQLiteError) in
                var done = false
                try db.query("SELECT 1 FROM imported WHERE name = ?", [.text(file)]) { _ in done = true }
                guard !done else { return }
                let none = Usage(inputTokens: 0, outputTokens: 0, reasoningTokens: 0)
                _ = try self.store(db, id, thread, kept: 0, after: nil, usage: none, at: written)
                try db.query("INSERT INTO imported VALUES (?, ?)", [.text(file), .double(Date().timeIntervalSince1970)])
            }
        }
    }

    /// Whether the earlier wisp's file `name` was imported already.
    func wasImported(_ name: String) -> Bool {
        var done = false
        _ = try? withDB { db throws(SQLiteError) in
            try db.query("SELECT 1 FROM imported WHERE name = ?", [.text(name)]) { _ in done = true }
        }
        return done
    }

    fileprivate func deleteStored(_ id: String) throws(WispError) -> Bool {
        var existed = false
        do {
            try write { db throws(SQLiteError) in
                try db.query("SELECT 1 FROM threads WHERE id = ?", [.text(id)]) { _ in existed = true }
                try ThreadRows.remove(id, db)
            }
        } catch {
            // Deleted once the store can be written; not read meanwhile.
            _ = try? withDB { db throws(SQLiteError) in
                try db.query("SELECT 1 FROM threads WHERE id = ?", [.text(id)]) { _ in existed = true }
            }
            if existed { closedMeanwhile.withLock { _ = $0.insert(id) } }
            return existed
        }
        _ = closedMeanwhile.withLock { $0.remove(id) }
        return existed
    }

    private final class Lease: ThreadLease {
        let id: String
        let store: SQLiteThreadStore
        init(id: String, store: SQLiteThreadStore) { self.id = id; self.store = store }

        func load(unlessAt seen: StoreVersion?) async throws(WispError) -> Loaded {
            try await store.blocking { () throws(WispError) -> Loaded in try self.store.load(self.id, unlessAt: seen) }
        }

        func commit(_ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                    usage: Usage, by deadline: Double?) async throws(WispError) -> StoreVersion {
            try await store.blocking { () throws(WispError) -> StoreVersion in
                try self.store.commit(self.id, thread, kept: kept, after: seen, usage: usage, by: deadline)
            }
        }

        func delete() async throws(WispError) -> Bool {
            try await store.blocking { () throws(WispError) -> Bool in try self.store.deleteStored(self.id) }
        }

        func setAside(_ why: String) async -> WispError {
            await offPipeLoop { self.store.corrupt(self.id, why) }
        }

        func release() async {
            store.directory.unlockShare(id)
            store.leases.release(id)
        }
    }
}
