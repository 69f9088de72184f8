// The core's pipe loop (Pipe/PipeLoop.swift): input and the tasks that prefer it run on its
// one OS thread, a job enqueued from elsewhere while it sleeps wakes it, and `offPipeLoop` leaves it.
import Foundation
import Testing
@testable import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The calling OS thread (a synchronous function: `Thread.current` is not for async code, where
/// the OS thread may change at any await; here it is read between two).
func currentOSThread() -> ObjectIdentifier { ObjectIdentifier(Thread.current) }

@Suite struct PipeLoopTests {
    struct Seen: Sendable {
        var bytes: [UInt8] = []
        var eof = false
        var osThread: ObjectIdentifier?
    }

    /// A loop on an OS thread of its own reading a fresh pipe (it runs for the rest of the process).
    func startLoop() -> (PipeLoop, input: Int32, seen: Locked<Seen>) {
        let loop = PipeLoop()
        var fds: [Int32] = [-1, -1]
        precondition(pipe(&fds) == 0)
        let seen = Locked(Seen())
        let read = fds[0]
        Thread.detachNewThread {
            loop.run(input: read) { bytes in
                seen.withLock { s in
                    s.osThread = currentOSThread()
                    if bytes.isEmpty { s.eof = true } else { s.bytes += bytes }
                }
            }
        }
        return (loop, fds[1], seen)
    }

    @Test func inputAndTheTasksThatPreferTheLoopRunOnItsOSThread() async throws {
        let (loop, input, seen) = startLoop()
        #expect(write(input, "abc", 3) == 3)
        // The loop is asleep in poll by now: this task's first job comes from another OS thread.
        try await Task.sleep(for: .milliseconds(20))
        let ran = await Task(executorPreference: loop) { currentOSThread() }.value
        let away = await Task(executorPreference: loop) { await offPipeLoop { currentOSThread() } }.value
        #expect(write(input, "de", 2) == 2)
        close(input)
        for _ in 0..<400 where !seen.withLock({ $0.eof }) { try await Task.sleep(for: .milliseconds(5)) }
        let s = seen.withLock { $0 }
        #expect(s.eof, "end of input reaches onInput")
        #expect(s.bytes == Array("abcde".utf8))
        #expect(s.osThread == ran, "a task preferring the loop runs on the OS thread that reads the input")
        #expect(away != ran, "offPipeLoop runs its work on another OS thread")
    }

    actor Isolated {
        /// The OS thread this actor runs on, and the one its `offPipeLoop` work ran on.
        func osThreads() async -> (ObjectIdentifier, ObjectIdentifier) {
            let here = currentOSThread()
            let there = await offPipeLoop { currentOSThread() }
            return (here, there)
        }
    }

    @Test func offPipeFromAnActorLeavesTheLoop() async throws {
        let (loop, _, _) = startLoop()
        let actor = Isolated()
        let loopOSThread = await Task(executorPreference: loop) { currentOSThread() }.value
        let (here, there) = await Task(executorPreference: loop) { await actor.osThreads() }.value
        #expect(here == loopOSThread, "the actor runs on the loop its caller prefers")
        #expect(there != loopOSThread, "the blocking work does not")
    }

    @Test func aStreamOfJobsDoesNotStarveTheInput() async throws {
        let (loop, input, seen) = startLoop()
        let running = DispatchSemaphore(value: 0)
        // A task that keeps the loop's queue full (it yields, never sleeps) until the input is
        // read; its time bound is for a failing test only.
        let busy = Task(executorPreference: loop) { () -> Bool in
            running.signal()
            let cap = ContinuousClock.now.advanced(by: .seconds(60))
            while ContinuousClock.now < cap {
                if !seen.withLock({ $0.bytes.isEmpty }) { return true }
                await Task.yield()
            }
            return false
        }
        // Written once the jobs are coming, from an OS thread of its own (no pool thread needed).
        Thread.detachNewThread {
            running.wait()
            _ = write(input, "x", 1)
        }
        #expect(await busy.value, "the input was read while jobs kept coming")
        close(input)
    }
}
