/// The limit on one frame's payload, both ways (the shim's `MAX_FRAME_BYTES`): a larger frame
/// is a protocol error.
public let maxFrameBytes = 16 * 1024 * 1024

/// Framing for the pipe (ARCHITECTURE.md): a 4-byte unsigned big-endian length N, then N bytes
/// of JSON. The decoder is incremental, so any split of a byte stream yields the same frames.
public enum Frame {
    /// Whether a whole encoded frame (prefix included) is within `maxFrameBytes`.
    public static func fits(_ frame: [UInt8]) -> Bool { frame.count <= 4 + maxFrameBytes }

    public static func encode(payload: some Collection<UInt8>) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 4)
        out.reserveCapacity(4 + payload.count)
        out.append(contentsOf: payload)
        setLength(of: &out)
        return out
    }

    /// Writes the length prefix into the first 4 bytes of `frame`, the payload being the rest.
    static func setLength(of frame: inout [UInt8]) {
        let n = UInt32(truncatingIfNeeded: frame.count - 4)
        frame[0] = UInt8(truncatingIfNeeded: n >> 24)
        frame[1] = UInt8(truncatingIfNeeded: n >> 16)
        frame[2] = UInt8(truncatingIfNeeded: n >> 8)
        frame[3] = UInt8(truncatingIfNeeded: n)
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

/// Accumulates bytes and hands out whole payloads: the shim's `FrameDecoder` in the same shape
/// (`feed(data) -> payloads`, then `finish()` at end of stream).
public struct FrameDecoder {
    public let maxBytes: Int
    private var buffer: [UInt8] = []
    private var start = 0

    public init(maxBytes: Int = maxFrameBytes) {
        self.maxBytes = maxBytes
    }

    /// Every payload `bytes` completes, in order. Throws on a frame over the limit (the stream
    /// cannot be read on from there).
    public mutating func feed(_ bytes: some Collection<UInt8>) throws(FrameError) -> [ArraySlice<UInt8>] {
        // Compacted before, not after: the payloads handed out last time are slices of the
        // buffer, gone by now, so this moves only the bytes of an unfinished frame.
        compact()
        buffer.append(contentsOf: bytes)
        var payloads: [ArraySlice<UInt8>] = []
        while let payload = try next() { payloads.append(payload) }
        return payloads
    }

    /// Bytes held for a frame not yet complete.
    public var buffered: Int { buffer.count - start }

    /// Call at end of stream: an unfinished frame is an error.
    public func finish() throws(FrameError) {
        let available = buffered
        guard available == 0 else {
            if available < 4 { throw .truncated(have: available, need: 4) }
            throw .truncated(have: available, need: 4 + length(at: start))
        }
    }

    private func length(at i: Int) -> Int {
        Int(buffer[i]) << 24 | Int(buffer[i + 1]) << 16 | Int(buffer[i + 2]) << 8 | Int(buffer[i + 3])
    }

    private mutating func next() throws(FrameError) -> ArraySlice<UInt8>? {
        let available = buffered
        guard available >= 4 else { return nil }
        let length = length(at: start)
        guard length <= maxBytes else { throw .tooLarge(length: length, limit: maxBytes) }
        guard available >= 4 + length else { return nil }
        let payload = buffer[(start + 4)..<(start + 4 + length)]
        start += 4 + length
        return payload
    }

    private mutating func compact() {
        if start > 0 {
            buffer.removeFirst(start)
            start = 0
        }
    }
}
