// libFuzzer target for the core's request reader (framing, request decoding, the `rejected`
// path): any bytes on stdin must give requests, rejections or a PipeProtocolError, never a
// crash or a hang; and the hand-written fast path (PipeJSON) must read the input as one JSON
// payload exactly as JSONDecoder does, or leave it alone. Built and run by `make fuzz`
// (swiftc -sanitize=fuzzer,address with the Pipe sources).
import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    // The input as one payload, and (the seeds are framed traffic) past a frame's length prefix.
    for payload in [bytes[...], bytes.dropFirst(4)] {
        let json = UnsafeRawBufferPointer(rebasing: payload)
        if let fast = PipeJSON.request(json), (try? JSONDecoder().decode(Request.self, from: Data(json))) != fast {
            fatalError("PipeJSON read \(fast) where JSONDecoder disagrees")
        }
    }
    var reader = RequestReader(maxFrameBytes: 1 << 20)
    // Feed in two uneven pieces so split handling is exercised too.
    let cut = count / 3
    for piece in [bytes[0..<cut], bytes[cut..<count]] {
        do {
            for item in try reader.feed(UnsafeRawBufferPointer(rebasing: piece)) {
                if case .rejected(let id, let message) = item, id <= 0 || message.isEmpty {
                    fatalError("a rejection must name a positive id and a reason")
                }
            }
        } catch {
            return 0
        }
    }
    _ = try? reader.finish()
    return 0
}
