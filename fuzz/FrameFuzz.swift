// libFuzzer target for the core's frame decoder and request decoding: any bytes on stdin
// must give frames, a decoding error or a FrameError, never a crash or a hang.
// Built and run by `make fuzz` (swiftc -sanitize=fuzzer,address with the Pipe sources).
import Foundation

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = UnsafeRawBufferPointer(start: start, count: count)
    var decoder = FrameDecoder(maxBytes: 1 << 20)
    // Feed in two uneven pieces so split handling is exercised too.
    let cut = count / 3
    let decoderJSON = JSONDecoder()
    for piece in [bytes[0..<cut], bytes[cut..<count]] {
        decoder.append(UnsafeRawBufferPointer(rebasing: piece))
        do {
            while let payload = try decoder.next() {
                _ = try? decoderJSON.decode(Request.self, from: Data(payload))
            }
        } catch {
            return 0
        }
    }
    _ = try? decoder.finish()
    return 0
}
