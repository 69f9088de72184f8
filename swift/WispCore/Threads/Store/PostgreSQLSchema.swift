#if os(Linux)
import WispInfrastructure

/// The PostgreSQL store's schema (`--store`), the SQLite store's (`StoreSchema`) in PostgreSQL's
/// words: `threads` and `turns` as there, `wisp_clock` the versions' source, and `wisp_schema`
/// the one row that says which version the database is at (a newer one is a newer wisp's).
///
/// Several wisps may start at once on an empty database: each prepares it in one transaction that
/// first takes a transaction-scoped advisory lock (`lockKey`), so one creates the schema and the
/// others, waiting for it, find it made (CREATE … IF NOT EXISTS alone races in the catalogue).
enum PostgreSQLSchema {
    static let version = 1
    /// The advisory lock the schema's preparation is serialised by: a constant no lease uses
    /// (leases lock keys of the two-integer form).
    static let lockKey = 0x7769_7370_0000_0001  // "wisp", 1

    static let tables = [
        "CREATE TABLE IF NOT EXISTS wisp_schema(one integer PRIMARY KEY CHECK (one = 1), version integer NOT NULL)",
        """
        CREATE TABLE IF NOT EXISTS threads(id text PRIMARY KEY, version bigint NOT NULL, instructions text,
          tools text NOT NULL, roots text NOT NULL, turns integer NOT NULL,
          created_at double precision NOT NULL, updated_at double precision NOT NULL,
          first_prompt text NOT NULL, last_reply text NOT NULL,
          input_tokens bigint, output_tokens bigint, reasoning_tokens bigint)
        """,
        "CREATE INDEX IF NOT EXISTS threads_by_update ON threads(updated_at)",
        """
        CREATE TABLE IF NOT EXISTS turns(thread_id text NOT NULL REFERENCES threads(id) ON DELETE CASCADE
            ON UPDATE CASCADE DEFERRABLE INITIALLY DEFERRED,
          seq integer NOT NULL, prompt text NOT NULL, response text NOT NULL, reasoning text,
          tokens bigint NOT NULL, tool_exchanges text, structured boolean NOT NULL DEFAULT false,
          words text NOT NULL DEFAULT '', PRIMARY KEY (thread_id, seq))
        """,
        // Search: each turn's `words` (`StoreSchema.words`, the SQLite store's) as lexemes taken
        // whole, no text-search parser between: the index finds exactly the words `SearchWords` found.
        "CREATE INDEX IF NOT EXISTS turns_text ON turns USING gin ((\(lexemes)))",
        "CREATE SEQUENCE IF NOT EXISTS wisp_clock",
    ]

    /// A turn's `words` as a `tsvector`, one lexeme per word (the index's expression, and search's).
    static let lexemes = "array_to_tsvector(string_to_array(btrim(words), ' '))"

    enum Prepared: Equatable { case ready, newer(Int) }

    /// Brings the database to `version` in one transaction, or finds a newer wisp's. It runs on a
    /// bare connection, before any store has one, so it takes the connection's own transaction;
    /// a newer wisp's database is found before anything is written, and that transaction commits
    /// nothing (`wisp_schema` is there already).
    static func prepare(_ db: PostgreSQLConnection) throws(PostgreSQLError) -> Prepared {
        try db.transaction { _ throws(PostgreSQLError) -> Prepared in
            try db.query("SELECT pg_advisory_xact_lock($1)", [String(lockKey)])
            try db.query(tables[0])
            let at = try db.query("SELECT version FROM wisp_schema").first.flatMap { $0.first ?? nil }.flatMap { Int($0) } ?? 0
            if at > version { return .newer(at) }
            if at < version {
                for sql in tables.dropFirst() { try db.query(sql) }
                try db.query("INSERT INTO wisp_schema VALUES (1, $1) ON CONFLICT (one) DO UPDATE SET version = $1",
                             [String(version)])
            }
            return .ready
        }
    }

    /// What a newer wisp's database is refused with.
    static func newerRefusal(_ shown: String, _ found: Int) -> String {
        "database \(shown) holds threads of a newer wisp (schema \(found); this wisp reads up to \(version)): "
            + "use that wisp, or another database"
    }
}
#endif
