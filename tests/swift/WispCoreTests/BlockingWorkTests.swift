// A call's blocking work behind a busy pool: its time limit holds (README: "Each `respond` call
// has a time limit ... which holds whatever the core does"), and the pool's workers are taken by
// other threads' jobs that block until the test lets them go. The clock is read only for the
// README's promise, with room.
import Dispatch
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

extension WholePool {
@Suite(.serialized) struct BlockingWork {
    /// Jobs that block one of the pool's OS threads until `open` (or, for a broken pool, until
    /// `failAfter` has passed, so that the test fails rather than hangs).
    final class Hold: Sendable {
        private let semaphore = DispatchSemaphore(value: 0)
        private let state = Locked((entered: 0, open: false))

        init(failAfter: Double = 20) {
            DispatchQueue.global().asyncAfter(deadline: .now() + failAfter) { [self] in open() }
        }

        func pass() {
            state.withLock { $0.entered += 1 }
            semaphore.wait()
            semaphore.signal()
        }

        func open() {
            let first = state.withLock { s -> Bool in
                defer { s.open = true }
                return !s.open
            }
            if first { semaphore.signal() }
        }

        var entered: Int { state.withLock { $0.entered } }
        var isOpen: Bool { state.withLock { $0.open } }
    }

    @Test func aCallWithFilesAnswersTimeoutOnTimeBehindEveryWorkerBusy() async throws {
        let base = NSTemporaryDirectory() + "wisp-busy-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: base, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: base) }
        try "one small line\n".write(toFile: base + "/small.txt", atomically: true, encoding: .utf8)

        // Every worker busy with another thread's job (eight search_text walks using their whole limit).
        let hold = Hold()
        let pool = BlockingPool.shared
        let busy = (0..<pool.workers).map { i in Task { await offPipeLoop(as: .thread("busy-\(i)")) { hold.pass() } } }
        while hold.entered < pool.workers, !hold.isOpen { try await Task.sleep(for: .milliseconds(2)) }

        let backend = EchoBackend()
        let wire = Wire()
        let server = PipeServer(registry: ThreadRegistry(backend: backend, fileRoots: Roots([base])), backend: backend,
                                log: Log(level: .error)) { wire.send($0) }
        let limit = 0.5
        let clock = ContinuousClock()
        let start = clock.now
        await server.handle(Respond(id: 1, prompt: "read it", thread_id: "durable",
                                             options: RespondOptions(timeout_s: limit), files: ["small.txt"]))
        let reply = await wire.reply(1, within: .seconds(30))
        let took = seconds(clock.now - start)
        let stillBusy = !hold.isOpen
        hold.open()
        for t in busy { await t.value }

        #expect(stillBusy, "the call's answer waited for the other threads' jobs")
        #expect(!reply.ok && reply.body["code"] as? String == "timeout", "\(reply.body)")
        #expect(took < limit + 1.0, "answered after \(took) s, its limit \(limit) s")
        #expect(await !server.registry.contains("durable"), "a call stopped before its turn leaves no thread")
        // With the pool free again, the same call is served.
        await server.handle(Respond(id: 2, prompt: "read it", thread_id: "durable",
                                             options: RespondOptions(timeout_s: 10), files: ["small.txt"]))
        let served = await wire.reply(2)
        #expect(served.ok && served.body["text"] as? String == "echo 1: read it\nfile small.txt: one small line", "\(served.body)")
    }
}
}
