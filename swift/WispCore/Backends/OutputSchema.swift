import WispInfrastructure

/// Structured output: a `respond` call's JSON Schema, compiled, which every backend builds
/// from; the one verdict on the model's reply, taken before the turn may join the history, is
/// in OutputVerdict.swift, and echo's value for a schema in Echo/EchoValues.swift.
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
            guard depth <= OutputSchema.maxDepth else {
                throw WispError(.invalidArgument,
                        "schema is nested more than \(OutputSchema.maxDepth) " +
                        "levels deep (at \(path)); use a flatter schema")
            }
            guard case .object = s else {
                throw WispError(.invalidArgument, "schema at \(path) must be an object (a schema)")
            }
            let at = Place(schema: s, path: path, depth: depth)
            kind = try at.kind()
            const = s["const"]
            choices = try at.choices()
            anyOf = try at.branches("anyOf")
            oneOf = try at.branches("oneOf")
            (properties, index) = try at.properties()
            required = try at.required()
            closed = try at.closed()
            items = try s["items"].map { (i) throws(WispError) in try Node(i, path: "\(path)/items", depth: depth + 1) }
            minItems = try at.count("minItems")
            maxItems = try at.count("maxItems")
            pattern = try at.pattern()
            minimum = try at.bound("minimum")
            maximum = try at.bound("maximum")
            echoBytes = Self.echoSize(const: const, choices: choices, first: (anyOf ?? oneOf)?.first, kind: kind,
                                      properties: properties,
                                      items: items, minItems: minItems, minimum: minimum)
        }

        /// One schema object being compiled, and where it is: each keyword read and checked.
        private struct Place {
            let schema: JSONValue
            let path: String
            let depth: Int

            func bad(_ keyword: String, _ why: String) -> WispError {
                WispError(.invalidArgument, "schema: `\(keyword)` at \(path) \(why)")
            }

            func kind() throws(WispError) -> Kind? {
                guard let t = schema["type"] else { return nil }
                guard let name = t.string, let k = Kind(rawValue: name) else {
                    throw bad("type", "must be one of object, array, string, integer, number, boolean, null")
                }
                return k
            }

            func choices() throws(WispError) -> [JSONValue]? {
                guard let e = schema["enum"] else { return nil }
                guard let members = e.array, !members.isEmpty else { throw bad("enum", "must be a non-empty array") }
                return members
            }

            func branches(_ keyword: String) throws(WispError) -> [Node]? {
                guard let b = schema[keyword] else { return nil }
                guard let list = b.array, !list.isEmpty else {
                    throw bad(keyword, "must be a non-empty array of schemas")
                }
                var out: [Node] = []
                for (k, item) in list.enumerated() {
                    out.append(try Node(item, path: "\(path)/\(keyword)/\(k)", depth: depth + 1))
                }
                return out
            }

            func properties() throws(WispError) -> ([(key: String, node: Node)], [[UInt8]: Int]) {
                var properties: [(key: String, node: Node)] = []
                var index: [[UInt8]: Int] = [:]
                guard let p = schema["properties"] else { return (properties, index) }
                guard let members = p.members else { throw bad("properties", "must be an object") }
                for m in members {
                    let node = try Node(m.value, path: "\(path)/properties/\(Node.escape(m.key))", depth: depth + 1)
                    // JSON keeps the last of a key given twice, as Python's json (the shim's) does.
                    if let k = index[Array(m.key.utf8)] { properties[k].node = node } else {
                        index[Array(m.key.utf8)] = properties.count
                        properties.append((m.key, node))
                    }
                }
                return (properties, index)
            }

            func required() throws(WispError) -> [String] {
                guard let r = schema["required"] else { return [] }
                guard let names = r.array, let strings = Optional(names.compactMap(\.string)),
                      strings.count == names.count else {
                    throw bad("required", "must be an array of property names")
                }
                return strings
            }

            func closed() throws(WispError) -> Bool {
                guard let a = schema["additionalProperties"] else { return false }
                guard a.bool == false else { throw bad("additionalProperties", "must be false (or left out)") }
                return true
            }

            func count(_ keyword: String) throws(WispError) -> Int? {
                guard let v = schema[keyword] else { return nil }
                guard let n = v.number, n.isInteger,
                      !(n.decimal?.negative ?? true) || (n.decimal?.isZero ?? false) else {
                    throw bad(keyword, "must be a whole number of items, at least 0")
                }
                // Past Int, a bound is beyond any reply: saturated.
                return n.int ?? Int.max
            }

            func pattern() throws(WispError) -> (text: String, regex: LinearRegex)? {
                guard let p = schema["pattern"] else { return nil }
                guard let text = p.string else { throw bad("pattern", "must be a string") }
                do {
                    return (text, try LinearRegex(text, dialect: .ecma))
                } catch {
                    throw WispError(.invalidArgument,
                            "schema: `pattern` at \(path) is not a regular expression wisp can use: \(error.message)")
                }
            }

            func bound(_ keyword: String) throws(WispError) -> JSONNumber? {
                guard let v = schema[keyword] else { return nil }
                guard let n = v.number, let d = n.decimal else { throw bad(keyword, "must be a number") }
                // Echo writes a whole bound out in digits: a number of thousands of digits is no bound anyone means.
                guard d.magnitude <= 400, d.magnitude >= -400 else {
                    throw bad(keyword, "is \(n.text.prefix(40)), too large or too small a number for wisp")
                }
                return n
            }
        }

        static func escape(_ key: String) -> String {
            key.replacing("~", with: "~0").replacing("/", with: "~1")
        }

        private static let cap = Int.max / 4

        private static func echoSize(const: JSONValue?, choices: [JSONValue]?, first: Node?, kind: Kind?,
                                     properties: [(key: String, node: Node)], items: Node?, minItems: Int?,
                                     minimum: JSONNumber?) -> Int {
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
            case .integer, .number:
                return minimum.map { $0.decimal.map { max($0.magnitude, 0) + $0.digits.count + 3 } ?? 24 } ?? 24
            default: return 5
            }
        }
    }

    /// Counts the work of one check, to look at cancellation now and then rather than at every node.
    struct Budget {
        var steps = 0
        mutating func step() throws(WispError) {
            steps &+= 1
            if steps & 63 == 0, Task.isCancelled { throw WispError.callCancelled }
        }
    }
}
