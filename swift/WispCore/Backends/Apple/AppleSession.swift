// One live conversation with Apple's model (AppleBackend.swift says how this folder is checked
// without a Mac).
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import WispInfrastructure
import FoundationModels

/// One live `LanguageModelSession`. Built fresh from `instructions` alone, or rebuilt from
/// wisp's canonical history (the condensing path): instructions entry first, then whole turns.
@available(macOS 26.0, *)
final class AppleSession: ModelSession {
    private let model: SystemLanguageModel
    private let session: LanguageModelSession
    /// A tool whose schema FoundationModels cannot take: reported on the first call.
    private let setupError: WispError?

    init(model: SystemLanguageModel, instructions: String?, tools: [ModelTool], history: [Turn]) {
        self.model = model
        var fmTools: [any FoundationModels.Tool] = []
        var setupError: WispError?
        do {
            fmTools = try Self.tools(tools)
        } catch {
            setupError = error
            fmTools = []
        }
        self.setupError = setupError
        if history.isEmpty {
            session = LanguageModelSession(model: model, tools: fmTools, instructions: instructions)
        } else {
            let entries = Self.entries(instructions: instructions, tools: fmTools, history: history[...])
            session = LanguageModelSession(model: model, tools: fmTools, transcript: Transcript(entries: entries))
        }
    }

    static func tools(_ tools: [ModelTool]) throws(WispError) -> [any FoundationModels.Tool] {
        var fmTools: [any FoundationModels.Tool] = []
        for tool in tools { fmTools.append(try AppleTool(tool)) }
        return fmTools
    }

    /// The transcript a session rebuilt from `history` starts with. A turn's reasoning is not put
    /// back: the model signs its reasoning, and wisp keeps the text only.
    static func entries(instructions: String?, tools: [any FoundationModels.Tool],
                        history: ArraySlice<Turn>) -> [Transcript.Entry] {
        var entries: [Transcript.Entry] = []
        if instructions != nil || !tools.isEmpty {
            entries.append(.instructions(Transcript.Instructions(
                segments: instructions.map { [.text(Transcript.TextSegment(content: $0))] } ?? [],
                toolDefinitions: tools.map { Transcript.ToolDefinition(tool: $0) })))
        }
        for turn in history { entries += Self.entries(for: turn) }
        return entries
    }

    /// A whole turn: prompt, each tool call with its output, response. The new prompt never goes here.
    static func entries(for turn: Turn) -> [Transcript.Entry] {
        var entries: [Transcript.Entry] = [prompt(turn.prompt)]
        for exchange in turn.toolExchanges {
            let id = UUID().uuidString
            let arguments = (try? GeneratedContent(json: exchange.arguments))
                ?? GeneratedContent(kind: .string(exchange.arguments))
            entries.append(.toolCalls(Transcript.ToolCalls([Transcript.ToolCall(id: id, toolName: exchange.name,
                                                                                arguments: arguments)])))
            entries.append(.toolOutput(Transcript.ToolOutput(id: id, toolName: exchange.name,
                    segments: [.text(Transcript.TextSegment(content: exchange.output))])))
        }
        entries.append(.response(Transcript.Response(assetIDs: [],
                segments: [.text(Transcript.TextSegment(content: turn.response))])))
        return entries
    }

    static func prompt(_ text: String) -> Transcript.Entry {
        .prompt(Transcript.Prompt(segments: [.text(Transcript.TextSegment(content: text))]))
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        if let setupError { throw setupError }
        var options = GenerationOptions()
        if let t = settings.temperature { options.temperature = min(max(t, 0), 1) }
        if let n = settings.maxOutputTokens { options.maximumResponseTokens = max(n, 1) }
        let start = session.transcript.count
        var text: String
        var usage: Usage
        do {
            (text, usage) = try await generate(prompt, settings: settings, options: options, onPartial: onPartial)
        } catch {
            // A cancelled call may surface as some other error: cancellation wins.
            if Task.isCancelled { throw WispError.callCancelled }
            // Guided output that cannot be decoded was cut off (maximumResponseTokens) or went astray.
            if settings.schema != nil, AppleBackend.isDecodingFailure(error) {
                if settings.maxOutputTokens != nil {
                    throw OutputSchema.cutOff(maxOutputTokens: settings.maxOutputTokens)
                }
                throw WispError(.invalidOutput, OutputSchema.invalidOutputMessage(
                    "Apple's model produced output that could not be decoded into the schema " +
                    "(\(error))", maxOutputTokens: nil))
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
                let i = pending.firstIndex { $0.id == output.id }
                    ?? pending.firstIndex { $0.toolName == output.toolName }
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
        // Below 27 the model reports no usage; from 26.4 its tokenizer counts what was read and written.
        if usage == Usage(), #available(macOS 26.4, *) { usage = await counted(since: start) }
        return Generation(text: text, toolExchanges: exchanges, promptTokens: usage.inputTokens,
                          outputTokens: usage.outputTokens,
                          usage: usage, reasoning: reasoning(since: start))
    }

    /// The reply, by the overloads this system has, and on macOS 27 what it cost as the model
    /// reports it. Response and ResponseStream stay in this method: they are not Sendable on the 26 SDK.
    nonisolated(nonsending)
    private func generate(_ prompt: String, settings: GenerationSettings, options: GenerationOptions,
                          onPartial: PartialHandler?) async throws -> (String, Usage) {
        var text = ""
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, *) {
            // The same defaults as the overloads without context options, plus the call's reasoning level.
            let context = ContextOptions(includeSchemaInPrompt: settings.schema == nil ? nil : true,
                                         reasoningLevel: settings.reasoning.map(Self.level))
            var usage = Usage()
            if let schema = settings.schema {
                // Guided generation: the model can only produce values of this schema.
                let guided = try AppleOutputSchema.generationSchema(schema)
                guard let onPartial else {
                    let response = try await session.respond(to: prompt, schema: guided, options: options,
                                                             contextOptions: context)
                    return (response.content.jsonString, Self.usage(response.usage))
                }
                let stream = session.streamResponse(to: prompt, schema: guided, options: options,
                                                    contextOptions: context)
                for try await snapshot in stream {
                    text = snapshot.content.jsonString
                    usage = Self.usage(snapshot.usage)
                    onPartial(PartialReply(text: text, tokens: estimatedTokens(text)))
                }
                return (text, usage)
            }
            guard let onPartial else {
                let response = try await session.respond(to: prompt, options: options, contextOptions: context)
                return (response.content, Self.usage(response.usage))
            }
            for try await snapshot in session.streamResponse(to: prompt, options: options, contextOptions: context) {
                usage = Self.usage(snapshot.usage)
                if text.isEmpty && snapshot.content == "null" { continue }
                text = snapshot.content
                onPartial(PartialReply(text: text, tokens: estimatedTokens(text)))
            }
            return (text, usage)
        }
        #endif
        if settings.reasoning != nil { throw AppleBackend.noReasoningLevel() }
        if let schema = settings.schema {
            let guided = try AppleOutputSchema.generationSchema(schema)
            guard let onPartial else {
                return (try await session.respond(to: prompt, schema: guided,
                                                  options: options).content.jsonString, Usage())
            }
            for try await snapshot in session.streamResponse(to: prompt, schema: guided, options: options) {
                text = snapshot.content.jsonString
                onPartial(PartialReply(text: text, tokens: estimatedTokens(text)))
            }
            return (text, Usage())
        }
        guard let onPartial else { return (try await session.respond(to: prompt, options: options).content, Usage()) }
        // Snapshots are cumulative: each one holds the whole reply so far.
        // A first snapshot of "null" has been seen in string streams (AnyLanguageModel): skipped.
        for try await snapshot in session.streamResponse(to: prompt, options: options) {
            if text.isEmpty && snapshot.content == "null" { continue }
            text = snapshot.content
            onPartial(PartialReply(text: text, tokens: estimatedTokens(text)))
        }
        return (text, Usage())
    }

    /// What the model read (the transcript up to the new prompt, the prompt, tool outputs) and
    /// wrote (tool calls, the reply) in this call, by its tokenizer; nothing when it cannot count.
    @available(macOS 26.4, *)
    nonisolated(nonsending)
    private func counted(since start: Int) async -> Usage {
        var read = Array(session.transcript.prefix(start)), wrote: [Transcript.Entry] = []
        for entry in session.transcript.dropFirst(start) {
            switch entry {
            case .toolCalls, .response: wrote.append(entry)
            default: read.append(entry)
            }
        }
        guard !wrote.isEmpty, let input = try? await model.tokenCount(for: read),
              let output = try? await model.tokenCount(for: wrote) else { return Usage() }
        return Usage(inputTokens: input, outputTokens: output)
    }

    /// The reasoning entries this call appended (macOS 27), as text.
    private func reasoning(since start: Int) -> String? {
        #if canImport(FoundationModels, _version: 2.0)
        if #available(macOS 27.0, *) {
            var thoughts: [String] = []
            for entry in session.transcript.dropFirst(start) {
                if case .reasoning(let r) = entry { thoughts.append(Self.text(r.segments)) }
            }
            let text = thoughts.filter { !$0.isEmpty }.joined(separator: "\n\n")
            return text.isEmpty ? nil : text
        }
        #endif
        return nil
    }

    #if canImport(FoundationModels, _version: 2.0)
    @available(macOS 27.0, *)
    static func level(_ level: ReasoningLevel) -> ContextOptions.ReasoningLevel {
        switch level {
        case .light: .light
        case .moderate: .moderate
        case .deep: .deep
        }
    }

    @available(macOS 27.0, *)
    static func usage(_ u: LanguageModelSession.Usage) -> Usage {
        Usage(inputTokens: u.input.totalTokenCount, outputTokens: u.output.totalTokenCount,
              reasoningTokens: u.output.reasoningTokenCount)
    }
    #endif

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
#endif
