import WispInfrastructure

/// The one verdict on a model's reply under a call's schema (OutputSchema.swift says what is
/// judged and how exactly), and on its size once encoded; `wisp-core --check-replies` asks the
/// same verdict for the schema differential test.
extension OutputSchema {
    /// Why `reply` does not match, or nil when it is JSON that does. Throws `cancelled` when the
    /// call is cancelled meanwhile.
    public func problem(with reply: String) throws(WispError) -> String? {
        let value: JSONValue
        do {
            value = try JSONValue.parse(reply)
        } catch {
            return "the reply is not valid JSON (\(error))"
        }
        var budget = Budget()
        // JavaScript's reading is Python's but for integers past 2^53: judged again only when there may be one.
        let both = largeIntegers || NumberReading.mayHoldLargeIntegers(reply)
        for reading in both ? NumberReading.allCases : [.python] {
            if let n = reading.firstUnreadable(in: value) {
                return "the reply has the number \(n.text.prefix(40)), which \(reading.parser) reads as infinity; "
                    + "no caller can receive it"
            }
            if let p = try Self.problem(value, node, at: "$", reading, &budget) {
                return reading == .python ? p : "\(p) (with numbers as \(reading.parser) reads them)"
            }
        }
        return nil
    }

    /// Throws `invalid_output` when the reply does not parse or match; the message says what to try.
    public func check(_ reply: String, maxOutputTokens: Int?) throws(WispError) {
        guard let problem = try problem(with: reply) else { return }
        throw WispError(.invalidOutput, Self.invalidOutputMessage(problem, maxOutputTokens: maxOutputTokens))
    }

    static func invalidOutputMessage(_ problem: String, maxOutputTokens: Int?) -> String {
        let larger = maxOutputTokens.map { "a larger max_output_tokens (this call allowed \($0)), " }
            ?? "a larger max_output_tokens, "
        return "the model's reply does not match the schema: \(problem). The turn was not added to the thread. "
            + "Try \(larger)a simpler schema, or a prompt that says what each field should hold."
    }

    /// The reply stopped at the output cap: whatever JSON it holds is cut off.
    public static func cutOff(maxOutputTokens: Int?) -> WispError {
        let cap = maxOutputTokens.map { " (\($0) tokens)" } ?? ""
        return WispError(.invalidOutput, "the model's reply was cut off at the output cap\(cap) before the JSON value "
            + "was complete. The turn was not added to the thread. Try a larger max_output_tokens or a simpler schema.")
    }

    private static func problem(_ v: JSONValue, _ s: Node, at path: String, _ reading: NumberReading,
                                _ budget: inout Budget) throws(WispError) -> String? {
        try budget.step()
        if let c = s.const, !reading.same(v, c) { return "\(path) must be \(c.jsonText), got \(short(v))" }
        if let e = s.choices, !e.contains(where: { reading.same(v, $0) }) {
            return "\(path) must be one of \(short(.array(e))), got \(short(v))"
        }
        if let branches = s.anyOf {
            var fits = false
            for b in branches where try problem(v, b, at: path, reading, &budget) == nil { fits = true; break }
            if !fits { return "\(path) matches none of the `anyOf` choices: \(short(v))" }
        }
        if let branches = s.oneOf {
            var fits = 0
            for b in branches where try problem(v, b, at: path, reading, &budget) == nil { fits += 1 }
            if fits != 1 { return "\(path) must match exactly one `oneOf` choice, matches \(fits): \(short(v))" }
        }
        guard let kind = s.kind else { return nil }
        switch (kind, v) {
        case (.null, .null), (.boolean, .bool):
            return nil
        case (.string, .string(let str)):
            if let p = s.pattern {
                guard let found = p.regex.matches(Substring(str), stop: { Task.isCancelled }) else {
                    throw WispError.callCancelled
                }
                if !found { return "\(path) must match the pattern \(p.text), got \(short(v))" }
            }
            return nil
        case (.integer, .number(let n)) where reading.isInteger(n), (.number, .number(let n)):
            if let lo = s.minimum, reading.compare(n, lo) < 0 {
                return "\(path) must be at least \(lo.text), got \(n.text.preview)"
            }
            if let hi = s.maximum, reading.compare(n, hi) > 0 {
                return "\(path) must be at most \(hi.text), got \(n.text.preview)"
            }
            return nil
        case (.array, .array(let items)):
            if let lo = s.minItems, items.count < lo {
                return "\(path) must have at least \(lo) item(s), has \(items.count)"
            }
            if let hi = s.maxItems, items.count > hi {
                return "\(path) must have at most \(hi) item(s), has \(items.count)"
            }
            if let itemSchema = s.items {
                for (k, item) in items.enumerated() {
                    if let p = try problem(item, itemSchema, at: "\(path)[\(k)]", reading, &budget) { return p }
                }
            }
            return nil
        case (.object, .object(let members)):
            var seen = Set<[UInt8]>()
            for m in members where !seen.insert(Array(m.key.utf8)).inserted {
                return "\(path) has the key \(quoted(m.key)) twice"
            }
            for name in s.required where !seen.contains(Array(name.utf8)) {
                return "\(path) is missing the required property \(quoted(name))"
            }
            for m in members {
                if let k = s.index[Array(m.key.utf8)] {
                    let at = "\(path).\(m.key)"
                    if let p = try problem(m.value, s.properties[k].node, at: at, reading, &budget) { return p }
                } else if s.closed {
                    return "\(path) has the property \(quoted(m.key)), which the schema does not allow"
                }
            }
            return nil
        default:
            let name = kind.rawValue
            let article = kind == .integer || kind == .array || kind == .object ? "an" : "a"
            return "\(path) must be \(article) \(name), got \(short(v))"
        }
    }

    private static func quoted(_ s: String) -> String { JSONValue.string(s).jsonText }

    private static func short(_ v: JSONValue) -> String {
        v.jsonText.preview
    }
}

extension OutputSchema {
    /// Room in a reply frame for everything but the reply's text (ids, counts, a store error).
    static let replyOverhead = 16 * 1024

    /// The one verdict on a finished reply, before its turn may be committed: it matches the
    /// call's schema, and it fits in a pipe frame once encoded (else `reply_too_large`). Off the
    /// pipe loop unless the reply is short and there is no schema.
    public static func checkReply(_ text: String, settings: GenerationSettings) async throws(WispError) {
        if settings.schema == nil, text.utf8.count < onPipeLoopBytes { return try checkSize(text) }
        try await offPipeLoop(ifDropped: WispError.callCancelled) { () throws(WispError) in
            try checkSize(text)
            try settings.schema?.check(text, maxOutputTokens: settings.maxOutputTokens)
        }
    }

    static func checkSize(_ text: String) throws(WispError) {
        let limit = maxFrameBytes - replyOverhead
        // Escaping at most sextuples a byte: most replies need no count.
        guard text.utf8.count > limit / 6 else { return }
        let size = JSONWriter.encodedCount(text)
        guard size > limit else { return }
        throw WispError(.replyTooLarge, "the reply is \(size) bytes once JSON-encoded, over the \(limit) bytes a "
            + "reply may have on wisp's pipe (its frame limit is \(maxFrameBytes) bytes); the turn was not added "
            + "to the thread. Ask for a shorter reply (max_output_tokens), or attach smaller files.")
    }
}

// MARK: - the verdict as a filter (tests)

extension OutputSchema {
    /// `wisp-core --check-replies`: for each stdin line `[schema, reply]` (two JSON strings), one
    /// stdout line `{"valid":true}`, `{"valid":false,"problem":…}` or `{"schema_error":…}`. The
    /// schema differential test (tests/python/test_schema_differential.py) asks the core's
    /// verdict this way, with the same code a `respond` call runs.
    public static func verdictLine(_ line: String) -> String {
        guard let pair = try? JSONValue.parse(line), let items = pair.array, items.count == 2,
              let schemaText = items[0].string, let reply = items[1].string else {
            let problem = "the line is not a JSON array of two strings"
            return JSONValue.object([JSONMember("schema_error", .string(problem))]).jsonText
        }
        do {
            let schema = try OutputSchema(text: schemaText)
            if let problem = try schema.problem(with: reply) {
                return JSONValue.object([JSONMember("valid", false), JSONMember("problem", .string(problem))]).jsonText
            }
            return JSONValue.object([JSONMember("valid", true)]).jsonText
        } catch {
            return JSONValue.object([JSONMember("schema_error", .string(error.message))]).jsonText
        }
    }
}
