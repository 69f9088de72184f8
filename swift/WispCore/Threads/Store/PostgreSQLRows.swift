#if os(Linux)
import WispInfrastructure

/// One thread as rows of the PostgreSQL store (`PostgreSQLSchema`), the SQLite store's
/// `ThreadRows` in PostgreSQL's words. The values are encoded by the SQLite store's own encoders
/// (`StoreSchema.json`, `.strings`, `.exchanges`, `.words`, `Turn.stored`): one codec for both.
/// Every function runs inside its caller's transaction; the policies are the store's.
enum PostgreSQLRows {
    struct Unreadable: Error { let why: String }

    /// A thread's head, and its turns in order, as `loaded` reads them.
    static let headColumns = "SELECT version, instructions, tools, roots FROM threads WHERE id = "
    static let turnColumns = "SELECT prompt, tool_exchanges, response, reasoning, tokens, structured FROM turns "
        + "WHERE thread_id = "

    static func read(_ db: PostgreSQLConnection, _ id: String,
                     unlessAt seen: StoreVersion?) throws(PostgreSQLError) -> Result<Loaded, Unreadable> {
        let head = try db.query(headColumns + "$1", [id])
        if let early = unlessAt(head, seen) { return .success(early) }
        return loaded(head, try db.query(turnColumns + "$1 ORDER BY seq", [id]))
    }

    /// One trip for a lease and what is stored under it (`literal`: the id as `PostgreSQLConnection.literal`
    /// quotes it): the lease's statement first, then the head, then the turns unless the head is at
    /// `seen`. Each statement reads after the one before it ended, so what it reads is what the lease holds.
    static func leaseAndRead(_ lease: String, _ literal: String, unlessAt seen: StoreVersion?) -> String {
        let changed = seen.map { "AND NOT EXISTS (SELECT 1 FROM threads WHERE id = \(literal) AND version = \($0.value)) " } ?? ""
        return "\(lease); \(headColumns)\(literal); \(turnColumns)\(literal) \(changed)ORDER BY seq"
    }

    /// `.none` when nothing is stored, `.unchanged` at `seen`; nil when the turns are needed.
    static func unlessAt(_ head: [[String?]], _ seen: StoreVersion?) -> Loaded? {
        guard let row = head.first, row.count == 4 else { return Loaded.none }
        return row[0].flatMap { Int64($0) } == seen?.value ? .unchanged : nil
    }

    /// The thread its head and turns rows hold (`headColumns`, `turnColumns`).
    static func loaded(_ head: [[String?]], _ rows: [[String?]]) -> Result<Loaded, Unreadable> {
        guard let row = head.first, row.count == 4 else { return .success(.none) }
        let version = row[0].flatMap { Int64($0) } ?? -1
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

    /// What a commit reads first, in the statements that open its transaction (`literal`: the id
    /// quoted): the next version, and the stored thread's head where there is one. The lease is the
    /// thread's lock (no one else writes the thread while it is held), so the row is not locked again.
    static func commitHead(_ literal: String) -> String {
        "SELECT nextval('wisp_clock'), t.version, t.created_at, t.turns, t.input_tokens, t.output_tokens, "
            + "t.reasoning_tokens FROM (SELECT 1) AS one LEFT JOIN threads AS t ON t.id = \(literal)"
    }

    /// Writes `thread` at `now` (Unix seconds) as version `head`'s (`commitHead`'s row); `usage` is
    /// added to its totals. `beforeInsert` runs once a thread is found new, before its rows are
    /// written (the cap's lock). The head and the new turns go in one statement. Returns the new
    /// version, and whether no thread was stored under `id` before.
    static func write(_ db: PostgreSQLConnection, _ id: String, _ thread: StoredThread, head: [String?], kept: Int,
                      after seen: StoreVersion?, usage: Usage, at now: Double,
                      beforeInsert: () throws(PostgreSQLError) -> Void) throws(PostgreSQLError) -> (version: Int64, new: Bool) {
        guard head.count == 7, let version = head[0].flatMap({ Int64($0) }) else {
            throw PostgreSQLError("the thread's head did not read (\(head.count) columns)")
        }
        let old = head[1].flatMap { Int64($0) }.map { v in
            (version: v, created: head[2].flatMap { Double($0) } ?? now, turns: head[3].flatMap { Int64($0) } ?? 0,
             usage: usageOf(head, from: 4))
        }
        if old == nil { try beforeInsert() }
        // Only the turns after `kept` are written when the stored thread is the one the holder saw.
        let from = old.map { $0.version == seen?.value && kept >= 0 && Int64(kept) <= $0.turns } == true ? kept : 0
        if old.map({ Int64(from) < $0.turns }) ?? true {  // appending after what is stored deletes nothing
            try db.query("DELETE FROM turns WHERE thread_id = $1 AND seq >= $2", [id, String(from)])
        }
        let totals = old.map { $0.usage + usage } ?? usage
        func count(_ n: Int?) -> String? { n.map { String($0) } }
        let turns = Array(thread.history.enumerated().dropFirst(from))
        try db.query("""
            WITH head AS (INSERT INTO threads VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
              ON CONFLICT (id) DO UPDATE SET version = $2, instructions = $3, tools = $4, roots = $5, turns = $6,
                updated_at = $8, first_prompt = $9, last_reply = $10, input_tokens = $11, output_tokens = $12,
                reasoning_tokens = $13)
            INSERT INTO turns SELECT $1, * FROM unnest($14::integer[], $15::text[], $16::text[], $17::text[],
              $18::bigint[], $19::text[], $20::boolean[], $21::text[])
            """, [id, String(version), thread.instructions, StoreSchema.json(thread.tools), StoreSchema.json(thread.roots),
                  String(thread.history.count), String(old?.created ?? now), String(now),
                  ThreadSummary.preview(thread.history.first?.prompt ?? ""),
                  ThreadSummary.preview(thread.history.last?.response ?? ""),
                  count(totals.inputTokens), count(totals.outputTokens), count(totals.reasoningTokens),
                  array(turns.map { String($0.offset) }), array(turns.map(\.element.prompt)),
                  array(turns.map(\.element.response)), array(turns.map(\.element.reasoning)),
                  array(turns.map { String($0.element.tokens) }), array(turns.map { StoreSchema.json($0.element.toolExchanges) }),
                  array(turns.map { $0.element.structured ? "true" : "false" }),
                  array(turns.map { StoreSchema.words($0.element.prompt, $0.element.response) })])
        return (version, old == nil)
    }

    /// `values` as a PostgreSQL array's text (each element quoted, nil as NULL), for `unnest`.
    static func array(_ values: [String?]) -> String {
        var out = "{"
        for (i, value) in values.enumerated() {
            if i > 0 { out += "," }
            guard let value else { out += "NULL"; continue }
            out += "\""
            for c in value.unicodeScalars {
                if c == "\"" || c == "\\" { out += "\\" }
                out.unicodeScalars.append(c)
            }
            out += "\""
        }
        return out + "}"
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
