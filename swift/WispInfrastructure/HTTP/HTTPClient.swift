#if canImport(FoundationEssentials) && !canImport(Darwin)
import FoundationEssentials
#else
import Foundation
#endif

/// wisp's one HTTP client for every model server: `open` sends a request and streams its answer
/// as events. Ending the stream early (Task cancellation, or the consumer leaving) cancels the
/// request, which closes the connection.
///
/// The one choice of transport, by platform: on Linux wisp's own HTTP/1.1 (`HTTPConnection`, TLS
/// through the system's OpenSSL loaded at run time), so the core needs neither
/// FoundationNetworking nor libcurl; on Apple's systems URLSession (`SessionTransport`), which
/// the system provides with its TLS and its trust store, and which has none of Linux's faults.
public final class HTTPClient: Sendable {
    #if canImport(Darwin)
    private let session = SessionTransport()
    #endif

    public init() {}

    public func open(_ request: HTTPRequest) -> AsyncThrowingStream<HTTPEvent, any Error> {
        #if canImport(Darwin)
        session.open(request)
        #else
        HTTPConnection.open(request)
        #endif
    }

    /// Why https cannot be used here (naming what to install), nil when it can: asked at start
    /// for an https endpoint, so that the status and `--check` say it before any call.
    public static var tlsProblem: String? {
        #if canImport(Darwin)
        nil
        #else
        if case .failure(let error) = OpenSSL.shared { error.detail } else { nil }
        #endif
    }
}
