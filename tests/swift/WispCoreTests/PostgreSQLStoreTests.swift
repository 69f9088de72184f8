#if os(Linux)
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

/// The PostgreSQL store's own promises beyond the contract (StoreContractTests), on a real server:
/// two stores on one database are two replicas.
@Suite(.serialized, .enabled(if: PostgreSQLServer.absent == nil, "\(PostgreSQLServer.absent ?? "")"))
struct PostgreSQLStoreTests {
    static let password = "pw-never-shown-4d1"

    private func store(_ url: String, max: Int = 1000) throws -> PostgreSQLThreadStore {
        PostgreSQLThreadStore(url: try StoreURL(url), maxStored: max, log: Log(level: .error))
    }

    private func thread(_ prompts: String...) -> StoredThread {
        StoredThread(instructions: nil, tools: [], roots: [],
                     history: prompts.map { Turn(prompt: $0, response: "ok", tokens: 1) })
    }

    @Test func aLeaseHeldByAnotherReplicaIsBusyAfterItsWaitNamingTheCause() async throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let one = try store(server.url), two = try store(server.url)
        let held = try await one.lease("t")
        let started = ContinuousClock.now
        await #expect { _ = try await two.lease("t") } throws: { error in
            let e = error as? WispError
            return e?.code == .busy && e?.message.contains("thread t") == true && e?.message.contains("another wisp") == true
        }
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(1900) && waited < .seconds(10), "waited \(waited)")
        await held.release()
        let after = try await two.lease("t")
        await after.release()
    }

    @Test func aNewerWispsDatabaseFailsEveryCallClosedSayingSo() async throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let first = try store(server.url)
        let lease = try await first.lease("t")
        _ = try await lease.commit(thread("one"), kept: 0, after: nil, usage: Usage())
        await lease.release()
        let db = try PostgreSQLConnection(server.url)
        try db.query("UPDATE wisp_schema SET version = $1", [String(PostgreSQLSchema.version + 1)])
        db.close()
        let later = try store(server.url)  // a replica started after a newer wisp migrated
        #expect(later.trouble?.contains("newer wisp") == true, "\(later.trouble ?? "nil")")
        // What it says of itself: the schema the database is at, and that it is a newer wisp's.
        #expect(first.about.schema == PostgreSQLSchema.version && first.about.note == nil)
        #expect(later.about.schema == PostgreSQLSchema.version + 1 && later.about.version == first.about.version)
        #expect(later.about.text.contains("newer wisp"), "\(later.about.text)")
        await #expect { _ = try await later.lease("t") } throws: { error in
            let e = error as? WispError
            return e?.code == .storeUnavailable && e?.message.contains("newer wisp") == true
        }
        await #expect { _ = try await later.read("t") } throws: { error in
            (error as? WispError)?.code == .storeUnavailable
        }
    }

    @Test func aCommitPastItsDeadlineAndATextPostgreSQLCannotHoldAreKeptNowhere() async throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let s = try store(server.url)
        let lease = try await s.lease("t")
        let v = try await lease.commit(thread("one"), kept: 0, after: nil, usage: Usage())
        await #expect(throws: WispError.commitPastDeadline) {
            _ = try await lease.commit(thread("one", "two"), kept: 1, after: v, usage: Usage(),
                                       by: monotonicSeconds() + 0.01)
        }
        await #expect { _ = try await lease.commit(thread("one", "a\u{0}b"), kept: 1, after: v, usage: Usage()) }
            throws: { error in
                let e = error as? WispError
                return e?.code == .storeUnavailable && e?.message.contains("NUL") == true
            }
        await lease.release()
        #expect(try await s.read("t") == .loaded(thread("one"), v))
    }

    @Test func anUnreachableDatabaseFailsClosedNamingItButNotItsPassword() async throws {
        let server = try PostgreSQLServer()
        let url = server.url.replacingOccurrences(of: "wisp@", with: "wisp:\(Self.password)@")
        server.stop()
        let s = try store(url)
        #expect(s.trouble != nil)
        await #expect { _ = try await s.lease("t") } throws: { error in
            let e = error as? WispError
            return e?.code == .storeUnavailable && e?.message.contains(server.root) == true
                && e?.message.contains(Self.password) == false
        }
        #expect(await s.summaries(matching: nil, limit: 10).isEmpty)
        #expect(!s.location.contains(Self.password) && !(s.trouble ?? "").contains(Self.password))
    }

    @Test func theCapHoldsAcrossReplicasAddingThreadsAtOnce() async throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let replicas = try (0..<3).map { _ in try store(server.url, max: 5) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (r, s) in replicas.enumerated() {
                group.addTask {
                    for i in 0..<6 {
                        let lease = try await s.lease("r\(r)-\(i)")
                        _ = try await lease.commit(self.thread("p"), kept: 0, after: nil, usage: Usage())
                        await lease.release()
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(await replicas[0].summaries(matching: nil, limit: 100).count == 5)
    }
}
#endif
