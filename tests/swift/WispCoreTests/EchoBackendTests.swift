// The echo backend's contract: directives, replies, tools and files as the registry sees them.
import Foundation
import Testing
@testable import WispCore
import WispInfrastructure

@Suite struct EchoContract {
    @Test func directives() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        #expect(try await call(registry, "t", "!sleep 10 hi").outcome.text == "echo 1: !sleep 10 hi")
        do {
            try await call(registry, "t", "!fail busy")
            Issue.record("!fail must fail")
        } catch let e as WispError {
            #expect(e.code == .busy)
        }
        await #expect(throws: WispError.self) { try await call(registry, "t", "!fail nonsense") }
        await #expect(throws: WispError.self) { try await call(registry, "t", "!sleep soon") }
        // A failed call leaves N where it was; a non-directive "!" is plain text.
        #expect(try await call(registry, "t", "!wave").outcome.text == "echo 2: !wave")
        let tool = try await call(registry, "t", "!tool read_file {}")
        #expect(tool.outcome.text == "echo 3: tool read_file failed: no tools are bound to this thread (bind them with `tools` when the thread is created)")
    }

    @Test func usageIsEchosOwnCountOfWhatItReadAndWrote() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let first = try await call(registry, "u", "hello there", instructions: "Be brief.").outcome
        #expect(first.usage == Usage(inputTokens: estimatedTokens("Be brief.") + estimatedTokens("hello there"),
                                     outputTokens: estimatedTokens("echo 1: hello there")))
        let second = try await call(registry, "u", "again").outcome
        let earlier = estimatedTokens("hello there") + estimatedTokens("echo 1: hello there")
        #expect(second.usage == Usage(inputTokens: estimatedTokens("Be brief.") + earlier + estimatedTokens("again"),
                                      outputTokens: estimatedTokens("echo 2: again")))
        // A reasoning level changes nothing in echo's reply or its count.
        let levelled = try await EchoBackend().makeSession(instructions: nil, tools: [], history: [])
            .respond(to: "hi", settings: GenerationSettings(reasoning: .deep), onPartial: nil)
        let plain = try await EchoBackend().makeSession(instructions: nil, tools: [], history: [])
            .respond(to: "hi", settings: GenerationSettings(), onPartial: nil)
        #expect(levelled == plain && plain.usage.reasoningTokens == nil && plain.reasoning == nil)
        let threads = await registry.snapshot()
        #expect(threads.first?.usage == UsageBody(first.usage + second.usage))
    }

    @Test func progressGivesAtLeastTwoCumulativePartials() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let seen = Locked<[String]>([])
        let r = try await call(registry, nil, "stream me", onPartial: { p in
            seen.withLock { $0.append("\(p.tokens)|\(p.text)") }
        })
        let partials = seen.withLock { $0 }
        #expect(partials.count >= 2)
        #expect(partials.last == "\(estimatedTokens(r.outcome.text))|\(r.outcome.text)")
        let tokens = partials.map { Int($0.split(separator: "|")[0])! }
        #expect(tokens == tokens.sorted() && Set(tokens).count == tokens.count)
    }

    @Test func echoDelayIsAddedToEveryReply() async throws {
        let registry = ThreadRegistry(backend: EchoBackend(delayMs: 150))
        let clock = ContinuousClock()
        let elapsed = try await clock.measure { try await call(registry, nil, "slow") }
        #expect(seconds(elapsed) >= 0.15)
    }

    @Test func aHeldCallAnswersOnlyWhenReleased() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let first = try await startCall(registry, "a", "!hold k one")
        let second = try await startCall(registry, "b", "!hold k two")
        // `!held` is the rendezvous: it answers only once both calls are parked at the hold.
        #expect(try await call(registry, "w", "!held k 2").outcome.text == "echo 1: !held k 2")
        #expect(try await call(registry, "r", "!release other").outcome.text == "echo 1: released 0")
        #expect(try await call(registry, "r", "!release k").outcome.text == "echo 2: released 2")
        #expect(try await first.value.outcome.text == "echo 1: !hold k one")
        #expect(try await second.value.outcome.text == "echo 1: !hold k two")
        // A release frees the holds of its moment only: a later hold waits for a later one.
        let later = try await startCall(registry, "a", "!hold k three")
        try await call(registry, "w", "!held k")
        #expect(try await call(registry, "r", "!release k").outcome.text == "echo 3: released 1")
        #expect(try await later.value.outcome.text == "echo 2: !hold k three")
    }

    @Test func aHoldOrAWatchIsCancellable() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        let held = try await startCall(registry, "a", "!hold gone")
        try await call(registry, "w", "!held gone")
        held.cancel()
        await #expect(throws: WispError.self) { try await held.value }
        let watch = try await startCall(registry, "w", "!held nobody 3")
        watch.cancel()
        await #expect(throws: WispError.self) { try await watch.value }
        // The cancelled hold no longer counts: nothing is left to release.
        #expect(try await call(registry, "r", "!release gone").outcome.text == "echo 1: released 0")
    }

    @Test func holdDirectivesRefuseWhatTheyCannotRead() async throws {
        let registry = ThreadRegistry(backend: EchoBackend())
        for bad in ["!hold", "!release", "!held", "!held k 0", "!held k -1", "!held k many", "!held k 99999999999999999999"] {
            await #expect(throws: WispError.self, "\(bad)") { try await call(registry, "t", bad) }
        }
    }
}
