/// The reader's containers (JSON/JSONReader.swift has the cursor and the scalars): arrays,
/// objects read whole or straight into typed fields through a `JSONFields` table, and any value.

extension JSONReader {
    private mutating func enter() throws(JSONError) {
        depth += 1
        guard depth <= JSONValue.maxDepth else { throw error("nested more than \(JSONValue.maxDepth) levels deep") }
    }

    /// An array, each item read by `item`.
    public mutating func array<T>(_ item: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> [T] {
        guard take(0x5B) else { throw expected("an array") }
        try enter()
        defer { depth -= 1 }
        var out: [T] = []
        if take(0x5D) { return out }
        repeat {
            do { out.append(try item(&self)) } catch { var e = error; e.path.insert("\(out.count)", at: 0); throw e }
        } while take(0x2C)
        guard take(0x5D) else { throw error("expected ',' or ']' in an array, \(what())") }
        return out
    }

    public mutating func strings() throws(JSONError) -> [String] { try array { r throws(JSONError) in try r.string() } }

    /// An object's members, each handed to `member` with its key: `member` reads the value.
    public mutating func members(_ member: (String, inout JSONReader) throws(JSONError) -> Void) throws(JSONError) {
        guard take(0x7B) else { throw expected("an object") }
        try enter()
        defer { depth -= 1 }
        if take(0x7D) { return }
        repeat {
            let key = try string()
            guard take(0x3A) else { throw error("expected ':' after a member name, \(what())") }
            try member(key, &self)
        } while take(0x2C)
        guard take(0x7D) else { throw error("expected ',' or '}' in an object, \(what())") }
    }

    /// An object read into `value` through `fields`: each known key at most once (a key twice
    /// is refused: which one would count is not defined), unknown keys skipped. Returns the keys
    /// it held, as a bit per place in `fields`.
    @discardableResult
    public mutating func object<T>(into value: inout T, _ fields: JSONFields<T>) throws(JSONError) -> UInt64 {
        guard take(0x7B) else { throw expected("an object") }
        try enter()
        defer { depth -= 1 }
        if take(0x7D) { return 0 }
        var seen: UInt64 = 0
        repeat {
            let k = try key(fields.names)
            guard take(0x3A) else { throw error("expected ':' after a member name, \(what())") }
            if let k {
                guard seen & (1 << UInt64(k)) == 0 else { throw error("the key '\(fields.names[k])' appears twice") }
                seen |= 1 << UInt64(k)
                do { try fields.reads[k](&self, &value) } catch {
                    var e = error
                    e.path.insert("\(fields.names[k])", at: 0)
                    throw e
                }
            } else {
                try skip()
            }
        } while take(0x2C)
        guard take(0x7D) else { throw error("expected ',' or '}' in an object, \(what())") }
        return seen
    }

    /// The value of member `name` of the object that starts here, read by `read`, without moving
    /// this reader: for a tag that says how to read the rest (the pipe's `op`), found at once
    /// when it comes first. Nil when the object has no such member; members before it are
    /// checked only as far as passing over them takes.
    public func member<T>(_ name: StaticString,
                          _ read: (inout JSONReader) throws(JSONError) -> T) throws(JSONError) -> T? {
        var r = self
        guard r.take(0x7B) else { throw r.expected("an object") }
        if r.take(0x7D) { return nil }
        repeat {
            let k = try r.key([name])
            guard r.take(0x3A) else { throw r.error("expected ':' after a member name, \(r.what())") }
            if k != nil {
                do { return try read(&r) } catch {
                    var e = error
                    e.path.insert("\(name)", at: 0)
                    throw e
                }
            }
            try r.skip()
        } while r.take(0x2C)
        guard r.take(0x7D) else { throw r.error("expected ',' or '}' in an object, \(r.what())") }
        return nil
    }

    /// A key, as its place in `names` (nil for any other key). Keys without escapes, the usual
    /// case, are compared in place.
    private mutating func key(_ names: [StaticString]) throws(JSONError) -> Int? {
        skipSpace()
        guard i < b.count, b[i] == 0x22 else { throw expected("a member name in quotes") }
        let start = i + 1
        var end = start
        while end < b.count, b[end] != 0x22, b[end] != 0x5C, b[end] >= 0x20 { end += 1 }
        if end < b.count, b[end] == 0x22 {
            i = end + 1
            let found = UnsafeRawBufferPointer(rebasing: b[start..<end])
            for (n, name) in names.enumerated() where name.utf8CodeUnitCount == found.count {
                if name.withUTF8Buffer({ $0.elementsEqual(found) }) { return n }
            }
            // Unknown: still checked as a string (UTF-8).
            if found.contains(where: { $0 >= 0x80 }), String(validating: found, as: UTF8.self) == nil {
                throw JSONError("a string is not valid UTF-8", at: start)
            }
            return nil
        }
        let text = try string()
        return names.firstIndex { name in name.withUTF8Buffer { $0.elementsEqual(text.utf8) } }
    }

    /// Any value, checked and passed over.
    public mutating func skip() throws(JSONError) {
        skipSpace()
        guard i < b.count else { throw expected("a JSON value") }
        switch b[i] {
        case 0x7B: try members { _, r throws(JSONError) in try r.skip() }
        case 0x5B: _ = try array { r throws(JSONError) in try r.skip() }
        case 0x22: _ = try string()
        default: _ = try value()
        }
    }

    /// Any JSON value, whole.
    public mutating func value() throws(JSONError) -> JSONValue {
        skipSpace()
        guard i < b.count else { throw error(i == 0 ? "no JSON value" : "the text ends before the JSON value does") }
        switch b[i] {
        case 0x7B:
            var members: [JSONMember] = []
            try self.members { key, r throws(JSONError) in members.append(JSONMember(key, try r.value())) }
            return .object(members)
        case 0x5B: return .array(try array { r throws(JSONError) in try r.value() })
        case 0x22: return .string(try string())
        case 0x74, 0x66: return .bool(try bool())
        case 0x6E:
            guard null() else { throw expected("a JSON value") }
            return .null
        case 0x2D, 0x30...0x39: return .number(try number())
        default: throw expected("a JSON value")
        }
    }
}

/// How an object's known keys are read into a `T`: one entry per key, so a new optional field
/// of a message is one line here (`("name", { $1.name = try $0.nullable { try $0.string() } })`).
public struct JSONFields<T>: Sendable {
    public typealias Read = @Sendable (inout JSONReader, inout T) throws(JSONError) -> Void
    let names: [StaticString]
    let reads: [Read]

    public init(_ fields: KeyValuePairs<StaticString, Read>) {
        self.init(names: fields.map(\.key), reads: fields.map(\.value))
    }

    public init(names: [StaticString], reads: [Read]) {
        precondition(names.count <= 64 && names.count == reads.count, "JSONFields: at most 64 keys, one read each")
        self.names = names
        self.reads = reads
    }
}
