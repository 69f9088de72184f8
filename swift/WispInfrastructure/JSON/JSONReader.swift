/// The reader of wisp's one JSON codec (JSON/JSON.swift): the cursor, scalars and strings. Its
/// containers and typed field tables are in JSON/JSONReaderObjects.swift.

/// Reads JSON text in one pass: either whole values (`value()`) or, for the pipe's messages and
/// stored threads, straight into typed fields (`object(into:_:)` with a `JSONFields` table), which
/// builds no intermediate tree.
public struct JSONReader {
    let b: UnsafeRawBufferPointer
    // Internal, not private: the containers (JSONReaderObjects.swift) move them too.
    var i = 0
    var depth = 0

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
    mutating func take(_ c: UInt8) -> Bool {
        skipSpace()
        guard i < b.count, b[i] == c else { return false }
        i += 1
        return true
    }

    func what() -> String {
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

    func expected(_ kind: String) -> JSONError { error("expected \(kind), \(what())") }

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
}
