/// A pattern's syntax: the tree (`RegexNode`) and the parser that builds it from the pattern's
/// scalars, refusing what the engine does not support by name.
indirect enum RegexNode {
    case empty
    case scalar(Unicode.Scalar)
    case set(ScalarSet)
    case any
    case lineStart, lineEnd
    case wordBoundary(Bool)
    case concat([RegexNode])
    case alternation([RegexNode])
    case repetition(RegexNode, min: Int, max: Int?)
}

struct RegexParser {
    let s: [Unicode.Scalar]
    let dialect: LinearRegex.Dialect
    var i = 0
    var caseInsensitive = false
    var nesting = 0

    init(_ s: [Unicode.Scalar], dialect: LinearRegex.Dialect) { self.s = s; self.dialect = dialect }

    var ecma: Bool { dialect == .ecma }

    var atEnd: Bool { i >= s.count }
    func peek(_ k: Int = 0) -> Unicode.Scalar? { i + k < s.count ? s[i + k] : nil }

    mutating func parse() throws(RegexError) -> RegexNode {
        if !ecma, s.starts(with: Array("(?i)".unicodeScalars)) { caseInsensitive = true; i = 4 }
        let node = try alternation()
        if !atEnd { throw .refusing("unmatched ) at position \(i + 1)") }
        return node
    }

    mutating func alternation() throws(RegexError) -> RegexNode {
        var branches = [try concatenation()]
        while peek() == "|" {
            i += 1
            branches.append(try concatenation())
        }
        return branches.count == 1 ? branches[0] : .alternation(branches)
    }

    mutating func concatenation() throws(RegexError) -> RegexNode {
        var items: [RegexNode] = []
        while let c = peek(), c != "|", c != ")" {
            var atom = try self.atom()
            while let q = peek(), let (min, max) = try quantifier(q) {
                switch atom {
                case .empty, .lineStart, .lineEnd, .wordBoundary:
                    throw .refusing("nothing to repeat before \(q) at position \(i)")
                default: break
                }
                if peek() == "?" { i += 1 } // lazy: the same for a yes/no match
                else if peek() == "+" { throw .refusing("possessive quantifier \(q)+ is not supported") }
                atom = .repetition(atom, min: min, max: max)
            }
            items.append(atom)
        }
        return items.isEmpty ? .empty : items.count == 1 ? items[0] : .concat(items)
    }

    /// Consumes a quantifier at the current position, if there is one.
    mutating func quantifier(_ q: Unicode.Scalar) throws(RegexError) -> (Int, Int?)? {
        switch q {
        case "*": i += 1; return (0, nil)
        case "+": i += 1; return (1, nil)
        case "?": i += 1; return (0, 1)
        case "{":
            // {m}, {m,}, {m,n}; any other `{` is a literal, as in most engines.
            var j = i + 1
            func number() -> Int? {
                var n: Int?
                while j < s.count, let d = Int(String(s[j])), ("0"..."9").contains(s[j]) {
                    n = min((n ?? 0) * 10 + d, 1_000_000); j += 1
                }
                return n
            }
            guard let m = number() else { return nil }
            var n: Int? = m
            if j < s.count && s[j] == "," { j += 1; n = number() }
            guard j < s.count && s[j] == "}" else { return nil }
            guard m <= LinearRegex.maxRepeat, (n ?? 0) <= LinearRegex.maxRepeat else {
                throw .refusing("repeat count above \(LinearRegex.maxRepeat)")
            }
            if let n, n < m { throw .refusing("{\(m),\(n)}: the maximum is below the minimum") }
            i = j + 1
            return (m, n)
        default: return nil
        }
    }

    mutating func atom() throws(RegexError) -> RegexNode {
        let c = s[i]
        i += 1
        switch c {
        case "." where ecma: return .set(ScalarSet(items: [.outside(ECMAClass.lineTerminator)]))
        case ".": return .any
        case "^": return .lineStart
        case "$": return .lineEnd
        case "*", "+", "?": throw .refusing("nothing to repeat before \(c) at position \(i)")
        case "[": return .set(try bracket())
        case "(":
            if peek() == "?" {
                let rest = String(String.UnicodeScalarView(s[i..<min(s.count, i + 3)]))
                if rest.hasPrefix("?:") { i += 2 }
                else if rest.hasPrefix("?=") || rest.hasPrefix("?!") {
                    throw .refusing("lookahead (\(rest.prefix(2)) is not supported")
                }
                else if rest.hasPrefix("?<=") || rest.hasPrefix("?<!") {
                    throw .refusing("lookbehind (\(rest) is not supported")
                }
                else if rest.hasPrefix("?>") { throw .refusing("atomic group (?> is not supported") }
                else if rest.hasPrefix("?<") || (!ecma && rest.hasPrefix("?P<")) {
                    // A named group matches as a plain group (names only matter to captures).
                    guard let close = s[i...].firstIndex(of: ">") else { throw .refusing("unterminated group name") }
                    i = close + 1
                } else if rest.hasPrefix("?#") { throw .refusing("comment group (?# is not supported") }
                else { throw .refusing("inline flags (\(rest)… are not supported (only a leading (?i))") }
            }
            nesting += 1
            guard nesting <= LinearRegex.maxNesting else {
                throw .refusing("groups nested more than \(LinearRegex.maxNesting) deep")
            }
            let inner = try alternation()
            nesting -= 1
            guard peek() == ")" else { throw .refusing("missing ) for the group opened at position \(i)") }
            i += 1
            return inner
        case ")": throw .refusing("unmatched ) at position \(i)")
        case "\\": return try escape(inClass: false)
        default: return .scalar(c)
        }
    }

    /// After a backslash.
    mutating func escape(inClass: Bool) throws(RegexError) -> RegexNode {
        guard let c = peek() else { throw .refusing("pattern ends with a lone \\") }
        i += 1
        if ecma {
            switch c {
            case "d": return .set(ScalarSet(items: ECMAClass.digit.map { .range($0) }))
            case "D": return .set(ScalarSet(items: [.outside(ECMAClass.digit)]))
            case "w": return .set(ScalarSet(items: ECMAClass.word.map { .range($0) }))
            case "W": return .set(ScalarSet(items: [.outside(ECMAClass.word)]))
            case "s": return .set(ScalarSet(items: ECMAClass.space.map { .range($0) }))
            case "S": return .set(ScalarSet(items: [.outside(ECMAClass.space)]))
            case "A", "z", "Z", "e": throw .refusing("escape \\\(c) is not ECMA-262")
            case "x" where peek() == "{": throw .refusing("\\x{…} is not ECMA-262; use \\uHHHH")
            default: break
            }
        }
        switch c {
        case "d": return .set(ScalarSet(items: [.digit(true)]))
        case "D": return .set(ScalarSet(items: [.digit(false)]))
        case "w": return .set(ScalarSet(items: [.word(true)]))
        case "W": return .set(ScalarSet(items: [.word(false)]))
        case "s": return .set(ScalarSet(items: [.space(true)]))
        case "S": return .set(ScalarSet(items: [.space(false)]))
        case "b" where !inClass: return .wordBoundary(true)
        case "B" where !inClass: return .wordBoundary(false)
        case "A" where !inClass: return .lineStart
        case "z" where !inClass, "Z" where !inClass: return .lineEnd
        case "t": return .scalar("\t")
        case "n": return .scalar("\n")
        case "r": return .scalar("\r")
        case "f": return .scalar("\u{0C}")
        case "v": return .scalar("\u{0B}")
        case "e": return .scalar("\u{1B}")
        case "0": return .scalar("\u{0}")
        case "x", "u":
            var digits = ""
            if c == "x" && peek() == "{" {
                guard let close = s[i...].firstIndex(of: "}") else { throw .refusing("\\x{ without }") }
                digits = String(String.UnicodeScalarView(s[(i + 1)..<close]))
                i = close + 1
            } else {
                let width = c == "x" ? 2 : 4
                guard i + width <= s.count else { throw .refusing("\\\(c) needs \(width) hex digits") }
                digits = String(String.UnicodeScalarView(s[i..<(i + width)]))
                i += width
            }
            guard let v = UInt32(digits, radix: 16), let scalar = Unicode.Scalar(v) else {
                throw .refusing("\\\(c)\(digits) is not a valid code point")
            }
            return .scalar(scalar)
        case "1"..."9": throw .refusing("backreference \\\(c) is not supported")
        case "k": throw .refusing("named backreference \\k is not supported")
        case "p", "P": throw .refusing("Unicode property class \\\(c){…} is not supported")
        case "Q": throw .refusing("quoting \\Q…\\E is not supported; escape each character")
        default:
            if c.properties.isAlphabetic || ("0"..."9").contains(c) {
                throw .refusing("escape \\\(c) is not supported")
            }
            return .scalar(c)
        }
    }

    mutating func bracket() throws(RegexError) -> ScalarSet {
        var set = ScalarSet()
        if peek() == "^" { set.negated = true; i += 1 }
        var first = true
        while true {
            guard let c = peek() else { throw .refusing("missing ] for a [ class") }
            if c == "]" && !first { i += 1; break }
            first = false
            if c == "[" {
                throw .refusing(peek(1) == ":"
                                ? "POSIX class [: … :] is not supported; use a range such as [a-z]"
                                : "nested class [ inside [...] is not supported; escape it as \\[")
            }
            let low: Unicode.Scalar
            i += 1
            if c == "\\" {
                switch try escape(inClass: true) {
                case .scalar(let s): low = s
                case .set(let inner): set.items += inner.items; continue
                default: throw .refusing("escape inside [...]")
                }
            } else {
                low = c
            }
            if peek() == "-", let after = peek(1), after != "]" {
                i += 1
                var high = after
                i += 1
                if after == "\\" {
                    guard case .scalar(let s) = try escape(inClass: true) else {
                        throw .refusing("a class cannot end a range in [...]")
                    }
                    high = s
                }
                guard low.value <= high.value else { throw .refusing("range \(low)-\(high) is out of order") }
                set.items.append(.range(low.value...high.value))
            } else {
                set.items.append(.range(low.value...low.value))
            }
        }
        return set
    }
}
