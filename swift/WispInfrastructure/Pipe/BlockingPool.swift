import Dispatch
#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

/// Whose blocking work a job is, for `BlockingPool`'s fairness: set for a call's task with
/// `BlockingPool.$owner.withValue`.
public enum BlockingOwner: Hashable, Sendable {
    /// Work of no conversation thread (a status report, a test).
    case none
    /// A call's work, by its conversation thread.
    case thread(String)
    /// The pipe's dispatcher, which reads every request in order: it never waits behind calls'
    /// work (every request, cancels included, would wait with it), and it runs one job at a time.
    case dispatcher
}

/// The OS threads that run blocking work (disk, fsync, model tools, file reads) for the core:
/// a bounded pool of its own, so that such work neither holds the pipe loop nor takes the
/// cooperative pool's threads (as many as cores) from everything else.
///
/// Fair across conversation threads: a job is admitted only while fewer than `workers` run and
/// its owner runs fewer than `perOwner`, so one thread's tool walks never occupy every worker;
/// waiting jobs are admitted by owner in turn (round robin), in order within an owner. A job
/// whose task is cancelled (its call ended: a cancel, its time limit) while it waits is dropped,
/// so the call answers at once, however busy the workers are.
///
/// An admitted job's work runs with this pool as its task executor; work it starts off the
/// pool again (`offPipeLoop` inside `offPipeLoop`) is part of the same job and is not queued.
public final class BlockingPool: TaskExecutor, Sendable {
    /// The core's pool. Sixteen workers: eight threads' tool walks, each using its whole time
    /// limit, and a stalled mount or two still leave room for other threads' file reads and
    /// stores (the OS shares the cores between them), while the whole stays a few OS threads.
    public static let shared = BlockingPool(workers: 16, perOwner: 4)

    @TaskLocal public static var owner = BlockingOwner.none
    /// Set inside an admitted job's work.
    @TaskLocal static var admitted = false

    public let workers: Int
    public let perOwner: Int

    private struct Waiter {
        let ticket: UInt64
        let continuation: CheckedContinuation<Bool, Never>
    }

    private struct State {
        /// Jobs ready to run on the pool's threads, first in first out.
        var jobs: [UnownedJob] = []
        var head = 0
        var threadsStarted = false
        /// Admission: jobs running (`.dispatcher`'s not counted), by owner too.
        var running = 0
        var byOwner: [BlockingOwner: Int] = [:]
        var waiting: [BlockingOwner: [Waiter]] = [:]
        /// Owners with waiting jobs, in the order their turns come.
        var turns: [BlockingOwner] = []
        var nextTicket: UInt64 = 0
    }

    private let state = Locked(State())
    /// One signal per job enqueued; the pool's threads wait on it.
    private let ready = DispatchSemaphore(value: 0)

    public init(workers: Int, perOwner: Int) {
        self.workers = max(1, workers)
        self.perOwner = min(max(1, perOwner), max(1, workers))
    }

    /// Runs `work` on the pool, its turn taken as `owner`'s (default `BlockingPool.owner`). With
    /// `dropped`, work still waiting for its turn when its task is cancelled never runs: `dropped` is thrown.
    public func run<T: Sendable, E: Error>(as owner: BlockingOwner? = nil, ifDropped dropped: E? = nil,
                                           _ work: @Sendable () async throws(E) -> T) async throws(E) -> T {
        if Self.admitted {
            return try await work()
        }
        let owner = owner ?? Self.owner
        if await !admit(owner, droppable: dropped != nil), let dropped { throw dropped }
        defer { release(owner) }
        let result = await Self.$admitted.withValue(true) {
            await withTaskExecutorPreference(self, isolation: nil) { () async -> Result<T, E> in
                do throws(E) { return .success(try await work()) } catch { return .failure(error) }
            }
        }
        return try result.get()
    }

    /// Jobs of each owner running now, and owners waiting: for tests.
    public var load: (running: [BlockingOwner: Int], waiting: [BlockingOwner: Int]) {
        state.withLock { s in (s.byOwner, s.waiting.mapValues(\.count)) }
    }

    // MARK: admission

    private func admit(_ owner: BlockingOwner, droppable: Bool) async -> Bool {
        let ticket = state.withLock { s in
            s.nextTicket += 1
            return s.nextTicket
        }
        let wait = {
            await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
                let now = self.state.withLock { s -> Bool? in
                    if droppable && Task.isCancelled { return false }
                    if self.mayRun(owner, s), s.waiting[owner] == nil {
                        Self.start(owner, &s)
                        return true
                    }
                    s.waiting[owner, default: []].append(Waiter(ticket: ticket, continuation: c))
                    if !s.turns.contains(owner) { s.turns.append(owner) }
                    return nil
                }
                if let now { c.resume(returning: now) }
            }
        }
        guard droppable else { return await wait() }
        return await withTaskCancellationHandler(operation: wait) {
            let dropped = self.state.withLock { s -> CheckedContinuation<Bool, Never>? in
                guard let k = s.waiting[owner]?.firstIndex(where: { $0.ticket == ticket }) else { return nil }
                let c = s.waiting[owner]?.remove(at: k).continuation
                if s.waiting[owner]?.isEmpty == true {
                    s.waiting[owner] = nil
                    s.turns.removeAll { $0 == owner }
                }
                return c
            }
            dropped?.resume(returning: false)
        }
    }

    private func mayRun(_ owner: BlockingOwner, _ s: State) -> Bool {
        if owner == .dispatcher { return true }
        return s.running < workers && s.byOwner[owner, default: 0] < perOwner
    }

    private static func start(_ owner: BlockingOwner, _ s: inout State) {
        if owner != .dispatcher { s.running += 1 }
        s.byOwner[owner, default: 0] += 1
    }

    private func release(_ owner: BlockingOwner) {
        let next = state.withLock { s -> [CheckedContinuation<Bool, Never>] in
            if owner != .dispatcher { s.running -= 1 }
            s.byOwner[owner, default: 1] -= 1
            if s.byOwner[owner] == 0 { s.byOwner[owner] = nil }
            var admitted: [CheckedContinuation<Bool, Never>] = []
            // The first owner in turn that may run goes next, then to the back of the line.
            while let k = s.turns.firstIndex(where: { mayRun($0, s) }) {
                let turn = s.turns.remove(at: k)
                guard var line = s.waiting[turn], !line.isEmpty else { s.waiting[turn] = nil; continue }
                admitted.append(line.removeFirst().continuation)
                Self.start(turn, &s)
                if line.isEmpty {
                    s.waiting[turn] = nil
                } else {
                    s.waiting[turn] = line
                    s.turns.append(turn)
                }
            }
            return admitted
        }
        for c in next { c.resume(returning: true) }
    }

    // MARK: the executor

    public func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let first = state.withLock { s -> Bool in
            s.jobs.append(unowned)
            defer { s.threadsStarted = true }
            return !s.threadsStarted
        }
        // All at first use: the workers and one for the dispatcher's job, each running at most one
        // admitted job at a time (plus the short hops of its task), so no job waits for a thread.
        if first {
            for _ in 0...workers { OSThread.detach { self.serve() } }
        }
        ready.signal()
    }

    /// A pool thread, for good: runs jobs as they come.
    private func serve() {
        let me = asUnownedTaskExecutor()
        while true {
            ready.wait()
            let job = state.withLock { s -> UnownedJob in
                let job = s.jobs[s.head]
                s.head += 1
                if s.head > 1024, s.head * 2 > s.jobs.count {
                    s.jobs.removeFirst(s.head)
                    s.head = 0
                }
                return job
            }
            job.runSynchronously(on: me)
        }
    }
}

/// Runs `work` on the core's `BlockingPool` rather than the pipe loop (see `PipeLoop`): for
/// anything that can block, such as a file read, an fsync or a model tool. `work` is
/// nonisolated on purpose: work isolated to an actor would stay where that actor runs (the pipe
/// loop, for a conversation thread's actor), whatever executor the task prefers.
///
/// Its turn is `owner`'s, by default `BlockingPool.owner`'s. With `dropped`, work still waiting for a worker when the
/// calling task is cancelled (its call ended) is dropped, and `dropped` thrown: a call stops on
/// time however busy the pool is. Without it, the work always runs (a lock's release, a store
/// after the commit).
public func offPipeLoop<T: Sendable, E: Error>(as owner: BlockingOwner? = nil, ifDropped dropped: E? = nil,
                                               _ work: @Sendable () async throws(E) -> T) async throws(E) -> T {
    try await BlockingPool.shared.run(as: owner, ifDropped: dropped, work)
}
