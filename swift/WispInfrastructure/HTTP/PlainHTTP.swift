#if os(Linux)
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Glibc
import Synchronization

/// HTTP/1.1 for `http://` endpoints on Linux over a plain socket, read on an OS thread of its own; the
/// same events as `HTTPClient.open` (status, then body bytes as they arrive). Which requests it
/// carries is `HTTPClient.plainTransport`'s choice.
///
/// Why: swift-corelibs-foundation's URLSession leaves the socket's write source armed after the
/// request has been sent, and an idle socket is always writable, so while a model server streams
/// its answer the core spins (strace: EPOLLOUT wake-ups by the thousand on the one socket),
/// taking CPU the model server needed: on 2 cores, tokens/s through wisp fell well below direct
/// (`make bench` has the figures).
enum PlainHTTP {
    static func open(_ request: URLRequest) -> AsyncThrowingStream<HTTPEvent, any Error> {
        let (stream, continuation) = AsyncThrowingStream<HTTPEvent, any Error>.makeStream()
        let connection = Connection()
        continuation.onTermination = { _ in connection.cancel() }
        // Blocking reads belong on an OS thread of their own, not the cooperative pool.
        Thread.detachNewThread { connection.run(request, continuation) }
        return stream
    }
}

private final class Connection: Sendable {
    /// A body's or a chunk's length as the server states it: a length, and one that an `Int`
    /// holds with room to add to.
    static let lengths = 0...Int(Int32.max) * 64
    private struct State {
        var fd: Int32 = -1
        var cancelled = false
    }

    private let state = Mutex(State())

    /// Unblocks the reading OS thread; it then ends the stream.
    func cancel() {
        state.withLock { s in
            s.cancelled = true
            if s.fd >= 0 { shutdown(s.fd, Int32(SHUT_RDWR)) }
        }
    }

    func run(_ request: URLRequest, _ out: AsyncThrowingStream<HTTPEvent, any Error>.Continuation) {
        do {
            try exchange(request, out)
            out.finish()
        } catch {
            out.finish(throwing: state.withLock { $0.cancelled } ? URLError(.cancelled) : error)
        }
        state.withLock { s in
            if s.fd >= 0 { close(s.fd) }
            s.fd = -1
        }
    }

    private func exchange(_ request: URLRequest, _ out: AsyncThrowingStream<HTTPEvent, any Error>.Continuation) throws {
        guard let url = request.url, let host = url.host,
              let parts = URLComponents(url: url, resolvingAgainstBaseURL: false) else {
            throw URLError(.badURL)
        }
        let port = url.port ?? 80
        let fd = try Self.connect(host: host, port: port, timeout: request.timeoutInterval)
        let cancelled = state.withLock { s in
            s.fd = fd
            return s.cancelled
        }
        if cancelled { throw URLError(.cancelled) }

        var target = parts.percentEncodedPath.isEmpty ? "/" : parts.percentEncodedPath
        if let query = parts.percentEncodedQuery { target += "?" + query }
        let body = request.httpBody ?? Data()
        var head = "\(request.httpMethod ?? "GET") \(target) HTTP/1.1\r\nHost: \(host):\(port)\r\nConnection: close\r\n"
        for (name, value) in request.allHTTPHeaderFields ?? [:] where name.lowercased() != "content-length" {
            head += "\(name): \(value)\r\n"
        }
        head += "Content-Length: \(body.count)\r\n\r\n"
        try Self.sendAll(fd, Array(head.utf8) + Array(body))

        var input = Input(fd: fd)
        let header = try input.header()
        out.yield(.response(header.status))
        if header.chunked {
            while true {
                let sizeLine = try input.line(or: "the body ended before its last chunk")
                let digits = sizeLine.split(separator: ";").first?.trimmingCharacters(in: .whitespaces) ?? ""
                guard let size = OutsideNumber.int(digits, radix: 16, in: Self.lengths) else {
                    throw URLError(.cannotParseResponse)
                }
                if size == 0 { break }
                try input.forward(size, of: "a chunk of \(size) bytes") { out.yield(.data($0)) }
                _ = try input.line(or: "the body ended inside a chunk") // the CRLF after the chunk
            }
        } else if let length = header.contentLength {
            try input.forward(length, of: "its Content-Length of \(length) bytes") { out.yield(.data($0)) }
        } else {
            try input.forwardToEnd { out.yield(.data($0)) }
        }
    }

    // MARK: socket

    private static func connect(host: String, port: Int, timeout: TimeInterval) throws -> Int32 {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &list) == 0, let first = list else {
            throw URLError(.cannotFindHost)
        }
        defer { freeaddrinfo(list) }
        var seconds = timeout > 0 ? timeout : 60
        seconds = min(seconds, 86_400)
        var tv = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - seconds.rounded(.down)) * 1_000_000))
        var next: UnsafeMutablePointer<addrinfo>? = first
        while let ai = next {
            next = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, ai.pointee.ai_socktype, ai.pointee.ai_protocol)
            if fd < 0 { continue }
            // The request's timeout bounds the connect, each send, and each wait for more bytes
            // (URLSession's timeoutIntervalForRequest is an idle timeout too).
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 { return fd }
            let timedOut = errno == EINPROGRESS || errno == EAGAIN
            close(fd)
            if timedOut { throw URLError(.timedOut) }
        }
        throw URLError(.cannotConnectToHost)
    }

    private static func sendAll(_ fd: Int32, _ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes.withUnsafeBytes {
                send(fd, $0.baseAddress! + offset, bytes.count - offset, Int32(MSG_NOSIGNAL))
            }
            if n > 0 {
                offset += n
            } else if n < 0 && errno == EINTR {
                continue
            } else {
                let timedOut = n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)
                throw timedOut ? URLError(.timedOut) : URLError(.networkConnectionLost)
            }
        }
    }
}

/// Buffered reads from the socket.
private struct Input {
    let fd: Int32
    private var buffer: [UInt8] = []
    private var start = 0
    private var chunk = [UInt8](repeating: 0, count: 1 << 16)

    init(fd: Int32) { self.fd = fd }

    struct Header {
        var status: Int
        var chunked: Bool
        var contentLength: Int?
    }

    /// More bytes into the buffer; false at end of stream.
    private mutating func fill() throws -> Bool {
        if start > 0 && start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        }
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress!, $0.count, 0) }
            if n > 0 {
                buffer.append(contentsOf: chunk[0..<n])
                return true
            }
            if n == 0 { return false }
            if errno == EINTR { continue }
            throw (errno == EAGAIN || errno == EWOULDBLOCK) ? URLError(.timedOut) : URLError(.networkConnectionLost)
        }
    }

    /// The connection closed early: `why`, as the error's description (the call's error names it).
    static func lost(_ why: String) -> URLError {
        URLError(.networkConnectionLost, userInfo: [NSLocalizedDescriptionKey: why])
    }

    /// One line without its CRLF (or LF); `or`: what a close before its end means.
    mutating func line(or early: String = "the answer ended inside its header") throws -> String {
        while true {
            if let i = buffer[start...].firstIndex(of: 0x0A) {
                var end = i
                if end > start && buffer[end - 1] == 0x0D { end -= 1 }
                let text = String(decoding: buffer[start..<end], as: UTF8.self)
                start = i + 1
                return text
            }
            if buffer.count - start > 65_536 { throw URLError(.cannotParseResponse) }
            guard try fill() else { throw Self.lost(early) }
        }
    }

    mutating func header() throws -> Header {
        var statusLine = try line()
        var status = 0
        var header = Header(status: 0, chunked: false, contentLength: nil)
        repeat {
            // "HTTP/1.1 200 OK"; a 1xx interim answer is followed by the real one.
            let fields = statusLine.split(separator: " ", maxSplits: 2)
            guard fields.count >= 2, fields[0].hasPrefix("HTTP/"),
                  let code = OutsideNumber.int(fields[1], in: 100...999) else {
                throw URLError(.cannotParseResponse)
            }
            status = code
            header = Header(status: code, chunked: false, contentLength: nil)
            while true {
                let field = try line()
                if field.isEmpty { break }
                guard let colon = field.firstIndex(of: ":") else { continue }
                let name = field[..<colon].lowercased()
                let value = field[field.index(after: colon)...].trimmingCharacters(in: .whitespaces)
                if name == "transfer-encoding" && value.lowercased().contains("chunked") { header.chunked = true }
                if name == "content-length" {
                    // A length that is not one (or a second, different one) makes the body's end unknowable.
                    guard let length = OutsideNumber.int(value, in: Connection.lengths),
                          header.contentLength == nil || header.contentLength == length else {
                        throw URLError(.cannotParseResponse)
                    }
                    header.contentLength = length
                }
            }
            if (100..<200).contains(status) { statusLine = try line() }
        } while (100..<200).contains(status)
        return header
    }

    /// Hands on exactly `count` bytes as they arrive; `what`: what they are, for a close before their end.
    mutating func forward(_ count: Int, of what: String, _ emit: (Data) -> Void) throws {
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

    /// Hands on everything until the server closes the connection.
    mutating func forwardToEnd(_ emit: (Data) -> Void) throws {
        while true {
            if start < buffer.count {
                emit(Data(buffer[start...]))
                start = buffer.count
            }
            guard try fill() else { return }
        }
    }
}
#endif
