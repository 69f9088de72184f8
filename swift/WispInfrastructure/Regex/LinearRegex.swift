/// search_text's regular expressions and schema `pattern`s: a Pike VM (Thompson's construction simulated over the
/// text's Unicode scalars), so a match costs at most text length × program size steps whatever
/// the pattern. A backtracking engine (NSRegularExpression) takes exponential time on patterns
/// like `(a+)+$` and cannot be interrupted; one such call would hold a CPU for ever.
///
/// Supported: literals; `.` (any scalar); classes `[abc]`, `[a-z]`, `[^…]` with the escapes
/// below inside; `\d \w \s \D \W \S`; `\b \B`; `\t \n \r \f \v \e \0 \xHH \x{H…} \uHHHH`;
/// any escaped punctuation (`\.`, `\(`, …); `* + ?`, `{m}`, `{m,}`, `{m,n}` (m, n ≤ 1000) and
/// their lazy forms (`*?` …, the same for a yes/no match); `|`; groups `(…)`, `(?:…)`,
/// `(?<name>…)`; anchors `^ $ \A \z` (the line's start and end); a leading `(?i)` for
/// case-insensitive matching. Anything else a backtracking engine has (backreferences,
/// lookaround, atomic groups, possessive quantifiers, `\p{…}`, inline flags other than a
/// leading `(?i)`) is refused with its name, never taken literally.
///
/// The `.ecma` dialect is JSON Schema's `pattern` (ECMA-262 without flags, over code points):
/// `.` matches any code point but a line terminator (\n \r U+2028 U+2029), `\d \w \b` are
/// ASCII, `\s` is ECMA's white space and line terminators, `^ $` only the text's start and end
/// (never before a final newline), and `(?i)`, `\A \z \Z \e \x{…}` are refused (not ECMA).
public struct LinearRegex: Sendable {
    public enum Dialect: Sendable { case search, ecma }
    /// Groups nested deeper are refused: the parser recurses once per level.
    public static let maxNesting = 200
    public static let maxRepeat = 1000
    public static let maxProgram = 20_000

    enum Instruction: Sendable {
        case scalar(Unicode.Scalar)
        case set(Int)
        case any
        case split(Int, Int)
        case jump(Int)
        case lineStart, lineEnd
        case wordBoundary(Bool)
        case match
    }

    let program: [Instruction]
    let sets: [ScalarSet]
    let caseInsensitive: Bool
    let dialect: Dialect
    /// What a match must start with, when the program says (no `.`, no empty match): while no
    /// match is under way the scan skips scalars that cannot start one.
    let starts: [Instruction]?

    public init(_ pattern: String, dialect: Dialect = .search) throws(RegexError) {
        var parser = Parser(Array(pattern.unicodeScalars), dialect: dialect)
        var compiler = Compiler(caseInsensitive: false)
        do {
            let tree = try parser.parse()
            compiler = Compiler(caseInsensitive: parser.caseInsensitive)
            try compiler.emit(tree)
        } catch {
            let supported = dialect == .search
                ? "search_text supports literals, ., [...] classes, \\d \\w \\s \\b, * + ? {m,n}, |, (...) groups, ^ $ and a leading (?i)"
                : "a schema pattern (ECMA-262) may use literals, ., [...] classes, \\d \\w \\s \\b, * + ? {m,n}, |, (...) groups, ^ and $"
            throw RegexError(message: "\(error.message); \(supported)")
        }
        self.dialect = dialect
        compiler.program.append(.match)
        program = compiler.program
        sets = compiler.sets
        caseInsensitive = parser.caseInsensitive
        starts = LinearRegex.startInstructions(program)
    }

    private static func startInstructions(_ program: [Instruction]) -> [Instruction]? {
        var seen = Set<Int>()
        var stack = [0]
        var found: [Instruction] = []
        while let pc = stack.popLast() {
            guard seen.insert(pc).inserted else { continue }
            switch program[pc] {
            case .scalar, .set: found.append(program[pc])
            case .any, .match: return nil
            case .jump(let to): stack.append(to)
            case .split(let a, let b): stack.append(a); stack.append(b)
            // Assertions are taken as passable: the skip may keep a scalar it need not, never drop one.
            case .lineStart, .lineEnd, .wordBoundary: stack.append(pc + 1)
            }
        }
        return found
    }

    private func reads(_ instruction: Instruction, _ scalar: Unicode.Scalar) -> Bool {
        switch instruction {
        case .scalar(let s): caseInsensitive ? fold(s) == fold(scalar) : s == scalar
        case .set(let k): sets[k].contains(scalar, caseInsensitive: caseInsensitive)
        case .any: true
        default: false
        }
    }

    /// Whether `text` contains a match; nil if `deadline` passed or `stop` said so first (both
    /// are looked at every 1024 scalars).
    public func matches(_ text: Substring, deadline: ContinuousClock.Instant? = nil, stop: (() -> Bool)? = nil) -> Bool? {
        var scalars = ContiguousArray<Unicode.Scalar>()
        scalars.reserveCapacity(text.utf8.count)
        for s in text.unicodeScalars { scalars.append(s) }
        // Two thread lists (sparse sets of program counters: O(1) insert, test and clear) and the
        // expansion stack, in one allocation: this loop is the whole cost of a search.
        let size = program.count
        let memory = UnsafeMutablePointer<Int>.allocate(capacity: size * 6 + 2)
        memory.initialize(repeating: 0, count: size * 6 + 2)
        defer { memory.deallocate() }
        var current = Threads(dense: memory, sparse: memory + size)
        var next = Threads(dense: memory + 2 * size, sparse: memory + 3 * size)
        let stack = memory + 4 * size
        return scalars.withUnsafeBufferPointer { text -> Bool? in
            var previous: Unicode.Scalar?
            var i = 0
            while true {
                if i & 1023 == 1023 {
                    if let deadline, ContinuousClock.now > deadline { return nil }
                    if let stop, stop() { return nil }
                }
                let scalar: Unicode.Scalar? = i < text.count ? text[i] : nil
                if current.count == 0, let starts, let scalar, !startsWith(starts, scalar) {
                    previous = scalar
                    i += 1
                    continue
                }
                // A new thread at every position: the match may start anywhere in the line.
                if add(0, &current, stack, previous: previous, scalar: scalar) { return true }
                guard let scalar else { return false }
                next.count = 0
                let following: Unicode.Scalar? = i + 1 < text.count ? text[i + 1] : nil
                var k = 0
                while k < current.count {
                    let pc = current.dense[k]
                    k += 1
                    if reads(program[pc], scalar), add(pc + 1, &next, stack, previous: scalar, scalar: following) { return true }
                }
                swap(&current, &next)
                previous = scalar
                i += 1
            }
        }
    }

    private func startsWith(_ starts: [Instruction], _ scalar: Unicode.Scalar) -> Bool {
        var k = 0
        while k < starts.count {
            if reads(starts[k], scalar) { return true }
            k += 1
        }
        return false
    }

    /// Adds `pc` and everything reachable from it without reading a scalar; true if that reaches `match`.
    private func add(_ pc: Int, _ list: inout Threads, _ stack: UnsafeMutablePointer<Int>,
                     previous: Unicode.Scalar?, scalar: Unicode.Scalar?) -> Bool {
        var top = 0
        stack[0] = pc
        top = 1
        while top > 0 {
            top -= 1
            let pc = stack[top]
            guard list.insert(pc) else { continue }
            switch program[pc] {
            case .match: return true
            case .jump(let to): stack[top] = to; top += 1
            case .split(let a, let b): stack[top] = b; stack[top + 1] = a; top += 2
            case .lineStart: if previous == nil { stack[top] = pc + 1; top += 1 }
            case .lineEnd: if scalar == nil { stack[top] = pc + 1; top += 1 }
            case .wordBoundary(let at):
                let boundary = dialect == .ecma ? isASCIIWord(previous) != isASCIIWord(scalar) : isWord(previous) != isWord(scalar)
                if boundary == at { stack[top] = pc + 1; top += 1 }
            case .scalar, .set, .any: break
            }
        }
        return false
    }

    /// The program counters alive at one position, each once.
    struct Threads {
        let dense: UnsafeMutablePointer<Int>
        let sparse: UnsafeMutablePointer<Int>
        var count = 0

        mutating func insert(_ pc: Int) -> Bool {
            let k = sparse[pc]
            if k < count && dense[k] == pc { return false }
            sparse[pc] = count
            dense[count] = pc
            count += 1
            return true
        }
    }
}

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
                                               0x2028...0x2029, 0x202F...0x202F, 0x205F...0x205F, 0x3000...0x3000, 0xFEFF...0xFEFF]
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

private indirect enum Node {
    case empty
    case scalar(Unicode.Scalar)
    case set(ScalarSet)
    case any
    case lineStart, lineEnd
    case wordBoundary(Bool)
    case concat([Node])
    case alternation([Node])
    case repetition(Node, min: Int, max: Int?)
}

/// A pattern the engine refuses: the construct it does not support, named, and what its dialect
/// does support.
public struct RegexError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String

    public var description: String { message }
}

/// LinearRegex.init adds what its dialect supports.
private func refuse(_ what: String) -> RegexError {
    RegexError(message: "regex: \(what)")
}

private struct Parser {
    let s: [Unicode.Scalar]
    let dialect: LinearRegex.Dialect
    var i = 0
    var caseInsensitive = false
    var nesting = 0

    init(_ s: [Unicode.Scalar], dialect: LinearRegex.Dialect) { self.s = s; self.dialect = dialect }

    var ecma: Bool { dialect == .ecma }

    var atEnd: Bool { i >= s.count }
    func peek(_ k: Int = 0) -> Unicode.Scalar? { i + k < s.count ? s[i + k] : nil }

    mutating func parse() throws(RegexError) -> Node {
        if !ecma, s.starts(with: Array("(?i)".unicodeScalars)) { caseInsensitive = true; i = 4 }
        let node = try alternation()
        if !atEnd { throw refuse("unmatched ) at position \(i + 1)") }
        return node
    }

    mutating func alternation() throws(RegexError) -> Node {
        var branches = [try concatenation()]
        while peek() == "|" {
            i += 1
            branches.append(try concatenation())
        }
        return branches.count == 1 ? branches[0] : .alternation(branches)
    }

    mutating func concatenation() throws(RegexError) -> Node {
        var items: [Node] = []
        while let c = peek(), c != "|", c != ")" {
            var atom = try self.atom()
            while let q = peek(), let (min, max) = try quantifier(q) {
                switch atom {
                case .empty, .lineStart, .lineEnd, .wordBoundary: throw refuse("nothing to repeat before \(q) at position \(i)")
                default: break
                }
                if peek() == "?" { i += 1 } // lazy: the same for a yes/no match
                else if peek() == "+" { throw refuse("possessive quantifier \(q)+ is not supported") }
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
                while j < s.count, let d = Int(String(s[j])), ("0"..."9").contains(s[j]) { n = min((n ?? 0) * 10 + d, 1_000_000); j += 1 }
                return n
            }
            guard let m = number() else { return nil }
            var n: Int? = m
            if j < s.count && s[j] == "," { j += 1; n = number() }
            guard j < s.count && s[j] == "}" else { return nil }
            guard m <= LinearRegex.maxRepeat, (n ?? 0) <= LinearRegex.maxRepeat else { throw refuse("repeat count above \(LinearRegex.maxRepeat)") }
            if let n, n < m { throw refuse("{\(m),\(n)}: the maximum is below the minimum") }
            i = j + 1
            return (m, n)
        default: return nil
        }
    }

    mutating func atom() throws(RegexError) -> Node {
        let c = s[i]
        i += 1
        switch c {
        case "." where ecma: return .set(ScalarSet(items: [.outside(ECMAClass.lineTerminator)]))
        case ".": return .any
        case "^": return .lineStart
        case "$": return .lineEnd
        case "*", "+", "?": throw refuse("nothing to repeat before \(c) at position \(i)")
        case "[": return .set(try bracket())
        case "(":
            if peek() == "?" {
                let rest = String(String.UnicodeScalarView(s[i..<min(s.count, i + 3)]))
                if rest.hasPrefix("?:") { i += 2 }
                else if rest.hasPrefix("?=") || rest.hasPrefix("?!") { throw refuse("lookahead (\(rest.prefix(2)) is not supported") }
                else if rest.hasPrefix("?<=") || rest.hasPrefix("?<!") { throw refuse("lookbehind (\(rest) is not supported") }
                else if rest.hasPrefix("?>") { throw refuse("atomic group (?> is not supported") }
                else if rest.hasPrefix("?<") || (!ecma && rest.hasPrefix("?P<")) {
                    // A named group matches as a plain group (names only matter to captures).
                    guard let close = s[i...].firstIndex(of: ">") else { throw refuse("unterminated group name") }
                    i = close + 1
                } else if rest.hasPrefix("?#") { throw refuse("comment group (?# is not supported") }
                else { throw refuse("inline flags (\(rest)… are not supported (only a leading (?i))") }
            }
            nesting += 1
            guard nesting <= LinearRegex.maxNesting else { throw refuse("groups nested more than \(LinearRegex.maxNesting) deep") }
            let inner = try alternation()
            nesting -= 1
            guard peek() == ")" else { throw refuse("missing ) for the group opened at position \(i)") }
            i += 1
            return inner
        case ")": throw refuse("unmatched ) at position \(i)")
        case "\\": return try escape(inClass: false)
        default: return .scalar(c)
        }
    }

    /// After a backslash.
    mutating func escape(inClass: Bool) throws(RegexError) -> Node {
        guard let c = peek() else { throw refuse("pattern ends with a lone \\") }
        i += 1
        if ecma {
            switch c {
            case "d": return .set(ScalarSet(items: ECMAClass.digit.map { .range($0) }))
            case "D": return .set(ScalarSet(items: [.outside(ECMAClass.digit)]))
            case "w": return .set(ScalarSet(items: ECMAClass.word.map { .range($0) }))
            case "W": return .set(ScalarSet(items: [.outside(ECMAClass.word)]))
            case "s": return .set(ScalarSet(items: ECMAClass.space.map { .range($0) }))
            case "S": return .set(ScalarSet(items: [.outside(ECMAClass.space)]))
            case "A", "z", "Z", "e": throw refuse("escape \\\(c) is not ECMA-262")
            case "x" where peek() == "{": throw refuse("\\x{…} is not ECMA-262; use \\uHHHH")
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
                guard let close = s[i...].firstIndex(of: "}") else { throw refuse("\\x{ without }") }
                digits = String(String.UnicodeScalarView(s[(i + 1)..<close]))
                i = close + 1
            } else {
                let width = c == "x" ? 2 : 4
                guard i + width <= s.count else { throw refuse("\\\(c) needs \(width) hex digits") }
                digits = String(String.UnicodeScalarView(s[i..<(i + width)]))
                i += width
            }
            guard let v = UInt32(digits, radix: 16), let scalar = Unicode.Scalar(v) else { throw refuse("\\\(c)\(digits) is not a valid code point") }
            return .scalar(scalar)
        case "1"..."9": throw refuse("backreference \\\(c) is not supported")
        case "k": throw refuse("named backreference \\k is not supported")
        case "p", "P": throw refuse("Unicode property class \\\(c){…} is not supported")
        case "Q": throw refuse("quoting \\Q…\\E is not supported; escape each character")
        default:
            if c.properties.isAlphabetic || ("0"..."9").contains(c) { throw refuse("escape \\\(c) is not supported") }
            return .scalar(c)
        }
    }

    mutating func bracket() throws(RegexError) -> ScalarSet {
        var set = ScalarSet()
        if peek() == "^" { set.negated = true; i += 1 }
        var first = true
        while true {
            guard let c = peek() else { throw refuse("missing ] for a [ class") }
            if c == "]" && !first { i += 1; break }
            first = false
            if c == "[" {
                throw refuse(peek(1) == ":" ? "POSIX class [: … :] is not supported; use a range such as [a-z]" : "nested class [ inside [...] is not supported; escape it as \\[")
            }
            let low: Unicode.Scalar
            i += 1
            if c == "\\" {
                switch try escape(inClass: true) {
                case .scalar(let s): low = s
                case .set(let inner): set.items += inner.items; continue
                default: throw refuse("escape inside [...]")
                }
            } else {
                low = c
            }
            if peek() == "-", let after = peek(1), after != "]" {
                i += 1
                var high = after
                i += 1
                if after == "\\" {
                    guard case .scalar(let s) = try escape(inClass: true) else { throw refuse("a class cannot end a range in [...]") }
                    high = s
                }
                guard low.value <= high.value else { throw refuse("range \(low)-\(high) is out of order") }
                set.items.append(.range(low.value...high.value))
            } else {
                set.items.append(.range(low.value...low.value))
            }
        }
        return set
    }
}

private struct Compiler {
    let caseInsensitive: Bool
    var program: [LinearRegex.Instruction] = []
    var sets: [ScalarSet] = []

    mutating func emit(_ node: Node) throws(RegexError) {
        guard program.count <= LinearRegex.maxProgram else {
            throw refuse("pattern is too large once its repeats are expanded (over \(LinearRegex.maxProgram) steps)")
        }
        switch node {
        case .empty: break
        case .scalar(let s): program.append(.scalar(s))
        case .set(let set): sets.append(set); program.append(.set(sets.count - 1))
        case .any: program.append(.any)
        case .lineStart: program.append(.lineStart)
        case .lineEnd: program.append(.lineEnd)
        case .wordBoundary(let at): program.append(.wordBoundary(at))
        case .concat(let items): for item in items { try emit(item) }
        case .alternation(let branches):
            var jumps: [Int] = []
            for (k, branch) in branches.enumerated() {
                if k < branches.count - 1 {
                    let split = program.count
                    program.append(.split(split + 1, 0))
                    try emit(branch)
                    jumps.append(program.count)
                    program.append(.jump(0))
                    program[split] = .split(split + 1, program.count)
                } else {
                    try emit(branch)
                }
            }
            for j in jumps { program[j] = .jump(program.count) }
        case .repetition(let body, let min, let max):
            for _ in 0..<min { try emit(body) }
            if let max {
                var splits: [Int] = []
                for _ in min..<max {
                    splits.append(program.count)
                    program.append(.split(program.count + 1, 0))
                    try emit(body)
                }
                for k in splits { program[k] = .split(k + 1, program.count) }
            } else {
                let loop = program.count
                program.append(.split(loop + 1, 0))
                try emit(body)
                program.append(.jump(loop))
                program[loop] = .split(loop + 1, program.count)
            }
        }
    }
}
