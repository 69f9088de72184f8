#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// wisp's model tools: read-only, confined to `Roots`, with capped outputs. Every tool's
/// schema and output take room in a small (4096-token) context, so descriptions are one
/// phrase and outputs say what was cut.
public enum ToolCatalogue {
    public struct Limits: Sendable {
        public var maxOutputBytes = 6_000
        public var maxLines = 200
        public var maxEntries = 200
        public var maxMatches = 50
        /// What search_text reads in all, and for how long, before it stops and says so.
        public var maxScanBytes = 16 * 1024 * 1024
        public var maxScanSeconds = 2.0
        public init() {}
    }

    public static func tools(roots: Roots, limits: Limits = Limits()) -> [ModelTool] {
        tools(resolving: { roots }, limits: limits)
    }

    /// The catalogue confined to `roots` plus a client's roots `extra`, which are resolved
    /// (realpath and stat: a hung mount blocks both) at the first tool call, off the pipe loop
    /// where tools run, not here: a thread's tools are built inside the registry's accept.
    public static func tools(roots: Roots, adding extra: [String], limits: Limits = Limits()) -> [ModelTool] {
        let resolved = Locked<Roots?>(nil)
        return tools(resolving: {
            if let known = resolved.withLock({ $0 }) { return known }
            let all = roots.adding(extra)
            resolved.withLock { $0 = all }
            return all
        }, limits: limits)
    }

    private static func tools(resolving: @escaping @Sendable () -> Roots, limits: Limits) -> [ModelTool] {
        [
            ModelTool(name: "read_file", description: "Read a text file (optionally lines start_line..end_line).",
                      parametersSchema: ToolSchema(properties: [
                          .string("path", "file path, relative to the workspace root"),
                          .integer("start_line", minimum: 1), .integer("end_line", minimum: 1),
                      ], required: ["path"]).json) { json in
                let a = try arguments(ReadFileArguments.self, json)
                return try readFile(roots: resolving(), path: a.path, start: a.start_line, end: a.end_line,
                                    limits: limits)
            },
            ModelTool(name: "list_directory", description: "List a directory's entries (directories end with /).",
                      parametersSchema: ToolSchema(properties: [
                          .string("path", "directory path, relative to the workspace root; '.' for the root"),
                      ], required: ["path"]).json) { json in
                let a = try arguments(ListDirectoryArguments.self, json)
                return try listDirectory(roots: resolving(), path: a.path, limits: limits)
            },
            ModelTool(name: "search_text",
                    description: "Find lines matching a literal or regex pattern under a path; prints file:line: text.",
                      parametersSchema: ToolSchema(properties: [
                          .string("pattern"),
                          .string("path", "file or directory to search; '.' for the root"),
                          .boolean("regex", "treat pattern as a regular expression (default false: literal)"),
                      ], required: ["pattern"]).json) { json in
                let a = try arguments(SearchTextArguments.self, json)
                return try searchText(roots: resolving(), pattern: a.pattern, path: a.path ?? ".",
                                      regex: a.regex ?? false, limits: limits)
            },
        ]
    }

    // MARK: read_file

    static func readFile(roots: Roots, path: String, start: Int?, end: Int?,
                         limits: Limits) throws(WispError) -> String {
        if let n = start ?? end, n < 1 { throw WispError(.invalidArgument, "line numbers start at 1") }
        let file = try roots.open(path)
        guard !file.isDirectory else {
            throw WispError(.invalidArgument, "\(Roots.shown(path)) is a directory; use list_directory")
        }
        // Read what a capped answer can use, and one byte more to know whether there was more.
        let wantsRange = start != nil || end != nil
        let budget = wantsRange ? limits.maxScanBytes : limits.maxOutputBytes * 4
        let (data, complete) = file.read(upTo: budget)
        guard let text = String(validating: data, as: UTF8.self), !data.contains(0) else {
            throw WispError(.invalidArgument, "\(Roots.shown(path)) is a binary file; read_file shows text only")
        }
        let lines = TextLines.split(text)
        let first = max(1, start ?? 1)
        guard first <= max(lines.count, 1) else {
            throw WispError(.invalidArgument,
                            "\(Roots.shown(path)) has \(lines.count) lines; start_line \(first) is past the end")
        }
        let last = min(lines.count, end ?? Int.max)
        guard last >= first || lines.isEmpty else {
            throw WispError(.invalidArgument, "end_line \(last) is before start_line \(first)")
        }
        var out = ""
        var shown = 0
        var cut: String?
        for i in (first - 1)..<max(first - 1, last) {
            let line = lines[i]
            if shown >= limits.maxLines || out.utf8.count + line.utf8.count + 1 > limits.maxOutputBytes {
                cut = "[cut at line \(i) of \(lines.count)\(complete ? "" : "+"): output limit \(limits.maxLines) " +
                      "lines / \(limits.maxOutputBytes) bytes; ask for start_line \(i + 1)]"
                break
            }
            out += line
            out += "\n"
            shown += 1
        }
        if cut == nil && !complete && end == nil {
            cut = "[file continues past \(data.count) bytes; ask for a line range]"
        }
        if let cut { out += cut }
        return out
    }

    // MARK: list_directory

    static func listDirectory(roots: Roots, path: String, limits: Limits) throws(WispError) -> String {
        let dir = try roots.open(path)
        guard dir.isDirectory else { throw WispError(.invalidArgument, "\(Roots.shown(path)) is not a directory") }
        // Sorted by bytes: the names are the file system's, not text to collate.
        let names = dir.entries().sorted { $0.lexicographicallyPrecedes($1) }
        var lines: [String] = []
        for name in names.prefix(limits.maxEntries) {
            let kind = dir.kind(of: name)
            lines.append(String(decoding: name, as: UTF8.self) + (kind == S_IFDIR ? "/" : kind == S_IFLNK ? "@" : ""))
        }
        if names.count > limits.maxEntries {
            lines.append("[\(names.count - limits.maxEntries) more entries not shown]")
        }
        if names.isEmpty { return "(empty directory)" }
        return lines.joined(separator: "\n")
    }

    // MARK: search_text

    /// Directories search_text descends below its start (each level holds one descriptor).
    static let maxSearchDepth = 64
    /// Bytes of a matching line search_text shows (200 of ASCII, then the cut mark), however its clusters are built.
    static let matchLineBytes = 200 + String.cutMark.utf8.count

    static func searchText(roots: Roots, pattern: String, path: String, regex: Bool,
                           limits: Limits) throws(WispError) -> String {
        guard !pattern.isEmpty else { throw WispError(.invalidArgument, "pattern is empty") }
        let deadline = ContinuousClock.now + .milliseconds(Int(limits.maxScanSeconds * 1000))
        let matcher: (Substring) -> Bool?
        if regex {
            let re: LinearRegex
            do { re = try LinearRegex(pattern) } catch { throw WispError(.invalidArgument, error.message) }
            matcher = { re.matches($0, deadline: deadline) }
        } else {
            matcher = { $0.contains(pattern) }
        }
        let start = try roots.open(path)
        var scanned = 0
        var results: [String] = []
        var stoppedBy: String?
        var hardLinked = 0
        let timeLimit = "time limit \(limits.maxScanSeconds) s"

        func scan(_ file: Roots.Opened) {
            let (data, _) = file.read(upTo: min(limits.maxScanBytes - scanned, 4 * 1024 * 1024))
            scanned += data.count
            guard !data.prefix(8192).contains(0), let text = String(validating: data, as: UTF8.self) else { return }
            for (n, line) in TextLines.split(text).enumerated() {
                // The clock is read per line (and inside the regex matcher per 1,024 scalars), so
                // one huge file cannot hold the call past its time limit.
                if n & 63 == 63, ContinuousClock.now > deadline || Task.isCancelled { stoppedBy = timeLimit; return }
                guard let hit = matcher(line) else { stoppedBy = timeLimit; return }
                guard hit else { continue }
                if results.count >= limits.maxMatches { stoppedBy = "match limit \(limits.maxMatches)"; return }
                let shown = String(line).bounded(toBytes: Self.matchLineBytes)
                results.append("\(roots.display(file.real)):\(n + 1): \(shown)")
            }
        }

        // Descends by descriptor, never by name: what is scanned is inside the directory that was
        // opened, however the names under it are swapped meanwhile. Symlinks are not followed.
        func walk(_ dir: Roots.Opened, depth: Int) {
            let names = dir.entries().sorted(by: { $0.lexicographicallyPrecedes($1) })
            for name in names where name.first != UInt8(ascii: ".") {
                if stoppedBy != nil { return }
                if ContinuousClock.now > deadline || Task.isCancelled { stoppedBy = timeLimit; return }
                if scanned >= limits.maxScanBytes { stoppedBy = "scan limit \(limits.maxScanBytes) bytes"; return }
                let child: Roots.Opened?
                do { child = try roots.openChild(dir, name) } catch { hardLinked += 1; continue }
                guard let child else { continue }
                if !child.isDirectory { scan(child) } else if depth < maxSearchDepth { walk(child, depth: depth + 1) }
            }
        }

        if start.isDirectory { walk(start, depth: 0) } else { scan(start) }
        var out = results.isEmpty ? "no matches" : results.joined(separator: "\n")
        if hardLinked > 0 {
            out += "\n[\(hardLinked) hard-linked or changing files skipped; " +
                   "wisp reads hard-linked files only with --allow-hardlinks]"
        }
        if let stoppedBy { out += "\n[search stopped at the \(stoppedBy); narrow the path or pattern]" }
        return out
    }
}

/// Decodes a tool's JSON arguments strictly (no `true` for a number, no `1.5` for a line),
/// with messages the model can act on.
func arguments<T: Decodable>(_ type: T.Type, _ json: String) throws(WispError) -> T {
    do {
        return try JSONDecoder().decode(T.self, from: Data(json.utf8))
    } catch let DecodingError.keyNotFound(key, _) {
        throw WispError(.invalidArgument, "'\(key.stringValue)' is required")
    } catch let DecodingError.typeMismatch(expected, context) {
        guard let key = context.codingPath.last else {
            throw WispError(.invalidArgument, "arguments must be a JSON object")
        }
        let kind = expected == String.self ? "a string"
            : expected == Bool.self ? "true or false"
            : expected == Int.self ? "a whole number" : "\(expected)"
        throw WispError(.invalidArgument, "'\(key.stringValue)' must be \(kind)")
    } catch let DecodingError.valueNotFound(_, context) {
        throw WispError(.invalidArgument, "'\(context.codingPath.last?.stringValue ?? "?")' must not be null")
    } catch {
        throw WispError(.invalidArgument, "arguments must be a JSON object")
    }
}

struct ReadFileArguments: Decodable {
    var path: String
    var start_line: Int?
    var end_line: Int?
}

struct ListDirectoryArguments: Decodable {
    var path: String
}

struct SearchTextArguments: Decodable {
    var pattern: String
    var path: String?
    var regex: Bool?
}
