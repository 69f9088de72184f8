#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import WispInfrastructure

/// The model backends `--backend` chooses from; the raw values are the words of the flag and
/// of `WISP_BACKEND`.
public enum BackendKind: String, CaseIterable, Sendable {
    /// The Apple model where it is available, else an OpenAI-compatible endpoint when one is set.
    case auto
    case echo
    case openai
    case apple

    /// The words, as a sentence lists them: "auto, echo, openai or apple".
    static var listed: String {
        let words = allCases.map(\.rawValue)
        return words.dropLast().joined(separator: ", ") + " or " + words.last!
    }
}

/// Everything the core can be told, from flags (`--max-threads 8`) or `WISP_*` env; a flag wins.
public struct CoreConfig: Sendable, Equatable {
    public var backend = BackendKind.auto
    public static let defaultMaxThreads = 32
    public static let defaultMaxQueue = 16
    public static let defaultMaxStoredThreads = 1000
    public var maxThreads = defaultMaxThreads
    public var maxQueue = defaultMaxQueue
    /// Overrides the context size the backend reports (echo: its window; openai: used when the server does not say).
    public var contextSize: Int?
    public var echoDelayMs = 0
    public var logLevel = LogLevel.info
    /// OpenAI-compatible base URLs, e.g. http://127.0.0.1:8080/v1; several make a fleet
    /// (`Backends/OpenAI/Fleet.swift`). `--endpoint` flags replace `WISP_ENDPOINT`'s list.
    public var endpoints: [String] = []
    /// The header a chat request names its thread in, for a router in front; nil: none.
    public static let defaultSessionHeader = "X-Session-ID"
    public var sessionHeader: String? = defaultSessionHeader
    public var model: String?
    /// llama-server's parallel slots, which the openai backend pins threads to; nil: ask the
    /// server (`/props`), 0: never pin.
    public var slots: Int?
    /// From WISP_API_KEY only, so it never shows in a process list; never logged.
    public var apiKey: String?
    /// Directories the model tools may read; default the working directory.
    public var roots: [String] = []
    /// Whether model tools and `files` read regular files that have more than one hard link.
    public var allowHardLinks = false
    /// Durable threads: the directory they are stored in; nil keeps them in memory only.
    public var stateDir: String?
    /// Durable threads in PostgreSQL, shared by every wisp on the database; never with `stateDir`.
    public var store: StoreURL?
    public var maxStoredThreads = defaultMaxStoredThreads
    /// What the counting flags take. Each thread and each queued call holds memory, so their
    /// bounds are far above any use and far below what could be allocated or added without overflow.
    public static let maxThreadsRange = 1...1_000_000
    public static let maxQueueRange = 0...1_000_000
    public static let maxStoredThreadsRange = 1...100_000_000
    /// Ollama's `keep_alive` for the model between turns (OpenAIDialects.swift), in its own words.
    public static let defaultKeepAlive = "30m"
    public var keepAlive = defaultKeepAlive
    /// Condensing on a server that caches only an unchanged prefix drops a thread down to this
    /// share of the context (bench/README.md, `long_no_reuse`, has the measurement behind it).
    public static let defaultCondenseTo = 0.5
    public var condenseTo = defaultCondenseTo

    public init() {}

    /// What each integer flag takes, read by parsing and stated by `--facts`.
    public static let ranges: KeyValuePairs<String, ClosedRange<Int>> = [
        "max-threads": maxThreadsRange, "max-queue": maxQueueRange, "context-size": 1...TokenCount.range.upperBound,
        "echo-delay-ms": EchoDirective.sleepRange, "slots": OpenAIReplies.slotCounts,
        "max-stored-threads": maxStoredThreadsRange,
    ]

    public static let usage = """
    usage: wisp-core [options]   (speaks wisp's pipe protocol on stdin/stdout; started by `python -m wisp_shim`)
      --backend NAME       \(BackendKind.allCases.map(\.rawValue).joined(separator: " | "))
                                                                    (WISP_BACKEND, default \(BackendKind.auto.rawValue))
      --max-threads N      live threads before LRU eviction         (WISP_MAX_THREADS, default \(defaultMaxThreads))
      --max-queue N        calls waiting per thread before `busy`   (WISP_MAX_QUEUE, default \(defaultMaxQueue))
      --context-size N     context window in tokens                 (WISP_CONTEXT_SIZE)
      --echo-delay-ms N    extra latency per echo reply             (WISP_ECHO_DELAY_MS, default 0)
      --endpoint URL       OpenAI-compatible base URL; repeat for several (WISP_ENDPOINT, ','-separated)
      --session-header NAME  header naming the thread on each chat request, for a router
                           (WISP_SESSION_HEADER, default \(defaultSessionHeader); '' for none)
      --model NAME         model name for the openai backend        (WISP_MODEL)
      --slots N            llama-server's parallel slots; each live thread keeps one (WISP_SLOTS;
                           default: what its /props says; 0: never name a slot)
      --root DIR           directory model tools may read; repeat   (WISP_ROOTS, ':'-separated)
      --allow-hardlinks    read files with several hard links       (WISP_ALLOW_HARDLINKS=1; default: refused)
      --state-dir DIR      store threads there (durable threads)    (WISP_STATE_DIR; default: memory only)
      --store URL          store threads in PostgreSQL, shared by every wisp on it (WISP_STORE;
                           postgresql://…, libpq's URI; PGPASSWORD or ~/.pgpass for the password)
      --max-stored-threads N  stored threads before LRU deletion    (WISP_MAX_STORED_THREADS,
                                                                     default \(defaultMaxStoredThreads))
      --keep-alive D       Ollama: keep the model loaded this long   (WISP_KEEP_ALIVE, default \(defaultKeepAlive);
                           an Ollama duration: 90s, 30m, 2h, -1 for ever)
      --condense-to F      condense down to this share of the context on servers without KV shifting
                                                                    (WISP_CONDENSE_TO, default \(defaultCondenseTo))
      --log-level LEVEL    debug | info | warning | error           (WISP_LOG_LEVEL, default info)
      --facts              print the facts the shim takes from this core, as JSON, and exit
      --version            print wisp's version (pyproject.toml's, at build time) and exit
      API key: WISP_API_KEY (env only).
    """

    /// Parses env then flags. Throws a message fit to print beside `usage`.
    public static func parse(arguments: [String], environment: [String: String]) throws(WispError) -> CoreConfig {
        var c = CoreConfig()
        try c.read(environment: environment)
        try c.read(arguments: arguments)
        if let dir = c.stateDir, let store = c.store {
            throw WispError(.invalidArgument, "--state-dir (\(dir)) and --store (\(store)) are both given: "
                            + "use one, --state-dir for threads in SQLite on this machine, --store for PostgreSQL")
        }
        return c
    }

    private static func int(_ key: String, _ value: String) throws(WispError) -> Int {
        let range = ranges.first { $0.key == key }!.value
        guard let n = OutsideNumber.int(value, in: range) else {
            let bounds = "≥ \(range.lowerBound) and ≤ \(range.upperBound)"
            throw WispError(.invalidArgument, "--\(key) must be an integer \(bounds), got '\(value)'")
        }
        return n
    }

    /// Sets what flag `key` (without its dashes) or its variable says.
    private mutating func apply(_ key: String, _ value: String) throws(WispError) {
        switch key {
        case "backend":
            guard let kind = BackendKind(rawValue: value) else {
                throw WispError(.invalidArgument, "backend must be \(BackendKind.listed), got '\(value)'")
            }
            backend = kind
        case "max-threads": maxThreads = try Self.int("max-threads", value)
        case "max-queue": maxQueue = try Self.int("max-queue", value)
        case "context-size": contextSize = try Self.int("context-size", value)
        case "echo-delay-ms": echoDelayMs = try Self.int("echo-delay-ms", value)
        case "endpoint": endpoints = value.split(separator: ",").map { String($0).trimmingSpaces() }
                                          .filter { !$0.isEmpty }
        case "session-header":
            // RFC 9110's token characters: anything else would break the request's head.
            let token = Set("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8)
            guard value.utf8.allSatisfy(token.contains), value.utf8.count <= 256 else {
                throw WispError(.invalidArgument, "--session-header must be an HTTP header name (letters, digits "
                                + "and !#$%&'*+-.^_`|~, at most 256), or '' for none; got '\(value.preview)'")
            }
            sessionHeader = value.isEmpty ? nil : value
        case "model": model = value.isEmpty ? nil : value
        case "slots": slots = try Self.int("slots", value)
        case "root": roots.append(value)
        case "state-dir": stateDir = value.isEmpty ? nil : value
        case "store": store = value.isEmpty ? nil : try StoreURL(value)
        case "max-stored-threads": maxStoredThreads = try Self.int("max-stored-threads", value)
        case "keep-alive":
            guard OllamaKeepAlive(value) != nil else {
                throw WispError(.invalidArgument,
                                "--keep-alive must be an Ollama duration such as " +
                                "90s, 30m, 2h or -1, got '\(value.preview)'")
            }
            keepAlive = value
        case "condense-to":
            guard let f = Double(value), f > 0, f < 1 else {
                throw WispError(.invalidArgument,
                                "--condense-to must be a share of the context " +
                                "between 0 and 1, got '\(value.preview)'")
            }
            condenseTo = f
        case "log-level":
            guard let l = LogLevel(rawValue: value) else {
                throw WispError(.invalidArgument, "log level must be debug, info, warning or error, got '\(value)'")
            }
            logLevel = l
        default: throw WispError(.invalidArgument, "unknown option --\(key)")
        }
    }

    private mutating func read(environment: [String: String]) throws(WispError) {
        let env: [(String, String)] = [
            ("WISP_BACKEND", "backend"), ("WISP_MAX_THREADS", "max-threads"), ("WISP_MAX_QUEUE", "max-queue"),
            ("WISP_CONTEXT_SIZE", "context-size"), ("WISP_ECHO_DELAY_MS", "echo-delay-ms"),
            ("WISP_ENDPOINT", "endpoint"), ("WISP_MODEL", "model"), ("WISP_SLOTS", "slots"),
            ("WISP_LOG_LEVEL", "log-level"),
            ("WISP_STATE_DIR", "state-dir"), ("WISP_STORE", "store"), ("WISP_MAX_STORED_THREADS", "max-stored-threads"),
            ("WISP_KEEP_ALIVE", "keep-alive"), ("WISP_CONDENSE_TO", "condense-to"),
        ]
        for (variable, key) in env {
            if let v = environment[variable], !v.isEmpty { try apply(key, v) }
        }
        // Set but empty says "no header", as `--session-header ''` does.
        if let v = environment["WISP_SESSION_HEADER"] { try apply("session-header", v) }
        if let joined = environment["WISP_ROOTS"], !joined.isEmpty {
            // Split by bytes: `String.split` would not split a ":" that a combining mark follows.
            roots = joined.utf8.split(separator: UInt8(ascii: ":")).map { String(decoding: $0, as: UTF8.self) }
        }
        if let v = environment["WISP_ALLOW_HARDLINKS"], !v.isEmpty {
            allowHardLinks = !["0", "false", "no"].contains(v.lowercased())
        }
        apiKey = environment["WISP_API_KEY"].flatMap { $0.isEmpty ? nil : $0 }
    }

    /// Flags override the environment; `--root` flags replace `WISP_ROOTS` rather than add to it.
    private mutating func read(arguments: [String]) throws(WispError) {
        var rootsFromFlags: [String] = []
        var endpointsFromFlags: [String]?
        var i = 0
        while i < arguments.count {
            var arg = arguments[i]
            guard arg.utf8.starts(with: "--".utf8) else {
                throw WispError(.invalidArgument, "unexpected argument '\(arg)'")
            }
            arg = String(decoding: arg.utf8.dropFirst(2), as: UTF8.self)
            // The one flag without a value.
            if arg == "allow-hardlinks" { allowHardLinks = true; i += 1; continue }
            let key: String
            let value: String
            // By bytes, as the separators above: "--root=\u{301}dir" names the directory "\u{301}dir".
            if let eq = arg.utf8.firstIndex(of: UInt8(ascii: "=")) {
                key = String(decoding: arg.utf8[..<eq], as: UTF8.self)
                value = String(decoding: arg.utf8[arg.utf8.index(after: eq)...], as: UTF8.self)
            } else {
                guard i + 1 < arguments.count else { throw WispError(.invalidArgument, "--\(arg) needs a value") }
                key = arg
                value = arguments[i + 1]
                i += 1
            }
            if key == "root" {
                rootsFromFlags.append(value)
            } else if key == "endpoint" {
                endpointsFromFlags = (endpointsFromFlags ?? []) + (value.isEmpty ? [] : [value])
            } else {
                try apply(key, value)
            }
            i += 1
        }
        if !rootsFromFlags.isEmpty { roots = rootsFromFlags }
        if let endpointsFromFlags { endpoints = endpointsFromFlags }
    }
}
