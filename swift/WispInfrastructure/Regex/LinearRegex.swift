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
    static let maxNesting = 200
    static let maxRepeat = 1000
    static let maxProgram = 20_000

    let program: [Instruction]
    let sets: [ScalarSet]
    let caseInsensitive: Bool
    let dialect: Dialect
    /// What a match must start with, when the program says (no `.`, no empty match): while no
    /// match is under way the scan skips scalars that cannot start one.
    let starts: [Instruction]?

    public init(_ pattern: String, dialect: Dialect = .search) throws(RegexError) {
        var parser = RegexParser(Array(pattern.unicodeScalars), dialect: dialect)
        var compiler = RegexCompiler(caseInsensitive: false)
        do {
            let tree = try parser.parse()
            compiler = RegexCompiler(caseInsensitive: parser.caseInsensitive)
            try compiler.emit(tree)
        } catch {
            let supported = dialect == .search
                ? "search_text supports literals, ., [...] classes, \\d \\w \\s " +
                  "\\b, * + ? {m,n}, |, (...) groups, ^ $ and a leading (?i)"
                : "a schema pattern (ECMA-262) may use literals, ., [...] classes, " +
                  "\\d \\w \\s \\b, * + ? {m,n}, |, (...) groups, ^ and $"
            throw RegexError(message: "\(error.message); \(supported)")
        }
        self.dialect = dialect
        compiler.program.append(.match)
        program = compiler.program
        sets = compiler.sets
        caseInsensitive = parser.caseInsensitive
        starts = LinearRegex.startInstructions(program)
    }

    // MARK: matching: a Pike VM over the program (RegexProgram.swift)

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
    public func matches(_ text: Substring, deadline: ContinuousClock.Instant? = nil,
                        stop: (() -> Bool)? = nil) -> Bool? {
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
                    if reads(program[pc], scalar), add(pc + 1, &next, stack, previous: scalar, scalar: following) {
                        return true
                    }
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
                let boundary = dialect == .ecma
                    ? isASCIIWord(previous) != isASCIIWord(scalar) : isWord(previous) != isWord(scalar)
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

/// A pattern the engine refuses: the construct it does not support, named, and what its dialect
/// does support.
public struct RegexError: Error, Sendable, Equatable, CustomStringConvertible {
    public let message: String

    public var description: String { message }

    /// The construct `what` refused (LinearRegex.init adds what its dialect supports).
    static func refusing(_ what: String) -> RegexError { RegexError(message: "regex: \(what)") }
}
