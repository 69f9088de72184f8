import WispInfrastructure

/// How a caller's JSON parser reads a number. The caller gets a structured reply as a JSON value
/// and judges it with its own parser's numbers, so the verdict holds under each reading a caller
/// may use: Python's `json` (a number written without fraction or exponent is an exact integer,
/// any other the nearest double) and JavaScript's `JSON.parse` (every number the nearest double).
/// Judged as written instead, 1.0000000000000001 is not an integer and is above 1, yet every
/// caller reads 1.0; 1e400 is a number, yet every caller reads infinity (and gets null from a
/// JSON writer). The shim's value is Python's reading, and it writes it back out exactly (integers
/// in full, doubles as their shortest round-trip text), so both readings survive the shim.
enum NumberReading: CaseIterable, Sendable {
    case python, javaScript

    /// A number as this reading holds it.
    enum Value {
        /// An integer written in plain digits, exact (Python's `int`).
        case integer(JSONNumber)
        case double(Double)
    }

    var parser: String { self == .python ? "Python's json" : "JavaScript's JSON.parse" }

    func read(_ n: JSONNumber) -> Value {
        if self == .python, !n.text.utf8.contains(where: { $0 == UInt8(ascii: ".") || $0 | 0x20 == UInt8(ascii: "e") })
        {
            return .integer(n)
        }
        // Swift's Double(String) rounds correctly, as both parsers do; past the range it is infinite.
        return .double(Double(n.text) ?? .nan)
    }

    func isInteger(_ n: JSONNumber) -> Bool {
        switch read(n) {
        case .integer: true
        case .double(let d): d.isFinite && d == d.rounded(.towardZero)
        }
    }

    /// True when this reading cannot hold the number as a finite one (past a double's range).
    func unreadable(_ n: JSONNumber) -> Bool {
        if case .double(let d) = read(n) { return !d.isFinite }
        return false
    }

    /// -1, 0 or 1 as `a` is below, equal to or above `b` in this reading.
    func compare(_ a: JSONNumber, _ b: JSONNumber) -> Int {
        switch (read(a), read(b)) {
        case (.integer(let x), .integer(let y)): return x < y ? -1 : (y < x ? 1 : 0)
        case (.double(let x), .double(let y)): return x < y ? -1 : (y < x ? 1 : 0)
        case (.integer(let x), .double(let y)): return Self.compare(integer: x, y)
        case (.double(let x), .integer(let y)): return -Self.compare(integer: y, x)
        }
    }

    /// Equal in this reading, as JSON Schema's `const` and `enum` compare: arrays item by item,
    /// objects member by member in order (as `JSONValue ==`), numbers by `compare`.
    func same(_ a: JSONValue, _ b: JSONValue) -> Bool {
        switch (a, b) {
        case (.number(let x), .number(let y)): return compare(x, y) == 0
        case (.array(let x), .array(let y)):
            return x.count == y.count && zip(x, y).allSatisfy { same($0, $1) }
        case (.object(let x), .object(let y)):
            return x.count == y.count
                && zip(x, y).allSatisfy { sameText($0.key, $1.key) && same($0.value, $1.value) }
        default: return a == b
        }
    }

    /// An exact integer against a double, as Python compares an `int` with a `float`.
    static func compare(integer i: JSONNumber, _ d: Double) -> Int {
        guard !d.isNaN else { return 0 }
        if d.isInfinite { return d > 0 ? -1 : 1 }
        // Rounding is monotone: when i rounds to another double, the order is theirs.
        let rounded = Double(i.text) ?? .nan
        if rounded.isNaN { return 0 }
        if rounded != d { return rounded < d ? -1 : 1 }
        // Below 2^53 every integer is a double: i is d. Above it d is a whole number; compare exactly.
        if d.magnitude < 9_007_199_254_740_992 { return 0 }
        let exact = JSONNumber(unchecked: integerText(d))
        return i < exact ? -1 : (exact < i ? 1 : 0)
    }

    /// A whole double's digits, exactly (its significand times a power of two, in decimal).
    static func integerText(_ d: Double) -> String {
        var digits: [UInt8] = [0]  // little-endian decimal digits
        var significand = (d.significandBitPattern | (1 << 52))
        var bits: [UInt8] = []
        while significand > 0 { bits.append(UInt8(significand & 1)); significand >>= 1 }
        func double(adding bit: UInt8) {
            var carry = bit
            for k in digits.indices {
                let v = digits[k] * 2 + carry
                digits[k] = v % 10
                carry = v / 10
            }
            if carry > 0 { digits.append(carry) }
        }
        for bit in bits.reversed() { double(adding: bit) }
        // The significand holds 53 bits for 2^52; d is that times 2^(exponent - 52).
        for _ in 0..<max(0, Int(d.exponent) - 52) { double(adding: 0) }
        while digits.count > 1, digits.last == 0 { digits.removeLast() }
        return (d < 0 ? "-" : "") + String(decoding: digits.reversed().map { $0 + 0x30 }, as: UTF8.self)
    }

    /// True when `text` has a run of 16 digits or more: only there can an integer be past 2^53,
    /// where Python's exact integers and JavaScript's doubles part.
    static func mayHoldLargeIntegers(_ text: String) -> Bool {
        var run = 0
        for c in text.utf8 {
            run = (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) ? run + 1 : 0
            if run >= 16 { return true }
        }
        return false
    }

    /// The first number in `value` this reading cannot hold as a finite number (walked without
    /// recursion: a reply may nest as deep as the reader lets it).
    func firstUnreadable(in value: JSONValue) -> JSONNumber? {
        var stack = [value]
        while let v = stack.popLast() {
            switch v {
            case .number(let n) where unreadable(n): return n
            case .array(let items): stack.append(contentsOf: items)
            case .object(let members): stack.append(contentsOf: members.map(\.value))
            default: break
            }
        }
        return nil
    }
}
