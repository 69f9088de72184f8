/// The pipe's JSON, read and written by hand for the pipe's own messages.
///
/// Why: Foundation's `JSONDecoder` and `JSONEncoder` cost more than everything else the core
/// does for a short reply (callgrind, echo backend: ~67k instructions to decode one `respond`
/// and ~50k to encode its reply, over half of the core's work per call). The messages are few
/// and flat, so they are handled directly here.
///
/// Reading is a fast path only: whatever it does not take as plainly valid (an unknown or
/// repeated key, a number it would have to convert, an escape it does not know, bytes that are
/// not UTF-8) returns nil, and `RequestReader` hands the frame to `JSONDecoder`, whose result or
/// error stands. So the two can differ in speed only; `make fuzz` and a test compare them.
/// Writing (`JSONWriter`, Support/JSONWriter.swift) gives what `JSONEncoder` gives, keys in
/// declaration order (a test checks the two agree but for that order, a hash table's in `JSONEncoder`).
public enum PipeJSON {
    /// The request in `bytes` if it is one the fast path takes, else nil (ask `JSONDecoder`).
    public static func request(_ bytes: UnsafeRawBufferPointer) -> Request? {
        var s = Scanner(bytes)
        return s.request()
    }

    public static func request(_ bytes: some Collection<UInt8>) -> Request? {
        bytes.withContiguousStorageIfAvailable { request(UnsafeRawBufferPointer($0)) }
            ?? Array(bytes).withUnsafeBytes { request($0) }
    }
}

// MARK: reading

private struct Scanner {
    let b: UnsafeRawBufferPointer
    var i = 0

    init(_ bytes: UnsafeRawBufferPointer) { b = bytes }

    mutating func skipSpace() {
        while i < b.count {
            switch b[i] {
            case 0x20, 0x0A, 0x0D, 0x09: i += 1
            default: return
            }
        }
    }

    mutating func take(_ c: UInt8) -> Bool {
        skipSpace()
        guard i < b.count, b[i] == c else { return false }
        i += 1
        return true
    }

    mutating func takeNull() -> Bool {
        skipSpace()
        guard i + 4 <= b.count, b[i] == 0x6E, b[i + 1] == 0x75, b[i + 2] == 0x6C, b[i + 3] == 0x6C else { return false }
        i += 4
        return true
    }

    mutating func bool() -> Bool? {
        skipSpace()
        if i + 4 <= b.count, b[i] == 0x74, b[i + 1] == 0x72, b[i + 2] == 0x75, b[i + 3] == 0x65 {
            i += 4
            return true
        }
        if i + 5 <= b.count, b[i] == 0x66, b[i + 1] == 0x61, b[i + 2] == 0x6C, b[i + 3] == 0x73, b[i + 4] == 0x65 {
            i += 5
            return false
        }
        return nil
    }

    /// A JSON integer that fits `Int`, written plainly (no fraction, no exponent).
    mutating func int() -> Int? {
        skipSpace()
        let negative = i < b.count && b[i] == 0x2D
        if negative { i += 1 }
        let start = i
        var value = 0
        while i < b.count, b[i] >= 0x30, b[i] <= 0x39 {
            let digit = Int(b[i] &- 0x30)
            let (m, o1) = value.multipliedReportingOverflow(by: 10)
            let (a, o2) = negative ? m.subtractingReportingOverflow(digit) : m.addingReportingOverflow(digit)
            guard !o1, !o2 else { return nil }
            value = a
            i += 1
        }
        let digits = i - start
        guard digits > 0, !(digits > 1 && b[start] == 0x30) else { return nil }
        if i < b.count, b[i] == 0x2E || b[i] == 0x65 || b[i] == 0x45 { return nil }
        return value
    }

    /// A JSON number as a Double: finite, and not rounded to zero or below the normal range
    /// (JSONDecoder refuses those, so they are left to it).
    mutating func double() -> Double? {
        skipSpace()
        let start = i
        if i < b.count, b[i] == 0x2D { i += 1 }
        func digits(_ s: inout Scanner) -> Int {
            let from = s.i
            while s.i < s.b.count, s.b[s.i] >= 0x30, s.b[s.i] <= 0x39 { s.i += 1 }
            return s.i - from
        }
        let intStart = i
        let n = digits(&self)
        guard n > 0, !(n > 1 && b[intStart] == 0x30) else { return nil }
        if i < b.count, b[i] == 0x2E {
            i += 1
            guard digits(&self) > 0 else { return nil }
        }
        if i < b.count, b[i] == 0x65 || b[i] == 0x45 {
            i += 1
            if i < b.count, b[i] == 0x2B || b[i] == 0x2D { i += 1 }
            guard digits(&self) > 0 else { return nil }
        }
        let mantissa = UnsafeRawBufferPointer(rebasing: b[start..<i])
        let text = String(decoding: mantissa, as: UTF8.self)
        guard let value = Double(text), value.isFinite, value == 0 || value.magnitude >= Double.leastNormalMagnitude else { return nil }
        if value == 0, text.utf8.prefix(while: { $0 != 0x65 && $0 != 0x45 }).contains(where: { $0 >= 0x31 && $0 <= 0x39 }) { return nil }
        return value
    }

    mutating func string() -> String? {
        skipSpace()
        guard i < b.count, b[i] == 0x22 else { return nil }
        i += 1
        let start = i
        while i < b.count {
            let c = b[i]
            if c == 0x22 {
                defer { i += 1 }
                return Self.text(UnsafeRawBufferPointer(rebasing: b[start..<i]))
            }
            if c == 0x5C || c < 0x20 { break }
            i += 1
        }
        var out = [UInt8](UnsafeRawBufferPointer(rebasing: b[start..<i]))
        while i < b.count {
            let c = b[i]
            i += 1
            switch c {
            case 0x22:
                return out.withUnsafeBytes { Self.text($0) }
            case 0x5C:
                guard i < b.count else { return nil }
                let e = b[i]
                i += 1
                switch e {
                case 0x22, 0x5C, 0x2F: out.append(e)
                case 0x62: out.append(0x08)
                case 0x66: out.append(0x0C)
                case 0x6E: out.append(0x0A)
                case 0x72: out.append(0x0D)
                case 0x74: out.append(0x09)
                case 0x75:
                    guard let unit = hex4() else { return nil }
                    var scalar: UInt32
                    if (0xD800...0xDBFF).contains(unit) {
                        guard i + 2 <= b.count, b[i] == 0x5C, b[i + 1] == 0x75 else { return nil }
                        i += 2
                        guard let low = hex4(), (0xDC00...0xDFFF).contains(low) else { return nil }
                        scalar = 0x10000 + ((UInt32(unit) - 0xD800) << 10) + (UInt32(low) - 0xDC00)
                    } else if (0xDC00...0xDFFF).contains(unit) {
                        return nil
                    } else {
                        scalar = UInt32(unit)
                    }
                    guard let u = Unicode.Scalar(scalar) else { return nil }
                    out.append(contentsOf: UTF8.encode(u)!)
                default:
                    return nil
                }
            default:
                if c < 0x20 { return nil }
                out.append(c)
            }
        }
        return nil
    }

    /// The bytes as a String if they are UTF-8, else nil. ASCII, the usual case, takes the
    /// fast `String(decoding:)`, which only repairs what is not UTF-8 and ASCII always is.
    static func text(_ bytes: UnsafeRawBufferPointer) -> String? {
        if !bytes.contains(where: { $0 >= 0x80 }) { return String(decoding: bytes, as: UTF8.self) }
        return String(validating: bytes, as: UTF8.self)
    }

    /// A key, as the index of the name it matches in `names` (nil for any other key).
    mutating func key(_ names: [StaticString]) -> Int?? {
        skipSpace()
        guard i < b.count, b[i] == 0x22 else { return nil }
        let start = i + 1
        var end = start
        while end < b.count, b[end] != 0x22, b[end] != 0x5C { end += 1 }
        // A key with an escape in it is no name of ours written plainly: left to JSONDecoder.
        guard end < b.count, b[end] == 0x22 else { return nil }
        i = end + 1
        let found = UnsafeRawBufferPointer(rebasing: b[start..<end])
        for (n, name) in names.enumerated() where name.utf8CodeUnitCount == found.count {
            if name.withUTF8Buffer({ $0.elementsEqual(found) }) { return .some(n) }
        }
        return .some(nil)
    }

    private mutating func hex4() -> UInt16? {
        guard i + 4 <= b.count else { return nil }
        var v: UInt16 = 0
        for _ in 0..<4 {
            let c = b[i]
            let d: UInt8
            switch c {
            case 0x30...0x39: d = c - 0x30
            case 0x41...0x46: d = c - 0x41 + 10
            case 0x61...0x66: d = c - 0x61 + 10
            default: return nil
            }
            v = v << 4 | UInt16(d)
            i += 1
        }
        return v
    }

    /// `null` (the outer optional holds nil), or what `parse` reads; nil when neither.
    mutating func nullable<T>(_ parse: (inout Scanner) -> T?) -> T?? {
        if takeNull() { return .some(nil) }
        return parse(&self).map { .some($0) }
    }

    /// An array of strings.
    mutating func strings() -> [String]? {
        guard take(0x5B) else { return nil }
        var out: [String] = []
        if take(0x5D) { return out }
        repeat {
            guard let s = string() else { return nil }
            out.append(s)
        } while take(0x2C)
        guard take(0x5D) else { return nil }
        return out
    }

    /// `RespondOptions` with only its own keys, each once.
    mutating func options() -> RespondOptions? {
        guard take(0x7B) else { return nil }
        var o = RespondOptions()
        var seen = 0
        if take(0x7D) { return o }
        repeat {
            guard let found = key(Self.optionKeys), let k = found, seen & (1 << k) == 0, take(0x3A) else { return nil }
            seen |= 1 << k
            switch k {
            case 0: guard let v = nullable({ $0.double() }) else { return nil }; o.temperature = v
            case 1: guard let v = nullable({ $0.int() }) else { return nil }; o.max_output_tokens = v
            case 2: guard let v = nullable({ $0.double() }) else { return nil }; o.timeout_s = v
            default: guard let v = nullable({ $0.double() }) else { return nil }; o.deadline = v
            }
        } while take(0x2C)
        guard take(0x7D) else { return nil }
        return o
    }

    static let optionKeys: [StaticString] = ["temperature", "max_output_tokens", "timeout_s", "deadline"]
    /// Every key a request may have, each a bit of `seen` by its place here.
    static let requestKeys: [StaticString] = ["op", "id", "request", "prompt", "thread_id", "instructions", "schema",
                                              "tools", "roots", "files", "options", "progress"]
    static let opAndID = 0b11
    /// The keys a `respond` may have: all but `request`.
    static let respondKeys = (1 << requestKeys.count - 1) & ~0b100

    mutating func request() -> Request? {
        guard take(0x7B) else { return nil }
        var op: String?, id: Int?, request: Int?
        var prompt: String??, threadID: String??, instructions: String??, schema: String??
        var tools: [String]??, roots: [String]??, files: [String]??
        var options: RespondOptions??, progress: Bool??
        var seen = 0
        guard !take(0x7D) else { return nil }
        repeat {
            guard let found = key(Self.requestKeys), let k = found, seen & (1 << k) == 0, take(0x3A) else { return nil }
            seen |= 1 << k
            switch k {
            case 0: guard let v = string() else { return nil }; op = v
            case 1: guard let v = int() else { return nil }; id = v
            case 2: guard let v = int() else { return nil }; request = v
            case 3: guard let v = nullable({ $0.string() }) else { return nil }; prompt = v
            case 4: guard let v = nullable({ $0.string() }) else { return nil }; threadID = v
            case 5: guard let v = nullable({ $0.string() }) else { return nil }; instructions = v
            case 6: guard let v = nullable({ $0.string() }) else { return nil }; schema = v
            case 7: guard let v = nullable({ $0.strings() }) else { return nil }; tools = v
            case 8: guard let v = nullable({ $0.strings() }) else { return nil }; roots = v
            case 9: guard let v = nullable({ $0.strings() }) else { return nil }; files = v
            case 10: guard let v = nullable({ $0.options() }) else { return nil }; options = v
            default: guard let v = nullable({ $0.bool() }) else { return nil }; progress = v
            }
        } while take(0x2C)
        guard take(0x7D) else { return nil }
        skipSpace()
        guard i == b.count, let op, let id else { return nil }
        // Only the op's own keys: a key another op takes is left to JSONDecoder.
        switch op {
        case "respond":
            guard seen & ~Self.respondKeys == 0, let text = prompt ?? nil else { return nil }
            return .respond(Respond(id: id, prompt: text, thread_id: threadID ?? nil, instructions: instructions ?? nil,
                                    tools: tools ?? nil, options: options ?? nil, progress: progress ?? nil,
                                    roots: roots ?? nil, files: files ?? nil, schema: schema ?? nil))
        case "close_thread":
            guard seen == Self.opAndID | 1 << 4, let thread = threadID ?? nil else { return nil }
            return .closeThread(CloseThread(id: id, thread_id: thread))
        case "cancel":
            guard seen == Self.opAndID | 1 << 2, let request else { return nil }
            return .cancel(Cancel(id: id, request: request))
        case "status":
            guard seen == Self.opAndID else { return nil }
            return .status(Status(id: id))
        case "ping":
            guard seen == Self.opAndID else { return nil }
            return .ping(Ping(id: id))
        default:
            return nil
        }
    }
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
            $0.field("thread_id", thread_id); $0.field("created", created); $0.field("text", text)
            $0.field("condensed", condensed); $0.field("turns", turns); $0.field("dropped", dropped)
            $0.field("prompt_tokens", prompt_tokens); $0.field("output_tokens", output_tokens); $0.field("store_error", store_error)
        }
    }
}

extension CloseThreadResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("thread_id", thread_id); $0.field("closed", closed) }
    }
}

extension CancelResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object { $0.field("cancelled", cancelled) }
    }
}

extension PingResult: JSONWritable {
    public func write(to w: inout JSONWriter) { w.object { _ in } }
}

extension Empty: JSONWritable {
    public func write(to w: inout JSONWriter) { w.object { _ in } }
}

extension ThreadInfo: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("thread_id", thread_id); $0.field("turns", turns); $0.field("pending", pending)
            $0.field("live", live); $0.field("stored", stored)
        }
    }
}

extension StatusResult: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("backend", backend); $0.field("model", model); $0.field("available", available); $0.field("reason", reason)
            $0.field("context_size", context_size); $0.field("max_threads", max_threads); $0.field("max_queue", max_queue)
            $0.key("threads"); $0.array(threads) { w, t in t.write(to: &w) }
            $0.field("tools", tools); $0.field("state_dir", state_dir); $0.field("state_error", state_error)
        }
    }
}

extension Reply: JSONWritable where Result: JSONWritable {
    public func write(to w: inout JSONWriter) {
        w.object {
            $0.field("id", id); $0.field("ok", ok)
            if let result { $0.field("result", result) }
            if let error { $0.field("error", error) }
        }
    }
}
