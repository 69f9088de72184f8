import Foundation
import WispInfrastructure

/// One conversation: the OpenAI `messages` array (system = instructions, then per turn the
/// user prompt, any tool calls with their results, and the reply). Lives inside one thread's actor.
final class OpenAISession: ModelSession {
    /// Model↔tool round trips allowed in one call; the last round forbids tools so the model must answer.
    static let maxToolRounds = 8

    private let server: OpenAIServer
    private let tools: [ModelTool]
    /// The thread, for its llama-server slot (nil: no slot is named).
    private let affinity: SessionAffinity?
    private(set) var messages: [ChatMessage]

    init(server: OpenAIServer, instructions: String?, tools: [ModelTool], history: [Turn], affinity: SessionAffinity? = nil) {
        self.server = server
        self.tools = tools
        self.affinity = affinity
        messages = Self.messages(instructions: instructions, history: history[...])
    }

    /// The `messages` a session rebuilt from `history` starts with. A turn's reasoning is not sent
    /// back: reasoning models' chat templates drop earlier turns' reasoning, and servers differ in
    /// the field they would take it in.
    static func messages(instructions: String?, history: ArraySlice<Turn>) -> [ChatMessage] {
        var m: [ChatMessage] = []
        if let instructions, !instructions.isEmpty { m.append(.text("system", instructions)) }
        for (t, turn) in history.enumerated() {
            m.append(.text("user", turn.prompt))
            for (k, e) in turn.toolExchanges.enumerated() {
                let id = "call_\(t)_\(k)"
                m.append(.toolCalls([ToolCall(id: id, name: e.name, arguments: e.arguments)]))
                m.append(.toolResult(id: id, output: e.output))
            }
            m.append(.text("assistant", turn.response))
        }
        return m
    }

    /// Tools a request offers: none with a schema, as llama-server cannot constrain a reply to
    /// a schema and offer tools in one request ("Cannot use custom grammar constraints with tools").
    static func offered(_ tools: [ModelTool], _ settings: GenerationSettings) -> [ModelTool] {
        settings.schema == nil ? tools : []
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        var added: [ChatMessage] = [.text("user", prompt)]
        var exchanges: [ToolExchange] = []
        var promptTokens: Int?
        var outputTokens = 0
        var usage: Usage?
        var reasoning: [String] = []
        var round = 0
        while true {
            let offerTools = !Self.offered(tools, settings).isEmpty
            let mustAnswer = round >= Self.maxToolRounds
            let pool = await server.slotPool()
            let slot = affinity.flatMap { pool?.acquire($0) }
            defer { if let slot { pool?.release(slot) } }
            let body = try OpenAIServer.chatBody(model: await server.requestModel(), messages: messages + added,
                                                 tools: offerTools ? tools : [], toolChoice: mustAnswer ? "none" : nil,
                                                 settings: settings, cache: pool.map { _ in PromptCache(slot: slot) })
            let tokensBefore = outputTokens
            let reply = try await server.streamChat(body: body, reasoning: settings.reasoning) { partial in
                onPartial?(PartialReply(text: partial.text, tokens: tokensBefore.addingClamped(partial.tokens)))
            }
            if promptTokens == nil { promptTokens = reply.promptTokens }
            outputTokens = outputTokens.addingClamped(reply.outputTokens ?? reply.chunks)
            let reported = Usage(inputTokens: reply.promptTokens, outputTokens: reply.outputTokens, reasoningTokens: reply.reasoningTokens)
            usage = usage.map { $0 + reported } ?? reported
            if !reply.reasoning.isEmpty { reasoning.append(reply.reasoning) }
            // Cut-off JSON can still parse (a number, say), so the server's word decides.
            if settings.schema != nil, reply.finishReason == "length" {
                throw OutputSchema.cutOff(maxOutputTokens: settings.maxOutputTokens)
            }

            guard offerTools, !mustAnswer, !reply.toolCalls.isEmpty else {
                added.append(.text("assistant", reply.text))
                messages += added
                return Generation(text: reply.text, toolExchanges: exchanges,
                                  promptTokens: promptTokens, outputTokens: outputTokens, usage: usage ?? Usage(),
                                  reasoning: reasoning.isEmpty ? nil : reasoning.joined(separator: "\n\n"))
            }
            added.append(.toolCalls(reply.toolCalls))
            for call in reply.toolCalls {
                try Task.checkCancellation()
                let exchange = await run(call)
                exchanges.append(exchange)
                added.append(.toolResult(id: call.id, output: exchange.output))
            }
            round += 1
        }
    }

    nonisolated(nonsending)
    private func run(_ call: ToolCall) async -> ToolExchange {
        let arguments = call.arguments.trimmingCharacters(in: .whitespacesAndNewlines).isEmpty ? "{}" : call.arguments
        return await ToolRun.exchange(tools.first(where: { $0.name == call.name }), name: call.name, arguments: arguments) {
            "There is no tool named '\(call.name)'. Available tools: \(tools.map(\.name).joined(separator: ", "))."
        }
    }
}

/// A tool call as the model made it.
struct ToolCall: Sendable, Equatable {
    var id: String
    var name: String
    var arguments: String
}

/// One entry of the OpenAI `messages` array.
enum ChatMessage: Sendable, Equatable {
    case text(String, String)              // role, content
    case toolCalls([ToolCall])             // assistant message that calls tools
    case toolResult(id: String, output: String)

    var json: [String: Any] {
        switch self {
        case let .text(role, content):
            return ["role": role, "content": content]
        case let .toolCalls(calls):
            // content "" rather than null: llama-cpp-python answers null with HTTP 500.
            return ["role": "assistant", "content": "", "tool_calls": calls.map {
                ["id": $0.id, "type": "function", "function": ["name": $0.name, "arguments": $0.arguments]] as [String: Any]
            }]
        case let .toolResult(id, output):
            return ["role": "tool", "tool_call_id": id, "content": output]
        }
    }
}
