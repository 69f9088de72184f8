import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

func freshStateDir() -> String {
    NSTemporaryDirectory() + "wisp-store-\(UInt64.random(in: 0...UInt64.max))/state"
}

private func store(_ dir: String, max: Int = 1000) throws -> SQLiteThreadStore {
    try SQLiteThreadStore(directory: dir, maxStored: max, log: Log(level: .error))
}

private func thread(_ turns: Int, from: Int = 1) -> StoredThread {
    StoredThread(instructions: "be brief", tools: ["read_file"], roots: ["/r"],
                 history: (from..<from + turns).map {
                     Turn(prompt: "p\($0)", toolExchanges: $0 % 2 == 0 ? [ToolExchange(name: "read_file", arguments: "{}", output: "o", failed: true)] : [],
                          response: "r\($0)", reasoning: $0 == 1 ? "thought first" : nil)
                 })
}

/// Leases `id`, runs `body` under it, and lets it go.
private func leased<T>(_ s: any ThreadStore, _ id: String, _ body: (any ThreadLease) async throws -> T) async throws -> T {
    let lease = try await s.lease(id)
    do {
        let value = try await body(lease)
        await lease.release()
        return value
    } catch {
        await lease.release()
        throw error
    }
}

@Suite struct SQLiteStore {
    @Test func roundTripsAThreadInPrivateFilesAndSaysWhenItIsUnchanged() async throws {
        let dir = freshStateDir()
        let s = try store(dir)
        let t = thread(3)
        let v = try await leased(s, "..") { try await $0.commit(t, kept: 0, after: nil, usage: Usage(inputTokens: 5, outputTokens: 7)) }
        #expect(try await leased(s, "..") { try await $0.load(unlessAt: nil) } == .loaded(t, v))
        #expect(try await leased(s, "..") { try await $0.load(unlessAt: v) } == .unchanged)
        #expect(try await leased(s, "none") { try await $0.load(unlessAt: nil) } == .none)
        var st = stat()
        #expect(lstat(dir, &st) == 0 && st.st_mode & 0o777 == 0o700)
        #expect(lstat(dir + "/threads.db", &st) == 0 && st.st_mode & 0o777 == 0o600)
        // A second store on the directory (another process) sees the same thread and version.
        #expect(try await leased(try store(dir), "..") { try await $0.load(unlessAt: v) } == .unchanged)
    }

    @Test func aCommitAfterTheVersionSeenWritesTheNewTurnsAndAnyOtherWritesTheThreadWhole() async throws {
        let s = try store(freshStateDir())
        try await leased(s, "t") { lease in
            var t = thread(1)
            var v = try await lease.commit(t, kept: 0, after: nil, usage: Usage())
            let first = v
            for i in 2...5 {
                t.history.append(thread(1, from: i).history[0])
                v = try await lease.commit(t, kept: i - 1, after: v, usage: Usage())
                #expect(try await lease.load(unlessAt: nil) == .loaded(t, v))
            }
            // Not the version it saw (another writer came between): written whole, nothing doubled.
            t.history.append(thread(1, from: 6).history[0])
            v = try await lease.commit(t, kept: 5, after: first, usage: Usage())
            #expect(try await lease.load(unlessAt: nil) == .loaded(t, v))
            // Condensed: fewer turns, written whole.
            t.history.removeFirst(3)
            v = try await lease.commit(t, kept: 0, after: v, usage: Usage())
            #expect(try await lease.load(unlessAt: nil) == .loaded(t, v))
        }
        #expect(await s.summaries(matching: nil, limit: 10).map(\.turns) == [3])
    }

    /// (Between processes the lease is a lock the kernel keeps per process: tests/python's two
    /// servers on one state dir exercise it.)
    @Test func aHeldLeaseMakesOthersWaitThenBusy() async throws {
        let s = try store(freshStateDir())
        let held = try await s.lease("t")
        let start = ContinuousClock.now
        let error = await #expect(throws: WispError.self) { _ = try await s.lease("t") }
        #expect(error?.code == .busy)
        #expect(ContinuousClock.now - start >= .seconds(2))
        await (try await s.lease("u")).release()  // other threads are not held up
        await held.release()
        await (try await s.lease("t")).release()
    }

    @Test func theCapDeletesTheLeastRecentlyUpdatedAndListingsPreviewAndSearch() async throws {
        let s = try store(freshStateDir(), max: 2)
        for (id, words) in [("a", "alpha common"), ("b", "beta common"), ("a", "again"), ("c", "gamma common")] {
            try await leased(s, id) { lease in
                var t = StoredThread(instructions: nil, tools: [], roots: [], history: [])
                if case .loaded(let old, _) = try await lease.load(unlessAt: nil) { t = old }
                t.history.append(Turn(prompt: words, response: "reply to " + words, tokens: 3))
                _ = try await lease.commit(t, kept: 0, after: nil, usage: Usage(inputTokens: 1, outputTokens: 2))
            }
        }
        let all = await s.summaries(matching: nil, limit: 10)
        #expect(all.map(\.id) == ["c", "a"])
        #expect(all[1].firstPrompt == "alpha common" && all[1].lastReply == "reply to again" && all[1].usage.outputTokens == 4)
        #expect(await s.summaries(matching: try ThreadQuery("common"), limit: 10).map(\.id) == ["c", "a"])
        #expect(await s.summaries(matching: try ThreadQuery("alpha REPLY"), limit: 10).map(\.id) == ["a"])
        #expect(await s.summaries(matching: try ThreadQuery("beta"), limit: 10).isEmpty)
        #expect(await s.summaries(matching: try ThreadQuery("\"unbalanced ( NEAR"), limit: 10).isEmpty)
    }

    @Test func storedNumbersOutOfRangeAreBoundedWhenRead() async throws {
        let dir = freshStateDir()
        let s = try store(dir)
        let t = thread(2)
        _ = try await leased(s, "t") { try await $0.commit(t, kept: 0, after: nil, usage: Usage(inputTokens: 1, outputTokens: 1)) }
        let db = try SQLiteDatabase(path: dir + "/threads.db", create: false, maxLength: 1 << 20, busyTimeoutMs: 1000)
        try db.execute("UPDATE turns SET tokens = \(Int64.max) WHERE seq = 0; UPDATE threads SET output_tokens = \(Int64.max)")
        guard case .loaded(let read, _) = try await leased(s, "t", { try await $0.load(unlessAt: nil) }) else { Issue.record("not loaded"); return }
        #expect(read.history[0].tokens == Turn.estimateTokens(prompt: "p1", toolExchanges: [], response: "r1", reasoning: "thought first"))
        #expect(read.history.reduce(0) { $0 + $1.tokens } > 0)
        _ = try await leased(s, "t") { try await $0.commit(read, kept: 2, after: nil, usage: Usage(inputTokens: 1, outputTokens: 1)) }
        #expect(await s.summaries(matching: nil, limit: 1).first?.usage.outputTokens == Int.max)  // saturated, as Usage sums
    }

    /// Schema 2 indexed prompts and replies with FTS5's own words; schema 3 fills each turn's
    /// words as the live search judges them, and the index is made again over them.
    @Test func aSchema2DatabaseIsSearchedAsLiveThreadsAreOnceMigrated() async throws {
        let dir = freshStateDir()
        let s = try store(dir)
        for (i, c) in trickySearches.enumerated() {
            _ = try await leased(s, "c\(i)") { lease in
                try await lease.commit(StoredThread(instructions: nil, tools: [], roots: [], history: [
                    Turn(prompt: c.text, response: "ok", tokens: 1),
                ]), kept: 0, after: nil, usage: Usage())
            }
        }
        s.close()
        let db = try SQLiteDatabase(path: dir + "/threads.db", create: false, maxLength: 1 << 20, busyTimeoutMs: 1000)
        try db.execute("""
            DROP TRIGGER turns_text_insert; DROP TRIGGER turns_text_delete; DROP TABLE turns_text;
            ALTER TABLE turns DROP COLUMN words;
            CREATE VIRTUAL TABLE turns_text USING fts5(prompt, response, content='turns', content_rowid='rowid');
            INSERT INTO turns_text(turns_text) VALUES ('rebuild');
            PRAGMA user_version = 2
            """)
        db.close()
        let migrated = try store(dir)
        for (i, c) in trickySearches.enumerated() {
            guard let query = try? ThreadQuery(c.query) else { continue }
            let found = await migrated.summaries(matching: query, limit: 1000).map(\.id)
            #expect(found.contains("c\(i)") == c.matches, "query \(c.query.debugDescription)")
        }
        // New turns are indexed by the new triggers.
        _ = try await leased(migrated, "c0") { lease in
            try await lease.commit(StoredThread(instructions: nil, tools: [], roots: [], history: [
                Turn(prompt: "Zürich", response: "ok", tokens: 1),
            ]), kept: 0, after: nil, usage: Usage())
        }
        #expect(await migrated.summaries(matching: try ThreadQuery("ZÜRICH"), limit: 10).map(\.id) == ["c0"])
    }

    @Test func aNewerWispsDatabaseIsMovedAsideAndNotUsed() throws {
        let dir = freshStateDir()
        _ = try store(dir)
        let db = try SQLiteDatabase(path: dir + "/threads.db", create: false, maxLength: 1 << 20, busyTimeoutMs: 1000)
        try db.execute("PRAGMA user_version = 99")
        let error = #expect(throws: WispError.self) { try store(dir) }
        #expect(error?.message.contains("newer wisp") == true && error?.message.contains("moved aside") == true)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).contains { $0.hasPrefix("threads.db.newer-") })
    }

    @Test func refusesAGroupWritableDirectory() throws {
        let dir = freshStateDir()
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        chmod(dir, 0o770)
        #expect(throws: WispError.self) { try store(dir) }
    }

    @Test func aFIFOInPlaceOfAnEarlierThreadFileIsSetAsideAtImportWithoutBlocking() throws {
        let dir = freshStateDir()
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o700])
        #expect(mkfifo(dir + "/thread-f.json", 0o600) == 0)
        _ = try store(dir)
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).contains { $0.hasPrefix("thread-f.json.corrupt-") })
    }
}

@Suite struct DurableRegistry {
    @Test func aSecondRegistryOnTheDirectoryResumesAndCloseDeletes() async throws {
        let dir = freshStateDir()
        let one = ThreadRegistry(backend: EchoBackend(), store: try store(dir))
        try await call(one, "t", "first", instructions: "be brief")
        try await call(one, "t", "second")
        let two = ThreadRegistry(backend: EchoBackend(), store: try store(dir))
        let listed = await two.snapshot()
        #expect(listed.map { [$0.thread_id, "\($0.turns)", "\($0.live)", "\($0.stored)"] } == [["t", "2", "false", "true"]])
        #expect(listed.first?.first_prompt == "first" && listed.first?.instructions == "be brief")
        let third = try await call(two, "t", "third")
        #expect(third.outcome.text == "echo 3: third" && !third.created)
        await #expect(throws: WispError.self) { try await call(two, "t", "x", instructions: "other") }
        // The first registry's live copy is behind: it reloads before answering.
        #expect(try await call(one, "t", "fourth").outcome.text == "echo 4: fourth")
        #expect(try await two.close("t"))
        #expect(await try store(dir).summaries(matching: nil, limit: 10).isEmpty)
        // Closed elsewhere: the other registry's live copy starts afresh.
        #expect(try await call(one, "t", "again").created)
    }

    @Test func aThreadClosedWhileItsCallRunsIsNotStoredAgainByThatCall() async throws {
        let memory = MemoryThreadStore()
        let gate = Gate()
        let registry = ThreadRegistry(backend: GateBackend(gate: gate), store: memory)
        try await call(registry, "t", "first")
        #expect(memory.stored("t") != nil)
        let running = try await startCall(registry, "t", "gate: second")
        await gate.waitUntilEntered()
        #expect(try await registry.close("t"))
        gate.open()
        _ = try await running.value
        #expect(memory.stored("t") == nil, "the call that finished after close_thread must not store the thread again")
    }

    /// A failing store loses nothing answered: a thread holding turns the store could not take
    /// is not evicted (the registry keeps it past capacity), and once the store works they are stored.
    @Test func aThreadHoldingUnstoredTurnsIsNeverEvictedAndIsStoredWhenTheStoreWorks() async throws {
        let memory = MemoryThreadStore()
        let registry = ThreadRegistry(backend: EchoBackend(), capacity: 2, store: memory)
        try await call(registry, "kept", "stored")
        memory.failWrites("Read-only file system")
        for i in 2...5 {
            let r = try await call(registry, "kept", "ro \(i)")
            #expect(r.outcome.text == "echo \(i): ro \(i)" && r.outcome.storeError?.contains("Read-only file system") == true)
        }
        // New threads come and go past the capacity of 2; "kept" holds four answered turns only in memory.
        for other in ["a", "b", "c"] { try await call(registry, other, "x") }
        #expect(await registry.contains("kept"))
        let next = try await call(registry, "kept", "after")
        #expect(next.outcome.text == "echo 6: after" && !next.created)
        memory.failWrites(nil)
        try await call(registry, "d", "x")  // a new thread: the registry stores waiting threads meanwhile
        // Stored by a later call's pass, off this task: waited for, with room for a loaded machine.
        for _ in 0..<6000 where memory.stored("kept")?.history.count != 6 {
            try await Task.sleep(for: .milliseconds(10))
        }
        #expect(memory.stored("kept")?.history.count == 6)
    }
}

/// What each store says of itself (`status`'s `store_about`, `--check`): one question, every store.
@Suite struct StoreAboutTests {
    @Test func sqliteSaysTheLibraryItRunsOnAndTheSchemaItsDatabaseIsAt() throws {
        let dir = freshStateDir()
        let s = try store(dir)
        defer { s.close() }
        // Asked of the database file itself, not of the store's constants.
        let db = try SQLiteDatabase(path: dir + "/" + SQLiteThreadStore.fileName, create: false, maxLength: 1 << 20,
                                    busyTimeoutMs: 1000)
        var library: String?, schema: Int64?
        try db.query("SELECT sqlite_version()") { library = $0.text(0) }
        try db.query("PRAGMA user_version") { schema = $0.int(0) }
        let (v, n) = (try #require(library), try #require(schema))
        #expect(n > 0)
        #expect(s.about == StoreAbout(engine: "sqlite", version: v, schema: Int(n)))
        #expect(s.about.text == "sqlite \(v), wisp schema \(n)")
    }

    @Test func memoryAndNoStoreAtAllSayThreadsEndWithTheProcess() async throws {
        #expect(MemoryThreadStore().about.text == "memory (threads end with this process)")
        let (server, wire) = pipeServer(EchoBackend())
        await server.handle(Status(id: 1))
        #expect(await wire.reply(1).body["store_about"] as? String == "memory (threads end with this process)")
    }
}
