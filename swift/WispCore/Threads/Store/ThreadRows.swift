import WispInfrastructure

/// One thread as rows of the SQLite store (`StoreSchema`): read whole, written by a commit (only
/// its new turns where the stored thread is the one its holder saw), removed. Every function runs
/// inside its caller's transaction or snapshot; the store's policies (leases, the cap, setting a
/// thread aside) are the store's.
enum ThreadRows {
    struct Unreadable: Error { let why: String }

    static func read(_ db: SQLiteDatabase, _ id: String,
                     unlessAt seen: StoreVersion?) throws(SQLiteError) -> Result<Loaded, Unreadable> {
        var head: (Int64, String?, String, String)?
        try db.query("SELECT version, instructions, tools, roots FROM threads WHERE id = ?", [.text(id)]) { r in
            head = (r.int(0) ?? -1, r.text(1), r.text(2) ?? "", r.text(3) ?? "")
        }
        guard let (version, instructions, toolsText, rootsText) = head else { return .success(.none) }
        if version == seen?.value { return .success(.unchanged) }
        var history: [Turn] = []
        var bad: String?
        let turns = "SELECT prompt, tool_exchanges, response, reasoning, tokens, structured FROM turns "
            + "WHERE thread_id = ? ORDER BY seq"
        try db.query(turns, [.text(id)]) { r in
            guard bad == nil else { return }
            guard let prompt = r.text(0), let response = r.text(2),
                  let exchanges = try? StoreSchema.exchanges(r.text(1)) else {
                bad = "its turn \(history.count + 1) does not read"
                return
            }
            history.append(.stored(prompt: prompt, toolExchanges: exchanges, response: response, reasoning: r.text(3),
                                   tokens: r.int(4) ?? -1, structured: r.int(5) == 1))
        }
        if let bad { return .failure(Unreadable(why: bad)) }
        guard let tools = try? StoreSchema.strings(toolsText), let roots = try? StoreSchema.strings(rootsText) else {
            return .failure(Unreadable(why: "its tools or roots do not read"))
        }
        let thread = StoredThread(instructions: instructions, tools: tools, roots: roots, history: history)
        return .success(.loaded(thread, StoreVersion(version)))
    }

    /// Writes `thread` at `now` (Unix seconds); `usage` is added to its totals. Returns its new
    /// version, and whether no thread was stored under `id` before (the cap then applies).
    static func write(_ db: SQLiteDatabase, _ id: String, _ thread: StoredThread, kept: Int, after seen: StoreVersion?,
                      usage: Usage, at now: Double) throws(SQLiteError) -> (version: Int64, new: Bool) {
        var old: (version: Int64, created: Double, turns: Int64, usage: Usage)?
        let head = "SELECT version, created_at, turns, input_tokens, output_tokens, reasoning_tokens "
            + "FROM threads WHERE id = ?"
        try db.query(head, [.text(id)]) { r in
            old = (r.int(0) ?? -1, r.double(1) ?? now, r.int(2) ?? 0, StoreSchema.usage(r, from: 3))
        }
        // Only the turns after `kept` are written when the stored thread is the one the holder saw.
        let from = old.map { $0.version == seen?.value && kept >= 0 && Int64(kept) <= $0.turns } == true ? kept : 0
        try db.query("DELETE FROM turns WHERE thread_id = ? AND seq >= ?", [.text(id), .int(Int64(from))])
        for (seq, turn) in thread.history.enumerated().dropFirst(from) {
            try db.query("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", [
                .text(id), .int(Int64(seq)), .text(turn.prompt), .text(turn.response),
                turn.reasoning.map { .text($0) } ?? .null,
                .int(Int64(turn.tokens)), StoreSchema.json(turn.toolExchanges).map { .text($0) } ?? .null,
                .int(turn.structured ? 1 : 0), .text(StoreSchema.words(turn.prompt, turn.response)),
            ])
        }
        var version: Int64 = 0
        try db.query("UPDATE clock SET now = now + 1 RETURNING now") { r in version = r.int(0) ?? 0 }
        let totals = old.map { $0.usage + usage } ?? usage
        func count(_ n: Int?) -> SQLiteValue { n.map { .int(Int64($0)) } ?? .null }
        try db.query("INSERT OR REPLACE INTO threads VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", [
            .text(id), .int(version), thread.instructions.map { .text($0) } ?? .null,
            .text(StoreSchema.json(thread.tools)), .text(StoreSchema.json(thread.roots)),
            .int(Int64(thread.history.count)), .double(old?.created ?? now), .double(now),
            .text(ThreadSummary.preview(thread.history.first?.prompt ?? "")),
            .text(ThreadSummary.preview(thread.history.last?.response ?? "")),
            count(totals.inputTokens), count(totals.outputTokens), count(totals.reasoningTokens),
        ])
        return (version, old == nil)
    }

    /// Deletes thread `id`'s rows, inside the caller's transaction.
    static func delete(_ id: String, _ db: SQLiteDatabase) throws(SQLiteError) {
        try db.query("DELETE FROM turns WHERE thread_id = ?", [.text(id)])
        try db.query("DELETE FROM threads WHERE id = ?", [.text(id)])
    }

    /// Deletes thread `id` in a transaction of its own.
    static func remove(_ id: String, _ db: SQLiteDatabase) throws(SQLiteError) {
        try db.transaction { () throws(SQLiteError) in try delete(id, db) }
    }
}
