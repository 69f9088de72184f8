import Foundation

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
        messages = m
    }

    nonisolated(nonsending)
    func respond(to prompt: String, settings: GenerationSettings, onPartial: PartialHandler?) async throws -> Generation {
        var added: [ChatMessage] = [.text("user", prompt)]
        var exchanges: [ToolExchange] = []
        var promptTokens: Int?
        var outputTokens = 0
        var round = 0
        while true {
            // llama-server cannot constrain a reply to a schema and offer tools in one request
            // ("Cannot use custom grammar constraints with tools"), so a call with a schema offers none.
            let offerTools = !tools.isEmpty && settings.schema == nil
            let mustAnswer = round >= Self.maxToolRounds
            let pool = await server.slotPool()
            let slot = affinity.flatMap { pool?.acquire($0) }
            defer { if let slot { pool?.release(slot) } }
            let body = try OpenAIServer.chatBody(model: await server.requestModel(), messages: messages + added,
                                                 tools: offerTools ? tools : [], toolChoice: mustAnswer ? "none" : nil,
                                                 settings: settings, cache: pool.map { _ in PromptCache(slot: slot) })
            let tokensBefore = outputTokens
            let reply = try await server.streamChat(body: body) { partial in
                onPartial?(PartialReply(text: partial.text, tokens: tokensBefore + partial.tokens))
            }
            if promptTokens == nil { promptTokens = reply.promptTokens }
            outputTokens += reply.outputTokens ?? reply.chunks
            // Cut-off JSON can still parse (a number, say), so the server's word decides.
            if settings.schema != nil, reply.finishReason == "length" {
                throw OutputSchema.cutOff(maxOutputTokens: settings.maxOutputTokens)
            }

            guard offerTools, !mustAnswer, !reply.toolCalls.isEmpty else {
                added.append(.text("assistant", reply.text))
                messages += added
                return Generation(text: reply.text, toolExchanges: exchanges,
                                  promptTokens: promptTokens, outputTokens: outputTokens)
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
