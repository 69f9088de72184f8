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
        // Every write is a new inode or a longer file: another process's write is always seen.
        #expect(try s.save("..", state) != written)
    }

    @Test func aTurnIsAppendedToTheFileItsThreadLastSawAndAnyOtherWriteReplacesIt() throws {
        let s = try store(freshDir())
        var state = ThreadStore.State(instructions: nil, tools: [], roots: [], history: [Turn(prompt: "p1", response: "r1")])
        var stamp = try s.save("t", state)
        let first = stamp
        for i in 2...5 {
            state.history.append(Turn(prompt: "p\(i)", toolExchanges: [ToolExchange(name: "n", arguments: "{}", output: "o\n")], response: "r\(i)"))
            let before = stamp
            stamp = try s.save("t", state, appendingTo: stamp)
            #expect(stamp.ino == first.ino && stamp.size > before.size, "turn \(i) was appended in place")
            #expect(try s.load("t")?.0 == state)
            #expect(s.summaries().map(\.turns) == [i])
        }
        // Not the file it last saw (another writer's turn came between): replaced whole.
        state.history.append(Turn(prompt: "p6", response: "r6"))
        let stale = try s.save("t", state, appendingTo: first)
        #expect(stale.ino != first.ino)
        #expect(try s.load("t")?.0 == state)
        // Condensed (fewer turns than the file plus one): replaced whole.
        state.history.removeFirst(3)
        state.history.append(Turn(prompt: "p7", response: "r7"))
        let condensed = try s.save("t", state, appendingTo: stale)
        #expect(condensed.ino != stale.ino)
        #expect(try s.load("t")?.0 == state)
    }

    @Test func aTornLastRecordIsNotPartOfTheThreadAndTheNextWriteReplacesTheFile() throws {
        let dir = freshDir()
        let s = try store(dir)
        let file = dir + "/thread-t.json"
        let two = ThreadStore.State(instructions: "i", tools: ["read_file"], roots: ["/r"],
                                    history: [Turn(prompt: "p1", response: "r1"), Turn(prompt: "p2", response: "r2")])
        var three = two
        three.history.append(Turn(prompt: "p3", toolExchanges: [ToolExchange(name: "read_file", arguments: "{}", output: "o")], response: "r3"))
        let stamp = try s.save("t", two)
        _ = try s.save("t", three, appendingTo: stamp)
        let whole = try Data(contentsOf: URL(fileURLWithPath: file))
        // Every cut inside the last record, and the record's bytes lost to zeros (a machine
        // stopped before its pages reached the disk): the two turns before it.
        var damaged = (Int(stamp.size) + 1..<whole.count).map { whole.prefix($0) }
        damaged.append(whole.prefix(Int(stamp.size)) + Data(count: whole.count - Int(stamp.size)))
        for bytes in damaged {
            try bytes.write(to: URL(fileURLWithPath: file))
            let (loaded, seen) = try #require(try s.load("t"), "\(bytes.count) bytes")
            #expect(loaded == two, "\(bytes.count) bytes")
            #expect(s.summaries().map(\.turns) == [2])
            // Appending after a torn record would bury it: the file is written anew.
            let next = try s.save("t", three, appendingTo: seen)
            #expect(next.ino != seen.ino, "\(bytes.count) bytes")
            #expect(try s.load("t")?.0 == three)
        }
        #expect(!(try FileManager.default.contentsOfDirectory(atPath: dir)).contains { $0.contains(".corrupt-") })
    }

    @Test func aBadRecordWithMoreAfterItIsCorrupt() throws {
        let dir = freshDir()
        let s = try store(dir)
        let file = dir + "/thread-t.json"
        let state = ThreadStore.State(instructions: nil, tools: [], roots: [],
                                      history: (1...3).map { Turn(prompt: "p\($0)", response: "r\($0)") })
        _ = try s.save("t", state)
        var lines = try String(contentsOfFile: file, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
        lines[1] = Substring(String(repeating: "#", count: lines[1].count))
        try lines.joined(separator: "\n").write(toFile: file, atomically: false, encoding: .utf8)
        let error = #expect(throws: WispError.self) { try s.load("t") }
        #expect(error?.message.contains("turn 1") == true && error?.message.contains("moved aside") == true)
        #expect(try s.load("t") == nil)
    }

    @Test func aFormat1FileLoadsAndItsNextWriteIsFormat2() throws {
        let dir = freshDir()
        let s = try store(dir)
        let file = dir + "/thread-old.json"
        let v1 = #"{"format":1,"id":"old","turns":1,"written":1.5}"# + "\n"
            + #"{"instructions":"be brief","tools":["read_file"],"roots":["/r"],"history":[{"prompt":"p","toolExchanges":[{"name":"read_file","arguments":"{}","output":"o","failed":true}],"response":"r","tokens":3}]}"# + "\n"
        #expect(FileManager.default.createFile(atPath: file, contents: Data(v1.utf8)))
        #expect(s.summaries() == [ThreadStore.Summary(id: "old", turns: 1, modified: 1.5)])
        let (state, seen) = try #require(try s.load("old"))
        #expect(state == ThreadStore.State(instructions: "be brief", tools: ["read_file"], roots: ["/r"],
                                           history: [Turn(prompt: "p", toolExchanges: [ToolExchange(name: "read_file", arguments: "{}", output: "o", failed: true)], response: "r", tokens: 3)]))
        var next = state
        next.history.append(Turn(prompt: "p2", response: "r2"))
        let written = try s.save("old", next, appendingTo: seen)
        #expect(written.ino != seen.ino)
        #expect(try String(contentsOfFile: file, encoding: .utf8).hasPrefix(#"{"format":2,"id":"old","#))
        #expect(try s.load("old")?.0 == next)
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
        let listed = await two.snapshot()
        #expect(listed.map { [$0.thread_id, "\($0.turns)", "\($0.live)", "\($0.stored)"] } == [["t", "2", "false", "true"]])
        #expect(listed.first?.first_prompt == "first" && listed.first?.instructions == "be brief")
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

    @Test func aCommittedTurnIsAppendedAndATurnThatCondensesReplacesTheFile() async throws {
        let dir = freshDir()
        let registry = ThreadRegistry(backend: EchoBackend(contextSize: 64), store: try store(dir))
        var last: ThreadStore.Stamp?
        var appended = 0, replaced = 0
        for i in 1...10 {
            let o = try await call(registry, "t", "\(i) " + String(repeating: "x", count: 40)).outcome
            let (stored, stamp) = try #require(try store(dir).load("t"))
            #expect(stored.history.count == o.turns)
            if let last {
                // Condensing drops turns from the file's start: only a whole new file says that.
                #expect((stamp.ino == last.ino) == (o.dropped == 0), "turn \(i), dropped \(o.dropped)")
                if o.dropped == 0 { appended += 1 } else { replaced += 1 }
            }
            last = stamp
        }
        #expect(appended > 0 && replaced > 0)
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
