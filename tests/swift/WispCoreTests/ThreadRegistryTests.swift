import Foundation
import Testing
@testable import WispCore

@Suite struct ThreadIDs {
    @Test(arguments: ["a", String(repeating: "x", count: 64), ".", "..", "a.b_c-d", "A9"])
    func valid(_ id: String) {
        #expect(ThreadRegistry.isValidID(id))
    }

    @Test(arguments: ["", String(repeating: "x", count: 65), "a b", "a/b", "é", "a\nb", "a\0b", "th🙂"])
    func invalid(_ id: String) async {
        #expect(!ThreadRegistry.isValidID(id))
        let registry = ThreadRegistry(backend: EchoBackend())
        await #expect(throws: WispError.self) { try await call(registry, id, "hi") }
        #expect(await registry.count == 0)
    }

    @Test func generatedIDsAreValidUniqueAndCarry128Bits() {
        let ids = (0..<1000).map { _ in ThreadRegistry.generateID() }
        #expect(Set(ids).count == ids.count)
        for id in ids {
            #expect(ThreadRegistry.isValidID(id))
            #expect(id.count == 32 && id.allSatisfy(\.isHexDigit))
        }
    }
}

@Suite struct ThreadSemantics {
    @Test func noIDCreatesThenKnownIDContinues() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let first = try await call(registry, nil, "hello")
        #expect(first.created)
        #expect(first.outcome.text == "echo 1: hello")
        let second = try await call(registry, first.id, "again")
        #expect(!second.created)
        #expect(second.outcome.text == "echo 2: again")
        #expect(second.outcome.turns == 2)
    }

    @Test func unknownIDCreatesUnderThatID() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let r = try await call(registry, "mine", "hi")
        #expect(r.created && r.id == "mine")
        #expect(try await call(registry, "mine", "more").outcome.text == "echo 2: more")
    }

    @Test func instructionsAndToolsBindOnlyAtCreation() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        try await call(registry, "t", "hi", instructions: "be brief")
        do {
            try await call(registry, "t", "again", instructions: "be long")
            Issue.record("instructions on an existing thread must fail")
        } catch let e as WispError {
            #expect(e.code == .invalidArgument)
            #expect(e.message.contains("bind only when a thread is created"))
        }
        do {
            try await call(registry, "t", "again", tools: ["read_file"])
            Issue.record("tools on an existing thread must fail")
        } catch let e as WispError {
            #expect(e.code == .invalidArgument)
            #expect(e.message.contains("tools bind only when a thread is created"))
        }
        // Neither error touched the thread.
        #expect(try await call(registry, "t", "third").outcome.text == "echo 2: third")
    }

    @Test func unknownToolAtCreationListsValidNames() async throws {
        let tool = ModelTool(name: "read_file", description: "reads", parametersSchema: "{}") { _ in "x" }
        let registry = ThreadRegistry(backend: EchoBackend(), tools: [tool])
        do {
            try await call(registry, "t", "hi", tools: ["nope"])
            Issue.record("unknown tool must fail")
        } catch let e as WispError {
            #expect(e.code == .invalidArgument && e.message.contains("valid tools: read_file"))
        }
        #expect(await !registry.contains("t"))
    }

    @Test func closeKnownAndUnknown() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        try await call(registry, "t", "hi")
        #expect(try await registry.close("t"))
        #expect(try await !registry.close("t"))
        #expect(try await !registry.close("never"))
        await #expect(throws: WispError.self) { try await registry.close("bad id") }
        #expect(try await call(registry, "t", "fresh").created)
    }

    @Test func lruEvictsTheLeastRecentlyUsed() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(), capacity: 3)
        for id in ["a", "b", "c"] { try await call(registry, id, "hi") }
        try await call(registry, "a", "touch")
        try await call(registry, "d", "hi")
        #expect(await registry.count == 3)
        #expect(await !registry.contains("b"))
        for id in ["a", "c", "d"] { #expect(await registry.contains(id)) }
        try await call(registry, "e", "hi")
        #expect(await !registry.contains("c"))
        // The evicted id comes back as a new thread.
        let back = try await call(registry, "b", "again")
        #expect(back.created && back.outcome.text == "echo 1: again")
    }

    @Test func evictionPrefersIdleThreadsAndInFlightCallsFinish() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(), capacity: 2)
        let slow = try await startCall(registry, "busy", "!sleep 400 slow")
        try await call(registry, "idle", "hi")
        try await call(registry, "new", "hi")   // "busy" is older, but in flight: "idle" goes
        #expect(await registry.contains("busy"))
        #expect(await !registry.contains("idle"))
        try await call(registry, "newer", "hi")  // "new" is the only idle one
        #expect(await registry.contains("busy"))
        #expect(await !registry.contains("new"))
        let r = try await slow.value
        #expect(r.outcome.text == "echo 1: !sleep 400 slow")
        #expect(await registry.count == 2)
    }

    @Test func busyThreadIsEvictedWhenNoneIsIdleAndItsCallStillFinishes() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(), capacity: 1)
        let slow = try await startCall(registry, "busy", "!sleep 300 slow")
        try await call(registry, "other", "hi")
        #expect(await !registry.contains("busy"))
        #expect(try await slow.value.outcome.text == "echo 1: !sleep 300 slow")
        #expect(await registry.count == 1)
    }

    @Test func aFailedCreatingCallForgetsTheEmptyThread() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        await #expect(throws: WispError.self) { try await call(registry, "t", "!fail generation_failed", instructions: "x") }
        #expect(await !registry.contains("t"))
        // So the caller can retry with the same instructions.
        #expect(try await call(registry, "t", "hi", instructions: "x").created)
    }
}

@Suite struct RegistryRaces {
    /// A thread whose creating call failed is forgotten, unless another call was accepted for it
    /// meanwhile: that call's turn must not vanish with it.
    @Test func aCallAcceptedWhileTheCreatingCallFailsKeepsItsThread() async throws {
        for _ in 0..<3000 {
            let registry = ThreadRegistry(backend: EchoBackend())
            let a = try await registry.accept(threadID: "x", instructions: nil, tools: nil)
            await #expect(throws: WispError.self) {
                _ = try await a.thread.respond(a.ticket, prompt: "!fail generation_failed", settings: .init(), onPartial: nil)
            }
            async let done: Void = registry.finished(a, failed: true)
            async let b = registry.accept(threadID: "x", instructions: nil, tools: nil)
            _ = await done
            let accepted = try await b
            let o = try await accepted.thread.respond(accepted.ticket, prompt: "kept", settings: .init(), onPartial: nil)
            await registry.finished(accepted)
            if !accepted.created {
                // B continued X: X must still be there, holding B's turn.
                #expect(await registry.contains("x"))
                let next = try await call(registry, "x", "next")
                #expect(!next.created && next.outcome.text == "echo \(o.turns + 1): next")
            }
        }
    }
}
