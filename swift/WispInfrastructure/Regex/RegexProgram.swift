/// The compiled form of a pattern: a program of instructions for the Pike VM (LinearRegex.swift),
/// emitted from the syntax tree (RegexParser.swift) by Thompson's construction, repeats expanded.
extension LinearRegex {
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

    /// What a match must start with (`starts`), read off the program: nil when any scalar may.
    static func startInstructions(_ program: [Instruction]) -> [Instruction]? {
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
}

/// Emits a tree's program: repeats expanded (so bounded by `maxProgram`), alternations as splits.
struct RegexCompiler {
    let caseInsensitive: Bool
    var program: [LinearRegex.Instruction] = []
    var sets: [ScalarSet] = []

    mutating func emit(_ node: RegexNode) throws(RegexError) {
        guard program.count <= LinearRegex.maxProgram else {
            throw .refusing("pattern is too large once its repeats are expanded (over \(LinearRegex.maxProgram) steps)")
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
