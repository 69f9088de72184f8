import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

/// A store the contract runs against: `make` a fresh one, `reopen` it as another process (or a
/// restarted wisp) would see it. A new store is one more entry in `all`.
struct StoreUnderTest: Sendable, CustomTestStringConvertible {
    let name: String
    let make: @Sendable (_ maxStored: Int) throws -> (any ThreadStore, reopen: @Sendable () throws -> any ThreadStore)

    var testDescription: String { name }

    static let all: [StoreUnderTest] = [
        StoreUnderTest(name: "memory") { max in
            let s = MemoryThreadStore(maxStored: max)
            return (s, { s })
        },
        StoreUnderTest(name: "sqlite") { max in
            let dir = freshStateDir()
            let open = { @Sendable () throws -> any ThreadStore in
                try SQLiteThreadStore(directory: dir, maxStored: max, log: Log(level: .error))
            }
            return (try open(), open)
        },
        // Where the system's SQLite has no FTS5, search reads each turn's words.
        StoreUnderTest(name: "sqlite without FTS5") { max in
            let dir = freshStateDir()
            _ = try SQLiteThreadStore(directory: dir, maxStored: max, log: Log(level: .error))
            let db = try SQLiteDatabase(path: dir + "/threads.db", create: false, maxLength: 1 << 20, busyTimeoutMs: 1000)
            try db.execute("DROP TRIGGER turns_text_insert; DROP TRIGGER turns_text_delete; DROP TABLE turns_text")
            db.close()
            let open = { @Sendable () throws -> any ThreadStore in
                try SQLiteThreadStore(directory: dir, maxStored: max, log: Log(level: .error))
            }
            return (try open(), open)
        },
    ] + postgreSQL

    /// The PostgreSQL store on a database of its own, where a cluster can be started here
    /// (`PostgreSQLContractRuns` says why not, where not).
    static var postgreSQL: [StoreUnderTest] {
        #if os(Linux)
        guard PostgreSQLServer.shared != nil else { return [] }
        return [StoreUnderTest(name: "postgresql") { max in
            guard let server = PostgreSQLServer.shared else { throw PostgreSQLError("no PostgreSQL server") }
            let url = try StoreURL(try server.freshDatabase())
            let open = { @Sendable () throws -> any ThreadStore in
                PostgreSQLThreadStore(url: url, maxStored: max, log: Log(level: .error))
            }
            return (try open(), open)
        }]
        #else
        return []
        #endif
    }
}

/// Says, as a skip with its reason, when the contract does not run against PostgreSQL here.
@Suite struct PostgreSQLContractRuns {
    #if os(Linux)
    static let why = PostgreSQLServer.absent ?? (PostgreSQLServer.shared == nil ? "its cluster did not start" : nil)
    #else
    static let why: String? = "the PostgreSQL store is built on Linux only"
    #endif

    @Test(.enabled(if: why == nil, "\(why ?? "")"))
    func theContractRunsAgainstPostgreSQL() {
        #expect(StoreUnderTest.all.contains { $0.name == "postgresql" })
    }

    /// CI installs PostgreSQL and sets WISP_REQUIRE_POSTGRES=1 (.ci/run): there a skip is a failure.
    @Test(.enabled(if: ProcessInfo.processInfo.environment["WISP_REQUIRE_POSTGRES"] == "1"))
    func postgreSQLIsHereWhereItIsRequired() {
        #expect(Self.why == nil, "WISP_REQUIRE_POSTGRES=1, but the PostgreSQL tests cannot run: \(Self.why ?? "")")
    }
}

private func leased<T>(_ s: any ThreadStore, _ id: String,
                       _ body: (any ThreadLease) async throws -> T) async throws -> T {
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

private func turn(_ prompt: String, _ reply: String = "ok") -> Turn {
    Turn(prompt: prompt, response: reply, tokens: 3)
}

/// Appends a turn to thread `id` (made if need be) with `usage`, as a call's commit does.
@discardableResult
private func append(_ s: any ThreadStore, _ id: String, _ prompt: String, reply: String = "ok",
                    usage: Usage = Usage(inputTokens: 1, outputTokens: 2)) async throws -> StoreVersion {
    try await leased(s, id) { lease in
        var t = StoredThread(instructions: "brief", tools: [], roots: [], history: [])
        var seen: StoreVersion?
        if case .loaded(let old, let v) = try await lease.load(unlessAt: nil) { (t, seen) = (old, v) }
        let kept = t.history.count
        t.history.append(turn(prompt, reply))
        return try await lease.commit(t, kept: kept, after: seen, usage: usage)
    }
}

/// Inputs where a word and its case are easy to judge two ways: (text, query, whether it matches).
let trickySearches: [(text: String, query: String, matches: Bool)] = [
    ("Café au lait", "CAFÉ", true),
    ("Café noir", "cafe\u{301}", true),  // the query decomposed
    ("cafe\u{301} crème", "CAFÉ crème", true),  // the text decomposed
    ("un café", "cafe", false),  // accents count
    ("STRASSE", "straße", true),
    ("Straße", "STRASSE", true),
    ("İSTANBUL", "İstanbul", true),
    ("İzmir", "izmir", false),  // İ folds to i + U+0307
    ("ΣΊΣΥΦΟΣ", "σίσυφος", true),
    ("東京都に行く", "東京", true),  // an ideograph is a word
    ("京都", "東京", false),
    ("ひらがな", "がな", true),
    ("🎉party🎉time", "time party", true),
    ("🎉🎉", "🎉 🎉", false),  // no words in the query: refused (see below)
    ("well-known fact", "known", true),
    ("e-mail", "email", false),
    ("don't stop", "don", true),
    ("x\"y OR z", "\"y", true),
    ("AND OR NOT NEAR", "near not", true),
    ("naïve", "NAÏVE", true),
    ("ﬁne print", "fine", true),
    ("v1.2.3 released", "2", true),
    ("Ǆemal", "ǆemal", true),
    ("Ⅻ chapter", "ⅻ", true),
    ("a\u{301}\u{302}b", "A\u{301}\u{302}B", true),  // stacked combining marks
]

@Suite struct StoreContract {
    @Test(arguments: StoreUnderTest.all)
    func aThreadRoundTripsAndIsReadTheSameAfterReopening(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(1000)
        let t = StoredThread(instructions: "be brief", tools: ["read_file"], roots: ["/r"], history: [
            Turn(prompt: "p1", toolExchanges: [ToolExchange(name: "read_file", arguments: "{}", output: "o", failed: true)],
                 response: "r1", reasoning: "thought"),
            Turn(prompt: "p2", response: "{\"a\":1}", tokens: 9, structured: true),
        ])
        let v = try await leased(s, "t") { try await $0.commit(t, kept: 0, after: nil, usage: Usage()) }
        #expect(try await leased(s, "t") { try await $0.load(unlessAt: nil) } == .loaded(t, v))
        #expect(try await leased(s, "t") { try await $0.load(unlessAt: v) } == .unchanged)
        #expect(try await s.read("t") == .loaded(t, v))
        #expect(try await s.read("t", unlessAt: v) == .unchanged)
        #expect(try await s.read("other") == .none)
        #expect(try await reopen().read("t") == .loaded(t, v))
        // Written after the version seen: only the new turn; after another: whole. Either reads the same.
        var more = t
        more.history.append(turn("p3"))
        let v2 = try await leased(s, "t") { try await $0.commit(more, kept: 2, after: v, usage: Usage()) }
        #expect(v2 != v)
        #expect(try await reopen().read("t") == .loaded(more, v2))
        more.history.removeFirst()
        let v3 = try await leased(s, "t") { try await $0.commit(more, kept: 2, after: v, usage: Usage()) }
        #expect(try await reopen().read("t") == .loaded(more, v3))
    }

    @Test(arguments: StoreUnderTest.all)
    func containsSaysWhatIsStoredAndAClosedThreadIsGoneEverywhere(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(1000)
        #expect(try await !s.contains("t"))
        try await append(s, "t", "hello")
        try await append(s, "u", "hello")
        #expect(try await s.contains("t"))
        #expect(try await reopen().contains("t"))
        #expect(try await s.delete("t"))
        #expect(try await !s.delete("t"))
        let again = try reopen()
        #expect(try await !s.contains("t"))
        #expect(try await !again.contains("t"))
        #expect(try await again.read("t") == .none)
        #expect(await again.summaries(matching: nil, limit: 10).map(\.id) == ["u"])
        #expect(await again.summaries(matching: try ThreadQuery("hello"), limit: 10).map(\.id) == ["u"])
        // Its id starts afresh.
        try await append(s, "t", "new")
        guard case .loaded(let fresh, _) = try await again.read("t") else { Issue.record("not stored"); return }
        #expect(fresh.history.map(\.prompt) == ["new"])
    }

    @Test(arguments: StoreUnderTest.all)
    func listingIsMostRecentlyUpdatedFirstAndRegistryPagesGiveEachThreadOnce(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(1000)
        for id in ["a", "b", "c", "d", "e"] { try await append(s, id, "turn of \(id)") }
        try await append(s, "b", "b again")
        let order = ["b", "e", "d", "c", "a"]
        #expect(try await reopen().summaries(matching: nil, limit: 10).map(\.id) == order)
        #expect(await s.summaries(matching: nil, limit: 2).map(\.id) == ["b", "e"])
        #expect(await s.summaries(matching: nil, limit: 0).isEmpty)
        let registry = ThreadRegistry(backend: EchoBackend(), store: try reopen())
        var seen: [String] = []
        var cursor: String?
        repeat {
            let page = try await registry.list(limit: 2, cursor: cursor)
            #expect(page.threads.count <= 2 && page.threads.allSatisfy { $0.stored && !$0.live })
            seen += page.threads.map(\.thread_id)
            cursor = page.next
        } while cursor != nil
        #expect(seen == order)
    }

    @Test(arguments: StoreUnderTest.all)
    func theCapDeletesTheLeastRecentlyUpdatedSkippingAHeldThread(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(2)
        try await append(s, "a", "x")
        try await append(s, "b", "x")
        try await append(s, "a", "y")  // b is now the least recently updated
        try await append(s, "c", "x")
        #expect(try await reopen().summaries(matching: nil, limit: 10).map(\.id) == ["c", "a"])
        // A thread a call holds is not deleted under it: the next least recent goes instead.
        let held = try await s.lease("a")
        try await append(s, "d", "x")
        await held.release()
        #expect(try await reopen().summaries(matching: nil, limit: 10).map(\.id) == ["d", "a"])
    }

    @Test(arguments: StoreUnderTest.all)
    func usageTotalsAddUpAndSaturateRatherThanTrap(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(1000)
        try await append(s, "t", "1", usage: Usage(inputTokens: 5, outputTokens: 7, reasoningTokens: 1))
        try await append(s, "t", "2", usage: Usage(inputTokens: 5, outputTokens: 7, reasoningTokens: 1))
        let sum = try await reopen().summaries(matching: nil, limit: 1).first?.usage
        #expect(sum?.inputTokens == 10 && sum?.outputTokens == 14 && sum?.reasoningTokens == 2)
        // A turn whose backend did not say leaves the total unknown, not an undercount.
        try await append(s, "u", "1", usage: Usage(inputTokens: 5, outputTokens: 7))
        try await append(s, "u", "2", usage: Usage(inputTokens: 5))
        let partial = try await reopen().summaries(matching: nil, limit: 1).first?.usage
        #expect(partial?.inputTokens == 10 && partial?.outputTokens == nil)
        try await append(s, "big", "1", usage: Usage(inputTokens: Int.max, outputTokens: Int.max - 1))
        try await append(s, "big", "2", usage: Usage(inputTokens: Int.max, outputTokens: 5))
        let big = try await reopen().summaries(matching: nil, limit: 1).first
        #expect(big?.id == "big" && big?.usage.inputTokens == Int.max && big?.usage.outputTokens == Int.max)
    }

    @Test(arguments: StoreUnderTest.all)
    func searchFindsExactlyWhatTheLiveJudgementFinds(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(1000)
        var histories: [String: [Turn]] = [:]
        for (i, c) in trickySearches.enumerated() {
            try await append(s, "c\(i)", c.text, reply: "reply \(i)")
            histories["c\(i)"] = [turn(c.text, "reply \(i)")]
        }
        let stored = try reopen()
        for (i, c) in trickySearches.enumerated() {
            guard let query = try? ThreadQuery(c.query) else {
                #expect(!c.matches, "query \(c.query.debugDescription) was refused")
                continue
            }
            let live = Set(histories.filter { query.matches($0.value) }.keys)
            let found = Set(await stored.summaries(matching: query, limit: 1000).map(\.id))
            #expect(found == live, "query \(c.query.debugDescription): stored \(found.sorted()), live \(live.sorted())")
            #expect(live.contains("c\(i)") == c.matches, "query \(c.query.debugDescription) on \(c.text.debugDescription)")
        }
    }

    /// Through the registry: a thread found live is found stored by a restarted wisp, and back.
    @Test(arguments: StoreUnderTest.all)
    func aRegistrySearchFindsTheSameThreadsLiveAndAfterARestart(_ kind: StoreUnderTest) async throws {
        let (s, reopen) = try kind.make(1000)
        let live = ThreadRegistry(backend: EchoBackend(), store: s)
        for (i, c) in trickySearches.enumerated() { try await call(live, "c\(i)", c.text) }
        let restarted = ThreadRegistry(backend: EchoBackend(), store: try reopen())
        for c in trickySearches where (try? ThreadQuery(c.query)) != nil {
            let a = try await live.list(query: c.query).threads
            let b = try await restarted.list(query: c.query).threads
            #expect(a.allSatisfy(\.live) && b.allSatisfy { !$0.live && $0.stored })
            #expect(a.map(\.thread_id) == b.map(\.thread_id), "query \(c.query.debugDescription)")
        }
    }
}

@Suite struct SearchWordsJudgement {
    /// A lease with the load under it (`leaseLoading`: one trip where the store makes it one) finds
    /// what a lease and then `load` find, and holds the lease for the commit that follows.
    @Test(arguments: StoreUnderTest.all)
    func leaseLoadingFindsWhatALoadFindsAndHoldsTheLease(_ under: StoreUnderTest) async throws {
        let (s, _) = try under.make(1000)
        defer { s.close() }
        let thread = { (prompts: [String]) in
            StoredThread(instructions: "brief", tools: [], roots: [], history: prompts.map { turn($0) })
        }
        let (fresh, nothing) = try await s.leaseLoading("t", unlessAt: nil)
        await fresh.release()
        #expect(nothing == .none)
        let v1 = try await append(s, "t", "one")
        let (a, whole) = try await s.leaseLoading("t", unlessAt: nil)
        await a.release()
        #expect(whole == .loaded(thread(["one"]), v1))
        let (b, same) = try await s.leaseLoading("t", unlessAt: v1)
        await b.release()
        #expect(same == .unchanged)
        let v2 = try await append(s, "t", "two")
        let (c, moved) = try await s.leaseLoading("t", unlessAt: v1)
        #expect(moved == .loaded(thread(["one", "two"]), v2))
        let v3 = try await c.commit(thread(["one", "two", "three"]), kept: 2, after: v2, usage: Usage())
        await c.release()
        #expect(try await s.read("t") == .loaded(thread(["one", "two", "three"]), v3))
    }

    @Test func wordsAreFoldedRunsOfLettersAndDigits() {
        #expect(SearchWords.of("Hello, WORLD! 42x") == ["hello", "world", "42x"])
        #expect(SearchWords.of("Straße İz") == ["strasse", "i\u{307}z"])
        #expect(SearchWords.of("東京 tower") == ["東", "京", "tower"])
        #expect(SearchWords.of("🎉a\u{200D}b") == ["a\u{200D}b"])  // a joiner is part of its word
        #expect(SearchWords.of("cafe\u{301}") == ["caf\u{E9}"])
        #expect(SearchWords.of("") == [] && SearchWords.of("... — !!") == [])
        // No word holds an ASCII byte but a letter or digit (the SQLite index splits on them).
        let odd = "a\u{301}\"b \u{0600}1 x\r\ny \u{0301}z"
        #expect(SearchWords.of(odd).allSatisfy { w in
            w.unicodeScalars.allSatisfy { !$0.isASCII || $0.properties.isAlphabetic || ("0"..."9").contains($0) }
        })
    }

    @Test func aQueryOfNoWordsIsRefusedSayingWhatAWordIs() {
        let error = #expect(throws: WispError.self) { try ThreadQuery("🎉 -- !") }
        #expect(error?.message.contains("letters or digits") == true)
    }
}
