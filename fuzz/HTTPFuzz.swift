// libFuzzer target for wisp's reader of an HTTP/1.1 answer (WispInfrastructure/HTTP/HTTP1.swift),
// the bytes a model server, or anything at its address, sends: any bytes, in any pieces, must
// read as an answer whose status is in range and whose body is no longer than what came, or fail
// with an HTTPError; never a crash, a trap or a hang. Compiled with HTTP1.swift and what it uses
// in one module (the reader is internal). Built and run by `make fuzz` (seeds: fuzz/corpus-http).
import Foundation

/// The input as the pieces a socket might hand over: cut where its first byte says, and then
/// every 7 bytes, so that every line and length is read across reads.
final class Pieces: ByteChannel {
    private var bytes: [UInt8]
    private let cut: Int
    private var given = 0

    init(_ bytes: [UInt8]) {
        self.bytes = bytes
        cut = bytes.isEmpty ? 1 : Int(bytes[0]) % 64 + 1
    }

    func receive(_ buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        let n = min(buffer.count, bytes.count - given, given == 0 ? cut : 7)
        guard n > 0 else { return 0 }
        bytes.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + given, byteCount: n) }
        given += n
        return n
    }

    func sendAll(_ bytes: [UInt8]) throws {}
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let input = Array(UnsafeRawBufferPointer(start: start, count: count))
    var reader = ResponseReader(Pieces(input))
    var body = 0
    do {
        let (head, framing) = try reader.head()
        if !(100...999).contains(head.status) { fatalError("status \(head.status) out of range") }
        if case .length(let n) = framing, !ResponseReader.lengths.contains(n) { fatalError("length \(n) out of range") }
        try reader.body(framing) { body += $0.count }
        if body > count { fatalError("a body of \(body) bytes from \(count) bytes of input") }
    } catch is HTTPError {
    } catch {
        fatalError("an error that is not an HTTPError: \(error)")
    }
    return 0
}
