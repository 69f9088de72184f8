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
        let tool = ModelTool(name: "read_file", description: "reads", parametersSchema: "{}") { _ in "x" }
        let registry = ThreadRegistry(backend: EchoBackend(), tools: [tool])
        try await call(registry, "t", "hi", instructions: "be brief", tools: ["read_file"])
        // Empty or not, a binding argument on an existing thread is refused, with the binding stated:
        // `tools: []` must not be read as "no tools now" and silently ignored.
        let attempts: [(String?, [String]?, String)] = [
            ("be long", nil, "instructions"), ("", nil, "instructions"),
            (nil, ["read_file"], "tools"), (nil, [], "tools"), ("", [], "instructions and tools"),
        ]
        for (instructions, tools, what) in attempts {
            do {
                try await call(registry, "t", "again", instructions: instructions, tools: tools)
                Issue.record("\(what) on an existing thread must fail")
            } catch let e as WispError {
                #expect(e.code == .invalidArgument)
                #expect(e.message.contains(#"bound to instructions "be brief" and tools [read_file]"#), "\(e.message)")
                #expect(e.message.contains("Omit \(what) (even an empty value) to continue it"), "\(e.message)")
            }
        }
        // No error touched the thread.
        #expect(try await call(registry, "t", "third").outcome.text == "echo 2: third")
    }

    @Test func theBindingErrorShortensLongInstructionsAndSaysNone() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        try await call(registry, "long", "hi", instructions: String(repeating: "i", count: 500))
        try await call(registry, "plain", "hi", instructions: "", tools: [])   // empty at creation: none
        do {
            try await call(registry, "long", "again", tools: [])
            Issue.record("tools on an existing thread must fail")
        } catch let e as WispError {
            let kept = String.previewBytes - String.cutMark.utf8.count
            #expect(e.message.contains(String(repeating: "i", count: kept) + "…\" and no tools"), "\(e.message)")
            #expect(!e.message.contains(String(repeating: "i", count: kept + 1)))
        }
        do {
            try await call(registry, "plain", "again", instructions: "")
            Issue.record("instructions on an existing thread must fail")
        } catch let e as WispError {
            #expect(e.message.contains("bound to no instructions and no tools"), "\(e.message)")
        }
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

    /// A stored thread's tool names are judged as a call's are (ToolBinder): one wording, which
    /// lists the tools there are, whether the names come from a call or from the store.
    @Test func aStoredThreadBoundToAToolThisCoreLacksIsRefusedListingTheValidNames() async throws {
        func tool(_ name: String) -> ModelTool {
            ModelTool(name: name, description: name, parametersSchema: "{}") { _ in "x" }
        }
        let store = MemoryThreadStore()
        let first = ThreadRegistry(backend: EchoBackend(), tools: [tool("read_file")], store: store)
        try await call(first, "t", "hi", tools: ["read_file"])
        let second = ThreadRegistry(backend: EchoBackend(), tools: [tool("list_directory")], store: store)
        do {
            _ = try await second.accept(threadID: nil, instructions: nil, tools: nil, forkFrom: "t")
            Issue.record("a fork of a thread bound to a missing tool must fail")
        } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message == #"fork_from 't': unknown tool "read_file"; valid tools: list_directory"#,
                    "\(error.message)")
        }
        let bare = ThreadRegistry(backend: EchoBackend(), store: store)
        let e = await #expect(throws: WispError.self) {
            _ = try await bare.accept(threadID: nil, instructions: nil, tools: nil, forkFrom: "t")
        }
        #expect(e?.message.hasSuffix("this wisp has no model tools") == true, "\(String(describing: e))")
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
    /// A thread whose creating call failed is forgotten; a call accepted for it meanwhile starts
    /// it afresh, as if the failed call had never happened, and keeps it.
    @Test func aCallAcceptedWhileTheCreatingCallFailsStartsTheThreadAfresh() async throws {
        for _ in 0..<3000 {
            let registry = ThreadRegistry(backend: EchoBackend())
            let a = try await registry.accept(threadID: "x", instructions: "first", tools: nil)
            await #expect(throws: WispError.self) {
                _ = try await a.thread.respond(a.ticket, prompt: "!fail generation_failed", settings: .init(), onPartial: nil)
            }
            async let done: Void = registry.finished(a, committed: false)
            async let b = registry.accept(threadID: "x", instructions: "second", tools: nil)
            _ = await done
            let accepted = try await b
            let o = try await accepted.thread.respond(accepted.ticket, prompt: "kept", settings: .init(), onPartial: nil)
            await registry.finished(accepted, committed: true)
            #expect(o.created && o.text == "echo 1: kept")
            #expect(await accepted.thread.instructions == "second")
            let next = try await call(registry, "x", "next")
            #expect(!next.created && next.outcome.text == "echo 2: next")
        }
    }
}

@Suite struct Recovery {
    @Test func aRebuildThatFailsAdvisesClosingTheThreadNotABareInternalError() async throws {
        let registry = ThreadRegistry(backend: RebuildFailsBackend())
        var failure: WispError?
        for i in 1...12 {
            do {
                try await call(registry, "t", "turn \(i) with some padding")
            } catch let e as WispError {
                failure = e
                break
            }
        }
        let e = try #require(failure, "the thread never had to be rebuilt")
        #expect(e.code == .contextOverflow)
        #expect(e.message.hasPrefix("Close this thread (close_thread) and start another"), "\(e.message)")
        #expect(e.message.contains("unsupported transcript content"))
        // A failure that is not part of recovery keeps its own code.
        let fresh = ThreadRegistry(backend: RebuildFailsBackend())
        await #expect(throws: WispError(.generationFailed, "echo backend: failed on purpose (!fail generation_failed)")) {
            try await call(fresh, "u", "!fail generation_failed")
        }
    }
}

@Suite struct ClientRootLimits {
    @Test func tooManyRootsAreRefusedAtOnceWithTheCap() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let many = (0..<20_000).map { "/nonexistent/root\($0)" }
        let clock = ContinuousClock()
        let start = clock.now
        do {
            _ = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: many)
            Issue.record("20,000 roots must be refused")
        } catch {
            #expect(error.code == .invalidArgument)
            #expect(error.message.contains("more than \(ThreadRegistry.maxRoots) roots") && error.message.contains("at most \(ThreadRegistry.maxRoots)"), "\(error.message)")
        }
        // Refused before any per-root work: quadratic work over 20,000 roots would take far longer.
        #expect(seconds(clock.now - start) < 5)
        #expect(await !registry.contains("t"))
        // The cap itself is allowed.
        let a = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: Array(many.prefix(ThreadRegistry.maxRoots)))
        await registry.finished(a, committed: false)
    }

    @Test(arguments: ["relative/dir", "", "/tmp/x\u{0}y", "~/x"])
    func aRootThatIsNotAnAbsolutePathIsRefused(_ root: String) async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        do {
            _ = try await registry.accept(threadID: "t", instructions: nil, tools: [], roots: ["/tmp", root])
            Issue.record("\(root.debugDescription) must be refused")
        } catch {
            #expect(error.code == .invalidArgument && error.message.contains("is not an absolute local path"), "\(error.message)")
        }
    }
}
