#if os(Linux)
import Glibc

/// Who the server's certificate must be for: an IP address literal is checked against the
/// certificate's IP addresses and gets no SNI (RFC 6066 allows only names there); anything else
/// is a DNS name, sent as SNI and checked against the certificate's names.
enum TLSPeer: Equatable {
    case address([UInt8])
    case name(String)

    init(host: String) {
        var v4 = in_addr()
        var v6 = in6_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            self = .address(withUnsafeBytes(of: &v4) { Array($0) })
        } else if inet_pton(AF_INET6, host, &v6) == 1 {
            self = .address(withUnsafeBytes(of: &v6) { Array($0) })
        } else {
            self = .name(host)
        }
    }
}

/// TLS over a connected socket, with OpenSSL (`OpenSSL.shared`). Used by one OS thread only (the
/// connection's); another thread may only `shutdown` the socket under it, which ends any wait in
/// here as a lost connection, which the connection then reports as its cancel.
final class TLSChannel: ByteChannel {
    private let ssl: OpenSSL
    private let handle: UInt // the connection's SSL*, as an address: see OpenSSL's note
    private let host: String

    private var connection: OpaquePointer? { OpaquePointer(bitPattern: handle) }

    /// Handshakes over `socket`, verifying the certificate for `host`.
    init(_ ssl: OpenSSL, over socket: TCPSocket, host: String) throws {
        guard let made = ssl.SSL_new(OpaquePointer(bitPattern: ssl.context)) else {
            throw HTTPError(.tlsFailed, "OpenSSL could not make a connection (SSL_new failed)")
        }
        self.ssl = ssl
        handle = UInt(bitPattern: made)
        self.host = host
        ssl.ERR_clear_error()
        guard ssl.SSL_set_fd(made, socket.fd) == 1, Self.expect(ssl, made, TLSPeer(host: host)) else {
            throw HTTPError(.tlsFailed, "OpenSSL could not be set up for \(host): \(Self.queued(ssl))")
        }
        let result = ssl.SSL_connect(made)
        if result != 1 { throw failure(result, "the TLS handshake with \(host)") }
    }

    deinit { ssl.SSL_free(connection) }

    /// SNI and the verifier's expected name or address.
    private static func expect(_ ssl: OpenSSL, _ made: OpaquePointer, _ peer: TLSPeer) -> Bool {
        switch peer {
        case .address(let bytes):
            return bytes.withUnsafeBufferPointer {
                ssl.X509_VERIFY_PARAM_set1_ip(ssl.SSL_get0_param(made), $0.baseAddress, $0.count) == 1
            }
        case .name(let name):
            ssl.SSL_set_hostflags(made, OpenSSL.X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS)
            let sni = name.withCString { name in
                ssl.SSL_ctrl(made, OpenSSL.SSL_CTRL_SET_TLSEXT_HOSTNAME, 0, UnsafeMutableRawPointer(mutating: name))
            }
            return sni == 1 && ssl.SSL_set1_host(made, name) == 1
        }
    }

    func sendAll(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            ssl.ERR_clear_error()
            let chunk = Int32(min(bytes.count - offset, 1 << 20))
            let n = bytes.withUnsafeBytes { ssl.SSL_write(connection, $0.baseAddress! + offset, chunk) }
            guard n > 0 else { throw failure(n, "sending the request") }
            offset += Int(n)
        }
    }

    func receive(_ buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        ssl.ERR_clear_error()
        let n = ssl.SSL_read(connection, buffer.baseAddress, Int32(min(buffer.count, Int(Int32.max))))
        if n > 0 { return min(Int(n), buffer.count) }
        if ssl.SSL_get_error(connection, n) == OpenSSL.SSL_ERROR_ZERO_RETURN { return 0 }
        throw failure(n, "waiting for the answer")
    }

    /// What a failed TLS call means: the certificate refused (the verifier's reason), the socket's
    /// time-out, the connection gone, or OpenSSL's own error.
    private func failure(_ result: Int32, _ doing: String) -> HTTPError {
        let code = errno
        let kind = ssl.SSL_get_error(connection, result)
        let verdict = ssl.SSL_get_verify_result(connection)
        if verdict != 0 {
            let reason = ssl.X509_verify_cert_error_string(verdict).map { String(cString: $0) } ?? "error \(verdict)"
            return HTTPError(.certificateRejected, """
                the server's certificate was refused for \(host): \(reason) (OpenSSL verify error \(verdict)); \
                wisp trusts the system's CA store, or SSL_CERT_FILE / SSL_CERT_DIR when set
                """)
        }
        switch kind {
        case OpenSSL.SSL_ERROR_WANT_READ, OpenSSL.SSL_ERROR_WANT_WRITE:
            // A blocking socket asks again only when its SO_RCVTIMEO / SO_SNDTIMEO fired.
            return HTTPError(.timedOut, "nothing moved for the time-out during \(doing)")
        case OpenSSL.SSL_ERROR_SYSCALL where code != 0:
            return TCPSocket.failure(code, doing)
        case OpenSSL.SSL_ERROR_SYSCALL, OpenSSL.SSL_ERROR_ZERO_RETURN:
            return HTTPError(.connectionLost, "the server closed the connection during \(doing)")
        default:
            return HTTPError(.tlsFailed, "\(doing) failed: \(Self.queued(ssl))")
        }
    }

    /// OpenSSL's queued errors on this thread, in its words.
    private static func queued(_ ssl: OpenSSL) -> String {
        var reasons: [String] = []
        while reasons.count < 4 {
            let code = ssl.ERR_get_error()
            if code == 0 { break }
            var text = [CChar](repeating: 0, count: 256)
            ssl.ERR_error_string_n(code, &text, text.count)
            reasons.append(String(decoding: text.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self))
        }
        return reasons.isEmpty ? "no reason given" : reasons.joined(separator: "; ")
    }
}
#endif
