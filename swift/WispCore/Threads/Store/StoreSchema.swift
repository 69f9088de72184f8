import WispInfrastructure

/// The SQLite store's schema, its version and the way from each older version to this one.
///
/// - `threads`: one row per thread: its binding (`tools`, `roots`: JSON arrays of strings), its
///   `version` (from `clock`, which only grows, so a thread closed and started again never
///   repeats a version another holder saw), its `turns`, `created_at`/`updated_at` (Unix seconds),
///   previews of its first prompt and last reply, and its usage totals (NULL where some turn's
///   backend did not say).
/// - `turns`: one row per turn, `seq` from 0; `tool_exchanges` a JSON array, NULL for none;
///   `structured` 1 for a turn that answered a `schema` (version 2); `words` the words of its
///   prompt and reply as `SearchWords` judges them, each once, each between spaces (version 3):
///   search matches them byte for byte, so the store finds what a live thread's search finds.
/// - `turns_text`: an FTS5 index over `words`, kept by triggers, where the system's SQLite has
///   FTS5 (the macOS SDK's and Debian's do); its `ascii` tokenizer splits at the spaces alone (a
///   word holds no other ASCII byte but letters and digits, and no upper case). Without FTS5,
///   search reads the `words` column. (Before version 3 it indexed prompts and replies with
///   SQLite's own idea of a word, which was not the live one.)
/// - `imported`: the thread files of earlier wisps already imported (each once: a thread closed
///   later must not come back from its old file).
/// - `PRAGMA user_version` is the schema version. A newer one is a newer wisp's database.
enum StoreSchema {
    static let version = 3

    /// The SQLite store's answer to `ThreadStore.about`: a database it opened is at `version`.
    static var about: StoreAbout { StoreAbout(engine: "sqlite", version: SQLiteDatabase.libraryVersion, schema: version) }

    /// `migrations[v]` takes a database at version v to v + 1 (0: an empty file).
    static let migrations: [[String]] = [
        [
            """
            CREATE TABLE threads(id TEXT PRIMARY KEY, version INTEGER NOT NULL, instructions TEXT,
              tools TEXT NOT NULL, roots TEXT NOT NULL, turns INTEGER NOT NULL,
              created_at REAL NOT NULL, updated_at REAL NOT NULL, first_prompt TEXT NOT NULL, last_reply TEXT NOT NULL,
              input_tokens INTEGER, output_tokens INTEGER, reasoning_tokens INTEGER)
            """,
            "CREATE INDEX threads_by_update ON threads(updated_at)",
            """
            CREATE TABLE turns(thread_id TEXT NOT NULL, seq INTEGER NOT NULL, prompt TEXT NOT NULL,
              response TEXT NOT NULL, reasoning TEXT, tokens INTEGER NOT NULL, tool_exchanges TEXT,
              PRIMARY KEY(thread_id, seq))
            """,
            "CREATE TABLE clock(one INTEGER PRIMARY KEY CHECK(one = 1), now INTEGER NOT NULL)",
            "INSERT INTO clock VALUES(1, 0)",
            "CREATE TABLE imported(name TEXT PRIMARY KEY, at REAL NOT NULL)",
        ],
        ["ALTER TABLE turns ADD COLUMN structured INTEGER NOT NULL DEFAULT 0"],
        // Filled in Swift (`fillWords`): SQL has no way to tell a word as `SearchWords` does.
        ["ALTER TABLE turns ADD COLUMN words TEXT NOT NULL DEFAULT ''"],
    ]

    /// The full-text index, made with the schema where the library has FTS5 (and made again over
    /// `words` for a database from before version 3).
    static let fullText = [
        "DROP TRIGGER IF EXISTS turns_text_insert", "DROP TRIGGER IF EXISTS turns_text_delete",
        "DROP TABLE IF EXISTS turns_text",
        "CREATE VIRTUAL TABLE turns_text USING fts5(words, content='turns', content_rowid='rowid', tokenize='ascii')",
        """
        CREATE TRIGGER turns_text_insert AFTER INSERT ON turns BEGIN
          INSERT INTO turns_text(rowid, words) VALUES (new.rowid, new.words); END
        """,
        """
        CREATE TRIGGER turns_text_delete AFTER DELETE ON turns BEGIN
          INSERT INTO turns_text(turns_text, rowid, words) VALUES ('delete', old.rowid, old.words); END
        """,
        "INSERT INTO turns_text(turns_text) VALUES ('rebuild')",
    ]

    enum Opened { case ready(fullText: Bool), newer(Int) }

    /// Brings `db` to `version` in one transaction (another process may be doing the same: the
    /// version is read again once the write lock is held).
    static func prepare(_ db: SQLiteDatabase) throws(SQLiteError) -> Opened {
        try db.transaction { () throws(SQLiteError) -> Opened in
            var at = 0
            try db.query("PRAGMA user_version") { row in at = Int(row.int(0) ?? 0) }
            if at > version { return .newer(at) }
            let fts = at == 0 ? SQLiteDatabase.hasOption("ENABLE_FTS5") : try hasFullText(db)
            let from = at
            while at < version {
                for sql in migrations[at] { try db.execute(sql) }
                if at == 2 { try fillWords(db) }
                at += 1
            }
            if fts && from < 3 { for sql in fullText { try db.execute(sql) } }
            try db.execute("PRAGMA user_version = \(version)")
            return .ready(fullText: fts)
        }
    }

    private static func hasFullText(_ db: SQLiteDatabase) throws(SQLiteError) -> Bool {
        var found = false
        try db.query("SELECT 1 FROM sqlite_master WHERE name = 'turns_text'") { _ in found = true }
        return found
    }

    // MARK: listing and search

    /// A turn's `words`: `SearchWords` of its prompt and reply, each once, each between spaces
    /// (so that a word is found as " word " without the full-text index).
    static func words(_ prompt: String, _ response: String) -> String {
        var seen = Set<String>()
        let words = (SearchWords.of(prompt) + SearchWords.of(response)).filter { seen.insert($0).inserted }
        return words.isEmpty ? "" : " " + words.joined(separator: " ") + " "
    }

    /// Version 3's `words` for the turns stored before it.
    private static func fillWords(_ db: SQLiteDatabase) throws(SQLiteError) {
        var rows: [(Int64, String)] = []
        try db.query("SELECT rowid, prompt, response FROM turns") { r in
            rows.append((r.int(0) ?? 0, words(r.text(1) ?? "", r.text(2) ?? "")))
        }
        for (rowid, words) in rows {
            try db.query("UPDATE turns SET words = ? WHERE rowid = ?", [.text(words), .int(rowid)])
        }
    }

    /// Stored threads, most recently updated first, each with every word of `query` in some
    /// turn's `words`.
    static func summaries(_ db: SQLiteDatabase, fullText: Bool, query: ThreadQuery?,
                          limit: Int) throws(SQLiteError) -> [ThreadSummary] {
        // A word is quoted for FTS5 so that no query syntax is taken from it (a word holds no
        // quote: `SearchWords`); without the index it is looked for between spaces.
        let each = fullText
            ? "id IN (SELECT turns.thread_id FROM turns_text JOIN turns ON turns.rowid = turns_text.rowid "
                + "WHERE turns_text MATCH ?)"
            : "id IN (SELECT thread_id FROM turns WHERE instr(words, ?))"
        let words = query?.words.sorted() ?? []
        let conditions = ["id NOT LIKE '!%'"] + words.map { _ in each }
        let sql = "SELECT id, turns, created_at, updated_at, first_prompt, last_reply, "
            + "input_tokens, output_tokens, reasoning_tokens, instructions, version FROM threads "
            + "WHERE \(conditions.joined(separator: " AND ")) "
            + "ORDER BY updated_at DESC LIMIT \(max(0, limit))"
        let values = words.map { w in SQLiteValue.text(fullText ? "\"" + w + "\"" : " " + w + " ") }
        var out: [ThreadSummary] = []
        try db.query(sql, values) { r in
            out.append(ThreadSummary(id: r.text(0) ?? "", turns: Int(max(0, r.int(1) ?? 0)),
                                     createdAt: r.double(2) ?? 0, updatedAt: r.double(3) ?? 0,
                                     firstPrompt: r.text(4) ?? "", lastReply: r.text(5) ?? "",
                                     usage: usage(r, from: 6), instructions: r.text(9),
                                     version: r.int(10).map(StoreVersion.init)))
        }
        return out
    }

    static func usage(_ r: SQLiteRow, from at: Int32) -> Usage {
        func count(_ i: Int32) -> Int? { r.int(i).flatMap { $0 >= 0 ? Int($0) : nil } }
        return Usage(inputTokens: count(at), outputTokens: count(at + 1), reasoningTokens: count(at + 2))
    }

    // MARK: values in rows

    static func json(_ strings: [String]) -> String {
        var w = JSONWriter(capacity: 64)
        w.array(strings) { w, s in w.string(s) }
        return String(decoding: w.bytes, as: UTF8.self)
    }

    static func json(_ exchanges: [ToolExchange]) -> String? {
        guard !exchanges.isEmpty else { return nil }
        var w = JSONWriter(capacity: 256)
        w.array(exchanges) { w, e in e.write(to: &w) }
        return String(decoding: w.bytes, as: UTF8.self)
    }

    static func strings(_ text: String) throws(JSONError) -> [String] {
        try read(text) { r throws(JSONError) in try r.strings() }
    }

    static func exchanges(_ text: String?) throws(JSONError) -> [ToolExchange] {
        guard let text else { return [] }
        return try read(text) { r throws(JSONError) in
            try r.array { r throws(JSONError) in try ToolExchange.read(&r) }
        }
    }

    private static func read<T>(_ text: String,
                                _ body: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> T {
        var text = text
        let result: Result<T, JSONError> = text.withUTF8 { b in
            var r = JSONReader(UnsafeRawBufferPointer(b))
            return catching { () throws(JSONError) -> T in
                let value = try body(&r)
                try r.end()
                return value
            }
        }
        return try result.get()
    }
}
