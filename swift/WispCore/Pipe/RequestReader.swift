import WispInfrastructure

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
            do throws(JSONError) {
                items.append(.request(try PipeJSON.request(payload)))
            } catch {
                guard let id = PipeJSON.requestID(payload), id > 0 else {
                    throw PipeProtocolError("a frame of \(payload.count) bytes is " +
                                            "not a JSON request with an integer id")
                }
                items.append(.rejected(id: id, message: error.description))
            }
        }
        return items
    }

    /// Call at end of input: a frame cut short is a protocol error.
    public func finish() throws(PipeProtocolError) {
        do { try frames.finish() } catch { throw PipeProtocolError(String(describing: error)) }
    }
}

/// Input the core cannot read on from: it must exit (status 65) so the shim starts a clean core.
public struct PipeProtocolError: Error, Equatable, CustomStringConvertible {
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { message }
}
