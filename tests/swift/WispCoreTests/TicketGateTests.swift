// The FIFO ticket gate on its own: turns in the order tickets were taken, waiters that leave
// (cancelled, timed out) skipped, and a waiter that leaves as its turn is handed to it.
import Testing
import WispInfrastructure
@testable import WispCore

/// A test's waiters, all run on this actor: what one of its steps does (a cancel and a release,
/// say) is done before any waiter resumes, so the races below are staged, not hoped for.
private actor Line {
    let gate = TicketGate()
    private(set) var log: [String] = []
    private var holding = 0
    /// Waiters that have started waiting (heard their place in line).
    private let placed = Locked<Set<String>>([])

    func take(_ count: Int) throws -> [TicketGate.Ticket] {
        try (0..<count).map { _ in try gate.take(maxWaiting: 100) }
    }

    /// Waits for `ticket`'s turn; logs whether it ran or left, and releases the turn it got.
    func waiter(_ name: String, _ ticket: TicketGate.Ticket, deadline: Double? = nil) -> Task<Void, Never> {
        Task {
            do {
                try await gate.wait(for: ticket, deadline: deadline) { [placed] _ in
                    _ = placed.withLock { $0.insert(name) }
                }
            } catch {
                log.append("\(name) left: \(error)")
                return
            }
            holding += 1
            log.append("\(name) runs")
            // Another holder would run here.
            await Task.yield()
            if holding > 1 { log.append("\(name) ran beside another") }
            holding -= 1
            gate.release(ticket)
        }
    }

    func untilWaiting(_ names: Set<String>) async {
        while !placed.withLock({ names.isSubset(of: $0) }) { await Task.yield() }
    }

    /// In one step of this actor: `first` and `second` happen before any waiter resumes.
    func atOnce(_ first: @Sendable () -> Void, _ second: @Sendable () -> Void) {
        first()
        second()
    }
}

@Suite struct TicketGateTests {
    @Test func turnsGoInTheOrderTicketsWereTakenNotTheOrderTheyWait() async throws {
        let line = Line()
        let tickets = try await line.take(5)
        var tasks: [Task<Void, Never>] = []
        // Waiting in reverse: a gate that served waiters as they came would run w5 first.
        for (i, ticket) in tickets.enumerated().reversed() { tasks.append(await line.waiter("w\(i + 1)", ticket)) }
        await line.untilWaiting(["w1", "w2", "w3", "w4", "w5"])
        line.gate.release(TicketGate.first)
        for task in tasks { await task.value }
        #expect(await line.log == ["w1 runs", "w2 runs", "w3 runs", "w4 runs", "w5 runs"])
        #expect(line.gate.pending == 0)
    }

    @Test func aWaiterCancelledInTheMiddleIsSkippedAndNeverRuns() async throws {
        let line = Line()
        let t = try await line.take(3)
        let w1 = await line.waiter("w1", t[0]), w2 = await line.waiter("w2", t[1]), w3 = await line.waiter("w3", t[2])
        await line.untilWaiting(["w1", "w2", "w3"])
        w2.cancel()
        await w2.value
        #expect(line.gate.pending == 3, "the holder and w1, w3")
        line.gate.release(TicketGate.first)
        await w1.value
        await w3.value
        #expect(await line.log == ["w2 left: cancelled", "w1 runs", "w3 runs"])
        #expect(line.gate.pending == 0)
    }

    @Test func aWaiterCancelledBeforeItWaitsNeverRuns() async throws {
        let line = Line()
        let t = try await line.take(2)
        let w1 = await line.waiter("w1", t[0])
        w1.cancel()
        await w1.value
        let w2 = await line.waiter("w2", t[1])
        await line.untilWaiting(["w2"])
        line.gate.release(TicketGate.first)
        await w2.value
        #expect(await line.log == ["w1 left: cancelled", "w2 runs"])
        #expect(line.gate.pending == 0)
    }

    /// The race: a waiter leaves (cancelled, or its deadline's timer fires) in the same instant
    /// the holder hands it the turn. Whichever came first wins; the turn is neither lost nor
    /// given twice, and the line goes on.
    @Test(arguments: [TicketGate.Exit.cancelled, .timedOut])
    func aWaiterThatLeavesAsItsTurnComesEitherRunsOrLeaves(exit: TicketGate.Exit) async throws {
        for leavesFirst in [true, false] {
            let line = Line()
            let t = try await line.take(2)
            let w1 = await line.waiter("w1", t[0]), w2 = await line.waiter("w2", t[1])
            await line.untilWaiting(["w1", "w2"])
            let leave: @Sendable () -> Void = {
                if exit == .cancelled { w1.cancel() } else { line.gate.leave(t[0], because: .timedOut) }
            }
            let handOver: @Sendable () -> Void = { line.gate.release(TicketGate.first) }
            if leavesFirst { await line.atOnce(leave, handOver) } else { await line.atOnce(handOver, leave) }
            await w1.value
            await w2.value
            let expected = leavesFirst ? ["w1 left: \(exit)", "w2 runs"] : ["w1 runs", "w2 runs"]
            let log = await line.log
            #expect(log == expected, "w1 \(leavesFirst ? "left" : "got its turn") first")
            #expect(line.gate.pending == 0)
            // The line still moves: a new ticket's turn comes at once.
            let next = try line.gate.take(maxWaiting: 1)
            try await line.gate.wait(for: next)
            line.gate.release(next)
        }
    }

    @Test func aHolderWhoseDeadlinePassedStillHandsOver() async throws {
        let line = Line()
        // The holder's turn is its own whatever its deadline: it releases when its call ends.
        try await line.gate.wait(for: TicketGate.first, deadline: monotonicSeconds() - 1)
        let t = try await line.take(1)
        let w1 = await line.waiter("w1", t[0])
        await line.untilWaiting(["w1"])
        line.gate.release(TicketGate.first)
        await w1.value
        #expect(await line.log == ["w1 runs"])
    }

    @Test func aWaiterLeavesAtItsDeadlineAndTheNextGetsTheTurn() async throws {
        let line = Line()
        let t = try await line.take(3)
        let late = await line.waiter("late", t[0], deadline: monotonicSeconds() - 1)
        await late.value
        let w1 = await line.waiter("w1", t[1], deadline: monotonicSeconds() + 0.05)
        // A hostile deadline (no timer can be set so far ahead) waits like none.
        let w2 = await line.waiter("w2", t[2], deadline: .greatestFiniteMagnitude)
        // The holder keeps the turn until w1's deadline has ended its wait.
        await w1.value
        await line.untilWaiting(["w2"])
        line.gate.release(TicketGate.first)
        await w2.value
        #expect(await line.log == ["late left: timedOut", "w1 left: timedOut", "w2 runs"])
        #expect(line.gate.pending == 0)
    }

    @Test func aFullLineRefusesATicket() throws {
        let gate = TicketGate()
        _ = try gate.take(maxWaiting: 2)
        _ = try gate.take(maxWaiting: 2)
        #expect(throws: TicketGate.Full.self) { try gate.take(maxWaiting: 2) }
        #expect(gate.pending == 3)
    }

    @Test func aPlaceReportedLateIsDroppedOnceASmallerOneWasHeard() {
        // The report a waiter makes as it parks and the one a release makes just after are judged
        // under the line's lock but heard outside it, so they can cross: the stale one is larger.
        let heard = Locked<[Int]>([])
        let reporter = PlaceReporter { ahead in heard.withLock { $0.append(ahead) } }
        reporter.report(2)
        reporter.report(3)
        reporter.report(2)
        reporter.report(1)
        reporter.report(0)
        #expect(heard.withLock { $0 } == [2, 1, 0])
    }
}
