/// JSON numbers kept exact, for wisp's one codec (JSON/JSON.swift): the text as written, and
/// the decimal it is compared by.

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
