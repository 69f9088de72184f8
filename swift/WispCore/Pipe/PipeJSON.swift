import WispInfrastructure

/// The pipe's messages in JSON, through the core's one codec (WispInfrastructure/JSON/JSON.swift).
///
/// A message's fields are declared once, in its `fields` table (beside the struct: in its
/// operation's file in Operations/, or in Messages.swift): the reader and the writer both come
/// from that table, so a new field is its property and one line there. Reading goes straight
/// into the message's type (no tree is built); a request's `op` is read first (at once when it is the first key, as the shim writes it) and
/// picks its operation's table (`PipeOperations`) for the rest.
///
/// The reader alone decides: a frame it does not read as a request is answered by
/// `RequestReader` (rejected with the reason, or a protocol error). Unknown keys are skipped, as
/// `JSONDecoder` skips them (a newer shim may send a field this core does not know); a key twice
/// is refused. `make fuzz` and PipeJSONTests compare the result with `JSONDecoder`'s.
public enum PipeJSON {
    /// The request in `bytes`, or why it is not one.
    public static func request(_ bytes: UnsafeRawBufferPointer) throws(JSONError) -> Request {
        var r = JSONReader(bytes)
        guard let read = try r.member("op", PipeOperations.reader) else { throw JSONError.missing("op") }
        let request = Request(try read(&r))
        try r.end()
        return request
    }

    public static func request(_ bytes: some Collection<UInt8>) throws(JSONError) -> Request {
        let result: Result<Request, JSONError>? = bytes.withContiguousStorageIfAvailable { b in
            do throws(JSONError) {
                return .success(try request(UnsafeRawBufferPointer(b)))
            } catch {
                return .failure(error)
            }
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

// MARK: field tables

/// A value a pipe field holds, read and written by the core's one codec.
public protocol PipeValue: SendableMetatype {
    static func read(_ r: inout JSONReader) throws(JSONError) -> Self
    func write(to w: inout JSONWriter)
}

/// A pipe message, or an object inside one, whose fields are declared once in `fields`.
public protocol PipeMessage: PipeValue, JSONWritable {
    static var fields: PipeFields<Self> { get }
    /// Where reading starts: a field the frame leaves out keeps this value (only an optional
    /// field may be left out).
    static var blank: Self { get }
}

extension PipeMessage {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> Self {
        let table = fields
        var message = blank
        let seen = try r.object(into: &message, table.reads)
        if let missing = table.firstMissing(seen) { throw JSONError.missing(missing) }
        return message
    }

    public func write(to w: inout JSONWriter) {
        let table = Self.fields
        w.object { w in for write in table.writes { write(self, &w) } }
    }
}

/// One field of a message `M`: its name, whether a frame must hold it, how it is read into `M`
/// and written from it.
public struct PipeField<M>: Sendable {
    let name: StaticString
    let required: Bool
    let read: JSONFields<M>.Read
    let write: @Sendable (M, inout JSONWriter) -> Void

    /// A field every message holds.
    public static func field<T: PipeValue>(_ name: StaticString, _ path: WritableKeyPath<M, T> & Sendable) -> Self {
        Self(name: name, required: true,
             read: { r, m throws(JSONError) in m[keyPath: path] = try T.read(&r) },
             write: { m, w in w.key(name); m[keyPath: path].write(to: &w) })
    }

    /// A field that may be absent or null (both read as nil); nil is left out when written.
    public static func field<T: PipeValue>(_ name: StaticString, _ path: WritableKeyPath<M, T?> & Sendable) -> Self {
        Self(name: name, required: false,
             read: { r, m throws(JSONError) in
                 m[keyPath: path] = try r.nullable { r throws(JSONError) in try T.read(&r) }
             },
             write: { m, w in
                 guard let value = m[keyPath: path] else { return }
                 w.key(name)
                 value.write(to: &w)
             })
    }

    /// A field whose value is fixed for `M` (a request's `op`): written as `value`, and read only
    /// as `value`.
    public static func constant<T: PipeValue & Equatable & Sendable>(_ name: StaticString, _ value: T) -> Self {
        Self(name: name, required: true,
             read: { r, _ throws(JSONError) in
                 guard try T.read(&r) == value else { throw JSONError("must be \(value)", at: -1) }
             },
             write: { _, w in w.key(name); value.write(to: &w) })
    }
}

/// A message's fields, in the order they are written.
public struct PipeFields<M>: Sendable {
    let names: [StaticString]
    let reads: JSONFields<M>
    let writes: [@Sendable (M, inout JSONWriter) -> Void]
    /// The fields a frame must hold, a bit per place.
    let required: UInt64

    public init(_ fields: [PipeField<M>]) {
        names = fields.map(\.name)
        reads = JSONFields(names: names, reads: fields.map(\.read))
        writes = fields.map(\.write)
        required = fields.indices.reduce(0) { mask, i in fields[i].required ? mask | 1 << UInt64(i) : mask }
    }

    /// The first required field `seen` lacks.
    func firstMissing(_ seen: UInt64) -> StaticString? {
        let lacking = required & ~seen
        guard lacking != 0 else { return nil }
        return names[lacking.trailingZeroBitCount]
    }
}

extension JSONError {
    /// A message as a whole lacks `field`.
    static func missing(_ field: StaticString) -> JSONError { JSONError("field '\(field)' is missing", at: -1) }
}

extension String: PipeValue {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> String { try r.string() }
    public func write(to w: inout JSONWriter) { w.string(self) }
}

extension Int: PipeValue {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> Int { try r.int() }
    public func write(to w: inout JSONWriter) { w.int(self) }
}

extension Int32: PipeValue {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> Int32 {
        guard let n = Int32(exactly: try r.int()) else { throw JSONError("must fit in 32 bits", at: -1) }
        return n
    }
    public func write(to w: inout JSONWriter) { w.int(Int(self)) }
}

extension Double: PipeValue {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> Double { try r.double() }
    public func write(to w: inout JSONWriter) { w.double(self) }
}

extension Bool: PipeValue {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> Bool { try r.bool() }
    public func write(to w: inout JSONWriter) { w.bool(self) }
}

extension Array: PipeValue where Element: PipeValue {
    public static func read(_ r: inout JSONReader) throws(JSONError) -> [Element] {
        try r.array { r throws(JSONError) in try Element.read(&r) }
    }
    public func write(to w: inout JSONWriter) { w.array(self) { w, item in item.write(to: &w) } }
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
