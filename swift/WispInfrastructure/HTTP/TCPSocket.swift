#if os(Linux)
#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Glibc

/// A connected TCP socket whose every wait is bounded: `SO_RCVTIMEO` and `SO_SNDTIMEO` at the
/// request's idle timeout bound the connect, each send and each wait for more bytes, and the TLS
/// handshake's reads and writes through it. Closed by its owner (`HTTPConnection`), which alone
/// knows when no other thread can still `shutdown` it.
final class TCPSocket: ByteChannel {
    let fd: Int32

    private init(fd: Int32) { self.fd = fd }

    /// The idle timeout as a socket option: 60 s when none is given, at most a day.
    static func timeval(_ timeout: TimeInterval) -> Glibc.timeval {
        let seconds = min(timeout > 0 ? timeout : 60, 86_400)
        return Glibc.timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - seconds.rounded(.down)) * 1_000_000))
    }

    static func connect(host: String, port: Int, timeout: TimeInterval) throws -> TCPSocket {
        var hints = addrinfo()
        hints.ai_family = AF_UNSPEC
        hints.ai_socktype = Int32(SOCK_STREAM.rawValue)
        var list: UnsafeMutablePointer<addrinfo>?
        let looked = getaddrinfo(host, String(port), &hints, &list)
        guard looked == 0, let first = list else {
            let why = gai_strerror(looked).map { String(cString: $0) } ?? "error \(looked)"
            throw HTTPError(.cannotFindHost, "\(host) could not be resolved (\(why))")
        }
        defer { freeaddrinfo(list) }
        var tv = timeval(timeout)
        var refused = "no address to connect to"
        var next: UnsafeMutablePointer<addrinfo>? = first
        while let ai = next {
            next = ai.pointee.ai_next
            let fd = socket(ai.pointee.ai_family, ai.pointee.ai_socktype, ai.pointee.ai_protocol)
            if fd < 0 { continue }
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<Glibc.timeval>.size))
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<Glibc.timeval>.size))
            var one: Int32 = 1
            setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            if Glibc.connect(fd, ai.pointee.ai_addr, ai.pointee.ai_addrlen) == 0 { return TCPSocket(fd: fd) }
            let code = errno
            close(fd)
            if code == EINPROGRESS || code == EAGAIN {
                throw HTTPError(.timedOut, "connecting to \(host):\(port) took longer than the time-out")
            }
            refused = String(cString: strerror(code))
        }
        throw HTTPError(.cannotConnect, "could not connect to \(host):\(port) (\(refused))")
    }

    func sendAll(_ bytes: [UInt8]) throws {
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
                throw Self.failure(n < 0 ? errno : 0, "sending the request")
            }
        }
    }

    func receive(_ buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        while true {
            let n = recv(fd, buffer.baseAddress, buffer.count, 0)
            if n >= 0 { return n }
            if errno == EINTR { continue }
            throw Self.failure(errno, "waiting for the answer")
        }
    }

    /// A send's or a receive's failure: the time-out (the socket options fire as EAGAIN), or a lost connection.
    static func failure(_ code: Int32, _ doing: String) -> HTTPError {
        if code == EAGAIN || code == EWOULDBLOCK {
            return HTTPError(.timedOut, "nothing moved for the time-out while \(doing)")
        }
        let why = code == 0 ? "the connection closed" : String(cString: strerror(code))
        return HTTPError(.connectionLost, "the connection failed while \(doing) (\(why))")
    }
}
#endif
