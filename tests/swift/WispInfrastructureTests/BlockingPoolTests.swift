// The blocking pool (Pipe/BlockingPool.swift): one owner never takes every worker, waiting
// owners take turns, a job whose task is cancelled while it waits is dropped (and one that may
// not be dropped runs anyway), the dispatcher never waits, and work inside work is not queued.
// Order is proven by gates and recorded sequences; a clock only bounds how long a broken pool
// may keep a test waiting.
import Dispatch
import Foundation
import Testing
@testable import WispInfrastructure

@Suite struct BlockingPoolTests {
    /// Jobs that block until `open`: a gate a pool's OS thread waits at (not the cooperative
    /// pool's), opened at the latest after `failAfter`, so a broken pool fails rather than hangs.
    final class Gate: Sendable {
        private let semaphore = DispatchSemaphore(value: 0)
        private let opened = Locked(false)
        let entered = Locked(0)

        init(failAfter: Double = 20) {
            DispatchQueue.global().asyncAfter(deadline: .now() + failAfter) { [self] in open() }
        }

        func pass() {
            entered.withLock { $0 += 1 }
            semaphore.wait()
            semaphore.signal()
        }

        func open() {
            let first = opened.withLock { o -> Bool in
                defer { o = true }
                return !o
            }
            if first { semaphore.signal() }
        }

        var isOpen: Bool { opened.withLock { $0 } }

        func waitUntilEntered(_ n: Int) async {
            while entered.withLock({ $0 }) < n, !isOpen { try? await Task.sleep(for: .milliseconds(1)) }
        }
    }

    struct Dropped: Error {}

    /// Waits (yielding) until `check` holds of the pool's load, or a gate's failure time passed.
    func until(_ pool: BlockingPool, _ gate: Gate,
               _ check: ((running: [BlockingOwner: Int], waiting: [BlockingOwner: Int])) -> Bool) async {
        while !check(pool.load), !gate.isOpen { try? await Task.sleep(for: .milliseconds(1)) }
    }

    @Test func oneOwnerNeverTakesEveryWorker() async {
        let pool = BlockingPool(workers: 3, perOwner: 2)
        let gate = Gate()
        let a = BlockingOwner.thread("a")
        let busy = (0..<3).map { _ in Task { await pool.run(as: a) { gate.pass() } } }
        await gate.waitUntilEntered(2)
        await until(pool, gate) { $0.waiting[a] == 1 }
        #expect(pool.load.running[a] == 2, "an owner runs at most perOwner jobs")
        // Another thread's job runs at once, on the worker the first one may not take.
        let other = await pool.run(as: .thread("b")) { gate.isOpen }
        #expect(!other, "the other thread's job waited for the first thread's jobs")
        gate.open()
        for t in busy { await t.value }
        #expect(gate.entered.withLock { $0 } == 3)
    }

    @Test func waitingOwnersTakeTurns() async {
        let pool = BlockingPool(workers: 1, perOwner: 1)
        let gate = Gate()
        let order = Locked<[String]>([])
        let holder = Task { await pool.run(as: .thread("x")) { gate.pass() } }
        await gate.waitUntilEntered(1)
        var queued: [Task<Void, Never>] = []
        for (name, owner) in [("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b")] {
            let before = pool.load.waiting.values.reduce(0, +)
            queued.append(Task { await pool.run(as: .thread(owner)) { order.withLock { $0.append(name) } } })
            await until(pool, gate) { $0.waiting.values.reduce(0, +) == before + 1 }
        }
        gate.open()
        await holder.value
        for t in queued { await t.value }
        #expect(order.withLock { $0 } == ["a1", "b1", "a2", "a3"], "first come first served would be a1 a2 a3 b1")
    }

    @Test func aJobWhoseTaskIsCancelledWhileItWaitsIsDropped() async {
        let pool = BlockingPool(workers: 1, perOwner: 1)
        let gate = Gate()
        let ran = Locked(false)
        let holder = Task { await pool.run(as: .thread("x")) { gate.pass() } }
        await gate.waitUntilEntered(1)
        let late = Task { () -> Bool in
            do throws(Dropped) {
                try await pool.run(as: .thread("late"), ifDropped: Dropped()) { () throws(Dropped) in ran.withLock { $0 = true } }
                return false
            } catch {
                return true
            }
        }
        await until(pool, gate) { $0.waiting[.thread("late")] == 1 }
        late.cancel()
        let dropped = await late.value
        #expect(dropped, "a dropped job throws what the caller gave")
        #expect(!gate.isOpen, "the caller heard while every worker was still busy")
        #expect(pool.load.waiting.isEmpty, "the job left the queue")
        gate.open()
        await holder.value
        _ = await pool.run(as: .thread("after")) { 0 }  // the worker has moved on past where the job was
        #expect(!ran.withLock { $0 }, "a dropped job never runs")
    }

    @Test func workThatMayNotBeDroppedRunsThoughItsTaskWasCancelled() async {
        let pool = BlockingPool(workers: 1, perOwner: 1)
        let gate = Gate()
        let holder = Task { await pool.run(as: .thread("x")) { gate.pass() } }
        await gate.waitUntilEntered(1)
        let release = Task { await pool.run(as: .thread("y")) { "released" } }
        await until(pool, gate) { $0.waiting[.thread("y")] == 1 }
        release.cancel()
        gate.open()
        await holder.value
        #expect(await release.value == "released")
    }

    @Test func theDispatcherNeverWaitsBehindCalls() async {
        let pool = BlockingPool(workers: 1, perOwner: 1)
        let gate = Gate()
        let holder = Task { await pool.run(as: .thread("x")) { gate.pass() } }
        await gate.waitUntilEntered(1)
        let whileBusy = await pool.run(as: .dispatcher) { !gate.isOpen }
        #expect(whileBusy)
        gate.open()
        await holder.value
    }

    @Test func workInsideWorkIsPartOfTheSameJob() async {
        let pool = BlockingPool(workers: 1, perOwner: 1)
        let inner = await pool.run(as: .thread("x")) { await pool.run(as: .thread("x")) { 7 } }
        #expect(inner == 7, "the inner work would wait for the worker its own job holds")
    }
}
