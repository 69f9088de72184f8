import Foundation
import Testing
@testable import WispCore

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

private func freshDir() -> String {
    NSTemporaryDirectory() + "wisp-store-\(UInt64.random(in: 0...UInt64.max))/state"
}

private func store(_ dir: String, max: Int = 1000) throws -> ThreadStore {
    try ThreadStore(directory: dir, maxStored: max, log: Log(level: .error))
}

@Suite struct ThreadStoreFormat {
    @Test func roundTripsStateAndCreatesPrivateFiles() throws {
        let dir = freshDir()
        let s = try store(dir)
        let state = ThreadStore.State(instructions: "be brief", tools: ["read_file"], roots: ["/r"],
                                      history: [Turn(prompt: "p", toolExchanges: [ToolExchange(name: "read_file", arguments: "{}", output: "o", failed: true)], response: "r")])
        let written = try s.save("..", state)
        let (loaded, stamp) = try #require(try s.load(".."))
        #expect(loaded == state)
        #expect(stamp == written)
        #expect(s.stamp("..") == written)
        var st = stat()
        #expect(lstat(dir, &st) == 0 && st.st_mode & 0o777 == 0o700)
        #expect(lstat(dir + "/thread-...json", &st) == 0 && st.st_mode & 0o777 == 0o600)
        // Every write is a new inode: another process's write is always seen.
        #expect(try s.save("..", state) != written)
    }

    @Test func aTurnsReasoningIsStoredAndRestored() throws {
        let s = try store(freshDir())
        let state = ThreadStore.State(instructions: nil, tools: [], roots: [],
                                      history: [Turn(prompt: "p", response: "r", reasoning: "thought first", tokens: 9), Turn(prompt: "q", response: "s")])
        _ = try s.save("t", state)
        let (loaded, _) = try #require(try s.load("t"))
        #expect(loaded == state)
        #expect(loaded.history.map(\.reasoning) == ["thought first", nil])
    }

    @Test func refusesAGroupWritableDirectory() throws {
        let dir = freshDir()
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        chmod(dir, 0o770)
        #expect(throws: WispError.self) { try store(dir) }
    }

    @Test func aCorruptFileIsMovedAsideAndTheIDIsFreeAgain() throws {
        let dir = freshDir()
        let s = try store(dir)
        _ = FileManager.default.createFile(atPath: dir + "/thread-x.json", contents: Data("{\"format\":1,\"id\":\"x\",\"turns\":2}\n[]\n".utf8))
        let error = #expect(throws: WispError.self) { try s.load("x") }
        #expect(error?.message.contains("thread-x.json") == true)
        #expect(try s.load("x") == nil)
        let names = try FileManager.default.contentsOfDirectory(atPath: dir)
        #expect(names.contains { $0.hasPrefix("thread-x.json.corrupt-") })
    }

    @Test func aHeldLockMakesOthersWaitThenBusy() async throws {
        let dir = freshDir()
        let s = try store(dir)
        let held = try #require(try s.tryLock("t"))
        #expect(try s.tryLock("t") == nil)
        let start = ContinuousClock.now
        let error = await #expect(throws: WispError.self) { _ = try await s.lock("t") }
        #expect(error?.code == .busy)
        #expect(ContinuousClock.now - start >= ThreadStore.lockWait)
        // Deleted by its holder: a later taker gets a fresh lock file, not the stale inode.
        s.delete("t", holding: held)
        #expect(try s.tryLock("t") != nil)
    }

    @Test func theCapDeletesTheLeastRecentlyWritten() throws {
        let s = try store(freshDir(), max: 2)
        let state = ThreadStore.State(instructions: nil, tools: [], roots: [], history: [])
        for id in ["a", "b", "a", "c"] { _ = try s.save(id, state) }
        #expect(s.summaries().map(\.id) == ["c", "a"])
    }
}

@Suite struct DurableRegistry {
    @Test func aSecondRegistryOnTheDirectoryResumesAndCloseDeletes() async throws {
        let dir = freshDir()
        let one = ThreadRegistry(backend: EchoBackend(), store: try store(dir))
        try await call(one, "t", "first", instructions: "be brief")
        try await call(one, "t", "second")
        let two = ThreadRegistry(backend: EchoBackend(), store: try store(dir))
        #expect(await two.snapshot() == [ThreadInfo(thread_id: "t", turns: 2, pending: 0, live: false, stored: true)])
        let third = try await call(two, "t", "third")
        #expect(third.outcome.text == "echo 3: third" && !third.created)
        await #expect(throws: WispError.self) { try await call(two, "t", "x", instructions: "other") }
        // The first registry's live copy is behind: it reloads before answering.
        #expect(try await call(one, "t", "fourth").outcome.text == "echo 4: fourth")
        #expect(try await two.close("t"))
        #expect(try store(dir).load("t") == nil)
        // Closed elsewhere: the other registry's live copy starts afresh.
        #expect(try await call(one, "t", "again").created)
    }

    @Test func aThreadClosedWhileItsCallRunsIsNotStoredAgainByThatCall() async throws {
        let dir = freshDir()
        let gate = Gate()
        let registry = ThreadRegistry(backend: GateBackend(gate: gate), store: try store(dir))
        try await call(registry, "t", "first")
        #expect(try store(dir).load("t") != nil)
        let running = try await startCall(registry, "t", "gate: second")
        await gate.waitUntilEntered()
        #expect(try await registry.close("t"))
        gate.open()
        _ = try await running.value
        #expect(try store(dir).load("t") == nil, "the call that finished after close_thread must not store the thread again")
    }
}
