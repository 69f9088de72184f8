#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
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
    private var readCheck = ReadCheck()

    convenience init(server: OpenAIServer, instructions: String?, tools: [ModelTool], history: [Turn],
                     affinity: SessionAffinity? = nil) {
        self.init(server: server, tools: tools,
                  messages: Self.messages(instructions: instructions, history: history[...]), affinity: affinity)
    }

    /// A session that goes on from `messages` (another endpoint's session's, after a move).
    init(server: OpenAIServer, tools: [ModelTool], messages: [ChatMessage], affinity: SessionAffinity?) {
        self.server = server
        self.tools = tools
        self.affinity = affinity
        self.messages = messages
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
    func respond(to prompt: String, settings: GenerationSettings,
                 onPartial: PartialHandler?) async throws -> Generation {
        var added: [ChatMessage] = [.text("user", prompt)]
        var exchanges: [ToolExchange] = []
        var tally = Tally()
        var round = 0
        let threadTools = Self.offered(tools, settings)
        // A model that writes its calls as text, handed a result with the tools still offered,
        // tends to ask for the same tool again instead of answering: that repeat is not run, and
        // the next round, offered no tools, is its answer (docs/tools.md, "Tool calls written as text").
        var answerNow = false
        while true {
            let offerTools = !threadTools.isEmpty && !answerNow
            let mustAnswer = round >= Self.maxToolRounds || answerNow
            let pool = await server.slotPool()
            await server.keepModelLoaded()
            // Held through the round's tool calls too: the thread keeps its slot's cache.
            let slot = affinity.flatMap { pool?.acquire($0) }
            defer { if let slot { pool?.release(slot) } }
            let reply = try await ask(messages + added, on: (pool, slot), offerTools: offerTools,
                                      mustAnswer: mustAnswer, settings: settings, tokensBefore: tally.outputTokens,
                                      onPartial: onPartial)
            tally.add(reply)
            // Cut-off JSON can still parse (a number, say), so the server's word decides.
            if settings.schema != nil, reply.finishReason == "length" {
                throw OutputSchema.cutOff(maxOutputTokens: settings.maxOutputTokens)
            }

            var calls = offerTools ? reply.toolCalls : []
            if calls.isEmpty, !threadTools.isEmpty, !mustAnswer,
               let call = TextToolCall.parse(reply.text, offered: threadTools, index: exchanges.count) {
                if TextToolCall.repeats(call, of: exchanges, offered: threadTools) {
                    answerNow = true
                    round += 1
                    continue
                }
                calls = [call]
            }
            guard !mustAnswer, !calls.isEmpty else {
                added.append(.text("assistant", reply.text))
                messages += added
                return tally.generation(text: reply.text, toolExchanges: exchanges,
                                        finishReason: reply.finishReason == "length" ? "length" : nil)
            }
            added.append(.toolCalls(calls))
            for call in calls {
                try Task.checkCancellation()
                let exchange: ToolExchange
                if let again = Self.earlier(call, in: exchanges) {
                    exchange = again
                } else {
                    exchange = await run(call)
                }
                exchanges.append(exchange)
                added.append(.toolResult(id: call.id, output: exchange.output))
            }
            round += 1
        }
    }

    /// One request of a call: `sent` streamed from the server (on the thread's slot, where the
    /// pool gave it one), its partial replies reported, and a prompt the server read short
    /// (`ReadCheck`) reported as an overflow.
    nonisolated(nonsending)
    private func ask(_ sent: [ChatMessage], on place: (pool: SlotPool?, slot: Int?), offerTools: Bool,
                     mustAnswer: Bool, settings: GenerationSettings, tokensBefore: Int,
                     onPartial: PartialHandler?) async throws -> ChatReply {
        let (pool, slot) = place
        let body = try OpenAIServer.chatBody(model: await server.requestModel(), messages: sent,
                                             tools: offerTools ? tools : [], toolChoice: mustAnswer ? "none" : nil,
                                             settings: settings, cache: pool.map { _ in PromptCache(slot: slot) })
        let floor = readCheck.floor(sent)
        // A thread of its own that found no free slot waits for the server to free one.
        let noFreeSlot = pool != nil && affinity != nil && slot == nil
        onPartial?(PartialReply(waiting: noFreeSlot ? .slot : .prompt(tokens: floor.count)))
        let reply = try await server.streamChat(body: body, reasoning: settings.reasoning,
                                                session: affinity?.key) { partial in
            onPartial?(PartialReply(text: partial.text, tokens: tokensBefore.addingClamped(partial.tokens)))
        }
        if let read = reply.readTokens, read < floor.tokens,
           await server.learnWindow(read: read, sent: floor.tokens, estimate: floor.count) {
            throw WispError(.contextOverflow, """
                the model server read \(read) tokens of a request of at least \(floor.tokens): it cut the prompt \
                silently to fit its window
                """)
        }
        readCheck.record(read: reply.readTokens, messages: sent.count,
                         bytes: offerTools ? body.count : sent.map(\.bytes).clampedSum())
        return reply
    }

    /// What a call's requests add up to: the first one's prompt, every one's output and usage, reasoning.
    private struct Tally {
        var promptTokens: Int?
        var outputTokens = 0
        var usage: Usage?
        var reasoning: [String] = []

        mutating func add(_ reply: ChatReply) {
            if promptTokens == nil { promptTokens = reply.promptTokens }
            outputTokens = outputTokens.addingClamped(reply.outputTokens ?? reply.chunks)
            let reported = Usage(inputTokens: reply.promptTokens, outputTokens: reply.outputTokens,
                                 reasoningTokens: reply.reasoningTokens,
                                 cachedTokens: reply.cachedTokens, firstTokenSeconds: reply.firstTokenSeconds,
                                 generationSeconds: reply.generationSeconds)
            usage = usage.map { $0 + reported } ?? reported
            if !reply.reasoning.isEmpty { reasoning.append(reply.reasoning) }
        }

        func generation(text: String, toolExchanges: [ToolExchange], finishReason: String?) -> Generation {
            Generation(text: text, toolExchanges: toolExchanges,
                       promptTokens: promptTokens, outputTokens: outputTokens, usage: usage ?? Usage(),
                       reasoning: reasoning.isEmpty ? nil : reasoning.joined(separator: "\n\n"),
                       finishReason: finishReason)
        }
    }

    /// The same call made earlier in this turn, answered again from its result rather than run
    /// again: the files have not changed between two rounds of one call, and a small model that
    /// repeats itself is not helped by a second run's cost. Arguments compare as JSON values.
    static func earlier(_ call: ToolCall, in exchanges: [ToolExchange]) -> ToolExchange? {
        guard let arguments = try? JSONValue.parse(call.arguments) else { return nil }
        return exchanges.last { e in
            guard sameText(e.name, call.name), !e.failed, let earlier = try? JSONValue.parse(e.arguments) else {
                return false
            }
            return earlier == arguments
        }
    }

    nonisolated(nonsending)
    private func run(_ call: ToolCall) async -> ToolExchange {
        let arguments = call.arguments.trimmingWhitespace().isEmpty ? "{}" : call.arguments
        return await ToolRun.exchange(tools.first(where: { $0.name == call.name }), name: call.name,
                                      arguments: arguments) {
            "There is no tool named '\(call.name)'. Available tools: \(tools.map(\.name).joined(separator: ", "))."
        }
    }
}

/// What the server read of each request, against what was sent: a server that fits a long
/// conversation to its window by itself (Ollama; LM Studio with its overflow policy) answers a
/// cut prompt as if it were whole, and says so only in `usage.prompt_tokens`.
///
/// The floor is what the request is at least, in the server's own tokens: what it read of this
/// session's last request (whose messages this one repeats), less a margin for a chat template
/// that renders the last turn a little differently once it is not the last (1% and 8 tokens),
/// plus the messages added since, at three quarters of the tokens a byte of text that the
/// server read last time (against the whole request body where tools were offered, their
/// schemas being tokens too), and never more than a token for 4 bytes before that quarter
/// is taken off. The cap is there because what was read includes the chat template's fixed
/// part (a default system prompt, the generation prompt), which does not grow with the
/// messages: learnt from a short request it is most of the count (SmolLM2 reads 39 tokens of a
/// 40-byte first prompt, its default system prompt among them), and charged per byte it makes a
/// healthy next turn look cut.
/// Text runs 3–5 bytes a token, so the cap still floors a real cut's missing turns. The first
/// request of a session has only 8 bytes of text a token (no tokenizer in use exceeds that over
/// a message), so it catches only a gross cut.
struct ReadCheck {
    /// The most tokens a byte of the messages added since is taken to cost.
    static let maxTokensPerByte = 0.25
    private var last: (read: Int, messages: Int, bytes: Int)?

    struct Floor {
        /// No fewer tokens than this can be read without a cut.
        var tokens: Int
        /// About how many tokens the request is: for a person watching it, and to tell a cut
        /// from a server that counts otherwise (`OpenAIServer.learnWindow`).
        var count: Int
    }

    func floor(_ sent: [ChatMessage]) -> Floor {
        let known = last.flatMap { $0.messages <= sent.count && $0.bytes > 0 ? $0 : nil }
        let new = Double(sent[(known?.messages ?? 0)...].reduce(0) { $0 + $1.bytes })
        guard let known else { return Floor(tokens: Int(new / 8), count: Int(new / 4)) }
        let perByte = min(Double(known.read) / Double(known.bytes), Self.maxTokensPerByte)
        let repeated = Double(known.read) * 0.99 - 8
        return Floor(tokens: max(0, Int(repeated + 0.75 * perByte * new)),
                     count: Int(Double(known.read) + perByte * new))
    }

    /// The server read `read` tokens of a request of `messages` messages in a body of `bytes`.
    mutating func record(read: Int?, messages: Int, bytes: Int) {
        // A count past any real window is not believed.
        last = read.flatMap { $0 <= 1 << 40 ? ($0, messages, bytes) : nil }
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

    /// The UTF-8 bytes of what the message says (content, tool names and arguments).
    var bytes: Int {
        switch self {
        case let .text(_, content): content.utf8.count
        case let .toolCalls(calls): calls.reduce(0) { $0 + $1.name.utf8.count + $1.arguments.utf8.count }
        case let .toolResult(_, output): output.utf8.count
        }
    }

    var json: [String: Any] {
        switch self {
        case let .text(role, content):
            return ["role": role, "content": content]
        case let .toolCalls(calls):
            // content "" rather than null: llama-cpp-python answers null with HTTP 500.
            return ["role": "assistant", "content": "", "tool_calls": calls.map {
                ["id": $0.id, "type": "function", "function": ["name": $0.name,
                                                               "arguments": $0.arguments]] as [String: Any]
            }]
        case let .toolResult(id, output):
            return ["role": "tool", "tool_call_id": id, "content": output]
        }
    }
}
