/// Classes of Unicode scalars the regex reads: `\w`-style word and digit tests, ECMA-262's
/// ranges, case folding, and the set a bracket class or a `\d`-style escape compiles to.
func isWord(_ s: Unicode.Scalar?) -> Bool {
    guard let s else { return false }
    if s.isASCII { return s == "_" || ("a"..."z").contains(s) || ("A"..."Z").contains(s) || ("0"..."9").contains(s) }
    let p = s.properties
    return p.isAlphabetic || p.generalCategory == .decimalNumber || p.generalCategory == .connectorPunctuation
        || p.generalCategory == .nonspacingMark || p.generalCategory == .spacingMark
}

func isASCIIWord(_ s: Unicode.Scalar?) -> Bool {
    guard let s, s.isASCII else { return false }
    return s == "_" || ("a"..."z").contains(s) || ("A"..."Z").contains(s) || ("0"..."9").contains(s)
}

/// ECMA-262's classes (`\d \w \s` and what `.` excludes), as code point ranges.
enum ECMAClass {
    static let digit: [ClosedRange<UInt32>] = [0x30...0x39]
    static let word: [ClosedRange<UInt32>] = [0x30...0x39, 0x41...0x5A, 0x5F...0x5F, 0x61...0x7A]
    static let space: [ClosedRange<UInt32>] = [0x09...0x0D, 0x20...0x20, 0xA0...0xA0, 0x1680...0x1680, 0x2000...0x200A,
                                               0x2028...0x2029, 0x202F...0x202F, 0x205F...0x205F, 0x3000...0x3000,
                                               0xFEFF...0xFEFF]
    static let lineTerminator: [ClosedRange<UInt32>] = [0x0A...0x0A, 0x0D...0x0D, 0x2028...0x2029]
}

func isDigit(_ s: Unicode.Scalar) -> Bool {
    s.isASCII ? ("0"..."9").contains(s) : s.properties.generalCategory == .decimalNumber
}

func fold(_ s: Unicode.Scalar) -> Unicode.Scalar {
    if s.isASCII { return ("A"..."Z").contains(s) ? Unicode.Scalar(s.value + 32)! : s }
    let lower = s.properties.lowercaseMapping.unicodeScalars
    return lower.count == 1 ? lower.first! : s
}

/// A bracket class or a `\d`-style escape.
struct ScalarSet: Sendable {
    enum Item: Sendable {
        case range(ClosedRange<UInt32>)
        case digit(Bool), word(Bool), space(Bool)
        /// Any scalar in none of the ranges.
        case outside([ClosedRange<UInt32>])
    }

    var items: [Item] = []
    var negated = false

    func contains(_ s: Unicode.Scalar, caseInsensitive: Bool) -> Bool {
        var hit = has(s)
        if !hit && caseInsensitive {
            let lower = fold(s)
            let upper = s.properties.uppercaseMapping.unicodeScalars
            hit = has(lower) || (upper.count == 1 && has(upper.first!))
        }
        return hit != negated
    }

    private func has(_ s: Unicode.Scalar) -> Bool {
        items.contains { item in
            switch item {
            case .range(let r): r.contains(s.value)
            case .digit(let yes): isDigit(s) == yes
            case .word(let yes): isWord(s) == yes
            case .space(let yes): s.properties.isWhitespace == yes
            case .outside(let ranges): !ranges.contains { $0.contains(s.value) }
            }
        }
    }
}
