#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// A tool call a model wrote as JSON in its reply instead of as an OpenAI `tool_calls` entry.
///
/// Small instruct models (Qwen2.5-Coder 1.5B, say) pick the right tool and write
/// `{"name": "read_file", "arguments": {"path": "notes.txt"}}` as their answer, and servers apply
/// no grammar for their templates, so no `tool_calls` entry ever comes. A reply is taken as a
/// call only when it is nothing else: one JSON object (bare, pretty-printed, in one ```json
/// fence, in Hermes' `<tool_call>` tags, or with every brace doubled as some templates show
/// them) with exactly `name` and `arguments` (or `parameters`), naming a tool offered to the
/// thread, with only the arguments that tool declares and every one it requires. Anything else
/// is text: a name not offered, an unknown or missing argument, a call inside prose, a second
/// JSON value after the first, a repeated key.
enum TextToolCall {
    /// The call `reply` is, or nil when it is text. `index` makes the call's id unique in its turn.
    static func parse(_ reply: String, offered tools: [ModelTool], index: Int) -> ToolCall? {
        guard let body = unwrapped(reply), let object = value(body)?.members, !hasRepeatedKeys(object) else {
            return nil
        }
        guard object.count == 2, let name = member(object, "name")?.string,
              let arguments = member(object, "arguments") ?? member(object, "parameters"),
              let given = arguments.members, !hasRepeatedKeys(given),
              let tool = tools.first(where: { sameText($0.name, name) }),
              let declared = declaredArguments(tool) else { return nil }
        let keys = given.map(\.key)
        guard keys.allSatisfy({ key in declared.all.contains { sameText($0, key) } }),
              declared.required.allSatisfy({ name in keys.contains { sameText($0, name) } }) else { return nil }
        return ToolCall(id: "text_call_\(index)", name: tool.name, arguments: arguments.jsonText)
    }

    /// Whether `call` asks again for what an earlier exchange of this turn already got: the same
    /// tool with the same values for every argument it requires (a path read again with other
    /// line numbers, say). A small model does that instead of answering; running it again would
    /// only feed the loop.
    static func repeats(_ call: ToolCall, of exchanges: [ToolExchange], offered tools: [ModelTool]) -> Bool {
        guard let tool = tools.first(where: { sameText($0.name, call.name) }), let declared = declaredArguments(tool),
              let arguments = try? JSONValue.parse(call.arguments) else { return false }
        return exchanges.contains { e in
            guard sameText(e.name, call.name), let earlier = try? JSONValue.parse(e.arguments) else { return false }
            return declared.required.allSatisfy { earlier[$0] == arguments[$0] }
        }
    }

    /// The JSON text inside the reply's one wrapper, if it has one: a ```/```json fence or
    /// `<tool_call>` tags, with nothing outside them but whitespace.
    private static func unwrapped(_ reply: String) -> Substring? {
        var text = reply.trimmingWhitespace()[...]
        if text.hasPrefix("```") {
            guard text.count >= 6, text.hasSuffix("```") else { return nil }
            text = text.dropFirst(3).dropLast(3)
            // The info string: a bare word (`json`) on the fence's own line, nothing else.
            let info = text.prefix { $0 != "\n" }
            guard info.allSatisfy({ $0.isLetter }), info.count < text.count else { return nil }
            text = text.dropFirst(info.count)
        } else if text.hasPrefix("<tool_call>") {
            guard text.hasSuffix("</tool_call>") else { return nil }
            text = text.dropFirst("<tool_call>".count).dropLast("</tool_call>".count)
        }
        return text
    }

    /// One JSON value, and nothing after it; failing that, the same with doubled braces undone
    /// (`{{"name": …}}` as a template's escaped example reads).
    private static func value(_ text: Substring) -> JSONValue? {
        if let v = try? JSONValue.parse(String(text)) { return v }
        guard text.contains("{{") else { return nil }
        let undoubled = String(text).replacing("{{", with: "{").replacing("}}", with: "}")
        return try? JSONValue.parse(undoubled)
    }

    private static func member(_ members: [JSONMember], _ key: String) -> JSONValue? {
        members.first { sameText($0.key, key) }?.value
    }

    /// Keys compare as code points (the codec's rule), so a key and its canonical twin are two keys.
    private static func hasRepeatedKeys(_ members: [JSONMember]) -> Bool {
        members.indices.contains { i in members[..<i].contains { sameText($0.key, members[i].key) } }
    }

    /// The argument names a tool's schema declares, and those it requires.
    private static func declaredArguments(_ tool: ModelTool) -> (all: [String], required: [String])? {
        guard let schema = try? JSONValue.parse(tool.parametersSchema),
              let properties = schema["properties"]?.members else { return nil }
        return (properties.map(\.key), (schema["required"]?.array ?? []).compactMap(\.string))
    }
}
