/// wisp's one JSON codec: the value (`JSONValue`), the reader (`JSONReader`) and, in
/// JSON/JSONWriter.swift, the writer. The pipe's messages, schemas and the replies judged
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

// MARK: - numbers

/// A JSON number as written: valid JSON number text, never rounded.
public struct JSONNumber: Sendable, CustomStringConvertible {
    /// The text, in JSON's number grammar.
    public let text: String

    /// `text` must be in JSON's number grammar (the reader checks it; `init(_: Int)` and
    /// `init(_: Double)` make it).
    public init(unchecked text: String) { self.text = text }

    public init(_ value: Int) { text = String(value) }

    /// nil for a value JSON cannot hold (infinity, NaN).
    public init?(_ value: Double) {
        guard value.isFinite else { return nil }
        if value == value.rounded(), value.magnitude < 1e15 {
            text = String(Int(value))
        } else {
            text = value.description
        }
    }

    public var description: String { text }

    /// The value as a decimal: sign, significant digits (no leading or trailing zeros; empty for
    /// zero) and the power of ten they are multiplied by. Nil when the exponent is beyond what
    /// an `Int` holds (the reader refuses such numbers).
    public var decimal: Decimal? {
        var negative = false
        var digits: [UInt8] = []
        var exponent = 0
        var fraction = 0
        var inFraction = false
        var it = Array(text.utf8)[...]
        if it.first == UInt8(ascii: "-") { negative = true; it = it.dropFirst() }
        while let c = it.first, c != UInt8(ascii: "e"), c != UInt8(ascii: "E") {
            it = it.dropFirst()
            if c == UInt8(ascii: ".") { inFraction = true; continue }
            if digits.isEmpty && c == UInt8(ascii: "0") { if inFraction { fraction += 1 }; continue }
            digits.append(c)
            if inFraction { fraction += 1 }
        }
        if !it.isEmpty {
            it = it.dropFirst()
            var expNegative = false
            if it.first == UInt8(ascii: "-") {
                expNegative = true
                it = it.dropFirst()
            } else if it.first == UInt8(ascii: "+") {
                it = it.dropFirst()
            }
            var e = 0
            for c in it {
                let (m, o1) = e.multipliedReportingOverflow(by: 10)
                let (a, o2) = m.addingReportingOverflow(Int(c &- 0x30))
                guard !o1, !o2, a <= 1 << 60 else { return nil }
                e = a
            }
            exponent = expNegative ? -e : e
        }
        exponent -= fraction
        while digits.last == UInt8(ascii: "0") { digits.removeLast(); exponent += 1 }
        if digits.isEmpty { return Decimal(negative: false, digits: [], exponent: 0) }
        return Decimal(negative: negative, digits: digits, exponent: exponent)
    }

    /// An exact decimal: value = (negative ? -1 : 1) × digits × 10^exponent.
    public struct Decimal: Sendable, Equatable, Comparable {
        public let negative: Bool
        /// ASCII digits, the first and last non-zero; empty for zero.
        public let digits: [UInt8]
        public let exponent: Int

        public var isZero: Bool { digits.isEmpty }
        public var isInteger: Bool { exponent >= 0 }

        /// The power of ten of the leading digit: orders magnitudes before digits are compared.
        public var magnitude: Int { exponent + digits.count }

        public static func < (a: Decimal, b: Decimal) -> Bool {
            if a.isZero && b.isZero { return false }
            if a.negative != b.negative || a.isZero || b.isZero {
                let sa = a.isZero ? 0 : (a.negative ? -1 : 1), sb = b.isZero ? 0 : (b.negative ? -1 : 1)
                return sa < sb
            }
            let smaller = absLess(a, b)
            return a.negative ? (!smaller && a != b) : smaller
        }

        private static func absLess(_ a: Decimal, _ b: Decimal) -> Bool {
            if a.magnitude != b.magnitude { return a.magnitude < b.magnitude }
            for k in 0..<max(a.digits.count, b.digits.count) {
                let x = k < a.digits.count ? a.digits[k] : 0x30, y = k < b.digits.count ? b.digits[k] : 0x30
                if x != y { return x < y }
            }
            return false
        }
    }

    /// The value as an `Int` when it is a whole number that fits (1.0 and 1e2 are whole).
    public var int: Int? {
        if let fast = Int(text) { return fast }
        guard let d = decimal, d.isInteger, d.magnitude <= 19 else { return nil }
        var v = 0
        for c in d.digits {
            let (m, o1) = v.multipliedReportingOverflow(by: 10)
            let (a, o2) = d.negative
                ? m.subtractingReportingOverflow(Int(c &- 0x30)) : m.addingReportingOverflow(Int(c &- 0x30))
            guard !o1, !o2 else { return nil }
            v = a
        }
        for _ in 0..<d.exponent {
            let (m, o) = v.multipliedReportingOverflow(by: 10)
            guard !o else { return nil }
            v = m
        }
        return v
    }

    /// The nearest `Double`, nil when it is out of `Double`'s range.
    public var double: Double? {
        guard let d = Double(text), d.isFinite else { return nil }
        return d
    }

    /// True when the value is a whole number (JSON Schema's `integer`: 1.0 is one).
    public var isInteger: Bool { decimal?.isInteger ?? false }
}

extension JSONNumber: Equatable, Comparable {
    /// Equal values, however written (1, 1.0 and 10e-1 are one number).
    public static func == (a: JSONNumber, b: JSONNumber) -> Bool {
        a.text == b.text || (a.decimal != nil && a.decimal == b.decimal)
    }

    public static func < (a: JSONNumber, b: JSONNumber) -> Bool {
        guard let x = a.decimal, let y = b.decimal else { return false }
        return x < y
    }
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

// MARK: - the reader

/// Reads JSON text in one pass: either whole values (`value()`) or, for the pipe's messages and
/// stored threads, straight into typed fields (`object(into:_:)` with a `JSONFields` table), which
/// builds no intermediate tree.
public struct JSONReader {
    let b: UnsafeRawBufferPointer
    private(set) var i = 0
    private var depth = 0

    public init(_ bytes: UnsafeRawBufferPointer) { b = bytes }

    func error(_ message: String) -> JSONError { JSONError(message, at: i) }

    @inline(__always)
    mutating func skipSpace() {
        while i < b.count {
            switch b[i] {
            case 0x20, 0x0A, 0x0D, 0x09: i += 1
            default: return
            }
        }
    }

    /// Only whitespace is left.
    public mutating func end() throws(JSONError) {
        skipSpace()
        guard i == b.count else { throw error("unexpected text after the JSON value") }
    }

    @inline(__always)
    private mutating func take(_ c: UInt8) -> Bool {
        skipSpace()
        guard i < b.count, b[i] == c else { return false }
        i += 1
        return true
    }

    private func what() -> String {
        guard i < b.count else { return "the text ends" }
        switch b[i] {
        case 0x22: return "found a string"
        case 0x7B: return "found an object"
        case 0x5B: return "found an array"
        case 0x74, 0x66: return "found a boolean"
        case 0x6E: return "found null"
        case 0x2D, 0x30...0x39: return "found a number"
        default: return "found '\(String(decoding: [b[i]], as: UTF8.self))'"
        }
    }

    private func expected(_ kind: String) -> JSONError { error("expected \(kind), \(what())") }

    private mutating func word(_ w: StaticString) -> Bool {
        let n = w.utf8CodeUnitCount
        guard i + n <= b.count else { return false }
        let same = w.withUTF8Buffer { $0.elementsEqual(UnsafeRawBufferPointer(rebasing: b[i..<i + n])) }
        if same { i += n }
        return same
    }

    // MARK: scalars

    /// `null`, taken; false (nothing taken) for anything else.
    public mutating func null() -> Bool {
        skipSpace()
        return i < b.count && b[i] == 0x6E && word("null")
    }

    public mutating func bool() throws(JSONError) -> Bool {
        skipSpace()
        if i < b.count, b[i] == 0x74, word("true") { return true }
        if i < b.count, b[i] == 0x66, word("false") { return false }
        throw expected("a boolean")
    }

    /// A number's text, checked against JSON's grammar.
    public mutating func number() throws(JSONError) -> JSONNumber {
        skipSpace()
        let start = i
        guard let end = numberEnd() else { throw i == start ? expected("a number") : error("not a valid number") }
        i = end
        return JSONNumber(unchecked: String(decoding: UnsafeRawBufferPointer(rebasing: b[start..<end]), as: UTF8.self))
    }

    /// Where the number at `i` ends, nil if there is none in JSON's grammar. Exponents are
    /// bounded (the value must stay comparable exactly): over 18 digits, not counting leading
    /// zeros (1e0000000000000000000001 is 10), is refused.
    private func numberEnd() -> Int? {
        var j = i
        func digits(_ j: inout Int) -> Int {
            let from = j
            while j < b.count, b[j] >= 0x30, b[j] <= 0x39 { j += 1 }
            return j - from
        }
        if j < b.count, b[j] == 0x2D { j += 1 }
        let whole = j
        let n = digits(&j)
        guard n > 0, !(n > 1 && b[whole] == 0x30) else { return nil }
        if j < b.count, b[j] == 0x2E {
            j += 1
            guard digits(&j) > 0 else { return nil }
        }
        if j < b.count, b[j] == 0x65 || b[j] == 0x45 {
            j += 1
            if j < b.count, b[j] == 0x2B || b[j] == 0x2D { j += 1 }
            let from = j
            while j < b.count, b[j] == 0x30 { j += 1 }
            let e = digits(&j)
            guard j > from, e <= 18 else { return nil }
        }
        return j
    }

    /// A JSON number that is a whole number fitting `Int` (written plainly, or as 1.0 or 1e2).
    public mutating func int() throws(JSONError) -> Int {
        skipSpace()
        // The usual case, a plain integer, without building its text.
        let start = i
        let negative = i < b.count && b[i] == 0x2D
        var j = negative ? i + 1 : i
        var value = 0
        var overflow = false
        while j < b.count, b[j] >= 0x30, b[j] <= 0x39 {
            let digit = Int(b[j] &- 0x30)
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (a, o2) = negative ? m.subtractingReportingOverflow(digit) : m.addingReportingOverflow(digit)
            overflow = overflow || o1 || o2
            value = a
            j += 1
        }
        let n = j - (negative ? i + 1 : i)
        if n > 0, !(n > 1 && b[negative ? i + 1 : i] == 0x30), !overflow,
           !(j < b.count && (b[j] == 0x2E || b[j] == 0x65 || b[j] == 0x45)) {
            i = j
            return value
        }
        let number = try number()
        guard let v = number.int else {
            i = start
            let shown = number.text.bounded(toBytes: 40)
            throw error(number.isInteger ? "the number \(shown) does not fit a 64-bit integer"
                                         : "expected a whole number, found \(shown)")
        }
        return v
    }

    /// A number as the nearest `Double`, as Python's and JavaScript's parsers read it: subnormals
    /// (5e-324) are numbers, and one below them reads as zero; only one past the range, which
    /// no finite Double is nearest to, is refused.
    public mutating func double() throws(JSONError) -> Double {
        skipSpace()
        let start = i
        let n = try number()
        guard let value = n.double else {
            i = start
            throw error("the number \(n.text.bounded(toBytes: 40)) is out of range")
        }
        return value
    }

    public mutating func string() throws(JSONError) -> String {
        skipSpace()
        guard i < b.count, b[i] == 0x22 else { throw expected("a string") }
        i += 1
        let start = i
        var ascii = true
        while i < b.count {
            let c = b[i]
            if c == 0x22 {
                defer { i += 1 }
                return try text(UnsafeRawBufferPointer(rebasing: b[start..<i]), ascii: ascii, at: start)
            }
            if c == 0x5C || c < 0x20 { break }
            if c >= 0x80 { ascii = false }
            i += 1
        }
        var out = [UInt8](UnsafeRawBufferPointer(rebasing: b[start..<i]))
        try unescape(into: &out)
        let reader = self
        return try out.withUnsafeBytes { bytes in
            catching { () throws(JSONError) in try reader.text(bytes, ascii: false, at: start) }
        }.get()
    }

    /// The rest of a string with escapes, from `i` to just past its closing quote.
    private mutating func unescape(into out: inout [UInt8]) throws(JSONError) {
        while i < b.count {
            let c = b[i]
            i += 1
            switch c {
            case 0x22:
                return
            case 0x5C:
                guard i < b.count else { throw error("the text ends inside a string") }
                let e = b[i]
                i += 1
                switch e {
                case 0x22, 0x5C, 0x2F: out.append(e)
                case 0x62: out.append(0x08)
                case 0x66: out.append(0x0C)
                case 0x6E: out.append(0x0A)
                case 0x72: out.append(0x0D)
                case 0x74: out.append(0x09)
                case 0x75:
                    let unit = try hex4()
                    var scalar: UInt32
                    if (0xD800...0xDBFF).contains(unit) {
                        guard i + 2 <= b.count, b[i] == 0x5C, b[i + 1] == 0x75 else {
                            throw error("a lone surrogate (\\u\(String(unit, radix: 16))) is not a character")
                        }
                        i += 2
                        let low = try hex4()
                        guard (0xDC00...0xDFFF).contains(low) else {
                            throw error("a lone surrogate (\\u\(String(unit, radix: 16))) is not a character")
                        }
                        scalar = 0x10000 + ((UInt32(unit) - 0xD800) << 10) + (UInt32(low) - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(unit) {
                        throw error("a lone surrogate (\\u\(String(unit, radix: 16))) is not a character")
                    } else {
                        scalar = UInt32(unit)
                    }
                    out.append(contentsOf: UTF8.encode(Unicode.Scalar(scalar)!)!)
                default:
                    throw JSONError("unknown escape \\\(String(decoding: [e], as: UTF8.self)) in a string", at: i - 2)
                }
            default:
                if c < 0x20 { throw JSONError("a control character inside a string must be escaped", at: i - 1) }
                out.append(c)
            }
        }
        throw error("the text ends inside a string")
    }

    private func text(_ bytes: UnsafeRawBufferPointer, ascii: Bool, at offset: Int) throws(JSONError) -> String {
        if ascii { return String(decoding: bytes, as: UTF8.self) }
        guard let s = String(validating: bytes, as: UTF8.self) else {
            throw JSONError("a string is not valid UTF-8", at: offset)
        }
        return s
    }

    private mutating func hex4() throws(JSONError) -> UInt16 {
        guard i + 4 <= b.count else { throw error("expected four hex digits after \\u") }
        var v: UInt16 = 0
        for _ in 0..<4 {
            let c = b[i]
            let d: UInt8
            switch c {
            case 0x30...0x39: d = c - 0x30
            case 0x41...0x46: d = c - 0x41 + 10
            case 0x61...0x66: d = c - 0x61 + 10
            default: throw error("expected four hex digits after \\u")
            }
            v = v << 4 | UInt16(d)
            i += 1
        }
        return v
    }

    /// `null` as nil, else what `read` reads.
    @inline(__always)
    public mutating func nullable<T>(_ read: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> T? {
        if null() { return nil }
        return try read(&self)
    }

    // MARK: containers

    private mutating func enter() throws(JSONError) {
        depth += 1
        guard depth <= JSONValue.maxDepth else { throw error("nested more than \(JSONValue.maxDepth) levels deep") }
    }

    /// An array, each item read by `item`.
    public mutating func array<T>(_ item: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> [T] {
        guard take(0x5B) else { throw expected("an array") }
        try enter()
        defer { depth -= 1 }
        var out: [T] = []
        if take(0x5D) { return out }
        repeat {
            do { out.append(try item(&self)) } catch { var e = error; e.path.insert("\(out.count)", at: 0); throw e }
        } while take(0x2C)
        guard take(0x5D) else { throw error("expected ',' or ']' in an array, \(what())") }
        return out
    }

    public mutating func strings() throws(JSONError) -> [String] { try array { r throws(JSONError) in try r.string() } }

    /// An object's members, each handed to `member` with its key: `member` reads the value.
    public mutating func members(_ member: (String, inout JSONReader) throws(JSONError) -> Void) throws(JSONError) {
        guard take(0x7B) else { throw expected("an object") }
        try enter()
        defer { depth -= 1 }
        if take(0x7D) { return }
        repeat {
            let key = try string()
            guard take(0x3A) else { throw error("expected ':' after a member name, \(what())") }
            try member(key, &self)
        } while take(0x2C)
        guard take(0x7D) else { throw error("expected ',' or '}' in an object, \(what())") }
    }

    /// An object read into `value` through `fields`: each known key at most once (a key twice
    /// is refused: which one would count is not defined), unknown keys skipped. Returns the keys
    /// it held, as a bit per place in `fields`.
    @discardableResult
    public mutating func object<T>(into value: inout T, _ fields: JSONFields<T>) throws(JSONError) -> UInt64 {
        guard take(0x7B) else { throw expected("an object") }
        try enter()
        defer { depth -= 1 }
        if take(0x7D) { return 0 }
        var seen: UInt64 = 0
        repeat {
            let k = try key(fields.names)
            guard take(0x3A) else { throw error("expected ':' after a member name, \(what())") }
            if let k {
                guard seen & (1 << UInt64(k)) == 0 else { throw error("the key '\(fields.names[k])' appears twice") }
                seen |= 1 << UInt64(k)
                do { try fields.reads[k](&self, &value) } catch {
                    var e = error
                    e.path.insert("\(fields.names[k])", at: 0)
                    throw e
                }
            } else {
                try skip()
            }
        } while take(0x2C)
        guard take(0x7D) else { throw error("expected ',' or '}' in an object, \(what())") }
        return seen
    }

    /// The value of member `name` of the object that starts here, read by `read`, without moving
    /// this reader: for a tag that says how to read the rest (the pipe's `op`), found at once
    /// when it comes first. Nil when the object has no such member; members before it are
    /// checked only as far as passing over them takes.
    public func member<T>(_ name: StaticString,
                          _ read: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> T? {
        var r = self
        guard r.take(0x7B) else { throw r.expected("an object") }
        if r.take(0x7D) { return nil }
        repeat {
            let k = try r.key([name])
            guard r.take(0x3A) else { throw r.error("expected ':' after a member name, \(r.what())") }
            if k != nil {
                do { return try read(&r) } catch {
                    var e = error
                    e.path.insert("\(name)", at: 0)
                    throw e
                }
            }
            try r.skip()
        } while r.take(0x2C)
        guard r.take(0x7D) else { throw r.error("expected ',' or '}' in an object, \(r.what())") }
        return nil
    }

    /// A key, as its place in `names` (nil for any other key). Keys without escapes, the usual
    /// case, are compared in place.
    private mutating func key(_ names: [StaticString]) throws(JSONError) -> Int? {
        skipSpace()
        guard i < b.count, b[i] == 0x22 else { throw expected("a member name in quotes") }
        let start = i + 1
        var end = start
        while end < b.count, b[end] != 0x22, b[end] != 0x5C, b[end] >= 0x20 { end += 1 }
        if end < b.count, b[end] == 0x22 {
            i = end + 1
            let found = UnsafeRawBufferPointer(rebasing: b[start..<end])
            for (n, name) in names.enumerated() where name.utf8CodeUnitCount == found.count {
                if name.withUTF8Buffer({ $0.elementsEqual(found) }) { return n }
            }
            // Unknown: still checked as a string (UTF-8).
            if found.contains(where: { $0 >= 0x80 }), String(validating: found, as: UTF8.self) == nil {
                throw JSONError("a string is not valid UTF-8", at: start)
            }
            return nil
        }
        let text = try string()
        return names.firstIndex { name in name.withUTF8Buffer { $0.elementsEqual(text.utf8) } }
    }

    /// Any value, checked and passed over.
    public mutating func skip() throws(JSONError) {
        skipSpace()
        guard i < b.count else { throw expected("a JSON value") }
        switch b[i] {
        case 0x7B: try members { _, r throws(JSONError) in try r.skip() }
        case 0x5B: _ = try array { r throws(JSONError) in try r.skip() }
        case 0x22: _ = try string()
        default: _ = try value()
        }
    }

    /// Any JSON value, whole.
    public mutating func value() throws(JSONError) -> JSONValue {
        skipSpace()
        guard i < b.count else { throw error(i == 0 ? "no JSON value" : "the text ends before the JSON value does") }
        switch b[i] {
        case 0x7B:
            var members: [JSONMember] = []
            try self.members { key, r throws(JSONError) in members.append(JSONMember(key, try r.value())) }
            return .object(members)
        case 0x5B: return .array(try array { r throws(JSONError) in try r.value() })
        case 0x22: return .string(try string())
        case 0x74, 0x66: return .bool(try bool())
        case 0x6E:
            guard null() else { throw expected("a JSON value") }
            return .null
        case 0x2D, 0x30...0x39: return .number(try number())
        default: throw expected("a JSON value")
        }
    }
}

/// How an object's known keys are read into a `T`: one entry per key, so a new optional field
/// of a message is one line here (`("name", { $1.name = try $0.nullable { try $0.string() } })`).
public struct JSONFields<T>: Sendable {
    public typealias Read = @Sendable (inout JSONReader, inout T) throws(JSONError) -> Void
    let names: [StaticString]
    let reads: [Read]

    public init(_ fields: KeyValuePairs<StaticString, Read>) {
        self.init(names: fields.map(\.key), reads: fields.map(\.value))
    }

    public init(names: [StaticString], reads: [Read]) {
        precondition(names.count <= 64 && names.count == reads.count, "JSONFields: at most 64 keys, one read each")
        self.names = names
        self.reads = reads
    }
}
