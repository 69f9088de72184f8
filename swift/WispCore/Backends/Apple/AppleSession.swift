// One live conversation with Apple's model (AppleBackend.swift says how this folder is checked
// without a Mac).
#if canImport(FoundationModels) && (os(macOS) || WISP_CHECK_APPLE)
import Foundation
import FoundationModels

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
#endif
