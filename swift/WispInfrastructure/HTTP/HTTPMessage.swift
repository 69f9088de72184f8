#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

/// One request to a model server, as wisp's own HTTP client takes it: no Foundation networking
/// type crosses this module's API, so the core links no HTTP stack but its own.
public struct HTTPRequest: Sendable {
    public var method: String
    public var url: URL
    /// Sent in this order, after `Host` and `Connection`; `Content-Length` is the client's to write.
    public var headers: [(name: String, value: String)]
    public var body: Data?
    /// How long the exchange may go without a byte moving either way (connect and TLS handshake
    /// included), not the whole call: the caller's deadline bounds that.
    public var idleTimeout: TimeInterval

    public init(method: String, url: URL, headers: [(name: String, value: String)] = [], body: Data? = nil,
                idleTimeout: TimeInterval) {
        self.method = method
        self.url = url
        self.headers = headers
        self.body = body
        self.idleTimeout = idleTimeout
    }
}

/// What an answer says before its body: the status of the final (non-1xx) answer.
public struct HTTPResponseHead: Sendable, Equatable {
    public var status: Int
    public init(status: Int) { self.status = status }
}

/// A response as events: the head first, then body bytes as they arrive.
public enum HTTPEvent: Sendable {
    case head(HTTPResponseHead)
    case data(Data)
}

/// Why an exchange failed without an HTTP answer, or with one that cannot be read. `detail`
/// says it in words (the peer's or the system's), for the message the caller builds.
public struct HTTPError: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Kind: Sendable, Equatable {
        /// Not an http(s) URL with a host and a port, or a header that cannot be sent as it is.
        case invalidRequest
        case cannotFindHost
        case cannotConnect
        /// Nothing moved for the request's idle timeout.
        case timedOut
        /// The connection closed before the answer's end.
        case connectionLost
        /// The answer is not HTTP/1.x as the client reads it.
        case malformedResponse
        /// The caller's own bound on an answer's size (the client sets none).
        case tooLarge
        case cancelled
        /// https, and no TLS library to make it with: `detail` names what to install.
        case tlsUnavailable
        /// The server's certificate was refused: `detail` is the verifier's reason.
        case certificateRejected
        /// The TLS handshake or a TLS record failed for another reason.
        case tlsFailed
    }

    public let kind: Kind
    public let detail: String

    public init(_ kind: Kind, _ detail: String) {
        self.kind = kind
        self.detail = detail
    }

    public var description: String { detail }
}
