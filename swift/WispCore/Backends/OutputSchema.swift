/// Structured output: a `respond` call's JSON Schema, what every backend builds from it, and the
/// check of the model's reply against it before the turn may join the history.
///
/// The shim refuses any schema outside wisp's supported subset before the core is called (it
/// names the keyword and where it is), so the core reads only that subset: object
/// (`properties`, `required`, `additionalProperties: false`), array (`items`, `minItems`,
/// `maxItems`), string (`pattern`), integer and number (`minimum`, `maximum`), boolean, null,
/// `enum` and `const` (strings, numbers, null), `anyOf`/`oneOf`, `description`/`title`.
///
/// Validation lives here, not (only) in the shim, because a reply that fails it must not enter
/// the history: the core has to know before it commits the turn. The shim validates again
/// with `jsonschema` as a second guard.

/// A JSON value that keeps an object's members in the order written. The order matters: the
/// echo backend builds properties in schema order, and llama-server and Apple's model generate
/// them in that order. Codable's keyed containers (and JSONSerialization) do not keep it, which
/// is why the pipe carries a schema as JSON text and this file parses it.
public indirect enum JSONValue: Sendable, Equatable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case array([JSONValue])
    case object([JSONMember])

    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { $0.key == key }?.value
    }

    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var number: Double? { if case .number(let n) = self { n } else { nil } }
    public var array: [JSONValue]? { if case .array(let a) = self { a } else { nil } }
    public var members: [JSONMember]? { if case .object(let m) = self { m } else { nil } }

    /// Whole numbers up to 2^53 print without a fraction, as JSON writers do.
    var integer: Int? {
        guard let n = number, n.rounded() == n, abs(n) <= 9_007_199_254_740_992 else { return nil }
        return Int(n)
    }
}

public struct JSONMember: Sendable, Equatable {
    public var key: String
    public var value: JSONValue
    public init(_ key: String, _ value: JSONValue) { self.key = key; self.value = value }
}

// MARK: - JSON text

extension JSONValue {
    /// Deep enough for any schema the shim accepts (it limits nesting) and any value built from one.
    static let maxDepth = 256

    /// Parses JSON text (RFC 8259; whitespace around the value is allowed). The error says where it failed.
    public static func parse(_ text: String) throws(JSONParseError) -> JSONValue {
        var parser = JSONParser(bytes: Array(text.utf8))
        parser.skipSpace()
        let value = try parser.value(depth: 0)
        parser.skipSpace()
        guard parser.atEnd else { throw parser.error("unexpected text after the JSON value") }
        return value
    }

    /// Compact JSON text, members in their order.
    public var jsonText: String {
        var out = ""
        write(to: &out)
        return out
    }

    private func write(to out: inout String) {
        switch self {
        case .null: out += "null"
        case .bool(let b): out += b ? "true" : "false"
        case .number(let n):
            if let i = integer { out += String(i) } else { out += n.isFinite ? "\(n)" : "null" }
        case .string(let s): Self.writeString(s, to: &out)
        case .array(let items):
            out += "["
            for (i, item) in items.enumerated() {
                if i > 0 { out += "," }
                item.write(to: &out)
            }
            out += "]"
        case .object(let members):
            out += "{"
            for (i, m) in members.enumerated() {
                if i > 0 { out += "," }
                Self.writeString(m.key, to: &out)
                out += ":"
                m.value.write(to: &out)
            }
            out += "}"
        }
    }

    private static func writeString(_ s: String, to out: inout String) {
        out += "\""
        for scalar in s.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\r": out += "\\r"
            case "\t": out += "\\t"
            case _ where scalar.value < 0x20:
                let hex = String(scalar.value, radix: 16)
                out += "\\u" + String(repeating: "0", count: 4 - hex.count) + hex
            default: out.unicodeScalars.append(scalar)
            }
        }
        out += "\""
    }
}

public struct JSONParseError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    /// Byte offset into the text.
    public var offset: Int
    public var description: String { "\(message) at byte \(offset)" }
}

private struct JSONParser {
    let bytes: [UInt8]
    var i = 0

    var atEnd: Bool { i >= bytes.count }

    func error(_ message: String) -> JSONParseError { JSONParseError(message: message, offset: i) }

    mutating func skipSpace() {
        while i < bytes.count, [0x20, 0x09, 0x0A, 0x0D].contains(bytes[i]) { i += 1 }
    }

    mutating func value(depth: Int) throws(JSONParseError) -> JSONValue {
        guard depth < JSONValue.maxDepth else { throw error("nested more than \(JSONValue.maxDepth) levels deep") }
        guard i < bytes.count else { throw error(i == 0 ? "no JSON value" : "the text ends before the JSON value does") }
        switch bytes[i] {
        case UInt8(ascii: "{"):
            i += 1
            var members: [JSONMember] = []
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "}") { i += 1; return .object(members) }
            while true {
                skipSpace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw error(atEnd ? "the text ends inside an object" : "expected a member name in quotes") }
                let key = try string()
                skipSpace()
                guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw error(atEnd ? "the text ends inside an object" : "expected ':' after a member name") }
                i += 1
                skipSpace()
                members.append(JSONMember(key, try value(depth: depth + 1)))
                skipSpace()
                guard i < bytes.count else { throw error("the text ends inside an object") }
                if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(members) }
                throw error("expected ',' or '}' in an object")
            }
        case UInt8(ascii: "["):
            i += 1
            var items: [JSONValue] = []
            skipSpace()
            if i < bytes.count, bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
            while true {
                skipSpace()
                items.append(try value(depth: depth + 1))
                skipSpace()
                guard i < bytes.count else { throw error("the text ends inside an array") }
                if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
                throw error("expected ',' or ']' in an array")
            }
        case UInt8(ascii: "\""):
            return .string(try string())
        case UInt8(ascii: "t"): try literal("true"); return .bool(true)
        case UInt8(ascii: "f"): try literal("false"); return .bool(false)
        case UInt8(ascii: "n"): try literal("null"); return .null
        case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"):
            return .number(try number())
        default:
            throw error("unexpected character '\(String(decoding: [bytes[i]], as: UTF8.self))'")
        }
    }

    mutating func literal(_ word: String) throws(JSONParseError) {
        let w = Array(word.utf8)
        guard i + w.count <= bytes.count, Array(bytes[i..<i + w.count]) == w else {
            throw error(i + w.count > bytes.count ? "the text ends inside '\(word)'" : "expected '\(word)'")
        }
        i += w.count
    }

    mutating func number() throws(JSONParseError) -> Double {
        let start = i
        func digits(_ p: inout JSONParser) -> Int {
            let s = p.i
            while p.i < p.bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(p.bytes[p.i]) { p.i += 1 }
            return p.i - s
        }
        if bytes[i] == UInt8(ascii: "-") { i += 1 }
        let whole = i
        guard digits(&self) > 0 else { throw error(atEnd ? "the text ends inside a number" : "expected a digit") }
        if bytes[whole] == UInt8(ascii: "0"), i - whole > 1 { throw JSONParseError(message: "a number may not start with 0", offset: whole) }
        if i < bytes.count, bytes[i] == UInt8(ascii: ".") {
            i += 1
            guard digits(&self) > 0 else { throw error(atEnd ? "the text ends inside a number" : "expected a digit after '.'") }
        }
        if i < bytes.count, bytes[i] == UInt8(ascii: "e") || bytes[i] == UInt8(ascii: "E") {
            i += 1
            if i < bytes.count, bytes[i] == UInt8(ascii: "+") || bytes[i] == UInt8(ascii: "-") { i += 1 }
            guard digits(&self) > 0 else { throw error(atEnd ? "the text ends inside a number" : "expected a digit in the exponent") }
        }
        guard let n = Double(String(decoding: bytes[start..<i], as: UTF8.self)), n.isFinite else {
            throw JSONParseError(message: "the number is too large", offset: start)
        }
        return n
    }

    mutating func string() throws(JSONParseError) -> String {
        i += 1 // the opening quote
        var scalars = String.UnicodeScalarView()
        var run = i
        func flush(_ p: JSONParser, _ from: Int, into s: inout String.UnicodeScalarView) {
            s.append(contentsOf: String(decoding: p.bytes[from..<p.i], as: UTF8.self).unicodeScalars)
        }
        while true {
            guard i < bytes.count else { throw error("the text ends inside a string") }
            let b = bytes[i]
            if b == UInt8(ascii: "\"") {
                flush(self, run, into: &scalars)
                i += 1
                return String(scalars)
            }
            if b < 0x20 { throw error("a control character inside a string must be escaped") }
            guard b == UInt8(ascii: "\\") else { i += 1; continue }
            flush(self, run, into: &scalars)
            i += 1
            guard i < bytes.count else { throw error("the text ends inside a string") }
            let e = bytes[i]
            i += 1
            switch e {
            case UInt8(ascii: "\""): scalars.append("\"")
            case UInt8(ascii: "\\"): scalars.append("\\")
            case UInt8(ascii: "/"): scalars.append("/")
            case UInt8(ascii: "b"): scalars.append("\u{08}")
            case UInt8(ascii: "f"): scalars.append("\u{0C}")
            case UInt8(ascii: "n"): scalars.append("\n")
            case UInt8(ascii: "r"): scalars.append("\r")
            case UInt8(ascii: "t"): scalars.append("\t")
            case UInt8(ascii: "u"):
                var code = try hex4()
                if (0xD800..<0xDC00).contains(code), i + 1 < bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") {
                    let save = i
                    i += 2
                    let low = try hex4()
                    if (0xDC00..<0xE000).contains(low) {
                        code = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00)
                    } else {
                        i = save
                    }
                }
                // A lone surrogate is not a character: it reads as U+FFFD, as most decoders do.
                scalars.append(Unicode.Scalar(code) ?? "\u{FFFD}")
            default:
                throw JSONParseError(message: "unknown escape in a string", offset: i - 2)
            }
            run = i
        }
    }

    mutating func hex4() throws(JSONParseError) -> UInt32 {
        guard i + 4 <= bytes.count, let v = UInt32(String(decoding: bytes[i..<i + 4], as: UTF8.self), radix: 16) else {
            throw error("expected four hex digits after \\u")
        }
        i += 4
        return v
    }
}

// MARK: - The schema

/// A `respond` call's JSON Schema, parsed once when the call arrives.
public struct OutputSchema: Sendable, Equatable {
    /// The schema as the caller wrote it (compact JSON text), for backends that forward it.
    public let text: String
    public let root: JSONValue

    /// Throws `invalid_argument` when the text is not a JSON object or a `pattern` does not compile.
    public init(text: String) throws(WispError) {
        let root: JSONValue
        do {
            root = try JSONValue.parse(text)
        } catch {
            throw WispError(.invalidArgument, "schema is not valid JSON: \(error)")
        }
        guard case .object = root else { throw WispError(.invalidArgument, "schema must be a JSON object") }
        try Self.checkPatterns(root, path: "#")
        self.text = root.jsonText
        self.root = root
    }

    private static func checkPatterns(_ node: JSONValue, path: String) throws(WispError) {
        switch node {
        case .object(let members):
            for m in members {
                if m.key == "pattern", let p = m.value.string {
                    do { _ = try Regex(p) } catch {
                        throw WispError(.invalidArgument, "schema: `pattern` at \(path) is not a regular expression wisp can use: \(error)")
                    }
                }
                try checkPatterns(m.value, path: "\(path)/\(m.key)")
            }
        case .array(let items):
            for (k, item) in items.enumerated() { try checkPatterns(item, path: "\(path)/\(k)") }
        default:
            break
        }
    }

    // MARK: validation

    /// Checks the model's reply: nil when it is JSON that matches the schema, else what is wrong.
    public func problem(with reply: String) -> String? {
        let value: JSONValue
        do {
            value = try JSONValue.parse(reply)
        } catch {
            return "the reply is not valid JSON (\(error))"
        }
        return Self.problem(value, root, at: "$")
    }

    /// Throws `invalid_output` when the reply does not parse or match; the message says what to try.
    public func check(_ reply: String, maxOutputTokens: Int?) throws(WispError) {
        guard let problem = problem(with: reply) else { return }
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

    private static func problem(_ v: JSONValue, _ s: JSONValue, at path: String) -> String? {
        if let c = s["const"], !same(v, c) { return "\(path) must be \(c.jsonText), got \(short(v))" }
        if let e = s["enum"]?.array, !e.contains(where: { same(v, $0) }) {
            return "\(path) must be one of \(short(.array(e))), got \(short(v))"
        }
        if let branches = s["anyOf"]?.array {
            let fits = branches.filter { problem(v, $0, at: path) == nil }.count
            if fits == 0 { return "\(path) matches none of the `anyOf` choices: \(short(v))" }
        }
        if let branches = s["oneOf"]?.array {
            let fits = branches.filter { problem(v, $0, at: path) == nil }.count
            if fits != 1 { return "\(path) must match exactly one `oneOf` choice, matches \(fits): \(short(v))" }
        }
        guard let type = s["type"]?.string else { return nil }
        switch (type, v) {
        case ("null", .null), ("boolean", .bool):
            return nil
        case ("string", .string(let str)):
            if let p = s["pattern"]?.string, let regex = try? Regex(p), !str.contains(regex) {
                return "\(path) must match the pattern \(p), got \(short(v))"
            }
            return nil
        case ("integer", .number(let n)) where n.rounded() == n, ("number", .number(let n)):
            if let lo = s["minimum"]?.number, n < lo { return "\(path) must be at least \(JSONValue.number(lo).jsonText), got \(v.jsonText)" }
            if let hi = s["maximum"]?.number, n > hi { return "\(path) must be at most \(JSONValue.number(hi).jsonText), got \(v.jsonText)" }
            return nil
        case ("array", .array(let items)):
            if let lo = s["minItems"]?.integer, items.count < lo { return "\(path) must have at least \(lo) item(s), has \(items.count)" }
            if let hi = s["maxItems"]?.integer, items.count > hi { return "\(path) must have at most \(hi) item(s), has \(items.count)" }
            if let itemSchema = s["items"] {
                for (k, item) in items.enumerated() {
                    if let p = problem(item, itemSchema, at: "\(path)[\(k)]") { return p }
                }
            }
            return nil
        case ("object", .object(let members)):
            var seen = Set<String>()
            for m in members where !seen.insert(m.key).inserted { return "\(path) has the key \"\(m.key)\" twice" }
            let properties = s["properties"]?.members ?? []
            for name in s["required"]?.array?.compactMap(\.string) ?? [] where !seen.contains(name) {
                return "\(path) is missing the required property \"\(name)\""
            }
            let closed = s["additionalProperties"] == .bool(false)
            for m in members {
                if let sub = properties.first(where: { $0.key == m.key }) {
                    if let p = problem(m.value, sub.value, at: "\(path).\(m.key)") { return p }
                } else if closed {
                    return "\(path) has the property \"\(m.key)\", which the schema does not allow"
                }
            }
            return nil
        default:
            return "\(path) must be \(type == "integer" || type == "array" || type == "object" ? "an" : "a") \(type), got \(short(v))"
        }
    }

    /// JSON equality for the scalars `enum` and `const` may hold (1 and 1.0 are the same number).
    private static func same(_ a: JSONValue, _ b: JSONValue) -> Bool { a == b }

    private static func short(_ v: JSONValue) -> String {
        let t = v.jsonText
        return t.count <= 80 ? t : String(t.prefix(77)) + "..."
    }

    // MARK: echo

    /// The echo backend's value for this schema (the echo contract's "Structured output" table).
    public func echoValue(n: Int) -> JSONValue { Self.echoValue(root, n: n) }

    private static func echoValue(_ s: JSONValue, n: Int) -> JSONValue {
        if let c = s["const"] { return c }
        if let first = s["enum"]?.array?.first { return first }
        if let first = (s["anyOf"] ?? s["oneOf"])?.array?.first { return echoValue(first, n: n) }
        switch s["type"]?.string {
        case "object":
            return .object((s["properties"]?.members ?? []).map { JSONMember($0.key, echoValue($0.value, n: n)) })
        case "array":
            let count = max(s["minItems"]?.integer ?? 0, 1)
            return .array(Array(repeating: echoValue(s["items"] ?? [:], n: n), count: count))
        case "string": return .string("echo \(n)")
        case "integer", "number": return s["minimum"] ?? .number(Double(n))
        case "boolean": return .bool(true)
        default: return .null
        }
    }
}

extension JSONValue: ExpressibleByDictionaryLiteral {
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(elements.map { JSONMember($0.0, $0.1) })
    }
}
