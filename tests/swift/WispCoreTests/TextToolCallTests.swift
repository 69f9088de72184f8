import Testing
import WispInfrastructure
@testable import WispCore

/// A tool call written as JSON text is a call only when the whole reply is exactly one, for a
/// tool the thread was offered; every near miss stays text. The tool loop's use of it (the
/// follow-up without tools, the repeated call) is tested end to end in
/// tests/python/test_text_tool_calls.py.
@Suite struct TextToolCallTests {
    let tools = ToolCatalogue.tools(roots: Roots([]))

    func call(_ reply: String) -> ToolCall? { TextToolCall.parse(reply, offered: tools, index: 0) }

    @Test(arguments: [
        #"{"name": "read_file", "arguments": {"path": "notes.txt"}}"#,
        "  \n" + #"{"name":"read_file","arguments":{"path":"notes.txt"}}"# + "\n",
        "```json\n" + #"{"name": "read_file", "arguments": {"path": "notes.txt"}}"# + "\n```",
        "```\n{\n  \"name\": \"read_file\",\n  \"arguments\": {\n    \"path\": \"notes.txt\"\n  }\n}\n```",
        #"{{"name": "read_file", "arguments": {{"path": "notes.txt"}}}}"#,
        #"{{"name": "read_file", "arguments": {"path": "notes.txt"}}}"#,
        "<tool_call>\n" + #"{"name": "read_file", "arguments": {"path": "notes.txt"}}"# + "\n</tool_call>",
        #"{"name": "read_file", "parameters": {"path": "notes.txt"}}"#,
    ])
    func theWholeReplyAsOneCallIsACall(reply: String) throws {
        let c = try #require(call(reply))
        #expect(c.name == "read_file")
        #expect(try JSONValue.parse(c.arguments) == ["path": "notes.txt"])
    }

    @Test func optionalArgumentsAreKeptAsWritten() throws {
        let reply = #"{"name": "read_file", "arguments": {"path": "a.txt", "start_line": 1, "end_line": 20}}"#
        let c = try #require(call(reply))
        #expect(c.arguments == #"{"path":"a.txt","start_line":1,"end_line":20}"#)
        #expect(c.id == "text_call_0")
        let list = #"{"name": "list_directory", "arguments": {"path": "."}}"#
        #expect(TextToolCall.parse(list, offered: tools, index: 3)?.id == "text_call_3")
    }

    @Test(arguments: [
        // A tool nobody offered ("What is 2+2?" gets one from a small model).
        #"{"name": "add", "arguments": {"a": 2, "b": 2}}"#,
        // An argument the tool does not declare, and a required one missing.
        #"{"name": "read_file", "arguments": {"path": "a.txt", "encoding": "utf-8"}}"#,
        #"{"name": "read_file", "arguments": {"start_line": 1}}"#,
        #"{"name": "read_file", "arguments": {}}"#,
        // A call inside prose, before or after.
        #"Let me read it: {"name": "read_file", "arguments": {"path": "a.txt"}}"#,
        #"{"name": "read_file", "arguments": {"path": "a.txt"}} and then I will answer."#,
        "Here it is:\n```json\n" + #"{"name": "read_file", "arguments": {"path": "a.txt"}}"# + "\n```",
        // Two JSON values.
        #"{"name": "read_file", "arguments": {"path": "a.txt"}} {"name": "read_file", "arguments": {"path": "b.txt"}}"#,
        #"{"name": "read_file", "arguments": {"path": "a.txt"}}"# + "\n"
            + #"{"name": "list_directory", "arguments": {"path": "."}}"#,
        // Not the shape of a call.
        #"{"name": "read_file", "arguments": {"path": "a.txt"}, "id": 1}"#,
        #"{"name": "read_file"}"#,
        #"{"name": "read_file", "arguments": "{\"path\": \"a.txt\"}"}"#,
        #"{"name": "read_file", "arguments": {"path": "a.txt", "path": "b.txt"}}"#,
        #"{"name": "read_file", "name": "read_file", "arguments": {"path": "a.txt"}}"#,
        #"[{"name": "read_file", "arguments": {"path": "a.txt"}}]"#,
        #""read_file""#,
        "The answer is 4.",
        "```json\n" + #"{"name": "read_file", "arguments": {"path": "a.txt"}}"#,
        "```python\nprint(1)\n```",
    ])
    func anythingElseIsText(reply: String) {
        #expect(call(reply) == nil)
    }

    @Test func onlyTheToolsOfferedToTheThreadCount() {
        let reply = #"{"name": "read_file", "arguments": {"path": "a.txt"}}"#
        #expect(TextToolCall.parse(reply, offered: [], index: 0) == nil)
        #expect(TextToolCall.parse(reply, offered: tools.filter { $0.name != "read_file" }, index: 0) == nil)
    }

    @Test func aCallRepeatsAnEarlierOneWhenItsRequiredArgumentsAreTheSame() throws {
        let first = #"{"path":"notes.txt","start_line":1,"end_line":5}"#
        let done = [ToolExchange(name: "read_file", arguments: first, output: "A")]
        func repeats(_ reply: String) throws -> Bool {
            TextToolCall.repeats(try #require(call(reply)), of: done, offered: tools)
        }
        #expect(try repeats(#"{"name": "read_file", "arguments": {"path": "notes.txt", "end_line": 3}}"#))
        #expect(try repeats(#"{"name": "read_file", "arguments": {"path": "notes.txt"}}"#))
        #expect(try !repeats(#"{"name": "read_file", "arguments": {"path": "todo.md"}}"#))
        #expect(try !repeats(#"{"name": "list_directory", "arguments": {"path": "notes.txt"}}"#))
        #expect(TextToolCall.repeats(ToolCall(id: "x", name: "read_file", arguments: #"{"path":"notes.txt"}"#), of: [],
                                     offered: tools) == false)
    }

    @Test func aRepeatedCallIsFoundByItsValueNotItsSpelling() throws {
        let done = [ToolExchange(name: "read_file", arguments: #"{"path":"a.txt","start_line":1}"#, output: "A")]
        let same = ToolCall(id: "x", name: "read_file", arguments: #"{ "path": "a.txt", "start_line": 1.0 }"#)
        #expect(OpenAISession.earlier(same, in: done)?.output == "A")
        let other = ToolCall(id: "y", name: "read_file", arguments: #"{"path":"b.txt","start_line":1}"#)
        #expect(OpenAISession.earlier(other, in: done) == nil)
        let path = #"{"path":"a.txt"}"#
        let failed = [ToolExchange(name: "read_file", arguments: path, output: "no such file", failed: true)]
        #expect(OpenAISession.earlier(ToolCall(id: "z", name: "read_file", arguments: path), in: failed) == nil)
    }
}
