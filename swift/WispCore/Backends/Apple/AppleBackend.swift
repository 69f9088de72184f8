// The `apple` backend: Apple's on-device model through FoundationModels (macOS 26+).
//
// Every FoundationModels call below was written from the SDK's module interfaces (macOS 26.5
// SDK and Xcode 27.0 beta SDK), and `make check-apple` typechecks this file against both on
// Linux (scripts/check-apple.sh, which also sets WISP_CHECK_APPLE). On a Mac the real SDK
// compiles it; on Linux it compiles to nothing.
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import FoundationModels
import WispInfrastructure

/// wisp's backend seam over `SystemLanguageModel`. Each wisp session owns one live
/// `LanguageModelSession`, so the model's cache carries across a thread's turns.
@available(macOS 26.0, *)
public struct AppleBackend: ModelBackend {
    public let name = "apple"
    public let model = "apple-on-device"
    private let systemModel: SystemLanguageModel

    public init(systemModel: SystemLanguageModel = .default) {
        self.systemModel = systemModel
    }

    /// True when the model can answer now: what `auto` checks before it prefers this backend.
    public static var isAvailable: Bool { SystemLanguageModel.default.isAvailable }

    public func availability() async -> Availability {
        switch systemModel.availability {
        case .available: .ready
        case .unavailable(let reason): .unavailable(Self.describe(reason))
        }
    }

    static func describe(_ reason: SystemLanguageModel.Availability.UnavailableReason) -> String {
        switch reason {
        case .deviceNotEligible:
            "Apple's on-device model cannot run on this device (Apple Intelligence needs a Mac with Apple silicon). Use --backend openai with --endpoint instead."
        case .appleIntelligenceNotEnabled:
            "Apple Intelligence is turned off. Turn it on in System Settings > Apple Intelligence & Siri, then try again (or use --backend openai with --endpoint)."
        case .modelNotReady:
            "Apple's on-device model is not ready: it is still downloading or being prepared. Keep the Mac online and on power, and try again in a few minutes."
        @unknown default:
            "Apple's on-device model is not available (\(reason)). Check System Settings > Apple Intelligence & Siri, or use --backend openai with --endpoint."
        }
    }

    /// Read at run time: 4096 on macOS 26 (below 26.4 the property itself returns 4096), 8192 on
    /// some Macs under 27, and 0 for a while after a cold start. Any positive value is the
    /// model's; only ≤ 0 (unknown) falls back to 4096, macOS 26's window.
    public func contextSize() async -> Int {
        Self.contextSize(live: systemModel.contextSize)
    }

    static func contextSize(live: Int) -> Int {
        live > 0 ? live : 4096
    }

    /// The model's own count on macOS 26.4+; nil below, or when the model cannot count now
    /// (the core then estimates and relies on the overflow report).
    public func tokenCount(_ text: String) async throws -> Int? {
        guard #available(macOS 26.4, *) else { return nil }
        do {
            return try await systemModel.tokenCount(for: text)
        } catch let error as CancellationError {
            throw error
        } catch {
            return nil
        }
    }

    public func makeSession(instructions: String?, tools: [ModelTool], history: [Turn]) -> any ModelSession {
        AppleSession(model: systemModel, instructions: instructions, tools: tools, history: history)
    }
}

/// One live `LanguageModelSession`. Built fresh from `instructions` alone, or rebuilt from
/// wisp's canonical history (the condensing path): instructions entry first, then whole turns.
@available(macOS 26.0, *)
final class AppleSession: ModelSession {
    private let session: LanguageModelSession
    /// A tool whose schema FoundationModels cannot take: reported on the first call.
    private let setupError: WispError?

    init(model: SystemLanguageModel, instructions: String?, tools: [ModelTool], history: [Turn]) {
        var fmTools: [any FoundationModels.Tool] = []
        var setupError: WispError?
        do {
            for tool in tools { fmTools.append(try AppleTool(tool)) }
        } catch {
            setupError = WispError.from(error)
            fmTools = []
        }
        self.setupError = setupError
        if history.isEmpty {
            session = LanguageModelSession(model: model, tools: fmTools, instructions: instructions)
        } else {
            var entries: [Transcript.Entry] = []
            if instructions != nil || !fmTools.isEmpty {
                entries.append(.instructions(Transcript.Instructions(
                    segments: instructions.map { [.text(Transcript.TextSegment(content: $0))] } ?? [],
                    toolDefinitions: fmTools.map { Transcript.ToolDefinition(tool: $0) })))
            }
            for turn in history { entries += Self.entries(for: turn) }
            session = LanguageModelSession(model: model, tools: fmTools, transcript: Transcript(entries: entries))
        }
    }

    /// A whole turn: prompt, each tool call with its output, response. The new prompt never goes here.
    static func entries(for turn: Turn) -> [Transcript.Entry] {
        var entries: [Transcript.Entry] = [.prompt(Transcript.Prompt(segments: [.text(Transcript.TextSegment(content: turn.prompt))]))]
        for exchange in turn.toolExchanges {
            let id = UUID().uuidString
            let arguments = (try? GeneratedContent(json: exchange.arguments)) ?? GeneratedContent(kind: .string(exchange.arguments))
            entries.append(.toolCalls(Transcript.ToolCalls([Transcript.ToolCall(id: id, toolName: exchange.name, arguments: arguments)])))
            entries.append(.toolOutput(Transcript.ToolOutput(id: id, toolName: exchange.name, segments: [.text(Transcript.TextSegment(content: exchange.output))])))
        }
        entries.append(.response(Transcript.Response(assetIDs: [], segments: [.text(Transcript.TextSegment(content: turn.response))])))
        return entries
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        if let setupError { throw setupError }
        var options = GenerationOptions()
        if let t = settings.temperature { options.temperature = min(max(t, 0), 1) }
        if let n = settings.maxOutputTokens { options.maximumResponseTokens = max(n, 1) }
        let start = session.transcript.count
        var text = ""
        // Response and ResponseStream stay in this method: they are not Sendable on the 26 SDK.
        do {
            if let schema = settings.schema {
                // Guided generation: the model can only produce values of this schema.
                let guided = try AppleOutputSchema.generationSchema(schema)
                if let onPartial {
                    for try await snapshot in session.streamResponse(to: prompt, schema: guided, options: options) {
                        text = snapshot.content.jsonString
                        onPartial(PartialReply(text: text, tokens: estimatedTokens(text)))
                    }
                } else {
                    text = try await session.respond(to: prompt, schema: guided, options: options).content.jsonString
                }
            } else if let onPartial {
                // Snapshots are cumulative: each one holds the whole reply so far.
                // A first snapshot of "null" has been seen in string streams (AnyLanguageModel): skipped.
                for try await snapshot in session.streamResponse(to: prompt, options: options) {
                    if text.isEmpty && snapshot.content == "null" { continue }
                    text = snapshot.content
                    onPartial(PartialReply(text: text, tokens: estimatedTokens(text)))
                }
            } else {
                text = try await session.respond(to: prompt, options: options).content
            }
        } catch {
            // A cancelled call may surface as some other error: cancellation wins.
            if Task.isCancelled { throw WispError.callCancelled }
            // Guided output that cannot be decoded was cut off (maximumResponseTokens) or went astray.
            if settings.schema != nil, AppleBackend.isDecodingFailure(error) {
                if settings.maxOutputTokens != nil { throw OutputSchema.cutOff(maxOutputTokens: settings.maxOutputTokens) }
                throw WispError(.invalidOutput, OutputSchema.invalidOutputMessage(
                    "Apple's model produced output that could not be decoded into the schema (\(error))", maxOutputTokens: nil))
            }
            throw AppleBackend.wispError(from: error)
        }
        // The tool calls this turn made, from the entries the session appended.
        var exchanges: [ToolExchange] = []
        var pending: [Transcript.ToolCall] = []
        var lastResponse: String?
        for entry in session.transcript.dropFirst(start) {
            switch entry {
            case .toolCalls(let calls):
                pending += calls
            case .toolOutput(let output):
                // Its call: the same id, else the first pending call of that tool.
                let i = pending.firstIndex { $0.id == output.id } ?? pending.firstIndex { $0.toolName == output.toolName }
                let call = i.map { pending.remove(at: $0) }
                let result = Self.text(output.segments)
                exchanges.append(ToolExchange(name: output.toolName, arguments: call?.arguments.jsonString ?? "{}",
                                              output: result, failed: result.hasPrefix(AppleTool.failurePrefix)))
            case .response(let response):
                lastResponse = Self.text(response.segments)
            default:
                break
            }
        }
        // A stream can end without a snapshot (e.g. after a tool call): the transcript has the reply.
        if text.isEmpty, let lastResponse { text = lastResponse }
        return Generation(text: text, toolExchanges: exchanges)
    }

    nonisolated(nonsending)
    func prewarm() async {
        session.prewarm()
    }

    static func text(_ segments: [Transcript.Segment]) -> String {
        segments.map { segment in
            switch segment {
            case .text(let t): t.content
            case .structure(let s): s.content.jsonString
            default: ""  // 27's attachment and custom segments carry no text
            }
        }.joined()
    }
}

// MARK: - Errors

@available(macOS 26.0, *)
extension AppleBackend {
    /// Any error from FoundationModels as a WispError. An overflow becomes `context_overflow`,
    /// which starts the core's condensing; the rest name what happened and what to do.
    static func wispError(from error: any Error) -> WispError {
        if let e = error as? WispError { return e }
        if error is CancellationError { return .callCancelled }
        // Built with the 27 SDK (FoundationModels 2.x), a 27 runtime throws the new types;
        // a 26 runtime still throws GenerationError, handled below.
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, *), let e = wispError27(from: error) { return e }
        #endif
        if let e = error as? LanguageModelSession.GenerationError { return wispError(from: e) }
        if let e = error as? LanguageModelSession.ToolCallError {
            if e.underlyingError is CancellationError { return .callCancelled }
            return WispError(.generationFailed, "tool '\(e.tool.name)' failed: \(e.underlyingError.localizedDescription)")
        }
        let ns = error as NSError
        return WispError(.generationFailed, "Apple's model failed (\(ns.domain) \(ns.code)): \(ns.localizedDescription)")
    }

    /// A reply the framework could not decode into the requested structure.
    static func isDecodingFailure(_ error: any Error) -> Bool {
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, *), error is GeneratedContent.ParsingError { return true }
        #endif
        if let e = error as? LanguageModelSession.GenerationError, case .decodingFailure = e { return true }
        return false
    }

    /// The macOS 26 error family (deprecated in the 27 SDK, still thrown on 26 runtimes).
    static func wispError(from error: LanguageModelSession.GenerationError) -> WispError {
        switch error {
        case .exceededContextWindowSize(let c):
            WispError(.contextOverflow, "The conversation no longer fits in the model's context window. (\(c.debugDescription))")
        case .assetsUnavailable(let c):
            WispError(.modelUnavailable, "Apple's on-device model assets are not available (downloading or removed); try again in a few minutes. (\(c.debugDescription))")
        case .guardrailViolation(let c):
            WispError(.generationFailed, "guardrail: Apple's safety guardrails blocked the prompt or the reply; rephrase it. (\(c.debugDescription))")
        case .refusal(_, let c):
            WispError(.generationFailed, "refusal: the model declined to answer; rephrase the request. (\(c.debugDescription))")
        case .unsupportedLanguageOrLocale(let c):
            WispError(.generationFailed, "unsupported language: the model does not support this language or locale. (\(c.debugDescription))")
        case .unsupportedGuide(let c):
            WispError(.generationFailed, "unsupported guide: a generation guide in a tool schema is not supported. (\(c.debugDescription))")
        case .decodingFailure(let c):
            WispError(.generationFailed, "decoding failure: the model's output could not be decoded. (\(c.debugDescription))")
        case .rateLimited(let c):
            WispError(.busy, "Apple's model is rate-limited (this happens to background processes); try again shortly. (\(c.debugDescription))")
        case .concurrentRequests(let c):
            WispError(.busy, "This session is already answering a request. (\(c.debugDescription))")
        @unknown default:
            WispError(.generationFailed, "Apple's model failed: \(error.localizedDescription)")
        }
    }

    #if canImport(FoundationModels, _version: 2.0)
    /// The macOS 27 error family; nil when `error` is none of them.
    @available(macOS 27.0, *)
    static func wispError27(from error: any Error) -> WispError? {
        if let e = error as? LanguageModelError {
            switch e {
            case .contextSizeExceeded(let i):
                return WispError(.contextOverflow, "The conversation no longer fits in the model's context window (\(i.tokenCount) tokens, window \(i.contextSize)).")
            case .rateLimited(let i):
                let retry = i.resetDate.map { " after \($0)" } ?? " shortly"
                return WispError(.busy, "Apple's model is rate-limited; try again\(retry). (\(i.debugDescription))")
            case .guardrailViolation(let i):
                return WispError(.generationFailed, "guardrail: Apple's safety guardrails blocked the prompt or the reply; rephrase it. (\(i.debugDescription))")
            case .refusal(let i):
                return WispError(.generationFailed, "refusal: the model declined to answer; rephrase the request. (\(i.debugDescription))")
            case .unsupportedLanguageOrLocale(let i):
                return WispError(.generationFailed, "unsupported language: the model does not support '\(i.languageCode.identifier)'. (\(i.debugDescription))")
            case .unsupportedGenerationGuide(let i):
                return WispError(.generationFailed, "unsupported guide: a generation guide in a tool schema is not supported. (\(i.debugDescription))")
            case .unsupportedCapability(let i):
                return WispError(.generationFailed, "unsupported capability: the model cannot do what was asked. (\(i.debugDescription))")
            case .unsupportedTranscriptContent(let i):
                return WispError(.internal, "wisp rebuilt a transcript the model does not accept. (\(i.debugDescription))")
            case .timeout(let i):
                return WispError(.timeout, "Apple's model timed out. (\(i.debugDescription))")
            @unknown default:
                return WispError(.generationFailed, "Apple's model failed: \(e.localizedDescription)")
            }
        }
        if let e = error as? LanguageModelSession.Error {
            switch e {
            case .concurrentRequests:
                return WispError(.busy, "This session is already answering a request.")
            case .transcriptMutationWhileResponding:
                return WispError(.internal, "The transcript was changed while the model was answering.")
            @unknown default:
                return WispError(.generationFailed, "Apple's model failed: \(e.localizedDescription)")
            }
        }
        if let e = error as? SystemLanguageModel.Error {
            switch e {
            case .assetsUnavailable(let i):
                return WispError(.modelUnavailable, "Apple's on-device model assets are not available (downloading or removed); try again in a few minutes. (\(i.debugDescription))")
            @unknown default:
                return WispError(.modelUnavailable, "Apple's on-device model is not available: \(e.localizedDescription)")
            }
        }
        if let e = error as? GeneratedContent.ParsingError {
            return WispError(.generationFailed, "decoding failure: the model's output could not be parsed. (\(e.debugDescription))")
        }
        return nil
    }
    #endif
}

// MARK: - Structured output

/// A `respond` schema (wisp's supported subset, OutputSchema.swift) as a FoundationModels
/// `GenerationSchema`, so the model's decoding is constrained to it. Properties keep their order.
@available(macOS 26.0, *)
enum AppleOutputSchema {
    static func generationSchema(_ schema: OutputSchema) throws(WispError) -> GenerationSchema {
        do {
            return try GenerationSchema(root: node(schema.root, name: "Output"), dependencies: [])
        } catch let error as WispError {
            throw error
        } catch {
            throw WispError(.invalidArgument, "schema: Apple's model cannot take it: \(error)")
        }
    }

    /// `name` is the node's path, so every named node (object, choice) is unique in the schema.
    static func node(_ s: JSONValue, name: String) throws -> DynamicGenerationSchema {
        let description = s["description"]?.string
        if let c = s["const"] { return try constant(c, name: name) }
        if let members = s["enum"]?.array {
            let strings = members.compactMap(\.string)
            if strings.count == members.count {
                return DynamicGenerationSchema(name: name, description: description, anyOf: strings)
            }
            return DynamicGenerationSchema(name: name, description: description, anyOf: try members.enumerated().map { k, m in
                try constant(m, name: "\(name)_\(k)")
            })
        }
        if let branches = (s["anyOf"] ?? s["oneOf"])?.array {
            return DynamicGenerationSchema(name: name, description: description, anyOf: try branches.enumerated().map { k, b in
                try node(b, name: "\(name)_\(k)")
            })
        }
        switch s["type"]?.string {
        case "object":
            // Names as code points (UTF-8 bytes): NFC and NFD "café" are two properties.
            let required = Set((s["required"]?.array?.compactMap(\.string) ?? []).map { Array($0.utf8) })
            return DynamicGenerationSchema(name: name, description: description, properties: try (s["properties"]?.members ?? []).map { m in
                DynamicGenerationSchema.Property(name: m.key, description: m.value["description"]?.string,
                                                 schema: try node(m.value, name: "\(name)_\(m.key)"),
                                                 isOptional: !required.contains(Array(m.key.utf8)))
            })
        case "array":
            return DynamicGenerationSchema(arrayOf: try node(s["items"] ?? [:], name: "\(name)_item"),
                                           minimumElements: s["minItems"]?.int, maximumElements: s["maxItems"]?.int)
        case "string":
            let guides: [GenerationGuide<String>] = try s["pattern"]?.string.map { [.pattern(try Regex($0))] } ?? []
            return DynamicGenerationSchema(type: String.self, guides: guides)
        case "integer":
            let lo = s["minimum"]?.number?.double.flatMap { Int(exactly: $0.rounded(.up)) }
            let hi = s["maximum"]?.number?.double.flatMap { Int(exactly: $0.rounded(.down)) }
            var guides: [GenerationGuide<Int>] = []
            if let lo, let hi, lo <= hi { guides = [.range(lo...hi)] }
            else if let lo { guides = [.minimum(lo)] }
            else if let hi { guides = [.maximum(hi)] }
            return DynamicGenerationSchema(type: Int.self, guides: guides)
        case "number":
            let lo = s["minimum"]?.number?.double, hi = s["maximum"]?.number?.double
            var guides: [GenerationGuide<Double>] = []
            if let lo, let hi, lo <= hi { guides = [.range(lo...hi)] }
            else if let lo { guides = [.minimum(lo)] }
            else if let hi { guides = [.maximum(hi)] }
            return DynamicGenerationSchema(type: Double.self, guides: guides)
        case "boolean":
            return DynamicGenerationSchema(type: Bool.self)
        case "null":
            return try null(at: name)
        default:
            throw WispError(.invalidArgument, "schema: the node \(name) has no `type`, `enum`, `const` or `anyOf`")
        }
    }

    /// One fixed value: a string as a constant guide, a number as a one-point range.
    static func constant(_ value: JSONValue, name: String) throws -> DynamicGenerationSchema {
        switch value {
        case .string(let s): return DynamicGenerationSchema(type: String.self, guides: [.constant(s)])
        case .number(let n):
            if let i = n.int { return DynamicGenerationSchema(type: Int.self, guides: [.range(i...i)]) }
            guard let d = n.double else { throw WispError(.invalidArgument, "schema: the number \(n.text.prefix(40)) at \(name) is out of range for Apple's model") }
            return DynamicGenerationSchema(type: Double.self, guides: [.range(d...d)])
        case .null: return try null(at: name)
        default: throw WispError(.invalidArgument, "schema: `enum`/`const` at \(name) may hold strings, numbers and null only")
        }
    }

    static func null(at name: String) throws -> DynamicGenerationSchema {
        guard #available(macOS 26.4, *) else {
            throw WispError(.invalidArgument, "schema: `null` (at \(name)) needs macOS 26.4 or later with Apple's model")
        }
        return .null
    }
}

// MARK: - Tools

/// A wisp `ModelTool` as a FoundationModels tool: arguments arrive as `GeneratedContent`
/// under a schema built from the tool's JSON Schema, and are handed on as JSON text.
@available(macOS 26.0, *)
struct AppleTool: FoundationModels.Tool {
    typealias Arguments = GeneratedContent
    typealias Output = String

    /// Marks an output the model saw in place of a failed call (`ToolExchange.failed`).
    static let failurePrefix = "Tool error: "

    let name: String
    let description: String
    let parameters: GenerationSchema
    private let tool: ModelTool

    init(_ tool: ModelTool) throws(WispError) {
        name = tool.name
        description = tool.description
        self.tool = tool
        do {
            let json = try JSONSerialization.jsonObject(with: Data(tool.parametersSchema.utf8))
            parameters = try GenerationSchema(root: Self.schema(json, name: tool.name), dependencies: [])
        } catch {
            throw WispError(.internal, "tool '\(tool.name)': its parameters schema cannot be given to Apple's model: \(error)")
        }
    }

    /// The subset of JSON Schema wisp's tools use: object, array, string (with enum), integer, number, boolean.
    static func schema(_ json: Any, name: String) -> DynamicGenerationSchema {
        let node = json as? [String: Any] ?? [:]
        let description = node["description"] as? String
        if let choices = node["enum"] as? [String] {
            return DynamicGenerationSchema(name: name, description: description, anyOf: choices)
        }
        switch node["type"] as? String {
        case "object":
            let properties = node["properties"] as? [String: Any] ?? [:]
            let required = Set(node["required"] as? [String] ?? [])
            return DynamicGenerationSchema(name: name, description: description, properties: properties.keys.sorted().map { key in
                let sub = properties[key] ?? [:]
                return DynamicGenerationSchema.Property(
                    name: key, description: (sub as? [String: Any])?["description"] as? String,
                    schema: schema(sub, name: "\(name)_\(key)"), isOptional: !required.contains(key))
            })
        case "array":
            return DynamicGenerationSchema(arrayOf: schema(node["items"] ?? [:], name: "\(name)_item"),
                                           minimumElements: node["minItems"] as? Int, maximumElements: node["maxItems"] as? Int)
        case "integer": return DynamicGenerationSchema(type: Int.self)
        case "number": return DynamicGenerationSchema(type: Double.self)
        case "boolean": return DynamicGenerationSchema(type: Bool.self)
        default: return DynamicGenerationSchema(type: String.self)
        }
    }

    /// Schema guides are not always enforced (Apple forum threads 811620, 812501), so the
    /// arguments are checked again here and by the tool itself. A failure goes back to the
    /// model as text, so the turn goes on (a throw would end the whole call).
    @concurrent
    func call(arguments: GeneratedContent) async throws -> String {
        guard case .structure = arguments.kind else {
            return Self.failurePrefix + "the arguments must be a JSON object"
        }
        let result = try await ToolRun.output(tool, arguments.jsonString)
        return result.failed ? Self.failurePrefix + result.text : result.text
    }
}
#endif
