import Foundation
import Testing
@testable import WispCore
@testable import WispInfrastructure

/// Structured output in the core: the ordered JSON parser and writer, the validator that
/// decides whether a reply may join the history, the echo backend's value, the OpenAI
/// request body, and the conversation leaving the history alone when a reply misses its schema.
@Suite struct OutputSchemaTests {
    static let label = #"""
        {"type":"object","properties":{
          "severity":{"type":"string","enum":["error","warning"]},
          "line":{"type":"integer","minimum":1,"maximum":100},
          "files":{"type":"array","items":{"type":"string","pattern":"\\.[ch]$"},"minItems":1,"maxItems":2},
          "hint":{"anyOf":[{"type":"string"},{"type":"null"}]},
          "kind":{"const":"diag"}},
         "required":["severity","line","files"],"additionalProperties":false}
        """#

    @Test func validatorAcceptsMatchingValues() throws {
        let schema = try OutputSchema(text: Self.label)
        for ok in [#"{"severity":"error","line":1,"files":["a.c"]}"#,
                   #"{"files":["a.c","b.h"],"line":100.0,"severity":"warning","hint":null,"kind":"diag"}"#,
                   #" {"severity":"error","line":7,"files":["x.h"],"hint":"look"} "#] {
            #expect(try schema.problem(with: ok) == nil, "\(ok)")
        }
    }

    @Test func validatorSaysWhatIsWrongAndWhere() throws {
        let schema = try OutputSchema(text: Self.label)
        let cases: [(String, String)] = [
            (#"{"severity":"error","line":1,"files":["a.c"]"#, "not valid JSON"),
            (#"{"severity":"fatal","line":1,"files":["a.c"]}"#, "$.severity must be one of"),
            (#"{"severity":"error","line":0,"files":["a.c"]}"#, "$.line must be at least 1"),
            (#"{"severity":"error","line":101,"files":["a.c"]}"#, "$.line must be at most 100"),
            (#"{"severity":"error","line":1.5,"files":["a.c"]}"#, "$.line must be an integer"),
            (#"{"severity":"error","line":"1","files":["a.c"]}"#, "$.line must be an integer"),
            (#"{"severity":"error","line":1,"files":[]}"#, "$.files must have at least 1"),
            (#"{"severity":"error","line":1,"files":["a.c","b.c","c.c"]}"#, "$.files must have at most 2"),
            (#"{"severity":"error","line":1,"files":["a.py"]}"#, "$.files[0] must match the pattern"),
            (#"{"severity":"error","line":1}"#, #"missing the required property "files""#),
            (#"{"severity":"error","line":1,"files":["a.c"],"x":1}"#, #""x", which the schema does not allow"#),
            (#"{"severity":"error","line":1,"files":["a.c"],"hint":3}"#, "$.hint matches none of the `anyOf`"),
            (#"{"severity":"error","line":1,"files":["a.c"],"kind":"other"}"#, #"$.kind must be "diag""#),
            (#"{"severity":"error","severity":"error","line":1,"files":["a.c"]}"#, "twice"),
            (#"["error"]"#, "$ must be an object"),
        ]
        for (reply, says) in cases {
            let problem = try schema.problem(with: reply)
            #expect(problem?.contains(says) == true, "\(reply): \(problem ?? "accepted")")
        }
        let oneOf = try OutputSchema(text: #"{"oneOf":[{"type":"number"},{"type":"integer"}]}"#)
        #expect(try oneOf.problem(with: "1.5") == nil)
        #expect(try oneOf.problem(with: "2")?.contains("exactly one") == true)
    }

    @Test func badSchemaTextIsAnInvalidArgument() {
        for bad in ["[]", "{", #"{"type":"string","pattern":"("}"#] {
            let error = #expect(throws: WispError.self) { try OutputSchema(text: bad) }
            #expect(error?.code == .invalidArgument, "\(bad)")
        }
    }

    @Test func echoBuildsTheContractValue() throws {
        let schema = try OutputSchema(text: Self.label)
        #expect(try schema.echoValue(n: 3).jsonText == #"{"severity":"error","line":1,"files":["echo 3"],"hint":"echo 3","kind":"diag"}"#)
        let cases: [(String, String)] = [
            (#"{"type":"integer"}"#, "4"), (#"{"type":"number","minimum":0.5}"#, "0.5"), (#"{"type":"boolean"}"#, "true"),
            (#"{"type":"null"}"#, "null"), (#"{"type":"array","items":{"type":"integer"},"minItems":2}"#, "[4,4]"),
            (#"{"enum":[null,1]}"#, "null"), (#"{"oneOf":[{"type":"string"}]}"#, #""echo 4""#),
        ]
        for (text, value) in cases {
            #expect(try OutputSchema(text: text).echoValue(n: 4).jsonText == value, "\(text)")
        }
    }

    /// The verdict is taken on exact data, by JSON Schema's rules.
    @Test func verdictIsExactForNumbersKeysAndPatterns() throws {
        let big = try OutputSchema(text: #"{"const":9007199254740993}"#)
        #expect(try big.problem(with: "9007199254740993") == nil)
        #expect(try big.problem(with: "9007199254740992") != nil)
        // Python reads this one as the float 9007199254740992.0, which is not the integer const.
        #expect(try big.problem(with: "9007199254740993.0") != nil)
        let bounded = try OutputSchema(text: #"{"type":"integer","minimum":1700000000000000001}"#)
        #expect(try bounded.problem(with: "1700000000000000000") != nil)
        #expect(try bounded.problem(with: "1700000000000000001") == nil)
        #expect(try bounded.echoValue(n: 1).jsonText == "1700000000000000001")
        #expect(try OutputSchema(text: #"{"type":"integer"}"#).problem(with: "1.0") == nil)
        // NFC and NFD keys are two properties, not one given twice.
        let keys = try OutputSchema(text: #"{"type":"object","properties":{"caf\u00e9":{"type":"integer"},"cafe\u0301":{"type":"string"}},"required":["caf\u00e9","cafe\u0301"],"additionalProperties":false}"#)
        #expect(try keys.problem(with: #"{"caf\u00e9":1,"cafe\u0301":"x"}"#) == nil)
        #expect(try keys.problem(with: #"{"caf\u00e9":1,"caf\u00e9":2}"#)?.contains("twice") == true)
        #expect(try keys.problem(with: #"{"caf\u00e9":1}"#)?.contains("missing") == true)
        // ECMA-262: `$` is the end of the text, never before a final newline.
        let abc = try OutputSchema(text: #"{"type":"string","pattern":"^abc$"}"#)
        #expect(try abc.problem(with: #""abc""#) == nil)
        #expect(try abc.problem(with: #""abc\n""#) != nil)
        // `.` is one code point (not a grapheme cluster) and no line terminator; \d is ASCII.
        let one = try OutputSchema(text: #"{"type":"string","pattern":"^.$"}"#)
        #expect(try one.problem(with: #""e\u0301""#) != nil)
        #expect(try one.problem(with: #""\ud83d\ude42""#) == nil)
        #expect(try one.problem(with: #""\r""#) != nil)
        #expect(try OutputSchema(text: #"{"type":"string","pattern":"^\\d$"}"#).problem(with: #""\u0661""#) != nil)
        // A backtracking pattern costs linear time.
        let evil = try OutputSchema(text: #"{"type":"string","pattern":"^(a+)+$"}"#)
        #expect(try evil.problem(with: "\"" + String(repeating: "a", count: 5000) + "b\"") != nil)
    }

    /// Numbers are judged as the caller's parser will read them: Python's json (integers in plain
    /// digits exact, others the nearest double) and JavaScript's JSON.parse (every one a double).
    @Test func numbersAreJudgedAsTheCallersParserReadsThem() throws {
        func problem(_ schema: String, _ reply: String) throws -> String? {
            try OutputSchema(text: schema).problem(with: reply)
        }
        // Every caller reads these as 0.1, 0.3 and 1.0.
        #expect(try problem(#"{"type":"number","maximum":0.1}"#, "0.10000000000000000001") == nil)
        #expect(try problem(#"{"const":0.3}"#, "0.30000000000000001") == nil)
        #expect(try problem(#"{"type":"integer"}"#, "1.0000000000000001") == nil)
        let either = #"{"oneOf":[{"type":"integer"},{"type":"number","minimum":1}]}"#
        #expect(try problem(either, "1.0000000000000001")?.contains("matches 2") == true)
        #expect(try problem(either, "1.5") == nil)
        // Past a double's range: infinity to every caller, null once written out again.
        #expect(try problem(#"{"type":"number"}"#, "1e400")?.contains("infinity") == true)
        #expect(try problem(#"{"type":"object"}"#, #"{"deep":[-1e400]}"#)?.contains("infinity") == true)
        #expect(try problem(#"{"type":"number","minimum":0}"#, "1e-400") == nil)
        // 400 digits: Python's exact integer, JavaScript's infinity.
        let huge = String(repeating: "9", count: 400)
        #expect(try problem(#"{"type":"integer"}"#, huge)?.contains("JSON.parse") == true)
        // 2^53 + 1 is its own integer to Python and 2^53 to JavaScript: both readings must pass.
        #expect(try problem(#"{"type":"integer","maximum":9007199254740992}"#, "9007199254740993") != nil)
        #expect(try problem(#"{"type":"integer","minimum":9007199254740993}"#, "9007199254740993") == nil)
        #expect(try problem(#"{"enum":[9007199254740993]}"#, "9007199254740992") != nil)
        // An exact integer against a double past 2^63, as Python compares them (1e23 is 99999999999999991611392).
        #expect(try problem(#"{"type":"integer","maximum":1e23}"#, "99999999999999991611392") == nil)
        #expect(try problem(#"{"type":"integer","maximum":1e23}"#, "99999999999999991611393") != nil)
        #expect(NumberReading.integerText(1e23) == "99999999999999991611392")
        #expect(NumberReading.integerText(-0x1p64) == "-18446744073709551616")
    }

    /// Whatever schema reaches the core, it answers, never crashes.
    @Test func oddSchemasAreArgumentErrorsNamingThePlace() throws {
        let cases: [(String, String)] = [
            (#"{"type":"object","properties":{"a":{"type":"array","items":{"type":"string"},"minItems":-1}}}"#, "#/properties/a"),
            (#"{"type":"string","pattern":"(?<=a)b"}"#, "lookbehind"),
            (#"{"type":"string","pattern":"(?i)^a$"}"#, "inline flags"),
            (#"{"type":"integer","minimum":1e400}"#, "minimum"),
            (#"{"type":"wat"}"#, "type"),
            (String(repeating: #"{"type":"array","items":"#, count: 150) + #"{"type":"null"}"# + String(repeating: "}", count: 150), "nested"),
        ]
        for (text, says) in cases {
            let error = #expect(throws: WispError.self, "\(text.prefix(80))") { try OutputSchema(text: text) }
            #expect(error?.code == .invalidArgument && error?.message.contains(says) == true, "\(error?.message ?? "")")
        }
        // minItems 2^40, and 8 levels of minItems 10: refused when echo would build them, at once.
        for text in [#"{"type":"array","items":{"type":"string"},"minItems":1099511627776}"#,
                     String(repeating: #"{"type":"array","minItems":10,"items":"#, count: 8) + #"{"type":"string"}"# + String(repeating: "}", count: 8)] {
            let schema = try OutputSchema(text: text)
            let error = #expect(throws: WispError.self) { try schema.echoValue(n: 1) }
            #expect(error?.code == .invalidArgument && error?.message.contains("minItems") == true)
        }
    }

    /// A reply too large for the pipe once encoded never joins the history.
    @Test func aReplyTooLargeOnceEncodedIsRefusedBeforeItsTurnIsKept() async throws {
        let quotes = String(repeating: "\"", count: maxFrameBytes / 2 + 1)
        do {
            try await OutputSchema.checkReply(quotes, settings: GenerationSettings())
            Issue.record("a reply of \(quotes.utf8.count) quotes fits no frame once escaped")
        } catch {
            #expect(error.code == .replyTooLarge && error.message.contains("\(maxFrameBytes)"))
        }
        // "/" is never escaped: as many slashes fit. Counted on an OS thread of its own, as this
        // is long work in a debug build and the other tests need the cooperative pool meanwhile.
        let slashes = await onOwnThread {
            Result { () throws(WispError) in try OutputSchema.checkSize(String(repeating: "/", count: maxFrameBytes / 2 + 1)) }
        }
        #expect(throws: Never.self) { try slashes.get() }
    }

    /// The reply is judged on the pool (off the pipe loop), whose OS threads have smaller stacks:
    /// a reply nested as deep as the reader takes is judged there, not a crash.
    @Test func aDeeplyNestedReplyIsJudgedOffThePipe() async throws {
        let deep = String(repeating: "[", count: JSONValue.maxDepth) + String(repeating: "]", count: JSONValue.maxDepth)
        let schema = try OutputSchema(text: #"{"type":"array","items":{"type":"array","items":{"type":"string"}}}"#)
        await #expect(throws: WispError.self) {
            try await OutputSchema.checkReply(deep, settings: GenerationSettings(schema: schema))
        }
        let deeper = "[" + deep + "]"
        let problem = try await offPipeLoop { () throws(WispError) in try schema.problem(with: deeper) }
        #expect(problem?.contains("not valid JSON") == true)
    }

    @Test func echoSessionRepliesWithTheValueAndCountsTurns() async throws {
        let session = EchoBackend().makeSession(instructions: nil, tools: [], history: [Turn(prompt: "a", response: "echo 1: a")])
        let schema = try OutputSchema(text: #"{"type":"object","properties":{"n":{"type":"integer"},"s":{"type":"string"}}}"#)
        let g = try await session.respond(to: "b", settings: GenerationSettings(schema: schema), onPartial: nil)
        #expect(g.text == #"{"n":2,"s":"echo 2"}"#)
    }

    @Test func agentKeepsHistoryWhenTheReplyMissesTheSchema() async throws {
        let conversation = Conversation(backend: EchoBackend(), instructions: nil, tools: [])
        _ = conversation.commit(try await conversation.respond(to: "first", settings: GenerationSettings(), onPartial: nil))
        let digits = try OutputSchema(text: #"{"type":"string","pattern":"^[0-9]+$"}"#)
        await #expect(throws: WispError.self) {
            do {
                _ = try await conversation.respond(to: "code?", settings: GenerationSettings(maxOutputTokens: 8, schema: digits), onPartial: nil)
            } catch let e as WispError {
                #expect(e.code == .invalidOutput && e.message.contains("max_output_tokens (this call allowed 8)"))
                throw e
            }
        }
        #expect(conversation.history.map(\.prompt) == ["first"])
        let next = conversation.commit(try await conversation.respond(to: "again", settings: GenerationSettings(), onPartial: nil))
        #expect(next.text == "echo 2: again")
    }

    @Test func openAIBodyCarriesTheSchemaInOrder() throws {
        let text = #"{"type":"object","properties":{"z":{"type":"string"},"a":{"type":"integer"}},"required":["z","a"]}"#
        let schema = try OutputSchema(text: text)
        let data = try OpenAIServer.chatBody(model: "m", messages: [.text("user", "hi")], tools: [], toolChoice: nil,
                                             settings: GenerationSettings(maxOutputTokens: 9, schema: schema))
        let body = try #require(try JSONSerialization.jsonObject(with: data) as? [String: Any])
        #expect(body["max_tokens"] as? Int == 9)
        let format = try #require(body["response_format"] as? [String: Any])
        #expect(format["type"] as? String == "json_schema")
        let wrapper = try #require(format["json_schema"] as? [String: Any])
        #expect(wrapper["strict"] as? Bool == true && wrapper["name"] is String)
        #expect(wrapper["schema"] is [String: Any])
        // The server sees the properties in the order written (parsed here with the ordered parser).
        let sent = try JSONValue.parse(String(decoding: data, as: UTF8.self))
        #expect(sent["response_format"]?["json_schema"]?["schema"] == schema.root)
        #expect(sent["response_format"]?["json_schema"]?["schema"]?["properties"]?.members?.map(\.key) == ["z", "a"])
        let plain = try OpenAIServer.chatBody(model: "m", messages: [.text("user", "hi")], tools: [], toolChoice: nil, settings: .init())
        #expect(try JSONValue.parse(String(decoding: plain, as: UTF8.self))["response_format"] == nil)
    }
}
