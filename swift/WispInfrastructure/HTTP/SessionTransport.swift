// Apple's systems only; `make check-apple` typechecks it on Linux (-D WISP_CHECK_APPLE) against
// swift-corelibs-foundation's URLSession, whose API is the same.
#if canImport(Darwin) || WISP_CHECK_APPLE
import Foundation  // URLSession's delegate is an NSObject: full Foundation, which only Apple's systems load
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Synchronization

/// `HTTPClient`'s transport on Apple's systems: one long-lived `URLSession` whose delegate feeds
/// each task's events into that task's stream, wisp's request, head and error types on either
/// side. Long-lived on purpose: a session per client keeps connections alive. Trust is the
/// system's (its keychain), not SSL_CERT_FILE, as for every other program there.
final class SessionTransport: Sendable {
    private let router = SessionRouter()
    private let session: URLSession

    init() {
        let configuration = URLSessionConfiguration.ephemeral
        configuration.urlCache = nil
        // Every live thread may stream at once (--max-threads); the default 6 would queue them.
        configuration.httpMaximumConnectionsPerHost = 64
        session = URLSession(configuration: configuration, delegate: router, delegateQueue: nil)
    }

    deinit { session.invalidateAndCancel() }

    func open(_ request: HTTPRequest) -> AsyncThrowingStream<HTTPEvent, any Error> {
        let (stream, continuation) = AsyncThrowingStream<HTTPEvent, any Error>.makeStream()
        var r = URLRequest(url: request.url)
        r.httpMethod = request.method
        // URLSession's per-request timeout is an idle timeout, as HTTPRequest's is.
        r.timeoutInterval = request.idleTimeout
        r.httpBody = request.body
        for (name, value) in request.headers { r.setValue(value, forHTTPHeaderField: name) }
        let task = session.dataTask(with: r)
        let id = task.taskIdentifier
        router.add(id, continuation)
        continuation.onTermination = { [router] _ in
            router.remove(id)
            task.cancel()
        }
        task.resume()
        return stream
    }

    /// URLSession's errors as wisp's.
    static func error(_ error: any Error) -> HTTPError {
        let detail = (error as NSError).localizedDescription
        guard let code = (error as? URLError)?.code else { return HTTPError(.connectionLost, detail) }
        switch code {
        case .cannotFindHost, .dnsLookupFailed: return HTTPError(.cannotFindHost, detail)
        case .cannotConnectToHost, .notConnectedToInternet: return HTTPError(.cannotConnect, detail)
        case .timedOut: return HTTPError(.timedOut, detail)
        case .networkConnectionLost: return HTTPError(.connectionLost, detail)
        case .cancelled: return HTTPError(.cancelled, detail)
        case .badURL, .unsupportedURL: return HTTPError(.invalidRequest, detail)
        case .cannotParseResponse, .badServerResponse: return HTTPError(.malformedResponse, detail)
        case .serverCertificateUntrusted, .serverCertificateHasBadDate, .serverCertificateNotYetValid,
             .serverCertificateHasUnknownRoot:
            return HTTPError(.certificateRejected, "the server's certificate was refused: \(detail)")
        case .secureConnectionFailed: return HTTPError(.tlsFailed, detail)
        default: return HTTPError(.connectionLost, detail)
        }
    }
}

/// The session's delegate: routes events to the stream of the task they belong to.
final class SessionRouter: NSObject, URLSessionDataDelegate, Sendable {
    private let streams = Mutex<[Int: AsyncThrowingStream<HTTPEvent, any Error>.Continuation]>([:])

    func add(_ id: Int, _ continuation: AsyncThrowingStream<HTTPEvent, any Error>.Continuation) {
        streams.withLock { $0[id] = continuation }
    }

    func remove(_ id: Int) {
        _ = streams.withLock { $0.removeValue(forKey: id) }
    }

    private func stream(_ id: Int) -> AsyncThrowingStream<HTTPEvent, any Error>.Continuation? {
        streams.withLock { $0[id] }
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive response: URLResponse,
                    completionHandler: @escaping @Sendable (URLSession.ResponseDisposition) -> Void) {
        let status = (response as? HTTPURLResponse)?.statusCode ?? 0
        stream(dataTask.taskIdentifier)?.yield(.head(HTTPResponseHead(status: status)))
        completionHandler(.allow)
    }

    func urlSession(_ session: URLSession, dataTask: URLSessionDataTask, didReceive data: Data) {
        stream(dataTask.taskIdentifier)?.yield(.data(data))
    }

    func urlSession(_ session: URLSession, task: URLSessionTask, didCompleteWithError error: (any Error)?) {
        guard let continuation = streams.withLock({ $0.removeValue(forKey: task.taskIdentifier) }) else { return }
        if let error { continuation.finish(throwing: SessionTransport.error(error)) } else { continuation.finish() }
    }
}
#endif
