import Foundation

/// The core's side of the pipe's input: bytes from stdin in, decoded requests out. Owns framing,
/// decoding, the `rejected` path and the wording of decoding errors, so all of it can be unit
/// tested and fuzzed without a process.
///
/// A frame that parses with a positive integer `id` but fits no op is `rejected` (answered with
/// an error, the core goes on). Anything else that cannot be read (a frame over the limit, one
/// that is not JSON or has no id, a stream cut inside a frame) throws `PipeProtocolError`: the
/// bytes that follow cannot be trusted, so the core exits and the shim restarts a clean one.
public struct RequestReader {
    /// What the reader hands the dispatcher.
    public enum Item: Sendable, Equatable {
        case request(Request)
        /// Parsed with an id but not as any op: answered with an error, the process goes on.
        case rejected(id: Int, message: String)
    }

    private var frames: FrameDecoder
    private let json = JSONDecoder()

    public init(maxFrameBytes limit: Int = maxFrameBytes) {
        frames = FrameDecoder(maxBytes: limit)
    }

    /// The items the bytes read so far complete, in order.
    public mutating func feed(_ data: some Collection<UInt8>) throws(PipeProtocolError) -> [Item] {
        let payloads: [ArraySlice<UInt8>]
        do { payloads = try frames.feed(data) } catch { throw PipeProtocolError(String(describing: error)) }
        var items: [Item] = []
        items.reserveCapacity(payloads.count)
        for payload in payloads {
            if let request = PipeJSON.request(payload) {
                items.append(.request(request))
            } else {
                items.append(try item(Data(payload)))
            }
        }
        return items
    }

    /// Call at end of input: a frame cut short is a protocol error.
    public func finish() throws(PipeProtocolError) {
        do { try frames.finish() } catch { throw PipeProtocolError(String(describing: error)) }
    }

    private struct RequestID: Decodable { var id: Int }

    /// A frame the fast path (PipeJSON) did not take, read by JSONDecoder: its result or its error.
    private func item(_ data: Data) throws(PipeProtocolError) -> Item {
        if let request = try? json.decode(Request.self, from: data) { return .request(request) }
        if let rid = try? json.decode(RequestID.self, from: data), rid.id > 0 {
            let reason: String
            do { _ = try json.decode(Request.self, from: data); reason = "undecodable request" } catch { reason = Self.describe(error) }
            return .rejected(id: rid.id, message: reason)
        }
        throw PipeProtocolError("a frame of \(data.count) bytes is not a JSON request with an integer id")
    }

    /// A decoding error as one line a person can act on.
    static func describe(_ error: any Error) -> String {
        func path(_ c: DecodingError.Context, _ last: (any CodingKey)? = nil) -> String {
            (c.codingPath + (last.map { [$0] } ?? [])).map(\.stringValue).joined(separator: ".")
        }
        switch error as? DecodingError {
        case .typeMismatch(let type, let c)?: return "field '\(path(c))' should be \(type)"
        case .valueNotFound(let type, let c)?: return "field '\(path(c))' is missing (\(type))"
        case .keyNotFound(let key, let c)?: return "field '\(path(c, key))' is missing"
        case .dataCorrupted(let c)?: return "field '\(path(c))': \(c.debugDescription)"
        default: return String(describing: error)
        }
    }
}

/// Input the core cannot read on from: it must exit (status 65) so the shim starts a clean core.
public struct PipeProtocolError: Error, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
