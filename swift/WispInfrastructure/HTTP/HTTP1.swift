#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

/// A connection's bytes, plain or through TLS: what the HTTP/1.1 exchange writes and reads.
/// Every failure is an `HTTPError`.
protocol ByteChannel: AnyObject {
    /// Up to `buffer.count` bytes into `buffer`; 0 at the end of the stream.
    func receive(_ buffer: UnsafeMutableRawBufferPointer) throws -> Int
    func sendAll(_ bytes: [UInt8]) throws
}

/// Where a URL says to connect: the scheme decides TLS and the default port.
struct HTTPTarget: Equatable {
    var secure: Bool
    var host: String
    var port: Int
    /// Path and query as the request line carries them.
    var path: String

    static let ports = 1...65_535

    init(_ url: URL) throws {
        guard let parts = URLComponents(url: url, resolvingAgainstBaseURL: false),
              let scheme = parts.scheme?.lowercased(), scheme == "http" || scheme == "https",
              var host = parts.host, !host.isEmpty else {
            throw HTTPError(.invalidRequest, "not an http(s) URL with a host (\(url.scheme ?? "no scheme")://…)")
        }
        // URLComponents keeps an IPv6 literal's brackets; the resolver and the verifier take it bare.
        if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
        secure = scheme == "https"
        self.host = host
        port = parts.port ?? (secure ? 443 : 80)
        guard Self.ports.contains(port) else { throw HTTPError(.invalidRequest, "port \(port) is not a TCP port") }
        var target = parts.percentEncodedPath.isEmpty ? "/" : parts.percentEncodedPath
        if let query = parts.percentEncodedQuery { target += "?" + query }
        path = target
    }

    /// The `Host` header's value: an IPv6 literal in brackets.
    var authority: String { host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)" }
}

enum RequestHead {
    /// The request's bytes: head, then body. One request per connection (`Connection: close`),
    /// so a body's end is the connection's and nothing is pooled.
    static func encode(_ request: HTTPRequest, to target: HTTPTarget) throws -> [UInt8] {
        let body = request.body ?? Data()
        var head = "\(request.method) \(target.path) HTTP/1.1\r\nHost: \(target.authority)\r\nConnection: close\r\n"
        for (name, value) in request.headers where name.lowercased() != "content-length" {
            // A line break in a header (a key from the environment, say) would start a header of its
            // own. Bytes, not Characters: "\r\n" is one Character, equal to neither "\r" nor "\n".
            guard !name.isEmpty, !(name + value).utf8.contains(where: { $0 == 0x0D || $0 == 0x0A }) else {
                let quoted = name.clipped(toBytes: 100).text
                throw HTTPError(.invalidRequest, "the request's header '\(quoted)' holds a line break")
            }
            head += "\(name): \(value)\r\n"
        }
        head += "Content-Length: \(body.count)\r\n\r\n"
        return Array(head.utf8) + Array(body)
    }
}

/// How an answer's body ends, as its head says.
enum BodyFraming: Equatable {
    case chunked
    case length(Int)
    case untilClose
}

/// An answer read from a channel, buffered: its head, then its body handed on as it arrives.
/// Every length the peer states is range-checked before it is used.
struct ResponseReader {
    /// A body's or a chunk's length as the server states it: a length, and one that an `Int`
    /// holds with room to add to.
    static let lengths = 0...Int(Int32.max) * 64
    /// The longest header line or chunk-size line taken.
    static let maxLine = 65_536

    let channel: any ByteChannel
    private var buffer: [UInt8] = []
    private var start = 0
    private var chunk = [UInt8](repeating: 0, count: 1 << 16)

    init(_ channel: any ByteChannel) { self.channel = channel }

    /// More bytes into the buffer; false at end of stream.
    private mutating func fill() throws -> Bool {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        let source = channel
        let n = try chunk.withUnsafeMutableBytes { try source.receive($0) }
        guard n > 0 else { return false }
        buffer.append(contentsOf: chunk[0..<min(n, chunk.count)])
        return true
    }

    static func lost(_ why: String) -> HTTPError { HTTPError(.connectionLost, why) }

    static func malformed(_ why: String) -> HTTPError {
        HTTPError(.malformedResponse, "the answer is not HTTP/1.1 as wisp reads it: \(why)")
    }

    /// One line without its CRLF (or LF); `early`: what a close before its end means.
    mutating func line(or early: String = "the answer ended inside its header") throws -> String {
        var searched = 0 // bytes after `start` already known to hold no LF
        while true {
            if let i = buffer[(start + searched)...].firstIndex(of: 0x0A) {
                if i - start > Self.maxLine { break }
                var end = i
                if end > start && buffer[end - 1] == 0x0D { end -= 1 }
                let text = String(decoding: buffer[start..<end], as: UTF8.self)
                start = i + 1
                return text
            }
            searched = buffer.count - start
            if searched > Self.maxLine { break }
            guard try fill() else { throw Self.lost(early) }
        }
        throw Self.malformed("a line longer than \(Self.maxLine) bytes")
    }

    /// The final answer's head (1xx interim answers skipped) and how its body ends.
    mutating func head() throws -> (HTTPResponseHead, BodyFraming) {
        while true {
            let statusLine = try line()
            // "HTTP/1.1 200 OK"
            let fields = statusLine.split(separator: " ", maxSplits: 2)
            guard fields.count >= 2, fields[0].hasPrefix("HTTP/"), fields[1].utf8.count == 3,
                  let status = OutsideNumber.int(fields[1], in: 100...999) else {
                throw Self.malformed("status line '\(statusLine.clipped(toBytes: 200).text)'")
            }
            var chunked = false
            var length: Int?
            while true {
                let field = try line()
                if field.isEmpty { break }
                guard let colon = field.firstIndex(of: ":") else { continue }
                let name = field[..<colon].lowercased()
                let value = field[field.index(after: colon)...].trimmingSpaces()
                if name == "transfer-encoding" && value.lowercased().contains("chunked") { chunked = true }
                if name == "content-length" {
                    // A length that is not one (or a second, different one) makes the body's end unknowable.
                    guard let n = OutsideNumber.int(value, in: Self.lengths), length == nil || length == n else {
                        throw Self.malformed("Content-Length '\(value.clipped(toBytes: 100).text)'")
                    }
                    length = n
                }
            }
            if (100..<200).contains(status) { continue }
            let framing: BodyFraming = chunked ? .chunked : length.map { .length($0) } ?? .untilClose
            return (HTTPResponseHead(status: status), framing)
        }
    }

    /// The body, handed on as it arrives, to its end as `framing` says.
    mutating func body(_ framing: BodyFraming, _ emit: (Data) -> Void) throws {
        switch framing {
        case .length(let length):
            try forward(length, of: "its Content-Length of \(length) bytes", emit)
        case .untilClose:
            while true {
                if start < buffer.count {
                    emit(Data(buffer[start...]))
                    start = buffer.count
                }
                guard try fill() else { return }
            }
        case .chunked:
            while true {
                let sizeLine = try line(or: "the body ended before its last chunk")
                let digits = sizeLine.split(separator: ";").first?.trimmingSpaces() ?? ""
                // Hex digits only: Int(_:radix:) would also take a sign.
                guard digits.allSatisfy(\.isHexDigit),
                      let size = OutsideNumber.int(digits, radix: 16, in: Self.lengths) else {
                    throw Self.malformed("chunk size '\(sizeLine.clipped(toBytes: 100).text)'")
                }
                if size == 0 { return }
                try forward(size, of: "a chunk of \(size) bytes", emit)
                _ = try line(or: "the body ended inside a chunk") // the CRLF after the chunk
            }
        }
    }

    /// Hands on exactly `count` bytes as they arrive; `what`: what they are, for a close before their end.
    private mutating func forward(_ count: Int, of what: String, _ emit: (Data) -> Void) throws {
        var left = count
        while left > 0 {
            if start == buffer.count {
                guard try fill() else { throw Self.lost("the body ended \(count - left) bytes into \(what)") }
            }
            let n = min(left, buffer.count - start)
            emit(Data(buffer[start..<(start + n)]))
            start += n
            left -= n
        }
    }
}
