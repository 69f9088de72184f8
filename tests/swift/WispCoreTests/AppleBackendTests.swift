// The apple backend against Apple's real on-device model. These run on a Mac with Apple
// Intelligence (macOS 26+); anywhere else they are skipped and say why. On Linux,
// `make check-apple` typechecks this file against the SDK interfaces.
import Testing
@testable import WispCore

#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import FoundationModels
import Synchronization

/// Why the real model cannot be used here, or nil when it can. Printed once when it is not nil.
private let appleSkipReason: String? = {
    var reason: String?
    if #available(macOS 26.0, *) {
        if case .unavailable(let why) = SystemLanguageModel.default.availability {
            reason = AppleBackend.describe(why)
        }
    } else {
        reason = "the apple backend needs macOS 26 or later"
    }
    if let reason { print("AppleBackendTests: skipped: \(reason)") }
    return reason
}()

private final class Partials: Sendable {
    let texts = Mutex<[String]>([])
}

/// The window rule alone, which needs no model: the live value whenever it is positive (a
/// smaller window must not be taken for 4096), 4096 only while it reads ≤ 0 (cold start).
@Test(arguments: [(-1, 4096), (0, 4096), (1, 1), (2048, 2048), (4096, 4096), (8192, 8192)])
func appleContextSizeIsTheLiveValueWhenPositive(_ live: Int, _ expected: Int) {
    if #available(macOS 26.0, *) {
        #expect(AppleBackend.contextSize(live: live) == expected)
    }
}

/// A reasoning level reaches the model as its own level on macOS 27; before it, the call is
/// refused naming the macOS it needs, before the model is asked.
@Test func appleReasoningLevelsAreTheModelsOwnOrRefused() async throws {
    #if canImport(FoundationModels, _version: 2.0)
    if #available(macOS 27.0, *) {
        // Compared outside #expect: its closure does not keep the #available refinement.
        let mapped = [ReasoningLevel.light, .moderate, .deep].map { AppleSession.level($0) }
        let same = mapped == [.light, .moderate, .deep]
        #expect(same)
        return
    }
    #endif
    if #available(macOS 26.0, *) {
        let session = AppleBackend().makeSession(instructions: nil, tools: [], history: [])
        do {
            _ = try await session.respond(to: "hi", settings: GenerationSettings(reasoning: .light), onPartial: nil)
            Issue.record("a reasoning level before macOS 27 must be refused")
        } catch let e as WispError {
            #expect(e.code == .invalidArgument && e.message.contains("macOS 27"))
        }
    }
}

@Suite(.enabled(if: appleSkipReason == nil, Comment(rawValue: appleSkipReason ?? "")), .serialized)
struct AppleModelTests {
    let brief = GenerationSettings(temperature: 0, maxOutputTokens: 120)

    @available(macOS 26.0, *)
    @Test func reportsReadyAndItsLiveContextSize() async throws {
        let backend = AppleBackend()
        #expect(await backend.availability() == .ready)
        let live = SystemLanguageModel.default.contextSize
        #expect(await backend.contextSize() == (live > 0 ? live : 4096))
        if #available(macOS 26.4, *) {
            let n = try await backend.tokenCount("Hello there, model.")
            #expect((n ?? 0) > 0)
        }
    }

    @available(macOS 26.0, *)
    @Test func oneSessionKeepsTheConversation() async throws {
        let session = AppleBackend().makeSession(instructions: "Answer in one short sentence.", tools: [], history: [])
        _ = try await session.respond(to: "My name is Ada. Please remember it.", settings: brief, onPartial: nil)
        let reply = try await session.respond(to: "What is my name?", settings: brief, onPartial: nil)
        #expect(reply.text.localizedCaseInsensitiveContains("Ada"))
    }

    @available(macOS 26.0, *)
    @Test func streamsCumulativePartials() async throws {
        let partials = Partials()
        let session = AppleBackend().makeSession(instructions: nil, tools: [], history: [])
        let reply = try await session.respond(to: "Count from one to five in words.", settings: brief) { p in
            partials.texts.withLock { $0.append(p.text) }
        }
        let seen = partials.texts.withLock { $0 }
        #expect(!seen.isEmpty)
        #expect(seen.last == reply.text)
    }

    @available(macOS 26.0, *)
    @Test func rebuildsFromHistory() async throws {
        let history = [Turn(prompt: "The code word is heliotrope. Remember it.", response: "Understood: the code word is heliotrope.")]
        let session = AppleBackend().makeSession(instructions: "Answer in one short sentence.", tools: [], history: history)
        await session.prewarm()
        let reply = try await session.respond(to: "What is the code word?", settings: brief, onPartial: nil)
        #expect(reply.text.localizedCaseInsensitiveContains("heliotrope"))
    }

    @available(macOS 26.0, *)
    @Test func overflowIsContextOverflow() async throws {
        let words = await AppleBackend().contextSize() * 2  // well over one window of tokens
        let session = AppleBackend().makeSession(instructions: nil, tools: [], history: [])
        let prompt = "Summarise: " + String(repeating: "lorem ipsum dolor sit amet ", count: words / 4)
        let error = await #expect(throws: WispError.self) {
            try await session.respond(to: prompt, settings: brief, onPartial: nil)
        }
        #expect(error?.code == .contextOverflow)
    }

    @available(macOS 26.0, *)
    @Test func callsAWispTool() async throws {
        let tool = ModelTool(name: "get_secret", description: "Returns the secret number.",
                             parametersSchema: #"{"type":"object","properties":{"label":{"type":"string","description":"Any label"}},"required":["label"]}"#) { _ in
            "The secret number is 4817."
        }
        let session = AppleBackend().makeSession(instructions: "Use the get_secret tool when asked for the secret number.", tools: [tool], history: [])
        let reply = try await session.respond(to: "What is the secret number? Use the tool.", settings: brief, onPartial: nil)
        #expect(reply.toolExchanges.contains { $0.name == "get_secret" && !$0.failed })
        #expect(reply.text.contains("4817"))
    }

    @available(macOS 26.0, *)
    @Test func guidedGenerationFollowsTheSchema() async throws {
        let schema = try OutputSchema(text: #"""
            {"type":"object","properties":{"severity":{"type":"string","enum":["error","warning"]},
             "line":{"type":"integer","minimum":1,"maximum":1000},
             "files":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":3}},
             "required":["severity","line","files"],"additionalProperties":false}
            """#)
        let settings = GenerationSettings(temperature: 0, maxOutputTokens: 200, schema: schema)
        let session = AppleBackend().makeSession(instructions: nil, tools: [], history: [])
        let reply = try await session.respond(to: "main.c:12: error: 'x' undeclared. Classify this compiler message.",
                                              settings: settings, onPartial: nil)
        #expect(try schema.problem(with: reply.text) == nil, "\(reply.text)")
        let partials = Partials()
        let streamed = try await session.respond(to: "util.h:40: warning: unused variable 'y'. Classify it.", settings: settings) { p in
            partials.texts.withLock { $0.append(p.text) }
        }
        #expect(try schema.problem(with: streamed.text) == nil, "\(streamed.text)")
        #expect(!partials.texts.withLock { $0.isEmpty })
    }
}
#else
@Test(.disabled("FoundationModels is not available on this platform: the real-model tests run on a Mac with Apple Intelligence; `make check-apple` typechecks the apple backend here"))
func appleModelTests() {}
#endif
