#if os(Linux)
#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif
import Glibc
import Synchronization

/// One HTTP/1.1 exchange over a socket of its own, plain or through TLS, read on an OS thread of
/// its own: the events `HTTPClient.open` promises (the head, then body bytes as they arrive).
///
/// Why not URLSession: swift-corelibs-foundation's leaves the socket's write source armed after
/// the request has been sent, and an idle socket is always writable, so while a model server
/// streams its answer the core spins (strace: EPOLLOUT wake-ups by the thousand on the one
/// socket), taking CPU the model server needed; and it needs libcurl, which a static core cannot
/// link. TLS is OpenSSL's, loaded at run time (`OpenSSL.swift`).
///
/// Time limits are the socket's: every connect, send, handshake step and wait for bytes is bounded
/// by the request's idle timeout (`TCPSocket`); the whole call by its caller, who ends the stream,
/// which cancels: the socket is shut down under the reading thread, which then ends the stream.
final class HTTPConnection: Sendable {
    private struct State {
        var fd: Int32 = -1
        var cancelled = false
    }

    private let state = Mutex(State())

    static func open(_ request: HTTPRequest) -> AsyncThrowingStream<HTTPEvent, any Error> {
        let (stream, continuation) = AsyncThrowingStream<HTTPEvent, any Error>.makeStream()
        let connection = HTTPConnection()
        continuation.onTermination = { _ in connection.cancel() }
        // Blocking reads belong on an OS thread of their own, not the cooperative pool.
        OSThread.detach { connection.run(request, continuation) }
        return stream
    }

    /// Unblocks the reading OS thread; it then ends the stream.
    func cancel() {
        state.withLock { s in
            s.cancelled = true
            if s.fd >= 0 { shutdown(s.fd, Int32(SHUT_RDWR)) }
        }
    }

    private var cancelledError: HTTPError { HTTPError(.cancelled, "the request was cancelled") }

    private func run(_ request: HTTPRequest, _ out: AsyncThrowingStream<HTTPEvent, any Error>.Continuation) {
        var socket: TCPSocket?
        do {
            try exchange(request, out, socket: &socket)
            out.finish()
        } catch {
            out.finish(throwing: state.withLock { $0.cancelled } ? cancelledError : error)
        }
        // The socket is closed only once no `cancel` can shut it down: its number may be reused.
        state.withLock { s in
            if let socket { close(socket.fd) }
            s.fd = -1
        }
    }

    private func exchange(_ request: HTTPRequest, _ out: AsyncThrowingStream<HTTPEvent, any Error>.Continuation,
                          socket: inout TCPSocket?) throws {
        let target = try HTTPTarget(request.url)
        let head = try RequestHead.encode(request, to: target)
        let tls = target.secure ? try OpenSSL.shared.get() : nil
        let connected = try TCPSocket.connect(host: target.host, port: target.port, timeout: request.idleTimeout)
        socket = connected
        let cancelled = state.withLock { s in
            s.fd = connected.fd
            return s.cancelled
        }
        if cancelled { throw cancelledError }
        let channel: any ByteChannel
        if let tls { channel = try TLSChannel(tls, over: connected, host: target.host) } else { channel = connected }
        try channel.sendAll(head)
        var reader = ResponseReader(channel)
        let (answer, framing) = try reader.head()
        out.yield(.head(answer))
        try reader.body(framing) { out.yield(.data($0)) }
    }
}
#endif
