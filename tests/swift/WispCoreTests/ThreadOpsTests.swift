// Fork, rewind, listing and reading a thread, in the core alone (echo backend).
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

/// A call through the registry with `fork_from` or `rewind`; `keep` decides the commit as the pipe server's does.
@discardableResult
private func op(_ registry: ThreadRegistry, _ threadID: String?, _ prompt: String, forkFrom: String? = nil, rewind: Int = 0,
                keep: @escaping @Sendable () -> Bool = { true }) async throws -> Conversation.Outcome? {
    let a = try await registry.accept(threadID: threadID, instructions: nil, tools: nil, forkFrom: forkFrom, rewinding: rewind > 0)
    do {
        let o = try await a.thread.respond(a.ticket, prompt: prompt, settings: GenerationSettings(), onPartial: nil, rewind: rewind,
                                           keep: keep)
        await registry.finished(a, committed: o != nil)
        return o
    } catch {
        await registry.finished(a, committed: false)
        throw error
    }
}

private func prompts(_ registry: ThreadRegistry, _ id: String) async throws -> [String] {
    try await registry.read(id, last: nil, maxBytes: 1 << 20).items.map(\.prompt)
}

@Suite struct ThreadOps {
    /// A missing thread's error says where it was looked for: a wisp without a store has nothing
    /// stored to look in (`NoThreadStore`), one with a store looked there too.
    @Test(arguments: [false, true])
    func aMissingThreadIsLookedForWhereThreadsAreKept(durable: Bool) async throws {
        let registry = durable ? ThreadRegistry(backend: EchoBackend(), store: MemoryThreadStore())
                               : ThreadRegistry(backend: EchoBackend())
        #expect(registry.store.durable == durable)
        let whereLooked = durable ? "(not live or stored)" : "(not live)"
        for attempt in [{ try await op(registry, "new", "x", forkFrom: "nowhere") },
                        { try await op(registry, "nowhere", "x", rewind: 1) }] {
            do {
                try await attempt()
                Issue.record("a fork or rewind of a missing thread was accepted")
            } catch let error as WispError {
                #expect(error.message.contains("no thread 'nowhere' \(whereLooked)"), "\(error.message)")
            }
        }
        #expect(try await registry.list().threads.isEmpty)
        #expect(try await registry.close("nowhere") == false)
    }

    @Test func aRewindIsOneCommitAndAStoppedOneChangesNothing() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        for p in ["a", "b", "c"] { try await call(registry, "t", p) }
        // Stopped after the model answered: nothing dropped, nothing added.
        #expect(try await op(registry, "t", "lost", rewind: 2, keep: { false }) == nil)
        #expect(try await prompts(registry, "t") == ["a", "b", "c"])
        let o = try #require(try await op(registry, "t", "again", rewind: 2))
        #expect(o.text == "echo 2: again" && o.turns == 2 && !o.created && o.rewound == 2)
        #expect(try await call(registry, "t", "d").outcome.text == "echo 3: d")
        await #expect(throws: WispError.self) { try await op(registry, "t", "x", rewind: 4) }
        #expect(try await prompts(registry, "t") == ["a", "again", "d"])
    }

    @Test func aForkOfABusyThreadCopiesItsCommittedTurnsOnly() async throws {
        let gate = Gate()
        let registry = ThreadRegistry(backend: GateBackend(gate: gate))
        for p in ["a", "b"] { try await call(registry, "src", p) }
        let busy = try await startCall(registry, "src", "gate running")
        await gate.waitUntilEntered()
        // The source's call is inside the model now; the fork does not wait for it.
        let o = try #require(try await op(registry, "f", "branch", forkFrom: "src"))
        #expect(o.created && o.turns == 3 && o.text == "echo 3: branch")
        gate.open()
        #expect(try await busy.value.outcome.turns == 3)
        #expect(try await prompts(registry, "src") == ["a", "b", "gate running"])
        #expect(try await prompts(registry, "f") == ["a", "b", "branch"])
    }

    @Test func aForkIsRefusedWithABindingOntoATakenIdOrFromNothing() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        try await call(registry, "s", "a")
        try await call(registry, "taken", "a")
        await #expect(throws: WispError.self) { try await registry.accept(threadID: nil, instructions: "i", tools: nil, forkFrom: "s") }
        await #expect(throws: WispError.self) { try await registry.accept(threadID: "taken", instructions: nil, tools: nil, forkFrom: "s") }
        await #expect(throws: WispError.self) { try await registry.accept(threadID: nil, instructions: nil, tools: nil, forkFrom: "none") }
        // A fork whose first call fails is forgotten, like any thread that never committed.
        await #expect(throws: WispError.self) { try await op(registry, "f", "!fail generation_failed x", forkFrom: "s") }
        #expect(await registry.contains("f") == false)
        #expect(await registry.count == 2)
    }

    @Test func listingPagesWithCursorsAndQueriesByWholeWords() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        for i in 0..<25 { try await call(registry, "t\(i)", i == 7 ? "the linker failed" : "compile \(i)") }
        var seen: [String] = []
        var cursor: String?
        repeat {
            let page = try await registry.list(limit: 10, cursor: cursor)
            #expect(page.threads.count <= 10)
            seen += page.threads.map(\.thread_id)
            cursor = page.next
        } while cursor != nil
        #expect(seen.count == 25 && Set(seen).count == 25 && seen.first == "t24")
        #expect(try await registry.list(query: "LINKER").threads.map(\.thread_id) == ["t7"])
        #expect(try await registry.list(query: "link").threads.isEmpty)  // whole words
        await #expect(throws: WispError.self) { try await registry.list(query: " ,; ") }
        await #expect(throws: WispError.self) { try await registry.list(cursor: "not-a-cursor!") }
    }

    @Test func aPlaceRoundTripsThroughItsCursor() throws {
        for place in [ListPlace(score: 0, updated: 1764645123.125, id: "a-b_c.d"), ListPlace(score: 12, updated: .infinity, id: "x")] {
            #expect(try ListPlace(cursor: place.cursor) == place)
        }
        for bad in ["", "1-2", "zz-1-a", "1-2-", "1-2-bad id"] { #expect(throws: WispError.self) { try ListPlace(cursor: bad) } }
    }

    @Test func aReadingIsBoundedInBytesAndAClippedPreviewStaysValid() {
        let turns = (0..<50).map { Turn(prompt: "p\($0) " + String(repeating: "é", count: 100), response: "r\($0)") }
        let r = ThreadViews.read(id: "t", instructions: nil, tools: [], history: turns, condensed: 0, last: nil, maxBytes: 2000)
        #expect(r.turns == 50 && r.omitted == 50 - r.items.count && r.items.last?.prompt.hasPrefix("p49") == true)
        #expect(r.items.reduce(0) { $0 + $1.prompt.utf8.count + $1.reply.utf8.count } <= 2000)
        // The newest turn is always given, shortened when it alone is over the bound.
        let big = turns + [Turn(prompt: String(repeating: "é", count: 5000), response: "{}", structured: true)]
        let one = ThreadViews.read(id: "t", instructions: nil, tools: [], history: big, condensed: 0, last: nil, maxBytes: 1000)
        #expect(one.items.count == 1 && one.items[0].cut && one.omitted == 50 && one.items[0].prompt.utf8.count <= 1000)
        #expect(one.items[0].reply == "{}" && one.items[0].structured)
        let clipped = ThreadViews.clip(String(repeating: "🙂", count: 100), bytes: 21)
        #expect(clipped.cut && clipped.text.utf8.count <= 21 && clipped.text.hasSuffix("…"))
        #expect(ThreadViews.clip("short", bytes: 21) == ("short", false))
    }
}
