// Durable faults stay with one thread, and the store's blocking work stays
// off the pipe loop (25.4).
import Dispatch
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

private func stateDir() -> String {
    NSTemporaryDirectory() + "wisp-faults-\(UInt64.random(in: 0...UInt64.max))/state"
}

private func names(_ dir: String) -> [String] {
    (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
}

/// One call that answers but never commits (a cancel or time limit that won), as the pipe server makes it.
private func uncommitted(_ registry: ThreadRegistry, _ id: String) async throws {
    let a = try await registry.accept(threadID: id, instructions: nil, tools: nil)
    let o = try await a.thread.respond(a.ticket, prompt: "x", settings: .init(), onPartial: nil, keep: { false })
    #expect(o == nil)
    await registry.finished(a, committed: false)
}

@Suite(.serialized) struct StoreFaults {
    /// 25.8: a lock file that is a symlink, a directory or a FIFO is moved aside once, and the
    /// thread goes on with its history.
    @Test func aLockFileThatIsNotOneIsMovedAsideOnceAndTheThreadGoesOn() async throws {
        let dir = stateDir()
        let registry = ThreadRegistry(backend: EchoBackend(), store: try ThreadStore(directory: dir, maxStored: 100, log: Log(level: .error)))
        try await call(registry, "t", "first")
        let lock = dir + "/thread-t.lock"
        let replacements: [(String, () throws -> Void)] = [
            ("symlink", { try FileManager.default.createSymbolicLink(atPath: lock, withDestinationPath: "/nowhere") }),
            ("directory", { try FileManager.default.createDirectory(atPath: lock, withIntermediateDirectories: false) }),
            ("fifo", { #expect(mkfifo(lock, 0o600) == 0) }),
        ]
        var turns = 1
        for (kind, replace) in replacements {
            unlink(lock)
            try replace()
            do {
                let r = try await call(registry, "t", "x")
                Issue.record("\(kind): the call ran on a lock file that is not one: \(r.outcome.text)")
            } catch let e as WispError {
                #expect(e.message.contains("moved aside"), "\(kind): \(e.message)")
            }
            turns += 1
            let next = try await call(registry, "t", "again")
            #expect(next.outcome.text == "echo \(turns): again", "\(kind)")
            #expect(names(dir).filter { $0.hasPrefix("thread-t.lock.corrupt-") }.count == replacements.firstIndex { $0.0 == kind }! + 1)
        }
    }

    /// 25.10: ids whose calls never commit leave no lock file; a closed thread's goes with it;
    /// orphans are swept at start; the cap removes its victims' locks.
    @Test func lockFilesNeverOutliveTheirThreads() async throws {
        let dir = stateDir()
        let store = try ThreadStore(directory: dir, maxStored: 2, log: Log(level: .error))
        let registry = ThreadRegistry(backend: EchoBackend(), store: store)
        for i in 0..<30 { try await uncommitted(registry, "n\(i)") }
        #expect(names(dir).filter { $0.hasSuffix(".lock") } == [])
        for id in ["a", "b", "c"] { try await call(registry, id, "hi") }
        // Over the cap of 2: "a" was deleted, lock and all.
        #expect(Set(names(dir).filter { $0.hasSuffix(".lock") || $0.hasSuffix(".json") }).isSubset(of: ["thread-b.json", "thread-b.lock", "thread-c.json", "thread-c.lock"]))
        #expect(try await registry.close("b"))
        #expect(!names(dir).contains("thread-b.lock"))
        // A process that died holding locks of threads it never stored: swept at the next start.
        for id in ["dead1", "dead2"] { #expect(FileManager.default.createFile(atPath: dir + "/thread-\(id).lock", contents: nil)) }
        _ = try ThreadStore(directory: dir, maxStored: 2, log: Log(level: .error))
        #expect(names(dir).filter { $0.hasPrefix("thread-dead") } == [])
        #expect(try ThreadStore(directory: dir, maxStored: 2, log: Log(level: .error)).load("c") != nil)
    }

    /// 25.11: a FIFO swapped in for a thread file between a look and the open must not block
    /// the reader (a plain open of a FIFO waits for a writer for good). On the old code this
    /// blocked within the 3 s (the listing's OS thread stuck in open).
    @Test func aFIFOSwappedInForAThreadFileNeverBlocksALoad() async throws {
        let dir = stateDir()
        let store = try ThreadStore(directory: dir, maxStored: 100, log: Log(level: .error))
        _ = try store.save("f", ThreadStore.State(instructions: nil, tools: [], roots: [], history: []))
        let good = try Data(contentsOf: URL(fileURLWithPath: dir + "/thread-f.json"))
        let file = dir + "/thread-f.json"
        let stop = Locked(false)
        // The swapper: a regular thread file and a FIFO, renamed in turn over the thread's file
        // as fast as it can (raw syscalls), so a look by name and the open after it see two files.
        Thread.detachNewThread {
            let regular = dir + "/r", fifo = dir + "/p"
            while !stop.withLock({ $0 }) {
                let fd = open(regular, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
                good.withUnsafeBytes { _ = write(fd, $0.baseAddress!, $0.count) }
                close(fd)
                rename(regular, file)
                mkfifo(fifo, 0o600)
                rename(fifo, file)
            }
        }
        // Lists (which looks at each file by name, then opens it to read its header) for 3 s;
        // a look that blocks never comes back. (`load` opens the same way; listing logs nothing.)
        // Waited for by polling, not a semaphore: a blocked wait would hold one of the few
        // pool's OS threads that every other test of the run shares.
        let loaded = Locked(false)
        Thread.detachNewThread {
            let end = ContinuousClock.now + .seconds(3)
            while ContinuousClock.now < end { _ = store.summaries() }
            loaded.withLock { $0 = true }
        }
        let giveUp = ContinuousClock.now + .seconds(15)
        while !loaded.withLock({ $0 }), ContinuousClock.now < giveUp { try? await Task.sleep(for: .milliseconds(20)) }
        let finished = loaded.withLock { $0 }
        stop.withLock { $0 = true }
        // And a FIFO where a thread file should be is refused at once.
        try? await Task.sleep(for: .milliseconds(50))
        unlink(file)
        #expect(mkfifo(file, 0o600) == 0)
        #expect(throws: WispError.self) { _ = try store.load("f") }
        #expect(finished, "a load blocked on a FIFO")
    }
}

/// A pipe loop on an OS thread of its own (it runs for the rest of the process), reading a pipe
/// nobody writes to: where the pipe server's calls run, as in the core.
private func pipeLoop() -> PipeLoop {
    let loop = PipeLoop()
    var fds: [Int32] = [-1, -1]
    precondition(pipe(&fds) == 0)
    let input = fds[0]
    Thread.detachNewThread { loop.run(input: input) { _ in } }
    return loop
}

@Suite struct StoreOffThePipe {
    /// 25.4: the lock's open and flock run off the pipe loop, so a hung file system (a
    /// simulated one: the store's `beforeLock` seam blocks) under one thread stalls no call on
    /// another. Its reply comes while the hung call is still hung.
    @Test func aHungLockStallsNoCallOnAnotherThread() async throws {
        let hung = DispatchSemaphore(value: 0)
        let store = try ThreadStore(directory: stateDir(), maxStored: 100, log: Log(level: .error), hooks: .init(beforeLock: { id in
            if id == "hung" { _ = hung.wait(timeout: .now() + 20) }
        }))
        let loop = pipeLoop()
        let wire = Wire()
        let backend = EchoBackend()
        let server = PipeServer(registry: ThreadRegistry(backend: backend, store: store), backend: backend, log: Log(level: .error),
                                executor: loop) { wire.send($0) }
        await Task(executorPreference: loop) { await server.handle(.respond(Respond(id: 1, prompt: "hi", thread_id: "hung"))) }.value
        // Not awaited: on a stalled loop the request would not even be taken.
        Task(executorPreference: loop) { await server.handle(.respond(Respond(id: 2, prompt: "hi", thread_id: "other"))) }
        let other = await wire.reply(2, within: .seconds(5))
        let hungAnswered = await wire.replyIndex(1, within: .zero) != nil
        hung.signal()
        #expect(other.ok && other.body["text"] as? String == "echo 1: hi")
        #expect(!hungAnswered)
        #expect(await wire.reply(1).ok)
    }

    /// 25.4: a client's roots are not resolved (realpath, stat) while the registry accepts the
    /// call on the pipe loop, but at the first tool call, which runs off it: a root that
    /// appears between the two is read.
    @Test func clientRootsAreResolvedAtTheToolCallNotAtAccept() async throws {
        let base = NSTemporaryDirectory() + "wisp-lazy-roots-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: base + "/own", withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: base) }
        let own = Roots([base + "/own"])
        let registry = ThreadRegistry(backend: EchoBackend(), tools: ToolCatalogue.tools(roots: own),
                                      toolsWithRoots: { extra in ToolCatalogue.tools(roots: own, adding: extra) })
        let later = base + "/client"
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: ["read_file"], roots: [later])
        try FileManager.default.createDirectory(atPath: later, withIntermediateDirectories: true)
        try "from the client\n".write(toFile: later + "/x.txt", atomically: false, encoding: .utf8)
        let o = try await a.thread.respond(a.ticket, prompt: #"!tool read_file {"path": "\#(later)/x.txt"}"#, settings: .init(), onPartial: nil)
        await registry.finished(a, committed: true)
        #expect(o.text == "echo 1: tool read_file -> from the client\n")
    }
}
