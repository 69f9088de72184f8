#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// The `echo` backend: no model, fully deterministic. Its behaviour is a public contract
/// (docs/echo.md) that outside checks rely on;
/// change it only on purpose, and note it there.
public struct EchoBackend: ModelBackend {
    public let name = "echo"
    public let model = "echo"
    /// The context window when `--context-size` does not set one.
    public static let defaultContextSize = 4096
    let context: Int
    let delayMs: Int
    let crash: @Sendable () -> Never
    let holds = EchoHolds()

    /// `crash` is what `!crash` does: the process ends it (wisp-core exits 70); library code never exits.
    public init(contextSize: Int? = nil, delayMs: Int = 0,
                crash: @escaping @Sendable () -> Never = { fatalError("echo backend: !crash") }) {
        self.context = contextSize ?? Self.defaultContextSize
        self.delayMs = delayMs
        self.crash = crash
    }

    public func availability() async -> Availability { .ready }
    public func contextSize() async -> Int { context }
    /// Echo reports overflow the way a real model does (by failing the call), so the core's
    /// recovery path is the one exercised; it offers no pre-flight count.
    public func tokenCount(_ text: String) async throws -> Int? { nil }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        EchoSession(instructions: instructions, tools: tools, turns: history, context: context, delayMs: delayMs,
                    holds: holds, crash: crash)
    }
}

final class EchoSession: ModelSession {
    private let instructions: String?
    private let tools: [String: ModelTool]
    private var turns: [Turn]
    private let context: Int
    private let delayMs: Int
    private let holds: EchoHolds
    private let crash: @Sendable () -> Never

    init(instructions: String?, tools: [ModelTool], turns: [Turn], context: Int, delayMs: Int,
         holds: EchoHolds, crash: @escaping @Sendable () -> Never) {
        self.crash = crash
        self.holds = holds
        self.instructions = instructions
        self.tools = Dictionary(tools.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        self.turns = turns
        self.context = context
        self.delayMs = delayMs
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        try await respond(to: ModelPrompt(text: prompt), settings: settings, onPartial: onPartial)
    }

    /// Directives are read from the caller's prompt; attached files are listed after the reply
    /// (`file F: first line`) and count towards the context as part of the turn's prompt.
    nonisolated(nonsending)
    func respond(to message: ModelPrompt, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        let n = turns.count + 1
        var sleepMs = 0
        var holdKey: String?
        var exchanges: [ToolExchange] = []
        let prompt = message.rendered
        var body = message.text

        switch try EchoDirective(message.text) {
        case .none:
            break
        case .crash:
            crash()
        case .sleep(let ms):
            sleepMs = ms
        case .hold(let key):
            holdKey = key
        case .held(let key, let count):
            try await holds.held(key, count: count)
        case .release(let key):
            body = "released \(holds.release(key))"
        case .fail(let code):
            throw WispError(code, "echo backend: failed on purpose (!fail \(code.rawValue))")
        case .tool(let name, let arguments):
            let exchange = await callTool(name, arguments)
            exchanges.append(exchange)
            body = exchange.failed ? "tool \(name) failed: \(exchange.output)" : "tool \(name) -> \(exchange.output)"
        }

        let text = try await replyText(n: n, body: body, files: message.files, schema: settings.schema)
        // A stored turn's count is not echo's own: the sum saturates.
        let used = ([estimatedTokens(instructions ?? ""), estimatedTokens(prompt), estimatedTokens(text)]
            + turns.map(\.tokens) + exchanges.map(\.estimatedTokens)).clampedSum()
        guard used <= context else {
            throw WispError(.contextOverflow, "echo backend: \(used) tokens exceed the \(context)-token context")
        }

        // Parked once the call would otherwise reply, so a released hold answers as a sleep would.
        if let holdKey { try await holds.hold(holdKey) }
        try await pace(text, delay: sleepMs.addingClamped(delayMs), onPartial: onPartial)

        let turn = Turn(prompt: prompt, toolExchanges: exchanges, response: text)
        turns.append(turn)
        // Usage is echo's own count of what it read and wrote (the contract); `reasoning` changes nothing here.
        let read = used - estimatedTokens(text), wrote = estimatedTokens(text)
        return Generation(text: text, toolExchanges: exchanges, promptTokens: read, outputTokens: wrote,
                          usage: Usage(inputTokens: read, outputTokens: wrote))
    }

    /// With a schema, the reply is the value the contract builds from it (directives still act);
    /// otherwise `echo N: P` and a line per attached file.
    nonisolated(nonsending)
    private func replyText(n: Int, body: String, files: [AttachedFile], schema: OutputSchema?) async throws -> String {
        if let schema {
            // Off the pipe loop: a schema may ask for a large value (bounded by echoValue).
            return try await offPipeLoop(ifDropped: WispError.callCancelled) { () throws(WispError) in
                try schema.echoValue(n: n).jsonText
            }
        }
        var text = "echo \(n): \(body)"
        for file in files {
            text += "\nfile \(file.path): \(TextLines.first(file.text))"
        }
        return text
    }

    /// Waits `delay` ms before the reply; with `onPartial`, at least two cumulative partials spread
    /// over it, as a streaming model would.
    nonisolated(nonsending)
    private func pace(_ text: String, delay: Int, onPartial: PartialHandler?) async throws {
        do {
            if let onPartial {
                let half = text.prefix(max(1, text.count / 2))
                try await Self.sleep(ms: delay / 2)
                let first = estimatedTokens(String(half))
                onPartial(PartialReply(text: String(half), tokens: first))
                try await Self.sleep(ms: delay - delay / 2)
                onPartial(PartialReply(text: text, tokens: max(first + 1, estimatedTokens(text))))
            } else {
                try await Self.sleep(ms: delay)
            }
        } catch {
            throw WispError.callCancelled
        }
        try Task.checkCancellation()
    }

    private static func sleep(ms: Int) async throws {
        if ms > 0 { try await Task.sleep(for: .milliseconds(ms)) }
    }

    nonisolated(nonsending)
    private func callTool(_ name: String, _ arguments: String) async -> ToolExchange {
        await ToolRun.exchange(tools[name], name: name, arguments: arguments) {
            let bound = tools.keys.sorted()
            return bound.isEmpty
                ? "no tools are bound to this thread (bind them with `tools` when the thread is created)"
                : "tool '\(name)' is not bound to this thread; bound: \(bound.joined(separator: ", "))"
        }
    }
}

/// A directive at the very start of an echo prompt; the rest of the prompt follows a space.
enum EchoDirective: Equatable {
    case none
    case sleep(Int)
    case hold(String)
    case held(String, count: Int)
    case release(String)
    case fail(WispError.Code)
    case crash
    case tool(name: String, arguments: String)

    /// `!sleep`'s milliseconds: up to a day.
    static let sleepRange = 0...86_400_000
    /// `!held`'s count: no more calls than a core could ever run at once.
    static let heldRange = 1...1_000_000

    init(_ prompt: String) throws {
        guard prompt.hasPrefix("!") else { self = .none; return }
        let words = prompt.split(separator: " ", maxSplits: 2, omittingEmptySubsequences: false)
        let argument = words.count > 1 ? String(words[1]) : ""
        switch words[0] {
        case "!crash":
            self = .crash
        case "!sleep":
            guard let ms = OutsideNumber.int(argument, in: Self.sleepRange) else {
                throw WispError(.invalidArgument, "echo: !sleep needs a whole number of milliseconds up to "
                                + "\(Self.sleepRange.upperBound), e.g. `!sleep 500 hello`")
            }
            self = .sleep(ms)
        case "!hold", "!release":
            guard !argument.isEmpty else {
                throw WispError(.invalidArgument, "echo: \(words[0]) needs a key, e.g. `\(words[0]) first hello`")
            }
            self = words[0] == "!hold" ? .hold(argument) : .release(argument)
        case "!held":
            let count = words.count > 2 ? String(words[2].prefix { $0 != " " }) : "1"
            guard !argument.isEmpty, let n = OutsideNumber.int(count, in: Self.heldRange) else {
                throw WispError(.invalidArgument, "echo: !held needs a key and a count of calls from 1 to "
                                + "\(Self.heldRange.upperBound), e.g. `!held first 2`")
            }
            self = .held(argument, count: n)
        case "!fail":
            guard let code = WispError.Code(rawValue: argument) else {
                let codes = WispError.Code.allCases.map(\.rawValue).joined(separator: ", ")
                throw WispError(.invalidArgument, "echo: !fail needs one of: \(codes)")
            }
            self = .fail(code)
        case "!tool":
            guard !argument.isEmpty else {
                throw WispError(.invalidArgument,
                        "echo: !tool needs a tool name and JSON arguments, " +
                        "e.g. `!tool read_file {\"path\": \"README.md\"}`")
            }
            let json = words.count > 2 ? String(words[2]) : "{}"
            self = .tool(name: argument, arguments: json)
        default:
            self = .none // not a directive: echoed like any text
        }
    }
}
