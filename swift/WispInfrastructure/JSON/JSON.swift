/// wisp's one JSON codec: the value (`JSONValue`, here), its numbers (JSON/JSONNumber.swift), the
/// reader (JSON/JSONReader.swift, its containers and field tables in JSON/JSONReaderObjects.swift)
/// and the writer (JSON/JSONWriter.swift). The pipe's messages, schemas and the replies judged
/// against them, the echo backend's values, model tools' schemas and stored threads all go
/// through it. (Still on Foundation's: the OpenAI backend's HTTP bodies and a model tool's
/// arguments, Tools/Catalogue.swift; no verdict of wisp's is taken on those numbers or keys.)
///
/// Exact on purpose: a number keeps the text it was written with (`JSONNumber`), so
/// 9007199254740993 stays that integer and 0.1 that decimal, and numbers compare by their
/// exact decimal value. Strings and object keys are sequences of Unicode scalars, compared as
/// such (`sameText`), never with `String ==`, which takes canonically equivalent texts (NFC and
/// NFD "café") as equal where JSON has two distinct keys. Object members keep their order.
///
/// Why by hand: Foundation's `JSONDecoder` and `JSONEncoder` cost more than everything else the
/// core does for a short reply (decoding one echo `respond`: the figure is in bench/), round
/// numbers through `Double`, and lose key order. The reader is strict RFC 8259
/// (UTF-8 only, no lone surrogate escapes, at most `maxDepth` levels); `make fuzz` and
/// PipeJSONTests compare it with `JSONDecoder` and `JSONSerialization`.


/// True when `a` and `b` are the same sequence of Unicode scalars (JSON's string equality).
@inlinable
public func sameText(_ a: String, _ b: String) -> Bool {
    a.utf8.elementsEqual(b.utf8)
}

// MARK: - values

/// A JSON value. Object members keep the order they were written in: the echo backend builds
/// properties in schema order, and llama-server and Apple's model generate them in that order.
public indirect enum JSONValue: Sendable {
    case null
    case bool(Bool)
    case number(JSONNumber)
    case string(String)
    case array([JSONValue])
    case object([JSONMember])

    /// The first member named `key` (compared as scalars), if this is an object.
    public subscript(key: String) -> JSONValue? {
        guard case .object(let members) = self else { return nil }
        return members.first { sameText($0.key, key) }?.value
    }

    public var string: String? { if case .string(let s) = self { s } else { nil } }
    public var number: JSONNumber? { if case .number(let n) = self { n } else { nil } }
    public var array: [JSONValue]? { if case .array(let a) = self { a } else { nil } }
    public var members: [JSONMember]? { if case .object(let m) = self { m } else { nil } }
    public var bool: Bool? { if case .bool(let b) = self { b } else { nil } }
    /// A whole number that fits an `Int`.
    public var int: Int? { number?.int }
}

extension JSONValue: Equatable {
    /// The same value: numbers by their exact value, strings and keys as scalars, members in order.
    public static func == (a: JSONValue, b: JSONValue) -> Bool {
        switch (a, b) {
        case (.null, .null): true
        case (.bool(let x), .bool(let y)): x == y
        case (.number(let x), .number(let y)): x == y
        case (.string(let x), .string(let y)): sameText(x, y)
        case (.array(let x), .array(let y)): x == y
        case (.object(let x), .object(let y)): x == y
        default: false
        }
    }
}

public struct JSONMember: Sendable, Equatable {
    public var key: String
    public var value: JSONValue
    public init(_ key: String, _ value: JSONValue) { self.key = key; self.value = value }

    public static func == (a: JSONMember, b: JSONMember) -> Bool { sameText(a.key, b.key) && a.value == b.value }
}

extension JSONValue: ExpressibleByDictionaryLiteral, ExpressibleByStringLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByBooleanLiteral, ExpressibleByArrayLiteral, ExpressibleByNilLiteral {
    public init(dictionaryLiteral elements: (String, JSONValue)...) {
        self = .object(elements.map { JSONMember($0.0, $0.1) })
    }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(integerLiteral value: Int) { self = .number(JSONNumber(value)) }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(arrayLiteral elements: JSONValue...) { self = .array(elements) }
    public init(nilLiteral: ()) { self = .null }
}

extension JSONValue {
    /// Deeper than anything wisp writes or accepts (the shim limits a schema's nesting), and
    /// JSONDecoder's own limit.
    static let maxDepth = 512

    /// Parses JSON text (RFC 8259; whitespace around the value is allowed). The error says where it failed.
    public static func parse(_ text: String) throws(JSONError) -> JSONValue {
        var text = text
        return try text.withUTF8 { bytes in
            catching { () throws(JSONError) in try parse(UnsafeRawBufferPointer(bytes)) }
        }.get()
    }

    public static func parse(_ bytes: UnsafeRawBufferPointer) throws(JSONError) -> JSONValue {
        var r = JSONReader(bytes)
        let value = try r.value()
        try r.end()
        return value
    }

    public static func parse(_ bytes: some Collection<UInt8>) throws(JSONError) -> JSONValue {
        let result: Result<JSONValue, JSONError>? = bytes.withContiguousStorageIfAvailable { b in
            do throws(JSONError) {
                return .success(try parse(UnsafeRawBufferPointer(b)))
            } catch {
                return .failure(error)
            }
        }
        if let result { return try result.get() }
        return try Array(bytes).withUnsafeBytes { b in catching { () throws(JSONError) in try parse(b) } }.get()
    }

    /// Compact JSON text, members in their order.
    public var jsonText: String {
        var w = JSONWriter()
        w.value(self)
        return String(decoding: w.bytes, as: UTF8.self)
    }
}

// MARK: - errors

/// `body`'s result or its error, as a value: for typed throws through the standard library's
/// `rethrows` closures (`withUnsafeBytes`), which lose the error's type.
@inline(__always)
public func catching<T, E: Error>(_ body: () throws(E) -> T) -> Result<T, E> {
    do { return .success(try body()) } catch { return .failure(error) }
}

public struct JSONError: Error, Sendable, Equatable, CustomStringConvertible {
    public var message: String
    /// Byte offset into the text.
    public var offset: Int
    /// The member names (and array indexes) leading to the value that is wrong, outermost first.
    public var path: [String] = []

    public init(_ message: String, at offset: Int) { self.message = message; self.offset = offset }

    public var description: String {
        if !path.isEmpty { return "field '\(path.joined(separator: "."))': \(message)" }
        return offset < 0 ? message : "\(message) at byte \(offset)"
    }
}
