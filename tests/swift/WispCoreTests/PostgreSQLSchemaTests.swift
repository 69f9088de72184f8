#if os(Linux)
import Testing
@testable import WispCore
import WispInfrastructure

/// The PostgreSQL store's schema on a real server: made once however many wisps start at once,
/// and a newer wisp's database refused.
@Suite(.serialized, .enabled(if: PostgreSQLServer.absent == nil, "\(PostgreSQLServer.absent ?? "")"))
struct PostgreSQLSchemaTests {
    @Test func replicasStartingAtOnceOnAnEmptyDatabaseAllComeUp() async throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let url = server.url
        let outcomes = await withTaskGroup(of: String.self) { group in
            for _ in 0..<4 {
                group.addTask {
                    do {
                        let db = try PostgreSQLConnection(url)
                        defer { db.close() }
                        return try PostgreSQLSchema.prepare(db) == .ready ? "ready" : "newer"
                    } catch { return "\(error)" }
                }
            }
            return await group.reduce(into: []) { $0.append($1) }
        }
        #expect(outcomes == ["ready", "ready", "ready", "ready"])
        let db = try PostgreSQLConnection(url)
        defer { db.close() }
        #expect(try db.query("SELECT version FROM wisp_schema") == [[String(PostgreSQLSchema.version)]])
    }

    @Test func aNewerWispsDatabaseIsRefused() throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let db = try PostgreSQLConnection(server.url)
        defer { db.close() }
        #expect(try PostgreSQLSchema.prepare(db) == .ready)
        try db.query("UPDATE wisp_schema SET version = $1", [String(PostgreSQLSchema.version + 1)])
        #expect(try PostgreSQLSchema.prepare(db) == .newer(PostgreSQLSchema.version + 1))
        #expect(PostgreSQLSchema.newerRefusal("postgresql://u:***@h/db", 2).contains("newer wisp"))
        // Nothing was half-done: the tables are as the first preparation left them.
        #expect(try db.query("SELECT count(*) FROM threads") == [["0"]])
    }
}
#endif
