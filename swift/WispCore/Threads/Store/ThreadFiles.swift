#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// Thread files of earlier wisps (one file per thread in the state dir), read once to import them
/// into the store at start; the files are kept where they are until the user deletes them.
///
/// - Format 2, `thread-<id>.json`: an append-only log of JSON lines: a header line
///   `{"format":2,"id":…,"written":T,"instructions":…,"tools":[…],"roots":[…]}` (T: Unix seconds),
///   then one record per turn, oldest first, each two lines: the turn
///   `{"prompt":…,"toolExchanges":[…],"response":…,"tokens":N}` (`reasoning` optional) and its
///   commit `{"turns":K,"written":T}`. A torn last record (at most its own two lines, cut short
///   or unreadable: its writer was killed) is not part of the thread.
/// - Format 1, two lines: a header `{"format":1,"id":…,"turns":N,"written":T}` and the state
///   `{"instructions":…,"tools":[…],"roots":[…],"history":[turn…]}`.
/// - A file that does not read as either (or over `maxFileBytes`, or not a regular file) is moved
///   aside (`thread-<id>.json.corrupt-<time>-<random>`) with a warning; its thread is not imported.
enum ThreadFiles {
    static let maxFileBytes = 64 * 1024 * 1024
    static let format = 2

    typealias State = StoredThread

    /// Imports every thread file not imported before, each whole or set aside.
    static func importAll(from directory: StateDirectory, into store: SQLiteThreadStore, log: Log) {
        var imported = 0
        for name in directory.names() {
            guard let id = id(in: name), case let file = String(decoding: name, as: UTF8.self),
                  !store.wasImported(file) else { continue }
            let (data, unreadable) = directory.read(name, limit: maxFileBytes)
            do throws(Unreadable) {
                guard let data else { throw Unreadable(why: unreadable ?? "it cannot be read") }
                let (state, written, torn) = try decode(data, id: id)
                if torn {
                    log(.info,
                        "thread file \(file): its last record was cut short " +
                        "(a crash while it was written) and is left out")
                }
                try? store.importThread(id, state, written: written ?? Date().timeIntervalSince1970, file: file)
                imported += 1
            } catch {
                let fate = switch directory.moveAside(file, tag: "corrupt") {
                case .success(let aside): "it was moved aside to \(aside)"
                case .failure(let e): e.message
                }
                log(.warning, "thread file \(directory.path)/\(file) was not imported: \(error.why); \(fate)")
            }
        }
        if imported > 0 {
            log(.info,
                "imported \(imported) thread files of an earlier wisp into " +
                "\(directory.path)/\(SQLiteThreadStore.fileName); the " +
                "files are kept: delete them when you no longer want them")
        }
    }

    /// The id in a file name `thread-<id>.json`, matched by bytes, if it is a valid id.
    static func id(in name: [UInt8]) -> String? {
        let p = Array("thread-".utf8), q = Array(".json".utf8)
        guard name.count > p.count + q.count, name.starts(with: p), name.reversed().starts(with: q.reversed()) else {
            return nil
        }
        let id = String(decoding: name[p.count..<(name.count - q.count)], as: UTF8.self)
        return ThreadRegistry.isValidID(id) ? id : nil
    }

    /// A file's first line. Format 2 holds the binding here; format 1 the turns of its state line.
    struct Header {
        var format: Int
        var id: String
        var turns: Int?
        var written: Double?
        var instructions: String?
        var tools: [String]?
        var roots: [String]?
    }

    /// The line that makes a turn's record whole: the turns stored up to it, and when.
    struct Commit {
        var turns: Int
        var written: Double
    }

    /// Why a file's bytes are not a thread.
    struct Unreadable: Error { let why: String }

    /// A file's bytes (either format) as the thread `id`'s state, and when its last whole record
    /// (or its header) was written. A torn last record is left out (`torn`).
    static func decode(_ data: [UInt8], id: String) throws(Unreadable) -> (state: State, written: Double?, torn: Bool) {
        guard let newline = data.firstIndex(of: 0x0A) else { throw Unreadable(why: "it has no header line") }
        let header: Header
        do {
            header = try Header.read(data[..<newline])
        } catch {
            throw Unreadable(why: "its header is not valid JSON (\(error))")
        }
        guard header.format == 1 || header.format == format else {
            throw Unreadable(why: "it is in format \(header.format), this wisp reads formats 1 and \(format)")
        }
        guard header.id == id else { throw Unreadable(why: "its header names thread '\(header.id)'") }
        if header.format == 1 {
            guard let turns = header.turns else {
                throw Unreadable(why: "its header is not valid JSON (field 'turns' is missing)")
            }
            let state: State
            do {
                state = try State.read(data[(newline + 1)...])
            } catch {
                throw Unreadable(why: "its state is not valid JSON (truncated?)")
            }
            guard state.history.count == turns else {
                throw Unreadable(why: "its header says \(turns) turns, its history holds \(state.history.count)")
            }
            return (state, header.written, false)
        }
        guard let tools = header.tools, let roots = header.roots else {
            throw Unreadable(why: "its header lacks the thread's tools or roots")
        }
        var history: [Turn] = []
        var written = header.written
        var at = newline + 1
        while at < data.count {
            if let (turn, commit, next) = Self.record(data, at: at) {
                guard commit.turns == history.count + 1 else {
                    throw Unreadable(why: "its record of turn \(history.count + 1) says \(commit.turns) turns")
                }
                history.append(turn)
                written = commit.written
                at = next
                continue
            }
            // Not whole: the torn last record when no more than its own two lines follow.
            var lines = 0
            for byte in data[at...] where byte == 0x0A { lines += 1; if lines > 2 { break } }
            guard lines <= 2 else {
                throw Unreadable(why: "its record of turn \(history.count + 1) is not valid JSON, and more follows it")
            }
            return (State(instructions: header.instructions, tools: tools, roots: roots,
                          history: history), written, true)
        }
        return (State(instructions: header.instructions, tools: tools, roots: roots, history: history), written, false)
    }

    /// The record (turn line, commit line) at `at`, and where the next one starts; nil when
    /// there is none whole there.
    private static func record(_ data: [UInt8], at: Int) -> (Turn, Commit, next: Int)? {
        guard let end = data[at...].firstIndex(of: 0x0A), let close = data[(end + 1)...].firstIndex(of: 0x0A),
              let turn = try? readWhole(data[at..<end], { r throws(JSONError) in try Turn.read(&r) }),
              let commit = try? Commit.read(data[(end + 1)..<close]) else { return nil }
        return (turn, commit, close + 1)
    }

}

extension Turn: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("prompt", prompt); $0.field("toolExchanges", toolExchanges); $0.field("response", response)
            $0.field("tokens", tokens); $0.field("reasoning", reasoning); $0.field("structured", structured)
        }
    }
}

extension ToolExchange: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("name", name); $0.field("arguments", arguments); $0.field("output", output)
            $0.field("failed", failed)
        }
    }
}

// MARK: reading (the core's one JSON reader, WispInfrastructure/JSON/JSON.swift)

/// A stored value's fields while they are read: each required one must turn up.
private func required<T>(_ value: T?, _ name: String) throws(JSONError) -> T {
    guard let value else { throw JSONError("field '\(name)' is missing", at: -1) }
    return value
}

private func readWhole<T>(_ bytes: ArraySlice<UInt8>,
                          _ read: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> T {
    let result: Result<T, JSONError> = bytes.withUnsafeBytes { b in
        var r = JSONReader(b)
        do throws(JSONError) {
            let value = try read(&r)
            try r.end()
            return .success(value)
        } catch {
            return .failure(error)
        }
    }
    return try result.get()
}

extension ThreadFiles.Header {
    private struct Fields {
        var format: Int?, id: String?, turns: Int?, written: Double?
        var instructions: String?, tools: [String]?, roots: [String]?
    }
    private static let table = JSONFields<Fields>([
        "format": { r, f throws(JSONError) in f.format = try r.int() },
        "id": { r, f throws(JSONError) in f.id = try r.string() },
        "turns": { r, f throws(JSONError) in f.turns = try r.int() },
        "written": { r, f throws(JSONError) in f.written = try r.nullable { r throws(JSONError) in try r.double() } },
        "instructions": { r, f throws(JSONError) in
            f.instructions = try r.nullable { r throws(JSONError) in try r.string() }
        },
        "tools": { r, f throws(JSONError) in f.tools = try r.strings() },
        "roots": { r, f throws(JSONError) in f.roots = try r.strings() },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(format: try required(f.format, "format"), id: try required(f.id, "id"), turns: f.turns,
                        written: f.written,
                        instructions: f.instructions, tools: f.tools, roots: f.roots)
        }
    }
}

extension ThreadFiles.Commit {
    private struct Fields { var turns: Int?, written: Double? }
    private static let table = JSONFields<Fields>([
        "turns": { r, f throws(JSONError) in f.turns = try r.int() },
        "written": { r, f throws(JSONError) in f.written = try r.double() },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(turns: try required(f.turns, "turns"), written: try required(f.written, "written"))
        }
    }
}

extension StoredThread {
    private struct Fields { var instructions: String?, tools: [String]?, roots: [String]?, history: [Turn]? }
    private static let table = JSONFields<Fields>([
        "instructions": { r, f throws(JSONError) in
            f.instructions = try r.nullable { r throws(JSONError) in try r.string() }
        },
        "tools": { r, f throws(JSONError) in f.tools = try r.strings() },
        "roots": { r, f throws(JSONError) in f.roots = try r.strings() },
        "history": { r, f throws(JSONError) in f.history = try r.array { r throws(JSONError) in try Turn.read(&r) } },
    ])

    static func read(_ bytes: ArraySlice<UInt8>) throws(JSONError) -> Self {
        try readWhole(bytes) { r throws(JSONError) in
            var f = Fields()
            try r.object(into: &f, table)
            return Self(instructions: f.instructions, tools: try required(f.tools, "tools"),
                        roots: try required(f.roots, "roots"),
                        history: try required(f.history, "history"))
        }
    }
}

extension Turn {
    private struct Fields {
        var prompt: String?, toolExchanges: [ToolExchange]?, response: String?, tokens: Int?, reasoning: String?
    }
    private static let table = JSONFields<Fields>([
        "prompt": { r, f throws(JSONError) in f.prompt = try r.string() },
        "toolExchanges": { r, f throws(JSONError) in
            f.toolExchanges = try r.array { r throws(JSONError) in try ToolExchange.read(&r) }
        },
        "response": { r, f throws(JSONError) in f.response = try r.string() },
        "tokens": { r, f throws(JSONError) in f.tokens = try r.int() },
        "reasoning": { r, f throws(JSONError) in
            f.reasoning = try r.nullable { r throws(JSONError) in try r.string() }
        },
    ])

    static func read(_ r: inout JSONReader) throws(JSONError) -> Turn {
        var f = Fields()
        try r.object(into: &f, table)
        return .stored(prompt: try required(f.prompt, "prompt"),
                       toolExchanges: try required(f.toolExchanges, "toolExchanges"),
                       response: try required(f.response,
                               "response"), reasoning: f.reasoning, tokens: Int64(try required(f.tokens, "tokens")))
    }
}

extension ToolExchange {
    private struct Fields { var name: String?, arguments: String?, output: String?, failed: Bool? }
    private static let table = JSONFields<Fields>([
        "name": { r, f throws(JSONError) in f.name = try r.string() },
        "arguments": { r, f throws(JSONError) in f.arguments = try r.string() },
        "output": { r, f throws(JSONError) in f.output = try r.string() },
        "failed": { r, f throws(JSONError) in f.failed = try r.bool() },
    ])

    static func read(_ r: inout JSONReader) throws(JSONError) -> ToolExchange {
        var f = Fields()
        try r.object(into: &f, table)
        return ToolExchange(name: try required(f.name, "name"), arguments: try required(f.arguments, "arguments"),
                            output: try required(f.output, "output"), failed: try required(f.failed, "failed"))
    }
}
