/// The pipe's shim → core messages (Messages.swift says how the protocol is laid out): each
/// request with its field table, and `Request`, any of them by its `op`.

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

public struct RespondOptions: PipeMessage, Codable, Sendable, Equatable {
    public var temperature: Double?
    public var max_output_tokens: Int?
    /// The call's time limit as the caller set it (what a `timeout` error names).
    public var timeout_s: Double?
    /// When that limit runs out, in `monotonicSeconds()`, the clock both processes read: a call
    /// read after it (a core stopped or busy while requests queued) is neither run nor committed.
    /// Without it, the limit counts from when the core reads the request.
    public var deadline: Double?
    /// `light`, `moderate` or `deep` (`ReasoningLevel`); nil: the backend's default.
    public var reasoning: String?

    public static let fields = PipeFields<Self>([
        .field("temperature", \.temperature),
        .field("max_output_tokens", \.max_output_tokens),
        .field("timeout_s", \.timeout_s),
        .field("deadline", \.deadline),
        .field("reasoning", \.reasoning),
    ])
    public static let blank = RespondOptions()
}

/// The pipe's clock for `RespondOptions.deadline`, in seconds: `clock_gettime(CLOCK_MONOTONIC)`,
/// read by the shim too (`protocol.monotonic_now`). Why this one: it is one clock for the whole
/// machine, so the shim's reading means the same instant here. On Linux every process of a
/// time namespace reads the same CLOCK_MONOTONIC (time namespaces may offset it, and the core,
/// the shim's child, inherits the shim's); on macOS it is the kernel's time since boot, the same
/// for every process. Not `ContinuousClock` (CLOCK_BOOTTIME on Linux, a different origin), and
/// not the wall clock, which may be stepped (NTP, the user) between the two readings.
public func monotonicSeconds() -> Double {
    var t = timespec()
    clock_gettime(CLOCK_MONOTONIC, &t)
    return Double(t.tv_sec) + Double(t.tv_nsec) / 1e9
}

public struct Respond: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var prompt: String
    public var thread_id: String?
    public var instructions: String?
    public var tools: [String]?
    public var options: RespondOptions?
    /// Send `Progress` events while generating.
    public var progress: Bool?
    /// Directories the MCP client offers (its roots): the model tools of a thread this call
    /// creates may read them as well as the core's own `--root`s.
    public var roots: [String]?
    /// Paths of text files the core reads (under its roots and `roots`) and gives the model with the prompt.
    public var files: [String]?
    /// Structured output for this call: a JSON Schema as compact JSON text (text, not a JSON
    /// value, so that the core keeps its key order; see OutputSchema.swift). The shim has
    /// checked that it stays inside wisp's supported subset.
    public var schema: String?
    /// The call creates its thread as a copy of this one's binding and committed history.
    public var fork_from: String?
    /// Drops the thread's last `rewind` turns as part of this call (all or nothing).
    public var rewind: Int?

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.respond),
        .field("id", \.id),
        .field("prompt", \.prompt),
        .field("thread_id", \.thread_id),
        .field("instructions", \.instructions),
        .field("tools", \.tools),
        .field("options", \.options),
        .field("progress", \.progress),
        .field("roots", \.roots),
        .field("files", \.files),
        .field("schema", \.schema),
        .field("fork_from", \.fork_from),
        .field("rewind", \.rewind),
    ])
    public static let blank = Respond(id: 0, prompt: "")
}

public struct CloseThread: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var thread_id: String

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.close_thread),
        .field("id", \.id),
        .field("thread_id", \.thread_id),
    ])
    public static let blank = CloseThread(id: 0, thread_id: "")
}

public struct Cancel: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    /// The id of the in-flight request to cancel.
    public var request: Int

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.cancel),
        .field("id", \.id),
        .field("request", \.request),
    ])
    public static let blank = Cancel(id: 0, request: 0)
}

/// The backend's state and a page of threads: with `query`, those whose prompts and replies hold
/// its words, best match first; else most recently used first. `cursor` is a `next_cursor`.
public struct Status: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var query: String?
    public var limit: Int?
    public var cursor: String?

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.status),
        .field("id", \.id),
        .field("query", \.query),
        .field("limit", \.limit),
        .field("cursor", \.cursor),
    ])
    public static let blank = Status(id: 0)
}

/// A thread's binding and its last turns, at most `max_bytes` of their text.
public struct ReadThread: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int
    public var thread_id: String
    /// At most this many of the newest turns; nil: as many as fit.
    public var last: Int?
    public var max_bytes: Int?

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.read_thread),
        .field("id", \.id),
        .field("thread_id", \.thread_id),
        .field("last", \.last),
        .field("max_bytes", \.max_bytes),
    ])
    public static let blank = ReadThread(id: 0, thread_id: "")
}

/// A liveness check: answered at once by the dispatcher (`PingResult`), without touching the
/// registry or a backend, so a reply proves the core still reads and runs its dispatcher.
public struct Ping: PipeMessage, Codable, Sendable, Equatable {
    public var id: Int

    public static let fields = PipeFields<Self>([
        .constant("op", Request.Op.ping),
        .field("id", \.id),
    ])
    public static let blank = Ping(id: 0)
}

/// Any shim → core message, decoded in one pass by its `op`.
public enum Request: Sendable, Equatable {
    case respond(Respond)
    case closeThread(CloseThread)
    case cancel(Cancel)
    case status(Status)
    case readThread(ReadThread)
    case ping(Ping)

    public var id: Int {
        switch self {
        case .respond(let m): m.id
        case .closeThread(let m): m.id
        case .cancel(let m): m.id
        case .status(let m): m.id
        case .readThread(let m): m.id
        case .ping(let m): m.id
        }
    }
}

extension Request: Codable {
    public enum Op: String, Codable, Sendable, CaseIterable {
        case respond, close_thread, cancel, status, read_thread, ping
    }
    private enum Keys: String, CodingKey { case op }

    public init(from decoder: any Decoder) throws {
        let op = try decoder.container(keyedBy: Keys.self).decode(Op.self, forKey: .op)
        switch op {
        case .respond: self = .respond(try Respond(from: decoder))
        case .close_thread: self = .closeThread(try CloseThread(from: decoder))
        case .cancel: self = .cancel(try Cancel(from: decoder))
        case .status: self = .status(try Status(from: decoder))
        case .read_thread: self = .readThread(try ReadThread(from: decoder))
        case .ping: self = .ping(try Ping(from: decoder))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Keys.self)
        switch self {
        case .respond(let m): try c.encode(Op.respond, forKey: .op); try m.encode(to: encoder)
        case .closeThread(let m): try c.encode(Op.close_thread, forKey: .op); try m.encode(to: encoder)
        case .cancel(let m): try c.encode(Op.cancel, forKey: .op); try m.encode(to: encoder)
        case .status(let m): try c.encode(Op.status, forKey: .op); try m.encode(to: encoder)
        case .readThread(let m): try c.encode(Op.read_thread, forKey: .op); try m.encode(to: encoder)
        case .ping(let m): try c.encode(Op.ping, forKey: .op); try m.encode(to: encoder)
        }
    }
}
