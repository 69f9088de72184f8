import Foundation

/// Framing for the pipe (DESIGN §3): a 4-byte unsigned big-endian length N, then N bytes of
/// JSON. The decoder is incremental, so any split of a byte stream yields the same frames.
public enum Frame {
    /// The default limit on one payload; a larger frame is a protocol error.
    public static let defaultMaxBytes = 16 * 1024 * 1024

    public static func encode(payload: some Collection<UInt8>) -> [UInt8] {
        let n = UInt32(payload.count)
        var out = [UInt8]()
        out.reserveCapacity(4 + payload.count)
        out.append(UInt8(truncatingIfNeeded: n >> 24))
        out.append(UInt8(truncatingIfNeeded: n >> 16))
        out.append(UInt8(truncatingIfNeeded: n >> 8))
        out.append(UInt8(truncatingIfNeeded: n))
        out.append(contentsOf: payload)
        return out
    }

    public static func encode<T: Encodable>(_ message: T) throws -> [UInt8] {
        encode(payload: try JSONEncoder().encode(message))
    }
}

public enum FrameError: Error, Equatable, CustomStringConvertible {
    /// The length prefix announces more than the limit allows.
    case tooLarge(length: Int, limit: Int)
    /// The stream ended inside a frame.
    case truncated(have: Int, need: Int)

    public var description: String {
        switch self {
        case .tooLarge(let length, let limit): "frame of \(length) bytes is over the \(limit)-byte limit"
        case .truncated(let have, let need): "stream ended inside a frame (\(have) of \(need) bytes)"
        }
    }
}

/// Accumulates bytes and hands out whole payloads.
public struct FrameDecoder {
    public let maxBytes: Int
    private var buffer: [UInt8] = []
    private var start = 0

    public init(maxBytes: Int = Frame.defaultMaxBytes) {
        self.maxBytes = maxBytes
    }

    public mutating func append(_ bytes: some Collection<UInt8>) {
        buffer.append(contentsOf: bytes)
    }

    public mutating func append(_ pointer: UnsafeRawBufferPointer) {
        buffer.append(contentsOf: pointer)
    }

    /// The next whole payload, nil when more bytes are needed.
    public mutating func next() throws(FrameError) -> ArraySlice<UInt8>? {
        let available = buffer.count - start
        guard available >= 4 else { compact(); return nil }
        let length = Int(buffer[start]) << 24 | Int(buffer[start + 1]) << 16 | Int(buffer[start + 2]) << 8 | Int(buffer[start + 3])
        guard length <= maxBytes else { throw .tooLarge(length: length, limit: maxBytes) }
        guard available >= 4 + length else { compact(); return nil }
        let payload = buffer[(start + 4)..<(start + 4 + length)]
        start += 4 + length
        return payload
    }

    /// Call at end of stream: an unfinished frame is an error.
    public func finish() throws(FrameError) {
        let available = buffer.count - start
        guard available == 0 else {
            if available < 4 { throw .truncated(have: available, need: 4) }
            let length = Int(buffer[start]) << 24 | Int(buffer[start + 1]) << 16 | Int(buffer[start + 2]) << 8 | Int(buffer[start + 3])
            throw .truncated(have: available, need: 4 + length)
        }
    }

    private mutating func compact() {
        if start > 0 {
            buffer.removeFirst(start)
            start = 0
        }
    }
}
