#if os(Linux)
import WispInfrastructure

/// One thread as rows of the PostgreSQL store (`PostgreSQLSchema`), the SQLite store's
/// `ThreadRows` in PostgreSQL's words. The values are encoded by the SQLite store's own encoders
/// (`StoreSchema.json`, `.strings`, `.exchanges`, `.words`, `Turn.stored`): one codec for both.
/// Every function runs inside its caller's transaction; the policies are the store's.
enum PostgreSQLRows {
    struct Unreadable: Error { let why: String }

    static func read(_ db: PostgreSQLConnection, _ id: String,
                     unlessAt seen: StoreVersion?) throws(PostgreSQLError) -> Result<Loaded, Unreadable> {
        let head = try db.query("SELECT version, instructions, tools, roots FROM threads WHERE id = $1", [id])
        guard let row = head.first, row.count == 4 else { return .success(.none) }
        let version = row[0].flatMap { Int64($0) } ?? -1
        if version == seen?.value { return .success(.unchanged) }
        let rows = try db.query("SELECT prompt, tool_exchanges, response, reasoning, tokens, structured FROM turns "
                                + "WHERE thread_id = $1 ORDER BY seq", [id])
        var history: [Turn] = []
        for r in rows {
            guard r.count == 6, let prompt = r[0], let response = r[2],
                  let exchanges = try? StoreSchema.exchanges(r[1]) else {
                return .failure(Unreadable(why: "its turn \(history.count + 1) does not read"))
            }
            history.append(.stored(prompt: prompt, toolExchanges: exchanges, response: response, reasoning: r[3],
                                   tokens: r[4].flatMap { Int64($0) } ?? -1, structured: r[5] == "t"))
        }
        guard let tools = try? StoreSchema.strings(row[2] ?? ""), let roots = try? StoreSchema.strings(row[3] ?? "") else {
            return .failure(Unreadable(why: "its tools or roots do not read"))
        }
        let thread = StoredThread(instructions: row[1], tools: tools, roots: roots, history: history)
        return .success(.loaded(thread, StoreVersion(version)))
    }

    /// Writes `thread` at `now` (Unix seconds); `usage` is added to its totals. `beforeInsert`
    /// runs once a thread is found new, before its rows are written (the cap's lock). Returns its
    /// new version, and whether no thread was stored under `id` before.
    static func write(_ db: PostgreSQLConnection, _ id: String, _ thread: StoredThread, kept: Int,
                      after seen: StoreVersion?, usage: Usage, at now: Double,
                      beforeInsert: () throws(PostgreSQLError) -> Void) throws(PostgreSQLError) -> (version: Int64, new: Bool) {
        let head = try db.query("SELECT version, created_at, turns, input_tokens, output_tokens, reasoning_tokens "
                                + "FROM threads WHERE id = $1 FOR UPDATE", [id]).first
        let old = head.map { r in
            (version: r[0].flatMap { Int64($0) } ?? -1, created: r[1].flatMap { Double($0) } ?? now,
             turns: r[2].flatMap { Int64($0) } ?? 0, usage: usageOf(r, from: 3))
        }
        if old == nil { try beforeInsert() }
        // Only the turns after `kept` are written when the stored thread is the one the holder saw.
        let from = old.map { $0.version == seen?.value && kept >= 0 && Int64(kept) <= $0.turns } == true ? kept : 0
        let version = try scalar(db.query("SELECT nextval('wisp_clock')")).flatMap { Int64($0) } ?? 0
        let totals = old.map { $0.usage + usage } ?? usage
        func count(_ n: Int?) -> String? { n.map { String($0) } }
        try db.query("""
            INSERT INTO threads VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
            ON CONFLICT (id) DO UPDATE SET version = $2, instructions = $3, tools = $4, roots = $5, turns = $6,
              updated_at = $8, first_prompt = $9, last_reply = $10, input_tokens = $11, output_tokens = $12,
              reasoning_tokens = $13
            """, [id, String(version), thread.instructions, StoreSchema.json(thread.tools), StoreSchema.json(thread.roots),
                  String(thread.history.count), String(old?.created ?? now), String(now),
                  ThreadSummary.preview(thread.history.first?.prompt ?? ""),
                  ThreadSummary.preview(thread.history.last?.response ?? ""),
                  count(totals.inputTokens), count(totals.outputTokens), count(totals.reasoningTokens)])
        if old.map({ Int64(from) < $0.turns }) ?? true {  // appending after what is stored deletes nothing
            try db.query("DELETE FROM turns WHERE thread_id = $1 AND seq >= $2", [id, String(from)])
        }
        for (seq, turn) in thread.history.enumerated().dropFirst(from) {
            try db.query("INSERT INTO turns VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)", [
                id, String(seq), turn.prompt, turn.response, turn.reasoning, String(turn.tokens),
                StoreSchema.json(turn.toolExchanges), turn.structured ? "true" : "false",
                StoreSchema.words(turn.prompt, turn.response),
            ])
        }
        return (version, old == nil)
    }

    /// The first column of the first row, or nil.
    static func scalar(_ rows: [[String?]]) -> String? { rows.first?.first ?? nil }

    static func usageOf(_ r: [String?], from at: Int) -> Usage {
        func count(_ i: Int) -> Int? { (i < r.count ? r[i] : nil).flatMap { Int($0) }.flatMap { $0 >= 0 ? $0 : nil } }
        return Usage(inputTokens: count(at), outputTokens: count(at + 1), reasoningTokens: count(at + 2))
    }

    /// A search word as a `tsquery` lexeme, taken as it is (no parser: the stored lexemes are
    /// `StoreSchema.words`, `SearchWords`' judgement, so the index finds exactly what it finds).
    static func lexeme(_ word: String) -> String {
        var quoted = "'"
        for c in word {
            if c == "'" || c == "\\" { quoted.append("\\") }
            quoted.append(c)
        }
        return quoted + "'"
    }

    /// Stored threads, most recently updated first, each with every word of `query` in some turn.
    static func summaries(_ db: PostgreSQLConnection, query: ThreadQuery?,
                          limit: Int) throws(PostgreSQLError) -> [ThreadSummary] {
        let words = query?.words.sorted() ?? []
        let conditions = ["id NOT LIKE '!%'"] + words.indices.map { i in
            "id IN (SELECT thread_id FROM turns WHERE \(PostgreSQLSchema.lexemes) @@ $\(i + 1)::tsquery)"
        }
        let sql = "SELECT id, turns, created_at, updated_at, first_prompt, last_reply, "
            + "input_tokens, output_tokens, reasoning_tokens, instructions, version FROM threads "
            + "WHERE \(conditions.joined(separator: " AND ")) ORDER BY updated_at DESC LIMIT \(max(0, limit))"
        return try db.query(sql, words.map(lexeme)).compactMap { r -> ThreadSummary? in
            guard r.count == 11, let id = r[0] else { return nil }
            return ThreadSummary(id: id, turns: max(0, r[1].flatMap { Int($0) } ?? 0),
                                 createdAt: r[2].flatMap { Double($0) } ?? 0, updatedAt: r[3].flatMap { Double($0) } ?? 0,
                                 firstPrompt: r[4] ?? "", lastReply: r[5] ?? "", usage: usageOf(r, from: 6),
                                 instructions: r[9], version: r[10].flatMap { Int64($0) }.map(StoreVersion.init))
        }
    }
}
#endif
