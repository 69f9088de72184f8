import WispInfrastructure

/// The pipe's messages in JSON, through the core's one codec (WispInfrastructure/JSON/JSON.swift): requests
/// read straight into their types by `JSONFields` tables (no tree is built), replies written by
/// `JSONWriter`.
///
/// The reader alone decides: a frame it does not read as a request is answered by
/// `RequestReader` (rejected with the reason, or a protocol error). Unknown keys are skipped, as
/// `JSONDecoder` skips them (a newer shim may send a field this core does not know); a key twice
/// is refused. `make fuzz` and PipeJSONTests compare the result with `JSONDecoder`'s.
public enum PipeJSON {
    /// The request in `bytes`, or why it is not one.
    public static func request(_ bytes: UnsafeRawBufferPointer) throws(JSONError) -> Request {
        var r = JSONReader(bytes)
        var fields = RequestFields()
        try r.object(into: &fields, RequestFields.table)
        try r.end()
        return try fields.message()
    }

    public static func request(_ bytes: some Collection<UInt8>) throws(JSONError) -> Request {
        let result: Result<Request, JSONError>? = bytes.withContiguousStorageIfAvailable { b in
            do throws(JSONError) { return .success(try request(UnsafeRawBufferPointer(b))) } catch { return .failure(error) }
        }
        if let result { return try result.get() }
        return try Array(bytes).withUnsafeBytes { b in catching { () throws(JSONError) in try request(b) } }.get()
    }

    /// The `id` of a frame that is a JSON object with an integer `id`, whatever else it holds.
    public static func requestID(_ bytes: some Collection<UInt8>) -> Int? {
        guard let value = try? JSONValue.parse(bytes) else { return nil }
        return value["id"]?.int
    }
}

extension RespondOptions {
    /// One line per field.
    static let table = JSONFields<RespondOptions>([
        "temperature": { r, o throws(JSONError) in o.temperature = try r.nullable { r throws(JSONError) in try r.double() } },
        "max_output_tokens": { r, o throws(JSONError) in o.max_output_tokens = try r.nullable { r throws(JSONError) in try r.int() } },
        "timeout_s": { r, o throws(JSONError) in o.timeout_s = try r.nullable { r throws(JSONError) in try r.double() } },
        "deadline": { r, o throws(JSONError) in o.deadline = try r.nullable { r throws(JSONError) in try r.double() } },
        "reasoning": { r, o throws(JSONError) in o.reasoning = try r.nullable { r throws(JSONError) in try r.string() } },
    ])
}

/// Every field a request of any op may carry; `request()` builds the op's message from it.
private struct RequestFields {
    var op: String?, id: Int?, request: Int?
    var prompt: String?, threadID: String?, instructions: String?, schema: String?
    var tools: [String]?, roots: [String]?, files: [String]?
    var options: RespondOptions?, progress: Bool?
    var forkFrom: String?, rewind: Int?, query: String?, limit: Int?, cursor: String?, last: Int?, maxBytes: Int?

    static let table = JSONFields<RequestFields>([
        "op": { r, f throws(JSONError) in f.op = try r.string() },
        "id": { r, f throws(JSONError) in f.id = try r.int() },
        "request": { r, f throws(JSONError) in f.request = try r.int() },
        "prompt": { r, f throws(JSONError) in f.prompt = try r.nullable { r throws(JSONError) in try r.string() } },
        "thread_id": { r, f throws(JSONError) in f.threadID = try r.nullable { r throws(JSONError) in try r.string() } },
        "instructions": { r, f throws(JSONError) in f.instructions = try r.nullable { r throws(JSONError) in try r.string() } },
        "schema": { r, f throws(JSONError) in f.schema = try r.nullable { r throws(JSONError) in try r.string() } },
        "tools": { r, f throws(JSONError) in f.tools = try r.nullable { r throws(JSONError) in try r.strings() } },
        "roots": { r, f throws(JSONError) in f.roots = try r.nullable { r throws(JSONError) in try r.strings() } },
        "files": { r, f throws(JSONError) in f.files = try r.nullable { r throws(JSONError) in try r.strings() } },
        "options": { r, f throws(JSONError) in
            f.options = try r.nullable { r throws(JSONError) in
                var o = RespondOptions()
                try r.object(into: &o, RespondOptions.table)
                return o
            }
        },
        "progress": { r, f throws(JSONError) in f.progress = try r.nullable { r throws(JSONError) in try r.bool() } },
        "fork_from": { r, f throws(JSONError) in f.forkFrom = try r.nullable { r throws(JSONError) in try r.string() } },
        "rewind": { r, f throws(JSONError) in f.rewind = try r.nullable { r throws(JSONError) in try r.int() } },
        "query": { r, f throws(JSONError) in f.query = try r.nullable { r throws(JSONError) in try r.string() } },
        "limit": { r, f throws(JSONError) in f.limit = try r.nullable { r throws(JSONError) in try r.int() } },
        "cursor": { r, f throws(JSONError) in f.cursor = try r.nullable { r throws(JSONError) in try r.string() } },
        "last": { r, f throws(JSONError) in f.last = try r.nullable { r throws(JSONError) in try r.int() } },
        "max_bytes": { r, f throws(JSONError) in f.maxBytes = try r.nullable { r throws(JSONError) in try r.int() } },
    ])

    func required<T>(_ value: T?, _ name: String) throws(JSONError) -> T {
        guard let value else { throw JSONError("field '\(name)' is missing", at: 0).noOffset }
        return value
    }

    func message() throws(JSONError) -> Request {
        let op = try required(op, "op"), id = try required(id, "id")
        switch op {
        case "respond":
            return .respond(Respond(id: id, prompt: try required(prompt, "prompt"), thread_id: threadID, instructions: instructions,
                                    tools: tools, options: options, progress: progress, roots: roots, files: files, schema: schema,
                                    fork_from: forkFrom, rewind: rewind))
        case "close_thread": return .closeThread(CloseThread(id: id, thread_id: try required(threadID, "thread_id")))
        case "cancel": return .cancel(Cancel(id: id, request: try required(request, "request")))
        case "status": return .status(Status(id: id, query: query, limit: limit, cursor: cursor))
        case "read_thread":
            return .readThread(ReadThread(id: id, thread_id: try required(threadID, "thread_id"), last: last, max_bytes: maxBytes))
        case "ping": return .ping(Ping(id: id))
        default:
            var e = JSONError("unknown op '\(op.prefix(40))' (respond, close_thread, cancel, status, read_thread or ping)", at: -1)
            e.path = ["op"]
            throw e
        }
    }
}

extension JSONError {
    /// An error about a message as a whole, not a place in its text.
    var noOffset: JSONError { var e = self; e.offset = -1; return e }
}

// MARK: writing

extension Frame {
    /// A core → shim message as a whole frame.
    public static func encode(_ message: some JSONWritable) -> [UInt8] {
        var w = JSONWriter(framed: true)
        message.write(to: &w)
        return w.frame()
    }
}

extension Ready: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("id", id); $0.field("event", event); $0.field("protocol", `protocol`); $0.field("backend", backend)
            $0.field("model", model); $0.field("pid", pid); $0.field("durable", durable)
        }
    }
}

extension Progress: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("id", id); $0.field("event", event); $0.field("text", text); $0.field("tokens", tokens) }
    }
}

extension Stage: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("id", id); $0.field("event", event); $0.field("stage", stage); $0.field("count", count) }
    }
}

extension Evicted: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("id", id); $0.field("event", event); $0.field("thread_id", thread_id) }
    }
}

extension ErrorBody: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("code", code); $0.field("message", message) }
    }
}

extension RespondResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("op", op.rawValue); $0.field("thread_id", thread_id); $0.field("created", created); $0.field("text", text)
            $0.field("condensed", condensed); $0.field("turns", turns); $0.field("dropped", dropped)
            $0.field("prompt_tokens", prompt_tokens); $0.field("output_tokens", output_tokens); $0.field("store_error", store_error)
            if let usage { $0.field("usage", usage) }
        }
    }
}

extension UsageBody: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("input_tokens", input_tokens); $0.field("output_tokens", output_tokens)
            $0.field("reasoning_tokens", reasoning_tokens); $0.field("cached_tokens", cached_tokens)
            $0.field("first_token_ms", first_token_ms); $0.field("output_tokens_per_s", output_tokens_per_s)
        }
    }
}

extension CloseThreadResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("op", op.rawValue); $0.field("thread_id", thread_id); $0.field("closed", closed) }
    }
}

extension CancelResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("op", op.rawValue); $0.field("cancelled", cancelled) }
    }
}

extension PingResult: JSONWritable {
    public func write(to w: inout JSONWriter) { w.object { $0.field("op", op.rawValue) } }
}

extension Empty: JSONWritable {
    public func write(to w: inout JSONWriter) { w.object { _ in } }
}

extension ThreadInfo: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("thread_id", thread_id); $0.field("turns", turns); $0.field("pending", pending)
            $0.field("live", live); $0.field("stored", stored)
            if let usage { $0.field("usage", usage) }
            $0.field("created_at", created_at); $0.field("updated_at", updated_at)
            $0.field("first_prompt", first_prompt); $0.field("last_reply", last_reply); $0.field("instructions", instructions)
        }
    }
}

extension StatusResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("op", op.rawValue); $0.field("backend", backend); $0.field("model", model); $0.field("available", available)
            $0.field("reason", reason)
            $0.field("context_size", context_size); $0.field("max_threads", max_threads); $0.field("max_queue", max_queue)
            $0.key("threads"); $0.array(threads) { w, t in t.write(to: &w) }
            $0.field("tools", tools); $0.field("state_dir", state_dir); $0.field("state_error", state_error)
            $0.field("next_cursor", next_cursor)
            if let usage { $0.field("usage", usage) }
            $0.field("context_note", context_note)
        }
    }
}

extension TurnItem: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("prompt", prompt); $0.field("reply", reply); $0.field("structured", structured); $0.field("cut", cut)
        }
    }
}

extension ReadThreadResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("op", op.rawValue); $0.field("thread_id", thread_id); $0.field("instructions", instructions)
            $0.field("tools", tools); $0.field("turns", turns); $0.field("omitted", omitted); $0.field("condensed", condensed)
            $0.key("items"); $0.array(items) { w, t in t.write(to: &w) }
        }
    }
}

extension Reply: JSONWritable where Result: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("id", id); $0.field("event", event); $0.field("ok", ok)
            if let result { $0.field("result", result) }
            if let error { $0.field("error", error) }
        }
    }
}
