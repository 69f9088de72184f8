#if os(Linux)
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

/// Leases on a real server: one holder at a time, the other told `busy` after the wait, and the
/// lease freed when its holder's connection ends.
@Suite(.serialized, .enabled(if: PostgreSQLServer.absent == nil, "\(PostgreSQLServer.absent ?? "")"))
struct PostgreSQLLeaseTests {
    @Test func aHeldLeaseIsBusyForAnotherConnectionUntilItsHolderIsGone() throws {
        let server = try PostgreSQLServer()
        defer { server.stop() }
        let holder = try PostgreSQLConnection(server.url), other = try PostgreSQLConnection(server.url)
        defer { other.close() }
        #expect(try PostgreSQLLease.take("t1", on: holder) == .held)
        let started = ContinuousClock.now
        guard case .busy(let why) = try PostgreSQLLease.take("t1", on: other) else {
            Issue.record("a second connection took a held lease"); return
        }
        // The promised wait, with room: not given up early, not waiting for ever.
        let waited = ContinuousClock.now - started
        #expect(waited >= .milliseconds(1900) && waited < .seconds(10), "waited \(waited)")
        #expect(why.contains("t1") && why.contains("another wisp"))
        #expect(try PostgreSQLLease.take("t2", on: other) == .held)
        // The holder's connection ends without releasing (as a SIGKILLed replica's does).
        holder.close()
        #expect(try PostgreSQLLease.take("t1", on: other) == .held)
        #expect(try PostgreSQLLease.release("t1", on: other))
        #expect(try PostgreSQLLease.release("t1", on: other) == false)
    }
}
#endif
