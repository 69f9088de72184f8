import WispInfrastructure

/// Structured output: a `respond` call's JSON Schema, what every backend builds from it, and
/// the one verdict on the model's reply, taken before the turn may join the history.
///
/// The shim refuses any schema outside wisp's supported subset before the core is called (it
/// names the keyword and where it is, and bounds what a schema may imply), so the core reads
/// only that subset: object (`properties`, `required`, `additionalProperties: false`), array
/// (`items`, `minItems`, `maxItems`), string (`pattern`), integer and number (`minimum`,
/// `maximum`), boolean, null, `enum` and `const` (strings, numbers, null), `anyOf`/`oneOf`,
/// `description`/`title`. Whatever else reaches the core anyway is refused here
/// (`invalid_argument`, naming the place), never a crash.
///
/// The verdict is JSON Schema's (2020-12) for that subset, on the data as the caller will read
/// it: numbers as Python's `json` and JavaScript's `JSON.parse` read them, the verdict holding
/// under both (NumberReading.swift); strings and keys as sequences of code points; `pattern` with
/// ECMA-262 semantics matched by the linear engine (WispInfrastructure/Regex/, `.ecma`). The shim
/// does not judge the reply again; `jsonschema` is the test oracle
/// (tests/python/test_schema_differential.py, which lists where the two differ).
///
/// Checking a reply and building echo's value can take time on a large reply or schema: both
/// run off the pipe loop and stop when their call is cancelled (`Task.isCancelled`).
public struct OutputSchema: Sendable, Equatable {
    /// The schema as the caller wrote it (compact JSON text), for backends that forward it.
    public let text: String
    public let root: JSONValue
    let node: Node
    /// Whether the schema may hold an integer past 2^53, where the two readings of numbers part.
    let largeIntegers: Bool

    /// Deeper than the shim lets through; bounds the core's recursion whatever it is sent.
    static let maxDepth = 64
    /// The largest value echo builds: a reply over the pipe's frame limit could not be delivered.
    static let maxEchoBytes = maxFrameBytes / 2

    public static func == (a: OutputSchema, b: OutputSchema) -> Bool { a.text == b.text }

    /// Throws `invalid_argument` when the text is not a JSON object, a keyword has a value wisp
    /// cannot use, or a `pattern` is not one the linear engine takes; the message names the place.
    public init(text: String) throws(WispError) {
        let root: JSONValue
        do {
            root = try JSONValue.parse(text)
        } catch {
            throw WispError(.invalidArgument, "schema is not valid JSON: \(error)")
        }
        guard case .object = root else { throw WispError(.invalidArgument, "schema must be a JSON object") }
        self.node = try Node(root, path: "#", depth: 0)
        self.text = root.jsonText
        self.root = root
        self.largeIntegers = NumberReading.mayHoldLargeIntegers(self.text)
    }

    // MARK: the compiled schema

    final class Node: Sendable {
        enum Kind: String, Sendable { case object, array, string, integer, number, boolean, null }
        let kind: Kind?
        let const: JSONValue?
        let choices: [JSONValue]?
        let anyOf: [Node]?
        let oneOf: [Node]?
        let properties: [(key: String, node: Node)]
        /// `properties` by the key's UTF-8 bytes: keys are code points, never canonically equivalent texts.
        let index: [[UInt8]: Int]
        let required: [String]
        let closed: Bool
        let items: Node?
        let minItems: Int?
        let maxItems: Int?
        let pattern: (text: String, regex: LinearRegex)?
        let minimum: JSONNumber?
        let maximum: JSONNumber?
        /// Bytes of echo's value for this node, saturated at `Int.max / 4`.
        let echoBytes: Int

        init(_ s: JSONValue, path: String, depth: Int) throws(WispError) {
            func bad(_ keyword: String, _ why: String) -> WispError {
                WispError(.invalidArgument, "schema: `\(keyword)` at \(path) \(why)")
            }
            guard depth <= OutputSchema.maxDepth else {
                throw WispError(.invalidArgument, "schema is nested more than \(OutputSchema.maxDepth) levels deep (at \(path)); use a flatter schema")
            }
            guard case .object = s else { throw WispError(.invalidArgument, "schema at \(path) must be an object (a schema)") }
            if let t = s["type"] {
                guard let name = t.string, let k = Kind(rawValue: name) else { throw bad("type", "must be one of object, array, string, integer, number, boolean, null") }
                kind = k
            } else {
                kind = nil
            }
            const = s["const"]
            if let e = s["enum"] {
                guard let members = e.array, !members.isEmpty else { throw bad("enum", "must be a non-empty array") }
                choices = members
            } else {
                choices = nil
            }
            func branches(_ keyword: String) throws(WispError) -> [Node]? {
                guard let b = s[keyword] else { return nil }
                guard let list = b.array, !list.isEmpty else { throw bad(keyword, "must be a non-empty array of schemas") }
                var out: [Node] = []
                for (k, item) in list.enumerated() { out.append(try Node(item, path: "\(path)/\(keyword)/\(k)", depth: depth + 1)) }
                return out
            }
            anyOf = try branches("anyOf")
            oneOf = try branches("oneOf")
            var properties: [(key: String, node: Node)] = []
            var index: [[UInt8]: Int] = [:]
            if let p = s["properties"] {
                guard let members = p.members else { throw bad("properties", "must be an object") }
                for m in members {
                    let node = try Node(m.value, path: "\(path)/properties/\(Self.escape(m.key))", depth: depth + 1)
                    // JSON keeps the last of a key given twice, as Python's json (the shim's) does.
                    if let k = index[Array(m.key.utf8)] { properties[k].node = node } else {
                        index[Array(m.key.utf8)] = properties.count
                        properties.append((m.key, node))
                    }
                }
            }
            self.properties = properties
            self.index = index
            if let r = s["required"] {
                guard let names = r.array, let strings = Optional(names.compactMap(\.string)), strings.count == names.count else {
                    throw bad("required", "must be an array of property names")
                }
                required = strings
            } else {
                required = []
            }
            if let a = s["additionalProperties"] {
                guard a.bool == false else { throw bad("additionalProperties", "must be false (or left out)") }
                closed = true
            } else {
                closed = false
            }
            if let i = s["items"] { items = try Node(i, path: "\(path)/items", depth: depth + 1) } else { items = nil }
            func count(_ keyword: String) throws(WispError) -> Int? {
                guard let v = s[keyword] else { return nil }
                guard let n = v.number, n.isInteger, !(n.decimal?.negative ?? true) || (n.decimal?.isZero ?? false) else {
                    throw bad(keyword, "must be a whole number of items, at least 0")
                }
                // Past Int, a bound is beyond any reply: saturated.
                return n.int ?? Int.max
            }
            minItems = try count("minItems")
            maxItems = try count("maxItems")
            if let p = s["pattern"] {
                guard let text = p.string else { throw bad("pattern", "must be a string") }
                do {
                    pattern = (text, try LinearRegex(text, dialect: .ecma))
                } catch {
                    throw WispError(.invalidArgument, "schema: `pattern` at \(path) is not a regular expression wisp can use: \(error.message)")
                }
            } else {
                pattern = nil
            }
            func bound(_ keyword: String) throws(WispError) -> JSONNumber? {
                guard let v = s[keyword] else { return nil }
                guard let n = v.number, let d = n.decimal else { throw bad(keyword, "must be a number") }
                // Echo writes a whole bound out in digits: a number of thousands of digits is no bound anyone means.
                guard d.magnitude <= 400, d.magnitude >= -400 else { throw bad(keyword, "is \(n.text.prefix(40)), too large or too small a number for wisp") }
                return n
            }
            minimum = try bound("minimum")
            maximum = try bound("maximum")
            echoBytes = Self.echoSize(const: const, choices: choices, first: (anyOf ?? oneOf)?.first, kind: kind, properties: properties,
                                      items: items, minItems: minItems, minimum: minimum)
        }

        static func escape(_ key: String) -> String {
            key.replacingOccurrences(of: "~", with: "~0").replacingOccurrences(of: "/", with: "~1")
        }

        private static let cap = Int.max / 4

        private static func echoSize(const: JSONValue?, choices: [JSONValue]?, first: Node?, kind: Kind?,
                                     properties: [(key: String, node: Node)], items: Node?, minItems: Int?, minimum: JSONNumber?) -> Int {
            func add(_ a: Int, _ b: Int) -> Int { min(cap, a + b) }
            if let const { return const.jsonText.utf8.count }
            if let first = choices?.first { return first.jsonText.utf8.count }
            if let first { return first.echoBytes }
            switch kind {
            case .object:
                return properties.reduce(2) { add($0, add(JSONWriter.encodedCount($1.key) + 2, $1.node.echoBytes)) }
            case .array:
                let n = max(minItems ?? 0, 1), each = add(items?.echoBytes ?? 4, 1)
                let (total, overflow) = n.multipliedReportingOverflow(by: each)
                return overflow ? cap : min(cap, add(total, 1))
            case .string: return 30
            case .integer, .number: return minimum.map { $0.decimal.map { max($0.magnitude, 0) + $0.digits.count + 3 } ?? 24 } ?? 24
            default: return 5
            }
        }
    }

    // MARK: validation

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
        let larger = maxOutputTokens.map { "a larger max_output_tokens (this call allowed \($0)), " } ?? "a larger max_output_tokens, "
        return "the model's reply does not match the schema: \(problem). The turn was not added to the thread. Try \(larger)a simpler schema, or a prompt that says what each field should hold."
    }

    /// The reply stopped at the output cap: whatever JSON it holds is cut off.
    public static func cutOff(maxOutputTokens: Int?) -> WispError {
        let cap = maxOutputTokens.map { " (\($0) tokens)" } ?? ""
        return WispError(.invalidOutput, "the model's reply was cut off at the output cap\(cap) before the JSON value was complete. The turn was not added to the thread. Try a larger max_output_tokens or a simpler schema.")
    }

    /// Counts the work of one check, to look at cancellation now and then rather than at every node.
    struct Budget {
        var steps = 0
        mutating func step() throws(WispError) {
            steps &+= 1
            if steps & 63 == 0, Task.isCancelled { throw WispError.callCancelled }
        }
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
                guard let found = p.regex.matches(Substring(str), stop: { Task.isCancelled }) else { throw WispError.callCancelled }
                if !found { return "\(path) must match the pattern \(p.text), got \(short(v))" }
            }
            return nil
        case (.integer, .number(let n)) where reading.isInteger(n), (.number, .number(let n)):
            if let lo = s.minimum, reading.compare(n, lo) < 0 {
                return "\(path) must be at least \(lo.text), got \(n.text.prefix(80))"
            }
            if let hi = s.maximum, reading.compare(n, hi) > 0 {
                return "\(path) must be at most \(hi.text), got \(n.text.prefix(80))"
            }
            return nil
        case (.array, .array(let items)):
            if let lo = s.minItems, items.count < lo { return "\(path) must have at least \(lo) item(s), has \(items.count)" }
            if let hi = s.maxItems, items.count > hi { return "\(path) must have at most \(hi) item(s), has \(items.count)" }
            if let itemSchema = s.items {
                for (k, item) in items.enumerated() {
                    if let p = try problem(item, itemSchema, at: "\(path)[\(k)]", reading, &budget) { return p }
                }
            }
            return nil
        case (.object, .object(let members)):
            var seen = Set<[UInt8]>()
            for m in members where !seen.insert(Array(m.key.utf8)).inserted { return "\(path) has the key \(quoted(m.key)) twice" }
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
            return "\(path) must be \(kind == .integer || kind == .array || kind == .object ? "an" : "a") \(name), got \(short(v))"
        }
    }

    private static func quoted(_ s: String) -> String { JSONValue.string(s).jsonText }

    private static func short(_ v: JSONValue) -> String {
        let t = v.jsonText
        return t.unicodeScalars.count <= 80 ? t : String(String.UnicodeScalarView(t.unicodeScalars.prefix(77))) + "..."
    }

    // MARK: echo

    /// The echo backend's value for this schema (the echo contract's "Structured output" table).
    /// Refused (`invalid_argument`) when it would be too large to send; stops when the call is cancelled.
    public func echoValue(n: Int) throws(WispError) -> JSONValue {
        guard node.echoBytes <= Self.maxEchoBytes else {
            throw WispError(.invalidArgument, "schema: the value echo would build for it is about \(node.echoBytes) bytes, over wisp's \(Self.maxEchoBytes)-byte limit (look at minItems); use smaller bounds")
        }
        var budget = Budget()
        return try Self.echoValue(node, n: n, &budget)
    }

    private static func echoValue(_ s: Node, n: Int, _ budget: inout Budget) throws(WispError) -> JSONValue {
        try budget.step()
        if let c = s.const { return c }
        if let first = s.choices?.first { return first }
        if let first = (s.anyOf ?? s.oneOf)?.first { return try echoValue(first, n: n, &budget) }
        switch s.kind {
        case .object:
            var members: [JSONMember] = []
            members.reserveCapacity(s.properties.count)
            for p in s.properties { members.append(JSONMember(p.key, try echoValue(p.node, n: n, &budget))) }
            return .object(members)
        case .array:
            let item = try s.items.map { node throws(WispError) in try echoValue(node, n: n, &budget) } ?? .null
            return .array(Array(repeating: item, count: max(s.minItems ?? 0, 1)))
        case .string: return .string("echo \(n)")
        case .integer: return .number(s.minimum.map(wholeNumber) ?? JSONNumber(n))
        case .number: return .number(s.minimum ?? JSONNumber(n))
        case .boolean: return .bool(true)
        default: return .null
        }
    }

    /// An integer schema's whole `minimum` in plain digits (1e3 as 1000, 5.0 as 5), exactly; a
    /// bound that is not whole stays as written (the shim refuses those for integers).
    static func wholeNumber(_ n: JSONNumber) -> JSONNumber {
        guard let d = n.decimal, d.isInteger else { return n }
        if d.isZero { return JSONNumber(0) }
        var text = d.negative ? "-" : ""
        text += String(decoding: d.digits, as: UTF8.self)
        text += String(repeating: "0", count: d.exponent)
        return JSONNumber(unchecked: text)
    }
}

// MARK: - the verdict on a reply

extension OutputSchema {
    /// Room in a reply frame for everything but the reply's text (ids, counts, a store error).
    static let replyOverhead = 16 * 1024

    /// The one verdict on a finished reply, before its turn may be committed: it matches the
    /// call's schema, and it fits in a pipe frame once encoded (else `reply_too_large`). Off the
    /// pipe loop unless the reply is short and there is no schema.
    public static func checkReply(_ text: String, settings: GenerationSettings) async throws(WispError) {
        if settings.schema == nil, text.utf8.count < 64 * 1024 { return try checkSize(text) }
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
        throw WispError(.replyTooLarge, "the reply is \(size) bytes once JSON-encoded, over the \(limit) bytes a reply may have on wisp's pipe (its frame limit is \(maxFrameBytes) bytes); the turn was not added to the thread. Ask for a shorter reply (max_output_tokens), or attach smaller files.")
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
            return JSONValue.object([JSONMember("schema_error", "the line is not a JSON array of two strings")]).jsonText
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
