#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The core's pipe loop: the one OS thread that reads stdin and runs the work of the requests
/// it reads, as the task executor that the dispatcher and every call prefer
/// (`Task(executorPreference:)`).
///
/// Why one OS thread: a request used to cross three before its reply was written (a blocking
/// reader, the dispatcher on the cooperative pool, then the call's task on another of the pool's
/// OS threads). Each crossing wakes a sleeping OS thread, and on a 2-vCPU VM that costs more
/// than everything the core computes for an echo reply. Here the loop that read a frame runs
/// the dispatcher and the call on to the reply's `write` before it sleeps again; a job that
/// another OS thread enqueues (a timer, a model server's bytes) wakes it through a pipe.
///
/// Work that may block (disk, fsync, model tools) must not run here: it would hold every
/// other call and the reading of cancels. `offPipeLoop` sends it to the `BlockingPool`.
public final class PipeLoop: TaskExecutor, Sendable {
    private struct State {
        var jobs: [UnownedJob] = []
        /// The loop is in (or about to enter) `poll` with nothing to run.
        var sleeping = false
        /// A wake-up byte is on its way since the loop last woke.
        var signalled = false
    }

    private let state = Locked(State())
    /// Polled beside the input: a byte means "jobs waiting".
    private let wakeUp = WakeUpPipe(for: "the pipe loop")

    /// Batches of jobs run between two looks at the input while jobs keep coming.
    private static let maxRounds = 64

    public init() {}

    public func enqueue(_ job: consuming ExecutorJob) {
        let unowned = UnownedJob(job)
        let wake = state.withLock { s -> Bool in
            s.jobs.append(unowned)
            guard s.sleeping, !s.signalled else { return false }
            s.signalled = true
            return true
        }
        if wake { wakeUp.wake() }
    }

    /// Runs the loop on the calling OS thread, for good: reads `input` whenever it has bytes and
    /// hands them to `onInput` (an empty buffer once at end of input; the loop then goes on
    /// running jobs), and runs every job enqueued, in order.
    public func run(input: Int32, onInput: (UnsafeRawBufferPointer) -> Void) -> Never {
        let me = asUnownedTaskExecutor()
        var batch: [UnownedJob] = []
        var buffer = [UInt8](repeating: 0, count: 1 << 16)
        var inputOpen = true
        while true {
            // Jobs beget jobs (every actor hop is one), so run until none is left before
            // looking at the input; after `maxRounds` batches it is looked at anyway.
            for _ in 0..<Self.maxRounds {
                state.withLock { swap(&$0.jobs, &batch) }
                if batch.isEmpty { break }
                for job in batch { job.runSynchronously(on: me) }
                batch.removeAll(keepingCapacity: true)
            }

            let idle = state.withLock { s -> Bool in
                s.sleeping = s.jobs.isEmpty
                return s.sleeping
            }
            // With jobs waiting the poll only looks (timeout 0), so a stream of jobs cannot starve input.
            var fds = [pollfd(fd: wakeUp.readEnd, events: Int16(POLLIN), revents: 0),
                       pollfd(fd: inputOpen ? input : -1, events: Int16(POLLIN), revents: 0)]
            let ready = poll(&fds, 2, idle ? -1 : 0)
            if idle {
                state.withLock { s in
                    s.sleeping = false
                    s.signalled = false
                }
            }
            guard ready > 0 else { continue }
            if fds[0].revents != 0 { wakeUp.drain() }
            if fds[1].revents != 0 {
                let n = buffer.withUnsafeMutableBytes { read(input, $0.baseAddress!, $0.count) }
                if n < 0 && (errno == EINTR || errno == EAGAIN) { continue }
                if n <= 0 {
                    inputOpen = false
                    onInput(UnsafeRawBufferPointer(start: nil, count: 0))
                } else {
                    buffer.withUnsafeBytes { onInput(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                }
            }
        }
    }
}

/// A pipe that wakes an OS thread asleep in `poll` on its read end: a byte means "look again".
/// Both ends are non-blocking and closed on exec.
public struct WakeUpPipe: Sendable {
    public let readEnd: Int32
    private let writeEnd: Int32

    /// `owner` names, in the fatal error, what could not get its pipe.
    public init(for owner: String) {
        var fds: [Int32] = [-1, -1]
        guard pipe(&fds) == 0 else { fatalError("wisp-core: cannot create \(owner)'s wake-up pipe: errno \(errno)") }
        for fd in fds {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        }
        readEnd = fds[0]
        writeEnd = fds[1]
    }

    public func wake() {
        var byte: UInt8 = 1
        // A full pipe already holds a wake-up, so EAGAIN loses nothing.
        _ = write(writeEnd, &byte, 1)
    }

    /// Empties the pipe, once the poll has seen it readable.
    public func drain() {
        // On the stack: the pipe loop drains on every wake-up.
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 64) { sink in
            while read(readEnd, sink.baseAddress!, sink.count) > 0 {}
        }
    }
}

/// Work on a text up to this many bytes (encoding a reply, checking one) stays on the pipe loop:
/// less than a hop to the pool costs.
public let onPipeLoopBytes = 64 * 1024
