/// The writer of wisp's one JSON codec (JSON/JSON.swift): the pipe's messages
/// (Pipe/PipeJSON.swift), stored threads (Threads/ThreadStore.swift) and `JSONValue`s (schemas,
/// echo values, model tools' schemas).
///
/// Why by hand: `JSONEncoder` costs more than everything else the core does for a short reply
/// (encoding one echo reply: the figure is in bench/), and a stored thread is encoded whole
/// on every turn. The output is what `JSONEncoder` writes with `.withoutEscapingSlashes` (nil
/// optionals left out), keys in declaration order; tests check the two agree. "/" is never
/// escaped: a reply of slashes would double in size for nothing.

/// A value `JSONWriter` writes, keys in declaration order.
public protocol JSONWritable: Encodable {
    func write(to w: inout JSONWriter)
}

public struct JSONWriter {
    public private(set) var bytes: [UInt8]
    /// No key written yet in the innermost object: the next key takes no comma.
    private var first = true
    private static let hex: [UInt8] = Array("0123456789abcdef".utf8)

    /// `framed`: room for a pipe frame's 4-byte length first, filled in by `frame()`.
    public init(framed: Bool = false, capacity: Int = 256) {
        bytes = framed ? [0, 0, 0, 0] : []
        bytes.reserveCapacity(capacity)
    }

    /// The finished pipe frame (made `framed`).
    public mutating func frame() -> [UInt8] {
        Frame.setLength(of: &bytes)
        return bytes
    }

    /// `{`, the fields `body` writes (each through `key(_:)`), `}`.
    public mutating func object(_ body: (inout JSONWriter) -> Void) {
        bytes.append(0x7B)
        let outer = first
        first = true
        body(&self)
        first = outer
        bytes.append(0x7D)
    }

    /// `"name":`, after a comma unless it is the object's first key.
    public mutating func key(_ name: StaticString) {
        if !first { bytes.append(0x2C) }
        first = false
        bytes.append(0x22)
        name.withUTF8Buffer { bytes.append(contentsOf: $0) }
        bytes.append(0x22)
        bytes.append(0x3A)
    }

    public mutating func field(_ name: StaticString, _ value: String) { key(name); string(value) }
    public mutating func field(_ name: StaticString, _ value: Int) { key(name); int(value) }
    public mutating func field(_ name: StaticString, _ value: Int32) { key(name); int(Int(value)) }
    public mutating func field(_ name: StaticString, _ value: Bool) { key(name); bool(value) }
    public mutating func field(_ name: StaticString, _ value: Double) { key(name); double(value) }
    public mutating func field(_ name: StaticString, _ value: String?) { if let value { field(name, value) } }
    public mutating func field(_ name: StaticString, _ value: Double?) { if let value { field(name, value) } }
    public mutating func field(_ name: StaticString, _ value: Int?) { if let value { field(name, value) } }
    public mutating func field(_ name: StaticString, _ value: [String]) {
        key(name)
        array(value) { $0.string($1) }
    }
    public mutating func field(_ name: StaticString, _ value: some JSONWritable) {
        key(name)
        value.write(to: &self)
    }
    public mutating func field<T: JSONWritable>(_ name: StaticString, _ value: [T]) {
        key(name)
        array(value) { w, item in item.write(to: &w) }
    }

    public mutating func array<T>(_ items: [T], _ each: (inout JSONWriter, T) -> Void) {
        bytes.append(0x5B)
        for (n, item) in items.enumerated() {
            if n > 0 { bytes.append(0x2C) }
            each(&self, item)
        }
        bytes.append(0x5D)
    }

    /// `"name":` for a key known only at run time.
    public mutating func key(_ name: String) {
        if !first { bytes.append(0x2C) }
        first = false
        string(name)
        bytes.append(0x3A)
    }

    public mutating func byte(_ value: UInt8) { bytes.append(value) }

    /// A number's own text: exact, never rounded.
    public mutating func number(_ value: JSONNumber) { bytes.append(contentsOf: value.text.utf8) }

    public mutating func value(_ value: JSONValue) {
        switch value {
        case .null: bytes.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C])
        case .bool(let b): bool(b)
        case .number(let n): number(n)
        case .string(let s): string(s)
        case .array(let items): array(items) { $0.value($1) }
        case .object(let members):
            object { w in
                for m in members {
                    w.key(m.key)
                    w.value(m.value)
                }
            }
        }
    }

    /// How many bytes `string(value)` writes: what a reply will cost once encoded, known before it is.
    public static func encodedCount(_ value: String) -> Int {
        var n = 2
        for c in value.utf8 {
            switch c {
            case 0x22, 0x5C, 0x08, 0x0C, 0x0A, 0x0D, 0x09: n += 2
            case 0..<0x20: n += 6
            default: n += 1
            }
        }
        return n
    }

    public mutating func bool(_ value: Bool) {
        if value {
            bytes.append(contentsOf: [0x74, 0x72, 0x75, 0x65])
        } else {
            bytes.append(contentsOf: [0x66, 0x61, 0x6C, 0x73, 0x65])
        }
    }

    /// A finite Double as Swift prints it (shortest form that reads back the same); NaN and the
    /// infinities, which JSON has no text for, as `null` (JavaScript's `JSON.stringify` does the
    /// same). Never a trap: a Double written here may come from a store's file or a model
    /// server's timings, and trapping would lose every thread the core holds.
    public mutating func double(_ value: Double) {
        guard value.isFinite else { return bytes.append(contentsOf: [0x6E, 0x75, 0x6C, 0x6C]) }
        bytes.append(contentsOf: value.description.utf8)
    }

    public mutating func int(_ value: Int) {
        if value == 0 { return bytes.append(0x30) }
        var digits: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8,
                     UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) =
            (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        var n = value.magnitude
        var count = 0
        withUnsafeMutableBytes(of: &digits) { d in
            while n > 0 {
                d[19 - count] = UInt8(n % 10) + 0x30
                n /= 10
                count += 1
            }
            if value < 0 { bytes.append(0x2D) }
            bytes.append(contentsOf: d[(20 - count)...])
        }
    }

    public mutating func string(_ value: String) {
        bytes.append(0x22)
        var value = value
        value.withUTF8 { s in
            var from = 0
            for at in 0..<s.count {
                let c = s[at]
                guard c < 0x20 || c == 0x22 || c == 0x5C else { continue }
                if from < at { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: s[from..<at])) }
                from = at + 1
                switch c {
                case 0x22: bytes.append(contentsOf: [0x5C, 0x22])
                case 0x5C: bytes.append(contentsOf: [0x5C, 0x5C])
                case 0x08: bytes.append(contentsOf: [0x5C, 0x62])
                case 0x0C: bytes.append(contentsOf: [0x5C, 0x66])
                case 0x0A: bytes.append(contentsOf: [0x5C, 0x6E])
                case 0x0D: bytes.append(contentsOf: [0x5C, 0x72])
                case 0x09: bytes.append(contentsOf: [0x5C, 0x74])
                default:
                    bytes.append(contentsOf: [0x5C, 0x75, 0x30, 0x30, Self.hex[Int(c >> 4)], Self.hex[Int(c & 0xF)]])
                }
            }
            if from < s.count { bytes.append(contentsOf: UnsafeBufferPointer(rebasing: s[from...])) }
        }
        bytes.append(0x22)
    }
}
