/// A number that came from outside the process (a model server's answer, an HTTP header, the
/// pipe, a flag or the environment), taken only when it lies in the range the code that uses
/// it can work with: every such number enters through here, so none can trap the core later.
/// A number out of range is nil, for the caller to refuse or to treat as not said.
///
/// One range-check bounds one number, not a sum of many, so arithmetic on what it lets through
/// saturates (`Int.addingClamped` and the rest below) wherever the count of terms is not bounded.
public enum OutsideNumber {
    /// A JSON number as `JSONSerialization` hands it over (an `Int`, or a `Double` for a number
    /// with a fraction or exponent, or too large for an `Int`): a whole number in `range`.
    /// Anything else (a string, a fraction, 1e300, NaN) is nil.
    public static func int(_ value: Any?, in range: ClosedRange<Int>) -> Int? {
        switch value {
        case let n as Int: range.contains(n) ? n : nil
        case let d as Double: int(d, in: range)
        default: nil
        }
    }

    /// A whole, finite `Double` in `range`.
    public static func int(_ value: Double, in range: ClosedRange<Int>) -> Int? {
        guard let n = Int(exactly: value), range.contains(n) else { return nil }
        return n
    }

    /// Decimal (or `radix`) digits, nothing around them but what `trimming` allows: a header's
    /// value, a flag, a chunk size. A sign is taken only where `range` admits negative numbers.
    public static func int(_ text: some StringProtocol, radix: Int = 10, in range: ClosedRange<Int>) -> Int? {
        guard range.lowerBound < 0 || !text.hasPrefix("-"), let n = Int(text, radix: radix), range.contains(n) else {
            return nil
        }
        return n
    }
}

/// Counts of tokens, as anything outside the core reports them (a context window, a prompt's
/// or a reply's tokens, a stored turn's). 2^31-1 is orders of magnitude above any model's
/// window, and low enough that a handful of them added or tripled cannot overflow an `Int`.
public enum TokenCount {
    public static let range = 0...Int(Int32.max)
}

extension Int {
    /// `self + other`, held at `Int.max` or `Int.min` rather than trapping.
    public func addingClamped(_ other: Int) -> Int {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? (other > 0 ? .max : .min) : sum
    }

    /// `self - other`, held at `Int.max` or `Int.min` rather than trapping.
    public func subtractingClamped(_ other: Int) -> Int {
        let (difference, overflow) = subtractingReportingOverflow(other)
        return overflow ? (other < 0 ? .max : .min) : difference
    }

    /// `self * other`, held at `Int.max` or `Int.min` rather than trapping.
    public func multipliedClamped(by other: Int) -> Int {
        let (product, overflow) = multipliedReportingOverflow(by: other)
        return overflow ? ((self < 0) == (other < 0) ? .max : .min) : product
    }
}

extension Sequence where Element == Int {
    /// The sum, held at `Int.max` or `Int.min` rather than trapping.
    public func clampedSum() -> Int { reduce(0) { $0.addingClamped($1) } }
}
