import WispInfrastructure

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// `respond`: a prompt for a thread (created, continued, forked or rewound as ThreadRegistry.swift
/// says), answered by the model. Its call has a life of its own in `PipeServer` (a place in its
/// thread's line, events, a time limit, a cancel), so it is a `PipeOperation` but not an
/// `AnsweredOperation`.

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

public struct Respond: PipeOperation, Codable {
    public typealias Result = RespondResult
    public static let op = "respond"

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
        .constant("op", op),
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

extension Respond {
    /// Returns as soon as the call has its place in its thread's line.
    public func serve(on server: PipeServer) async { await server.accept(self) }

    /// What the request asks that no call can do, judged before it takes an id or a thread.
    func check() throws(WispError) {
        guard !prompt.isEmpty else { throw WispError(.invalidArgument, "prompt must not be empty") }
        if let level = options?.reasoning, ReasoningLevel(rawValue: level) == nil {
            let levels = ReasoningLevel.allCases.map(\.rawValue).joined(separator: ", ")
            throw WispError(.invalidArgument, "reasoning must be one of \(levels), got '\(level.preview)'")
        }
        if let n = rewind, n < 1 { throw WispError(.invalidArgument, "rewind must be at least 1, got \(n)") }
        if rewind != nil, thread_id == nil, fork_from == nil {
            throw WispError(.invalidArgument, "rewind takes back turns of an existing thread: name it in thread_id")
        }
        // The shim checks it too; the core trusts no number off the pipe (`max_tokens` goes to a server).
        if let n = options?.max_output_tokens, !Self.maxOutputTokens.contains(n) {
            let most = Self.maxOutputTokens.upperBound
            throw WispError(.invalidArgument, "max_output_tokens must be an integer from 1 to \(most), got \(n)")
        }
    }

    /// What `max_output_tokens` may be: a token count (stated in the core's facts).
    static let maxOutputTokens = 1...TokenCount.range.upperBound

    /// The call's deadline: the shim's, else its limit counted from now (a shim or test that
    /// sends only `timeout_s`); none for no positive limit.
    var deadline: Double? {
        if let deadline = options?.deadline { return deadline }
        guard let seconds = options?.timeout_s, seconds > 0 else { return nil }
        return monotonicSeconds() + seconds
    }
}

/// The result of `respond`. `turns` counts the turns the thread holds after this call
/// (this one included); `dropped` counts the turns condensing removed during this call.
public struct RespondResult: PipeMessage, Codable, Sendable, Equatable {
    var op = Respond.op
    public var thread_id: String
    public var created: Bool
    public var text: String
    public var condensed: Bool
    public var turns: Int
    public var dropped: Int
    public var prompt_tokens: Int?
    public var output_tokens: Int?
    /// Durable threads only: why this turn could not be stored (it is kept in memory only, and
    /// a crash would lose the thread).
    public var store_error: String?
    /// What this call's model requests cost, added up (tool rounds included).
    public var usage: UsageBody?
    /// "length" when the model server stopped the reply at its output cap; absent otherwise.
    public var finish_reason: String?

    public static let fields = PipeFields<Self>([
        .field("op", \.op),
        .field("thread_id", \.thread_id),
        .field("created", \.created),
        .field("text", \.text),
        .field("condensed", \.condensed),
        .field("turns", \.turns),
        .field("dropped", \.dropped),
        .field("prompt_tokens", \.prompt_tokens),
        .field("output_tokens", \.output_tokens),
        .field("store_error", \.store_error),
        .field("usage", \.usage),
        .field("finish_reason", \.finish_reason),
    ])
    public static let blank = RespondResult(thread_id: "", created: false, text: "", condensed: false, turns: 0,
                                            dropped: 0)
}
